/* device_cuda_kern — see device_cuda_kern.h. */
#include "device_cuda_kern.h"

#include <cuda_runtime.h>

__global__ void sumsq_post_kernel(float *out, const int *nonfinite, float scale) {
  out[0] = out[0] * scale;
  out[1] = *nonfinite ? 1.0f : 0.0f;
}

extern "C" fsdp_status dev_cuda_sumsq_post(float *out, const int *nonfinite, float scale, cudaStream_t stream) {
  sumsq_post_kernel<<<1, 1, 0, stream>>>(out, nonfinite, scale);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return fsdp_set_error(FSDP_ERR_CUDA, "sumsq: kernel launch refused: %s (%s)", cudaGetErrorString(e),
                          cudaGetErrorName(e));
  return FSDP_OK;
}
