/* gpu_check — the device-only checks of the CUDA backend, run by hand on a machine with an NVIDIA
 * GPU (tests/gpu/run.sh, docs/gpu.md); never by ctest, since CI has no GPU.
 *
 *   1. every kernel of worker/cuda/ops_cuda.h against its CPU twin (worker/ops/ops_cpu.h, worker/model/optim.h,
 *      worker/ops/bf16.h: the specification) on fresh random inputs, at a tiny shape (edge tiles,
 *      odd sizes, fallbacks) and at GPT-2-small shapes (attention B=4 T=1024 C=768 NH=12; the
 *      classifier at V = 50257); the CUDA op's time (cudaEvent) is printed at the large shapes
 *      (check_ops.c, check_util.c);
 *   2. a bf16 cuBLASLt GEMM's rate (8192³, TFLOP/s), the denominator of MFU in later benchmarks;
 *   3. the NCCL comm with one rank (comm_nccl_get_unique_id + comm_new_nccl) and the staged gloo
 *      comm with world 1: all-gather, reduce-scatter, all-reduce on device buffers, fp32 and bf16;
 *      NCCL's spans (comm_set_trace) at comm_wait, in the host's window around the collectives;
 *   4. two processes: the staged gloo comm with both ranks on device 0, and, with two or more
 *      GPUs, NCCL with one GPU per rank (values, byte counters, bandwidth).
 *
 * Tolerances: gpu_check.h; the harness (buffers, random inputs, comparison): harness.c. Exit status: 0 when every check passed, 1 when one failed, 2 when there
 * is no usable CUDA device (no GPU, no driver), with one line saying so. One line per check.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <errno.h>
#include <ftw.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "err.h"
#include "gpu_check.h"
#include "mem.h"
#include "monotime.h"
#include "ops_cpu.h"
#include "trace.h"

/* ---- comms ---- */


/* With one rank every collective's result is its input, bit for bit, and nothing is sent (the
 * ring accounting counts S·(N−1)/N). */
