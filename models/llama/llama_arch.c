/* llama_arch — Llama's descriptor (arch.h): units and Hugging Face names, config.json (transformers
 * 4 and 5), plan terms, manifest keys.
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
#include "plan_priv.h"

#define LLAMA_PREFIX "model."

static int64_t kv_dim(const model_config *m) { return (int64_t)m->n_kv_head * (m->n_embd / m->n_head); }

static int64_t root_numel(const model_config *m) {
  return (m->tie_embeddings ? 1 : 2) * (int64_t)m->vocab_size * m->n_embd + m->n_embd;
}

static int64_t block_numel(const model_config *m) {
  int64_t C = m->n_embd, F = m->ffn_dim;
  return 2 * C + 2 * C * C + 2 * kv_dim(m) * C + 3 * F * C;   /* norms, q and o, k and v, gate up down */
}

/* embed_tokens and lm_head, or the tied embed_tokens alone; 7 per layer */
static int64_t n_decay(const model_config *m) { return (m->tie_embeddings ? 1 : 2) + 7 * (int64_t)m->n_layer; }
/* an untied model's embed_tokens is a lookup (its head is lm_head); a tied model's one tensor is the head's matmul */
static int64_t lookup_numel(const model_config *m) { return m->tie_embeddings ? 0 : (int64_t)m->vocab_size * m->n_embd; }
static int64_t embed_numel(const model_config *m) {
  return (m->tie_embeddings ? 1 : 2) * (int64_t)m->vocab_size * m->n_embd;
}

