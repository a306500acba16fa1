/* ops_cuda — CUDA kernels for the GPT-2 operators (see ops_cuda.h; ops_cpu.c is the specification).
 *
 * Kept deliberately plain: one thread per element for elementwise ops, one warp per row for
 * LayerNorm, one block per query row for attention, one block per row for the softmax, cuBLAS for
 * every matmul. Parameter-gradient reductions are split by output column exactly as on the CPU (no
 * atomics), so results are deterministic. The scalar math is in ops/gelu.h, ops/layernorm.h and
 * ops/softmax.h, shared with the CPU.
 */
#include "ops_cuda.h"

#include <math.h>

#include "ops/exp.h"
#include "ops/gelu.h"
#include "ops/layernorm.h"
#include "ops/softmax.h"

#define LAUNCH_CHECK(what)                                                                         \
  do {                                                                                             \
    cudaError_t e_ = cudaGetLastError();                                                           \
    if (e_ != cudaSuccess)                                                                         \
      return fsdp_set_error(FSDP_ERR_CUDA, "%s: launch (or an earlier kernel) failed: %s", (what),    \
                            cudaGetErrorString(e_));                                               \
  } while (0)

#define BLAS_CHECK(call, what)                                                                     \
  do {                                                                                             \
    cublasStatus_t s_ = (call);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                               \
      return fsdp_set_error(FSDP_ERR_CUDA, "%s: cuBLAS: %s", (what), cublasGetStatusString(s_));  \
  } while (0)

static const int kThreads = 256;

static unsigned blocks_for(long long n, int threads) { return (unsigned)((n + threads - 1) / threads); }

/* ---- block reductions (every thread gets the result; blockDim.x a multiple of 32, ≤ 1024) ---- */

template <typename F> __device__ F warp_sum(F v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* scratch: 32 elements of shared memory, not used by the caller between the two __syncthreads. */
template <typename F> __device__ F block_sum(F v, F *scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads(); /* scratch may still be read from a previous reduction */
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : (F)0;
  return warp_sum(v);
}
__device__ float block_max(float v, float *scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

/* ---- encoder ---- */

__global__ void encoder_forward_kernel(float *__restrict__ out, const int *__restrict__ inp,
                                       const float *__restrict__ wte, const float *__restrict__ wpe, int B, int T,
                                       int C) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)B * T * C) return;
  int c = (int)(i % C);
  long long bt = i / C;
  int t = (int)(bt % T);
  out[i] = wte[(long long)inp[bt] * C + c] + wpe[(long long)t * C + c];
}

/* Threads [0, T·C) each own one dwpe element (sum over b); threads [T·C, T·C + C) each own one
 * channel of dwte and walk the tokens in order, since repeated tokens add into the same row. */
__global__ void encoder_backward_kernel(float *__restrict__ dwte, float *__restrict__ dwpe,
                                        const float *__restrict__ dout, const int *__restrict__ inp, int B, int T,
                                        int C) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long TC = (long long)T * C;
  if (i < TC) {
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += dout[(long long)b * TC + i];
    dwpe[i] += s;
  } else if (i < TC + C) {
    int c = (int)(i - TC);
    for (long long bt = 0; bt < (long long)B * T; bt++) dwte[(long long)inp[bt] * C + c] += dout[bt * C + c];
  }
}

fsdp_status ops_cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                                     int C, cudaStream_t stream) {
  long long n = (long long)B * T * C;
  if (n <= 0) return FSDP_OK;
  encoder_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(out, inp, wte, wpe, B, T, C);
  LAUNCH_CHECK("encoder_forward");
  return FSDP_OK;
}

fsdp_status ops_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                                      int C, cudaStream_t stream) {
  long long n = (long long)T * C + C;
  if ((long long)B * T * C <= 0) return FSDP_OK;
  encoder_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dwte, dwpe, dout, inp, B, T, C);
  LAUNCH_CHECK("encoder_backward");
  return FSDP_OK;
}

/* ---- layernorm: one warp per row ---- */

__global__ void layernorm_forward_kernel(float *__restrict__ out, float *__restrict__ mean, float *__restrict__ rstd,
                                         const float *__restrict__ inp, const float *__restrict__ weight,
                                         const float *__restrict__ bias, int R, int C) {
  int lane = threadIdx.x % 32;
  long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= R) return;
  const float *x = inp + r * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  float m = warp_sum(s) / (float)C;
  float v = 0.0f; /* two passes, as on the CPU */
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  float rs = layernorm_rstd(warp_sum(v) / (float)C);
  float *o = out + r * C;
  for (int c = lane; c < C; c += 32) o[c] = layernorm_norm(x[c], m, rs) * weight[c] + bias[c];
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

