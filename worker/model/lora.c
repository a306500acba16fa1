/* lora — see lora.h. */
#include "lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "safetensors.h"

static void *dalloc(device_t *d, mem_category c, int64_t n, int esz) {
  return d->op->alloc(d, c, (size_t)n * (size_t)esz);
}

#define ALLOC_OR_FAIL(ptr, expr)      \
  do {                                \
    if (!((ptr) = (expr))) goto fail; \
  } while (0)

fsdp_status lora_new(const plan_t *p, int rank, device_t *d, lora_ctx **out) {
  *out = NULL;
  if (!p->lora.rank) return FSDP_OK;
  lora_ctx *l = calloc(1, sizeof *l);
  if (!l) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the adapters' context");
  const plan_lora *pl = &p->lora;
  int64_t BT = (int64_t)p->batch_size * p->model.seq_len, e = d->act_bytes;
  l->p = p, l->d = d, l->sharded = pl->sharded, l->rank = pl->sharded ? rank : 0;
  fsdp_status rc = pl->sharded ? plan_lora_units(p, &l->opt) : plan_lora_segment(p, 1, &l->opt);
  if (rc == FSDP_OK) l->n = l->opt->shard_total;
  if (rc == FSDP_OK && d->op->bind) rc = d->op->bind(d, l->opt, l->rank);   /* AdamW's table on the device (CUDA) */
  if (rc != FSDP_OK) goto out;
  rc = FSDP_ERR_NOMEM;   /* the allocator says what failed */
  l->offload = p->offload == OFFLOAD_OPTIMIZER;
  if (l->offload) {   /* host memory (zeroed), outside the device's categories: the plan's host_bytes */
    size_t bytes = (size_t)l->n * 4;
    ALLOC_OR_FAIL(l->param, d->op->alloc_host(d, bytes));
    ALLOC_OR_FAIL(l->m, d->op->alloc_host(d, bytes));
    ALLOC_OR_FAIL(l->v, d->op->alloc_host(d, bytes));
    ALLOC_OR_FAIL(l->hgrad, d->op->alloc_host(d, bytes));
    ALLOC_OR_FAIL(l->wact, dalloc(d, MEM_PARAM_SHARD, l->n, (int)e));
  } else {
    ALLOC_OR_FAIL(l->param, dalloc(d, MEM_PARAM_SHARD, l->n, 4));
    ALLOC_OR_FAIL(l->m, dalloc(d, MEM_OPTIM_STATE, l->n, 4));
    ALLOC_OR_FAIL(l->v, dalloc(d, MEM_OPTIM_STATE, l->n, 4));
    if (e == 4) l->wact = l->param;
    else ALLOC_OR_FAIL(l->wact, dalloc(d, MEM_PARAM_SHARD, l->n, (int)e));
    d->op->zero(d, l->m, (size_t)l->n * 4);
    d->op->zero(d, l->v, (size_t)l->n * 4);
  }
  ALLOC_OR_FAIL(l->grad, dalloc(d, MEM_GRAD_SHARD, l->n, 4));
  ALLOC_OR_FAIL(l->saved, dalloc(d, MEM_ACTIVATIONS, pl->saved, (int)e));
  ALLOC_OR_FAIL(l->dh, dalloc(d, MEM_WORKSPACE, BT * pl->rank, (int)e));
  *out = l;
  return FSDP_OK;
fail:
out:
  lora_destroy(&l);
  return rc;
}

void lora_destroy(lora_ctx **pl) {
  lora_ctx *l = pl ? *pl : NULL;
  if (!l) return;
  device_t *d = l->d;
  if (l->wact != l->param) d->op->free(d, l->wact);
  if (l->offload) {
    d->op->free_host(d, l->param);
    d->op->free_host(d, l->m);
    d->op->free_host(d, l->v);
    d->op->free_host(d, l->hgrad);
  } else {
    d->op->free(d, l->param);
    d->op->free(d, l->m);
    d->op->free(d, l->v);
  }
  d->op->free(d, l->grad);
  d->op->free(d, l->saved);
  d->op->free(d, l->dh);
  plan_destroy(&l->opt);
  free(l);
  *pl = NULL;
}

void lora_init_values(const plan_t *p, uint64_t seed, float *host) {
  const plan_lora *pl = &p->lora;
  int64_t r = pl->rank;
  for (int b = 0; b < p->model.n_layer; b++)
    for (int j = 0; j < pl->nmods; j++) {
      const plan_lora_mod *m = &pl->mod[j];
      float *A = host + (int64_t)b * pl->block_numel + m->a_off, *B = host + (int64_t)b * pl->block_numel + m->b_off;
      uint32_t gid = LORA_GID0 + (uint32_t)(b * PLAN_LORA_MAX + j);
      double bound = 1.0 / sqrt((double)m->in);
      for (int64_t k = 0; k < r * m->in; k++) A[k] = (float)((2.0 * rng_uniform(seed, gid, (uint64_t)k) - 1.0) * bound);
      memset(B, 0, (size_t)(m->out * r) * sizeof *B);
    }
}

