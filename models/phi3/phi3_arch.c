/* phi3_arch — Phi-3's descriptor (arch.h): Hugging Face Phi3ForCausalLM, a Llama whose q, k and v
 * are one tensor (self_attn.qkv_proj.weight [(NH + 2·NKV)·HS, C], rows q | k | v) and gate and up
 * one (mlp.gate_up_proj.weight [2F, C], rows gate | up), and whose rotary scaling is "longrope".
 *
 * fsdpd keeps Llama's units (llama.h's slots: q, k, v adjacent in the flat buffer, and gate, up),
 * so each fused tensor is exactly the span of its parts (plan_tensor.hf_rows): read into the slots
 * as it lies, written back whole. It is a Llama family member (llama_family.h's LLAMA_FAMILY_DESC):
 * the plan terms, the checks, the head tied or not, the forward and backward (model_phi3.c) are
 * Llama's; only what differs is here. [lora] adapts the fused projections whole, as peft adapts
 * Phi3ForCausalLM's nn.Linear modules (lora_modules below); peft has no default targets for phi3, so
 * neither has fsdpd: a job names them.
 *
 * config.json (Phi3Config, transformers 4 and 5): Llama's keys with Phi3Config's defaults
 * (max_position_embeddings 4096, rms_norm_eps 1e-5), and the rope: none, or longrope (transformers 4's
 * "su" and "yarn" mean it too) within the pretraining context: fsdpd computes the short factors and the
 * attention factor (seq_len <= original_max_position_embeddings); the long factors only exist beyond
 * it, which is refused. Dropout, a partial rotary factor and a sliding window narrower than the
 * model's positions are refused: fsdpd would compute another model.
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

#define PHI3_PREFIX "model."

static int head_size(const model_config *m) { return m->n_embd / m->n_head; }
static int64_t kv_dim(const model_config *m) { return (int64_t)m->n_kv_head * head_size(m); }

/* M without its longrope (Llama's functions know none; the caller handles it) */
static model_config unscaled(const model_config *m) {
  model_config u = *m;
  if (u.rope_scaling == ROPE_SCALING_LONGROPE) {
    u.rope_scaling = ROPE_SCALING_NONE;
    u.rope_original_max_pos = 0;
  }
  return u;
}

static fsdp_status check(const model_config *m) {
  model_config u = unscaled(m);
  TRY(llama_check(&u));
  if (m->rope_scaling != ROPE_SCALING_NONE && m->rope_scaling != ROPE_SCALING_LONGROPE)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "rope_scaling %s is not Phi-3's; allowed with arch = phi3: none | "
                          "longrope", jobspec_rope_scaling_name(m->rope_scaling));
  if (m->rope_scaling != ROPE_SCALING_LONGROPE) return FSDP_OK;
  int half = head_size(m) / 2;
  if (m->rope_short_factor.n != half)
    return fsdp_set_error(FSDP_ERR_INVALID, "longrope has %d short factors; allowed: one per rotary frequency, head "
                          "size / 2 = %d", m->rope_short_factor.n, half);
  if (!(m->rope_attention_factor > 0 && m->rope_attention_factor <= 1e6))
    return fsdp_set_error(FSDP_ERR_RANGE, "longrope attention_factor %g is out of range; allowed: 0 < factor <= 1e6",
                          m->rope_attention_factor);
  if (m->rope_original_max_pos < 1 || m->seq_len > m->rope_original_max_pos)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "seq_len = %d is above longrope's original_max_position_embeddings = %d: "
                          "transformers switches to the long factors there, which fsdpd does not compute; allowed: "
                          "seq_len <= %d", m->seq_len, m->rope_original_max_pos, m->rope_original_max_pos);
  return FSDP_OK;
}

/* ---- units: Llama's slots, the fused tensors' parts ---- */

