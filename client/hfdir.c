/* hfdir — a Hugging Face model folder out; see hfdir.h. */
#include "hfdir.h"

#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "hfconfig.h"
#include "safetensors.h"

#define HFDIR_MAX_COPY ((size_t)1 << 30)   /* a tokenizer file is megabytes; refuse anything silly */

/* What AutoTokenizer (and generate's defaults) read from a folder, copied when the source has them. */
static const char *const tokenizer_files[] = {
  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
  "merges.txt", "tokenizer.model", "chat_template.jinja", "generation_config.json", NULL};

static fsdp_status write_json(fsutil_out *out, const char *name, json_t *o) {
  char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
  if (!text) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory building %s/%s", out->shown, name);
  size_t n = strlen(text);
  text[n] = '\n';   /* json_dumps' terminator becomes the newline */
  fsdp_status rc = fsutil_out_write(out, name, text, n + 1, 0644);
  free(text);
  return rc;
}

/* The weights: which file each tensor goes to, then one writer per file, then the index. */
static fsdp_status write_weights(fsutil_out *out, const plan_t *p, float *const *units, const hfdir_opts *o,
                                 int *nfiles) {
  int n = 0;
  for (int u = 0; u < p->nunits; u++) n += p->units[u].ntensors;
  int *file = calloc((size_t)n, sizeof *file);
  if (!file) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  int bytes = jobspec_dtype_bytes(o->dtype), nf = 0, cur = -1, k = 0;
  uint64_t used = 0, total = 0;
  for (int u = 0; u < p->nunits; u++)
    for (int j = 0; j < p->units[u].ntensors; j++, k++) {
      const plan_tensor *t = &p->units[u].t[j];
      int64_t fshape[2];
      if (!plan_tensor_file_shape(t, fshape)) {   /* a fused tensor's later part: in its first part's file */
        file[k] = file[k - 1];
        continue;
      }
      uint64_t size = (uint64_t)(t->ndim == 2 ? fshape[0] * fshape[1] : t->numel) * (uint64_t)bytes;
      total += size;
      if (size > o->max_shard) {   /* alone in its own file, as transformers does */
        file[k] = nf++;
        continue;
      }
      if (cur < 0 || used + size > o->max_shard) cur = nf++, used = 0;
      file[k] = cur;
      used += size;
    }
  fsdp_status rc = FSDP_OK;
  json_t *map = json_object();
  const char *stname = o->dtype == DTYPE_BF16 ? "BF16" : "F32";
  for (int f = 0; rc == FSDP_OK && f < nf; f++) {
    char name[64];
    if (nf == 1) snprintf(name, sizeof name, "model.safetensors");
    else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, nf);
    st_writer *w = NULL;
    rc = st_writer_new_at(out->dirfd, out->shown, name, &w);
    k = 0;
    for (int u = 0; u < p->nunits; u++)
      for (int j = 0; j < p->units[u].ntensors; j++, k++) {
        const plan_tensor *t = &p->units[u].t[j];
        int64_t fshape[2];
        if (file[k] != f || rc != FSDP_OK || !plan_tensor_file_shape(t, fshape)) continue;
        rc = st_writer_add(w, t->name, stname, t->ndim == 2 ? fshape : t->shape, t->ndim, units[u] + t->offset);
        json_object_set_new(map, t->name, json_string(name));
      }
    if (rc == FSDP_OK) rc = st_writer_finish(&w);
    if (rc == FSDP_OK) rc = fsutil_out_claim(out, name);
    st_writer_destroy(&w);
  }
  if (rc == FSDP_OK && nf > 1) {
    json_t *idx = json_pack("{s:{s:I, s:I}, s:O}", "metadata", "total_parameters", (json_int_t)p->n_params,
                            "total_size", (json_int_t)total, "weight_map", map);
    rc = write_json(out, "model.safetensors.index.json", idx);
    json_decref(idx);
  }
  json_decref(map);
  free(file);
  *nfiles = nf;
  return rc;
}

/* The source folder's tokenizer files, each read as fsutil_open_read allows (no other user's link; as
 * root, root's files only) and written new in OUT; an absent one is passed over. */
static fsdp_status copy_tokenizer(fsutil_out *out, const char *src) {
  for (int i = 0; tokenizer_files[i]; i++) {
    char path[PATH_MAX], *text;
    size_t len = 0;
    if (snprintf(path, sizeof path, "%s/%s", src, tokenizer_files[i]) >= (int)sizeof path)
      return fsdp_set_error(FSDP_ERR_RANGE, "the path %s is too long", src);
    fsdp_status rc = fsutil_read_all(AT_FDCWD, path, HFDIR_MAX_COPY, &text, &len);
    if (rc == FSDP_ERR_NOTFOUND) continue;
    TRY(rc);
    rc = fsutil_out_write(out, tokenizer_files[i], text, len, 0644);
    free(text);
    TRY(rc);
  }
  return FSDP_OK;
}

dtype_kind hfdir_source_dtype(const char *src) {
  char path[PATH_MAX];
  hf_config hc;
  snprintf(path, sizeof path, "%s/config.json", src);
  return hf_config_load(path, &hc) == FSDP_OK && !strcmp(hc.dtype, "bfloat16") ? DTYPE_BF16 : DTYPE_FP32;
}

fsdp_status hfdir_write_to(fsutil_out *out, const plan_t *p, float *const *units, const hfdir_opts *o, int *nfiles) {
  json_t *source = NULL;
  if (o->source) {
    char path[PATH_MAX], *text;
    size_t len;
    json_error_t err;
    snprintf(path, sizeof path, "%s/config.json", o->source);
    fsdp_status rc = fsutil_read_all(AT_FDCWD, path, HFDIR_MAX_COPY, &text, &len);
    if (rc != FSDP_OK) {
      char why[1024];
      snprintf(why, sizeof why, "%s", fsdp_last_error());
      return fsdp_set_error(rc, "the config of the folder the model came from: %s", why);
    }
    source = json_loadb(text, len, 0, &err);
    free(text);
    if (!source)
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s, the config of the folder the model came from, is not JSON (line %d)",
                            path, err.line);
  }
  fsdp_status rc = write_weights(out, p, units, o, nfiles);
  json_t *cfg = rc == FSDP_OK ? hf_config_json(&p->model, source, o->dtype == DTYPE_BF16 ? "bfloat16" : "float32")
                              : NULL;
  if (rc == FSDP_OK) rc = write_json(out, "config.json", cfg);
  if (rc == FSDP_OK && o->source) rc = copy_tokenizer(out, o->source);
  json_decref(cfg);
  json_decref(source);
  return rc;
}

fsdp_status hfdir_write(const char *dir, const plan_t *p, float *const *units, const hfdir_opts *o, int *nfiles) {
  fsutil_out out;
  TRY(fsutil_out_dir(dir, &out));
  fsdp_status rc = hfdir_write_to(&out, p, units, o, nfiles);
  if (rc == FSDP_OK) fsutil_out_close(&out);
  else fsutil_out_discard(&out);
  return rc;
}