fsdp_status lora_refresh(lora_ctx *l) {
  if (!l) return FSDP_OK;
  device_t *d = l->d;
  if (l->offload) {   /* from the host master: copied, or rounded to bf16 on the host (staged in hgrad) */
    if (d->act_bytes == 4) return d->op->upload(d, l->wact, l->param, (size_t)l->n * sizeof(float));
    uint16_t *h = (uint16_t *)l->hgrad;
    for (int64_t i = 0; i < l->n; i++) h[i] = st_f32_to_bf16(l->param[i]);
    return d->op->upload(d, l->wact, h, (size_t)l->n * sizeof(uint16_t));
  }
  if (l->wact != l->param) d->kern->to_act(d, l->wact, l->param, DTYPE_FP32, l->n);
  return FSDP_OK;
}

void lora_set_block(lora_ctx *l, const void *w, float *g) {
  if (!l || !l->sharded) return;
  l->wblk = w;
  l->gblk = g;
}

/* Target J of P's LoRA at SLOT, or -1. */
static int mod_of(const plan_t *p, int slot) {
  const plan_lora_mod *m = plan_lora_of(p, slot);
  return m ? (int)(m - p->lora.mod) : -1;
}

static char *at(void *base, int64_t elems, int e) { return (char *)base + elems * e; }

/* Block LAYER's target J: its A and B (act form), their gradients, and its kept h = x·Aᵀ. */
typedef struct lora_views {
  const plan_lora_mod *m;
  void *A, *B, *h;
  float *gA, *gB;
} lora_views;
static lora_views views(lora_ctx *l, int layer, int j) {
  const plan_t *p = l->p;
  const plan_lora *pl = &p->lora;
  const plan_lora_mod *m = &pl->mod[j];
  int e = l->d->act_bytes;
  int64_t base = (int64_t)layer * pl->block_numel, BT = (int64_t)p->batch_size * p->model.seq_len;
  int64_t kept = p->ackpt == ACKPT_FULL ? 0 : layer;   /* checkpointing: the recompute writes them again */
  void *w = l->wact;
  float *g = l->grad;
  if (l->sharded) w = (void *)(uintptr_t)l->wblk, g = l->gblk, base = 0;   /* the gathered block */
  return (lora_views){.m = m, .A = at(w, base + m->a_off, e), .B = at(w, base + m->b_off, e),
                      .h = at(l->saved, (kept * pl->nmods + j) * BT * pl->rank, e),
                      .gA = g ? g + base + m->a_off : NULL, .gB = g ? g + base + m->b_off : NULL};
}

/* Block LAYER's adapter at SLOT: y[:, col0 : col0 + out] += s·(x·Aᵀ)·Bᵀ, with h = x·Aᵀ kept for the
 * backward; the second product accumulates into y's columns in place (no scratch, no copy). */
void lora_forward(lora_ctx *l, int layer, int slot, void *y, const void *x) {
  int j = l ? mod_of(l->p, slot) : -1;
  if (j < 0) return;
  device_t *d = l->d;
  lora_views v = views(l, layer, j);
  int BT = l->p->batch_size * l->p->model.seq_len, r = l->p->lora.rank, in = (int)v.m->in, out = (int)v.m->out;
  float s = (float)l->p->lora.scale;
  d->kern->gemm(d, 0, 1, BT, r, in, 1.0f, x, in, v.A, in, 0.0f, v.h, r, 0);                          /* h = x·Aᵀ */
  d->kern->gemm(d, 0, 1, BT, out, r, s, v.h, r, v.B, r, 1.0f, at(y, v.m->col0, d->act_bytes), v.m->ld, 0);
}

/* With g = dy's columns of the target (read in place, rows ld wide): dB += s·gᵀ·h, dh = s·g·B,
 * dA += dhᵀ·x and dx += dh·A (accumulated into the base's input gradient in place). */
void lora_backward(lora_ctx *l, int layer, int slot, void *dx, const void *dy, const void *x) {
  int j = l ? mod_of(l->p, slot) : -1;
  if (j < 0) return;
  device_t *d = l->d;
  lora_views v = views(l, layer, j);
  int BT = l->p->batch_size * l->p->model.seq_len, r = l->p->lora.rank, in = (int)v.m->in, out = (int)v.m->out;
  float s = (float)l->p->lora.scale;
  const void *g = at((void *)(uintptr_t)dy, v.m->col0, d->act_bytes);
  int64_t ld = v.m->ld;
  d->kern->gemm(d, 1, 0, out, r, BT, s, g, ld, v.h, r, 1.0f, v.gB, r, 1);     /* dB += s·gᵀ·h */
  d->kern->gemm(d, 0, 0, BT, r, out, s, g, ld, v.B, r, 0.0f, l->dh, r, 0);    /* dh = s·g·B */
  d->kern->gemm(d, 1, 0, r, in, BT, 1.0f, l->dh, r, x, in, 1.0f, v.gA, in, 1);  /* dA += dhᵀ·x */
  if (dx) d->kern->gemm(d, 0, 0, BT, in, r, 1.0f, l->dh, r, v.A, in, 1.0f, dx, in, 0);   /* dx += dh·A */
}
