/* jobspec — the job file: a libinih pass over the declarative key table (jobspec_keys.c: section,
 * name, type, default, range, help), and the cross-field checks. See jobspec.h and docs/jobs.md.
 *
 * Line numbers: Debian's libinih is built without INI_HANDLER_LINENO, so the text is fed through
 * ini_parse_stream() with our own line reader, which counts lines and also (a) strips leading
 * whitespace, so an indented key is a key and never a multi-line continuation, (b) drops inline
 * "# comments" (inih itself only drops inline "; comments"), and (c) checks section headers, so an
 * unknown section is reported even when it holds no key. Errors name the job file as the caller
 * named it, and the line: fsdp_last_error() reads "jobs/tiny.ini:7: ..." (jobspec_error).
 */
#include "jobspec.h"
#include "jobspec_keys.h"

#include "fsutil.h"
#include "arch.h"
#include "hfconfig.h"
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <glob.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JOBSPEC_MAX_FILE (1 << 20)   /* a job file is a few hundred bytes; refuse anything silly */

int jobspec_build_has_cuda(void) {
#ifdef FSDP_BUILD_CUDA
  return 1;
#else
  return 0;
#endif
}

fsdp_status jobspec_check_build(const jobspec_t *s) {
  if (s->device == DEVICE_CUDA && !jobspec_build_has_cuda())
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED,
                          "%s: [fsdp] device = cuda, but this build of fsdpd has no CUDA backend (nvcc, cuBLAS or NCCL "
                          "were not found when it was built); allowed here: device = cpu, or rebuild with "
                          "-DFSDP_CUDA=ON", s->path);
  return FSDP_OK;
}

/* ---- parse context ---- */

typedef struct pctx {
  jobspec_t *s;
  const char *origin;
  const char *base_dir;
  const char *p;             /* reader position in the text */
  int lineno;                /* the line the reader handed out last */
  int key_line[JOBSPEC_MAX_KEYS];       /* where each key was set; 0 = default */
  int sec_line[JOBSPEC_NSECTIONS];   /* first header line of each section; 0 = absent */
  int nlines;
  fsdp_status err;           /* first error; its message is already recorded */
  int err_line;
} pctx;

/* A job file's error, located for its reader: "ORIGIN:LINE: message" (LINE 0: "ORIGIN: message"),
 * ORIGIN as the caller named the file. */
static fsdp_status jobspec_error(fsdp_status st, const char *origin, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static fsdp_status jobspec_error(fsdp_status st, const char *origin, int line, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (line > 0) return fsdp_set_error(st, "%s:%d: %s", origin, line, msg);
  return fsdp_set_error(st, "%s: %s", origin, msg);
}

#define PERR(c, line, st, ...)                                                 \
  do {                                                                         \
    if (!(c)->err) {                                                           \
      jobspec_error((st), (c)->origin, (line), __VA_ARGS__);                   \
      (c)->err = (st);                                                         \
      (c)->err_line = (line);                                                  \
    }                                                                          \
  } while (0)

static int section_index(const char *name) {
  for (int i = 0; jobspec_sections[i]; i++)
    if (!strcmp(jobspec_sections[i], name)) return i;
  return -1;
}

static void trim_copy(char *dst, size_t n, const char *src, size_t len) {
  while (len && isspace((unsigned char)*src)) src++, len--;
  while (len && isspace((unsigned char)src[len - 1])) len--;
  if (len >= n) len = n - 1;
  memcpy(dst, src, len);
  dst[len] = '\0';
}

static void check_section_header(pctx *c, const char *line) {
  const char *close = strchr(line, ']');
  if (!close) return;   /* inih reports the syntax error */
  char name[64];
  trim_copy(name, sizeof name, line + 1, (size_t)(close - line - 1));
  int si = section_index(name);
  if (si < 0) {
    PERR(c, c->lineno, FSDP_ERR_INVALID,
         "unknown section [%s]; allowed: " JOBSPEC_SECTIONS_ALLOWED, name);
    return;
  }
  if (!c->sec_line[si]) c->sec_line[si] = c->lineno;
}

/* fgets-style reader over the text: one whole line per call (see the header comment). */
static char *line_reader(char *str, int num, void *stream) {
  pctx *c = stream;
  if (!*c->p) return NULL;
  const char *nl = strchr(c->p, '\n');
  size_t len = nl ? (size_t)(nl - c->p) : strlen(c->p);
  const char *line = c->p;
  c->p += len + (nl ? 1 : 0);
  c->lineno++;
  while (len && (*line == ' ' || *line == '\t')) line++, len--;
  /* An inline "#" comment starts at a '#' preceded by whitespace; a whole-line one is inih's. */
  for (size_t i = 1; i < len; i++)
    if (line[i] == '#' && (line[i - 1] == ' ' || line[i - 1] == '\t')) {
      len = i;
      break;
    }
  if (len && line[len - 1] == '\r') len--;
  if (len + 2 > (size_t)num) {
    if (*line != '#' && *line != ';')   /* a long comment is harmless: cut it */
      PERR(c, c->lineno, FSDP_ERR_INVALID, "line is longer than %d characters (the INI reader's limit)", num - 2);
    len = (size_t)num - 2;
  }
  memcpy(str, line, len);
  str[len] = '\n';
  str[len + 1] = '\0';
  if (*str == '[') {
    char tmp[256];
    trim_copy(tmp, sizeof tmp, str, len);
    check_section_header(c, tmp);
  }
  return str;
}

/* ---- value parsers ---- */

static int parse_i64(const char *v, long long *out) {
  if (!*v) return 0;
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || *end) return 0;
  *out = x;
  return 1;
}

