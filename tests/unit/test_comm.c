/* test_comm — the gloo collectives across real processes: N = 1..4 ranks forked from this test,
 * rendezvousing through a fresh mkdtemp file store (and once through comm_kv callbacks). Checks
 * exact results (integer-valued floats), the fixed reduce-scatter summation order, asynchronous
 * overlap, byte counters, barrier, argument errors, and that a dead or silent rank makes the
 * others fail within timeout_s instead of hanging. Children report through their exit status;
 * the parent reaps them with a deadline and kills them on failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "comm.h"
#include "ranks.h"

/* ---- a comm_kv over a directory: the coordinator's KV service stand-in ---- */

static fsdp_status kv_set(void *ctx, const char *key, const void *val, size_t len) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/kv-", (const char *)ctx);
  size_t n = strlen(path);
  for (const char *k = key; *k && n < sizeof path - 1; k++) path[n++] = (*k == '/') ? '_' : *k;
  path[n] = '\0';
  snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return fsdp_set_error(FSDP_ERR_IO, "kv_set %s: %s", tmp, strerror(errno));
  size_t w = fwrite(val, 1, len, f);
  fclose(f);
  if (w != len || rename(tmp, path) != 0) return fsdp_set_error(FSDP_ERR_IO, "kv_set %s failed", path);
  return FSDP_OK;
}

static fsdp_status kv_get(void *ctx, const char *key, void **val, size_t *len, double timeout_s) {
  char path[4096];
  snprintf(path, sizeof path, "%s/kv-", (const char *)ctx);
  size_t n = strlen(path);
  for (const char *k = key; *k && n < sizeof path - 1; k++) path[n++] = (*k == '/') ? '_' : *k;
  path[n] = '\0';
  double deadline = now_s() + timeout_s;
  for (;;) {   /* wait for the key to exist, with a deadline */
    FILE *f = fopen(path, "rb");
    if (f) {
      fseek(f, 0, SEEK_END);
      long sz = ftell(f);
      fseek(f, 0, SEEK_SET);
      void *b = malloc(sz > 0 ? (size_t)sz : 1);
      size_t r = fread(b, 1, (size_t)sz, f);
      fclose(f);
      *val = b;
      *len = r;
      return FSDP_OK;
    }
    if (now_s() > deadline) return fsdp_set_error(FSDP_ERR_TIMEOUT, "kv_get %s: not set within %.1f s", key, timeout_s);
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
}

/* ---- process groups ---- */

typedef int (*rank_fn)(comm_t *c, int rank, int world, const char *dir, void *arg);

typedef struct {
  int world;
  int use_kv;
  double timeout_s;
  double deadline_s;    /* the whole group, for the parent */
  int pipe_rd;          /* -1, or a pipe the last rank may block on: children close the write end, */
  int pipe_wr;          /* and the parent closes it once only one rank is left */
} group_opts;

typedef struct {
  const group_opts *o;
  rank_fn fn;
  void *arg;
} group_call;

/* One rank: its comm (file store or KV in the run directory), then the checks. */
static int group_rank(int r, int world, const char *dir, void *arg) {
  const group_call *g = arg;
  comm_t *c = NULL;
  comm_kv kv = {.ctx = (void *)(uintptr_t)dir, .set = kv_set, .get = kv_get};
  char store[128];
  snprintf(store, sizeof store, "%s/store", dir);
  fsdp_status st = comm_new_gloo(r, world, g->o->use_kv ? NULL : store, g->o->use_kv ? &kv : NULL, "test",
                                 g->o->timeout_s, &c);
  if (st != FSDP_OK) {
    fprintf(stderr, "rank %d: comm_new_gloo: %s\n", r, fsdp_last_error());
    return 2;
  }
  int fails = g->fn(c, r, world, dir, g->arg);
  comm_destroy(&c);
  return fails ? 1 : 0;
}

/* Fork opts->world ranks running FN (tests/unit/ranks.h); returns the number of ranks that failed
 * (exit status ≠ 0, killed, or past the deadline). */
static int run_group(const group_opts *o, rank_fn fn, void *arg) {
  ranks_run r = {.world = o->world, .deadline_s = o->deadline_s, .release_fd = o->pipe_wr};
  group_call g = {o, fn, arg};
  int failed = ranks_go(&r, group_rank, &g);
  char why[64];
  for (int k = 0; k < o->world; k++)
    if (r.status[k] == -1 || !WIFEXITED(r.status[k]) || WEXITSTATUS(r.status[k]) != 0)
      fprintf(stderr, "world %d: rank %d failed (%s)\n", o->world, k, ranks_why(&r, k, why, sizeof why));
  ranks_cleanup(&r);
  return failed;
}

/* ---- the checks each rank runs ---- */

static float ag_val(int rank, size_t i) { return (float)(rank * 1000 + (int)(i % 977)); }
static float rs_val(int rank, int blk, size_t i) { return (float)((rank + 1) * (blk + 1) + (int)(i % 13)); }
static float ar_val(int rank, size_t i) { return (float)(rank + 1 + (int)(i % 7)); }

static int check_allgather(comm_t *c, int rank, int world, size_t count, comm_req **req, float **keep) {
  float *send = malloc(count * sizeof *send), *recv = malloc(count * (size_t)world * sizeof *recv);
  for (size_t i = 0; i < count; i++) send[i] = ag_val(rank, i);
  for (size_t i = 0; i < count * (size_t)world; i++) recv[i] = -1;
  if (req) {   /* asynchronous: the caller waits and then calls again with req == NULL... */
    CHECK_OK(comm_allgather(c, send, recv, count, COMM_F32, req));
    keep[0] = send;
    keep[1] = recv;
    return 0;
  }
  CHECK_OK(comm_allgather(c, send, recv, count, COMM_F32, NULL));
  size_t bad = 0;
  for (int r = 0; r < world; r++)
    for (size_t i = 0; i < count; i++) bad += recv[(size_t)r * count + i] != ag_val(r, i);
  CHECK_EQ_INT(0, bad);
  free(send);
  free(recv);
  return 0;
}

static size_t verify_ag(const float *recv, int world, size_t count) {
  size_t bad = 0;
  for (int r = 0; r < world; r++)
    for (size_t i = 0; i < count; i++) bad += recv[(size_t)r * count + i] != ag_val(r, i);
  return bad;
}

static size_t verify_rs(const float *recv, int rank, int world, size_t count) {
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    float want = (float)((rank + 1) * world * (world + 1) / 2 + world * (int)(i % 13));
    bad += recv[i] != want;
  }
  return bad;
}

