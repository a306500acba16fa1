/* ops_cuda_norm — the embedding, LayerNorm, GELU and residual kernels (see ops_cuda.h): bf16
 * storage, fp32 math, scalar formulas from the headers in worker/ops/ as on the CPU.
 *
 * Layout of the work: elementwise ops are grid-stride loops over 128-bit packs of 8 bf16 where the
 * pointers allow (ops_ew_loop); LayerNorm is one warp per row (8 rows per 256-thread block: B·T =
 * 16384 rows give 2048 blocks for 132 SMs), 8 columns per lane per load; every parameter gradient
 * is a column sum over the rows, over fixed row slices folded by the last block of each column
 * group (ops_colsum_fold: one kernel), so that the order, hence the bits, depends only on the
 * shapes. The embedding's backward walks each token's chain of positions once (encoder_dwte_kernel).
 */
#include "ops_cuda_common.cuh"

#include "ops/docmask.h"
#include "ops/gelu.h"
#include "ops/layernorm.h"

/* ---- encoder ---- */

template <bool VEC>
__global__ void encoder_forward_kernel(ops_bf16 *__restrict__ out, const int *__restrict__ inp,
                                       const ops_bf16 *__restrict__ wte, const ops_bf16 *__restrict__ wpe, int T,
                                       int C, const int32_t *__restrict__ seg, int64_t n) {
  /* VEC: C is a multiple of 8, so a pack never crosses a row */
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        const int c = (int)(i % C);
        const int64_t bt = i / C;
        float x[8], p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        ld8(x, wte + (int64_t)inp[bt] * C + c);
        if (wpe) ld8(p, wpe + (int64_t)doc_pos(seg, bt, (int)(bt % T)) * C + c);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] += p[k];
        st8(out + i, x);
      },
      [&](int64_t i) {
        const int c = (int)(i % C);
        const int64_t bt = i / C;
        const int t = doc_pos(seg, bt, (int)(bt % T));
        out[i] = tobf(ldbf(wte + (int64_t)inp[bt] * C + c) + (wpe ? ldbf(wpe + (int64_t)t * C + c) : 0.0f));
      });
}

/* dwpe[t,c] += Σ_b dout[b,t,c], b in order. VEC: TC is a multiple of 8 (C is), a thread takes 8
 * columns at a time with 128-bit loads of dout and no tail; else one element at a time. */
template <bool VEC>
__global__ void encoder_dwpe_kernel(float *__restrict__ dwpe, const ops_bf16 *__restrict__ dout, int B, int64_t TC) {
  constexpr int W = VEC ? 8 : 1;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x * W;
  for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * W; i < TC; i += stride) {
    float s[W], x[W];
#pragma unroll
    for (int k = 0; k < W; k++) s[k] = 0.0f;
    const int nb = OPS_FAULT("dwpe_batch") ? B - 1 : B; /* planted: the last sequence left out */
    for (int b = 0; b < nb; b++) {
      ops_ldv<VEC>(x, dout + (int64_t)b * TC + i);
#pragma unroll
      for (int k = 0; k < W; k++) s[k] += x[k];
    }
    if (VEC) {
      float d[8];
      ld4f(d, dwpe + i);
      ld4f(d + 4, dwpe + i + 4);
#pragma unroll
      for (int k = 0; k < W; k++) d[k] += s[k];
      st4f(dwpe + i, d);
      st4f(dwpe + i + 4, d + 4);
    } else {
      dwpe[i] += s[0];
    }
  }
}

/* With documents: dwpe[p,c] += Σ over rows b, then positions t in order, of dout[b,t,c] where
 * t − seg[b·T + t] = p (the token at position p of its document). */
