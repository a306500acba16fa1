/* cudart_shim — the part of the CUDA runtime that worker/cuda/device_cuda.c and comm_stage_cuda.c
 * call, on the host, with real streams: each stream is a thread that runs its queue in order
 * (copies, memsets, event records, event waits and host functions), so a host function that blocks
 * parks its stream as on a GPU. What makes it useful for deadlocks: the calls that synchronize the
 * whole device on a GPU (cudaMallocHost, cudaHostAlloc, cudaFreeHost, cudaFree, cudaDeviceSynchronize)
 * wait here for every stream to finish the work submitted before the call, including a stream
 * parked in a host function. A wait that exceeds FSDP_SHIM_SYNC_S seconds (default 5) is counted
 * (cudart_shim_deadlocks), reported on stderr, and fails the call with cudaErrorLaunchTimeout, so
 * a deadlock on a GPU is a bounded failure here.
 *
 * "Device" memory is host memory; kernels do not exist (the ops are stubs, ops_stubs.py). One process
 * is one device: the test forks one process per rank. Thread-safe: one mutex guards every queue.
 * Used only by tests/gpu/stage_check.c.
 */
#include "cudart_shim.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum item_kind { IT_COPY, IT_SET, IT_RECORD, IT_WAIT, IT_HOSTFN };

typedef struct item {
  enum item_kind kind;
  void *dst;
  const void *src;
  size_t n;
  int value;
  struct CUevent_st *ev;
  uint64_t gen;
  cudaHostFn_t fn;
  void *arg;
  struct item *next;
} item;

struct CUstream_st {
  pthread_t th;
  item *head, *tail;
  uint64_t submitted, done;   /* items */
  int in_hostfn;
  int quit;
  struct CUstream_st *next_stream;
};

