/* ops_cuda_norm — the embedding, LayerNorm, GELU and residual kernels (see ops_cuda.h): bf16
 * storage, fp32 math, scalar formulas from the headers in worker/ops/ as on the CPU.
 *
 * Layout of the work: elementwise ops are grid-stride loops over 128-bit packs of 8 bf16 where the
 * pointers allow (ops_ew_loop); LayerNorm is one warp per row (8 rows per 256-thread block: B·T =
 * 16384 rows give 2048 blocks for 132 SMs), 8 columns per lane per load; every parameter gradient
 * is a column sum over the rows, done in two passes over fixed row slices (ops_colsum_splits) so
 * that the order, hence the bits, depends only on the shapes.
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

/* dwpe[t,c] += Σ_b dout[b,t,c], b in order. */
__global__ void encoder_dwpe_kernel(float *__restrict__ dwpe, const ops_bf16 *__restrict__ dout, int B, int64_t TC) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < TC; i += (int64_t)gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += ldbf(dout + (int64_t)b * TC + i);
    dwpe[i] += s;
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
 * zeroed before). 256 threads per block, positions i of the block against tiles of 256 later
 * positions in shared memory, until every thread of the block found its successor. */
#define ENC_TILE 256
__global__ void __launch_bounds__(ENC_TILE) encoder_link_kernel(int *__restrict__ next, int *__restrict__ has_prev,
                                                                const int *__restrict__ inp, int BT) {
  __shared__ int tile[ENC_TILE];
  const int i = blockIdx.x * ENC_TILE + threadIdx.x;
  const int tok = i < BT ? inp[i] : -1;
  int nx = -1;
  for (int j0 = blockIdx.x * ENC_TILE; j0 < BT; j0 += ENC_TILE) {
    int j = j0 + threadIdx.x;
    tile[threadIdx.x] = j < BT ? inp[j] : -1;
    __syncthreads();
    if (nx < 0 && i < BT) {
      int lim = BT - j0 < ENC_TILE ? BT - j0 : ENC_TILE;
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

/* One block per position i that starts a chain (the first occurrence of its token): dwte[tok, c]
 * += Σ over the chain of dout[j, c], positions in order. */
__global__ void encoder_dwte_kernel(float *__restrict__ dwte, const ops_bf16 *__restrict__ dout,
                                    const int *__restrict__ inp, const int *__restrict__ next,
                                    const int *__restrict__ has_prev, int C) {
  const int i = blockIdx.x;
  if (has_prev[i]) return;
  float *row = dwte + (int64_t)inp[i] * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.0f;
    for (int j = i; j >= 0; j = next[j]) s += ldbf(dout + (int64_t)j * C + c);
    row[c] += s;
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
                                      int C, const int32_t *seg, const ops_cuda_ctx *ctx) {
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
    encoder_dwpe_kernel<<<ops_blocks((int64_t)T * C, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(dwpe, dout, B,
                                                                                                 (int64_t)T * C);
    LAUNCH_CHECK(what);
  }
  CUDA_CHECK(cudaMemsetAsync(has_prev, 0, (size_t)BT * sizeof(int), ctx->stream), what);
  encoder_link_kernel<<<(BT + ENC_TILE - 1) / ENC_TILE, ENC_TILE, 0, ctx->stream>>>(next, has_prev, inp, BT);
  LAUNCH_CHECK(what);
  int threads = C >= 256 ? 256 : (C + 31) / 32 * 32;
  encoder_dwte_kernel<<<BT, threads, 0, ctx->stream>>>(dwte, dout, inp, next, has_prev, C);
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

template <bool VEC>
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

/* Partial sums over row slice blockIdx.y of dweight (Σ dout·norm) and dbias (Σ dout), 32 columns
 * per block, 8 thread rows, fixed order. */
#define LN_CS_ROWS 8
__global__ void layernorm_dparams_partial_kernel(float *__restrict__ pw, float *__restrict__ pb,
                                                 const ops_bf16 *__restrict__ dout, const ops_bf16 *__restrict__ inp,
                                                 const float *__restrict__ mean, const float *__restrict__ rstd,
                                                 int R, int C, int rows_per_split) {
  __shared__ float sw[LN_CS_ROWS][33], sb[LN_CS_ROWS][33];
  const int c = blockIdx.x * 32 + threadIdx.x, split = blockIdx.y;
  const int r0 = split * rows_per_split, r1 = r0 + rows_per_split < R ? r0 + rows_per_split : R;
  float w = 0.0f, b = 0.0f;
  if (c < C)
    for (int r = r0 + threadIdx.y; r < r1; r += LN_CS_ROWS) {
      float d = ldbf(dout + (int64_t)r * C + c);
      w += d * layernorm_norm(ldbf(inp + (int64_t)r * C + c), mean[r], rstd[r]);
      b += d;
    }
  sw[threadIdx.y][threadIdx.x] = w;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int y = 1; y < LN_CS_ROWS; y++) {
      w += sw[y][threadIdx.x];
      b += sb[y][threadIdx.x];
    }
    pw[(int64_t)split * C + c] = w;
    pb[(int64_t)split * C + c] = b;
  }
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

fsdp_status ops_cuda_layernorm_backward(ops_bf16 *dinp, float *dweight, float *dbias, const ops_bf16 *dout,
                                        const ops_bf16 *inp, const ops_bf16 *weight, const float *mean,
                                        const float *rstd, int B, int T, int C, const ops_cuda_ctx *ctx) {
  static const char *what = "layernorm_backward";
  const int R = B * T;
  if (R <= 0 || C <= 0) return FSDP_OK;
  const int nsplit = ops_colsum_splits(R), per = (R + nsplit - 1) / nsplit;
  void *ws = NULL;
  TRY(ops_workspace(ctx, 2 * (size_t)nsplit * C * sizeof(float), what, &ws));
  float *pw = (float *)ws, *pb = pw + (size_t)nsplit * C;
  const unsigned blocks = (R + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK;
  if (C % 8 == 0 && ops_aligned16(dinp) && ops_aligned16(dout) && ops_aligned16(inp) && ops_aligned16(weight))
    layernorm_dinp_kernel<true><<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, ctx->stream>>>(dinp, dout, inp, weight, mean,
                                                                                    rstd, R, C);
  else
    layernorm_dinp_kernel<false><<<blocks, 32 * LN_ROWS_PER_BLOCK, 0, ctx->stream>>>(dinp, dout, inp, weight, mean,
                                                                                     rstd, R, C);
  LAUNCH_CHECK(what);
  layernorm_dparams_partial_kernel<<<dim3((C + 31) / 32, nsplit), dim3(32, LN_CS_ROWS), 0, ctx->stream>>>(
      pw, pb, dout, inp, mean, rstd, R, C, per);
  LAUNCH_CHECK(what);
  TRY(ops_colsum_finish(dweight, pw, nsplit, C, ctx, what));
  return ops_colsum_finish(dbias, pb, nsplit, C, ctx, what);
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
