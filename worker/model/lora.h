/* lora — the adapters of a LoRA job on one rank (docs/models.md "LoRA", plan.h's plan_lora): their
 * fp32 weights, gradient and AdamW state (replicated: the whole segment; sharded: this rank's shard of
 * every block's adapters, plan_lora_units), the x·Aᵀ of every block kept for its backward, the
 * scratch, and the two verbs the blocks call around each target projection:
 *
 *   lora_forward   after the base projection y = x·Wᵀ (W frozen): y += scale·(x·Aᵀ)·Bᵀ
 *   lora_backward  after the base projection's input gradient: dx += its adapters' part (DX NULL:
 *                  no input gradient wanted, as below the first block), and dA, dB += their gradients
 *
 * Both do nothing for a slot no target adapts (or a NULL context), so an architecture calls them
 * around every projection. Only the kernel table's gemm runs (four products a target each way at
 * most, reading and accumulating the fused rows' columns in place): the same code on every device.
 * The runtime owns the context (lora_new), zeroes the gradient each step and runs AdamW over `opt`
 * (with offload on the host: the master and AdamW state in host memory, the gradient brought down);
 * replicated, it all-reduces the gradient first and the verbs read block l's part of wact and grad;
 * sharded, `opt` is the adapters' units, which the runtime gathers and reduces (unit.h) beside the
 * base's, and lora_set_block points the verbs at the gathered block and its gradient buffer before
 * each block's compute. The model only reads it. One device, its thread.
 */
#ifndef FSDP_LORA_H
#define FSDP_LORA_H

#include "device.h"
#include "plan.h"

typedef struct lora_ctx {
  const plan_t *p;
  device_t *d;
  int sharded;                   /* p->lora.sharded */
  int64_t n;                     /* p->lora.numel, or sharded L·Sa */
  float *param, *grad, *m, *v;   /* n fp32 each (param_shard, grad_shard, optim_state) */
  void *wact;                    /* the compute form of param: param itself when act elements are fp32
                                    (sharded: the gather source); with offload always its own buffer */
  /* [fsdp] offload = optimizer: param, m and v are host memory (alloc_host), AdamW runs on the host
   * over them, and hgrad (host, n fp32) stages the gradient and the bf16 form on its way up; the
   * device keeps grad and wact */
  int offload;
  float *hgrad;
  void *saved;                   /* x·Aᵀ per (block, target): BT·r act elements each (activations) */
  void *dh;                      /* scratch (workspace): BT·r act elements, s·dy·B */
  plan_t *opt;                   /* AdamW's view: replicated, plan_lora_segment(p, 1) (unit l = block l);
                                    sharded, plan_lora_units (unit l + 1 = block l); bound to the device
                                    by lora_new (CUDA's decay table) */
  int rank;                      /* AdamW's rank in opt (0 replicated) */
  const void *wblk;              /* sharded: the gathered adapters of the block being computed ... */
  float *gblk;                   /* ... and its gradient buffer (NULL in the forward) */
} lora_ctx;

/* NULL-safe on P without LoRA (*OUT = NULL, FSDP_OK). RANK: this rank in P. */
fsdp_status lora_new(const plan_t *p, int rank, device_t *d, lora_ctx **out);
void lora_destroy(lora_ctx **l);
/* peft's initialization into HOST (p->lora.numel floats): A Kaiming-uniform (a = √5: U(−1/√in,
 * 1/√in)) from rng_uniform(seed, gid, k), gid = LORA_GID0 + block·PLAN_LORA_MAX + target, B zero. */
#define LORA_GID0 0x40000000u
void lora_init_values(const plan_t *p, uint64_t seed, float *host);
/* wact from param (after an update or a load): on the stream, or with offload uploaded from the
 * host master (rounded there when the compute form is bf16). */
fsdp_status lora_refresh(lora_ctx *l);
/* Sharded: the block the next verbs compute: its gathered adapters W (compute form, Pa elements) and
 * its gradient buffer G (fp32, Pa; NULL outside its backward). Nothing replicated. */
void lora_set_block(lora_ctx *l, const void *w, float *g);

void lora_forward(lora_ctx *l, int layer, int slot, void *y, const void *x);
void lora_backward(lora_ctx *l, int layer, int slot, void *dx, const void *dy, const void *x);

#endif
