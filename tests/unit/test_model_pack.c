/* test_model_pack — packed rows (model_set_docs) for GPT-2 and Llama on the CPU: a row of three
 * documents computes what each document computes alone.
 *
 * For each architecture, one row of T = 24 tokens holds documents of 7, 9 and 8 tokens. The packed
 * micro-step (model_set_docs with the row's document starts) must give every token the loss it has
 * when its document runs alone as a row of its own length (a plan with seq_len = its length, the
 * same weights), and every parameter gradient must be the sum of the three documents' gradients
 * (dscale 1: Σ of the losses). Tolerance 1e-6 relative: the packed and the separate runs do the
 * same fp32 operations on the same values, except that the matmuls' sums over tokens (weight
 * gradients) and over keys run in another grouping, a few roundings of 2^-24 on sums of ~24 terms
 * (per element against the tensor's largest gradient; per token against its own loss).
 *
 * Controls (planted faults through a copy of the device's kernel table): attention ignoring the
 * documents (seg NULL to the attention kernels: tokens see the previous documents), and positions
 * running on across documents (seg NULL to rope and the encoder): each must fail the comparison by
 * far more than the tolerance — except Llama's positions, which rope makes invisible once attention
 * stays in the document (see test_arch); its restart is checked on the rotation itself. A bad SEG
 * is refused in one line.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device.h"
#include "jobspec.h"
#include "model.h"
#include "model_gpt2.h"
#include "model_llama.h"
#include "plan.h"
#include "rng.h"

#define T_ROW 24
static const int doc_len[3] = {7, 9, 8};

static device_t *g_dev;
static dev_kernels g_kern_base, g_faulty;

typedef enum { FAULT_NONE = 0, FAULT_ATTN, FAULT_POS } fault;

/* Planted faults: the real kernels with the documents withheld from attention or from positions. */
static void no_doc_attention_forward(device_t *d, void *out, void *state, const void *qkv, int B, int T, int C, int NH,
                                     int NKV, const int32_t *seg, int window) {
  (void)seg;
  g_kern_base.attention_forward(d, out, state, qkv, B, T, C, NH, NKV, NULL, window);
}
static void no_doc_attention_backward(device_t *d, void *dqkv, void *scratch, const void *dout, const void *qkv,
                                      const void *out, const void *state, int B, int T, int C, int NH, int NKV,
                                      const int32_t *seg, int window) {
  (void)seg;
  g_kern_base.attention_backward(d, dqkv, scratch, dout, qkv, out, state, B, T, C, NH, NKV, NULL, window);
}
static void running_rope_forward(device_t *d, void *qkv, int B, int T, int NH, int NKV, int HS, const rope_freqs *r,
                                 const int32_t *seg) {
  (void)seg;
  g_kern_base.rope_forward(d, qkv, B, T, NH, NKV, HS, r, NULL);
}
static void running_rope_backward(device_t *d, void *dqkv, int B, int T, int NH, int NKV, int HS,
                                  const rope_freqs *r, const int32_t *seg) {
  (void)seg;
  g_kern_base.rope_backward(d, dqkv, B, T, NH, NKV, HS, r, NULL);
}
static void running_encoder_forward(device_t *d, void *out, const int *inp, const void *wte, const void *wpe, int B,
                                    int T, int C, const int32_t *seg) {
  (void)seg;
  g_kern_base.encoder_forward(d, out, inp, wte, wpe, B, T, C, NULL);
}
static void running_encoder_backward(device_t *d, float *dwte, float *dwpe, const void *dout, const int *inp, int B,
                                     int T, int C, int pad, const int32_t *seg) {
  (void)seg;
  g_kern_base.encoder_backward(d, dwte, dwpe, dout, inp, B, T, C, pad, NULL);
}

