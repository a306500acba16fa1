/* ops_cuda_matmul — the Conv1D matmuls through cuBLASLt (bf16 operands, fp32 compute), their
 * epilogues (BIAS, GELU_AUX_BIAS forward, DGELU backward), and the deterministic column sums behind
 * dbias (see ops_cuda.h).
 *
 * Row-major to column-major: cuBLASLt is column-major, and a row-major (r, c) matrix is the
 * column-major (c, r) one with the same bytes. So out[BT,OC] = inp[BT,C]·W[C,OC] is computed as
 * outᵀ(OC×BT) = Wᵀ(OC×C)·inpᵀ(C×BT), with W and inp used as stored (no transposes), and the bias
 * (length OC = the column-major m) fits cuBLASLt's BIAS epilogue, which broadcasts along n.
 *
 * dbias is not taken from cuBLASLt's BGRAD epilogues (DGELU_BGRAD, BGRADB): their documentation
 * promises no reduction order, so their bits could vary with the algorithm the heuristic picks, and
 * their support depends on layouts and versions that cannot be checked here without a GPU. A
 * column sum over fixed row slices folded by its last block (ops_colsum_fold, 128-bit loads, one
 * kernel) is deterministic and reads dout once (BT·OC·2 bytes), cheap next to the GEMMs.
 */
#include "ops_cuda_common.cuh"

#include <pthread.h>
#include <stdio.h>

#define LT_CHECK(call, what)                                                                           \
  do {                                                                                                 \
    cublasStatus_t s_ = (call);                                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                 \
      rc = fsdp_set_error(FSDP_ERR_CUDA, "%s: %s: cuBLASLt: %s", (what), #call, cublasLtGetStatusString(s_)); \
      goto out;                                                                                        \
    }                                                                                                  \
  } while (0)

static fsdp_status lt_status(cublasStatus_t s, const char *what, const char *call) {
  if (s == CUBLAS_STATUS_SUCCESS) return FSDP_OK;
  return fsdp_set_error(FSDP_ERR_CUDA, "%s: setting %s: cuBLASLt: %s", what, call, cublasLtGetStatusString(s));
}

/* The largest power of two (at most 256) that divides the address. */
static uint32_t ptr_align(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && (a & (al - 1))) al >>= 1;
  return al;
}

/* ---- the GEMM plans: descriptors and algorithm per shape and epilogue, made once ----
 * A GEMM's descriptors, layouts and heuristic answer depend only on its key (the handle, the
 * transposes, the shape, the leading dimensions, D's type, beta, the epilogue and which of its
 * pointers it has, each pointer's alignment, the workspace), so they are made the first time a key
 * is seen and kept for the process, as are the answers "no algorithm" and "refused at run time"
 * (the caller's fallback then runs at once). A call sets only the bias and aux pointers on the
 * kept descriptor, under the cache's lock (which also makes the shared descriptor safe to use
 * from two contexts' threads). A full table (LT_PLANS keys: GPT-2 or Llama use ~20) makes and
 * drops the plans of further keys per call, as before. */

#define LT_PLANS 128

typedef struct lt_key {
  cublasLtHandle_t lt;
  int transa, transb, m, n, k, d_f32, beta_one, has_bias, has_aux;
  int64_t lda, ldb, ldd, ldaux;
  uint32_t aa, ab, ad;
  cublasLtEpilogue_t epilogue;
  size_t ws;
} lt_key;

typedef struct lt_plan {
  lt_key key;
  fsdp_status st; /* FSDP_OK: usable; FSDP_ERR_UNSUPPORTED: no algorithm, or refused (why) */
  char why[200];
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
} lt_plan;

static pthread_mutex_t lt_mu = PTHREAD_MUTEX_INITIALIZER;
static lt_plan lt_plans[LT_PLANS];
static int lt_n;

static void lt_plan_drop(lt_plan *p) {
  if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  p->op = NULL, p->la = p->lb = p->ld = NULL;
}