__global__ void encoder_dwpe_docs_kernel(float *__restrict__ dwpe, const ops_bf16 *__restrict__ dout,
                                         const int32_t *__restrict__ seg, int B, int T, int C) {
  const int64_t TC = (int64_t)T * C;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < TC; i += (int64_t)gridDim.x * blockDim.x) {
    const int p = (int)(i / C), c = (int)(i % C);
    float s = 0.0f;
    for (int b = 0; b < B; b++)
      for (int t = p; t < T; t++)
        if (doc_pos(seg, (int64_t)b * T + t, t) == p) s += ldbf(dout + ((int64_t)b * T + t) * C + c);
    dwpe[i] += s;
  }
}

/* next[i] = the smallest j > i with inp[j] == inp[i], or −1; has_prev[next[i]] = 1 (has_prev is
 * zeroed before). ENC_TILE threads per block, positions i of the block against tiles of
 * ENC_SPAN later positions in shared memory (VEC: loaded 4 tokens, 128 bits, per thread), until
 * every thread of the block found its successor. */
#define ENC_TILE 256
#define ENC_SPAN (4 * ENC_TILE)
template <bool VEC>
__global__ void __launch_bounds__(ENC_TILE) encoder_link_kernel(int *__restrict__ next, int *__restrict__ has_prev,
                                                                const int *__restrict__ inp, int BT) {
  __shared__ int tile[ENC_SPAN];
  const int i = blockIdx.x * ENC_TILE + threadIdx.x;
  const int tok = i < BT ? inp[i] : -1;
  int nx = -1;
  for (int j0 = blockIdx.x * ENC_TILE; j0 < BT; j0 += ENC_SPAN) {
    const int j = j0 + 4 * (int)threadIdx.x; /* a multiple of 4: 16-byte aligned when inp is */
    if (VEC && j + 3 < BT) {
      const int4 q = *reinterpret_cast<const int4 *>(inp + j);
      tile[4 * threadIdx.x] = q.x, tile[4 * threadIdx.x + 1] = q.y;
      tile[4 * threadIdx.x + 2] = q.z, tile[4 * threadIdx.x + 3] = OPS_FAULT("link_tile") ? -1 : q.w;
    } else {
#pragma unroll
      for (int k = 0; k < 4; k++) tile[4 * threadIdx.x + k] = j + k < BT ? inp[j + k] : -1;
    }
    __syncthreads();
    if (nx < 0 && i < BT) {
      const int lim = BT - j0 < ENC_SPAN ? BT - j0 : ENC_SPAN;
      for (int jj = 0; jj < lim; jj++)
        if (j0 + jj > i && tile[jj] == tok) {
          nx = j0 + jj;
          break;
        }
    }
    if (__syncthreads_and(nx >= 0 || i >= BT)) break; /* also the barrier before the tile is reloaded */
  }
  if (i < BT) {
    next[i] = nx;
    if (nx >= 0) has_prev[nx] = 1; /* next is injective: no two threads write one element */
  }
}

/* One block per position i that starts a chain (the first occurrence of its token) other than PAD's:
 * dwte[tok, c] += Σ over the chain of dout[j, c], positions in order. VEC: the block's threads cover the whole
 * row, 8 columns each (128-bit loads of dout), so the chain is walked once; else a thread per
 * column, the chain walked once per blockDim columns. */
template <bool VEC>
__global__ void encoder_dwte_kernel(float *__restrict__ dwte, const ops_bf16 *__restrict__ dout,
                                    const int *__restrict__ inp, const int *__restrict__ next,
                                    const int *__restrict__ has_prev, int C, int pad) {
  const int i = blockIdx.x;
  if (has_prev[i] || (inp[i] == pad && !OPS_FAULT("pad_row"))) return;   /* planted: the pad row trained */
  float *row = dwte + (int64_t)inp[i] * C;
  if (VEC) {
    for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) { /* once for C ≤ 8·1024 */
      float s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, x[8];
      for (int j = i; j >= 0; j = OPS_FAULT("dwte_chain") ? -1 : next[j]) { /* planted: the chain's head only */
        ld8(x, dout + (int64_t)j * C + c);
#pragma unroll
        for (int k = 0; k < 8; k++) s[k] += x[k];
      }
#pragma unroll
      for (int k = 0; k < 8; k++) row[c + k] += s[k]; /* dwte's rows are not 16-byte aligned in general */
    }
  } else {
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float s = 0.0f;
      for (int j = i; j >= 0; j = next[j]) s += ldbf(dout + (int64_t)j * C + c);
      row[c] += s;
    }
  }
}

