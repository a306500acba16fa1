/* opcheck — what test_ops and test_ops_llama share: seeded random inputs in float and double,
 * central finite differences in double, the objective L = Σ w_i·out_i, and expect_close (one CHECK
 * per array, naming the worst element). The tolerances are derived in test_ops.c's header comment.
 * Header-only (static inline): each test owns its own copy and random stream.
 */
#ifndef FSDP_OPCHECK_H
#define FSDP_OPCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

#define FWD_ATOL 1e-5
#define FWD_RTOL 1e-4
#define GRAD_ATOL 1e-4
#define GRAD_RTOL 1e-3
#define FD_H 1e-5

static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;
static inline double urand(void) { /* uniform in [-1, 1), splitmix64 */
  unsigned long long z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / (double)(1ull << 52) - 1.0;
}

static inline float *fnew(int n) { return calloc((size_t)n, sizeof(float)); }
static inline double *dnew(int n) { return calloc((size_t)n, sizeof(double)); }

/* x = scale·U(-1,1), kept in both precisions (the double copy holds exactly the float values). */
static inline void frand(float *f, double *d, int n, double scale) {
  for (int i = 0; i < n; i++) {
    f[i] = (float)(scale * urand());
    if (d) d[i] = f[i];
  }
}
static inline void ffill(float *f, int n, float v) {
  for (int i = 0; i < n; i++) f[i] = v;
}

/* One CHECK per array: the element that violates |got − ref| ≤ atol + rtol·|ref| the most. */
static inline void expect_close(const char *what, const double *ref, const float *got, int n, double atol, double rtol) {
  int worst = 0;
  double worst_excess = -INFINITY;
  for (int i = 0; i < n; i++) {
    double excess = fabs((double)got[i] - ref[i]) - (atol + rtol * fabs(ref[i]));
    if (!(excess <= worst_excess)) { /* NaN counts as the worst */
      worst_excess = excess;
      worst = i;
      if (isnan(excess)) break;
    }
  }
  if (!(worst_excess <= 0)) fprintf(stderr, "%s: element %d of %d is off\n", what, worst, n);
  CHECK_NEAR(ref[worst], got[worst], atol, rtol);
}

/* Central differences of f with respect to x[0..n); f reads x through its context. */
typedef double (*objective_fn)(void *ctx);
static inline void fd_grad(double *grad, double *x, int n, objective_fn f, void *ctx) {
  for (int i = 0; i < n; i++) {
    double save = x[i];
    x[i] = save + FD_H;
    double fp = f(ctx);
    x[i] = save - FD_H;
    double fm = f(ctx);
    x[i] = save;
    grad[i] = (fp - fm) / (2 * FD_H);
  }
}

static inline double wdot(const double *w, const double *out, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += w[i] * out[i];
  return s;
}

#endif
