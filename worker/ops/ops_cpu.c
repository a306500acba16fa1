/* ops_cpu — the GPT-2 and Llama operators on the CPU (see ops_cpu.h for shapes and conventions).
 *
 * Matmuls (and attention's products) go through OpenBLAS' cblas_sgemm, which threads itself, or,
 * on a thread that computes in bf16, through gemm_bf16.c (gemm_bf16.h); every other loop is an OpenMP parallel loop. Reductions that produce a parameter gradient are
 * split by OUTPUT column (each thread owns a block of channels and walks the rows in order), so no
 * two threads ever write the same float and the OpenMP loops give the same bits for any thread
 * count (the test checks it); only the CPU's vector width (AVX-512 or AVX2 build of a loop, below)
 * changes the rounding. The scalar formulas come from the headers in worker/ops/, shared with
 * ops_cuda.cu.
 *
 * Speed (bench/bench_ops.c): GEMMs dominate as long as OpenBLAS uses its AVX2/AVX-512 kernels;
 * see blas_check() below for the case where it silently does not.
 */
#include "ops_cpu.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "blasinfo.h"
#include "gemm_bf16.h"
#include "log.h"

#include "ops/exp.h"
#include "ops/gated.h"
#include "ops/gelu.h"
#include "ops/layernorm.h"
#include "ops/rmsnorm.h"
#include "ops/docmask.h"
#include "ops/rope.h"
#include "ops/softmax.h"

/* The build targets baseline x86-64 (SSE2) so that one binary runs anywhere; the loops that are
 * compute-bound rather than memory-bound (exponentials: softmax, cross-entropy, GELU) are compiled
 * also for x86-64-v3 (AVX2, FMA) and v4 (AVX-512), and the loader picks the best (GCC ifunc). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define OPS_VEC __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OPS_VEC
#endif

/* Elements per OpenMP work item in elementwise loops. */
#define SPAN 8192

/* Channels per block in column-split reductions: 32 floats = two cache lines, so blocks never
 * share a line and C = 768 still gives 24 blocks to spread over the threads. */
#define COL_BLOCK 32

/* y += a·x */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* ---- GEMM ----
 * Every product goes through gemm(), row-major cblas_sgemm's arguments. When ops_test_split_k() says
 * so (test binaries only: docs/testing.md) each product is two GEMMs over the halves of k, the
 * second accumulating into the first: the same mathematics summed in another order, as another
 * CPU's BLAS kernel (AVX2 rather than AVX-512) sums it. The equivalence tests run with it to stand
 * in for the machines they do not run on. */

/* A no-op in fsdp-worker: the test binaries link tests/hooks/sum_order.c, whose definition reads
 * FSDP_SUM_ORDER. */
__attribute__((weak)) int ops_test_split_k(void) { return 0; }

/* cblas_sgemm, or the bf16 GEMM where this thread computes in bf16 (gemm_bf16.h) */
static void gemm1(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (gemm_bf16_active() != GEMM_FP32)
    gemm_bf16(ta != CblasNoTrans, tb != CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void gemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (K < 2 || !ops_test_split_k()) {
    gemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  int k1 = K / 2;
  /* op(A) is M×K: its k-th column is A + k (not transposed) or A + k·lda (transposed); op(B) is
   * K×N: its k-th row is B + k·ldb (not transposed) or B + k (transposed). */
  const float *A2 = ta == CblasNoTrans ? A + k1 : A + (size_t)k1 * lda;
  const float *B2 = tb == CblasNoTrans ? B + (size_t)k1 * ldb : B + k1;
  gemm1(ta, tb, M, N, k1, alpha, A, lda, B, ldb, beta, C, ldc);
  gemm1(ta, tb, M, N, K - k1, alpha, A2, lda, B2, ldb, 1.0f, C, ldc);
}

void gemm_strided(int ta, int tb, int M, int N, int K, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  gemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, (int)lda, B, (int)ldb, beta,
       C, (int)ldc);
}

/* ---- encoder ---- */

void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C,
                     const int32_t *seg) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    const float *we = wte + (size_t)inp[bt] * C;
    float *o = out + (size_t)bt * C;
    if (!wpe) {
      memcpy(o, we, (size_t)C * sizeof(float));
      continue;
    }
    const float *pe = wpe + (size_t)doc_pos(seg, bt, bt % T) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
  }
}

