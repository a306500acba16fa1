/* ops_cuda_common — what the ops_cuda*.cu files share: error macros, bf16 loads and stores,
 * warp and block reductions, and the internal helpers one file defines and another calls
 * (the cuBLASLt GEMM, the split column sums). Internal to libfsdpcuda: C++ linkage, not part of
 * the C API in ops_cuda.h.
 */
#ifndef FSDP_OPS_CUDA_COMMON_CUH
#define FSDP_OPS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>

#include "ops/bf16.h"
#include "ops_cuda.h"

/* cudaGetLastError both reads and clears a launch error, so no sticky state is left for the next
 * caller; an error from an earlier, unrelated call is reported here too (hence the wording). */
#define LAUNCH_CHECK(what)                                                                             \
  do {                                                                                                 \
    cudaError_t e_ = cudaGetLastError();                                                               \
    if (e_ != cudaSuccess)                                                                             \
      return fsdp_set_error(FSDP_ERR_CUDA, "%s: kernel launch (or an earlier CUDA call) failed: %s (%s)", \
                            (what), cudaGetErrorString(e_), cudaGetErrorName(e_));                     \
  } while (0)

#define CUDA_CHECK(call, what)                                                                         \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) {                                                                           \
      (void)cudaGetLastError();                                                                        \
      return fsdp_set_error(FSDP_ERR_CUDA, "%s: %s: %s (%s)", (what), #call, cudaGetErrorString(e_),   \
                            cudaGetErrorName(e_));                                                     \
    }                                                                                                  \
  } while (0)

/* Threads per block of the elementwise kernels; grid-stride loops cap the grid at this many
 * blocks, which fills 132 SMs many times over. */
#define OPS_THREADS 256
#define OPS_MAX_BLOCKS 8192

static inline unsigned ops_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return (unsigned)(b > OPS_MAX_BLOCKS ? OPS_MAX_BLOCKS : b);
}

/* A kernel's dynamic shared-memory limit raised to `bytes` once per device: the check against the
 * device's opt-in maximum (cudaDeviceGetAttribute) and cudaFuncSetAttribute run at the first launch
 * of the kernel on ctx->device, and every later launch finds the limit in ONCE and makes no host
 * call (the attention launched three per kernel every call before). One ops_smem_once per kernel,
 * a static beside its launch; any thread (two racing first launches set the same limit twice). */
#define OPS_MAX_DEVICES 64
struct ops_smem_once {
  std::atomic<int> bytes[OPS_MAX_DEVICES]; /* the limit set on each device; 0: not yet */
};
template <typename Kern>
static fsdp_status ops_smem_opt_in(ops_smem_once *once, Kern kernel, size_t bytes, const ops_cuda_ctx *ctx,
                                   const char *what) {
  const int dev = ctx->device;
  const bool cached = dev >= 0 && dev < OPS_MAX_DEVICES;
  if (cached && once->bytes[dev].load(std::memory_order_acquire) == (int)bytes) return FSDP_OK;
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), what);
  if (bytes > (size_t)optin)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: needs %zu bytes of shared memory per block; this GPU allows %d",
                          what, bytes, optin);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), what);
  if (cached) once->bytes[dev].store((int)bytes, std::memory_order_release);
  return FSDP_OK;
}

/* The workspace as T*, after checking that `bytes` fit in it. */
static inline fsdp_status ops_workspace(const ops_cuda_ctx *ctx, size_t bytes, const char *what, void **p) {
  if (bytes > ctx->workspace_bytes || (bytes && !ctx->workspace))
    return fsdp_set_error(FSDP_ERR_RANGE, "%s: needs %zu bytes of workspace, the context has %zu (give it at least "
                          "OPS_CUDA_WORKSPACE_MIN)", what, bytes, ctx->workspace ? ctx->workspace_bytes : (size_t)0);
  *p = ctx->workspace;
  return FSDP_OK;
}

/* bf16 <-> fp32 in kernels: the hardware conversions (round to nearest even). The casts of the C API
 * use f32_to_bf16 (ops/bf16.h) instead, for NaN payloads bit-identical to the CPU. */
