/* model_gpt2 — GPT-2 forward and backward by FSDP unit; see model_gpt2.h. */
#include "model_gpt2.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "ops_cpu.h"
#include "rng.h"

/* ---------------------------------------------------------------- buffers */

int64_t gpt2_acts_floats(const plan_t *p) {
  return (int64_t)p->model.n_layer * p->act.block_saved + p->act.root_saved;
}

int64_t gpt2_workspace_floats(const plan_t *p) {
  return p->act.head_ws > p->act.bwd_ws ? p->act.head_ws : p->act.bwd_ws;
}

/* Hand out N floats from *cursor. */
static float *take(float **cursor, int64_t n) {
  float *r = *cursor;
  *cursor += n;
  return r;
}

gpt2_acts *gpt2_acts_new(const plan_t *p) {
  gpt2_acts *a = calloc(1, sizeof *a);
  if (!a) {
    fsdp_set_error(FSDP_ERR_NOMEM, "gpt2_acts_new: out of host memory for the activation table");
    return NULL;
  }
  a->B = p->batch_size;
  a->T = p->model.seq_len;
  a->C = p->model.n_embd;
  a->NH = p->model.n_head;
  a->V = p->model.vocab_size;
  a->L = p->model.n_layer;
  a->blk = calloc((size_t)(a->L > 0 ? a->L : 1), sizeof *a->blk);
  a->saved_floats = gpt2_acts_floats(p);
  a->ws_floats = gpt2_workspace_floats(p);
  a->saved = mem_alloc(MEM_ACTIVATIONS, (size_t)a->saved_floats * sizeof(float));
  a->ws = mem_alloc(MEM_WORKSPACE, (size_t)a->ws_floats * sizeof(float));
  if (!a->blk || !a->saved || !a->ws) {
    if (!a->blk) fsdp_set_error(FSDP_ERR_NOMEM, "gpt2_acts_new: out of host memory for %d block tables", a->L);
    gpt2_acts_destroy(&a);     /* mem_alloc recorded its own error */
    return NULL;
  }
  const int64_t BT = (int64_t)a->B * a->T, BTC = BT * a->C, BHTT = (int64_t)a->B * a->NH * a->T * a->T;

  float *c = a->saved;
  for (int l = 0; l < a->L; l++) {   /* block_saved = 16·BTC + 4·BT + BHTT, in plan_act's order */
    gpt2_block_acts *b = &a->blk[l];
    b->ln1 = take(&c, BTC);
    b->ln1_mean = take(&c, BT);
    b->ln1_rstd = take(&c, BT);
    b->qkv = take(&c, 3 * BTC);
    b->atty = take(&c, BTC);
    b->att = take(&c, BHTT);
    b->res2 = take(&c, BTC);
    b->ln2 = take(&c, BTC);
    b->ln2_mean = take(&c, BT);
    b->ln2_rstd = take(&c, BT);
    b->fch = take(&c, 4 * BTC);
    b->fch_gelu = take(&c, 4 * BTC);
    b->out = take(&c, BTC);
  }
  a->x0 = take(&c, BTC);             /* root_saved = 2·BTC + 2·BT */
  a->lnf = take(&c, BTC);
  a->lnf_mean = take(&c, BT);
  a->lnf_rstd = take(&c, BT);

  /* Backward scratch (bwd_ws = 7·BTC + BHTT). dres starts at 0 and overlaps the logits: the
   * head writes it only after the logits are dead. */
  c = a->ws;
  a->dres = take(&c, BTC);
  a->dx = take(&c, BTC);
  a->dbuf = take(&c, 4 * BTC);
  a->datty = take(&c, BTC);
  a->datt = take(&c, BHTT);
  /* The head: logits, losses, then dlnf after both (live together during classifier_backward). */
  c = a->ws;
  a->logits = take(&c, BT * a->V);
  a->losses = take(&c, BT);
  a->dlnf = take(&c, BTC);
  /* Forward scratch: anywhere; nothing else is live. */
  a->fwd_tmp = a->ws;
  return a;
}

void gpt2_acts_destroy(gpt2_acts **pa) {
  if (!pa || !*pa) return;
  gpt2_acts *a = *pa;
  mem_free(a->saved);
  mem_free(a->ws);
  free(a->blk);
  free(a);
  *pa = NULL;
}

/* ---------------------------------------------------------------- forward */

