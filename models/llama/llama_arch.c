/* llama_arch — Llama's descriptor (arch.h): units and Hugging Face names, config.json (transformers
 * 4 and 5), plan terms, manifest keys; and the Llama family's shared terms (llama_family.h), which the
 * family's other descriptors (qwen2, qwen3, mistral, phi3) use as theirs.
 *
 * Names are Hugging Face LlamaForCausalLM's, stored whole ("model.layers.0.self_attn.q_proj.weight",
 * "lm_head.weight"), so an export writes them as they are; lookups take them with or without the
 * "model." prefix (checkpoints converted from a bare LlamaModel carry none). A tied model's root has
 * no lm_head: embed_tokens is both ends (slot LROOT_EMBED), as GPT-2's wte.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "hfconfig.h"
#include "llama.h"
#include "llama_family.h"
#include "plan_priv.h"

#define LLAMA_PREFIX "model."

static int64_t kv_dim(const model_config *m) { return (int64_t)m->n_kv_head * llama_head_dim(m); }
static int64_t q_dim(const model_config *m) { return (int64_t)m->n_head * llama_head_dim(m); }
/* Q: the fused q|k|v row */
static int64_t qkv_dim(const model_config *m) { return q_dim(m) + 2 * kv_dim(m); }

int64_t llama_root_numel(const model_config *m) {
  return (m->tie_embeddings ? 1 : 2) * (int64_t)m->vocab_size * m->n_embd + m->n_embd;
}

int64_t llama_block_numel(const model_config *m) {
  int64_t C = m->n_embd, F = m->ffn_dim, Q = qkv_dim(m);
  int64_t n = 2 * C + Q * C + C * q_dim(m) + 3 * F * C;   /* norms, q k v, o, gate up down */
  if (llama_has(m, LBLK_QB)) n += Q;
  if (llama_has(m, LBLK_QN)) n += 2 * llama_head_dim(m);
  if (llama_has(m, LBLK_OB)) n += C;
  if (llama_has(m, LBLK_GB)) n += 2 * F + C;
  return n;
}

/* embed_tokens and lm_head, or the tied embed_tokens alone; 7 per layer (biases and norms are 1-D) */
int64_t llama_n_decay(const model_config *m) { return (m->tie_embeddings ? 1 : 2) + 7 * (int64_t)m->n_layer; }
/* an untied model's embed_tokens is a lookup (its head is lm_head); a tied model's one tensor is the head's matmul */
int64_t llama_lookup_numel(const model_config *m) { return m->tie_embeddings ? 0 : (int64_t)m->vocab_size * m->n_embd; }
int64_t llama_embed_numel(const model_config *m) {
  return (m->tie_embeddings ? 1 : 2) * (int64_t)m->vocab_size * m->n_embd;
}

/* plan.h's Llama terms with QD = NH·HD the q and attention-output width, Q = QD + 2·NKV·HD, and with
 * q/k norms the pre-norm q|k|v (BT·Q) and the heads' rstd (BT·(NH + NKV)) kept as well. */
plan_act llama_act(const model_config *m, int B, device_kind dev, ackpt_mode ackpt) {
  int64_t T = m->seq_len, C = m->n_embd, F = m->ffn_dim, Q = qkv_dim(m), QD = q_dim(m), V = m->vocab_size;
  int64_t BT = (int64_t)B * T, BTC = BT * C, ATT = plan_attention_floats(dev, B, T, m->n_head);
  int64_t DATT = plan_attention_scratch_floats(dev, B, T, m->n_head, llama_head_dim(m));
  int64_t e = dev == DEVICE_CPU ? 4 : 2, logits = plan_logits_bytes(dev, BT, V, C);
  if (logits < e * BTC) logits = e * BTC;   /* the slot dres reuses, as GPT-2's */
  int qn = m->qk_norm != 0;
  int64_t acts = BT * (4 * C + QD + Q + 3 * F + qn * Q), stats = 2 * BT + ATT + qn * BT * (m->n_head + m->n_kv_head);
  int64_t block = acts + stats, block_bytes = e * acts + 4 * stats;
  int64_t wide = BT * (2 * F > Q ? 2 * F : Q), bwd = 2 * BTC + BT * (QD > C ? QD : C) + BT * F + wide;
  return llama_plan_act(ackpt == ACKPT_FULL, e, BT, C, block, block_bytes, logits, bwd, DATT);
}