__global__ void layernorm_dinp_kernel(float *__restrict__ dinp, const float *__restrict__ dout,
                                      const float *__restrict__ inp, const float *__restrict__ weight,
                                      const float *__restrict__ mean, const float *__restrict__ rstd, int R, int C) {
  int lane = threadIdx.x % 32;
  long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= R) return;
  const float *x = inp + r * C, *d = dout + r * C;
  float m = mean[r], rs = rstd[r];
  float g_sum = 0.0f, gn_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float g = weight[c] * d[c];
    g_sum += g;
    gn_sum += g * layernorm_norm(x[c], m, rs);
  }
  float g_mean = warp_sum(g_sum) / (float)C, gn_mean = warp_sum(gn_sum) / (float)C;
  float *dx = dinp + r * C;
  for (int c = lane; c < C; c += 32)
    dx[c] = layernorm_dinp(weight[c] * d[c], layernorm_norm(x[c], m, rs), g_mean, gn_mean, rs);
}

/* Column reductions: a (32 × COLSUM_ROWS) block owns 32 channels; thread row y sums rows y,
 * y + COLSUM_ROWS, ...; the partial sums are added in a fixed order. */
#define COLSUM_ROWS 16

__global__ void layernorm_dparams_kernel(float *__restrict__ dweight, float *__restrict__ dbias,
                                         const float *__restrict__ dout, const float *__restrict__ inp,
                                         const float *__restrict__ mean, const float *__restrict__ rstd, int R,
                                         int C) {
  __shared__ float sw[COLSUM_ROWS][32], sb[COLSUM_ROWS][32];
  int c = blockIdx.x * 32 + threadIdx.x;
  float w = 0.0f, b = 0.0f;
  if (c < C)
    for (int r = threadIdx.y; r < R; r += COLSUM_ROWS) {
      float d = dout[(long long)r * C + c];
      w += d * layernorm_norm(inp[(long long)r * C + c], mean[r], rstd[r]);
      b += d;
    }
  sw[threadIdx.y][threadIdx.x] = w;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int y = 1; y < COLSUM_ROWS; y++) {
      w += sw[y][threadIdx.x];
      b += sb[y][threadIdx.x];
    }
    dweight[c] += w;
    dbias[c] += b;
  }
}

fsdp_status ops_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                       const float *bias, int B, int T, int C, cudaStream_t stream) {
  int R = B * T, rows_per_block = kThreads / 32;
  if (R <= 0 || C <= 0) return FSDP_OK;
  layernorm_forward_kernel<<<blocks_for(R, rows_per_block), kThreads, 0, stream>>>(out, mean, rstd, inp, weight,
                                                                                   bias, R, C);
  LAUNCH_CHECK("layernorm_forward");
  return FSDP_OK;
}

fsdp_status ops_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                        const float *inp, const float *weight, const float *mean,
                                        const float *rstd, int B, int T, int C, cudaStream_t stream) {
  int R = B * T, rows_per_block = kThreads / 32;
  if (R <= 0 || C <= 0) return FSDP_OK;
  layernorm_dinp_kernel<<<blocks_for(R, rows_per_block), kThreads, 0, stream>>>(dinp, dout, inp, weight, mean,
                                                                                rstd, R, C);
  LAUNCH_CHECK("layernorm_backward (dinp)");
  layernorm_dparams_kernel<<<blocks_for(C, 32), dim3(32, COLSUM_ROWS), 0, stream>>>(dweight, dbias, dout, inp,
                                                                                    mean, rstd, R, C);
  LAUNCH_CHECK("layernorm_backward (dweight, dbias)");
  return FSDP_OK;
}

/* ---- matmul and classifier through cuBLAS ----
 * cuBLAS is column-major: a row-major (m, n) matrix is its column-major transpose, so every
 * row-major product Y = X·W is computed as Yᵀ = Wᵀ·Xᵀ. */

__global__ void bias_fill_kernel(float *__restrict__ out, const float *__restrict__ bias, int BT, int OC) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (long long)BT * OC) out[i] = bias[i % OC];
}

__global__ void colsum_kernel(float *__restrict__ acc, const float *__restrict__ m, int rows, int cols) {
  __shared__ float s[COLSUM_ROWS][32];
  int c = blockIdx.x * 32 + threadIdx.x;
  float v = 0.0f;
  if (c < cols)
    for (int r = threadIdx.y; r < rows; r += COLSUM_ROWS) v += m[(long long)r * cols + c];
  s[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int y = 1; y < COLSUM_ROWS; y++) v += s[y][threadIdx.x];
    acc[c] += v;
  }
}