static void units(plan_t *p) {
  const model_config *m = &p->model;
  int64_t C = m->n_embd, F = m->ffn_dim, KV = kv_dim(m), V = m->vocab_size, Q = C + 2 * KV;
  plan_unit *r = &p->units[0];
  snprintf(r->name, sizeof r->name, "root");
  plan_add_tensor(r, "model.embed_tokens.weight", LROOT_EMBED, V, C);
  plan_add_tensor(r, "model.norm.weight", LROOT_NORM, C, 0);
  if (!m->tie_embeddings) plan_add_tensor(r, "lm_head.weight", LROOT_HEAD, V, C);
  const llama_slots sl = llama_slots_of(m);   /* Llama's layer without its optional tensors */
  for (int i = 0; i < m->n_layer; i++) {
    plan_unit *u = &p->units[1 + i];
    snprintf(u->name, sizeof u->name, "layers.%hu", (unsigned short)i);   /* i < 512 */
    char name[96];
    int gid = LROOT_NT + sl.n * i;
#define NAME(s) (snprintf(name, sizeof name, PHI3_PREFIX "layers.%d.%s", i, s), name)
    plan_add_tensor(u, NAME("input_layernorm.weight"), gid + sl.at[LBLK_LN1_W], C, 0);
    plan_add_part(u, NAME("self_attn.qkv_proj.weight"), gid + sl.at[LBLK_Q], C, C, Q, 0);
    plan_add_part(u, name, gid + sl.at[LBLK_K], KV, C, Q, C);
    plan_add_part(u, name, gid + sl.at[LBLK_V], KV, C, Q, C + KV);
    plan_add_tensor(u, NAME("self_attn.o_proj.weight"), gid + sl.at[LBLK_O], C, C);
    plan_add_tensor(u, NAME("post_attention_layernorm.weight"), gid + sl.at[LBLK_LN2_W], C, 0);
    plan_add_part(u, NAME("mlp.gate_up_proj.weight"), gid + sl.at[LBLK_GATE], F, C, 2 * F, 0);
    plan_add_part(u, name, gid + sl.at[LBLK_UP], F, C, 2 * F, F);
    plan_add_tensor(u, NAME("mlp.down_proj.weight"), gid + sl.at[LBLK_DOWN], C, F);
#undef NAME
  }
}

/* ---- LoRA: peft's modules ---- */

/* peft wraps qkv_proj and gate_up_proj as single nn.Linear modules, so each fused projection has one
 * adapter: A [r, C] and B [Q, r] over all of q|k|v's columns, A [r, C] and B [2F, r] over gate|up's
 * (the columns the fused weight writes in the order of its rows: llama.h's q, k, v and gate, up slots,
 * adjacent). Each sits at its first part's slot: Llama's forward calls the verbs at every part's slot
 * and finds none at the others. */
static int lora_modules(const model_config *m, arch_lora_module *o) {
  int64_t C = m->n_embd, F = m->ffn_dim, Q = C + 2 * kv_dim(m);
  o[0] = (arch_lora_module){"self_attn.qkv_proj", LBLK_Q, C, Q, 0, Q};
  o[1] = (arch_lora_module){"self_attn.o_proj", LBLK_O, C, C, 0, C};
  o[2] = (arch_lora_module){"mlp.gate_up_proj", LBLK_GATE, C, 2 * F, 0, 2 * F};
  o[3] = (arch_lora_module){"mlp.down_proj", LBLK_DOWN, F, C, 0, C};
  return 4;
}

/* ---- config.json: Phi3Config ---- */

/* Phi3Config's: rope_scaling (legacy) over rope_parameters; "su" and "yarn" are longrope. */
static const json_t *rope_object(const json_t *o, const char **where) {
  const json_t *sc = json_object_get(o, "rope_scaling"), *rp = json_object_get(o, "rope_parameters");
  *where = "rope_scaling";
  if (json_is_object(sc) && json_object_size(sc)) return sc;
  *where = "rope_parameters";
  return json_is_object(rp) ? rp : NULL;
}

static const char *rope_type_of(const json_t *r) {
  const char *t = llama_hf_rope_type(r);
  return !strcmp(t, "su") || !strcmp(t, "yarn") ? "longrope" : t;
}

