/* stage_check — gloo staged (worker/cuda/comm_stage_cuda.c) beside the CUDA device
 * (worker/cuda/device_cuda.c), both the real host code, on the CUDA-runtime shim of
 * tests/gpu/shim (real streams; cudaMallocHost, cudaFreeHost and cudaFree wait for every stream,
 * including one parked in a host function). Two forked ranks run all-gathers, reduce-scatters and
 * all-reduces of growing size (f32 and bf16; the largest several times the staging buffer) the
 * way the runtime issues them during a step: the collective starts after an event recorded on the
 * compute stream, and the compute stream then waits for its end, parked in a host function until
 * the comm thread completes the collective. A staged comm that allocates or frees pinned memory
 * inside a collective then waits for a stream that waits for it: on a GPU a hang, here a counted,
 * bounded failure (the shim's FSDP_SHIM_SYNC_S, then the group's deadline). Every result is
 * checked against its exact value. Then a wait on a mark no comm completes must fail sync() after
 * the device's wait bound (the job's timeout_s). ctest gpu_stage_shim; no GPU needed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "cudart_shim.h"
#include "device.h"
#include "monotime.h"
#include "ranks.h"

#define WORLD 2
#define STAGE_BYTES ((size_t)256 << 10)   /* smaller than the largest collective: staged in pieces */

static const size_t kCounts[] = {1000, 8000, 64000, 400000};   /* per-rank block, growing as units do */

/* Small integers: exact in bf16 and f32, and so are their sums over two ranks (< 256). */
static float value(int rank, size_t i) { return (float)(i % 61) + 64.0f * (float)rank; }

static void put(void *buf, comm_dtype dt, size_t i, float v) {
  if (dt == COMM_F32) ((float *)buf)[i] = v;
  else {
    uint32_t u;
    memcpy(&u, &v, 4);
    ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);   /* exact for these values */
  }
}

static float get(const void *buf, comm_dtype dt, size_t i) {
  if (dt == COMM_F32) return ((const float *)buf)[i];
  uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
  float v;
  memcpy(&v, &u, 4);
  return v;
}

typedef struct rank_ctx {
  device_t *dev;
  comm_t *comm;
  dev_event *gate, *after, *done;
  int rank;
} rank_ctx;

/* Issue one collective as a step does, with the compute stream held (GATE) until both the record
 * of AFTER and the wait on DONE are queued behind it: so the stream is parked in the wait's host
 * function whenever the comm thread runs the collective. */
static fsdp_status issue(rank_ctx *r, comm_op_kind kind, void *send, void *recv, size_t count, comm_dtype dt) {
  device_t *d = r->dev;
  uint64_t g = dev_event_mark(r->gate);
  d->op->wait(d, r->gate, DEV_T_COMPUTE);
  d->op->record(d, r->after);
  comm_req *req = NULL;
  fsdp_status st;
  if (kind == COMM_OP_ALLGATHER) st = comm_allgather_ev(r->comm, send, recv, count, dt, r->after, r->done, &req);
  else if (kind == COMM_OP_REDUCESCATTER)
    st = comm_reduce_scatter_ev(r->comm, send, recv, count, dt, r->after, r->done, &req);
  else st = comm_allreduce_ev(r->comm, recv, count, dt, r->after, r->done, &req);
  if (st == FSDP_OK) d->op->wait(d, r->done, DEV_T_GATHER);
  dev_event_complete(r->gate, g);
  fsdp_status w = comm_wait(&req);
  fsdp_status s = d->op->sync(d);
  return st != FSDP_OK ? st : w != FSDP_OK ? w : s;
}

/* One collective of COUNT elements per block; its result checked element by element. 0 when it ran
 * and was right. */
