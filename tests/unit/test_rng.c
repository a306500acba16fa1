/* test_rng — Philox4x32-10 against the published known-answer vectors, sane normal statistics, and
 * model_init_shard: every shard of every world size 1..8 holds exactly the whole model's values. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jobspec.h"
#include "gpt2.h"
#include "model.h"
#include "plan.h"
#include "rng.h"

/* Random123's kat_vectors for philox4x32 with 10 rounds: counter, key → output. */
static void test_philox_kat(void) {
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
       0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
       0x24126ea1},
  };
  for (int i = 0; i < 3; i++) {
    uint32_t out[4];
    rng_philox4x32_10(kat[i], kat[i] + 4, out);
    for (int j = 0; j < 4; j++) CHECK_EQ_INT(kat[i][6 + j], out[j]);
  }
}

/* Mean, variance, tails and independence of rng_normal over 10^6 draws: each estimate is compared
 * with its expected value at ~5 standard errors. */
static void test_normal_stats(void) {
  const int n = 1000000;
  double s1 = 0, s2 = 0, s4 = 0, lag = 0, prev = 0, other = 0;
  int beyond3 = 0;
  for (int k = 0; k < n; k++) {
    double z = rng_normal(7, 3, (uint64_t)k);
    s1 += z;
    s2 += z * z;
    s4 += z * z * z * z;
    if (fabs(z) > 3) beyond3++;
    if (k) lag += z * prev;
    prev = z;
    other += z * rng_normal(7, 4, (uint64_t)k);   /* another tensor: independent */
  }
  double se = 1.0 / sqrt(n);
  CHECK_NEAR(0.0, s1 / n, 5 * se, 0);
  CHECK_NEAR(1.0, s2 / n, 5 * sqrt(2.0) * se, 0);           /* Var(z²) = 2 */
  CHECK_NEAR(3.0, s4 / n, 5 * sqrt(96.0) * se, 0);          /* Var(z⁴) = 105 − 9 = 96 */
  CHECK_NEAR(0.0, lag / n, 5 * se, 0);
  CHECK_NEAR(0.0, other / n, 5 * se, 0);
  double p3 = 0.0026997960632601866;                        /* P(|z| > 3) */
  CHECK_NEAR(p3 * n, beyond3, 5 * sqrt(p3 * n), 0);
  /* Different seeds and tensors give different streams; the same key gives the same value. */
  CHECK(rng_normal(1, 0, 0) != rng_normal(2, 0, 0));
  CHECK(rng_normal(1, 0, 0) != rng_normal(1, 1, 0));
  CHECK(rng_normal(1, 0, 5) == rng_normal(1, 0, 5));
  CHECK(rng_normal(1, 0, (uint64_t)1 << 40) != rng_normal(1, 0, 0));   /* high counter word is used */
}

static void spec_for(jobspec_t *s, int L, int H, int C, int V, int T) {
  jobspec_defaults(s);
  s->model = (model_config){.n_layer = L, .n_head = H, .n_embd = C, .vocab_size = V, .seq_len = T};
  s->batch_size = 2;
  s->grad_accum = 1;
  s->device = DEVICE_CPU;
  s->sharding = SHARD_FULL;
  s->param_dtype = s->reduce_dtype = DTYPE_FP32;
}

/* Shards of any world size reassemble to the world-1 model, bit for bit, with zero padding; and
 * the values follow the init rule (LN 1/0, biases 0, weights N(0, 0.02), c_proj N(0, 0.02/sqrt(2L))). */
