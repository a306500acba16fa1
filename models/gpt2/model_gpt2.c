/* model_gpt2 — GPT-2 forward and backward by FSDP unit over the device layer; see model_gpt2.h. */
#include "model_gpt2.h"

#include <math.h>
#include <stdlib.h>

#include "lora.h"
#include "model.h"
#include "rng.h"

/* ---------------------------------------------------------------- buffers */

/* Lay the saved activations and the workspace views out from SAVED and WS; returns the byte sizes. */
static void layout(void *acts, char *saved, char *ws, int64_t *saved_bytes, int64_t *ws_bytes) {
  gpt2_acts *a = acts;
  const int64_t BT = (int64_t)a->B * a->T, BTC = BT * a->C;
  const int64_t ATT = dev_attention_floats(a->dev, a->B, a->T, a->NH);
  const int64_t DATT = dev_attention_scratch_floats(a->dev, a->B, a->T, a->NH, a->C / a->NH);
  const int e = a->dev->act_bytes;
  char *c = saved;
  int64_t o = 0;
  for (int l = 0; l < a->L; l++) {   /* block_saved = 16·BTC + 4·BT + BHTT, in plan_act's order */
    gpt2_block_acts *b = &a->blk[l];
    if (a->recompute) {                /* checkpointing: only the output per block, block_saved = BTC */
      b->out = model_take(c, &o, BTC, e);
      continue;
    }
    b->ln1 = model_take(c, &o, BTC, e);
    b->ln1_mean = model_take(c, &o, BT, 4);
    b->ln1_rstd = model_take(c, &o, BT, 4);
    b->qkv = model_take(c, &o, 3 * BTC, e);
    b->atty = model_take(c, &o, BTC, e);
    b->att = model_take(c, &o, ATT, 4);
    b->res2 = model_take(c, &o, BTC, e);
    b->ln2 = model_take(c, &o, BTC, e);
    b->ln2_mean = model_take(c, &o, BT, 4);
    b->ln2_rstd = model_take(c, &o, BT, 4);
    b->fch = model_take(c, &o, 4 * BTC, e);
    b->fch_gelu = model_take(c, &o, 4 * BTC, e);
    b->out = model_take(c, &o, BTC, e);
  }
  if (a->recompute && a->L > 0) {      /* the one working set every block shares: block_ws */
    gpt2_block_acts w;
    w.ln1 = model_take(c, &o, BTC, e);
    w.ln1_mean = model_take(c, &o, BT, 4);
    w.ln1_rstd = model_take(c, &o, BT, 4);
    w.qkv = model_take(c, &o, 3 * BTC, e);
    w.atty = model_take(c, &o, BTC, e);
    w.att = model_take(c, &o, ATT, 4);
    w.res2 = model_take(c, &o, BTC, e);
    w.ln2 = model_take(c, &o, BTC, e);
    w.ln2_mean = model_take(c, &o, BT, 4);
    w.ln2_rstd = model_take(c, &o, BT, 4);
    w.fch = model_take(c, &o, 4 * BTC, e);
    w.fch_gelu = model_take(c, &o, 4 * BTC, e);
    a->fwd_tmp = model_take(c, &o, BTC, e);   /* not the workspace: a recompute runs amid the backward */
    for (int l = 0; l < a->L; l++) {
      w.out = a->blk[l].out;
      a->blk[l] = w;
    }
  }
  a->x0 = model_take(c, &o, BTC, e);             /* root_saved = 2·BTC + 2·BT */
  a->lnf = model_take(c, &o, BTC, e);
  a->lnf_mean = model_take(c, &o, BT, 4);
  a->lnf_rstd = model_take(c, &o, BT, 4);
  *saved_bytes = o;

  /* Backward scratch (bwd_ws = 7·BTC + BHTT). dres starts at 0 and overlaps the logits: the
   * head writes it only after the logits are dead. */
  c = ws, o = 0;
  a->dres = model_take(c, &o, BTC, e);
  a->dx = model_take(c, &o, BTC, e);
  a->dbuf = model_take(c, &o, 4 * BTC, e);
  a->datty = model_take(c, &o, BTC, e);
  a->datt = model_take(c, &o, DATT, 4);
  int64_t bwd = o;
  /* The head: logits, losses, then dlnf after both (live together during the classifier). */
  o = 0;
  /* the logits slot also holds dres (at 0) once they are dead: at least BTC act elements, so that
   * dres never reaches the losses or dlnf that ln_f's backward reads while writing it */
  int64_t lg = dev_logits_bytes(a->dev, (int)BT, a->V, a->C);   /* BT·V fp32 on the CPU */
  a->logits = model_take(c, &o, lg > BTC * e ? lg : BTC * e, 1);
  a->losses = model_take(c, &o, BT, 4);
  a->dlnf = model_take(c, &o, BTC, e);
  int64_t head = o;
  /* Forward scratch: anywhere in the workspace, where nothing else is live during the forward
   * (with checkpointing it is in the working set, above) */
  if (!a->recompute) a->fwd_tmp = ws;
  *ws_bytes = bwd > head ? bwd : head;
}

