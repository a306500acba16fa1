/* llama_family — the Llama descriptor's terms that the family's folders (models/qwen2, qwen3,
 * mistral, phi3) share: every arch_desc entry that does not depend on which family member it is, and the pieces of
 * config.json reading and writing they build their own from (llama_arch.c). Pure functions, any
 * thread, as arch.h's.
 *
 * A member's descriptor is LLAMA_FAMILY_DESC plus its own id, names, job keys, why_not, hf_parse,
 * hf_own_config, canonical (which sets the choices the member always makes: Qwen2's q/k/v biases,
 * Qwen3's q/k norms) and file_desc; a member that differs in more (Mistral's window, Phi-3's fused
 * tensors and longrope) names its own entries after the macro, which replace the family's, and builds
 * them from the functions below. Its forward and backward are Llama's (model_llama.h,
 * LLAMA_FAMILY_MODEL_OPS), which read those choices from the plan's model_config.
 *
 * Gemma 3 (models/gemma3) is no member (its own units, norms and rope per layer kind) but reads,
 * writes and prints the keys it has in common with the family through the pieces below.
 */
#ifndef FSDP_LLAMA_FAMILY_H
#define FSDP_LLAMA_FAMILY_H

#include <jansson.h>
#include <stdio.h>

#include "arch.h"
#include "llama.h"

int64_t llama_root_numel(const model_config *m);
int64_t llama_block_numel(const model_config *m);
int64_t llama_n_decay(const model_config *m);
int64_t llama_lookup_numel(const model_config *m);
int64_t llama_embed_numel(const model_config *m);
int64_t llama_attn_dim(const model_config *m);
plan_act llama_act(const model_config *m, int B, device_kind dev, ackpt_mode ackpt);
/* The plan_act of a decoder whose root keeps 2·BTC act + BT fp32 and whose head works in the logits
 * (LOGITS bytes), BT losses and BTC: BLOCK floats (BLOCK_BYTES) saved per layer, or with CK (full
 * checkpointing) the layer's output BTC saved and BLOCK its workspace; BWD act + DATT fp32 of
 * backward workspace; E bytes per act element. */
plan_act llama_plan_act(int ck, int64_t e, int64_t BT, int64_t C, int64_t block, int64_t block_bytes, int64_t logits,
                        int64_t bwd, int64_t DATT);
fsdp_status llama_check(const model_config *m);
/* llama_check's n_kv_head (a divisor of n_head) and norm_eps / rope_theta ranges. */
fsdp_status llama_check_kv(const model_config *m);
fsdp_status llama_check_eps_theta(const model_config *m);
void llama_units(plan_t *p);
const plan_tensor *llama_find(const plan_t *p, const char *name, int *unit);
int llama_head_slot(const model_config *m);
fsdp_status llama_file_check(const plan_t *p, const char *path, int (*has)(const void *, const char *), const void *f);
fsdp_status llama_missing(const plan_t *p, const char *name, const char *where);
void llama_model_json(json_t *jm, const model_config *m);
int llama_manifest_fix(model_config *m);
void llama_manifest_read(const json_t *jm, model_config *m);
int llama_same_model(const model_config *a, const model_config *b);
void llama_describe(const model_config *m, char *buf, size_t n);
void llama_print_model(const model_config *m, FILE *f);
/* llama_model_json's first keys, those of every decoder here: n_kv_head, ffn_dim, norm_eps,
 * rope_theta, tie_word_embeddings (the descriptor's always_tied, or M's), rope_scaling, head_dim. */
void llama_model_json_shape(json_t *jm, const model_config *m);
/* The rope scaling for a message: "none", "linear (factor 8)", "llama3 (...)". */
void llama_rope_text(const model_config *m, char *buf, size_t n);
/* The plan's shape line: "  KV=..  HD=..  F=..  eps=..  theta=..\n". */
void llama_print_shape(const model_config *m, FILE *f);
const char *llama_params_note(const model_config *m);
const char *llama_no_emb_label(const model_config *m);
const char *llama_flops_formula(const model_config *m);
extern const arch_hf_key llama_hf_keys[];
extern const arch_dropout llama_dropout[];    /* attention_dropout (0 where absent): every member's */     /* LlamaConfig's names; every member's keys are among them */
extern const char *const llama_probe_names[];
int llama_lora_modules(const model_config *m, arch_lora_module *out);
/* The 7 projections q, k, v, o, gate, up, down at block slots SLOT (q|k|v and gate|up fused). */
int llama_lora_modules_at(const model_config *m, const int slot[7], arch_lora_module *out);

