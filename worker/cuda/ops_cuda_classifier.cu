/* ops_cuda_classifier — the fused tied head: logits, softmax + cross-entropy + dlogits in place,
 * and the head's backward, chunk by chunk of rows (see ops_cuda.h for the contract).
 *
 * Memory: one chunk of logits at a time, fp32 with row stride Vp (V rounded up to 128, so every
 * row starts 512-byte aligned for the GEMMs). The softmax kernel turns each fp32 row into its bf16
 * dlogits in place, in the first half of the row's own bytes (bf16 row stride 2·Vp): one buffer of
 * chunk·Vp·4 bytes serves both. The logits are kept in fp32 (not bf16) because a logit of
 * magnitude ~10 rounded to bf16 is off by ~0.04, which would move the probabilities by ~4%; only
 * the gradient, which feeds bf16 GEMMs anyway, is rounded.
 *
 * The GEMMs (column-major view, see ops_cuda_matmul.cu) read only rows [0, V) of wte and write only
 * rows [0, V) of dwte, so the vocabulary padding of a caller's buffer is never touched:
 *   logits(V×n, ld Vp)   = wte(C×V stored, transposed)·inp_chunk(C×n)
 *   dinp_chunk(C×n)      = wte(C×V)·dlogits(V×n, ld 2·Vp)
 *   dwte(C×V)           += inp_chunk(C×n)·dlogits(V×n)ᵀ
 */
#include "ops_cuda_common.cuh"

#include "ops/exp.h"
#include "ops/softmax.h"

#define XENT_THREADS 1024

static int64_t padded_vocab(int V) { return ((int64_t)V + 127) / 128 * 128; }

size_t ops_cuda_classifier_scratch_bytes(int chunk, int V) {
  if (chunk <= 0 || V <= 0) return 0;
  return (size_t)chunk * (size_t)padded_vocab(V) * sizeof(float);
}

/* One block per row: the row's loss, then its dlogits written over it in bf16.
 * In place without a race: the bf16 write of element j lands in the bytes of fp32 element j/2.
 * The write pass goes in tiles of blockDim.x elements, reading tile k into registers, then a
 * barrier, then writing it: tile k's writes cover fp32 elements [k·bd/2, (k+1)·bd/2), all inside
 * tiles 0..k, whose reads are finished by then; later tiles' elements are never written early. */
__global__ void __launch_bounds__(XENT_THREADS)
    xent_inplace_kernel(float *__restrict__ logits, float *__restrict__ losses, const int *__restrict__ targets,
                        int V, int64_t Vp, float dscale) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  const int64_t r = blockIdx.x;
  float *z = logits + r * Vp;
  ops_bf16 *dl = reinterpret_cast<ops_bf16 *>(z);
  const int tgt = targets[r];
  const bool valid = tgt >= 0 && tgt < V;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx, redf);
  const float zt = valid ? z[tgt] : 0.0f;
  double sum = 0.0; /* Σ exp in double, as on the CPU */
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)ops_expf(z[j] - mx);
  sum = block_sum(sum, redd); /* its barriers order every read above before the writes below */
  if (threadIdx.x == 0) losses[r] = valid ? (float)xent_loss(zt, mx, sum) : NAN;
  const float inv = (float)(1.0 / sum);
  for (int j0 = 0; j0 < V; j0 += blockDim.x) {
    const int j = j0 + threadIdx.x;
    const float zj = j < V ? z[j] : 0.0f;
    __syncthreads();
    if (j < V) dl[j] = tobf(xent_dlogit(ops_expf(zj - mx) * inv, j == tgt, dscale));
  }
}

fsdp_status ops_cuda_classifier_forward_backward(float *losses, ops_bf16 *dinp, float *dwte, void *logits_scratch,
                                                 const ops_bf16 *inp, const ops_bf16 *wte, const int *targets,
                                                 int BT, int C, int V, int chunk, float dscale,
                                                 const ops_cuda_ctx *ctx) {
  static const char *what = "classifier";
  if (BT <= 0) return FSDP_OK;
  if (C <= 0 || V <= 0 || chunk <= 0 || !logits_scratch)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: C=%d V=%d chunk=%d scratch=%p: need C, V, chunk > 0 and a scratch "
                          "buffer of ops_cuda_classifier_scratch_bytes(chunk, V)", what, C, V, chunk, logits_scratch);
  if ((dinp == NULL) != (dwte == NULL))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: dinp and dwte must be both set (training) or both NULL (loss only)",
                          what);
  const int64_t Vp = padded_vocab(V);
  float *logits = (float *)logits_scratch;
  const ops_bf16 *dlogits = (const ops_bf16 *)logits_scratch;
  for (int r0 = 0; r0 < BT; r0 += chunk) {
    const int n = BT - r0 < chunk ? BT - r0 : chunk;
    const ops_bf16 *x = inp + (int64_t)r0 * C;
    TRY(ops_lt_gemm(ctx, "classifier (logits)", 1, 0, V, n, C, wte, C, x, C, logits, Vp, 1, 0,
                    CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0));
    xent_inplace_kernel<<<n, XENT_THREADS, 0, ctx->stream>>>(logits, losses + r0, targets + r0, V, Vp, dscale);
    LAUNCH_CHECK("classifier (softmax, cross-entropy)");
    if (!dinp) continue;
    TRY(ops_lt_gemm(ctx, "classifier (dinp)", 0, 0, C, n, V, wte, C, dlogits, 2 * Vp, dinp + (int64_t)r0 * C, C, 0,
                    0, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0));
    TRY(ops_lt_gemm(ctx, "classifier (dwte)", 0, 1, C, V, n, x, C, dlogits, 2 * Vp, dwte, C, 1, 1,
                    CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0));
  }
  return FSDP_OK;
}
