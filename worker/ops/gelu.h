/* gelu — GELU, tanh approximation (GPT-2's "gelu_new"), and its derivative: the scalar math that
 * gelu_forward/gelu_backward on the CPU and their CUDA kernels both call.
 *
 *   gelu(x) = 0.5·x·(1 + tanh(u)),  u = sqrt(2/π)·(x + 0.044715·x³)
 */
#ifndef FSDP_OPS_GELU_H
#define FSDP_OPS_GELU_H

#include <math.h>

#include "ops_hd.h"

#define GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_COEF 0.044715f

OPS_HD float gelu_tanh(float x) {
  float u = GELU_SQRT_2_OVER_PI * (x + GELU_COEF * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

/* d gelu / dx */
OPS_HD float gelu_tanh_grad(float x) {
  float x2 = x * x;
  float u = GELU_SQRT_2_OVER_PI * (x + GELU_COEF * x2 * x);
  float th = tanhf(u);
  float du = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_COEF * x2);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

#endif
