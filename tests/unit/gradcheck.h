/* gradcheck — what test_model (GPT-2) and test_model_llama share: the whole model, one rank, through
 * worker/model/model.h, checked against the test's own double-precision reference forward.
 *
 *   gradcheck_model   every parameter's gradient against central finite differences of the
 *                     reference (|g − g_ref| ≤ 4e-5·G + 1e-4·|g_ref|, derived in test_model.c's
 *                     header), every tensor taking part; then gradients accumulate (a second
 *                     identical micro-step doubles them) and activation checkpointing gives the
 *                     same bits with the planner's smaller buffers
 *   gradcheck_init_loss   at init the loss is ≈ ln V, and the buffers are the planner's terms, to
 *                     the byte, and all the tracked allocator saw
 *
 * The reference reads the model's dimensions from p (p->model, p->batch_size) and unit u's
 * unpadded flat buffer, in double, from w[u]. Header-only (static): each test owns its copy.
 */
#ifndef FSDP_TEST_GRADCHECK_H
#define FSDP_TEST_GRADCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jobspec.h"
#include "mem.h"
#include "model.h"
#include "model_gpt2.h"
#include "model_llama.h"
#include "plan.h"
#include "rng.h"

/* The job of these tests: model M, batch B, one rank, fp32, the CPU. */
static void gradcheck_spec(jobspec_t *s, model_config m, int B) {
  jobspec_defaults(s);
  s->model = m;
  s->batch_size = B;
  s->grad_accum = 1;
  s->world_size = 1;
  s->device = DEVICE_CPU;
  s->param_dtype = s->reduce_dtype = DTYPE_FP32;
}

/* Mean cross-entropy over B·T tokens of the reference model. */
typedef double (*gradcheck_loss_fn)(const plan_t *p, double *const *w, const int *inp, const int *tgt);

/* Whole-model buffers: units[u] views into one world-1 shard, initialized by model_init_shard. */
typedef struct weights {
  plan_t *p;
  float *w, *g;          /* world-1 shards: every unit's flat buffer, padded */
  float **units, **dunits;
} weights;

static int weights_new(weights *m, const jobspec_t *s, uint64_t seed) {
  memset(m, 0, sizeof *m);
  if (plan_build(s, 1, &m->p) != FSDP_OK) return -1;
  m->w = calloc((size_t)m->p->shard_total, sizeof(float));
  m->g = calloc((size_t)m->p->shard_total, sizeof(float));
  m->units = calloc((size_t)m->p->nunits, sizeof(float *));
  m->dunits = calloc((size_t)m->p->nunits, sizeof(float *));
  model_init_shard(m->p, seed, 0, m->w);
  for (int u = 0; u < m->p->nunits; u++) {
    m->units[u] = m->w + m->p->units[u].shard_base;
    m->dunits[u] = m->g + m->p->units[u].shard_base;
  }
  return 0;
}

static void weights_free(weights *m) {
  free(m->w); free(m->g); free(m->units); free(m->dunits);
  plan_destroy(&m->p);
}

/* One forward and backward over every unit; returns Σ loss. */
static double fwd_bwd(const plan_t *p, model_acts *a, const weights *m, const int *inp, const int *tgt, float dscale) {
  float loss = 0;
  model_forward_backward(p, a, (void *const *)m->units, m->dunits, inp, tgt, dscale, &loss);
  return loss;
}

static void tokens(int *inp, int *tgt, int n, int V, uint64_t seed) {
  for (int i = 0; i < n; i++) {
    inp[i] = (int)(rng_uniform(seed, 1, (uint64_t)i) * V);
    tgt[i] = (int)(rng_uniform(seed, 2, (uint64_t)i) * V);
  }
}

/* The architecture's two allocations, in bytes. */
static int64_t acts_saved_bytes(const model_acts *a) { return model_acts_arena(a)->saved_bytes; }
static int64_t acts_ws_bytes(const model_acts *a) { return model_acts_arena(a)->ws_bytes; }

/* The buffers are the planner's activation and workspace terms (less the token ids, which the
 * runtime allocates). */