gpt2_acts *gpt2_acts_new(const plan_t *p, device_t *d) {
  gpt2_acts *a = calloc(1, sizeof *a);
  if (!a) {
    fsdp_set_error(FSDP_ERR_NOMEM, "gpt2_acts_new: out of host memory for the activation table");
    return NULL;
  }
  a->dev = d;
  a->recompute = p->ackpt == ACKPT_FULL;
  a->B = p->batch_size;
  a->T = p->model.seq_len;
  a->C = p->model.n_embd;
  a->NH = p->model.n_head;
  a->V = p->model.vocab_size;
  a->L = p->model.n_layer;
  a->blk = calloc((size_t)(a->L > 0 ? a->L : 1), sizeof *a->blk);
  if (!a->blk) {
    fsdp_set_error(FSDP_ERR_NOMEM, "gpt2_acts_new: out of host memory for %d block tables", a->L);
    gpt2_acts_destroy(&a);
    return NULL;
  }
  if (model_arena_alloc(&a->arena, d, layout, a) != FSDP_OK) {
    gpt2_acts_destroy(&a);   /* the allocator recorded its own error */
    return NULL;
  }
  return a;
}

void gpt2_acts_destroy(gpt2_acts **pa) {
  if (!pa || !*pa) return;
  gpt2_acts *a = *pa;
  model_arena_free(&a->arena);
  free(a->blk);
  free(a);
  *pa = NULL;
}

/* ---------------------------------------------------------------- forward */

#define PARAM(u, slot, buf) model_param(p, a->dev, (u), (slot), (buf))
/* The adapters ([lora]) around a projection: nothing where none is (lora.h) */
#define LORA (a->arena.lora)
#define LORA_AT(slot) (LORA && plan_lora_of(p, (slot)))

void gpt2_embed_forward(gpt2_acts *a, const plan_t *p, const void *root, const int *inp) {
  device_t *d = a->dev;
  d->kern->encoder_forward(d, a->x0, inp, PARAM(0, ROOT_WTE, root), PARAM(0, ROOT_WPE, root), a->B, a->T, a->C,
                           a->arena.seg);
}

/* The residual stream entering block LAYER and leaving the last block. */
static void *block_input(gpt2_acts *a, int layer) { return layer == 0 ? a->x0 : a->blk[layer - 1].out; }
static void *last_output(gpt2_acts *a) { return a->L == 0 ? a->x0 : a->blk[a->L - 1].out; }

