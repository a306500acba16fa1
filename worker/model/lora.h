/* lora — the adapters of a LoRA job on one rank (docs/models.md "LoRA", plan.h's plan_lora): their
 * fp32 weights, gradient and AdamW state (the whole segment, replicated on every rank), the x·Aᵀ of
 * every block kept for its backward, the scratch, and the two verbs the blocks call around each
 * target projection:
 *
 *   lora_forward   after the base projection y = x·Wᵀ (W frozen): y += scale·(x·Aᵀ)·Bᵀ
 *   lora_backward  after the base projection's input gradient: dx += its adapters' part (DX NULL:
 *                  no input gradient wanted, as below the first block), and dA, dB += their gradients
 *
 * Both do nothing for a slot no target adapts (or a NULL context), so an architecture calls them
 * around every projection. Only the kernel table's gemm runs (four products a target each way at
 * most, reading and accumulating the fused rows' columns in place): the same code on every device. The runtime owns the context (lora_new), zeroes
 * the gradient each step, all-reduces it and runs AdamW over `opt` (the segment as a plan of one
 * decayed tensor per block); the model only reads it. One device, its thread.
 */
#ifndef FSDP_LORA_H
#define FSDP_LORA_H

#include "device.h"
#include "plan.h"

typedef struct lora_ctx {
  const plan_t *p;
  device_t *d;
  int64_t n;                     /* p->lora.numel */
  float *param, *grad, *m, *v;   /* n fp32 each (param_shard, grad_shard, optim_state) */
  void *wact;                    /* the compute form of param: param itself when act elements are fp32 */
  void *saved;                   /* x·Aᵀ per (block, target): BT·r act elements each (activations) */
  void *dh;                      /* scratch (workspace): BT·r act elements, s·dy·B */
  plan_t opt;                    /* AdamW's view of the segment: unit l = block l's adapters, one tensor
                                    (bound to the device by lora_new: CUDA's decay table) */
} lora_ctx;

/* NULL-safe on P without LoRA (*OUT = NULL, FSDP_OK). */
fsdp_status lora_new(const plan_t *p, device_t *d, lora_ctx **out);
void lora_destroy(lora_ctx **l);
/* peft's initialization into HOST (p->lora.numel floats): A Kaiming-uniform (a = √5: U(−1/√in,
 * 1/√in)) from rng_uniform(seed, gid, k), gid = LORA_GID0 + block·PLAN_LORA_MAX + target, B zero. */
#define LORA_GID0 0x40000000u
void lora_init_values(const plan_t *p, uint64_t seed, float *host);
/* wact from param (after an update or a load), on the stream. */
void lora_refresh(lora_ctx *l);

void lora_forward(lora_ctx *l, int layer, int slot, void *y, const void *x);
void lora_backward(lora_ctx *l, int layer, int slot, void *dx, const void *dy, const void *x);

#endif
