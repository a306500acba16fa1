/* ops_cuda_attention — fused causal self-attention, forward and backward, in the flash-attention
 * manner, on plain fp32 FMAs: OPS_ATTN_FMA, the reference. The entry points here dispatch: to cuDNN
 * (ops_cuda_cudnn.h, the default), to the tensor-core kernels of ops_cuda_attention_tc.cu where cuDNN
 * cannot run or when chosen, or to the kernels below. Tiles of
 * queries and keys in shared memory, an online softmax, no T×T matrix in device memory. Only the per-row log-sum-exp (B,NH,T, fp32) is saved for the backward, which recomputes
 * the probabilities from it (see ops_cuda.h for shapes).
 *
 * Deliberately plain (correctness first, no tensor cores): fp32 FMAs on tiles held in shared
 * memory as fp32. A block is 256 threads, a 16×16 grid (tx = lane & 15, ty = tid >> 4); a TILE×TILE
 * score tile is computed as (TILE/16)² elements per thread, rows ty + 16·a and columns tx + 16·b, so
 * the 16 threads that share a row are the 16 lanes of one half-warp and the row's max and sum are
 * half-warp shuffles. Shared rows are padded by one float (stride D+1) so that 16 lanes reading 16
 * different rows at one column hit 16 different banks.
 *
 * Grouped-query attention (ops_cuda.h): query head h reads kv head g = h / (NH/NKV) of a row
 * C + 2·NKV·hs wide; the dK/dV kernel runs per kv head and sums over its query heads in a fixed
 * order (head by head, each over its query tiles) in registers, so a shared head still has one
 * writer and the bits do not depend on scheduling.
 *
 *   forward    grid (query tiles, NH, B), heaviest tiles first: for key tiles 0..qt: S = scale·QKᵀ,
 *              causal mask, online softmax (running max m, sum l; O rescaled by e^(m_old−m_new)),
 *              O += P·V through shared memory. out = O/l, lse = m + log l.
 *   backward   Dvec_i = Σ_c dO_ic·O_ic (one warp per row, into the workspace); then two kernels,
 *              so that every output element has one writer and no atomics are needed:
 *              dK/dV: grid (key tiles, NKV, B), loop over the group's query heads and, for each,
 *              the query tiles ≥ the key tile: P = e^(S−lse), dP = dO·Vᵀ, dS = P∘(dP − Dvec);
 *              dV += Pᵀ·dO, dK += scale·dSᵀ·Q.
 *              dQ: grid (query tiles, NH, B), loop over key tiles ≤ the query tile, same P and dS;
 *              dQ += scale·dS·K.
 * Documents and a sliding window (ops/docmask.h) narrow each loop: a query tile starts at the key
 * tile of its first row's first key, the dK/dV loop stops at the first query tile that sees past
 * its key tile, and scores outside a row's [lo, t] are masked like the causal ones (the forward
 * keeps each query row's lo in TILE ints of shared memory, beside the tiles).
 * Head size 64 uses 64×64 tiles (forward 66 KB of shared memory, backward 100 KB); head size 128,
 * 32×32 tiles (54 KB, 75 KB). Both exceed the default 48 KB, so the first launch of each kernel on a
 * device raises its dynamic limit (ops_smem_opt_in: checked against the opt-in maximum, then
 * cudaFuncSetAttribute), and later launches make no host call but the launch.
 * The kernels have no static shared arrays: the dynamic size is the whole footprint.
 */
#include "ops_cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>

extern "C" {
#include "log.h" /* a C header without extern "C" guards of its own */
}
#include "envknob.h"
#include "ops_cuda_cudnn.h"

#include "ops/docmask.h"
#include "ops/exp.h"
#include "ops/softmax.h"

#define ATT_THREADS 256

/* rows [row0, row0 + TILE) × columns [0, D) of a row-major bf16 matrix with row stride ld, into
 * fp32 shared memory with row stride LD; rows ≥ T read as 0. */
template <int D, int TILE, int LD>
__device__ __forceinline__ void load_tile(float *__restrict__ dst, const ops_bf16 *__restrict__ src, int64_t ld,
                                          int row0, int T) {
  for (int idx = threadIdx.x; idx < TILE * D; idx += ATT_THREADS) {
    const int r = idx / D, c = idx % D, t = row0 + r;
    dst[r * LD + c] = t < T ? ldbf(src + (int64_t)t * ld + c) : 0.0f;
  }
}

