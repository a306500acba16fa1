/* ops_cuda — the GPT-2 and Llama operators on an NVIDIA GPU in bf16 with fp32 math: the kernels behind the
 * CUDA device layer. ops_cpu.h (fp32) stays the specification; gpu_check compares every function
 * here with it (tests/gpu, docs/gpu.md).
 *
 * Conventions (as ops_cpu.h: outputs first, then inputs, then sizes, then the context):
 *  - Every pointer is a DEVICE pointer. Every call takes an ops_cuda_ctx as its LAST argument and
 *    only enqueues work on ctx->stream: no allocation, no host synchronization, no device-wide
 *    synchronization inside any call. A call returns FSDP_ERR_CUDA with the CUDA or cuBLAS text when
 *    a launch or a cuBLASLt call is refused (and clears CUDA's last-error state: nothing sticky is
 *    left behind); a fault while a kernel runs surfaces at the caller's next synchronizing call.
 *  - Storage: parameters (as gathered), activations and activation gradients are bf16 (ops_bf16);
 *    PARAMETER GRADIENTS are fp32 and ACCUMULATED (+=); activation gradients are ASSIGNED (=);
 *    LayerNorm mean/rstd, attention's logsumexp and losses are fp32. All math is fp32 (every sum
 *    accumulates in fp32 or wider). Buffers never alias unless a comment says so.
 *  - Deterministic: same inputs, same shapes → same bits, on any GPU model (reduction splits depend
 *    only on the shapes, never on the SM count; no floating-point atomics anywhere), except the
 *    attention backward when it runs through cuDNN (below).
 *  - The workspace: ctx->workspace (ctx->workspace_bytes, at least OPS_CUDA_WORKSPACE_MIN, 256-byte
 *    aligned) is scratch for cuBLASLt and for the multi-pass reductions below. Calls on one ctx
 *    must stay in stream order (they reuse it); two streams need two workspaces.
 *  - Shapes: B batch, T time, C channels, OC output channels, NH heads, NKV kv heads, HS head
 *    size, F SwiGLU width, V vocabulary, N elements. BT = B·T rows. Element counts are int64 where
 *    a buffer can pass 2^31 elements.
 * Scalar formulas (GELU, LayerNorm, RMSNorm, rotary, SwiGLU, softmax, exp, bf16 rounding) come from
 * the headers in worker/ops/, compiled for both backends. Any host thread may call these; one thread per ctx at a time.
 *
 * Compiled only when the CUDA backend is built (FSDP_HAVE_CUDA).
 */
#ifndef FSDP_OPS_CUDA_H
#define FSDP_OPS_CUDA_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/rope.h" /* rope_freqs: plain data, and the formula the rope kernel calls */