static void set_fault(fault f) {
  g_faulty = g_kern_base;
  if (f == FAULT_ATTN) {
    g_faulty.attention_forward = no_doc_attention_forward;
    g_faulty.attention_backward = no_doc_attention_backward;
  } else if (f == FAULT_POS) {
    g_faulty.rope_forward = running_rope_forward;
    g_faulty.rope_backward = running_rope_backward;
    g_faulty.encoder_forward = running_encoder_forward;
    g_faulty.encoder_backward = running_encoder_backward;
  }
  g_dev->kern = &g_faulty;
}

static plan_t *plan_of(model_config m, int T) {
  jobspec_t s;
  jobspec_defaults(&s);
  m.seq_len = T;
  s.model = m;
  s.batch_size = 1;
  s.grad_accum = 1;
  s.world_size = 1;
  s.device = DEVICE_CPU;
  s.param_dtype = s.reduce_dtype = DTYPE_FP32;
  plan_t *p = NULL;
  CHECK(plan_build(&s, 1, &p) == FSDP_OK);
  return p;
}

/* One forward and backward of plan P's row INP/TGT (SEG or NULL) over weights W into gradients G
 * (zeroed first); the per-token losses into LOSSES. */
static void run(const plan_t *p, float *w, float *g, const int *inp, const int *tgt, const int32_t *seg,
                float *losses) {
  model_acts *a = model_acts_new(p, g_dev);
  CHECK(a != NULL);
  if (!a) return;
  void **units = calloc((size_t)p->nunits, sizeof *units);
  float **dunits = calloc((size_t)p->nunits, sizeof *dunits);
  memset(g, 0, (size_t)p->shard_total * sizeof(float));
  for (int u = 0; u < p->nunits; u++) {
    units[u] = w + p->units[u].shard_base;
    dunits[u] = g + p->units[u].shard_base;
  }
  CHECK(model_set_docs(a, p, seg) == FSDP_OK);
  float loss = 0;   /* the losses first (the backward reuses their workspace), then the gradients */
  model_embed_forward(a, p, units[0], inp);
  for (int l = 0; l < p->model.n_layer; l++) model_block_forward(a, p, l, units[1 + l]);
  model_head_forward(a, p, units[0], tgt, &loss);
  CHECK(g_dev->op->sync(g_dev) == FSDP_OK);
  const float *l = p->model.arch == ARCH_GPT2 ? ((gpt2_acts *)a->acts)->losses : ((llama_acts *)a->acts)->losses;
  memcpy(losses, l, (size_t)p->model.seq_len * sizeof(float));
  model_forward_backward(p, a, units, dunits, inp, tgt, 1.0f, &loss);
  CHECK(g_dev->op->sync(g_dev) == FSDP_OK);
  free(units);
  free(dunits);
  model_acts_destroy(&a);
}

/* The largest violation of the tolerance over losses and gradients (≤ 1: the rows agree). */
static double compare(const plan_t *p, const float *loss_pack, const float *loss_alone, const float *g_pack,
                      const float *g_sum) {
  double worst = 0;
  for (int t = 0; t < T_ROW; t++) {
    double e = fabs(loss_pack[t] - loss_alone[t]) / (1e-6 * fabs(loss_alone[t]));
    if (e > worst) worst = e;
  }
  for (int u = 0; u < p->nunits; u++)
    for (int j = 0; j < p->units[u].ntensors; j++) {
      const plan_tensor *pt = &p->units[u].t[j];
      const float *a = g_pack + p->units[u].shard_base + pt->offset, *b = g_sum + p->units[u].shard_base + pt->offset;
      double mx = 0;
      for (int64_t k = 0; k < pt->numel; k++) mx = fabs(b[k]) > mx ? fabs(b[k]) : mx;
      for (int64_t k = 0; k < pt->numel; k++) {
        double e = fabs(a[k] - b[k]) / (1e-6 * mx + 1e-30);
        if (e > worst) worst = e;
      }
    }
  return worst;
}

/* Architecture M: the packed row against its documents alone; returns the worst violation with
 * fault F planted (FAULT_NONE: must be ≤ 1). */
