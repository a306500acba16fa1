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

/* Planted faults (ops_cuda_common.cuh's OPS_FAULT): true where EMU_FAULT names this fault point;
 * each such answer counts as a hit (emu_fault_hits), so a run can tell that its fault was planted. */
#define FSDP_EMU 1
bool emu_fault(const char *name);
extern "C" long emu_fault_hits(void);

/* cache hints are nothing on the host */
template <typename T> inline void __stcs(T *p, T v) { *p = v; }
template <typename T> inline T __ldcg(const T *p) { return *p; }

/* Blocks run one after another and a block's threads switch only at barriers and shuffles, so an
 * atomic is a plain read-modify-write and a fence orders nothing that is not ordered already. */
inline void __threadfence(void) {}
template <typename T> inline T atomicAdd(T *p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}

void __syncthreads(void);
void emu_warp_barrier(void);
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_barrier(); }
int __syncthreads_and(int pred);
void emu_warp_exchange(const void *mine, void *theirs, int size, int src_lane);

/* cp.async (sm_80+), as ops_cuda_attention_tc.cu issues it: a copy joins the issuing thread's open
 * group and its destination reads as 0xFF bytes (NaN in bf16 and fp32) until a wait lands it, so
 * a read of a tile before its wait (or before the barrier after the waits of the other threads)
 * and a copy issued over a tile other threads still read both show up as NaN. commit closes the
 * open group; wait(n) lands all but the newest n closed groups. A thread that exits with copies
 * never waited for aborts. */
void emu_cp_async(void *dst, const void *src, int bytes);
void emu_cp_async_commit(void);
void emu_cp_async_wait(int newest_left);

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

extern long emu_attr_calls; /* emu.cpp: the attribute calls made so far */
template <class T> cudaError_t cudaFuncSetAttribute(T *, enum cudaFuncAttribute, int) {
  emu_attr_calls++;
  return cudaSuccess;
}

/* WMMA, as the API defines it (warp-collective loads, stores and products of 16×16 tiles): each
 * emulated lane holds the whole tile, and loads and stores are bracketed by warp barriers so that
 * they act once per warp. No register layout is assumed, as the kernels assume none. */
#include <cuda_bf16.h>
#include <type_traits>
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  float x[M * N];
};
template <class U, int M, int N, int K, class T, class L> void fill_fragment(fragment<U, M, N, K, T, L> &f, float v) {
  for (int i = 0; i < M * N; i++) f.x[i] = v;
}
template <class U, class L>
void load_matrix_sync(fragment<U, 16, 16, 16, __nv_bfloat16, L> &f, const __nv_bfloat16 *p, unsigned ldm) {
  emu_warp_barrier();
  const bool col = std::is_same<L, col_major>::value;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = __bfloat162float(col ? p[c * ldm + r] : p[r * ldm + c]);
  emu_warp_barrier();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm, layout_t l) {
  emu_warp_barrier();
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
  emu_warp_barrier();
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t l) {
  emu_warp_barrier();
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) (l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * 16 + c];
  emu_warp_barrier();
}
template <class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
              const fragment<accumulator, 16, 16, 16, float> &c) {
  float t[256];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < 16; k++) s += a.x[i * 16 + k] * b.x[k * 16 + j];
      t[i * 16 + j] = s;
    }
  for (int i = 0; i < 256; i++) d.x[i] = t[i];
}
} // namespace wmma
} // namespace nvcuda

#endif