static size_t verify_ar(const float *buf, int world, size_t count) {
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) bad += buf[i] != (float)(world * (world + 1) / 2 + world * (int)(i % 7));
  return bad;
}

/* Non-integer values: the reduce-scatter must equal the documented ring order bit for bit,
 * ((x[b+1] + x[b+2]) + …) + x[b], which every rank can recompute since inputs are deterministic. */
static float odd_val(int rank, int blk, size_t i) {
  uint32_t h = (uint32_t)(rank * 7919 + blk * 104729) ^ (uint32_t)(i * 2654435761u);
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return (float)(h % 100000) * 1.0e-3f + 0.1f / (float)(rank + 1);
}

/* All-gather (out of place and in place), reduce-scatter and all-reduce at sizes from 1 element to
 * past a segment, each against its formula. */
static void check_sizes(comm_t *c, int rank, int world, uint64_t *want) {
  const size_t counts[] = {1, 3, 1000, 300001, (size_t)1 << 20};   /* 300001: a partial last segment */
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    size_t n = counts[k];
    /* all-gather, blocking, out of place and in place */
    check_allgather(c, rank, world, n, NULL, NULL);
    want[COLL_ALLGATHER] += n * 4 * (uint64_t)(world - 1);
    float *buf = malloc(n * (size_t)world * sizeof *buf);
    for (size_t i = 0; i < n * (size_t)world; i++) buf[i] = -1;
    for (size_t i = 0; i < n; i++) buf[(size_t)rank * n + i] = ag_val(rank, i);
    CHECK_OK(comm_allgather(c, buf + (size_t)rank * n, buf, n, COMM_F32, NULL));
    CHECK_EQ_INT(0, verify_ag(buf, world, n));
    want[COLL_ALLGATHER] += n * 4 * (uint64_t)(world - 1);
    /* reduce-scatter */
    float *rs_send = malloc(n * (size_t)world * sizeof *rs_send), *rs_recv = malloc(n * sizeof *rs_recv);
    for (int b = 0; b < world; b++)
      for (size_t i = 0; i < n; i++) rs_send[(size_t)b * n + i] = rs_val(rank, b, i);
    CHECK_OK(comm_reduce_scatter(c, rs_send, rs_recv, n, COMM_F32, NULL));
    CHECK_EQ_INT(0, verify_rs(rs_recv, rank, world, n));
    want[COLL_REDUCESCATTER] += n * 4 * (uint64_t)(world - 1);
    /* all-reduce */
    for (size_t i = 0; i < n; i++) buf[i] = ar_val(rank, i);
    CHECK_OK(comm_allreduce(c, buf, n, COMM_F32, NULL));
    CHECK_EQ_INT(0, verify_ar(buf, world, n));
    want[COLL_ALLREDUCE] += 2 * n * 4 * (uint64_t)(world - 1) / (uint64_t)world;
    free(buf);
    free(rs_send);
    free(rs_recv);
  }
}

