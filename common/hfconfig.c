/* hfconfig — config.json in and out; see hfconfig.h. */
#include "hfconfig.h"

#include "arch.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "st_model.h"

#define HF_MAX_INT 16777216
#define HF_MAX_CONFIG ((size_t)16 << 20)   /* a config.json is kilobytes */

const char *hf_config_key(model_arch arch, const char *key) {
  const arch_desc *d = arch_get(arch);
  return d ? arch_hf_key_of(d, key) : NULL;
}

/* ---- reading ---- */

fsdp_status hf_get_int(const json_t *o, const char *path, const char *key, int dflt, int *v) {
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

fsdp_status hf_get_num(const json_t *o, const char *path, const char *key, double dflt, double *v) {
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

fsdp_status hf_want_bool(const json_t *o, const char *path, const char *key, int want, const char *why) {
  json_t *x = json_object_get(o, key);
  if (!x || json_is_null(x) || (json_is_boolean(x) && json_boolean_value(x) == want)) return FSDP_OK;
  return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: %s = %s is not computed by fsdpd (%s); allowed: %s", path, key,
                        json_is_boolean(x) ? (json_boolean_value(x) ? "true" : "false") : "not a boolean", why,
                        want ? "true" : "false");
}

/* The first non-zero of D's dropout keys in O (absent: the class's default) into OUT. */
static fsdp_status dropout_of(const arch_desc *d, const json_t *o, const char *path, hf_config *out) {
  for (const arch_dropout *k = d->dropout; k && k->key; k++) {
    const json_t *x = json_object_get(o, k->key);
    int absent = !x || json_is_null(x);
    double p = absent ? k->dflt : json_number_value(x);
    if (!absent && (!json_is_number(x) || !(p >= 0 && p <= 1)))
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s must be a dropout probability in 0..1", path, k->key);
    if (p != 0 && !out->dropout_key[0]) {
      snprintf(out->dropout_key, sizeof out->dropout_key, "%s", k->key);
      out->dropout = p;
      out->dropout_default = absent;
    }
  }
  return FSDP_OK;
}

fsdp_status hf_config_parse(const json_t *o, const char *path, hf_config *out) {
  memset(out, 0, sizeof *out);
  if (!json_is_object(o)) return fsdp_set_error(FSDP_ERR_FORMAT, "%s is not a JSON object", path);
  const char *type = json_string_value(json_object_get(o, "model_type"));
  char types[128];
  if (!type)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s has no model_type; allowed: %s (a config.json as "
                          "save_pretrained writes it)", path, arch_names(types, sizeof types, ", ", 1));
  model_config *m = &out->model;
  m->rope_factor = 8, m->rope_low_freq_factor = 1, m->rope_high_freq_factor = 4, m->rope_original_max_pos = 8192;
  m->pad_token_id = -1;   /* the architecture's reader sets it where its embedding has a padding_idx */
  const arch_desc *d = arch_by_hf_type(type);
  if (!d)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: model_type '%s' is not a model fsdpd computes; allowed: %s", path,
                          type, arch_names(types, sizeof types, ", ", 1));
  m->arch = d->id;
  arch_ext_defaults(m);   /* the architecture's own settings a config leaves out */
  TRY(d->hf_parse(o, path, m));
  TRY(dropout_of(d, o, path, out));
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

fsdp_status hf_check_init_folder(const char *weights, model_arch arch) {
  const arch_desc *d = arch_get(arch);
  const char *slash = strrchr(weights, '/');
  if (!d || !slash) return FSDP_OK;
  char dir[4096], cfg[4200];
  snprintf(dir, sizeof dir, "%.*s", (int)(slash - weights), weights);
  snprintf(cfg, sizeof cfg, "%s/config.json", dir[0] ? dir : "/");
  char *text;
  size_t len;
  if (fsutil_read_all(AT_FDCWD, cfg, HF_MAX_CONFIG, &text, &len) != FSDP_OK) return FSDP_OK;   /* none beside it */
  json_t *o = json_loadb(text, len, 0, NULL);
  free(text);
  const char *type = json_string_value(json_object_get(o, "model_type"));
  fsdp_status rc = FSDP_OK;
  if (type && strcmp(type, d->hf_model_type))
    rc = fsdp_set_error(FSDP_ERR_INVALID, "%s is beside %s, whose model_type is '%s', but the job has arch = %s; "
                        "allowed: from = %s in place of init (its config.json sets the model)", weights, cfg, type, d->name,
                        dir);
  json_decref(o);
  return rc;
}

/* ---- writing ---- */

json_t *hf_config_json(const model_config *m, const json_t *source, const char *dtype) {
  if (!source) {
    const arch_desc *d = arch_get(m->arch);
    json_t *o = d ? d->hf_own_config(m) : NULL;
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
