/* hfconfig — config.json in and out; see hfconfig.h. */
#include "hfconfig.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"

#define HF_MAX_INT 16777216
#define HF_MAX_CONFIG ((size_t)16 << 20)   /* a config.json is kilobytes */

/* [model] keys and the config keys that carry them, per architecture. */
static const struct { const char *ini, *gpt2, *llama; } key_map[] = {
  {"arch", "model_type", "model_type"},
  {"n_layer", "n_layer", "num_hidden_layers"},
  {"n_head", "n_head", "num_attention_heads"},
  {"n_embd", "n_embd", "hidden_size"},
  {"vocab_size", "vocab_size", "vocab_size"},
  {"n_positions", "n_positions", "max_position_embeddings"},
  {"n_kv_head", NULL, "num_key_value_heads"},
  {"ffn_dim", NULL, "intermediate_size"},
  {"norm_eps", NULL, "rms_norm_eps"},
  {"rope_theta", NULL, "rope_theta"},
  {"tie_word_embeddings", "tie_word_embeddings", "tie_word_embeddings"},
  {"rope_scaling", NULL, "rope_type"},
  {"rope_factor", NULL, "factor"},
  {"rope_low_freq_factor", NULL, "low_freq_factor"},
  {"rope_high_freq_factor", NULL, "high_freq_factor"},
  {"rope_original_max_position_embeddings", NULL, "original_max_position_embeddings"},
};

const char *hf_config_key(model_arch arch, const char *key) {
  for (size_t i = 0; i < sizeof key_map / sizeof key_map[0]; i++)
    if (!strcmp(key_map[i].ini, key)) return arch == ARCH_LLAMA ? key_map[i].llama : key_map[i].gpt2;
  return NULL;
}

/* ---- reading ---- */

static fsdp_status get_int(const json_t *o, const char *path, const char *key, int dflt, int *v) {
  json_t *x = json_object_get(o, key);
  if (!x || json_is_null(x)) {
    if (dflt < 0) return fsdp_set_error(FSDP_ERR_FORMAT, "%s has no %s; a positive integer is required", path, key);
    *v = dflt;
    return FSDP_OK;
  }
  if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > HF_MAX_INT)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s must be an integer in 1..%d", path, key, HF_MAX_INT);
  *v = (int)json_integer_value(x);
  return FSDP_OK;
}

static fsdp_status get_num(const json_t *o, const char *path, const char *key, double dflt, double *v) {
  json_t *x = json_object_get(o, key);
  if (!x || json_is_null(x)) {
    if (isnan(dflt)) return fsdp_set_error(FSDP_ERR_FORMAT, "%s has no %s; a number is required", path, key);
    *v = dflt;
    return FSDP_OK;
  }
  if (!json_is_number(x) || !(json_number_value(x) > 0))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s must be a positive number", path, key);
  *v = json_number_value(x);
  return FSDP_OK;
}

/* A boolean KEY that must be WANT (absent is fine): what fsdpd computes. */
static fsdp_status want_bool(const json_t *o, const char *path, const char *key, int want, const char *why) {
  json_t *x = json_object_get(o, key);
  if (!x || json_is_null(x) || (json_is_boolean(x) && json_boolean_value(x) == want)) return FSDP_OK;
  return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s = %s is not computed by fsdpd (%s); allowed: %s", path, key,
                        json_is_boolean(x) ? (json_boolean_value(x) ? "true" : "false") : "not a boolean", why,
                        want ? "true" : "false");
}

/* The rotary base and scaling: transformers 5's rope_parameters, or 4's rope_theta and rope_scaling. */
static fsdp_status llama_rope(const json_t *o, const char *path, model_config *m) {
  const json_t *rp = json_object_get(o, "rope_parameters");
  const char *where = "rope_parameters";
  if (!json_is_object(rp)) rp = NULL;
  TRY(get_num(rp ? rp : o, path, "rope_theta", 10000, &m->rope_theta));
  const json_t *sc = rp;
  if (!sc) {
    sc = json_object_get(o, "rope_scaling");
    where = "rope_scaling";
    if (!sc || json_is_null(sc)) return FSDP_OK;
    if (!json_is_object(sc)) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: rope_scaling must be null or an object", path);
  }
  const char *type = json_string_value(json_object_get(sc, "rope_type"));
  if (!type) type = json_string_value(json_object_get(sc, "type"));
  if (!type || !strcmp(type, "default")) return FSDP_OK;
  if (strcmp(type, "llama3"))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s rope_type '%s' is not computed by fsdpd; allowed: default, "
                          "llama3", path, where, type);
  m->rope_scaling = ROPE_SCALING_LLAMA3;
  TRY(get_num(sc, path, "factor", NAN, &m->rope_factor));
  TRY(get_num(sc, path, "low_freq_factor", NAN, &m->rope_low_freq_factor));
  TRY(get_num(sc, path, "high_freq_factor", NAN, &m->rope_high_freq_factor));
  return get_int(sc, path, "original_max_position_embeddings", -1, &m->rope_original_max_pos);
}