fsdp_status ops_cuda_encoder_forward(ops_bf16 *out, const int *inp, const ops_bf16 *wte, const ops_bf16 *wpe, int B,
                                     int T, int C, const int32_t *seg, const ops_cuda_ctx *ctx) {
  int64_t n = (int64_t)B * T * C;
  if (n <= 0) return FSDP_OK;
  const bool vec = C % 8 == 0 && ops_aligned16(out) && ops_aligned16(wte) && (!wpe || ops_aligned16(wpe));
  OPS_EW_LAUNCH(encoder_forward_kernel, vec, 8, n, "encoder_forward", out, inp, wte, wpe, T, C, seg);
  return FSDP_OK;
}

fsdp_status ops_cuda_encoder_backward(float *dwte, float *dwpe, const ops_bf16 *dout, const int *inp, int B, int T,
                                      int C, int pad, const int32_t *seg, const ops_cuda_ctx *ctx) {
  static const char *what = "encoder_backward";
  const int BT = B * T;
  if ((int64_t)BT * C <= 0) return FSDP_OK;
  void *ws = NULL;
  TRY(ops_workspace(ctx, 2 * (size_t)BT * sizeof(int), what, &ws));
  int *next = (int *)ws, *has_prev = next + BT;
  if (dwpe && seg) {
    encoder_dwpe_docs_kernel<<<ops_blocks((int64_t)T * C, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(dwpe, dout, seg,
                                                                                                      B, T, C);
    LAUNCH_CHECK(what);
  } else if (dwpe) {
    const int64_t TC = (int64_t)T * C;
    const bool vec = C % 8 == 0 && ops_aligned16(dout) && ops_aligned16(dwpe);
    OPS_EW_LAUNCH(encoder_dwpe_kernel, vec, 8, TC, what, dwpe, dout, B);
  }
  CUDA_CHECK(cudaMemsetAsync(has_prev, 0, (size_t)BT * sizeof(int), ctx->stream), what);
  const unsigned lblocks = (BT + ENC_TILE - 1) / ENC_TILE;
  if (ops_aligned16(inp)) encoder_link_kernel<true><<<lblocks, ENC_TILE, 0, ctx->stream>>>(next, has_prev, inp, BT);
  else encoder_link_kernel<false><<<lblocks, ENC_TILE, 0, ctx->stream>>>(next, has_prev, inp, BT);
  LAUNCH_CHECK(what);
  if (C % 8 == 0 && ops_aligned16(dout)) {
    const int packs = C / 8, threads = packs >= 1024 ? 1024 : (packs + 31) / 32 * 32;
    encoder_dwte_kernel<true><<<BT, threads, 0, ctx->stream>>>(dwte, dout, inp, next, has_prev, C, pad);
  } else {
    const int threads = C >= 256 ? 256 : (C + 31) / 32 * 32;
    encoder_dwte_kernel<false><<<BT, threads, 0, ctx->stream>>>(dwte, dout, inp, next, has_prev, C, pad);
  }
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

/* ---- LayerNorm: one warp per row ----
 * VEC: each lane takes 8 consecutive columns at a time (C a multiple of 8, rows 16-byte aligned):
 * 256 columns per warp step, every load and store 128 bits; the row is re-read from L1 by each
 * pass rather than held in registers, so any C works. */

#define LN_ROWS_PER_BLOCK 8
#define LN_STEP(VEC) ((VEC) ? 256 : 32)   /* columns per warp step */
#define LN_W(VEC) ((VEC) ? 8 : 1)         /* columns per lane per step */

/* The rest of a LayerNorm row once S = Σ x over the row X (bf16, C values) is known: the mean, the
 * variance in a second pass over X (two passes, as on the CPU), then out = norm·w + b in a third;
 * lane 0 saves the row's mean and rstd. One warp per row, LN_W(VEC) columns per lane per step. */
template <bool VEC>
__device__ __forceinline__ void ln_row(ops_bf16 *__restrict__ o, float *__restrict__ mean, float *__restrict__ rstd,
                                       const ops_bf16 *x, const ops_bf16 *__restrict__ weight,
                                       const ops_bf16 *__restrict__ bias, int64_t r, int C, float s) {
  constexpr int W = LN_W(VEC);
  const int lane = threadIdx.x % 32;
  const float m = warp_sum(s) / (float)C;
  float v = 0.0f, xv[W], wv[W], bv[W];
  for (int c = lane * W; c < C; c += LN_STEP(VEC)) {
    ops_ldv<VEC>(xv, x + c);
#pragma unroll
    for (int k = 0; k < W; k++) v += (xv[k] - m) * (xv[k] - m);
  }
  const float rs = layernorm_rstd(warp_sum(v) / (float)C);
  for (int c = lane * W; c < C; c += LN_STEP(VEC)) {
    ops_ldv<VEC>(xv, x + c);
    ops_ldv<VEC>(wv, weight + c);
    ops_ldv<VEC>(bv, bias + c);
#pragma unroll
    for (int k = 0; k < W; k++) xv[k] = layernorm_norm(xv[k], m, rs) * wv[k] + bv[k];
    ops_stv<VEC>(o + c, xv);
  }
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

template <bool VEC>
__global__ void __launch_bounds__(32 * LN_ROWS_PER_BLOCK)
    layernorm_forward_kernel(ops_bf16 *__restrict__ out, float *__restrict__ mean, float *__restrict__ rstd,
                             const ops_bf16 *__restrict__ inp, const ops_bf16 *__restrict__ weight,
                             const ops_bf16 *__restrict__ bias, int R, int C) {
  constexpr int W = LN_W(VEC);
  const int lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / 32;
  if (r >= R) return;
  const ops_bf16 *x = inp + r * C;
  float s = 0.0f, xv[W];
  for (int c = lane * W; c < C; c += LN_STEP(VEC)) {
    ops_ldv<VEC>(xv, x + c);
#pragma unroll
    for (int k = 0; k < W; k++) s += xv[k];
  }
  ln_row<VEC>(out + r * C, mean, rstd, x, weight, bias, r, C, s);
}

/* dinp = the row's input gradient; ACC: dinp += it instead (the residual stream's gradient, one
 * bf16 rounding of the sum: the separate add is gone). */
template <bool VEC, bool ACC>
__global__ void __launch_bounds__(32 * LN_ROWS_PER_BLOCK)
    layernorm_dinp_kernel(ops_bf16 *__restrict__ dinp, const ops_bf16 *__restrict__ dout,
                          const ops_bf16 *__restrict__ inp, const ops_bf16 *__restrict__ weight,
                          const float *__restrict__ mean, const float *__restrict__ rstd, int R, int C) {
  constexpr int W = LN_W(VEC);
  const int lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / 32;
  if (r >= R) return;
  const ops_bf16 *x = inp + r * C, *d = dout + r * C;
  const float m = mean[r], rs = rstd[r];
  float g_sum = 0.0f, gn_sum = 0.0f, xv[W], wv[W], dv[W];
  for (int c = lane * W; c < C; c += LN_STEP(VEC)) {
    ops_ldv<VEC>(xv, x + c);
    ops_ldv<VEC>(wv, weight + c);
    ops_ldv<VEC>(dv, d + c);
#pragma unroll
    for (int k = 0; k < W; k++) {
      const float g = wv[k] * dv[k];
      g_sum += g;
      gn_sum += g * layernorm_norm(xv[k], m, rs);
    }
  }
  const float g_mean = warp_sum(g_sum) / (float)C, gn_mean = warp_sum(gn_sum) / (float)C;
  ops_bf16 *dx = dinp + r * C;
  for (int c = lane * W; c < C; c += LN_STEP(VEC)) {
    ops_ldv<VEC>(xv, x + c);
    ops_ldv<VEC>(wv, weight + c);
    ops_ldv<VEC>(dv, d + c);
#pragma unroll
    for (int k = 0; k < W; k++)
      xv[k] = layernorm_dinp(wv[k] * dv[k], layernorm_norm(xv[k], m, rs), g_mean, gn_mean, rs);
    if (ACC && !OPS_FAULT("norm_acc")) { /* planted: assigned, not accumulated */
      ops_ldv<VEC>(wv, dx + c);
#pragma unroll
      for (int k = 0; k < W; k++) xv[k] += wv[k];
    }
    ops_stv<VEC>(dx + c, xv);
  }
}

/* res = a + b, rounded to bf16 and stored, then the LayerNorm of those bf16 values (one warp per
 * row; each lane reads back only what it wrote). No __restrict__ on res and a: res may be a. */
template <bool VEC>
__global__ void __launch_bounds__(32 * LN_ROWS_PER_BLOCK)
    residual_layernorm_kernel(ops_bf16 *res, ops_bf16 *__restrict__ out, float *__restrict__ mean,
                              float *__restrict__ rstd, const ops_bf16 *a, const ops_bf16 *__restrict__ b,
                              const ops_bf16 *__restrict__ weight, const ops_bf16 *__restrict__ bias, int R, int C) {
  constexpr int W = LN_W(VEC);
  const int lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / 32;
  if (r >= R) return;
  ops_bf16 *x = res + r * C;
  float s = 0.0f, xv[W], yv[W];
  for (int c = lane * W; c < C; c += LN_STEP(VEC)) {
    ops_ldv<VEC>(xv, a + r * C + c);
    ops_ldv<VEC>(yv, b + r * C + c);
#pragma unroll
    for (int k = 0; k < W; k++) {
      xv[k] = tof(tobf(xv[k] + yv[k]));   /* the stored value, as the LayerNorm will read it */
      s += xv[k];
    }
    ops_stv<VEC>(x + c, xv);
  }
  ln_row<VEC>(out + r * C, mean, rstd, x, weight, bias, r, C, s);   /* reads back what this lane wrote */
}

/* dweight += Σ_r dout·norm and dbias += Σ_r dout, columns over the rows: row slices, folded by
 * the last block of each column group (ops_colsum_fold); VEC: 8 columns per thread, 128-bit loads. */
template <bool VEC>
__global__ void __launch_bounds__(OPS_CS_X *OPS_CS_Y)
    layernorm_dparams_kernel(float *dweight, float *dbias, float *__restrict__ partial, int *__restrict__ counters,
                             const ops_bf16 *__restrict__ dout, const ops_bf16 *__restrict__ inp,
                             const float *__restrict__ mean, const float *__restrict__ rstd, int R, int C,
                             int rows_per_split) {
  constexpr int W = VEC ? 8 : 1;
  ops_colsum_fold<2, W>(dweight, dbias, partial, counters, R, C, rows_per_split, [&](int64_t r, int c, float(*acc)[W]) {
    float d[W], x[W];
    ops_ldv<VEC>(d, dout + r * C + c);
    ops_ldv<VEC>(x, inp + r * C + c);
    const float m = mean[r], rs = rstd[r];
#pragma unroll
    for (int k = 0; k < W; k++) {
      acc[0][k] += d[k] * layernorm_norm(x[k], m, rs);
      acc[1][k] += d[k];
    }
  });
}

fsdp_status ops_cuda_layernorm_forward(ops_bf16 *out, float *mean, float *rstd, const ops_bf16 *inp,
                                       const ops_bf16 *weight, const ops_bf16 *bias, int B, int T, int C,
                                       const ops_cuda_ctx *ctx) {
  const int R = B * T;
  if (R <= 0 || C <= 0) return FSDP_OK;
  const unsigned blocks = (R + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK;
  if (C % 8 == 0 && ops_aligned16(out) && ops_aligned16(inp) && ops_aligned16(weight) && ops_aligned16(bias))
    layernorm_forward_kernel<true><<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, ctx->stream>>>(out, mean, rstd, inp, weight,
                                                                                       bias, R, C);
  else
    layernorm_forward_kernel<false><<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, ctx->stream>>>(out, mean, rstd, inp, weight,
                                                                                        bias, R, C);
  LAUNCH_CHECK("layernorm_forward");
  return FSDP_OK;
}

fsdp_status ops_cuda_residual_layernorm_forward(ops_bf16 *res, ops_bf16 *out, float *mean, float *rstd,
                                                const ops_bf16 *a, const ops_bf16 *b, const ops_bf16 *weight,
                                                const ops_bf16 *bias, int B, int T, int C, const ops_cuda_ctx *ctx) {
  const int R = B * T;
  if (R <= 0 || C <= 0) return FSDP_OK;
  const unsigned blocks = (R + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK;
  const bool vec = C % 8 == 0 && ops_aligned16(res) && ops_aligned16(out) && ops_aligned16(a) && ops_aligned16(b) &&
                   ops_aligned16(weight) && ops_aligned16(bias);
  if (vec)
    residual_layernorm_kernel<true><<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, ctx->stream>>>(res, out, mean, rstd, a, b,
                                                                                        weight, bias, R, C);
  else
    residual_layernorm_kernel<false><<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, ctx->stream>>>(res, out, mean, rstd, a, b,
                                                                                         weight, bias, R, C);
  LAUNCH_CHECK("residual_layernorm_forward");
  return FSDP_OK;
}

static fsdp_status layernorm_backward(ops_bf16 *dinp, float *dweight, float *dbias, const ops_bf16 *dout,
                                      const ops_bf16 *inp, const ops_bf16 *weight, const float *mean,
                                      const float *rstd, int B, int T, int C, bool acc, const ops_cuda_ctx *ctx) {
  const char *what = acc ? "layernorm_backward_acc" : "layernorm_backward";
  const int R = B * T;
  if (R <= 0 || C <= 0) return FSDP_OK;
  const int nsplit = ops_colsum_splits(R), per = (R + nsplit - 1) / nsplit;
  void *ws = NULL;
  TRY(ops_workspace(ctx, ops_colsum_ws_bytes(2, nsplit, C), what, &ws));
  TRY(ops_colsum_zero(ws, 2, nsplit, C, ctx, what));
  float *partial = (float *)ws;
  int *counters = ops_colsum_counters(ws, 2, nsplit, C);
  const unsigned blocks = (R + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK;
  const bool vec8 = C % 8 == 0 && ops_aligned16(dout) && ops_aligned16(inp);
#define LN_DINP(V, A)                                                                                          \
  layernorm_dinp_kernel<V, A><<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, ctx->stream>>>(dinp, dout, inp, weight, mean, rstd, \
                                                                                 R, C)
  if (vec8 && ops_aligned16(dinp) && ops_aligned16(weight)) {
    if (acc) LN_DINP(true, true);
    else LN_DINP(true, false);
  } else {
    if (acc) LN_DINP(false, true);
    else LN_DINP(false, false);
  }
#undef LN_DINP
  LAUNCH_CHECK(what);
  if (!dweight) return FSDP_OK;   /* a frozen norm ([lora]) */
  const dim3 cs_block(OPS_CS_X, OPS_CS_Y);
  if (vec8)
    layernorm_dparams_kernel<true><<<ops_colsum_grid(C, R, 8), cs_block, 0, ctx->stream>>>(
        dweight, dbias, partial, counters, dout, inp, mean, rstd, R, C, per);
  else
    layernorm_dparams_kernel<false><<<ops_colsum_grid(C, R, 1), cs_block, 0, ctx->stream>>>(
        dweight, dbias, partial, counters, dout, inp, mean, rstd, R, C, per);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

fsdp_status ops_cuda_layernorm_backward(ops_bf16 *dinp, float *dweight, float *dbias, const ops_bf16 *dout,
                                        const ops_bf16 *inp, const ops_bf16 *weight, const float *mean,
                                        const float *rstd, int B, int T, int C, const ops_cuda_ctx *ctx) {
  return layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C, false, ctx);
}

fsdp_status ops_cuda_layernorm_backward_acc(ops_bf16 *dres, float *dweight, float *dbias, const ops_bf16 *dout,
                                            const ops_bf16 *inp, const ops_bf16 *weight, const float *mean,
                                            const float *rstd, int B, int T, int C, const ops_cuda_ctx *ctx) {
  return layernorm_backward(dres, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C, true, ctx);
}

/* ---- GELU, residual ---- */

template <bool VEC> __global__ void gelu_forward_kernel(ops_bf16 *__restrict__ out, const ops_bf16 *__restrict__ inp,
                                                        int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        float x[8];
        ld8(x, inp + i);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = gelu_tanh(x[k]);
        st8(out + i, x);
      },
      [&](int64_t i) { out[i] = tobf(gelu_tanh(ldbf(inp + i))); });
}

/* No __restrict__ on dinp and dout: they may be the same buffer (each element is read, then written
 * by the same thread). */
template <bool VEC>
__global__ void gelu_backward_kernel(ops_bf16 *dinp, const ops_bf16 *__restrict__ inp, const ops_bf16 *dout,
                                     int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        float x[8], d[8];
        ld8(x, inp + i);
        ld8(d, dout + i);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = gelu_tanh_grad(x[k]) * d[k];
        st8(dinp + i, x);
      },
      [&](int64_t i) { dinp[i] = tobf(gelu_tanh_grad(ldbf(inp + i)) * ldbf(dout + i)); });
}

/* out may be a (add_act). */
template <bool VEC>
__global__ void residual_forward_kernel(ops_bf16 *out, const ops_bf16 *a, const ops_bf16 *b, int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        float x[8], y[8];
        ld8(x, a + i);
        ld8(y, b + i);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] += y[k];
        st8(out + i, x);
      },
      [&](int64_t i) { out[i] = tobf(ldbf(a + i) + ldbf(b + i)); });
}