static int parse_u64(const char *v, uint64_t *out) {
  if (!*v || *v == '-' || *v == '+' || !isdigit((unsigned char)*v)) return 0;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end) return 0;
  *out = (uint64_t)x;
  return 1;
}

static int ends_with(const char *s, const char *sfx) {
  size_t n = strlen(s), m = strlen(sfx);
  return n > m && !strcmp(s + n - m, sfx);
}

static int parse_dbl(const char *v, double *out) {
  if (!*v) return 0;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (*end || !isfinite(x) || (errno == ERANGE && x != 0)) return 0;
  *out = x;
  return 1;
}

/* Lexically normalize an absolute path: collapse "//", "/./" and "dir/..". */
static void normalize_path(char *p) {
  char *out = p, *in = p;
  while (*in) {
    while (*in == '/') in++;
    if (!*in) break;
    char *seg = in;
    while (*in && *in != '/') in++;
    size_t len = (size_t)(in - seg);
    if (len == 1 && seg[0] == '.') continue;
    if (len == 2 && seg[0] == '.' && seg[1] == '.') {
      while (out > p && *--out != '/') {}
      continue;
    }
    *out++ = '/';
    memmove(out, seg, len);
    out += len;
  }
  if (out == p) *out++ = '/';
  *out = '\0';
}

/* PATH relative to the base directory, absolute; 0 if it does not fit. */
static int resolve_path(const pctx *c, const char *v, char *out, size_t n) {
  char tmp[2 * JOBSPEC_PATH_MAX];
  int w = v[0] == '/' ? snprintf(tmp, sizeof tmp, "%s", v) : snprintf(tmp, sizeof tmp, "%s/%s", c->base_dir, v);
  if (w < 0 || (size_t)w >= sizeof tmp) return 0;
  normalize_path(tmp);
  char real[PATH_MAX];
  const char *use = realpath(tmp, real) ? real : tmp;
  if (strlen(use) >= n) return 0;
  snprintf(out, n, "%s", use);
  return 1;
}

/* RAW (a path as the job file names it, before realpath resolves its links) read as fsutil_open_read
 * allows: a link of another user's on the way is refused, here, where the path still holds it. 1 when
 * it opens, or fails for a reason check_readable words itself (missing, unreadable). */
static int check_links(pctx *c, const keydef *k, const char *raw) {
  char joined[2 * JOBSPEC_PATH_MAX];
  int w = raw[0] == '/' ? snprintf(joined, sizeof joined, "%s", raw)
                        : snprintf(joined, sizeof joined, "%s/%s", c->base_dir, raw);
  if (w < 0 || (size_t)w >= sizeof joined) return 1;
  normalize_path(joined);
  int fd;
  fsdp_status rc = fsutil_open_read(AT_FDCWD, joined, &fd);
  if (rc == FSDP_OK) close(fd);
  if (rc != FSDP_ERR_INVALID && rc != FSDP_ERR_DENIED) return 1;
  PERR(c, c->lineno, rc, "[%s] %s = %s: %s", k->sec, k->key, raw, fsdp_last_error());
  return 0;
}

/* A readable regular file at the resolved path, or an error naming it. RAW is the key's value: its
 * links are checked as named (a glob's match, ABS, is named so already). */
static int check_readable(pctx *c, const keydef *k, const char *raw, const char *abs) {
  if (!check_links(c, k, strpbrk(raw, "*?[") ? abs : raw)) return 0;
  struct stat st;
  if (stat(abs, &st) != 0 || access(abs, R_OK) != 0) {
    PERR(c, c->lineno, FSDP_ERR_NOTFOUND, "[%s] %s = %s: cannot read %s: %s", k->sec, k->key, raw, abs,
         strerror(errno));
    return 0;
  }
  if (!S_ISREG(st.st_mode)) {
    PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = %s: %s is not a regular file", k->sec, k->key, raw, abs);
    return 0;
  }
  return 1;
}

/* [data] train/val = PATH, a glob, or several of them separated by spaces: each resolved against
 * the base directory, a glob matching at least one file, every file readable; stored one per line
 * (tok_open reads them as one stream, each glob in name order). */
static void data_paths(pctx *c, const keydef *k, const char *v, char *out) {
  char items[JOBSPEC_PATH_MAX], *save = NULL, one[JOBSPEC_PATH_MAX];
  size_t used = 0;
  snprintf(items, sizeof items, "%s", v);
  out[0] = '\0';
  for (char *it = strtok_r(items, " \t", &save); it; it = strtok_r(NULL, " \t", &save)) {
    if (!resolve_path(c, it, one, sizeof one) || used + strlen(one) + 2 > JOBSPEC_PATH_MAX) {
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[data] %s: the paths are longer than %d characters", k->key,
           JOBSPEC_PATH_MAX - 1);
      return;
    }
    used += (size_t)snprintf(out + used, JOBSPEC_PATH_MAX - used, "%s%s", used ? "\n" : "", one);
    if (!strpbrk(one, "*?[")) {
      if (!check_readable(c, k, it, one)) return;
      continue;
    }
    glob_t g;
    int grc = glob(one, GLOB_ERR, NULL, &g);
    if (grc != 0) {
      PERR(c, c->lineno, FSDP_ERR_NOTFOUND, "[data] %s = %s: %s matches no file", k->key, v, one);
      if (grc != GLOB_NOMATCH) globfree(&g);
      return;
    }
    int ok = 1;
    for (size_t i = 0; ok && i < g.gl_pathc; i++) ok = check_readable(c, k, it, g.gl_pathv[i]);
    globfree(&g);
    if (!ok) return;
  }
}