static fsdp_status parse_llama(const json_t *o, const char *path, model_config *m) {
  m->arch = ARCH_LLAMA;
  TRY(get_int(o, path, "num_hidden_layers", -1, &m->n_layer));
  TRY(get_int(o, path, "num_attention_heads", -1, &m->n_head));
  TRY(get_int(o, path, "hidden_size", -1, &m->n_embd));
  TRY(get_int(o, path, "vocab_size", -1, &m->vocab_size));
  TRY(get_int(o, path, "intermediate_size", -1, &m->ffn_dim));
  TRY(get_int(o, path, "max_position_embeddings", 2048, &m->n_positions));
  TRY(get_int(o, path, "num_key_value_heads", m->n_head, &m->n_kv_head));
  TRY(get_num(o, path, "rms_norm_eps", 1e-6, &m->norm_eps));
  json_t *tie = json_object_get(o, "tie_word_embeddings");
  m->tie_embeddings = json_is_true(tie);
  json_t *hd = json_object_get(o, "head_dim"), *act = json_object_get(o, "hidden_act");
  if (hd && !json_is_null(hd) && (!json_is_integer(hd) || json_integer_value(hd) * m->n_head != m->n_embd))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: head_dim = %lld is not computed by fsdpd; allowed: hidden_size / "
                          "num_attention_heads = %d", path, (long long)json_integer_value(hd), m->n_embd / m->n_head);
  if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: hidden_act = %s is not computed by fsdpd; allowed: silu (SwiGLU)",
                          path, json_is_string(act) ? json_string_value(act) : "?");
  TRY(want_bool(o, path, "attention_bias", 0, "Llama without biases"));
  TRY(want_bool(o, path, "mlp_bias", 0, "Llama without biases"));
  return llama_rope(o, path, m);
}

static fsdp_status parse_gpt2(const json_t *o, const char *path, model_config *m) {
  m->arch = ARCH_GPT2;
  TRY(get_int(o, path, "n_layer", -1, &m->n_layer));
  TRY(get_int(o, path, "n_head", -1, &m->n_head));
  TRY(get_int(o, path, "n_embd", -1, &m->n_embd));
  TRY(get_int(o, path, "vocab_size", -1, &m->vocab_size));
  TRY(get_int(o, path, "n_positions", 1024, &m->n_positions));
  m->n_kv_head = m->n_head;   /* tie_embeddings stays 0: it is Llama's choice; GPT-2 always ties */
  int inner;
  double eps;
  TRY(get_int(o, path, "n_inner", 4 * m->n_embd, &inner));
  TRY(get_num(o, path, "layer_norm_epsilon", 1e-5, &eps));
  if (inner != 4 * m->n_embd)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: n_inner = %d is not computed by fsdpd; allowed: null or 4 x n_embd "
                          "= %d", path, inner, 4 * m->n_embd);
  if (fabs(eps - 1e-5) > 1e-12)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: layer_norm_epsilon = %g is not computed by fsdpd; allowed: 1e-05",
                          path, eps);
  json_t *act = json_object_get(o, "activation_function");
  const char *a = json_string_value(act);
  if (act && !json_is_null(act) && (!a || (strcmp(a, "gelu_new") && strcmp(a, "gelu_pytorch_tanh"))))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: activation_function = %s is not computed by fsdpd; allowed: "
                          "gelu_new, gelu_pytorch_tanh (GELU's tanh approximation)", path, a ? a : "?");
  TRY(want_bool(o, path, "scale_attn_weights", 1, "attention scores divided by sqrt(head size)"));
  TRY(want_bool(o, path, "scale_attn_by_inverse_layer_idx", 0, "the same attention scale in every layer"));
  return want_bool(o, path, "tie_word_embeddings", 1, "GPT-2's head is wte");
}

fsdp_status hf_config_parse(const json_t *o, const char *path, hf_config *out) {
  memset(out, 0, sizeof *out);
  if (!json_is_object(o)) return fsdp_set_error(FSDP_ERR_FORMAT, "%s is not a JSON object", path);
  const char *type = json_string_value(json_object_get(o, "model_type"));
  if (!type)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s has no model_type; allowed: gpt2, llama (a config.json as "
                          "save_pretrained writes it)", path);
  model_config *m = &out->model;
  m->rope_factor = 8, m->rope_low_freq_factor = 1, m->rope_high_freq_factor = 4, m->rope_original_max_pos = 8192;
  if (!strcmp(type, "llama")) TRY(parse_llama(o, path, m));
  else if (!strcmp(type, "gpt2")) TRY(parse_gpt2(o, path, m));
  else
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: model_type '%s' is not a model fsdpd computes; allowed: gpt2, "
                          "llama", path, type);
  if (m->n_embd % m->n_head)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: the hidden size %d is not a multiple of the %d heads", path, m->n_embd,
                          m->n_head);
  const char *ver = json_string_value(json_object_get(o, "transformers_version"));
  out->tf_major = ver ? atoi(ver) : 0;
  const char *dt = json_string_value(json_object_get(o, "dtype"));
  if (!dt) dt = json_string_value(json_object_get(o, "torch_dtype"));
  snprintf(out->dtype, sizeof out->dtype, "%s", dt ? dt : "");
  return FSDP_OK;
}

