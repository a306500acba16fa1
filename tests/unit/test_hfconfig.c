/* test_hfconfig — config.json of GPT-2 and Llama in transformers 4 and 5 forms read into model_config;
 * what fsdpd does not compute refused naming it; an export's config carries the source's fields. */
#include <jansson.h>
#include <string.h>

#include "check.h"
#include "hfconfig.h"
#include "llama_family.h"
#include "arch.h"

static fsdp_status parse(const char *text, hf_config *out) {
  json_error_t err;
  json_t *o = json_loads(text, 0, &err);
  CHECK(o != NULL);
  fsdp_status rc = hf_config_parse(o, "config.json", out);
  json_decref(o);
  return rc;
}

static int has(const char *needle) {
  if (strstr(fsdp_last_error(), needle)) return 1;
  fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", fsdp_last_error(), needle);
  return 0;
}

#define LLAMA_SHAPE                                                                                              \
  "\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 3, "      \
  "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300, \"max_position_embeddings\": " \
  "131072, \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": true, \"head_dim\": 16, \"hidden_act\": \"silu\", "  \
  "\"attention_bias\": false, \"mlp_bias\": false"

/* The same Llama-3.2-style model saved by transformers 5 (rope_parameters, dtype) and 4 (rope_theta,
 * rope_scaling, torch_dtype) reads the same. */
static void test_llama_forms(void) {
  hf_config a, b;
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"dtype\": \"bfloat16\", \"transformers_version\": \"5.23.0\", \"rope_parameters\": "
                 "{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0, \"low_freq_factor\": 1.0, "
                 "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}", &a));
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.47.1\", \"rope_theta\": "
                 "500000.0, \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0, "
                 "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}", &b));
  const model_config *m = &a.model;
  CHECK_EQ_INT(ARCH_LLAMA, m->arch);
  CHECK(m->n_layer == 3 && m->n_head == 4 && m->n_kv_head == 2 && m->n_embd == 64 && m->ffn_dim == 128);
  CHECK(m->vocab_size == 300 && m->n_positions == 131072 && m->seq_len == 0 && m->tie_embeddings == 1);
  CHECK(m->rope_theta == 500000 && m->norm_eps == 1e-5 && m->rope_scaling == ROPE_SCALING_LLAMA3);
  CHECK(m->rope_factor == 32 && m->rope_low_freq_factor == 1 && m->rope_high_freq_factor == 4);
  CHECK_EQ_INT(8192, m->rope_original_max_pos);
  CHECK(!memcmp(&a.model, &b.model, sizeof a.model));
  CHECK(a.tf_major == 5 && b.tf_major == 4 && !strcmp(a.dtype, "bfloat16") && !strcmp(b.dtype, "bfloat16"));
  /* defaults: no GQA key = MHA, no rope keys = theta 10000 unscaled, untied */
  CHECK_OK(parse("{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 1, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 50, \"rope_scaling\": null}", &a));
  CHECK(a.model.n_kv_head == 4 && a.model.rope_theta == 10000 && a.model.rope_scaling == ROPE_SCALING_NONE &&
        !a.model.tie_embeddings && a.model.n_positions == 2048 && a.tf_major == 0 && !a.dtype[0]);
}

/* Both forms in one config.json, as transformers 5's from_pretrained reads them (checked against
 * LlamaConfig.rope_parameters of transformers 5.23): the legacy rope_scaling replaces rope_parameters,
 * a top-level rope_theta stands where the rope object has none; where the two say different things
 * the config is refused, naming both. */