static void set_special(pctx *c, const keydef *k, const char *v) {
  jobspec_t *s = c->s;
  char *field = (char *)s + k->off;
  switch (k->type) {
  case KT_NAME: {
    size_t n = strlen(v);
    int ok = n >= 1 && n < sizeof s->name;
    for (size_t i = 0; ok && i < n; i++)
      ok = isalnum((unsigned char)v[i]) || v[i] == '.' || v[i] == '_' || v[i] == '-';
    if (!ok)
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[job] name = '%s' is not allowed; allowed: %s", v, k->help);
    else
      snprintf(s->name, sizeof s->name, "%s", v);
    break;
  }
  case KT_INIT: {
    if (!strcmp(v, "random")) {
      snprintf(s->init, sizeof s->init, "random");
      break;
    }
    if (!ends_with(v, ".safetensors") && !ends_with(v, ".safetensors.index.json")) {
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[model] init = '%s' is not allowed; allowed: random | PATH.safetensors | "
           "PATH.safetensors.index.json (a sharded model's index), or from = DIR for a whole model folder", v);
      break;
    }
    if (!resolve_path(c, v, s->init, sizeof s->init)) {
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[model] init: the path is longer than %d characters", JOBSPEC_PATH_MAX - 1);
      break;
    }
    check_readable(c, k, v, s->init);
    break;
  }
  case KT_TRAIN:
  case KT_VAL: {
    /* train and val take the same values: a token file or the synthetic chain */
    int is_val = k->type == KT_VAL;
    char *path = is_val ? s->val : s->train;
    int *synthetic = is_val ? &s->val_synthetic : &s->synthetic;
    uint64_t *mseed = is_val ? &s->val_markov_seed : &s->markov_seed;
    if (!strncmp(v, "synthetic:", 10)) {
      uint64_t seed;
      if (strncmp(v, "synthetic:markov:", 17) || !parse_u64(v + 17, &seed)) {
        PERR(c, c->lineno, FSDP_ERR_INVALID,
             "[data] %s = '%s' is not allowed; allowed: PATH (an llm.c token file) | synthetic:markov:SEED "
             "(SEED an integer in 0..%llu)", k->key, v, (unsigned long long)UINT64_MAX);
        break;
      }
      *synthetic = 1;
      *mseed = seed;
      path[0] = '\0';
      break;
    }
    if (!*v) {
      PERR(c, c->lineno, FSDP_ERR_INVALID,
           "[data] %s is empty; allowed: PATH (an llm.c token file) | synthetic:markov:SEED%s", k->key,
           is_val ? " (leave the key out for no validation)" : "");
      break;
    }
    *synthetic = 0;
    data_paths(c, k, v, path);
    break;
  }
  case KT_FROM: {
    struct stat st;
    if (!resolve_path(c, v, field, JOBSPEC_PATH_MAX))
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[model] from: the path is longer than %d characters", JOBSPEC_PATH_MAX - 1);
    else if (stat(field, &st) != 0 || !S_ISDIR(st.st_mode))
      PERR(c, c->lineno, FSDP_ERR_NOTFOUND, "[model] from = %s: %s is not a directory; allowed: a Hugging Face model "
           "folder (config.json and its safetensors, as save_pretrained writes it)", v, field);
    else {   /* the folder as named, its links included: its config.json is read through them */
      char cfg[JOBSPEC_PATH_MAX + 16];
      snprintf(cfg, sizeof cfg, "%s/config.json", v);
      check_links(c, k, cfg);
    }
    break;
  }
  case KT_TEXT:
    if (strlen(v) >= JOBSPEC_TEXT_MAX)
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[%s] %s is %zu characters; allowed: at most %d", k->sec, k->key,
           strlen(v), JOBSPEC_TEXT_MAX - 1);
    else
      snprintf(field, JOBSPEC_TEXT_MAX, "%s", v);
    break;
  case KT_DIR:
    if (!*v) {
      field[0] = '\0';
    } else if (!resolve_path(c, v, field, JOBSPEC_PATH_MAX)) {
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[%s] %s: the path is longer than %d characters", k->sec, k->key,
           JOBSPEC_PATH_MAX - 1);
    }
    break;
  default:
    break;
  }
}

static void set_value(pctx *c, const keydef *k, const char *v) {
  char allowed[160];
  char *field = (char *)c->s + k->off;
  switch (k->type) {
  case KT_INT: {
    long long x;
    if (!parse_i64(v, &x)) {
      jobspec_key_allowed(k, allowed, sizeof allowed);
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = '%s' is not an integer; allowed: %s", k->sec, k->key, v, allowed);
    } else if ((double)x < k->lo || (double)x > k->hi) {
      jobspec_key_allowed(k, allowed, sizeof allowed);
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[%s] %s = %lld is out of range; allowed: %s", k->sec, k->key, x, allowed);
    } else {
      *(int *)field = (int)x;
    }
    break;
  }
  case KT_U64: {
    uint64_t x;
    if (!parse_u64(v, &x)) {
      jobspec_key_allowed(k, allowed, sizeof allowed);
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = '%s' is not an integer; allowed: %s", k->sec, k->key, v, allowed);
    } else {
      *(uint64_t *)field = x;
    }
    break;
  }
  case KT_DBL: {
    double x;
    jobspec_key_allowed(k, allowed, sizeof allowed);
    if (!parse_dbl(v, &x))
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = '%s' is not a number; allowed: %s", k->sec, k->key, v, allowed);
    else if (x < k->lo || (k->lo_open && x == k->lo) || x > k->hi || (k->hi_open && x == k->hi))
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[%s] %s = %s is out of range; allowed: %s", k->sec, k->key, v, allowed);
    else
      *(double *)field = x;
    break;
  }
  case KT_FACTORS: {
    rope_factor_list l;
    jobspec_key_allowed(k, allowed, sizeof allowed);
    int ok = jobspec_parse_factors(v, &l);
    for (int i = 0; ok && i < l.n; i++) ok = l.v[i] > k->lo && l.v[i] <= k->hi;
    if (!ok) PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = '%s' is not allowed; allowed: %s", k->sec, k->key, v, allowed);
    else *(rope_factor_list *)field = l;
    break;
  }
  case KT_ENUM: {
    for (int i = 0; k->names[i]; i++)
      if (!strcmp(v, k->names[i])) {
        *(int *)field = i;
        return;
      }
    jobspec_key_allowed(k, allowed, sizeof allowed);
    PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = '%s' is not allowed; allowed: %s", k->sec, k->key, v, allowed);
    break;
  }
  default:
    set_special(c, k, v);
  }
}