void gpt2_block_forward(gpt2_acts *a, const plan_t *p, int layer, const void *unit) {
  const int B = a->B, T = a->T, C = a->C, NH = a->NH, BT = B * T, u = 1 + layer;
  device_t *d = a->dev;
  gpt2_block_acts *s = &a->blk[layer];
  const void *x = block_input(a, layer);

  d->kern->layernorm_forward(d, s->ln1, s->ln1_mean, s->ln1_rstd, x, PARAM(u, BLK_LN1_W, unit),
                           PARAM(u, BLK_LN1_B, unit), B, T, C);
  d->kern->matmul_forward(d, s->qkv, s->ln1, PARAM(u, BLK_ATTN_W, unit), PARAM(u, BLK_ATTN_B, unit), BT, C, 3 * C);
  lora_forward(LORA, layer, BLK_ATTN_W, s->qkv, s->ln1);
  d->kern->attention_forward(d, s->atty, s->att, s->qkv, B, T, C, NH, NH, a->arena.seg, 0);
  d->kern->matmul_forward(d, a->fwd_tmp, s->atty, PARAM(u, BLK_ATTNPROJ_W, unit), PARAM(u, BLK_ATTNPROJ_B, unit), BT,
                        C, C);
  lora_forward(LORA, layer, BLK_ATTNPROJ_W, a->fwd_tmp, s->atty);
  dev_residual_layernorm(d, s->res2, s->ln2, s->ln2_mean, s->ln2_rstd, x, a->fwd_tmp, PARAM(u, BLK_LN2_W, unit),
                         PARAM(u, BLK_LN2_B, unit), B, T, C);
  if (LORA_AT(BLK_FC_W)) {   /* the adapter adds before the GELU: c_fc unfused */
    d->kern->matmul_forward(d, s->fch, s->ln2, PARAM(u, BLK_FC_W, unit), PARAM(u, BLK_FC_B, unit), BT, C, 4 * C);
    lora_forward(LORA, layer, BLK_FC_W, s->fch, s->ln2);
    d->kern->gelu_forward(d, s->fch_gelu, s->fch, (int64_t)BT * 4 * C);
  } else {
    dev_matmul_gelu(d, s->fch_gelu, s->fch, s->ln2, PARAM(u, BLK_FC_W, unit), PARAM(u, BLK_FC_B, unit), BT, C,
                    4 * C);
  }
  d->kern->matmul_forward(d, a->fwd_tmp, s->fch_gelu, PARAM(u, BLK_FCPROJ_W, unit), PARAM(u, BLK_FCPROJ_B, unit), BT,
                        4 * C, C);
  lora_forward(LORA, layer, BLK_FCPROJ_W, a->fwd_tmp, s->fch_gelu);
  d->kern->residual_forward(d, s->out, s->res2, a->fwd_tmp, (int64_t)BT * C);
}

/* ---------------------------------------------------------------- loss and backward */

void gpt2_head_forward_backward(gpt2_acts *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                float dscale, float *loss_acc) {
  const int B = a->B, T = a->T, C = a->C, V = a->V, BT = B * T;
  device_t *d = a->dev;
  const void *x = last_output(a);

  d->kern->layernorm_forward(d, a->lnf, a->lnf_mean, a->lnf_rstd, x, PARAM(0, ROOT_LNF_W, root),
                           PARAM(0, ROOT_LNF_B, root), B, T, C);
  d->kern->classifier(d, a->dlnf, model_grad(p, 0, ROOT_WTE, droot), a->losses, loss_acc, a->logits, a->lnf,
                    PARAM(0, ROOT_WTE, root), targets, BT, C, V, dscale);
  /* dlogits is dead from here on, so dres may overwrite it. */
  d->kern->layernorm_backward(d, a->dres, model_grad(p, 0, ROOT_LNF_W, droot), model_grad(p, 0, ROOT_LNF_B, droot),
                            a->dlnf, x, PARAM(0, ROOT_LNF_W, root), a->lnf_mean, a->lnf_rstd, B, T, C);
}

