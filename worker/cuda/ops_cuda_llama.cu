/* ops_cuda_llama — Llama's operators on the GPU (see ops_cuda.h): nn.Linear through cuBLASLt,
 * RMSNorm and rotary embeddings (its SwiGLU is ops_cuda_gated.cu's); bf16 storage, fp32 math, the
 * scalar formulas from worker/ops/ (rmsnorm.h, rope.h) as on the CPU. The linear's bias is
 * matmul_forward's (the BIAS epilogue, ops_add_bias where cuBLASLt has none) and its gradient
 * matmul_backward's column sum (ops_colsum_accumulate).
 *
 * Layout of the work: RMSNorm is one warp per row (as LayerNorm in ops_cuda_norm.cu) and its
 * weight gradient a column sum over fixed row slices folded by its last blocks (ops_colsum_fold),
 * so the bits depend only on the shapes; rotary embeddings are one thread per rotated pair in a
 * grid-stride loop.
 *
 * linear, row-major to column-major (see ops_cuda_matmul.cu): a row-major W [OC, C] is the
 * column-major C×OC matrix, so out = inp·Wᵀ is outᵀ(OC×BT) = Wᵀ·inpᵀ (A = W transposed),
 * dinpᵀ(C×BT) = W(C×OC)·doutᵀ, and dW, column-major C×OC, += inpᵀ(C×BT)·dout(BT×OC) (B = dout
 * transposed), accumulated in fp32 by cuBLASLt with beta 1.
 */
#include "ops_cuda_common.cuh"

#include "ops/rmsnorm.h"
#include "ops/docmask.h"
#include "ops/rope.h"

/* ---- linear ---- */

fsdp_status ops_cuda_linear_forward(ops_bf16 *out, const ops_bf16 *inp, const ops_bf16 *weight, const ops_bf16 *bias,
                                    int BT, int C, int OC, const ops_cuda_ctx *ctx) {
  static const char *what = "linear_forward";
  if (BT <= 0 || OC <= 0) return FSDP_OK;
  if (C <= 0) return fsdp_set_error(FSDP_ERR_INVALID, "%s: C = %d", what, C);
  fsdp_status rc = ops_lt_gemm(ctx, what, 1, 0, OC, BT, C, weight, C, inp, C, out, OC, 0, 0,
                               bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, NULL, 0);
  if (rc != FSDP_ERR_UNSUPPORTED || !bias) return rc;
  /* no BIAS algorithm: the plain GEMM, then the bias (rounded into bf16 once more, as matmul_forward's) */
  TRY(ops_lt_gemm(ctx, what, 1, 0, OC, BT, C, weight, C, inp, C, out, OC, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL,
                  0));
  return ops_add_bias(out, bias, BT, OC, ctx, what);
}

fsdp_status ops_cuda_linear_backward(ops_bf16 *dinp, float *dweight, float *dbias, const ops_bf16 *dout,
                                     const ops_bf16 *inp, const ops_bf16 *weight, int BT, int C, int OC,
                                     const ops_cuda_ctx *ctx) {
  if (BT <= 0 || C <= 0 || OC <= 0) return FSDP_OK;
  if (dbias) TRY(ops_colsum_accumulate(dbias, dout, BT, OC, ctx, "linear_backward (dbias)"));
  if (dinp)
    TRY(ops_lt_gemm(ctx, "linear_backward (dinp)", 0, 0, C, BT, OC, weight, C, dout, OC, dinp, C, 0, 0,
                    CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0));
  if (!dweight) return FSDP_OK;   /* a frozen weight ([lora]): only the input gradient */
  return ops_lt_gemm(ctx, "linear_backward (dweight)", 0, 1, C, OC, BT, inp, C, dout, OC, dweight, C, 1, 1,
                     CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0);
}

/* ---- RMSNorm: one warp per row; VEC: 8 columns per lane per 128-bit load (C a multiple of 8) ---- */