static int on_key(void *user, const char *section, const char *name, const char *value) {
  pctx *c = user;
  if (c->err) return 0;
  char sec[64];
  trim_copy(sec, sizeof sec, section, strlen(section));
  if (!*sec) {
    PERR(c, c->lineno, FSDP_ERR_INVALID, "key '%s' is outside any section; put it under one of "
         JOBSPEC_SECTIONS_ALLOWED, name);
    return 0;
  }
  if (section_index(sec) < 0) return 0;   /* reported by the reader */
  for (int i = 0; i < jobspec_nkeys; i++) {
    if (strcmp(jobspec_keys[i].sec, sec) || strcmp(jobspec_keys[i].key, name)) continue;
    if (c->key_line[i]) {
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s is set twice (first at line %d); set each key once",
           sec, name, c->key_line[i]);
      return 0;
    }
    c->key_line[i] = c->lineno;
    set_value(c, &jobspec_keys[i], value);
    return !c->err;
  }
  char allowed[256];
  size_t used = 0;
  allowed[0] = '\0';
  for (int i = 0; i < jobspec_nkeys && used < sizeof allowed; i++)
    if (!strcmp(jobspec_keys[i].sec, sec))
      used += (size_t)snprintf(allowed + used, sizeof allowed - used, "%s%s", used ? ", " : "", jobspec_keys[i].key);
  PERR(c, c->lineno, FSDP_ERR_INVALID, "unknown key '%s' in [%s]; allowed: %s", name, sec, allowed);
  return 0;
}

static int key_index(const char *sec, const char *key) {
  for (int i = 0; i < jobspec_nkeys; i++)
    if (!strcmp(jobspec_keys[i].sec, sec) && !strcmp(jobspec_keys[i].key, key)) return i;
  return -1;
}

/* The line to blame for a cross-field problem: the first of the keys that was set, else the
 * section header, else 0. */
static int blame(const pctx *c, const char *sec, const char *k1, const char *k2) {
  int i1 = key_index(sec, k1), i2 = k2 ? key_index(sec, k2) : -1;
  if (i1 >= 0 && c->key_line[i1]) return c->key_line[i1];
  if (i2 >= 0 && c->key_line[i2]) return c->key_line[i2];
  int si = section_index(sec);
  return si >= 0 ? c->sec_line[si] : 0;
}

/* A [model] value as the file would write it. */
static void model_value(const keydef *k, const jobspec_t *s, char *buf, size_t n) {
  const char *field = (const char *)s + k->off;
  if (k->type == KT_DBL) jobspec_fmt_num(buf, n, *(const double *)field);
  else if (k->type == KT_ENUM) snprintf(buf, n, "%s", k->names[*(const int *)field]);
  else snprintf(buf, n, "%d", *(const int *)field);
}

static int model_value_eq(const keydef *k, const jobspec_t *a, const jobspec_t *b) {
  if (k->type == KT_DBL) {
    double x = *(const double *)((const char *)a + k->off), y = *(const double *)((const char *)b + k->off);
    return fabs(x - y) <= 1e-9 * fabs(y);
  }
  return *(const int *)((const char *)a + k->off) == *(const int *)((const char *)b + k->off);
}

/* [model] from = DIR: config.json sets the model; a key the file also sets must agree with it; init
 * becomes the folder's weights. seq_len stays the job's (default: the model's positions, at most 1024). */
