/* model_llama — the Llama family's forward and backward by FSDP unit over the device layer; see model_llama.h. */
#include "model_llama.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lora.h"
#include "model.h"
#include "rng.h"

/* ---------------------------------------------------------------- buffers */


/* Everything of a layer but its output, in plan_act's order (llama_act). */
static void take_block(llama_acts *a, llama_block_acts *b, char *c, int64_t *o, int64_t att) {
  const int64_t BT = (int64_t)a->B * a->T, BTC = BT * a->C;
  const int e = a->dev->act_bytes;
  b->ln1 = model_take(c, o, BTC, e);
  b->ln1_rstd = model_take(c, o, BT, 4);
  b->qkv_raw = a->qk_norm ? model_take(c, o, BT * a->Q, e) : NULL;
  b->qk_rstd = a->qk_norm ? model_take(c, o, BT * (a->NH + a->NKV), 4) : NULL;
  b->qkv = model_take(c, o, BT * a->Q, e);
  b->atty = model_take(c, o, BT * a->QD, e);
  b->att = model_take(c, o, att, 4);
  b->res2 = model_take(c, o, BTC, e);
  b->ln2 = model_take(c, o, BTC, e);
  b->ln2_rstd = model_take(c, o, BT, 4);
  b->gu = model_take(c, o, BT * 2 * a->F, e);
  b->h = model_take(c, o, BT * a->F, e);
}

static void layout(void *acts, char *saved, char *ws, int64_t *saved_bytes, int64_t *ws_bytes) {
  llama_acts *a = acts;
  const int64_t BT = (int64_t)a->B * a->T, BTC = BT * a->C;
  const int64_t ATT = dev_attention_floats(a->dev, a->B, a->T, a->NH);
  const int64_t DATT = dev_attention_scratch_floats(a->dev, a->B, a->T, a->NH, a->HD);
  const int e = a->dev->act_bytes;
  char *c = saved;
  int64_t o = 0;
  for (int l = 0; l < a->L; l++) {
    llama_block_acts *b = &a->blk[l];
    if (!a->recompute) take_block(a, b, c, &o, ATT);
    b->out = model_take(c, &o, BTC, e);
  }
  if (a->recompute && a->L > 0) {      /* the one working set every layer shares: block_ws */
    llama_block_acts w;
    take_block(a, &w, c, &o, ATT);
    a->fwd_tmp = model_take(c, &o, BTC, e);  /* not the workspace: a recompute runs amid the backward */
    for (int l = 0; l < a->L; l++) {
      w.out = a->blk[l].out;
      a->blk[l] = w;
    }
  }
  a->x0 = model_take(c, &o, BTC, e);         /* root_saved = 2·BTC + BT */
  a->lnf = model_take(c, &o, BTC, e);
  a->lnf_rstd = model_take(c, &o, BT, 4);
  *saved_bytes = o;

  /* Backward scratch (bwd_ws = 2·BTC + BT·max(C, QD) + BTF + BT·max(2F, Q) + DATT); dres at 0
   * overlaps the logits, which are dead before the head writes it. */
  c = ws, o = 0;
  a->dres = model_take(c, &o, BTC, e);
  a->dx = model_take(c, &o, BTC, e);
  a->datty = model_take(c, &o, BT * (a->QD > a->C ? a->QD : a->C), e);
  a->dh = model_take(c, &o, BT * a->F, e);
  a->dbuf = model_take(c, &o, BT * (2 * a->F > a->Q ? 2 * a->F : a->Q), e);
  a->datt = model_take(c, &o, DATT, 4);
  int64_t bwd = o;
  o = 0;   /* the head: logits (at least BTC act elements: dres), losses, dlnf */
  int64_t lg = dev_logits_bytes(a->dev, (int)BT, a->V, a->C);
  a->logits = model_take(c, &o, lg > BTC * e ? lg : BTC * e, 1);
  a->losses = model_take(c, &o, BT, 4);
  a->dlnf = model_take(c, &o, BTC, e);
  int64_t head = o;
  if (!a->recompute) a->fwd_tmp = ws;   /* nothing else in the workspace is live during the forward */
  *ws_bytes = bwd > head ? bwd : head;
}

