/* gelu — GELU, tanh approximation (GPT-2's "gelu_new", Gemma's "gelu_pytorch_tanh", the activation
 * of GeGLU: ops/gated.h) and its derivative: the scalar math that gelu_forward/gelu_backward and the
 * gated loops on the CPU and their CUDA kernels all call.
 *
 *   gelu(x) = 0.5·x·(1 + tanh(u)),  u = sqrt(2/π)·(x + 0.044715·x³)
 *
 * computed as x·σ(2u) with σ(y) = 1/(1 + e^−y), since 0.5·(1 + tanh(u)) = σ(2u): one exponential
 * (ops_expf, which vectorizes) instead of tanhf, and clean limits: x for large x, a tiny
 * negative (≈ x·6e−39, not NaN) for very negative x, since e^−2u is clamped finite, never inf. Derivative: σ + 2·x·σ·(1 − σ)·du/dx.
 */
#ifndef FSDP_OPS_GELU_H
#define FSDP_OPS_GELU_H

#include "exp.h"
#include "ops_hd.h"

#define GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_COEF 0.044715f

/* σ(2u) = 0.5·(1 + tanh(u)) */
OPS_HD float gelu_sigma(float x) {
  float u = GELU_SQRT_2_OVER_PI * (x + GELU_COEF * x * x * x);
  return 1.0f / (1.0f + ops_expf(-2.0f * u));
}

OPS_HD float gelu_tanh(float x) { return x * gelu_sigma(x); }

/* d gelu / dx */
OPS_HD float gelu_tanh_grad(float x) {
  float s = gelu_sigma(x);
  float du = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_COEF * x * x);
  return s + 2.0f * x * s * (1.0f - s) * du;
}

#endif
