/* model_gemma3 — Gemma 3's forward and backward by FSDP unit over the kernel table; see model_gemma3.h. */
#include "model_gemma3.h"

#include <math.h>
#include <stdlib.h>

#include "gemma3.h"
#include "lora.h"
#include "ops/bf16.h"
#include "rng.h"

/* ---------------------------------------------------------------- buffers */

static void take_block(gemma3_acts *a, gemma3_block *b, char *c, int64_t *o, int64_t att) {
  const int64_t BT = (int64_t)a->B * a->T, BTC = BT * a->C;
  const int e = a->dev->act_bytes;
  b->ln1 = model_take(c, o, BTC, e);
  b->ln1_rstd = model_take(c, o, BT, 4);
  b->qkv_raw = model_take(c, o, BT * a->Q, e);
  b->qk_rstd = model_take(c, o, BT * (a->NH + a->NKV), 4);
  b->qkv = model_take(c, o, BT * a->Q, e);
  b->atty = model_take(c, o, BT * a->QD, e);
  b->att = model_take(c, o, att, 4);
  b->ao = model_take(c, o, BTC, e);
  b->pa_rstd = model_take(c, o, BT, 4);
  b->res2 = model_take(c, o, BTC, e);
  b->ln2 = model_take(c, o, BTC, e);
  b->ln2_rstd = model_take(c, o, BT, 4);
  b->gu = model_take(c, o, BT * 2 * a->F, e);
  b->h = model_take(c, o, BT * a->F, e);
  b->mo = model_take(c, o, BTC, e);
  b->pf_rstd = model_take(c, o, BT, 4);
}

static void layout(void *acts, char *saved, char *ws, int64_t *saved_bytes, int64_t *ws_bytes) {
  gemma3_acts *a = acts;
  const int64_t BT = (int64_t)a->B * a->T, BTC = BT * a->C;
  const int64_t ATT = dev_attention_floats(a->dev, a->B, a->T, a->NH);
  const int64_t DATT = dev_attention_scratch_floats(a->dev, a->B, a->T, a->NH, a->HD);
  const int e = a->dev->act_bytes;
  char *c = saved;
  int64_t o = 0;
  for (int l = 0; l < a->L; l++) {
    if (!a->recompute) take_block(a, &a->blk[l], c, &o, ATT);
    a->blk[l].out = model_take(c, &o, BTC, e);
  }
  if (a->recompute && a->L > 0) {   /* the one working set of every layer (block_ws) */
    gemma3_block w;
    take_block(a, &w, c, &o, ATT);
    a->fwd_tmp = model_take(c, &o, BTC, e);
    for (int l = 0; l < a->L; l++) {
      w.out = a->blk[l].out;
      a->blk[l] = w;
    }
  }
  a->x0 = model_take(c, &o, BTC, e);
  a->lnf = model_take(c, &o, BTC, e);
  a->lnf_rstd = model_take(c, &o, BT, 4);
  *saved_bytes = o;

  c = ws, o = 0;   /* the backward's scratch; dres at 0 overlaps the logits, dead before the head writes it */
  a->dres = model_take(c, &o, BTC, e);
  a->dx = model_take(c, &o, BTC, e);
  a->datty = model_take(c, &o, BT * (a->QD > a->C ? a->QD : a->C), e);
  a->dh = model_take(c, &o, BT * a->F, e);
  a->dbuf = model_take(c, &o, BT * (2 * a->F > a->Q ? 2 * a->F : a->Q), e);
  a->datt = model_take(c, &o, DATT, 4);
  int64_t bwd = o;
  o = 0;
  int64_t lg = dev_logits_bytes(a->dev, (int)BT, a->V, a->C);
  a->logits = model_take(c, &o, lg > BTC * e ? lg : BTC * e, 1);
  a->losses = model_take(c, &o, BT, 4);
  a->dlnf = model_take(c, &o, BTC, e);
  int64_t head = o;
  if (!a->recompute) a->fwd_tmp = ws;   /* nothing else in the workspace is live during the forward */
  *ws_bytes = bwd > head ? bwd : head;
}