static void apply_from(pctx *c) {
  jobspec_t *s = c->s;
  if (!s->from[0]) return;
  int line = c->key_line[key_index("model", "from")];
  if (c->key_line[key_index("model", "init")]) {
    PERR(c, line, FSDP_ERR_INVALID, "[model] from and init both name the weights; allowed: one of them (from = DIR "
         "reads DIR's config.json and weights)");
    return;
  }
  char cfg[JOBSPEC_PATH_MAX + 16], msg[600];
  snprintf(cfg, sizeof cfg, "%s/config.json", s->from);
  jobspec_t h = *s;
  hf_config hc;
  fsdp_status rc = hf_config_load(cfg, &hc);
  int untie = 0;
  if (rc == FSDP_OK) rc = hf_weights_path(s->from, s->init, sizeof s->init);
  if (rc == FSDP_OK) rc = hf_resolve_tie(s->init, &hc, &untie);
  if (rc != FSDP_OK) {
    snprintf(msg, sizeof msg, "%s", fsdp_last_error());
    PERR(c, line, rc, "[model] from: %s", msg);
    return;
  }
  if (hc.dropout_key[0] && !s->no_dropout) {
    PERR(c, line, FSDP_ERR_UNSUPPORTED, "[model] from: %s has %s = %g%s, a dropout, which fsdpd does not apply; allowed: "
         "0 there, or [model] dropout = none to train without it", cfg, hc.dropout_key, hc.dropout,
         hc.dropout_default ? " (the config class's default: the key is absent)" : "");
    return;
  }
  if (hc.dropout_key[0]) snprintf(s->dropout_off, sizeof s->dropout_off, "%s = %g", hc.dropout_key, hc.dropout);
  h.model = hc.model;
  for (int i = 0; i < jobspec_nkeys; i++) {
    const keydef *k = &jobspec_keys[i];
    const char *ck = c->key_line[i] && !strcmp(k->sec, "model") ? hf_config_key(h.model.arch, k->key) : NULL;
    if (!ck || model_value_eq(k, s, &h) || (!strcmp(k->key, "n_positions") && !s->model.n_positions)) continue;
    char mine[48], theirs[48];
    model_value(k, s, mine, sizeof mine);
    model_value(k, &h, theirs, sizeof theirs);
    PERR(c, c->key_line[i], FSDP_ERR_INVALID, "[model] %s = %s, but %s has %s = %s; allowed: the value of config.json, "
         "or leave the key out (from sets it)", k->key, mine, cfg, ck, theirs);
    return;
  }
  int T = s->model.seq_len, npos = h.model.n_positions;
  s->model = h.model;
  if (untie) s->model.tie_embeddings = 0;   /* both tensors in the weights, different: transformers' untied model */
  s->model.seq_len = c->key_line[key_index("model", "seq_len")] ? T : npos < 1024 ? npos : 1024;
}

/* rope_scaling = llama3 and longrope need their numbers, and they mean nothing without them. */
static void rope_checks(pctx *c) {
  model_config *m = &c->s->model;
  unsigned bit = jobspec_rope_bit(m->rope_scaling);
  const char *kind = jobspec_rope_scaling_name(m->rope_scaling);
  char missing[200] = "";
  size_t used = 0;
  for (int i = 0; i < jobspec_nkeys; i++) {
    const keydef *k = &jobspec_keys[i];
    if (!(k->applies & KA_ROPE)) continue;
    if (!(k->applies & bit) && c->key_line[i]) {
      PERR(c, c->key_line[i], FSDP_ERR_INVALID, "[model] %s applies to rope_scaling = %s only; remove the key or set "
           "rope_scaling = %s", k->key, k->applies & KA_ROPE3 ? "llama3" : "longrope",
           k->applies & KA_ROPE3 ? "llama3" : "longrope");
      return;
    }
    if ((k->applies & bit) && !c->key_line[i] && used < sizeof missing)
      used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%s", used ? ", " : "", k->key);
  }
  if (used)
    PERR(c, blame(c, "model", "rope_scaling", NULL), FSDP_ERR_INVALID,
         "[model] rope_scaling = %s needs %s; missing: %s", kind, m->rope_scaling == ROPE_SCALING_LLAMA3
         ? "rope_factor, rope_low_freq_factor, rope_high_freq_factor and rope_original_max_position_embeddings "
           "(Llama-3.1: 8, 1, 4, 8192)" : "rope_short_factor, rope_attention_factor and "
           "rope_original_max_position_embeddings (Phi-3's config.json: short_factor, attention_factor, "
           "original_max_position_embeddings)", missing);
  else if (m->rope_scaling == ROPE_SCALING_LLAMA3 && !(m->rope_high_freq_factor > m->rope_low_freq_factor))
    PERR(c, blame(c, "model", "rope_high_freq_factor", "rope_low_freq_factor"), FSDP_ERR_INVALID,
         "[model] rope_high_freq_factor = %g is not above rope_low_freq_factor = %g; allowed: high > low (the band "
         "between them is interpolated)", m->rope_high_freq_factor, m->rope_low_freq_factor);
}

