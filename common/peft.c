/* peft — see peft.h. */
#include "peft.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "fsutil.h"
#include "safetensors.h"

#define PEFT_CONFIG_MAX (1 << 20)

/* Whether peft's target_modules list T names module PATH (a name, or a suffix of whole parts). */
static int json_names(const json_t *t, const char *path) {
  size_t i, pl = strlen(path);
  json_t *v;
  if (json_is_string(t)) return !strcmp(json_string_value(t), path);   /* a regex in peft: taken literally */
  json_array_foreach(t, i, v) {
    const char *n = json_string_value(v);
    size_t nl = n ? strlen(n) : 0;
    if (n && nl <= pl && !strcmp(path + pl - nl, n) && (nl == pl || path[pl - nl - 1] == '.')) return 1;
  }
  return 0;
}

/* DIR's adapter_config.json as a JSON object into *OUT, its path into PATH; WHO names the reader. */
static fsdp_status load_config(const char *dir, const char *who, char *path, size_t n, json_t **out) {
  char *text = NULL;
  size_t len = 0;
  snprintf(path, n, "%s/adapter_config.json", dir);
  TRY(fsutil_read_all(AT_FDCWD, path, PEFT_CONFIG_MAX, &text, &len));
  json_error_t jerr;
  json_t *o = json_loadb(text, len, 0, &jerr);
  free(text);
  if (!json_is_object(o)) {
    json_decref(o);
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: %s is not a JSON object (line %d: %s)", who, path, jerr.line, jerr.text);
  }
  *out = o;
  return FSDP_OK;
}

static fsdp_status check_config(const plan_t *p, const char *dir, const char *who) {
  char path[JOBSPEC_PATH_MAX + 32];
  json_t *o = NULL;
  TRY(load_config(dir, who, path, sizeof path, &o));
  const char *type = json_string_value(json_object_get(o, "peft_type"));
  json_t *r = json_object_get(o, "r"), *alpha = json_object_get(o, "lora_alpha"), *t = json_object_get(o, "target_modules");
  fsdp_status rc = FSDP_OK;
  if (!type || strcmp(type, "LORA"))
    rc = fsdp_set_error(FSDP_ERR_INVALID, "%s: %s has peft_type %s; allowed: a LoRA adapter (LORA)", who, path,
                        type ? type : "(none)");
  else if (!json_is_integer(r) || json_integer_value(r) != p->lora.rank)
    rc = fsdp_set_error(FSDP_ERR_INVALID, "%s: %s is an adapter of rank r = %lld, the job's rank is %d; "
                        "allowed: an adapter of the job's rank (or set [lora] rank = %lld)", who, path,
                        (long long)json_integer_value(r), p->lora.rank, (long long)json_integer_value(r));
  else if (!json_is_number(alpha) || json_number_value(alpha) != p->lora.alpha)
    rc = fsdp_set_error(FSDP_ERR_INVALID, "%s: %s has lora_alpha = %g, the job's alpha is %g; allowed: "
                        "the same alpha", who, path, json_number_value(alpha), p->lora.alpha);
  for (int j = 0; rc == FSDP_OK && j < p->lora.nmods; j++)
    if (!json_names(t, p->lora.mod[j].path))
      rc = fsdp_set_error(FSDP_ERR_INVALID, "%s: %s's target_modules do not include %s, which [lora] "
                          "targets adapt; allowed: an adapter of the same targets", who, path, p->lora.mod[j].path);
  json_decref(o);
  return rc;
}

