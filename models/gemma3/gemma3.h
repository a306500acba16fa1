/* gemma3 — Gemma 3's text model (Hugging Face Gemma3ForCausalLM, model_type gemma3_text): its units'
 * tensor slots and its own settings. The descriptor is gemma3_arch (gemma3_arch.c: names, config.json,
 * plan terms); forward and backward model_gemma3.c.
 *
 * The root: model.embed_tokens.weight [V,C] (always tied: it is the head too), model.norm.weight [C].
 * Unit 1+i, decoder layer i, in the unit's order:
 *   input_layernorm [C], q_proj [NH·HD, C], k_proj, v_proj [NKV·HD, C], q_norm, k_norm [HD],
 *   o_proj [C, NH·HD], post_attention_layernorm [C], pre_feedforward_layernorm [C],
 *   gate_proj, up_proj [F, C], down_proj [C, F], post_feedforward_layernorm [C].
 * q, k, v are adjacent and so are gate and up: each group is one linear. Every RMSNorm (the four of a
 * layer, q/k norms and the final one) multiplies by (1 + w), computed in fp32 as transformers does, and
 * initializes w to 0. A layer is
 *   h   = x + post_attn_norm(o(attn(rope_l(qknorm(qkv(in_norm(x)))) · scale)))
 *   out = h + post_ff_norm(down(gelu_tanh(gate(pre_ff_norm(h))) · up(pre_ff_norm(h))))
 * with attention scaled by query_pre_attn_scalar^-1/2 (not head_dim^-1/2), layer l sliding
 * (sliding_window, the local rope base, unscaled) unless (l + 1) is a multiple of the pattern, then
 * global (full causal attention, rope_theta with the model's rope scaling). The embedding's output is
 * multiplied by √C as the weight's dtype rounds it (Gemma3TextScaledWordEmbedding).
 */
#ifndef FSDP_GEMMA3_H
#define FSDP_GEMMA3_H

#include "jobspec.h"

enum { G3ROOT_EMBED = 0, G3ROOT_NORM, G3ROOT_NT };

enum {
  G3_LN1 = 0, G3_Q, G3_K, G3_V, G3_QN, G3_KN, G3_O, G3_POST_ATTN, G3_PRE_FF, G3_GATE, G3_UP, G3_DOWN, G3_POST_FF,
  G3_NT
};

/* Its [model] keys beyond the common ones, as model_config.ext[] indices (gemma3_arch.c's ext_keys). */
enum {
  G3X_QUERY_PRE_ATTN_SCALAR = 0,   /* query_pre_attn_scalar: attention scale = its −1/2 power */
  G3X_ROPE_LOCAL_THETA,            /* rope_local_base_freq: the sliding layers' rotary base (10000) */
  G3X_PATTERN,                     /* sliding_window_pattern: layer l is global iff (l + 1) % P == 0 */
  G3X_N
};

static inline double gemma3_qpas(const model_config *m) { return m->ext[G3X_QUERY_PRE_ATTN_SCALAR]; }
static inline double gemma3_local_theta(const model_config *m) { return m->ext[G3X_ROPE_LOCAL_THETA]; }
static inline int gemma3_pattern(const model_config *m) { return (int)m->ext[G3X_PATTERN]; }
/* Whether layer L attends globally (full causal, rope_theta scaled) rather than in the window. */
static inline int gemma3_is_global(const model_config *m, int l) {
  int p = gemma3_pattern(m);
  return p <= 1 || (l + 1) % p == 0;
}
/* HD: head_dim, or C / NH where the model leaves it 0. */
static inline int gemma3_head_dim(const model_config *m) { return m->head_dim > 0 ? m->head_dim : m->n_embd / m->n_head; }

#endif