__device__ __forceinline__ float ldbf(const ops_bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float tof(ops_bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ ops_bf16 tobf(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ ops_bf16 bf_from_bits(uint16_t h) {
  __nv_bfloat16_raw r;
  r.x = h;
  return ops_bf16(r);
}

/* A planted fault point for the emulator's self-test (tests/gpu/emu, EMU_FAULT=NAME: gpu_emu must
 * then fail the faulty kernel's check): false, compiled away, in the CUDA build. */
#ifdef FSDP_EMU
#define OPS_FAULT(name) emu_fault(name)
#else
#define OPS_FAULT(name) false
#endif

#define OPS_LOG2E 1.4426950408889634f /* log2(e): e^x = 2^(x·log2 e) */
#define OPS_LN2 0.69314718055994531f  /* ln 2 */

/* ---- 128-bit global access ----
 * Memory-bound kernels move 16 bytes per load and store (8 bf16 or 4 fp32: one LDG.E.128 /
 * STG.E.128), as llm.c's kernels do. A kernel takes that path (its VEC = true instantiation) when
 * every pointer it accesses so is 16-byte aligned and its rows are whole packs; otherwise its VEC =
 * false instantiation goes element by element (tiny or odd shapes, offsets inside a buffer). The
 * static check tests/gpu/sass_check.py holds the VEC = true code to 128-bit loads. */
static inline bool ops_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

__device__ __forceinline__ void ld8h(ops_bf16 *h, const ops_bf16 *p) {
  const int4 r = *reinterpret_cast<const int4 *>(p);
  memcpy(h, &r, 16);
}
__device__ __forceinline__ void st8h(ops_bf16 *p, const ops_bf16 *h) {
  int4 r;
  memcpy(&r, h, 16);
  *reinterpret_cast<int4 *>(p) = r;
}
/* 8 bf16 → fp32 (exact) and 8 fp32 → bf16 (nearest even). */
__device__ __forceinline__ void ld8(float *f, const ops_bf16 *p) {
  ops_bf16 h[8];
  ld8h(h, p);
#pragma unroll
  for (int k = 0; k < 8; k++) f[k] = tof(h[k]);
}
__device__ __forceinline__ void st8(ops_bf16 *p, const float *f) {
  ops_bf16 h[8];
#pragma unroll
  for (int k = 0; k < 8; k++) h[k] = tobf(f[k]);
  st8h(p, h);
}
/* 4 fp32. */
__device__ __forceinline__ void ld4f(float *f, const float *p) {
  const float4 r = *reinterpret_cast<const float4 *>(p);
  f[0] = r.x, f[1] = r.y, f[2] = r.z, f[3] = r.w;
}
__device__ __forceinline__ void st4f(float *p, const float *f) {
  *reinterpret_cast<float4 *>(p) = make_float4(f[0], f[1], f[2], f[3]);
}

/* 8 bf16 (VEC: one 128-bit access) or 1, as fp32: the row kernels' columns per lane. */
template <bool VEC> __device__ __forceinline__ void ops_ldv(float *x, const ops_bf16 *p) {
  if (VEC) ld8(x, p);
  else x[0] = ldbf(p);
}
template <bool VEC> __device__ __forceinline__ void ops_stv(ops_bf16 *p, const float *x) {
  if (VEC) st8(p, x);
  else p[0] = tobf(x[0]);
}

/* The element loop of an elementwise kernel over n elements. VEC: BODYP(i) handles the pack [i,
 * i + P) for every whole pack (a grid-stride loop), then the n mod P elements left over go one
 * to a thread of the grid's first threads, BODY1(i), outside any loop; else BODY1 for every element. */
template <bool VEC, int P, class FP, class F1>
__device__ __forceinline__ void ops_ew_loop(int64_t n, FP bodyp, F1 body1) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
  if (VEC) {
    const int64_t np = n / P;
    for (int64_t p = tid; p < np; p += stride) bodyp(p * P);
    if (tid < n - np * P) body1(np * P + tid);
  } else {
    for (int64_t i = tid; i < n; i += stride) body1(i);
  }
}

/* Launch an elementwise kernel template (VEC, n last) over N elements in packs of P on ctx->stream. */
#define OPS_EW_LAUNCH(kernel, vec, P, N, what, ...)                                                             \
  do {                                                                                                          \
    if (vec)                                                                                                    \
      kernel<true><<<ops_blocks(((N) + (P) - 1) / (P), OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(__VA_ARGS__, \
                                                                                                    (N));       \
    else                                                                                                        \
      kernel<false><<<ops_blocks((N), OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(__VA_ARGS__, (N));           \
    LAUNCH_CHECK(what);                                                                                         \
  } while (0)

/* ---- reductions: every lane / thread gets the result ---- */

template <typename F> __device__ __forceinline__ F warp_sum(F v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Sum over the 16 lanes that share (lane >> 4): the attention kernels' row groups. */
__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* blockDim.x a multiple of 32, at most 1024; scratch: 32 elements of shared memory. Starts with a
 * barrier, so the scratch of a previous reduction may be reused. */
template <typename F> __device__ F block_sum(F v, F *scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : (F)0;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

/* ---- internal helpers shared between files ---- */

/* Column-major cuBLASLt GEMM: D[m,n] = op(A)[m,k]·op(B)[k,n] (+ D when beta_one), A and B bf16, fp32
 * compute; D is bf16 (d_f32 = 0) or fp32 (d_f32 = 1). epilogue: CUBLASLT_EPILOGUE_DEFAULT, _BIAS
 * (bias: m bf16), _GELU_AUX(_BIAS) (aux: m×n bf16 written, leading dimension ldaux), _DGELU (the
 * same aux read: D = gelu'(aux)·product; beta 0). Returns
 * FSDP_ERR_UNSUPPORTED (with a message) when cuBLASLt has no algorithm for the combination, so the
 * caller can fall back to a plainer epilogue. ops_cuda_matmul.cu. */
fsdp_status ops_lt_gemm(const ops_cuda_ctx *ctx, const char *what, int transa, int transb, int m, int n, int k,
                        const void *A, int64_t lda, const void *B, int64_t ldb, void *D, int64_t ldd, int d_f32,
                        int beta_one, cublasLtEpilogue_t epilogue, const void *bias, void *aux, int64_t ldaux);

/* Number of row slices a column sum over R rows is split into: a function of R only, so the
 * summation order (and the bits) never depend on the GPU. */
static inline int ops_colsum_splits(int64_t R) {
  int64_t s = (R + 255) / 256;
  return (int)(s < 1 ? 1 : (s > 64 ? 64 : s));
}

/* ---- column sums in one kernel: row slices, then the last block of each column group folds ----
 * A grid of (column groups, ops_colsum_splits(R) row slices) blocks of OPS_CS_X × OPS_CS_Y
 * threads; a thread takes W columns (8 on the VEC path: 128-bit loads; else 1) and every OPS_CS_Y-th
 * row of its slice. NO sums at once (LayerNorm: dweight and dbias). Each block writes its slice's
 * partial sums to the workspace; the last block of a column group to finish (a counter per group,
 * zeroed by the launcher, as llm.c's and CUDA's threadFenceReduction do) adds the slices, in slice
 * order, to dst: no separate finish kernel. The order of every sum depends only on the shapes. */
#define OPS_CS_X 16 /* column threads of a block */
#define OPS_CS_Y 16 /* row threads of a block */

/* Workspace of a folded column sum: NO·nsplit·N partial floats, then one counter per column group. */
static inline size_t ops_colsum_ws_bytes(int NO, int nsplit, int N) {
  return (size_t)NO * nsplit * N * sizeof(float) + ((size_t)N + OPS_CS_X - 1) / OPS_CS_X * sizeof(int);
}
static inline int *ops_colsum_counters(void *ws, int NO, int nsplit, int N) {
  return (int *)((float *)ws + (size_t)NO * nsplit * N);
}
/* Grid of a folded column sum over N columns and R rows (W = 8 on the VEC path). */
static inline dim3 ops_colsum_grid(int N, int64_t R, int W) {
  return dim3((unsigned)((N + OPS_CS_X * W - 1) / (OPS_CS_X * W)), (unsigned)ops_colsum_splits(R));
}

/* The body of a folded column-sum kernel. ROW(r, c, acc) adds row r's terms for columns [c, c + W)
 * to acc[o][k] (o < NO ≤ 2, k < W); dst0[c] (o = 0) and dst1[c] (o = 1) += the sums over rows
 * [0, R). per: rows per slice. */
template <int NO, int W, class F>
__device__ __forceinline__ void ops_colsum_fold(float *dst0, float *dst1, float *__restrict__ partial,
                                                int *__restrict__ counters, int64_t R, int N, int64_t per, F row) {
  static_assert(NO == 1 || NO == 2, "one or two column sums");
  __shared__ float sh[NO][OPS_CS_Y][OPS_CS_X * W + 1];
  __shared__ int last;
  const int tx = threadIdx.x, ty = threadIdx.y, nsplit = gridDim.y, split = blockIdx.y;
  const int c = (blockIdx.x * OPS_CS_X + tx) * W;
  const int64_t r0 = (int64_t)split * per, r1 = r0 + per < R ? r0 + per : R;
  float acc[NO][W];
#pragma unroll
  for (int o = 0; o < NO; o++)
#pragma unroll
    for (int k = 0; k < W; k++) acc[o][k] = 0.0f;
  if (c < N) /* W = 8: N is a multiple of 8, so all W columns exist */
    for (int64_t r = r0 + ty; r < r1; r += OPS_CS_Y) row(r, c, acc);
#pragma unroll
  for (int o = 0; o < NO; o++)
#pragma unroll
    for (int k = 0; k < W; k++) sh[o][ty][tx * W + k] = acc[o][k];
  __syncthreads();
  if (ty == 0 && c < N)
#pragma unroll
    for (int o = 0; o < NO; o++) {
      for (int y = 1; y < OPS_CS_Y; y++)
#pragma unroll
        for (int k = 0; k < W; k++) acc[o][k] += sh[o][y][tx * W + k];
      float *p = partial + ((int64_t)o * nsplit + split) * N + c;
      if (W == 8) {
        st4f(p, acc[o]);
        st4f(p + 4, acc[o] + 4);
      } else {
#pragma unroll
        for (int k = 0; k < W; k++) p[k] = acc[o][k];
      }
    }
  __threadfence(); /* this block's partials visible to the device before it is counted */
  __syncthreads();
  if (tx == 0 && ty == 0) last = atomicAdd(&counters[blockIdx.x], 1) == nsplit - 1;
  __syncthreads();
  if (!last) return;
  /* the last block of the group: Q columns per thread (float4 on the VEC path), slices in order;
   * __ldcg reads the other blocks' partials from L2, never a stale L1 line */
  constexpr int Q = W == 8 ? 4 : 1, GC = OPS_CS_X * W;
  const int t = ty * OPS_CS_X + tx;
  if (t >= NO * GC / Q) return;
  const int o = t / (GC / Q), cc = blockIdx.x * GC + t % (GC / Q) * Q;
  if (cc >= N) return;
  float s[Q];
#pragma unroll
  for (int k = 0; k < Q; k++) s[k] = 0.0f;
  const float *p = partial + (int64_t)o * nsplit * N + cc;
  const int nfold = OPS_FAULT("colsum_fold") ? nsplit - 1 : nsplit; /* planted: the last slice left out */
  for (int sp = 0; sp < nfold; sp++, p += N) {
    if (Q == 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4 *>(p));
      s[0] += v.x, s[1] += v.y, s[2] += v.z, s[3] += v.w;
    } else {
      s[0] += __ldcg(p);
    }
  }
  float *d = (o == 0 ? dst0 : dst1) + cc; /* any alignment: a parameter's gradient inside a flat buffer */
#pragma unroll
  for (int k = 0; k < Q; k++) d[k] += s[k];
}

/* Zero the counters of a folded column sum on ctx->stream (before its kernel). */
static inline fsdp_status ops_colsum_zero(void *ws, int NO, int nsplit, int N, const ops_cuda_ctx *ctx,
                                          const char *what) {
  const size_t groups = ((size_t)N + OPS_CS_X - 1) / OPS_CS_X;
  CUDA_CHECK(cudaMemsetAsync(ops_colsum_counters(ws, NO, nsplit, N), 0, groups * sizeof(int), ctx->stream), what);
  return FSDP_OK;
}

/* dst[c] += Σ_r m[r, c] for an (R, N) bf16 matrix: the two-pass column sum over ops_colsum_splits(R)
 * row slices (nsplit·N floats of workspace); the bias gradients of matmul_backward and
 * linear_backward. ops_cuda_matmul.cu. */
fsdp_status ops_colsum_accumulate(float *dst, const ops_bf16 *m, int64_t R, int N, const ops_cuda_ctx *ctx,
                                  const char *what);
/* D (BT, OC) += bias (OC), bf16: the BIAS epilogue's work where cuBLASLt has no algorithm for it. */
fsdp_status ops_add_bias(ops_bf16 *D, const ops_bf16 *bias, int64_t BT, int OC, const ops_cuda_ctx *ctx,
                         const char *what);

/* The tensor-core attention kernels (ops_cuda_attention_tc.cu), called by ops_cuda_attention.cu
 * after it checked the arguments (head size 64 or 128) and, for the backward, computed dvec. SEG
 * (documents, device memory) and WINDOW restrict each query's keys as ops_cuda_attention_forward's
 * (NULL, 0: causal). */
fsdp_status ops_attention_tc_forward(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C, int NH,
                                     int NKV, const int32_t *seg, int window, const ops_cuda_ctx *ctx);
fsdp_status ops_attention_tc_backward(ops_bf16 *dqkv, const ops_bf16 *dout, const ops_bf16 *qkv, const float *lse,
                                      const float *dvec, int B, int T, int C, int NH, int NKV, const int32_t *seg,
                                      int window, const ops_cuda_ctx *ctx);

#endif