fsdp_status peft_load(const plan_t *p, const char *dir, float *out, const char *who) {
  TRY(check_config(p, dir, who));
  char path[JOBSPEC_PATH_MAX + 32], name[160];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  st_file *f = NULL;
  TRY(st_open(path, &f));
  fsdp_status rc = FSDP_OK;
  const plan_lora *l = &p->lora;
  int64_t r = l->rank;
  int found = 0;
  for (int b = 0; rc == FSDP_OK && b < p->model.n_layer; b++)
    for (int j = 0; rc == FSDP_OK && j < l->nmods; j++)
      for (int ab = 0; rc == FSDP_OK && ab < 2; ab++) {
        const plan_lora_mod *m = &l->mod[j];
        int64_t shape[2] = {ab ? m->out : r, ab ? r : m->in};
        plan_lora_name(p, b, j, ab, name, sizeof name);
        int i = st_find(f, name);
        if (i < 0) {
          rc = fsdp_set_error(FSDP_ERR_NOTFOUND, "%s: %s has no %s; allowed: an adapter of this model "
                              "with the job's targets", who, path, name);
        } else if (st_ndim(f, i) != 2 || st_shape(f, i)[0] != shape[0] || st_shape(f, i)[1] != shape[1]) {
          rc = fsdp_set_error(FSDP_ERR_INVALID, "%s: %s's %s is not [%lld, %lld] (an adapter of another "
                              "base model?); allowed: an adapter of this model", who, path, name, (long long)shape[0],
                              (long long)shape[1]);
        } else {
          found++;
          if (out) rc = st_read(f, name, shape, 2, out + (int64_t)b * l->block_numel + (ab ? m->b_off : m->a_off));
        }
      }
  for (int i = 0; rc == FSDP_OK && i < st_count(f); i++)
    if (strstr(st_name(f, i), ".lora_") && found-- <= 0)
      rc = fsdp_set_error(FSDP_ERR_INVALID, "%s: %s holds adapters the job does not have (%s); allowed: "
                          "an adapter of the job's targets and layers", who, path, st_name(f, i));
  st_destroy(&f);
  return rc;
}

static json_t *config_json(const plan_t *p, const char *base) {
  const arch_desc *d = arch_get(p->model.arch);
  json_t *t = json_array();
  for (int j = 0; j < p->lora.nmods; j++) json_array_append_new(t, json_string(p->lora.mod[j].path));
  /* no folder (a random base, or one read from a weights file alone): null, as peft writes for a base
   * without a name, never a path from_pretrained cannot load */
  return json_pack("{s:s, s:s, s:o, s:i, s:f, s:f, s:o, s:s, s:b, s:b, s:b, s:b, s:b, s:o, s:o}",
                   "peft_type", "LORA", "task_type", "CAUSAL_LM", "base_model_name_or_path",
                   base && *base ? json_string(base) : json_null(), "r", p->lora.rank,
                   "lora_alpha", p->lora.alpha, "lora_dropout", 0.0, "target_modules", t, "bias", "none",
                   "fan_in_fan_out", !strcmp(d->layout, "Conv1D"), "inference_mode", 1, "init_lora_weights", 1,
                   "use_rslora", 0, "use_dora", 0, "rank_pattern", json_object(), "alpha_pattern", json_object());
}

fsdp_status peft_save(const plan_t *p, const float *adapters, const char *dir, const char *base) {
  fsutil_out out = FSUTIL_OUT_INIT;
  TRY(fsutil_out_dir(dir, &out));
  const plan_lora *l = &p->lora;
  char(*names)[160] = calloc((size_t)(2 * p->model.n_layer * l->nmods), sizeof *names);
  st_writer *w = NULL;
  fsdp_status rc = names ? st_writer_new_at(out.dirfd, out.shown, "adapter_model.safetensors", &w)
                         : fsdp_set_error(FSDP_ERR_NOMEM, "out of memory naming the adapters");
  int k = 0;
  for (int b = 0; rc == FSDP_OK && b < p->model.n_layer; b++)
    for (int j = 0; rc == FSDP_OK && j < l->nmods; j++)
      for (int ab = 0; rc == FSDP_OK && ab < 2; ab++, k++) {
        const plan_lora_mod *m = &l->mod[j];
        int64_t shape[2] = {ab ? m->out : l->rank, ab ? l->rank : m->in};
        plan_lora_name(p, b, j, ab, names[k], sizeof names[k]);
        rc = st_writer_add(w, names[k], "F32", shape, 2,
                           adapters + (int64_t)b * l->block_numel + (ab ? m->b_off : m->a_off));
      }
  if (rc == FSDP_OK) rc = st_writer_finish(&w);
  st_writer_destroy(&w);
  free(names);
  if (rc == FSDP_OK) rc = fsutil_out_claim(&out, "adapter_model.safetensors");
  json_t *o = rc == FSDP_OK ? config_json(p, base) : NULL;
  char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
  json_decref(o);
  if (rc == FSDP_OK && !text) rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory building %s/adapter_config.json", dir);
  if (rc == FSDP_OK) rc = fsutil_out_write(&out, "adapter_config.json", text, strlen(text), 0644);
  free(text);
  if (rc == FSDP_OK) fsutil_out_close(&out);
  else fsutil_out_discard(&out);
  return rc;
}

