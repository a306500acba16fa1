/* jobspec_canon — the job as text: the resolved job and back, what the coordinator sends its workers
 * (see jobspec.h), and the commented defaults file. The writer puts every key of the table on its own line, in table order, after a first
 * line that names the format's version; the reader takes exactly that: no defaults (it starts from
 * zero), no derived keys, no file lookups, so a worker runs the values the coordinator resolved and
 * never its own build's defaults. Each value must be of its key's type (a number, one of the enum's
 * names) and, where the key applies to the job, in the table's range (the text arrives over the
 * wire); one that does not apply (a Llama key under GPT-2) holds 0, outside its range. The
 * architecture's own settings (models/arch.h) close [model], each of them, none of another's.
 */
#include "jobspec.h"
#include "jobspec_keys.h"

#include "arch.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
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

static int write_value(FILE *f, const keydef *k, const jobspec_t *s) {
  const char *field = (const char *)s + k->off;
  char num[32];
  switch (k->type) {
  case KT_INT: return fprintf(f, "%d", *(const int *)field) < 0 ? -1 : 0;
  case KT_U64: return fprintf(f, "%" PRIu64, *(const uint64_t *)field) < 0 ? -1 : 0;
  case KT_DBL: jobspec_fmt_num(num, sizeof num, *(const double *)field); return fputs(num, f) == EOF ? -1 : 0;
  case KT_FACTORS: return jobspec_fmt_factors(f, (const rope_factor_list *)field);
  case KT_ENUM: {
    int v = *(const int *)field, n = 0;
    while (k->names[n]) n++;
    return v < 0 || v >= n || fputs(k->names[v], f) == EOF ? -1 : 0;
  }
  default:
    return write_text(f, k, s);
  }
}

static int write_key(FILE *f, const keydef *k, const jobspec_t *s) {
  if (fprintf(f, "%s = ", k->key) < 0 || write_value(f, k, s)) return -1;
  return fputc('\n', f) == EOF ? -1 : 0;
}

/* The model's architecture's own settings (models/arch.h), at the end of [model]. */
static int write_ext(FILE *f, const model_config *m) {
  const arch_desc *d = arch_get(m->arch);
  char v[32];
  for (int i = 0; i < arch_ext_count(d); i++) {
    arch_ext_format(&d->ext_keys[i], m->ext[i], v, sizeof v);
    if (fprintf(f, "%s = %s\n", d->ext_keys[i].key, v) < 0) return -1;
  }
  return 0;
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
      if (!strcmp(cur, "model")) bad = write_ext(f, &s->model) < 0;
      bad = bad || fprintf(f, "[%s]\n", k->sec) < 0;
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
  struct {   /* [model] keys of the architecture's own settings, read once the text's arch is known */
    const char *key, *value;
    int line;
  } ext[MODEL_EXT_MAX];
  int next;
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
  if (!strcmp(r->sec, "model") && arch_ext_known(ln) && r->next < MODEL_EXT_MAX) {
    r->ext[r->next].key = ln;
    r->ext[r->next].value = eq + 3;
    r->ext[r->next++].line = r->line;
    return FSDP_OK;
  }
  return cerr(r, "unknown key [%s] %s", r->sec, ln);
}

/* The architecture's own settings: each of them once, in range; no other architecture's. */
static fsdp_status read_ext(creader *r) {
  const arch_desc *d = arch_get(r->s->model.arch);
  int seen[MODEL_EXT_MAX] = {0};
  for (int i = 0; i < r->next; i++) {
    int j = arch_ext_index(d, r->ext[i].key);
    r->line = r->ext[i].line;
    if (j < 0) return cerr(r, "[model] %s is not a setting of arch = %s", r->ext[i].key, d ? d->name : "?");
    if (seen[j]++) return cerr(r, "[model] %s is set twice%s", r->ext[i].key, "");
    if (!arch_ext_parse(&d->ext_keys[j], r->ext[i].value, &r->s->model.ext[j]))
      return cerr(r, "[model] %s = %s is not one of its values", r->ext[i].key, r->ext[i].value);
  }
  for (int j = 0; j < arch_ext_count(d); j++)
    if (!seen[j]) return cerr(r, "[model] %s is missing (every key is explicit)%s", d->ext_keys[j].key, "");
  return FSDP_OK;
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
  if (rc == FSDP_OK) rc = read_ext(&r);
  if (rc == FSDP_OK) *out = *s;
  free(copy);
  free(s);
  return rc;
}

