/* st_model — weights in one file or in indexed shards; see st_model.h. */
#include "st_model.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "fsutil.h"

#define ST_INDEX_SUFFIX ".index.json"
#define ST_MAX_INDEX ((size_t)256 << 20)   /* an index of a trillion-parameter model is megabytes */

typedef struct st_shard {
  char *path;        /* absolute or as given: the index's directory + the file name */
  st_file *f;        /* NULL until opened */
} st_shard;

typedef struct st_wentry {
  char *name;        /* as listed */
  int shard;
} st_wentry;

struct st_model {
  char *path;
  int nshards, opened;
  st_shard *shards;
  int nnames;
  st_wentry *names;  /* the index's weight_map; empty for one file */
};

static int ends_with(const char *s, const char *sfx) {
  size_t n = strlen(s), m = strlen(sfx);
  return n >= m && !strcmp(s + n - m, sfx);
}

void st_model_destroy(st_model **pm) {
  st_model *m = pm ? *pm : NULL;
  if (!m) return;
  for (int i = 0; i < m->nshards; i++) {
    st_destroy(&m->shards[i].f);
    free(m->shards[i].path);
  }
  for (int i = 0; i < m->nnames; i++) free(m->names[i].name);
  free(m->shards);
  free(m->names);
  free(m->path);
  free(m);
  *pm = NULL;
}

int st_model_nfiles(const st_model *m) { return m->nshards; }
int st_model_opened(const st_model *m) { return m->opened; }

/* The shard index of FILE (added on first sight), or -1 with an error. */
static int shard_of(st_model *m, const char *file) {
  for (int i = 0; i < m->nshards; i++)
    if (!strcmp(strrchr(m->shards[i].path, '/') + 1, file)) return i;
  if (!*file || strchr(file, '/') || !strcmp(file, "..") || !ends_with(file, ".safetensors")) {
    fsdp_set_error(FSDP_ERR_FORMAT, "%s lists the file '%s'; allowed: a .safetensors file name in the index's own "
                   "folder", m->path, file);
    return -1;
  }
  const char *slash = strrchr(m->path, '/');
  int dlen = slash ? (int)(slash - m->path) : 1;
  size_t n = (size_t)dlen + strlen(file) + 2;
  char *path = malloc(n);
  if (!path) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", m->path), -1;
  snprintf(path, n, "%.*s/%s", dlen, slash ? m->path : ".", file);
  m->shards[m->nshards] = (st_shard){.path = path};
  return m->nshards++;
}

static fsdp_status read_index(st_model *m) {
  json_error_t err;
  char *text;
  size_t len;
  TRY(fsutil_read_all(AT_FDCWD, m->path, ST_MAX_INDEX, &text, &len));   /* no one else's link followed */
  json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
  free(text);
  if (!o) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s (line %d)", m->path, err.text, err.line);
  fsdp_status rc = FSDP_OK;
  json_t *wm = json_object_get(o, "weight_map");
  size_t n = json_object_size(wm);
  if (!json_is_object(wm) || !n) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s has no weight_map (an object of tensor name: shard file, as "
                        "save_pretrained writes it)", m->path);
    goto out;
  }
  m->shards = calloc(n, sizeof *m->shards);
  m->names = calloc(n, sizeof *m->names);
  if (!m->shards || !m->names) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", m->path);
    goto out;
  }
  const char *key;
  json_t *val;
  json_object_foreach(wm, key, val) {
    if (!json_is_string(val)) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: weight_map['%s'] is not a file name", m->path, key);
      goto out;
    }
    int s = shard_of(m, json_string_value(val));
    if (s < 0) {
      rc = FSDP_ERR_FORMAT;
      goto out;
    }
    if (!(m->names[m->nnames].name = strdup(key))) {
      rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", m->path);
      goto out;
    }
    m->names[m->nnames++].shard = s;
  }
out:
  json_decref(o);
  return rc;
}

fsdp_status st_model_open(const char *path, st_model **out) {
  *out = NULL;
  st_model *m = calloc(1, sizeof *m);
  if (!m || !(m->path = strdup(path))) {
    free(m);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory opening %s", path);
  }
  fsdp_status rc = FSDP_OK;
  if (ends_with(path, ST_INDEX_SUFFIX)) {
    rc = read_index(m);
  } else if (!(m->shards = calloc(1, sizeof *m->shards)) || !(m->shards[0].path = strdup(path))) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory opening %s", path);
  } else {
    m->nshards = 1;
  }
  if (rc != FSDP_OK) st_model_destroy(&m);
  *out = m;
  return rc;
}

