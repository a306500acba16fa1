/* ops_cuda_classifier — the fused tied head: logits, softmax + cross-entropy + dlogits in place,
 * and the head's backward, chunk by chunk of rows (see ops_cuda.h for the contract).
 *
 * Memory and traffic: one chunk of bf16 logits at a time, row stride Vp (V rounded up to 128, so
 * every row starts 256-byte aligned for the GEMMs and the kernel's 128-bit accesses). The chunk is
 * as large as the caller's budget allows (plan_classifier_chunk: GPT-2 at B·T = 16384 is one
 * chunk), because each chunk's dwte GEMM reads and writes the whole fp32 dwte (beta = 1): 16 chunks
 * of 1024 rows moved ~4.9 GB of dwte for GPT-2, one chunk 0.3 GB. Per chunk the logits are written
 * once by their GEMM, read twice by xent_fused_kernel (the second read of a ~100 KB row mostly from
 * L2) and overwritten in place by their gradient, which the two backward GEMMs read.
 *
 * Precision: the logits are rounded to bf16 by their GEMM, as llm.c and PyTorch's bf16 autocast
 * do: a logit of magnitude m is off by up to m·2⁻⁹ (0.02 at 10, 0.25 at 100), which moves a
 * token's loss by as much and the mean loss over many tokens by far less. The softmax takes
 * 2^((z − max)·log2 e) from exp2f (one MUFU.EX2 per element, ≤ 2 ulp), not ops_expf's polynomial:
 * the gradient is rounded to bf16 anyway.
 *
 * The padded vocabulary (llm.c's Vp): every GEMM runs over Vp = V rounded up to 128 rows of the
 * head, so that the vocabulary dimension of each (M of the logits, K of dinp, N of dwte) is a
 * multiple of the 8-element vectors cuBLASLt's aligned kernels need; V = 50257 would leave them
 * only their 2-byte-aligned ones. When V is not a multiple of 128, the head is copied into a
 * Vp-row buffer whose rows [V, Vp) are zero (V·C·2 bytes copied per call: ~77 MB for GPT-2, well
 * under 1% of the GEMMs' time), and dwte is computed over Vp rows into an fp32 buffer whose first
 * V rows are then added to the caller's (its rows [V, Vp) are dropped). Both live in the caller's
 * scratch, after the logits, so the model's units, checkpoints and exports never hold a padded
 * tensor: the padding exists only inside this call. The zero rows give logits of exactly 0 in the
 * columns [V, Vp), which the row kernel leaves out of the softmax and leaves in place as their
 * gradient (0), so they add nothing to dinp. When V is a multiple of 128 (Llama 3, Mistral,
 * Qwen), the GEMMs read wte and write dwte directly:
 *   logits(Vp×n, ld Vp, bf16) = head(C×Vp stored, transposed)·inp_chunk(C×n)
 *   dinp_chunk(C×n)           = head(C×Vp)·dlogits(Vp×n, ld Vp)
 *   dhead(C×Vp, fp32)        += inp_chunk(C×n)·dlogits(Vp×n)ᵀ
 */
#include "ops_cuda_common.cuh"

#include "ops/softmax.h"

#define XENT_THREADS 1024

static int64_t padded_vocab(int V) { return ((int64_t)V + 127) / 128 * 128; }

size_t ops_cuda_classifier_scratch_bytes(int chunk, int V, int C) {
  if (chunk <= 0 || V <= 0 || C <= 0) return 0;
  const size_t Vp = (size_t)padded_vocab(V), logits = (size_t)chunk * Vp * sizeof(ops_bf16);
  return Vp == (size_t)V ? logits : logits + Vp * (size_t)C * (sizeof(ops_bf16) + sizeof(float));
}

/* 8 fp32 → bf16 stored with the streaming hint (st.global.cs): this kernel never reads the gradient
 * back, so it should not push the rows still to be read out of L2. */
