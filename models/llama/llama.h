/* llama — the Llama family (Hugging Face LlamaForCausalLM, and the folders that reuse it: qwen2,
 * qwen3, mistral, phi3): its units' tensor slots. The descriptor is llama_arch (llama_arch.c: names, config.json,
 * plan terms; llama_family.h shares it with the family's folders); forward and backward model_llama.h.
 *
 * The root: model.embed_tokens.weight [V,C], model.norm.weight [C], lm_head.weight [V,C] (tied: no
 * lm_head; embed_tokens is both ends); unit 1+i decoder layer i. A layer's tensors, in the unit's
 * order, those in brackets only where the model has them (model_config's Llama-family block):
 *   input_layernorm [C], q_proj [NH·HD, C], k_proj, v_proj [NKV·HD, C], [q, k, v biases],
 *   [q_norm, k_norm [HD]], o_proj [C, NH·HD], [o_proj bias [C]], post_attention_layernorm [C],
 *   gate_proj, up_proj [F, C], [gate, up biases [F]], down_proj [C, F], [down bias [C]].
 * q, k, v are adjacent and so are their biases, gate and up and theirs: the model runs each group as
 * one linear of [Q, C] (Q = (NH + 2·NKV)·HD) and [2F, C]. Names as LlamaForCausalLM writes them,
 * "model." included; nn.Linear layout [out, in]. A layer's slot of each tensor is llama_slots_of's
 * (−1: absent). Global tensor index: root slot j → j, layer i slot j → LROOT_NT + n·i + j, n the
 * layer's tensor count (9 for a plain Llama, whose indices are what they always were; a tied and an
 * untied model initialize their layers alike).
 */
#ifndef FSDP_LLAMA_H
#define FSDP_LLAMA_H

#include "jobspec.h"

enum { LROOT_EMBED = 0, LROOT_NORM, LROOT_HEAD, LROOT_NT };   /* tied: no LROOT_HEAD (LROOT_EMBED is the head) */

/* A layer's tensors, in the unit's order; the bracketed ones of the header are optional. */
enum {
  LBLK_LN1_W = 0, LBLK_Q, LBLK_K, LBLK_V, LBLK_QB, LBLK_KB, LBLK_VB, LBLK_QN, LBLK_KN, LBLK_O, LBLK_OB, LBLK_LN2_W,
  LBLK_GATE, LBLK_UP, LBLK_GB, LBLK_UB, LBLK_DOWN, LBLK_DB, LBLK_MAX
};

/* Where each of a layer's tensors sits in its unit (−1: the model has none), and how many it has. */
typedef struct llama_slots {
  int at[LBLK_MAX];
  int n;
} llama_slots;

/* Whether M's layers hold tensor K (LBLK_*). */
static inline int llama_has(const model_config *m, int k) {
  switch (k) {
  case LBLK_QB: case LBLK_KB: case LBLK_VB: return m->qkv_bias || m->attention_bias;
  case LBLK_QN: case LBLK_KN: return m->qk_norm;
  case LBLK_OB: return m->attention_bias;
  case LBLK_GB: case LBLK_UB: case LBLK_DB: return m->mlp_bias;
  default: return 1;
  }
}

static inline llama_slots llama_slots_of(const model_config *m) {
  llama_slots s = {.n = 0};
  for (int k = 0; k < LBLK_MAX; k++) s.at[k] = llama_has(m, k) ? s.n++ : -1;
  return s;
}

/* HD: head_dim, or C / NH where the model leaves it 0. */
static inline int llama_head_dim(const model_config *m) { return m->head_dim > 0 ? m->head_dim : m->n_embd / m->n_head; }

#endif
