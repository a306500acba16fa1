/* ops_cpu — the GPT-2 operators on the CPU, in fp32: the readable reference that the CUDA
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

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] */
void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);

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

/* Causal multi-head self-attention. qkv is (B,T,3C) as Hugging Face's c_attn produces it
 * (q, k, v each C wide, head h at columns h*C/NH); att is (B,NH,T,T) softmax probabilities
 * (entries above the diagonal are 0), saved for backward; out is (B,T,C). Scale 1/sqrt(C/NH).
 * datt is (B,NH,T,T) scratch for backward. */
void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                        int B, int T, int C, int NH);

/* GELU, tanh approximation. */
void gelu_forward(float *out, const float *inp, int N);
void gelu_backward(float *dinp, const float *inp, const float *dout, int N);

/* out = a + b. Backward of a residual is the identity: the caller reuses dout. */
void residual_forward(float *out, const float *a, const float *b, int N);

/* The tied output head: logits[n,v] = Σ_c inp[n,c]·wte[v,c]; wte is [V,C]. */
void classifier_forward(float *logits, const float *inp, const float *wte, int BT, int C, int V);
void classifier_backward(float *dinp, float *dwte, const float *dlogits, const float *inp, const float *wte,
                         int BT, int C, int V);

/* Fused softmax + cross-entropy, in place: on entry `logits` holds (BT,V) logits; on return it holds
 * dlogits = dscale·(softmax − onehot(target)), and losses[n] = −log softmax[target[n]].
 * Returns Σ losses (double). dscale is usually 1/(all tokens of all ranks and micro-steps). */
double softmax_xent_forward_backward(float *logits, float *losses, const int *targets, int BT, int V, float dscale);

/* When OpenBLAS runs kernels far below what this CPU supports (see ops_cpu.c), the
 * OPENBLAS_CORETYPE value that fixes it ("SkylakeX", "Haswell"); NULL when the kernels are fine. */
const char *ops_cpu_blas_better_core(void);

#endif