fsdp_status ops_cuda_gelu_forward(ops_bf16 *out, const ops_bf16 *inp, int64_t N, const ops_cuda_ctx *ctx) {
  if (N <= 0) return FSDP_OK;
  OPS_EW_LAUNCH(gelu_forward_kernel, ops_aligned16(out) && ops_aligned16(inp), 8, N, "gelu_forward", out, inp);
  return FSDP_OK;
}

fsdp_status ops_cuda_gelu_backward(ops_bf16 *dinp, const ops_bf16 *inp, const ops_bf16 *dout, int64_t N,
                                   const ops_cuda_ctx *ctx) {
  if (N <= 0) return FSDP_OK;
  const bool vec = ops_aligned16(dinp) && ops_aligned16(inp) && ops_aligned16(dout);
  OPS_EW_LAUNCH(gelu_backward_kernel, vec, 8, N, "gelu_backward", dinp, inp, dout);
  return FSDP_OK;
}

fsdp_status ops_cuda_residual_forward(ops_bf16 *out, const ops_bf16 *a, const ops_bf16 *b, int64_t N,
                                      const ops_cuda_ctx *ctx) {
  if (N <= 0) return FSDP_OK;
  const bool vec = ops_aligned16(out) && ops_aligned16(a) && ops_aligned16(b);
  OPS_EW_LAUNCH(residual_forward_kernel, vec, 8, N, "residual_forward", out, a, b);
  return FSDP_OK;
}
