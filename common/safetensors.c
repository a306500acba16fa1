/* safetensors — .safetensors reader and writer, and the plan-aware load/save (see safetensors.h). */
#include "safetensors.h"

#include "arch.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c copies little-endian data with memcpy: a little-endian host is required"
#endif

#define ST_PREFIX "transformer."   /* GPT2LMHeadModel's; a bare GPT2Model has none */
#define ST_PREFIX_LEN 12
#define ST_LLAMA_PREFIX "model."      /* LlamaForCausalLM's; a bare LlamaModel has none */
#define ST_LLAMA_PREFIX_LEN 6
#define ST_ALLOWED "F32, BF16"

typedef struct st_entry {
  char *name;
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIM];
  int64_t numel;
  uint64_t begin, end;       /* byte offsets in the data buffer */
} st_entry;

struct st_file {
  char *path;
  void *map;
  size_t map_len;
  const uint8_t *data;       /* the data buffer, after the header */
  uint64_t data_len;
  int n;
  st_entry *e;               /* sorted by data offset */
};

const char *st_dtype_name(st_dtype d) { return d == ST_BF16 ? "BF16" : "F32"; }
static int st_dtype_size(st_dtype d) { return d == ST_BF16 ? 2 : 4; }

static int st_parse_dtype(const char *s, st_dtype *out) {
  if (!strcmp(s, "F32")) *out = ST_F32;
  else if (!strcmp(s, "BF16")) *out = ST_BF16;
  else return 0;
  return 1;
}

static const char *st_strip(const char *s) {
  if (!strncmp(s, ST_LLAMA_PREFIX, ST_LLAMA_PREFIX_LEN)) return s + ST_LLAMA_PREFIX_LEN;
  return strncmp(s, ST_PREFIX, ST_PREFIX_LEN) ? s : s + ST_PREFIX_LEN;
}

/* "[768, 2304]" */
static const char *st_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

static int st_cmp_offset(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* ---- reading ---- */

/* Validate one header entry NAME → VAL into E. */
static fsdp_status st_parse_entry(const char *path, const char *name, json_t *val, st_entry *e,
                                  uint64_t data_len) {
  if (!json_is_object(val))
    return fsdp_set_error(FSDP_ERR_FORMAT,
                          "%s: header entry '%s' is not an object with dtype, shape and data_offsets",
                          path, name);
  json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape"),
         *off = json_object_get(val, "data_offsets");
  if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
    return fsdp_set_error(FSDP_ERR_FORMAT,
                          "%s: tensor '%s' needs \"dtype\" (a string), \"shape\" (an array) and "
                          "\"data_offsets\" (an array of two integers)",
                          path, name);
  if (!st_parse_dtype(json_string_value(dt), &e->dtype))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED,
                          "%s: tensor '%s' has dtype %s; fsdpd reads " ST_ALLOWED
                          " (convert the file, e.g. to float32, before importing)",
                          path, name, json_string_value(dt));
  size_t nd = json_array_size(sh);
  if (nd > ST_MAX_DIM)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: tensor '%s' has %zu dimensions; at most %d allowed",
                          path, name, nd, ST_MAX_DIM);
  e->ndim = (int)nd;
  e->numel = 1;
  for (size_t i = 0; i < nd; i++) {
    json_t *d = json_array_get(sh, i);
    if (!json_is_integer(d) || json_integer_value(d) < 0)
      return fsdp_set_error(FSDP_ERR_FORMAT,
                            "%s: tensor '%s': shape[%zu] is not a non-negative integer", path, name,
                            i);
    e->shape[i] = json_integer_value(d);
    if (__builtin_mul_overflow(e->numel, e->shape[i], &e->numel) || e->numel > (INT64_MAX >> 3))
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
  }
  json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
  if (json_array_size(off) != 2 || !json_is_integer(b) || !json_is_integer(en) ||
      json_integer_value(b) < 0 || json_integer_value(en) < json_integer_value(b))
    return fsdp_set_error(FSDP_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets must be [BEGIN, END] with "
                          "0 <= BEGIN <= END",
                          path, name);
  e->begin = (uint64_t)json_integer_value(b);
  e->end = (uint64_t)json_integer_value(en);
  if (e->end > data_len)
    return fsdp_set_error(FSDP_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] out of bounds: the data "
                          "buffer is %llu bytes",
                          path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)data_len);
  uint64_t need = (uint64_t)e->numel * (uint64_t)st_dtype_size(e->dtype);
  if (e->end - e->begin != need) {
    char s[160];
    return fsdp_set_error(FSDP_ERR_FORMAT,
                          "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets "
                          "[%llu, %llu] span %llu",
                          path, name, st_shape_str(s, sizeof s, e->shape, e->ndim),
                          st_dtype_name(e->dtype), (unsigned long long)need,
                          (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)(e->end - e->begin));
  }
  if (!(e->name = strdup(name)))
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", path);
  return FSDP_OK;
}