llama_acts *llama_acts_new(const plan_t *p, device_t *d) {
  llama_acts *a = calloc(1, sizeof *a);
  if (!a) {
    fsdp_set_error(FSDP_ERR_NOMEM, "llama_acts_new: out of host memory for the activation table");
    return NULL;
  }
  const model_config *m = &p->model;
  a->dev = d;
  a->recompute = p->ackpt == ACKPT_FULL;
  a->B = p->batch_size;
  a->T = m->seq_len;
  a->C = m->n_embd;
  a->NH = m->n_head;
  a->NKV = m->n_kv_head;
  a->HD = llama_head_dim(m);
  a->QD = a->NH * a->HD;
  a->Q = a->QD + 2 * a->NKV * a->HD;
  a->sl = llama_slots_of(m);
  a->qk_norm = m->qk_norm != 0;
  a->F = m->ffn_dim;
  a->V = m->vocab_size;
  a->L = m->n_layer;
  a->eps = (float)m->norm_eps;
  a->rope = m->rope_scaling == ROPE_SCALING_LONGROPE   /* Phi-3's (models/phi3/) */
                ? rope_freqs_longrope(m->rope_theta, m->rope_short_factor.v, m->rope_short_factor.n,
                                      m->rope_attention_factor)
            : m->rope_scaling == ROPE_SCALING_LINEAR ? rope_freqs_linear(m->rope_theta, m->rope_factor)
                : rope_freqs_of(m->rope_theta, m->rope_scaling == ROPE_SCALING_LLAMA3, m->rope_factor,
                                m->rope_low_freq_factor, m->rope_high_freq_factor, m->rope_original_max_pos);
  a->window = m->sliding_window > 0 && m->sliding_window < a->T ? m->sliding_window : 0;   /* ≥ T: full */
  a->head = plan_head_slot(p);
  a->blk = calloc((size_t)(a->L > 0 ? a->L : 1), sizeof *a->blk);
  if (!a->blk) {
    fsdp_set_error(FSDP_ERR_NOMEM, "llama_acts_new: out of host memory for %d layer tables", a->L);
    llama_acts_destroy(&a);
    return NULL;
  }
  if (model_arena_alloc(&a->arena, d, layout, a) != FSDP_OK) {
    llama_acts_destroy(&a);   /* the allocator recorded its own error */
    return NULL;
  }
  return a;
}

void llama_acts_destroy(llama_acts **pa) {
  if (!pa || !*pa) return;
  llama_acts *a = *pa;
  model_arena_free(&a->arena);
  free(a->blk);
  free(a);
  *pa = NULL;
}

/* ---------------------------------------------------------------- forward */

/* Tensor SLOT of unit U in compute form (act elements), and its fp32 gradient. */
#define PARAM(u, slot, buf) model_param(p, a->dev, (u), (slot), (buf))
#define GRAD(u, slot, buf) model_grad(p, (u), (slot), (buf))
/* A layer's optional tensor K (LBLK_*): its parameter or gradient, NULL when the model has none. */
#define OPT_PARAM(k) (a->sl.at[k] >= 0 ? PARAM(u, a->sl.at[k], unit) : NULL)
#define OPT_GRAD(k) (a->sl.at[k] >= 0 ? GRAD(u, a->sl.at[k], dunit) : NULL)
#define AT(k) a->sl.at[k]
/* The adapters ([lora]) around a projection: nothing where none is (lora.h) */
#define LORA (a->arena.lora)

void llama_embed_forward(llama_acts *a, const plan_t *p, const void *root, const int *inp) {
  device_t *d = a->dev;
  d->kern->encoder_forward(d, a->x0, inp, PARAM(0, LROOT_EMBED, root), NULL, a->B, a->T, a->C, NULL);
}

/* q, k and v's adapters, each on its columns of the fused q|k|v rows (before the rotation) */
static void lora_qkv_forward(llama_acts *a, int layer, void *qkv, const void *ln1) {
  for (int t = LBLK_Q; t <= LBLK_V; t++) lora_forward(LORA, layer, t, qkv, ln1);
}