static void expect_plan_buffers(const plan_t *p, const model_acts *a) {
  const int64_t N = (int64_t)p->batch_size * p->model.seq_len;
  CHECK_EQ_INT((int64_t)p->mem[MEM_ACTIVATIONS] - 8 * N, acts_saved_bytes(a));
  CHECK_EQ_INT((int64_t)p->mem[MEM_WORKSPACE], acts_ws_bytes(a));
}

/* Model M with batch B against REF_LOSS; DEV: the synchronous CPU device. */
static void gradcheck_model(model_config mc, int B, device_t *dev, gradcheck_loss_fn ref_loss) {
  jobspec_t spec, *s = &spec;
  gradcheck_spec(s, mc, B);
  const int N = s->batch_size * s->model.seq_len;
  weights m;
  CHECK(weights_new(&m, s, 1234) == 0);
  if (!m.p) return;
  const plan_t *p = m.p;
  /* Move away from the init (norms 1, biases 0, tiny weights) so every term matters. */
  for (int u = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++) {
      const plan_tensor *pt = &p->units[u].t[t];
      for (int64_t k = 0; k < pt->numel; k++)
        m.units[u][pt->offset + k] += 0.3f * rng_normal(99, (uint32_t)pt->gid, (uint64_t)k);
    }
  int *inp = calloc((size_t)N, sizeof(int)), *tgt = calloc((size_t)N, sizeof(int));
  tokens(inp, tgt, N, s->model.vocab_size, 7);

  model_acts *a = model_acts_new(p, dev);
  CHECK(a != NULL);
  if (!a) return;
  double sum = fwd_bwd(p, a, &m, inp, tgt, 1.0f / N);

  double **w = calloc((size_t)p->nunits, sizeof(double *));
  for (int u = 0; u < p->nunits; u++) {
    w[u] = calloc((size_t)p->units[u].numel, sizeof(double));
    for (int64_t i = 0; i < p->units[u].numel; i++) w[u][i] = m.units[u][i];
  }
  double ref0 = ref_loss(p, w, inp, tgt);
  CHECK_NEAR(ref0, sum / N, 0, 1e-5);     /* fp32 forward vs double: a few ulps of the loss */

  /* Finite differences over every parameter. */
  const double h = 1e-5;
  double gmax = 0;
  int64_t nparam = 0;
  for (int u = 0; u < p->nunits; u++) nparam += p->units[u].numel;
  CHECK_EQ_INT(p->n_params, nparam);
  double *gref = malloc(sizeof(double) * (size_t)nparam);
  int64_t idx = 0;
  for (int u = 0; u < p->nunits; u++)
    for (int64_t i = 0; i < p->units[u].numel; i++, idx++) {
      double w0 = w[u][i];
      w[u][i] = w0 + h;
      double lp = ref_loss(p, w, inp, tgt);
      w[u][i] = w0 - h;
      double lm = ref_loss(p, w, inp, tgt);
      w[u][i] = w0;
      gref[idx] = (lp - lm) / (2 * h);
      if (fabs(gref[idx]) > gmax) gmax = fabs(gref[idx]);
    }
  int bad = 0, zero_tensor = 0;
  double worst = 0;
  int64_t ubase = 0;   /* where unit u starts in gref (units in order, unpadded) */
  for (int u = 0; u < p->nunits; u++) {
    for (int t = 0; t < p->units[u].ntensors; t++) {
      const plan_tensor *pt = &p->units[u].t[t];
      double tmax = 0;
      for (int64_t k = 0; k < pt->numel; k++) {
        double g = m.dunits[u][pt->offset + k], e = gref[ubase + pt->offset + k];
        double err = fabs(g - e) / (4e-5 * gmax + 1e-4 * fabs(e));
        if (fabs(e) > tmax) tmax = fabs(e);
        if (err > worst) worst = err;
        if (err > 1.0 && bad++ < 10)
          fprintf(stderr, "grad %s[%lld]: model %.9g, finite difference %.9g\n", pt->name, (long long)k, g, e);
      }
      zero_tensor += tmax < 1e-3 * gmax;   /* every tensor takes part in the loss */
    }
    ubase += p->units[u].numel;
  }
  printf("gradcheck: %lld parameters, max |g| %.3g, worst error / tolerance %.3g\n", (long long)nparam, gmax, worst);
  CHECK(gmax > 1e-3);
  CHECK_EQ_INT(0, bad);
  CHECK_EQ_INT(0, zero_tensor);

  /* Gradients accumulate: a second identical micro-step doubles them. */
  const size_t gbytes = sizeof(float) * (size_t)p->shard_total;
  float *g1 = malloc(gbytes);
  memcpy(g1, m.g, gbytes);
  double sum2 = fwd_bwd(p, a, &m, inp, tgt, 1.0f / N);
  CHECK_NEAR(sum, sum2, 0, 0);   /* deterministic */
  double maxdiff = 0;
  for (int64_t i = 0; i < p->shard_total; i++) {
    double d = fabs(m.g[i] - 2.0 * g1[i]);
    if (d > maxdiff) maxdiff = d;
  }
  CHECK(maxdiff <= 1e-6 * gmax);

  /* Activation checkpointing: the recomputed forward gives the same bits, in smaller buffers. */
  jobspec_t sc = *s;
  sc.ackpt = ACKPT_FULL;
  plan_t *pc = NULL;
  CHECK_OK(plan_build(&sc, 1, &pc));
  model_acts *ac = pc ? model_acts_new(pc, dev) : NULL;
  CHECK(ac != NULL);
  if (ac) {
    expect_plan_buffers(pc, ac);
    CHECK(acts_saved_bytes(ac) < acts_saved_bytes(a));
    memset(m.g, 0, gbytes);
    double sum_ck = fwd_bwd(pc, ac, &m, inp, tgt, 1.0f / N);
    CHECK_NEAR(sum, sum_ck, 0, 0);
    CHECK(!memcmp(g1, m.g, gbytes));
  }
  model_acts_destroy(&ac);
  plan_destroy(&pc);

  free(g1);
  free(gref);
  for (int u = 0; u < p->nunits; u++) free(w[u]);
  free(w);
  free(inp);
  free(tgt);
  model_acts_destroy(&a);
  CHECK(a == NULL);
  weights_free(&m);
}