fsdp_status ops_cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int BT,
                                    int C, int OC, cublasHandle_t blas, cudaStream_t stream) {
  if (BT <= 0 || OC <= 0) return FSDP_OK;
  const float one = 1.0f, zero = 0.0f;
  if (bias) {
    bias_fill_kernel<<<blocks_for((long long)BT * OC, kThreads), kThreads, 0, stream>>>(out, bias, BT, OC);
    LAUNCH_CHECK("matmul_forward (bias)");
  }
  BLAS_CHECK(cublasSetStream(blas, stream), "matmul_forward");
  /* outᵀ[OC,BT] (+)= weightᵀ[OC,C] · inpᵀ[C,BT] */
  BLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, OC, BT, C, &one, weight, OC, inp, C, bias ? &one : &zero,
                         out, OC),
             "matmul_forward");
  return FSDP_OK;
}

fsdp_status ops_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *weight, int BT, int C, int OC,
                                     cublasHandle_t blas, cudaStream_t stream) {
  if (BT <= 0 || C <= 0 || OC <= 0) return FSDP_OK;
  const float one = 1.0f, zero = 0.0f;
  BLAS_CHECK(cublasSetStream(blas, stream), "matmul_backward");
  /* dinpᵀ[C,BT] = weight[C,OC] · doutᵀ[OC,BT] */
  if (dinp)
    BLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, C, BT, OC, &one, weight, OC, dout, OC, &zero, dinp, C),
               "matmul_backward (dinp)");
  /* dweightᵀ[OC,C] += doutᵀ[OC,BT] · inp[BT,C] */
  BLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, BT, &one, dout, OC, inp, C, &one, dweight, OC),
             "matmul_backward (dweight)");
  if (dbias) {
    colsum_kernel<<<blocks_for(OC, 32), dim3(32, COLSUM_ROWS), 0, stream>>>(dbias, dout, BT, OC);
    LAUNCH_CHECK("matmul_backward (dbias)");
  }
  return FSDP_OK;
}

fsdp_status ops_cuda_classifier_forward(float *logits, const float *inp, const float *wte, int BT, int C, int V,
                                        cublasHandle_t blas, cudaStream_t stream) {
  if (BT <= 0 || V <= 0) return FSDP_OK;
  const float one = 1.0f, zero = 0.0f;
  BLAS_CHECK(cublasSetStream(blas, stream), "classifier_forward");
  /* logitsᵀ[V,BT] = wte[V,C] · inpᵀ[C,BT] */
  BLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, V, BT, C, &one, wte, C, inp, C, &zero, logits, V),
             "classifier_forward");
  return FSDP_OK;
}

fsdp_status ops_cuda_classifier_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                                         const float *wte, int BT, int C, int V, cublasHandle_t blas,
                                         cudaStream_t stream) {
  if (BT <= 0 || C <= 0 || V <= 0) return FSDP_OK;
  const float one = 1.0f, zero = 0.0f;
  BLAS_CHECK(cublasSetStream(blas, stream), "classifier_backward");
  /* dinpᵀ[C,BT] = wteᵀ[C,V] · dlogitsᵀ[V,BT] */
  BLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, BT, V, &one, wte, C, dlogits, V, &zero, dinp, C),
             "classifier_backward (dinp)");
  /* dwteᵀ[C,V] += inpᵀ[C,BT] · dlogits[BT,V] */
  BLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, V, BT, &one, inp, C, dlogits, V, &one, dwte, C),
             "classifier_backward (dwte)");
  return FSDP_OK;
}

/* ---- attention: one block per (t, h, b) query row ---- */

static const int kAttnThreads = 128;

/* shared: scores[T] then q[hs] */
__global__ void attention_forward_kernel(float *__restrict__ out, float *__restrict__ att,
                                         const float *__restrict__ qkv, int T, int C, int NH) {
  extern __shared__ float sh[];
  __shared__ float red[32];
  int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = C / NH;
  long long C3 = 3LL * C;
  float *sc = sh, *q = sh + T;
  const float *base = qkv + (long long)b * T * C3 + (long long)h * hs;
  float scale = attn_scale(hs);
  for (int i = threadIdx.x; i < hs; i += blockDim.x) q[i] = base[t * C3 + i];
  __syncthreads();
  float mx = -INFINITY;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float *k = base + t2 * C3 + C;
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += q[i] * k[i];
    s *= scale;
    sc[t2] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, red);
  float sum = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    float e = ops_expf(sc[t2] - mx);
    sc[t2] = e;
    sum += e;
  }
  float inv = 1.0f / block_sum(sum, red); /* block_sum's barriers also publish sc[] */
  float *a = att + (((long long)b * NH + h) * T + t) * T;
  for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x) {
    float p = t2 <= t ? sc[t2] * inv : 0.0f;
    if (t2 <= t) sc[t2] = p;
    a[t2] = p;
  }
  __syncthreads();
  float *o = out + ((long long)b * T + t) * C + (long long)h * hs;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += sc[t2] * base[t2 * C3 + 2LL * C + i];
    o[i] = acc;
  }
}

