/* gemma3_arch — Gemma 3's descriptor (arch.h; Hugging Face Gemma3ForCausalLM, model_type gemma3_text):
 * its units and names (gemma3.h's slots), config.json in transformers 4 and 5 forms, its own [model]
 * settings (ext_keys: query_pre_attn_scalar, rope_local_base_freq, sliding_window_pattern), plan terms,
 * manifest keys and plan lines. Forward, backward and initialization (norm weights 0, projections
 * N(0, initializer_range)) are model_gemma3.c's.
 *
 * config.json (Gemma3TextConfig): the rotary bases per layer kind — transformers 5's rope_parameters
 * {full_attention, sliding_attention}, or transformers 4's rope_theta (global, default 1e6),
 * rope_local_base_freq (sliding, 10000) and rope_scaling (global layers only), with transformers'
 * precedence (rope_parameters' own rope_theta first). Global layers may scale linearly; sliding layers
 * are unscaled. layer_types must be periodic (layer l global iff (l + 1) % P == 0, gemma3.h), else
 * sliding_window_pattern (default 6) gives P. What Gemma3ForCausalLM computes and fsdpd does not is
 * refused in one line: another activation than gelu_pytorch_tanh, logit soft-capping, attention
 * biases, dropout, bidirectional attention, an untied head.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "gemma3.h"
#include "hfconfig.h"
#include "llama_family.h"
#include "plan_priv.h"

#define G3_PREFIX "model."
#define G3_MAX_WINDOW (1 << 24)
#define G3_MAX_PATTERN 4096

static int64_t q_dim(const model_config *m) { return (int64_t)m->n_head * gemma3_head_dim(m); }
static int64_t kv_dim(const model_config *m) { return (int64_t)m->n_kv_head * gemma3_head_dim(m); }

/* ---- plan terms ---- */

static int64_t root_numel(const model_config *m) { return (int64_t)m->vocab_size * m->n_embd + m->n_embd; }
static int64_t block_numel(const model_config *m) {
  int64_t C = m->n_embd, F = m->ffn_dim, QD = q_dim(m);
  return 4 * C + (QD + 2 * kv_dim(m)) * C + 2 * gemma3_head_dim(m) + C * QD + 3 * F * C;   /* norms, qkv, q/k norms, o, mlp */
}
static int64_t n_decay(const model_config *m) { return 1 + 7 * (int64_t)m->n_layer; }   /* embed_tokens, 7 projections a layer */
static int64_t lookup_numel(const model_config *m) { return (void)m, 0; }   /* tied: the head's matmul reads it all */
static int64_t embed_numel(const model_config *m) { return (int64_t)m->vocab_size * m->n_embd; }
static int attn_window(const model_config *m, int layer) { return gemma3_is_global(m, layer) ? 0 : m->sliding_window; }

static fsdp_status check(const model_config *m) {
  int hd = gemma3_head_dim(m);
  TRY(llama_check_kv(m));
  if (m->head_dim < 0 || m->head_dim > 1024 || hd < 2 || hd % 2)
    return fsdp_set_error(FSDP_ERR_RANGE, "head_dim = %d; allowed: an even head size in 2..1024 (0: n_embd / n_head)",
                          m->head_dim);
  if (m->ffn_dim < 2 || m->ffn_dim > 1048576 || m->ffn_dim % 2)
    return fsdp_set_error(FSDP_ERR_RANGE, "ffn_dim = %d; allowed: an even integer in 2..1048576", m->ffn_dim);
  TRY(llama_check_eps_theta(m));
  if (m->rope_scaling != ROPE_SCALING_NONE && m->rope_scaling != ROPE_SCALING_LINEAR)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "rope_scaling %s is not Gemma 3's; allowed with arch = gemma3: none | "
                          "linear (its global layers)", jobspec_rope_scaling_name(m->rope_scaling));
  if (m->rope_scaling == ROPE_SCALING_LINEAR && !(m->rope_factor >= 1 && m->rope_factor <= 1e6))
    return fsdp_set_error(FSDP_ERR_RANGE, "rope_factor %g; allowed: 1 <= factor <= 1e6", m->rope_factor);
  if (m->sliding_window < 0 || m->sliding_window > G3_MAX_WINDOW)
    return fsdp_set_error(FSDP_ERR_RANGE, "sliding_window = %d; allowed: 0 (full attention) .. %d", m->sliding_window,
                          G3_MAX_WINDOW);
  if (!(gemma3_qpas(m) > 0 && gemma3_qpas(m) <= 1e9) || !(gemma3_local_theta(m) >= 1 && gemma3_local_theta(m) <= 1e9) ||
      gemma3_pattern(m) < 1 || gemma3_pattern(m) > G3_MAX_PATTERN)
    return fsdp_set_error(FSDP_ERR_RANGE, "query_pre_attn_scalar %g / rope_local_base_freq %g / sliding_window_pattern "
                          "%d out of range; allowed: > 0, 1..1e9, 1..%d", gemma3_qpas(m), gemma3_local_theta(m),
                          gemma3_pattern(m), G3_MAX_PATTERN);
  return FSDP_OK;
}

