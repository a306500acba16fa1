/* plan_llama — Llama's FSDP units and activation terms for plan.c; see plan.h and docs/models.md.
 *
 * Names are Hugging Face LlamaForCausalLM's, stored whole ("model.layers.0.self_attn.q_proj.weight",
 * "lm_head.weight"), so an export writes them as they are; lookups take them with or without the
 * "model." prefix (checkpoints converted from a bare LlamaModel carry none). A tied model's root has
 * no lm_head: embed_tokens is both ends (slot LROOT_EMBED; plan_head_slot), as GPT-2's wte; the
 * layers keep their gids, so a tied and an untied model initialize their layers alike.
 */
#include "plan_priv.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#define LLAMA_PREFIX "model."

static int64_t kv_dim(const model_config *m) { return (int64_t)m->n_kv_head * (m->n_embd / m->n_head); }

int64_t plan_llama_root_numel(const model_config *m) {
  return (m->tie_embeddings ? 1 : 2) * (int64_t)m->vocab_size * m->n_embd + m->n_embd;
}

int64_t plan_llama_block_numel(const model_config *m) {
  int64_t C = m->n_embd, F = m->ffn_dim;
  return 2 * C + 2 * C * C + 2 * kv_dim(m) * C + 3 * F * C;   /* norms, q and o, k and v, gate up down */
}

plan_act plan_llama_act(const model_config *m, int B, device_kind dev, ackpt_mode ackpt) {
  int64_t T = m->seq_len, C = m->n_embd, F = m->ffn_dim, Q = C + 2 * kv_dim(m), V = m->vocab_size;
  int64_t BT = (int64_t)B * T, BTC = BT * C, ATT = plan_attention_floats(dev, B, T, m->n_head);
  int64_t DATT = plan_attention_scratch_floats(dev, B, T, m->n_head, C / m->n_head);
  int64_t e = dev == DEVICE_CPU ? 4 : 2, logits = plan_logits_bytes(dev, BT, V);
  if (logits < e * BTC) logits = e * BTC;   /* the slot dres reuses, as GPT-2's */
  int64_t acts = BT * (5 * C + Q + 3 * F), stats = 2 * BT + ATT;
  int64_t block = acts + stats, block_bytes = e * acts + 4 * stats;
  int64_t wide = BT * (2 * F > Q ? 2 * F : Q), bwd = 3 * BTC + BT * F + wide;
  int ck = ackpt == ACKPT_FULL;
  return (plan_act){
    .block_saved = ck ? BTC : block,
    .block_ws = ck ? block : 0,
    .block_bytes = ck ? e * BTC : block_bytes,
    .block_ws_bytes = ck ? block_bytes : 0,
    .root_saved = 2 * BTC + BT,
    .head_ws = logits / 4 + BT + BTC,
    .bwd_ws = bwd + DATT,
    .root_bytes = e * 2 * BTC + 4 * BT,
    .head_ws_bytes = logits + 4 * BT + e * BTC,
    .bwd_ws_bytes = e * bwd + 4 * DATT,
  };
}