/* The architecture's own rules (its descriptor, models/arch.h); n_kv_head = 0 becomes n_head. */
static void model_checks(pctx *c) {
  model_config *m = &c->s->model;
  int from = c->s->from[0] != 0;   /* config.json set the model (apply_from; hfconfig checked its rope) */
  const arch_desc *d = arch_get(m->arch);
  for (int i = 0; i < jobspec_nkeys; i++)
    if (c->key_line[i] && !strcmp(jobspec_keys[i].sec, "model") && !arch_key_applies(d, jobspec_keys[i].key))
      PERR(c, c->key_line[i], FSDP_ERR_INVALID, "[model] %s applies to arch = %s only; %s; remove the key or set arch = %s",
           jobspec_keys[i].key, arch_key_owner(d, jobspec_keys[i].key)->name, d->why_not,
           arch_key_owner(d, jobspec_keys[i].key)->name);
  if (d->always_tied) {
    int tie = key_index("model", "tie_word_embeddings");
    if (c->key_line[tie] && !m->tie_embeddings)
      PERR(c, c->key_line[tie], FSDP_ERR_INVALID,
           "[model] tie_word_embeddings = false: %s; allowed with arch = %s: true (or leave the key out)", d->tied_why,
           d->name);
    m->tie_embeddings = 1;
  } else if (!from && !c->key_line[key_index("model", "tie_word_embeddings")]) {
    m->tie_embeddings = 0;   /* LlamaConfig's */
  }
  if (d->rotary && !from) rope_checks(c);
  if (!arch_key_applies(d, "n_kv_head") || (!c->key_line[key_index("model", "n_kv_head")] && !from) || !m->n_kv_head)
    m->n_kv_head = m->n_head;
  if (m->n_positions && m->seq_len > m->n_positions)
    PERR(c, blame(c, "model", "seq_len", "n_positions"), FSDP_ERR_RANGE,
         "[model] seq_len = %d is beyond the model's %d positions (%s); allowed: seq_len <= %d", m->seq_len,
         m->n_positions, hf_config_key(m->arch, "n_positions"), m->n_positions);
  if (m->rope_scaling == ROPE_SCALING_LONGROPE && m->seq_len > m->rope_original_max_pos)
    PERR(c, blame(c, "model", "seq_len", NULL), FSDP_ERR_UNSUPPORTED,
         "[model] seq_len = %d is above longrope's original_max_position_embeddings = %d: transformers switches to the "
         "long factors there, which fsdpd does not compute; allowed: seq_len <= %d", m->seq_len,
         m->rope_original_max_pos, m->rope_original_max_pos);
  if (arch_key_applies(d, "n_kv_head") && m->n_head % m->n_kv_head)
    PERR(c, blame(c, "model", "n_kv_head", "n_head"), FSDP_ERR_INVALID,
         "[model] n_kv_head = %d does not divide n_head = %d; allowed: a divisor of n_head (n_head itself is plain "
         "multi-head attention)", m->n_kv_head, m->n_head);
  else if (d->rotary && !m->head_dim && m->n_embd % m->n_head == 0 && (m->n_embd / m->n_head) % 2)
    PERR(c, blame(c, "model", "n_embd", "n_head"), FSDP_ERR_INVALID,
         "[model] head size n_embd / n_head = %d is odd; rotary embeddings rotate pairs of channels, so allowed: an "
         "even head size", m->n_embd / m->n_head);
  if (!arch_key_applies(d, "ffn_dim"))
    return;
  if (m->ffn_dim <= 0)
    PERR(c, blame(c, "model", "ffn_dim", "arch"), FSDP_ERR_INVALID,
         "[model] arch = %s needs ffn_dim, the SwiGLU width; allowed: an even integer in 2..1048576 (Llama-3.2-1B: 8192)",
         d->name);
  else if (m->ffn_dim % 2 && from)   /* the activations' layout keeps its fp32 buffers aligned only then (plan.c) */
    PERR(c, c->key_line[key_index("model", "from")], FSDP_ERR_UNSUPPORTED,
         "[model] from: %s/config.json has %s = %d, an odd SwiGLU width, which fsdpd does not compute; allowed: an even "
         "%s", c->s->from, hf_config_key(m->arch, "ffn_dim"), m->ffn_dim, hf_config_key(m->arch, "ffn_dim"));
  else if (m->ffn_dim % 2)
    PERR(c, blame(c, "model", "ffn_dim", NULL), FSDP_ERR_INVALID,
         "[model] ffn_dim = %d is odd; allowed: an even SwiGLU width (Llama's are multiples of 256)", m->ffn_dim);
}

/* [lora]: what the adapters' path does not do is refused here; the targets against the model in plan_build. */
/* [lora] base_dtype: refused without adapters; bf16 | fp32 is the dtype the base is held and gathered
 * in, so it sets param_dtype, and nf4 sets bf16 (the root's dtype and the dequantized unit's); a file
 * that sets param_dtype to another dtype is refused. */
static void lora_base_dtype(pctx *c) {
  jobspec_t *s = c->s;
  base_dtype_kind b = s->lora.base_dtype;
  if (b == BASE_AUTO) return;
  int line = blame(c, "lora", "base_dtype", NULL);
  if (s->lora.rank == 0) {
    PERR(c, line, FSDP_ERR_INVALID, "[lora] base_dtype = %s applies to a frozen base, so it needs [lora] rank > 0; "
         "allowed without [lora]: base_dtype = auto (every weight trained in param_dtype)", jobspec_base_dtype_name(b));
    return;
  }
  dtype_kind want = b == BASE_FP32 ? DTYPE_FP32 : DTYPE_BF16;   /* nf4: the root and the dequantized unit are bf16 */
  if (c->key_line[key_index("fsdp", "param_dtype")] && s->param_dtype != want)
    PERR(c, line, FSDP_ERR_INVALID, "[lora] base_dtype = %s and [fsdp] param_dtype = %s disagree: the frozen base is "
         "gathered in its own dtype; allowed: the same dtype in both, or one of them left out",
         jobspec_base_dtype_name(b), jobspec_dtype_kind_name(s->param_dtype));
  s->param_dtype = want;
}

static void lora_checks(pctx *c) {
  const jobspec_t *s = c->s;
  lora_base_dtype(c);
  if (s->lora.rank == 0) return;   /* no LoRA: the other [lora] keys are not read */
  if (s->lora.dropout != 0.0)
    PERR(c, blame(c, "lora", "dropout", NULL), FSDP_ERR_UNSUPPORTED,
         "[lora] dropout = %g is not implemented; allowed: 0 (no dropout on the adapters' input)", s->lora.dropout);
  if (s->sample_every > 0)
    PERR(c, blame(c, "eval", "sample_every", NULL), FSDP_ERR_UNSUPPORTED,
         "[eval] sample_every = %d with [lora]: samples from base + adapters are not built yet; allowed: sample_every = 0",
         s->sample_every);
  if (s->offload != OFFLOAD_NONE)
    PERR(c, blame(c, "lora", "rank", "offload"), FSDP_ERR_UNSUPPORTED,
         "[lora] with [fsdp] offload = %s: the adapters' optimizer state stays on the device; allowed: offload = none",
         jobspec_offload_mode_name(s->offload));
}

/* init = FILE whose folder's config.json is another architecture's: refused, not read as the job's. */
static void check_init_folder(pctx *c) {
  const jobspec_t *s = c->s;
  int line = c->key_line[key_index("model", "init")];
  if (s->from[0] || !line || !strcmp(s->init, "random") || hf_check_init_folder(s->init, s->model.arch) == FSDP_OK)
    return;
  char msg[600];
  snprintf(msg, sizeof msg, "%s", fsdp_last_error());
  PERR(c, line, FSDP_ERR_INVALID, "[model] init: %s", msg);
}