fsdp_status peft_read_config(const char *dir, jobspec_t *spec) {
  char path[JOBSPEC_PATH_MAX + 32];
  json_t *o = NULL;
  TRY(load_config(dir, "--adapter", path, sizeof path, &o));
  const char *type = json_string_value(json_object_get(o, "peft_type"));
  json_t *r = json_object_get(o, "r"), *alpha = json_object_get(o, "lora_alpha"), *t = json_object_get(o, "target_modules");
  const char *flags[] = {"use_dora", "use_rslora"}, *patterns[] = {"rank_pattern", "alpha_pattern"};
  fsdp_status rc = FSDP_OK;
  if (!type || strcmp(type, "LORA"))
    rc = fsdp_set_error(FSDP_ERR_INVALID, "--adapter: %s has peft_type %s; allowed: a LoRA adapter (LORA)", path,
                        type ? type : "(none)");
  else if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > 4096 || !json_is_number(alpha) ||
           !(json_number_value(alpha) > 0))
    rc = fsdp_set_error(FSDP_ERR_INVALID, "--adapter: %s has no rank r in 1..4096 and positive lora_alpha", path);
  for (int i = 0; rc == FSDP_OK && i < 2; i++)
    if (json_is_true(json_object_get(o, flags[i])))
      rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "--adapter: %s has %s = true, which fsdpd does not compute; allowed: "
                          "plain LoRA", path, flags[i]);
  for (int i = 0; rc == FSDP_OK && i < 2; i++)
    if (json_object_size(json_object_get(o, patterns[i])))
      rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "--adapter: %s has a %s (per-module values), which fsdpd does not "
                          "compute; allowed: one rank and alpha for every target", path, patterns[i]);
  size_t used = 0, i;
  json_t *v;
  if (rc == FSDP_OK && json_is_string(t)) rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "--adapter: %s's target_modules "
                                                              "is a regular expression; allowed: a list of names", path);
  else if (rc == FSDP_OK && !json_array_size(t)) rc = fsdp_set_error(FSDP_ERR_INVALID, "--adapter: %s lists no "
                                                                     "target_modules", path);
  json_array_foreach(t, i, v) {
    if (rc != FSDP_OK) break;
    const char *n = json_string_value(v);
    if (!n) rc = fsdp_set_error(FSDP_ERR_INVALID, "--adapter: %s's target_modules[%zu] is not a name", path, i);
    else used += (size_t)snprintf(spec->lora.targets + used, sizeof spec->lora.targets - used, "%s%s", i ? ", " : "", n);
    if (rc == FSDP_OK && used >= sizeof spec->lora.targets)
      rc = fsdp_set_error(FSDP_ERR_RANGE, "--adapter: %s's target_modules are too long", path);
  }
  if (rc == FSDP_OK) {
    spec->lora.rank = (int)json_integer_value(r);
    spec->lora.alpha = json_number_value(alpha);
    spec->lora.dropout = 0;
  }
  json_decref(o);
  return rc;
}

void peft_merge(const plan_t *p, float *whole, const float *adapters) {
  const arch_desc *d = arch_get(p->model.arch);
  const plan_lora *l = &p->lora;
  int conv1d = !strcmp(d->layout, "Conv1D");   /* W is [in, out], else [out, in] */
  int64_t r = l->rank;
  for (int b = 0; b < p->model.n_layer; b++)
    for (int j = 0; j < l->nmods; j++) {
      const plan_lora_mod *m = &l->mod[j];
      char blk[64], name[160];
      snprintf(blk, sizeof blk, d->lora_block_hf, b);
      snprintf(name, sizeof name, "%s%s.weight", blk, m->path);
      int u = -1;
      const plan_tensor *t = plan_find_tensor(p, name, &u);
      if (!t) continue;   /* plan_lora_build found every target's weight */
      float *W = whole + p->units[u].shard_base + t->offset;
      const float *A = adapters + (int64_t)b * l->block_numel + m->a_off;   /* [r, in] */
      const float *B = adapters + (int64_t)b * l->block_numel + m->b_off;   /* [out, r] */
      for (int64_t o = 0; o < m->out; o++)
        for (int64_t i = 0; i < m->in; i++) {
          double acc = 0;
          for (int64_t k = 0; k < r; k++) acc += (double)B[o * r + k] * (double)A[k * m->in + i];
          float *w = conv1d ? &W[i * m->out + o] : &W[o * m->in + i];
          *w = (float)((double)*w + (double)l->scale * acc);
        }
    }
}