/* The global layers' frequencies: rope_theta with the model's scaling, none or linear (Gemma 3 4B and
 * up: rope_scaling {"rope_type": "linear", "factor": 8}; the descriptor refuses any other). */
static rope_freqs global_rope(const model_config *m) {
  return m->rope_scaling == ROPE_SCALING_LINEAR ? rope_freqs_linear(m->rope_theta, m->rope_factor)
                                                : rope_freqs_of(m->rope_theta, 0, 0, 0, 0, 0);
}

static void acts_destroy(void *acts) {
  gemma3_acts *a = acts;
  if (!a) return;
  model_arena_free(&a->arena);
  free(a->blk);
  free(a);
}

static void *acts_new(const plan_t *p, device_t *d) {
  if (!(gemma3_qpas(&p->model) > 0) || !(gemma3_local_theta(&p->model) > 0)) {   /* the descriptor refuses these */
    fsdp_set_error(FSDP_ERR_INVALID, "gemma3: query_pre_attn_scalar %g and rope_local_base_freq %g; allowed: both > 0",
                   gemma3_qpas(&p->model), gemma3_local_theta(&p->model));
    return NULL;
  }
  gemma3_acts *a = calloc(1, sizeof *a);
  if (!a) {
    fsdp_set_error(FSDP_ERR_NOMEM, "gemma3: out of host memory for the activation table");
    return NULL;
  }
  const model_config *m = &p->model;
  a->dev = d;
  a->recompute = p->ackpt == ACKPT_FULL;
  a->B = p->batch_size, a->T = m->seq_len, a->C = m->n_embd, a->NH = m->n_head, a->NKV = m->n_kv_head;
  a->HD = gemma3_head_dim(m), a->QD = a->NH * a->HD, a->Q = a->QD + 2 * a->NKV * a->HD;
  a->F = m->ffn_dim, a->V = m->vocab_size, a->L = m->n_layer;
  a->eps = (float)m->norm_eps;
  a->escale = (float)sqrt((double)a->C);   /* torch.tensor(hidden_size**0.5): fp32 */
  if (p->param_dtype == DTYPE_BF16) a->escale = bf16_round(a->escale);
  a->qscale = (float)sqrt((double)a->HD / gemma3_qpas(m));
  a->window = m->sliding_window > 0 && m->sliding_window < a->T ? m->sliding_window : 0;
  a->rope_local = rope_freqs_of(gemma3_local_theta(m), 0, 0, 0, 0, 0);
  a->rope_global = global_rope(m);
  a->blk = calloc((size_t)(a->L > 0 ? a->L : 1), sizeof *a->blk);
  if (!a->blk) {
    fsdp_set_error(FSDP_ERR_NOMEM, "gemma3: out of host memory for %d layer tables", a->L);
    acts_destroy(a);
    return NULL;
  }
  if (model_arena_alloc(&a->arena, d, layout, a) != FSDP_OK) {
    acts_destroy(a);
    return NULL;
  }
  return a;
}

/* ---------------------------------------------------------------- forward */

#define PARAM(u, slot, buf) model_param(p, a->dev, (u), (slot), (buf))
#define GRAD(u, slot, buf) model_grad(p, (u), (slot), (buf))
#define W(slot) PARAM(u, (slot), unit)
#define DW(slot) GRAD(u, (slot), dunit)
#define LORA (a->arena.lora)

static void embed_forward(void *acts, const plan_t *p, const void *root, const int *inp) {
  gemma3_acts *a = acts;
  device_t *d = a->dev;
  const int BT = a->B * a->T;
  d->kern->encoder_forward(d, a->x0, inp, PARAM(0, G3ROOT_EMBED, root), NULL, a->B, a->T, a->C, NULL);
  d->kern->act_axpby(d, a->x0, a->C, a->x0, a->C, BT, a->C, a->escale, 0.0f);
}