__device__ __forceinline__ void st8cs(ops_bf16 *p, const float *f) {
  ops_bf16 h[8];
#pragma unroll
  for (int k = 0; k < 8; k++) h[k] = tobf(f[k]);
  int4 r;
  memcpy(&r, h, 16);
  __stcs(reinterpret_cast<int4 *>(p), r);
}

/* The columns of one row: VEC, BODYP(j) for every whole pack of 8 [j, j + 8) (thread t takes packs
 * t, t + blockDim, ...), then the V mod 8 columns left over one to a thread, outside any loop;
 * else BODY1(j) for every column. Both passes of the kernel give a thread the same columns. */
template <bool VEC, class FP, class F1> __device__ __forceinline__ void xent_row_loop(int V, FP bodyp, F1 body1) {
  if (VEC) {
    const int nv = V / 8 * 8;
    for (int j = threadIdx.x * 8; j < nv; j += blockDim.x * 8) bodyp(j);
    if (nv + (int)threadIdx.x < V) body1(nv + threadIdx.x);
  } else {
    for (int j = threadIdx.x; j < V; j += blockDim.x) body1(j);
  }
}

/* One block per row: the row's max and Σ e^(z − max) in one online pass (each thread keeps its own
 * max and rescales its sum when the max grows; the block then combines them in a fixed order, so
 * the bits never vary), the loss, then a second pass that overwrites each logit with its gradient
 * dscale·(softmax − onehot), in bf16, in place: a thread writes only the columns it read. Rows go
 * last first, as llm.c's do: the GEMM wrote the last rows last, so they are the likeliest in L2. */
