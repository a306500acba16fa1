/* mistral_arch — Mistral's descriptor (arch.h): MistralForCausalLM is Llama's layout, names and
 * config.json keys with one more setting, the sliding window of its attention (config.json
 * sliding_window, [model] sliding_window: query t sees keys t − W < s ≤ t, as transformers'
 * sliding_window_overlay). It is a Llama family member (llama_family.h's LLAMA_FAMILY_DESC): only
 * what differs is here (config.json, the job key, the window's range, manifest key, identity and plan
 * line); forward and backward are Llama's (model_mistral.c). MistralConfig has no biases; its head_dim
 * is the config's, else C / H.
 *
 * config.json's sliding_window: null is full attention; absent is MistralConfig's default, 4096; a
 * window of seq_len or more computes full attention (the worker runs it so).
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "hfconfig.h"
#include "llama_family.h"

#define MISTRAL_MAX_WINDOW (1 << 24)

static fsdp_status check(const model_config *m) {
  TRY(llama_check(m));
  if (m->sliding_window < 0 || m->sliding_window > MISTRAL_MAX_WINDOW)
    return fsdp_set_error(FSDP_ERR_RANGE, "sliding_window = %d is out of range; allowed: 0 (full attention) .. %d",
                          m->sliding_window, MISTRAL_MAX_WINDOW);
  return FSDP_OK;
}

static fsdp_status hf_parse(const json_t *o, const char *path, model_config *m) {
  m->arch = ARCH_MISTRAL;
  TRY(llama_hf_parse_common(o, path, 0, m));
  const json_t *w = json_object_get(o, "sliding_window");
  if (!w) m->sliding_window = 4096;   /* MistralConfig's default */
  else if (json_is_null(w)) m->sliding_window = 0;
  else if (json_is_integer(w) && json_integer_value(w) >= 1 && json_integer_value(w) <= MISTRAL_MAX_WINDOW)
    m->sliding_window = (int)json_integer_value(w);
  else
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: sliding_window must be null (full attention) or an integer in 1..%d",
                          path, MISTRAL_MAX_WINDOW);
  return FSDP_OK;
}

static json_t *window_json(const model_config *m) {
  return m->sliding_window > 0 ? json_integer(m->sliding_window) : json_null();
}

/* The family's config as MistralConfig names it: the class, the type and the window (no biases). */
static json_t *hf_own_config(const model_config *m) {
  json_t *o = llama_own_config(m, "MistralForCausalLM", "mistral");
  if (o) json_object_set_new(o, "sliding_window", window_json(m));
  return o;
}

/* no biases, no q/k norms */
static void canonical(model_config *m) {
  llama_canonical_head_dim(m);
  m->attention_bias = 0;
  m->qkv_bias = 0;
  m->mlp_bias = 0;
  m->qk_norm = 0;
}

static void model_json(json_t *jm, const model_config *m) {
  llama_model_json(jm, m);
  json_object_set_new(jm, "sliding_window", window_json(m));
}

/* The window (absent in a manifest of a model without one: full attention). */
static void manifest_read(const json_t *jm, model_config *m) {
  llama_manifest_read(jm, m);
  json_int_t window = json_integer_value(json_object_get(jm, "sliding_window"));
  m->sliding_window = window > 0 && window <= MISTRAL_MAX_WINDOW ? (int)window : 0;
}

static int same_model(const model_config *a, const model_config *b) {
  return llama_same_model(a, b) && a->sliding_window == b->sliding_window;
}

static void describe(const model_config *m, char *buf, size_t n) {
  llama_describe(m, buf, n);
  size_t k = strlen(buf);
  if (k + 1 >= n) return;
  if (m->sliding_window > 0) snprintf(buf + k, n - k, ", sliding_window %d", m->sliding_window);
  else snprintf(buf + k, n - k, ", sliding_window none");
}

static void print_model(const model_config *m, FILE *f) {
  llama_print_model(m, f);
  if (m->sliding_window > 0 && m->sliding_window < m->seq_len)
    fprintf(f, "          sliding window %d: token t attends to tokens t-%d .. t\n", m->sliding_window,
            m->sliding_window - 1);
  else if (m->sliding_window > 0)
    fprintf(f, "          sliding window %d >= seq_len %d: full causal attention\n", m->sliding_window, m->seq_len);
  else
    fprintf(f, "          no sliding window: full causal attention\n");
}

/* Llama's keys MistralConfig has (no biases), and the window. */
static const arch_hf_key hf_keys[] = {
  LLAMA_HF_KEYS_SHAPE,
  LLAMA_HF_KEYS_ROPE,
  {"head_dim", "head_dim"},
  {"sliding_window", "sliding_window"},
  {"pad_token_id", "pad_token_id"},
  {NULL, NULL},
};

static const char *const job_keys[] = {"n_kv_head", "ffn_dim", "norm_eps", "rope_theta", "rope_scaling", "rope_factor",
                                       "rope_low_freq_factor", "rope_high_freq_factor",
                                       "rope_original_max_position_embeddings", "sliding_window", "pad_token_id", NULL};

static int attn_window(const model_config *m, int layer) { return (void)layer, m->sliding_window; }
static const char *flops_formula(const model_config *m) {
  if (m->sliding_window <= 0 || m->sliding_window >= m->seq_len) return llama_flops_formula(m);
  return m->tie_embeddings ? "6·Ψ + 12·L·H·HD·T·(the window's share of the scores)"
                           : "6·(Ψ − embed_tokens) + 12·L·H·HD·T·(the window's share of the scores)";
}

/* The family's entries, then Mistral's own: a later designator replaces the family's. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
const arch_desc mistral_arch = {
  LLAMA_FAMILY_DESC,
  .id = ARCH_MISTRAL,
  .name = "mistral",
  .hf_model_type = "mistral",
  .job_keys = job_keys,
  .why_not = "it is not a Mistral setting",
  .hf_keys = hf_keys,
  .hf_parse = hf_parse,
  .hf_own_config = hf_own_config,
  .check = check,
  .canonical = canonical,
  .attn_window = attn_window,
  .flops_formula = flops_formula,
  .file_desc = "a Llama-layout model (model.embed_tokens.weight, model.layers.0.…)",
  .model_json = model_json,
  .manifest_read = manifest_read,
  .same_model = same_model,
  .describe = describe,
  .print_model = print_model,
};
#pragma GCC diagnostic pop