/* The descriptors and the heuristic's algorithm for P's key. FSDP_ERR_UNSUPPORTED (P->why) when
 * cuBLASLt has none; another error (with its message) when a descriptor call failed. */
static fsdp_status lt_plan_make(lt_plan *p, const char *what) {
  const lt_key *q = &p->key;
  fsdp_status rc = FSDP_OK;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  const cublasOperation_t opa = q->transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = q->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t dt = q->d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  LT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
  LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), what);
  LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), what);
  LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &q->epilogue, sizeof q->epilogue),
           what);
  if (q->has_bias) {
    const cudaDataType_t bt = CUDA_R_16BF;
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), what);
  }
  if (q->has_aux) /* the aux type is left at its default, D's type (bf16), as llm.c does */
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &q->ldaux, sizeof q->ldaux),
             what);
  /* Stored shapes: op(A) is m×k, so A is stored k×m when transposed. */
  LT_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, q->transa ? q->k : q->m, q->transa ? q->m : q->k, q->lda),
           what);
  LT_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, q->transb ? q->n : q->k, q->transb ? q->k : q->n, q->ldb),
           what);
  LT_CHECK(cublasLtMatrixLayoutCreate(&p->ld, dt, q->m, q->n, q->ldd), what);
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), what);
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &q->ws, sizeof q->ws),
           what);
  /* The heuristic assumes 256-byte aligned matrices unless told otherwise; a chunk or a column
   * offset can be less aligned, so say what each pointer really is (part of the key). */
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &q->aa, sizeof q->aa),
           what);
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &q->ab, sizeof q->ab),
           what);
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &q->ad, sizeof q->ad),
           what);
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &q->ad, sizeof q->ad),
           what);
  {
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(q->lt, p->op, p->la, p->lb, p->ld, p->ld, pref, 1, &heur, &found);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) { /* the caller may fall back to a plainer epilogue */
      snprintf(p->why, sizeof p->why, "cuBLASLt has no algorithm for this GEMM (m=%d n=%d k=%d, transa %d transb %d, "
               "epilogue %d, D %s, workspace %zu bytes): %s", q->m, q->n, q->k, q->transa, q->transb,
               (int)q->epilogue, q->d_f32 ? "fp32" : "bf16", q->ws,
               s != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(s) : "no result");
      rc = FSDP_ERR_UNSUPPORTED;
      goto out;
    }
    p->algo = heur.algo;
  }
out:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  return rc;
}

