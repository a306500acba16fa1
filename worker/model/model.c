/* model — dispatch by architecture; see model.h. */
#include "model.h"

#include <stdlib.h>
#include <string.h>

model_acts *model_acts_new(const plan_t *p, device_t *d) {
  model_acts *a = calloc(1, sizeof *a);
  if (!a) {
    fsdp_set_error(FSDP_ERR_NOMEM, "model_acts_new: out of host memory");
    return NULL;
  }
  a->arch = p->model.arch;
  if (a->arch == ARCH_LLAMA) a->llama = llama_acts_new(p, d);
  else a->gpt2 = gpt2_acts_new(p, d);
  if (!a->llama && !a->gpt2) {   /* the architecture's constructor recorded the error */
    free(a);
    return NULL;
  }
  return a;
}

void model_acts_destroy(model_acts **pa) {
  if (!pa || !*pa) return;
  gpt2_acts_destroy(&(*pa)->gpt2);
  llama_acts_destroy(&(*pa)->llama);
  free(*pa);
  *pa = NULL;
}

void model_embed_forward(model_acts *a, const plan_t *p, const void *root, const int *inp) {
  if (a->llama) llama_embed_forward(a->llama, p, root, inp);
  else gpt2_embed_forward(a->gpt2, p, root, inp);
}

void model_block_forward(model_acts *a, const plan_t *p, int layer, const void *unit) {
  if (a->llama) llama_block_forward(a->llama, p, layer, unit);
  else gpt2_block_forward(a->gpt2, p, layer, unit);
}

void model_head_forward_backward(model_acts *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                 float dscale, float *loss_acc) {
  if (a->llama) llama_head_forward_backward(a->llama, p, root, droot, targets, dscale, loss_acc);
  else gpt2_head_forward_backward(a->gpt2, p, root, droot, targets, dscale, loss_acc);
}

void model_head_forward(model_acts *a, const plan_t *p, const void *root, const int *targets, float *loss_acc) {
  if (a->llama) llama_head_forward(a->llama, p, root, targets, loss_acc);
  else gpt2_head_forward(a->gpt2, p, root, targets, loss_acc);
}

void model_block_backward(model_acts *a, const plan_t *p, int layer, const void *unit, float *dunit) {
  if (a->llama) llama_block_backward(a->llama, p, layer, unit, dunit);
  else gpt2_block_backward(a->gpt2, p, layer, unit, dunit);
}

void model_embed_backward(model_acts *a, const plan_t *p, float *droot, const int *inp) {
  if (a->llama) llama_embed_backward(a->llama, p, droot, inp);
  else gpt2_embed_backward(a->gpt2, p, droot, inp);
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

const void *model_final_hidden(const model_acts *a) { return a->llama ? a->llama->lnf : a->gpt2->lnf; }

float model_init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k) {
  return p->model.arch == ARCH_LLAMA ? llama_init_value(p, u, t, seed, k) : gpt2_init_value(p, u, t, seed, k);
}

void model_init_shard(const plan_t *p, uint64_t seed, int rank, float *shard) {
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
      for (int64_t e = a; e < b; e++) dst[e - lo] = model_init_value(p, u, t, seed, e - pt->offset);
    }
  }
}

void *model_take(char *base, int64_t *off, int64_t n, int esz) {
  void *r = base ? base + *off : NULL;
  *off += n * esz;
  return r;
}