plan_act llama_plan_act(int ck, int64_t e, int64_t BT, int64_t C, int64_t block, int64_t block_bytes, int64_t logits,
                        int64_t bwd, int64_t DATT) {
  const int64_t BTC = BT * C;
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

/* A hand-built model's rope scaling in range (jobspec refuses a job file's with its line). */
static fsdp_status check_rope(const model_config *m) {
  if (m->rope_scaling != ROPE_SCALING_NONE && m->rope_scaling != ROPE_SCALING_LLAMA3 && m->rope_scaling != ROPE_SCALING_LINEAR)
    return fsdp_set_error(FSDP_ERR_INVALID, "rope_scaling %d is out of range; allowed: none | llama3 | linear",
                          (int)m->rope_scaling);
  if (m->rope_scaling == ROPE_SCALING_LINEAR && !(m->rope_factor >= 1 && m->rope_factor <= 1e6))
    return fsdp_set_error(FSDP_ERR_RANGE, "rope_scaling linear with factor %g; allowed: 1 <= factor <= 1e6",
                          m->rope_factor);
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

fsdp_status llama_check_kv(const model_config *m) {
  int nkv = m->n_kv_head;
  if (nkv < 1 || nkv > m->n_head || m->n_head % nkv)
    return fsdp_set_error(FSDP_ERR_INVALID, "n_kv_head = %d does not divide n_head = %d; allowed: a divisor", nkv,
                          m->n_head);
  return FSDP_OK;
}

fsdp_status llama_check_eps_theta(const model_config *m) {
  if (!(m->norm_eps > 0 && m->norm_eps < 1) || !(m->rope_theta >= 1 && m->rope_theta <= 1e9))
    return fsdp_set_error(FSDP_ERR_RANGE, "norm_eps %g / rope_theta %g out of range; allowed: 0 < eps < 1, "
                          "1 <= theta <= 1e9", m->norm_eps, m->rope_theta);
  return FSDP_OK;
}

fsdp_status llama_check(const model_config *m) {
  int hd = llama_head_dim(m);
  TRY(llama_check_kv(m));
  if (m->head_dim < 0 || m->head_dim > 1024)
    return fsdp_set_error(FSDP_ERR_RANGE, "head_dim = %d is out of range; allowed: 0 (n_embd / n_head) or 2..1024",
                          m->head_dim);
  if (hd % 2 || hd < 2)
    return fsdp_set_error(FSDP_ERR_INVALID, "head size %d is odd; rotary embeddings need an even head size", hd);
  if (m->ffn_dim < 1 || m->ffn_dim > 1048576)
    return fsdp_set_error(FSDP_ERR_RANGE, "ffn_dim = %d is out of range; allowed: 1..1048576", m->ffn_dim);
  if (m->ffn_dim % 2)   /* bf16 (B,T,F) buffers of odd B·T would leave the next fp32 one misaligned (model_llama.c) */
    return fsdp_set_error(FSDP_ERR_INVALID, "ffn_dim = %d is odd; allowed: an even SwiGLU width", m->ffn_dim);
  if (m->pad_token_id < -1 || m->pad_token_id >= m->vocab_size)
    return fsdp_set_error(FSDP_ERR_RANGE, "pad_token_id = %d is not a token of the vocabulary; allowed: -1 (none) or "
                          "0..%d (below vocab_size)", m->pad_token_id, m->vocab_size - 1);
  TRY(llama_check_eps_theta(m));
  return check_rope(m);
}

void llama_canonical_head_dim(model_config *m) {
  if (m->head_dim == m->n_embd / m->n_head && m->n_embd % m->n_head == 0) m->head_dim = 0;   /* one identity */
}

/* Llama's own choices are head_dim, attention_bias and mlp_bias; q/k/v biases alone and q/k norms are
 * other families'. */
static void canonical(model_config *m) {
  llama_canonical_head_dim(m);
  m->qkv_bias = 0;
  m->qk_norm = 0;
}

void llama_units(plan_t *p) {
  const model_config *m = &p->model;
  int64_t C = m->n_embd, F = m->ffn_dim, KV = kv_dim(m), QD = q_dim(m), HD = llama_head_dim(m), V = m->vocab_size;
  plan_unit *r = &p->units[0];
  snprintf(r->name, sizeof r->name, "root");
  plan_add_tensor(r, "model.embed_tokens.weight", LROOT_EMBED, V, C);
  plan_add_tensor(r, "model.norm.weight", LROOT_NORM, C, 0);
  if (!m->tie_embeddings) plan_add_tensor(r, "lm_head.weight", LROOT_HEAD, V, C);   /* tied: embed_tokens is the head */
  const struct { const char *suffix; int64_t rows, cols; } blk[LBLK_MAX] = {
    [LBLK_LN1_W] = {"input_layernorm.weight", C, 0},
    [LBLK_Q] = {"self_attn.q_proj.weight", QD, C},
    [LBLK_K] = {"self_attn.k_proj.weight", KV, C},
    [LBLK_V] = {"self_attn.v_proj.weight", KV, C},
    [LBLK_QB] = {"self_attn.q_proj.bias", QD, 0},
    [LBLK_KB] = {"self_attn.k_proj.bias", KV, 0},
    [LBLK_VB] = {"self_attn.v_proj.bias", KV, 0},
    [LBLK_QN] = {"self_attn.q_norm.weight", HD, 0},
    [LBLK_KN] = {"self_attn.k_norm.weight", HD, 0},
    [LBLK_O] = {"self_attn.o_proj.weight", C, QD},
    [LBLK_OB] = {"self_attn.o_proj.bias", C, 0},
    [LBLK_LN2_W] = {"post_attention_layernorm.weight", C, 0},
    [LBLK_GATE] = {"mlp.gate_proj.weight", F, C},
    [LBLK_UP] = {"mlp.up_proj.weight", F, C},
    [LBLK_GB] = {"mlp.gate_proj.bias", F, 0},
    [LBLK_UB] = {"mlp.up_proj.bias", F, 0},
    [LBLK_DOWN] = {"mlp.down_proj.weight", C, F},
    [LBLK_DB] = {"mlp.down_proj.bias", C, 0},
  };
  llama_slots sl = llama_slots_of(m);
  for (int i = 0; i < m->n_layer; i++) {
    plan_unit *u = &p->units[1 + i];
    snprintf(u->name, sizeof u->name, "layers.%hu", (unsigned short)i);   /* i < 512 */
    for (int k = 0; k < LBLK_MAX; k++) {
      if (sl.at[k] < 0) continue;
      char name[96];   /* "model.layers.511.post_attention_layernorm.weight": 48 */
      snprintf(name, sizeof name, LLAMA_PREFIX "layers.%d.%s", i, blk[k].suffix);
      plan_add_tensor(u, name, LROOT_NT + sl.n * i + sl.at[k], blk[k].rows, blk[k].cols);
    }
  }
}

static const char *strip(const char *s) {
  return strncmp(s, LLAMA_PREFIX, strlen(LLAMA_PREFIX)) ? s : s + strlen(LLAMA_PREFIX);
}

/* NAME with or without "model." */
const plan_tensor *llama_find(const plan_t *p, const char *name, int *unit) {
  const char *bare = strip(name);
  for (int u = 0; u < p->nunits; u++)
    for (int j = 0; j < p->units[u].ntensors; j++)
      if (!strcmp(strip(p->units[u].t[j].name), bare)) {
        if (unit) *unit = u;
        return &p->units[u].t[j];
      }
  return NULL;
}

int llama_head_slot(const model_config *m) { return m->tie_embeddings ? LROOT_EMBED : LROOT_HEAD; }

int64_t llama_attn_dim(const model_config *m) { return q_dim(m); }

/* ---- config.json: LlamaConfig ---- */

const char *llama_hf_rope_type(const json_t *r) {
  const char *type = json_string_value(json_object_get(r, "rope_type"));
  if (!type) type = json_string_value(json_object_get(r, "type"));
  return type ? type : "default";
}

double llama_hf_num(const json_t *o, const char *key) {
  const json_t *x = o ? json_object_get(o, key) : NULL;
  return json_is_number(x) ? json_number_value(x) : NAN;
}

/* Read the llama3 or linear scaling of SC (WHERE names it) into M, or nothing for "default". */
static fsdp_status rope_scaling_of(const json_t *sc, const char *path, const char *where, model_config *m) {
  const char *type = llama_hf_rope_type(sc);
  if (!strcmp(type, "default")) return FSDP_OK;
  if (!strcmp(type, "linear")) {   /* _compute_linear_scaling_rope_parameters: inv_freq / factor */
    m->rope_scaling = ROPE_SCALING_LINEAR;
    return hf_get_num(sc, path, "factor", NAN, &m->rope_factor);
  }
  if (strcmp(type, "llama3"))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s rope_type '%s' is not computed by fsdpd; allowed: default, "
                          "llama3, linear", path, where, type);
  m->rope_scaling = ROPE_SCALING_LLAMA3;
  TRY(hf_get_num(sc, path, "factor", NAN, &m->rope_factor));
  TRY(hf_get_num(sc, path, "low_freq_factor", NAN, &m->rope_low_freq_factor));
  TRY(hf_get_num(sc, path, "high_freq_factor", NAN, &m->rope_high_freq_factor));
  return hf_get_int(sc, path, "original_max_position_embeddings", -1, &m->rope_original_max_pos);
}

/* The rotary base and scaling with transformers 5's precedence (PreTrainedConfig's
 * convert_rope_params_to_dict, as from_pretrained applies it): a legacy rope_scaling object, where
 * there is one, replaces rope_parameters whole, and its base is its own rope_theta, else the
 * top-level rope_theta, else 10000; without one, rope_parameters' rope_theta, else the top-level
 * one, else 10000. Where the two forms say different things (a base, a scaling), transformers keeps
 * one silently; fsdpd refuses, naming both. */
static fsdp_status hf_rope(const json_t *o, const char *path, model_config *m) {
  const json_t *rp = json_object_get(o, "rope_parameters"), *sc = json_object_get(o, "rope_scaling");
  if (!json_is_object(rp)) rp = NULL;
  if (sc && !json_is_null(sc) && !json_is_object(sc))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: rope_scaling must be null or an object", path);
  if (sc && (json_is_null(sc) || json_object_size(sc) == 0)) sc = NULL;   /* transformers: `rope_scaling or ...` */
  const json_t *use = sc ? sc : rp;
  const char *where = sc ? "rope_scaling" : "rope_parameters";
  double top = llama_hf_num(o, "rope_theta"), own = llama_hf_num(use, "rope_theta");
  if (use && !isnan(own) && !isnan(top) && own != top)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s has rope_theta %g but the top-level rope_theta is %g; "
                          "allowed: one base (remove one of them, or make them equal)", path, where, own, top);
  TRY(hf_get_num(use && !isnan(own) ? use : o, path, "rope_theta", 10000, &m->rope_theta));
  if (use) TRY(rope_scaling_of(use, path, where, m));
  if (sc && rp) {   /* the legacy block wins; refuse a rope_parameters that says otherwise */
    model_config other = *m;
    other.rope_scaling = ROPE_SCALING_NONE;
    TRY(rope_scaling_of(rp, path, "rope_parameters", &other));
    double rp_theta = llama_hf_num(rp, "rope_theta");
    int same = other.rope_scaling == m->rope_scaling &&
               (m->rope_scaling == ROPE_SCALING_NONE ||
                (other.rope_factor == m->rope_factor && other.rope_low_freq_factor == m->rope_low_freq_factor &&
                 other.rope_high_freq_factor == m->rope_high_freq_factor &&
                 other.rope_original_max_pos == m->rope_original_max_pos));
    if (strcmp(llama_hf_rope_type(rp), "default") && !same)
      return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: rope_parameters (rope_type '%s') and the legacy rope_scaling "
                            "(rope_type '%s') disagree; allowed: one of them, or both the same", path,
                            llama_hf_rope_type(rp), llama_hf_rope_type(sc));
    if (!isnan(rp_theta) && rp_theta != m->rope_theta)
      return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: rope_parameters has rope_theta %g but transformers takes %g "
                            "(the legacy rope_scaling replaces rope_parameters); allowed: one base (set rope_theta "
                            "in rope_scaling or at the top level to %g, or remove rope_scaling)", path, rp_theta,
                            m->rope_theta, rp_theta);
  }
  return FSDP_OK;
}