/* What Phi3ForCausalLM computes and fsdpd does not: refused, naming the key. */
static fsdp_status refuse_others(const json_t *o, const json_t *rope, const char *path) {
  double prf = llama_hf_num(rope, "partial_rotary_factor");
  if (isnan(prf)) prf = llama_hf_num(o, "partial_rotary_factor");
  if (!isnan(prf) && prf != 1)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: partial_rotary_factor = %g rotates part of each head, which fsdpd "
                          "does not compute; allowed: 1 (or absent)", path, prf);
  const json_t *sw = json_object_get(o, "sliding_window");
  int npos = 4096;
  TRY(hf_get_int(o, path, "max_position_embeddings", 4096, &npos));
  if (sw && !json_is_null(sw) && (!json_is_integer(sw) || json_integer_value(sw) < npos))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: sliding_window = %lld is narrower than max_position_embeddings = %d; "
                          "fsdpd's phi3 computes full causal attention; allowed: null or at least %d", path,
                          (long long)json_integer_value(sw), npos, npos);
  return FSDP_OK;
}

/* N numbers of array KEY of R into OUT (NULL: only check), or refused naming it. */
static fsdp_status factor_list(const json_t *r, const char *path, const char *where, const char *key, int n,
                               rope_factor_list *out) {
  const json_t *a = json_object_get(r, key);
  if (!json_is_array(a) || (int)json_array_size(a) != n)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s.%s must be a list of %d numbers (head size / 2), as Phi3Config "
                          "requires", path, where, key, n);
  for (int i = 0; i < n; i++) {
    const json_t *x = json_array_get(a, (size_t)i);
    if (!json_is_number(x) || !(json_number_value(x) > 0) || json_number_value(x) > 1e6)
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s.%s[%d] must be a number > 0 and <= 1e6", path, where, key, i);
    if (out) out->v[i] = json_number_value(x);
  }
  if (out) out->n = n;
  return FSDP_OK;
}

/* longrope of R (WHERE names it) as _compute_longrope_parameters computes it for seq_len <= original:
 * original_max_position_embeddings is the top-level one (Phi3Config keeps it there; standardize_rope_params
 * gives it priority), factor the rope's or max_position_embeddings / original, attention_factor the
 * rope's or sqrt(1 + ln factor / ln original) when factor > 1, else 1. */
static fsdp_status longrope_of(const json_t *o, const json_t *r, const char *path, const char *where, model_config *m) {
  int half = (m->n_embd / m->n_head) / 2, npos = m->n_positions, orig;
  TRY(hf_get_int(o, path, "original_max_position_embeddings", -1, &orig));
  TRY(factor_list(r, path, where, "short_factor", half, &m->rope_short_factor));
  TRY(factor_list(r, path, where, "long_factor", half, NULL));
  double factor = llama_hf_num(r, "factor"), af = llama_hf_num(r, "attention_factor");
  if (isnan(factor)) factor = (double)npos / orig;
  if (isnan(af)) af = factor <= 1.0 ? 1.0 : sqrt(1 + log(factor) / log((double)orig));
  if (!(af > 0 && af <= 1e6))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s.attention_factor = %g; allowed: a number > 0 and <= 1e6", path, where,
                          af);
  m->rope_scaling = ROPE_SCALING_LONGROPE;
  m->rope_original_max_pos = orig;
  m->rope_attention_factor = af;
  return FSDP_OK;
}

/* Llama's reader over a copy of O with Phi3Config's defaults and without the longrope (read here):
 * the shapes, the head tied or not, the activation, the base with transformers' precedence. */
