/* optim — AdamW, schedule, clipping; see optim.h. */
#include "optim.h"

#include <math.h>

/* AdamW over n contiguous elements of one tensor; decay_factor = 1 − lr·wd or 1. The kernel is a
 * plain serial loop so that it vectorizes where the compiler may (with -fno-math-errno: sqrtf of
 * v ≥ 0 never sets errno, but GCC must assume it could); the caller splits the work over threads. */
static void adamw_kernel(
    float *restrict w, const float *restrict g, float *restrict m, float *restrict v, int64_t n, float grad_scale,
    float decay_factor, float beta1, float beta2, float step_size, float bc2_sqrt, float eps) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    w[i] = w[i] * decay_factor - step_size * (mi / denom);
  }
}

static void adamw_span(float *w, const float *g, float *m, float *v, int64_t n, float grad_scale, float decay_factor,
                       float beta1, float beta2, float step_size, float bc2_sqrt, float eps) {
  const int64_t chunk = 1 << 14;      /* elements per task: 64 KiB of each stream */
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n; c += chunk) {
    int64_t len = n - c < chunk ? n - c : chunk;
    adamw_kernel(w + c, g + c, m + c, v + c, len, grad_scale, decay_factor, beta1, beta2, step_size, bc2_sqrt, eps);
  }
}

optim_config optim_config_of(const jobspec_t *s) {
  return (optim_config){.beta1 = s->beta1, .beta2 = s->beta2, .eps = s->eps, .weight_decay = s->weight_decay};
}

void optim_adamw_shard(const plan_t *p, int rank, float *param_shard, const float *grad_shard, float *m,
                       float *v, int step, double lr, const optim_config *spec, float grad_scale) {
  const double bc1 = 1.0 - pow(spec->beta1, step);
  const double bc2 = 1.0 - pow(spec->beta2, step);
  const float step_size = (float)(lr / bc1);
  const float bc2_sqrt = (float)sqrt(bc2);
  const float decay = (float)(1.0 - lr * spec->weight_decay);
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *un = &p->units[u];
    const int64_t lo = plan_shard_offset(p, u, rank), hi = lo + un->shard_numel;
    const int64_t base = un->shard_base - lo;    /* shard index of flat element e is base + e */
    for (int t = 0; t < un->ntensors; t++) {
      const plan_tensor *pt = &un->t[t];
      int64_t a = pt->offset > lo ? pt->offset : lo;
      int64_t b = pt->offset + pt->numel < hi ? pt->offset + pt->numel : hi;
      if (a >= b) continue;
      adamw_span(param_shard + base + a, grad_shard + base + a, m + base + a, v + base + a, b - a, grad_scale,
                 pt->decay ? decay : 1.0f, (float)spec->beta1, (float)spec->beta2, step_size, bc2_sqrt,
                 (float)spec->eps);
    }
  }
}

double optim_lr(const jobspec_t *s, int step) {
  const int it = step - 1, W = s->warmup_steps, N = s->steps;
  if (it < W) return s->lr * (double)(it + 1) / (double)(W + 1);
  if (s->schedule == SCHED_CONSTANT) return s->lr;
  if (it > N) return s->min_lr;
  double ratio = N > W ? (double)(it - W) / (double)(N - W) : 1.0;
  double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
  return s->min_lr + coeff * (s->lr - s->min_lr);
}

double optim_clip_scale(double global_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  double c = max_norm / (global_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}