fsdp_status hf_config_load(const char *path, hf_config *out) {
  json_error_t err;
  char *text;
  size_t len;
  TRY(fsutil_read_all(AT_FDCWD, path, HF_MAX_CONFIG, &text, &len));   /* no one else's link followed */
  json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
  free(text);
  if (!o) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: bad JSON at line %d: %s", path, err.line, err.text);
  fsdp_status rc = hf_config_parse(o, path, out);
  json_decref(o);
  return rc;
}

fsdp_status hf_weights_path(const char *dir, char *out, size_t n) {
  static const char *const names[] = {"model.safetensors.index.json", "model.safetensors"};
  struct stat st;
  for (int i = 0; i < 2; i++) {
    int w = snprintf(out, n, "%s/%s", dir, names[i]);
    if (w < 0 || (size_t)w >= n) return fsdp_set_error(FSDP_ERR_RANGE, "the path %s is too long", dir);
    if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) return FSDP_OK;
  }
  return fsdp_set_error(FSDP_ERR_NOTFOUND, "%s holds neither model.safetensors.index.json nor model.safetensors "
                        "(the weights save_pretrained writes)", dir);
}

/* ---- writing ---- */

/* Transformers 4's rope_scaling of a llama3 model (5 reads it too). */
static json_t *rope_scaling_json(const model_config *m) {
  if (m->rope_scaling == ROPE_SCALING_NONE) return json_null();
  return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", m->rope_factor, "low_freq_factor",
                   m->rope_low_freq_factor, "high_freq_factor", m->rope_high_freq_factor,
                   "original_max_position_embeddings", m->rope_original_max_pos);
}

/* fsdpd's own configs, for a model that came from no folder. GPT-2's special token 50256 is named only
 * when the vocabulary holds it; fsdpd's byte-level Llama models have no special tokens, so bos/eos/pad
 * are null (LlamaConfig's defaults, 1 and 2, would stop generate() at a byte). */
static json_t *own_config(const model_config *m) {
  int npos = m->n_positions > 0 ? m->n_positions : m->seq_len;
  if (m->arch == ARCH_LLAMA)
    return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:o, s:s, s:b, s:b, s:b, s:f, "
                     "s:n, s:n, s:n}",
                     "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size", m->n_embd,
                     "intermediate_size", m->ffn_dim, "num_attention_heads", m->n_head, "num_key_value_heads",
                     m->n_kv_head, "head_dim", m->n_embd / m->n_head, "num_hidden_layers", m->n_layer, "vocab_size",
                     m->vocab_size, "max_position_embeddings", npos, "rms_norm_eps", m->norm_eps, "rope_theta",
                     m->rope_theta, "rope_scaling",
                     rope_scaling_json(m), "hidden_act", "silu",
                     "tie_word_embeddings", m->tie_embeddings, "attention_bias", 0, "mlp_bias", 0,
                     "initializer_range", 0.02, "bos_token_id", "eos_token_id", "pad_token_id");
  json_t *special = m->vocab_size > 50256 ? json_integer(50256) : json_null();
  return json_pack("{s:s, s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:b, s:o, s:o}", "model_type", "gpt2",
                   "architectures", "GPT2LMHeadModel", "n_layer", m->n_layer, "n_head", m->n_head, "n_embd", m->n_embd,
                   "vocab_size", m->vocab_size, "n_positions", npos, "n_ctx", npos, "activation_function", "gelu_new",
                   "layer_norm_epsilon", 1e-5, "tie_word_embeddings", 1, "bos_token_id", special, "eos_token_id",
                   json_incref(special));
}

json_t *hf_config_json(const model_config *m, const json_t *source, const char *dtype) {
  if (!source) {
    json_t *o = own_config(m);
    if (o) json_object_set_new(o, "torch_dtype", json_string(dtype));   /* read by transformers 4 and 5 */
    return o;
  }
  json_t *o = json_deep_copy(source);
  if (!o) return NULL;
  /* The model is the source's (the job refused any other shape, rope or tie); the dtype is the
   * export's, in the field the source's transformers wrote. */
  const char *ver = json_string_value(json_object_get(source, "transformers_version"));
  int v5 = json_object_get(source, "dtype") ? 1 : json_object_get(source, "torch_dtype") ? 0 : !ver || atoi(ver) >= 5;
  json_object_set_new(o, v5 ? "dtype" : "torch_dtype", json_string(dtype));
  return o;
}