/* A boolean KEY of O into *V (absent or null: DFLT). */
fsdp_status llama_hf_bool(const json_t *o, const char *path, const char *key, int dflt, int *v) {
  json_t *x = json_object_get(o, key);
  if (!x || json_is_null(x)) {
    *v = dflt;
    return FSDP_OK;
  }
  if (!json_is_boolean(x)) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s must be true or false", path, key);
  *v = json_boolean_value(x);
  return FSDP_OK;
}

fsdp_status llama_hf_pad(const json_t *o, const char *path, int absent, model_config *m) {
  const json_t *x = json_object_get(o, "pad_token_id");
  m->pad_token_id = x ? -1 : absent;
  if (!x || json_is_null(x)) return FSDP_OK;
  if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= m->vocab_size)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: pad_token_id must be null or a token id in 0..%d (below vocab_size)",
                          path, m->vocab_size - 1);
  m->pad_token_id = (int)json_integer_value(x);
  return FSDP_OK;
}

fsdp_status llama_hf_shape(const json_t *o, const char *path, const llama_hf_dflt *d, model_config *m) {
  TRY(hf_get_int(o, path, "num_hidden_layers", d->n_layer, &m->n_layer));
  TRY(hf_get_int(o, path, "num_attention_heads", d->n_head, &m->n_head));
  TRY(hf_get_int(o, path, "hidden_size", d->n_embd, &m->n_embd));
  TRY(hf_get_int(o, path, "vocab_size", d->vocab_size, &m->vocab_size));
  TRY(hf_get_int(o, path, "intermediate_size", d->ffn_dim, &m->ffn_dim));
  TRY(hf_get_int(o, path, "max_position_embeddings", d->n_positions, &m->n_positions));
  return hf_get_int(o, path, "num_key_value_heads", d->n_kv_head ? d->n_kv_head : m->n_head, &m->n_kv_head);
}