/* Rows: datt[t,t2] = dout_t·v_t2, turned into d(pre-softmax) in place; dq_t = scale·Σ dpre·k_t2.
 * shared: dpre[T] then dout_t[hs] */
__global__ void attention_backward_rows_kernel(float *__restrict__ dqkv, float *__restrict__ datt,
                                               const float *__restrict__ dout, const float *__restrict__ qkv,
                                               const float *__restrict__ att, int T, int C, int NH) {
  extern __shared__ float sh[];
  __shared__ float red[32];
  int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = C / NH;
  long long C3 = 3LL * C;
  float *dp = sh, *d = sh + T;
  const float *base = qkv + (long long)b * T * C3 + (long long)h * hs;
  const float *a = att + (((long long)b * NH + h) * T + t) * T;
  float *da = datt + (((long long)b * NH + h) * T + t) * T;
  float scale = attn_scale(hs);
  for (int i = threadIdx.x; i < hs; i += blockDim.x) d[i] = dout[((long long)b * T + t) * C + (long long)h * hs + i];
  __syncthreads();
  float pdp = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float *v = base + t2 * C3 + 2LL * C;
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += d[i] * v[i];
    dp[t2] = s;
    pdp += a[t2] * s;
  }
  pdp = block_sum(pdp, red);
  for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x) {
    float g = t2 <= t ? softmax_dinp(a[t2], dp[t2], pdp) : 0.0f;
    if (t2 <= t) dp[t2] = g;
    da[t2] = g;
  }
  __syncthreads();
  float *dq = dqkv + ((long long)b * T + t) * C3 + (long long)h * hs;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) acc += dp[t2] * base[t2 * C3 + C + i];
    dq[i] = acc * scale;
  }
}

/* Columns: dk_t2 = scale·Σ_{t≥t2} dpre[t,t2]·q_t; dv_t2 = Σ_{t≥t2} att[t,t2]·dout_t. */
__global__ void attention_backward_cols_kernel(float *__restrict__ dqkv, const float *__restrict__ datt,
                                               const float *__restrict__ dout, const float *__restrict__ qkv,
                                               const float *__restrict__ att, int T, int C, int NH) {
  int t2 = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = C / NH;
  long long C3 = 3LL * C;
  const float *base = qkv + (long long)b * T * C3 + (long long)h * hs;
  const float *a = att + ((long long)b * NH + h) * T * T;
  const float *da = datt + ((long long)b * NH + h) * T * T;
  float scale = attn_scale(hs);
  float *dk = dqkv + ((long long)b * T + t2) * C3 + C + (long long)h * hs;
  float *dv = dk + C;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float ak = 0.0f, av = 0.0f;
    for (int t = t2; t < T; t++) {
      ak += da[(long long)t * T + t2] * base[t * C3 + i];
      av += a[(long long)t * T + t2] * dout[((long long)b * T + t) * C + (long long)h * hs + i];
    }
    dk[i] = ak * scale;
    dv[i] = av;
  }
}

static fsdp_status attention_check(int B, int T, int C, int NH, size_t *shmem) {
  if (NH <= 0 || C % NH != 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "attention: C=%d is not a multiple of NH=%d (need C %% NH == 0)", C, NH);
  if (NH > 65535 || B > 65535)
    return fsdp_set_error(FSDP_ERR_RANGE, "attention: B=%d, NH=%d must be at most 65535", B, NH);
  *shmem = ((size_t)T + (size_t)(C / NH)) * sizeof(float);
  if (*shmem > 48 * 1024)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED,
                          "attention: T=%d plus head size %d needs %zu bytes of shared memory; at most 49152 "
                          "(T up to about 12000) is supported",
                          T, C / NH, *shmem);
  return FSDP_OK;
}

fsdp_status ops_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                       cudaStream_t stream) {
  size_t shmem;
  TRY(attention_check(B, T, C, NH, &shmem));
  if (B <= 0 || T <= 0) return FSDP_OK;
  attention_forward_kernel<<<dim3(T, NH, B), kAttnThreads, shmem, stream>>>(out, att, qkv, T, C, NH);
  LAUNCH_CHECK("attention_forward");
  return FSDP_OK;
}