static double pack_vs_alone(model_config m, fault f) {
  plan_t *pp = plan_of(m, T_ROW);
  if (!pp) return INFINITY;
  const int64_t n = pp->shard_total;
  float *w = calloc((size_t)n, sizeof(float)), *g_pack = calloc((size_t)n, sizeof(float));
  float *g_sum = calloc((size_t)n, sizeof(float)), *g = calloc((size_t)n, sizeof(float));
  model_init_shard(pp, 1234, 0, w);
  /* away from the init (norms 1, biases 0, small weights), so that every term matters */
  for (int u = 0; u < pp->nunits; u++)
    for (int j = 0; j < pp->units[u].ntensors; j++) {
      const plan_tensor *pt = &pp->units[u].t[j];
      for (int64_t k = 0; k < pt->numel; k++)
        w[pp->units[u].shard_base + pt->offset + k] += 0.3f * rng_normal(99, (uint32_t)pt->gid, (uint64_t)k);
    }
  int inp[T_ROW], tgt[T_ROW];
  int32_t seg[T_ROW];
  for (int t = 0, d = 0, start = 0; t < T_ROW; t++) {
    if (t == start + doc_len[d]) start += doc_len[d++];
    seg[t] = start;
    inp[t] = (int)(rng_uniform(5, 1, (uint64_t)t) * m.vocab_size);
    tgt[t] = (int)(rng_uniform(5, 2, (uint64_t)t) * m.vocab_size);
  }
  float loss_pack[T_ROW], loss_alone[T_ROW];
  set_fault(f);
  run(pp, w, g_pack, inp, tgt, seg, loss_pack);
  g_dev->kern = &g_kern_base;
  for (int d = 0, start = 0; d < 3; start += doc_len[d++]) {
    plan_t *pd = plan_of(m, doc_len[d]);
    CHECK(pd && pd->shard_total == n);   /* the same units: the weights carry over */
    if (!pd || pd->shard_total != n) break;
    run(pd, w, g, inp + start, tgt + start, NULL, loss_alone + start);
    for (int64_t k = 0; k < n; k++) g_sum[k] += g[k];
    plan_destroy(&pd);
  }
  double worst = compare(pp, loss_pack, loss_alone, g_pack, g_sum);
  free(w);
  free(g_pack);
  free(g_sum);
  free(g);
  plan_destroy(&pp);
  return worst;
}

static model_config gpt2(void) {
  return (model_config){.arch = ARCH_GPT2, .n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 32,
                        .seq_len = T_ROW, .n_kv_head = 2, .n_positions = T_ROW};
}

static model_config llama(void) {
  return (model_config){.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 2, .n_head = 4, .n_embd = 16, .vocab_size = 32,
                        .seq_len = T_ROW, .n_kv_head = 2, .ffn_dim = 12, .norm_eps = 1e-5, .rope_theta = 10000,
                        .n_positions = 64};
}

/* POS_VISIBLE: whether positions that run on across documents change the result. GPT-2's learned
 * positions do; rope does not once attention stays in the document (q_t·k_s depends on t − s only,
 * so shifting a whole document's positions is invisible up to the angles' rounding), and Llama's
 * restart is checked on the rotation itself (test_rope_restarts). */
static void test_arch(const char *name, model_config m, int pos_visible) {
  double ok = pack_vs_alone(m, FAULT_NONE);
  double attn = pack_vs_alone(m, FAULT_ATTN), pos = pack_vs_alone(m, FAULT_POS);
  printf("%s: packed vs alone %.3g of the tolerance; controls: documents seeing each other %.3g, positions "
         "running on %.3g\n", name, ok, attn, pos);
  CHECK(ok <= 1.0);
  CHECK(attn > 100.0);
  if (pos_visible) CHECK(pos > 100.0);
}

/* Rope on a packed row rotates each document's tokens as the document alone (bit for bit: the same
 * angles), and without the documents it does not. */