/* Split by channel block: a token that occurs twice adds into the same dwte row, so splitting by
 * token would race; splitting by channel keeps each float with one thread, summed in token order. */
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C, int pad,
                      const int32_t *seg) {
  int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblk; blk++) {
    int c0 = blk * COL_BLOCK, n = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
    for (int bt = 0; bt < B * T; bt++) {
      const float *d = dout + (size_t)bt * C + c0;
      if (inp[bt] != pad) axpy(dwte + (size_t)inp[bt] * C + c0, 1.0f, d, n);
      if (dwpe) axpy(dwpe + (size_t)doc_pos(seg, bt, bt % T) * C + c0, 1.0f, d, n);
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
  /* dweight, dbias: column sums, split by channel block (none for a frozen norm). */
  if (!dweight) return;
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

/* ---- OpenBLAS kernel check ----
 * OpenBLAS picks its kernels from the CPU model when it loads. 0.3.21 (Debian 12) does not know
 * recent CPUs (Sapphire Rapids here) and falls back to "Prescott", SSE3 kernels that run sgemm
 * ~5× slower than its AVX-512 ones; only the OPENBLAS_CORETYPE environment variable, read at load,
 * fixes that. fsdp-worker re-executes itself with it (worker/main.c); anything else logs its kernels
 * once, at the first GEMM, with blasinfo's warning when they are older than the CPU's. */
const char *ops_cpu_blas_better_core(void) {
#if defined(__GNUC__) && defined(__x86_64__)
  /* OpenBLAS cores without AVX2 kernels */
  static const char *const blas_slow_cores[] = {"Prescott", "Core2",    "Penryn",    "Dunnington",
                                                "Nehalem",  "Atom",     "Sandybridge", "Opteron",
                                                "Barcelona", "Bobcat",  "Bulldozer"};
  __builtin_cpu_init();
  const char *want = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : NULL;
  const char *core = openblas_get_corename();
  if (!want || !core) return NULL;
  for (size_t i = 0; i < sizeof blas_slow_cores / sizeof blas_slow_cores[0]; i++)
    if (strcmp(core, blas_slow_cores[i]) == 0) return want;
#endif
  return NULL;
}

static void blas_check(void) { blasinfo_log(openblas_get_config(), openblas_get_corename()); }

static pthread_once_t blas_check_once = PTHREAD_ONCE_INIT;

/* ---- matmul (Hugging Face Conv1D: weight [C, OC]) ---- */

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int BT, int C, int OC) {
  pthread_once(&blas_check_once, blas_check);
  if (BT <= 0 || OC <= 0) return;
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) memcpy(out + (size_t)r * OC, bias, (size_t)OC * sizeof(float));
  }
  /* out[BT,OC] (+)= inp[BT,C] · weight[C,OC] */
  gemm(CblasNoTrans, CblasNoTrans, BT, OC, C, 1.0f, inp, C, weight, OC,
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
    gemm(CblasNoTrans, CblasTrans, BT, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, C);
  /* dweight[C,OC] += inp[BT,C]ᵀ · dout[BT,OC] (none for a frozen weight) */
  if (dweight) gemm(CblasTrans, CblasNoTrans, C, OC, BT, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
  if (dbias) colsum_accumulate(dbias, dout, BT, OC);
}

/* ---- attention ----
 * The products go through cblas_sgemm head by head, reading q, k, v in place inside qkv (leading
 * dimension C + 2·NKV·hs, 3C for GPT-2): with OpenBLAS' AVX-512 kernels that was 2.3× faster
 * than plain per-row loops (one core, T = 256). Causality is used by rows of ATT_BLOCK: query
 * rows [r0, r1) only meet keys [0, r1), so the products skip the blocks above the diagonal (T = 1024: 4 blocks, 62% of the
 * square's flops; measured 1.7-1.9× faster than full squares). Only the row-wise softmax and
 * its backward are OpenMP loops, one parallel region each, so the OpenMP and BLAS thread pools
 * alternate only twice per call. Bigger blocks mean fewer, larger sgemm calls, which matters when
 * OpenBLAS splits each call over many threads. */
#define ATT_BLOCK 256

/* Row t of a causal softmax restricted to keys [lo, n) (n = t + 1; ops/docmask.h): those become
 * probabilities, a[0..lo) and a[n..T) zeros. */
static OPS_VEC void softmax_causal_row(float *a, int lo, int n, int T) {
  float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
  for (int j = lo; j < n; j++) maxv = a[j] > maxv ? a[j] : maxv;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = lo; j < n; j++) {
    a[j] = ops_expf(a[j] - maxv);
    sum += a[j];
  }
  float inv = 1.0f / sum;
#pragma omp simd
  for (int j = lo; j < n; j++) a[j] *= inv;
  for (int j = 0; j < lo; j++) a[j] = 0.0f;
  for (int j = n; j < T; j++) a[j] = 0.0f;
}