static plan_act act(const model_config *m, int B, device_kind dev, ackpt_mode ackpt) {
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

/* A hand-built model's rope scaling in range (jobspec refuses a job file's with its line). */
static fsdp_status check_rope(const model_config *m) {
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

static fsdp_status check(const model_config *m) {
  int nkv = m->n_kv_head;
  if (nkv < 1 || nkv > m->n_head || m->n_head % nkv)
    return fsdp_set_error(FSDP_ERR_INVALID, "n_kv_head = %d does not divide n_head = %d; allowed: a divisor", nkv,
                          m->n_head);
  if ((m->n_embd / m->n_head) % 2)
    return fsdp_set_error(FSDP_ERR_INVALID, "head size %d is odd; rotary embeddings need an even head size",
                          m->n_embd / m->n_head);
  if (m->ffn_dim < 1 || m->ffn_dim > 1048576)
    return fsdp_set_error(FSDP_ERR_RANGE, "ffn_dim = %d is out of range; allowed: 1..1048576", m->ffn_dim);
  if (m->ffn_dim % 2)   /* bf16 (B,T,F) buffers of odd B·T would leave the next fp32 one misaligned (model_llama.c) */
    return fsdp_set_error(FSDP_ERR_INVALID, "ffn_dim = %d is odd; allowed: an even SwiGLU width", m->ffn_dim);
  if (!(m->norm_eps > 0 && m->norm_eps < 1) || !(m->rope_theta >= 1 && m->rope_theta <= 1e9))
    return fsdp_set_error(FSDP_ERR_RANGE, "norm_eps %g / rope_theta %g out of range; allowed: 0 < eps < 1, "
                          "1 <= theta <= 1e9", m->norm_eps, m->rope_theta);
  return check_rope(m);
}

static void canonical(model_config *m) { (void)m; }

static void units(plan_t *p) {
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

static const char *strip(const char *s) {
  return strncmp(s, LLAMA_PREFIX, strlen(LLAMA_PREFIX)) ? s : s + strlen(LLAMA_PREFIX);
}

/* NAME with or without "model." */
static const plan_tensor *find(const plan_t *p, const char *name, int *unit) {
  const char *bare = strip(name);
  for (int u = 0; u < p->nunits; u++)
    for (int j = 0; j < p->units[u].ntensors; j++)
      if (!strcmp(strip(p->units[u].t[j].name), bare)) {
        if (unit) *unit = u;
        return &p->units[u].t[j];
      }
  return NULL;
}

static int head_slot(const model_config *m) { return m->tie_embeddings ? LROOT_EMBED : LROOT_HEAD; }

/* ---- config.json: LlamaConfig ---- */

/* A rope object's type: rope_type, or transformers 4's "type"; "default" when neither. */
static const char *rope_type_of(const json_t *sc) {
  const char *type = json_string_value(json_object_get(sc, "rope_type"));
  if (!type) type = json_string_value(json_object_get(sc, "type"));
  return type ? type : "default";
}

/* A number KEY of O, or NAN when absent or null (hf_get_num checks its range). */
static double num_or_nan(const json_t *o, const char *key) {
  const json_t *x = o ? json_object_get(o, key) : NULL;
  return json_is_number(x) ? json_number_value(x) : NAN;
}

/* Read the llama3 scaling of SC (WHERE names it) into M, or nothing for "default". */
static fsdp_status rope_scaling_of(const json_t *sc, const char *path, const char *where, model_config *m) {
  const char *type = rope_type_of(sc);
  if (!strcmp(type, "default")) return FSDP_OK;
  if (strcmp(type, "llama3"))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s rope_type '%s' is not computed by fsdpd; allowed: default, "
                          "llama3", path, where, type);
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
  double top = num_or_nan(o, "rope_theta"), own = num_or_nan(use, "rope_theta");
  if (use && !isnan(own) && !isnan(top) && own != top)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s has rope_theta %g but the top-level rope_theta is %g; "
                          "allowed: one base (remove one of them, or make them equal)", path, where, own, top);
  TRY(hf_get_num(use && !isnan(own) ? use : o, path, "rope_theta", 10000, &m->rope_theta));
  if (use) TRY(rope_scaling_of(use, path, where, m));
  if (sc && rp) {   /* the legacy block wins; refuse a rope_parameters that says otherwise */
    model_config other = *m;
    other.rope_scaling = ROPE_SCALING_NONE;
    TRY(rope_scaling_of(rp, path, "rope_parameters", &other));
    double rp_theta = num_or_nan(rp, "rope_theta");
    int same = other.rope_scaling == m->rope_scaling &&
               (m->rope_scaling == ROPE_SCALING_NONE ||
                (other.rope_factor == m->rope_factor && other.rope_low_freq_factor == m->rope_low_freq_factor &&
                 other.rope_high_freq_factor == m->rope_high_freq_factor &&
                 other.rope_original_max_pos == m->rope_original_max_pos));
    if (strcmp(rope_type_of(rp), "default") && !same)
      return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: rope_parameters (rope_type '%s') and the legacy rope_scaling "
                            "(rope_type '%s') disagree; allowed: one of them, or both the same", path,
                            rope_type_of(rp), rope_type_of(sc));
    if (!isnan(rp_theta) && rp_theta != m->rope_theta)
      return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: rope_parameters has rope_theta %g but transformers takes %g "
                            "(the legacy rope_scaling replaces rope_parameters); allowed: one base (set rope_theta "
                            "in rope_scaling or at the top level to %g, or remove rope_scaling)", path, rp_theta,
                            m->rope_theta, rp_theta);
  }
  return FSDP_OK;
}

