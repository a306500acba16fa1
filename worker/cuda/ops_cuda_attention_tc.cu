/* ops_cuda_attention_tc — the fused causal attention on tensor cores (WMMA, bf16 × bf16 → fp32),
 * the default behind ops_cuda_attention_forward/_backward; ops_cuda_attention.cu holds the plain
 * fp32-FMA kernels, same algorithm, kept as the reference and the fallback (ops_cuda.h says how to
 * pick). Same outputs, same saved lse, so the two are interchangeable even between forward and
 * backward.
 *
 * Layout: a block is 4 warps and owns a tile of 64 rows (queries in the forward and in dQ, keys in
 * dK/dV); warp w owns rows 16w..16w+15. The other operand streams through in tiles of 64 rows. Every
 * product is WMMA 16×16×16 from shared memory (bf16 tiles, rows padded by 8 elements); score tiles,
 * the softmax and the accumulators (O, dK, dV, dQ) stay in shared memory in fp32, each warp on its
 * own rows, so no fragment's register layout is ever assumed: accumulators go through
 * load/store_matrix_sync, and the elementwise work is done by the warp's lanes on shared memory
 * (two lanes per row, half the columns each, their row max and sum joined by one shuffle).
 * P and dS are rounded to bf16 for the products, as in FlashAttention; everything else is fp32.
 * Exponentials are exp2f on scores pre-scaled by log2(e) (one ex2 instruction each, where the
 * reference kernels' ops_expf is a polynomial); the saved lse stays the natural log.
 *
 *   forward   for each key tile ≤ the query tile: S = Q·Kᵀ; online softmax on the warp's rows
 *             (O rescaled in place); O += P·V. out = O/l, lse = m + log l.
 *   backward  D = rowsum(dO∘O) (ops_cuda_attention.cu's kernel); then dK/dV per key tile over the
 *             query tiles ≥ it (Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, P = e^(S·scale − lse), dS = P∘(dP − D);
 *             dV += Pᵀ·dO, dK += dSᵀ·Q), and dQ per query tile over the key tiles ≤ it
 *             (dQ += dS·K): one writer per output, no atomics.
 * Grouped-query attention: query head h reads kv head g = h / (NH/NKV) (rows C + 2·NKV·hs wide);
 * a dK/dV block owns a key tile of kv head g and accumulates over the group's query heads in
 * order, each over its query tiles, so a shared head has one writer and fixed-order sums.
 */
#include "ops_cuda_common.cuh"

#include <mma.h>

#include "ops/softmax.h"

namespace wmma = nvcuda::wmma;

#define TC_THREADS 128 /* 4 warps */
#define TC_TILE 64     /* rows per block tile and per streamed tile */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

template <int D> struct tc_cfg {
  static constexpr int LDH = D + 8;             /* bf16 tiles (Q, K, V, dO): 64 × D */
  static constexpr int LDS = TC_TILE + 4;       /* fp32 score tiles per warp: 16 × 64 */
  static constexpr int LDB = TC_TILE + 8;       /* bf16 P / dS tiles per warp: 16 × 64 */
  static constexpr int LDA = D + 4;             /* fp32 accumulators per warp: 16 × D */
  static constexpr size_t tile_h = (size_t)TC_TILE * LDH * 2;
  static constexpr size_t warp_s = (size_t)16 * LDS * 4;
  static constexpr size_t warp_b = (size_t)16 * LDB * 2;
  static constexpr size_t warp_a = (size_t)16 * LDA * 4;
  /* forward: Q, K, V; per warp S, P, O */
  static constexpr size_t fwd_smem = 3 * tile_h + 4 * (warp_s + warp_b + warp_a);
  /* dK/dV: K, V, Q, dO; per warp Sᵀ, dPᵀ, P, dS, dK, dV; lse and D of the query tile */
  static constexpr size_t dkv_smem = 4 * tile_h + 4 * (2 * warp_s + 2 * warp_b + 2 * warp_a) + 2 * TC_TILE * 4;
  /* dQ: Q, dO, K, V; per warp S, dP, dS, dQ */
  static constexpr size_t dq_smem = 4 * tile_h + 4 * (2 * warp_s + warp_b + warp_a);
  static_assert(D % 16 == 0, "WMMA tiles");
  static_assert(tile_h % 128 == 0 && warp_s % 128 == 0 && warp_b % 128 == 0 && warp_a % 128 == 0,
                "every region keeps the 32-byte alignment WMMA pointers need");
};

