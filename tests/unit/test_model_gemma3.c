/* test_model_gemma3 — Gemma 3's forward and backward (models/gemma3/model_gemma3.c through
 * worker/model/model.h) against an independent double-precision reference written here from
 * transformers' modeling_gemma3.py (Gemma3ForCausalLM): the embedding times √C, every RMSNorm scaled
 * by 1 + w, q/k norms before rope, attention scaled by query_pre_attn_scalar^-1/2, sliding layers in
 * their window (kv_idx > q_idx − W, masking_utils) with the local rope base and global ones causal
 * with rope_theta, the post-attention and post-feedforward norms before each residual add, GeGLU
 * (gelu_pytorch_tanh) and the tied head. Its gradient against central finite differences of that
 * reference, every parameter, at head_dim ≠ C / H, qpas ≠ head_dim, a window below T and both layer
 * kinds; then with packed rows (documents); accumulation, activation checkpointing (the same bits in
 * gemma3_act's smaller buffers), the buffers equal to gemma3_act's terms, the loss at init ≈ ln V.
 * And the reference with a planted error — w for 1 + w, the embedding unscaled, head_dim^-1/2 for
 * qpas^-1/2, the window one key wider — is far from the model: each would fail the comparison.
 *
 * Tolerance: test_model_llama's argument (fp32 operators in a chain of ~30, sums of at most
 * max(B·T, 2F, Q) = 32 terms): |g − g_ref| ≤ 4e-5·G + 1e-4·|g_ref|, and the loss to 1e-5.
 *
 * The plan is built here (units, offsets, gids), not by plan_build, so that the compute is tested
 * apart from the descriptor (models/gemma3/gemma3_arch.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device.h"
#include "gemma3.h"
#include "mem.h"
#include "model.h"
#include "model_gemma3.h"
#include "plan.h"
#include "refrope.h"
#include "rng.h"

/* ---------------------------------------------------------------- the plan, by hand */

static void add_tensor(plan_unit *pu, int *gid, const char *name, int64_t r, int64_t c) {
  plan_tensor *t = &pu->t[pu->ntensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->gid = (*gid)++;
  t->ndim = c ? 2 : 1;
  t->shape[0] = r, t->shape[1] = c;
  t->numel = c ? r * c : r;
  t->offset = pu->numel;
  t->decay = c != 0;
  pu->numel += t->numel;
}

/* One rank, fp32, the CPU: units in gemma3.h's order, unpadded (world 1). */
static plan_t *gemma3_plan(model_config m, int B, ackpt_mode ck) {
  plan_t *p = calloc(1, sizeof *p);
  p->model = m;
  p->world = p->shard_world = p->ngroups = 1;
  p->param_dtype = p->reduce_dtype = DTYPE_FP32;
  p->device = DEVICE_CPU;
  p->ackpt = ck;
  p->batch_size = B, p->grad_accum = 1;
  p->nunits = 1 + m.n_layer;
  p->units = calloc((size_t)p->nunits, sizeof *p->units);
  const int64_t C = m.n_embd, HD = gemma3_head_dim(&m), QD = m.n_head * HD, KV = m.n_kv_head * HD, F = m.ffn_dim;
  int gid = 0;
  add_tensor(&p->units[0], &gid, "model.embed_tokens.weight", m.vocab_size, C);
  add_tensor(&p->units[0], &gid, "model.norm.weight", C, 0);
  for (int l = 0; l < m.n_layer; l++) {
    plan_unit *u = &p->units[1 + l];
    const char *n[G3_NT] = {"input_layernorm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "o_proj",
                            "post_attention_layernorm", "pre_feedforward_layernorm", "gate_proj", "up_proj",
                            "down_proj", "post_feedforward_layernorm"};
    const int64_t shp[G3_NT][2] = {{C, 0}, {QD, C}, {KV, C}, {KV, C}, {HD, 0}, {HD, 0}, {C, QD}, {C, 0}, {C, 0},
                                   {F, C}, {F, C}, {C, F}, {C, 0}};
    for (int t = 0; t < G3_NT; t++) add_tensor(u, &gid, n[t], shp[t][0], shp[t][1]);
  }
  for (int u = 0; u < p->nunits; u++) {
    plan_unit *pu = &p->units[u];
    pu->padded = pu->shard_numel = pu->numel;
    pu->shard_base = p->shard_total;
    p->shard_total += pu->numel;
  }
  return p;
}

static void plan_free(plan_t **p) {
  if (!*p) return;
  free((*p)->units);
  free(*p);
  *p = NULL;
}

/* ---------------------------------------------------------------- double reference model */

/* What the reference computes wrong on purpose (0: transformers' model). */
typedef struct planted {
  int norm_w;          /* RMSNorm scale w instead of 1 + w */
  int unscaled_embed;  /* no √C */
  int hd_scale;        /* attention scaled by head_dim^-1/2 */
  int wide_window;     /* the window one key wider */
} planted;

#define P(u, slot) (w[u] + p->units[u].t[slot].offset)

/* Gemma3RMSNorm: x·rstd·(1 + g). */
static void ref_rmsnorm(double *out, const double *x, const double *g, int N, int C, double eps, const planted *e) {
  for (int n = 0; n < N; n++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += x[(size_t)n * C + c] * x[(size_t)n * C + c];
    double rs = 1.0 / sqrt(ms / C + eps);
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = x[(size_t)n * C + c] * rs * ((e->norm_w ? 0.0 : 1.0) + g[c]);
  }
}

static void ref_linear(double *out, const double *x, const double *w, int N, int C, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = 0;
      for (int c = 0; c < C; c++) s += x[(size_t)n * C + c] * w[(size_t)o * C + c];
      out[(size_t)n * OC + o] = s;
    }
}

