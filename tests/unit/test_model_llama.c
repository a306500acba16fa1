/* test_model_llama — the Llama family's forward and backward (models/llama/model_llama through
 * worker/model/model.h) against an independent double-precision reference written here from Hugging
 * Face's LlamaForCausalLM (RMSNorm, rotate-half rotary, grouped-query attention, SwiGLU, untied head;
 * and tied, with llama3's rope scaling; head_dim ≠ C / H with attention_bias and mlp_bias), Qwen2's
 * (q/k/v biases) and Qwen3's (q_norm and k_norm before rope, its own head_dim), and its gradient
 * against central finite differences of that reference, for every parameter: the tied embed_tokens,
 * used at both ends, gets the sum of both uses.
 *
 * Tolerance: the argument of test_model.c (GPT-2's gradient check) carries over: a chain of ~24
 * fp32 operators, each a sum over at most max(B·T, 2F, Q) = 32 terms, so |g − g_ref| ≤
 * 4e-5·G + 1e-4·|g_ref| is the worst-case rounding bound and ~10^4 below what a wrong index, a
 * missing term or a wrong sign gives. Also: activation checkpointing gives bit-identical gradients,
 * the buffers are the planner's terms to the byte, and the loss at init is ≈ ln V.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h"
#include "jobspec.h"
#include "llama.h"
#include "plan.h"
#include "refrope.h"
#include "testfiles.h"

/* ---------------------------------------------------------------- double reference model */

/* Tensor SLOT of unit U in the reference weights W (unit u's unpadded flat buffer, in double); a
 * layer's tensor K (LBLK_*) where the model has it (llama.h's slots), else NULL. */
#define P(u, slot) (w[u] + p->units[u].t[slot].offset)
#define L_(u, k) (sl.at[k] >= 0 ? P(u, sl.at[k]) : NULL)