/* rows [row0, row0 + 64) × columns [0, D) of a bf16 matrix with row stride ld into a shared tile
 * of row stride LDH; rows ≥ T are zero. */
template <int D>
__device__ __forceinline__ void tc_load(ops_bf16 *__restrict__ dst, const ops_bf16 *__restrict__ src, int64_t ld,
                                        int row0, int T) {
  for (int i = threadIdx.x; i < TC_TILE * D; i += TC_THREADS) {
    const int r = i / D, c = i % D, t = row0 + r;
    dst[r * tc_cfg<D>::LDH + c] = t < T ? src[(int64_t)t * ld + c] : tobf(0.0f);
  }
}

/* C (16 × 16·NB, fp32, ldc) = A (16 × 16·KB, bf16 row-major, lda) · B, where B is 16·KB × 16·NB and
 * given either as Bᵀ stored row-major (TRANS: B's column j is row j of the buffer) or as B
 * row-major. ACC: add to what C holds. One warp. */
template <int KB, int NB, bool TRANS, bool ACC>
__device__ __forceinline__ void warp_gemm(float *c, int ldc, const ops_bf16 *a, int lda, const ops_bf16 *b, int ldb) {
  for (int n = 0; n < NB; n++) {
    frag_c acc;
    if (ACC) wmma::load_matrix_sync(acc, c + n * 16, ldc, wmma::mem_row_major);
    else wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < KB; k++) {
      frag_a fa;
      wmma::load_matrix_sync(fa, a + k * 16, lda);
      if (TRANS) {
        frag_b_col fb;
        wmma::load_matrix_sync(fb, b + (size_t)n * 16 * ldb + k * 16, ldb);
        wmma::mma_sync(acc, fa, fb, acc);
      } else {
        frag_b_row fb;
        wmma::load_matrix_sync(fb, b + (size_t)k * 16 * ldb + n * 16, ldb);
        wmma::mma_sync(acc, fa, fb, acc);
      }
    }
    wmma::store_matrix_sync(c + n * 16, acc, ldc, wmma::mem_row_major);
  }
}

/* ---- forward ---- */

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
    attention_tc_forward_kernel(ops_bf16 *__restrict__ out, float *__restrict__ lse, const ops_bf16 *__restrict__ qkv,
                                int T, int C, int NH, int NKV, float scale) {
  using K = tc_cfg<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  ops_bf16 *sQ = (ops_bf16 *)smem, *sK = (ops_bf16 *)(smem + K::tile_h), *sV = (ops_bf16 *)(smem + 2 * K::tile_h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char *wbase = smem + 3 * K::tile_h + warp * (K::warp_s + K::warp_b + K::warp_a);
  float *sS = (float *)wbase;
  ops_bf16 *sP = (ops_bf16 *)(wbase + K::warp_s);
  float *sO = (float *)(wbase + K::warp_s + K::warp_b);
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z; /* longest tiles first */
  const int64_t C3 = C + 2 * (int64_t)NKV * D;
  const ops_bf16 *q = qkv + (int64_t)b * T * C3 + (int64_t)h * D;
  const ops_bf16 *k = qkv + (int64_t)b * T * C3 + C + (int64_t)(h / (NH / NKV)) * D, *v = k + (int64_t)NKV * D;
  const int q0 = qt * TC_TILE;
  const int r = lane >> 1, half = lane & 1; /* this lane's row of the warp's 16, and its half of the columns */
  const int qi = q0 + warp * 16 + r;

  tc_load<D>(sQ, q, C3, q0, T);
  for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) sO[r * K::LDA + c] = 0.0f;
  /* the softmax in base 2: scores pre-scaled by scale·log2(e), so every e^x is one exp2f (ex2) */
  const float scale2 = scale * OPS_LOG2E;
  float m = -INFINITY, l = 0.0f;

  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * TC_TILE;
    __syncthreads(); /* every warp is done with the previous K, V (and sQ is loaded) */
    tc_load<D>(sK, k, C3, k0, T);
    tc_load<D>(sV, v, C3, k0, T);
    __syncthreads();
    warp_gemm<D / 16, TC_TILE / 16, true, false>(sS, K::LDS, sQ + warp * 16 * K::LDH, K::LDH, sK, K::LDH);
    __syncwarp();
    /* online softmax on row r, columns [32·half, 32·half + 32); key k0 ≤ qi is always allowed, so mx is finite */
    float mx = -INFINITY;
    for (int c = half * 32; c < half * 32 + 32; c++) {
      const int kj = k0 + c;
      const float s = (kj <= qi && kj < T) ? sS[r * K::LDS + c] * scale2 : -INFINITY;
      sS[r * K::LDS + c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mnew = fmaxf(m, mx);
    const float corr = m == -INFINITY ? 0.0f : exp2f(m - mnew);
    float sum = 0.0f;
    for (int c = half * 32; c < half * 32 + 32; c++) {
      const float s = sS[r * K::LDS + c];
      const float p = s == -INFINITY ? 0.0f : exp2f(s - mnew);
      sP[r * K::LDB + c] = tobf(p);
      sum += p; /* unrounded, as FlashAttention: lse stays fp32-accurate for the backward */
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = mnew;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) sO[r * K::LDA + c] *= corr;
    __syncwarp();
    warp_gemm<TC_TILE / 16, D / 16, false, true>(sO, K::LDA, sP, K::LDB, sV, K::LDH);
    __syncwarp();
  }
  if (qi < T) {
    const float inv = 1.0f / l;
    ops_bf16 *orow = out + ((int64_t)b * T + qi) * C + (int64_t)h * D;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) orow[c] = tobf(sO[r * K::LDA + c] * inv);
    if (half == 0) lse[((int64_t)b * NH + h) * T + qi] = (m + log2f(l)) * OPS_LN2;   /* natural, as saved */
  }
}

