/* jobspec — the job file: a libinih pass over the declarative key table (jobspec_keys.c: section,
 * name, type, default, range, help), then the rules between keys (jobspec_rules.c). See jobspec.h
 * and docs/jobs.md.
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
#include "jobspec_rules.h"

#include "arch.h"
#include "fsutil.h"
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
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

static void trim_copy(char *dst, size_t n, const char *src, size_t len) {
  while (len && isspace((unsigned char)*src)) src++, len--;
  while (len && isspace((unsigned char)src[len - 1])) len--;
  if (len >= n) len = n - 1;
  memcpy(dst, src, len);
  dst[len] = '\0';
}

static void check_section_header(jobspec_ctx *c, const char *line) {
  const char *close = strchr(line, ']');
  if (!close) return;   /* inih reports the syntax error */
  char name[64];
  trim_copy(name, sizeof name, line + 1, (size_t)(close - line - 1));
  int si = jobspec_section_index(name);
  if (si < 0) {
    PERR(c, c->lineno, FSDP_ERR_INVALID,
         "unknown section [%s]; allowed: " JOBSPEC_SECTIONS_ALLOWED, name);
    return;
  }
  if (!c->sec_line[si]) c->sec_line[si] = c->lineno;
}

/* fgets-style reader over the text: one whole line per call (see the header comment). */
static char *line_reader(char *str, int num, void *stream) {
  jobspec_ctx *c = stream;
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
static int resolve_path(const jobspec_ctx *c, const char *v, char *out, size_t n) {
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
static int check_links(jobspec_ctx *c, const keydef *k, const char *raw) {
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
static int check_readable(jobspec_ctx *c, const keydef *k, const char *raw, const char *abs) {
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
static void data_paths(jobspec_ctx *c, const keydef *k, const char *v, char *out) {
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

static void set_special(jobspec_ctx *c, const keydef *k, const char *v) {
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

static void set_value(jobspec_ctx *c, const keydef *k, const char *v) {
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
  jobspec_ctx *c = user;
  if (c->err) return 0;
  char sec[64];
  trim_copy(sec, sizeof sec, section, strlen(section));
  if (!*sec) {
    PERR(c, c->lineno, FSDP_ERR_INVALID, "key '%s' is outside any section; put it under one of "
         JOBSPEC_SECTIONS_ALLOWED, name);
    return 0;
  }
  if (jobspec_section_index(sec) < 0) return 0;   /* reported by the reader */
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
  if (!strcmp(sec, "model") && arch_ext_known(name)) {   /* an architecture's own: the rules read it */
    for (int i = 0; i < c->next; i++)
      if (!strcmp(c->ext[i].key, name)) {
        PERR(c, c->lineno, FSDP_ERR_INVALID, "[model] %s is set twice (first at line %d); set each key once", name,
             c->ext[i].line);
        return 0;
      }
    if (c->next == JOBSPEC_MAX_EXT || strlen(name) >= sizeof c->ext[0].key || strlen(value) >= JOBSPEC_TEXT_MAX) {
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[model] %s: too many or too long architecture settings; allowed: each "
           "once, on one line", name);
      return 0;
    }
    snprintf(c->ext[c->next].key, sizeof c->ext[0].key, "%s", name);
    snprintf(c->ext[c->next].value, JOBSPEC_TEXT_MAX, "%s", value);
    c->ext[c->next++].line = c->lineno;
    return 1;
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

/* Every key's default from its row, through the parser's own setters (so each is in its range). */
void jobspec_defaults(jobspec_t *s) {
  memset(s, 0, sizeof *s);
  snprintf(s->path, sizeof s->path, "<string>");
  jobspec_ctx c = {.s = s, .origin = "<defaults>", .base_dir = "/"};
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
  jobspec_ctx c = {.s = &s, .origin = origin, .base_dir = base_dir, .p = text};
  for (const char *q = text; *q; q++) c.nlines += *q == '\n';
  if (text[0] && text[strlen(text) - 1] != '\n') c.nlines++;
  int rc = ini_parse_stream(line_reader, &c, on_key, &c);
  if (rc < 0) return jobspec_error(FSDP_ERR_NOMEM, origin, 0, "the INI parser ran out of memory");
  if (rc > 0 && (!c.err || rc < c.err_line)) {
    c.err = 0;
    PERR(&c, rc, FSDP_ERR_FORMAT, "syntax error; allowed lines: [section], key = value, # comment or ; comment");
  }
  if (!c.err) jobspec_rules_check(&c);
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