fsdp_status llama_hf_parse_common(const json_t *o, const char *path, int head_dim_dflt, model_config *m) {
  static const llama_hf_dflt required = {-1, -1, -1, -1, -1, 2048, 0};   /* LlamaConfig's shapes: no defaults */
  TRY(llama_hf_shape(o, path, &required, m));
  TRY(hf_get_num(o, path, "rms_norm_eps", 1e-6, &m->norm_eps));
  /* head_dim: the config's, else the family's default (C / H: 0) as transformers' attention takes it */
  TRY(hf_get_int(o, path, "head_dim", head_dim_dflt, &m->head_dim));
  if (m->head_dim % 2)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: head_dim = %d is odd; rotary embeddings rotate pairs of channels, "
                          "so allowed: an even head_dim", path, m->head_dim);
  json_t *tie = json_object_get(o, "tie_word_embeddings");
  m->tie_embeddings = json_is_true(tie);
  json_t *act = json_object_get(o, "hidden_act");
  if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: hidden_act = %s is not computed by fsdpd; allowed: silu (SwiGLU)",
                          path, json_is_string(act) ? json_string_value(act) : "?");
  TRY(llama_hf_pad(o, path, -1, m));
  return hf_rope(o, path, m);
}

/* LlamaConfig: head_dim (None: C / H), attention_bias (q, k, v and o), mlp_bias. */
static fsdp_status hf_parse(const json_t *o, const char *path, model_config *m) {
  m->arch = ARCH_LLAMA;
  TRY(llama_hf_parse_common(o, path, 0, m));
  TRY(llama_hf_bool(o, path, "attention_bias", 0, &m->attention_bias));
  return llama_hf_bool(o, path, "mlp_bias", 0, &m->mlp_bias);
}

