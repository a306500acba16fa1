/* ops_cuda_family — the Llama family's operators beyond Llama's own on the GPU (see ops_cuda.h):
 * Qwen3's (and, scaled by 1 + w, Gemma 3's) per-head RMSNorm of q and k. bf16 storage, fp32 math, the formulas of worker/ops/rmsnorm.h
 * as on the CPU (ops_cpu_family.c). The linear biases are ops_cuda_llama.cu's.
 *
 * Layout of the work: one warp per head row (BT·(NH + NKV) rows of HD channels, the q heads of a
 * token then its k heads), scalar loads (HD is a head: 64 or 128 channels, 2–4 per lane); v is
 * copied by a grid-stride loop; the weight gradients are two-pass column sums over fixed slices of
 * the q rows and of the k rows (ops_colsum_splits), so the bits depend only on the shapes.
 */
#include "ops_cuda_common.cuh"

#include "ops/rmsnorm.h"

#define QKN_ROWS_PER_BLOCK 8

/* Head row r (0 .. BT·NQK − 1) of a (BT, Q) buffer: token r / NQK, head r % NQK, at its offset. */
__device__ __forceinline__ int64_t qkn_at(int64_t r, int NQK, int Q, int HD) {
  return (r / NQK) * (int64_t)Q + (r % NQK) * (int64_t)HD;
}

__global__ void __launch_bounds__(32 * QKN_ROWS_PER_BLOCK)
    qk_norm_forward_kernel(ops_bf16 *out, float *__restrict__ rstd, const ops_bf16 *inp, const ops_bf16 *__restrict__ wq,
                           const ops_bf16 *__restrict__ wk, int64_t R, int NH, int NKV, int HD, float eps,
                           float woff) {
  const int lane = threadIdx.x % 32, NQK = NH + NKV, Q = (NH + 2 * NKV) * HD;
  const int64_t r = (int64_t)blockIdx.x * QKN_ROWS_PER_BLOCK + threadIdx.x / 32;
  if (r >= R) return;
  const int64_t at = qkn_at(r, NQK, Q, HD);
  const ops_bf16 *w = (int)(r % NQK) < NH ? wq : wk;
  float ss = 0.0f;
  for (int c = lane; c < HD; c += 32) {
    float x = ldbf(inp + at + c);
    ss += x * x;
  }
  const float rs = rmsnorm_rstd(warp_sum(ss) / (float)HD, eps);
  for (int c = lane; c < HD; c += 32) out[at + c] = tobf(ldbf(inp + at + c) * rs * (woff + ldbf(w + c)));
  if (lane == 0) rstd[r] = rs;
}

/* v of every token: dst = src (n = BT·NKV·HD elements, token-major). */
__global__ void qk_norm_copy_v_kernel(ops_bf16 *__restrict__ dst, const ops_bf16 *__restrict__ src, int64_t n, int NH,
                                      int NKV, int HD) {
  const int VW = NKV * HD, Q = (NH + 2 * NKV) * HD, off = (NH + NKV) * HD;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t at = (i / VW) * Q + off + i % VW;
    dst[at] = src[at];
  }
}

__global__ void __launch_bounds__(32 * QKN_ROWS_PER_BLOCK)
    qk_norm_dinp_kernel(ops_bf16 *dinp, const ops_bf16 *dout, const ops_bf16 *__restrict__ inp,
                        const ops_bf16 *__restrict__ wq, const ops_bf16 *__restrict__ wk, const float *__restrict__ rstd,
                        int64_t R, int NH, int NKV, int HD, float woff) {
  const int lane = threadIdx.x % 32, NQK = NH + NKV, Q = (NH + 2 * NKV) * HD;
  const int64_t r = (int64_t)blockIdx.x * QKN_ROWS_PER_BLOCK + threadIdx.x / 32;
  if (r >= R) return;
  const int64_t at = qkn_at(r, NQK, Q, HD);
  const ops_bf16 *w = (int)(r % NQK) < NH ? wq : wk;
  const float rs = rstd[r];
  float gn_sum = 0.0f;
  if (OPS_FAULT("qk_norm_offset")) woff = 0.0f;   /* planted: w instead of woff + w */
  for (int c = lane; c < HD; c += 32) gn_sum += (woff + ldbf(w + c)) * ldbf(dout + at + c) * (ldbf(inp + at + c) * rs);
  const float gn_mean = warp_sum(gn_sum) / (float)HD;
  /* each lane rewrites only the channels it read: dinp may be dout */
  for (int c = lane; c < HD; c += 32)
    dinp[at + c] =
        tobf(rmsnorm_dinp((woff + ldbf(w + c)) * ldbf(dout + at + c), ldbf(inp + at + c) * rs, gn_mean, rs));
}

/* The q (K = 0) or k (K = 1) norm's dweight += its column sum over the BT·NHEADS head rows: a folded
 * column sum (ops_colsum_fold), one column per thread, fixed order. */