/* ---- the commented defaults (`fsdpctl plan --defaults`) ---- */

/* What the defaults file shows for a commented-out model key: its default, or, where the default
 * is no value (the llama3 numbers), Llama-3.1-8B's. */
static void write_example(FILE *f, const keydef *k, const jobspec_t *d) {
  static const struct { const char *key, *value; } ex[] = {
    {"rope_factor", "8"}, {"rope_low_freq_factor", "1"}, {"rope_high_freq_factor", "4"},
    {"rope_original_max_position_embeddings", "8192"},
  };
  for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++)
    if (!strcmp(k->key, ex[i].key)) {
      fputs(ex[i].value, f);
      return;
    }
  write_value(f, k, d);
}

/* Every architecture's own settings, commented out: the default model (GPT-2) has none. */
static void write_ext_defaults(FILE *f) {
  char allowed[160];
  for (int a = 0; a < arch_count(); a++) {
    const arch_desc *d = arch_get((model_arch)a);
    for (int i = 0; i < arch_ext_count(d); i++) {
      arch_ext_allowed(&d->ext_keys[i], allowed, sizeof allowed);
      fprintf(f, "# %s: %s; allowed: %s\n; %s = %s\n", d->name, d->ext_keys[i].help, allowed, d->ext_keys[i].key,
              d->ext_keys[i].def);
    }
  }
}

void jobspec_write_defaults(FILE *f) {
  jobspec_t d;
  jobspec_defaults(&d);
  fprintf(f,
          "# fsdpd job file: every key with its default (GPT-2 small, nanoGPT's training recipe).\n"
          "# Comments start with # or ;. Relative paths are relative to this file's directory.\n"
          "# Keys shown commented out have no default. docs/jobs.md describes each one.\n");
  const char *cur = "";
  for (int i = 0; i < jobspec_nkeys; i++) {
    const keydef *k = &jobspec_keys[i];
    if (strcmp(cur, k->sec)) {
      if (!strcmp(cur, "model")) write_ext_defaults(f);
      fprintf(f, "\n[%s]\n", k->sec);
      cur = k->sec;
    }
    char allowed[160];
    jobspec_key_allowed(k, allowed, sizeof allowed);
    if (k->type >= KT_NAME) fprintf(f, "# %s\n", k->help);
    else fprintf(f, "# %s; allowed: %s\n", k->help, allowed);
    if (k->type == KT_NAME) fprintf(f, "; name = tiny\n");
    else if (k->type == KT_TRAIN) fprintf(f, "; train = synthetic:markov:1\n");
    else if (k->type == KT_VAL) fprintf(f, "; val = synthetic:markov:2\n");
    else if (k->type == KT_TEXT) fprintf(f, "; %s = To be, or not to be\n", k->key);
    else if (k->type == KT_DIR) fprintf(f, "; dir = checkpoints\n");
    else if (k->type == KT_FROM) fprintf(f, "; from = SmolLM2-135M\n");
    else if (!jobspec_key_applies(k, d.model.arch) || k->off == offsetof(jobspec_t, model.tie_embeddings)) {
      /* the default model is GPT-2, which refuses the other architectures' keys and always ties */
      fprintf(f, "; %s = ", k->key);
      write_example(f, k, &d);
      fputc('\n', f);
    } else {
      write_key(f, k, &d);
    }
  }
}
