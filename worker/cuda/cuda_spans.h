/* cuda_spans — CUDA timing events into trace.h's host time (CUDA build only; included by
 * device_cuda.c and comm_nccl.c, the one technique behind the compute stream's and NCCL's spans).
 *
 * An anchor is a timing event whose host time is known: one recorded on a stream with nothing
 * pending completes as it is recorded. The CUDA device records it between steps and synchronizes
 * it, so the host clock read afterwards is its time (late by the wake-up latency); the NCCL comm
 * records it when its stream has no collective in flight and reads the clock right after the
 * record (early by the latency until the stream's front end takes it), so that a step is never
 * synchronized. Any completed timing event of the same stream is then the anchor's host time minus
 * (recorded before it) or plus (after) the elapsed time between the two (cudaEventElapsedTime:
 * about 0.5 µs resolution, in float ms, so anchors are renewed every step or more often).
 */
#ifndef FSDP_CUDA_SPANS_H
#define FSDP_CUDA_SPANS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

/* µs from timing event A to B, both complete, B recorded after A on the same stream: 0 and the
 * elapsed time in *US, or -1 (CUDA could not say; its error is cleared) and *US = 0. */
static inline int cuda_spans_elapsed_us(cudaEvent_t a, cudaEvent_t b, uint64_t *us) {
  float ms = 0;
  *us = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  if (ms > 0) *us = (uint64_t)((double)ms * 1000.0 + 0.5);
  return 0;
}

/* The host time of EV, recorded before ANCHOR (AFTER = 0) or after it (AFTER = 1), given the
 * anchor's host time ANCHOR_US: 0 and the time in *US, or -1 and *US = ANCHOR_US. */
static inline int cuda_spans_host_us(cudaEvent_t ev, cudaEvent_t anchor, uint64_t anchor_us, int after,
                                     uint64_t *us) {
  uint64_t d = 0;
  int rc = after ? cuda_spans_elapsed_us(anchor, ev, &d) : cuda_spans_elapsed_us(ev, anchor, &d);
  *us = after ? anchor_us + d : d < anchor_us ? anchor_us - d : 0;
  return rc;
}

#endif