/* M's rope scaling as Hugging Face's config.json writes it: JSON null, or {"rope_type": "llama3",
 * "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} (the plan's
 * --json, the checkpoint manifest, the export's LlamaConfig; transformers 4 and 5 read it). */
json_t *llama_rope_scaling_json(const model_config *m) {
  if (m->rope_scaling == ROPE_SCALING_NONE) return json_null();
  if (m->rope_scaling == ROPE_SCALING_LINEAR) return json_pack("{s:s, s:f}", "rope_type", "linear", "factor", m->rope_factor);
  return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", jobspec_rope_scaling_name(m->rope_scaling), "factor",
                   m->rope_factor, "low_freq_factor", m->rope_low_freq_factor, "high_freq_factor",
                   m->rope_high_freq_factor, "original_max_position_embeddings", m->rope_original_max_pos);
}

/* fsdpd's byte-level Llama-family models have no special tokens, so bos/eos are null (LlamaConfig's
 * defaults, 1 and 2, would stop generate() at a byte); pad is the job's pad_token_id, null for none. */
json_t *llama_own_config(const model_config *m, const char *architecture, const char *model_type) {
  int npos = m->n_positions > 0 ? m->n_positions : m->seq_len;
  return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:o, s:s, s:b, s:f, "
                   "s:n, s:n, s:o}",
                   "architectures", architecture, "model_type", model_type, "hidden_size", m->n_embd,
                   "intermediate_size", m->ffn_dim, "num_attention_heads", m->n_head, "num_key_value_heads",
                   m->n_kv_head, "head_dim", llama_head_dim(m), "num_hidden_layers", m->n_layer, "vocab_size",
                   m->vocab_size, "max_position_embeddings", npos, "rms_norm_eps", m->norm_eps, "rope_theta",
                   m->rope_theta, "rope_scaling", llama_rope_scaling_json(m), "hidden_act", "silu",
                   "tie_word_embeddings", m->tie_embeddings, "initializer_range", 0.02, "bos_token_id",
                   "eos_token_id", "pad_token_id", m->pad_token_id >= 0 ? json_integer(m->pad_token_id) : json_null());
}