/* Parameter views of a unit's gathered buffer. The const cast is safe: forward only reads. */
#define PARAM(u, slot, buf) gpt2_tensor(p, (u), (slot), (float *)(buf))

void gpt2_embed_forward(gpt2_acts *a, const plan_t *p, const float *root, const int *inp) {
  encoder_forward(a->x0, inp, PARAM(0, ROOT_WTE, root), PARAM(0, ROOT_WPE, root), a->B, a->T, a->C);
}

/* The residual stream entering block LAYER and leaving the last block. */
static float *block_input(gpt2_acts *a, int layer) { return layer == 0 ? a->x0 : a->blk[layer - 1].out; }
static float *last_output(gpt2_acts *a) { return a->L == 0 ? a->x0 : a->blk[a->L - 1].out; }

void gpt2_block_forward(gpt2_acts *a, const plan_t *p, int layer, const float *unit) {
  const int B = a->B, T = a->T, C = a->C, NH = a->NH, BT = B * T, u = 1 + layer;
  gpt2_block_acts *s = &a->blk[layer];
  const float *x = block_input(a, layer);

  layernorm_forward(s->ln1, s->ln1_mean, s->ln1_rstd, x, PARAM(u, BLK_LN1_W, unit), PARAM(u, BLK_LN1_B, unit),
                    B, T, C);
  matmul_forward(s->qkv, s->ln1, PARAM(u, BLK_ATTN_W, unit), PARAM(u, BLK_ATTN_B, unit), BT, C, 3 * C);
  attention_forward(s->atty, s->att, s->qkv, B, T, C, NH);
  matmul_forward(a->fwd_tmp, s->atty, PARAM(u, BLK_ATTNPROJ_W, unit), PARAM(u, BLK_ATTNPROJ_B, unit), BT, C, C);
  residual_forward(s->res2, x, a->fwd_tmp, BT * C);

  layernorm_forward(s->ln2, s->ln2_mean, s->ln2_rstd, s->res2, PARAM(u, BLK_LN2_W, unit),
                    PARAM(u, BLK_LN2_B, unit), B, T, C);
  matmul_forward(s->fch, s->ln2, PARAM(u, BLK_FC_W, unit), PARAM(u, BLK_FC_B, unit), BT, C, 4 * C);
  gelu_forward(s->fch_gelu, s->fch, BT * 4 * C);
  matmul_forward(a->fwd_tmp, s->fch_gelu, PARAM(u, BLK_FCPROJ_W, unit), PARAM(u, BLK_FCPROJ_B, unit), BT, 4 * C, C);
  residual_forward(s->out, s->res2, a->fwd_tmp, BT * C);
}

/* ---------------------------------------------------------------- loss and backward */

/* dst += src over N floats: the backward of a residual branch joining the stream. */
static void accumulate(float *dst, const float *src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

double gpt2_head_forward_backward(gpt2_acts *a, const plan_t *p, const float *root, float *droot,
                                  const int *targets, float dscale) {
  const int B = a->B, T = a->T, C = a->C, V = a->V, BT = B * T;
  const float *x = last_output(a);
  const float *wte = PARAM(0, ROOT_WTE, root);

  layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, PARAM(0, ROOT_LNF_W, root), PARAM(0, ROOT_LNF_B, root),
                    B, T, C);
  classifier_forward(a->logits, a->lnf, wte, BT, C, V);
  double loss = softmax_xent_forward_backward(a->logits, a->losses, targets, BT, V, dscale);  /* logits → dlogits */

  classifier_backward(a->dlnf, gpt2_tensor(p, 0, ROOT_WTE, droot), a->logits, a->lnf, wte, BT, C, V);
  /* dlogits is dead from here on, so dres may overwrite it. */
  layernorm_backward(a->dres, gpt2_tensor(p, 0, ROOT_LNF_W, droot), gpt2_tensor(p, 0, ROOT_LNF_B, droot), a->dlnf,
                     x, PARAM(0, ROOT_LNF_W, root), a->lnf_mean, a->lnf_rstd, B, T, C);
  return loss;
}