fsdp_status st_open(const char *path, st_file **out) {
  *out = NULL;
  fsdp_status rc = FSDP_OK;
  json_t *root = NULL;
  st_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory opening %s", path);
  }
  int fd;
  if ((rc = fsutil_open_read(AT_FDCWD, path, &fd)) != FSDP_OK) goto out;   /* no one else's link followed */
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    rc = fsdp_set_error(FSDP_ERR_IO, "%s: not a readable regular file", path);
    goto out;
  }
  if (st.st_size < 8) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT,
                        "%s is %lld bytes; a .safetensors file starts with an 8-byte header "
                        "length and a JSON header",
                        path, (long long)st.st_size);
    goto out;
  }
  f->map_len = (size_t)st.st_size;
  f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    goto out;
  }
  uint64_t hlen;
  memcpy(&hlen, f->map, 8);
  if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > (uint64_t)st.st_size - 8) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT,
                        "%s: header length %llu, but the file has %llu bytes after the length "
                        "(and headers are 2 to %llu bytes): truncated, or not a .safetensors file",
                        path, (unsigned long long)hlen, (unsigned long long)(st.st_size - 8),
                        (unsigned long long)ST_MAX_HEADER);
    goto out;
  }
  const char *hdr = (const char *)f->map + 8;
  f->data = (const uint8_t *)f->map + 8 + hlen;
  f->data_len = (uint64_t)st.st_size - 8 - hlen;
  if (hdr[0] != '{') {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: the header does not start with '{': not a "
                        ".safetensors file", path);
    goto out;
  }
  json_error_t jerr;
  root = json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root || !json_is_object(root)) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: bad JSON header at byte %d: %s", path,
                        root ? 0 : jerr.position, root ? "not an object" : jerr.text);
    goto out;
  }
  size_t cap = json_object_size(root);
  f->e = calloc(cap ? cap : 1, sizeof *f->e);
  if (!f->e) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", path);
    goto out;
  }
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "__metadata__")) continue;
    TRY_GOTO(st_parse_entry(path, key, val, &f->e[f->n], f->data_len), rc, out);
    f->n++;
  }
  qsort(f->e, (size_t)f->n, sizeof *f->e, st_cmp_offset);
  uint64_t at = 0;
  for (int i = 0; i < f->n; i++) {
    const st_entry *e = &f->e[i];
    if (e->begin < at) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT,
                          "%s: tensors '%s' and '%s' overlap (bytes %llu..%llu); each byte of the "
                          "data belongs to exactly one tensor",
                          path, f->e[i - 1].name, e->name, (unsigned long long)e->begin,
                          (unsigned long long)at);
      goto out;
    }
    if (e->begin > at) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT,
                          "%s: bytes [%llu, %llu) of the data belong to no tensor (before '%s'); "
                          "the data must be contiguous",
                          path, (unsigned long long)at, (unsigned long long)e->begin, e->name);
      goto out;
    }
    at = e->end;
  }
  if (at != f->data_len) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT,
                        "%s: the tensors cover %llu bytes but the data buffer is %llu bytes "
                        "(header length + data must equal the file size)",
                        path, (unsigned long long)at, (unsigned long long)f->data_len);
    goto out;
  }
  *out = f;
  f = NULL;
out:
  json_decref(root);
  if (fd >= 0) close(fd);
  st_destroy(&f);
  return rc;
}