/* In place: da[lo..n) = softmax_dinp(a, da, Σ a·da), da[0..lo) = da[n..T) = 0. */
static OPS_VEC void softmax_causal_row_backward(float *restrict da, const float *restrict a, int lo, int n, int T) {
  float pdp = 0.0f;
#pragma omp simd reduction(+ : pdp)
  for (int j = lo; j < n; j++) pdp += a[j] * da[j];
#pragma omp simd
  for (int j = lo; j < n; j++) da[j] = softmax_dinp(a[j], da[j], pdp);
  for (int j = 0; j < lo; j++) da[j] = 0.0f;
  for (int j = n; j < T; j++) da[j] = 0.0f;
}

/* Per-(b,h) views: q of query head h, k and v of kv head g are (T, hs) with leading dimension C3
 * (the qkv row); att rows are T long. */
#define ATT_Q(qkv, b, h) ((qkv) + (size_t)(b) * T * C3 + (size_t)(h) * hs)
#define ATT_K(qkv, b, g) (ATT_Q(qkv, b, g) + C)
#define ATT_V(qkv, b, g) (ATT_Q(qkv, b, g) + C + (size_t)NKV * hs)
#define ATT_BH(att, b, h) ((att) + ((size_t)(b) * NH + (h)) * T * T)

/* One past the last query of row b that sees a key below R1: queries from R0 on see keys [lo, t],
 * lo non-decreasing, so the run ends at the first query whose lo is R1 or more. */
static int att_query_end(const int32_t *seg, int window, int b, int T, int r0, int r1) {
  if (!seg && window <= 0) return T;
  int t = r1;
  while (t < T && attn_key_lo(seg, window, b, T, t) < r1) t++;
  return t > r0 ? t : r0 + 1;
}

void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH, int NKV,
                       const int32_t *seg, int window) {
  if (B <= 0 || T <= 0) return;
  int hs = C / NH, C3 = C + 2 * NKV * hs, rep = NH / NKV;
  float scale = attn_scale(hs);
  /* att[t,t2] = scale·q_t·k_t2 for t in [r0, r1), t2 in [k0, r1) (k0: the first key row r0 sees;
   * every row of the block sees from k0 on at most); the rest of each row is left for the softmax,
   * which zeroes it. */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, k0 = attn_key_lo(seg, window, b, T, r0);
        gemm(CblasNoTrans, CblasTrans, r1 - r0, r1 - k0, hs, scale, ATT_Q(qkv, b, h) + (size_t)r0 * C3, C3,
             ATT_K(qkv, b, h / rep) + (size_t)k0 * C3, C3, 0.0f, ATT_BH(att, b, h) + (size_t)r0 * T + k0, T);
      }
  /* Causal softmax per row: row t keeps keys lo..t and costs ~t − lo, so rows are dealt out in
   * chunks of 32 round-robin rather than in one contiguous run per thread. */
#pragma omp parallel for schedule(static, 32)
  for (long long row = 0; row < (long long)B * NH * T; row++) {
    int t = (int)(row % T), b = (int)(row / ((long long)NH * T));
    softmax_causal_row(att + (size_t)row * T, attn_key_lo(seg, window, b, T, t), t + 1, T);
  }
  /* out_h[r0:r1, :] = att[r0:r1, k0:r1] · v[k0:r1, :], into columns h·hs.. of out (leading dim C). */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, k0 = attn_key_lo(seg, window, b, T, r0);
        gemm(CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1 - k0, 1.0f, ATT_BH(att, b, h) + (size_t)r0 * T + k0, T,
             ATT_V(qkv, b, h / rep) + (size_t)k0 * C3, C3, 0.0f, out + ((size_t)b * T + r0) * C + (size_t)h * hs, C);
      }
}

