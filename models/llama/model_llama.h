/* model_llama — the Llama family (Hugging Face LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
 * MistralForCausalLM, Phi3ForCausalLM)
 * over the device layer, one FSDP unit at a time.
 *
 * The same contract as model_gpt2.h (read it first): the runtime hands gathered units in compute
 * form with the plan's offsets, and calls, per micro-step,
 *
 *   llama_embed_forward                  x0 = embed_tokens[inp]                  (root unit)
 *   llama_block_forward   l = 0 .. L-1   out_l = layer_l(out_{l-1})
 *   llama_head_forward_backward          final RMSNorm, lm_head (tied: embed_tokens), xent; droot +=, dres
 *   llama_block_backward  l = L-1 .. 0   dunit_l +=, dres = dL/d out_{l-1}
 *   llama_embed_backward                 d embed_tokens += from dres
 *
 * A decoder layer: h = x + o(attn(rope(qknorm(qkv(rms1(x)))))), out = h + down(silu(gate(rms2(h))) ·
 * up(rms2(h))), with the biases and q/k norms the model has (llama.h's slots; qknorm: Qwen3's per-head
 * RMSNorm, else nothing). q, k, v are adjacent in the unit's flat buffer ([Q, C] together, Q =
 * (NH + 2·NKV)·HD), and so are their biases, gate and up ([2F, C]) and theirs: each group is one
 * linear. Heads are HD wide (head_dim, which need not be C / NH): attention's output is NH·HD wide
 * and o_proj maps it back to C. Grouped-query attention shares kv head h/(NH/NKV). Rotary
 * frequencies: ops/rope.h, from rope_theta and the model's rope scaling. A sliding window
 * (Mistral) and packed rows (model_set_docs: the arena's seg) restrict attention and restart the
 * rotary positions per document (ops/docmask.h). A tied model's head is
 * embed_tokens (plan_head_slot): its gradient gets the head's contribution in the head and the
 * lookup's in llama_embed_backward, both added into the one slot of droot.
 *
 * Buffers: llama_acts holds exactly the activations of plan_act (llama_act's terms), one
 * MEM_ACTIVATIONS and one MEM_WORKSPACE allocation, reused by phase as GPT-2's are. With activation
 * checkpointing a layer keeps only its output and llama_block_backward recomputes its forward in
 * one working set shared by all layers. A llama_acts belongs to one device and its thread.
 */
#ifndef FSDP_MODEL_LLAMA_H
#define FSDP_MODEL_LLAMA_H

#include <stdint.h>

#include "device.h"
#include "llama.h"
#include "model.h"
#include "plan.h"

typedef struct llama_block_acts {   /* saved by the layer's forward, read by its backward (act unless noted) */
  void *ln1;           /* (B,T,C)   input_layernorm(x) */
  float *ln1_rstd;     /* (B,T) fp32 */
  void *qkv_raw;       /* (B,T,Q)   q|k|v before the q/k norms (qk_norm only; else NULL) */
  float *qk_rstd;      /* (B,T,NH+NKV) fp32: the q/k norms' rstd (qk_norm only) */
  void *qkv;           /* (B,T,Q)   Q = (NH + 2·NKV)·HD; q and k normed (qk_norm) and rotated */
  void *atty;          /* (B,T,QD)  attention output before o_proj, QD = NH·HD */
  void *att;           /* attention state for backward (dev_attention_floats floats) */
  void *res2;          /* (B,T,C)   x + attn */
  void *ln2;           /* (B,T,C)   post_attention_layernorm(res2) */
  float *ln2_rstd;     /* (B,T) fp32 */
  void *gu;            /* (B,T,2F)  gate | up */
  void *h;             /* (B,T,F)   silu(gate)·up */
  void *out;           /* (B,T,C)   res2 + mlp: the layer's output */
} llama_block_acts;

