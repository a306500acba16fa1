/* jobspec_canon — the resolved job as text, and back: what the coordinator sends its workers (see
 * jobspec.h). The writer puts every key of the table on its own line, in table order, after a first
 * line that names the format's version; the reader takes exactly that: no defaults (it starts from
 * zero), no derived keys, no file lookups, so a worker runs the values the coordinator resolved and
 * never its own build's defaults. Each value must be of its key's type (a number, one of the enum's
 * names) and, where the key applies to the job, in the table's range (the text arrives over the
 * wire); one that does not apply (a Llama key under GPT-2) holds 0, outside its range.
 */
#include "jobspec.h"
#include "jobspec_keys.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CANON_HEADER "# fsdpd resolved job, version "

/* A text value as written: the data lists one per line inside jobspec_t, space-separated here. */
static int write_text(FILE *f, const keydef *k, const jobspec_t *s) {
  const char *field = (const char *)s + k->off;
  if (k->type == KT_TRAIN || k->type == KT_VAL) {
    int syn = k->type == KT_TRAIN ? s->synthetic : s->val_synthetic;
    uint64_t seed = k->type == KT_TRAIN ? s->markov_seed : s->val_markov_seed;
    if (syn) return fprintf(f, "synthetic:markov:%" PRIu64, seed) < 0 ? -1 : 0;
    for (const char *p = field; *p; p++)
      if (fputc(*p == '\n' ? ' ' : *p, f) == EOF) return -1;
    return 0;
  }
  return fputs(field, f) == EOF ? -1 : 0;
}

static int write_key(FILE *f, const keydef *k, const jobspec_t *s) {
  const char *field = (const char *)s + k->off;
  char num[32];
  if (fprintf(f, "%s = ", k->key) < 0) return -1;
  switch (k->type) {
  case KT_INT: if (fprintf(f, "%d", *(const int *)field) < 0) return -1; break;
  case KT_U64: if (fprintf(f, "%" PRIu64, *(const uint64_t *)field) < 0) return -1; break;
  case KT_DBL: jobspec_fmt_num(num, sizeof num, *(const double *)field); if (fputs(num, f) == EOF) return -1; break;
  case KT_FACTORS: if (jobspec_fmt_factors(f, (const rope_factor_list *)field)) return -1; break;
  case KT_ENUM: {
    int v = *(const int *)field, n = 0;
    while (k->names[n]) n++;
    if (v < 0 || v >= n || fputs(k->names[v], f) == EOF) return -1;
    break;
  }
  default:
    if (write_text(f, k, s)) return -1;
  }
  return fputc('\n', f) == EOF ? -1 : 0;
}

fsdp_status jobspec_canonical_write(const jobspec_t *s, char **text) {
  *text = NULL;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot write the resolved job: %s", strerror(errno));
  int bad = fprintf(f, CANON_HEADER "%d (every key explicit)\n", JOBSPEC_CANON_VERSION) < 0;
  const char *cur = "";
  for (int i = 0; !bad && i < jobspec_nkeys; i++) {
    const keydef *k = &jobspec_keys[i];
    if (strcmp(cur, k->sec)) {
      bad = fprintf(f, "[%s]\n", k->sec) < 0;
      cur = k->sec;
    }
    const char *field = (const char *)s + k->off;
    fsdp_status why = k->type >= KT_NAME && k->type != KT_TRAIN && k->type != KT_VAL && strchr(field, '\n')
                          ? fsdp_set_error(FSDP_ERR_INVALID, "%s: [%s] %s holds a line break (a path resolved through "
                                           "a link?); allowed: a value on one line", s->path, k->sec, k->key)
                      : !bad && write_key(f, k, s)
                          ? fsdp_set_error(FSDP_ERR_INTERNAL, "%s: [%s] %s has no value the resolved job can carry",
                                           s->path, k->sec, k->key)
                          : FSDP_OK;
    if (why != FSDP_OK) {
      fclose(f);
      free(buf);
      return why;
    }
  }
  if (fclose(f) != 0 || bad) {
    free(buf);
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot write the resolved job: out of memory");
  }
  *text = buf;
  return FSDP_OK;
}

