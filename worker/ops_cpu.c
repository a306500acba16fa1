/* ops_cpu — the GPT-2 operators on the CPU (see ops_cpu.h for shapes and conventions).
 *
 * Matmuls go through OpenBLAS' cblas_sgemm, which threads itself; every other loop is an OpenMP
 * parallel loop. Reductions that produce a parameter gradient are split by OUTPUT column (each
 * thread owns a block of channels and walks the rows in order), so every result is deterministic
 * and independent of the thread count, and no two threads ever write the same float.
 * The scalar formulas come from ops/*.h, shared with ops_cuda.cu.
 */
#include "ops_cpu.h"

#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "ops/gelu.h"
#include "ops/layernorm.h"
#include "ops/softmax.h"

/* Channels per block in column-split reductions: 32 floats = two cache lines, so blocks never
 * share a line and C = 768 still gives 24 blocks to spread over the threads. */
#define COL_BLOCK 32

static inline float dot(const float *a, const float *b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* y += a·x */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* ---- encoder ---- */

void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    const float *we = wte + (size_t)inp[bt] * C;
    const float *pe = wpe + (size_t)(bt % T) * C;
    float *o = out + (size_t)bt * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
  }
}

/* Split by channel block: a token that occurs twice adds into the same dwte row, so splitting by
 * token would race; splitting by channel keeps each float with one thread, summed in token order. */
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C) {
  int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblk; blk++) {
    int c0 = blk * COL_BLOCK, n = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
    for (int bt = 0; bt < B * T; bt++) {
      const float *d = dout + (size_t)bt * C + c0;
      axpy(dwte + (size_t)inp[bt] * C + c0, 1.0f, d, n);
      axpy(dwpe + (size_t)(bt % T) * C + c0, 1.0f, d, n);
    }
  }
}

/* ---- layernorm ---- */

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int B, int T, int C) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < B * T; r++) {
    const float *x = inp + (size_t)r * C;
    float *o = out + (size_t)r * C;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    float m = s / (float)C;
    /* Two passes (variance of the centred row) instead of E[x²]−m², which cancels badly when the
     * mean is large against the spread. */
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    float rs = layernorm_rstd(v / (float)C);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = layernorm_norm(x[c], m, rs) * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int B, int T, int C) {
  int BT = B * T;
  /* dinp: rows are independent. */
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) {
    const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
    float *dx = dinp + (size_t)r * C;
    float m = mean[r], rs = rstd[r];
    float g_sum = 0.0f, gn_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, gn_sum)
    for (int c = 0; c < C; c++) {
      float g = weight[c] * d[c];
      g_sum += g;
      gn_sum += g * layernorm_norm(x[c], m, rs);
    }
    float g_mean = g_sum / (float)C, gn_mean = gn_sum / (float)C;
#pragma omp simd
    for (int c = 0; c < C; c++)
      dx[c] = layernorm_dinp(weight[c] * d[c], layernorm_norm(x[c], m, rs), g_mean, gn_mean, rs);
  }
  /* dweight, dbias: column sums, split by channel block. */
  int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblk; blk++) {
    int c0 = blk * COL_BLOCK, n = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
    float dw[COL_BLOCK] = {0}, db[COL_BLOCK] = {0};
    for (int r = 0; r < BT; r++) {
      const float *x = inp + (size_t)r * C + c0, *d = dout + (size_t)r * C + c0;
      float m = mean[r], rs = rstd[r];
#pragma omp simd
      for (int i = 0; i < n; i++) {
        dw[i] += d[i] * layernorm_norm(x[i], m, rs);
        db[i] += d[i];
      }
    }
    for (int i = 0; i < n; i++) {
      dweight[c0 + i] += dw[i];
      dbias[c0 + i] += db[i];
    }
  }
}

/* ---- matmul (Hugging Face Conv1D: weight [C, OC]) ---- */

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int BT, int C, int OC) {
  if (BT <= 0 || OC <= 0) return;
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) memcpy(out + (size_t)r * OC, bias, (size_t)OC * sizeof(float));
  }
  /* out[BT,OC] (+)= inp[BT,C] · weight[C,OC] */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, OC, C, 1.0f, inp, C, weight, OC,
              bias ? 1.0f : 0.0f, out, OC);
}

/* Column sums of a (rows, cols) matrix added into acc[cols], split by column block. */
static void colsum_accumulate(float *acc, const float *m, int rows, int cols) {
  int nblk = (cols + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblk; blk++) {
    int c0 = blk * COL_BLOCK, n = cols - c0 < COL_BLOCK ? cols - c0 : COL_BLOCK;
    float s[COL_BLOCK] = {0};
    for (int r = 0; r < rows; r++) axpy(s, 1.0f, m + (size_t)r * cols + c0, n);
    for (int i = 0; i < n; i++) acc[c0 + i] += s[i];
  }
}

/* dinp and dbias may be NULL (no input gradient wanted; a layer without bias). */
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int BT, int C, int OC) {
  if (BT <= 0 || C <= 0 || OC <= 0) return;
  /* dinp[BT,C] = dout[BT,OC] · weight[C,OC]ᵀ */
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, C);
  /* dweight[C,OC] += inp[BT,C]ᵀ · dout[BT,OC] */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, BT, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
  if (dbias) colsum_accumulate(dbias, dout, BT, OC);
}

/* ---- attention ---- */

/* Forward: every (b, h, t) query row is independent. schedule(static, 1) interleaves the rows of
 * the causal triangle (row t costs ~t) so threads get even work. */
void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
  int hs = C / NH;
  size_t C3 = (size_t)3 * C;
  float scale = attn_scale(hs);