/* The reduce-scatter summation order, bit for bit. */
static void check_rs_order(comm_t *c, int rank, int world, uint64_t *want) {
  size_t n = 4099;
  float *send = malloc(n * (size_t)world * sizeof *send), *recv = malloc(n * sizeof *recv);
  for (int b = 0; b < world; b++)
    for (size_t i = 0; i < n; i++) send[(size_t)b * n + i] = odd_val(rank, b, i);
  CHECK_OK(comm_reduce_scatter(c, send, recv, n, COMM_F32, NULL));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    float acc = odd_val((rank + 1) % world, rank, i);
    for (int s = 2; s <= world; s++) acc = acc + odd_val((rank + s) % world, rank, i);
    bad += memcmp(&acc, &recv[i], sizeof acc) != 0;
  }
  CHECK_EQ_INT(0, bad);
  want[COLL_REDUCESCATTER] += n * 4 * (uint64_t)(world - 1);
  free(send);
  free(recv);
}

/* All-reduce of non-integer values: every rank ends with the same bits (a global grad-norm
 * must not differ between ranks), and repeating it gives the same bits again. */
static void check_ar_same_bits(comm_t *c, int rank, int world, uint64_t *want) {
  size_t n = 1027;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *all = malloc(n * (size_t)world * sizeof *all);
  for (size_t i = 0; i < n; i++) a[i] = b[i] = odd_val(rank, 0, i);
  CHECK_OK(comm_allreduce(c, a, n, COMM_F32, NULL));
  CHECK_OK(comm_allreduce(c, b, n, COMM_F32, NULL));
  CHECK(memcmp(a, b, n * sizeof *a) == 0);
  CHECK_OK(comm_allgather(c, a, all, n, COMM_F32, NULL));
  size_t bad = 0;
  for (int r = 0; r < world; r++) bad += memcmp(all + (size_t)r * n, a, n * sizeof *a) != 0;
  CHECK_EQ_INT(0, bad);
  double ref = 0, got = 0;   /* and it is the sum, to fp32 rounding */
  for (size_t i = 0; i < n; i++) {
    double s = 0;
    for (int r = 0; r < world; r++) s += odd_val(r, 0, i);
    ref += fabs(s);
    got += fabs(s - a[i]);
  }
  CHECK(got <= 1e-6 * ref);
  want[COLL_ALLREDUCE] += 2 * (2 * n * 4 * (uint64_t)(world - 1) / (uint64_t)world);
  want[COLL_ALLGATHER] += n * 4 * (uint64_t)(world - 1);
  free(a), free(b), free(all);
}