/* Tied always; none of the Llama family's choices; head_dim = C / H written as 0. */
static void canonical(model_config *m) {
  llama_canonical_head_dim(m);
  m->tie_embeddings = 1;
  m->attention_bias = m->qkv_bias = m->mlp_bias = m->qk_norm = 0;
}

/* ---- units ---- */

static void units(plan_t *p) {
  const model_config *m = &p->model;
  int64_t C = m->n_embd, F = m->ffn_dim, QD = q_dim(m), KV = kv_dim(m), HD = gemma3_head_dim(m), V = m->vocab_size;
  plan_unit *r = &p->units[0];
  snprintf(r->name, sizeof r->name, "root");
  plan_add_tensor(r, G3_PREFIX "embed_tokens.weight", G3ROOT_EMBED, V, C);
  plan_add_tensor(r, G3_PREFIX "norm.weight", G3ROOT_NORM, C, 0);
  const struct { const char *suffix; int64_t rows, cols; } blk[G3_NT] = {
    [G3_LN1] = {"input_layernorm.weight", C, 0},
    [G3_Q] = {"self_attn.q_proj.weight", QD, C},
    [G3_K] = {"self_attn.k_proj.weight", KV, C},
    [G3_V] = {"self_attn.v_proj.weight", KV, C},
    [G3_QN] = {"self_attn.q_norm.weight", HD, 0},
    [G3_KN] = {"self_attn.k_norm.weight", HD, 0},
    [G3_O] = {"self_attn.o_proj.weight", C, QD},
    [G3_POST_ATTN] = {"post_attention_layernorm.weight", C, 0},
    [G3_PRE_FF] = {"pre_feedforward_layernorm.weight", C, 0},
    [G3_GATE] = {"mlp.gate_proj.weight", F, C},
    [G3_UP] = {"mlp.up_proj.weight", F, C},
    [G3_DOWN] = {"mlp.down_proj.weight", C, F},
    [G3_POST_FF] = {"post_feedforward_layernorm.weight", C, 0},
  };
  for (int i = 0; i < m->n_layer; i++) {
    plan_unit *u = &p->units[1 + i];
    snprintf(u->name, sizeof u->name, "layers.%hu", (unsigned short)i);   /* i < 512 */
    for (int k = 0; k < G3_NT; k++) {
      char name[96];
      snprintf(name, sizeof name, G3_PREFIX "layers.%d.%s", i, blk[k].suffix);
      plan_add_tensor(u, name, G3ROOT_NT + G3_NT * i + k, blk[k].rows, blk[k].cols);
    }
  }
}

static int head_slot(const model_config *m) { return (void)m, G3ROOT_EMBED; }

/* ---- config.json: Gemma3TextConfig ---- */