/* ---- the reader ---- */

typedef struct creader {
  jobspec_t *s;
  const char *origin;
  int line;
  char sec[16];
  int seen[JOBSPEC_MAX_KEYS];
} creader;

static fsdp_status cerr(const creader *r, const char *fmt, const char *a, const char *b) {
  char what[400];
  snprintf(what, sizeof what, fmt, a, b);
  return fsdp_set_error(FSDP_ERR_FORMAT, "%s: the resolved job, line %d: %s", r->origin, r->line, what);
}

static fsdp_status read_data(const creader *r, const keydef *k, const char *v) {
  int is_val = k->type == KT_VAL;
  char *path = is_val ? r->s->val : r->s->train;
  if (!strncmp(v, "synthetic:markov:", 17)) {
    char *end;
    errno = 0;
    unsigned long long seed = strtoull(v + 17, &end, 10);
    if (errno || *end || !isdigit((unsigned char)v[17])) return cerr(r, "[data] %s = %s: not a synthetic seed", k->key, v);
    *(is_val ? &r->s->val_synthetic : &r->s->synthetic) = 1;
    *(is_val ? &r->s->val_markov_seed : &r->s->markov_seed) = (uint64_t)seed;
    return FSDP_OK;
  }
  if (strlen(v) >= JOBSPEC_PATH_MAX) return cerr(r, "[data] %s is longer than the paths allowed%s", k->key, "");
  size_t n = 0;
  for (const char *p = v; *p; p++) path[n++] = *p == ' ' ? '\n' : *p;
  path[n] = '\0';
  if (!is_val && !n) return cerr(r, "[data] %s is empty%s", k->key, "");
  return FSDP_OK;
}

static fsdp_status read_value(const creader *r, const keydef *k, const char *v) {
  char *field = (char *)r->s + k->off, *end;
  errno = 0;
  switch (k->type) {
  case KT_INT: {
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < INT_MIN || x > INT_MAX) return cerr(r, "%s = %s is not an integer", k->key, v);
    *(int *)field = (int)x;
    return FSDP_OK;
  }
  case KT_U64: {
    unsigned long long x = strtoull(v, &end, 10);
    if (!isdigit((unsigned char)*v) || *end || errno) return cerr(r, "%s = %s is not an integer", k->key, v);
    *(uint64_t *)field = (uint64_t)x;
    return FSDP_OK;
  }
  case KT_DBL: {
    double x = strtod(v, &end);
    if (!*v || *end || !isfinite(x)) return cerr(r, "%s = %s is not a number", k->key, v);
    *(double *)field = x;
    return FSDP_OK;
  }
  case KT_FACTORS:
    if (!strcmp(v, "")) return FSDP_OK;   /* none: rope_scaling is not longrope (check_range) */
    if (!jobspec_parse_factors(v, (rope_factor_list *)field)) return cerr(r, "%s = %s is not a list of numbers", k->key, v);
    return FSDP_OK;
  case KT_ENUM:
    for (int i = 0; k->names[i]; i++)
      if (!strcmp(v, k->names[i])) {
        *(int *)field = i;
        return FSDP_OK;
      }
    return cerr(r, "%s = %s is not one of its names", k->key, v);
  case KT_TRAIN:
  case KT_VAL:
    return read_data(r, k, v);
  default: {
    size_t cap = k->type == KT_TEXT ? JOBSPEC_TEXT_MAX : k->type == KT_NAME ? sizeof r->s->name : JOBSPEC_PATH_MAX;
    if (strlen(v) >= cap) return cerr(r, "%s is longer than allowed%s", k->key, "");
    snprintf(field, cap, "%s", v);
    return FSDP_OK;
  }
  }
}

/* A number of a key that applies to the job (its architecture; the llama3 numbers under rope_scaling =
 * llama3) within the key's range: one that does not apply holds 0, outside it. */