/* Asynchronous overlap: three collectives in flight, waited in order. */
static void check_async_overlap(comm_t *c, int rank, int world, uint64_t *want) {
  size_t n = 100000;
  float *ag_s = malloc(n * sizeof(float)), *ag_r = malloc(n * (size_t)world * sizeof(float));
  float *rs_s = malloc(n * (size_t)world * sizeof(float)), *rs_r = malloc(n * sizeof(float));
  float *ar = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) ag_s[i] = ag_val(rank, i), ar[i] = ar_val(rank, i);
  for (int b = 0; b < world; b++)
    for (size_t i = 0; i < n; i++) rs_s[(size_t)b * n + i] = rs_val(rank, b, i);
  comm_req *r1 = NULL, *r2 = NULL, *r3 = NULL;
  CHECK_OK(comm_allgather(c, ag_s, ag_r, n, COMM_F32, &r1));
  CHECK_OK(comm_reduce_scatter(c, rs_s, rs_r, n, COMM_F32, &r2));
  CHECK_OK(comm_allreduce(c, ar, n, COMM_F32, &r3));
  CHECK(r1 && r2 && r3);
  /* Meanwhile the caller computes something (the point of the comm thread). */
  double x = 0;
  for (int i = 0; i < 2000000; i++) x += 1.0 / (i + 1);
  CHECK(x > 1);
  CHECK_OK(comm_wait(&r1));
  CHECK(r1 == NULL);
  CHECK_EQ_INT(0, verify_ag(ag_r, world, n));
  CHECK_OK(comm_wait(&r2));
  CHECK_EQ_INT(0, verify_rs(rs_r, rank, world, n));
  CHECK_OK(comm_wait(&r3));
  CHECK_EQ_INT(0, verify_ar(ar, world, n));
  CHECK_OK(comm_wait(&r3));   /* NULL handle: no-op */
  want[COLL_ALLGATHER] += n * 4 * (uint64_t)(world - 1);
  want[COLL_REDUCESCATTER] += n * 4 * (uint64_t)(world - 1);
  want[COLL_ALLREDUCE] += 2 * n * 4 * (uint64_t)(world - 1) / (uint64_t)world;
  free(ag_s), free(ag_r), free(rs_s), free(rs_r), free(ar);
}

/* bf16: small integers are exact in bf16, so the sums are exact too. */
static void check_bf16(comm_t *c, int rank, int world, uint64_t *want) {
  size_t n = 513;
  uint16_t *s = malloc(n * (size_t)world * 2), *r = malloc(n * (size_t)world * 2);
  for (int b = 0; b < world; b++)
    for (size_t i = 0; i < n; i++) {
      float v = (float)((rank + 1) * (b + 1) + (int)(i % 5));
      uint32_t u;
      memcpy(&u, &v, 4);
      s[(size_t)b * n + i] = (uint16_t)(u >> 16);
    }
  CHECK_OK(comm_reduce_scatter(c, s, r, n, COMM_BF16, NULL));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)r[i] << 16;
    float v;
    memcpy(&v, &u, 4);
    bad += v != (float)((rank + 1) * world * (world + 1) / 2 + world * (int)(i % 5));
  }
  CHECK_EQ_INT(0, bad);
  CHECK_OK(comm_allgather(c, s, r, n, COMM_BF16, NULL));
  bad = 0;
  for (int q = 0; q < world; q++)
    for (size_t i = 0; i < n; i++) {
      float v = (float)((q + 1) * 1 + (int)(i % 5));
      uint32_t u;
      memcpy(&u, &v, 4);
      bad += r[(size_t)q * n + i] != (uint16_t)(u >> 16);
    }
  CHECK_EQ_INT(0, bad);
  CHECK_OK(comm_allreduce(c, s, n, COMM_BF16, NULL));
  want[COLL_REDUCESCATTER] += n * 2 * (uint64_t)(world - 1);
  want[COLL_ALLGATHER] += n * 2 * (uint64_t)(world - 1);
  want[COLL_ALLREDUCE] += 2 * n * 2 * (uint64_t)(world - 1) / (uint64_t)world;
  free(s);
  free(r);
}

