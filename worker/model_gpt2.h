/* model_gpt2 — GPT-2 on the CPU in fp32, one FSDP unit at a time (DESIGN.md §3).
 *
 * The FSDP runtime gathers a unit's flat buffer and hands it here with the unit's offsets from the
 * plan; this module never sees shards, ranks or collectives (except gpt2_init_shard, which fills a
 * rank's shard from the counter-based generator). Per micro-step the runtime calls, in order:
 *
 *   gpt2_embed_forward                     x0 = wte[inp] + wpe                 (root unit)
 *   gpt2_block_forward    l = 0 .. L-1     out_l = block_l(out_{l-1}), out_{-1} = x0
 *   gpt2_head_forward_backward             final LN, tied head, mean xent; backward through the head
 *                                          and ln_f: droot +=, dres = dL/d out_{L-1}
 *   gpt2_block_backward   l = L-1 .. 0     dunit_l +=, dres = dL/d out_{l-1}
 *   gpt2_embed_backward                    dwte, dwpe += from dres
 *
 * Parameter gradients accumulate (+=), so G micro-steps add up; the runtime zeroes them. dscale
 * scales dlogits: 1/(B·T·world·G) gives the gradient of the mean loss over every token.
 *
 * Buffers: gpt2_acts holds exactly the activations of plan_act, in one MEM_ACTIVATIONS allocation
 * (L·block_saved + root_saved floats), and one MEM_WORKSPACE allocation that is reused by phase:
 * forward scratch, then the head (logits + per-token losses + dlnf), then the backward scratch
 * (dres dx dbuf datty datt). Backward consumes what forward saved (d fch overwrites fch_gelu), so
 * each block's backward must follow its forward exactly once. A gpt2_acts belongs to one thread at
 * a time; the operators inside are OpenMP-parallel.
 */
#ifndef FSDP_MODEL_GPT2_H
#define FSDP_MODEL_GPT2_H

#include <stdint.h>

#include "plan.h"

typedef struct gpt2_block_acts {   /* saved by block forward, read by its backward */
  float *ln1;          /* (B,T,C) */
  float *ln1_mean;     /* (B,T) */
  float *ln1_rstd;     /* (B,T) */
  float *qkv;          /* (B,T,3C) */
  float *atty;         /* (B,T,C)   attention output before c_proj */
  float *att;          /* (B,NH,T,T) softmax probabilities */
  float *res2;         /* (B,T,C)   x + attn */
  float *ln2;          /* (B,T,C) */
  float *ln2_mean;     /* (B,T) */
  float *ln2_rstd;     /* (B,T) */
  float *fch;          /* (B,T,4C)  c_fc output */
  float *fch_gelu;     /* (B,T,4C)  GELU(fch); backward reuses it for d fch */
  float *out;          /* (B,T,C)   res2 + mlp: the block's output */
} gpt2_block_acts;

typedef struct gpt2_acts {
  int B, T, C, NH, V, L;
  gpt2_block_acts *blk;  /* L */
  float *x0;             /* (B,T,C)   wte[inp] + wpe */
  float *lnf;            /* (B,T,C) */
  float *lnf_mean;       /* (B,T) */
  float *lnf_rstd;       /* (B,T) */
  /* workspace views; the phases overlap in memory */
  float *fwd_tmp;        /* (B,T,C)   forward: c_proj outputs before the residual add */
  float *logits;         /* (B,T,V)   head: logits, then dlogits */
  float *losses;         /* (B,T)     head: per-token losses */
  float *dlnf;           /* (B,T,C)   head: d lnf */
  float *dres;           /* (B,T,C)   the running residual-stream gradient (head → blocks → embed) */
  float *dx;             /* (B,T,C) */
  float *dbuf;           /* (B,T,4C) */
  float *datty;          /* (B,T,C) */
  float *datt;           /* (B,NH,T,T) */
  float *saved;          /* the MEM_ACTIVATIONS allocation */
  float *ws;             /* the MEM_WORKSPACE allocation */
  int64_t saved_floats, ws_floats;
} gpt2_acts;

/* Float counts of the two allocations for plan P: activations = L·block_saved + root_saved
 * (the runtime allocates the token ids, the rest of plan's activation term); workspace =
 * max(head_ws, bwd_ws) (head_ws holds dlnf too: it is live together with dlogits). */
int64_t gpt2_acts_floats(const plan_t *p);
int64_t gpt2_workspace_floats(const plan_t *p);

/* NULL (and an error recorded) if an allocation fails. B = p->batch_size, T = p->model.seq_len. */
gpt2_acts *gpt2_acts_new(const plan_t *p);
void gpt2_acts_destroy(gpt2_acts **a);

/* Tensor SLOT of unit U inside a gathered flat buffer BUF (a view; no copy). */
static inline float *gpt2_tensor(const plan_t *p, int u, int slot, float *buf) {
  return buf + p->units[u].t[slot].offset;
}

/* inp, targets: B·T token ids, each in [0, V) (the data loader checks). root/droot: unit 0's
 * gathered parameters and gradient; unit/dunit: unit 1+layer's. */
void gpt2_embed_forward(gpt2_acts *a, const plan_t *p, const float *root, const int *inp);
void gpt2_block_forward(gpt2_acts *a, const plan_t *p, int layer, const float *unit);
/* Returns Σ of the B·T per-token losses (nats). */
double gpt2_head_forward_backward(gpt2_acts *a, const plan_t *p, const float *root, float *droot,
                                  const int *targets, float dscale);
void gpt2_block_backward(gpt2_acts *a, const plan_t *p, int layer, const float *unit, float *dunit);
void gpt2_embed_backward(gpt2_acts *a, const plan_t *p, float *droot, const int *inp);

/* Every unit in order with all units gathered: units[u], dunits[u] are unit u's flat buffers
 * (dunits accumulate). Returns Σ loss. For tests and the benchmark. */
double gpt2_forward_backward(const plan_t *p, gpt2_acts *a, float *const *units, float *const *dunits,
                             const int *inp, const int *targets, float dscale);

/* Initial value of element K (in the tensor's row-major HF layout) of tensor T of unit U:
 * weights and embeddings N(0, 0.02) from rng_normal(seed, gid, k), c_proj weights (attn and mlp)
 * N(0, 0.02/sqrt(2·n_layer)), biases 0, LayerNorm weights 1 and biases 0. */
float gpt2_init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k);
/* Fill RANK's concatenated shard (p->shard_total floats; unit u at p->units[u].shard_base) with
 * the initial values; padding is 0. Identical to slicing the whole model for every world size. */
void gpt2_init_shard(const plan_t *p, uint64_t seed, int rank, float *shard);

#endif
