/* llama — Llama (Hugging Face LlamaForCausalLM): its units' tensor slots. The descriptor is
 * llama_arch (llama_arch.c: names, config.json, plan terms); forward and backward model_llama.h.
 *
 * The root: model.embed_tokens.weight [V,C], model.norm.weight [C], lm_head.weight [V,C] (tied: no
 * lm_head; embed_tokens is both ends); unit 1+i decoder layer i. q, k, v are adjacent, and so are
 * gate and up: the model runs each group as one linear of [C + 2·NKV·HS, C] and [2F, C]. Names as
 * LlamaForCausalLM writes them, "model." included; nn.Linear layout [out, in]. Global tensor index:
 * root slot j → j, layer i slot j → LROOT_NT + LBLK_NT·i + j (a tied and an untied model initialize
 * their layers alike).
 */
#ifndef FSDP_LLAMA_H
#define FSDP_LLAMA_H

enum { LROOT_EMBED = 0, LROOT_NORM, LROOT_HEAD, LROOT_NT };   /* tied: no LROOT_HEAD (LROOT_EMBED is the head) */
enum {
  LBLK_LN1_W = 0, LBLK_Q, LBLK_K, LBLK_V, LBLK_O, LBLK_LN2_W, LBLK_GATE, LBLK_UP, LBLK_DOWN, LBLK_NT
};

#endif
