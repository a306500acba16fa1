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
 * two-pass column sum over fixed row slices (ops_colsum_splits, 128-bit loads) is deterministic and
 * reads dout once (BT·OC·2 bytes), cheap next to the GEMMs.
 */
#include "ops_cuda_common.cuh"

#include <stdio.h>

#define LT_CHECK(call, what)                                                                           \
  do {                                                                                                 \
    cublasStatus_t s_ = (call);                                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                 \
      rc = fsdp_set_error(FSDP_ERR_CUDA, "%s: %s: cuBLASLt: %s", (what), #call, cublasLtGetStatusString(s_)); \
      goto out;                                                                                        \
    }                                                                                                  \
  } while (0)

/* The largest power of two (at most 256) that divides the address. */
static uint32_t ptr_align(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && (a & (al - 1))) al >>= 1;
  return al;
}

fsdp_status ops_lt_gemm(const ops_cuda_ctx *ctx, const char *what, int transa, int transb, int m, int n, int k,
                        const void *A, int64_t lda, const void *B, int64_t ldb, void *D, int64_t ldd, int d_f32,
                        int beta_one, cublasLtEpilogue_t epilogue, const void *bias, void *aux, int64_t ldaux) {
  fsdp_status rc = FSDP_OK;
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  const float alpha = 1.0f, beta = beta_one ? 1.0f : 0.0f;
  const cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t dt = d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  size_t ws = ctx->workspace ? ctx->workspace_bytes : 0;
  if (m <= 0 || n <= 0) return FSDP_OK;
  if (k <= 0) return fsdp_set_error(FSDP_ERR_INVALID, "%s: GEMM with k = %d", what, k);

  LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), what);
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), what);
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue), what);
  if (bias) {
    const cudaDataType_t bt = CUDA_R_16BF;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), what);
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), what);
  }
  if (aux) { /* the aux type is left at its default, D's type (bf16), as llm.c does */
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux), what);
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof ldaux), what);
  }
  /* Stored shapes: op(A) is m×k, so A is stored k×m when transposed. */
  LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, transa ? k : m, transa ? m : k, lda), what);
  LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, transb ? n : k, transb ? k : n, ldb), what);
  LT_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd), what);
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), what);
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           what);
  {
    /* The heuristic assumes 256-byte aligned matrices unless told otherwise; a chunk or a column
     * offset can be less aligned, so say what each pointer really is. */
    const uint32_t aa = ptr_align(A), ab = ptr_align(B), ad = ptr_align(D);
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa),
             what);
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab),
             what);
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad),
             what);
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad),
             what);
  }
  {
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, ld, ld, pref, 1, &heur, &found);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) { /* the caller may fall back to a plainer epilogue */
      rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED,
                          "%s: cuBLASLt has no algorithm for this GEMM (m=%d n=%d k=%d, transa %d transb %d, "
                          "epilogue %d, D %s, workspace %zu bytes): %s",
                          what, m, n, k, transa, transb, (int)epilogue, d_f32 ? "fp32" : "bf16", ws,
                          s != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(s) : "no result");
      goto out;
    }
  }
  {
    /* cuBLASLt may still refuse the algorithm its heuristic offered (NOT_SUPPORTED: nothing was
     * launched, D is untouched): as a heuristic miss, the caller's plainer epilogue runs instead */
    cublasStatus_t s = cublasLtMatmul(ctx->lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &heur.algo,
                                      ctx->workspace, ws, ctx->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED)
      rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED,
                          "%s: cuBLASLt refused the algorithm its heuristic gave for this GEMM (m=%d n=%d k=%d, "
                          "transa %d transb %d, epilogue %d, D %s): %s",
                          what, m, n, k, transa, transb, (int)epilogue, d_f32 ? "fp32" : "bf16",
                          cublasLtGetStatusString(s));
    else if (s != CUBLAS_STATUS_SUCCESS)
      rc = fsdp_set_error(FSDP_ERR_CUDA, "%s: cublasLtMatmul: cuBLASLt: %s", what, cublasLtGetStatusString(s));
  }
out:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return rc;
}

/* ---- column sums: partial[s·N + c] = Σ rows of slice s, column c ---- */

#define CS_ROWS 8 /* thread rows per block; blocks are 32 threads × CS_ROWS, each thread 8 columns (VEC) or 1 */

template <bool VEC>
__global__ void colsum_partial_kernel(float *__restrict__ partial, const ops_bf16 *__restrict__ m, int64_t R, int N,
                                      int64_t rows_per_split) {
  constexpr int W = VEC ? 8 : 1;
  __shared__ float s[CS_ROWS][32 * W + 1];
  const int c = (blockIdx.x * 32 + threadIdx.x) * W, split = blockIdx.y;
  const int64_t r0 = (int64_t)split * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < R ? r0 + rows_per_split : R;
  float v[W], x[W];
#pragma unroll
  for (int k = 0; k < W; k++) v[k] = 0.0f;
  if (c < N) /* VEC: N is a multiple of 8, so all W columns exist */
    for (int64_t r = r0 + threadIdx.y; r < r1; r += CS_ROWS) {
      ops_ldv<VEC>(x, m + r * N + c);
#pragma unroll
      for (int k = 0; k < W; k++) v[k] += x[k];
    }
#pragma unroll
  for (int k = 0; k < W; k++) s[threadIdx.y][threadIdx.x * W + k] = v[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < N) {
    for (int y = 1; y < CS_ROWS; y++)
#pragma unroll
      for (int k = 0; k < W; k++) v[k] += s[y][threadIdx.x * W + k];
#pragma unroll
    for (int k = 0; k < W; k++) partial[(int64_t)split * N + c + k] = v[k];
  }
}

__global__ void colsum_finish_kernel(float *__restrict__ dst, const float *__restrict__ partial, int nsplit, int N) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= N) return;
  float v = 0.0f;
  for (int s = 0; s < nsplit; s++) v += partial[(int64_t)s * N + c];
  dst[c] += v;
}

fsdp_status ops_colsum_finish(float *dst, const float *partial, int nsplit, int N, const ops_cuda_ctx *ctx,
                              const char *what) {
  colsum_finish_kernel<<<ops_blocks(N, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(dst, partial, nsplit, N);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

fsdp_status ops_colsum_accumulate(float *dst, const ops_bf16 *m, int64_t R, int N, const ops_cuda_ctx *ctx,
                                     const char *what) {
  if (R <= 0 || N <= 0) return FSDP_OK;
  int nsplit = ops_colsum_splits(R);
  int64_t per = (R + nsplit - 1) / nsplit;
  void *ws = NULL;
  TRY(ops_workspace(ctx, (size_t)nsplit * N * sizeof(float), what, &ws));
  if (N % 8 == 0 && ops_aligned16(m))   /* the same order per column either way: the same bits */
    colsum_partial_kernel<true><<<dim3((N + 255) / 256, nsplit), dim3(32, CS_ROWS), 0, ctx->stream>>>((float *)ws, m,
                                                                                                    R, N, per);
  else
    colsum_partial_kernel<false><<<dim3((N + 31) / 32, nsplit), dim3(32, CS_ROWS), 0, ctx->stream>>>((float *)ws, m,
                                                                                                   R, N, per);
  LAUNCH_CHECK(what);
  return ops_colsum_finish(dst, (const float *)ws, nsplit, N, ctx, what);
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