/* With dpre = softmax_dinp(att, datt) (the gradient before the softmax; 0 outside each row's keys):
 *   datt = dout·vᵀ;  dq = scale·dpre·k;  dk = scale·dpreᵀ·q;  dv = attᵀ·dout,
 * blocked like the forward: query rows [r0, r1) meet keys [k0, r1) (datt, dq), and key rows
 * [r0, r1) meet queries [r0, q1) (dk, dv; q1 = att_query_end, T without documents or a window).
 * datt is overwritten with dpre. Every dq element is written once with beta = 0 (assignment); dk
 * and dv of kv head g are assigned by its first query head (beta = 0) and accumulated by the
 * others (beta = 1), in head order. */
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                        int B, int T, int C, int NH, int NKV, const int32_t *seg, int window) {
  if (B <= 0 || T <= 0) return;
  int hs = C / NH, C3 = C + 2 * NKV * hs, rep = NH / NKV;
  float scale = attn_scale(hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, k0 = attn_key_lo(seg, window, b, T, r0);
        gemm(CblasNoTrans, CblasTrans, r1 - r0, r1 - k0, hs, 1.0f, dout + ((size_t)b * T + r0) * C + (size_t)h * hs,
             C, ATT_V(qkv, b, h / rep) + (size_t)k0 * C3, C3, 0.0f, ATT_BH(datt, b, h) + (size_t)r0 * T + k0, T);
      }
#pragma omp parallel for schedule(static, 32)
  for (long long row = 0; row < (long long)B * NH * T; row++) {
    int t = (int)(row % T), b = (int)(row / ((long long)NH * T));
    softmax_causal_row_backward(datt + (size_t)row * T, att + (size_t)row * T, attn_key_lo(seg, window, b, T, t),
                                t + 1, T);
  }
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *dpre = ATT_BH(datt, b, h), *a = ATT_BH(att, b, h);
      const float *d = dout + (size_t)b * T * C + (size_t)h * hs;
      int g = h / rep;
      float beta = h % rep == 0 ? 0.0f : 1.0f;   /* the group's first query head assigns dk, dv */
      for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, n = r1 - r0;
        int k0 = attn_key_lo(seg, window, b, T, r0), q1 = att_query_end(seg, window, b, T, r0, r1);
        /* dq[r0:r1] = scale·dpre[r0:r1, k0:r1]·k[k0:r1] */
        gemm(CblasNoTrans, CblasNoTrans, n, hs, r1 - k0, scale, dpre + (size_t)r0 * T + k0, T,
             ATT_K(qkv, b, g) + (size_t)k0 * C3, C3, 0.0f, ATT_Q(dqkv, b, h) + (size_t)r0 * C3, C3);
        /* dk[r0:r1] = scale·dpre[r0:q1, r0:r1]ᵀ·q[r0:q1] */
        gemm(CblasTrans, CblasNoTrans, n, hs, q1 - r0, scale, dpre + (size_t)r0 * T + r0, T,
             ATT_Q(qkv, b, h) + (size_t)r0 * C3, C3, beta, ATT_K(dqkv, b, g) + (size_t)r0 * C3, C3);
        /* dv[r0:r1] = att[r0:q1, r0:r1]ᵀ·dout[r0:q1] */
        gemm(CblasTrans, CblasNoTrans, n, hs, q1 - r0, 1.0f, a + (size_t)r0 * T + r0, T,
             d + (size_t)r0 * C, C, beta, ATT_V(dqkv, b, g) + (size_t)r0 * C3, C3);
      }
    }
}

#undef ATT_Q
#undef ATT_K
#undef ATT_V
#undef ATT_BH

/* ---- GELU, residual ---- */

static OPS_VEC void gelu_span(float *restrict out, const float *restrict inp, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) out[i] = gelu_tanh(inp[i]);
}

static OPS_VEC void gelu_backward_span(float *restrict dinp, const float *restrict inp,
                                       const float *restrict dout, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) dinp[i] = gelu_tanh_grad(inp[i]) * dout[i];
}

void gelu_forward(float *out, const float *inp, int N) {
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < N; i += SPAN) gelu_span(out + i, inp + i, N - i < SPAN ? (int)(N - i) : SPAN);
}

void gelu_backward(float *dinp, const float *inp, const float *dout, int N) {
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < N; i += SPAN)
    gelu_backward_span(dinp + i, inp + i, dout + i, N - i < SPAN ? (int)(N - i) : SPAN);
}

void residual_forward(float *out, const float *a, const float *b, int N) {
#pragma omp parallel for simd schedule(static)
  for (int i = 0; i < N; i++) out[i] = a[i] + b[i];
}

/* ---- Llama: linear, RMSNorm, rotary ---- */

