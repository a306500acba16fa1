/* comm — the collectives FSDP needs: all-gather, reduce-scatter, all-reduce (sum) and barrier,
 * asynchronous, with a completion handle, a timeout, and byte counters. docs/comm.md explains it.
 *
 * Backends behind the one comm_t:
 *   gloo        CPU workers (Debian's libgloo, TCP). A gloo collective blocks, so each comm owns one
 *               communication thread that runs the collectives in FIFO order; the caller computes
 *               meanwhile. comm_gloo.cc is the only C++ and exposes a C API (comm_gloo_*).
 *   nccl        CUDA workers (comm_nccl.c, CUDA build only): its own stream, a cudaEvent per
 *               collective, a non-blocking communicator so that an abort is always possible.
 *   gloo staged CUDA workers sharing a GPU in tests (comm_stage_cuda.c): device buffers copied
 *               through pinned host memory around the gloo collectives, on the comm thread.
 * Rendezvous: a directory (gloo FileStore, --standalone) or the coordinator's key-value service
 * through comm_kv callbacks. The directory must be fresh per job (stale keys would be read).
 *
 * Ownership and threads: a comm_t is used by one caller thread (the worker's step executor); the
 * comm thread is internal. Buffers passed to an asynchronous collective must stay alive and
 * untouched until comm_wait() returns. Every rank must issue the same collectives in the same
 * order. A collective that fails (a peer died, a timeout) fails the comm: every later call returns
 * an error at once. Errors are recorded with fsdp_set_error() on the caller's thread.
 */
#ifndef FSDP_COMM_H
#define FSDP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "err.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct comm comm_t;           /* opaque */
typedef struct comm_req comm_req;     /* completion handle of an asynchronous collective */
/* Element types. COMM_BF16 sums round to bf16 after every addition, on every backend (gloo in the
 * adapter, NCCL with ncclBfloat16). */
typedef enum { COMM_F32 = 0, COMM_BF16 } comm_dtype;

/* Rendezvous store: either a directory (file store) or callbacks a worker routes to the
 * coordinator's KV service. get blocks until the key exists or timeout_s passes
 * (FSDP_ERR_TIMEOUT); *val is malloc'd and freed by the caller. The callbacks are called from the
 * thread that calls comm_new_gloo(), during that call only. */
typedef struct comm_kv {
  void *ctx;
  fsdp_status (*set)(void *ctx, const char *key, const void *val, size_t len);
  fsdp_status (*get)(void *ctx, const char *key, void **val, size_t *len, double timeout_s);
} comm_kv;

/* Join a gloo group of WORLD ranks as RANK. Exactly one of store_dir and kv is non-NULL (with
 * world = 1 both may be NULL: no rendezvous). PREFIX namespaces the keys (e.g. the job id and an
 * attempt counter) so that several groups can share one store. timeout_s bounds the rendezvous and
 * every collective. The address each rank publishes is FSDP_GLOO_IFACE (an interface name) or
 * FSDP_GLOO_HOST (a host name or IP) from the environment; by default a random loopback address
 * 127.X.Y.Z of its own with a store directory (one machine; comm_gloo.cc says why not 127.0.0.1)
 * and this host's name with a KV store. */
fsdp_status comm_new_gloo(int rank, int world, const char *store_dir, const comm_kv *kv,
                          const char *prefix, double timeout_s, comm_t **out);

/* recv = world·count elements, rank r's block at r·count. req == NULL: blocking. */
fsdp_status comm_allgather(comm_t *c, const void *send, void *recv, size_t count, comm_dtype dt,
                           comm_req **req);
/* Sum; send holds world·count elements, rank r receives in recv (count) the sum of every rank's
 * block r. The summation order is fixed (ring order, independent of timing). */
fsdp_status comm_reduce_scatter(comm_t *c, const void *send, void *recv, size_t count,
                                comm_dtype dt, comm_req **req);
/* Sum, in place. Every rank ends with the same bits. */
fsdp_status comm_allreduce(comm_t *c, void *buf, size_t count, comm_dtype dt, comm_req **req);
/* Blocks until every rank has entered the barrier (after every collective issued before it). */
fsdp_status comm_barrier(comm_t *c);
/* Stream-ordered variants (device.h): the collective starts only once AFTER's latest mark at the
 * time of the call is complete (NULL: at once), and marks DONE at the call, completing that mark
 * when the collective has finished, successfully or not (NULL: no event). So a gather into a buffer
 * the compute stream still reads is issued with after = an event recorded after the last reader,
 * and compute that reads the result waits on done (device wait). A failed collective still
 * completes DONE (the data are then garbage; comm_wait reports the failure). The host-side
 * comm_wait() stays: every request is still waited and freed by the caller. */
