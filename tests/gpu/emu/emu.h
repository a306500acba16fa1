/* emu.h — force-included (g++ -include) when tests/gpu/emu builds the kernels of worker/ops_cuda_*.cu
 * for the host: CUDA's thread model emulated with one coroutine per thread (see emu.cpp). Only
 * what those kernels use. */
#ifndef FSDP_EMU_H
#define FSDP_EMU_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <functional>

#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __shared__
#define __shared__ static /* blocks run one after another: a static is the block's shared memory */

extern dim3 threadIdx, blockIdx, blockDim, gridDim;
extern unsigned char *emu_dyn_smem;

void __syncthreads(void);
int __syncthreads_and(int pred);
void emu_warp_exchange(const void *mine, void *theirs, int size, int src_lane);

template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
  T r;
  emu_warp_exchange(&v, &r, (int)sizeof(T), (int)((threadIdx.x + threadIdx.y * blockDim.x) % 32) ^ o);
  return r;
}

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
using std::isfinite;

void emu_run_grid(dim3 grid, dim3 block, size_t smem, std::function<void()> body);

template <typename... P, typename... A>
void emu_launch_k(dim3 grid, dim3 block, size_t smem, cudaStream_t, void (*k)(P...), A... args) {
  emu_run_grid(grid, block, smem, [=]() { k(args...); });
}

template <class T> cudaError_t cudaFuncSetAttribute(T *, enum cudaFuncAttribute, int) { return cudaSuccess; }

#endif