static void *block_input(llama_acts *a, int layer) { return layer == 0 ? a->x0 : a->blk[layer - 1].out; }
static void *last_output(llama_acts *a) { return a->L == 0 ? a->x0 : a->blk[a->L - 1].out; }

void llama_block_forward(llama_acts *a, const plan_t *p, int layer, const void *unit) {
  const int B = a->B, T = a->T, C = a->C, F = a->F, BT = B * T, u = 1 + layer;
  device_t *d = a->dev;
  llama_block_acts *s = &a->blk[layer];
  const void *x = block_input(a, layer);

  /* attention: res2 = x + o_proj(attn(rope(qknorm(qkv(rms1(x)))))); q|k|v is one [Q, C] weight; the
   * adapters ([lora]) add to each projection's output, before the q/k norms */
  void *qkv_out = a->qk_norm ? s->qkv_raw : s->qkv;
  d->kern->rmsnorm_forward(d, s->ln1, s->ln1_rstd, x, PARAM(u, AT(LBLK_LN1_W), unit), BT, C, a->eps, 0.0f);
  d->kern->linear_forward(d, qkv_out, s->ln1, PARAM(u, AT(LBLK_Q), unit), OPT_PARAM(LBLK_QB), BT, C, a->Q);
  lora_qkv_forward(a, layer, qkv_out, s->ln1);
  if (a->qk_norm)
    d->kern->qk_norm_forward(d, s->qkv, s->qk_rstd, s->qkv_raw, PARAM(u, AT(LBLK_QN), unit),
                             PARAM(u, AT(LBLK_KN), unit), BT, a->NH, a->NKV, a->HD, a->eps, 0.0f);
  d->kern->rope_forward(d, s->qkv, B, T, a->NH, a->NKV, a->HD, &a->rope, a->arena.seg);
  d->kern->attention_forward(d, s->atty, s->att, s->qkv, B, T, a->QD, a->NH, a->NKV, a->arena.seg, a->window);
  d->kern->linear_forward(d, a->fwd_tmp, s->atty, PARAM(u, AT(LBLK_O), unit), OPT_PARAM(LBLK_OB), BT, a->QD, C);
  lora_forward(LORA, layer, LBLK_O, a->fwd_tmp, s->atty);
  d->kern->residual_forward(d, s->res2, x, a->fwd_tmp, (int64_t)BT * C);

  /* MLP: out = res2 + down(silu(gate(rms2(res2))) · up(rms2(res2))); gate|up is one [2F, C] weight */
  d->kern->rmsnorm_forward(d, s->ln2, s->ln2_rstd, s->res2, PARAM(u, AT(LBLK_LN2_W), unit), BT, C, a->eps, 0.0f);
  d->kern->linear_forward(d, s->gu, s->ln2, PARAM(u, AT(LBLK_GATE), unit), OPT_PARAM(LBLK_GB), BT, C, 2 * F);
  lora_forward(LORA, layer, LBLK_GATE, s->gu, s->ln2);
  lora_forward(LORA, layer, LBLK_UP, s->gu, s->ln2);
  d->kern->swiglu_forward(d, s->h, s->gu, BT, F);
  d->kern->linear_forward(d, a->fwd_tmp, s->h, PARAM(u, AT(LBLK_DOWN), unit), OPT_PARAM(LBLK_DB), BT, F, C);
  lora_forward(LORA, layer, LBLK_DOWN, a->fwd_tmp, s->h);
  d->kern->residual_forward(d, s->out, s->res2, a->fwd_tmp, (int64_t)BT * C);
}

/* ---------------------------------------------------------------- loss and backward */

