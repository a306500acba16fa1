/* device_cuda_int — the CUDA device's state (device_cuda.c), shared with the module that keeps its
 * timers and spans (device_cuda_timing.c); internal to the CUDA build. One host thread (the
 * runtime's) drives a device; CUDA's host-function thread touches only dev_events and the
 * host_failed / host_msg pair (see cuda_dev).
 */
#ifndef FSDP_DEVICE_CUDA_INT_H
#define FSDP_DEVICE_CUDA_INT_H

#ifndef FSDP_HAVE_CUDA
#define FSDP_HAVE_CUDA 1   /* this file is compiled only in the CUDA build */
#endif
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdatomic.h>

#include "device.h"
#include "mem.h"
#include "ops_cuda.h"

typedef struct alloc_rec {
  void *p;
  size_t bytes;
  mem_category cat;
} alloc_rec;

/* A timing entry: a segment boundary (timer of the stream time from here to the next boundary)
 * or a wait (its blocked time, charged to timer, taken out of seg_timer). */
typedef struct tentry {
  int wait;
  int timer, seg_timer;
  int ev0, ev1;        /* indices into the timing-event pool */
} tentry;

/* A span boundary: a timing event of the window and what it opens or closes (trace.h). */
typedef struct tmark {
  int ev;
  int end;
  trace_kind kind;
  int unit, step;
  trace_t *t;
} tmark;

#define DEV_CUDA_BINDINGS 2   /* plans bound at once (cuda_dev.bound) */

typedef struct cuda_dev {
  device_t base;
  int gpu;
  cudaStream_t stream;
  cudaStream_t copy_stream;   /* snapshots (checkpoints), created at the first */
  cudaEvent_t copy_after;     /* the compute stream's point a snapshot starts after */
  cublasLtHandle_t lt;
  ops_cuda_ctx ctx;
  void *ws;
  char *scal;          /* PLAN_CUDA_SCALAR_BYTES: sumsq's non-finite flag */
  float *nf4_maps;     /* an NF4 base's maps (PLAN_NF4_MAPS_BYTES: nf4_code, then the dynamic map), at bind */

  alloc_rec *recs;
  int nrec, caprec;

  /* bound by bind(), one per plan AdamW runs over: the base's shard and, for [lora], the adapters'
   * segment (lora.h's opt) */
  struct cuda_binding {
    const plan_t *plan;
    int rank;
    int64_t *segs;     /* device: 2·nseg int64 (capacity 2 per 2-D tensor of the plan) */
    int nseg;
  } bound[DEV_CUDA_BINDINGS];

  fsdp_status err;     /* the first failure, sticky */
  char msg[640];

  double wait_s;       /* the longest a host function parks the stream (the job's timeout_s) */
  /* A host function's failure (its wait gave up): host_msg written first, then host_failed set
   * (release) by the stream's host functions, which run one at a time; the host thread turns it
   * into err once the stream has passed it (take_host_failure). */
  _Atomic int host_failed;
  char host_msg[320];

  int timer;           /* the timer of ops submitted now */
  cudaEvent_t *tev;    /* timing events, reused every timers() window */
  int ntev, captev;
  tentry *tl;
  int ntl, captl;
  int timing;          /* a window is open (its first boundary is recorded) */
  tmark *marks;        /* span boundaries (dev_ops.trace) of the window, resolved in timers() */
  int nmarks, capmarks;
} cuda_dev;

static inline cuda_dev *cd(device_t *d) { return (cuda_dev *)d; }

/* ---- timers and spans (device_cuda_timing.c) ----
 * A window of timing entries runs from one timers() call to the next; every entry is best effort
 * (no event: nothing charged). */

/* Record a timing event on the compute stream: its index in d->tev, or −1 (failed device, no event). */
int cuda_dev_tev_record(cuda_dev *d);
/* Append an entry to the open window (dropped without its events or with no window open). */
void cuda_dev_tl_add(cuda_dev *d, tentry t);
/* Open a window at the current end of the stream: its first segment belongs to d->timer. */
void cuda_dev_window_open(cuda_dev *d);
/* The window's span boundaries into host time, given END: a timing event recorded on the idle
 * stream and synchronized, so that it completed "now". */
void cuda_dev_resolve_marks(cuda_dev *d, int end);
/* dev_ops.set_timer, .trace and .timers. */
void cuda_dev_set_timer(device_t *dd, dev_timer t);
void cuda_dev_trace(device_t *dd, trace_t *t, int end, trace_kind kind, int unit, int step);
void cuda_dev_timers(device_t *dd, uint64_t us[DEV_NTIMER]);

#endif
