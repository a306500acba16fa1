/* qwen3_arch — Qwen3's descriptor (arch.h; Hugging Face Qwen3ForCausalLM): a Llama whose q and k
 * heads each pass an RMSNorm (q_norm, k_norm: weight [head_dim], rms_norm_eps) before rope, with a
 * head_dim of its own (Qwen3-0.6B: 16 heads of 128 over hidden 1024) and attention_bias as its config
 * says (q, k, v and o). Everything but config.json and the names is the Llama family's
 * (llama_family.h); forward and backward are Llama's (model_qwen3.c registers them).
 *
 * Sliding-window attention (use_sliding_window: true, or a layer_types entry "sliding_attention") is
 * refused: fsdpd computes full causal attention in every layer (every published Qwen3 config).
 */
#include <jansson.h>
#include <string.h>

#include "arch.h"
#include "hfconfig.h"
#include "llama_family.h"

/* Qwen3Config: head_dim 128 where the config has none (Qwen3Config's default), attention_bias false. */
static fsdp_status hf_parse(const json_t *o, const char *path, model_config *m) {
  m->arch = ARCH_QWEN3;
  TRY(llama_hf_parse_common(o, path, 128, m));
  TRY(hf_want_bool(o, path, "use_sliding_window", 0, "sliding-window attention; fsdpd computes full attention"));
  const json_t *lt = json_object_get(o, "layer_types");
  for (size_t i = 0; json_is_array(lt) && i < json_array_size(lt); i++) {
    const char *t = json_string_value(json_array_get(lt, i));
    if (!t || strcmp(t, "full_attention"))
      return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: layer_types[%zu] = %s is not computed by fsdpd (sliding-window "
                            "attention); allowed: full_attention in every layer", path, i, t ? t : "?");
  }
  TRY(llama_hf_bool(o, path, "attention_bias", 0, &m->attention_bias));
  m->qk_norm = 1;
  return FSDP_OK;
}

static json_t *hf_own_config(const model_config *m) {
  json_t *o = llama_own_config(m, "Qwen3ForCausalLM", "qwen3");
  if (o) {
    json_object_set_new(o, "attention_bias", json_boolean(m->attention_bias));
    json_object_set_new(o, "use_sliding_window", json_false());
  }
  return o;
}

/* q/k norms always; no MLP bias, no q/k/v biases without o_proj's */
static void canonical(model_config *m) {
  llama_canonical_head_dim(m);
  m->qk_norm = 1;
  m->qkv_bias = 0;
  m->mlp_bias = 0;
}

static const char *const job_keys[] = {"n_kv_head", "ffn_dim", "norm_eps", "rope_theta", "rope_scaling", "rope_factor",
                                       "rope_low_freq_factor", "rope_high_freq_factor",
                                       "rope_original_max_position_embeddings", "head_dim", "attention_bias",
                                       "pad_token_id", NULL};

const arch_desc qwen3_arch = {
  LLAMA_FAMILY_DESC,
  .id = ARCH_QWEN3,
  .name = "qwen3",
  .hf_model_type = "qwen3",
  .job_keys = job_keys,
  .why_not = "Qwen3 has no MLP biases (arch = llama sets mlp_bias)",
  .hf_parse = hf_parse,
  .hf_own_config = hf_own_config,
  .canonical = canonical,
  .file_desc = "a Qwen3 model (model.embed_tokens.weight, model.layers.0.self_attn.q_norm.weight, …)",
};
