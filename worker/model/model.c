/* model — dispatch by architecture through the table of models/models.def; see model.h. */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#define FSDP_ARCH(ID, name) extern const model_ops name##_model;
#include "models.def"

static const model_ops *const table[] = {
#define FSDP_ARCH(ID, name) [ARCH_##ID] = &name##_model,
#include "models.def"
};

const model_ops *model_ops_of(model_arch a) {
  return (unsigned)a < sizeof table / sizeof table[0] ? table[a] : NULL;
}

model_acts *model_acts_new(const plan_t *p, device_t *d) {
  const model_ops *ops = model_ops_of(p->model.arch);
  if (!ops) {
    fsdp_set_error(FSDP_ERR_INVALID, "model_acts_new: architecture %d has no model", (int)p->model.arch);
    return NULL;
  }
  model_acts *a = calloc(1, sizeof *a);
  if (!a) {
    fsdp_set_error(FSDP_ERR_NOMEM, "model_acts_new: out of host memory");
    return NULL;
  }
  a->ops = ops;
  a->acts = ops->acts_new(p, d);
  if (!a->acts) {   /* the architecture's constructor recorded the error */
    free(a);
    return NULL;
  }
  model_arena *ar = (model_arena *)a->acts;   /* the plan counts the document starts: made now (model_set_docs) */
  const size_t seg_bytes = (size_t)p->batch_size * (size_t)p->model.seq_len * sizeof(int32_t);
  if (p->docs && !(ar->seg_buf = d->op->alloc(d, MEM_ACTIVATIONS, seg_bytes))) {
    model_acts_destroy(&a);
    return NULL;
  }
  return a;
}

void model_acts_destroy(model_acts **pa) {
  if (!pa || !*pa) return;
  (*pa)->ops->acts_destroy((*pa)->acts);
  free(*pa);
  *pa = NULL;
}

fsdp_status model_set_docs(model_acts *a, const plan_t *p, const int32_t *seg) {
  model_arena *ar = (model_arena *)a->acts;   /* every architecture's state starts with its arena */
  const int B = p->batch_size, T = p->model.seq_len;
  int several = 0;
  for (int b = 0; seg && b < B; b++)
    for (int t = 0; t < T; t++) {
      int32_t s = seg[(int64_t)b * T + t], prev = t ? seg[(int64_t)b * T + t - 1] : 0;
      if (s != prev && s != t)
        return fsdp_set_error(FSDP_ERR_INVALID, "packed rows: token %d of row %d starts its document at %d; allowed: "
                              "%d (the previous token's document) or %d (a new document)", t, b, (int)s, (int)prev, t);
      several |= s != 0;
    }
  if (!several) {   /* every row one document: the kernels' own causal path */
    ar->seg = NULL;
    return FSDP_OK;
  }
  device_t *d = ar->dev;
  const size_t bytes = (size_t)B * T * sizeof(int32_t);
  if (!ar->seg_buf && !(ar->seg_buf = d->op->alloc(d, MEM_ACTIVATIONS, bytes))) return FSDP_ERR_NOMEM;
  TRY(d->op->upload(d, ar->seg_buf, seg, bytes));
  ar->seg = ar->seg_buf;
  return FSDP_OK;
}

void model_embed_forward(model_acts *a, const plan_t *p, const void *root, const int *inp) {
  a->ops->embed_forward(a->acts, p, root, inp);
}

void model_block_forward(model_acts *a, const plan_t *p, int layer, const void *unit) {
  a->ops->block_forward(a->acts, p, layer, unit);
}

void model_head_forward_backward(model_acts *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                 float dscale, float *loss_acc) {
  a->ops->head_forward_backward(a->acts, p, root, droot, targets, dscale, loss_acc);
}

void model_head_forward(model_acts *a, const plan_t *p, const void *root, const int *targets, float *loss_acc) {
  a->ops->head_forward(a->acts, p, root, targets, loss_acc);
}

void model_block_backward(model_acts *a, const plan_t *p, int layer, const void *unit, float *dunit) {
  a->ops->block_backward(a->acts, p, layer, unit, dunit);
}

void model_embed_backward(model_acts *a, const plan_t *p, float *droot, const int *inp) {
  a->ops->embed_backward(a->acts, p, droot, inp);
}

void model_forward_backward(const plan_t *p, model_acts *a, void *const *units, float *const *dunits, const int *inp,
                            const int *targets, float dscale, float *loss_acc) {
  const int L = p->model.n_layer;
  model_embed_forward(a, p, units[0], inp);
  for (int l = 0; l < L; l++) model_block_forward(a, p, l, units[1 + l]);
  model_head_forward_backward(a, p, units[0], dunits[0], targets, dscale, loss_acc);
  for (int l = L - 1; l >= 0; l--) model_block_backward(a, p, l, units[1 + l], dunits[1 + l]);
  model_embed_backward(a, p, dunits[0], inp);
}

const void *model_final_hidden(const model_acts *a) { return a->ops->final_hidden(a->acts); }

float model_init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k) {
  return model_ops_of(p->model.arch)->init_value(p, u, t, seed, k);
}

void model_init_shard(const plan_t *p, uint64_t seed, int rank, float *shard) {
  const model_ops *ops = model_ops_of(p->model.arch);
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *un = &p->units[u];
    const int64_t lo = plan_shard_offset(p, u, rank), hi = lo + un->shard_numel;
    float *dst = shard + un->shard_base;   /* dst[i] is flat element lo + i */
    memset(dst, 0, (size_t)un->shard_numel * sizeof(float));
    for (int t = 0; t < un->ntensors; t++) {
      const plan_tensor *pt = &un->t[t];
      int64_t a = pt->offset > lo ? pt->offset : lo;
      int64_t b = pt->offset + pt->numel < hi ? pt->offset + pt->numel : hi;
#pragma omp parallel for schedule(static)
      for (int64_t e = a; e < b; e++) dst[e - lo] = ops->init_value(p, u, t, seed, e - pt->offset);
    }
  }
}

void *model_take(char *base, int64_t *off, int64_t n, int esz) {
  void *r = base ? base + *off : NULL;
  *off += n * esz;
  return r;
}

fsdp_status model_arena_alloc(model_arena *ar, device_t *d, model_layout_fn layout, void *acts) {
  ar->dev = d;
  layout(acts, NULL, NULL, &ar->saved_bytes, &ar->ws_bytes);
  ar->saved = d->op->alloc(d, MEM_ACTIVATIONS, (size_t)ar->saved_bytes);
  ar->ws = d->op->alloc(d, MEM_WORKSPACE, (size_t)ar->ws_bytes);
  if (!ar->saved || !ar->ws) return FSDP_ERR_NOMEM;   /* the allocator recorded its own error */
  layout(acts, ar->saved, ar->ws, &ar->saved_bytes, &ar->ws_bytes);
  return FSDP_OK;
}

void model_arena_free(model_arena *ar) {
  if (!ar || !ar->dev) return;
  ar->dev->op->free(ar->dev, ar->saved);
  ar->dev->op->free(ar->dev, ar->ws);
  if (ar->seg_buf) ar->dev->op->free(ar->dev, ar->seg_buf);
  ar->saved = ar->ws = NULL;
  ar->seg_buf = NULL;
  ar->seg = NULL;
}

void model_set_lora(model_acts *a, struct lora_ctx *l) { ((model_arena *)a->acts)->lora = l; }
