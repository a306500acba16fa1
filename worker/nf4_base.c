/* nf4_base — see nf4_base.h. */
#include "nf4_base.h"

#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "nf4.h"
#include "safetensors.h"
#include "st_model.h"

static int64_t tensor_bytes(const plan_tensor *t) { return t->ndim == 1 ? 2 * t->numel : nf4_bytes(t->numel); }

int64_t nf4_base_offset(const plan_unit *u, int t) {
  int64_t at = 0;
  for (int i = 0; i < t; i++) at += tensor_bytes(&u->t[i]);
  return at;
}

/* Q: P read through unit U only, its shard N elements long (every other unit's empty, every shard at
 * 0 of the caller's buffer); with ONE_RANK a world of one, so that the shard is the unit's elements
 * [0, N). UNITS: room for p->nunits units. */
static void view_of(const plan_t *p, int u, int64_t n, int one_rank, plan_unit *units, plan_t *q) {
  *q = *p;
  memcpy(units, p->units, (size_t)p->nunits * sizeof *units);
  for (int k = 0; k < p->nunits; k++) {
    units[k].shard_base = 0;
    units[k].shard_numel = k == u ? n : 0;
  }
  q->units = units;
  if (one_rank) q->world = q->shard_world = q->ngroups = 1;
}

/* RANK's shard of Q's one non-empty unit in fp32 into DST: the seed's values, or F's. */
static fsdp_status read_view(const jobspec_t *spec, st_model *f, const plan_t *q, int rank, float *dst) {
  if (!f) {
    model_init_shard(q, spec->seed, rank, dst);
    return FSDP_OK;
  }
  return st_model_load_shard(f, q, rank, dst);
}

/* Block unit U's bytes [lo, lo + nf4_shard) into OUT: the tensors they touch read (X: room for the
 * unit's elements) and quantized whole into IMG (nf4_padded bytes). */
static fsdp_status load_block(const jobspec_t *spec, st_model *f, const plan_t *p, int u, int64_t lo, plan_unit *units,
                              float *x, uint8_t *img, uint8_t *out) {
  const plan_unit *U = &p->units[u];
  int64_t hi = lo + p->lora.nf4_shard, end = 0;   /* end: the elements to read */
  for (int t = 0; t < U->ntensors; t++) {
    int64_t a = nf4_base_offset(U, t), b = a + tensor_bytes(&U->t[t]);
    if (a < hi && b > lo) end = U->t[t].offset + U->t[t].numel;
  }
  memset(img, 0, (size_t)p->lora.nf4_padded);
  if (end > 0) {
    plan_t q;
    view_of(p, u, end, 1, units, &q);
    TRY(read_view(spec, f, &q, 0, x));
  }
  for (int t = 0; t < U->ntensors; t++) {
    const plan_tensor *pt = &U->t[t];
    int64_t a = nf4_base_offset(U, t), b = a + tensor_bytes(pt);
    if (a >= hi || b <= lo) continue;
    if (pt->ndim == 1) {
      for (int64_t i = 0; i < pt->numel; i++) {
        uint16_t h = st_f32_to_bf16(x[pt->offset + i]);
        memcpy(img + a + 2 * i, &h, sizeof h);
      }
    } else if (nf4_record_write(x + pt->offset, pt->numel, img + a) != 0) {
      return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the block scales to quantize %s to NF4", pt->name);
    }
  }
  memcpy(out, img + lo, (size_t)p->lora.nf4_shard);
  return FSDP_OK;
}

fsdp_status nf4_base_load(const jobspec_t *spec, const plan_t *p, int rank, uint16_t *root, uint8_t *blocks) {
  int64_t Sr = p->units[0].shard_numel, pb = Sr;
  for (int u = 1; u < p->nunits; u++) {
    if (nf4_base_offset(&p->units[u], p->units[u].ntensors) > p->lora.nf4_padded)
      return fsdp_set_error(FSDP_ERR_INTERNAL, "block %s's NF4 image is larger than the plan's %lld bytes",
                            p->units[u].name, (long long)p->lora.nf4_padded);
    if (p->units[u].numel > pb) pb = p->units[u].numel;
  }
  plan_unit *units = malloc((size_t)p->nunits * sizeof *units);
  float *x = malloc((size_t)pb * sizeof *x);
  uint8_t *img = malloc((size_t)p->lora.nf4_padded);
  st_model *f = NULL;
  fsdp_status rc = units && x && img ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the host buffers to "
                                                                "quantize the base (%lld bytes)", (long long)(4 * pb));
  if (rc == FSDP_OK && strcmp(spec->init, "random") != 0) rc = st_model_open(spec->init, &f);
  if (rc == FSDP_OK) {   /* the root: this rank's shard, rounded to bf16 */
    plan_t q;
    view_of(p, 0, Sr, 0, units, &q);
    rc = read_view(spec, f, &q, rank, x);
    for (int64_t i = 0; rc == FSDP_OK && i < Sr; i++) root[i] = st_f32_to_bf16(x[i]);
  }
  int64_t lo = (int64_t)plan_group_rank(p, rank) * p->lora.nf4_shard;
  for (int u = 1; rc == FSDP_OK && u < p->nunits; u++)
    rc = load_block(spec, f, p, u, lo, units, x, img, blocks + (int64_t)(u - 1) * p->lora.nf4_shard);
  st_model_destroy(&f);
  free(img);
  free(x);
  free(units);
  return rc;
}

void nf4_base_dequant(device_t *d, const plan_unit *u, const uint8_t *img, uint16_t *out) {
  int64_t at = 0;
  for (int t = 0; t < u->ntensors; t++) {
    const plan_tensor *pt = &u->t[t];
    if (pt->ndim == 1) d->op->copy(d, out + pt->offset, img + at, (size_t)pt->numel * sizeof(uint16_t));
    else d->kern->nf4_dequant(d, out + pt->offset, img + at, pt->numel);
    at += tensor_bytes(pt);
  }
}