void gpt2_head_forward(gpt2_acts *a, const plan_t *p, const void *root, const int *targets, float *loss_acc) {
  const int B = a->B, T = a->T, C = a->C;
  device_t *d = a->dev;
  d->kern->layernorm_forward(d, a->lnf, a->lnf_mean, a->lnf_rstd, last_output(a), PARAM(0, ROOT_LNF_W, root),
                           PARAM(0, ROOT_LNF_B, root), B, T, C);
  if (targets)
    d->kern->classifier(d, NULL, NULL, a->losses, loss_acc, a->logits, a->lnf, PARAM(0, ROOT_WTE, root), targets,
                      B * T, C, a->V, 1.0f);
}

void gpt2_block_backward(gpt2_acts *a, const plan_t *p, int layer, const void *unit, float *dunit) {
  const int B = a->B, T = a->T, C = a->C, NH = a->NH, BT = B * T, u = 1 + layer;
  device_t *d = a->dev;
  gpt2_block_acts *s = &a->blk[layer];
  const void *x = block_input(a, layer);
  void *dres = a->dres;              /* on entry dL/d out; on return dL/d x */
  void *dfch = s->fch_gelu;          /* fch_gelu is dead once c_proj's weight gradient is taken */
#define DPARAM(slot) model_grad(p, u, (slot), dunit)

  /* activation checkpointing: the block's activations again, from its saved input, with the unit
   * the runtime gathered for this backward; the same operators give the same bits */
  if (a->recompute) gpt2_block_forward(a, p, layer, unit);

  /* MLP: out = res2 + c_proj(gelu(c_fc(ln2(res2)))) */
  if (LORA_AT(BLK_FCPROJ_W)) {   /* the adapter's input gradient joins before the GELU's: unfused */
    d->kern->matmul_backward(d, a->dbuf, DPARAM(BLK_FCPROJ_W), DPARAM(BLK_FCPROJ_B), dres, s->fch_gelu,
                             PARAM(u, BLK_FCPROJ_W, unit), BT, 4 * C, C);
    lora_backward(LORA, layer, BLK_FCPROJ_W, a->dbuf, dres, s->fch_gelu);
    d->kern->gelu_backward(d, dfch, s->fch, a->dbuf, (int64_t)BT * 4 * C);
  } else {
    dev_matmul_backward_gelu(d, dfch, DPARAM(BLK_FCPROJ_W), DPARAM(BLK_FCPROJ_B), dres, s->fch_gelu,
                             PARAM(u, BLK_FCPROJ_W, unit), s->fch, a->dbuf, BT, 4 * C, C);
  }
  d->kern->matmul_backward(d, a->dx, DPARAM(BLK_FC_W), DPARAM(BLK_FC_B), dfch, s->ln2, PARAM(u, BLK_FC_W, unit), BT, C,
                         4 * C);
  lora_backward(LORA, layer, BLK_FC_W, a->dx, dfch, s->ln2);
  dev_layernorm_backward_add(d, dres, a->datty, DPARAM(BLK_LN2_W), DPARAM(BLK_LN2_B), a->dx, s->res2,
                             PARAM(u, BLK_LN2_W, unit), s->ln2_mean, s->ln2_rstd, B, T, C);   /* dres = dL/d res2 */

  /* attention: res2 = x + c_proj(attn(c_attn(ln1(x)))) */
  d->kern->matmul_backward(d, a->datty, DPARAM(BLK_ATTNPROJ_W), DPARAM(BLK_ATTNPROJ_B), dres, s->atty,
                         PARAM(u, BLK_ATTNPROJ_W, unit), BT, C, C);
  lora_backward(LORA, layer, BLK_ATTNPROJ_W, a->datty, dres, s->atty);
  d->kern->attention_backward(d, a->dbuf, a->datt, a->datty, s->qkv, s->atty, s->att, B, T, C, NH, NH, a->arena.seg,
                              0);   /* dbuf = d qkv */
  /* a frozen base ([lora]) needs no gradient below the first block: there c_attn's backward gives
   * the adapters theirs and stops */
  void *dln1 = layer > 0 || dunit ? a->dx : NULL;
  d->kern->matmul_backward(d, dln1, DPARAM(BLK_ATTN_W), DPARAM(BLK_ATTN_B), a->dbuf, s->ln1,
                         PARAM(u, BLK_ATTN_W, unit), BT, C, 3 * C);
  lora_backward(LORA, layer, BLK_ATTN_W, dln1, a->dbuf, s->ln1);
  if (dln1)
    dev_layernorm_backward_add(d, dres, a->datty, DPARAM(BLK_LN1_W), DPARAM(BLK_LN1_B), a->dx, x,
                               PARAM(u, BLK_LN1_W, unit), s->ln1_mean, s->ln1_rstd, B, T, C);   /* dres = dL/d x */
#undef DPARAM
}

