/* test_optim — AdamW on sharded flat buffers against torch.optim.AdamW's documented algorithm
 * (computed here in double, tensor by tensor on the whole model), the 2-D-only decay mask, padding
 * left alone, the learning-rate schedule at known steps, and the clip scale. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jobspec.h"
#include "optim.h"
#include "plan.h"
#include "rng.h"

static void spec_for(jobspec_t *s) {
  jobspec_defaults(s);
  s->model = (model_config){.n_layer = 2, .n_head = 2, .n_embd = 12, .vocab_size = 37, .seq_len = 9};
  s->batch_size = 2;
  s->grad_accum = 1;
  s->device = DEVICE_CPU;
  s->sharding = SHARD_FULL;
  s->param_dtype = s->reduce_dtype = DTYPE_FP32;
  s->lr = 1e-2;
  s->weight_decay = 0.1;
  s->beta1 = 0.9;
  s->beta2 = 0.95;
  s->eps = 1e-8;
}

/* torch.optim.AdamW, as its documentation states the algorithm, for one element over steps 1..t. */
typedef struct { double p, m, v; } ref_state;
static void ref_adamw(ref_state *s, double g, int t, double lr, double wd, double b1, double b2, double eps) {
  s->p -= lr * wd * s->p;
  s->m = b1 * s->m + (1 - b1) * g;
  s->v = b2 * s->v + (1 - b2) * g * g;
  double mhat = s->m / (1 - pow(b1, t)), vhat = s->v / (1 - pow(b2, t));
  s->p -= lr * mhat / (sqrt(vhat) + eps);
}

static void test_adamw(void) {
  jobspec_t s;
  spec_for(&s);
  const int steps = 5, world = 3;
  const float gscale = 0.7f;
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, world, &p));
  if (!p) return;
  int64_t nflat = 0;
  for (int u = 0; u < p->nunits; u++) nflat += p->units[u].numel;
  ref_state *ref = calloc((size_t)nflat, sizeof *ref);
  float *w = malloc(sizeof(float) * (size_t)p->shard_total * world), *g = malloc(sizeof(float) * (size_t)p->shard_total * world);
  float *m = calloc((size_t)p->shard_total * world, sizeof(float)), *v = calloc((size_t)p->shard_total * world, sizeof(float));

  /* Element value functions (unit u, flat element e) → param and gradient at step t. */
#define PVAL(u, e) (float)(0.5 * rng_normal(11, (uint32_t)(u), (uint64_t)(e)))
#define GVAL(u, e, t) (float)(0.1 * rng_normal(12 + (t), (uint32_t)(u), (uint64_t)(e)))
  const float PADMARK = 123.0f;
  int64_t rb = 0;
  for (int u = 0; u < p->nunits; u++) {
    for (int64_t e = 0; e < p->units[u].numel; e++) ref[rb + e].p = PVAL(u, e);
    rb += p->units[u].numel;
  }
  for (int r = 0; r < world; r++)
    for (int u = 0; u < p->nunits; u++) {
      const plan_unit *un = &p->units[u];
      for (int64_t i = 0; i < un->shard_numel; i++) {
        int64_t e = plan_shard_offset(p, u, r) + i;
        w[r * p->shard_total + un->shard_base + i] = e < un->numel ? PVAL(u, e) : PADMARK;
      }
    }

  for (int t = 1; t <= steps; t++) {
    double lr = s.lr * t / steps;     /* any per-step lr */
    for (int r = 0; r < world; r++) {
      for (int u = 0; u < p->nunits; u++) {
        const plan_unit *un = &p->units[u];
        for (int64_t i = 0; i < un->shard_numel; i++) {
          int64_t e = plan_shard_offset(p, u, r) + i;
          g[r * p->shard_total + un->shard_base + i] = e < un->numel ? GVAL(u, e, t) : 1e30f;
        }
      }
      optim_adamw_shard(p, r, w + r * p->shard_total, g + r * p->shard_total, m + r * p->shard_total,
                        v + r * p->shard_total, t, lr, (const optim_config[]){optim_config_of(&s)}, gscale);
    }
    rb = 0;
    for (int u = 0; u < p->nunits; u++) {
      for (int ti = 0; ti < p->units[u].ntensors; ti++) {
        const plan_tensor *pt = &p->units[u].t[ti];
        double wd = pt->ndim == 2 ? s.weight_decay : 0.0;   /* decay on 2-D tensors only */
        CHECK_EQ_INT(pt->ndim == 2, pt->decay);
        for (int64_t k = 0; k < pt->numel; k++)
          ref_adamw(&ref[rb + pt->offset + k], (double)gscale * GVAL(u, pt->offset + k, t), t, lr, wd, s.beta1, s.beta2,
                    s.eps);
      }
      rb += p->units[u].numel;
    }
  }

  /* Compare every element of every rank with the reference; padding must be untouched. */
  double worst = 0;
  int pad_touched = 0, bad = 0;
  for (int r = 0; r < world; r++) {
    rb = 0;
    for (int u = 0; u < p->nunits; u++) {
      const plan_unit *un = &p->units[u];
      for (int64_t i = 0; i < un->shard_numel; i++) {
        int64_t e = plan_shard_offset(p, u, r) + i, at = r * p->shard_total + un->shard_base + i;
        if (e >= un->numel) {
          if (w[at] != PADMARK || m[at] != 0 || v[at] != 0) pad_touched++;
          continue;
        }
        /* fp32 update: each step rounds p·(1 − lr·wd) and p − step once (≤ 1 ulp of |p|, 2^-23·|p|)
         * plus a few ulps of the step (≤ lr ≤ 1e-2); over 5 steps ≤ 6e-7·|p| + 1e-8. Accept 3× that. */
        double d = fabs(w[at] - ref[rb + e].p) / (3e-8 + 2e-6 * fabs(ref[rb + e].p));
        if (d > worst) worst = d;
        if (d > 1) bad++;
      }
      rb += un->numel;
    }
  }
  printf("adamw: worst |param − reference| / tolerance %.3g over %d steps\n", worst, steps);
  CHECK_EQ_INT(0, bad);
  CHECK_EQ_INT(0, pad_touched);

  /* The decay mask matters: with gradients 0 and m = v = 0, a 2-D tensor shrinks by exactly
   * (1 − lr·wd) and a 1-D tensor does not move. */
  memset(g, 0, sizeof(float) * (size_t)p->shard_total);
  memset(m, 0, sizeof(float) * (size_t)p->shard_total);
  memset(v, 0, sizeof(float) * (size_t)p->shard_total);
  for (int64_t i = 0; i < p->shard_total; i++) w[i] = 2.0f;
  optim_adamw_shard(p, 0, w, g, m, v, 1, 0.5, (const optim_config[]){optim_config_of(&s)}, 1.0f);
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *un = &p->units[u];
    for (int ti = 0; ti < un->ntensors; ti++) {
      const plan_tensor *pt = &un->t[ti];
      if (pt->offset >= un->shard_numel) continue;          /* not in rank 0's shard */
      float want = pt->decay ? 2.0f * (float)(1.0 - 0.5 * s.weight_decay) : 2.0f;
      CHECK_NEAR(want, w[un->shard_base + pt->offset], 0, 1e-7);
    }
  }
  free(ref); free(w); free(g); free(m); free(v);
  plan_destroy(&p);
}

