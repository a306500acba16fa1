/* model — the architecture behind one interface: what the runtime, the sampler and the tests call.
 *
 * p->model.arch picks the architecture's table of verbs, model_ops (its folder's model_<name>.c,
 * registered by its line in models/models.def: GPT-2 model_gpt2.h, Llama model_llama.h); every one
 * follows the contract that model_gpt2.h spells out (the call order per micro-step, += parameter
 * gradients, dscale, the activations and workspace allocated exactly as plan_act says). A model_acts
 * holds one architecture's activation buffers; it belongs to one device and its thread. These
 * functions only dispatch: every operator runs in the architecture's module.
 */
#ifndef FSDP_MODEL_H
#define FSDP_MODEL_H

#include <stdint.h>

#include "device.h"
#include "plan.h"

/* An architecture's forward and backward (the worker's half of its descriptor, models/arch.h):
 * ACTS is its own activation state, made by acts_new for one plan and device. */
typedef struct model_ops {
  void *(*acts_new)(const plan_t *p, device_t *d);   /* NULL (an error recorded) if an allocation fails */
  void (*acts_destroy)(void *acts);
  void (*embed_forward)(void *acts, const plan_t *p, const void *root, const int *inp);
  void (*block_forward)(void *acts, const plan_t *p, int layer, const void *unit);
  void (*head_forward_backward)(void *acts, const plan_t *p, const void *root, float *droot, const int *targets,
                                float dscale, float *loss_acc);
  void (*head_forward)(void *acts, const plan_t *p, const void *root, const int *targets, float *loss_acc);
  void (*block_backward)(void *acts, const plan_t *p, int layer, const void *unit, float *dunit);
  void (*embed_backward)(void *acts, const plan_t *p, float *droot, const int *inp);
  const void *(*final_hidden)(const void *acts);
  float (*init_value)(const plan_t *p, int u, int t, uint64_t seed, int64_t k);
} model_ops;

/* The table of architecture A, or NULL. */
const model_ops *model_ops_of(model_arch a);

typedef struct model_acts {
  const model_ops *ops;   /* p->model.arch's */
  void *acts;             /* its activation state */
} model_acts;

/* NULL (an error recorded) if an allocation fails. */
model_acts *model_acts_new(const plan_t *p, device_t *d);
void model_acts_destroy(model_acts **a);

/* See model_gpt2.h for each one's contract. */
void model_embed_forward(model_acts *a, const plan_t *p, const void *root, const int *inp);
void model_block_forward(model_acts *a, const plan_t *p, int layer, const void *unit);
void model_head_forward_backward(model_acts *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                 float dscale, float *loss_acc);
void model_head_forward(model_acts *a, const plan_t *p, const void *root, const int *targets, float *loss_acc);
void model_block_backward(model_acts *a, const plan_t *p, int layer, const void *unit, float *dunit);
void model_embed_backward(model_acts *a, const plan_t *p, float *droot, const int *inp);
/* The documents of the next micro-step's rows (packed data, [data] pack): SEG, host memory of B·T
 * entries, gives for token t of row b the index in the row of its document's first token: seg[b·T]
 * = 0, and seg[b·T+t] is seg[b·T+t−1] (the same document) or t (a new one starts); NULL: each row
 * is one document. Attention stays inside each document and positions restart at 0 in each (rope
 * and learned positions alike), forward and backward. Call before model_embed_forward; the values
 * are copied to the device (once per call, after the work already submitted, which may still read
 * the previous rows') and hold until the next call. FSDP_ERR_INVALID (naming the first bad entry)
 * for a SEG that breaks the rule above; FSDP_ERR_NOMEM if the device copy cannot be allocated. */
fsdp_status model_set_docs(model_acts *a, const plan_t *p, const int32_t *seg);
/* Every unit in order, all gathered in compute form (tests and the benchmark). */
void model_forward_backward(const plan_t *p, model_acts *a, void *const *units, float *const *dunits, const int *inp,
                            const int *targets, float dscale, float *loss_acc);

/* The final norm's output (B,T,C act elements) after model_head_forward, for sampling; the logits
 * multiply it with root tensor plan_head_slot(p). */
const void *model_final_hidden(const model_acts *a);

/* The counter-based initial value of element K (in the tensor's row-major HF layout) of tensor T
 * of unit U (the architecture's *_init_value), and RANK's concatenated shard (p->shard_total
 * floats, host memory; unit u at p->units[u].shard_base) filled with those values, padding 0:
 * identical to slicing the whole model, for every world size. */
float model_init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k);
void model_init_shard(const plan_t *p, uint64_t seed, int rank, float *shard);

/* ---------------------------------------------------------------- for the architectures' modules */

/* Tensor SLOT of unit U inside a unit's buffer: parameters in compute form (act elements), or
 * gradients (fp32). Views; no copy. */
static inline void *model_param(const plan_t *p, const device_t *d, int u, int slot, const void *buf) {
  return (char *)(uintptr_t)buf + p->units[u].t[slot].offset * d->act_bytes;
}
/* BUF NULL (a frozen base, [lora]): NULL, and the operators compute no weight gradient. */
static inline float *model_grad(const plan_t *p, int u, int slot, float *buf) {
  return buf ? buf + p->units[u].t[slot].offset : NULL;
}

/* Hand out N elements of ESZ bytes at *off in BASE (NULL base: only count): how each architecture
 * lays its activations and workspace out, once to size the allocations and once to place them. */
void *model_take(char *base, int64_t *off, int64_t n, int esz);

/* The activation arena every architecture keeps its buffers in: one MEM_ACTIVATIONS allocation
 * (kept forward → backward) and one MEM_WORKSPACE allocation (reused by phase), both of exactly the
 * bytes its LAYOUT counts (plan_act's terms). An architecture's activation state starts with it, so
 * that the runtime and the tests read its sizes without knowing the architecture. */
struct lora_ctx;
typedef struct model_arena {
  device_t *dev;
  struct lora_ctx *lora;   /* the adapters ([lora], worker/model/lora.h), or NULL; model_set_lora */
  void *saved, *ws;
  int64_t saved_bytes, ws_bytes;
  /* The rows' documents (model_set_docs): SEG_BUF, B·T int32 device memory (MEM_ACTIVATIONS), made
   * by model_acts_new where the plan counts it (plan_t.docs), else at the first micro-step whose rows
   * hold several documents (a caller without data files, as the tests); SEG is it while the current rows do,
   * NULL while every row is one document (the kernels' fast path). */
  int32_t *seg_buf;
  const int32_t *seg;
} model_arena;
/* LAYOUT(ACTS, saved, ws, &saved_bytes, &ws_bytes) lays ACTS's views out from the two bases (NULL:
 * count only). Called once to count, then, after the allocations, to place. FSDP_ERR_NOMEM (the
 * allocator's error recorded) if an allocation fails; model_arena_free is then still due. */
typedef void (*model_layout_fn)(void *acts, char *saved, char *ws, int64_t *saved_bytes, int64_t *ws_bytes);
fsdp_status model_arena_alloc(model_arena *ar, device_t *d, model_layout_fn layout, void *acts);
void model_arena_free(model_arena *ar);   /* NULL-safe; the buffers back to the device */
/* The adapters the blocks add to their target projections from now on (NULL: none); L outlives A. */
void model_set_lora(model_acts *a, struct lora_ctx *l);
/* The arena of A (every architecture's state starts with one). */
static inline const model_arena *model_acts_arena(const model_acts *a) { return (const model_arena *)a->acts; }

#endif