void gpt2_embed_backward(gpt2_acts *a, const plan_t *p, float *droot, const int *inp) {
  device_t *d = a->dev;
  if (!droot) return;   /* a frozen root ([lora]): nothing below the embedding needs a gradient */
  d->kern->encoder_backward(d, model_grad(p, 0, ROOT_WTE, droot), model_grad(p, 0, ROOT_WPE, droot), a->dres, inp,
                          a->B, a->T, a->C, -1, a->arena.seg);   /* GPT2Model's wte has no padding_idx */
}

/* ---------------------------------------------------------------- initialization */

float gpt2_init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k) {
  const plan_tensor *pt = &p->units[u].t[t];
  double std = 0.02;
  if (u == 0) {
    if (t == ROOT_LNF_W) return 1.0f;
    if (t == ROOT_LNF_B) return 0.0f;
  } else {
    switch (t) {
      case BLK_LN1_W: case BLK_LN2_W: return 1.0f;
      case BLK_LN1_B: case BLK_LN2_B: case BLK_ATTN_B: case BLK_ATTNPROJ_B: case BLK_FC_B: case BLK_FCPROJ_B:
        return 0.0f;
      case BLK_ATTNPROJ_W: case BLK_FCPROJ_W:   /* GPT-2's residual-projection scaling */
        std = 0.02 / sqrt(2.0 * p->model.n_layer);
        break;
      default: break;
    }
  }
  return (float)(std * (double)rng_normal(seed, (uint32_t)pt->gid, (uint64_t)k));
}

/* ---------------------------------------------------------------- the table (model.h) */

static void *acts_new(const plan_t *p, device_t *d) { return gpt2_acts_new(p, d); }
static void acts_destroy(void *acts) {
  gpt2_acts *a = acts;
  gpt2_acts_destroy(&a);
}
static void embed_forward(void *a, const plan_t *p, const void *root, const int *inp) {
  gpt2_embed_forward(a, p, root, inp);
}
static void block_forward(void *a, const plan_t *p, int layer, const void *unit) { gpt2_block_forward(a, p, layer, unit); }
static void head_forward_backward(void *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                  float dscale, float *loss_acc) {
  gpt2_head_forward_backward(a, p, root, droot, targets, dscale, loss_acc);
}
static void head_forward(void *a, const plan_t *p, const void *root, const int *targets, float *loss_acc) {
  gpt2_head_forward(a, p, root, targets, loss_acc);
}
static void block_backward(void *a, const plan_t *p, int layer, const void *unit, float *dunit) {
  gpt2_block_backward(a, p, layer, unit, dunit);
}
static void embed_backward(void *a, const plan_t *p, float *droot, const int *inp) {
  gpt2_embed_backward(a, p, droot, inp);
}
static const void *final_hidden(const void *a) { return ((const gpt2_acts *)a)->lnf; }

const model_ops gpt2_model = {
  .acts_new = acts_new,
  .acts_destroy = acts_destroy,
  .embed_forward = embed_forward,
  .block_forward = block_forward,
  .head_forward_backward = head_forward_backward,
  .head_forward = head_forward,
  .block_backward = block_backward,
  .embed_backward = embed_backward,
  .final_hidden = final_hidden,
  .init_value = gpt2_init_value,
};