static void *block_input(gemma3_acts *a, int layer) { return layer == 0 ? a->x0 : a->blk[layer - 1].out; }
static void *last_output(gemma3_acts *a) { return a->L == 0 ? a->x0 : a->blk[a->L - 1].out; }

/* Layer L's attention pattern: its window (0: full causal) and rotary frequencies. */
static int window_of(const gemma3_acts *a, const plan_t *p, int l) { return gemma3_is_global(&p->model, l) ? 0 : a->window; }
static const rope_freqs *rope_of(const gemma3_acts *a, const plan_t *p, int l) {
  return gemma3_is_global(&p->model, l) ? &a->rope_global : &a->rope_local;
}

/* q's columns of the (BT, Q) rows BUF times qscale, in place (forward: q; backward: dq). */
static void scale_q(gemma3_acts *a, void *buf) {
  if (a->qscale != 1.0f) a->dev->kern->act_axpby(a->dev, buf, a->Q, buf, a->Q, (int64_t)a->B * a->T, a->QD, a->qscale, 0.0f);
}

static void block_forward(void *acts, const plan_t *p, int layer, const void *unit) {
  gemma3_acts *a = acts;
  const int B = a->B, T = a->T, C = a->C, F = a->F, BT = B * T, u = 1 + layer;
  device_t *d = a->dev;
  gemma3_block *s = &a->blk[layer];
  const void *x = block_input(a, layer);

  /* res2 = x + post_attn_norm(o(attn(scale·rope(qknorm(qkv(in_norm(x))))))) */
  d->kern->rmsnorm_forward(d, s->ln1, s->ln1_rstd, x, W(G3_LN1), BT, C, a->eps, 1.0f);
  d->kern->linear_forward(d, s->qkv_raw, s->ln1, W(G3_Q), NULL, BT, C, a->Q);
  for (int t = G3_Q; t <= G3_V; t++) lora_forward(LORA, layer, t, s->qkv_raw, s->ln1);
  d->kern->qk_norm_forward(d, s->qkv, s->qk_rstd, s->qkv_raw, W(G3_QN), W(G3_KN), BT, a->NH, a->NKV, a->HD, a->eps,
                           1.0f);
  d->kern->rope_forward(d, s->qkv, B, T, a->NH, a->NKV, a->HD, rope_of(a, p, layer), a->arena.seg);
  scale_q(a, s->qkv);
  d->kern->attention_forward(d, s->atty, s->att, s->qkv, B, T, a->QD, a->NH, a->NKV, a->arena.seg,
                             window_of(a, p, layer));
  d->kern->linear_forward(d, s->ao, s->atty, W(G3_O), NULL, BT, a->QD, C);
  lora_forward(LORA, layer, G3_O, s->ao, s->atty);
  d->kern->rmsnorm_forward(d, a->fwd_tmp, s->pa_rstd, s->ao, W(G3_POST_ATTN), BT, C, a->eps, 1.0f);
  d->kern->residual_forward(d, s->res2, x, a->fwd_tmp, (int64_t)BT * C);

  /* out = res2 + post_ff_norm(down(gelu_tanh(gate(pre_ff_norm(res2))) · up(pre_ff_norm(res2)))) */
  d->kern->rmsnorm_forward(d, s->ln2, s->ln2_rstd, s->res2, W(G3_PRE_FF), BT, C, a->eps, 1.0f);
  d->kern->linear_forward(d, s->gu, s->ln2, W(G3_GATE), NULL, BT, C, 2 * F);
  lora_forward(LORA, layer, G3_GATE, s->gu, s->ln2);
  lora_forward(LORA, layer, G3_UP, s->gu, s->ln2);
  d->kern->geglu_forward(d, s->h, s->gu, BT, F);
  d->kern->linear_forward(d, s->mo, s->h, W(G3_DOWN), NULL, BT, F, C);
  lora_forward(LORA, layer, G3_DOWN, s->mo, s->h);
  d->kern->rmsnorm_forward(d, a->fwd_tmp, s->pf_rstd, s->mo, W(G3_POST_FF), BT, C, a->eps, 1.0f);
  d->kern->residual_forward(d, s->out, s->res2, a->fwd_tmp, (int64_t)BT * C);
}

