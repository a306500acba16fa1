/* ops_cuda_util — AdamW over a flat fp32 shard, and the small vector utilities (fill, casts,
 * accumulate, sum of squares, loss sum); see ops_cuda.h.
 *
 * AdamW reproduces optim.c's float arithmetic operation by operation: every product and sum is an
 * explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn, ...), which nvcc never contracts into
 * an FMA, so each element gets the CPU's bits (the CPU build has no FMA contraction either:
 * baseline x86-64). Reductions are fixed-order: a fixed number of slices (not derived from the
 * GPU), then one block.
 */
#include "ops_cuda_common.cuh"

#include <math.h>

/* ---- AdamW ---- */

ops_cuda_adamw_consts_t ops_cuda_adamw_consts(int step, double lr, double beta1, double beta2, double eps,
                                              double weight_decay, float grad_scale) {
  /* As optim_adamw_shard: constants in double, then rounded to float once. */
  const double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
  ops_cuda_adamw_consts_t k;
  k.beta1 = (float)beta1;
  k.beta2 = (float)beta2;
  k.eps = (float)eps;
  k.step_size = (float)(lr / bc1);
  k.bc2_sqrt = (float)sqrt(bc2);
  k.decay = (float)(1.0 - lr * weight_decay);
  k.grad_scale = grad_scale;
  return k;
}

/* The first of the sorted, disjoint [start, end) pairs of segs with end > i (nseg if none). */
__device__ __forceinline__ int first_segment(const int64_t *__restrict__ segs, int nseg, int64_t i) {
  int lo = 0, hi = nseg;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (segs[2 * mid + 1] > i) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/* Whether element i lies in a segment, starting from segment s = first_segment(.., i0) for some
 * i0 ≤ i: s advances past the segments that end at or before i, so a pack searches once. */
__device__ __forceinline__ bool in_segment_from(const int64_t *__restrict__ segs, int nseg, int &s, int64_t i) {
  while (s < nseg && segs[2 * s + 1] <= i) s++;
  return s < nseg && segs[2 * s] <= i;
}

/* One element of optim.c's update, line by line:
 *   gi = g·grad_scale; mi = β1·m + (1−β1)·gi; vi = β2·v + (1−β2)·gi·gi;
 *   denom = sqrtf(vi)/bc2_sqrt + eps; w = w·decay − step_size·(mi/denom) */
__device__ __forceinline__ float adamw_one(float &w, float &m, float &v, float g, float decay,
                                           const ops_cuda_adamw_consts_t &k) {
  const float gi = __fmul_rn(g, k.grad_scale);
  const float mi = __fadd_rn(__fmul_rn(k.beta1, m), __fmul_rn(__fsub_rn(1.0f, k.beta1), gi));
  const float vi = __fadd_rn(__fmul_rn(k.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, k.beta2), gi), gi));
  m = mi;
  v = vi;
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
  w = __fsub_rn(__fmul_rn(w, decay), __fmul_rn(k.step_size, __fdiv_rn(mi, denom)));
  return w;
}

/* VEC: 8 elements per thread: w, m, v and g read and written 128 bits at a time (two accesses
 * each), the bf16 copy stored in one 128-bit store, and the decay segments searched once per pack. */
