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

#include "log.h"
#include "mem.h"

_Static_assert(NCCL_UNIQUE_ID_BYTES == 128, "comm.h hands NCCL unique ids around as 128 bytes");

typedef struct nccl_impl {
  ncclComm_t comm;
  cudaStream_t stream;
  int device, rank, world;
  double timeout_s;
  float *dbar;             /* one device float: the barrier is an all-reduce of it */
  int aborted;
  cudaEvent_t *pool;       /* free events */
  int npool, cap;
} nccl_impl;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
    if (now_s() > deadline)
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
  /* the latest record of AFTER now: the same ticket comm.c took at issue (same thread, no record since) */
  if (after && (e = cudaStreamWaitEvent(n->stream, after, 0)) != cudaSuccess) return cuda_err(e, "cudaStreamWaitEvent");
  double deadline = now_s() + n->timeout_s;
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
  TRY(settle(n, r, what, deadline));
  if (done && (e = cudaEventRecord(done, n->stream)) != cudaSuccess) return cuda_err(e, "cudaEventRecord of done");
  cudaEvent_t ev;
  TRY(get_event(n, &ev));
  e = cudaEventRecord(ev, n->stream);
  if (e != cudaSuccess) {
    put_event(n, ev);
    return cuda_err(e, "cudaEventRecord");
  }
  *token = (void *)ev;
  return FSDP_OK;
}

static fsdp_status nccl_poll(void *impl, void *token, int *done) {
  nccl_impl *n = impl;
  cudaEvent_t ev = (cudaEvent_t)token;
  *done = 0;
  cudaError_t e = cudaEventQuery(ev);
  if (e == cudaSuccess) {
    put_event(n, ev);
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
    if (n->aborted) cudaEventDestroy((cudaEvent_t)token);
    else put_event(n, (cudaEvent_t)token);
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
    double deadline = now_s() + n->timeout_s;
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
  double deadline = now_s() + timeout_s;
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
