/* rng — Philox4x32-10 and the deviates built on it; see rng.h. */
#include "rng.h"

#include <math.h>

/* The published round constants: multipliers and the Weyl key increments (golden ratio, sqrt(3)−1). */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

void rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    if (round > 0) {            /* the key is bumped between rounds, not before the first */
      k0 += PHILOX_W0;
      k1 += PHILOX_W1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(PHILOX_M0, c0, &hi0, &lo0);
    mulhilo32(PHILOX_M1, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

static void block(uint64_t seed, uint32_t gid, uint64_t k, uint32_t out[4]) {
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  const uint32_t ctr[4] = {(uint32_t)k, (uint32_t)(k >> 32), gid, 0};
  rng_philox4x32_10(ctr, key, out);
}

float rng_normal(uint64_t seed, uint32_t gid, uint64_t k) {
  uint32_t w[4];
  block(seed, gid, k, w);
  const double two32 = 4294967296.0;
  double u1 = ((double)w[0] + 1.0) / two32;   /* (0, 1]: log is finite */
  double u2 = (double)w[1] / two32;           /* [0, 1) */
  return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

double rng_uniform(uint64_t seed, uint32_t gid, uint64_t k) {
  uint32_t w[4];
  block(seed, gid, k, w);
  return (double)w[0] / 4294967296.0;
}