static void ref_rope(double *x, int HS, int t, double theta) {
  for (int i = 0; i < HS / 2; i++) {
    double ang = t * ref_inv_freq(i, HS, theta, NULL), c = cos(ang), s = sin(ang);
    double a = x[i], b = x[i + HS / 2];
    x[i] = a * c - b * s;
    x[i + HS / 2] = b * c + a * s;
  }
}

static double gelu_tanh_d(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

/* Mean cross-entropy over B·T tokens; SEG (NULL: one document per row) as model_set_docs'. */
static double ref_loss(const plan_t *p, double *const *w, const int *inp, const int *tgt, const int32_t *seg,
                       const planted *e) {
  const model_config *mc = &p->model;
  const int B = p->batch_size, T = mc->seq_len, C = mc->n_embd, NH = mc->n_head, NKV = mc->n_kv_head;
  const int F = mc->ffn_dim, V = mc->vocab_size, L = mc->n_layer, N = B * T, HS = gemma3_head_dim(mc);
  const int QD = NH * HS, KV = NKV * HS, Q = QD + 2 * KV;
  const double eps = mc->norm_eps, scale = e->hd_scale ? 1.0 / sqrt((double)HS) : 1.0 / sqrt(gemma3_qpas(mc));
  const double escale = e->unscaled_embed ? 1.0 : (double)(float)sqrt((double)C);
  double *x = calloc((size_t)N * C, sizeof(double)), *h = malloc(sizeof(double) * N * C);
  double *qkv = malloc(sizeof(double) * N * Q), *y = malloc(sizeof(double) * N * QD);
  double *gt = malloc(sizeof(double) * N * F), *up = malloc(sizeof(double) * N * F);
  double *t = malloc(sizeof(double) * N * C), *lg = malloc(sizeof(double) * V);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) x[n * C + c] = P(0, G3ROOT_EMBED)[(size_t)inp[n] * C + c] * escale;
  for (int l = 0; l < L; l++) {
    const int u = 1 + l, global = gemma3_is_global(mc, l);
    const double theta = global ? mc->rope_theta : gemma3_local_theta(mc);
    const int W = global ? 0 : mc->sliding_window + (e->wide_window ? 1 : 0);
    ref_rmsnorm(h, x, P(u, G3_LN1), N, C, eps, e);
    for (int n = 0; n < N; n++) {   /* q, k, v apart, their norms per head, then rope */
      double *q = qkv + (size_t)n * Q, *k = q + QD, *v = k + KV;
      ref_linear(q, h + (size_t)n * C, P(u, G3_Q), 1, C, QD);
      ref_linear(k, h + (size_t)n * C, P(u, G3_K), 1, C, KV);
      ref_linear(v, h + (size_t)n * C, P(u, G3_V), 1, C, KV);
      ref_rmsnorm(q, q, P(u, G3_QN), NH, HS, eps, e);
      ref_rmsnorm(k, k, P(u, G3_KN), NKV, HS, eps, e);
      int pos = n % T - (seg ? seg[n] : 0);
      for (int hd = 0; hd < NH; hd++) ref_rope(q + hd * HS, HS, pos, theta);
      for (int hd = 0; hd < NKV; hd++) ref_rope(k + hd * HS, HS, pos, theta);
    }
    for (int b = 0; b < B; b++)
      for (int hd = 0; hd < NH; hd++) {
        int kvh = hd / (NH / NKV);
        for (int i = 0; i < T; i++) {
          const double *q = qkv + (size_t)(b * T + i) * Q + hd * HS;
          int lo = seg ? seg[b * T + i] : 0;
          if (W > 0 && i - W + 1 > lo) lo = i - W + 1;   /* kv_idx > q_idx − W */
          double s[64], mx = -1e300, z = 0;
          for (int j = lo; j <= i; j++) {
            const double *k = qkv + (size_t)(b * T + j) * Q + QD + kvh * HS;
            double d = 0;
            for (int c = 0; c < HS; c++) d += q[c] * k[c];
            s[j] = d * scale;
            if (s[j] > mx) mx = s[j];
          }
          for (int j = lo; j <= i; j++) z += (s[j] = exp(s[j] - mx));
          for (int c = 0; c < HS; c++) {
            double acc = 0;
            for (int j = lo; j <= i; j++) acc += s[j] / z * qkv[(size_t)(b * T + j) * Q + QD + KV + kvh * HS + c];
            y[(size_t)(b * T + i) * QD + hd * HS + c] = acc;
          }
        }
      }
    ref_linear(t, y, P(u, G3_O), N, QD, C);
    ref_rmsnorm(t, t, P(u, G3_POST_ATTN), N, C, eps, e);
    for (int i = 0; i < N * C; i++) x[i] += t[i];
    ref_rmsnorm(h, x, P(u, G3_PRE_FF), N, C, eps, e);
    ref_linear(gt, h, P(u, G3_GATE), N, C, F);
    ref_linear(up, h, P(u, G3_UP), N, C, F);
    for (int i = 0; i < N * F; i++) up[i] *= gelu_tanh_d(gt[i]);
    ref_linear(t, up, P(u, G3_DOWN), N, F, C);
    ref_rmsnorm(t, t, P(u, G3_POST_FF), N, C, eps, e);
    for (int i = 0; i < N * C; i++) x[i] += t[i];
  }
  ref_rmsnorm(h, x, P(0, G3ROOT_NORM), N, C, eps, e);
  double loss = 0;
  for (int n = 0; n < N; n++) {
    double mx = -1e300, z = 0;
    ref_linear(lg, h + (size_t)n * C, P(0, G3ROOT_EMBED), 1, C, V);
    for (int v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
    for (int v = 0; v < V; v++) z += exp(lg[v] - mx);
    loss += mx + log(z) - lg[tgt[n]];
  }
  free(x); free(h); free(qkv); free(y); free(gt); free(up); free(t); free(lg);
  return loss / N;
}

/* ---------------------------------------------------------------- the model through model.h */

static device_t *g_dev;

static model_acts *acts_new(const plan_t *p) {
  void *s = gemma3_model.acts_new(p, g_dev);
  CHECK(s != NULL);
  if (!s) return NULL;
  model_acts *a = calloc(1, sizeof *a);
  a->ops = &gemma3_model;
  a->acts = s;
  return a;
}

static void acts_free(model_acts **a) {
  if (!*a) return;
  gemma3_model.acts_destroy((*a)->acts);
  free(*a);
  *a = NULL;
}

/* Σ loss of one forward and backward over every unit (gradients += into G). */
static double fwd_bwd(const plan_t *p, model_acts *a, float *wts, float *g, const int *inp, const int *tgt) {
  void **units = calloc((size_t)p->nunits, sizeof(void *));
  float **dunits = calloc((size_t)p->nunits, sizeof(float *));
  for (int u = 0; u < p->nunits; u++) units[u] = wts + p->units[u].shard_base, dunits[u] = g + p->units[u].shard_base;
  const int N = p->batch_size * p->model.seq_len;
  float loss = 0;
  model_forward_backward(p, a, units, dunits, inp, tgt, 1.0f / N, &loss);
  free(units);
  free(dunits);
  return loss;
}

/* Gemma 3 of these sizes: 3 layers with pattern 2 (sliding, global, sliding), eps 1e-6, rope_theta
 * 1e6 and the local base 1e4, head_dim 6 (≠ C / H = 4), qpas 8 (≠ head_dim), window 3 below T = 6. */
static model_config gemma3(void) {
  /* arch: the model reads none of it (ARCH_GEMMA3 is models.def's, with the descriptor) */
  model_config m = {.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 3, .n_head = 4, .n_kv_head = 2, .n_embd = 16, .head_dim = 6,
                    .ffn_dim = 12, .vocab_size = 16, .seq_len = 6, .norm_eps = 1e-6, .rope_theta = 1e6,
                    .sliding_window = 3, .tie_embeddings = 1};
  m.ext[G3X_QUERY_PRE_ATTN_SCALAR] = 8;
  m.ext[G3X_ROPE_LOCAL_THETA] = 1e4;
  m.ext[G3X_PATTERN] = 2;
  return m;
}

/* The shard at the model's init, then moved away from it (norms 0, tiny weights) so every term matters. */
static float *weights(const plan_t *p, double spread) {
  float *w = calloc((size_t)p->shard_total, sizeof(float));
  for (int u = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++) {
      const plan_tensor *pt = &p->units[u].t[t];
      for (int64_t k = 0; k < pt->numel; k++)
        w[p->units[u].shard_base + pt->offset + k] =
            gemma3_model.init_value(p, u, t, 1234, k) + (float)spread * rng_normal(99, (uint32_t)pt->gid, (uint64_t)k);
    }
  return w;
}

static void tokens(int *inp, int *tgt, int n, int V) {
  for (int i = 0; i < n; i++) {
    inp[i] = (int)(rng_uniform(7, 1, (uint64_t)i) * V);
    tgt[i] = (int)(rng_uniform(7, 2, (uint64_t)i) * V);
  }
}

/* Every gradient against finite differences of the reference, with documents SEG (NULL: none); the
 * reference with each planted error is far from the model's loss. */
static void gradcheck(const int32_t *seg) {
  const model_config mc = gemma3();
  const int B = 2, N = B * mc.seq_len;
  plan_t *p = gemma3_plan(mc, B, ACKPT_NONE);
  float *wts = weights(p, 0.3), *g = calloc((size_t)p->shard_total, sizeof(float));
  int inp[12], tgt[12];
  tokens(inp, tgt, N, mc.vocab_size);
  model_acts *a = acts_new(p);
  if (!a) return;
  CHECK_OK(model_set_docs(a, p, seg));
  double sum = fwd_bwd(p, a, wts, g, inp, tgt);

  double **w = calloc((size_t)p->nunits, sizeof(double *));
  int64_t nparam = 0;
  for (int u = 0; u < p->nunits; u++) {
    w[u] = calloc((size_t)p->units[u].numel, sizeof(double));
    for (int64_t i = 0; i < p->units[u].numel; i++) w[u][i] = wts[p->units[u].shard_base + i];
    nparam += p->units[u].numel;
  }
  const planted none = {0};
  double ref0 = ref_loss(p, w, inp, tgt, seg, &none);
  printf("gemma3%s: loss %.9f, reference %.9f\n", seg ? " (packed rows)" : "", sum / N, ref0);
  CHECK_NEAR(ref0, sum / N, 0, 1e-5);
  const planted bad_ref[] = {{.norm_w = 1}, {.unscaled_embed = 1}, {.hd_scale = 1}, {.wide_window = 1}};
  for (size_t i = 0; i < sizeof bad_ref / sizeof bad_ref[0]; i++) {
    double l = ref_loss(p, w, inp, tgt, seg, &bad_ref[i]);
    if (!(fabs(l - ref0) > 10 * 1e-5 * fabs(ref0)))   /* ten times the comparison's tolerance */
      fprintf(stderr, "FAIL: planted error %zu moves the reference loss only from %.9f to %.9f\n", i, ref0, l);
    CHECK(fabs(l - ref0) > 10 * 1e-5 * fabs(ref0));
  }

  const double h = 1e-5;
  double gmax = 0, *gref = malloc(sizeof(double) * (size_t)nparam);
  for (int u = 0, idx = 0; u < p->nunits; u++)
    for (int64_t i = 0; i < p->units[u].numel; i++, idx++) {
      double w0 = w[u][i];
      w[u][i] = w0 + h;
      double lp = ref_loss(p, w, inp, tgt, seg, &none);
      w[u][i] = w0 - h;
      double lm = ref_loss(p, w, inp, tgt, seg, &none);
      w[u][i] = w0;
      gref[idx] = (lp - lm) / (2 * h);
      if (fabs(gref[idx]) > gmax) gmax = fabs(gref[idx]);
    }
  int bad = 0, zero_tensor = 0;
  double worst = 0;
  for (int u = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++) {
      const plan_tensor *pt = &p->units[u].t[t];
      double tmax = 0;
      for (int64_t k = 0; k < pt->numel; k++) {
        const int64_t at = p->units[u].shard_base + pt->offset + k;   /* unpadded: gref's index too */
        double gm = g[at], e = gref[at], err = fabs(gm - e) / (4e-5 * gmax + 1e-4 * fabs(e));
        if (fabs(e) > tmax) tmax = fabs(e);
        if (err > worst) worst = err;
        if (err > 1.0 && bad++ < 10)
          fprintf(stderr, "grad layer unit %d %s[%lld]: model %.9g, finite difference %.9g\n", u, pt->name,
                  (long long)k, gm, e);
      }
      zero_tensor += tmax < 1e-3 * gmax;
    }
  printf("gradcheck: %lld parameters, max |g| %.3g, worst error / tolerance %.3g\n", (long long)nparam, gmax, worst);
  CHECK(gmax > 1e-3);
  CHECK_EQ_INT(0, bad);
  CHECK_EQ_INT(0, zero_tensor);

  /* a second identical micro-step doubles the gradients */
  const size_t gbytes = sizeof(float) * (size_t)p->shard_total;
  float *g1 = malloc(gbytes);
  memcpy(g1, g, gbytes);
  CHECK_NEAR(sum, fwd_bwd(p, a, wts, g, inp, tgt), 0, 0);
  double maxdiff = 0;
  for (int64_t i = 0; i < p->shard_total; i++) maxdiff = fmax(maxdiff, fabs(g[i] - 2.0 * g1[i]));
  CHECK(maxdiff <= 1e-6 * gmax);

  /* activation checkpointing: the same bits, from smaller buffers */
  plan_t *pc = gemma3_plan(mc, B, ACKPT_FULL);
  model_acts *ac = acts_new(pc);
  if (ac) {
    CHECK_OK(model_set_docs(ac, pc, seg));
    CHECK(model_acts_arena(ac)->saved_bytes < model_acts_arena(a)->saved_bytes);
    memset(g, 0, gbytes);
    CHECK_NEAR(sum, fwd_bwd(pc, ac, wts, g, inp, tgt), 0, 0);
    CHECK(!memcmp(g1, g, gbytes));
  }
  acts_free(&ac);
  plan_free(&pc);
  free(g1);
  free(gref);
  for (int u = 0; u < p->nunits; u++) free(w[u]);
  free(w);
  acts_free(&a);
  free(wts);
  free(g);
  plan_free(&p);
}

static void test_gradcheck(void) { gradcheck(NULL); }

/* Packed rows: row 0 holds documents at 0 and 4, row 1 at 0, 2 and 3: positions restart, attention
 * stays inside each (and inside the window). */
static void test_gradcheck_docs(void) {
  static const int32_t seg[12] = {0, 0, 0, 0, 4, 4, 0, 0, 2, 3, 3, 3};
  gradcheck(seg);
}

/* The arena is gemma3_act's terms to the byte (both checkpointing modes), the tracked allocator saw
 * exactly it, and at init (norms 0, weights N(0, 0.02)) the loss is ≈ ln V. */
/* init = random, as Gemma3PreTrainedModel's: the embedding's pad_token_id row (the tied head's) 0; none: drawn. */
static void test_init_pad_row(void) {
  for (int v = 0; v < 2; v++) {
    model_config mc = gemma3();
    mc.pad_token_id = v ? -1 : 3;
    plan_t *p = gemma3_plan(mc, 1, ACKPT_NONE);
    int zero[2] = {0, 0};   /* row 3, rows 2 and 4: elements equal to 0 */
    for (int64_t c = 0; c < mc.n_embd; c++) {
      zero[0] += gemma3_model.init_value(p, 0, G3ROOT_EMBED, 7, 3 * mc.n_embd + c) == 0.0f;
      zero[1] += gemma3_model.init_value(p, 0, G3ROOT_EMBED, 7, 2 * mc.n_embd + c) == 0.0f;
      zero[1] += gemma3_model.init_value(p, 0, G3ROOT_EMBED, 7, 4 * mc.n_embd + c) == 0.0f;
    }
    CHECK_EQ_INT(v ? 0 : mc.n_embd, zero[0]);
    CHECK_EQ_INT(0, zero[1]);
    plan_free(&p);
  }
}

static void test_buffers_init_loss(void) {
  model_config mc = gemma3();
  mc.n_embd = 32, mc.ffn_dim = 88, mc.vocab_size = 64, mc.seq_len = 16, mc.sliding_window = 5;
  const int B = 3, N = B * mc.seq_len;
  for (int ck = 0; ck < 2; ck++) {
    plan_t *p = gemma3_plan(mc, B, ck ? ACKPT_FULL : ACKPT_NONE);
    const plan_act pa = gemma3_act(&mc, B, DEVICE_CPU, p->ackpt);
    model_acts *a = acts_new(p);
    if (!a) return;
    CHECK_EQ_INT(mc.n_layer * pa.block_bytes + pa.block_ws_bytes + pa.root_bytes, model_acts_arena(a)->saved_bytes);
    CHECK_EQ_INT(pa.bwd_ws_bytes > pa.head_ws_bytes ? pa.bwd_ws_bytes : pa.head_ws_bytes,
                 model_acts_arena(a)->ws_bytes);
    mem_stats st;
    mem_get_stats(&st);
    CHECK_EQ_INT(model_acts_arena(a)->saved_bytes, (int64_t)st.cur[MEM_ACTIVATIONS]);
    CHECK_EQ_INT(model_acts_arena(a)->ws_bytes, (int64_t)st.cur[MEM_WORKSPACE]);
    float *wts = weights(p, 0.0), *g = calloc((size_t)p->shard_total, sizeof(float));
    for (int u = 0; u < p->nunits; u++)   /* the init: every norm weight 0 */
      for (int t = 0; t < p->units[u].ntensors; t++)
        if (p->units[u].t[t].ndim == 1) CHECK(wts[p->units[u].shard_base + p->units[u].t[t].offset] == 0.0f);
    int *inp = calloc((size_t)N, sizeof(int)), *tgt = calloc((size_t)N, sizeof(int));
    tokens(inp, tgt, N, mc.vocab_size);
    double loss = fwd_bwd(p, a, wts, g, inp, tgt) / N;
    printf("init loss %.5f, ln V %.5f\n", loss, log(mc.vocab_size));
    CHECK_NEAR(log(mc.vocab_size), loss, 0.05, 0);
    acts_free(&a);
    mem_get_stats(&st);
    CHECK_EQ_INT(0, (int64_t)st.cur[MEM_ACTIVATIONS]);
    free(inp), free(tgt), free(wts), free(g);
    plan_free(&p);
  }
}

/* ---- the CUDA layout's alignment, without a GPU: a device of kind cuda (bf16 act elements) whose
 * memory is host memory ---- */

static void *fake_alloc(device_t *d, mem_category cat, size_t bytes) {
  (void)d, (void)cat;
  return aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
}
static void fake_free(device_t *d, void *p) {
  (void)d;
  free(p);
}
static int misaligned(const void *p, const void *base) { return p && ((const char *)p - (const char *)base) % 4 != 0; }

/* Every buffer of the bf16 layout on a 4-byte boundary (fp32 loads; bf16x2 pairs) at an odd B·T = 7,
 * with and without checkpointing, and the arena equal to gemma3_act's CUDA terms. */
static void test_cuda_layout_alignment(void) {
  static const dev_ops ops = {.name = "fake-cuda", .alloc = fake_alloc, .free = fake_free};
  device_t fake = {.op = &ops, .kind = DEVICE_CUDA, .act_bytes = 2};
  model_config mc = gemma3();
  mc.seq_len = 7, mc.ffn_dim = 14;
  for (int ck = 0; ck < 2; ck++) {
    plan_t *p = gemma3_plan(mc, 1, ck ? ACKPT_FULL : ACKPT_NONE);
    p->device = DEVICE_CUDA;
    gemma3_acts *a = gemma3_model.acts_new(p, &fake);
    CHECK(a != NULL);
    if (!a) return;
    int bad = 0;
    const void *sv = a->arena.saved, *ws = a->arena.ws;
    for (int l = 0; l < a->L; l++) {
      const gemma3_block *k = &a->blk[l];
      const void *v[] = {k->ln1, k->ln1_rstd, k->qkv_raw, k->qk_rstd, k->qkv, k->atty, k->att, k->ao, k->pa_rstd,
                         k->res2, k->ln2, k->ln2_rstd, k->gu, k->h, k->mo, k->pf_rstd, k->out};
      for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) bad += misaligned(v[i], sv);
    }
    const void *r[] = {a->x0, a->lnf, a->lnf_rstd}, *w[] = {a->logits, a->losses, a->dlnf, a->dres, a->dx,
                                                           a->datty, a->dh, a->dbuf, a->datt};
    for (size_t i = 0; i < 3; i++) bad += misaligned(r[i], sv);
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) bad += misaligned(w[i], ws);
    if (bad) fprintf(stderr, "FAIL: %d buffer(s) of the bf16 Gemma 3 layout misaligned (checkpointing %d)\n", bad, ck);
    CHECK_EQ_INT(0, bad);
    const plan_act pa = gemma3_act(&mc, 1, DEVICE_CUDA, p->ackpt);
    CHECK_EQ_INT(mc.n_layer * pa.block_bytes + pa.block_ws_bytes + pa.root_bytes, a->arena.saved_bytes);
    CHECK_EQ_INT(pa.bwd_ws_bytes > pa.head_ws_bytes ? pa.bwd_ws_bytes : pa.head_ws_bytes, a->arena.ws_bytes);
    gemma3_model.acts_destroy(a);
    plan_free(&p);
  }
}

int main(void) {
  if (dev_new_cpu(DEV_CPU_SYNC, &g_dev) != FSDP_OK) return 2;
  test_gradcheck();
  test_gradcheck_docs();
  test_buffers_init_loss();
  test_init_pad_row();
  test_cuda_layout_alignment();
  dev_destroy(&g_dev);
  return check_done();
}