/* ---------------------------------------------------------------- loss and backward */

static void head_forward_backward(void *acts, const plan_t *p, const void *root, float *droot, const int *targets,
                                  float dscale, float *loss_acc) {
  gemma3_acts *a = acts;
  const int C = a->C, BT = a->B * a->T;
  device_t *d = a->dev;
  const void *x = last_output(a), *wn = PARAM(0, G3ROOT_NORM, root), *wte = PARAM(0, G3ROOT_EMBED, root);
  d->kern->rmsnorm_forward(d, a->lnf, a->lnf_rstd, x, wn, BT, C, a->eps, 1.0f);
  d->kern->classifier(d, a->dlnf, GRAD(0, G3ROOT_EMBED, droot), a->losses, loss_acc, a->logits, a->lnf, wte, targets,
                      BT, C, a->V, dscale);
  /* dlogits is dead from here on, so dres may overwrite it */
  d->kern->rmsnorm_backward(d, a->dres, GRAD(0, G3ROOT_NORM, droot), a->dlnf, x, wn, a->lnf_rstd, BT, C, 1.0f);
}

static void head_forward(void *acts, const plan_t *p, const void *root, const int *targets, float *loss_acc) {
  gemma3_acts *a = acts;
  const int BT = a->B * a->T;
  device_t *d = a->dev;
  d->kern->rmsnorm_forward(d, a->lnf, a->lnf_rstd, last_output(a), PARAM(0, G3ROOT_NORM, root), BT, a->C, a->eps,
                           1.0f);
  if (targets)
    d->kern->classifier(d, NULL, NULL, a->losses, loss_acc, a->logits, a->lnf, PARAM(0, G3ROOT_EMBED, root), targets,
                        BT, a->C, a->V, 1.0f);
}