/* ---- backward ---- */

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
    attention_tc_dkv_kernel(ops_bf16 *__restrict__ dqkv, const ops_bf16 *__restrict__ dout,
                            const ops_bf16 *__restrict__ qkv, const float *__restrict__ lse,
                            const float *__restrict__ dvec, int T, int C, int NH, int NKV, float scale) {
  using K = tc_cfg<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  ops_bf16 *sK = (ops_bf16 *)smem, *sV = (ops_bf16 *)(smem + K::tile_h), *sQ = (ops_bf16 *)(smem + 2 * K::tile_h);
  ops_bf16 *sdO = (ops_bf16 *)(smem + 3 * K::tile_h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char *wbase = smem + 4 * K::tile_h + warp * (2 * K::warp_s + 2 * K::warp_b + 2 * K::warp_a);
  float *sS = (float *)wbase, *sdP = (float *)(wbase + K::warp_s);
  ops_bf16 *sP = (ops_bf16 *)(wbase + 2 * K::warp_s), *sdS = (ops_bf16 *)(wbase + 2 * K::warp_s + K::warp_b);
  float *sdK = (float *)(wbase + 2 * K::warp_s + 2 * K::warp_b), *sdV = sdK + 16 * K::LDA;
  float *sL = (float *)(smem + 4 * K::tile_h + 4 * (2 * K::warp_s + 2 * K::warp_b + 2 * K::warp_a)), *sD = sL + TC_TILE;
  const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z, nqt = gridDim.x, rep = NH / NKV;
  const int64_t C3 = C + 2 * (int64_t)NKV * D;
  const ops_bf16 *k = qkv + (int64_t)b * T * C3 + C + (int64_t)g * D, *v = k + (int64_t)NKV * D;
  const int k0 = kt * TC_TILE;
  const int r = lane >> 1, half = lane & 1;
  const int kj = k0 + warp * 16 + r; /* this lane's key row */

  tc_load<D>(sK, k, C3, k0, T);
  tc_load<D>(sV, v, C3, k0, T);
  for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) sdK[r * K::LDA + c] = sdV[r * K::LDA + c] = 0.0f;

  for (int h = g * rep; h < (g + 1) * rep; h++) { /* the group's query heads, in order */
    const ops_bf16 *q = qkv + (int64_t)b * T * C3 + (int64_t)h * D;
    const ops_bf16 *dO = dout + (int64_t)b * T * C + (int64_t)h * D;
    const float *L = lse + ((int64_t)b * NH + h) * T, *Dv = dvec + ((int64_t)b * NH + h) * T;
    for (int qt = kt; qt < nqt; qt++) {
      const int q0 = qt * TC_TILE;
      __syncthreads();
      tc_load<D>(sQ, q, C3, q0, T);
      tc_load<D>(sdO, dO, C, q0, T);
      for (int i = threadIdx.x; i < TC_TILE; i += TC_THREADS) {
        sL[i] = q0 + i < T ? L[q0 + i] * OPS_LOG2E : 0.0f;   /* lse in base 2, for exp2f */
        sD[i] = q0 + i < T ? Dv[q0 + i] : 0.0f;
      }
      __syncthreads();
      /* Sᵀ (16 keys × 64 queries) = K_w·Qᵀ; dPᵀ = V_w·dOᵀ */
      warp_gemm<D / 16, TC_TILE / 16, true, false>(sS, K::LDS, sK + warp * 16 * K::LDH, K::LDH, sQ, K::LDH);
      warp_gemm<D / 16, TC_TILE / 16, true, false>(sdP, K::LDS, sV + warp * 16 * K::LDH, K::LDH, sdO, K::LDH);
      __syncwarp();
      for (int c = half * 32; c < half * 32 + 32; c++) {
        const int qi = q0 + c;
        const bool ok = qi >= kj && qi < T && kj < T;
        const float p = ok ? exp2f(sS[r * K::LDS + c] * (scale * OPS_LOG2E) - sL[c]) : 0.0f;
        sP[r * K::LDB + c] = tobf(p);
        sdS[r * K::LDB + c] = tobf(p * (sdP[r * K::LDS + c] - sD[c]));
      }
      __syncwarp();
      /* dV_w += Pᵀ·dO; dK_w += dSᵀ·Q (scaled at the end) */
      warp_gemm<TC_TILE / 16, D / 16, false, true>(sdV, K::LDA, sP, K::LDB, sdO, K::LDH);
      warp_gemm<TC_TILE / 16, D / 16, false, true>(sdK, K::LDA, sdS, K::LDB, sQ, K::LDH);
      __syncwarp();
    }
  }
  if (kj < T) {
    ops_bf16 *dkrow = dqkv + ((int64_t)b * T + kj) * C3 + C + (int64_t)g * D, *dvrow = dkrow + (int64_t)NKV * D;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) {
      dkrow[c] = tobf(sdK[r * K::LDA + c] * scale);
      dvrow[c] = tobf(sdV[r * K::LDA + c]);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
    attention_tc_dq_kernel(ops_bf16 *__restrict__ dqkv, const ops_bf16 *__restrict__ dout,
                           const ops_bf16 *__restrict__ qkv, const float *__restrict__ lse,
                           const float *__restrict__ dvec, int T, int C, int NH, int NKV, float scale) {
  using K = tc_cfg<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  ops_bf16 *sQ = (ops_bf16 *)smem, *sdO = (ops_bf16 *)(smem + K::tile_h), *sK = (ops_bf16 *)(smem + 2 * K::tile_h);
  ops_bf16 *sV = (ops_bf16 *)(smem + 3 * K::tile_h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char *wbase = smem + 4 * K::tile_h + warp * (2 * K::warp_s + K::warp_b + K::warp_a);
  float *sS = (float *)wbase, *sdP = (float *)(wbase + K::warp_s);
  ops_bf16 *sdS = (ops_bf16 *)(wbase + 2 * K::warp_s);
  float *sdQ = (float *)(wbase + 2 * K::warp_s + K::warp_b);
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z; /* longest first */
  const int64_t C3 = C + 2 * (int64_t)NKV * D;
  const ops_bf16 *q = qkv + (int64_t)b * T * C3 + (int64_t)h * D;
  const ops_bf16 *k = qkv + (int64_t)b * T * C3 + C + (int64_t)(h / (NH / NKV)) * D, *v = k + (int64_t)NKV * D;
  const ops_bf16 *dO = dout + (int64_t)b * T * C + (int64_t)h * D;
  const int q0 = qt * TC_TILE;
  const int r = lane >> 1, half = lane & 1;
  const int qi = q0 + warp * 16 + r; /* this lane's query row */
  const float Lq = qi < T ? lse[((int64_t)b * NH + h) * T + qi] * OPS_LOG2E : 0.0f;   /* base 2, for exp2f */
  const float Dq = qi < T ? dvec[((int64_t)b * NH + h) * T + qi] : 0.0f;

  tc_load<D>(sQ, q, C3, q0, T);
  tc_load<D>(sdO, dO, C, q0, T);
  for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) sdQ[r * K::LDA + c] = 0.0f;

  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * TC_TILE;
    __syncthreads();
    tc_load<D>(sK, k, C3, k0, T);
    tc_load<D>(sV, v, C3, k0, T);
    __syncthreads();
    warp_gemm<D / 16, TC_TILE / 16, true, false>(sS, K::LDS, sQ + warp * 16 * K::LDH, K::LDH, sK, K::LDH);
    warp_gemm<D / 16, TC_TILE / 16, true, false>(sdP, K::LDS, sdO + warp * 16 * K::LDH, K::LDH, sV, K::LDH);
    __syncwarp();
    for (int c = half * 32; c < half * 32 + 32; c++) {
      const int kj = k0 + c;
      const bool ok = qi >= kj && qi < T && kj < T;
      const float p = ok ? exp2f(sS[r * K::LDS + c] * (scale * OPS_LOG2E) - Lq) : 0.0f;
      sdS[r * K::LDB + c] = tobf(p * (sdP[r * K::LDS + c] - Dq));
    }
    __syncwarp();
    warp_gemm<TC_TILE / 16, D / 16, false, true>(sdQ, K::LDA, sdS, K::LDB, sK, K::LDH);
    __syncwarp();
  }
  if (qi < T) {
    ops_bf16 *dqrow = dqkv + ((int64_t)b * T + qi) * C3 + (int64_t)h * D;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) dqrow[c] = tobf(sdQ[r * K::LDA + c] * scale);
  }
}