/* What Gemma3ForCausalLM computes and fsdpd does not. */
static fsdp_status refuse_others(const json_t *o, const char *path) {
  const char *act = json_string_value(json_object_get(o, "hidden_activation"));
  if (json_object_get(o, "hidden_activation") && !json_is_null(json_object_get(o, "hidden_activation")) &&
      (!act || strcmp(act, "gelu_pytorch_tanh")))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: hidden_activation = %s is not computed by fsdpd for gemma3; "
                          "allowed: gelu_pytorch_tanh", path, act ? act : "?");
  static const char *const capping[] = {"attn_logit_softcapping", "final_logit_softcapping", NULL};
  for (int i = 0; capping[i]; i++) {
    const json_t *x = json_object_get(o, capping[i]);
    if (x && !json_is_null(x))
      return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s = %g soft-caps logits, which fsdpd does not compute; allowed: "
                            "null", path, capping[i], json_number_value(x));
  }
  TRY(hf_want_bool(o, path, "attention_bias", 0, "biases on q, k, v and o"));
  TRY(hf_want_bool(o, path, "use_bidirectional_attention", 0, "bidirectional attention"));
  TRY(hf_want_bool(o, path, "tie_word_embeddings", 1, "an lm_head apart from embed_tokens; Gemma 3 ties them"));
  double drop = llama_hf_num(o, "attention_dropout");
  if (!isnan(drop) && drop != 0)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: attention_dropout = %g is not computed by fsdpd; allowed: 0", path,
                          drop);
  return FSDP_OK;
}

/* The period P of LAYER_TYPES (layer l full_attention iff (l + 1) % P == 0; all sliding: L + 1), or
 * refused naming the first layer that breaks it. */
static fsdp_status pattern_of(const json_t *lt, const char *path, int L, int *p) {
  if (!json_is_array(lt) || (int)json_array_size(lt) != L)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: layer_types must be a list of num_hidden_layers = %d entries", path, L);
  int P = L + 1;
  for (int l = 0; l < L; l++) {
    const char *t = json_string_value(json_array_get(lt, (size_t)l));
    if (!t || (strcmp(t, "full_attention") && strcmp(t, "sliding_attention")))
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: layer_types[%d] = %s; allowed: full_attention, sliding_attention",
                            path, l, t ? t : "?");
    if (!strcmp(t, "full_attention") && P == L + 1) P = l + 1;
  }
  for (int l = 0; l < L; l++) {
    int full = !strcmp(json_string_value(json_array_get(lt, (size_t)l)), "full_attention");
    if (full != ((l + 1) % P == 0))
      return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: layer_types[%d] = %s breaks the period %d of its first "
                            "full_attention layer; fsdpd computes a periodic pattern (layer l global iff (l + 1) %% P "
                            "== 0); allowed: such a list, or sliding_window_pattern", path, l,
                            full ? "full_attention" : "sliding_attention", P);
  }
  *p = P > G3_MAX_PATTERN ? G3_MAX_PATTERN : P;
  return FSDP_OK;
}

/* The global layers' rope (FULL: its base and its scaling, default or linear) and the sliding layers'
 * base (SLIDE: unscaled), with transformers' precedence: the rope_parameters entry's own rope_theta,
 * else the legacy top-level key (rope_theta, rope_local_base_freq), else Gemma3TextConfig's default. */
static fsdp_status hf_rope(const json_t *o, const char *path, model_config *m) {
  const json_t *rp = json_object_get(o, "rope_parameters"), *sc = json_object_get(o, "rope_scaling");
  if (rp && !json_is_null(rp) && (!json_is_object(rp) || json_object_get(rp, "rope_type")))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: rope_parameters must be an object of full_attention and "
                          "sliding_attention (Gemma3TextConfig's)", path);
  const json_t *full = json_is_object(rp) ? json_object_get(rp, "full_attention") : NULL;
  const json_t *slide = json_is_object(rp) ? json_object_get(rp, "sliding_attention") : NULL;
  if (json_is_object(sc) && json_object_size(sc)) full = sc;   /* rope_scaling updates full_attention */
  double top = llama_hf_num(o, "rope_theta"), local = llama_hf_num(o, "rope_local_base_freq");
  double ft = llama_hf_num(full, "rope_theta"), st = llama_hf_num(slide, "rope_theta");
  if (full == sc && json_is_object(rp) && isnan(ft)) ft = llama_hf_num(json_object_get(rp, "full_attention"), "rope_theta");
  m->rope_theta = !isnan(ft) ? ft : !isnan(top) ? top : 1e6;
  m->ext[G3X_ROPE_LOCAL_THETA] = !isnan(st) ? st : !isnan(local) ? local : 10000;
  if (!(m->rope_theta > 0) || !(m->ext[G3X_ROPE_LOCAL_THETA] > 0))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: the rope bases must be positive numbers", path);
  if (slide && strcmp(llama_hf_rope_type(slide), "default"))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: rope_parameters.sliding_attention rope_type '%s' is not computed "
                          "by fsdpd; allowed: default (Gemma 3 scales its global layers only)", path,
                          llama_hf_rope_type(slide));
  const char *type = full ? llama_hf_rope_type(full) : "default";
  if (!strcmp(type, "default")) return FSDP_OK;
  if (strcmp(type, "linear"))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: the global layers' rope_type '%s' is not computed by fsdpd for "
                          "gemma3; allowed: default, linear", path, type);
  m->rope_scaling = ROPE_SCALING_LINEAR;
  return hf_get_num(full, path, "factor", NAN, &m->rope_factor);
}