fsdp_status ops_cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                                        const float *att, int B, int T, int C, int NH, cudaStream_t stream) {
  size_t shmem;
  TRY(attention_check(B, T, C, NH, &shmem));
  if (B <= 0 || T <= 0) return FSDP_OK;
  attention_backward_rows_kernel<<<dim3(T, NH, B), kAttnThreads, shmem, stream>>>(dqkv, datt, dout, qkv, att, T,
                                                                                  C, NH);
  LAUNCH_CHECK("attention_backward (rows)");
  int hs = C / NH, threads = hs < 32 ? 32 : (hs > 256 ? 256 : (hs + 31) / 32 * 32);
  attention_backward_cols_kernel<<<dim3(T, NH, B), threads, 0, stream>>>(dqkv, datt, dout, qkv, att, T, C, NH);
  LAUNCH_CHECK("attention_backward (columns)");
  return FSDP_OK;
}

/* ---- GELU, residual ---- */

__global__ void gelu_forward_kernel(float *__restrict__ out, const float *__restrict__ inp, int N) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) out[i] = gelu_tanh(inp[i]);
}

__global__ void gelu_backward_kernel(float *__restrict__ dinp, const float *__restrict__ inp,
                                     const float *__restrict__ dout, int N) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) dinp[i] = gelu_tanh_grad(inp[i]) * dout[i];
}

__global__ void residual_forward_kernel(float *__restrict__ out, const float *__restrict__ a,
                                        const float *__restrict__ b, int N) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) out[i] = a[i] + b[i];
}

fsdp_status ops_cuda_gelu_forward(float *out, const float *inp, int N, cudaStream_t stream) {
  if (N <= 0) return FSDP_OK;
  gelu_forward_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(out, inp, N);
  LAUNCH_CHECK("gelu_forward");
  return FSDP_OK;
}

fsdp_status ops_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, int N, cudaStream_t stream) {
  if (N <= 0) return FSDP_OK;
  gelu_backward_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(dinp, inp, dout, N);
  LAUNCH_CHECK("gelu_backward");
  return FSDP_OK;
}

fsdp_status ops_cuda_residual_forward(float *out, const float *a, const float *b, int N, cudaStream_t stream) {
  if (N <= 0) return FSDP_OK;
  residual_forward_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(out, a, b, N);
  LAUNCH_CHECK("residual_forward");
  return FSDP_OK;
}

/* ---- fused softmax + cross-entropy: one block per row ---- */

static const int kXentThreads = 1024;

__global__ void softmax_xent_kernel(float *__restrict__ logits, float *__restrict__ losses,
                                    const int *__restrict__ targets, int V, float dscale) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  long long r = blockIdx.x;
  float *z = logits + r * V;
  int tgt = targets[r];
  bool valid = tgt >= 0 && tgt < V;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx, redf);
  float zt = valid ? z[tgt] : 0.0f; /* read before any thread overwrites the row */
  double sum = 0.0;                 /* Σ exp in double, as on the CPU */
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)ops_expf(z[j] - mx);
  sum = block_sum(sum, redd); /* its barriers also order every zt read before the writes below */
  if (threadIdx.x == 0) losses[r] = valid ? (float)xent_loss(zt, mx, sum) : NAN;
  float inv = (float)(1.0 / sum);
  for (int j = threadIdx.x; j < V; j += blockDim.x) z[j] = xent_dlogit(ops_expf(z[j] - mx) * inv, j == tgt, dscale);
}

__global__ void loss_sum_kernel(double *sum, const float *__restrict__ losses, int N) {
  __shared__ double red[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += losses[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *sum = s;
}

fsdp_status ops_cuda_softmax_xent_forward_backward(float *logits, float *losses, const int *targets, int BT, int V,
                                                   float dscale, cudaStream_t stream) {
  if (BT <= 0 || V <= 0) return FSDP_OK;
  softmax_xent_kernel<<<BT, kXentThreads, 0, stream>>>(logits, losses, targets, V, dscale);
  LAUNCH_CHECK("softmax_xent_forward_backward");
  return FSDP_OK;
}

fsdp_status ops_cuda_loss_sum(double *sum, const float *losses, int N, cudaStream_t stream) {
  loss_sum_kernel<<<1, kXentThreads, 0, stream>>>(sum, losses, N > 0 ? N : 0);
  LAUNCH_CHECK("loss_sum");
  return FSDP_OK;
}