void linear_forward(float *out, const float *inp, const float *weight, int BT, int C, int OC) {
  pthread_once(&blas_check_once, blas_check);
  if (BT <= 0 || OC <= 0) return;
  /* out[BT,OC] = inp[BT,C] · weight[OC,C]ᵀ */
  gemm(CblasNoTrans, CblasTrans, BT, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
}

void linear_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                     int BT, int C, int OC) {
  if (BT <= 0 || C <= 0 || OC <= 0) return;
  /* dinp[BT,C] = dout[BT,OC] · weight[OC,C] */
  if (dinp)
    gemm(CblasNoTrans, CblasNoTrans, BT, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  /* dweight[OC,C] += dout[BT,OC]ᵀ · inp[BT,C] (none for a frozen weight) */
  if (dweight) gemm(CblasTrans, CblasNoTrans, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
}

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int BT, int C, float eps,
                     float woff) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) {
    const float *x = inp + (size_t)r * C;
    float *o = out + (size_t)r * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    float rs = rmsnorm_rstd(ss / (float)C, eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c] * rs * (woff + weight[c]);
    rstd[r] = rs;
  }
}

void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                      const float *rstd, int BT, int C, float woff) {
  /* dinp: rows are independent. */
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) {
    const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
    float *dx = dinp + (size_t)r * C;
    float rs = rstd[r], gn_sum = 0.0f;
#pragma omp simd reduction(+ : gn_sum)
    for (int c = 0; c < C; c++) gn_sum += (woff + weight[c]) * d[c] * (x[c] * rs);
    float gn_mean = gn_sum / (float)C;
#pragma omp simd
    for (int c = 0; c < C; c++) dx[c] = rmsnorm_dinp((woff + weight[c]) * d[c], x[c] * rs, gn_mean, rs);
  }
  /* dweight: column sums, split by channel block (as layernorm's; none for a frozen norm). */
  if (!dweight) return;
  int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblk; blk++) {
    int c0 = blk * COL_BLOCK, n = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
    float dw[COL_BLOCK] = {0};
    for (int r = 0; r < BT; r++) {
      const float *x = inp + (size_t)r * C + c0, *d = dout + (size_t)r * C + c0;
      float rs = rstd[r];
#pragma omp simd
      for (int i = 0; i < n; i++) dw[i] += d[i] * (x[i] * rs);
    }
    for (int i = 0; i < n; i++) dweight[c0 + i] += dw[i];
  }
}

/* Without documents: one position t of every row at that position: the angle of pair i depends on
 * t and i only, so its cosine and sine are computed once per (t, i) and applied to all B rows and
 * NH + NKV heads. With documents (SEG) each row's token has its own position in its document
 * (ops/docmask.h), so the angles are taken per (b, t, i). DIR = 1 rotates forward, −1 back. */
static void rope_apply(float *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                       const int32_t *seg, float dir) {
  int half = HS / 2, C3 = (NH + 2 * NKV) * HS;
  if (seg) {
#pragma omp parallel for schedule(static)
    for (long long bt = 0; bt < (long long)B * T; bt++) {
      float *row = qkv + (size_t)bt * C3;
      int pos = doc_pos(seg, bt, (int)(bt % T));
      for (int i = 0; i < half; i++) {
        float ang = rope_angle(pos, i, HS, rope), c = cosf(ang), s = dir * sinf(ang);
        for (int h = 0; h < NH + NKV; h++) rope_rotate(row + (size_t)h * HS + i, row + (size_t)h * HS + i + half, c, s);
      }
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      float ang = rope_angle(t, i, HS, rope), c = cosf(ang) * rope->scale, s = dir * (sinf(ang) * rope->scale);
      for (int b = 0; b < B; b++) {
        float *row = qkv + ((size_t)b * T + t) * C3;
        for (int h = 0; h < NH + NKV; h++) {
          float *x = row + (size_t)h * HS + i;
          rope_rotate(x, x + half, c, s);
        }
      }
    }
}

void rope_forward(float *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope, const int32_t *seg) {
  rope_apply(qkv, B, T, NH, NKV, HS, rope, seg, 1.0f);
}

void rope_backward(float *dqkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope, const int32_t *seg) {
  rope_apply(dqkv, B, T, NH, NKV, HS, rope, seg, -1.0f);
}

/* ---- the gated MLP activation (ops/gated.h): SwiGLU, GeGLU ---- */

/* One row's loop for the activation A, always inlined with A a constant: gated_row's branches are
 * each the branch-free loop of their activation, vectorized for the clone's ISA. */
static inline __attribute__((always_inline)) void gated_span(float *restrict out, const float *restrict gate,
                                                             const float *restrict up, int F, gate_act A) {
#pragma omp simd
  for (int i = 0; i < F; i++) out[i] = gated(A, gate[i], up[i]);
}

static inline __attribute__((always_inline)) void gated_backward_span(float *restrict dgate, float *restrict dup,
                                                                      const float *restrict gate,
                                                                      const float *restrict up,
                                                                      const float *restrict d, int F, gate_act A) {
#pragma omp simd
  for (int i = 0; i < F; i++) {
    dgate[i] = gated_dgate(A, gate[i], up[i], d[i]);
    dup[i] = gated_dup(A, gate[i], d[i]);
  }
}

static OPS_VEC void gated_row(float *restrict out, const float *restrict gate, const float *restrict up, int F,
                              gate_act act) {
  if (act == GATE_SILU) gated_span(out, gate, up, F, GATE_SILU);
  else gated_span(out, gate, up, F, GATE_GELU_TANH);
}

static OPS_VEC void gated_backward_row(float *restrict dgate, float *restrict dup, const float *restrict gate,
                                       const float *restrict up, const float *restrict d, int F, gate_act act) {
  if (act == GATE_SILU) gated_backward_span(dgate, dup, gate, up, d, F, GATE_SILU);
  else gated_backward_span(dgate, dup, gate, up, d, F, GATE_GELU_TANH);
}

static void gated_forward(float *out, const float *gu, int BT, int F, gate_act act) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) {
    const float *g = gu + (size_t)r * 2 * F;
    gated_row(out + (size_t)r * F, g, g + F, F, act);
  }
}