static fsdp_status hf_parse(const json_t *o, const char *path, model_config *m) {
  m->arch = ARCH_GEMMA3;
  static const llama_hf_dflt dflt = {26, 8, 2304, 262208, 9216, 131072, 4};   /* Gemma3TextConfig's */
  TRY(refuse_others(o, path));
  TRY(llama_hf_shape(o, path, &dflt, m));
  TRY(hf_get_int(o, path, "head_dim", 256, &m->head_dim));
  TRY(hf_get_num(o, path, "rms_norm_eps", 1e-6, &m->norm_eps));
  TRY(hf_get_num(o, path, "query_pre_attn_scalar", 256, &m->ext[G3X_QUERY_PRE_ATTN_SCALAR]));
  /* pad_token_id (absent: Gemma3TextConfig's 0): the embedding's padding_idx, whose row the lookup's
   * gradient skips (model_gemma3.c), as nn.Embedding's */
  TRY(llama_hf_pad(o, path, 0, m));
  if (m->head_dim % 2)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: head_dim = %d is odd; allowed: an even head_dim (rotary pairs)", path,
                          m->head_dim);
  const json_t *w = json_object_get(o, "sliding_window");
  if (!w) m->sliding_window = 4096;   /* Gemma3TextConfig's default */
  else if (json_is_null(w)) m->sliding_window = 0;
  else if (json_is_integer(w) && json_integer_value(w) >= 1 && json_integer_value(w) <= G3_MAX_WINDOW)
    m->sliding_window = (int)json_integer_value(w);
  else
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: sliding_window must be null or an integer in 1..%d", path, G3_MAX_WINDOW);
  const json_t *lt = json_object_get(o, "layer_types");
  int P = 6;
  if (lt && !json_is_null(lt)) TRY(pattern_of(lt, path, m->n_layer, &P));
  else TRY(hf_get_int(o, path, "sliding_window_pattern", 6, &P));
  if (P > G3_MAX_PATTERN)
    return fsdp_set_error(FSDP_ERR_RANGE, "%s: sliding_window_pattern = %d; allowed: 1..%d", path, P, G3_MAX_PATTERN);
  m->ext[G3X_PATTERN] = P;
  m->tie_embeddings = 1;
  return hf_rope(o, path, m);
}

static json_t *window_json(const model_config *m) {
  return m->sliding_window > 0 ? json_integer(m->sliding_window) : json_null();
}

static json_t *full_rope_json(const model_config *m) {
  if (m->rope_scaling == ROPE_SCALING_LINEAR)
    return json_pack("{s:s, s:f, s:f}", "rope_type", "linear", "factor", m->rope_factor, "rope_theta", m->rope_theta);
  return json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta", m->rope_theta);
}

/* Gemma3TextConfig for a model that came from no folder: transformers 5's rope_parameters and
 * layer_types, and transformers 4's rope_theta, rope_local_base_freq, rope_scaling and
 * sliding_window_pattern saying the same. fsdpd's byte-level models have no special tokens. */
