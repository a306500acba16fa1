/* swiglu — SiLU and the SwiGLU gate of Llama's MLP, out = silu(gate)·up, and their derivatives:
 * the scalar math that swiglu_forward/swiglu_backward on the CPU and their CUDA kernels both call.
 *
 *   silu(g) = g·σ(g),  σ(g) = 1/(1 + e^−g),  silu'(g) = σ(g)·(1 + g·(1 − σ(g)))
 *
 * σ takes e^x from ops_expf (ops/exp.h), which clamps its input, so σ never meets inf: silu(g) is
 * a tiny negative for very negative g, never NaN.
 */
#ifndef FSDP_OPS_SWIGLU_H
#define FSDP_OPS_SWIGLU_H

#include "exp.h"
#include "ops_hd.h"

OPS_HD float silu_sigma(float g) { return 1.0f / (1.0f + ops_expf(-g)); }

OPS_HD float silu(float g) { return g * silu_sigma(g); }

/* d silu / dg */
OPS_HD float silu_grad(float g) {
  float s = silu_sigma(g);
  return s * (1.0f + g * (1.0f - s));
}

OPS_HD float swiglu(float gate, float up) { return silu(gate) * up; }

/* The gradients of swiglu(gate, up) given d = d out. */
OPS_HD float swiglu_dgate(float gate, float up, float d) { return d * up * silu_grad(gate); }
OPS_HD float swiglu_dup(float gate, float d) { return d * silu(gate); }

#endif
