/* exp — ops_expf, the exponential that every operator uses (softmax, cross-entropy, GELU), written
 * so that a loop over it vectorizes: glibc's expf is a scalar call that GCC will not vectorize
 * without -ffast-math, and it made GELU and the softmax the slowest CPU loops. The same code runs in
 * the CUDA kernels, so both backends round the same way.
 *
 * Cephes' expf: x = n·ln2 + r with |r| ≤ ln2/2, e^r by a degree-7 polynomial, 2^n put straight into
 * the exponent bits. Relative error ≤ 2 ulp (~2.4e-7) over the clamped range. The input is clamped to
 * [-87, 88], so the result is always a finite normal float: e^x for x < −87 comes out as e^−87 ≈
 * 1.6e−38 instead of 0 or a denormal, and x > 88 as e^88 ≈ 1.7e38 instead of inf. NaN stays NaN.
 */
#ifndef FSDP_OPS_EXP_H
#define FSDP_OPS_EXP_H

#include <stdint.h>
#include <string.h>

#include "ops_hd.h"

/* c ? a : b, by bit masks. GCC -O2 leaves an SSE or AVX2 loop scalar ("control flow in loop") when
 * it holds a float ?: like this clamp, but vectorizes the masks; fminf/fmaxf do not vectorize at
 * all and would turn NaN into a bound. */
OPS_HD float ops_select(int c, float a, float b) {
  uint32_t m = 0u - (uint32_t)(c != 0), ab, bb, rb;
  memcpy(&ab, &a, sizeof ab);
  memcpy(&bb, &b, sizeof bb);
  rb = (ab & m) | (bb & ~m);
  float r;
  memcpy(&r, &rb, sizeof r);
  return r;
}

OPS_HD float ops_expf(float x) {
  x = ops_select(x < -87.0f, -87.0f, x); /* a NaN compares false both times and stays NaN */
  x = ops_select(x > 88.0f, 88.0f, x);
  /* n = round(x·log2 e) by the 1.5·2²³ trick: after the add, the low mantissa bits of v hold n. */
  const float shifter = 12582912.0f;
  float v = x * 1.44269504088896341f + shifter;
  float n = v - shifter;
  float r = x - n * 0.693359375f - n * -2.12194440e-4f; /* ln 2 in two parts: exact first product */
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  uint32_t vb, sb;
  memcpy(&vb, &v, sizeof vb);
  /* 2^n: n sits in vb's low bits offset by the shifter's pattern 0x4B400000; integer math on the
   * bits, so a NaN (whose n is garbage) never meets an undefined float-to-int conversion. */
  sb = (vb - 0x4B400000u + 127u) << 23;
  float scale;
  memcpy(&scale, &sb, sizeof scale);
  return p * scale;
}

#endif