static fsdp_status check_range(const jobspec_t *s, const keydef *k, const char *origin) {
  if (k->type != KT_INT && k->type != KT_DBL && k->type != KT_FACTORS) return FSDP_OK;
  if (!jobspec_key_applies(k, s->model.arch) ||
      ((k->applies & KA_ROPE) && !(k->applies & jobspec_rope_bit(s->model.rope_scaling))))
    return FSDP_OK;
  const char *field = (const char *)s + k->off;
  if (k->type == KT_FACTORS) {
    const rope_factor_list *l = (const rope_factor_list *)field;
    int ok = l->n >= 1 && l->n <= ROPE_MAX_FACTORS;
    for (int i = 0; ok && i < l->n; i++) ok = l->v[i] > k->lo && l->v[i] <= k->hi;
    if (!ok)
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: the resolved job: [%s] %s holds %d numbers, not all in range", origin,
                            k->sec, k->key, l->n);
    return FSDP_OK;
  }
  double x = k->type == KT_INT ? *(const int *)field : *(const double *)field;
  if (x < k->lo || (k->lo_open && x == k->lo) || x > k->hi || (k->hi_open && x == k->hi)) {
    char allowed[160], v[32];
    jobspec_key_allowed(k, allowed, sizeof allowed);
    jobspec_fmt_num(v, sizeof v, x);
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: the resolved job: [%s] %s = %s is out of range; allowed: %s", origin,
                          k->sec, k->key, v, allowed);
  }
  return FSDP_OK;
}

/* One line of the text: a section header or "key = value" (the value verbatim to the line's end). */
static fsdp_status read_line(creader *r, char *ln) {
  if (*ln == '[') {
    char *close = strchr(ln, ']');
    if (!close || close[1] || (size_t)(close - ln - 1) >= sizeof r->sec) return cerr(r, "a malformed section '%s'%s", ln, "");
    *close = '\0';
    snprintf(r->sec, sizeof r->sec, "%s", ln + 1);
    return FSDP_OK;
  }
  char *eq = strstr(ln, " = ");
  if (!eq) return cerr(r, "'%s' is not 'key = value'%s", ln, "");
  *eq = '\0';
  for (int i = 0; i < jobspec_nkeys; i++) {
    const keydef *k = &jobspec_keys[i];
    if (strcmp(k->sec, r->sec) || strcmp(k->key, ln)) continue;
    if (r->seen[i]++) return cerr(r, "[%s] %s is set twice", r->sec, ln);
    return read_value(r, k, eq + 3);
  }
  return cerr(r, "unknown key [%s] %s", r->sec, ln);
}

fsdp_status jobspec_canonical_read(const char *text, const char *origin, jobspec_t *out) {
  if (!origin || !*origin) origin = "<resolved job>";
  size_t hn = strlen(CANON_HEADER);
  if (!text || strncmp(text, CANON_HEADER, hn))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: the job arrived without its resolved form (a coordinator older than "
                          "this worker?); run the same fsdpd version on every node", origin);
  int version = atoi(text + hn);
  if (version != JOBSPEC_CANON_VERSION)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: the coordinator resolved the job in format version %d, this worker "
                          "reads version %d; run the same fsdpd version on every node", origin, version,
                          JOBSPEC_CANON_VERSION);
  jobspec_t *s = calloc(1, sizeof *s);   /* from zero: no default of this build takes part */
  char *copy = strdup(text);
  if (!s || !copy) {
    free(s), free(copy);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  }
  snprintf(s->path, sizeof s->path, "%s", origin);
  creader r = {.s = s, .origin = origin, .line = 1};
  fsdp_status rc = FSDP_OK;
  char *save = NULL;
  strtok_r(copy, "\n", &save);   /* the header */
  for (char *ln = strtok_r(NULL, "\n", &save); ln && rc == FSDP_OK; ln = strtok_r(NULL, "\n", &save)) {
    r.line++;
    rc = read_line(&r, ln);
  }
  for (int i = 0; rc == FSDP_OK && i < jobspec_nkeys; i++)
    if (!r.seen[i]) rc = cerr(&r, "[%s] %s is missing (every key is explicit)", jobspec_keys[i].sec, jobspec_keys[i].key);
  for (int i = 0; rc == FSDP_OK && i < jobspec_nkeys; i++) rc = check_range(s, &jobspec_keys[i], origin);
  if (rc == FSDP_OK) *out = *s;
  free(copy);
  free(s);
  return rc;
}