/* ops_lt_gemm with D = alpha·op(A)·op(B) (+ D): alpha is an argument of the call, not of the plan */
static fsdp_status lt_gemm(const ops_cuda_ctx *ctx, const char *what, float alpha, int transa, int transb, int m,
                           int n, int k, const void *A, int64_t lda, const void *B, int64_t ldb, void *D, int64_t ldd,
                           int d_f32, int beta_one, cublasLtEpilogue_t epilogue, const void *bias, void *aux,
                           int64_t ldaux) {
  if (m <= 0 || n <= 0) return FSDP_OK;
  if (k <= 0) return fsdp_set_error(FSDP_ERR_INVALID, "%s: GEMM with k = %d", what, k);
  lt_key key;
  memset(&key, 0, sizeof key); /* compared with memcmp: no stray padding bytes */
  key.lt = ctx->lt, key.transa = transa, key.transb = transb, key.m = m, key.n = n, key.k = k, key.d_f32 = d_f32;
  key.beta_one = beta_one, key.has_bias = bias != NULL, key.has_aux = aux != NULL;
  key.lda = lda, key.ldb = ldb, key.ldd = ldd, key.ldaux = aux ? ldaux : 0;
  key.aa = ptr_align(A), key.ab = ptr_align(B), key.ad = ptr_align(D);
  key.epilogue = epilogue, key.ws = ctx->workspace ? ctx->workspace_bytes : 0;
  const float beta = beta_one ? 1.0f : 0.0f;
  fsdp_status rc = FSDP_OK;
  lt_plan once, *p = NULL;

  pthread_mutex_lock(&lt_mu);
  for (int i = 0; i < lt_n && !p; i++)
    if (memcmp(&lt_plans[i].key, &key, sizeof key) == 0) p = &lt_plans[i];
  if (!p) {
    p = lt_n < LT_PLANS ? &lt_plans[lt_n] : &once;
    memset(p, 0, sizeof *p);
    p->key = key;
    p->st = lt_plan_make(p, what);
    if (p->st != FSDP_OK) lt_plan_drop(p);
    if (p->st != FSDP_OK && p->st != FSDP_ERR_UNSUPPORTED) { /* a failed descriptor call: not kept */
      rc = p->st;
      goto out;
    }
    if (p != &once) lt_n++;
  }
  if (p->st != FSDP_OK) {
    rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s", what, p->why);
    goto out;
  }
  if (bias && (rc = lt_status(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                               sizeof bias), what, "the bias pointer")) != FSDP_OK)
    goto out;
  if (aux && (rc = lt_status(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                              sizeof aux), what, "the aux pointer")) != FSDP_OK)
    goto out;
  {
    /* cuBLASLt may still refuse the algorithm its heuristic offered (NOT_SUPPORTED: nothing was
     * launched, D is untouched): as a heuristic miss, the caller's plainer epilogue runs instead,
     * and the key is remembered as refused */
    cublasStatus_t s = cublasLtMatmul(ctx->lt, p->op, &alpha, A, p->la, B, p->lb, &beta, D, p->ld, D, p->ld, &p->algo,
                                      ctx->workspace, key.ws, ctx->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
      snprintf(p->why, sizeof p->why, "cuBLASLt refused the algorithm its heuristic gave for this GEMM (m=%d n=%d "
               "k=%d, transa %d transb %d, epilogue %d, D %s): %s", m, n, k, transa, transb, (int)epilogue,
               d_f32 ? "fp32" : "bf16", cublasLtGetStatusString(s));
      p->st = FSDP_ERR_UNSUPPORTED;
      lt_plan_drop(p);
      rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s", what, p->why);
    } else if (s != CUBLAS_STATUS_SUCCESS) {
      rc = fsdp_set_error(FSDP_ERR_CUDA, "%s: cublasLtMatmul: cuBLASLt: %s", what, cublasLtGetStatusString(s));
    }
  }
out:
  if (p == &once) lt_plan_drop(&once);
  pthread_mutex_unlock(&lt_mu);
  return rc;
}

fsdp_status ops_lt_gemm(const ops_cuda_ctx *ctx, const char *what, int transa, int transb, int m, int n, int k,
                        const void *A, int64_t lda, const void *B, int64_t ldb, void *D, int64_t ldd, int d_f32,
                        int beta_one, cublasLtEpilogue_t epilogue, const void *bias, void *aux, int64_t ldaux) {
  return lt_gemm(ctx, what, 1.0f, transa, transb, m, n, k, A, lda, B, ldb, D, ldd, d_f32, beta_one, epilogue, bias,
                 aux, ldaux);
}

/* Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B first, the shapes swapped. */
fsdp_status ops_cuda_gemm(int ta, int tb, int M, int N, int K, float alpha, const ops_bf16 *A, int64_t lda,
                          const ops_bf16 *B, int64_t ldb, float beta, void *C, int64_t ldc, int c_f32,
                          const ops_cuda_ctx *ctx) {
  if (beta != 0.0f && beta != 1.0f) return fsdp_set_error(FSDP_ERR_INVALID, "gemm: beta = %g; allowed: 0 or 1", beta);
  const int beta_one = beta == 1.0f && !OPS_FAULT("gemm_accumulate");   /* planted: the sum assigned */
  return lt_gemm(ctx, "gemm", alpha, tb, ta, N, M, K, B, ldb, A, lda, C, ldc, c_f32, beta_one,
                 CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0);
}