static void check_comm_world1(comm_t *c, const char *label, const char *backend) {
  char name[96], detail[256];
  snprintf(name, sizeof name, "%s backend name", label);
  snprintf(detail, sizeof detail, "\"%s\"", comm_backend_name(c));
  verdict(name, strcmp(comm_backend_name(c), backend) == 0 && comm_world(c) == 1 && comm_rank(c) == 0, detail);
  const size_t n = 1000003;   /* odd: no multiple of any vector width */
  for (int t = 0; t < 2; t++) {
    comm_dtype dt = t ? COMM_BF16 : COMM_F32;
    const char *dn = t ? "bf16" : "f32";
    size_t bytes = n * comm_dtype_size(dt);
    uint8_t *src = hbuf(bytes), *got = hbuf(bytes);
    for (size_t i = 0; i < n; i++) {
      float f = rng_uniform(-4, 4);
      if (dt == COMM_F32) {
        memcpy(src + 4 * i, &f, 4);
      } else {
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t h = (uint16_t)(u >> 16);   /* a bf16 value: the top half of a float */
        memcpy(src + 2 * i, &h, 2);
      }
    }
    void *d_send = d_upload(src, bytes), *d_recv = dbuf(bytes), *d_buf = d_upload(src, bytes);
    void *d_inpl = d_upload(src, bytes);
    CU(cudaMemset(d_recv, 0xFF, bytes));
    CU(cudaDeviceSynchronize());   /* NCCL's stream does not wait for the legacy stream's copies */
    for (int k = 0; k < 4; k++) {
      static const char *const what[] = {"all-gather", "reduce-scatter (async)", "all-reduce (async, in place)",
                                         "all-gather (in place)"};
      comm_req *req = NULL;
      fsdp_status st;
      void *res = d_recv;
      fsdp_clear_error();
      if (k == 0) {
        st = comm_allgather(c, d_send, d_recv, n, dt, NULL);
      } else if (k == 1) {
        CU(cudaMemset(d_recv, 0xFF, bytes));
        CU(cudaDeviceSynchronize());
        st = comm_reduce_scatter(c, d_send, d_recv, n, dt, &req);
        if (st == FSDP_OK) st = comm_wait(&req);
      } else if (k == 2) {
        st = comm_allreduce(c, d_buf, n, dt, &req);
        if (st == FSDP_OK) st = comm_wait(&req);
        res = d_buf;
      } else {
        st = comm_allgather(c, d_inpl, d_inpl, n, dt, NULL);
        res = d_inpl;
      }
      snprintf(name, sizeof name, "%s %s %s", label, what[k], dn);
      if (st != FSDP_OK) {
        snprintf(detail, sizeof detail, "%s: %s", fsdp_strerror(st), fsdp_last_error());
        verdict(name, 0, detail);
        continue;
      }
      CU(cudaMemcpy(got, res, bytes, cudaMemcpyDeviceToHost));
      size_t diff = 0;
      for (size_t i = 0; i < bytes; i++) diff += got[i] != src[i];
      snprintf(detail, sizeof detail, "n=%zu, %zu of %zu bytes differ from the input", n, diff, bytes);
      verdict(name, diff == 0, detail);
    }
  }
  fsdp_clear_error();
  fsdp_status st = comm_barrier(c);
  snprintf(name, sizeof name, "%s barrier", label);
  verdict(name, st == FSDP_OK, st == FSDP_OK ? "" : fsdp_last_error());
  uint64_t sent[COLL_NKIND];
  comm_sent_bytes(c, sent);
  snprintf(name, sizeof name, "%s sent bytes (world 1: all 0)", label);
  snprintf(detail, sizeof detail, "all-gather %llu, reduce-scatter %llu, all-reduce %llu",
           (unsigned long long)sent[COLL_ALLGATHER], (unsigned long long)sent[COLL_REDUCESCATTER],
           (unsigned long long)sent[COLL_ALLREDUCE]);
  verdict(name, sent[COLL_ALLGATHER] == 0 && sent[COLL_REDUCESCATTER] == 0 && sent[COLL_ALLREDUCE] == 0, detail);
  free_all();
}

static uint64_t mem_comm_now(void) {
  mem_stats ms;
  mem_get_stats(&ms);
  return ms.cur[MEM_COMM];
}

/* NCCL's spans (comm_set_trace): each collective timed on the comm's stream, in the trace as soon
 * as comm_wait returns (no device synchronization), named by its unit and step, inside the host's
 * window around it, in stream order; the barrier records none. */