__global__ void qk_norm_dweight_kernel(float *dw, float *__restrict__ partial, int *__restrict__ counters,
                                       const ops_bf16 *__restrict__ dout, const ops_bf16 *__restrict__ inp,
                                       const float *__restrict__ rstd, int64_t R, int NH, int NKV, int HD, int k,
                                       int64_t rows_per_split) {
  const int NQK = NH + NKV, Q = (NH + 2 * NKV) * HD, nheads = k ? NKV : NH, h0 = k ? NH : 0;
  ops_colsum_fold<1, 1>(dw, nullptr, partial, counters, R, HD, rows_per_split, [&](int64_t r, int c, float(*acc)[1]) {
    const int64_t hr = (r / nheads) * NQK + h0 + r % nheads;   /* the head row among all NQK per token */
    const int64_t at = qkn_at(hr, NQK, Q, HD) + c;
    acc[0][0] += ldbf(dout + at) * (ldbf(inp + at) * rstd[hr]);
  });
}

static fsdp_status qk_check(int NH, int NKV, int HD, const char *what) {
  if (NH < 1 || NKV < 1 || HD < 1) return fsdp_set_error(FSDP_ERR_INVALID, "%s: NH %d, NKV %d, HD %d", what, NH, NKV, HD);
  return FSDP_OK;
}

fsdp_status ops_cuda_qk_norm_forward(ops_bf16 *out, float *rstd, const ops_bf16 *inp, const ops_bf16 *wq,
                                     const ops_bf16 *wk, int BT, int NH, int NKV, int HD, float eps, float woff,
                                     const ops_cuda_ctx *ctx) {
  static const char *what = "qk_norm_forward";
  if (BT <= 0) return FSDP_OK;
  TRY(qk_check(NH, NKV, HD, what));
  const int64_t R = (int64_t)BT * (NH + NKV);
  qk_norm_forward_kernel<<<(unsigned)((R + QKN_ROWS_PER_BLOCK - 1) / QKN_ROWS_PER_BLOCK), 32 * QKN_ROWS_PER_BLOCK, 0,
                           ctx->stream>>>(out, rstd, inp, wq, wk, R, NH, NKV, HD, eps, woff);
  LAUNCH_CHECK(what);
  if (out != inp) {
    const int64_t n = (int64_t)BT * NKV * HD;
    qk_norm_copy_v_kernel<<<ops_blocks(n, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(out, inp, n, NH, NKV, HD);
    LAUNCH_CHECK(what);
  }
  return FSDP_OK;
}

fsdp_status ops_cuda_qk_norm_backward(ops_bf16 *dinp, float *dwq, float *dwk, const ops_bf16 *dout, const ops_bf16 *inp,
                                      const ops_bf16 *wq, const ops_bf16 *wk, const float *rstd, int BT, int NH,
                                      int NKV, int HD, float woff, const ops_cuda_ctx *ctx) {
  static const char *what = "qk_norm_backward";
  if (BT <= 0) return FSDP_OK;
  TRY(qk_check(NH, NKV, HD, what));
  /* the weight gradients first: they read dout, which dinp may overwrite; none for frozen norms
   * (dwq = dwk = NULL, [lora]) */
  for (int k = 0; k < (dwq ? 2 : 0); k++) {
    const int64_t R = (int64_t)BT * (k ? NKV : NH);
    const int nsplit = ops_colsum_splits(R);
    const int64_t per = (R + nsplit - 1) / nsplit;
    void *ws = NULL;
    TRY(ops_workspace(ctx, ops_colsum_ws_bytes(1, nsplit, HD), what, &ws));
    TRY(ops_colsum_zero(ws, 1, nsplit, HD, ctx, what));
    qk_norm_dweight_kernel<<<ops_colsum_grid(HD, R, 1), dim3(OPS_CS_X, OPS_CS_Y), 0, ctx->stream>>>(
        k ? dwk : dwq, (float *)ws, ops_colsum_counters(ws, 1, nsplit, HD), dout, inp, rstd, R, NH, NKV, HD, k, per);
    LAUNCH_CHECK(what);
  }
  const int64_t R = (int64_t)BT * (NH + NKV);
  qk_norm_dinp_kernel<<<(unsigned)((R + QKN_ROWS_PER_BLOCK - 1) / QKN_ROWS_PER_BLOCK), 32 * QKN_ROWS_PER_BLOCK, 0,
                        ctx->stream>>>(dinp, dout, inp, wq, wk, rstd, R, NH, NKV, HD, woff);
  LAUNCH_CHECK(what);
  if (dinp != dout) {
    const int64_t n = (int64_t)BT * NKV * HD;
    qk_norm_copy_v_kernel<<<ops_blocks(n, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(dinp, dout, n, NH, NKV, HD);
    LAUNCH_CHECK(what);
  }
  return FSDP_OK;
}