static json_t *hf_own_config(const model_config *m) {
  int npos = m->n_positions > 0 ? m->n_positions : m->seq_len;
  json_t *lt = json_array();
  for (int l = 0; lt && l < m->n_layer; l++)
    json_array_append_new(lt, json_string(gemma3_is_global(m, l) ? "full_attention" : "sliding_attention"));
  json_t *scaling = m->rope_scaling == ROPE_SCALING_LINEAR
                        ? json_pack("{s:s, s:f}", "rope_type", "linear", "factor", m->rope_factor) : json_null();
  return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s, s:f, s:o, s:o, s:i, "
                   "s:{s:o, s:{s:s, s:f}}, s:f, s:f, s:o, s:b, s:b, s:n, s:n, s:f, s:f, s:n, s:n, s:o}",
                   "architectures", "Gemma3ForCausalLM", "model_type", "gemma3_text", "hidden_size", m->n_embd,
                   "intermediate_size", m->ffn_dim, "num_attention_heads", m->n_head, "num_key_value_heads",
                   m->n_kv_head, "head_dim", gemma3_head_dim(m), "num_hidden_layers", m->n_layer, "vocab_size",
                   m->vocab_size, "max_position_embeddings", npos, "rms_norm_eps", m->norm_eps, "hidden_activation",
                   "gelu_pytorch_tanh", "query_pre_attn_scalar", gemma3_qpas(m), "sliding_window", window_json(m),
                   "layer_types", lt, "sliding_window_pattern", gemma3_pattern(m), "rope_parameters",
                   "full_attention", full_rope_json(m), "sliding_attention", "rope_type", "default", "rope_theta",
                   gemma3_local_theta(m), "rope_theta", m->rope_theta, "rope_local_base_freq", gemma3_local_theta(m),
                   "rope_scaling", scaling, "tie_word_embeddings", 1, "attention_bias", 0, "attn_logit_softcapping",
                   "final_logit_softcapping", "initializer_range", 0.02, "attention_dropout", 0.0, "bos_token_id",
                   "eos_token_id", "pad_token_id", m->pad_token_id >= 0 ? json_integer(m->pad_token_id) : json_null());
}

static const arch_hf_key hf_keys[] = {
  LLAMA_HF_KEYS_SHAPE,
  {"rope_factor", "factor"},
  {"head_dim", "head_dim"},
  {"sliding_window", "sliding_window"},
  {"query_pre_attn_scalar", "query_pre_attn_scalar"},
  {"rope_local_base_freq", "rope_local_base_freq"},
  {"sliding_window_pattern", "sliding_window_pattern"},
  {"pad_token_id", "pad_token_id"},
  {NULL, NULL},
};

/* ---- weights files ---- */

/* Its head is always embed_tokens: a file's lm_head.weight, equal or not, is st_tied_head's. */
static fsdp_status file_check(const plan_t *p, const char *path, int (*has)(const void *, const char *), const void *f) {
  return (void)p, (void)path, (void)has, (void)f, FSDP_OK;
}

static fsdp_status missing(const plan_t *p, const char *name, const char *where) { return (void)p, (void)name, (void)where, FSDP_OK; }

/* ---- checkpoints, plan output: the Llama family's, and the window ---- */

static void model_json(json_t *jm, const model_config *m) {
  llama_model_json_shape(jm, m);
  json_object_set_new(jm, "sliding_window", window_json(m));
  json_object_set_new(jm, "pad_token_id", json_integer(m->pad_token_id));
}

static int manifest_fix(model_config *m) {
  m->tie_embeddings = 1;
  return m->n_kv_head < 1 || m->ffn_dim < 1 ? -1 : 0;
}

/* head_dim and pad_token_id as the family's (whose canonical() is then Gemma 3's), and the window */
static void manifest_read(const json_t *jm, model_config *m) {
  llama_manifest_read(jm, m);
  json_int_t w = json_integer_value(json_object_get(jm, "sliding_window"));
  m->sliding_window = w > 0 && w <= G3_MAX_WINDOW ? (int)w : 0;
}

static int same_model(const model_config *a, const model_config *b) {
  return llama_same_model(a, b) && a->sliding_window == b->sliding_window && a->pad_token_id == b->pad_token_id;
}

static void describe(const model_config *m, char *buf, size_t n) {
  char rope[48];
  llama_rope_text(m, rope, sizeof rope);
  snprintf(buf, n, ", norm_eps %g, rope_theta %g, head_dim %d, sliding_window %d, rope_scaling %s", m->norm_eps,
           m->rope_theta, gemma3_head_dim(m), m->sliding_window, rope);
}

static void print_model(const model_config *m, FILE *f) {
  llama_print_shape(m, f);
  fprintf(f, "          tied: lm_head is model.embed_tokens.weight; norms (1 + w); attention scale "
          "query_pre_attn_scalar^-1/2 = %g^-1/2\n", gemma3_qpas(m));
  fprintf(f, "          layer l global iff (l + 1) %% %d == 0: full causal attention, rope theta %g", gemma3_pattern(m),
          m->rope_theta);
  if (m->rope_scaling == ROPE_SCALING_LINEAR) fprintf(f, " linear factor %g", m->rope_factor);
  fprintf(f, "; others sliding window %d, rope theta %g unscaled\n", m->sliding_window, gemma3_local_theta(m));
}

