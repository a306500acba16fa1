/* comm_nccl — the NCCL backend of comm.h (CUDA build only), a streamed backend for comm.c.
 *
 * One non-blocking communicator (config.blocking = 0) per comm, so that ncclCommAbort is always
 * possible: no NCCL call can block the caller forever. A collective with `after` makes the comm's
 * stream wait for that event's native cudaEvent (the compute stream's record) and one with `done`
 * records done's native event after the collective, so compute waits on the device, not the host. Every NCCL call may return ncclInProgress;
 * we then poll ncclCommGetAsyncError until it leaves that state or the deadline passes. Each
 * collective is enqueued on the comm's own stream and followed by a cudaEvent (from a small pool)
 * that comm_wait() polls together with ncclCommGetAsyncError; on timeout comm.c calls
 * nccl_abort(), which aborts the communicator, and the comm fails. Only the caller's thread uses
 * a comm. bf16 maps to ncclBfloat16; sums are ncclSum.
 *
 * Spans (comm_set_trace): a traced collective is bracketed on the stream by two timing events
 * (after the wait for `after`, so the span starts when the collective can run) from a fixed pool
 * of NCCL_SPANS pairs, made at the first traced collective. When the stream has nothing in flight
 * at a submit, an anchor timing event is recorded first and the host clock read right after it
 * (cuda_spans.h: on an idle stream it completes as it is recorded); every span submitted until the
 * stream is next idle is timed from that anchor. The span is recorded when comm_wait sees the
 * collective complete (its two events and the anchor are then complete too), so nothing waits:
 * no host synchronization, no stream wait. A collective issued with every pair in flight, or
 * before any anchor, records no span (counted; reported once, and at destroy).
 */
#ifndef FSDP_HAVE_CUDA
#define FSDP_HAVE_CUDA 1   /* this file is compiled only in the CUDA build (libfsdpcuda) */
#endif
#define _GNU_SOURCE
#include "comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_spans.h"
#include "log.h"
#include "mem.h"
#include "monotime.h"

_Static_assert(NCCL_UNIQUE_ID_BYTES == 128, "comm.h hands NCCL unique ids around as 128 bytes");

/* Traced collectives in flight (issued, not yet waited) per comm. A step keeps up to about 3 per
 * unit in flight (its reduce-scatters are waited at its end): 256 covers 80 units. */
#define NCCL_SPANS 256

typedef struct nccl_span {
  cudaEvent_t ev[2];       /* timing events: the collective's start and end on the stream */
  cudaEvent_t token;       /* the request's completion event while in flight; NULL: free */
  trace_t *trace;
  trace_lane lane;
  trace_kind kind;
  int unit, step;
} nccl_span;

typedef struct nccl_impl {
  ncclComm_t comm;
  cudaStream_t stream;
  int device, rank, world;
  double timeout_s;
  float *dbar;             /* one device float: the barrier is an all-reduce of it */
  int aborted;
  cudaEvent_t *pool;       /* free events */
  int npool, cap;
  int inflight;            /* tokens handed out and not yet polled done or released */

  /* spans (comm_set_trace): made at the first traced collective */
  nccl_span *spans;        /* NCCL_SPANS */
  int freel[NCCL_SPANS];   /* indices of free spans */
  int nfree, nbusy;
  int spans_off;           /* making the events failed: no spans */
  cudaEvent_t anchor;      /* timing event recorded on the idle stream at host time anchor_us */
  uint64_t anchor_us;
  int anchored;
  uint64_t dropped;        /* traced collectives that recorded no span */
} nccl_impl;