static void test_rope_restarts(void) {
  const int NH = 2, NKV = 1, HS = 8, C3 = (NH + 2 * NKV) * HS;
  rope_freqs r = rope_freqs_of(10000, 0, 0, 0, 0, 0);
  float *x = malloc(sizeof(float) * T_ROW * C3), *packed = malloc(sizeof(float) * T_ROW * C3);
  float *alone = malloc(sizeof(float) * T_ROW * C3), *running = malloc(sizeof(float) * T_ROW * C3);
  int32_t seg[T_ROW];
  for (int i = 0; i < T_ROW * C3; i++) x[i] = rng_normal(3, 1, (uint64_t)i);
  for (int t = 0, d = 0, start = 0; t < T_ROW; t++) {
    if (t == start + doc_len[d]) start += doc_len[d++];
    seg[t] = start;
  }
  memcpy(packed, x, sizeof(float) * T_ROW * C3);
  memcpy(alone, x, sizeof(float) * T_ROW * C3);
  memcpy(running, x, sizeof(float) * T_ROW * C3);
  g_kern_base.rope_forward(g_dev, packed, 1, T_ROW, NH, NKV, HS, &r, seg);
  g_kern_base.rope_forward(g_dev, running, 1, T_ROW, NH, NKV, HS, &r, NULL);
  for (int d = 0, start = 0; d < 3; start += doc_len[d++])
    g_kern_base.rope_forward(g_dev, alone + (size_t)start * C3, 1, doc_len[d], NH, NKV, HS, &r, NULL);
  CHECK(g_dev->op->sync(g_dev) == FSDP_OK);
  CHECK(memcmp(packed, alone, sizeof(float) * T_ROW * C3) == 0);
  CHECK(memcmp(running, alone, sizeof(float) * T_ROW * C3) != 0);
  g_kern_base.rope_backward(g_dev, packed, 1, T_ROW, NH, NKV, HS, &r, seg);   /* and back */
  CHECK(g_dev->op->sync(g_dev) == FSDP_OK);
  double err = 0;
  for (int i = 0; i < T_ROW * C3; i++) err = fmax(err, fabs(packed[i] - x[i]));
  CHECK(err < 1e-5);   /* a rotation and its inverse: a few fp32 roundings of values ~1 */
  free(x);
  free(packed);
  free(alone);
  free(running);
}

/* A SEG that is no row of documents is refused, naming the token. */
static void test_bad_seg(void) {
  plan_t *p = plan_of(llama(), T_ROW);
  if (!p) return;
  model_acts *a = model_acts_new(p, g_dev);
  CHECK(a != NULL);
  if (!a) return;
  int32_t seg[T_ROW] = {0};
  seg[5] = 3;   /* token 5 claims a document that started at 3, but token 4's started at 0 */
  CHECK(model_set_docs(a, p, seg) == FSDP_ERR_INVALID);
  CHECK(strstr(fsdp_last_error(), "token 5 of row 0") != NULL);
  seg[5] = 0;
  seg[0] = 1;   /* a row's first token starts a document at 0 */
  CHECK(model_set_docs(a, p, seg) == FSDP_ERR_INVALID);
  seg[0] = 0;
  CHECK(model_set_docs(a, p, seg) == FSDP_OK);   /* all zero: one document per row */
  CHECK(model_acts_arena(a)->seg == NULL);
  model_acts_destroy(&a);
  plan_destroy(&p);
}

int main(void) {
  if (dev_new_cpu(DEV_CPU_SYNC, &g_dev) != FSDP_OK) return 2;
  g_kern_base = *g_dev->kern;
  test_arch("gpt2", gpt2(), 1);
  test_arch("llama", llama(), 0);
  test_rope_restarts();
  test_bad_seg();
  g_dev->kern = &g_kern_base;
  dev_destroy(&g_dev);
  return check_done();
}