#pragma omp parallel for collapse(3) schedule(static, 1)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
        const float *q = base + t * C3;
        float *a = att + (((size_t)b * NH + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          float s = dot(q, base + t2 * C3 + C, hs) * scale;
          a[t2] = s;
          if (s > maxv) maxv = s;
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          a[t2] = expf(a[t2] - maxv);
          sum += a[t2];
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
        for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
        float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
        memset(o, 0, (size_t)hs * sizeof(float));
        for (int t2 = 0; t2 <= t; t2++) axpy(o, a[t2], base + t2 * C3 + 2 * (size_t)C, hs);
      }
}

/* Backward in two parallel phases, as the CUDA kernels do, so that every output float has one
 * writer and no thread needs to zero a slice that another phase adds to:
 *   rows    (b,h,t):  datt[t,t2] = dout_t·v_t2; dpre = softmax_dinp(...) kept in datt;
 *                     dq_t = scale·Σ_t2 dpre[t,t2]·k_t2
 *   columns (b,h,t2): dk_t2 = scale·Σ_{t≥t2} dpre[t,t2]·q_t;  dv_t2 = Σ_{t≥t2} att[t,t2]·dout_t */
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                        int B, int T, int C, int NH) {
  int hs = C / NH;
  size_t C3 = (size_t)3 * C;
  float scale = attn_scale(hs);
#pragma omp parallel for collapse(3) schedule(static, 1)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
        const float *a = att + (((size_t)b * NH + h) * T + t) * T;
        float *da = datt + (((size_t)b * NH + h) * T + t) * T;
        const float *d = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
        float pdp = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          da[t2] = dot(d, base + t2 * C3 + 2 * (size_t)C, hs);
          pdp += a[t2] * da[t2];
        }
        float *dq = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
        memset(dq, 0, (size_t)hs * sizeof(float));
        for (int t2 = 0; t2 <= t; t2++) {
          da[t2] = softmax_dinp(a[t2], da[t2], pdp);
          axpy(dq, da[t2] * scale, base + t2 * C3 + C, hs);
        }
        for (int t2 = t + 1; t2 < T; t2++) da[t2] = 0.0f;
      }
#pragma omp parallel for collapse(3) schedule(static, 1)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t2 = 0; t2 < T; t2++) {
        const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
        const float *a = att + ((size_t)b * NH + h) * T * T;
        const float *da = datt + ((size_t)b * NH + h) * T * T;
        float *dk = dqkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
        float *dv = dk + C;
        memset(dk, 0, (size_t)hs * sizeof(float));
        memset(dv, 0, (size_t)hs * sizeof(float));
        for (int t = t2; t < T; t++) {
          axpy(dk, da[(size_t)t * T + t2] * scale, base + t * C3, hs);
          axpy(dv, a[(size_t)t * T + t2], dout + ((size_t)b * T + t) * C + (size_t)h * hs, hs);
        }
      }
}

/* ---- GELU, residual ---- */

void gelu_forward(float *out, const float *inp, int N) {
#pragma omp parallel for simd schedule(static)
  for (int i = 0; i < N; i++) out[i] = gelu_tanh(inp[i]);
}

void gelu_backward(float *dinp, const float *inp, const float *dout, int N) {
#pragma omp parallel for simd schedule(static)
  for (int i = 0; i < N; i++) dinp[i] = gelu_tanh_grad(inp[i]) * dout[i];
}

void residual_forward(float *out, const float *a, const float *b, int N) {
#pragma omp parallel for simd schedule(static)
  for (int i = 0; i < N; i++) out[i] = a[i] + b[i];
}

/* ---- tied output head (wte [V, C]) ---- */

void classifier_forward(float *logits, const float *inp, const float *wte, int BT, int C, int V) {
  if (BT <= 0 || V <= 0) return;
  /* logits[BT,V] = inp[BT,C] · wte[V,C]ᵀ */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
}

void classifier_backward(float *dinp, float *dwte, const float *dlogits, const float *inp, const float *wte,
                         int BT, int C, int V) {
  if (BT <= 0 || C <= 0 || V <= 0) return;
  /* dinp[BT,C] = dlogits[BT,V] · wte[V,C] */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dinp, C);
  /* dwte[V,C] += dlogits[BT,V]ᵀ · inp[BT,C] */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, BT, 1.0f, dlogits, V, inp, C, 1.0f, dwte, C);
}

/* ---- fused softmax + cross-entropy ---- */

/* A target outside [0, V) is a caller bug: its loss is NaN (so the step's loss shows it) and its
 * row's gradient is dscale·softmax, with no out-of-bounds access. */
double softmax_xent_forward_backward(float *logits, float *losses, const int *targets, int BT, int V, float dscale) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) {
    float *z = logits + (size_t)r * V;
    int tgt = targets[r];
    int valid = tgt >= 0 && tgt < V;
    float zmax = -INFINITY;
    for (int j = 0; j < V; j++) zmax = z[j] > zmax ? z[j] : zmax;
    float zt = valid ? z[tgt] : 0.0f;
    /* Σ exp in double: V = 50257 terms of up to 1 each, where a float sum would lose ~1e-4. */
    double sum = 0.0;
    for (int j = 0; j < V; j++) {
      z[j] = expf(z[j] - zmax);
      sum += z[j];
    }
    losses[r] = valid ? (float)xent_loss(zt, zmax, sum) : NAN;
    float inv = (float)(1.0 / sum);
#pragma omp simd
    for (int j = 0; j < V; j++) z[j] = xent_dlogit(z[j] * inv, j == tgt, dscale);
  }
  /* Summed in row order, outside the parallel loop, so the total does not depend on threads. */
  double total = 0.0;
  for (int r = 0; r < BT; r++) total += losses[r];
  return total;
}
