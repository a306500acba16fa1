/* device_cuda_kern — the few kernels the CUDA device (device_cuda.c) needs beyond ops_cuda.h, to
 * keep the device layer's contract (device.h). CUDA build only; enqueue on STREAM, never
 * synchronize; a refused launch returns FSDP_ERR_CUDA with CUDA's text (and clears it). */
#ifndef FSDP_DEVICE_CUDA_KERN_H
#define FSDP_DEVICE_CUDA_KERN_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "err.h" /* a C header without extern "C" guards of its own */

/* dev_ops.sumsq's tail: out[0] = scale·out[0] (ops_cuda_sumsq's Σ x²), out[1] = 1 when *nonfinite
 * else 0 (one device float each; nonfinite one device int). */
fsdp_status dev_cuda_sumsq_post(float *out, const int *nonfinite, float scale, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