void llama_head_forward_backward(llama_acts *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                 float dscale, float *loss_acc) {
  const int C = a->C, BT = a->B * a->T;
  device_t *d = a->dev;
  const void *x = last_output(a);
  d->kern->rmsnorm_forward(d, a->lnf, a->lnf_rstd, x, PARAM(0, LROOT_NORM, root), BT, C, a->eps, 0.0f);
  d->kern->classifier(d, a->dlnf, GRAD(0, a->head, droot), a->losses, loss_acc, a->logits, a->lnf,
                    PARAM(0, a->head, root), targets, BT, C, a->V, dscale);
  /* dlogits is dead from here on, so dres may overwrite it */
  d->kern->rmsnorm_backward(d, a->dres, GRAD(0, LROOT_NORM, droot), a->dlnf, x, PARAM(0, LROOT_NORM, root), a->lnf_rstd,
                          BT, C, 0.0f);
}

void llama_head_forward(llama_acts *a, const plan_t *p, const void *root, const int *targets, float *loss_acc) {
  const int BT = a->B * a->T;
  device_t *d = a->dev;
  d->kern->rmsnorm_forward(d, a->lnf, a->lnf_rstd, last_output(a), PARAM(0, LROOT_NORM, root), BT, a->C, a->eps, 0.0f);
  if (targets)
    d->kern->classifier(d, NULL, NULL, a->losses, loss_acc, a->logits, a->lnf, PARAM(0, a->head, root), targets, BT,
                      a->C, a->V, 1.0f);
}

void llama_block_backward(llama_acts *a, const plan_t *p, int layer, const void *unit, float *dunit) {
  const int B = a->B, T = a->T, C = a->C, F = a->F, BT = B * T, u = 1 + layer;
  device_t *d = a->dev;
  llama_block_acts *s = &a->blk[layer];
  const void *x = block_input(a, layer);
  void *dres = a->dres;   /* on entry dL/d out; on return dL/d x */

  /* activation checkpointing: the layer's activations again from its saved input */
  if (a->recompute) llama_block_forward(a, p, layer, unit);

  /* MLP */
  d->kern->linear_backward(d, a->dh, GRAD(u, AT(LBLK_DOWN), dunit), OPT_GRAD(LBLK_DB), dres, s->h,
                           PARAM(u, AT(LBLK_DOWN), unit), BT, F, C);
  lora_backward(LORA, layer, LBLK_DOWN, a->dh, dres, s->h);
  d->kern->swiglu_backward(d, a->dbuf, s->gu, a->dh, BT, F);
  d->kern->linear_backward(d, a->dx, GRAD(u, AT(LBLK_GATE), dunit), OPT_GRAD(LBLK_GB), a->dbuf, s->ln2,
                           PARAM(u, AT(LBLK_GATE), unit), BT, C, 2 * F);
  lora_backward(LORA, layer, LBLK_GATE, a->dx, a->dbuf, s->ln2);
  lora_backward(LORA, layer, LBLK_UP, a->dx, a->dbuf, s->ln2);
  dev_rmsnorm_backward_add(d, dres, a->datty, GRAD(u, AT(LBLK_LN2_W), dunit), a->dx, s->res2,
                           PARAM(u, AT(LBLK_LN2_W), unit), s->ln2_rstd, BT, C, 0.0f);   /* dres = dL/d res2 */

  /* attention */
  d->kern->linear_backward(d, a->datty, GRAD(u, AT(LBLK_O), dunit), OPT_GRAD(LBLK_OB), dres, s->atty,
                           PARAM(u, AT(LBLK_O), unit), BT, a->QD, C);
  lora_backward(LORA, layer, LBLK_O, a->datty, dres, s->atty);
  d->kern->attention_backward(d, a->dbuf, a->datt, a->datty, s->qkv, s->atty, s->att, B, T, a->QD, a->NH, a->NKV,
                              a->arena.seg, a->window);
  d->kern->rope_backward(d, a->dbuf, B, T, a->NH, a->NKV, a->HD, &a->rope, a->arena.seg);
  if (a->qk_norm)   /* in place: d(normed q|k|v) → d(raw q|k|v) */
    d->kern->qk_norm_backward(d, a->dbuf, OPT_GRAD(LBLK_QN), OPT_GRAD(LBLK_KN), a->dbuf, s->qkv_raw,
                              PARAM(u, AT(LBLK_QN), unit), PARAM(u, AT(LBLK_KN), unit), s->qk_rstd, BT, a->NH,
                              a->NKV, a->HD, 0.0f);
  /* a frozen base ([lora]) needs no gradient below the first block: there the q|k|v backward
   * gives the adapters theirs and stops */
  void *dln1 = layer > 0 || dunit ? a->dx : NULL;
  d->kern->linear_backward(d, dln1, GRAD(u, AT(LBLK_Q), dunit), OPT_GRAD(LBLK_QB), a->dbuf, s->ln1,
                           PARAM(u, AT(LBLK_Q), unit), BT, C, a->Q);
  for (int t = LBLK_Q; t <= LBLK_V; t++) lora_backward(LORA, layer, t, dln1, a->dbuf, s->ln1);
  if (dln1)
    dev_rmsnorm_backward_add(d, dres, a->datty, GRAD(u, AT(LBLK_LN1_W), dunit), a->dx, x,
                             PARAM(u, AT(LBLK_LN1_W), unit), s->ln1_rstd, BT, C, 0.0f);   /* dres = dL/d x */
}

