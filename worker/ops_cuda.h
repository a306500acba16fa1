/* ops_cuda — the GPT-2 operators on an NVIDIA GPU, in fp32: the twins of ops_cpu.h, which stays the
 * specification. Every function takes the same arguments in the same order as its CPU twin, all
 * pointers are DEVICE pointers, and a cudaStream_t (plus a cublasHandle_t for the matmuls, which this
 * module binds to that stream) comes last. Same conventions: backward ACCUMULATES into parameter
 * gradients (+=) and ASSIGNS activation gradients (=); buffers never alias. The scalar formulas come
 * from the headers in worker/ops/, compiled for both backends.
 *
 * Calls only enqueue work: they return FSDP_ERR_CUDA (with cudaGetErrorString's or cuBLAS' text)
 * when a launch or a cuBLAS call is refused; a fault while the kernel runs surfaces at the next
 * synchronizing call. Results are deterministic (no atomics). Any host thread may call them, one
 * thread per cublasHandle_t at a time.
 *
 * Compiled only when the CUDA backend is built (FSDP_HAVE_CUDA).
 */
#ifndef FSDP_OPS_CUDA_H
#define FSDP_OPS_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "err.h" /* a C header without extern "C" guards of its own */

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] */
fsdp_status ops_cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                                     int C, cudaStream_t stream);
fsdp_status ops_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                                      int C, cudaStream_t stream);

/* LayerNorm over C, eps 1e-5; mean and rstd (B*T) saved for backward. */
fsdp_status ops_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                       const float *bias, int B, int T, int C, cudaStream_t stream);
fsdp_status ops_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                        const float *inp, const float *weight, const float *mean,
                                        const float *rstd, int B, int T, int C, cudaStream_t stream);

/* Conv1D, weight [C, OC]; bias may be NULL. In backward, dinp and dbias may be NULL (not wanted). */
fsdp_status ops_cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int BT,
                                    int C, int OC, cublasHandle_t blas, cudaStream_t stream);
fsdp_status ops_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *weight, int BT, int C, int OC,
                                     cublasHandle_t blas, cudaStream_t stream);

/* Causal self-attention; qkv (B,T,3C), att and datt (B,NH,T,T), out (B,T,C). C % NH == 0 and
 * (T + C/NH) floats must fit in 48 KiB of shared memory (T up to ~12000). */
fsdp_status ops_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                       cudaStream_t stream);
fsdp_status ops_cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                                        const float *att, int B, int T, int C, int NH, cudaStream_t stream);

fsdp_status ops_cuda_gelu_forward(float *out, const float *inp, int N, cudaStream_t stream);
fsdp_status ops_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, int N, cudaStream_t stream);
fsdp_status ops_cuda_residual_forward(float *out, const float *a, const float *b, int N, cudaStream_t stream);

/* Tied head, wte [V, C]. */
fsdp_status ops_cuda_classifier_forward(float *logits, const float *inp, const float *wte, int BT, int C, int V,
                                        cublasHandle_t blas, cudaStream_t stream);
fsdp_status ops_cuda_classifier_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                                         const float *wte, int BT, int C, int V, cublasHandle_t blas,
                                         cudaStream_t stream);

/* Fused softmax + cross-entropy in place, as on the CPU. The losses (BT) stay on the device, since
 * returning their sum would force a synchronization: ops_cuda_loss_sum adds them when wanted. */
fsdp_status ops_cuda_softmax_xent_forward_backward(float *logits, float *losses, const int *targets, int BT, int V,
                                                   float dscale, cudaStream_t stream);
/* *sum (one device double) = Σ losses[0..N), in a fixed order (deterministic). */
fsdp_status ops_cuda_loss_sum(double *sum, const float *losses, int N, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