template <bool VEC>
__global__ void adamw_kernel(float *__restrict__ w, ops_bf16 *__restrict__ wbf, float *__restrict__ m,
                             float *__restrict__ v, const float *__restrict__ g, const int64_t *__restrict__ segs,
                             int nseg, ops_cuda_adamw_consts_t k, int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        float wv[8], mv[8], vv[8], gv[8];
        ld4f(wv, w + i), ld4f(wv + 4, w + i + 4);
        ld4f(mv, m + i), ld4f(mv + 4, m + i + 4);
        ld4f(vv, v + i), ld4f(vv + 4, v + i + 4);
        ld4f(gv, g + i), ld4f(gv + 4, g + i + 4);
        int s = first_segment(segs, nseg, i);
        ops_bf16 h[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
          const int64_t at = OPS_FAULT("adamw_segment") ? i : i + e; /* planted: the pack's first element's decay */
          adamw_one(wv[e], mv[e], vv[e], gv[e], in_segment_from(segs, nseg, s, at) ? k.decay : 1.0f, k);
          h[e] = bf_from_bits(f32_to_bf16(wv[e]));
        }
        st4f(w + i, wv), st4f(w + i + 4, wv + 4);
        st4f(m + i, mv), st4f(m + i + 4, mv + 4);
        st4f(v + i, vv), st4f(v + i + 4, vv + 4);
        if (wbf) st8h(wbf + i, h);
      },
      [&](int64_t i) {
        int s = first_segment(segs, nseg, i);
        const float wi = adamw_one(w[i], m[i], v[i], g[i], in_segment_from(segs, nseg, s, i) ? k.decay : 1.0f, k);
        if (wbf) wbf[i] = bf_from_bits(f32_to_bf16(wi));
      });
}

fsdp_status ops_cuda_adamw(float *param, ops_bf16 *param_bf16, float *m, float *v, const float *grad, int64_t n,
                           const int64_t *decay_segs, int nseg, const ops_cuda_adamw_consts_t *k,
                           const ops_cuda_ctx *ctx) {
  if (n <= 0) return FSDP_OK;
  if (nseg < 0 || (nseg > 0 && !decay_segs))
    return fsdp_set_error(FSDP_ERR_INVALID, "adamw: %d decay segments but no table", nseg);
  const bool vec = ops_aligned16(param) && ops_aligned16(m) && ops_aligned16(v) && ops_aligned16(grad) &&
                   (!param_bf16 || ops_aligned16(param_bf16));
  OPS_EW_LAUNCH(adamw_kernel, vec, 8, n, "adamw", param, param_bf16, m, v, grad, decay_segs, nseg, *k);
  return FSDP_OK;
}

/* ---- fill, casts, accumulate ---- */

__global__ void fill_kernel(float *__restrict__ dst, float value, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = value;
}

/* Bit-exact with f32_to_bf16 (ops/bf16.h), NaN payloads included. */
template <bool VEC>
__global__ void cast_f32_bf16_kernel(ops_bf16 *__restrict__ dst, const float *__restrict__ src, int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        float f[8];
        ops_bf16 h[8];
        ld4f(f, src + i);
        ld4f(f + 4, src + i + 4);
#pragma unroll
        for (int k = 0; k < 8; k++) h[k] = bf_from_bits(f32_to_bf16(f[k]));
        st8h(dst + i, h);
      },
      [&](int64_t i) { dst[i] = bf_from_bits(f32_to_bf16(src[i])); });
}

template <bool VEC>
__global__ void cast_bf16_f32_kernel(float *__restrict__ dst, const ops_bf16 *__restrict__ src, int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        float f[8];
        ld8(f, src + i);
        st4f(dst + i, f);
        st4f(dst + i + 4, f + 4);
      },
      [&](int64_t i) { dst[i] = ldbf(src + i); });
}

template <bool VEC> __global__ void acc_f32_kernel(float *__restrict__ dst, const float *__restrict__ src, int64_t n) {
  ops_ew_loop<VEC, 4>(
      n,
      [&](int64_t i) {
        float d[4], x[4];
        ld4f(d, dst + i);
        ld4f(x, src + i);
#pragma unroll
        for (int k = 0; k < 4; k++) d[k] += x[k];
        st4f(dst + i, d);
      },
      [&](int64_t i) { dst[i] += src[i]; });
}

template <bool VEC>
__global__ void acc_bf16_kernel(float *__restrict__ dst, const ops_bf16 *__restrict__ src, int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        float d[8], x[8];
        ld4f(d, dst + i);
        ld4f(d + 4, dst + i + 4);
        ld8(x, src + i);
#pragma unroll
        for (int k = 0; k < 8; k++) d[k] += x[k];
        st4f(dst + i, d);
        st4f(dst + i + 4, d + 4);
      },
      [&](int64_t i) { dst[i] += ldbf(src + i); });
}