/* ---- column sums: dst[c] += Σ_r m[r, c], one kernel (ops_colsum_fold) ---- */

template <bool VEC>
__global__ void __launch_bounds__(OPS_CS_X *OPS_CS_Y)
    colsum_partial_kernel(float *__restrict__ dst, float *__restrict__ partial, int *__restrict__ counters,
                          const ops_bf16 *__restrict__ m, int64_t R, int N, int64_t rows_per_split) {
  constexpr int W = VEC ? 8 : 1;
  ops_colsum_fold<1, W>(dst, nullptr, partial, counters, R, N, rows_per_split, [&](int64_t r, int c, float(*acc)[W]) {
    float x[W];
    ops_ldv<VEC>(x, m + r * N + c);
#pragma unroll
    for (int k = 0; k < W; k++) acc[0][k] += x[k];
  });
}

fsdp_status ops_colsum_accumulate(float *dst, const ops_bf16 *m, int64_t R, int N, const ops_cuda_ctx *ctx,
                                     const char *what) {
  if (R <= 0 || N <= 0) return FSDP_OK;
  const int nsplit = ops_colsum_splits(R);
  const int64_t per = (R + nsplit - 1) / nsplit;
  void *ws = NULL;
  TRY(ops_workspace(ctx, ops_colsum_ws_bytes(1, nsplit, N), what, &ws));
  TRY(ops_colsum_zero(ws, 1, nsplit, N, ctx, what));
  float *partial = (float *)ws;
  int *counters = ops_colsum_counters(ws, 1, nsplit, N);
  const dim3 block(OPS_CS_X, OPS_CS_Y);
  if (N % 8 == 0 && ops_aligned16(m))   /* the same order per column either way: the same bits */
    colsum_partial_kernel<true><<<ops_colsum_grid(N, R, 8), block, 0, ctx->stream>>>(dst, partial, counters, m, R, N,
                                                                                      per);
  else
    colsum_partial_kernel<false><<<ops_colsum_grid(N, R, 1), block, 0, ctx->stream>>>(dst, partial, counters, m, R, N,
                                                                                       per);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

/* ---- the matmul ---- */

/* out (BT, OC) += bias (OC), bf16: the BIAS epilogue's work where cuBLASLt has no algorithm for it.
 * VEC: OC is a multiple of 8, so a pack of 8 never crosses a row. */
template <bool VEC>
__global__ void add_bias_kernel(ops_bf16 *__restrict__ out, const ops_bf16 *__restrict__ bias, int OC, int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        float x[8], b[8];
        ld8(x, out + i);
        ld8(b, bias + i % OC);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] += b[k];
        st8(out + i, x);
      },
      [&](int64_t i) { out[i] = tobf(tof(out[i]) + ldbf(bias + i % OC)); });
}

/* D (BT, OC) = inp·W (+ bias): the BIAS epilogue, or the plain GEMM and a bias kernel when cuBLASLt
 * has no algorithm for the epilogue (a bias rounded into bf16 once more than the epilogue would). */
static fsdp_status gemm_bias(const ops_cuda_ctx *ctx, const char *what, ops_bf16 *D, const ops_bf16 *inp,
                             const ops_bf16 *weight, const ops_bf16 *bias, int BT, int C, int OC) {
  fsdp_status rc = ops_lt_gemm(ctx, what, 0, 0, OC, BT, C, weight, OC, inp, C, D, OC, 0, 0,
                               bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, NULL, 0);
  if (rc != FSDP_ERR_UNSUPPORTED || !bias) return rc;
  TRY(ops_lt_gemm(ctx, what, 0, 0, OC, BT, C, weight, OC, inp, C, D, OC, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL,
                  0));
  return ops_add_bias(D, bias, BT, OC, ctx, what);
}