static void gated_backward(float *dgu, const float *gu, const float *dout, int BT, int F, gate_act act) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) {
    const float *g = gu + (size_t)r * 2 * F;
    float *dg = dgu + (size_t)r * 2 * F;
    gated_backward_row(dg, dg + F, g, g + F, dout + (size_t)r * F, F, act);
  }
}

void swiglu_forward(float *out, const float *gu, int BT, int F) { gated_forward(out, gu, BT, F, GATE_SILU); }
void swiglu_backward(float *dgu, const float *gu, const float *dout, int BT, int F) {
  gated_backward(dgu, gu, dout, BT, F, GATE_SILU);
}
void geglu_forward(float *out, const float *gu, int BT, int F) { gated_forward(out, gu, BT, F, GATE_GELU_TANH); }
void geglu_backward(float *dgu, const float *gu, const float *dout, int BT, int F) {
  gated_backward(dgu, gu, dout, BT, F, GATE_GELU_TANH);
}

/* ---- fused softmax + cross-entropy ---- */

/* One row: z (V logits) becomes dlogits; returns the row's loss. Target XENT_NO_TARGET (−1, an
 * untrained token: transformers' label −100) has loss 0 and gradient 0. Any other target outside
 * [0, V) is a caller bug: its loss is NaN (so the step's loss shows it) and its row's gradient is
 * dscale·softmax, with no out-of-bounds access. */
static OPS_VEC float xent_row(float *z, int V, int tgt, float dscale) {
  if (tgt == XENT_NO_TARGET) {
    memset(z, 0, (size_t)V * sizeof *z);
    return 0.0f;
  }
  int valid = tgt >= 0 && tgt < V;
  float zmax = -INFINITY;
#pragma omp simd reduction(max : zmax)
  for (int j = 0; j < V; j++) zmax = z[j] > zmax ? z[j] : zmax;
  float zt = valid ? z[tgt] : 0.0f;
  /* Σ exp in double: V = 50257 terms of up to 1 each, where a float sum would lose ~1e-4. */
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < V; j++) {
    z[j] = ops_expf(z[j] - zmax);
    sum += z[j];
  }
  float inv = (float)(1.0 / sum);
#pragma omp simd
  for (int j = 0; j < V; j++) z[j] = xent_dlogit(z[j] * inv, j == tgt, dscale);
  return valid ? (float)xent_loss(zt, zmax, sum) : NAN;
}

double softmax_xent_forward_backward(float *logits, float *losses, const int *targets, int BT, int V, float dscale) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < BT; r++) losses[r] = xent_row(logits + (size_t)r * V, V, targets[r], dscale);
  /* Summed in row order, outside the parallel loop, so the total does not depend on threads. */
  double total = 0.0;
  for (int r = 0; r < BT; r++) total += losses[r];
  return total;
}