void st_destroy(st_file **pf) {
  st_file *f = pf ? *pf : NULL;
  if (!f) return;
  if (f->map) munmap(f->map, f->map_len);
  if (f->e)
    for (int i = 0; i < f->n; i++) free(f->e[i].name);
  free(f->e);
  free(f->path);
  free(f);
  *pf = NULL;
}

int st_count(const st_file *f) { return f->n; }
const char *st_name(const st_file *f, int i) { return f->e[i].name; }
st_dtype st_tensor_dtype(const st_file *f, int i) { return f->e[i].dtype; }
int st_ndim(const st_file *f, int i) { return f->e[i].ndim; }
const int64_t *st_shape(const st_file *f, int i) { return f->e[i].shape; }
int64_t st_numel(const st_file *f, int i) { return f->e[i].numel; }

int st_find(const st_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->e[i].name, name)) return i;
  const char *bare = st_strip(name);
  for (int i = 0; i < f->n; i++)
    if (!strcmp(st_strip(f->e[i].name), bare)) return i;
  return -1;
}

static fsdp_status st_not_found(const st_file *f, const char *name) {
  return fsdp_set_error(FSDP_ERR_NOTFOUND,
                        "tensor '%s' (with or without '" ST_PREFIX "' or '" ST_LLAMA_PREFIX "') is not in %s, which holds "
                        "%d tensors%s%s%s",
                        name, f->path, f->n, f->n ? ", the first '" : "",
                        f->n ? f->e[0].name : "", f->n ? "'" : "");
}

static fsdp_status st_check_shape(const st_file *f, int i, const char *name, const int64_t *shape,
                                  int ndim) {
  const st_entry *e = &f->e[i];
  int same = e->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = e->shape[d] == shape[d];
  if (same) return FSDP_OK;
  char a[160], b[160];
  int transposed = ndim == 2 && e->ndim == 2 && e->shape[0] == shape[1] && e->shape[1] == shape[0];
  return fsdp_set_error(FSDP_ERR_INVALID,
                        "tensor '%s' in %s: expected shape %s, found %s%s", name, f->path,
                        st_shape_str(a, sizeof a, shape, ndim),
                        st_shape_str(b, sizeof b, e->shape, e->ndim),
                        !transposed ? ""
                        : strstr(name, "_proj.") ? " (transposed: Llama stores nn.Linear weights as [out, in])"
                                                 : " (transposed: Hugging Face GPT-2 stores Conv1D weights as "
                                                   "[in, out]; a torch.nn.Linear export is [out, in])");
}

static void st_copy_range(const st_entry *e, const uint8_t *data, int64_t first, int64_t count,
                          float *dst) {
  if (count == 0) return;
  const uint8_t *src = data + e->begin + (uint64_t)first * (uint64_t)st_dtype_size(e->dtype);
  if (e->dtype == ST_F32) {
    memcpy(dst, src, (size_t)count * 4);
  } else {
    for (int64_t k = 0; k < count; k++) {
      uint16_t h;
      memcpy(&h, src + 2 * k, 2);
      dst[k] = st_bf16_to_f32(h);
    }
  }
}

fsdp_status st_read(const st_file *f, const char *name, const int64_t *shape, int ndim, float *dst) {
  int i = st_find(f, name);
  if (i < 0) return st_not_found(f, name);
  TRY(st_check_shape(f, i, name, shape, ndim));
  st_copy_range(&f->e[i], f->data, 0, f->e[i].numel, dst);
  return FSDP_OK;
}

fsdp_status st_read_range(const st_file *f, const char *name, int64_t first, int64_t count,
                          float *dst) {
  int i = st_find(f, name);
  if (i < 0) return st_not_found(f, name);
  const st_entry *e = &f->e[i];
  if (first < 0 || count < 0 || first > e->numel || count > e->numel - first)
    return fsdp_set_error(FSDP_ERR_RANGE,
                          "tensor '%s' in %s has %lld elements; elements [%lld, %lld) asked for",
                          name, f->path, (long long)e->numel, (long long)first,
                          (long long)(first + count));
  st_copy_range(e, f->data, first, count, dst);
  return FSDP_OK;
}

/* ---- writing ---- */

typedef struct st_wentry {
  char *name;
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIM];
  int64_t numel;
  const float *data;
} st_wentry;