static void cross_checks(pctx *c) {
  const jobspec_t *s = c->s;
  apply_from(c);
  check_init_folder(c);
  if (s->model.n_embd % s->model.n_head)
    PERR(c, blame(c, "model", "n_embd", "n_head"), FSDP_ERR_INVALID,
         "[model] n_embd = %d is not divisible by n_head = %d; allowed: n_embd a multiple of n_head",
         s->model.n_embd, s->model.n_head);
  model_checks(c);
  if (s->min_lr > s->lr && s->schedule == SCHED_COSINE)   /* constant never reads min_lr */
    PERR(c, blame(c, "optim", "min_lr", "lr"), FSDP_ERR_RANGE,
         "[optim] min_lr = %g%s is above lr = %g; allowed: 0 <= min_lr <= lr (the cosine schedule's floor), or "
         "schedule = constant", s->min_lr, c->key_line[key_index("optim", "min_lr")] ? "" : " (the default)", s->lr);
  if (s->device == DEVICE_CPU && s->offload != OFFLOAD_NONE)
    PERR(c, blame(c, "fsdp", "offload", "device"), FSDP_ERR_UNSUPPORTED,
         "[fsdp] offload = %s moves optimizer state off the GPU, so it needs device = cuda; allowed with device = cpu: "
         "offload = none (the state is in host memory already)", jobspec_offload_mode_name(s->offload));
  if (s->device == DEVICE_CPU && s->comm == COMM_NCCL)
    PERR(c, blame(c, "fsdp", "comm", "device"), FSDP_ERR_UNSUPPORTED,
         "[fsdp] comm = nccl needs device = cuda; allowed with device = cpu: comm = auto | gloo");
  /* only against a world_size the file sets: `fsdpctl plan --world N` and standalone --world choose another (plan_build checks then) */
  if (s->sharding == SHARD_HYBRID && s->shard_group > 0 && c->key_line[key_index("fsdp", "world_size")] &&
      (s->world_size % s->shard_group || s->world_size == s->shard_group))
    PERR(c, blame(c, "fsdp", "shard_group", "world_size"), FSDP_ERR_INVALID, "%s", jobspec_hybrid_error(s->world_size, s->shard_group));
  if (s->sharding != SHARD_HYBRID && s->shard_group > 0)
    PERR(c, blame(c, "fsdp", "shard_group", "sharding"), FSDP_ERR_INVALID,
         "[fsdp] shard_group = %d applies to sharding = hybrid only; allowed with sharding = %s: shard_group = 0",
         s->shard_group, jobspec_shard_mode_name(s->sharding));
  if (s->ckpt_every > 0 && !s->ckpt_dir[0])
    PERR(c, blame(c, "checkpoint", "every", NULL), FSDP_ERR_INVALID,
         "[checkpoint] every = %d needs a dir; set [checkpoint] dir = PATH, or every = 0 for none", s->ckpt_every);
  if (s->eval_every > 0 && !jobspec_has_val(s))
    PERR(c, blame(c, "eval", "every", NULL), FSDP_ERR_INVALID,
         "[eval] every = %d needs validation tokens; set [data] val = PATH | synthetic:markov:SEED, or every = 0 "
         "for none", s->eval_every);
  if (s->eval_at_start && !jobspec_has_val(s))
    PERR(c, blame(c, "eval", "at_start", NULL), FSDP_ERR_INVALID,
         "[eval] at_start = true needs validation tokens; set [data] val = PATH | synthetic:markov:SEED, or "
         "at_start = false");
  if (s->sample_every > 0 && !s->sample_prompt[0])
    PERR(c, blame(c, "eval", "sample_every", NULL), FSDP_ERR_INVALID,
         "[eval] sample_every = %d needs a prompt; set [eval] sample_prompt = TEXT, or sample_every = 0 for none",
         s->sample_every);
  for (const unsigned char *q = (const unsigned char *)s->sample_prompt; *q; q++)
    if (*q >= s->model.vocab_size) {
      PERR(c, blame(c, "eval", "sample_prompt", NULL), FSDP_ERR_RANGE,
           "[eval] sample_prompt: byte %u at offset %d is outside the vocabulary (vocab_size = %d); allowed: "
           "text whose bytes are all < vocab_size (one token per byte)",
           *q, (int)(q - (const unsigned char *)s->sample_prompt), s->model.vocab_size);
      break;
    }
  if (!s->pack && (s->synthetic || s->val_synthetic))   /* a token file's kind is the job file check's (tokmask.h) */
    PERR(c, blame(c, "data", "pack", NULL), FSDP_ERR_INVALID,
         "[data] pack = false: the synthetic stream is one continuous stream without documents; allowed: pack = true "
         "(the default) with synthetic:markov, or a masked file made by gen-data --chat");
  if (s->max_restarts > 0 && (s->ckpt_every <= 0 || s->resume != RESUME_AUTO))   /* else a restart trains from step 0 */
    PERR(c, blame(c, "job", "max_restarts", NULL), FSDP_ERR_INVALID,
         "[job] max_restarts = %d restarts from the newest checkpoint, so it needs [checkpoint] every > 0 (with a "
         "dir) and resume = auto; set them, or max_restarts = 0", s->max_restarts);
  lora_checks(c);
  if (!c->key_line[key_index("data", "train")]) {
    int line = c->sec_line[section_index("data")];
    PERR(c, line ? line : c->nlines, FSDP_ERR_INVALID,
         "[data] train is required (no default); allowed: PATH (an llm.c token file) | synthetic:markov:SEED");
  }
}