template <int D, int TILE> struct att_cfg {
  static constexpr int LDK = D + 1;    /* padded row stride of Q, K, V, dO tiles */
  static constexpr int LDP = TILE + 1; /* padded row stride of P / dS tiles */
  static constexpr int RM = TILE / 16; /* micro-tile rows (and score columns) per thread */
  static constexpr int DN = D / 16;    /* output columns per thread */
  static constexpr size_t fwd_smem = sizeof(float) * (3 * TILE * LDK + TILE * LDP) + sizeof(int) * TILE;
  static constexpr size_t bwd_smem = sizeof(float) * (4 * TILE * LDK + 2 * TILE * LDP + 2 * TILE);
  static_assert(TILE % 16 == 0 && D % 16 == 0, "tiles are cut in 16×16 thread grids");
};

/* The first key query row QI of row b sees (ops/docmask.h); rows past T (a tile's padding) are
 * never stored: 0. */
__device__ __forceinline__ int att_row_lo(const int32_t *seg, int window, int b, int T, int qi) {
  return qi < T ? attn_key_lo(seg, window, b, T, qi) : 0;
}

/* ---- forward ---- */

template <int D, int TILE>
__global__ void __launch_bounds__(ATT_THREADS)
    attention_forward_kernel(ops_bf16 *__restrict__ out, float *__restrict__ lse, const ops_bf16 *__restrict__ qkv,
                             int T, int C, int NH, int NKV, float scale, const int32_t *__restrict__ seg, int window) {
  using K = att_cfg<D, TILE>;
  extern __shared__ float sm[];
  float *sQ = sm, *sK = sQ + TILE * K::LDK, *sV = sK + TILE * K::LDK, *sP = sV + TILE * K::LDK;
  int *sLo = (int *)(sP + TILE * K::LDP); /* each query row's first key (ops/docmask.h) */
  const int qt = gridDim.x - 1 - blockIdx.x; /* the longest (last) query tiles start first */
  const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t C3 = C + 2 * (int64_t)NKV * D;
  const ops_bf16 *q = qkv + (int64_t)b * T * C3 + (int64_t)h * D;
  const ops_bf16 *k = qkv + (int64_t)b * T * C3 + C + (int64_t)g * D, *v = k + (int64_t)NKV * D;
  const int q0 = qt * TILE;

  load_tile<D, TILE, K::LDK>(sQ, q, C3, q0, T);
  for (int i = threadIdx.x; i < TILE; i += ATT_THREADS) sLo[i] = att_row_lo(seg, window, b, T, q0 + i);
  float o[K::RM][K::DN], mrow[K::RM], lrow[K::RM];
#pragma unroll
  for (int a = 0; a < K::RM; a++) {
    mrow[a] = -INFINITY;
    lrow[a] = 0.0f;
#pragma unroll
    for (int d = 0; d < K::DN; d++) o[a][d] = 0.0f;
  }

  for (int kt = att_row_lo(seg, window, b, T, q0) / TILE; kt <= qt; kt++) { /* no row sees a tile before */
    const int k0 = kt * TILE;
    __syncthreads(); /* the previous tile's readers of sK, sV, sP are done (and sQ is loaded) */
    load_tile<D, TILE, K::LDK>(sK, k, C3, k0, T);
    load_tile<D, TILE, K::LDK>(sV, v, C3, k0, T);
    __syncthreads();
    float s[K::RM][K::RM];
#pragma unroll
    for (int a = 0; a < K::RM; a++)
#pragma unroll
      for (int j = 0; j < K::RM; j++) s[a][j] = 0.0f;
    for (int c = 0; c < D; c++) {
      float qv[K::RM], kv[K::RM];
#pragma unroll
      for (int a = 0; a < K::RM; a++) qv[a] = sQ[(ty + 16 * a) * K::LDK + c];
#pragma unroll
      for (int j = 0; j < K::RM; j++) kv[j] = sK[(tx + 16 * j) * K::LDK + c];
#pragma unroll
      for (int a = 0; a < K::RM; a++)
#pragma unroll
        for (int j = 0; j < K::RM; j++) s[a][j] += qv[a] * kv[j];
    }
    /* A row may see no key of a tile (documents, a window): its max stays −inf and its P 0. */
#pragma unroll
    for (int a = 0; a < K::RM; a++) {
      const int qi = q0 + ty + 16 * a, lo = sLo[ty + 16 * a];
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < K::RM; j++) {
        const int kj = k0 + tx + 16 * j;
        s[a][j] = (kj <= qi && kj >= lo && kj < T) ? s[a][j] * scale : -INFINITY;
        mx = fmaxf(mx, s[a][j]);
      }
      mx = half_warp_max(mx);
      const float mnew = fmaxf(mrow[a], mx);
      const float corr = mrow[a] == -INFINITY ? 0.0f : ops_expf(mrow[a] - mnew);
      float ls = 0.0f;
#pragma unroll
      for (int j = 0; j < K::RM; j++) {
        const float p = s[a][j] == -INFINITY ? 0.0f : ops_expf(s[a][j] - mnew);
        s[a][j] = p;
        ls += p;
      }
      ls = half_warp_sum(ls);
      lrow[a] = lrow[a] * corr + ls;
      mrow[a] = mnew;
#pragma unroll
      for (int d = 0; d < K::DN; d++) o[a][d] *= corr;
#pragma unroll
      for (int j = 0; j < K::RM; j++) sP[(ty + 16 * a) * K::LDP + tx + 16 * j] = s[a][j];
    }
    __syncthreads();
    for (int kk = 0; kk < TILE; kk++) {
      float pv[K::RM], vv[K::DN];
#pragma unroll
      for (int a = 0; a < K::RM; a++) pv[a] = sP[(ty + 16 * a) * K::LDP + kk];
#pragma unroll
      for (int d = 0; d < K::DN; d++) vv[d] = sV[kk * K::LDK + tx + 16 * d];
#pragma unroll
      for (int a = 0; a < K::RM; a++)
#pragma unroll
        for (int d = 0; d < K::DN; d++) o[a][d] += pv[a] * vv[d];
    }
  }