static fsdp_status hf_parse(const json_t *o, const char *path, model_config *m) {
  m->arch = ARCH_LLAMA;
  TRY(hf_get_int(o, path, "num_hidden_layers", -1, &m->n_layer));
  TRY(hf_get_int(o, path, "num_attention_heads", -1, &m->n_head));
  TRY(hf_get_int(o, path, "hidden_size", -1, &m->n_embd));
  TRY(hf_get_int(o, path, "vocab_size", -1, &m->vocab_size));
  TRY(hf_get_int(o, path, "intermediate_size", -1, &m->ffn_dim));
  TRY(hf_get_int(o, path, "max_position_embeddings", 2048, &m->n_positions));
  TRY(hf_get_int(o, path, "num_key_value_heads", m->n_head, &m->n_kv_head));
  TRY(hf_get_num(o, path, "rms_norm_eps", 1e-6, &m->norm_eps));
  json_t *tie = json_object_get(o, "tie_word_embeddings");
  m->tie_embeddings = json_is_true(tie);
  json_t *hd = json_object_get(o, "head_dim"), *act = json_object_get(o, "hidden_act");
  if (hd && !json_is_null(hd) && (!json_is_integer(hd) || json_integer_value(hd) * m->n_head != m->n_embd))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: head_dim = %lld is not computed by fsdpd; allowed: hidden_size / "
                          "num_attention_heads = %d", path, (long long)json_integer_value(hd), m->n_embd / m->n_head);
  if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: hidden_act = %s is not computed by fsdpd; allowed: silu (SwiGLU)",
                          path, json_is_string(act) ? json_string_value(act) : "?");
  TRY(hf_want_bool(o, path, "attention_bias", 0, "Llama without biases"));
  TRY(hf_want_bool(o, path, "mlp_bias", 0, "Llama without biases"));
  return hf_rope(o, path, m);
}

/* M's rope scaling as Hugging Face's config.json writes it: JSON null, or {"rope_type": "llama3",
 * "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} (the plan's
 * --json, the checkpoint manifest, the export's LlamaConfig; transformers 4 and 5 read it). */
static json_t *rope_scaling_json(const model_config *m) {
  if (m->rope_scaling == ROPE_SCALING_NONE) return json_null();
  return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", jobspec_rope_scaling_name(m->rope_scaling), "factor",
                   m->rope_factor, "low_freq_factor", m->rope_low_freq_factor, "high_freq_factor",
                   m->rope_high_freq_factor, "original_max_position_embeddings", m->rope_original_max_pos);
}

/* fsdpd's byte-level Llama models have no special tokens, so bos/eos/pad are null (LlamaConfig's
 * defaults, 1 and 2, would stop generate() at a byte). */
static json_t *hf_own_config(const model_config *m) {
  int npos = m->n_positions > 0 ? m->n_positions : m->seq_len;
  return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:o, s:s, s:b, s:b, s:b, s:f, "
                   "s:n, s:n, s:n}",
                   "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size", m->n_embd,
                   "intermediate_size", m->ffn_dim, "num_attention_heads", m->n_head, "num_key_value_heads",
                   m->n_kv_head, "head_dim", m->n_embd / m->n_head, "num_hidden_layers", m->n_layer, "vocab_size",
                   m->vocab_size, "max_position_embeddings", npos, "rms_norm_eps", m->norm_eps, "rope_theta",
                   m->rope_theta, "rope_scaling", rope_scaling_json(m), "hidden_act", "silu",
                   "tie_word_embeddings", m->tie_embeddings, "attention_bias", 0, "mlp_bias", 0,
                   "initializer_range", 0.02, "bos_token_id", "eos_token_id", "pad_token_id");
}

static const arch_hf_key hf_keys[] = {
  {"arch", "model_type"},
  {"n_layer", "num_hidden_layers"},
  {"n_head", "num_attention_heads"},
  {"n_embd", "hidden_size"},
  {"vocab_size", "vocab_size"},
  {"n_positions", "max_position_embeddings"},
  {"n_kv_head", "num_key_value_heads"},
  {"ffn_dim", "intermediate_size"},
  {"norm_eps", "rms_norm_eps"},
  {"rope_theta", "rope_theta"},
  {"tie_word_embeddings", "tie_word_embeddings"},
  {"rope_scaling", "rope_type"},
  {"rope_factor", "factor"},
  {"rope_low_freq_factor", "low_freq_factor"},
  {"rope_high_freq_factor", "high_freq_factor"},
  {"rope_original_max_position_embeddings", "original_max_position_embeddings"},
  {NULL, NULL},
};

/* ---- weights files ---- */

