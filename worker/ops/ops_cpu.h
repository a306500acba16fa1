/* ops_cpu — the GPT-2 and Llama operators on the CPU, in fp32: the readable reference that the CUDA
 * backend (ops_cuda.cu) must agree with. Scalar math shared with CUDA lives in the headers under worker/ops/.
 *
 * Conventions (llm.c): outputs first, then inputs, then sizes. B batch, T time, C channels,
 * OC output channels, NH heads, V vocabulary, N = number of elements. Backward functions ACCUMULATE
 * into parameter gradients (+=) and ASSIGN activation gradients (=). Buffers never alias unless
 * a comment says so. Matmuls go through cblas_sgemm; the other loops are OpenMP-parallel.
 * Stateless and thread-compatible: any thread may call them on disjoint buffers.
 */
#ifndef FSDP_OPS_CPU_H
#define FSDP_OPS_CPU_H

#include <stdint.h>

#include "ops/rope.h"

/* out[b,t,:] = wte[inp[b,t],:] + wpe[pos,:], pos = t, or with documents (SEG, ops/docmask.h; NULL:
 * one per row) t − seg[b·T + t]; wpe (and dwpe) NULL: no learned positions (Llama). The backward adds
 * nothing into dwte's row PAD (nn.Embedding's padding_idx: the lookup never trains it; −1: none). */
void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C,
                     const int32_t *seg);
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C, int pad,
                      const int32_t *seg);

/* LayerNorm over C with eps 1e-5; mean and rstd are (B*T) and saved for backward. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int B, int T, int C);
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int B, int T, int C);

/* Hugging Face Conv1D: weight is [C, OC]; out[n,:] = inp[n,:] @ weight + bias (bias may be NULL).
 * BT rows. */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int BT, int C, int OC);
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int BT, int C, int OC);

/* Causal grouped-query self-attention. qkv is (B,T,C + 2·NKV·hs), hs = C/NH: q (NH heads) then k
 * and v (NKV heads each), head h of q at columns h·hs, kv head g of k at C + g·hs and of v at
 * C + (NKV + g)·hs; NKV = NH is GPT-2's c_attn layout (B,T,3C). Query head h reads kv head
 * h / (NH/NKV); NKV divides NH. att is (B,NH,T,T) softmax probabilities (entries above the
 * diagonal are 0), saved for backward; out is (B,T,C). Scale 1/sqrt(hs). datt is (B,NH,T,T)
 * scratch for backward; the gradient of a shared kv head is the sum over its query heads, added in
 * head order (the same bits for any thread count). Documents SEG (NULL: one per row) and a sliding
 * WINDOW (0: none) restrict query t to keys [lo, t] (ops/docmask.h); att is 0 outside them, and
 * the products skip the blocks no query of a block sees. */
void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH, int NKV,
                       const int32_t *seg, int window);
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                        int B, int T, int C, int NH, int NKV, const int32_t *seg, int window);

/* GELU, tanh approximation. */
void gelu_forward(float *out, const float *inp, int N);
void gelu_backward(float *dinp, const float *inp, const float *dout, int N);

/* out = a + b. Backward of a residual is the identity: the caller reuses dout. */
void residual_forward(float *out, const float *a, const float *b, int N);

/* ---- Llama ---- */

/* nn.Linear without bias: weight is [OC, C] (out, in); out[n,:] = weight·inp[n,:]. BT rows.
 * Backward: dinp = dout·weight (dinp may be NULL: not wanted), dweight += doutᵀ·inp.
 * Also the output head of both architectures: logits[n,v] = Σ_c inp[n,c]·w[v,c], w = wte (GPT-2,
 * tied) or lm_head (Llama), [V, C]. */
/* C[M×N] = alpha·op(A)·op(B) + beta·C, row-major with leading dimensions; op(X) = Xᵀ where tX
 * (A is then stored K×M, B N×K). beta = 0 never reads C. LoRA's products (lora.h): a column
 * block of a fused projection's rows read or accumulated in place, the scale in alpha. */
void gemm_strided(int ta, int tb, int M, int N, int K, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc);
void linear_forward(float *out, const float *inp, const float *weight, int BT, int C, int OC);
void linear_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                     int BT, int C, int OC);