static void block_backward(void *acts, const plan_t *p, int layer, const void *unit, float *dunit) {
  gemma3_acts *a = acts;
  const int B = a->B, T = a->T, C = a->C, F = a->F, BT = B * T, u = 1 + layer;
  device_t *d = a->dev;
  gemma3_block *s = &a->blk[layer];
  const void *x = block_input(a, layer);
  void *dres = a->dres;   /* on entry dL/d out; on return dL/d x */

  if (a->recompute) block_forward(a, p, layer, unit);

  /* MLP: dx = d mo through post_ff_norm, then down, GeGLU, gate|up, and pre_ff_norm into dres */
  d->kern->rmsnorm_backward(d, a->dx, DW(G3_POST_FF), dres, s->mo, W(G3_POST_FF), s->pf_rstd, BT, C, 1.0f);
  d->kern->linear_backward(d, a->dh, DW(G3_DOWN), NULL, a->dx, s->h, W(G3_DOWN), BT, F, C);
  lora_backward(LORA, layer, G3_DOWN, a->dh, a->dx, s->h);
  d->kern->geglu_backward(d, a->dbuf, s->gu, a->dh, BT, F);
  d->kern->linear_backward(d, a->dx, DW(G3_GATE), NULL, a->dbuf, s->ln2, W(G3_GATE), BT, C, 2 * F);
  lora_backward(LORA, layer, G3_GATE, a->dx, a->dbuf, s->ln2);
  lora_backward(LORA, layer, G3_UP, a->dx, a->dbuf, s->ln2);
  dev_rmsnorm_backward_add(d, dres, a->datty, DW(G3_PRE_FF), a->dx, s->res2, W(G3_PRE_FF), s->ln2_rstd, BT, C,
                           1.0f);   /* dres = dL/d res2 */

  /* attention: dx = d ao through post_attn_norm, then o, the attention, q's scale, rope, the q/k norms */
  d->kern->rmsnorm_backward(d, a->dx, DW(G3_POST_ATTN), dres, s->ao, W(G3_POST_ATTN), s->pa_rstd, BT, C, 1.0f);
  d->kern->linear_backward(d, a->datty, DW(G3_O), NULL, a->dx, s->atty, W(G3_O), BT, a->QD, C);
  lora_backward(LORA, layer, G3_O, a->datty, a->dx, s->atty);
  d->kern->attention_backward(d, a->dbuf, a->datt, a->datty, s->qkv, s->atty, s->att, B, T, a->QD, a->NH, a->NKV,
                              a->arena.seg, window_of(a, p, layer));
  scale_q(a, a->dbuf);
  d->kern->rope_backward(d, a->dbuf, B, T, a->NH, a->NKV, a->HD, rope_of(a, p, layer), a->arena.seg);
  d->kern->qk_norm_backward(d, a->dbuf, DW(G3_QN), DW(G3_KN), a->dbuf, s->qkv_raw, W(G3_QN), W(G3_KN), s->qk_rstd, BT,
                            a->NH, a->NKV, a->HD, 1.0f);
  d->kern->linear_backward(d, a->dx, DW(G3_Q), NULL, a->dbuf, s->ln1, W(G3_Q), BT, C, a->Q);
  for (int t = G3_Q; t <= G3_V; t++) lora_backward(LORA, layer, t, a->dx, a->dbuf, s->ln1);
  dev_rmsnorm_backward_add(d, dres, a->datty, DW(G3_LN1), a->dx, x, W(G3_LN1), s->ln1_rstd, BT, C,
                           1.0f);   /* dres = dL/d x */
}

static void embed_backward(void *acts, const plan_t *p, float *droot, const int *inp) {
  gemma3_acts *a = acts;
  device_t *d = a->dev;
  if (!droot) return;   /* a frozen root ([lora]) */
  d->kern->act_axpby(d, a->dres, a->C, a->dres, a->C, (int64_t)a->B * a->T, a->C, a->escale, 0.0f);
  d->kern->encoder_backward(d, GRAD(0, G3ROOT_EMBED, droot), NULL, a->dres, inp, a->B, a->T, a->C,
                           p->model.pad_token_id, NULL);   /* Gemma 3's embedding has a padding_idx too */
}

#undef PARAM
#undef GRAD
#undef W
#undef DW
#undef LORA

static const void *final_hidden(const void *a) { return ((const gemma3_acts *)a)->lnf; }

/* Gemma3PreTrainedModel's init: every projection and the embedding N(0, initializer_range = 0.02)
 * from rng_normal(seed, gid, k), the embedding's padding_idx row (pad_token_id) 0; every RMSNorm
 * weight 0 (its scale 1 + w starts at 1). */
static float init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k) {
  const plan_tensor *pt = &p->units[u].t[t];
  if (pt->ndim == 1) return 0.0f;
  if (u == 0 && t == G3ROOT_EMBED && p->model.pad_token_id >= 0 && k / pt->shape[1] == p->model.pad_token_id) return 0.0f;
  return (float)(0.02 * (double)rng_normal(seed, (uint32_t)pt->gid, (uint64_t)k));
}

const model_ops gemma3_model = {
  .acts_new = acts_new,
  .acts_destroy = acts_destroy,
  .embed_forward = embed_forward,
  .block_forward = block_forward,
  .head_forward_backward = head_forward_backward,
  .head_forward = head_forward,
  .block_backward = block_backward,
  .embed_backward = embed_backward,
  .final_hidden = final_hidden,
  .init_value = init_value,
};