#define L3_SCALING "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64"
static void test_llama_mixed_rope(void) {
  hf_config a;
  /* rope_parameters default + a legacy llama3 block: transformers computes the scaling */
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}, "
                 "\"rope_scaling\": {\"rope_type\": \"llama3\", " L3_SCALING "}}", &a));
  CHECK(a.model.rope_scaling == ROPE_SCALING_LLAMA3 && a.model.rope_factor == 8 && a.model.rope_theta == 10000);
  CHECK_EQ_INT(64, a.model.rope_original_max_pos);
  /* rope_parameters without a base + a top-level rope_theta: the top-level one */
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"rope_parameters\": {\"rope_type\": \"default\"}, \"rope_theta\": 500000.0}", &a));
  CHECK(a.model.rope_theta == 500000 && a.model.rope_scaling == ROPE_SCALING_NONE);
  /* the legacy block with the top-level base (a transformers 4 config) */
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"rope_theta\": 500000.0, \"rope_scaling\": {\"type\": \"llama3\", " L3_SCALING "}}",
                 &a));
  CHECK(a.model.rope_theta == 500000 && a.model.rope_scaling == ROPE_SCALING_LLAMA3);
  /* the same scaling in both forms is one model */
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, "
                 L3_SCALING "}, \"rope_scaling\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, " L3_SCALING "}}",
                 &a));
  CHECK(a.model.rope_theta == 500000 && a.model.rope_scaling == ROPE_SCALING_LLAMA3);
  /* linear, in either form: its factor (LlamaConfig's _compute_linear_scaling_rope_parameters) */
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", &a));
  CHECK(a.model.rope_scaling == ROPE_SCALING_LINEAR && a.model.rope_factor == 2 && a.model.rope_theta == 10000);
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 8.0, "
                 "\"rope_theta\": 1000000.0}}", &a));
  CHECK(a.model.rope_scaling == ROPE_SCALING_LINEAR && a.model.rope_factor == 8 && a.model.rope_theta == 1e6);
  json_t *rs = llama_rope_scaling_json(&a.model);
  CHECK(rs && !strcmp(json_string_value(json_object_get(rs, "rope_type")), "linear") &&
        json_number_value(json_object_get(rs, "factor")) == 8);
  json_decref(rs);
  static const struct { const char *cfg, *msg; } bad[] = {
    {"{" LLAMA_SHAPE ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}, \"rope_theta\": 500000.0}",
     "rope_parameters has rope_theta 10000 but the top-level rope_theta is 500000"},
    {"{" LLAMA_SHAPE ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 20000.0}, "
     "\"rope_scaling\": {\"rope_type\": \"llama3\", " L3_SCALING "}, \"rope_theta\": 30000.0}",
     "rope_parameters has rope_theta 20000 but transformers takes 30000"},
    {"{" LLAMA_SHAPE ", \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 10000.0, " L3_SCALING "}, "
     "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 4.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
     "\"original_max_position_embeddings\": 64}}",
     "rope_parameters (rope_type 'llama3') and the legacy rope_scaling (rope_type 'llama3') disagree"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK(parse(bad[i].cfg, &a) == FSDP_ERR_UNSUPPORTED);
    CHECK(has(bad[i].msg));
  }
}

static void test_gpt2(void) {
  hf_config h;
  CHECK_OK(parse("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": 32, \"vocab_size\": 256, "
                 "\"n_positions\": 64, \"activation_function\": \"gelu_new\", \"layer_norm_epsilon\": 1e-05, "
                 "\"n_inner\": null, \"dtype\": \"float32\", \"transformers_version\": \"5.23.0\"}", &h));
  CHECK(h.model.arch == ARCH_GPT2 && h.model.n_layer == 2 && h.model.n_head == 4 && h.model.n_kv_head == 4);
  CHECK(h.model.n_embd == 32 && h.model.vocab_size == 256 && h.model.n_positions == 64);
}

/* Llama's head_dim and biases; Qwen2's q/k/v biases (whatever attention_bias says); Qwen3's q/k norms,
 * its head_dim default 128 and attention_bias. */
static void test_family(void) {
  hf_config h;
  CHECK_OK(parse("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 9, \"head_dim\": 32, \"attention_bias\": true, "
                 "\"mlp_bias\": true}", &h));
  CHECK(h.model.arch == ARCH_LLAMA && h.model.head_dim == 32 && h.model.attention_bias && h.model.mlp_bias);
  CHECK_OK(parse("{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 9, \"attention_bias\": true, \"use_sliding_window\": false, "
                 "\"sliding_window\": 4096, \"layer_types\": [\"full_attention\"]}", &h));
  CHECK(h.model.arch == ARCH_QWEN2 && h.model.qkv_bias && !h.model.attention_bias && !h.model.qk_norm);
  CHECK_OK(parse("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 9}", &h));
  CHECK(h.model.arch == ARCH_QWEN3 && h.model.head_dim == 128 && h.model.qk_norm && !h.model.attention_bias);
  CHECK_OK(parse("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 9, \"head_dim\": 32, \"attention_bias\": true}", &h));
  CHECK(h.model.head_dim == 32 && h.model.attention_bias);
}