#ifdef __cplusplus
extern "C" {
#endif

#include "err.h" /* a C header without extern "C" guards of its own */

/* bf16 storage: two bytes, the top half of an fp32 (worker/ops/bf16.h converts on raw bits). C has
 * no __nv_bfloat16, only its raw struct: same size and layout, so the pointers are interchangeable. */
#ifdef __cplusplus
typedef __nv_bfloat16 ops_bf16;
#else
typedef __nv_bfloat16_raw ops_bf16;
#endif

/* What every call enqueues on. Owned by the caller (the device layer); these functions never
 * create or destroy any of it. */
typedef struct ops_cuda_ctx {
  cudaStream_t stream;    /* all work goes here */
  cublasLtHandle_t lt;    /* cublasLtCreate()'d by the caller */
  void *workspace;        /* device scratch, 256-byte aligned */
  size_t workspace_bytes; /* >= OPS_CUDA_WORKSPACE_MIN */
  int device;             /* the GPU current on every thread that calls with this ctx (cudaSetDevice):
                             kernels' attributes are set once per device and kernel */
} ops_cuda_ctx;

/* 32 MiB: cuBLASLt's recommended workspace on Hopper, and more than any reduction here needs
 * (matmul dbias: 64·OC floats; layernorm_backward: 128·C floats; rmsnorm_backward: 64·C floats;
 * each of those three also C/16 ints of counters; encoder_backward: 2·B·T ints;
 * sumsq: 12 KiB; the cuDNN attention's plans, whatever they ask). A call whose need
 * exceeds ctx->workspace_bytes returns FSDP_ERR_RANGE. The classifier's logits are not workspace:
 * the caller passes that scratch buffer. */
#define OPS_CUDA_WORKSPACE_MIN ((size_t)32 << 20)

/* ---- encoder: out[b,t,:] = wte[inp[b,t],:] + wpe[pos,:]; wpe NULL: no positions (Llama) ----
 * pos = t, or with documents SEG (device memory, NULL: one per row) t − seg[b·T + t] (ops/docmask.h). */
fsdp_status ops_cuda_encoder_forward(ops_bf16 *out, const int *inp, const ops_bf16 *wte, const ops_bf16 *wpe, int B,
                                     int T, int C, const int32_t *seg, const ops_cuda_ctx *ctx);
/* dwte (V,C) and dwpe (T,C) fp32 +=. Deterministic: each dwte row is summed over its token's
 * occurrences in position order (a first pass links every position to the next one holding the
 * same token; needs 2·B·T ints of workspace), each dwpe element over b in order (with SEG: over the
 * tokens at that position in their documents, row by row, in position order). dwpe may be NULL.
 * dwte's row PAD gets nothing (padding_idx; −1: none). */
fsdp_status ops_cuda_encoder_backward(float *dwte, float *dwpe, const ops_bf16 *dout, const int *inp, int B, int T,
                                      int C, int pad, const int32_t *seg, const ops_cuda_ctx *ctx);

/* ---- LayerNorm over C, eps 1e-5; mean and rstd (B·T, fp32) saved for backward ---- */
fsdp_status ops_cuda_layernorm_forward(ops_bf16 *out, float *mean, float *rstd, const ops_bf16 *inp,
                                       const ops_bf16 *weight, const ops_bf16 *bias, int B, int T, int C,
                                       const ops_cuda_ctx *ctx);
/* dinp (bf16) assigned; dweight, dbias (fp32) +=. */
/* res = a + b (bf16, the residual stream), then out = LayerNorm(res) as ops_cuda_layernorm_forward, in
 * one pass over the rows (the LayerNorm reads back what it just wrote, from L1, not another pass
 * over memory): the same bits as residual_forward then layernorm_forward. res may be a. */
fsdp_status ops_cuda_residual_layernorm_forward(ops_bf16 *res, ops_bf16 *out, float *mean, float *rstd,
                                                const ops_bf16 *a, const ops_bf16 *b, const ops_bf16 *weight,
                                                const ops_bf16 *bias, int B, int T, int C, const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_layernorm_backward(ops_bf16 *dinp, float *dweight, float *dbias, const ops_bf16 *dout,
                                        const ops_bf16 *inp, const ops_bf16 *weight, const float *mean,
                                        const float *rstd, int B, int T, int C, const ops_cuda_ctx *ctx);
/* The same, accumulated into the residual stream's gradient: dres += dinp (in fp32, rounded to
 * bf16 once), as llm.c's fused backward; no separate add, no dinp buffer. */
fsdp_status ops_cuda_layernorm_backward_acc(ops_bf16 *dres, float *dweight, float *dbias, const ops_bf16 *dout,
                                            const ops_bf16 *inp, const ops_bf16 *weight, const float *mean,
                                            const float *rstd, int B, int T, int C, const ops_cuda_ctx *ctx);

/* ---- Conv1D matmul (Hugging Face layout: weight [C, OC], out = inp @ weight + bias) ----
 * cuBLASLt, bf16 operands, fp32 compute. bias may be NULL. Matrices may start at any element
 * (cuBLASLt is told each pointer's alignment); keep a bias 16-byte aligned, as llm.c does (the
 * epilogue's alignment needs are not documented and were not measured here). Each call builds its
 * cuBLASLt descriptors and asks the heuristic afresh (host work of tens of µs, no caching yet).
 * pre_gelu NULL: out = inp @ weight + bias (BIAS epilogue).
 * pre_gelu non-NULL: pre_gelu = inp @ weight + bias and out = gelu_tanh(pre_gelu) (GELU_AUX_BIAS
 * epilogue: cuBLASLt's GELU is the tanh approximation; when the library offers no algorithm for
 * that epilogue, a BIAS GEMM into pre_gelu plus ops_cuda_gelu_forward gives the same function). */
fsdp_status ops_cuda_matmul_forward(ops_bf16 *out, ops_bf16 *pre_gelu, const ops_bf16 *inp, const ops_bf16 *weight,
                                    const ops_bf16 *bias, int BT, int C, int OC, const ops_cuda_ctx *ctx);
/* dweight (fp32, C×OC) += inpᵀ @ dout (cuBLASLt, beta 1), dbias (fp32) += column sums of dout by a
 * deterministic two-pass reduction (64·OC floats of workspace), then dinp (bf16, assigned) = dout @
 * weightᵀ; when pre_gelu is non-NULL, dinp = (dout @ weightᵀ)·gelu'(pre_gelu), the backward of a GELU
 * fused into the PREVIOUS matmul's forward (pre_gelu its saved pre-activation, (BT, C) like dinp),
 * in the GEMM's DGELU epilogue (gelu' on the fp32 product, one rounding), or, where cuBLASLt has no
 * algorithm for it, a plain GEMM and an elementwise kernel. dinp may be inp (the weight gradient is
 * taken first). dinp and dbias may be NULL. */
fsdp_status ops_cuda_matmul_backward(ops_bf16 *dinp, float *dweight, float *dbias, const ops_bf16 *dout,
                                     const ops_bf16 *inp, const ops_bf16 *weight, const ops_bf16 *pre_gelu, int BT,
                                     int C, int OC, const ops_cuda_ctx *ctx);

/* ---- fused causal self-attention (flash-attention style; no T×T matrix in memory) ----
 * qkv (B,T,C + 2·NKV·hs), hs = C/NH: q (NH heads, head h at columns h·hs), then k and v (NKV heads
 * each, kv head g at C + g·hs and C + (NKV + g)·hs); NKV = NH is Hugging Face's c_attn (B,T,3C).
 * Grouped-query attention: query head h reads kv head h / (NH/NKV); NKV must divide NH (else
 * FSDP_ERR_INVALID). out (B,T,C); lse (B,NH,T) fp32: each query row's log-sum-exp of its scaled scores,
 * saved for backward. Scale 1/sqrt(hs). hs must be 64 or 128 (else FSDP_ERR_UNSUPPORTED).
 * Three implementations with the same outputs (interchangeable even between forward and backward):
 * OPS_ATTN_CUDNN, cuDNN's fused flash attention (ops_cuda_cudnn.h: libcudnn opened at run time, the
 * GPU node's own), the default; OPS_ATTN_TC, tensor cores through WMMA (bf16 operands, fp32
 * accumulation; ops_cuda_attention_tc.cu), which runs whenever cuDNN cannot (no library, no engine
 * for the shape, a workspace too small: one log line says why); OPS_ATTN_FMA, plain fp32 FMAs on
 * shared-memory tiles (ops_cuda_attention.cu), the reference. ops_cuda_attention_select picks one for
 * the whole process; before any call, the environment variable FSDP_CUDA_ATTN=cudnn|tc|fma does.
 * cuDNN saves the same state: its softmax statistics are the natural-log LSE, fp32 (B,NH,T); its
 * plans' own workspace comes from ctx->workspace (where a plan needs more, the tensor cores run).
 * cuDNN's dQ accumulation is not promised to be bit-reproducible from run to run; FSDP_CUDA_ATTN=tc
 * is.
 * Documents SEG (device memory, NULL: one per row) and a sliding WINDOW (0: none) restrict query t
 * to keys [lo, t] (ops/docmask.h). cuDNN's graph expresses the window (a second mask, the band's
 * left bound); documents it does not, so with cuDNN selected a call with SEG runs the tensor-core
 * kernels (the FMA ones when chosen, or for pointers off 16 bytes; logged once); both skip every
 * key tile no query of a query tile sees (docs/gpu.md). */
typedef enum ops_attn_impl { OPS_ATTN_TC = 0, OPS_ATTN_FMA = 1, OPS_ATTN_CUDNN = 2 } ops_attn_impl;
void ops_cuda_attention_select(ops_attn_impl impl);
ops_attn_impl ops_cuda_attention_selected(void);
/* What the last forward (backward = 0) or backward call ran (OPS_ATTN_TC after a fallback from
 * cuDNN; −1 before any call), and into buf the reason of the last fallback ("" if none): for reports. */
ops_attn_impl ops_cuda_attention_ran(int backward);
void ops_cuda_attention_note(char *buf, size_t n);
fsdp_status ops_cuda_attention_forward(ops_bf16 *out, float *lse, const ops_bf16 *qkv, int B, int T, int C, int NH,
                                       int NKV, const int32_t *seg, int window, const ops_cuda_ctx *ctx);
/* dqkv (B,T,C + 2·NKV·hs) bf16 assigned, from dout, the forward's qkv, out and lse. Recomputes the
 * scores. scratch: B·NH·T·(hs + 1) floats (plan_attention_scratch_floats), 256-byte aligned: the
 * dO·O row sums, and cuDNN's fp32 dQ accumulator. Tensor cores and FMA: deterministic (dk/dv and dq
 * by two kernels, no atomics; a shared kv head's dk/dv summed over its query heads in head order by
 * one block). */
fsdp_status ops_cuda_attention_backward(ops_bf16 *dqkv, float *scratch, const ops_bf16 *dout, const ops_bf16 *qkv,
                                        const ops_bf16 *out, const float *lse, int B, int T, int C, int NH,
                                        int NKV, const int32_t *seg, int window, const ops_cuda_ctx *ctx);

/* ---- elementwise (bf16 storage, fp32 math) ---- */
fsdp_status ops_cuda_gelu_forward(ops_bf16 *out, const ops_bf16 *inp, int64_t N, const ops_cuda_ctx *ctx);
/* dinp = gelu'(inp)·dout; dinp may equal dout (in place). */
fsdp_status ops_cuda_gelu_backward(ops_bf16 *dinp, const ops_bf16 *inp, const ops_bf16 *dout, int64_t N,
                                   const ops_cuda_ctx *ctx);
/* out = a + b; out may equal a or b. */
fsdp_status ops_cuda_residual_forward(ops_bf16 *out, const ops_bf16 *a, const ops_bf16 *b, int64_t N,
                                      const ops_cuda_ctx *ctx);

/* LoRA's products (device.h's gemm): row-major C[M×N] = alpha·op(A)·op(B) + beta·C with leading
 * dimensions, op(X) = Xᵀ where tX; A and B bf16, C bf16 or (C_F32) fp32, beta 0 or 1; one cuBLASLt
 * GEMM, fp32 compute. */
fsdp_status ops_cuda_gemm(int ta, int tb, int M, int N, int K, float alpha, const ops_bf16 *A, int64_t lda,
                          const ops_bf16 *B, int64_t ldb, float beta, void *C, int64_t ldc, int c_f32,
                          const ops_cuda_ctx *ctx);
/* ---- Llama's operators (ops_cuda_llama.cu) ----
 * linear: nn.Linear, weight [OC, C] (out, in), through cuBLASLt (bf16 operands, fp32 compute): out
 * (BT,OC) = inp·weightᵀ + bias (bias (OC) bf16, NULL: none; cuBLASLt's BIAS epilogue, or the plain
 * GEMM and a bias kernel where it has no algorithm for it, as matmul_forward). Backward: dinp (BT,C)
 * = dout·weight (assigned; may be NULL), dweight (fp32, OC×C) += doutᵀ·inp (cuBLASLt, beta 1),
 * dbias (fp32, OC; NULL: none) += column sums of dout (matmul_backward's deterministic two-pass sum,
 * 64·OC floats of workspace). */
fsdp_status ops_cuda_linear_forward(ops_bf16 *out, const ops_bf16 *inp, const ops_bf16 *weight, const ops_bf16 *bias,
                                    int BT, int C, int OC, const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_linear_backward(ops_bf16 *dinp, float *dweight, float *dbias, const ops_bf16 *dout,
                                     const ops_bf16 *inp, const ops_bf16 *weight, int BT, int C, int OC,
                                     const ops_cuda_ctx *ctx);
/* RMSNorm over C (ops/rmsnorm.h): out = inp·rstd·(woff + weight), the scale in fp32 (WOFF 0: Llama's
 * norms, 1: Gemma's), rstd (BT, fp32) saved. Backward: dinp assigned (_acc: dres += dinp, rounded to
 * bf16 once), dweight (fp32) += by a deterministic column sum (64·C floats and C/16 ints of workspace). */
fsdp_status ops_cuda_rmsnorm_forward(ops_bf16 *out, float *rstd, const ops_bf16 *inp, const ops_bf16 *weight, int BT,
                                     int C, float eps, float woff, const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_rmsnorm_backward(ops_bf16 *dinp, float *dweight, const ops_bf16 *dout, const ops_bf16 *inp,
                                      const ops_bf16 *weight, const float *rstd, int BT, int C, float woff,
                                      const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_rmsnorm_backward_acc(ops_bf16 *dres, float *dweight, const ops_bf16 *dout, const ops_bf16 *inp,
                                          const ops_bf16 *weight, const float *rstd, int BT, int C, float woff,
                                          const ops_cuda_ctx *ctx);
/* Rotary embeddings, Hugging Face's rotate-half (ops/rope.h), in place on the NH q and NKV k heads
 * of a (B,T,(NH + 2·NKV)·HS) qkv buffer, with the frequencies of ROPE (read at the call, passed to
 * the kernel by value); v untouched. The backward rotates dq, dk back in place.
 * An odd HS is FSDP_ERR_INVALID. SEG (device memory, NULL: one document per row): positions restart
 * in each document (ops/docmask.h). */
fsdp_status ops_cuda_rope_forward(ops_bf16 *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                                  const int32_t *seg, const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_rope_backward(ops_bf16 *dqkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *rope,
                                   const int32_t *seg, const ops_cuda_ctx *ctx);
/* The gated MLP activation (ops/gated.h; ops_cuda_gated.cu, one kernel template for both): gu
 * (BT, 2F) holds gate then up per row; out (BT, F) = act(gate)·up; dgu (BT, 2F) assigned.
 * SwiGLU: act = silu (Llama). */
fsdp_status ops_cuda_swiglu_forward(ops_bf16 *out, const ops_bf16 *gu, int BT, int F, const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_swiglu_backward(ops_bf16 *dgu, const ops_bf16 *gu, const ops_bf16 *dout, int BT, int F,
                                     const ops_cuda_ctx *ctx);
/* GeGLU: act = gelu_tanh (Gemma). */
fsdp_status ops_cuda_geglu_forward(ops_bf16 *out, const ops_bf16 *gu, int BT, int F, const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_geglu_backward(ops_bf16 *dgu, const ops_bf16 *gu, const ops_bf16 *dout, int BT, int F,
                                    const ops_cuda_ctx *ctx);

/* ---- the Llama family beyond Llama (ops_cuda_family.cu) ----
 * Qwen3's q_norm / k_norm (ops_cpu.h qk_norm_forward): RMSNorm over each of the NH q heads (weight
 * wq [HD]) and NKV k heads (wk) of HD channels of a (BT, (NH + 2·NKV)·HD) qkv buffer, one warp per
 * head; v copied; rstd (BT, NH + NKV) fp32 saved. out may be inp. Backward: dinp assigned (may be
 * dout: every warp reads its head before it writes it), dwq and dwk (fp32) += by a deterministic
 * two-pass sum over fixed slices of the BT·NH (BT·NKV) head rows (64·HD floats of workspace each).
 * WOFF: the weight's offset, as ops_cuda_rmsnorm_forward's (Gemma 3: 1). */
fsdp_status ops_cuda_qk_norm_forward(ops_bf16 *out, float *rstd, const ops_bf16 *inp, const ops_bf16 *wq,
                                     const ops_bf16 *wk, int BT, int NH, int NKV, int HD, float eps, float woff,
                                     const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_qk_norm_backward(ops_bf16 *dinp, float *dwq, float *dwk, const ops_bf16 *dout, const ops_bf16 *inp,
                                      const ops_bf16 *wq, const ops_bf16 *wk, const float *rstd, int BT, int NH,
                                      int NKV, int HD, float woff, const ops_cuda_ctx *ctx);

/* ---- fused tied classifier: logits, softmax, cross-entropy, its gradient, and the head's backward ----
 * inp (BT,C) bf16 (ln_f's output), wte (V,C) bf16: only rows [0, V) are read, so a buffer padded
 * to more rows works and its padding never matters; targets (BT) ints.
 * The GEMMs run over the padded vocabulary Vp = V rounded up to a multiple of 128 (llm.c's): when V
 * is not one, the call copies wte into a Vp-row buffer of its scratch with zero rows [V, Vp), and
 * computes dwte over Vp rows there, adding rows [V) into the caller's (ops_cuda_classifier.cu).
 * Rows go in chunks of `chunk` rows (plan_classifier_chunk: all of them where they fit). Per chunk:
 * logits (bf16, Vp columns, row stride Vp) = inp_chunk @ headᵀ (cuBLASLt); ops_cuda_xent_inplace
 * computes each row's loss over the V real columns and overwrites them IN PLACE with dlogits =
 * dscale·(softmax − onehot) in bf16 (the pad columns hold 0, the zero rows' logits, and stay 0);
 * then dinp_chunk (bf16, assigned) = dlogits @ head and dwte (fp32, rows [0,V) only) += dlogitsᵀ @
 * inp_chunk, accumulated by the GEMM (beta = 1). losses (BT) fp32 assigned: −log softmax[target];
 * target XENT_NO_TARGET (−1, an untrained token) loss 0 and gradient 0; any other target outside
 * [0, V) gives a NaN loss and a gradient of dscale·softmax (as on the CPU). dscale is the runtime's
 * 1/(tokens of the step), whose mean over the trained tokens the optimizer's gradient scale
 * completes (runtime.c).
 * dinp and dwte both NULL: forward only (losses; evaluation); dwte alone NULL: a frozen head ([lora]),
 * the losses and dinp, no dwte GEMM.
 * logits_scratch: ops_cuda_classifier_scratch_bytes(chunk, V, C) bytes = chunk·Vp·2, plus Vp·C·6
 * (the padded head, bf16, and its fp32 gradient) when Vp ≠ V (GPT-2, chunk 16384: 1.65 GB + 232 MB;
 * Llama 3, V = 128256 = 1002·128: chunk·Vp·2 alone). */
size_t ops_cuda_classifier_scratch_bytes(int chunk, int V, int C);
fsdp_status ops_cuda_classifier_forward_backward(float *losses, ops_bf16 *dinp, float *dwte, void *logits_scratch,
                                                 const ops_bf16 *inp, const ops_bf16 *wte, const int *targets,
                                                 int BT, int C, int V, int chunk, float dscale,
                                                 const ops_cuda_ctx *ctx);
/* The classifier's row kernel alone: n rows of bf16 logits (V columns, row stride ld): losses (n)
 * assigned, each row overwritten by its dlogits as above. One block per row, two reads of the row
 * (the second mostly from L2) and one write, 128-bit where the rows are 16-byte aligned. */
fsdp_status ops_cuda_xent_inplace(ops_bf16 *logits, float *losses, const int *targets, int n, int V, int64_t ld,
                                  float dscale, const ops_cuda_ctx *ctx);

/* ---- AdamW over a flat fp32 shard, in one kernel ----
 * Exactly optim_adamw_shard's update (worker/model/optim.h, torch.optim.AdamW) with the per-step
 * constants that ops_cuda_adamw_consts computes on the host in double. Element i decays (θ·(1 −
 * lr·wd)) when it lies in one of the nseg [start, end) ranges of decay_segs (a DEVICE array of
 * 2·nseg int64, sorted, disjoint; the caller builds it from the plan: the 2-D tensors' parts of
 * this shard). Every element in [0, n) is updated: padding must carry zero gradients (it then
 * stays unchanged). When param_bf16 is non-NULL, it receives the updated parameters rounded to
 * bf16 (nearest even) in the same pass. */
typedef struct ops_cuda_adamw_consts_t {
  float beta1, beta2, eps;
  float step_size;    /* lr / (1 − β1^t) */
  float bc2_sqrt;     /* sqrt(1 − β2^t) */
  float decay;        /* 1 − lr·weight_decay */
  float grad_scale;   /* multiplies every gradient first (the clip factor) */
} ops_cuda_adamw_consts_t;
ops_cuda_adamw_consts_t ops_cuda_adamw_consts(int step, double lr, double beta1, double beta2, double eps,
                                              double weight_decay, float grad_scale);
fsdp_status ops_cuda_adamw(float *param, ops_bf16 *param_bf16, float *m, float *v, const float *grad, int64_t n,
                           const int64_t *decay_segs, int nseg, const ops_cuda_adamw_consts_t *k,
                           const ops_cuda_ctx *ctx);

/* ---- utilities ---- */
fsdp_status ops_cuda_fill_f32(float *dst, float value, int64_t n, const ops_cuda_ctx *ctx);
/* Round to nearest even; NaN stays NaN (bit-identical to f32_to_bf16 in worker/ops/bf16.h). */
fsdp_status ops_cuda_cast_f32_to_bf16(ops_bf16 *dst, const float *src, int64_t n, const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_cast_bf16_to_f32(float *dst, const ops_bf16 *src, int64_t n, const ops_cuda_ctx *ctx);
/* OUT (n bf16) = the NF4 record REC (nf4.h: codes n/2, scale codes n/64, group scales, offset; at any
 * byte address) dequantized, bit-identical to nf4_record_dequantize_bf16; MAPS: nf4_code's 16 values,
 * then the 256 of the dynamic map (nf4_dynamic), in device memory. n a multiple of NF4_BLOCK (else
 * FSDP_ERR_INVALID). */
fsdp_status ops_cuda_nf4_dequantize(ops_bf16 *out, const uint8_t *rec, const float *maps, int64_t n,
                                    const ops_cuda_ctx *ctx);
/* dst += src */
fsdp_status ops_cuda_accumulate_f32(float *dst, const float *src, int64_t n, const ops_cuda_ctx *ctx);
/* dst[r·dld + c] = alpha·src[r·sld + c] + beta·dst[r·dld + c] over ROWS × COLS bf16 (device.h's act_axpby). */
fsdp_status ops_cuda_act_axpby(ops_bf16 *dst, int64_t dld, const ops_bf16 *src, int64_t sld, int64_t rows,
                               int64_t cols, float alpha, float beta, const ops_cuda_ctx *ctx);
fsdp_status ops_cuda_accumulate_bf16(float *dst, const ops_bf16 *src, int64_t n, const ops_cuda_ctx *ctx);
/* *sumsq (one device float) = Σ x², summed in double in a fixed order (1024 fixed partial slices,
 * then one block; no atomics; 1024 doubles of workspace); *nonfinite (one device int) = 1 when
 * some x is inf or NaN, else 0. Both assigned. */
fsdp_status ops_cuda_sumsq(float *sumsq, int *nonfinite, const float *x, int64_t n, const ops_cuda_ctx *ctx);
/* *acc (one device float) += Σ losses[0..n), summed in double in a fixed order by one block. */
fsdp_status ops_cuda_loss_sum(float *acc, const float *losses, int n, const ops_cuda_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif
