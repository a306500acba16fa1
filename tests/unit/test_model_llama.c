/* test_model_llama — Llama forward and backward (worker/model_llama through worker/model.h) against
 * an independent double-precision reference written here from Hugging Face's LlamaForCausalLM
 * (RMSNorm, rotate-half rotary, grouped-query attention, SwiGLU, untied head), and its gradient
 * against central finite differences of that reference, for every parameter.
 *
 * Tolerance: the argument of test_model.c (GPT-2's gradient check) carries over: a chain of ~24
 * fp32 operators, each a sum over at most max(B·T, 2F, Q) = 32 terms, so |g − g_ref| ≤
 * 4e-5·G + 1e-4·|g_ref| is the worst-case rounding bound and ~10^4 below what a wrong index, a
 * missing term or a wrong sign gives. Also: activation checkpointing gives bit-identical gradients,
 * the buffers are the planner's terms to the byte, and the loss at init is ≈ ln V.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jobspec.h"
#include "mem.h"
#include "model.h"
#include "plan.h"
#include "rng.h"

/* ---------------------------------------------------------------- double reference model */

typedef struct ref {
  const plan_t *p;
  int B, T, C, NH, NKV, F, V, L;
  double eps, theta;
  double **w;     /* w[u]: unit u's flat buffer in double */
} ref;

static const double *P(const ref *r, int u, int slot) { return r->w[u] + r->p->units[u].t[slot].offset; }

static void ref_rmsnorm(double *out, const double *x, const double *g, int N, int C, double eps) {
  for (int n = 0; n < N; n++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += x[(size_t)n * C + c] * x[(size_t)n * C + c];
    double rs = 1.0 / sqrt(ms / C + eps);
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = x[(size_t)n * C + c] * rs * g[c];
  }
}

/* nn.Linear without bias: out[n, o] = Σ_c x[n, c]·w[o, c], w is [OC, C]. */
static void ref_linear(double *out, const double *x, const double *w, int N, int C, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = 0;
      for (int c = 0; c < C; c++) s += x[(size_t)n * C + c] * w[(size_t)o * C + c];
      out[(size_t)n * OC + o] = s;
    }
}

/* transformers' apply_rotary_pos_emb on one head vector at position t: x·cos + rotate_half(x)·sin,
 * inv_freq[i] = theta^(−2i/HS), cos and sin repeated over both halves. */
static void ref_rope(double *x, int HS, int t, double theta) {
  for (int i = 0; i < HS / 2; i++) {
    double ang = t * pow(theta, -2.0 * i / HS), c = cos(ang), s = sin(ang);
    double a = x[i], b = x[i + HS / 2];
    x[i] = a * c - b * s;
    x[i + HS / 2] = b * c + a * s;
  }
}

/* Mean cross-entropy over B·T tokens. */
static double ref_loss(const ref *r, const int *inp, const int *tgt) {
  const int B = r->B, T = r->T, C = r->C, NH = r->NH, NKV = r->NKV, F = r->F, V = r->V, N = B * T;
  const int HS = C / NH, KV = NKV * HS, Q = C + 2 * KV;
  double *x = malloc(sizeof(double) * N * C), *h = malloc(sizeof(double) * N * C);
  double *qkv = malloc(sizeof(double) * N * Q), *y = malloc(sizeof(double) * N * C);
  double *gu = malloc(sizeof(double) * N * 2 * F), *a = malloc(sizeof(double) * N * F);
  double *t = malloc(sizeof(double) * N * C), *lg = malloc(sizeof(double) * V);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) x[n * C + c] = P(r, 0, LROOT_EMBED)[(size_t)inp[n] * C + c];
  for (int l = 0; l < r->L; l++) {
    int u = 1 + l;
    ref_rmsnorm(h, x, P(r, u, LBLK_LN1_W), N, C, r->eps);
    /* separate projections, as Hugging Face runs them */
    for (int n = 0; n < N; n++) {
      ref_linear(qkv + (size_t)n * Q, h + (size_t)n * C, P(r, u, LBLK_Q), 1, C, C);
      ref_linear(qkv + (size_t)n * Q + C, h + (size_t)n * C, P(r, u, LBLK_K), 1, C, KV);
      ref_linear(qkv + (size_t)n * Q + C + KV, h + (size_t)n * C, P(r, u, LBLK_V), 1, C, KV);
      int pos = n % T;
      for (int hd = 0; hd < NH; hd++) ref_rope(qkv + (size_t)n * Q + hd * HS, HS, pos, r->theta);
      for (int hd = 0; hd < NKV; hd++) ref_rope(qkv + (size_t)n * Q + C + hd * HS, HS, pos, r->theta);
    }
    for (int b = 0; b < B; b++)
      for (int hd = 0; hd < NH; hd++) {
        int kvh = hd / (NH / NKV);   /* repeat_kv */
        for (int i = 0; i < T; i++) {
          const double *q = qkv + (size_t)(b * T + i) * Q + hd * HS;
          double s[64], mx = -1e300, z = 0;
          for (int j = 0; j <= i; j++) {
            const double *k = qkv + (size_t)(b * T + j) * Q + C + kvh * HS;
            double d = 0;
            for (int e = 0; e < HS; e++) d += q[e] * k[e];
            s[j] = d / sqrt((double)HS);
            if (s[j] > mx) mx = s[j];
          }
          for (int j = 0; j <= i; j++) z += (s[j] = exp(s[j] - mx));
          for (int e = 0; e < HS; e++) {
            double acc = 0;
            for (int j = 0; j <= i; j++) acc += s[j] / z * qkv[(size_t)(b * T + j) * Q + C + KV + kvh * HS + e];
            y[(size_t)(b * T + i) * C + hd * HS + e] = acc;
          }
        }
      }
    ref_linear(t, y, P(r, u, LBLK_O), N, C, C);
    for (int i = 0; i < N * C; i++) x[i] += t[i];
    ref_rmsnorm(h, x, P(r, u, LBLK_LN2_W), N, C, r->eps);
    ref_linear(gu, h, P(r, u, LBLK_GATE), N, C, F);
    ref_linear(a, h, P(r, u, LBLK_UP), N, C, F);
    for (int i = 0; i < N * F; i++) a[i] *= gu[i] / (1.0 + exp(-gu[i]));   /* silu(gate)·up */
    ref_linear(t, a, P(r, u, LBLK_DOWN), N, F, C);
    for (int i = 0; i < N * C; i++) x[i] += t[i];
  }
  ref_rmsnorm(h, x, P(r, 0, LROOT_NORM), N, C, r->eps);
  double loss = 0;
  for (int n = 0; n < N; n++) {
    double mx = -1e300, z = 0;
    ref_linear(lg, h + (size_t)n * C, P(r, 0, LROOT_HEAD), 1, C, V);
    for (int v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
    for (int v = 0; v < V; v++) z += exp(lg[v] - mx);
    loss += mx + log(z) - lg[tgt[n]];
  }
  free(x); free(h); free(qkv); free(y); free(gu); free(a); free(t); free(lg);
  return loss / N;
}

/* ---------------------------------------------------------------- helpers */

static void spec_for(jobspec_t *s, int L, int H, int KV, int C, int F, int V, int T, int B) {
  jobspec_defaults(s);
  s->model = (model_config){.arch = ARCH_LLAMA, .n_layer = L, .n_head = H, .n_embd = C, .vocab_size = V,
                            .seq_len = T, .n_kv_head = KV, .ffn_dim = F, .norm_eps = 1e-5, .rope_theta = 10000};
  s->batch_size = B;
  s->grad_accum = 1;
  s->world_size = 1;
  s->device = DEVICE_CPU;
  s->param_dtype = s->reduce_dtype = DTYPE_FP32;
}

typedef struct weights {
  plan_t *p;
  float *w, *g;          /* world-1 shards */
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

static device_t *g_dev;   /* the synchronous CPU device */

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

/* ---------------------------------------------------------------- tests */

/* Gradient of the mean loss vs finite differences of the double reference, every parameter; GQA
 * with two query heads per kv head. Then the same step with activation checkpointing. */
static void test_gradcheck(void) {
  const int L = 2, H = 4, KV = 2, C = 16, F = 12, V = 16, T = 5, B = 2, N = B * T;
  jobspec_t s;
  spec_for(&s, L, H, KV, C, F, V, T, B);
  weights m;
  CHECK(weights_new(&m, &s, 1234) == 0);
  if (!m.p) return;
  const plan_t *p = m.p;
  /* Away from the init (norms 1, tiny weights) so every term matters. */
  for (int u = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++) {
      const plan_tensor *pt = &p->units[u].t[t];
      for (int64_t k = 0; k < pt->numel; k++)
        m.units[u][pt->offset + k] += 0.3f * rng_normal(99, (uint32_t)pt->gid, (uint64_t)k);
    }
  int inp[N], tgt[N];
  tokens(inp, tgt, N, V, 7);

  model_acts *a = model_acts_new(p, g_dev);
  CHECK(a != NULL);
  if (!a) return;
  double sum = fwd_bwd(p, a, &m, inp, tgt, 1.0f / N);

  ref r = {.p = p, .B = B, .T = T, .C = C, .NH = H, .NKV = KV, .F = F, .V = V, .L = L, .eps = 1e-5, .theta = 10000};
  r.w = calloc((size_t)p->nunits, sizeof(double *));
  for (int u = 0; u < p->nunits; u++) {
    r.w[u] = calloc((size_t)p->units[u].numel, sizeof(double));
    for (int64_t i = 0; i < p->units[u].numel; i++) r.w[u][i] = m.units[u][i];
  }
  double ref0 = ref_loss(&r, inp, tgt);
  CHECK_NEAR(ref0, sum / N, 0, 1e-5);

  const double h = 1e-5;
  double gmax = 0;
  int64_t nparam = 0;
  for (int u = 0; u < p->nunits; u++) nparam += p->units[u].numel;
  CHECK_EQ_INT(p->n_params, nparam);
  double *gref = malloc(sizeof(double) * (size_t)nparam);
  int64_t idx = 0;
  for (int u = 0; u < p->nunits; u++)
    for (int64_t i = 0; i < p->units[u].numel; i++, idx++) {
      double w0 = r.w[u][i];
      r.w[u][i] = w0 + h;
      double lp = ref_loss(&r, inp, tgt);
      r.w[u][i] = w0 - h;
      double lm = ref_loss(&r, inp, tgt);
      r.w[u][i] = w0;
      gref[idx] = (lp - lm) / (2 * h);
      if (fabs(gref[idx]) > gmax) gmax = fabs(gref[idx]);
    }
  int bad = 0, zero_tensor = 0;
  double worst = 0;
  int64_t ubase = 0;
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

  /* Activation checkpointing: the recomputed forward gives the same bits. */
  float *g1 = malloc(sizeof(float) * (size_t)p->shard_total);
  memcpy(g1, m.g, sizeof(float) * (size_t)p->shard_total);
  s.ackpt = ACKPT_FULL;
  plan_t *pc = NULL;
  CHECK_OK(plan_build(&s, 1, &pc));
  model_acts *ac = pc ? model_acts_new(pc, g_dev) : NULL;
  CHECK(ac != NULL);
  if (ac) {
    CHECK_EQ_INT((int64_t)pc->mem[MEM_ACTIVATIONS] - 8 * N, ac->llama->saved_bytes);
    CHECK_EQ_INT((int64_t)pc->mem[MEM_WORKSPACE], ac->llama->ws_bytes);
    CHECK(ac->llama->saved_bytes < a->llama->saved_bytes);
    memset(m.g, 0, sizeof(float) * (size_t)p->shard_total);
    double sum_ck = fwd_bwd(pc, ac, &m, inp, tgt, 1.0f / N);
    CHECK_NEAR(sum, sum_ck, 0, 0);
    CHECK(!memcmp(g1, m.g, sizeof(float) * (size_t)p->shard_total));
  }
  model_acts_destroy(&ac);
  plan_destroy(&pc);

  free(g1);
  free(gref);
  for (int u = 0; u < p->nunits; u++) free(r.w[u]);
  free(r.w);
  model_acts_destroy(&a);
  CHECK(a == NULL);
  weights_free(&m);
}

/* At init the logits are nearly zero, so the loss is ≈ ln V; the buffers are the planner's terms
 * and the tracked allocator saw exactly them. */
static void test_init_loss(void) {
  const int L = 2, H = 4, KV = 1, C = 32, F = 88, V = 64, T = 16, B = 4, N = B * T;
  jobspec_t s;
  spec_for(&s, L, H, KV, C, F, V, T, B);
  weights m;
  CHECK(weights_new(&m, &s, 42) == 0);
  if (!m.p) return;
  int inp[N], tgt[N];
  tokens(inp, tgt, N, V, 3);
  model_acts *a = model_acts_new(m.p, g_dev);
  CHECK(a != NULL);
  if (!a) return;
  CHECK_EQ_INT((int64_t)m.p->mem[MEM_ACTIVATIONS] - 8 * N, a->llama->saved_bytes);
  CHECK_EQ_INT((int64_t)m.p->mem[MEM_WORKSPACE], a->llama->ws_bytes);
  double loss = fwd_bwd(m.p, a, &m, inp, tgt, 1.0f / N) / N;
  printf("init loss %.5f, ln V %.5f\n", loss, log(V));
  CHECK_NEAR(log(V), loss, 0.03, 0);
  mem_stats st;
  mem_get_stats(&st);
  CHECK_EQ_INT(a->llama->saved_bytes, (int64_t)st.cur[MEM_ACTIVATIONS]);
  CHECK_EQ_INT(a->llama->ws_bytes, (int64_t)st.cur[MEM_WORKSPACE]);
  model_acts_destroy(&a);
  mem_get_stats(&st);
  CHECK_EQ_INT(0, (int64_t)st.cur[MEM_ACTIVATIONS]);
  CHECK_EQ_INT(0, (int64_t)st.cur[MEM_WORKSPACE]);
  weights_free(&m);
}

int main(void) {
  if (device_new_cpu(DEV_CPU_SYNC, &g_dev) != FSDP_OK) return 2;
  test_gradcheck();
  test_init_loss();
  device_destroy(&g_dev);
  return check_done();
}