/* x[n, :] += b for N rows of OC (b NULL: no bias). */
static void ref_bias(double *x, const double *b, int N, int OC) {
  for (int n = 0; b && n < N; n++)
    for (int o = 0; o < OC; o++) x[(size_t)n * OC + o] += b[o];
}

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
 * inv_freq[i] = theta^(−2i/HS) (scaled by llama3's bands with SCALING), cos and sin repeated over
 * both halves. */
static void ref_rope(double *x, int HS, int t, double theta, const double *scaling) {
  for (int i = 0; i < HS / 2; i++) {
    double ang = t * ref_inv_freq(i, HS, theta, scaling), c = cos(ang), s = sin(ang);
    double a = x[i], b = x[i + HS / 2];
    x[i] = a * c - b * s;
    x[i + HS / 2] = b * c + a * s;
  }
}

/* Mean cross-entropy over B·T tokens. */
static double ref_loss(const plan_t *p, double *const *w, const int *inp, const int *tgt) {
  const model_config *mc = &p->model;
  const int B = p->batch_size, T = mc->seq_len, C = mc->n_embd, NH = mc->n_head, NKV = mc->n_kv_head;
  const int F = mc->ffn_dim, V = mc->vocab_size, L = mc->n_layer, N = B * T;
  const double eps = mc->norm_eps, theta = mc->rope_theta;
  const double llama3[4] = {mc->rope_factor, mc->rope_low_freq_factor, mc->rope_high_freq_factor,
                            mc->rope_original_max_pos};
  const double *scaling = mc->rope_scaling == ROPE_SCALING_LLAMA3 ? llama3 : NULL;
  const int HS = llama_head_dim(mc), QD = NH * HS, KV = NKV * HS, Q = QD + 2 * KV;
  const llama_slots sl = llama_slots_of(mc);
  double *x = calloc((size_t)N * C, sizeof(double)), *h = malloc(sizeof(double) * N * C);
  double *qkv = malloc(sizeof(double) * N * Q), *y = malloc(sizeof(double) * N * QD);
  double *gu = malloc(sizeof(double) * N * 2 * F), *a = malloc(sizeof(double) * N * F);
  double *t = malloc(sizeof(double) * N * C), *lg = malloc(sizeof(double) * V);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) x[n * C + c] = P(0, LROOT_EMBED)[(size_t)inp[n] * C + c];
  for (int l = 0; l < L; l++) {
    int u = 1 + l;
    ref_rmsnorm(h, x, L_(u, LBLK_LN1_W), N, C, eps);
    /* separate projections, as Hugging Face runs them; q_norm / k_norm on each head, then rope */
    for (int n = 0; n < N; n++) {
      double *q = qkv + (size_t)n * Q, *k = q + QD, *v = k + KV;
      ref_linear(q, h + (size_t)n * C, L_(u, LBLK_Q), 1, C, QD);
      ref_linear(k, h + (size_t)n * C, L_(u, LBLK_K), 1, C, KV);
      ref_linear(v, h + (size_t)n * C, L_(u, LBLK_V), 1, C, KV);
      ref_bias(q, L_(u, LBLK_QB), 1, QD);
      ref_bias(k, L_(u, LBLK_KB), 1, KV);
      ref_bias(v, L_(u, LBLK_VB), 1, KV);
      if (mc->qk_norm) {
        ref_rmsnorm(q, q, L_(u, LBLK_QN), NH, HS, eps);
        ref_rmsnorm(k, k, L_(u, LBLK_KN), NKV, HS, eps);
      }
      int pos = n % T;
      for (int hd = 0; hd < NH; hd++) ref_rope(q + hd * HS, HS, pos, theta, scaling);
      for (int hd = 0; hd < NKV; hd++) ref_rope(k + hd * HS, HS, pos, theta, scaling);
    }
    for (int b = 0; b < B; b++)
      for (int hd = 0; hd < NH; hd++) {
        int kvh = hd / (NH / NKV);   /* repeat_kv */
        for (int i = 0; i < T; i++) {
          const double *q = qkv + (size_t)(b * T + i) * Q + hd * HS;
          double s[64], mx = -1e300, z = 0;
          for (int j = 0; j <= i; j++) {
            const double *k = qkv + (size_t)(b * T + j) * Q + QD + kvh * HS;
            double d = 0;
            for (int e = 0; e < HS; e++) d += q[e] * k[e];
            s[j] = d / sqrt((double)HS);
            if (s[j] > mx) mx = s[j];
          }
          for (int j = 0; j <= i; j++) z += (s[j] = exp(s[j] - mx));
          for (int e = 0; e < HS; e++) {
            double acc = 0;
            for (int j = 0; j <= i; j++) acc += s[j] / z * qkv[(size_t)(b * T + j) * Q + QD + KV + kvh * HS + e];
            y[(size_t)(b * T + i) * QD + hd * HS + e] = acc;
          }
        }
      }
    ref_linear(t, y, L_(u, LBLK_O), N, QD, C);
    ref_bias(t, L_(u, LBLK_OB), N, C);
    for (int i = 0; i < N * C; i++) x[i] += t[i];
    ref_rmsnorm(h, x, L_(u, LBLK_LN2_W), N, C, eps);
    ref_linear(gu, h, L_(u, LBLK_GATE), N, C, F);
    ref_bias(gu, L_(u, LBLK_GB), N, F);
    ref_linear(a, h, L_(u, LBLK_UP), N, C, F);
    ref_bias(a, L_(u, LBLK_UB), N, F);
    for (int i = 0; i < N * F; i++) a[i] *= gu[i] / (1.0 + exp(-gu[i]));   /* silu(gate)·up */
    ref_linear(t, a, L_(u, LBLK_DOWN), N, F, C);
    ref_bias(t, L_(u, LBLK_DB), N, C);
    for (int i = 0; i < N * C; i++) x[i] += t[i];
  }
  ref_rmsnorm(h, x, P(0, LROOT_NORM), N, C, eps);
  double loss = 0;
  for (int n = 0; n < N; n++) {
    double mx = -1e300, z = 0;
    ref_linear(lg, h + (size_t)n * C, P(0, mc->tie_embeddings ? LROOT_EMBED : LROOT_HEAD), 1, C, V);
    for (int v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
    for (int v = 0; v < V; v++) z += exp(lg[v] - mx);
    loss += mx + log(z) - lg[tgt[n]];
  }
  free(x); free(h); free(qkv); free(y); free(gu); free(a); free(t); free(lg);
  return loss / N;
}

/* ---------------------------------------------------------------- tests */

/* A Llama of these sizes (norm_eps 1e-5, rope_theta 10000). */
static model_config llama(int L, int H, int KV, int C, int F, int V, int T) {
  return (model_config){.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = L, .n_head = H, .n_embd = C, .vocab_size = V, .seq_len = T,
                        .n_kv_head = KV, .ffn_dim = F, .norm_eps = 1e-5, .rope_theta = 10000};
}

static device_t *g_dev;   /* the synchronous CPU device */

/* Gradient of the mean loss vs finite differences of the double reference, every parameter; GQA
 * with two query heads per kv head. Then accumulation and the same step with activation
 * checkpointing (gradcheck.h). */
static void test_gradcheck(void) {
  gradcheck_model(llama(2, 4, 2, 16, 12, 16, 5), 2, g_dev, ref_loss);   /* L H KV C F V T, B */
}

/* The same with tie_word_embeddings and llama3's rope scaling: embed_tokens is also the head, so its
 * finite differences are those of both uses at once; the two rotary frequencies (head size 4:
 * wavelengths 6.3 and 628) fall in the interpolated band and the low one (edges 8/2 and 8/1). */
static void test_gradcheck_tied_scaled(void) {
  model_config m = llama(2, 4, 2, 16, 12, 16, 5);
  m.tie_embeddings = 1;
  m.rope_scaling = ROPE_SCALING_LLAMA3;
  m.rope_factor = 4, m.rope_low_freq_factor = 1, m.rope_high_freq_factor = 2, m.rope_original_max_pos = 8;
  gradcheck_model(m, 2, g_dev, ref_loss);
}

/* Llama with head_dim 6 (≠ C / H = 4: q is 24 wide, o_proj [16, 24]), attention_bias (q, k, v and o)
 * and mlp_bias (gate, up, down): every bias and the head_dim-wide q, k, v, o in the finite differences. */
static void test_gradcheck_llama_biases_head_dim(void) {
  model_config m = llama(2, 4, 2, 16, 12, 16, 5);
  m.head_dim = 6;
  m.attention_bias = 1;
  m.mlp_bias = 1;
  gradcheck_model(m, 2, g_dev, ref_loss);
}

/* Qwen2: q/k/v biases, o_proj and the MLP without; tied. */
static void test_gradcheck_qwen2(void) {
  model_config m = llama(2, 4, 2, 16, 12, 16, 5);
  m.arch = ARCH_QWEN2;
  m.tie_embeddings = 1;
  gradcheck_model(m, 2, g_dev, ref_loss);
}

/* Qwen3: q_norm and k_norm (weight [HD]) on each head before rope, head_dim 8 (≠ C / H = 4), and
 * attention_bias; the norms' weights moved away from 1 by gradcheck_model, so they matter. */
static void test_gradcheck_qwen3(void) {
  model_config m = llama(2, 4, 2, 16, 12, 16, 5);
  m.arch = ARCH_QWEN3;
  m.head_dim = 8;
  m.attention_bias = 1;
  gradcheck_model(m, 2, g_dev, ref_loss);
}

/* At init the logits are nearly zero, so the loss is ≈ ln V; the buffers are the planner's terms
 * and the tracked allocator saw exactly them. */
static void test_init_loss(void) {
  gradcheck_init_loss(llama(2, 4, 1, 32, 88, 64, 16), 4, g_dev);
  model_config q3 = llama(2, 4, 1, 32, 88, 64, 16);   /* with the pre-norm q|k|v, its rstd and a wider q */
  q3.arch = ARCH_QWEN3, q3.head_dim = 16, q3.attention_bias = 1;
  gradcheck_init_loss(q3, 4, g_dev);
  model_config lb = llama(2, 4, 1, 32, 88, 64, 16);
  lb.head_dim = 4, lb.attention_bias = 1, lb.mlp_bias = 1;   /* a q narrower than C */
  gradcheck_init_loss(lb, 4, g_dev);
}

/* init = random, as PreTrainedModel._init_weights: the embedding's pad_token_id row 0 (a tied head's
 * with it), an untied lm_head's row drawn as any other; no pad_token_id: every row drawn. */
static void test_init_pad_row(void) {
  for (int v = 0; v < 3; v++) {
    model_config m = llama(1, 4, 2, 8, 16, 12, 4);
    m.pad_token_id = v == 2 ? -1 : 5, m.tie_embeddings = v == 1;
    plan_t *p = NULL;
    CHECK_OK(plan_of_model(m, 1, &p));
    if (!p) return;
    int zero[3] = {0, 0, 0};   /* embed row 5, embed rows 4 and 6, lm_head row 5: elements equal to 0 */
    for (int64_t c = 0; c < 8; c++) {
      zero[0] += model_init_value(p, 0, LROOT_EMBED, 7, 5 * 8 + c) == 0.0f;
      zero[1] += model_init_value(p, 0, LROOT_EMBED, 7, 4 * 8 + c) == 0.0f;
      zero[1] += model_init_value(p, 0, LROOT_EMBED, 7, 6 * 8 + c) == 0.0f;
      if (!m.tie_embeddings) zero[2] += model_init_value(p, 0, LROOT_HEAD, 7, 5 * 8 + c) == 0.0f;
    }
    CHECK_EQ_INT(v == 2 ? 0 : 8, zero[0]);
    CHECK_EQ_INT(0, zero[1]);
    CHECK_EQ_INT(0, zero[2]);
    plan_destroy(&p);
  }
}

/* ---- the CUDA layout's alignment, without a GPU: a device of kind cuda (bf16 act elements) whose
 * memory is host memory, enough for llama_acts_new's layout ---- */

static void *fake_alloc(device_t *d, mem_category cat, size_t bytes) {
  (void)d, (void)cat;
  return aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
}
static void fake_free(device_t *d, void *p) {
  (void)d;
  free(p);
}

static int misaligned(const void *p, const void *base, int align) {
  return p && ((const char *)p - (const char *)base) % align != 0;
}

/* Every fp32 buffer of the bf16 layout on a 4-byte boundary (a misaligned float load is a CUDA
 * error) and every bf16 one on an even element (bf16x2 loads), for odd B·T: the sizes of the bf16
 * buffers before them must keep the offsets even, so ffn_dim must be even (plan_build refuses an
 * odd one). */
static void test_cuda_layout_alignment(void) {
  static const dev_ops ops = {.name = "fake-cuda", .alloc = fake_alloc, .free = fake_free};
  device_t fake = {.op = &ops, .kind = DEVICE_CUDA, .act_bytes = 2};
  for (int ck = 0; ck < 4; ck++) {   /* Llama, then Qwen3 (its pre-norm q|k|v and their rstd), each ± checkpointing */
    jobspec_t s;
    model_config m = llama(3, 4, 2, 16, 14, 16, 7);   /* B·T = 7, B·T·F = 98 */
    if (ck >= 2) m.arch = ARCH_QWEN3, m.head_dim = 6, m.attention_bias = 1;
    gradcheck_spec(&s, m, 1);
    s.device = DEVICE_CUDA;
    s.ackpt = ck % 2 ? ACKPT_FULL : ACKPT_NONE;
    plan_t *p = NULL;
    CHECK_OK(plan_build(&s, 1, &p));
    if (!p) return;
    llama_acts *a = llama_acts_new(p, &fake);
    CHECK(a != NULL);
    if (a) {
      int bad = 0;
      for (int l = 0; l < a->L; l++) {
        const llama_block_acts *b = &a->blk[l];
        bad += misaligned(b->ln1_rstd, a->arena.saved, 4) + misaligned(b->att, a->arena.saved, 4) +
               misaligned(b->ln2_rstd, a->arena.saved, 4) + misaligned(b->qk_rstd, a->arena.saved, 4);
        const void *act[] = {b->ln1, b->qkv_raw, b->qkv, b->atty, b->res2, b->ln2, b->gu, b->h, b->out};
        for (size_t i = 0; i < sizeof act / sizeof act[0]; i++) bad += misaligned(act[i], a->arena.saved, 4);
      }
      bad += misaligned(a->lnf_rstd, a->arena.saved, 4) + misaligned(a->x0, a->arena.saved, 4) + misaligned(a->lnf, a->arena.saved, 4);
      bad += misaligned(a->losses, a->arena.ws, 4) + misaligned(a->datt, a->arena.ws, 4) + misaligned(a->dh, a->arena.ws, 4) +
             misaligned(a->dbuf, a->arena.ws, 4) + misaligned(a->dlnf, a->arena.ws, 4);
      if (bad) fprintf(stderr, "FAIL: %d buffer(s) of the bf16 Llama layout misaligned (checkpointing %d)\n", bad, ck);
      CHECK_EQ_INT(0, bad);
    }
    llama_acts_destroy(&a);
    plan_destroy(&p);
  }
  /* an odd ffn_dim would misalign them: refused, in the job file and for a plan built elsewhere */
  jobspec_t s;
  gradcheck_spec(&s, llama(2, 4, 2, 16, 13, 16, 7), 1);
  plan_t *p = NULL;
  CHECK(plan_build(&s, 1, &p) == FSDP_ERR_INVALID);
  CHECK(strstr(fsdp_last_error(), "ffn_dim = 13 is odd") != NULL);
  plan_destroy(&p);
}

int main(void) {
  if (dev_new_cpu(DEV_CPU_SYNC, &g_dev) != FSDP_OK) return 2;
  test_gradcheck();
  test_gradcheck_tied_scaled();
  test_gradcheck_llama_biases_head_dim();
  test_gradcheck_qwen2();
  test_gradcheck_qwen3();
  test_init_loss();
  test_init_pad_row();
  test_cuda_layout_alignment();
  dev_destroy(&g_dev);
  return check_done();
}
