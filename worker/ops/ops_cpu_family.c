/* ops_cpu_family — the Llama family's operators beyond Llama's own (ops_cpu.h's "Llama family"
 * block): nn.Linear biases (Llama's attention_bias and mlp_bias, Qwen2's q/k/v biases) and the
 * per-head RMSNorm of q and k (Qwen3's q_norm, k_norm). fp32, the readable reference of the CUDA
 * kernels (ops_cuda_family.cu). Sums run in a fixed order: the same bits for any thread count. */
#include <stddef.h>

#include "ops/rmsnorm.h"
#include "ops_cpu.h"

void bias_forward(float *out, const float *bias, int BT, int OC) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) {
    float *o = out + (size_t)r * OC;
#pragma omp simd
    for (int c = 0; c < OC; c++) o[c] += bias[c];
  }
}

void bias_backward(float *dbias, const float *dout, int BT, int OC) {
#pragma omp parallel for schedule(static)
  for (int c = 0; c < OC; c++) {   /* one column per iteration, its rows in order */
    float s = 0.0f;
    for (int r = 0; r < BT; r++) s += dout[(size_t)r * OC + c];
    dbias[c] += s;
  }
}

/* Head h (0 .. NH + NKV − 1: the q heads, then the k heads) of row r: at r·Q + h·HD. */
static size_t head_at(int r, int h, int NH, int NKV, int HD) { return (size_t)r * (size_t)(NH + 2 * NKV) * HD + (size_t)h * HD; }

void qk_norm_forward(float *out, float *rstd, const float *inp, const float *wq, const float *wk, int BT, int NH,
                     int NKV, int HD, float eps, float woff) {
  const int NQK = NH + NKV, Q = (NH + 2 * NKV) * HD;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) {
    for (int h = 0; h < NQK; h++) {
      const float *x = inp + head_at(r, h, NH, NKV, HD), *w = h < NH ? wq : wk;
      float *o = out + head_at(r, h, NH, NKV, HD);
      float ss = 0.0f;
      for (int c = 0; c < HD; c++) ss += x[c] * x[c];
      float rs = rmsnorm_rstd(ss / (float)HD, eps);
      for (int c = 0; c < HD; c++) o[c] = x[c] * rs * (woff + w[c]);
      rstd[(size_t)r * NQK + h] = rs;
    }
    const float *v = inp + (size_t)r * Q + (size_t)NQK * HD;   /* v passes through */
    float *ov = out + (size_t)r * Q + (size_t)NQK * HD;
    if (ov != v)
      for (int c = 0; c < NKV * HD; c++) ov[c] = v[c];
  }
}

void qk_norm_backward(float *dinp, float *dwq, float *dwk, const float *dout, const float *inp, const float *wq,
                      const float *wk, const float *rstd, int BT, int NH, int NKV, int HD, float woff) {
  const int NQK = NH + NKV, Q = (NH + 2 * NKV) * HD;
  /* dweight first (dinp may be dout): column c of q_norm sums over rows, then q heads, in order;
   * none for frozen norms (dwq = dwk = NULL, [lora]) */
  for (int g = 0; g < (dwq ? 2 : 0); g++) {
    float *dw = g ? dwk : dwq;
    int h0 = g ? NH : 0, h1 = g ? NQK : NH;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < HD; c++) {
      float s = 0.0f;
      for (int r = 0; r < BT; r++)
        for (int h = h0; h < h1; h++) {
          size_t at = head_at(r, h, NH, NKV, HD) + (size_t)c;
          s += dout[at] * (inp[at] * rstd[(size_t)r * NQK + h]);
        }
      dw[c] += s;
    }
  }
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) {
    for (int h = 0; h < NQK; h++) {
      const float *x = inp + head_at(r, h, NH, NKV, HD), *d = dout + head_at(r, h, NH, NKV, HD), *w = h < NH ? wq : wk;
      float *dx = dinp + head_at(r, h, NH, NKV, HD);
      float rs = rstd[(size_t)r * NQK + h], gn_sum = 0.0f;
      for (int c = 0; c < HD; c++) gn_sum += (woff + w[c]) * d[c] * (x[c] * rs);
      float gn_mean = gn_sum / (float)HD;
      for (int c = 0; c < HD; c++) dx[c] = rmsnorm_dinp((woff + w[c]) * d[c], x[c] * rs, gn_mean, rs);
    }
    const float *dv = dout + (size_t)r * Q + (size_t)NQK * HD;
    float *dxv = dinp + (size_t)r * Q + (size_t)NQK * HD;
    if (dxv != dv)
      for (int c = 0; c < NKV * HD; c++) dxv[c] = dv[c];
  }
}