static json_t *hf_own_config(const model_config *m) {
  json_t *o = llama_own_config(m, "LlamaForCausalLM", "llama");
  if (o) {
    json_object_set_new(o, "attention_bias", json_boolean(m->attention_bias));
    json_object_set_new(o, "mlp_bias", json_boolean(m->mlp_bias));
  }
  return o;
}

const arch_dropout llama_dropout[] = {{"attention_dropout", 0}, {NULL, 0}};

const arch_hf_key llama_hf_keys[] = {
  LLAMA_HF_KEYS_SHAPE,
  LLAMA_HF_KEYS_ROPE,
  {"head_dim", "head_dim"},
  {"attention_bias", "attention_bias"},
  {"mlp_bias", "mlp_bias"},
  {"pad_token_id", "pad_token_id"},
  {NULL, NULL},
};

/* ---- weights files ---- */

/* An untied job never trains a head the file lacks (a tied job's head, equal or not, is st_tied_head's). */
fsdp_status llama_file_check(const plan_t *p, const char *path, int (*has)(const void *, const char *), const void *f) {
  int head = has(f, "lm_head.weight");
  int llama = has(f, "embed_tokens.weight") || has(f, "layers.0.self_attn.q_proj.weight");
  if (!p->model.tie_embeddings && !head && llama)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s holds no lm_head.weight (a tied model's head is "
                          "model.embed_tokens.weight); the job has tie_word_embeddings = false: set it true", path);
  return FSDP_OK;
}

/* The head of an untied job missing from a file that has embed_tokens: a tied model. */
fsdp_status llama_missing(const plan_t *p, const char *name, const char *where) {
  (void)p;
  if (!strcmp(name, "lm_head.weight"))
    return fsdp_set_error(FSDP_ERR_NOTFOUND, "%s has no lm_head.weight: its head is embed_tokens (a tied model); "
                          "allowed: tie_word_embeddings = true in [model], or a file with lm_head.weight", where);
  return FSDP_OK;
}

/* ---- checkpoints, plan output ---- */

void llama_model_json_shape(json_t *jm, const model_config *m) {
  json_object_set_new(jm, "n_kv_head", json_integer(m->n_kv_head));
  json_object_set_new(jm, "ffn_dim", json_integer(m->ffn_dim));
  json_object_set_new(jm, "norm_eps", json_real(m->norm_eps));
  json_object_set_new(jm, "rope_theta", json_real(m->rope_theta));
  json_object_set_new(jm, "tie_word_embeddings", json_boolean(m->tie_embeddings || arch_get(m->arch)->always_tied));
  json_object_set_new(jm, "rope_scaling", llama_rope_scaling_json(m));
  json_object_set_new(jm, "head_dim", json_integer(llama_head_dim(m)));
}

