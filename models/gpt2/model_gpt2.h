/* model_gpt2 — GPT-2 over the device layer (device.h), one FSDP unit at a time (docs/design.md §3).
 *
 * The FSDP runtime gathers a unit's flat buffer, brings it to the device's compute form, and hands
 * it here with the unit's offsets from the plan; this module never sees shards, ranks or
 * collectives (model_init_shard, in model.c, fills a rank's shard from gpt2_init_value).
 * Every call only submits operators to the device's stream. Per micro-step the runtime calls:
 *
 *   gpt2_embed_forward                     x0 = wte[inp] + wpe[pos]            (root unit)
 *   gpt2_block_forward    l = 0 .. L-1     out_l = block_l(out_{l-1}), out_{-1} = x0
 *   gpt2_head_forward_backward             final LN, tied head, xent (Σ loss into *loss_acc);
 *                                          backward through the head and ln_f: droot +=, dres
 *   gpt2_block_backward   l = L-1 .. 0     dunit_l +=, dres = dL/d out_{l-1}
 *   gpt2_embed_backward                    dwte, dwpe += from dres
 *
 * Packed rows (model_set_docs, the arena's seg): attention stays in each document and pos restarts
 * at 0 in each (wpe's row), forward and backward; without them pos = t.
 *
 * Parameter gradients are fp32 and accumulate (+=), so G micro-steps add up; the runtime zeroes
 * them. dscale scales dlogits: 1/(B·T·world·G) gives the gradient of the mean loss over every token.
 *
 * Buffers: gpt2_acts holds exactly the activations of plan_act, in one MEM_ACTIVATIONS allocation,
 * and one MEM_WORKSPACE allocation that is reused by phase: forward scratch, then the head (logits
 * + per-token losses + dlnf), then the backward scratch (dres dx dbuf datty datt). Activations are
 * act elements of the device (device.h), statistics and losses fp32. Backward consumes what forward
 * saved (d fch overwrites fch_gelu), so each block's backward must follow its forward exactly once.
 * With activation checkpointing a block keeps only its output (the next block's input); its other
 * activations live in one working set shared by all blocks, and gpt2_block_backward recomputes
 * the block's forward there before differentiating it.
 * A gpt2_acts belongs to one device and its thread.
 */
#ifndef FSDP_MODEL_GPT2_H
#define FSDP_MODEL_GPT2_H

#include <stdint.h>

#include "device.h"
#include "gpt2.h"
#include "model.h"
#include "plan.h"

typedef struct gpt2_block_acts {   /* saved by block forward, read by its backward (act unless noted) */
  void *ln1;           /* (B,T,C) */
  float *ln1_mean;     /* (B,T) fp32 */
  float *ln1_rstd;     /* (B,T) fp32 */
  void *qkv;           /* (B,T,3C) */
  void *atty;          /* (B,T,C)   attention output before c_proj */
  void *att;           /* attention state for backward: (B,NH,T,T) probabilities on the CPU */
  void *res2;          /* (B,T,C)   x + attn */
  void *ln2;           /* (B,T,C) */
  float *ln2_mean;     /* (B,T) */
  float *ln2_rstd;     /* (B,T) */
  void *fch;           /* (B,T,4C)  c_fc output */
  void *fch_gelu;      /* (B,T,4C)  GELU(fch); backward reuses it for d fch */
  void *out;           /* (B,T,C)   res2 + mlp: the block's output */
} gpt2_block_acts;

typedef struct gpt2_acts {
  model_arena arena;     /* first (model.h): the MEM_ACTIVATIONS and MEM_WORKSPACE allocations */
  device_t *dev;
  int recompute;         /* [fsdp] activation_checkpointing = full: blocks share one working set and
                            the backward recomputes each block's forward first */
  int B, T, C, NH, V, L;
  gpt2_block_acts *blk;  /* L */
  void *x0;              /* (B,T,C)   wte[inp] + wpe */
  void *lnf;             /* (B,T,C) */
  float *lnf_mean;       /* (B,T) */
  float *lnf_rstd;       /* (B,T) */
  /* workspace views; the phases overlap in memory */
  void *fwd_tmp;         /* (B,T,C)   forward: c_proj outputs before the residual add */
  void *logits;          /* (B,T,V)   head: logits, then dlogits */
  float *losses;         /* (B,T)     head: per-token losses */
  void *dlnf;            /* (B,T,C)   head: d lnf */
  void *dres;            /* (B,T,C)   the running residual-stream gradient (head → blocks → embed) */
  void *dx;              /* (B,T,C) */
  void *dbuf;            /* (B,T,4C) */
  void *datty;           /* (B,T,C) */
  void *datt;            /* attention backward scratch */
} gpt2_acts;

/* NULL (and an error recorded) if an allocation fails. B = p->batch_size, T = p->model.seq_len.
 * On the CPU the two allocations are the plan's terms: activations = 4·(L·block_saved +
 * root_saved) bytes (the runtime allocates the token ids, the rest of plan's activation term),
 * workspace = 4·max(head_ws, bwd_ws) (head_ws holds dlnf too: it is live with dlogits). */
gpt2_acts *gpt2_acts_new(const plan_t *p, device_t *d);
void gpt2_acts_destroy(gpt2_acts **a);

/* inp, targets: B·T token ids on the device, each in [0, V) (the data loader checks). root/droot:
 * unit 0's parameters (compute form) and gradient; unit/dunit: unit 1+layer's. loss_acc: one
 * device float the head adds its Σ of per-token losses (nats) to. */
void gpt2_embed_forward(gpt2_acts *a, const plan_t *p, const void *root, const int *inp);
void gpt2_block_forward(gpt2_acts *a, const plan_t *p, int layer, const void *unit);
void gpt2_head_forward_backward(gpt2_acts *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                float dscale, float *loss_acc);
/* Forward only, for evaluation and sampling: the final LayerNorm (a->lnf), and with TARGETS the
 * per-token losses (Σ into *loss_acc); no gradient. */
void gpt2_head_forward(gpt2_acts *a, const plan_t *p, const void *root, const int *targets, float *loss_acc);
void gpt2_block_backward(gpt2_acts *a, const plan_t *p, int layer, const void *unit, float *dunit);
void gpt2_embed_backward(gpt2_acts *a, const plan_t *p, float *droot, const int *inp);

/* Initial value of element K (in the tensor's row-major HF layout) of tensor T of unit U:
 * weights and embeddings N(0, 0.02) from rng_normal(seed, gid, k), c_proj weights (attn and mlp)
 * N(0, 0.02/sqrt(2·n_layer)), biases 0, LayerNorm weights 1 and biases 0. */
float gpt2_init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k);

#endif