static int rank_main_correctness(comm_t *c, int rank, int world, const char *dir, void *arg) {
  (void)arg;
  CHECK_EQ_INT(rank, comm_rank(c));
  CHECK_EQ_INT(world, comm_world(c));
  uint64_t want[COLL_NKIND] = {0, 0, 0};   /* bytes sent per collective kind, by the formulas */
  check_sizes(c, rank, world, want);
  check_rs_order(c, rank, world, want);
  check_ar_same_bits(c, rank, world, want);
  check_async_overlap(c, rank, world, want);
  check_bf16(c, rank, world, want);

  /* Byte counters equal the formula exactly. */
  uint64_t got[COLL_NKIND];
  comm_sent_bytes(c, got);
  for (int k = 0; k < COLL_NKIND; k++) CHECK_EQ_INT(want[k], got[k]);

  /* Barrier: every rank leaves a mark before it; after it, every mark must be there. */
  char path[4096];
  snprintf(path, sizeof path, "%s/arrived.%d", dir, rank);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) fclose(f);
  CHECK_OK(comm_barrier(c));
  int present = 0;
  for (int r = 0; r < world; r++) {
    snprintf(path, sizeof path, "%s/arrived.%d", dir, r);
    present += access(path, F_OK) == 0;
  }
  CHECK_EQ_INT(world, present);
  CHECK_OK(comm_barrier(c));   /* nobody deletes a mark before all have looked */
  fprintf(stderr, "  rank %d of %d: %d checks passed, %d failed\n", rank, world, check_pass_, check_fail_);
  return check_fail_;
}

/* A rank dies before the second collective: the others must fail within timeout_s + 3 s. */
static int rank_main_dead(comm_t *c, int rank, int world, const char *dir, void *arg) {
  (void)dir;
  int dead = *(int *)arg;
  size_t n = 4096;
  float *send = calloc(n, sizeof(float)), *recv = calloc(n * (size_t)world, sizeof(float));
  CHECK_OK(comm_allgather(c, send, recv, n, COMM_F32, NULL));
  if (rank == dead) _exit(0);   /* dies mid-sequence, without cleaning up */
  comm_req *req = NULL;
  double t0 = now_s();
  CHECK_OK(comm_allgather(c, send, recv, n, COMM_F32, &req));
  fsdp_status st = comm_wait(&req);
  double dt = now_s() - t0;
  CHECK(st == FSDP_ERR_TIMEOUT || st == FSDP_ERR_COMM);
  CHECK(strstr(fsdp_last_error(), "all-gather") != NULL);
  CHECK(dt < 2.0 + 3.0);
  fprintf(stderr, "  rank %d: peer died: %s after %.2f s: %s\n", rank, fsdp_strerror(st), dt, fsdp_last_error());
  /* Every later call fails fast. */
  t0 = now_s();
  st = comm_allreduce(c, send, 1, COMM_F32, NULL);
  CHECK(st == FSDP_ERR_TIMEOUT || st == FSDP_ERR_COMM);
  CHECK(now_s() - t0 < 0.5);
  CHECK(comm_barrier(c) != FSDP_OK);
  free(send);
  free(recv);
  return check_fail_;
}

/* A rank stays alive but never joins the collective: the others must time out (FSDP_ERR_TIMEOUT)
 * within timeout_s + 3 s. The silent rank blocks on a pipe that the parent closes once the others
 * have exited. */
static int rank_main_silent(comm_t *c, int rank, int world, const char *dir, void *arg) {
  (void)dir;
  int *p = arg;
  size_t n = 64;
  float *buf = calloc(n * (size_t)world, sizeof(float));
  if (rank == world - 1) {
    char ch;
    ssize_t r = read(p[0], &ch, 1);   /* returns 0 at EOF: the parent closed the write end */
    (void)r;
    free(buf);
    return 0;
  }
  comm_req *req = NULL;
  double t0 = now_s();
  float *out = calloc(n, sizeof(float));
  CHECK_OK(comm_reduce_scatter(c, buf, out, n, COMM_F32, &req));
  fsdp_status st = comm_wait(&req);
  double dt = now_s() - t0;
  CHECK_EQ_INT(FSDP_ERR_TIMEOUT, st);
  CHECK(strstr(fsdp_last_error(), "reduce-scatter") != NULL);
  CHECK(strstr(fsdp_last_error(), "timeout_s = 2") != NULL);
  CHECK(dt >= 1.5);
  CHECK(dt < 2.0 + 3.0);
  fprintf(stderr, "  rank %d: silent peer: %s after %.2f s: %s\n", rank, fsdp_strerror(st), dt, fsdp_last_error());
  free(buf);
  free(out);
  return check_fail_;
}

