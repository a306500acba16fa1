/* ops_cuda_gated — the gated MLP activation on the GPU (see ops_cuda.h): out = act(gate)·up on the
 * fused [gate | up] rows, SwiGLU (Llama's, act = SiLU) and GeGLU (Gemma's, act = tanh GELU). bf16
 * storage, fp32 math, the formulas of worker/ops/gated.h as on the CPU (ops_cpu.c gated_forward).
 * One kernel template per direction, instantiated for each activation A; one thread per output
 * element in a grid-stride loop, 8 per thread with 128-bit loads when F is a multiple of 8 and the
 * pointers are 16-byte aligned (VEC).
 */
#include "ops_cuda_common.cuh"

#include "ops/gated.h"

template <bool VEC, gate_act A>
__global__ void gated_forward_kernel(ops_bf16 *__restrict__ out, const ops_bf16 *__restrict__ gu, int F, int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        const ops_bf16 *g = gu + i / F * 2 * F + i % F;
        float gv[8], uv[8];
        ld8(gv, g);
        ld8(uv, g + F);
#pragma unroll
        for (int k = 0; k < 8; k++) gv[k] = gated(A, gv[k], uv[k]);
        st8(out + i, gv);
      },
      [&](int64_t i) {
        const ops_bf16 *g = gu + i / F * 2 * F + i % F;
        out[i] = tobf(gated(A, ldbf(g), ldbf(g + F)));
      });
}

/* d gate; planted (GeGLU only): the gate's gradient without GELU's derivative, σ in its place */
template <gate_act A> __device__ __forceinline__ float gated_dgate_of(bool lost, float g, float u, float d) {
  return lost ? d * u * gelu_sigma(g) : gated_dgate(A, g, u, d);
}

template <bool VEC, gate_act A>
__global__ void gated_backward_kernel(ops_bf16 *__restrict__ dgu, const ops_bf16 *__restrict__ gu,
                                      const ops_bf16 *__restrict__ dout, int F, int64_t n) {
  const bool lost = A == GATE_GELU_TANH && OPS_FAULT("geglu_grad");
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        const int64_t off = i / F * 2 * F + i % F;
        float g[8], u[8], d[8], dg[8];
        ld8(g, gu + off);
        ld8(u, gu + off + F);
        ld8(d, dout + i);
#pragma unroll
        for (int k = 0; k < 8; k++) {
          dg[k] = gated_dgate_of<A>(lost, g[k], u[k], d[k]);
          u[k] = gated_dup(A, g[k], d[k]);
        }
        st8(dgu + off, dg);
        st8(dgu + off + F, u);
      },
      [&](int64_t i) {
        const int64_t off = i / F * 2 * F + i % F;
        const float g = ldbf(gu + off), u = ldbf(gu + off + F), d = ldbf(dout + i);
        dgu[off] = tobf(gated_dgate_of<A>(lost, g, u, d));
        dgu[off + F] = tobf(gated_dup(A, g, d));
      });
}

/* The launches of OPS_EW_LAUNCH (packs of 8 where VEC), with the activation as the second template
 * argument. */
template <gate_act A>
static fsdp_status gated_forward(ops_bf16 *out, const ops_bf16 *gu, int BT, int F, const ops_cuda_ctx *ctx,
                                 const char *what) {
  const int64_t n = (int64_t)BT * F;
  if (n <= 0) return FSDP_OK;
  if (F % 8 == 0 && ops_aligned16(out) && ops_aligned16(gu))
    gated_forward_kernel<true, A><<<ops_blocks((n + 7) / 8, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(out, gu, F, n);
  else
    gated_forward_kernel<false, A><<<ops_blocks(n, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(out, gu, F, n);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

template <gate_act A>
static fsdp_status gated_backward(ops_bf16 *dgu, const ops_bf16 *gu, const ops_bf16 *dout, int BT, int F,
                                  const ops_cuda_ctx *ctx, const char *what) {
  const int64_t n = (int64_t)BT * F;
  if (n <= 0) return FSDP_OK;
  if (F % 8 == 0 && ops_aligned16(dgu) && ops_aligned16(gu) && ops_aligned16(dout))
    gated_backward_kernel<true, A><<<ops_blocks((n + 7) / 8, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(dgu, gu, dout,
                                                                                                          F, n);
  else
    gated_backward_kernel<false, A><<<ops_blocks(n, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(dgu, gu, dout, F, n);
  LAUNCH_CHECK(what);
  return FSDP_OK;
}

fsdp_status ops_cuda_swiglu_forward(ops_bf16 *out, const ops_bf16 *gu, int BT, int F, const ops_cuda_ctx *ctx) {
  return gated_forward<GATE_SILU>(out, gu, BT, F, ctx, "swiglu_forward");
}

fsdp_status ops_cuda_swiglu_backward(ops_bf16 *dgu, const ops_bf16 *gu, const ops_bf16 *dout, int BT, int F,
                                     const ops_cuda_ctx *ctx) {
  return gated_backward<GATE_SILU>(dgu, gu, dout, BT, F, ctx, "swiglu_backward");
}

fsdp_status ops_cuda_geglu_forward(ops_bf16 *out, const ops_bf16 *gu, int BT, int F, const ops_cuda_ctx *ctx) {
  return gated_forward<GATE_GELU_TANH>(out, gu, BT, F, ctx, "geglu_forward");
}

fsdp_status ops_cuda_geglu_backward(ops_bf16 *dgu, const ops_bf16 *gu, const ops_bf16 *dout, int BT, int F,
                                    const ops_cuda_ctx *ctx) {
  return gated_backward<GATE_GELU_TANH>(dgu, gu, dout, BT, F, ctx, "geglu_backward");
}
