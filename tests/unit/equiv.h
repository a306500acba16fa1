/* equiv — how far the weights of two runs that sum the same gradients in another order may be
 * apart, as the equivalence tests (test_runtime, test_hybrid, test_ckpt) judge it. The bounds are
 * derived in docs/testing.md ("Tolerances"):
 *   - where a gradient is well above its rounding error, AdamW's scale-free update changes by
 *     ~lr·(relative rounding of g) per step: |Δw| ≤ ATOL + RTOL·|w|;
 *   - where a gradient cancels to near zero, its rounding error is as large as itself and the
 *     update can be anything AdamW allows: only equiv_adamw_bound() holds. Such weights are rare:
 *     at most one in EQUIV_ILL_CONDITIONED may fall outside the first bound. A fault (a wrong
 *     shard, a dropped reduce-scatter) moves most weights of a unit (test_runtime plants both).
 * Header-only (static): each test owns its copy. */
#ifndef FSDP_TEST_EQUIV_H
#define FSDP_TEST_EQUIV_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "jobspec.h"
#include "optim.h"

#define EQUIV_ILL_CONDITIONED 1000

/* How far AdamW can move one weight apart in two runs over steps 1..STEPS of job S, whatever their
 * gradients: the update lr_t·m̂_t/(√v̂_t + ε) has |m̂_t/√v̂_t| ≤ ρ_t (Cauchy-Schwarz on the two
 * moving averages: ρ_t = (1−β1)/(1−β1^t) · √((1−β2^t)/(1−β2)) · √(Σ_{k<t} (β1²/β2)^k)), so the two
 * runs' updates differ by at most 2·lr_t·ρ_t per step; decay and clipping only shrink it. */
static double equiv_adamw_bound(const jobspec_t *s, int steps) {
  double sum = 0;
  for (int t = 1; t <= steps; t++) {
    double geo = 0;
    for (int k = 0; k < t; k++) geo += pow(s->beta1 * s->beta1 / s->beta2, k);
    double rho = (1 - s->beta1) / (1 - pow(s->beta1, t)) * sqrt((1 - pow(s->beta2, t)) / (1 - s->beta2)) * sqrt(geo);
    sum += 2 * optim_lr(s, t) * rho;
  }
  return sum;
}

/* Checks model M (N floats) against the reference MREF after STEPS steps of job S, as above.
 * Returns the number of failed checks; *MAXW gets the largest difference, *BEYOND the weights
 * outside ATOL + RTOL·|w|. */
static int equiv_weights(const jobspec_t *s, int steps, const float *mref, const float *m, int64_t n, double atol,
                         double rtol, double *maxw, int64_t *beyond) {
  int failed_before = check_fail_;
  double drift = equiv_adamw_bound(s, steps);
  int64_t wild = 0;
  *maxw = 0, *beyond = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)m[i] - mref[i]);
    if (d > *maxw) *maxw = d;
    if (d > atol + rtol * fabs(mref[i])) ++*beyond;
    if (d > drift) wild++;
  }
  CHECK_EQ_INT(0, wild);
  CHECK(*beyond <= n / EQUIV_ILL_CONDITIONED);
  return check_fail_ - failed_before;
}

#endif