/* world = 1 in process: local copies, no bytes sent, argument errors. */
static void test_world1_and_args(void) {
  comm_t *c = NULL;
  CHECK_OK(comm_new_gloo(0, 1, NULL, NULL, "solo", 5.0, &c));
  CHECK(c != NULL);
  if (!c) return;
  CHECK(strcmp(comm_backend_name(c), "local") == 0);
  float a[5] = {1, 2, 3, 4, 5}, b[5] = {0};
  CHECK_OK(comm_allgather(c, a, b, 5, COMM_F32, NULL));
  CHECK(memcmp(a, b, sizeof a) == 0);
  float d[5] = {0};
  comm_req *req = NULL;
  CHECK_OK(comm_reduce_scatter(c, a, d, 5, COMM_F32, &req));
  CHECK_OK(comm_wait(&req));
  CHECK(memcmp(a, d, sizeof a) == 0);
  CHECK_OK(comm_allreduce(c, a, 5, COMM_F32, NULL));
  CHECK_EQ_INT(3, (int)a[2]);
  CHECK_OK(comm_barrier(c));
  uint64_t got[COLL_NKIND];
  comm_sent_bytes(c, got);
  for (int k = 0; k < COLL_NKIND; k++) CHECK_EQ_INT(0, got[k]);
  /* errors: overlapping reduce-scatter buffers, a bad dtype */
  CHECK_EQ_INT(FSDP_ERR_INVALID, comm_reduce_scatter(c, a, a + 1, 2, COMM_F32, NULL));
  CHECK_EQ_INT(FSDP_ERR_INVALID, comm_allreduce(c, a, 2, (comm_dtype)7, NULL));
  comm_destroy(&c);
  CHECK(c == NULL);
  comm_destroy(&c);   /* NULL-safe */

  CHECK_EQ_INT(FSDP_ERR_RANGE, comm_new_gloo(2, 2, "/tmp", NULL, "x", 5.0, &c));
  CHECK_EQ_INT(FSDP_ERR_RANGE, comm_new_gloo(0, 1, NULL, NULL, "x", 0.0, &c));
  CHECK_EQ_INT(FSDP_ERR_INVALID, comm_new_gloo(0, 2, NULL, NULL, "x", 5.0, &c));
  CHECK(c == NULL);
}

/* comm.c's last resorts, against backends that ignore their deadlines (the transport cannot be
 * made to misbehave on purpose): a threaded backend whose run() blocks until abort() (the
 * watchdog must give up and comm_destroy must abort and join), and a streamed backend whose work
 * never completes (comm_wait must time out after timeout_s and abort, as with NCCL). */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int aborted, destroyed, released, running;
} stuck_t;

static fsdp_status stuck_run(void *impl, const comm_op *op) {
  stuck_t *s = impl;
  (void)op;
  pthread_mutex_lock(&s->mu);
  s->running = 1;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 60;
  while (!s->aborted && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0) {
  }
  pthread_mutex_unlock(&s->mu);
  return fsdp_set_error(FSDP_ERR_COMM, "stuck backend aborted");
}