void gpt2_block_backward(gpt2_acts *a, const plan_t *p, int layer, const float *unit, float *dunit) {
  const int B = a->B, T = a->T, C = a->C, NH = a->NH, BT = B * T, u = 1 + layer;
  gpt2_block_acts *s = &a->blk[layer];
  const float *x = block_input(a, layer);
  float *dres = a->dres;              /* on entry dL/d out; on return dL/d x */
  float *dfch = s->fch_gelu;          /* fch_gelu is dead once c_proj's weight gradient is taken */
#define DPARAM(slot) gpt2_tensor(p, u, (slot), dunit)

  /* MLP: out = res2 + c_proj(gelu(c_fc(ln2(res2)))) */
  matmul_backward(a->dbuf, DPARAM(BLK_FCPROJ_W), DPARAM(BLK_FCPROJ_B), dres, s->fch_gelu,
                  PARAM(u, BLK_FCPROJ_W, unit), BT, 4 * C, C);
  gelu_backward(dfch, s->fch, a->dbuf, BT * 4 * C);
  matmul_backward(a->dx, DPARAM(BLK_FC_W), DPARAM(BLK_FC_B), dfch, s->ln2, PARAM(u, BLK_FC_W, unit), BT, C, 4 * C);
  layernorm_backward(a->datty, DPARAM(BLK_LN2_W), DPARAM(BLK_LN2_B), a->dx, s->res2, PARAM(u, BLK_LN2_W, unit),
                     s->ln2_mean, s->ln2_rstd, B, T, C);
  accumulate(dres, a->datty, (int64_t)BT * C);               /* dres = dL/d res2 */

  /* attention: res2 = x + c_proj(attn(c_attn(ln1(x)))) */
  matmul_backward(a->datty, DPARAM(BLK_ATTNPROJ_W), DPARAM(BLK_ATTNPROJ_B), dres, s->atty,
                  PARAM(u, BLK_ATTNPROJ_W, unit), BT, C, C);
  attention_backward(a->dbuf, a->datt, a->datty, s->qkv, s->att, B, T, C, NH);   /* dbuf = d qkv */
  matmul_backward(a->dx, DPARAM(BLK_ATTN_W), DPARAM(BLK_ATTN_B), a->dbuf, s->ln1, PARAM(u, BLK_ATTN_W, unit),
                  BT, C, 3 * C);
  layernorm_backward(a->datty, DPARAM(BLK_LN1_W), DPARAM(BLK_LN1_B), a->dx, x, PARAM(u, BLK_LN1_W, unit),
                     s->ln1_mean, s->ln1_rstd, B, T, C);
  accumulate(dres, a->datty, (int64_t)BT * C);               /* dres = dL/d x */
#undef DPARAM
}

void gpt2_embed_backward(gpt2_acts *a, const plan_t *p, float *droot, const int *inp) {
  encoder_backward(gpt2_tensor(p, 0, ROOT_WTE, droot), gpt2_tensor(p, 0, ROOT_WPE, droot), a->dres, inp,
                   a->B, a->T, a->C);
}

double gpt2_forward_backward(const plan_t *p, gpt2_acts *a, float *const *units, float *const *dunits,
                             const int *inp, const int *targets, float dscale) {
  gpt2_embed_forward(a, p, units[0], inp);
  for (int l = 0; l < a->L; l++) gpt2_block_forward(a, p, l, units[1 + l]);
  double loss = gpt2_head_forward_backward(a, p, units[0], dunits[0], targets, dscale);
  for (int l = a->L - 1; l >= 0; l--) gpt2_block_backward(a, p, l, units[1 + l], dunits[1 + l]);
  gpt2_embed_backward(a, p, dunits[0], inp);
  return loss;
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

void gpt2_init_shard(const plan_t *p, uint64_t seed, int rank, float *shard) {
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *un = &p->units[u];
    const int64_t lo = plan_shard_offset(p, u, rank), hi = lo + un->shard_numel;
    float *dst = shard + un->shard_base;    /* dst[i] is flat element lo + i */
    memset(dst, 0, (size_t)un->shard_numel * sizeof(float));
    for (int t = 0; t < un->ntensors; t++) {
      const plan_tensor *pt = &un->t[t];
      int64_t a = pt->offset > lo ? pt->offset : lo;
      int64_t b = pt->offset + pt->numel < hi ? pt->offset + pt->numel : hi;
#pragma omp parallel for schedule(static)
      for (int64_t e = a; e < b; e++) dst[e - lo] = gpt2_init_value(p, u, t, seed, e - pt->offset);
    }
  }
}
