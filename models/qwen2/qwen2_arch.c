/* qwen2_arch — Qwen2 and Qwen2.5's descriptor (arch.h; Hugging Face Qwen2ForCausalLM): a Llama with
 * biases on q_proj, k_proj and v_proj (none on o_proj, none in the MLP), tied or untied. Everything
 * but config.json and the names is the Llama family's (llama_family.h); forward and backward are
 * Llama's (model_qwen2.c registers them).
 *
 * Sliding-window attention (use_sliding_window: true, or a layer_types entry "sliding_attention") is
 * refused: fsdpd computes full causal attention in every layer, which is what transformers computes
 * for every published Qwen2/2.5 config (use_sliding_window: false).
 */
#include <jansson.h>
#include <string.h>

#include "arch.h"
#include "hfconfig.h"
#include "llama_family.h"

/* Qwen2Config: head_dim where the config has one (Qwen2Attention's getattr), else C / H; the biases
 * are the architecture's, whatever attention_bias or mlp_bias say (Qwen2 reads neither). */
static fsdp_status hf_parse(const json_t *o, const char *path, model_config *m) {
  m->arch = ARCH_QWEN2;
  TRY(llama_hf_parse_common(o, path, 0, m));
  TRY(hf_want_bool(o, path, "use_sliding_window", 0, "sliding-window attention; fsdpd computes full attention"));
  const json_t *lt = json_object_get(o, "layer_types");
  for (size_t i = 0; json_is_array(lt) && i < json_array_size(lt); i++) {
    const char *t = json_string_value(json_array_get(lt, i));
    if (!t || strcmp(t, "full_attention"))
      return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: layer_types[%zu] = %s is not computed by fsdpd (sliding-window "
                            "attention); allowed: full_attention in every layer", path, i, t ? t : "?");
  }
  m->qkv_bias = 1;
  return FSDP_OK;
}

static json_t *hf_own_config(const model_config *m) {
  json_t *o = llama_own_config(m, "Qwen2ForCausalLM", "qwen2");
  if (o) json_object_set_new(o, "use_sliding_window", json_false());
  return o;
}

/* q/k/v biases, no o_proj or MLP bias, no q/k norms */
static void canonical(model_config *m) {
  llama_canonical_head_dim(m);
  m->qkv_bias = 1;
  m->attention_bias = 0;
  m->mlp_bias = 0;
  m->qk_norm = 0;
}

static const char *const job_keys[] = {"n_kv_head", "ffn_dim", "norm_eps", "rope_theta", "rope_scaling", "rope_factor",
                                       "rope_low_freq_factor", "rope_high_freq_factor",
                                       "rope_original_max_position_embeddings", "head_dim", "pad_token_id", NULL};

const arch_desc qwen2_arch = {
  LLAMA_FAMILY_DESC,
  .id = ARCH_QWEN2,
  .name = "qwen2",
  .hf_model_type = "qwen2",
  .job_keys = job_keys,
  .why_not = "Qwen2 has q/k/v biases and none elsewhere (arch = llama sets attention_bias and mlp_bias)",
  .hf_parse = hf_parse,
  .hf_own_config = hf_own_config,
  .canonical = canonical,
  .file_desc = "a Qwen2 model (model.embed_tokens.weight, model.layers.0.self_attn.q_proj.bias, …)",
};