fsdp_status comm_allgather_ev(comm_t *c, const void *send, void *recv, size_t count, comm_dtype dt,
                              dev_event *after, dev_event *done, comm_req **req);
fsdp_status comm_reduce_scatter_ev(comm_t *c, const void *send, void *recv, size_t count, comm_dtype dt,
                                   dev_event *after, dev_event *done, comm_req **req);
fsdp_status comm_allreduce_ev(comm_t *c, void *buf, size_t count, comm_dtype dt, dev_event *after, dev_event *done,
                              comm_req **req);
/* Completes and frees *req (NULL-safe; *req becomes NULL). Every request must be waited, before
 * comm_destroy(). FSDP_ERR_TIMEOUT (the message names
 * the collective and the timeout) if it did not complete within timeout_s; FSDP_ERR_COMM if it
 * failed. */
fsdp_status comm_wait(comm_req **req);

/* Cumulative logical bytes this rank sent, by COLL_* kind: S·(N−1)/N for an all-gather or
 * reduce-scatter of S total bytes, 2·S·(N−1)/N for an all-reduce (plan.h's ring accounting),
 * counted when a collective completes successfully. */
void comm_sent_bytes(const comm_t *c, uint64_t out[COLL_NKIND]);
int comm_rank(const comm_t *c);
int comm_world(const comm_t *c);
/* The backend's name: "local", "gloo", "nccl", "gloo-staged". */
const char *comm_backend_name(const comm_t *c);
/* Waits for queued collectives to finish (or fail), then frees. NULL-safe; *c becomes NULL. */
void comm_destroy(comm_t **c);

/* Spans (trace.h): with a trace set (before the first collective; NULL: none), each all-gather,
 * reduce-scatter and all-reduce records a span on LANE (a comm lane) from when it starts running
 * (after its `after` event) to when it ends, named by the unit given to comm_trace_unit just before
 * it was issued (TRACE_NO_UNIT otherwise) and the trace's step at issue. Threaded and local
 * backends take the times on the comm thread; NCCL takes them on its stream with timing events and
 * records the span when comm_wait sees the collective complete (comm_nccl.c). Caller's thread,
 * like the collectives. */
void comm_set_trace(comm_t *c, trace_t *t, trace_lane lane);
void comm_trace_unit(comm_t *c, int unit);

#ifdef FSDP_HAVE_CUDA
/* NCCL (comm_nccl.c). Rank 0 makes the id and hands it to every rank (comm_boot.h: through the
 * coordinator's KV, or the rendezvous directory in --standalone). send/recv are device pointers on
 * DEVICE. Collectives run on the comm's own stream: the _ev variants make it wait for `after`'s
 * native event (cudaStreamWaitEvent) and record `done`'s native event after the collective, so
 * the compute stream orders itself by the CUDA device's events (device.h); without events the
 * caller synchronizes. comm_wait() returns once the collective finished on the device. */
fsdp_status comm_nccl_get_unique_id(uint8_t out[128]);
fsdp_status comm_new_nccl(int rank, int world, const uint8_t id[128], int device, double timeout_s,
                          comm_t **out);
/* A sub-communicator of the NCCL comm PARENT (ncclCommSplit, NCCL >= 2.18; FSDP_ERR_UNSUPPORTED
 * before, and the caller makes one from its own unique id instead): the ranks that pass the same
 * COLOR form one comm of WORLD ranks, ordered by KEY (this rank's rank in it). Collective over
 * PARENT: every rank calls it, in the same order. Same device and timeout as PARENT. */
fsdp_status comm_nccl_split(comm_t *parent, int color, int key, int world, comm_t **out);
/* The cudaStream_t the comm enqueues on (as void *), for cudaStreamWaitEvent ordering. */
void *comm_nccl_stream(const comm_t *c);

/* gloo for CUDA workers (comm_stage_cuda.c): same arguments as comm_new_gloo plus the device;
 * send/recv/buf are device pointers, staged through pinned host buffers counted under MEM_COMM.
 * The staging copies run on the comm's own stream, from the comm thread, after `after`'s CPU mark
 * (the CUDA device must have host_marks set, device.h) or, with no CPU mark, after the caller's
 * stream work is complete; `done`'s native event is recorded after the copy back. */