/* RMSNorm over C (ops/rmsnorm.h): out = inp·rstd·(woff + weight), rstd (BT) saved for backward. WOFF is
 * the weight's offset: 0 for Llama's norms, 1 for Gemma's (which store w and scale by 1 + w, in fp32). */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int BT, int C, float eps,
                     float woff);
void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                      const float *rstd, int BT, int C, float woff);

/* Rotary embeddings in Hugging Face's rotate-half convention (ops/rope.h), in place on the NH q
 * heads and NKV k heads of each row of a (B,T,C + 2·NKV·HS) qkv buffer (C = NH·HS, HS even; v is
 * untouched); row (b,t) is at position t (with documents SEG, NULL: one per row, t − seg[b·T + t]:
 * ops/docmask.h), with the frequencies of ROPE. The backward rotates dq and dk back, in place. */
void rope_forward(float *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope, const int32_t *seg);
void rope_backward(float *dqkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope, const int32_t *seg);

/* The gated MLP activation (ops/gated.h), one loop for both: gu is (BT, 2F), gate then up in each
 * row; out (BT, F) = act(gate)·up, dgu (BT, 2F) assigned. SwiGLU: act = silu (Llama). */
void swiglu_forward(float *out, const float *gu, int BT, int F);
void swiglu_backward(float *dgu, const float *gu, const float *dout, int BT, int F);

/* GeGLU: act = gelu_tanh (Gemma). */
void geglu_forward(float *out, const float *gu, int BT, int F);
void geglu_backward(float *dgu, const float *gu, const float *dout, int BT, int F);

/* ---- the Llama family beyond Llama (ops_cpu_family.c) ---- */

/* nn.Linear's bias: out[n,:] += bias (OC); backward dbias += Σ_n dout[n,:] (rows in order). */
void bias_forward(float *out, const float *bias, int BT, int OC);
void bias_backward(float *dbias, const float *dout, int BT, int OC);

/* Qwen3's q_norm and k_norm: RMSNorm over each head of HD channels (ops/rmsnorm.h) of a (BT, Q) qkv
 * buffer, Q = (NH + 2·NKV)·HD: the NH q heads with weight wq [HD], the NKV k heads with wk [HD]; v is
 * copied. rstd (BT, NH + NKV) fp32 is saved, the q heads' then the k heads' of each row. out may be
 * inp. Backward: dinp (q and k: RMSNorm's; v: dout's) assigned, dwq and dwk +=; dinp may be dout. WOFF:
 * rmsnorm_forward's (1: Gemma 3's q_norm, k_norm scale by 1 + w). */
void qk_norm_forward(float *out, float *rstd, const float *inp, const float *wq, const float *wk, int BT, int NH,
                     int NKV, int HD, float eps, float woff);
void qk_norm_backward(float *dinp, float *dwq, float *dwk, const float *dout, const float *inp, const float *wq,
                      const float *wk, const float *rstd, int BT, int NH, int NKV, int HD, float woff);

/* Fused softmax + cross-entropy, in place: on entry `logits` holds (BT,V) logits; on return it holds
 * dlogits = dscale·(softmax − onehot(target)), and losses[n] = −log softmax[target[n]].
 * A target XENT_NO_TARGET (−1, ops/softmax.h) gives loss 0 and a gradient row of 0.
 * Returns Σ losses (double). dscale is usually 1/(all tokens of all ranks and micro-steps). */
double softmax_xent_forward_backward(float *logits, float *losses, const int *targets, int BT, int V, float dscale);

/* When OpenBLAS runs kernels far below what this CPU supports (see ops_cpu.c), the
 * OPENBLAS_CORETYPE value that fixes it ("SkylakeX", "Haswell"); NULL when the kernels are fine. */
const char *ops_cpu_blas_better_core(void);

/* Nonzero: every GEMM is summed as two over the halves of k (FSDP_SUM_ORDER=split_k, docs/testing.md).
 * In fsdp-worker 0 (ops_cpu.c's weak definition); the test binaries that need it link
 * tests/hooks/sum_order.c instead. Any thread. */
int ops_test_split_k(void);

#endif