/* q|k|v run as one linear of rows NH·HD + 2·KV wide, gate|up as one of 2F (model_gemma3.c), as Llama's. */
static int lora_modules(const model_config *m, arch_lora_module *o) {
  static const int slot[7] = {G3_Q, G3_K, G3_V, G3_O, G3_GATE, G3_UP, G3_DOWN};
  return llama_lora_modules_at(m, slot, o);
}

static const char *params_note(const model_config *m) { return (void)m, "the tied embed_tokens counted once"; }
static const char *no_emb_label(const model_config *m) { return (void)m, "Ψ without embed_tokens"; }
static const char *flops_formula(const model_config *m) {
  return (void)m, "6·Ψ + 12·H·HD·T·(global layers + local ones × their window's share of the scores)";
}

static const char *const job_keys[] = {"n_kv_head", "ffn_dim", "norm_eps", "rope_theta", "rope_scaling", "rope_factor",
                                       "head_dim", "sliding_window", "pad_token_id", NULL};
static const arch_ext_key ext_keys[] = {
  [G3X_QUERY_PRE_ATTN_SCALAR] = {"query_pre_attn_scalar", ARCH_EXT_DOUBLE, 0, 1e9, 1, "256",
                                 "attention scores are scaled by query_pre_attn_scalar^-1/2 (Gemma 3 1B..27B: 256)"},
  [G3X_ROPE_LOCAL_THETA] = {"rope_local_base_freq", ARCH_EXT_DOUBLE, 1, 1e9, 0, "10000",
                            "the sliding-window layers' rotary base, unscaled (rope_theta is the global layers')"},
  [G3X_PATTERN] = {"sliding_window_pattern", ARCH_EXT_INT, 1, G3_MAX_PATTERN, 0, "6",
                   "layer l attends globally iff (l + 1) is a multiple of it, else in sliding_window (Gemma 3: 6)"},
  [G3X_N] = {NULL, ARCH_EXT_INT, 0, 0, 0, NULL, NULL},
};
static const char *const probe_names[] = {"layers.0.pre_feedforward_layernorm.weight", NULL};

const arch_desc gemma3_arch = {
  .id = ARCH_GEMMA3,
  .name = "gemma3",
  .hf_model_type = "gemma3_text",
  .job_keys = job_keys,
  .why_not = "it is not a Gemma 3 setting",
  .ext_keys = ext_keys,
  .always_tied = 1,
  .tied_why = "Gemma 3's output head is always its embed_tokens",
  .tie_pair = {"model.embed_tokens.weight", "lm_head.weight"},
  .rotary = 1,
  .hf_keys = hf_keys,
  .hf_parse = hf_parse,
  .hf_own_config = hf_own_config,
  .root_numel = root_numel,
  .block_numel = block_numel,
  .n_decay = n_decay,
  .lookup_numel = lookup_numel,
  .embed_numel = embed_numel,
  .act = gemma3_act,   /* gemma3.h: what model_gemma3.c keeps, to the byte */
  .attn_dim = llama_attn_dim,
  .attn_window = attn_window,
  .check = check,
  .canonical = canonical,
  .units = units,
  .find = llama_find,
  .head_slot = head_slot,
  .probe_names = probe_names,
  .file_desc = "a Gemma 3 model (model.layers.0.pre_feedforward_layernorm.weight, …)",
  .reads = "model.embed_tokens.weight, model.layers.0.…",
  .file_check = file_check,
  .missing = missing,
  .model_json = model_json,
  .manifest_fix = manifest_fix,
  .manifest_read = manifest_read,
  .same_model = same_model,
  .describe = describe,
  .print_model = print_model,
  .params_note = params_note,
  .no_emb_label = no_emb_label,
  .flops_formula = flops_formula,
  .block_prefix = "layers",
  .layout = "nn.Linear [out, in]",
  .name_width = 49,
  .lora_default = "q_proj,v_proj",
  .lora_block_hf = "model.layers.%d.",
  .lora_modules = lora_modules,
};
