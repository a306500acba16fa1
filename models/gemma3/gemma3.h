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
#include "llama_family.h"
#include "plan.h"

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

/* The activations model_gemma3.c keeps for B rows of M on DEV (plan.h's plan_act; the descriptor's act
 * calls it, so that the planner and the model agree to the byte). With QD = NH·HD, Q = QD + 2·NKV·HD,
 * F = ffn_dim, BTX = B·T·X, e the act element's bytes:
 *   block_saved = BT·(6C + QD + 2Q + 3F) act + BT·(4 + NH + NKV) + ATT fp32: in_norm(x) BTC and its rstd
 *                 BT, q|k|v before the q/k norms BTQ and their rstd BT·(NH + NKV), q|k|v normed, rotated
 *                 and q scaled BTQ, the attention's output BT·QD and state ATT, o_proj's output BTC and
 *                 post_attn_norm's rstd BT, res2 = x + post_attn_norm(o) BTC, pre_ff_norm(res2) BTC and
 *                 its rstd BT, gate|up 2BTF, gelu_tanh(gate)·up BTF, down's output BTC and post_ff_norm's
 *                 rstd BT, the layer's output BTC; checkpointing: the output only, and block_ws the
 *                 rest once, with the forward's BTC scratch
 *   root_saved  = 2·BTC act + BT fp32: x0 = √C·embed_tokens[inp], the final norm's output and rstd
 *   head_ws     = the logits (at least BTC act: dres reuses them), the losses BT, d final norm BTC
 *   bwd_ws      = 2·BTC + BT·max(C, QD) + BTF + BT·max(2F, Q) act + DATT fp32: dres, dx, datty, d geglu,
 *                 d gate|up then d q|k|v, the attention's backward scratch */
static inline plan_act gemma3_act(const model_config *m, int B, device_kind dev, ackpt_mode ackpt) {
  const int64_t T = m->seq_len, C = m->n_embd, F = m->ffn_dim, HD = gemma3_head_dim(m), V = m->vocab_size;
  const int64_t NH = m->n_head, NKV = m->n_kv_head, QD = NH * HD, Q = QD + 2 * NKV * HD;
  const int64_t BT = (int64_t)B * T, BTC = BT * C, ATT = plan_attention_floats(dev, B, T, NH);
  const int64_t DATT = plan_attention_scratch_floats(dev, B, T, NH, HD);
  const int64_t e = dev == DEVICE_CPU ? 4 : 2;
  int64_t logits = plan_logits_bytes(dev, BT, V, C);
  if (logits < e * BTC) logits = e * BTC;
  const int64_t acts = BT * (6 * C + QD + 2 * Q + 3 * F), stats = BT * (4 + NH + NKV) + ATT;
  const int64_t block = acts + stats, block_bytes = e * acts + 4 * stats;
  const int64_t wide = BT * (2 * F > Q ? 2 * F : Q), bwd = 2 * BTC + BT * (QD > C ? QD : C) + BT * F + wide;
  return llama_plan_act(ackpt == ACKPT_FULL, e, BT, C, block, block_bytes, logits, bwd, DATT);
}

#endif