static fsdp_status hf_parse(const json_t *o, const char *path, model_config *m) {
  const char *where;
  const json_t *rope = rope_object(o, &where);
  TRY(refuse_others(o, rope, path));
  const char *type = rope ? rope_type_of(rope) : "default";
  if (strcmp(type, "default") && strcmp(type, "longrope"))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s rope_type '%s' is not computed by fsdpd for phi3; allowed: "
                          "default, longrope", path, where, type);
  json_t *c = json_deep_copy(o);
  if (!c) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", path);
  if (!json_object_get(c, "max_position_embeddings")) json_object_set_new(c, "max_position_embeddings", json_integer(4096));
  if (!json_object_get(c, "rms_norm_eps")) json_object_set_new(c, "rms_norm_eps", json_real(1e-5));
  if (rope && !strcmp(type, "longrope")) {   /* Llama's reader sees only the base: the rope object's, or the top level's */
    double own = llama_hf_num(rope, "rope_theta"), top = llama_hf_num(o, "rope_theta");
    fsdp_status rc = FSDP_OK;
    if (!isnan(own) && !isnan(top) && own != top)
      rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s has rope_theta %g but the top-level rope_theta is %g; allowed: "
                          "one base (remove one of them, or make them equal)", path, where, own, top);
    json_object_del(c, "rope_scaling");
    json_object_set_new(c, "rope_parameters", json_pack("{s:s}", "rope_type", "default"));
    if (!isnan(own)) json_object_set_new(c, "rope_theta", json_real(own));
    if (rc != FSDP_OK) {
      json_decref(c);
      return rc;
    }
  }
  m->arch = ARCH_PHI3;
  fsdp_status rc = llama_hf_parse_common(c, path, 0, m);
  json_decref(c);
  TRY(rc);
  return rope && !strcmp(type, "longrope") ? longrope_of(o, rope, path, where, m) : FSDP_OK;
}

static json_t *factors_json(const rope_factor_list *l) {
  json_t *a = json_array();
  for (int i = 0; a && i < l->n; i++) json_array_append_new(a, json_real(l->v[i]));
  return a;
}

/* M's longrope as Phi3Config writes it; JSON null when unscaled. The long factors are the short
 * ones: fsdpd trains within the original context, where transformers reads only those. */
static json_t *rope_scaling_json(const model_config *m) {
  if (m->rope_scaling != ROPE_SCALING_LONGROPE) return json_null();
  return json_pack("{s:s, s:o, s:o, s:f}", "rope_type", "longrope", "short_factor", factors_json(&m->rope_short_factor),
                   "long_factor", factors_json(&m->rope_short_factor), "attention_factor", m->rope_attention_factor);
}

/* Phi3Config for a model that came from no folder: Llama's, renamed, with the fused names' class. */
static json_t *hf_own_config(const model_config *m) {
  json_t *o = llama_own_config(m, "Phi3ForCausalLM", "phi3");
  if (!o) return NULL;
  json_object_set_new(o, "rope_scaling", rope_scaling_json(m));
  int npos = m->n_positions > 0 ? m->n_positions : m->seq_len;
  json_object_set_new(o, "original_max_position_embeddings",
                      json_integer(m->rope_scaling == ROPE_SCALING_LONGROPE ? m->rope_original_max_pos : npos));
  json_object_set_new(o, "resid_pdrop", json_real(0));
  json_object_set_new(o, "embd_pdrop", json_real(0));
  json_object_set_new(o, "attention_dropout", json_real(0));
  json_object_set_new(o, "sliding_window", json_null());
  return o;
}

/* Phi3ForCausalLM's: after the embeddings, on the attention weights, on each residual branch */
static const arch_dropout dropout[] = {{"embd_pdrop", 0}, {"attention_dropout", 0}, {"resid_pdrop", 0}, {NULL, 0}};

static const arch_hf_key hf_keys[] = {
  LLAMA_HF_KEYS_SHAPE,
  {"rope_original_max_position_embeddings", "original_max_position_embeddings"},
  {"rope_attention_factor", "attention_factor"},
  {"pad_token_id", "pad_token_id"},
  {NULL, NULL},
};

/* ---- checkpoints, plan output: Llama's, and the longrope ---- */

static void model_json(json_t *jm, const model_config *m) {
  model_config u = unscaled(m);
  llama_model_json(jm, &u);
  if (m->rope_scaling == ROPE_SCALING_LONGROPE) {   /* beside rope_scaling, which a manifest reads as llama3's */
    json_t *r = rope_scaling_json(m);
    json_object_set_new(r, "original_max_position_embeddings", json_integer(m->rope_original_max_pos));
    json_object_set_new(jm, "rope_longrope", r);
  }
}