#define RMS_ROWS_PER_BLOCK 8
#define RMS_W(VEC) ((VEC) ? 8 : 1)

template <bool VEC>
__global__ void __launch_bounds__(32 * RMS_ROWS_PER_BLOCK)
    rmsnorm_forward_kernel(ops_bf16 *__restrict__ out, float *__restrict__ rstd, const ops_bf16 *__restrict__ inp,
                           const ops_bf16 *__restrict__ weight, int R, int C, float eps, float woff) {
  constexpr int W = RMS_W(VEC);
  const int lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * RMS_ROWS_PER_BLOCK + threadIdx.x / 32;
  if (r >= R) return;
  const ops_bf16 *x = inp + r * C;
  float ss = 0.0f, xv[W], wv[W];
  for (int c = lane * W; c < C; c += 32 * W) {
    ops_ldv<VEC>(xv, x + c);
#pragma unroll
    for (int k = 0; k < W; k++) ss += xv[k] * xv[k];
  }
  const float rs = rmsnorm_rstd(warp_sum(ss) / (float)C, eps);
  ops_bf16 *o = out + r * C;
  for (int c = lane * W; c < C; c += 32 * W) {
    ops_ldv<VEC>(xv, x + c);
    ops_ldv<VEC>(wv, weight + c);
#pragma unroll
    for (int k = 0; k < W; k++) xv[k] = xv[k] * rs * (woff + wv[k]);
    ops_stv<VEC>(o + c, xv);
  }
  if (lane == 0) rstd[r] = rs;
}

/* dinp = the row's input gradient; ACC: dinp += it (the residual stream's gradient, one rounding). */
template <bool VEC, bool ACC>
__global__ void __launch_bounds__(32 * RMS_ROWS_PER_BLOCK)
    rmsnorm_dinp_kernel(ops_bf16 *__restrict__ dinp, const ops_bf16 *__restrict__ dout,
                        const ops_bf16 *__restrict__ inp, const ops_bf16 *__restrict__ weight,
                        const float *__restrict__ rstd, int R, int C, float woff) {
  constexpr int W = RMS_W(VEC);
  const int lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * RMS_ROWS_PER_BLOCK + threadIdx.x / 32;
  if (r >= R) return;
  const ops_bf16 *x = inp + r * C, *d = dout + r * C;
  const float rs = rstd[r];
  float gn_sum = 0.0f, xv[W], wv[W], dv[W];
  if (OPS_FAULT("norm_offset")) woff = 0.0f;   /* planted: w instead of woff + w */
  for (int c = lane * W; c < C; c += 32 * W) {
    ops_ldv<VEC>(xv, x + c);
    ops_ldv<VEC>(wv, weight + c);
    ops_ldv<VEC>(dv, d + c);
#pragma unroll
    for (int k = 0; k < W; k++) gn_sum += (woff + wv[k]) * dv[k] * (xv[k] * rs);
  }
  const float gn_mean = warp_sum(gn_sum) / (float)C;
  ops_bf16 *dx = dinp + r * C;
  for (int c = lane * W; c < C; c += 32 * W) {
    ops_ldv<VEC>(xv, x + c);
    ops_ldv<VEC>(wv, weight + c);
    ops_ldv<VEC>(dv, d + c);
#pragma unroll
    for (int k = 0; k < W; k++) xv[k] = rmsnorm_dinp((woff + wv[k]) * dv[k], xv[k] * rs, gn_mean, rs);
    if (ACC && !OPS_FAULT("norm_acc")) { /* planted: assigned, not accumulated */
      ops_ldv<VEC>(wv, dx + c);
#pragma unroll
      for (int k = 0; k < W; k++) xv[k] += wv[k];
    }
    ops_stv<VEC>(dx + c, xv);
  }
}

/* dweight += Σ_r dout·norm over the rows: row slices folded by the last block of each column group
 * (ops_colsum_fold, one kernel); VEC: 8 columns per thread, 128-bit loads. */