static void test_schedule(void) {
  jobspec_t s;
  spec_for(&s);
  s.lr = 1e-3;
  s.min_lr = 1e-4;
  s.warmup_steps = 10;
  s.steps = 110;
  s.schedule = SCHED_COSINE;
  /* nanoGPT get_lr(it), it = step − 1: warmup lr·(it+1)/(W+1) */
  CHECK_NEAR(1e-3 * 1 / 11, optim_lr(&s, 1), 0, 1e-12);
  CHECK_NEAR(1e-3 * 10 / 11, optim_lr(&s, 10), 0, 1e-12);
  CHECK_NEAR(1e-3, optim_lr(&s, 11), 0, 1e-12);                    /* it = W: cos(0) */
  CHECK_NEAR(0.5 * (1e-3 + 1e-4), optim_lr(&s, 61), 0, 1e-12);     /* halfway: ratio ½ */
  CHECK_NEAR(1e-4 + 0.5 * (1 + cos(M_PI * 0.25)) * 9e-4, optim_lr(&s, 36), 0, 1e-12);
  CHECK_NEAR(1e-4, optim_lr(&s, 111), 0, 1e-12);                   /* it = N: ratio 1 */
  CHECK_NEAR(1e-4, optim_lr(&s, 500), 0, 1e-12);                   /* past the end */
  double prev = 1;
  int monotone = 1;
  for (int t = 11; t <= 111; t++) {
    double lr = optim_lr(&s, t);
    if (lr > prev) monotone = 0;
    prev = lr;
  }
  CHECK(monotone);
  s.schedule = SCHED_CONSTANT;
  CHECK_NEAR(1e-3 * 5 / 11, optim_lr(&s, 5), 0, 1e-12);
  CHECK_NEAR(1e-3, optim_lr(&s, 11), 0, 1e-12);
  CHECK_NEAR(1e-3, optim_lr(&s, 1000), 0, 1e-12);
  s.warmup_steps = 0;
  CHECK_NEAR(1e-3, optim_lr(&s, 1), 0, 1e-12);
  s.schedule = SCHED_COSINE;
  CHECK_NEAR(1e-3, optim_lr(&s, 1), 0, 1e-12);
}

static void test_clip(void) {
  CHECK_NEAR(1.0, optim_clip_scale(0.5, 1.0), 0, 0);
  CHECK_NEAR(1.0 / (1.0 + 1e-6), optim_clip_scale(1.0, 1.0), 0, 1e-15);
  CHECK_NEAR(1.0 / (4.0 + 1e-6), optim_clip_scale(4.0, 1.0), 0, 1e-15);
  CHECK_NEAR(1.0, optim_clip_scale(1e9, 0.0), 0, 0);             /* off */
  CHECK_NEAR(1.0, optim_clip_scale(0.0, 1.0), 0, 0);
}

int main(void) {
  test_adamw();
  test_schedule();
  test_clip();
  return check_done();
}