#pragma unroll
  for (int a = 0; a < K::RM; a++) {
    const int qi = q0 + ty + 16 * a;
    if (qi >= T) continue;
    const float inv = 1.0f / lrow[a];
    ops_bf16 *orow = out + ((int64_t)b * T + qi) * C + (int64_t)h * D;
#pragma unroll
    for (int d = 0; d < K::DN; d++) orow[tx + 16 * d] = tobf(o[a][d] * inv);
    if (tx == 0) lse[((int64_t)b * NH + h) * T + qi] = mrow[a] + logf(lrow[a]);
  }
}

/* ---- backward ---- */

/* dvec[(b·NH + h)·T + t] = Σ_c dout·out over head h's columns. VEC (16-byte aligned rows): hs/8
 * lanes per (b, t, h), 8 columns each (16-byte loads), so a warp sums 32·8/hs rows; else one warp
 * per row, a column per lane. Every lane reaches the shuffles (rows past the end add zeros). */
template <bool VEC>
__global__ void attention_dvec_kernel(float *__restrict__ dvec, const ops_bf16 *__restrict__ dout,
                                      const ops_bf16 *__restrict__ out, int B, int T, int C, int NH) {
  constexpr int P = VEC ? 8 : 1;
  const int hs = C / NH, tpr = VEC ? hs / 8 : 32; /* threads per row: 8 or 16, or 32 */
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, w = tid / tpr;
  const int lane = (int)(tid % tpr);
  const bool live = w < (int64_t)B * T * NH;
  const int h = (int)(w % NH);
  const int64_t bt = w / NH, off = bt * C + (int64_t)h * hs;
  float s = 0.0f;
  for (int c = lane * P; live && c < hs; c += tpr * P) {
    float a[P], o[P];
    ops_ldv<VEC>(a, dout + off + c);
    ops_ldv<VEC>(o, out + off + c);
#pragma unroll
    for (int k = 0; k < P; k++) s += a[k] * o[k];
  }
  for (int o = tpr / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int64_t b = bt / T, t = bt % T;
  if (live && lane == 0) dvec[(b * NH + h) * T + t] = s;
}

/* P and dS of one (query i, key j) pair, from the score s = q·k (unscaled). */
__device__ __forceinline__ void att_p_ds(float s, float dp, float l, float dv, bool ok, float scale, float *p,
                                         float *ds) {
  const float pp = ok ? ops_expf(s * scale - l) : 0.0f;
  *p = pp;
  *ds = pp * (dp - dv);
}

template <int D, int TILE>
__global__ void __launch_bounds__(ATT_THREADS)
    attention_backward_dkv_kernel(ops_bf16 *__restrict__ dqkv, const ops_bf16 *__restrict__ dout,
                                  const ops_bf16 *__restrict__ qkv, const float *__restrict__ lse,
                                  const float *__restrict__ dvec, int T, int C, int NH, int NKV, float scale,
                                  const int32_t *__restrict__ seg, int window) {
  using K = att_cfg<D, TILE>;
  extern __shared__ float sm[];
  float *sK = sm, *sV = sK + TILE * K::LDK, *sQ = sV + TILE * K::LDK, *sdO = sQ + TILE * K::LDK;
  float *sPt = sdO + TILE * K::LDK, *sdSt = sPt + TILE * K::LDP, *sL = sdSt + TILE * K::LDP, *sD = sL + TILE;
  const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z, nqt = gridDim.x, rep = NH / NKV;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t C3 = C + 2 * (int64_t)NKV * D;
  const ops_bf16 *k = qkv + (int64_t)b * T * C3 + C + (int64_t)g * D, *v = k + (int64_t)NKV * D;
  const int k0 = kt * TILE;

  load_tile<D, TILE, K::LDK>(sK, k, C3, k0, T);
  load_tile<D, TILE, K::LDK>(sV, v, C3, k0, T);
  float dk[K::RM][K::DN], dv[K::RM][K::DN];
#pragma unroll
  for (int a = 0; a < K::RM; a++)
#pragma unroll
    for (int d = 0; d < K::DN; d++) dk[a][d] = dv[a][d] = 0.0f;

  for (int h = g * rep; h < (g + 1) * rep; h++) { /* the group's query heads, in order */
    const ops_bf16 *q = qkv + (int64_t)b * T * C3 + (int64_t)h * D;
    const ops_bf16 *dO = dout + (int64_t)b * T * C + (int64_t)h * D;
    const float *L = lse + ((int64_t)b * NH + h) * T, *Dv = dvec + ((int64_t)b * NH + h) * T;
    for (int qt = kt; qt < nqt; qt++) {
      const int q0 = qt * TILE;
      if (att_row_lo(seg, window, b, T, q0) >= k0 + TILE) break; /* this and every later query tile see past it */
      __syncthreads(); /* previous readers of sQ, sdO, sPt, sdSt, sL, sD are done */
      load_tile<D, TILE, K::LDK>(sQ, q, C3, q0, T);
      load_tile<D, TILE, K::LDK>(sdO, dO, C, q0, T);
      for (int i = threadIdx.x; i < TILE; i += ATT_THREADS) {
        sL[i] = q0 + i < T ? L[q0 + i] : 0.0f;
        sD[i] = q0 + i < T ? Dv[q0 + i] : 0.0f;
      }
      __syncthreads();
      /* transposed tiles: rows are keys j = ty + 16a, columns queries i = tx + 16b */
      float s[K::RM][K::RM], dp[K::RM][K::RM];
#pragma unroll
      for (int a = 0; a < K::RM; a++)
#pragma unroll
        for (int j = 0; j < K::RM; j++) s[a][j] = dp[a][j] = 0.0f;
      for (int c = 0; c < D; c++) {
        float kv[K::RM], vv[K::RM], qv[K::RM], ov[K::RM];
#pragma unroll
        for (int a = 0; a < K::RM; a++) {
          kv[a] = sK[(ty + 16 * a) * K::LDK + c];
          vv[a] = sV[(ty + 16 * a) * K::LDK + c];
          qv[a] = sQ[(tx + 16 * a) * K::LDK + c];
          ov[a] = sdO[(tx + 16 * a) * K::LDK + c];
        }
#pragma unroll
        for (int a = 0; a < K::RM; a++)
#pragma unroll
          for (int j = 0; j < K::RM; j++) {
            s[a][j] += kv[a] * qv[j];
            dp[a][j] += vv[a] * ov[j];
          }
      }
#pragma unroll
      for (int a = 0; a < K::RM; a++) {
        const int kj = k0 + ty + 16 * a;
#pragma unroll
        for (int j = 0; j < K::RM; j++) {
          const int il = tx + 16 * j, qi = q0 + il;
          float p, ds;
          const bool ok = qi >= kj && qi < T && kj < T && kj >= att_row_lo(seg, window, b, T, qi);
          att_p_ds(s[a][j], dp[a][j], sL[il], sD[il], ok, scale, &p, &ds);
          sPt[(ty + 16 * a) * K::LDP + il] = p;
          sdSt[(ty + 16 * a) * K::LDP + il] = ds;
        }
      }
      __syncthreads();
      for (int i = 0; i < TILE; i++) {
        float pv[K::RM], dsv[K::RM], ov[K::DN], qv[K::DN];
#pragma unroll
        for (int a = 0; a < K::RM; a++) {
          pv[a] = sPt[(ty + 16 * a) * K::LDP + i];
          dsv[a] = sdSt[(ty + 16 * a) * K::LDP + i];
        }
#pragma unroll
        for (int d = 0; d < K::DN; d++) {
          ov[d] = sdO[i * K::LDK + tx + 16 * d];
          qv[d] = sQ[i * K::LDK + tx + 16 * d];
        }
#pragma unroll
        for (int a = 0; a < K::RM; a++)
#pragma unroll
          for (int d = 0; d < K::DN; d++) {
            dv[a][d] += pv[a] * ov[d];
            dk[a][d] += dsv[a] * qv[d];
          }
      }
    }
  }
#pragma unroll
  for (int a = 0; a < K::RM; a++) {
    const int kj = k0 + ty + 16 * a;
    if (kj >= T) continue;
    ops_bf16 *dkrow = dqkv + ((int64_t)b * T + kj) * C3 + C + (int64_t)g * D, *dvrow = dkrow + (int64_t)NKV * D;
#pragma unroll
    for (int d = 0; d < K::DN; d++) {
      dkrow[tx + 16 * d] = tobf(dk[a][d] * scale);
      dvrow[tx + 16 * d] = tobf(dv[a][d]);
    }
  }
}

template <int D, int TILE>
__global__ void __launch_bounds__(ATT_THREADS)
    attention_backward_dq_kernel(ops_bf16 *__restrict__ dqkv, const ops_bf16 *__restrict__ dout,
                                 const ops_bf16 *__restrict__ qkv, const float *__restrict__ lse,
                                 const float *__restrict__ dvec, int T, int C, int NH, int NKV, float scale,
                                 const int32_t *__restrict__ seg, int window) {
  using K = att_cfg<D, TILE>;
  extern __shared__ float sm[];
  float *sQ = sm, *sdO = sQ + TILE * K::LDK, *sK = sdO + TILE * K::LDK, *sV = sK + TILE * K::LDK;
  float *sdS = sV + TILE * K::LDK, *sL = sdS + TILE * K::LDP, *sD = sL + TILE;
  const int qt = gridDim.x - 1 - blockIdx.x; /* longest first */
  const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t C3 = C + 2 * (int64_t)NKV * D;
  const ops_bf16 *q = qkv + (int64_t)b * T * C3 + (int64_t)h * D;
  const ops_bf16 *k = qkv + (int64_t)b * T * C3 + C + (int64_t)g * D, *v = k + (int64_t)NKV * D;
  const ops_bf16 *dO = dout + (int64_t)b * T * C + (int64_t)h * D;
  const float *L = lse + ((int64_t)b * NH + h) * T, *Dv = dvec + ((int64_t)b * NH + h) * T;
  const int q0 = qt * TILE;

  load_tile<D, TILE, K::LDK>(sQ, q, C3, q0, T);
  load_tile<D, TILE, K::LDK>(sdO, dO, C, q0, T);
  for (int i = threadIdx.x; i < TILE; i += ATT_THREADS) {
    sL[i] = q0 + i < T ? L[q0 + i] : 0.0f;
    sD[i] = q0 + i < T ? Dv[q0 + i] : 0.0f;
  }
  float dq[K::RM][K::DN];
#pragma unroll
  for (int a = 0; a < K::RM; a++)
#pragma unroll
    for (int d = 0; d < K::DN; d++) dq[a][d] = 0.0f;

  for (int kt = att_row_lo(seg, window, b, T, q0) / TILE; kt <= qt; kt++) {
    const int k0 = kt * TILE;
    __syncthreads();
    load_tile<D, TILE, K::LDK>(sK, k, C3, k0, T);
    load_tile<D, TILE, K::LDK>(sV, v, C3, k0, T);
    __syncthreads();
    /* rows are queries i = ty + 16a, columns keys j = tx + 16b */
    float s[K::RM][K::RM], dp[K::RM][K::RM];
#pragma unroll
    for (int a = 0; a < K::RM; a++)
#pragma unroll
      for (int j = 0; j < K::RM; j++) s[a][j] = dp[a][j] = 0.0f;
    for (int c = 0; c < D; c++) {
      float qv[K::RM], ov[K::RM], kv[K::RM], vv[K::RM];
#pragma unroll
      for (int a = 0; a < K::RM; a++) {
        qv[a] = sQ[(ty + 16 * a) * K::LDK + c];
        ov[a] = sdO[(ty + 16 * a) * K::LDK + c];
        kv[a] = sK[(tx + 16 * a) * K::LDK + c];
        vv[a] = sV[(tx + 16 * a) * K::LDK + c];
      }
#pragma unroll
      for (int a = 0; a < K::RM; a++)
#pragma unroll
        for (int j = 0; j < K::RM; j++) {
          s[a][j] += qv[a] * kv[j];
          dp[a][j] += ov[a] * vv[j];
        }
    }
#pragma unroll
    for (int a = 0; a < K::RM; a++) {
      const int il = ty + 16 * a, qi = q0 + il, lo = att_row_lo(seg, window, b, T, qi);
#pragma unroll
      for (int j = 0; j < K::RM; j++) {
        const int kj = k0 + tx + 16 * j;
        float p, ds;
        att_p_ds(s[a][j], dp[a][j], sL[il], sD[il], qi >= kj && qi < T && kj < T && kj >= lo, scale, &p, &ds);
        sdS[il * K::LDP + tx + 16 * j] = ds;
      }
    }
    __syncthreads();
    for (int j = 0; j < TILE; j++) {
      float dsv[K::RM], kv[K::DN];
#pragma unroll
      for (int a = 0; a < K::RM; a++) dsv[a] = sdS[(ty + 16 * a) * K::LDP + j];
#pragma unroll
      for (int d = 0; d < K::DN; d++) kv[d] = sK[j * K::LDK + tx + 16 * d];
#pragma unroll
      for (int a = 0; a < K::RM; a++)
#pragma unroll
        for (int d = 0; d < K::DN; d++) dq[a][d] += dsv[a] * kv[d];
    }
  }
#pragma unroll
  for (int a = 0; a < K::RM; a++) {
    const int qi = q0 + ty + 16 * a;
    if (qi >= T) continue;
    ops_bf16 *dqrow = dqkv + ((int64_t)b * T + qi) * C3 + (int64_t)h * D;
#pragma unroll
    for (int d = 0; d < K::DN; d++) dqrow[tx + 16 * d] = tobf(dq[a][d] * scale);
  }
}

/* ---- host side ---- */

static fsdp_status attention_args(int B, int C, int NH, int NKV, const char *what) {
  if (NH <= 0 || C % NH != 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: C=%d is not a multiple of NH=%d", what, C, NH);
  if (NKV <= 0 || NH % NKV != 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: NKV=%d kv heads must divide NH=%d", what, NKV, NH);
  const int hs = C / NH;
  if (hs != 64 && hs != 128)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: head size %d (C=%d, NH=%d); the fused attention supports 64 "
                          "and 128", what, hs, C, NH);
  if (NH > 65535 || B > 65535)
    return fsdp_set_error(FSDP_ERR_RANGE, "%s: B=%d, NH=%d must be at most 65535", what, B, NH);
  return FSDP_OK;
}

template <int D, int TILE>
static fsdp_status attention_forward_launch(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C,
                                            int NH, int NKV, const int32_t *seg, int window,
                                            const ops_cuda_ctx *ctx) {
  static const char *what = "attention_forward";
  using K = att_cfg<D, TILE>;
  static ops_smem_once once;
  TRY(ops_smem_opt_in(&once, attention_forward_kernel<D, TILE>, K::fwd_smem, ctx, what));
  dim3 grid((T + TILE - 1) / TILE, NH, B);
  attention_forward_kernel<D, TILE><<<grid, ATT_THREADS, K::fwd_smem, ctx->stream>>>(out, lse, qkv, T, C, NH,
                                                                                     NKV, attn_scale(D), seg, window);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

template <int D, int TILE>
static fsdp_status attention_backward_launch(ops_bf16 *dqkv, const ops_bf16 *dout, const ops_bf16 *qkv,
                                             const float *lse, const float *dvec, int B, int T, int C, int NH,
                                             int NKV, const int32_t *seg, int window, const ops_cuda_ctx *ctx) {
  static const char *what = "attention_backward";
  using K = att_cfg<D, TILE>;
  static ops_smem_once once_dkv, once_dq;
  TRY(ops_smem_opt_in(&once_dkv, attention_backward_dkv_kernel<D, TILE>, K::bwd_smem, ctx, what));
  TRY(ops_smem_opt_in(&once_dq, attention_backward_dq_kernel<D, TILE>, K::bwd_smem, ctx, what));
  const int nt = (T + TILE - 1) / TILE;
  attention_backward_dkv_kernel<D, TILE><<<dim3(nt, NKV, B), ATT_THREADS, K::bwd_smem, ctx->stream>>>(
      dqkv, dout, qkv, lse, dvec, T, C, NH, NKV, attn_scale(D), seg, window);
  LAUNCH_CHECK("attention_backward (dk, dv)");
  attention_backward_dq_kernel<D, TILE><<<dim3(nt, NH, B), ATT_THREADS, K::bwd_smem, ctx->stream>>>(
      dqkv, dout, qkv, lse, dvec, T, C, NH, NKV, attn_scale(D), seg, window);
  LAUNCH_CHECK("attention_backward (dq)");
  return FSDP_OK;
}

/* The implementation in use: −1 until the first call reads FSDP_CUDA_ATTN. */
static std::atomic<int> g_attn_impl(-1);
/* What the last forward and backward ran, and why cuDNN last fell back (for reports). */
static std::atomic<int> g_attn_ran[2] = {{-1}, {-1}};
static std::mutex g_attn_note_mu;
static char g_attn_note[320];

void ops_cuda_attention_select(ops_attn_impl impl) { g_attn_impl.store((int)impl); }

ops_attn_impl ops_cuda_attention_selected(void) {
  int v = g_attn_impl.load();
  if (v < 0) {
    const char *e = envknob_get(ENV_CUDA_ATTN);
    int want = (int)OPS_ATTN_CUDNN;
    if (strcmp(e, "fma") == 0) want = (int)OPS_ATTN_FMA;
    else if (strcmp(e, "tc") == 0) want = (int)OPS_ATTN_TC;
    else if (strcmp(e, "cudnn") != 0)
      log_warn("FSDP_CUDA_ATTN=%s is not one of cudnn, tc, fma: using cudnn (the tensor-core kernel where cuDNN "
               "cannot run)", e);
    g_attn_impl.compare_exchange_strong(v, want); /* a concurrent select() wins */
    v = g_attn_impl.load();
  }
  return (ops_attn_impl)v;
}

ops_attn_impl ops_cuda_attention_ran(int backward) { return (ops_attn_impl)g_attn_ran[backward ? 1 : 0].load(); }

void ops_cuda_attention_note(char *buf, size_t n) {
  std::lock_guard<std::mutex> hold(g_attn_note_mu);
  snprintf(buf, n, "%s", g_attn_note);
}

/* The implementation a call runs first: cuDNN's graph expresses the causal mask and the sliding
 * window, not packed documents (docs/gpu.md), so with SEG the tensor-core kernels run, said once. */
static ops_attn_impl impl_for(const int32_t *seg) {
  static std::atomic<bool> said(false);
  ops_attn_impl impl = ops_cuda_attention_selected();
  if (!seg || impl != OPS_ATTN_CUDNN) return impl;
  if (!said.exchange(true))
    log_info("attention: packed documents run the tensor-core kernels (cuDNN's graph here has no document mask)");
  return OPS_ATTN_TC;
}

/* cuDNN's answer: FSDP_ERR_UNSUPPORTED means "run the tensor-core kernel" (its reason kept). */
static bool cudnn_fell_back(fsdp_status rc, const char *why) {
  if (rc != FSDP_ERR_UNSUPPORTED) return false;
  std::lock_guard<std::mutex> hold(g_attn_note_mu);
  snprintf(g_attn_note, sizeof g_attn_note, "%s", why);
  return true;
}

fsdp_status ops_cuda_attention_forward(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C, int NH,
                                       int NKV, const int32_t *seg, int window, const ops_cuda_ctx *ctx) {
  TRY(attention_args(B, C, NH, NKV, "attention_forward"));
  if (B <= 0 || T <= 0) return FSDP_OK;
  ops_attn_impl impl = impl_for(seg);
  if (impl == OPS_ATTN_CUDNN) {
    char why[320];
    fsdp_status rc = ops_cudnn_attention_forward(out, lse, qkv, B, T, C, NH, NKV, window, ctx, why, sizeof why);
    if (!cudnn_fell_back(rc, why)) {
      g_attn_ran[0].store((int)OPS_ATTN_CUDNN);
      return rc;
    }
    impl = OPS_ATTN_TC;
  }
  /* the tensor-core kernels copy 16-byte vectors: pointers off 16 bytes take the FMA kernels */
  if (impl == OPS_ATTN_TC && !(ops_aligned16(qkv) && ops_aligned16(out))) impl = OPS_ATTN_FMA;
  g_attn_ran[0].store((int)impl);
  if (impl == OPS_ATTN_TC) return ops_attention_tc_forward(out, lse, qkv, B, T, C, NH, NKV, seg, window, ctx);
  if (C / NH == 64) return attention_forward_launch<64, 64>(out, lse, qkv, B, T, C, NH, NKV, seg, window, ctx);
  return attention_forward_launch<128, 32>(out, lse, qkv, B, T, C, NH, NKV, seg, window, ctx);
}

fsdp_status ops_cuda_attention_backward(ops_bf16 *dqkv, float *scratch, const ops_bf16 *dout, const ops_bf16 *qkv,
                                        const ops_bf16 *out, const float *lse, int B, int T, int C, int NH,
                                        int NKV, const int32_t *seg, int window, const ops_cuda_ctx *ctx) {
  static const char *what = "attention_backward";
  TRY(attention_args(B, C, NH, NKV, what));
  if (B <= 0 || T <= 0) return FSDP_OK;
  ops_attn_impl impl = impl_for(seg);
  if (impl == OPS_ATTN_CUDNN) {
    char why[320];
    fsdp_status rc = ops_cudnn_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV, window, ctx,
                                                  why, sizeof why);
    if (!cudnn_fell_back(rc, why)) {
      g_attn_ran[1].store((int)OPS_ATTN_CUDNN);
      return rc;
    }
    impl = OPS_ATTN_TC;
  }
  if (impl == OPS_ATTN_TC && !(ops_aligned16(dqkv) && ops_aligned16(dout) && ops_aligned16(qkv))) impl = OPS_ATTN_FMA;
  g_attn_ran[1].store((int)impl);
  const int64_t rows = (int64_t)B * T * NH;
  float *dvec = scratch;
  if (ops_aligned16(dout) && ops_aligned16(out)) /* rows of hs = 64 or 128 bf16: whole 16-byte packs */
    attention_dvec_kernel<true><<<(unsigned)((rows * (C / NH / 8) + OPS_THREADS - 1) / OPS_THREADS), OPS_THREADS, 0,
                                  ctx->stream>>>(dvec, dout, out, B, T, C, NH);
  else
    attention_dvec_kernel<false><<<(unsigned)((rows * 32 + OPS_THREADS - 1) / OPS_THREADS), OPS_THREADS, 0,
                                   ctx->stream>>>(dvec, dout, out, B, T, C, NH);
  LAUNCH_CHECK("attention_backward (dO·O)");
  if (impl == OPS_ATTN_TC)
    return ops_attention_tc_backward(dqkv, dout, qkv, lse, dvec, B, T, C, NH, NKV, seg, window, ctx);
  if (C / NH == 64)
    return attention_backward_launch<64, 64>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, NKV, seg, window, ctx);
  return attention_backward_launch<128, 32>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, NKV, seg, window, ctx);
}