template <bool VEC>
__global__ void __launch_bounds__(OPS_CS_X *OPS_CS_Y)
    rmsnorm_dweight_kernel(float *dweight, float *__restrict__ partial, int *__restrict__ counters,
                           const ops_bf16 *__restrict__ dout, const ops_bf16 *__restrict__ inp,
                           const float *__restrict__ rstd, int R, int C, int rows_per_split) {
  constexpr int W = VEC ? 8 : 1;
  ops_colsum_fold<1, W>(dweight, nullptr, partial, counters, R, C, rows_per_split, [&](int64_t r, int c, float(*acc)[W]) {
    float d[W], x[W];
    ops_ldv<VEC>(d, dout + r * C + c);
    ops_ldv<VEC>(x, inp + r * C + c);
    const float rs = rstd[r];
#pragma unroll
    for (int k = 0; k < W; k++) acc[0][k] += d[k] * (x[k] * rs);
  });
}

fsdp_status ops_cuda_rmsnorm_forward(ops_bf16 *out, float *rstd, const ops_bf16 *inp, const ops_bf16 *weight, int BT,
                                     int C, float eps, float woff, const ops_cuda_ctx *ctx) {
  if (BT <= 0 || C <= 0) return FSDP_OK;
  const unsigned blocks = (BT + RMS_ROWS_PER_BLOCK - 1) / RMS_ROWS_PER_BLOCK;
  if (C % 8 == 0 && ops_aligned16(out) && ops_aligned16(inp) && ops_aligned16(weight))
    rmsnorm_forward_kernel<true><<<blocks, 32 * RMS_ROWS_PER_BLOCK, 0, ctx->stream>>>(out, rstd, inp, weight, BT, C,
                                                                                      eps, woff);
  else
    rmsnorm_forward_kernel<false><<<blocks, 32 * RMS_ROWS_PER_BLOCK, 0, ctx->stream>>>(out, rstd, inp, weight, BT, C,
                                                                                       eps, woff);
  LAUNCH_CHECK("rmsnorm_forward");
  return FSDP_OK;
}

static fsdp_status rmsnorm_backward(ops_bf16 *dinp, float *dweight, const ops_bf16 *dout, const ops_bf16 *inp,
                                    const ops_bf16 *weight, const float *rstd, int BT, int C, float woff, bool acc,
                                    const ops_cuda_ctx *ctx) {
  const char *what = acc ? "rmsnorm_backward_acc" : "rmsnorm_backward";
  if (BT <= 0 || C <= 0) return FSDP_OK;
  const int nsplit = ops_colsum_splits(BT), per = (BT + nsplit - 1) / nsplit;
  void *ws = NULL;
  TRY(ops_workspace(ctx, ops_colsum_ws_bytes(1, nsplit, C), what, &ws));
  TRY(ops_colsum_zero(ws, 1, nsplit, C, ctx, what));
  const unsigned blocks = (BT + RMS_ROWS_PER_BLOCK - 1) / RMS_ROWS_PER_BLOCK;
  const bool vec8 = C % 8 == 0 && ops_aligned16(dout) && ops_aligned16(inp);
#define RMS_DINP(V, A) \
  rmsnorm_dinp_kernel<V, A><<<blocks, 32 * RMS_ROWS_PER_BLOCK, 0, ctx->stream>>>(dinp, dout, inp, weight, rstd, BT, C, \
                                                                                  woff)
  if (vec8 && ops_aligned16(dinp) && ops_aligned16(weight)) {
    if (acc) RMS_DINP(true, true);
    else RMS_DINP(true, false);
  } else {
    if (acc) RMS_DINP(false, true);
    else RMS_DINP(false, false);
  }
#undef RMS_DINP
  LAUNCH_CHECK(what);
  if (!dweight) return FSDP_OK;   /* a frozen norm ([lora]) */
  float *partial = (float *)ws;
  int *counters = ops_colsum_counters(ws, 1, nsplit, C);
  const dim3 cs_block(OPS_CS_X, OPS_CS_Y);
  if (vec8)
    rmsnorm_dweight_kernel<true><<<ops_colsum_grid(C, BT, 8), cs_block, 0, ctx->stream>>>(dweight, partial, counters,
                                                                                         dout, inp, rstd, BT, C, per);
  else
    rmsnorm_dweight_kernel<false><<<ops_colsum_grid(C, BT, 1), cs_block, 0, ctx->stream>>>(dweight, partial, counters,
                                                                                          dout, inp, rstd, BT, C, per);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

fsdp_status ops_cuda_rmsnorm_backward(ops_bf16 *dinp, float *dweight, const ops_bf16 *dout, const ops_bf16 *inp,
                                      const ops_bf16 *weight, const float *rstd, int BT, int C, float woff,
                                      const ops_cuda_ctx *ctx) {
  return rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, BT, C, woff, false, ctx);
}