void llama_model_json(json_t *jm, const model_config *m) {
  llama_model_json_shape(jm, m);
  json_object_set_new(jm, "attention_bias", json_boolean(m->attention_bias));
  json_object_set_new(jm, "mlp_bias", json_boolean(m->mlp_bias));
  json_object_set_new(jm, "pad_token_id", json_integer(m->pad_token_id));
}

int llama_manifest_fix(model_config *m) { return m->n_kv_head < 1 || m->ffn_dim < 1 ? -1 : 0; }

/* head_dim, the biases and pad_token_id (absent in checkpoints of an fsdpd without them: C / H, none); the
 * descriptor's canonical() then sets the family's own choices (Qwen2's biases, Qwen3's norms). */
void llama_manifest_read(const json_t *jm, model_config *m) {
  json_int_t hd = json_integer_value(json_object_get(jm, "head_dim"));
  m->head_dim = hd > 0 && hd <= 1024 ? (int)hd : 0;
  m->attention_bias = json_is_true(json_object_get(jm, "attention_bias"));
  m->mlp_bias = json_is_true(json_object_get(jm, "mlp_bias"));
  const json_t *pad = json_object_get(jm, "pad_token_id");   /* absent: a checkpoint from before it, none */
  m->pad_token_id = json_is_integer(pad) && json_integer_value(pad) >= 0 && json_integer_value(pad) < m->vocab_size
                        ? (int)json_integer_value(pad) : -1;
  arch_get(m->arch)->canonical(m);
}

static int rope_eq(const model_config *a, const model_config *b) {
  return a->rope_scaling == b->rope_scaling &&
         (a->rope_scaling == ROPE_SCALING_NONE ||
          (a->rope_scaling == ROPE_SCALING_LINEAR && a->rope_factor == b->rope_factor) ||
          (a->rope_factor == b->rope_factor && a->rope_low_freq_factor == b->rope_low_freq_factor &&
           a->rope_high_freq_factor == b->rope_high_freq_factor && a->rope_original_max_pos == b->rope_original_max_pos));
}

int llama_same_model(const model_config *a, const model_config *b) {
  return a->n_kv_head == b->n_kv_head && a->ffn_dim == b->ffn_dim && a->norm_eps == b->norm_eps &&
         a->rope_theta == b->rope_theta && !a->tie_embeddings == !b->tie_embeddings && rope_eq(a, b) &&
         llama_head_dim(a) == llama_head_dim(b) && !a->attention_bias == !b->attention_bias &&
         !a->qkv_bias == !b->qkv_bias && !a->mlp_bias == !b->mlp_bias && !a->qk_norm == !b->qk_norm;
}

/* What M has beyond a plain Llama's, for a message: "", or ", head_dim 128, q/k/v biases, ..." (the
 * head_dim only with HEAD_DIM). */
static void extras(const model_config *m, int head_dim, char *buf, size_t n) {
  char hd[32] = "";
  if (m->head_dim && head_dim) snprintf(hd, sizeof hd, ", head_dim %d", m->head_dim);
  snprintf(buf, n, "%s%s%s%s", hd, m->attention_bias ? ", q/k/v/o biases" : m->qkv_bias ? ", q/k/v biases" : "",
           m->mlp_bias ? ", MLP biases" : "", m->qk_norm ? ", q/k norms" : "");
}

void llama_rope_text(const model_config *m, char *buf, size_t n) {
  if (m->rope_scaling == ROPE_SCALING_NONE) snprintf(buf, n, "none");
  else if (m->rope_scaling == ROPE_SCALING_LINEAR) snprintf(buf, n, "linear (factor %g)", m->rope_factor);
  else
    snprintf(buf, n, "llama3 (factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d)",
             m->rope_factor, m->rope_low_freq_factor, m->rope_high_freq_factor, m->rope_original_max_pos);
}

/* eps, theta, the head size, the tie, the biases and the rope scaling, for a message */
void llama_describe(const model_config *m, char *buf, size_t n) {
  char x[96];
  extras(m, 1, x, sizeof x);
  int k = snprintf(buf, n, ", norm_eps %g, rope_theta %g, %s%s, rope_scaling ", m->norm_eps, m->rope_theta,
                   m->tie_embeddings ? "tied" : "untied", x);
  if (k < 0 || (size_t)k >= n) return;
  llama_rope_text(m, buf + k, n - (size_t)k);
}