/* STAGE_BYTES: the pinned buffer, allocated here once and freed by comm_destroy (never while
 * collectives run: cudaMallocHost and cudaFreeHost synchronize the device, which may be parked
 * waiting for the collective); at least (world + 1)·64 KiB; larger collectives are staged in
 * pieces. A job passes plan_stage_bytes(plan). None is allocated with world = 1. */
fsdp_status comm_new_gloo_staged(int rank, int world, const char *store_dir, const comm_kv *kv,
                                 const char *prefix, double timeout_s, int device, size_t stage_bytes, comm_t **out);
#endif

/* ---- Backend interface: for comm.c, comm_gloo.cc, comm_nccl.c, comm_stage_cuda.c only. ---- */

typedef enum { COMM_OP_ALLGATHER = 0, COMM_OP_REDUCESCATTER, COMM_OP_ALLREDUCE, COMM_OP_BARRIER } comm_op_kind;

typedef struct comm_op {
  comm_op_kind kind;
  const void *send;    /* allgather, reduce-scatter */
  void *recv;          /* allgather, reduce-scatter; the buffer of an all-reduce */
  size_t count;        /* as in the public call */
  comm_dtype dt;
  dev_event *after;    /* start once mark after_ticket of AFTER is complete (NULL: at once) */
  uint64_t after_ticket;
  dev_event *done;     /* complete mark done_ticket of DONE when finished (NULL: none) */
  uint64_t done_ticket;
  /* Its span (comm_set_trace; set by comm.c at issue): trace NULL = none. Threaded and local
   * backends' spans are recorded by comm.c; a streamed backend records its own, timed on its
   * stream (NCCL), or none. */
  trace_t *trace;
  trace_lane lane;
  int unit, step;
} comm_op;

/* A backend is either threaded (run != NULL: comm.c runs each op on the comm thread, blocking) or
 * streamed (submit/poll: the op is enqueued on a device stream, comm_wait polls it). Backends
 * record their error message with fsdp_set_error() on the thread that calls them. */
typedef struct comm_backend {
  const char *name;
  fsdp_status (*run)(void *impl, const comm_op *op);
  fsdp_status (*submit)(void *impl, const comm_op *op, void **token);
  /* *done = 1 when finished (token then released); an error status when it failed. */
  fsdp_status (*poll)(void *impl, void *token, int *done);
  void (*release)(void *impl, void *token);   /* drop a token without waiting (after a failure) */
  void (*abort)(void *impl);                   /* make pending and future work fail at once */
  void (*destroy)(void *impl);
} comm_backend;

/* Wrap a backend instance into a comm_t (takes ownership of impl, destroying it on failure). */
fsdp_status comm_wrap(const comm_backend *be, void *impl, int rank, int world, double timeout_s,
                      comm_t **out);
/* The backend instance of C if its backend is BE, else NULL. */
void *comm_backend_impl(const comm_t *c, const comm_backend *be);
const char *comm_op_name(comm_op_kind k);   /* "all-gather", "reduce-scatter", ... */
/* The span kind of an op (TRACE_ALLGATHER, ...), or -1 for one that records none (the barrier). */
int comm_op_trace_kind(comm_op_kind k);
size_t comm_dtype_size(comm_dtype dt);

/* The gloo adapter's C API (comm_gloo.cc). world ≥ 2. The address rule is comm_new_gloo's. */
typedef struct comm_gloo comm_gloo;
fsdp_status comm_gloo_new(int rank, int world, const char *store_dir, const comm_kv *kv,
                          const char *prefix, double timeout_s, comm_gloo **out);
fsdp_status comm_gloo_run(void *g, const comm_op *op);   /* blocking; comm_backend.run */
void comm_gloo_abort(void *g);
void comm_gloo_destroy(void *g);
/* The gloo adapter's test hooks (docs/testing.md), nonzero to run the reduce-scatter ring backwards
 * (FSDP_SUM_ORDER=reverse_ring) or to drop every reduce-scatter, each rank keeping its own partial
 * block (FSDP_FAULT=drop_reduce_scatter). In fsdp-worker 0 (comm_gloo.cc's weak definitions); the
 * test binaries that need them link tests/hooks/sum_order.c instead. Any thread. */
int comm_test_reverse_ring(void);
int comm_test_drop_reduce_scatter(void);

#ifdef __cplusplus
}
#endif

#endif