/* pad_token_id read (null or absent: -1; GPT-2 never has one); the first non-zero dropout noted, a key left out
 * taking its config class's default (GPT2Config's 0.1, LlamaConfig's 0). */
static void test_pad_dropout(void) {
  hf_config h;
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"pad_token_id\": 3, \"attention_dropout\": 0.0}", &h));
  CHECK(h.model.pad_token_id == 3 && !h.dropout_key[0]);
  CHECK_OK(parse("{" LLAMA_SHAPE "}", &h));   /* absent: none (Gemma 3's absent one is 0: test_gemma3) */
  CHECK(h.model.pad_token_id == -1);
  CHECK_OK(parse("{" LLAMA_SHAPE ", \"pad_token_id\": null, \"attention_dropout\": 0.25}", &h));
  CHECK(h.model.pad_token_id == -1 && !strcmp(h.dropout_key, "attention_dropout") && h.dropout == 0.25 &&
        !h.dropout_default);
  CHECK_OK(parse("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": 32, \"vocab_size\": 256, "
                 "\"pad_token_id\": 7, \"embd_pdrop\": 0.0}", &h));
  CHECK(h.model.pad_token_id == -1 && !strcmp(h.dropout_key, "attn_pdrop") && h.dropout == 0.1 && h.dropout_default);
  CHECK(parse("{" LLAMA_SHAPE ", \"pad_token_id\": 300}", &h) == FSDP_ERR_FORMAT);   /* vocab_size 300 */
  CHECK(strstr(fsdp_last_error(), "pad_token_id must be null or a token id in 0..299") != NULL);
  CHECK(parse("{" LLAMA_SHAPE ", \"attention_dropout\": \"0.1\"}", &h) == FSDP_ERR_FORMAT);
}

/* One line naming what is not computed. */
static void test_refused(void) {
  static const struct { const char *json, *needle; } bad[] = {
    {"{" LLAMA_SHAPE ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0}}",
     "rope_type 'yarn' is not computed by fsdpd; allowed: default, llama3"},
    {"{" LLAMA_SHAPE ", \"rope_scaling\": {\"type\": \"linear\"}}", "has no factor"},
    {"{" LLAMA_SHAPE ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}", "no low_freq_factor"},
    {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, "
     "\"num_attention_heads\": 4, \"vocab_size\": 9, \"attention_bias\": 1}", "attention_bias must be true or false"},
    {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, "
     "\"num_attention_heads\": 4, \"vocab_size\": 9, \"head_dim\": 33}", "head_dim = 33 is odd"},
    {"{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, "
     "\"num_attention_heads\": 4, \"vocab_size\": 9, \"use_sliding_window\": true, \"sliding_window\": 16}",
     "use_sliding_window = true is not computed by fsdpd"},
    {"{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
     "\"num_attention_heads\": 4, \"vocab_size\": 9, \"layer_types\": [\"full_attention\", \"sliding_attention\"]}",
     "layer_types[1] = sliding_attention is not computed by fsdpd"},
    {"{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 8, \"vocab_size\": 9, "
     "\"activation_function\": \"relu\"}", "activation_function = relu"},
    {"{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 8, \"vocab_size\": 9, "
     "\"scale_attn_by_inverse_layer_idx\": true}", "scale_attn_by_inverse_layer_idx = true"},
    {"{\"model_type\": \"gemma3\"}", "model_type 'gemma3' is not a model fsdpd computes"},   /* multimodal */
    {"{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 8, \"vocab_size\": 9}", "has no n_head"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    hf_config h;
    CHECK(parse(bad[i].json, &h) != FSDP_OK);
    CHECK(has(bad[i].needle) && !strchr(fsdp_last_error(), '\n'));
  }
}

/* Gemma 3's config.json (Gemma3TextConfig), skipped while models/models.def does not register it:
 * transformers 5's rope_parameters per layer kind and layer_types, transformers 4's rope_theta,
 * rope_local_base_freq, rope_scaling and sliding_window_pattern, the defaults of each; fsdpd's own
 * config reads back the same; what it does not compute refused in one line each. */
