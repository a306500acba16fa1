/* refrope — the rotary inverse frequency in double, as the reference of test_ops_llama and
 * test_model_llama: theta^(−2i/HS), and with Llama-3.1/3.2's scaling ("llama3") transformers'
 * _compute_llama3_parameters band by band, written from its formula independently of worker/ops/rope.h
 * (no fp32 steps). Header-only (static inline).
 */
#ifndef FSDP_TEST_REFROPE_H
#define FSDP_TEST_REFROPE_H

#include <math.h>

/* SCALING: NULL (unscaled), or llama3's {factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings}. */
static inline double ref_inv_freq(int i, int HS, double theta, const double *scaling) {
  double inv = 1.0 / pow(theta, 2.0 * i / HS);
  if (!scaling) return inv;
  double factor = scaling[0], lo = scaling[1], hi = scaling[2], orig = scaling[3], wavelen = 2 * M_PI / inv;
  if (wavelen > orig / lo) return inv / factor;   /* low frequencies */
  if (wavelen < orig / hi) return inv;            /* high frequencies */
  double s = (orig / wavelen - lo) / (hi - lo);
  return (1 - s) * inv / factor + s * inv;
}

#endif