fsdp_status ops_cuda_rmsnorm_backward_acc(ops_bf16 *dres, float *dweight, const ops_bf16 *dout, const ops_bf16 *inp,
                                          const ops_bf16 *weight, const float *rstd, int BT, int C, float woff,
                                          const ops_cuda_ctx *ctx) {
  return rmsnorm_backward(dres, dweight, dout, inp, weight, rstd, BT, C, woff, true, ctx);
}

/* ---- rotary embeddings: one thread per pair (i, i + HS/2) of a q or k head ---- */

/* DIR = 1 rotates by the angle (forward), −1 back (backward). n = B·T·(NH + NKV)·HS/2 pairs; the
 * pair index runs fastest over i, then heads, then rows. */
__global__ void rope_kernel(ops_bf16 *__restrict__ qkv, int T, int NH, int NKV, int HS, rope_freqs rope, float dir,
                            const int32_t *__restrict__ seg, int64_t n) {
  const int half = HS / 2, nh = NH + NKV;
  const int64_t C3 = (int64_t)(NH + 2 * NKV) * HS;
  for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += (int64_t)gridDim.x * blockDim.x) {
    const int i = (int)(p % half), h = (int)(p / half % nh);
    const int64_t bt = p / half / nh;
    float s, c;
    sincosf(rope_angle(doc_pos(seg, bt, (int)(bt % T)), i, HS, &rope), &s, &c);
    ops_bf16 *x = qkv + bt * C3 + (int64_t)h * HS + i;
    float a = ldbf(x), b = ldbf(x + half);
    rope_rotate(&a, &b, c * rope.scale, dir * (s * rope.scale));
    x[0] = tobf(a);
    x[half] = tobf(b);
  }
}

static fsdp_status rope_launch(ops_bf16 *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                               const int32_t *seg, float dir, const ops_cuda_ctx *ctx, const char *what) {
  if (HS <= 0 || HS % 2 != 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: head size %d; rotary embeddings need an even head size", what, HS);
  const int64_t n = (int64_t)B * T * (NH + NKV) * (HS / 2);
  if (n <= 0) return FSDP_OK;
  rope_kernel<<<ops_blocks(n, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(qkv, T, NH, NKV, HS, *rope, dir, seg, n);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

fsdp_status ops_cuda_rope_forward(ops_bf16 *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                                  const int32_t *seg, const ops_cuda_ctx *ctx) {
  return rope_launch(qkv, B, T, NH, NKV, HS, rope, seg, 1.0f, ctx, "rope_forward");
}

fsdp_status ops_cuda_rope_backward(ops_bf16 *dqkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                                   const int32_t *seg, const ops_cuda_ctx *ctx) {
  return rope_launch(dqkv, B, T, NH, NKV, HS, rope, seg, -1.0f, ctx, "rope_backward");
}