#define G3_SHAPE                                                                                                  \
  "\"model_type\": \"gemma3_text\", \"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 4, "  \
  "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, \"vocab_size\": 300, "            \
  "\"sliding_window\": 8, \"query_pre_attn_scalar\": 24"
static void test_gemma3(void) {
  const arch_desc *g = arch_by_name("gemma3");
  if (!g) {
    printf("test_gemma3: gemma3 is not registered in models/models.def; skipped\n");
    return;
  }
  hf_config a, b;
  CHECK_OK(parse("{" G3_SHAPE ", \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
                 "\"full_attention\"], \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"linear\", \"factor\": "
                 "8.0, \"rope_theta\": 1000000.0}, \"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": "
                 "10000.0}}}", &a));
  const model_config *m = &a.model;
  CHECK(m->arch == g->id && m->n_layer == 4 && m->n_kv_head == 1 && m->head_dim == 16 && m->sliding_window == 8);
  CHECK(m->rope_theta == 1e6 && m->rope_scaling == ROPE_SCALING_LINEAR && m->rope_factor == 8 && m->tie_embeddings);
  CHECK(m->ext[arch_ext_index(g, "query_pre_attn_scalar")] == 24 && m->ext[arch_ext_index(g, "rope_local_base_freq")] == 10000 &&
        m->ext[arch_ext_index(g, "sliding_window_pattern")] == 2 && m->norm_eps == 1e-6);
  /* transformers 4's keys: the same model */
  CHECK_OK(parse("{" G3_SHAPE ", \"sliding_window_pattern\": 2, \"rope_theta\": 1000000.0, \"rope_local_base_freq\": "
                 "10000.0, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}}", &b));
  CHECK(arch_same_model(&a.model, &b.model));
  /* the defaults: pattern 6, bases 1e6 and 10000, unscaled, window 4096, scalar 256, head_dim 256, pad_token_id 0
   * (Gemma3TextConfig's; Llama's absent pad_token_id is none) */
  CHECK_OK(parse("{\"model_type\": \"gemma3_text\", \"hidden_size\": 32, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"vocab_size\": 300}", &b));
  CHECK(b.model.rope_theta == 1e6 && b.model.rope_scaling == ROPE_SCALING_NONE && b.model.sliding_window == 4096 &&
        b.model.head_dim == 256 && b.model.pad_token_id == 0 && b.model.ext[arch_ext_index(g, "sliding_window_pattern")] == 6 &&
        b.model.ext[arch_ext_index(g, "query_pre_attn_scalar")] == 256 &&
        b.model.ext[arch_ext_index(g, "rope_local_base_freq")] == 10000);
  /* fsdpd's own config.json of the first reads back as it */
  a.model.seq_len = 16;
  json_t *own = hf_config_json(&a.model, NULL, "float32");
  hf_config c;
  CHECK(own && hf_config_parse(own, "own", &c) == FSDP_OK && arch_same_model(&a.model, &c.model));
  CHECK(json_array_size(json_object_get(own, "layer_types")) == 4 &&
        !strcmp(json_string_value(json_array_get(json_object_get(own, "layer_types"), 1)), "full_attention"));
  json_decref(own);
  static const struct { const char *json, *needle; } bad[] = {
    {"{" G3_SHAPE ", \"layer_types\": [\"sliding_attention\", \"full_attention\", \"full_attention\", "
     "\"full_attention\"]}", "layer_types[2] = full_attention breaks the period 2"},
    {"{" G3_SHAPE ", \"hidden_activation\": \"gelu\"}", "hidden_activation = gelu is not computed by fsdpd"},
    {"{" G3_SHAPE ", \"attn_logit_softcapping\": 50.0}", "attn_logit_softcapping = 50 soft-caps logits"},
    {"{" G3_SHAPE ", \"final_logit_softcapping\": 30.0}", "final_logit_softcapping = 30 soft-caps logits"},
    {"{" G3_SHAPE ", \"attention_bias\": true}", "attention_bias = true is not computed by fsdpd"},
    {"{" G3_SHAPE ", \"tie_word_embeddings\": false}", "tie_word_embeddings = false is not computed by fsdpd"},
    {"{" G3_SHAPE ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}",
     "the global layers' rope_type 'yarn' is not computed"},
    {"{" G3_SHAPE ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\"}, \"sliding_attention\": "
     "{\"rope_type\": \"linear\", \"factor\": 2.0}}}", "sliding_attention rope_type 'linear' is not computed"},
    {"{" G3_SHAPE ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}",
     "rope_parameters must be an object of full_attention and sliding_attention"},
    {"{" G3_SHAPE ", \"use_bidirectional_attention\": true}", "use_bidirectional_attention = true"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    hf_config h;
    CHECK(parse(bad[i].json, &h) != FSDP_OK);
    CHECK(has(bad[i].needle) && !strchr(fsdp_last_error(), '\n'));
  }
}

