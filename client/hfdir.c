/* hfdir — a Hugging Face model folder out; see hfdir.h. */
#include "hfdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hfconfig.h"
#include "safetensors.h"

#define HFDIR_MAX_COPY ((off_t)1 << 30)   /* a tokenizer file is megabytes; refuse anything silly */

/* What AutoTokenizer (and generate's defaults) read from a folder, copied when the source has them. */
static const char *const tokenizer_files[] = {
  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
  "merges.txt", "tokenizer.model", "chat_template.jinja", "generation_config.json", NULL};

/* DIR created, or an existing empty directory that is no link. */
static fsdp_status make_dir(const char *dir) {
  if (mkdir(dir, 0755) == 0) return FSDP_OK;
  if (errno != EEXIST) return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
  struct stat st;
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s exists and is not a directory (a link is not followed); allowed: a new "
                          "folder, or an empty one", dir);
  DIR *d = opendir(dir);
  if (!d) return fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
  struct dirent *e;
  int empty = 1;
  while (empty && (e = readdir(d)))
    empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
  closedir(d);
  if (!empty)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s is not empty; allowed: a new folder, or an empty one (an export "
                          "never mixes its files with others)", dir);
  return FSDP_OK;
}

fsdp_status hfdir_write_file(const char *dir, const char *name, const char *text, size_t len) {
  char path[PATH_MAX], tmp[PATH_MAX + 8];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
    return fsdp_set_error(FSDP_ERR_RANGE, "the path %s/%s is too long", dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  unlink(tmp);   /* a stale temporary, or a link in its place: never written through */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += (size_t)w;
  }
  int ok = off == len && fsync(fd) == 0, err = errno;
  if (close(fd) != 0 && ok) ok = 0, err = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, err = errno;
  if (!ok) {
    unlink(tmp);
    return fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", path, strerror(err));
  }
  return FSDP_OK;
}

static fsdp_status write_json(const char *dir, const char *name, json_t *o) {
  char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
  if (!text) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory building %s/%s", dir, name);
  size_t n = strlen(text);
  text[n] = '\n';   /* json_dumps' terminator becomes the newline */
  fsdp_status rc = hfdir_write_file(dir, name, text, n + 1);
  free(text);
  return rc;
}

/* The weights: which file each tensor goes to, then one writer per file, then the index. */
static fsdp_status write_weights(const char *dir, const plan_t *p, float *const *units, const hfdir_opts *o,
                                 int *nfiles) {
  int n = 0;
  for (int u = 0; u < p->nunits; u++) n += p->units[u].ntensors;
  int *file = calloc((size_t)n, sizeof *file);
  if (!file) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  int bytes = jobspec_dtype_bytes(o->dtype), nf = 0, cur = -1, k = 0;
  uint64_t used = 0, total = 0;
  for (int u = 0; u < p->nunits; u++)
    for (int j = 0; j < p->units[u].ntensors; j++, k++) {
      uint64_t size = (uint64_t)p->units[u].t[j].numel * (uint64_t)bytes;
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
    char name[64], path[PATH_MAX];
    if (nf == 1) snprintf(name, sizeof name, "model.safetensors");
    else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, nf);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    st_writer *w = NULL;
    rc = st_writer_new(path, &w);
    k = 0;
    for (int u = 0; u < p->nunits; u++)
      for (int j = 0; j < p->units[u].ntensors; j++, k++) {
        const plan_tensor *t = &p->units[u].t[j];
        if (file[k] != f || rc != FSDP_OK) continue;
        rc = st_writer_add(w, t->name, stname, t->shape, t->ndim, units[u] + t->offset);
        json_object_set_new(map, t->name, json_string(name));
      }
    if (rc == FSDP_OK) rc = st_writer_finish(&w);
    st_writer_destroy(&w);
  }
  if (rc == FSDP_OK && nf > 1) {
    json_t *idx = json_pack("{s:{s:I, s:I}, s:O}", "metadata", "total_parameters", (json_int_t)p->n_params,
                            "total_size", (json_int_t)total, "weight_map", map);
    rc = write_json(dir, "model.safetensors.index.json", idx);
    json_decref(idx);
  }
  json_decref(map);
  free(file);
  *nfiles = nf;
  return rc;
}

/* SRC/NAME into memory: a regular file (no link), at most HFDIR_MAX_COPY bytes. *TEXT NULL: it is absent. */
static fsdp_status read_source(const char *src, const char *name, char **text, size_t *len) {
  char path[PATH_MAX];
  *text = NULL;
  snprintf(path, sizeof path, "%s/%s", src, name);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? FSDP_OK : fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", path, strerror(errno));
  struct stat st;
  fsdp_status rc = FSDP_OK;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > HFDIR_MAX_COPY) {
    rc = fsdp_set_error(FSDP_ERR_INVALID, "%s is not a regular file of at most 1 GiB", path);
  } else if (!(*text = malloc((size_t)st.st_size + 1))) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", path);
  } else {
    size_t off = 0;
    ssize_t r = 1;
    while (off < (size_t)st.st_size && (r = read(fd, *text + off, (size_t)st.st_size - off)) > 0) off += (size_t)r;
    if (off != (size_t)st.st_size) {
      rc = fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", path, r < 0 ? strerror(errno) : "it shrank");
      free(*text);
      *text = NULL;
    }
    *len = off;
  }
  close(fd);
  return rc;
}

static fsdp_status copy_tokenizer(const char *dir, const char *src) {
  for (int i = 0; tokenizer_files[i]; i++) {
    char *text;
    size_t len = 0;
    TRY(read_source(src, tokenizer_files[i], &text, &len));
    if (!text) continue;
    fsdp_status rc = hfdir_write_file(dir, tokenizer_files[i], text, len);
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

fsdp_status hfdir_write(const char *dir, const plan_t *p, float *const *units, const hfdir_opts *o, int *nfiles) {
  json_t *source = NULL;
  if (o->source) {
    char path[PATH_MAX];
    json_error_t err;
    snprintf(path, sizeof path, "%s/config.json", o->source);
    if (!(source = json_load_file(path, 0, &err)))
      return fsdp_set_error(FSDP_ERR_NOTFOUND, "cannot read %s, the config of the folder the model came from: %s",
                            path, err.text);
  }
  fsdp_status rc = make_dir(dir);
  if (rc == FSDP_OK) rc = write_weights(dir, p, units, o, nfiles);
  json_t *cfg = rc == FSDP_OK ? hf_config_json(&p->model, source, o->dtype == DTYPE_BF16 ? "bfloat16" : "float32")
                              : NULL;
  if (rc == FSDP_OK) rc = write_json(dir, "config.json", cfg);
  if (rc == FSDP_OK && o->source) rc = copy_tokenizer(dir, o->source);
  json_decref(cfg);
  json_decref(source);
  return rc;
}