/* At init the logits are nearly zero, so the loss is ≈ ln V (within 0.03: the test's header says
 * why); the buffers are the planner's terms and the tracked allocator saw exactly them. */
static void gradcheck_init_loss(model_config mc, int B, device_t *dev) {
  jobspec_t spec, *s = &spec;
  gradcheck_spec(s, mc, B);
  const int N = s->batch_size * s->model.seq_len, V = s->model.vocab_size;
  weights m;
  CHECK(weights_new(&m, s, 42) == 0);
  if (!m.p) return;
  int *inp = calloc((size_t)N, sizeof(int)), *tgt = calloc((size_t)N, sizeof(int));
  tokens(inp, tgt, N, V, 3);
  model_acts *a = model_acts_new(m.p, dev);
  CHECK(a != NULL);
  if (!a) return;
  expect_plan_buffers(m.p, a);
  double loss = fwd_bwd(m.p, a, &m, inp, tgt, 1.0f / N) / N;
  printf("init loss %.5f, ln V %.5f\n", loss, log(V));
  CHECK_NEAR(log(V), loss, 0.03, 0);
  mem_stats st;
  mem_get_stats(&st);
  CHECK_EQ_INT(acts_saved_bytes(a), (int64_t)st.cur[MEM_ACTIVATIONS]);
  CHECK_EQ_INT(acts_ws_bytes(a), (int64_t)st.cur[MEM_WORKSPACE]);
  model_acts_destroy(&a);
  mem_get_stats(&st);
  CHECK_EQ_INT(0, (int64_t)st.cur[MEM_ACTIVATIONS]);
  CHECK_EQ_INT(0, (int64_t)st.cur[MEM_WORKSPACE]);
  free(inp);
  free(tgt);
  weights_free(&m);
}

#endif