static fsdp_status open_shard(st_model *m, int s, const st_file **f) {
  if (!m->shards[s].f) {
    TRY(st_open(m->shards[s].path, &m->shards[s].f));
    m->opened++;
  }
  *f = m->shards[s].f;
  return FSDP_OK;
}

/* st_lookup_fn over the index: the listed name (exact, else without the model's prefix). */
static fsdp_status lookup(void *ctx, const char *name, int need, const st_file **f, const char **where) {
  st_model *m = ctx;
  *f = NULL;
  *where = m->path;
  if (!m->nnames) return need ? open_shard(m, 0, f) : FSDP_OK;   /* one file */
  int hit = -1;
  for (int i = 0; i < m->nnames && hit < 0; i++)
    if (!strcmp(m->names[i].name, name)) hit = i;
  for (int i = 0; i < m->nnames && hit < 0; i++)
    if (!strcmp(st_bare_name(m->names[i].name), st_bare_name(name))) hit = i;
  if (hit < 0) return FSDP_ERR_NOTFOUND;
  fsdp_status rc = need ? open_shard(m, m->names[hit].shard, f) : FSDP_OK;
  if (rc == FSDP_ERR_NOTFOUND)   /* the tensor is listed; its file is missing (not "not in the index") */
    return fsdp_set_error(FSDP_ERR_IO, "%s lists tensor '%s' in %s, which is missing", m->path, m->names[hit].name,
                          m->shards[m->names[hit].shard].path);
  return rc;
}

/* st_has_fn over the index: NAME listed (as lookup finds it), its file opened or not. */
static int listed(const void *ctx, const char *name) {
  const st_file *f;
  const char *where;
  return lookup((void *)ctx, name, 0, &f, &where) == FSDP_OK;
}

fsdp_status st_model_load_shard(st_model *m, const plan_t *p, int rank, float *shard) {
  if (!m->nnames) {   /* one file: its own checks, the architecture's included */
    const st_file *f;
    TRY(open_shard(m, 0, &f));
    return st_load_shard(f, p, rank, shard);
  }
  const char *dup;
  TRY(st_check_arch(p, m->path, listed, lookup, m, &dup));   /* as one file's: another model refused first */
  for (int i = 0; i < m->nnames; i++) TRY(st_check_used(p, m->path, m->names[i].name, dup));
  return st_load_shard_with(p, rank, shard, lookup, m);
}

fsdp_status st_model_check(st_model *m, const plan_t *p) {
  for (int s = 0; s < m->nshards; s++) {   /* every file, so that one fsdpd cannot read is refused too */
    const st_file *f;
    TRY(open_shard(m, s, &f));
  }
  return st_model_load_shard(m, p, 0, NULL);
}

fsdp_status st_model_untie(const char *weights, const model_config *m, int *untie) {
  const arch_desc *d = arch_get(m->arch);
  *untie = 0;
  if (!d || !m->tie_embeddings || !d->tie_pair[0] || d->always_tied) return FSDP_OK;
  st_model *sm = NULL;
  const st_file *fe = NULL, *fh = NULL;
  int ie = -1, ih = -1, same = 1;
  fsdp_status rc = st_model_open(weights, &sm);
  if (rc == FSDP_OK) rc = st_lookup_entry(lookup, sm, d->tie_pair[1], &fh, &ih);
  if (rc == FSDP_OK && ih >= 0) rc = st_lookup_entry(lookup, sm, d->tie_pair[0], &fe, &ie);
  if (rc == FSDP_OK && ie >= 0) rc = st_equal(fe, ie, fh, ih, &same);
  st_model_destroy(&sm);
  /* weights fsdpd cannot read, or a head without an embedding: the weights' own check says why */
  *untie = rc == FSDP_OK && ie >= 0 && !same;
  return FSDP_OK;
}

fsdp_status st_model_check_path(const char *path, const plan_t *p) {
  st_model *m = NULL;
  TRY(st_model_open(path, &m));
  fsdp_status rc = st_model_check(m, p);
  st_model_destroy(&m);
  return rc;
}