/* ---- config.json ---- */
/* The keys every member reads alike (shapes, eps, the tie, hidden_act = silu, rope_theta and the rope
 * scaling with transformers' precedence, head_dim with HEAD_DIM_DFLT where the config has none: 0
 * for C / H); M's arch and the member's own keys are the caller's. */
fsdp_status llama_hf_parse_common(const json_t *o, const char *path, int head_dim_dflt, model_config *m);
/* The shape keys num_hidden_layers .. num_key_value_heads, absent: D's (-1: required; n_kv_head 0:
 * n_head). */
typedef struct { int n_layer, n_head, n_embd, vocab_size, ffn_dim, n_positions, n_kv_head; } llama_hf_dflt;
fsdp_status llama_hf_shape(const json_t *o, const char *path, const llama_hf_dflt *d, model_config *m);
/* pad_token_id: null, none (-1); absent, ABSENT; else a row of the vocabulary (nn.Embedding refuses
 * any other, and wraps a negative one, which fsdpd does not). */
fsdp_status llama_hf_pad(const json_t *o, const char *path, int absent, model_config *m);
/* A number KEY of O (O may be NULL), or NAN when absent or null (hf_get_num checks its range). */
double llama_hf_num(const json_t *o, const char *key);
/* A rope object's type: rope_type, or transformers 4's "type"; "default" when neither. */
const char *llama_hf_rope_type(const json_t *r);
/* A boolean KEY of O into *V; absent or null: DFLT. */
fsdp_status llama_hf_bool(const json_t *o, const char *path, const char *key, int dflt, int *v);
/* fsdpd's own config.json of M with ARCHITECTURE ("Qwen2ForCausalLM") and MODEL_TYPE, the keys every
 * member writes alike (head_dim included); a new reference, the caller adds its own keys. */
json_t *llama_own_config(const model_config *m, const char *architecture, const char *model_type);
json_t *llama_rope_scaling_json(const model_config *m);
/* head_dim = C / H written as 0: one identity for both spellings (canonical()). */
void llama_canonical_head_dim(model_config *m);

/* The rows of an arch_desc's hf_keys (job key, config.json key) that every decoder here has alike,
 * which its table opens with: the shapes, norm_eps, rope_theta, the tie and the rope type; then
 * the llama3 and linear scalings' keys, Llama's and Mistral's. */
#define LLAMA_HF_KEYS_SHAPE                                                                                \
  {"arch", "model_type"}, {"n_layer", "num_hidden_layers"}, {"n_head", "num_attention_heads"},              \
  {"n_embd", "hidden_size"}, {"vocab_size", "vocab_size"}, {"n_positions", "max_position_embeddings"},      \
  {"n_kv_head", "num_key_value_heads"}, {"ffn_dim", "intermediate_size"}, {"norm_eps", "rms_norm_eps"},     \
  {"rope_theta", "rope_theta"}, {"tie_word_embeddings", "tie_word_embeddings"}, {"rope_scaling", "rope_type"}
#define LLAMA_HF_KEYS_ROPE                                                                                 \
  {"rope_factor", "factor"}, {"rope_low_freq_factor", "low_freq_factor"},                                  \
  {"rope_high_freq_factor", "high_freq_factor"},                                                           \
  {"rope_original_max_position_embeddings", "original_max_position_embeddings"}

#define LLAMA_FAMILY_DESC                                                                                   \
  .always_tied = 0, .tied_why = NULL, .tie_pair = {"model.embed_tokens.weight", "lm_head.weight"},          \
  .rotary = 1, .hf_keys = llama_hf_keys, .root_numel = llama_root_numel,                                   \
  .dropout = llama_dropout, .block_numel = llama_block_numel, .n_decay = llama_n_decay,                     \
  .lookup_numel = llama_lookup_numel,                                                                      \
  .embed_numel = llama_embed_numel, .attn_dim = llama_attn_dim, .act = llama_act, .check = llama_check,     \
  .units = llama_units, .find = llama_find, .head_slot = llama_head_slot, .probe_names = llama_probe_names,  \
  .reads = "model.embed_tokens.weight, model.layers.0.…", .file_check = llama_file_check,                   \
  .missing = llama_missing, .model_json = llama_model_json, .manifest_fix = llama_manifest_fix,             \
  .manifest_read = llama_manifest_read, .same_model = llama_same_model, .describe = llama_describe,         \
  .print_model = llama_print_model, .params_note = llama_params_note, .no_emb_label = llama_no_emb_label,   \
  .flops_formula = llama_flops_formula, .block_prefix = "layers", .layout = "nn.Linear [out, in]",          \
  .name_width = 47, .lora_default = "q_proj,v_proj", .lora_block_hf = "model.layers.%d.",                     \
  .lora_modules = llama_lora_modules

#endif