struct st_writer {
  char *path;        /* the file, as shown; with dirfd >= 0, name is the file in dirfd */
  int dirfd;
  char *dir_shown, *name;
  int n, cap;
  st_wentry *e;
};

fsdp_status st_writer_new(const char *path, st_writer **out) {
  *out = NULL;
  st_writer *w = calloc(1, sizeof *w);
  if (!w || !(w->path = strdup(path))) {
    free(w);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory writing %s", path);
  }
  w->dirfd = -1;
  *out = w;
  return FSDP_OK;
}

fsdp_status st_writer_new_at(int dirfd, const char *dir_shown, const char *name, st_writer **out) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dir_shown, name);
  TRY(st_writer_new(path, out));
  st_writer *w = *out;
  w->dirfd = dirfd;
  if (!(w->dir_shown = strdup(dir_shown)) || !(w->name = strdup(name))) {
    st_writer_destroy(out);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory writing %s", path);
  }
  return FSDP_OK;
}

void st_writer_destroy(st_writer **pw) {
  st_writer *w = pw ? *pw : NULL;
  if (!w) return;
  for (int i = 0; i < w->n; i++) free(w->e[i].name);
  free(w->e);
  free(w->path);
  free(w->dir_shown);
  free(w->name);
  free(w);
  *pw = NULL;
}

fsdp_status st_writer_add(st_writer *w, const char *name, const char *dtype, const int64_t *shape,
                          int ndim, const float *data) {
  st_wentry e = {0};
  if (!name || !*name || !strcmp(name, "__metadata__"))
    return fsdp_set_error(FSDP_ERR_INVALID,
                          "%s: tensor name '%s' is not allowed (empty or reserved)", w->path,
                          name ? name : "");
  if (!dtype || !st_parse_dtype(dtype, &e.dtype))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: tensor '%s': dtype '%s'; allowed: " ST_ALLOWED,
                          w->path, name, dtype ? dtype : "(null)");
  if (ndim < 0 || ndim > ST_MAX_DIM)
    return fsdp_set_error(FSDP_ERR_RANGE, "%s: tensor '%s' has %d dimensions; 0 to %d allowed",
                          w->path, name, ndim, ST_MAX_DIM);
  e.ndim = ndim;
  e.numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0 || __builtin_mul_overflow(e.numel, shape[d], &e.numel) ||
        e.numel > (INT64_MAX >> 3))
      return fsdp_set_error(FSDP_ERR_RANGE, "%s: tensor '%s': shape[%d] = %lld is not allowed",
                            w->path, name, d, (long long)shape[d]);
    e.shape[d] = shape[d];
  }
  if (e.numel > 0 && !data)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: tensor '%s': no data", w->path, name);
  for (int i = 0; i < w->n; i++)
    if (!strcmp(st_strip(w->e[i].name), st_strip(name)))
      return fsdp_set_error(FSDP_ERR_INVALID,
                            "%s: tensor '%s' added twice (as '%s' before); names are unique, "
                            "with or without '" ST_PREFIX "'",
                            w->path, name, w->e[i].name);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 64;
    st_wentry *ne = realloc(w->e, sizeof *ne * (size_t)cap);
    if (!ne) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory writing %s", w->path);
    w->e = ne;
    w->cap = cap;
  }
  if (!(e.name = strdup(name)))
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory writing %s", w->path);
  e.data = data;
  w->e[w->n++] = e;
  return FSDP_OK;
}

/* The JSON header: keys sorted (jansson's JSON_SORT_KEYS), compact, so equal inputs give equal
 * bytes. Returns a malloc'd string. */
static fsdp_status st_header_json(const st_writer *w, char **out) {
  *out = NULL;
  json_t *root = json_object();
  int bad = !root;
  uint64_t at = 0;
  for (int i = 0; !bad && i < w->n; i++) {
    const st_wentry *e = &w->e[i];
    uint64_t end = at + (uint64_t)e->numel * (uint64_t)st_dtype_size(e->dtype);
    json_t *shape = json_array();
    bad |= !shape;
    for (int d = 0; !bad && d < e->ndim; d++)
      bad |= json_array_append_new(shape, json_integer(e->shape[d])) != 0;
    json_t *ent = json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(e->dtype), "shape",
                            shape, "data_offsets", (json_int_t)at, (json_int_t)end);
    bad |= !ent || json_object_set_new(root, e->name, ent) != 0;
    at = end;
  }
  if (!bad) bad |= json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt")) != 0;
  if (!bad) *out = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(root);
  if (!*out) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory building the header of %s", w->path);
  return FSDP_OK;
}