void llama_print_shape(const model_config *m, FILE *f) {
  fprintf(f, "  KV=%d  HD=%d  F=%d  eps=%g  theta=%g\n", m->n_kv_head, llama_head_dim(m), m->ffn_dim, m->norm_eps,
          m->rope_theta);
}

/* The shape line's rest, and the line under it: the head tied or not, the biases and norms, the rope scaling. */
void llama_print_model(const model_config *m, FILE *f) {
  char x[96];
  extras(m, 0, x, sizeof x);
  llama_print_shape(m, f);
  fprintf(f, "          %s%s%s", m->tie_embeddings ? "tied: lm_head is model.embed_tokens.weight (one tensor, both uses)"
                                                     : "untied: lm_head.weight is its own tensor", x[0] ? "; " : "",
          x[0] ? x + 2 : "");
  if (m->pad_token_id >= 0)
    fprintf(f, "; pad_token_id %d (the lookup does not train its row%s)", m->pad_token_id,
            m->tie_embeddings ? "; the tied head does" : "");
  if (m->rope_scaling == ROPE_SCALING_LINEAR)
    fprintf(f, "; rope linear factor %g\n", m->rope_factor);
  else if (m->rope_scaling == ROPE_SCALING_LLAMA3)
    fprintf(f, "; rope llama3 factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d\n",
            m->rope_factor, m->rope_low_freq_factor, m->rope_high_freq_factor, m->rope_original_max_pos);
  else
    fprintf(f, "; rope unscaled\n");
}

const char *llama_params_note(const model_config *m) {
  return m->tie_embeddings ? "the tied embed_tokens counted once" : "embed_tokens and the untied lm_head both counted";
}
const char *llama_no_emb_label(const model_config *m) {
  return m->tie_embeddings ? "Ψ without embed_tokens" : "Ψ without embed, lm_head";
}
const char *llama_flops_formula(const model_config *m) {
  return m->tie_embeddings ? "6·Ψ + 12·L·H·HD·T" : "6·(Ψ − embed_tokens) + 12·L·H·HD·T";
}

static const char *const job_keys[] = {"n_kv_head", "ffn_dim", "norm_eps", "rope_theta", "rope_scaling", "rope_factor",
                                       "rope_low_freq_factor", "rope_high_freq_factor",
                                       "rope_original_max_position_embeddings", "head_dim", "attention_bias",
                                       "mlp_bias", "pad_token_id", NULL};
const char *const llama_probe_names[] = {"embed_tokens.weight", "layers.0.self_attn.q_proj.weight", NULL};

int llama_lora_modules_at(const model_config *m, const int slot[7], arch_lora_module *o) {
  int64_t C = m->n_embd, F = m->ffn_dim, QD = q_dim(m), KV = kv_dim(m), Q = qkv_dim(m);
  o[0] = (arch_lora_module){"self_attn.q_proj", slot[0], C, QD, 0, Q};
  o[1] = (arch_lora_module){"self_attn.k_proj", slot[1], C, KV, QD, Q};
  o[2] = (arch_lora_module){"self_attn.v_proj", slot[2], C, KV, QD + KV, Q};
  o[3] = (arch_lora_module){"self_attn.o_proj", slot[3], QD, C, 0, C};
  o[4] = (arch_lora_module){"mlp.gate_proj", slot[4], C, F, 0, 2 * F};
  o[5] = (arch_lora_module){"mlp.up_proj", slot[5], C, F, F, 2 * F};
  o[6] = (arch_lora_module){"mlp.down_proj", slot[6], F, C, 0, C};
  return 7;
}

int llama_lora_modules(const model_config *m, arch_lora_module *o) {
  static const int slot[7] = {LBLK_Q, LBLK_K, LBLK_V, LBLK_O, LBLK_GATE, LBLK_UP, LBLK_DOWN};
  return llama_lora_modules_at(m, slot, o);
}

const arch_desc llama_arch = {
  LLAMA_FAMILY_DESC,
  .id = ARCH_LLAMA,
  .name = "llama",
  .hf_model_type = "llama",
  .job_keys = job_keys,
  .why_not = "it is not a Llama setting",
  .hf_parse = hf_parse,
  .hf_own_config = hf_own_config,
  .canonical = canonical,
  .file_desc = "a Llama model (model.embed_tokens.weight, model.layers.0.…)",
};