typedef struct llama_acts {
  model_arena arena;     /* first (model.h): the MEM_ACTIVATIONS and MEM_WORKSPACE allocations */
  device_t *dev;
  int recompute;         /* activation checkpointing = full */
  int B, T, C, NH, NKV, HD, QD, Q, F, V, L;
  llama_slots sl;        /* where each of a layer's tensors sits in its unit (llama.h) */
  int qk_norm;
  float eps;
  rope_freqs rope;       /* the model's rotary frequencies (ops/rope.h) */
  int window;            /* the sliding window below T (Mistral's sliding_window), 0: full causal attention */
  int head;              /* the root slot of the output head: LROOT_HEAD, or LROOT_EMBED when tied */
  llama_block_acts *blk; /* L */
  void *x0;              /* (B,T,C)   embed_tokens[inp] */
  void *lnf;             /* (B,T,C)   model.norm(last output) */
  float *lnf_rstd;       /* (B,T) */
  /* workspace views; the phases overlap in memory */
  void *fwd_tmp;         /* (B,T,C)   forward: o_proj and down_proj outputs before the residual add */
  void *logits;          /* head: logits, then dlogits */
  float *losses;         /* (B,T) */
  void *dlnf;            /* (B,T,C) */
  void *dres;            /* (B,T,C)   the running residual-stream gradient */
  void *dx;              /* (B,T,C) */
  void *datty;           /* (B,T,C) */
  void *dh;              /* (B,T,F)   d swiglu output */
  void *dbuf;            /* (B,T,max(2F, Q))  d gate|up, then d qkv */
  void *datt;            /* attention backward scratch */
} llama_acts;

/* NULL (an error recorded) if an allocation fails; sizes are plan_act's for p->model (the Llama family). */
llama_acts *llama_acts_new(const plan_t *p, device_t *d);
void llama_acts_destroy(llama_acts **a);

void llama_embed_forward(llama_acts *a, const plan_t *p, const void *root, const int *inp);
void llama_block_forward(llama_acts *a, const plan_t *p, int layer, const void *unit);
void llama_head_forward_backward(llama_acts *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                 float dscale, float *loss_acc);
/* Forward only: the final norm (a->lnf), and with TARGETS the losses (Σ into *loss_acc). */
void llama_head_forward(llama_acts *a, const plan_t *p, const void *root, const int *targets, float *loss_acc);
void llama_block_backward(llama_acts *a, const plan_t *p, int layer, const void *unit, float *dunit);
void llama_embed_backward(llama_acts *a, const plan_t *p, float *droot, const int *inp);

/* Initial value of element K of tensor T of unit U: Hugging Face's LlamaPreTrainedModel init,
 * N(0, 0.02) from rng_normal(seed, gid, k) for every projection and both embeddings, biases 0,
 * RMSNorm weights (q/k norms included) 1. */
float llama_init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k);

/* The table's entries (model.h's model_ops over a llama_acts), and the table every family member
 * registers as its own: `const model_ops qwen2_model = LLAMA_FAMILY_MODEL_OPS;`. */
void *llama_ops_acts_new(const plan_t *p, device_t *d);
void llama_ops_acts_destroy(void *acts);
void llama_ops_embed_forward(void *a, const plan_t *p, const void *root, const int *inp);
void llama_ops_block_forward(void *a, const plan_t *p, int layer, const void *unit);
void llama_ops_head_forward_backward(void *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                     float dscale, float *loss_acc);
void llama_ops_head_forward(void *a, const plan_t *p, const void *root, const int *targets, float *loss_acc);
void llama_ops_block_backward(void *a, const plan_t *p, int layer, const void *unit, float *dunit);
void llama_ops_embed_backward(void *a, const plan_t *p, float *droot, const int *inp);
const void *llama_ops_final_hidden(const void *a);
#define LLAMA_FAMILY_MODEL_OPS                                                                                 \
  {                                                                                                          \
    .acts_new = llama_ops_acts_new, .acts_destroy = llama_ops_acts_destroy,                                  \
    .embed_forward = llama_ops_embed_forward, .block_forward = llama_ops_block_forward,                      \
    .head_forward_backward = llama_ops_head_forward_backward, .head_forward = llama_ops_head_forward,        \
    .block_backward = llama_ops_block_backward, .embed_backward = llama_ops_embed_backward,                  \
    .final_hidden = llama_ops_final_hidden, .init_value = llama_init_value,                                  \
  }

#endif