/* Every key's default from its row, through the parser's own setters (so each is in its range). */
void jobspec_defaults(jobspec_t *s) {
  memset(s, 0, sizeof *s);
  snprintf(s->path, sizeof s->path, "<string>");
  pctx c = {.s = s, .origin = "<defaults>", .base_dir = "/"};
  for (int i = 0; i < jobspec_nkeys; i++)
    if (jobspec_keys[i].def) set_value(&c, &jobspec_keys[i], jobspec_keys[i].def);
  if (c.err) log_error("the key table's defaults: %s", fsdp_last_error());   /* a bug; test_jobspec fails on it */
}

static void default_name(jobspec_t *s, const char *origin) {
  const char *b = strrchr(origin, '/');
  b = b ? b + 1 : origin;
  if (!*b || *b == '<') return;   /* "<string>": keep "job" */
  size_t n = strcspn(b, ".");
  if (!n) return;
  if (n >= sizeof s->name) n = sizeof s->name - 1;
  for (size_t i = 0; i < n; i++)
    s->name[i] = isalnum((unsigned char)b[i]) || b[i] == '_' || b[i] == '-' ? b[i] : '-';
  s->name[n] = '\0';
}

fsdp_status jobspec_parse(const char *text, const char *origin, const char *base_dir, jobspec_t *out) {
  if (!origin) origin = "<string>";
  if (!text || !out) return fsdp_set_error(FSDP_ERR_INVALID, "jobspec_parse: NULL text or output");
  char cwd[PATH_MAX];
  if (!base_dir || base_dir[0] != '/') {
    if (!getcwd(cwd, sizeof cwd)) return fsdp_set_error(FSDP_ERR_IO, "getcwd: %s", strerror(errno));
    if (base_dir && *base_dir) {
      size_t n = strlen(cwd);
      if (n + 1 + strlen(base_dir) >= sizeof cwd)
        return fsdp_set_error(FSDP_ERR_RANGE, "base directory %s is too long", base_dir);
      snprintf(cwd + n, sizeof cwd - n, "/%s", base_dir);
    }
    base_dir = cwd;
  }
  jobspec_t s;
  jobspec_defaults(&s);
  snprintf(s.path, sizeof s.path, "%s", origin);
  default_name(&s, origin);
  pctx c = {.s = &s, .origin = origin, .base_dir = base_dir, .p = text};
  for (const char *q = text; *q; q++) c.nlines += *q == '\n';
  if (text[0] && text[strlen(text) - 1] != '\n') c.nlines++;
  int rc = ini_parse_stream(line_reader, &c, on_key, &c);
  if (rc < 0) return jobspec_error(FSDP_ERR_NOMEM, origin, 0, "the INI parser ran out of memory");
  if (rc > 0 && (!c.err || rc < c.err_line)) {
    c.err = 0;
    PERR(&c, rc, FSDP_ERR_FORMAT, "syntax error; allowed lines: [section], key = value, # comment or ; comment");
  }
  if (!c.err) cross_checks(&c);
  if (c.err) return c.err;
  *out = s;
  return FSDP_OK;
}

fsdp_status jobspec_load(const char *path, jobspec_t *out) {
  if (!path || !out) return fsdp_set_error(FSDP_ERR_INVALID, "jobspec_load: NULL path or output");
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    return jobspec_error(e == ENOENT ? FSDP_ERR_NOTFOUND : FSDP_ERR_IO, path, 0,
                             "cannot open the job file: %s", strerror(e));
  }
  char *text = malloc(JOBSPEC_MAX_FILE + 1);
  if (!text) {
    fclose(f);
    return fsdp_set_error(FSDP_ERR_NOMEM, "no memory for the job file");
  }
  size_t n = fread(text, 1, JOBSPEC_MAX_FILE + 1, f);
  int rerr = ferror(f);
  fclose(f);
  fsdp_status rc;
  if (rerr) {
    rc = jobspec_error(FSDP_ERR_IO, path, 0, "cannot read the job file (is it a directory?)");
    goto out;
  }
  if (n > JOBSPEC_MAX_FILE) {
    rc = jobspec_error(FSDP_ERR_RANGE, path, 0, "the job file is larger than %d bytes", JOBSPEC_MAX_FILE);
    goto out;
  }
  text[n] = '\0';
  if (strlen(text) != n) {
    rc = jobspec_error(FSDP_ERR_FORMAT, path, 0, "the job file contains a NUL byte; allowed: INI text");
    goto out;
  }
  char real[PATH_MAX], dir[PATH_MAX];
  if (!realpath(path, real)) {
    rc = jobspec_error(FSDP_ERR_IO, path, 0, "cannot resolve the job file's path: %s", strerror(errno));
    goto out;
  }
  snprintf(dir, sizeof dir, "%s", real);
  char *slash = strrchr(dir, '/');
  if (slash == dir) slash[1] = '\0';
  else if (slash) *slash = '\0';
  rc = jobspec_parse(text, path, dir, out);
out:
  free(text);
  return rc;
}


int jobspec_lr_warning(const jobspec_t *s, char *buf, size_t n) {
  if (s->warmup_steps < s->steps || s->lr <= 0) return 0;
  double last = s->lr * (double)s->steps / (double)(s->warmup_steps + 1);
  snprintf(buf, n, "warning: warmup_steps = %d >= steps = %d: the learning rate rises for the whole job and "
           "ends at %.3g, never reaching lr = %.3g; set warmup_steps to a few %% of steps (docs/data.md, "
           "fine-tuning)", s->warmup_steps, s->steps, last, s->lr);
  return 1;
}
