/* rope — the angle of rotary position embeddings in Hugging Face's rotate-half convention
 * (LlamaRotaryEmbedding, apply_rotary_pos_emb), shared by the CPU reference and the CUDA kernels,
 * and the rotation of one pair; the loops over heads and positions stay in each backend.
 *
 * A head of HS channels (HS even) at position t: pair (i, i + HS/2), i < HS/2, rotates by
 * angle = t·inv_freq_i:
 *   y_i        = x_i·cos − x_{i+HS/2}·sin
 *   y_{i+HS/2} = x_{i+HS/2}·cos + x_i·sin
 * The backward is the transposed rotation (by −angle). As in Hugging Face, the inverse frequency
 * and the angle are fp32: inv_freq = 1/theta^(2i/HS), angle = (float)t·inv_freq.
 *
 * Llama-3.1/3.2's scaling ("llama3", transformers' _compute_llama3_parameters) rescales inv_freq by
 * its wavelength w = 2π/inv_freq against the pretraining context O (original_max_position_embeddings):
 *   w > O/low_freq_factor  (low frequencies)   inv_freq / factor
 *   w < O/high_freq_factor (high frequencies)  inv_freq, unchanged
 *   between                                    (1 − s)·inv_freq/factor + s·inv_freq,
 *                                              s = (O/w − low_freq_factor) / (high_freq_factor − low_freq_factor)
 * computed in fp32 step by step as torch does it (w = (1/inv_freq)·2π, O/w = (1/w)·O: torch's
 * scalar-over-tensor division is a reciprocal and a product), so the frequencies equal transformers'
 * to the last bit (tests/unit/test_ops_llama.c).
 *
 * "linear" (transformers' _compute_linear_scaling_rope_parameters; Gemma 3's global layers): every
 * inv_freq divided by factor, in fp32 as torch's `inv_freq /= factor`.
 *
 * Phi-3's "longrope" within its pretraining context (transformers' _compute_longrope_parameters with
 * seq_len <= original_max_position_embeddings, Phi3RotaryEmbedding): inv_freq_i = 1/(short_factor_i ·
 * theta^(2i/HS)), and cos and sin both multiplied by attention_factor (scale), forward and backward.
 */
#ifndef FSDP_OPS_ROPE_H
#define FSDP_OPS_ROPE_H

#include <math.h>

#include "ops_hd.h"

/* A model's rotary frequencies: the base and, when llama3 is set, the scaling's constants as torch
 * sees them (fp32; the band edges and the band's width computed from the Python numbers in double and
 * rounded once); linear's factor alone. Plain data, passed by value to the kernels; rope_freqs_of()
 * fills it (rope_freqs_linear, rope_freqs_longrope for the others). */
enum { ROPE_FREQS_PLAIN = 0, ROPE_FREQS_LLAMA3 = 1, ROPE_FREQS_LINEAR = 2 };   /* rope_freqs.llama3 */
#define ROPE_MAX_EXT 256   /* longrope factors: HS/2 for a head of up to 512 channels */
typedef struct rope_freqs {
  float theta;
  int llama3;                    /* ROPE_FREQS_*: 0 unscaled (the rest unused), 1 llama3, 2 linear (factor) */
  float factor, low_freq_factor, original;   /* original_max_position_embeddings */
  float low_wavelen, high_wavelen, band;     /* O/low_freq_factor, O/high_freq_factor, high − low */
  int longrope;                  /* 1: inv_freq_i / ext[i], cos and sin times scale */
  float scale;                   /* 1 unless longrope: attention_factor */
  float ext[ROPE_MAX_EXT];       /* longrope's short_factor as fp32 (torch.tensor(..., float32)) */
} rope_freqs;

OPS_HD rope_freqs rope_freqs_of(double theta, int llama3, double factor, double low_freq_factor,
                                double high_freq_factor, int original_max_pos) {
  rope_freqs r = {(float)theta, 0, 0, 0, 0, 0, 0, 0, 0, 1.0f, {0}};
  if (llama3) {
    r.llama3 = 1;
    r.factor = (float)factor;
    r.low_freq_factor = (float)low_freq_factor;
    r.original = (float)original_max_pos;
    r.low_wavelen = (float)(original_max_pos / low_freq_factor);
    r.high_wavelen = (float)(original_max_pos / high_freq_factor);
    r.band = (float)(high_freq_factor - low_freq_factor);
  }
  return r;
}

/* Linear scaling's frequencies: the base's, each divided by FACTOR. */
OPS_HD rope_freqs rope_freqs_linear(double theta, double factor) {
  rope_freqs r = rope_freqs_of(theta, 0, 0, 0, 0, 0);
  r.llama3 = ROPE_FREQS_LINEAR;
  r.factor = (float)factor;
  return r;
}

/* Longrope's frequencies: N factors (N = HS/2, at most ROPE_MAX_EXT; the caller checks). */
OPS_HD rope_freqs rope_freqs_longrope(double theta, const double *short_factor, int n, double attention_factor) {
  rope_freqs r = rope_freqs_of(theta, 0, 0, 0, 0, 0);
  r.longrope = 1;
  r.scale = (float)attention_factor;
  for (int i = 0; i < n && i < ROPE_MAX_EXT; i++) r.ext[i] = (float)short_factor[i];
  return r;
}

OPS_HD float rope_inv_freq(int i, int HS, const rope_freqs *r) {
  if (r->longrope) return 1.0f / (r->ext[i] * powf(r->theta, (float)(2 * i) / (float)HS));
  float inv_freq = 1.0f / powf(r->theta, (float)(2 * i) / (float)HS);
  if (r->llama3 == ROPE_FREQS_PLAIN) return inv_freq;
  if (r->llama3 == ROPE_FREQS_LINEAR) return inv_freq / r->factor;
  float wavelen = (1.0f / inv_freq) * 6.283185307179586f;
  if (wavelen > r->low_wavelen) return inv_freq / r->factor;
  if (wavelen < r->high_wavelen) return inv_freq;
  float s = ((1.0f / wavelen) * r->original - r->low_freq_factor) / r->band;
  return (1.0f - s) * inv_freq / r->factor + s * inv_freq;
}

OPS_HD float rope_angle(int t, int i, int HS, const rope_freqs *r) { return (float)t * rope_inv_freq(i, HS, r); }

/* Rotates the pair (*a, *b) = (x_i, x_{i+HS/2}) by the angle whose cosine and sine are c, s;
 * s = −sin(angle) rotates back (the backward). */
OPS_HD void rope_rotate(float *a, float *b, float c, float s) {
  float x0 = *a, x1 = *b;
  *a = x0 * c - x1 * s;
  *b = x1 * c + x0 * s;
}

#endif