void llama_embed_backward(llama_acts *a, const plan_t *p, float *droot, const int *inp) {
  device_t *d = a->dev;
  if (!droot) return;   /* a frozen root ([lora]): nothing below the embedding needs a gradient */
  d->kern->encoder_backward(d, GRAD(0, LROOT_EMBED, droot), NULL, a->dres, inp, a->B, a->T, a->C,
                           p->model.pad_token_id, NULL);
}

#undef PARAM
#undef GRAD
#undef OPT_PARAM
#undef OPT_GRAD
#undef AT

/* ---------------------------------------------------------------- initialization */

/* PreTrainedModel._init_weights (transformers 5): every matrix N(0, initializer_range = 0.02), the
 * embedding's padding_idx row (pad_token_id) 0, so a tied head's too; biases 0, norms 1. */
float llama_init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k) {
  const plan_tensor *pt = &p->units[u].t[t];
  if (pt->ndim == 1) {   /* a bias (…_proj.bias) is 0, a norm's weight 1 */
    size_t n = strlen(pt->name);
    return n > 5 && !strcmp(pt->name + n - 5, ".bias") ? 0.0f : 1.0f;
  }
  if (u == 0 && t == LROOT_EMBED && p->model.pad_token_id >= 0 && k / pt->shape[1] == p->model.pad_token_id) return 0.0f;
  return (float)(0.02 * (double)rng_normal(seed, (uint32_t)pt->gid, (uint64_t)k));
}

/* ---------------------------------------------------------------- the table (model.h) */

void *llama_ops_acts_new(const plan_t *p, device_t *d) { return llama_acts_new(p, d); }
void llama_ops_acts_destroy(void *acts) {
  llama_acts *a = acts;
  llama_acts_destroy(&a);
}
void llama_ops_embed_forward(void *a, const plan_t *p, const void *root, const int *inp) {
  llama_embed_forward(a, p, root, inp);
}
void llama_ops_block_forward(void *a, const plan_t *p, int layer, const void *unit) {
  llama_block_forward(a, p, layer, unit);
}
void llama_ops_head_forward_backward(void *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                     float dscale, float *loss_acc) {
  llama_head_forward_backward(a, p, root, droot, targets, dscale, loss_acc);
}
void llama_ops_head_forward(void *a, const plan_t *p, const void *root, const int *targets, float *loss_acc) {
  llama_head_forward(a, p, root, targets, loss_acc);
}
void llama_ops_block_backward(void *a, const plan_t *p, int layer, const void *unit, float *dunit) {
  llama_block_backward(a, p, layer, unit, dunit);
}
void llama_ops_embed_backward(void *a, const plan_t *p, float *droot, const int *inp) {
  llama_embed_backward(a, p, droot, inp);
}
const void *llama_ops_final_hidden(const void *a) { return ((const llama_acts *)a)->lnf; }

const model_ops llama_model = LLAMA_FAMILY_MODEL_OPS;