struct CUevent_st {
  uint64_t recorded, completed;   /* generations */
  double t_ms;                    /* when the latest record completed */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct CUstream_st *streams;
static int deadlocks;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static double sync_timeout_s(void) {
  const char *e = getenv("FSDP_SHIM_SYNC_S");
  double s = e ? atof(e) : 5.0;
  return s > 0 ? s : 5.0;
}

static void deadline_in(struct timespec *ts, double s) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += (time_t)s;
  ts->tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static void run_item(struct CUstream_st *s, item *it) {
  switch (it->kind) {
    case IT_COPY: memmove(it->dst, it->src, it->n); break;
    case IT_SET: memset(it->dst, it->value, it->n); break;
    case IT_RECORD:
      pthread_mutex_lock(&mu);
      if (it->gen > it->ev->completed) it->ev->completed = it->gen;
      it->ev->t_ms = now_ms();
      pthread_cond_broadcast(&cv);
      pthread_mutex_unlock(&mu);
      break;
    case IT_WAIT:
      pthread_mutex_lock(&mu);
      while (it->ev->completed < it->gen) pthread_cond_wait(&cv, &mu);
      pthread_mutex_unlock(&mu);
      break;
    case IT_HOSTFN:
      pthread_mutex_lock(&mu);
      s->in_hostfn = 1;
      pthread_mutex_unlock(&mu);
      it->fn(it->arg);
      pthread_mutex_lock(&mu);
      s->in_hostfn = 0;
      pthread_mutex_unlock(&mu);
      break;
  }
}

static void *stream_main(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (!s->head && !s->quit) pthread_cond_wait(&cv, &mu);
    if (!s->head) break;
    item *it = s->head;
    pthread_mutex_unlock(&mu);
    run_item(s, it);
    pthread_mutex_lock(&mu);
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    s->done++;
    free(it);
    pthread_cond_broadcast(&cv);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

static cudaError_t enqueue(cudaStream_t s, item it) {
  if (!s) return cudaErrorInvalidResourceHandle;   /* the code under test uses streams of its own */
  item *p = malloc(sizeof *p);
  if (!p) return cudaErrorMemoryAllocation;
  *p = it;
  p->next = NULL;
  pthread_mutex_lock(&mu);
  if (s->tail) s->tail->next = p;
  else s->head = p;
  s->tail = p;
  s->submitted++;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

/* Wait until every stream has done what was submitted before now: a device-wide synchronization. */
static cudaError_t device_wide_sync(const char *what) {
  pthread_mutex_lock(&mu);
  int n = 0;
  for (struct CUstream_st *s = streams; s; s = s->next_stream) n++;
  uint64_t *want = calloc((size_t)n + 1, sizeof *want);
  int i = 0;
  for (struct CUstream_st *s = streams; s; s = s->next_stream) want[i++] = s->submitted;
  struct timespec dl;
  deadline_in(&dl, sync_timeout_s());
  cudaError_t rc = cudaSuccess;
  for (;;) {
    int busy = 0, parked = 0;
    i = 0;
    for (struct CUstream_st *s = streams; s; s = s->next_stream, i++)
      if (s->done < want[i]) busy++, parked += s->in_hostfn;
    if (!busy) break;
    if (pthread_cond_timedwait(&cv, &mu, &dl) == ETIMEDOUT) {
      deadlocks++;
      fprintf(stderr, "cudart_shim: %s waited %.0f s for %d stream(s) (%d parked in a host function): on a GPU "
              "this synchronization never returns\n", what, sync_timeout_s(), busy, parked);
      rc = cudaErrorLaunchTimeout;
      break;
    }
  }
  pthread_mutex_unlock(&mu);
  free(want);
  return rc;
}

int cudart_shim_deadlocks(void) {
  pthread_mutex_lock(&mu);
  int n = deadlocks;
  pthread_mutex_unlock(&mu);
  return n;
}

/* ---- the runtime API ---- */

cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaErrorLaunchTimeout ? "a device-wide synchronization did not return (shim)" : "shim error";
}
const char *cudaGetErrorName(cudaError_t e) {
  return e == cudaErrorLaunchTimeout ? "cudaErrorLaunchTimeout" : "shimError";
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) {
  *fr = *tot = (size_t)1 << 34;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) {
  *p = aligned_alloc(256, (n + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
  cudaError_t rc = device_wide_sync("cudaFree");
  free(p);
  return rc;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
  cudaError_t rc = device_wide_sync("cudaMallocHost");
  if (rc != cudaSuccess) return rc;
  *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
  (void)flags;
  return cudaMallocHost(p, n);
}
cudaError_t cudaFreeHost(void *p) {
  cudaError_t rc = device_wide_sync("cudaFreeHost");
  if (rc == cudaSuccess) free(p);   /* a stream may still copy into it */
  return rc;
}
cudaError_t cudaDeviceSynchronize(void) { return device_wide_sync("cudaDeviceSynchronize"); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
  (void)flags;
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return cudaErrorMemoryAllocation;
  if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
    free(s);
    return cudaErrorMemoryAllocation;
  }
  pthread_mutex_lock(&mu);
  s->next_stream = streams;
  streams = s;
  pthread_mutex_unlock(&mu);
  *out = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&mu);
  uint64_t want = s->submitted;
  while (s->done < want) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&mu);
  s->quit = 1;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  pthread_join(s->th, NULL);
  pthread_mutex_lock(&mu);
  for (struct CUstream_st **p = &streams; *p; p = &(*p)->next_stream)
    if (*p == s) {
      *p = s->next_stream;
      break;
    }
  pthread_mutex_unlock(&mu);
  free(s);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
  (void)k;
  return enqueue(s, (item){.kind = IT_COPY, .dst = dst, .src = src, .n = n});
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s) {
  return enqueue(s, (item){.kind = IT_SET, .dst = dst, .value = v, .n = n});
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
  return enqueue(s, (item){.kind = IT_HOSTFN, .fn = fn, .arg = arg});
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  (void)flags;
  *e = calloc(1, sizeof **e);
  return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  free(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  pthread_mutex_lock(&mu);
  uint64_t g = ++e->recorded;
  pthread_mutex_unlock(&mu);
  return enqueue(s, (item){.kind = IT_RECORD, .ev = e, .gen = g});
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&mu);
  uint64_t g = e->recorded;
  pthread_mutex_unlock(&mu);
  return enqueue(s, (item){.kind = IT_WAIT, .ev = e, .gen = g});
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  pthread_mutex_lock(&mu);
  uint64_t g = e->recorded;
  while (e->completed < g) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  pthread_mutex_lock(&mu);
  *ms = (float)(b->t_ms - a->t_ms);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

/* cuBLASLt: the CUDA device makes and destroys one handle; the stubbed operators never use it. */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  static int one;
  *h = (cublasLtHandle_t)(void *)&one;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  (void)h;
  return CUBLAS_STATUS_SUCCESS;
}