template <bool VEC>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_fused_kernel(ops_bf16 *__restrict__ logits, float *__restrict__ losses, const int *__restrict__ targets,
                      int V, int64_t Vp, float dscale) {
  __shared__ float red[32];
  const int64_t row = (int64_t)gridDim.x - 1 - blockIdx.x;
  ops_bf16 *z = logits + row * Vp;
  const int tgt = targets[row];
  if (OPS_FAULT("pad_softmax")) V = (int)Vp; /* planted: the padding columns in the softmax */
  if (tgt == XENT_NO_TARGET) { /* untrained (the same for the whole block): loss 0, gradient 0 */
    if (threadIdx.x == 0) losses[row] = 0.0f;
    const float zero[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    xent_row_loop<VEC>(
        V, [&](int j) { st8cs(z + j, zero); }, [&](int j) { __stcs(z + j, tobf(0.0f)); });
    return;
  }
  const bool valid = tgt >= 0 && tgt < V;
  const float zt = valid && threadIdx.x == 0 ? ldbf(z + tgt) : 0.0f; /* read before any write */
  float mx = -INFINITY, s = 0.0f;
  auto online = [&](const float *x, int n) {
    float m = mx;
    for (int k = 0; k < n; k++) m = fmaxf(m, x[k]);
    if (m > mx) s *= exp2f((mx - m) * OPS_LOG2E), mx = m; /* mx = −inf: s is 0 and stays 0 */
    for (int k = 0; k < n; k++) s += exp2f((x[k] - mx) * OPS_LOG2E);
  };
  xent_row_loop<VEC>(
      V,
      [&](int j) {
        float x[8];
        ld8(x, z + j);
        online(x, 8);
      },
      [&](int j) {
        const float x = ldbf(z + j);
        online(&x, 1);
      });
  const float rmax = block_max(mx, red);
  const float sum = block_sum(mx == -INFINITY ? 0.0f : s * exp2f((mx - rmax) * OPS_LOG2E), red);
  if (threadIdx.x == 0) losses[row] = valid ? (float)xent_loss(zt, rmax, (double)sum) : NAN;
  const float inv = 1.0f / sum;
  auto grad = [&](float x, int j) { return xent_dlogit(exp2f((x - rmax) * OPS_LOG2E) * inv, j == tgt, dscale); };
  xent_row_loop<VEC>(
      V,
      [&](int j) {
        float x[8];
        ld8(x, z + j);
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = grad(x[k], j + k);
        st8cs(z + j, x);
      },
      [&](int j) { __stcs(z + j, tobf(grad(ldbf(z + j), j))); });
}

fsdp_status ops_cuda_xent_inplace(ops_bf16 *logits, float *losses, const int *targets, int n, int V, int64_t ld,
                                  float dscale, const ops_cuda_ctx *ctx) {
  static const char *what = "classifier (softmax, cross-entropy)";
  if (n <= 0) return FSDP_OK;
  if (V <= 0 || ld < V)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: V=%d ld=%lld: need 0 < V <= ld", what, V, (long long)ld);
  if (ld % 8 == 0 && ops_aligned16(logits))
    xent_fused_kernel<true><<<n, XENT_THREADS, 0, ctx->stream>>>(logits, losses, targets, V, ld, dscale);
  else
    xent_fused_kernel<false><<<n, XENT_THREADS, 0, ctx->stream>>>(logits, losses, targets, V, ld, dscale);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

fsdp_status ops_cuda_classifier_forward_backward(float *losses, ops_bf16 *dinp, float *dwte, void *logits_scratch,
                                                 const ops_bf16 *inp, const ops_bf16 *wte, const int *targets,
                                                 int BT, int C, int V, int chunk, float dscale,
                                                 const ops_cuda_ctx *ctx) {
  static const char *what = "classifier";
  if (BT <= 0) return FSDP_OK;
  if (C <= 0 || V <= 0 || chunk <= 0 || !logits_scratch)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: C=%d V=%d chunk=%d scratch=%p: need C, V, chunk > 0 and a scratch "
                          "buffer of ops_cuda_classifier_scratch_bytes(chunk, V, C)", what, C, V, chunk, logits_scratch);
  if (dwte && !dinp)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: dwte needs dinp (training); dinp alone is a frozen head, neither "
                          "the loss only", what);
  const int64_t Vp = padded_vocab(V);
  ops_bf16 *logits = (ops_bf16 *)logits_scratch;
  const ops_bf16 *head = wte;
  float *dhead = dwte;
  if (Vp != V) { /* the padded head and its gradient, after the logits (ops_cuda_classifier_scratch_bytes) */
    ops_bf16 *hp = logits + (int64_t)chunk * Vp;
    CUDA_CHECK(cudaMemcpyAsync(hp, wte, (size_t)V * C * sizeof(ops_bf16), cudaMemcpyDeviceToDevice, ctx->stream),
               what);
    CUDA_CHECK(cudaMemsetAsync(hp + (int64_t)V * C, 0, (size_t)(Vp - V) * C * sizeof(ops_bf16), ctx->stream), what);
    head = hp;
    if (dwte) dhead = (float *)(hp + Vp * C);
  }
  for (int r0 = 0; r0 < BT; r0 += chunk) {
    const int n = BT - r0 < chunk ? BT - r0 : chunk;
    const ops_bf16 *x = inp + (int64_t)r0 * C;
    TRY(ops_lt_gemm(ctx, "classifier (logits)", 1, 0, (int)Vp, n, C, head, C, x, C, logits, Vp, 0, 0,
                    CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0));
    TRY(ops_cuda_xent_inplace(logits, losses + r0, targets + r0, n, V, Vp, dscale, ctx));
    if (!dinp) continue;
    TRY(ops_lt_gemm(ctx, "classifier (dinp)", 0, 0, C, n, (int)Vp, head, C, logits, Vp, dinp + (int64_t)r0 * C, C, 0,
                    0, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0));
    if (!dwte) continue; /* a frozen head ([lora]): the input gradient only */
    /* the padded gradient starts at the first chunk's product; the caller's accumulates */
    TRY(ops_lt_gemm(ctx, "classifier (dwte)", 0, 1, C, (int)Vp, n, x, C, logits, Vp, dhead, C, 1,
                    dhead == dwte || r0 > 0, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0));
  }
  if (dwte && dhead != dwte) TRY(ops_cuda_accumulate_f32(dwte, dhead, (int64_t)V * C, ctx));
  return FSDP_OK;
}
