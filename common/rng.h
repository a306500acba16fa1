/* rng — the counter-based random numbers behind initialization (docs/design.md §3).
 *
 * Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) maps a
 * 128-bit counter and a 64-bit key to 128 random bits with no state, so the value of element k of
 * tensor gid depends only on (seed, gid, k): every rank initializes only its own shard and the
 * result is bit-identical for any world size and any order of calls. Pure functions: any thread.
 *
 * rng_normal(seed, gid, k): key = (seed low 32 bits, seed high 32 bits), counter = (k low 32,
 * k high 32, gid, 0); the first two output words give u1 = (w0 + 1)·2^-32 ∈ (0, 1] and
 * u2 = w1·2^-32 ∈ [0, 1), and the value is the Box–Muller sqrt(−2 ln u1)·cos(2π u2), computed in
 * double and rounded once to float.
 */
#ifndef FSDP_RNG_H
#define FSDP_RNG_H

#include <stdint.h>

/* One Philox4x32-10 block: out = philox(ctr, key). */
void rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* A standard normal deviate for element K of tensor GID under SEED. */
float rng_normal(uint64_t seed, uint32_t gid, uint64_t k);
/* A uniform deviate in [0, 1) for element K of tensor GID under SEED (first output word, 2^-32 steps). */
double rng_uniform(uint64_t seed, uint32_t gid, uint64_t k);

#endif