/* ---- host side (called by ops_cuda_attention.cu after it checked the arguments) ---- */

template <typename Kern> static fsdp_status tc_smem(Kern kernel, size_t bytes, const char *what) {
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev), what);
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), what);
  if (bytes > (size_t)optin)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: needs %zu bytes of shared memory per block; this GPU allows %d",
                          what, bytes, optin);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), what);
  return FSDP_OK;
}

template <int D>
static fsdp_status tc_forward(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C, int NH, int NKV,
                              const ops_cuda_ctx *ctx) {
  static const char *what = "attention_forward (tensor cores)";
  TRY(tc_smem(attention_tc_forward_kernel<D>, tc_cfg<D>::fwd_smem, what));
  dim3 grid((T + TC_TILE - 1) / TC_TILE, NH, B);
  attention_tc_forward_kernel<D><<<grid, TC_THREADS, tc_cfg<D>::fwd_smem, ctx->stream>>>(out, lse, qkv, T, C, NH,
                                                                                          NKV, attn_scale(D));
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

template <int D>
static fsdp_status tc_backward(ops_bf16 *dqkv, const ops_bf16 *dout, const ops_bf16 *qkv, const float *lse,
                               const float *dvec, int B, int T, int C, int NH, int NKV, const ops_cuda_ctx *ctx) {
  static const char *what = "attention_backward (tensor cores)";
  TRY(tc_smem(attention_tc_dkv_kernel<D>, tc_cfg<D>::dkv_smem, what));
  TRY(tc_smem(attention_tc_dq_kernel<D>, tc_cfg<D>::dq_smem, what));
  const int nt = (T + TC_TILE - 1) / TC_TILE;
  attention_tc_dkv_kernel<D><<<dim3(nt, NKV, B), TC_THREADS, tc_cfg<D>::dkv_smem, ctx->stream>>>(
      dqkv, dout, qkv, lse, dvec, T, C, NH, NKV, attn_scale(D));
  LAUNCH_CHECK("attention_backward (tensor cores, dk, dv)");
  attention_tc_dq_kernel<D><<<dim3(nt, NH, B), TC_THREADS, tc_cfg<D>::dq_smem, ctx->stream>>>(
      dqkv, dout, qkv, lse, dvec, T, C, NH, NKV, attn_scale(D));
  LAUNCH_CHECK("attention_backward (tensor cores, dq)");
  return FSDP_OK;
}

fsdp_status ops_attention_tc_forward(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C, int NH,
                                     int NKV, const ops_cuda_ctx *ctx) {
  return C / NH == 64 ? tc_forward<64>(out, lse, qkv, B, T, C, NH, NKV, ctx)
                      : tc_forward<128>(out, lse, qkv, B, T, C, NH, NKV, ctx);
}

fsdp_status ops_attention_tc_backward(ops_bf16 *dqkv, const ops_bf16 *dout, const ops_bf16 *qkv, const float *lse,
                                      const float *dvec, int B, int T, int C, int NH, int NKV,
                                      const ops_cuda_ctx *ctx) {
  return C / NH == 64 ? tc_backward<64>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, NKV, ctx)
                      : tc_backward<128>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, NKV, ctx);
}
