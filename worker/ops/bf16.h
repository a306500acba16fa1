/* bf16 — bfloat16 <-> fp32 conversions on raw bits (uint16_t), the one definition shared by the CPU
 * side (tests, host code) and the CUDA kernels, so that a cast is bit-identical on both.
 *
 * bf16 is the top half of an IEEE fp32. Widening is exact. Narrowing rounds to nearest, ties to
 * even; a NaN stays a NaN (made quiet, sign kept); ±inf stays ±inf; values that round past the
 * largest bf16 become ±inf, as IEEE rounding says. Same rule as st_f32_to_bf16 (common/safetensors.h)
 * and __float2bfloat16_rn. Pure functions: any thread.
 */
#ifndef FSDP_OPS_BF16_H
#define FSDP_OPS_BF16_H

#include <stdint.h>
#include <string.h>

#include "ops_hd.h"

OPS_HD float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

OPS_HD uint16_t f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                  /* nearest, ties to even */
}

/* x rounded to the nearest bf16, as a float */
OPS_HD float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

#endif