static void test_init_shards(void) {
  /* Odd sizes, so that tensors straddle shard boundaries and the padding is non-trivial. */
  const int L = 3, H = 2, C = 26, V = 101, T = 13;
  const uint64_t seed = 0x5eed;
  jobspec_t s;
  spec_for(&s, L, H, C, V, T);
  s.world_size = 1;
  plan_t *p1 = NULL;
  CHECK_OK(plan_build(&s, 1, &p1));
  if (!p1) return;
  float *full = malloc(sizeof(float) * (size_t)p1->shard_total);
  model_init_shard(p1, seed, 0, full);

  for (int world = 1; world <= 8; world++) {
    s.world_size = world;
    plan_t *p = NULL;
    CHECK_OK(plan_build(&s, world, &p));
    if (!p) continue;
    float *shard = malloc(sizeof(float) * (size_t)p->shard_total);
    int mismatches = 0, nonzero_pad = 0;
    for (int r = 0; r < world; r++) {
      for (int64_t i = 0; i < p->shard_total; i++) shard[i] = NAN;   /* every element must be written */
      model_init_shard(p, seed, r, shard);
      for (int u = 0; u < p->nunits; u++) {
        const plan_unit *un = &p->units[u];
        int64_t lo = plan_shard_offset(p, u, r);
        for (int64_t i = 0; i < un->shard_numel; i++) {
          int64_t e = lo + i;     /* flat element */
          float got = shard[un->shard_base + i];
          if (e < un->numel) {
            float want = full[p1->units[u].shard_base + e];
            if (memcmp(&got, &want, sizeof got) != 0) mismatches++;
          } else if (got != 0.0f || signbit(got)) {
            nonzero_pad++;
          }
        }
      }
    }
    CHECK_EQ_INT(0, mismatches);
    CHECK_EQ_INT(0, nonzero_pad);
    free(shard);
    plan_destroy(&p);
  }

  /* Sharding none: every rank's "shard" is the whole model. */
  s.sharding = SHARD_NONE;
  s.world_size = 3;
  plan_t *pn = NULL;
  CHECK_OK(plan_build(&s, 3, &pn));
  if (pn) {
    float *all = malloc(sizeof(float) * (size_t)pn->shard_total);
    model_init_shard(pn, seed, 2, all);
    int mismatches = 0;
    for (int u = 0; u < pn->nunits; u++)
      if (memcmp(all + pn->units[u].shard_base, full + p1->units[u].shard_base,
                 sizeof(float) * (size_t)pn->units[u].numel) != 0)
        mismatches++;
    CHECK_EQ_INT(0, mismatches);
    free(all);
    plan_destroy(&pn);
  }

  /* The init rule, on the whole model. */
  for (int u = 0; u < p1->nunits; u++)
    for (int t = 0; t < p1->units[u].ntensors; t++) {
      const plan_tensor *pt = &p1->units[u].t[t];
      const float *x = full + p1->units[u].shard_base + pt->offset;
      double s1 = 0, s2 = 0;
      for (int64_t k = 0; k < pt->numel; k++) {
        s1 += x[k];
        s2 += (double)x[k] * x[k];
      }
      double mean = s1 / pt->numel, rms = sqrt(s2 / pt->numel);
      int is_ln_w = (u == 0 && t == ROOT_LNF_W) || (u > 0 && (t == BLK_LN1_W || t == BLK_LN2_W));
      if (is_ln_w) {
        CHECK_NEAR(1.0, mean, 0, 0);
        CHECK_NEAR(1.0, rms, 0, 0);
      } else if (pt->ndim == 1) {       /* biases and LayerNorm biases */
        CHECK_NEAR(0.0, rms, 0, 0);
      } else {
        int cproj = u > 0 && (t == BLK_ATTNPROJ_W || t == BLK_FCPROJ_W);
        double std = cproj ? 0.02 / sqrt(2.0 * L) : 0.02;
        double se = std / sqrt((double)pt->numel);
        CHECK_NEAR(0.0, mean, 5 * se, 0);
        CHECK_NEAR(std, rms, 5 * std / sqrt(2.0 * pt->numel), 0);   /* sd of the sample rms ≈ σ/sqrt(2n) */
        /* Element k is std · rng_normal(seed, gid, k), exactly. */
        CHECK(x[pt->numel - 1] == (float)(std * (double)rng_normal(seed, (uint32_t)pt->gid, (uint64_t)pt->numel - 1)));
      }
    }
  free(full);
  plan_destroy(&p1);
}

int main(void) {
  test_philox_kat();
  test_normal_stats();
  test_init_shards();
  return check_done();
}