#define ELEMENTWISE(kernel, what, n, ...)                                                   \
  do {                                                                                      \
    if ((n) <= 0) return FSDP_OK;                                                           \
    kernel<<<ops_blocks((n), OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(__VA_ARGS__, (n)); \
    LAUNCH_CHECK(what);                                                                     \
    return FSDP_OK;                                                                         \
  } while (0)

fsdp_status ops_cuda_fill_f32(float *dst, float value, int64_t n, const ops_cuda_ctx *ctx) {
  ELEMENTWISE(fill_kernel, "fill_f32", n, dst, value);
}

/* DST and SRC, 16-byte aligned: the kernels' 128-bit path. */
#define VEC_PAIR(dst, src) (ops_aligned16(dst) && ops_aligned16(src))

fsdp_status ops_cuda_cast_f32_to_bf16(ops_bf16 *dst, const float *src, int64_t n, const ops_cuda_ctx *ctx) {
  if (n > 0) OPS_EW_LAUNCH(cast_f32_bf16_kernel, VEC_PAIR(dst, src), 8, n, "cast_f32_to_bf16", dst, src);
  return FSDP_OK;
}

fsdp_status ops_cuda_cast_bf16_to_f32(float *dst, const ops_bf16 *src, int64_t n, const ops_cuda_ctx *ctx) {
  if (n > 0) OPS_EW_LAUNCH(cast_bf16_f32_kernel, VEC_PAIR(dst, src), 8, n, "cast_bf16_to_f32", dst, src);
  return FSDP_OK;
}

fsdp_status ops_cuda_accumulate_f32(float *dst, const float *src, int64_t n, const ops_cuda_ctx *ctx) {
  if (n > 0) OPS_EW_LAUNCH(acc_f32_kernel, VEC_PAIR(dst, src), 4, n, "accumulate_f32", dst, src);
  return FSDP_OK;
}

fsdp_status ops_cuda_accumulate_bf16(float *dst, const ops_bf16 *src, int64_t n, const ops_cuda_ctx *ctx) {
  if (n > 0) OPS_EW_LAUNCH(acc_bf16_kernel, VEC_PAIR(dst, src), 8, n, "accumulate_bf16", dst, src);
  return FSDP_OK;
}

/* Column blocks (device.h's act_axpby): dst[r·dld + c] = alpha·src[r·sld + c] + beta·dst[..], fp32 math, one
 * rounding to bf16; one thread per element. */
__global__ void act_axpby_kernel(ops_bf16 *dst, int64_t dld, const ops_bf16 *src, int64_t sld, int64_t cols,
                                 float alpha, float beta, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float x = __fmul_rn(alpha, ldbf(src + r * sld + c));
    dst[r * dld + c] = tobf(beta == 0.0f ? x : __fadd_rn(x, __fmul_rn(beta, ldbf(dst + r * dld + c))));
  }
}

fsdp_status ops_cuda_act_axpby(ops_bf16 *dst, int64_t dld, const ops_bf16 *src, int64_t sld, int64_t rows,
                               int64_t cols, float alpha, float beta, const ops_cuda_ctx *ctx) {
  ELEMENTWISE(act_axpby_kernel, "act_axpby", rows * cols, dst, dld, src, sld, cols, alpha, beta);
}

/* ---- sum of squares and loss sum ---- */

#define SUMSQ_SLICES 1024 /* fixed: the order of the sum does not depend on the GPU */
#define RED_THREADS 256

/* Block s sums slice s = [s·per, (s+1)·per) of x²: thread-strided partials, then a fixed tree. VEC:
 * per is a multiple of 4 and x 16-byte aligned, each thread takes 4 elements per load; the last
 * slice's < 4 elements past its last whole pack go to its first threads, outside the loop. */