static void check_nccl_spans(comm_t *c) {
  char detail[512];
  trace_t *t = NULL;
  fsdp_clear_error();
  if (trace_new(&t) != FSDP_OK) {
    verdict("nccl[1] spans: trace_new", 0, fsdp_last_error());
    return;
  }
  const size_t n = (size_t)1 << 22;   /* 16 MiB of f32: each collective takes measurable time */
  float *d_send = dbuf(n * 4), *d_recv = dbuf(n * 4);
  CU(cudaDeviceSynchronize());
  trace_set_step(t, 7);
  comm_set_trace(c, t, TRACE_COMM);
  comm_req *req[3] = {NULL, NULL, NULL};
  uint64_t h0 = monotime_us();
  comm_trace_unit(c, 3);
  fsdp_status st = comm_allgather(c, d_send, d_recv, n, COMM_F32, &req[0]);
  comm_trace_unit(c, 4);
  if (st == FSDP_OK) st = comm_reduce_scatter(c, d_send, d_recv, n, COMM_F32, &req[1]);
  if (st == FSDP_OK) st = comm_allreduce(c, d_recv, n, COMM_F32, &req[2]);
  for (int i = 0; i < 3; i++) {
    fsdp_status w = comm_wait(&req[i]);
    if (st == FSDP_OK) st = w;
  }
  uint64_t h1 = monotime_us();
  if (st == FSDP_OK) st = comm_barrier(c);
  comm_set_trace(c, NULL, TRACE_COMM);
  if (st != FSDP_OK) {
    snprintf(detail, sizeof detail, "%s: %s", fsdp_strerror(st), fsdp_last_error());
    verdict("nccl[1] spans: the collectives", 0, detail);
    trace_destroy(&t);
    free_all();
    return;
  }
  trace_span *v = NULL;
  size_t nv = 0;
  st = trace_collect(t, 7, 7, &v, &nv);
  static const trace_kind kinds[3] = {TRACE_ALLGATHER, TRACE_REDUCESCATTER, TRACE_ALLREDUCE};
  static const int units[3] = {3, 4, TRACE_NO_UNIT};
  const uint64_t slack = 1000;   /* µs: the anchor is read on the host, the spans on the device */
  int ok = st == FSDP_OK && nv == 3;
  snprintf(detail, sizeof detail, "%zu spans of step 7 (expected 3: all-gather, reduce-scatter, all-reduce)", nv);
  for (size_t i = 0; ok && i < 3; i++) {
    const trace_span *sp = &v[i];
    ok = sp->kind == kinds[i] && sp->unit == units[i] && sp->lane == TRACE_COMM && sp->step == 7 && sp->t0_us >= h0 &&
         sp->t0_us <= sp->t1_us && sp->t1_us <= h1 + slack && (i == 0 || v[i - 1].t1_us <= sp->t0_us + slack);
    snprintf(detail, sizeof detail, "span %zu: kind %d unit %d lane %d step %d, [%+lld, %+lld] µs from the issue, "
             "the waits returned at %+lld", i, sp->kind, sp->unit, sp->lane, sp->step, (long long)(sp->t0_us - h0),
             (long long)(sp->t1_us - h0), (long long)(h1 - h0));
  }
  if (ok)
    snprintf(detail, sizeof detail, "all-gather %llu µs, reduce-scatter %llu µs, all-reduce %llu µs of 16 MiB",
             (unsigned long long)(v[0].t1_us - v[0].t0_us), (unsigned long long)(v[1].t1_us - v[1].t0_us),
             (unsigned long long)(v[2].t1_us - v[2].t0_us));
  verdict("nccl[1] spans: one per collective at comm_wait, named, in the host's window, in order", ok, detail);
  free(v);
  trace_destroy(&t);
  free_all();
}

static void check_comms_world1(void) {
  printf("\n== comms, world 1, device 0 ==\n");
  char detail[512];
  uint64_t m0 = mem_comm_now();
  uint8_t id[128];
  comm_t *c = NULL;
  fsdp_clear_error();
  fsdp_status st = comm_nccl_get_unique_id(id);
  if (st == FSDP_OK) st = comm_new_nccl(0, 1, id, 0, 60.0, &c);
  snprintf(detail, sizeof detail, "%s", st == FSDP_OK ? "" : fsdp_last_error());
  verdict("nccl[1] comm_nccl_get_unique_id + comm_new_nccl", st == FSDP_OK, detail);
  if (st == FSDP_OK) {
    verdict("nccl[1] comm_nccl_stream is set", comm_nccl_stream(c) != NULL, "");
    check_nccl_spans(c);
    check_comm_world1(c, "nccl[1]", "nccl");
    comm_destroy(&c);
    uint64_t m1 = mem_comm_now();
    snprintf(detail, sizeof detail, "MEM_COMM %llu bytes before, %llu after destroy", (unsigned long long)m0,
             (unsigned long long)m1);
    verdict("nccl[1] comm_destroy returns MEM_COMM bytes", c == NULL && m1 == m0, detail);
  }

  fsdp_clear_error();
  st = comm_new_gloo_staged(0, 1, NULL, NULL, "gpu_check", 60.0, 0, 0, &c);
  verdict("gloo-staged[1] comm_new_gloo_staged (no rendezvous)", st == FSDP_OK, st == FSDP_OK ? "" : fsdp_last_error());
  if (st == FSDP_OK) {
    check_comm_world1(c, "gloo-staged[1]", "gloo-staged");
    comm_destroy(&c);
  }
  fflush(stdout);
}