void plan_llama_units(plan_t *p) {
  const model_config *m = &p->model;
  int64_t C = m->n_embd, F = m->ffn_dim, KV = kv_dim(m), V = m->vocab_size;
  plan_unit *r = &p->units[0];
  snprintf(r->name, sizeof r->name, "root");
  plan_add_tensor(r, "model.embed_tokens.weight", LROOT_EMBED, V, C);
  plan_add_tensor(r, "model.norm.weight", LROOT_NORM, C, 0);
  if (!m->tie_embeddings) plan_add_tensor(r, "lm_head.weight", LROOT_HEAD, V, C);   /* tied: embed_tokens is the head */
  const struct { const char *suffix; int64_t rows, cols; } blk[LBLK_NT] = {
    [LBLK_LN1_W] = {"input_layernorm.weight", C, 0},
    [LBLK_Q] = {"self_attn.q_proj.weight", C, C},
    [LBLK_K] = {"self_attn.k_proj.weight", KV, C},
    [LBLK_V] = {"self_attn.v_proj.weight", KV, C},
    [LBLK_O] = {"self_attn.o_proj.weight", C, C},
    [LBLK_LN2_W] = {"post_attention_layernorm.weight", C, 0},
    [LBLK_GATE] = {"mlp.gate_proj.weight", F, C},
    [LBLK_UP] = {"mlp.up_proj.weight", F, C},
    [LBLK_DOWN] = {"mlp.down_proj.weight", C, F},
  };
  for (int i = 0; i < m->n_layer; i++) {
    plan_unit *u = &p->units[1 + i];
    snprintf(u->name, sizeof u->name, "layers.%hu", (unsigned short)i);   /* i < 512 */
    for (int j = 0; j < LBLK_NT; j++) {
      char name[96];   /* "model.layers.511.post_attention_layernorm.weight": 48 */
      snprintf(name, sizeof name, LLAMA_PREFIX "layers.%d.%s", i, blk[j].suffix);
      plan_add_tensor(u, name, LROOT_NT + LBLK_NT * i + j, blk[j].rows, blk[j].cols);
    }
  }
}

fsdp_status plan_llama_check_rope(const model_config *m) {
  if ((unsigned)m->rope_scaling > ROPE_SCALING_LLAMA3)
    return fsdp_set_error(FSDP_ERR_INVALID, "rope_scaling %d is out of range; allowed: none | llama3", (int)m->rope_scaling);
  if (m->rope_scaling == ROPE_SCALING_LLAMA3 &&
      !(m->rope_factor >= 1 && m->rope_factor <= 1e6 && m->rope_low_freq_factor > 0 &&
        m->rope_high_freq_factor > m->rope_low_freq_factor && m->rope_high_freq_factor <= 1e6 &&
        m->rope_original_max_pos >= 1 && m->rope_original_max_pos <= 16777216))
    return fsdp_set_error(FSDP_ERR_RANGE, "rope_scaling llama3 with factor %g, low_freq_factor %g, "
                          "high_freq_factor %g, original_max_position_embeddings %d; allowed: 1 <= factor <= 1e6, "
                          "0 < low < high <= 1e6, original 1..16777216", m->rope_factor, m->rope_low_freq_factor,
                          m->rope_high_freq_factor, m->rope_original_max_pos);
  return FSDP_OK;
}

void plan_llama_print_head_rope(const model_config *m, FILE *f) {
  fprintf(f, "          %s", m->tie_embeddings ? "tied: lm_head is model.embed_tokens.weight (one tensor, both uses)"
                                                 : "untied: lm_head.weight is its own tensor");
  if (m->rope_scaling == ROPE_SCALING_LLAMA3)
    fprintf(f, "; rope llama3 factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d\n",
            m->rope_factor, m->rope_low_freq_factor, m->rope_high_freq_factor, m->rope_original_max_pos);
  else
    fprintf(f, "; rope unscaled\n");
}

json_t *plan_rope_scaling_json(const model_config *m) {
  if (m->rope_scaling == ROPE_SCALING_NONE) return json_null();
  return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", jobspec_rope_scaling_name(m->rope_scaling), "factor",
                   m->rope_factor, "low_freq_factor", m->rope_low_freq_factor, "high_freq_factor",
                   m->rope_high_freq_factor, "original_max_position_embeddings", m->rope_original_max_pos);
}

static const char *strip(const char *s) {
  return strncmp(s, LLAMA_PREFIX, strlen(LLAMA_PREFIX)) ? s : s + strlen(LLAMA_PREFIX);
}

const plan_tensor *plan_llama_find(const plan_t *p, const char *name, int *unit) {
  const char *bare = strip(name);
  for (int u = 0; u < p->nunits; u++)
    for (int j = 0; j < p->units[u].ntensors; j++)
      if (!strcmp(strip(p->units[u].t[j].name), bare)) {
        if (unit) *unit = u;
        return &p->units[u].t[j];
      }
  return NULL;
}