static void stuck_abort(void *impl) {
  stuck_t *s = impl;
  pthread_mutex_lock(&s->mu);
  s->aborted++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void stuck_destroy(void *impl) { ((stuck_t *)impl)->destroyed++; }

static fsdp_status never_submit(void *impl, const comm_op *op, void **token) {
  (void)op;
  *token = impl;
  return FSDP_OK;
}

static fsdp_status never_poll(void *impl, void *token, int *done) {
  (void)impl, (void)token;
  *done = 0;
  return FSDP_OK;
}

static void never_release(void *impl, void *token) {
  (void)token;
  ((stuck_t *)impl)->released++;
}

static void test_last_resorts(void) {
  static const comm_backend stuck_be = {.name = "stuck", .run = stuck_run, .abort = stuck_abort, .destroy = stuck_destroy};
  stuck_t s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  comm_t *c = NULL;
  CHECK_OK(comm_wrap(&stuck_be, &s, 0, 2, 0.5, &c));
  float x[2] = {0}, y[4];
  comm_req *req = NULL;
  double t0 = now_s();
  CHECK_OK(comm_allgather(c, x, y, 2, COMM_F32, &req));
  fsdp_status st = comm_wait(&req);
  double dt = now_s() - t0;
  CHECK_EQ_INT(FSDP_ERR_TIMEOUT, st);
  CHECK(strstr(fsdp_last_error(), "blocked") != NULL);
  CHECK(dt >= 2 * 0.5 + 5 - 0.1 && dt < 2 * 0.5 + 5 + 2);   /* the watchdog: 2·timeout_s + 5 s */
  t0 = now_s();
  CHECK_EQ_INT(FSDP_ERR_TIMEOUT, comm_allreduce(c, x, 2, COMM_F32, NULL));   /* fails fast */
  CHECK(now_s() - t0 < 0.5);
  comm_destroy(&c);   /* aborts the stuck backend, joins the thread, destroys */
  CHECK_EQ_INT(1, s.aborted);
  CHECK_EQ_INT(1, s.destroyed);

  static const comm_backend never_be = {.name = "never", .submit = never_submit, .poll = never_poll,
                                        .release = never_release, .abort = stuck_abort, .destroy = stuck_destroy};
  stuck_t n = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  CHECK_OK(comm_wrap(&never_be, &n, 1, 2, 0.5, &c));
  t0 = now_s();
  CHECK_OK(comm_reduce_scatter(c, y, x, 2, COMM_F32, &req));
  st = comm_wait(&req);
  dt = now_s() - t0;
  CHECK_EQ_INT(FSDP_ERR_TIMEOUT, st);
  CHECK(strstr(fsdp_last_error(), "reduce-scatter") != NULL);
  CHECK(dt >= 0.5 && dt < 0.5 + 1.0);
  CHECK_EQ_INT(1, n.aborted);
  CHECK_EQ_INT(1, n.released);
  CHECK(comm_barrier(c) != FSDP_OK);
  uint64_t got[COLL_NKIND];
  comm_sent_bytes(c, got);
  CHECK_EQ_INT(0, got[COLL_REDUCESCATTER]);   /* nothing completed, nothing counted */
  comm_destroy(&c);
  CHECK_EQ_INT(1, n.destroyed);
}

/* A rendezvous nobody else joins fails within timeout_s. */
static void test_rendezvous_timeout(void) {
  char dir[] = "/tmp/fsdp-test-comm-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  comm_t *c = NULL;
  double t0 = now_s();
  fsdp_status st = comm_new_gloo(0, 2, dir, NULL, "alone", 1.0, &c);
  double dt = now_s() - t0;
  CHECK_EQ_INT(FSDP_ERR_TIMEOUT, st);
  CHECK(c == NULL);
  CHECK(dt < 1.0 + 3.0);
  CHECK(strstr(fsdp_last_error(), "rendezvous") != NULL);
  rm_rf(dir);
}

int main(void) {
  double t_start = now_s();
  test_world1_and_args();

  for (int world = 1; world <= 4; world++) {
    group_opts o = {.world = world, .timeout_s = 30, .deadline_s = 45, .pipe_rd = -1, .pipe_wr = -1};
    double t0 = now_s();
    int failed = run_group(&o, rank_main_correctness, NULL);
    CHECK_EQ_INT(0, failed);
    printf("world %d: collectives checked in %.2f s\n", world, now_s() - t0);
  }
  {
    group_opts o = {.world = 2, .use_kv = 1, .timeout_s = 30, .deadline_s = 45, .pipe_rd = -1, .pipe_wr = -1};
    CHECK_EQ_INT(0, run_group(&o, rank_main_correctness, NULL));
    printf("world 2 through comm_kv callbacks: ok\n");
  }
  {
    int dead = 1;
    group_opts o = {.world = 3, .timeout_s = 2, .deadline_s = 15, .pipe_rd = -1, .pipe_wr = -1};
    double t0 = now_s();
    CHECK_EQ_INT(0, run_group(&o, rank_main_dead, &dead));
    printf("world 3, rank 1 dies: survivors failed cleanly (group %.2f s)\n", now_s() - t0);
  }
  {
    int p[2];
    CHECK(pipe(p) == 0);
    group_opts o = {.world = 2, .timeout_s = 2, .deadline_s = 15, .pipe_rd = p[0], .pipe_wr = p[1]};
    double t0 = now_s();
    CHECK_EQ_INT(0, run_group(&o, rank_main_silent, p));
    close(p[0]);
    printf("world 2, rank 1 silent: the other timed out cleanly (group %.2f s)\n", now_s() - t0);
  }
  test_rendezvous_timeout();
  test_last_resorts();
  printf("total %.2f s\n", now_s() - t_start);
  return check_done();
}
