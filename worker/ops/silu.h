/* silu — SiLU (Llama's hidden_act "silu", the activation of SwiGLU: ops/gated.h) and its
 * derivative: the scalar math that the gated loops on the CPU and their CUDA kernel both call.
 *
 *   silu(g) = g·σ(g),  σ(g) = 1/(1 + e^−g),  silu'(g) = σ(g)·(1 + g·(1 − σ(g)))
 *
 * σ takes e^x from ops_expf (ops/exp.h), which clamps its input, so σ never meets inf: silu(g) is
 * a tiny negative for very negative g, never NaN.
 */
#ifndef FSDP_OPS_SILU_H
#define FSDP_OPS_SILU_H

#include "exp.h"
#include "ops_hd.h"

OPS_HD float silu_sigma(float g) { return 1.0f / (1.0f + ops_expf(-g)); }

OPS_HD float silu(float g) { return g * silu_sigma(g); }

/* d silu / dg */
OPS_HD float silu_grad(float g) {
  float s = silu_sigma(g);
  return s * (1.0f + g * (1.0f - s));
}

#endif