/* tied or not: never train a head other than the file's */
static fsdp_status file_check(const plan_t *p, const char *path, int (*has)(const void *, const char *), const void *f) {
  int head = has(f, "lm_head.weight");
  int llama = has(f, "embed_tokens.weight") || has(f, "layers.0.self_attn.q_proj.weight");
  if (p->model.tie_embeddings && head)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s holds an untied model (lm_head.weight); the job has tie_word_embeddings "
                          "= true, whose head is model.embed_tokens.weight: set tie_word_embeddings = false", path);
  if (!p->model.tie_embeddings && !head && llama)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s holds no lm_head.weight (a tied model's head is "
                          "model.embed_tokens.weight); the job has tie_word_embeddings = false: set it true", path);
  return FSDP_OK;
}

/* The head of an untied job missing from a file that has embed_tokens: a tied model. */
static fsdp_status missing(const plan_t *p, const char *name, const char *where) {
  (void)p;
  if (!strcmp(name, "lm_head.weight"))
    return fsdp_set_error(FSDP_ERR_NOTFOUND, "%s has no lm_head.weight: its head is embed_tokens (a tied model); "
                          "allowed: tie_word_embeddings = true in [model], or a file with lm_head.weight", where);
  return FSDP_OK;
}

/* ---- checkpoints, plan output ---- */

static void model_json(json_t *jm, const model_config *m) {
  json_object_set_new(jm, "n_kv_head", json_integer(m->n_kv_head));
  json_object_set_new(jm, "ffn_dim", json_integer(m->ffn_dim));
  json_object_set_new(jm, "norm_eps", json_real(m->norm_eps));
  json_object_set_new(jm, "rope_theta", json_real(m->rope_theta));
  json_object_set_new(jm, "tie_word_embeddings", json_boolean(m->tie_embeddings));
  json_object_set_new(jm, "rope_scaling", rope_scaling_json(m));
}

static int manifest_fix(model_config *m) { return m->n_kv_head < 1 || m->ffn_dim < 1 ? -1 : 0; }

static int rope_eq(const model_config *a, const model_config *b) {
  return a->rope_scaling == b->rope_scaling &&
         (a->rope_scaling == ROPE_SCALING_NONE ||
          (a->rope_factor == b->rope_factor && a->rope_low_freq_factor == b->rope_low_freq_factor &&
           a->rope_high_freq_factor == b->rope_high_freq_factor && a->rope_original_max_pos == b->rope_original_max_pos));
}

static int same_model(const model_config *a, const model_config *b) {
  return a->n_kv_head == b->n_kv_head && a->ffn_dim == b->ffn_dim && a->norm_eps == b->norm_eps &&
         a->rope_theta == b->rope_theta && !a->tie_embeddings == !b->tie_embeddings && rope_eq(a, b);
}

/* eps, theta, the tie and the rope scaling, for a message */
static void describe(const model_config *m, char *buf, size_t n) {
  int k = snprintf(buf, n, ", norm_eps %g, rope_theta %g, %s, rope_scaling ", m->norm_eps, m->rope_theta,
                   m->tie_embeddings ? "tied" : "untied");
  if (k < 0 || (size_t)k >= n) return;
  if (m->rope_scaling == ROPE_SCALING_NONE) snprintf(buf + k, n - (size_t)k, "none");
  else
    snprintf(buf + k, n - (size_t)k, "llama3 (factor %g, low_freq_factor %g, high_freq_factor %g, "
             "original_max_position_embeddings %d)", m->rope_factor, m->rope_low_freq_factor, m->rope_high_freq_factor,
             m->rope_original_max_pos);
}

/* The shape line's rest, and the line under it: the head tied or not, the rope scaling. */
static void print_model(const model_config *m, FILE *f) {
  fprintf(f, "  KV=%d  F=%d  eps=%g  theta=%g\n", m->n_kv_head, m->ffn_dim, m->norm_eps, m->rope_theta);
  fprintf(f, "          %s", m->tie_embeddings ? "tied: lm_head is model.embed_tokens.weight (one tensor, both uses)"
                                                 : "untied: lm_head.weight is its own tensor");
  if (m->rope_scaling == ROPE_SCALING_LLAMA3)
    fprintf(f, "; rope llama3 factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d\n",
            m->rope_factor, m->rope_low_freq_factor, m->rope_high_freq_factor, m->rope_original_max_pos);
  else
    fprintf(f, "; rope unscaled\n");
}