/* ---- NCCL with two processes, one GPU each (forked before any CUDA call) ---- */

static int write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, void *p, size_t n) {
  char *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Small integers, exact in bf16 (up to 256) and in any summation order. */
static float rank_value(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 61 + 1)); }

static void put_value(void *buf, comm_dtype dt, size_t i, float f) {
  if (dt == COMM_F32) {
    ((float *)buf)[i] = f;
  } else {
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
  }
}

static float get_value(const void *buf, comm_dtype dt, size_t i) {
  if (dt == COMM_F32) return ((const float *)buf)[i];
  uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The two-process checks: NCCL with one GPU per rank, or the staged gloo comm with both ranks on
 * device 0 (what it exists for: workers sharing a GPU). */
typedef enum { MP_NCCL = 0, MP_STAGED } mp_kind;
static const char *const kMpLabel[] = {"nccl[2]", "gloo-staged[2]"};

#define CHILD_FAIL(...)                                    \
  do {                                                     \
    printf("%s rank %d: FAIL: ", kMpLabel[kind], rank);   \
    printf(__VA_ARGS__);                                   \
    printf("\n");                                          \
    fails++;                                               \
  } while (0)

/* id_fd: NCCL's unique id goes from rank 0 to rank 1 through this pipe end; store_dir: the gloo
 * rendezvous directory (staged). */
static int mp_rank_main(mp_kind kind, int rank, int world, int id_fd, const char *store_dir) {
  uint8_t id[128];
  int fails = 0;
  comm_t *c = NULL;
  if (kind == MP_STAGED) {
    if (comm_new_gloo_staged(rank, world, store_dir, NULL, "gpu_check", 60.0, 0, (size_t)4 << 20, &c) != FSDP_OK) {
      CHILD_FAIL("comm_new_gloo_staged on device 0: %s", fsdp_last_error());
      return 1;
    }
  } else if (rank == 0) {
    fsdp_status st = comm_nccl_get_unique_id(id);
    if (st != FSDP_OK) {
      CHILD_FAIL("comm_nccl_get_unique_id: %s", fsdp_last_error());
      return 1;
    }
    for (int r = 1; r < world; r++)
      if (write_all(id_fd, id, sizeof id) != 0) {
        CHILD_FAIL("cannot pass the unique id through the pipe: %s", strerror(errno));
        return 1;
      }
  } else if (read_all(id_fd, id, sizeof id) != 0) {
    CHILD_FAIL("no unique id from rank 0 (it failed before sending it)");
    return 1;
  }
  if (kind == MP_NCCL) {
    close(id_fd);
    if (comm_new_nccl(rank, world, id, rank, 60.0, &c) != FSDP_OK) {
      CHILD_FAIL("comm_new_nccl on device %d: %s", rank, fsdp_last_error());
      return 1;
    }
  }
  const size_t n = 1000003;
  uint64_t want[COLL_NKIND] = {0};
  for (int t = 0; t < 2; t++) {
    comm_dtype dt = t ? COMM_BF16 : COMM_F32;
    size_t esz = comm_dtype_size(dt), big = (size_t)world * n;
    void *h = xmalloc(big * esz), *d_send = NULL, *d_recv = NULL;
    CU(cudaMalloc(&d_send, big * esz));
    CU(cudaMalloc(&d_recv, big * esz));
    /* all-gather: block r of the result is rank r's input */
    for (size_t i = 0; i < n; i++) put_value(h, dt, i, rank_value(rank, i));
    CU(cudaMemcpy(d_send, h, n * esz, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    if (comm_allgather(c, d_send, d_recv, n, dt, NULL) != FSDP_OK) CHILD_FAIL("all-gather: %s", fsdp_last_error());
    want[COLL_ALLGATHER] += n * esz * (uint64_t)(world - 1);
    CU(cudaMemcpy(h, d_recv, big * esz, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (int r = 0; r < world; r++)
      for (size_t i = 0; i < n; i++) bad += get_value(h, dt, (size_t)r * n + i) != rank_value(r, i);
    if (bad) CHILD_FAIL("all-gather %s: %zu wrong elements", t ? "bf16" : "f32", bad);
    /* reduce-scatter: element j of every rank's input is (rank+1)·(j%61+1); the sum over ranks is
     * world(world+1)/2·(j%61+1) */
    for (size_t j = 0; j < big; j++) put_value(h, dt, j, rank_value(rank, j));
    CU(cudaMemcpy(d_send, h, big * esz, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    comm_req *req = NULL;
    if (comm_reduce_scatter(c, d_send, d_recv, n, dt, &req) != FSDP_OK || comm_wait(&req) != FSDP_OK)
      CHILD_FAIL("reduce-scatter: %s", fsdp_last_error());
    want[COLL_REDUCESCATTER] += n * esz * (uint64_t)(world - 1);
    CU(cudaMemcpy(h, d_recv, n * esz, cudaMemcpyDeviceToHost));
    float tri = (float)(world * (world + 1) / 2);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += get_value(h, dt, i) != tri * (float)(((size_t)rank * n + i) % 61 + 1);
    if (bad) CHILD_FAIL("reduce-scatter %s: %zu wrong elements", t ? "bf16" : "f32", bad);
    /* all-reduce in place */
    for (size_t i = 0; i < n; i++) put_value(h, dt, i, rank_value(rank, i));
    CU(cudaMemcpy(d_recv, h, n * esz, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    if (comm_allreduce(c, d_recv, n, dt, &req) != FSDP_OK || comm_wait(&req) != FSDP_OK)
      CHILD_FAIL("all-reduce: %s", fsdp_last_error());
    want[COLL_ALLREDUCE] += 2 * n * esz * (uint64_t)(world - 1) / (uint64_t)world;
    CU(cudaMemcpy(h, d_recv, n * esz, cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += get_value(h, dt, i) != tri * (float)(i % 61 + 1);
    if (bad) CHILD_FAIL("all-reduce %s: %zu wrong elements", t ? "bf16" : "f32", bad);
    CU(cudaFree(d_send));
    CU(cudaFree(d_recv));
    free(h);
  }
  if (comm_barrier(c) != FSDP_OK) CHILD_FAIL("barrier: %s", fsdp_last_error());
  uint64_t sent[COLL_NKIND];
  comm_sent_bytes(c, sent);
  for (int k = 0; k < COLL_NKIND; k++)
    if (sent[k] != want[k])
      CHILD_FAIL("comm_sent_bytes[%d] = %llu, expected %llu", k, (unsigned long long)sent[k],
                 (unsigned long long)want[k]);

  /* Bandwidth, nccl-tests' way: S = the whole gathered size, algbw = S/t, busbw = algbw·(n−1)/n. */
  if (!fails) {
    /* fp32 elements per rank: 128 MiB with NCCL, 16 MiB through the host (gloo over loopback) */
    const size_t per = kind == MP_NCCL ? (size_t)32 << 20 : (size_t)4 << 20;
    void *d_send = NULL, *d_recv = NULL;
    CU(cudaMalloc(&d_send, per * 4));
    CU(cudaMalloc(&d_recv, per * 4 * (size_t)world));
    CU(cudaMemset(d_send, 0, per * 4));
    CU(cudaDeviceSynchronize());
    for (int k = 0; k < 2; k++) {
      const int warm = 3, iters = 10;
      double t0 = 0;
      for (int it = 0; it < warm + iters && !fails; it++) {
        if (it == warm) t0 = monotime_s();
        fsdp_status st = k == 0 ? comm_allgather(c, d_send, d_recv, per, COMM_F32, NULL)
                                : comm_reduce_scatter(c, d_recv, d_send, per, COMM_F32, NULL);
        if (st != FSDP_OK) CHILD_FAIL("%s bandwidth run: %s", k ? "reduce-scatter" : "all-gather", fsdp_last_error());
      }
      double t = (monotime_s() - t0) / iters, S = (double)per * 4 * world;
      if (!fails && rank == 0)
        printf("%s %-15s S=%.0f MiB  time %.3f ms  algbw %.2f GB/s  busbw %.2f GB/s\n", kMpLabel[kind],
               k ? "reduce-scatter" : "all-gather", S / (1 << 20), 1e3 * t, S / t / 1e9,
               S / t / 1e9 * (world - 1) / world);
    }
    CU(cudaFree(d_send));
    CU(cudaFree(d_recv));
  }
  comm_destroy(&c);
  printf("%s rank %d: %s (all-gather, reduce-scatter, all-reduce in f32 and bf16, barrier, sent bytes)\n",
         kMpLabel[kind], rank, fails ? "FAIL" : "PASS");
  fflush(stdout);
  return fails ? 1 : 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  remove(path);   /* best effort: a leftover rendezvous file in /tmp harms nothing */
  return 0;
}

/* Runs a two-rank check in two forked children (before this process touches CUDA); returns 1
 * when both ranks passed. */
static int check_two_ranks(mp_kind kind) {
  const int world = 2;
  const char *label = kMpLabel[kind];
  const double limit_s = 150;
  char store[] = "/tmp/gpu_check_store.XXXXXX";
  if (kind == MP_STAGED && !mkdtemp(store)) {
    printf("%s: FAIL: mkdtemp %s: %s\n", label, store, strerror(errno));
    return 0;
  }
  int fd[2];
  if (pipe(fd) != 0) {
    printf("%s: FAIL: pipe: %s\n", label, strerror(errno));
    return 0;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid[2];
  for (int r = 0; r < world; r++) {
    pid[r] = fork();
    if (pid[r] < 0) {
      printf("%s: FAIL: fork: %s\n", label, strerror(errno));
      if (r == 1) {
        kill(pid[0], SIGKILL);
        waitpid(pid[0], NULL, 0);
      }
      close(fd[0]);
      close(fd[1]);
      return 0;
    }
    if (pid[r] == 0) {
      close(r == 0 ? fd[0] : fd[1]);
      int rc = mp_rank_main(kind, r, world, r == 0 ? fd[1] : fd[0], store);
      fflush(stdout);
      _exit(rc);
    }
  }
  close(fd[0]);
  close(fd[1]);
  int ok = 1, left = world;
  int done[2] = {0, 0};
  double deadline = monotime_s() + limit_s;
  while (left > 0) {
    for (int r = 0; r < world; r++) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pid[r], &status, WNOHANG) == pid[r]) {
        done[r] = 1;
        left--;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          ok = 0;
          if (WIFSIGNALED(status)) printf("%s rank %d: FAIL: killed by signal %d\n", label, r, WTERMSIG(status));
        }
      }
    }
    if (left > 0 && monotime_s() > deadline) {
      printf("%s: FAIL: the ranks did not finish within %.0f s; killing them\n", label, limit_s);
      for (int r = 0; r < world; r++)
        if (!done[r]) {
          kill(pid[r], SIGKILL);
          waitpid(pid[r], NULL, 0);
        }
      ok = 0;
      break;
    }
    if (left > 0) {
      struct timespec ts = {0, 20 * 1000 * 1000};   /* polling the children's exit, with a deadline */
      nanosleep(&ts, NULL);
    }
  }
  if (kind == MP_STAGED) nftw(store, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return ok;
}

/* ---- device probe (in a child, so that the parent can still fork NCCL ranks afterwards) ---- */

/* Returns the device count, or -1 with the reason in why. */
static int probe_devices(char *why, size_t len) {
  int fd[2];
  if (pipe(fd) != 0) {
    snprintf(why, len, "pipe: %s", strerror(errno));
    return -1;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, len, "fork: %s", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    close(fd[0]);
    char msg[512];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) snprintf(msg, sizeof msg, "E cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(e),
                                   cudaGetErrorName(e));
    else snprintf(msg, sizeof msg, "N %d", n);
    write_all(fd[1], msg, strlen(msg) + 1);
    _exit(0);
  }
  close(fd[1]);
  char msg[512] = "";
  size_t got = 0;
  for (;;) {
    ssize_t r = read(fd[0], msg + got, sizeof msg - 1 - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  msg[got] = '\0';
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (msg[0] == 'N') return atoi(msg + 2);
  if (msg[0] == 'E') snprintf(why, len, "%s", msg + 2);
  else if (WIFSIGNALED(status)) snprintf(why, len, "the CUDA probe was killed by signal %d", WTERMSIG(status));
  else snprintf(why, len, "the CUDA probe exited without an answer (status %d)", status);
  return -1;
}

int main(int argc, char **argv) {
  (void)argc;
  /* The CPU reference's GEMMs: OpenBLAS picks its kernels when it loads; on CPUs it does not know
   * it falls back to slow SSE3 ones unless OPENBLAS_CORETYPE says otherwise (as fsdp-worker does). */
  const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : ops_cpu_blas_better_core();
  if (core) {
    setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv);   /* returns only on failure: then run with the slow kernels */
  }
  setvbuf(stdout, NULL, _IOLBF, 0);

  char why[512] = "";
  int ndev = probe_devices(why, sizeof why);
  if (ndev <= 0) {
    fprintf(stderr,
            "gpu_check: no CUDA device: %s. These checks need an NVIDIA GPU and its driver; run "
            "tests/gpu/run.sh on such a machine (docs/gpu.md).\n",
            ndev == 0 ? "cudaGetDeviceCount found 0 devices" : why);
    return 2;
  }
  printf("gpu_check: %d CUDA device(s)\n", ndev);

  /* The two-process checks first: their ranks are forked before this process makes any CUDA call. */
  printf("\n== comms, two processes ==\n");
  if (ndev >= 2) {
    verdict("nccl[2] two ranks on devices 0 and 1", check_two_ranks(MP_NCCL), "");
  } else {
    printf("nccl[2]: SKIPPED: needs 2 GPUs (NCCL does not run two ranks on one device); this machine has 1\n");
  }
  verdict("gloo-staged[2] two ranks sharing device 0", check_two_ranks(MP_STAGED), "");

  CU(cudaSetDevice(0));
  struct cudaDeviceProp prop;
  CU(cudaGetDeviceProperties(&prop, 0));
  int rt = 0, drv = 0;
  CU(cudaRuntimeGetVersion(&rt));
  CU(cudaDriverGetVersion(&drv));
  printf("\ndevice 0: %s, compute capability %d.%d, %d SMs, %.1f GiB; CUDA runtime %d, driver %d\n", prop.name,
         prop.major, prop.minor, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30), rt, drv);
  const char *seed_env = getenv("GPU_CHECK_SEED");
  uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  rng_seed(seed);
  printf("random inputs: GPU_CHECK_SEED=%llu (set it to repeat this run's inputs)\n", (unsigned long long)seed);
  CU(cudaStreamCreate(&g_ctx.stream));
  CU(cudaEventCreate(&g_ev0));
  CU(cudaEventCreate(&g_ev1));
  cublasStatus_t bs = cublasLtCreate(&g_ctx.lt);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "gpu_check: FATAL: cublasLtCreate: %s\n", cublasLtGetStatusString(bs));
    return 1;
  }
  g_ctx.workspace_bytes = OPS_CUDA_WORKSPACE_MIN;
  CU(cudaMalloc(&g_ctx.workspace, g_ctx.workspace_bytes));

  check_model_ops(1);
  check_llama_ops(1);
  check_docmask_ops();
  check_util_ops();
  check_lora_ops();
  measure_gemm_rate();
  measure_copy_rate();
  roofline_print();
  check_comms_world1();

  cublasLtDestroy(g_ctx.lt);
  CU(cudaFree(g_ctx.workspace));
  cudaEventDestroy(g_ev0);
  cudaEventDestroy(g_ev1);
  cudaStreamDestroy(g_ctx.stream);
  printf("\ngpu_check: %d checks passed, %d failed: %s\n", g_pass, g_fail, g_fail ? "FAIL" : "PASS");
  return g_fail ? 1 : 0;
}