static int st_write_data(FILE *fp, const st_wentry *e) {
  if (e->numel == 0) return 1;
  if (e->dtype == ST_F32) return fwrite(e->data, 4, (size_t)e->numel, fp) == (size_t)e->numel;
  uint16_t buf[8192];
  for (int64_t i = 0; i < e->numel; i += 8192) {
    int64_t m = e->numel - i < 8192 ? e->numel - i : 8192;
    for (int64_t k = 0; k < m; k++) buf[k] = st_f32_to_bf16(e->data[i + k]);
    if (fwrite(buf, 2, (size_t)m, fp) != (size_t)m) return 0;
  }
  return 1;
}

fsdp_status st_writer_finish(st_writer **pw) {
  st_writer *w = *pw;
  char *json = NULL;
  fsutil_atomic a = FSUTIL_ATOMIC_INIT;
  fsdp_status rc;
  TRY_GOTO(st_header_json(w, &json), rc, out);
  size_t jlen = strlen(json);
  uint64_t hlen = (jlen + 7) / 8 * 8;   /* the data starts 8-byte aligned */
  /* PATH.tmp created O_EXCL | O_NOFOLLOW, renamed over PATH: a planted link is never written through */
  if (w->dirfd >= 0) TRY_GOTO(fsutil_atomic_begin(w->dirfd, w->dir_shown, w->name, 0644, &a), rc, out);
  else TRY_GOTO(fsutil_atomic_open(w->path, 0644, &a), rc, out);
  FILE *fp = fsutil_atomic_stream(&a);
  int ok = fp && fwrite(&hlen, 8, 1, fp) == 1 && fwrite(json, 1, jlen, fp) == jlen;
  for (size_t k = jlen; ok && k < hlen; k++) ok = fputc(' ', fp) != EOF;
  for (int i = 0; ok && i < w->n; i++) ok = st_write_data(fp, &w->e[i]);
  if (!ok) {
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", w->path, strerror(errno));
    goto out;
  }
  rc = fsutil_atomic_commit(&a);
out:
  fsutil_atomic_abort(&a);
  free(json);
  st_writer_destroy(pw);
  return rc;
}

/* ---- plan-aware ---- */

static int st_has(const void *f, const char *name) { return st_find(f, name) >= 0; }

static fsdp_status st_one_file(void *ctx, const char *name, int need, const st_file **f, const char **where);

/* Whether the weights CTX (HAS) hold a name that tells a file of O (its probe names) and that P's model
 * has no tensor of. */
static int holds_other(st_has_fn has, const void *ctx, const arch_desc *o, const plan_t *p) {
  for (int j = 0; o->probe_names && o->probe_names[j]; j++)
    if (has(ctx, o->probe_names[j]) && !plan_find_tensor(p, o->probe_names[j], NULL)) return 1;
  return 0;
}

fsdp_status st_equal(const st_file *fa, int ia, const st_file *fb, int ib, int *same) {
  int n = st_ndim(fa, ia);
  *same = 0;
  if (n != st_ndim(fb, ib) || memcmp(st_shape(fa, ia), st_shape(fb, ib), (size_t)n * sizeof(int64_t))) return FSDP_OK;
  enum { CHUNK = 1 << 16 };
  float *x = malloc(2 * CHUNK * sizeof(float));
  if (!x) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", fb->path);
  fsdp_status rc = FSDP_OK;
  int eq = 1;
  for (int64_t k = 0, total = st_numel(fa, ia); eq && rc == FSDP_OK && k < total; k += CHUNK) {
    int64_t c = total - k < CHUNK ? total - k : CHUNK;
    rc = st_read_range(fa, st_name(fa, ia), k, c, x);
    if (rc == FSDP_OK) rc = st_read_range(fb, st_name(fb, ib), k, c, x + CHUNK);
    for (int64_t j = 0; rc == FSDP_OK && eq && j < c; j++) eq = x[j] == x[CHUNK + j];
  }
  free(x);
  *same = eq && rc == FSDP_OK;
  return rc;
}