static int one(rank_ctx *r, comm_op_kind kind, size_t count, comm_dtype dt) {
  const size_t es = comm_dtype_size(dt), in_n = kind == COMM_OP_REDUCESCATTER ? WORLD * count : count;
  const size_t out_n = kind == COMM_OP_ALLGATHER ? WORLD * count : count;
  device_t *d = r->dev;
  void *h = malloc(WORLD * count * es);
  void *send = d->op->alloc(d, MEM_ACTIVATIONS, in_n * es), *recv = d->op->alloc(d, MEM_ACTIVATIONS, out_n * es);
  int ok = 0;
  CHECK(h && send && recv);
  if (!h || !send || !recv) goto out;
  for (size_t i = 0; i < in_n; i++) put(h, dt, i, value(r->rank, i));
  CHECK_OK(d->op->upload(d, kind == COMM_OP_ALLREDUCE ? recv : send, h, in_n * es));
  fsdp_status st = issue(r, kind, send, recv, count, dt);
  CHECK_OK(st);
  if (st != FSDP_OK) goto out;
  CHECK_OK(d->op->download(d, h, recv, out_n * es));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < out_n; i++) {
    float want = kind == COMM_OP_ALLGATHER ? value((int)(i / count), i % count)
                 : kind == COMM_OP_REDUCESCATTER
                     ? value(0, (size_t)r->rank * count + i) + value(1, (size_t)r->rank * count + i)
                     : value(0, i) + value(1, i);
    if (get(h, dt, i) != want && !bad++) first = i;
  }
  if (bad)
    fprintf(stderr, "rank %d: %s of %zu %s elements: %zu wrong, the first at %zu (%g)\n", r->rank,
            kind == COMM_OP_ALLGATHER ? "all-gather" : kind == COMM_OP_REDUCESCATTER ? "reduce-scatter" : "all-reduce",
            count, dt == COMM_F32 ? "f32" : "bf16", bad, first, (double)get(h, dt, first));
  CHECK_EQ_INT(0, bad);
  ok = bad == 0;
out:
  d->op->free(d, send);
  d->op->free(d, recv);
  free(h);
  return ok ? 0 : -1;
}

/* A wait on a mark that no comm thread will ever complete (a comm thread stuck or gone): the
 * stream's host function gives up after the device's wait_s and sync() fails with the reason,
 * instead of parking the stream for ever (it waited 1e9 s once). */
static void check_wait_bounded(void) {
  device_t *d = NULL;
  CHECK_OK(dev_new_cuda(0, 0.5, &d));
  if (!d) return;
  dev_event *e = dev_event_new(d);
  CHECK(e != NULL);
  if (e) {
    const uint64_t t = dev_event_mark(e);   /* pending: nobody completes it before sync returns */
    const double t0 = monotime_s();
    d->op->wait(d, e, DEV_T_GATHER);
    fsdp_status st = d->op->sync(d);
    const double took = monotime_s() - t0;
    CHECK_EQ_INT(FSDP_ERR_TIMEOUT, st);
    CHECK(strstr(fsdp_last_error(), "timeout_s") != NULL);
    CHECK(took >= 0.4 && took < 4.0);   /* the 0.5 s bound, not the shim's 5 s deadlock limit */
    fprintf(stderr, "bounded wait: %s after %.2f s\n", fsdp_last_error(), took);
    dev_event_complete(e, t);
    dev_event_destroy(&e);
  }
  dev_destroy(&d);
}

static int rank_main(int rank, int world, const char *dir, void *arg) {
  (void)arg;
  char store[128];
  snprintf(store, sizeof store, "%s/store", dir);
  rank_ctx r = {.rank = rank};
  CHECK_OK(dev_new_cuda(0, 20.0, &r.dev));
  if (!r.dev) return check_done();
  r.dev->host_marks = 1;   /* as worker/main.c sets it for gloo staged */
  CHECK_OK(comm_new_gloo_staged(rank, world, store, NULL, "stage", 20.0, 0, STAGE_BYTES, &r.comm));
  r.gate = dev_event_new(r.dev);
  r.after = dev_event_new(r.dev);
  r.done = dev_event_new(r.dev);
  CHECK(r.gate && r.after && r.done);
  int failed = !(r.comm && r.gate && r.after && r.done);   /* the first failure ends the sequence */
  for (int t = 0; t < 2 && !failed; t++)
    for (size_t k = 0; k < sizeof kCounts / sizeof *kCounts && !failed; k++)
      for (int kind = COMM_OP_ALLGATHER; kind <= COMM_OP_ALLREDUCE && !failed; kind++)
        failed = one(&r, (comm_op_kind)kind, kCounts[k], t ? COMM_BF16 : COMM_F32) != 0;
  comm_destroy(&r.comm);
  dev_event_destroy(&r.gate);
  dev_event_destroy(&r.after);
  dev_event_destroy(&r.done);
  dev_destroy(&r.dev);
  if (rank == 0) check_wait_bounded();
  CHECK_EQ_INT(0, cudart_shim_deadlocks());   /* no device-wide synchronization waited on a parked stream */
  return check_done();
}

int main(void) {
  ranks_run run = {.world = WORLD, .deadline_s = 60, .release_fd = -1};
  int failed = ranks_go(&run, rank_main, NULL);
  char why[64];
  for (int k = 0; k < WORLD; k++)
    if (run.status[k] != 0) printf("rank %d: %s\n", k, ranks_why(&run, k, why, sizeof why));
  ranks_cleanup(&run);
  printf("%s: %d of %d ranks failed\n", failed ? "FAIL" : "ok", failed, WORLD);
  return failed ? 1 : 0;
}