/* An export's config: the source's every field, the dtype in the source's own key. */
static void test_export_config(void) {
  json_t *src4 = json_loads("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": 32, \"vocab_size\": "
                            "256, \"n_positions\": 64, \"bos_token_id\": 7, \"torch_dtype\": \"bfloat16\", "
                            "\"transformers_version\": \"4.40.0\", \"custom\": [1, 2]}", 0, NULL);
  hf_config h;
  CHECK_OK(hf_config_parse(src4, "c", &h));
  json_t *o = hf_config_json(&h.model, src4, "float32");
  CHECK(o && json_integer_value(json_object_get(o, "bos_token_id")) == 7 && json_object_get(o, "custom"));
  CHECK(!strcmp(json_string_value(json_object_get(o, "torch_dtype")), "float32") && !json_object_get(o, "dtype"));
  json_decref(o);
  json_object_del(src4, "torch_dtype");
  json_object_set_new(src4, "transformers_version", json_string("5.2.0"));
  o = hf_config_json(&h.model, src4, "bfloat16");
  CHECK(o && !strcmp(json_string_value(json_object_get(o, "dtype")), "bfloat16"));
  json_decref(o);
  json_decref(src4);
  /* fsdpd's own: reads back as the model, with its positions, tie and rope */
  model_config m = {.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 32, .ffn_dim = 64,
                    .vocab_size = 99, .seq_len = 16, .n_positions = 4096, .norm_eps = 1e-6, .rope_theta = 5e5,
                    .tie_embeddings = 1, .rope_scaling = ROPE_SCALING_LLAMA3, .rope_factor = 8,
                    .rope_low_freq_factor = 1, .rope_high_freq_factor = 4, .rope_original_max_pos = 512};
  o = hf_config_json(&m, NULL, "float32");
  CHECK_OK(hf_config_parse(o, "own", &h));
  h.model.seq_len = m.seq_len;
  /* field by field: the structs' padding bytes are not part of the model */
  const model_config *g = &h.model;
  CHECK(g->arch == m.arch && g->n_layer == m.n_layer && g->n_head == m.n_head && g->n_kv_head == m.n_kv_head);
  CHECK(g->n_embd == m.n_embd && g->ffn_dim == m.ffn_dim && g->vocab_size == m.vocab_size && g->seq_len == m.seq_len);
  CHECK(g->n_positions == m.n_positions && g->norm_eps == m.norm_eps && g->rope_theta == m.rope_theta);
  CHECK(g->tie_embeddings == m.tie_embeddings && g->rope_scaling == m.rope_scaling && g->rope_factor == m.rope_factor);
  CHECK(g->rope_low_freq_factor == m.rope_low_freq_factor && g->rope_high_freq_factor == m.rope_high_freq_factor);
  CHECK(g->rope_original_max_pos == m.rope_original_max_pos);
  json_decref(o);
  CHECK(!strcmp(hf_config_key(ARCH_LLAMA, "n_embd"), "hidden_size") && !strcmp(hf_config_key(ARCH_GPT2, "n_embd"), "n_embd"));
  CHECK(!hf_config_key(ARCH_GPT2, "ffn_dim") && !hf_config_key(ARCH_LLAMA, "seq_len"));
}

int main(void) {
  test_llama_forms();
  test_llama_mixed_rope();
  test_gpt2();
  test_family();
  test_refused();
  test_pad_dropout();
  test_export_config();
  test_gemma3();
  return check_done();
}
