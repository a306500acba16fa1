/* hfconfig — a Hugging Face model folder's config.json (GPT2Config, LlamaConfig; the forms transformers 4
 * and 5 save) read into fsdpd's model_config, and written back for an export. The model_type picks the
 * architecture's descriptor (models/arch.h), whose reader and own config these call.
 *
 * Reading: every shape key and every choice the config makes is read (a non-zero dropout is noted, for
 * the job to refuse or to train without: jobspec.h's [model] dropout); what fsdpd's models do not compute
 * (a rope type other than default and llama3, biases, another activation or head size, GPT-2's
 * non-default attention scaling) is refused in one line naming the key and its value, never
 * approximated. Transformers 5 keeps the rotary base and scaling in "rope_parameters"; 4 in
 * "rope_theta" and "rope_scaling" (type or rope_type). The dtype field is "dtype" (5) or "torch_dtype" (4).
 *
 * Writing: hf_config_json() starts from the source folder's config (every field carried over) or, with
 * none, from fsdpd's own GPT2Config / LlamaConfig, and sets the model's shapes and the export's dtype in
 * the field the source used. Plain functions over jansson values; no state; any thread.
 */
#ifndef FSDP_HFCONFIG_H
#define FSDP_HFCONFIG_H

#include <jansson.h>
#include <stddef.h>

#include "err.h"
#include "jobspec.h"

typedef struct hf_config {
  model_config model;   /* arch and every shape key; seq_len 0 (the job's own key); n_positions the config's */
  int tf_major;         /* the major version of "transformers_version" (4, 5), 0 when absent */
  char dtype[16];       /* the weights' dtype as the config names it ("float32", "bfloat16"), "" when absent */
  /* The first of the architecture's dropout keys (arch.h's arch_desc.dropout) that is not 0, its
   * value and whether it is the config class's default (the key absent); "" and 0 when none is. */
  char dropout_key[32];
  double dropout;
  int dropout_default;
} hf_config;

/* Read PATH (a config.json). */
fsdp_status hf_config_load(const char *path, hf_config *out);
/* The same from an object already read; PATH names it in messages. */
fsdp_status hf_config_parse(const json_t *o, const char *path, hf_config *out);

/* For the architectures' readers (models/<name>/<name>_arch.c), PATH naming O in messages: KEY as an
 * integer in 1..16777216 (absent or null: DFLT, or refused when DFLT < 0), as a positive number
 * (absent: DFLT, refused when DFLT is NaN), and a boolean that must be WANT when present (WHY: what
 * fsdpd computes instead). */
fsdp_status hf_get_int(const json_t *o, const char *path, const char *key, int dflt, int *v);
fsdp_status hf_get_num(const json_t *o, const char *path, const char *key, double dflt, double *v);
fsdp_status hf_want_bool(const json_t *o, const char *path, const char *key, int want, const char *why);

/* The config.json key that carries [model] KEY for ARCH ("hidden_size" for n_embd under llama), or NULL
 * when the config has none (seq_len, init, from). */
const char *hf_config_key(model_arch arch, const char *key);

/* A weights file WEIGHTS given by [model] init (a .safetensors or an index) for a job of ARCH: when
 * the file's folder holds a config.json that names another model_type (a Mistral folder under arch =
 * llama, whose tensor names are Llama's), FSDP_ERR_INVALID naming both and from = DIR; FSDP_OK when
 * the types agree or the folder has no readable config.json with a model_type. */
fsdp_status hf_check_init_folder(const char *weights, model_arch arch);

/* The weights of the folder DIR: DIR/model.safetensors.index.json when it exists, else
 * DIR/model.safetensors; FSDP_ERR_NOTFOUND naming both when neither does. */
fsdp_status hf_weights_path(const char *dir, char *out, size_t n);

/* The config of an export of M with weights in DTYPE ("float32" or "bfloat16"): SOURCE (a folder's
 * config.json, borrowed; NULL for none) with the shapes of M, or fsdpd's own config. New reference. */
json_t *hf_config_json(const model_config *m, const json_t *source, const char *dtype);

#endif