static fsdp_status cuda_err(cudaError_t e, const char *what) {
  (void)cudaGetLastError();   /* reported here; not left behind for the next launch check */
  return fsdp_set_error(FSDP_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static fsdp_status nccl_err(const nccl_impl *n, ncclResult_t r, const char *what) {
  const char *last = n && n->comm ? ncclGetLastError(n->comm) : NULL;
  return fsdp_set_error(r == ncclSystemError || r == ncclRemoteError ? FSDP_ERR_COMM : FSDP_ERR_CUDA,
                        "%s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

/* After a call returned ncclInProgress: wait (bounded) until the communicator leaves that state. */
static fsdp_status settle(nccl_impl *n, ncclResult_t r, const char *what, double deadline) {
  if (r == ncclSuccess) return FSDP_OK;
  if (r != ncclInProgress) return nccl_err(n, r, what);
  for (;;) {
    ncclResult_t ae = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(n->comm, &ae);
    if (q != ncclSuccess) return nccl_err(n, q, "ncclCommGetAsyncError");
    if (ae == ncclSuccess) return FSDP_OK;
    if (ae != ncclInProgress) return nccl_err(n, ae, what);
    if (monotime_s() > deadline)
      return fsdp_set_error(FSDP_ERR_TIMEOUT, "%s still in progress after timeout_s = %.3g on rank %d of %d", what,
                            n->timeout_s, n->rank, n->world);
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

static ncclDataType_t nccl_type(comm_dtype dt) { return dt == COMM_BF16 ? ncclBfloat16 : ncclFloat32; }

static fsdp_status get_event(nccl_impl *n, cudaEvent_t *ev) {
  if (n->npool > 0) {
    *ev = n->pool[--n->npool];
    return FSDP_OK;
  }
  cudaError_t e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
  return e == cudaSuccess ? FSDP_OK : cuda_err(e, "cudaEventCreateWithFlags");
}

static void put_event(nccl_impl *n, cudaEvent_t ev) {
  if (n->npool == n->cap) {
    int cap = n->cap ? 2 * n->cap : 8;
    cudaEvent_t *p = realloc(n->pool, (size_t)cap * sizeof *p);
    if (!p) {
      cudaEventDestroy(ev);
      return;
    }
    n->pool = p;
    n->cap = cap;
  }
  n->pool[n->npool++] = ev;
}

/* ---- spans ---- */

static void spans_free(nccl_impl *n) {
  if (!n->spans) return;
  for (int i = 0; i < NCCL_SPANS; i++)
    for (int k = 0; k < 2; k++)
      if (n->spans[i].ev[k]) cudaEventDestroy(n->spans[i].ev[k]);
  if (n->anchor) cudaEventDestroy(n->anchor);
  free(n->spans);
  n->spans = NULL;
  n->anchor = NULL;
  n->nfree = n->nbusy = 0;
  (void)cudaGetLastError();
}

/* The pool's events, once (cudaEventDefault: timing enabled). Spans are best effort: a failure
 * turns them off for this comm, never fails the collective. */
static int spans_ready(nccl_impl *n) {
  if (n->spans) return 1;
  if (n->spans_off) return 0;
  n->spans = calloc(NCCL_SPANS, sizeof *n->spans);
  int ok = n->spans && cudaEventCreateWithFlags(&n->anchor, cudaEventDefault) == cudaSuccess;
  for (int i = 0; ok && i < NCCL_SPANS; i++)
    for (int k = 0; ok && k < 2; k++) ok = cudaEventCreateWithFlags(&n->spans[i].ev[k], cudaEventDefault) == cudaSuccess;
  if (!ok) {
    log_warn("comm: nccl rank %d of %d: cannot make %d timing events for its spans; it records none", n->rank,
             n->world, 2 * NCCL_SPANS + 1);
    spans_free(n);
    n->spans_off = 1;
    return 0;
  }
  for (int i = 0; i < NCCL_SPANS; i++) n->freel[i] = NCCL_SPANS - 1 - i;
  n->nfree = NCCL_SPANS;
  return 1;
}

static void span_drop(nccl_impl *n) {
  if (n->dropped++ == 0)
    log_warn("comm: nccl rank %d of %d: a collective recorded no span (%d already in flight, or no anchor); "
             "further ones are counted and reported when the comm is destroyed", n->rank, n->world, NCCL_SPANS);
}

/* A free span for OP, anchored first if the stream is idle; -1: none (dropped, or not traced). */
static int span_open(nccl_impl *n, const comm_op *op) {
  int kind = comm_op_trace_kind(op->kind);
  if (!op->trace || kind < 0 || !spans_ready(n)) return -1;
  if (n->inflight == 0) {   /* nothing in flight: the stream is idle, the anchor completes now */
    n->anchored = cudaEventRecord(n->anchor, n->stream) == cudaSuccess;
    n->anchor_us = monotime_us();
    if (!n->anchored) (void)cudaGetLastError();
  }
  if (!n->anchored || n->nfree == 0) {
    span_drop(n);
    return -1;
  }
  int i = n->freel[--n->nfree];
  n->nbusy++;
  nccl_span *sp = &n->spans[i];
  sp->token = NULL;
  sp->trace = op->trace;
  sp->lane = op->lane;
  sp->kind = (trace_kind)kind;
  sp->unit = op->unit;
  sp->step = op->step;
  return i;
}

/* Back to the pool; RECORD: the collective completed, so are its events: record the span. */
static void span_close(nccl_impl *n, int i, int record) {
  nccl_span *sp = &n->spans[i];
  if (record) {
    uint64_t t0, t1;
    if (cuda_spans_host_us(sp->ev[0], n->anchor, n->anchor_us, 1, &t0) == 0 &&
        cuda_spans_host_us(sp->ev[1], n->anchor, n->anchor_us, 1, &t1) == 0)
      trace_add(sp->trace, sp->lane, sp->kind, sp->unit, sp->step, t0, t1 > t0 ? t1 : t0);
    else
      span_drop(n);
  }
  sp->token = NULL;
  n->freel[n->nfree++] = i;
  n->nbusy--;
}

/* The span whose request completes with TOKEN, or -1. */
static int span_of(const nccl_impl *n, cudaEvent_t token) {
  if (n->nbusy == 0) return -1;
  for (int i = 0; i < NCCL_SPANS; i++)
    if (n->spans[i].token == token) return i;
  return -1;
}

/* A timing event of span I on the stream (spans are best effort: a failed record drops it). */
static int span_mark(nccl_impl *n, int i, int k) {
  if (i < 0) return -1;
  if (cudaEventRecord(n->spans[i].ev[k], n->stream) == cudaSuccess) return i;
  (void)cudaGetLastError();
  span_close(n, i, 0);
  span_drop(n);
  return -1;
}

/* ---- collectives ---- */

static fsdp_status nccl_submit(void *impl, const comm_op *op, void **token) {
  nccl_impl *n = impl;
  *token = NULL;
  if (n->aborted) return fsdp_set_error(FSDP_ERR_COMM, "nccl %s: the communicator was aborted", comm_op_name(op->kind));
  /* Ordering against the compute stream is by the CUDA device's native events (device.h). */
  cudaEvent_t after = op->after ? (cudaEvent_t)dev_event_native(op->after) : NULL;
  cudaEvent_t done = op->done ? (cudaEvent_t)dev_event_native(op->done) : NULL;
  if ((op->after && !after) || (op->done && !done))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "nccl %s: its events are not CUDA events (the device must be cuda)",
                          comm_op_name(op->kind));
  cudaError_t e = cudaSetDevice(n->device);
  if (e != cudaSuccess) return cuda_err(e, "cudaSetDevice");
  int sp = span_open(n, op);   /* its anchor, if any, goes before the wait for AFTER */
  fsdp_status st = FSDP_OK;
  /* the latest record of AFTER now: the same ticket comm.c took at issue (same thread, no record since) */
  if (after && (e = cudaStreamWaitEvent(n->stream, after, 0)) != cudaSuccess) {
    st = cuda_err(e, "cudaStreamWaitEvent");
    goto fail;
  }
  sp = span_mark(n, sp, 0);
  double deadline = monotime_s() + n->timeout_s;
  ncclResult_t r = ncclSuccess;
  const char *what = comm_op_name(op->kind);
  switch (op->kind) {
    case COMM_OP_ALLGATHER:
      r = ncclAllGather(op->send, op->recv, op->count, nccl_type(op->dt), n->comm, n->stream);
      break;
    case COMM_OP_REDUCESCATTER:
      r = ncclReduceScatter(op->send, op->recv, op->count, nccl_type(op->dt), ncclSum, n->comm, n->stream);
      break;
    case COMM_OP_ALLREDUCE:
      r = ncclAllReduce(op->recv, op->recv, op->count, nccl_type(op->dt), ncclSum, n->comm, n->stream);
      break;
    case COMM_OP_BARRIER:
      r = ncclAllReduce(n->dbar, n->dbar, 1, ncclFloat32, ncclSum, n->comm, n->stream);
      break;
  }
  if ((st = settle(n, r, what, deadline)) != FSDP_OK) goto fail;
  sp = span_mark(n, sp, 1);
  if (done && (e = cudaEventRecord(done, n->stream)) != cudaSuccess) {
    st = cuda_err(e, "cudaEventRecord of done");
    goto fail;
  }
  cudaEvent_t ev;
  if ((st = get_event(n, &ev)) != FSDP_OK) goto fail;
  e = cudaEventRecord(ev, n->stream);
  if (e != cudaSuccess) {
    put_event(n, ev);
    st = cuda_err(e, "cudaEventRecord");
    goto fail;
  }
  if (sp >= 0) n->spans[sp].token = ev;
  n->inflight++;
  *token = (void *)ev;
  return FSDP_OK;

fail:
  if (sp >= 0) span_close(n, sp, 0);
  return st;
}

static fsdp_status nccl_poll(void *impl, void *token, int *done) {
  nccl_impl *n = impl;
  cudaEvent_t ev = (cudaEvent_t)token;
  *done = 0;
  cudaError_t e = cudaEventQuery(ev);
  if (e == cudaSuccess) {
    int sp = span_of(n, ev);
    if (sp >= 0) span_close(n, sp, 1);
    put_event(n, ev);
    n->inflight--;
    *done = 1;
    return FSDP_OK;
  }
  if (e != cudaErrorNotReady) return cuda_err(e, "cudaEventQuery");
  (void)cudaGetLastError();   /* NotReady is no failure: leave nothing for the next launch check */
  ncclResult_t ae = ncclSuccess;
  ncclResult_t q = ncclCommGetAsyncError(n->comm, &ae);
  if (q != ncclSuccess) return nccl_err(n, q, "ncclCommGetAsyncError");
  if (ae != ncclSuccess && ae != ncclInProgress) return nccl_err(n, ae, "NCCL asynchronous error");
  return FSDP_OK;
}

static void nccl_release(void *impl, void *token) {
  nccl_impl *n = impl;
  /* After an abort the event may never fire; destroying a pending event is allowed. */
  if (token) {
    int sp = span_of(n, (cudaEvent_t)token);
    if (sp >= 0) span_close(n, sp, 0);
    if (n->aborted) cudaEventDestroy((cudaEvent_t)token);
    else put_event(n, (cudaEvent_t)token);
    n->inflight--;
  }
}

static void nccl_abort(void *impl) {
  nccl_impl *n = impl;
  if (n->aborted) return;
  n->aborted = 1;
  ncclResult_t r = ncclCommAbort(n->comm);
  if (r != ncclSuccess) log_warn("comm: ncclCommAbort on rank %d: %s", n->rank, ncclGetErrorString(r));
}

static void nccl_destroy(void *impl) {
  nccl_impl *n = impl;
  if (!n) return;
  cudaSetDevice(n->device);
  if (n->comm && !n->aborted) {
    /* Finalize flushes outstanding work; bounded by the timeout, then abort. */
    double deadline = monotime_s() + n->timeout_s;
    fsdp_status st = settle(n, ncclCommFinalize(n->comm), "ncclCommFinalize", deadline);
    if (st == FSDP_OK) {
      ncclCommDestroy(n->comm);
    } else {
      log_warn("comm: %s; aborting the communicator", fsdp_last_error());
      ncclCommAbort(n->comm);
    }
  }
  for (int i = 0; i < n->npool; i++) cudaEventDestroy(n->pool[i]);
  free(n->pool);
  if (n->dropped > 1)
    log_warn("comm: nccl rank %d of %d: %llu collectives recorded no span (at most %d in flight are timed)", n->rank,
             n->world, (unsigned long long)n->dropped, NCCL_SPANS);
  spans_free(n);
  if (n->dbar) {
    cudaFree(n->dbar);
    mem_account(MEM_COMM, -(int64_t)sizeof(float));
  }
  if (n->stream) cudaStreamDestroy(n->stream);
  free(n);
}

static const comm_backend nccl_backend = {
    .name = "nccl",
    .submit = nccl_submit,
    .poll = nccl_poll,
    .release = nccl_release,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

fsdp_status comm_nccl_get_unique_id(uint8_t out[128]) {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return nccl_err(NULL, r, "ncclGetUniqueId");
  memcpy(out, id.internal, sizeof id.internal);
  return FSDP_OK;
}

/* The backend instance around a communicator that INIT makes (ncclCommInitRankConfig from a unique
 * id, or ncclCommSplit of a parent), non-blocking: its own stream and barrier word first. */
typedef ncclResult_t (*nccl_init_fn)(const void *arg, ncclComm_t *comm, ncclConfig_t *cfg);

static fsdp_status nccl_open(int rank, int world, int device, double timeout_s, nccl_init_fn init, const void *arg,
                             const char *what, comm_t **out) {
  nccl_impl *n = calloc(1, sizeof *n);
  if (!n) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the NCCL backend");
  n->device = device;
  n->rank = rank;
  n->world = world;
  n->timeout_s = timeout_s;
  fsdp_status st = FSDP_OK;
  cudaError_t e;
  if ((e = cudaSetDevice(device)) != cudaSuccess) {
    st = cuda_err(e, "cudaSetDevice");
    goto fail;
  }
  if ((e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess) {
    st = cuda_err(e, "cudaStreamCreateWithFlags");
    goto fail;
  }
  if ((e = cudaMalloc((void **)&n->dbar, sizeof(float))) != cudaSuccess ||
      (e = cudaMemset(n->dbar, 0, sizeof(float))) != cudaSuccess) {
    st = cuda_err(e, "cudaMalloc of the barrier word");
    goto fail;
  }
  mem_account(MEM_COMM, (int64_t)sizeof(float));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  double deadline = monotime_s() + timeout_s;
  ncclResult_t r = init(arg, &n->comm, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    st = nccl_err(n, r, what);
    if (n->comm) ncclCommAbort(n->comm);   /* a non-blocking init may have made a handle: never drop it */
    n->comm = NULL;
    goto fail;
  }
  st = settle(n, r, what, deadline);
  if (st != FSDP_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fsdp_last_error());
    ncclCommAbort(n->comm);
    n->comm = NULL;
    st = fsdp_set_error(st, "NCCL communicator init (%s) of rank %d of %d on device %d failed: %s; check that every "
                            "rank took part with the same id or parent", what, rank, world, device, msg);
    goto fail;
  }
  return comm_wrap(&nccl_backend, n, rank, world, timeout_s, out);

fail:
  if (n->dbar) {
    cudaFree(n->dbar);
    mem_account(MEM_COMM, -(int64_t)sizeof(float));
    n->dbar = NULL;
  }
  if (n->stream) cudaStreamDestroy(n->stream);
  free(n->pool);
  free(n);
  return st;
}

typedef struct init_rank_arg {
  ncclUniqueId uid;
  int rank, world;
} init_rank_arg;

static ncclResult_t init_rank(const void *arg, ncclComm_t *comm, ncclConfig_t *cfg) {
  const init_rank_arg *a = arg;
  return ncclCommInitRankConfig(comm, a->world, a->uid, a->rank, cfg);
}

fsdp_status comm_new_nccl(int rank, int world, const uint8_t id[128], int device, double timeout_s,
                          comm_t **out) {
  if (!out || !id) return fsdp_set_error(FSDP_ERR_INVALID, "comm_new_nccl: NULL id or out");
  *out = NULL;
  if (world < 1 || rank < 0 || rank >= world)
    return fsdp_set_error(FSDP_ERR_RANGE, "comm_new_nccl: rank %d, world %d; allowed: world >= 1, 0 <= rank < world",
                          rank, world);
  if (!(timeout_s > 0))
    return fsdp_set_error(FSDP_ERR_RANGE, "comm_new_nccl: timeout_s %g; allowed: > 0", timeout_s);
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess) return cuda_err(e, "cudaGetDeviceCount");
  if (device < 0 || device >= ndev)
    return fsdp_set_error(FSDP_ERR_RANGE, "comm_new_nccl: device %d; this machine has %d CUDA device(s)", device, ndev);
  init_rank_arg a = {.rank = rank, .world = world};
  memcpy(a.uid.internal, id, sizeof a.uid.internal);
  return nccl_open(rank, world, device, timeout_s, init_rank, &a, "ncclCommInitRankConfig", out);
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
typedef struct split_arg {
  ncclComm_t parent;
  int color, key;
} split_arg;

static ncclResult_t split(const void *arg, ncclComm_t *comm, ncclConfig_t *cfg) {
  const split_arg *a = arg;
  return ncclCommSplit(a->parent, a->color, a->key, comm, cfg);
}
#endif

fsdp_status comm_nccl_split(comm_t *parent, int color, int key, int world, comm_t **out) {
  if (!out) return fsdp_set_error(FSDP_ERR_INVALID, "comm_nccl_split: NULL out");
  *out = NULL;
  nccl_impl *p = parent ? comm_backend_impl(parent, &nccl_backend) : NULL;
  if (!p) return fsdp_set_error(FSDP_ERR_INVALID, "comm_nccl_split: the parent is not an NCCL communicator");
  if (world < 1 || key < 0 || key >= world || color < 0)
    return fsdp_set_error(FSDP_ERR_RANGE, "comm_nccl_split: color %d, key %d, world %d", color, key, world);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  split_arg a = {.parent = p->comm, .color = color, .key = key};
  return nccl_open(key, world, p->device, p->timeout_s, split, &a, "ncclCommSplit", out);
#else
  return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "ncclCommSplit needs NCCL 2.18 or later (this build has %d)",
                        NCCL_VERSION_CODE);
#endif
}

void *comm_nccl_stream(const comm_t *c) {
  nccl_impl *n = comm_backend_impl(c, &nccl_backend);
  return n ? (void *)n->stream : NULL;
}
