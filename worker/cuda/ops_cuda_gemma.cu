/* ops_cuda_gemma — Gemma's operators on the GPU beyond the Llama family's (see ops_cuda.h): the
 * GeGLU gate of its MLP, out = gelu_tanh(gate)·up on the fused [gate | up] rows. bf16 storage, fp32
 * math, the formulas of worker/ops/gelu.h as on the CPU (ops_cpu.c geglu_forward). One thread per
 * output element in a grid-stride loop, 8 per thread with 128-bit loads when F is a multiple of 8
 * (as SwiGLU's in ops_cuda_llama.cu). Its RMSNorms are Llama's kernels with the weight offset 1.
 */
#include "ops_cuda_common.cuh"

#include "ops/gelu.h"

template <bool VEC>
__global__ void geglu_forward_kernel(ops_bf16 *__restrict__ out, const ops_bf16 *__restrict__ gu, int F, int64_t n) {
  ops_ew_loop<VEC, 8>(
      n,
      [&](int64_t i) {
        const ops_bf16 *g = gu + i / F * 2 * F + i % F;
        float gv[8], uv[8];
        ld8(gv, g);
        ld8(uv, g + F);
#pragma unroll
        for (int k = 0; k < 8; k++) gv[k] = geglu(gv[k], uv[k]);
        st8(out + i, gv);
      },
      [&](int64_t i) {
        const ops_bf16 *g = gu + i / F * 2 * F + i % F;
        out[i] = tobf(geglu(ldbf(g), ldbf(g + F)));
      });
}

template <bool VEC>
__global__ void geglu_backward_kernel(ops_bf16 *__restrict__ dgu, const ops_bf16 *__restrict__ gu,
                                      const ops_bf16 *__restrict__ dout, int F, int64_t n) {
  const bool tanh_grad_lost = OPS_FAULT("geglu_grad");   /* planted: the gate's gradient without GELU's */
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
          dg[k] = tanh_grad_lost ? d[k] * u[k] * gelu_sigma(g[k]) : geglu_dgate(g[k], u[k], d[k]);
          u[k] = geglu_dup(g[k], d[k]);
        }
        st8(dgu + off, dg);
        st8(dgu + off + F, u);
      },
      [&](int64_t i) {
        const int64_t off = i / F * 2 * F + i % F;
        const float g = ldbf(gu + off), u = ldbf(gu + off + F), d = ldbf(dout + i);
        dgu[off] = tobf(tanh_grad_lost ? d * u * gelu_sigma(g) : geglu_dgate(g, u, d));
        dgu[off + F] = tobf(geglu_dup(g, d));
      });
}

fsdp_status ops_cuda_geglu_forward(ops_bf16 *out, const ops_bf16 *gu, int BT, int F, const ops_cuda_ctx *ctx) {
  const int64_t n = (int64_t)BT * F;
  if (n <= 0) return FSDP_OK;
  const bool vec = F % 8 == 0 && ops_aligned16(out) && ops_aligned16(gu);
  OPS_EW_LAUNCH(geglu_forward_kernel, vec, 8, n, "geglu_forward", out, gu, F);
  return FSDP_OK;
}

fsdp_status ops_cuda_geglu_backward(ops_bf16 *dgu, const ops_bf16 *gu, const ops_bf16 *dout, int BT, int F,
                                    const ops_cuda_ctx *ctx) {
  const int64_t n = (int64_t)BT * F;
  if (n <= 0) return FSDP_OK;
  const bool vec = F % 8 == 0 && ops_aligned16(dgu) && ops_aligned16(gu) && ops_aligned16(dout);
  OPS_EW_LAUNCH(geglu_backward_kernel, vec, 8, n, "geglu_backward", dgu, gu, dout, F);
  return FSDP_OK;
}
