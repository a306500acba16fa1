/* mistral_arch — Mistral's descriptor (arch.h): MistralForCausalLM is Llama's layout, names and
 * config.json keys (llama_arch, through models/llama/llama_family.h) with one more setting, the
 * sliding window of its attention (config.json sliding_window, [model] sliding_window: query t sees
 * keys t − W < s ≤ t, as transformers' sliding_window_overlay). Only what differs is here: the
 * config.json reading and writing, the job key, the window in the manifest, the model's identity
 * and the plan's lines; every other verb is llama_arch's.
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

#define L llama_arch
#define MISTRAL_MAX_WINDOW (1 << 24)

/* ---- Llama's verbs ---- */

static int64_t root_numel(const model_config *m) { return L.root_numel(m); }
static int64_t block_numel(const model_config *m) { return L.block_numel(m); }
static int64_t n_decay(const model_config *m) { return L.n_decay(m); }
static int64_t lookup_numel(const model_config *m) { return L.lookup_numel(m); }
static int64_t embed_numel(const model_config *m) { return L.embed_numel(m); }
static plan_act act(const model_config *m, int B, device_kind dev, ackpt_mode ackpt) { return L.act(m, B, dev, ackpt); }
static void canonical(model_config *m) { L.canonical(m); }
static void units(plan_t *p) { L.units(p); }
static const plan_tensor *find(const plan_t *p, const char *name, int *unit) { return L.find(p, name, unit); }
static int head_slot(const model_config *m) { return L.head_slot(m); }
static fsdp_status file_check(const plan_t *p, const char *path, int (*has)(const void *, const char *), const void *f) {
  return L.file_check(p, path, has, f);
}
static fsdp_status missing(const plan_t *p, const char *name, const char *where) { return L.missing(p, name, where); }
static int manifest_fix(model_config *m) { return L.manifest_fix(m); }
static const char *params_note(const model_config *m) { return L.params_note(m); }
static const char *no_emb_label(const model_config *m) { return L.no_emb_label(m); }
static const char *flops_formula(const model_config *m) { return L.flops_formula(m); }

/* ---- the window ---- */

static fsdp_status check(const model_config *m) {
  TRY(L.check(m));
  if (m->sliding_window < 0 || m->sliding_window > MISTRAL_MAX_WINDOW)
    return fsdp_set_error(FSDP_ERR_RANGE, "sliding_window = %d is out of range; allowed: 0 (full attention) .. %d",
                          m->sliding_window, MISTRAL_MAX_WINDOW);
  return FSDP_OK;
}

static fsdp_status hf_parse(const json_t *o, const char *path, model_config *m) {
  TRY(L.hf_parse(o, path, m));
  m->arch = ARCH_MISTRAL;
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

/* Llama's config as MistralConfig names it: the class, the type and the window. */
static json_t *hf_own_config(const model_config *m) {
  json_t *o = L.hf_own_config(m);
  if (!o) return NULL;
  json_object_set_new(o, "architectures", json_pack("[s]", "MistralForCausalLM"));
  json_object_set_new(o, "model_type", json_string("mistral"));
  json_object_set_new(o, "sliding_window", window_json(m));
  json_object_del(o, "attention_bias");   /* MistralConfig has neither: it has no biases */
  json_object_del(o, "mlp_bias");
  return o;
}

static void model_json(json_t *jm, const model_config *m) {
  L.model_json(jm, m);
  json_object_set_new(jm, "sliding_window", window_json(m));
}

static int same_model(const model_config *a, const model_config *b) {
  return L.same_model(a, b) && a->sliding_window == b->sliding_window;
}

static void describe(const model_config *m, char *buf, size_t n) {
  L.describe(m, buf, n);
  size_t k = strlen(buf);
  if (k + 1 >= n) return;
  if (m->sliding_window > 0) snprintf(buf + k, n - k, ", sliding_window %d", m->sliding_window);
  else snprintf(buf + k, n - k, ", sliding_window none");
}

static void print_model(const model_config *m, FILE *f) {
  L.print_model(m, f);
  if (m->sliding_window > 0 && m->sliding_window < m->seq_len)
    fprintf(f, "          sliding window %d: token t attends to tokens t-%d .. t\n", m->sliding_window,
            m->sliding_window - 1);
  else if (m->sliding_window > 0)
    fprintf(f, "          sliding window %d >= seq_len %d: full causal attention\n", m->sliding_window, m->seq_len);
  else
    fprintf(f, "          no sliding window: full causal attention\n");
}

/* Llama's keys (MistralConfig names them alike), and the window. */
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
  {"sliding_window", "sliding_window"},
  {"pad_token_id", "pad_token_id"},
  {NULL, NULL},
};

static const char *const job_keys[] = {"n_kv_head", "ffn_dim", "norm_eps", "rope_theta", "rope_scaling", "rope_factor",
                                       "rope_low_freq_factor", "rope_high_freq_factor",
                                       "rope_original_max_position_embeddings", "sliding_window", "pad_token_id", NULL};
static const char *const probe_names[] = {"embed_tokens.weight", "layers.0.self_attn.q_proj.weight", NULL};

const arch_desc mistral_arch = {
  .id = ARCH_MISTRAL,
  .name = "mistral",
  .hf_model_type = "mistral",
  .job_keys = job_keys,
  .why_not = "it is not a Mistral setting",
  .always_tied = 0,
  .tied_why = NULL,
  .tie_pair = {"model.embed_tokens.weight", "lm_head.weight"},
  .rotary = 1,
  .hf_keys = hf_keys,
  .hf_parse = hf_parse,
  .hf_own_config = hf_own_config,
  .dropout = llama_dropout,
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
  .probe_names = probe_names,
  .file_desc = "a Llama-layout model (model.embed_tokens.weight, model.layers.0.…)",
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