static int same_model(const model_config *a, const model_config *b) {
  model_config ua = unscaled(a), ub = unscaled(b);
  if (!llama_same_model(&ua, &ub) || a->rope_scaling != b->rope_scaling) return 0;
  if (a->rope_scaling != ROPE_SCALING_LONGROPE) return 1;
  return a->rope_attention_factor == b->rope_attention_factor && a->rope_original_max_pos == b->rope_original_max_pos &&
         a->rope_short_factor.n == b->rope_short_factor.n &&
         !memcmp(a->rope_short_factor.v, b->rope_short_factor.v, sizeof a->rope_short_factor.v[0] * (size_t)a->rope_short_factor.n);
}

static void describe(const model_config *m, char *buf, size_t n) {
  model_config u = unscaled(m);
  llama_describe(&u, buf, n);
  size_t k = strlen(buf);
  if (m->rope_scaling == ROPE_SCALING_LONGROPE && k + 4 < n && k >= 4 && !strcmp(buf + k - 4, "none"))
    snprintf(buf + k - 4, n - (k - 4), "longrope (%d short factors, attention_factor %g, "
             "original_max_position_embeddings %d)", m->rope_short_factor.n, m->rope_attention_factor,
             m->rope_original_max_pos);
}

static void print_model(const model_config *m, FILE *f) {
  fprintf(f, "  KV=%d  F=%d  eps=%g  theta=%g\n", m->n_kv_head, m->ffn_dim, m->norm_eps, m->rope_theta);
  fprintf(f, "          %s; qkv_proj and gate_up_proj fused", m->tie_embeddings
          ? "tied: lm_head is model.embed_tokens.weight (one tensor, both uses)" : "untied: lm_head.weight is its own tensor");
  if (m->rope_scaling == ROPE_SCALING_LONGROPE)
    fprintf(f, "; rope longrope short factors %g..%g (%d), attention_factor %g, original_max_position_embeddings %d\n",
            m->rope_short_factor.v[0], m->rope_short_factor.v[m->rope_short_factor.n - 1], m->rope_short_factor.n,
            m->rope_attention_factor, m->rope_original_max_pos);
  else
    fprintf(f, "; rope unscaled\n");
}

static const char *const job_keys[] = {"n_kv_head", "ffn_dim", "norm_eps", "rope_theta", "rope_scaling",
                                       "rope_original_max_position_embeddings", "rope_short_factor",
                                       "rope_attention_factor", "pad_token_id", NULL};
static const char *const probe_names[] = {"layers.0.self_attn.qkv_proj.weight", NULL};

/* Llama's choices Phi-3 never makes: biases, q/k norms; its head size is n_embd / n_head. */
static void canonical(model_config *m) {
  llama_canonical_head_dim(m);
  m->attention_bias = 0;
  m->qkv_bias = 0;
  m->mlp_bias = 0;
  m->qk_norm = 0;
}

/* The family's entries, then Phi-3's own: a later designator replaces the family's. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
const arch_desc phi3_arch = {
  LLAMA_FAMILY_DESC,
  .id = ARCH_PHI3,
  .name = "phi3",
  .hf_model_type = "phi3",
  .job_keys = job_keys,
  .why_not = "it is not a Phi-3 setting",
  .hf_keys = hf_keys,
  .hf_parse = hf_parse,
  .dropout = dropout,
  .hf_own_config = hf_own_config,
  .check = check,
  .canonical = canonical,
  .units = units,
  .probe_names = probe_names,
  .file_desc = "a Phi-3 model (model.layers.0.self_attn.qkv_proj.weight, fused q|k|v and gate|up)",
  .reads = "model.embed_tokens.weight, model.layers.0.self_attn.qkv_proj.weight, mlp.gate_up_proj.weight, …",
  .model_json = model_json,
  .same_model = same_model,
  .describe = describe,
  .print_model = print_model,
  .lora_default = NULL,   /* peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING has no phi3 */
  .lora_modules = lora_modules,
};
#pragma GCC diagnostic pop