fsdp_status st_lookup_entry(st_lookup_fn lookup, void *ctx, const char *name, const st_file **f, int *i) {
  const char *where;
  *i = -1;
  fsdp_status rc = lookup(ctx, name, 1, f, &where);
  if (rc == FSDP_ERR_NOTFOUND) return FSDP_OK;
  TRY(rc);
  *i = st_find(*f, name);
  return FSDP_OK;
}

fsdp_status st_tied_head(const plan_t *p, st_lookup_fn lookup, void *ctx, const char **dup) {
  const arch_desc *d = arch_get(p->model.arch);
  const st_file *fe = NULL, *fh = NULL;
  int ie = -1, ih = -1, same = 0;
  *dup = NULL;
  if (!(p->model.tie_embeddings || d->always_tied) || !d->tie_pair[0]) return FSDP_OK;
  TRY(st_lookup_entry(lookup, ctx, d->tie_pair[1], &fh, &ih));
  if (ih >= 0) TRY(st_lookup_entry(lookup, ctx, d->tie_pair[0], &fe, &ie));
  if (ie < 0) return FSDP_OK;   /* no head, or no embedding: the loader names what is missing */
  TRY(st_equal(fe, ie, fh, ih, &same));
  if (same) {
    *dup = d->tie_pair[1];
    return FSDP_OK;
  }
  if (d->always_tied)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s holds %s different from %s: an untied head, which arch = %s does not "
                          "have (%s); allowed: weights whose %s equals %s, or without it", fh->path, d->tie_pair[1],
                          d->tie_pair[0], d->name, d->tied_why, d->tie_pair[1], d->tie_pair[0]);
  return fsdp_set_error(FSDP_ERR_INVALID, "%s holds an untied model (%s, different from %s); the job has "
                        "tie_word_embeddings = true, whose head is %s: set tie_word_embeddings = false", fh->path,
                        d->tie_pair[1], d->tie_pair[0], d->tie_pair[0]);
}

/* The weights as the architecture's file check sees them: a tied head's equal copy (DUP) is not there. */
typedef struct st_view {
  st_has_fn has;
  const void *ctx;
  const char *dup;
} st_view;

static int st_view_has(const void *ctx, const char *name) {
  const st_view *v = ctx;
  if (v->dup && !strcmp(st_strip(name), st_strip(v->dup))) return 0;
  return v->has(v->ctx, name);
}

fsdp_status st_check_arch(const plan_t *p, const char *where, st_has_fn has, st_lookup_fn lookup, void *ctx,
                          const char **dup) {
  const arch_desc *d = arch_get(p->model.arch);
  for (int a = 0; a < arch_count(); a++) {
    const arch_desc *o = arch_get((model_arch)a);
    if (o != d && holds_other(has, ctx, o, p))
      return fsdp_set_error(FSDP_ERR_INVALID, "%s holds %s; the job is arch = %s, which reads %s", where, o->file_desc,
                            d->name, d->reads);
  }
  TRY(st_tied_head(p, lookup, ctx, dup));
  st_view v = {has, ctx, *dup};
  return d->file_check(p, where, st_view_has, &v);
}

const char *st_bare_name(const char *name) { return st_strip(name); }

/* Buffers transformers saves beside the parameters and no model trains: GPT-2's causal masks, an old
 * Llama checkpoint's rotary table. */