fsdp_status ops_add_bias(ops_bf16 *D, const ops_bf16 *bias, int64_t BT, int OC, const ops_cuda_ctx *ctx,
                         const char *what) {
  const int64_t n = BT * OC;
  OPS_EW_LAUNCH(add_bias_kernel, OC % 8 == 0 && ops_aligned16(D) && ops_aligned16(bias), 8, n, what, D, bias, OC);
  return FSDP_OK;
}

fsdp_status ops_cuda_matmul_forward(ops_bf16 *out, ops_bf16 *pre_gelu, const ops_bf16 *inp, const ops_bf16 *weight,
                                    const ops_bf16 *bias, int BT, int C, int OC, const ops_cuda_ctx *ctx) {
  static const char *what = "matmul_forward";
  if (BT <= 0 || OC <= 0) return FSDP_OK;
  if (C <= 0) return fsdp_set_error(FSDP_ERR_INVALID, "%s: C = %d", what, C);
  if (!pre_gelu) return gemm_bias(ctx, what, out, inp, weight, bias, BT, C, OC);
  /* outᵀ = gelu(Wᵀ·inpᵀ + b), the pre-activation into pre_gelu (aux, same shape as out). */
  fsdp_status rc = ops_lt_gemm(ctx, what, 0, 0, OC, BT, C, weight, OC, inp, C, out, OC, 0, 0,
                               bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, bias, pre_gelu, OC);
  if (rc != FSDP_ERR_UNSUPPORTED) return rc;
  /* No fused algorithm (e.g. OC not a multiple of 8): the same function in steps. */
  TRY(gemm_bias(ctx, what, pre_gelu, inp, weight, bias, BT, C, OC));
  return ops_cuda_gelu_forward(out, pre_gelu, (int64_t)BT * OC, ctx);
}

fsdp_status ops_cuda_matmul_backward(ops_bf16 *dinp, float *dweight, float *dbias, const ops_bf16 *dout,
                                     const ops_bf16 *inp, const ops_bf16 *weight, const ops_bf16 *pre_gelu, int BT,
                                     int C, int OC, const ops_cuda_ctx *ctx) {
  static const char *what = "matmul_backward (dinp)";
  if (BT <= 0 || C <= 0 || OC <= 0) return FSDP_OK;
  /* dWᵀ(OC×C) += doutᵀ(OC×BT)·inp(BT×C: stored C×BT, transposed), fp32, beta 1; first, so that
   * dinp may overwrite inp */
  if (dweight)   /* NULL: a frozen weight ([lora]), only the input gradient */
    TRY(ops_lt_gemm(ctx, "matmul_backward (dweight)", 0, 1, OC, C, BT, dout, OC, inp, C, dweight, OC, 1, 1,
                    CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0));
  if (dbias) TRY(ops_colsum_accumulate(dbias, dout, BT, OC, ctx, "matmul_backward (dbias)"));
  if (!dinp) return FSDP_OK;
  /* dinpᵀ(C×BT) = W(C×OC: stored OC×C, transposed)·doutᵀ(OC×BT), times gelu'(pre_geluᵀ) (aux, C×BT) */
  fsdp_status rc = ops_lt_gemm(ctx, what, 1, 0, C, BT, OC, weight, OC, dout, OC, dinp, C, 0, 0,
                               pre_gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, NULL,
                               (void *)pre_gelu, C);
  if (rc != FSDP_ERR_UNSUPPORTED || !pre_gelu) return rc;
  /* No DGELU algorithm (e.g. C not a multiple of 8): the same function in steps, rounded twice. */
  TRY(ops_lt_gemm(ctx, what, 1, 0, C, BT, OC, weight, OC, dout, OC, dinp, C, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, NULL,
                  NULL, 0));
  return ops_cuda_gelu_backward(dinp, pre_gelu, dinp, (int64_t)BT * C, ctx);
}