static const char *params_note(const model_config *m) {
  return m->tie_embeddings ? "the tied embed_tokens counted once" : "embed_tokens and the untied lm_head both counted";
}
static const char *no_emb_label(const model_config *m) {
  return m->tie_embeddings ? "Ψ without embed_tokens" : "Ψ without embed, lm_head";
}
static const char *flops_formula(const model_config *m) {
  return m->tie_embeddings ? "6·Ψ + 12·L·C·T" : "6·(Ψ − embed_tokens) + 12·L·C·T";
}

static const char *const job_keys[] = {"n_kv_head", "ffn_dim", "norm_eps", "rope_theta", "rope_scaling", "rope_factor",
                                       "rope_low_freq_factor", "rope_high_freq_factor",
                                       "rope_original_max_position_embeddings", NULL};
static const char *const probe_names[] = {"embed_tokens.weight", "layers.0.self_attn.q_proj.weight", NULL};

/* q|k|v run as one linear of rows C + 2·KV wide, gate|up as one of 2F (model_llama.c). */
static int lora_modules(const model_config *m, arch_lora_module *o) {
  int64_t C = m->n_embd, F = m->ffn_dim, KV = (int64_t)m->n_kv_head * (m->n_embd / m->n_head), Q = C + 2 * KV;
  o[0] = (arch_lora_module){"self_attn.q_proj", LBLK_Q, C, C, 0, Q};
  o[1] = (arch_lora_module){"self_attn.k_proj", LBLK_K, C, KV, C, Q};
  o[2] = (arch_lora_module){"self_attn.v_proj", LBLK_V, C, KV, C + KV, Q};
  o[3] = (arch_lora_module){"self_attn.o_proj", LBLK_O, C, C, 0, C};
  o[4] = (arch_lora_module){"mlp.gate_proj", LBLK_GATE, C, F, 0, 2 * F};
  o[5] = (arch_lora_module){"mlp.up_proj", LBLK_UP, C, F, F, 2 * F};
  o[6] = (arch_lora_module){"mlp.down_proj", LBLK_DOWN, F, C, 0, C};
  return 7;
}

const arch_desc llama_arch = {
  .id = ARCH_LLAMA,
  .name = "llama",
  .hf_model_type = "llama",
  .job_keys = job_keys,
  .why_not = "it is not a Llama setting",
  .always_tied = 0,
  .tied_why = NULL,
  .rotary = 1,
  .hf_keys = hf_keys,
  .hf_parse = hf_parse,
  .hf_own_config = hf_own_config,
  .root_numel = root_numel,
  .block_numel = block_numel,
  .n_decay = n_decay,
  .lookup_numel = lookup_numel,
  .embed_numel = embed_numel,
  .act = act,
  .check = check,
  .canonical = canonical,
  .units = units,
  .find = find,
  .head_slot = head_slot,
  .lora_default = "q_proj,v_proj",
  .lora_block_hf = "model.layers.%d.",
  .lora_modules = lora_modules,
  .probe_names = probe_names,
  .file_desc = "a Llama model (model.embed_tokens.weight, model.layers.0.…)",
  .reads = "model.embed_tokens.weight, model.layers.0.…",
  .file_check = file_check,
  .missing = missing,
  .model_json = model_json,
  .manifest_fix = manifest_fix,
  .same_model = same_model,
  .describe = describe,
  .print_model = print_model,
  .params_note = params_note,
  .no_emb_label = no_emb_label,
  .flops_formula = flops_formula,
  .block_prefix = "layers",
  .layout = "nn.Linear [out, in]",
  .name_width = 47,
};