template <bool VEC>
__global__ void __launch_bounds__(RED_THREADS)
    sumsq_partial_kernel(double *__restrict__ part, int *__restrict__ bad, const float *__restrict__ x, int64_t n,
                         int64_t per) {
  __shared__ double red[32];
  __shared__ int redi[32];
  const int64_t lo = (int64_t)blockIdx.x * per, hi = lo + per < n ? lo + per : n;
  double s = 0.0;
  int nf = 0;
  if (VEC) {
    const int64_t end = hi > lo ? lo + (hi - lo) / 4 * 4 : lo;
    for (int64_t i = lo + 4 * threadIdx.x; i < end; i += 4 * RED_THREADS) {
      float v[4];
      ld4f(v, x + i);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        nf |= !isfinite(v[k]);
        s += (double)v[k] * (double)v[k];
      }
    }
    if (end + threadIdx.x < hi) {
      const float xi = x[end + threadIdx.x];
      nf |= !isfinite(xi);
      s += (double)xi * (double)xi;
    }
  } else {
    for (int64_t i = lo + threadIdx.x; i < hi; i += RED_THREADS) {
      const float xi = x[i];
      nf |= !isfinite(xi);
      s += (double)xi * (double)xi;
    }
  }
  s = block_sum(s, red);
  nf = block_sum(nf, redi);
  if (threadIdx.x == 0) {
    part[blockIdx.x] = s;
    bad[blockIdx.x] = nf != 0;
  }
}

__global__ void __launch_bounds__(RED_THREADS)
    sumsq_finish_kernel(float *__restrict__ out, int *__restrict__ nonfinite, const double *__restrict__ part,
                        const int *__restrict__ bad) {
  __shared__ double red[32];
  __shared__ int redi[32];
  double s = 0.0;
  int nf = 0;
  for (int i = threadIdx.x; i < SUMSQ_SLICES; i += RED_THREADS) {
    s += part[i];
    nf += bad[i];
  }
  s = block_sum(s, red);
  nf = block_sum(nf, redi);
  if (threadIdx.x == 0) {
    *out = (float)s;
    *nonfinite = nf != 0;
  }
}

fsdp_status ops_cuda_sumsq(float *sumsq, int *nonfinite, const float *x, int64_t n, const ops_cuda_ctx *ctx) {
  static const char *what = "sumsq";
  void *ws = NULL;
  TRY(ops_workspace(ctx, SUMSQ_SLICES * (sizeof(double) + sizeof(int)), what, &ws));
  double *part = (double *)ws;
  int *bad = (int *)(part + SUMSQ_SLICES);
  if (n < 0) n = 0;
  const int64_t per = ((n + SUMSQ_SLICES - 1) / SUMSQ_SLICES + 3) / 4 * 4;   /* whole packs of 4 */
  if (ops_aligned16(x)) sumsq_partial_kernel<true><<<SUMSQ_SLICES, RED_THREADS, 0, ctx->stream>>>(part, bad, x, n, per);
  else sumsq_partial_kernel<false><<<SUMSQ_SLICES, RED_THREADS, 0, ctx->stream>>>(part, bad, x, n, per);
  LAUNCH_CHECK(what);
  sumsq_finish_kernel<<<1, RED_THREADS, 0, ctx->stream>>>(sumsq, nonfinite, part, bad);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

__global__ void __launch_bounds__(1024) loss_sum_kernel(float *acc, const float *__restrict__ losses, int n) {
  __shared__ double red[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)losses[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *acc = (float)((double)*acc + s);
}

fsdp_status ops_cuda_loss_sum(float *acc, const float *losses, int n, const ops_cuda_ctx *ctx) {
  loss_sum_kernel<<<1, 1024, 0, ctx->stream>>>(acc, losses, n > 0 ? n : 0);
  LAUNCH_CHECK("loss_sum");
  return FSDP_OK;
}
