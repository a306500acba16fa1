/* rope — the angle of rotary position embeddings in Hugging Face's rotate-half convention
 * (LlamaRotaryEmbedding, apply_rotary_pos_emb), shared by the CPU reference and the CUDA kernels,
 * and the rotation of one pair; the loops over heads and positions stay in each backend.
 *
 * A head of HS channels (HS even) at position t: pair (i, i + HS/2), i < HS/2, rotates by
 * angle = t·theta^(−2i/HS):
 *   y_i        = x_i·cos − x_{i+HS/2}·sin
 *   y_{i+HS/2} = x_{i+HS/2}·cos + x_i·sin
 * The backward is the transposed rotation (by −angle). As in Hugging Face, the inverse frequency
 * and the angle are fp32: inv_freq = 1/theta^(2i/HS), angle = (float)t·inv_freq.
 */
#ifndef FSDP_OPS_ROPE_H
#define FSDP_OPS_ROPE_H

#include <math.h>

#include "ops_hd.h"

OPS_HD float rope_angle(int t, int i, int HS, float theta) {
  float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)HS);
  return (float)t * inv_freq;
}

/* Rotates the pair (*a, *b) = (x_i, x_{i+HS/2}) by the angle whose cosine and sine are c, s;
 * s = −sin(angle) rotates back (the backward). */
OPS_HD void rope_rotate(float *a, float *b, float c, float s) {
  float x0 = *a, x1 = *b;
  *a = x0 * c - x1 * s;
  *b = x1 * c + x0 * s;
}

#endif
