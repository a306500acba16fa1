/* model_gemma3 — Gemma 3's text model (gemma3.h: slots, settings, the layer rule) over the kernel
 * table, one FSDP unit at a time, with model_llama.h's contract and call order:
 *
 *   embed_forward                 x0 = √C·embed_tokens[inp]   (√C rounded to the weight's dtype)
 *   block_forward  l = 0 .. L-1   out_l = layer_l(out_{l-1})
 *   head_forward_backward         final norm, the tied head (embed_tokens), xent; droot +=, dres
 *   block_backward l = L-1 .. 0   dunit_l +=, dres = dL/d out_{l-1}
 *   embed_backward                d embed_tokens += √C·dres at the tokens
 *
 * Every RMSNorm is the kernel table's with the weight offset 1 (scale 1 + w in fp32). The attention
 * kernels scale their scores by HD^-1/2; Gemma's are query_pre_attn_scalar^-1/2, so the rotated q is
 * multiplied by √(HD/qpas) before them and dq by the same after their backward: one pass over B·T·QD
 * elements each way (act_axpby on q's columns), skipped where qpas = HD, instead of a scale argument
 * threaded through the CPU, tensor-core and cuDNN attention and all their callers. Sliding layers
 * (gemma3_is_global) attend in the window and rotate with the local base; global ones attend fully
 * and rotate with rope_theta. Packed rows (model_set_docs) restrict both, as Llama's. [lora]: the
 * adapters around q, k, v, o, gate, up and down by their slots (G3_*), as model_llama's.
 *
 * Buffers: exactly gemma3_act's terms (gemma3.h), in one model_arena; with activation checkpointing a
 * layer keeps its output and the backward recomputes the rest in one working set. One device, its
 * thread.
 */
#ifndef FSDP_MODEL_GEMMA3_H
#define FSDP_MODEL_GEMMA3_H

#include "model.h"
#include "ops/rope.h"

typedef struct gemma3_block {   /* saved by the layer's forward, read by its backward (act unless noted) */
  void *ln1;          /* (B,T,C)   input_layernorm(x) */
  float *ln1_rstd;    /* (B,T) fp32 */
  void *qkv_raw;      /* (B,T,Q)   q|k|v before the q/k norms */
  float *qk_rstd;     /* (B,T,NH+NKV) fp32 */
  void *qkv;          /* (B,T,Q)   q and k normed and rotated, q times qscale */
  void *atty;         /* (B,T,QD)  attention output before o_proj */
  void *att;          /* attention state (dev_attention_floats floats) */
  void *ao;           /* (B,T,C)   o_proj's output */
  float *pa_rstd;     /* (B,T) fp32: post_attention_layernorm's */
  void *res2;         /* (B,T,C)   x + post_attention_layernorm(ao) */
  void *ln2;          /* (B,T,C)   pre_feedforward_layernorm(res2) */
  float *ln2_rstd;    /* (B,T) fp32 */
  void *gu;           /* (B,T,2F)  gate | up */
  void *h;            /* (B,T,F)   gelu_tanh(gate)·up */
  void *mo;           /* (B,T,C)   down_proj's output */
  float *pf_rstd;     /* (B,T) fp32: post_feedforward_layernorm's */
  void *out;          /* (B,T,C)   res2 + post_feedforward_layernorm(mo) */
} gemma3_block;

typedef struct gemma3_acts {
  model_arena arena;   /* first (model.h) */
  device_t *dev;
  int recompute;
  int B, T, C, NH, NKV, HD, QD, Q, F, V, L;
  float eps;
  float escale;        /* √C as embed_tokens' dtype rounds it (Gemma3TextScaledWordEmbedding) */
  float qscale;        /* √(HD / query_pre_attn_scalar): q's factor before the HD^-1/2 kernels */
  int window;          /* sliding layers' window when below T; 0: they attend fully */
  rope_freqs rope_local, rope_global;
  gemma3_block *blk;
  void *x0, *lnf;      /* (B,T,C) */
  float *lnf_rstd;     /* (B,T) */
  void *fwd_tmp;       /* (B,T,C)   a post-norm's output before its residual add */
  void *logits;
  float *losses;
  void *dlnf, *dres, *dx, *datty, *dh, *dbuf, *datt;   /* as model_llama.h's */
} gemma3_acts;

/* The table (model.h): acts_new returns a gemma3_acts. */
extern const model_ops gemma3_model;

#endif