static const char *const st_buffers[] = {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq", NULL};

fsdp_status st_check_used(const plan_t *p, const char *where, const char *name, const char *dup) {
  if (plan_find_tensor(p, name, NULL)) return FSDP_OK;
  if (dup && !strcmp(st_strip(name), st_strip(dup))) return FSDP_OK;   /* a tied head's equal copy */
  size_t n = strlen(name);
  for (int i = 0; st_buffers[i]; i++) {
    size_t k = strlen(st_buffers[i]);
    if (n > k && !strcmp(name + n - k, st_buffers[i])) return FSDP_OK;
  }
  const arch_desc *d = arch_get(p->model.arch);
  return fsdp_set_error(FSDP_ERR_INVALID, "%s holds '%s', a tensor that arch = %s with this [model] does not have; "
                        "allowed: a file of exactly the job's model (%s), or the model whose tensor it is", where,
                        name, d->name, d->reads);
}

/* NAME missing from WHERE (F, or an index without F): the architecture's message where it has one. */
static fsdp_status st_missing(const st_file *f, const plan_t *p, const char *name, const char *where) {
  fsdp_status rc = arch_get(p->model.arch)->missing(p, st_strip(name), where);
  if (rc != FSDP_OK) return rc;
  if (f) return st_not_found(f, name);
  return fsdp_set_error(FSDP_ERR_NOTFOUND, "tensor '%s' is not in %s", name, where);
}

fsdp_status st_load_shard_with(const plan_t *p, int rank, float *shard, st_lookup_fn lookup, void *ctx) {
  if (rank < 0 || rank >= p->world)
    return fsdp_set_error(FSDP_ERR_RANGE, "st_load_shard: rank %d of world %d", rank, p->world);
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *U = &p->units[u];
    float *dst = shard ? shard + U->shard_base : NULL;
    int64_t lo = plan_shard_offset(p, u, rank), hi = lo + U->shard_numel;
    if (dst) memset(dst, 0, sizeof *dst * (size_t)U->shard_numel);
    for (int k = 0; k < U->ntensors; k++) {
      const plan_tensor *t = &U->t[k];
      int64_t a = t->offset > lo ? t->offset : lo;
      int64_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
      const st_file *f = NULL;
      const char *where = NULL;
      fsdp_status st = lookup(ctx, t->name, !dst || a < b, &f, &where);
      if (st == FSDP_ERR_NOTFOUND) return st_missing(NULL, p, t->name, where);
      TRY(st);
      if (!f) continue;   /* listed in a file this rank does not read */
      int i = st_find(f, t->name);
      if (i < 0) return st_missing(f, p, t->name, f->path);
      int64_t fshape[2];   /* a part of a fused tensor: the fused tensor's shape, its rows from hf_row0 */
      plan_tensor_file_shape(t, fshape);
      TRY(st_check_shape(f, i, t->name, t->ndim == 2 ? fshape : t->shape, t->ndim));
      if (dst && a < b)
        st_copy_range(&f->e[i], f->data, a - t->offset + t->hf_row0 * t->shape[1], b - a, dst + (a - lo));
    }
  }
  return FSDP_OK;
}

/* One file: every tensor is in it, and every rank checks every tensor, so that all ranks fail alike. */
static fsdp_status st_one_file(void *ctx, const char *name, int need, const st_file **f, const char **where) {
  (void)name, (void)need;
  *f = ctx;
  *where = (*f)->path;
  return FSDP_OK;
}

fsdp_status st_load_shard(const st_file *f, const plan_t *p, int rank, float *shard) {
  const char *dup;
  TRY(st_check_arch(p, f->path, st_has, st_one_file, (void *)f, &dup));
  for (int i = 0; i < f->n; i++) TRY(st_check_used(p, f->path, f->e[i].name, dup));
  return st_load_shard_with(p, rank, shard, st_one_file, (void *)f);
}

static fsdp_status save_units(st_writer *w, const plan_t *p, float *const *units) {
  fsdp_status rc;
  for (int u = 0; u < p->nunits; u++)
    for (int k = 0; k < p->units[u].ntensors; k++) {
      const plan_tensor *t = &p->units[u].t[k];
      int64_t fshape[2];
      if (!plan_tensor_file_shape(t, fshape)) continue;   /* a fused tensor is written whole with its first part */
      TRY_GOTO(st_writer_add(w, t->name, "F32", t->ndim == 2 ? fshape : t->shape, t->ndim, units[u] + t->offset), rc,
               fail);
    }
  return st_writer_finish(&w);
fail:
  st_writer_destroy(&w);
  return rc;
}

fsdp_status st_save_units(const char *path, const plan_t *p, float *const *units) {
  st_writer *w = NULL;
  TRY(st_writer_new(path, &w));
  return save_units(w, p, units);
}

fsdp_status st_save_units_at(int dirfd, const char *dir_shown, const char *name, const plan_t *p, float *const *units) {
  st_writer *w = NULL;
  TRY(st_writer_new_at(dirfd, dir_shown, name, &w));
  return save_units(w, p, units);
}
