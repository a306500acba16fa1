/* arch — the table of architectures, from models/models.def; see arch.h. */
#include "arch.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FSDP_ARCH(ID, name) extern const arch_desc name##_arch;
#include "models.def"

static const arch_desc *const table[] = {
#define FSDP_ARCH(ID, name) [ARCH_##ID] = &name##_arch,
#include "models.def"
};
#define NARCH ((int)(sizeof table / sizeof table[0]))

const arch_desc *arch_get(model_arch a) { return (unsigned)a < (unsigned)NARCH ? table[a] : NULL; }

int arch_count(void) { return NARCH; }

const arch_desc *arch_by_name(const char *name) {
  for (int i = 0; name && i < NARCH; i++)
    if (!strcmp(table[i]->name, name)) return table[i];
  return NULL;
}

const arch_desc *arch_by_hf_type(const char *model_type) {
  for (int i = 0; model_type && i < NARCH; i++)
    if (!strcmp(table[i]->hf_model_type, model_type)) return table[i];
  return NULL;
}

const char *arch_names(char *buf, size_t n, const char *sep, int hf_types) {
  size_t used = 0;
  if (n) buf[0] = '\0';
  for (int i = 0; i < NARCH && used < n; i++) {
    int w = snprintf(buf + used, n - used, "%s%s", i ? sep : "", hf_types ? table[i]->hf_model_type : table[i]->name);
    if (w < 0) break;
    used += (size_t)w;
  }
  return buf;
}

static int listed(const char *const *keys, const char *key) {
  for (int j = 0; keys && keys[j]; j++)
    if (!strcmp(keys[j], key)) return 1;
  return 0;
}

int arch_key_applies(const arch_desc *d, const char *key) {
  if (listed(d->job_keys, key)) return 1;
  for (int i = 0; i < NARCH; i++)
    if (listed(table[i]->job_keys, key)) return 0;   /* another architecture's own key */
  return 1;                                          /* a key every architecture has */
}

const arch_desc *arch_key_owner(const arch_desc *d, const char *key) {
  for (int i = 0; i < NARCH; i++)
    if (table[i] != d && (listed(table[i]->job_keys, key) || arch_ext_index(table[i], key) >= 0)) return table[i];
  return NULL;
}

const char *arch_hf_key_of(const arch_desc *d, const char *key) {
  for (const arch_hf_key *k = d->hf_keys; k && k->ini; k++)
    if (!strcmp(k->ini, key)) return k->hf;
  return NULL;
}

/* ---- an architecture's own settings ---- */

int arch_ext_count(const arch_desc *d) {
  int n = 0;
  while (d && d->ext_keys && d->ext_keys[n].key) n++;
  return n;
}

int arch_ext_index(const arch_desc *d, const char *key) {
  for (int i = 0; i < arch_ext_count(d); i++)
    if (!strcmp(d->ext_keys[i].key, key)) return i;
  return -1;
}

int arch_ext_known(const char *key) {
  for (int i = 0; i < NARCH; i++)
    if (arch_ext_index(table[i], key) >= 0) return 1;
  return 0;
}

static int in_range(const arch_ext_key *k, double x) {
  return x >= k->lo && x <= k->hi && !(k->lo_open && x == k->lo);
}

int arch_ext_parse(const arch_ext_key *k, const char *text, double *v) {
  if (k->kind == ARCH_EXT_BOOL) {
    if (strcmp(text, "true") && strcmp(text, "false")) return 0;
    *v = !strcmp(text, "true");
    return 1;
  }
  char *end;
  errno = 0;
  double x = k->kind == ARCH_EXT_INT ? (double)strtoll(text, &end, 10) : strtod(text, &end);
  if (!*text || *end || errno || !isfinite(x) || !in_range(k, x)) return 0;
  *v = x;
  return 1;
}

/* X as the shortest %g that reads back as X (integers as integers). */
static void fmt_num(char *buf, size_t n, double x) {
  if (x == floor(x) && fabs(x) < 1e15) {
    snprintf(buf, n, "%.0f", x);
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) return;
  }
}

void arch_ext_allowed(const arch_ext_key *k, char *buf, size_t n) {
  char lo[32], hi[32];
  fmt_num(lo, sizeof lo, k->lo);
  fmt_num(hi, sizeof hi, k->hi);
  if (k->kind == ARCH_EXT_BOOL) snprintf(buf, n, "false | true");
  else if (k->kind == ARCH_EXT_INT) snprintf(buf, n, "an integer in %s..%s", lo, hi);
  else snprintf(buf, n, "a number %s %s and <= %s", k->lo_open ? ">" : ">=", lo, hi);
}

void arch_ext_format(const arch_ext_key *k, double v, char *buf, size_t n) {
  if (k->kind == ARCH_EXT_BOOL) snprintf(buf, n, "%s", v != 0 ? "true" : "false");
  else fmt_num(buf, n, v);
}

void arch_ext_defaults(model_config *m) {
  const arch_desc *d = arch_get(m->arch);
  for (int i = 0; i < MODEL_EXT_MAX; i++) m->ext[i] = 0;
  for (int i = 0; i < arch_ext_count(d); i++) {
    double v = 0;
    arch_ext_parse(&d->ext_keys[i], d->ext_keys[i].def, &v);   /* test_jobspec checks every default parses */
    m->ext[i] = v;
  }
}

void arch_model_json(json_t *jm, const model_config *m) {
  const arch_desc *d = arch_get(m->arch);
  if (!d) return;
  if (d->model_json) d->model_json(jm, m);
  for (int i = 0; i < arch_ext_count(d); i++) {
    const arch_ext_key *k = &d->ext_keys[i];
    double v = m->ext[i];
    json_object_set_new(jm, k->key, k->kind == ARCH_EXT_BOOL  ? json_boolean(v != 0)
                                    : k->kind == ARCH_EXT_INT ? json_integer((json_int_t)v)
                                                              : json_real(v));
  }
}

int arch_ext_read(const json_t *jm, model_config *m) {
  const arch_desc *d = arch_get(m->arch);
  arch_ext_defaults(m);
  for (int i = 0; i < arch_ext_count(d); i++) {
    const arch_ext_key *k = &d->ext_keys[i];
    const json_t *x = json_object_get(jm, k->key);
    if (!x) continue;   /* a checkpoint that predates the setting: its default */
    int ok = k->kind == ARCH_EXT_BOOL ? json_is_boolean(x) : k->kind == ARCH_EXT_INT ? json_is_integer(x) : json_is_number(x);
    double v = k->kind == ARCH_EXT_BOOL ? json_is_true(x) : json_number_value(x);
    if (!ok || !in_range(k, v)) return -1;
    m->ext[i] = v;
  }
  return 0;
}

int arch_same_model(const model_config *a, const model_config *b) {
  const arch_desc *d = arch_get(a->arch);
  if (!d || a->arch != b->arch || !d->same_model(a, b)) return 0;
  for (int i = 0; i < arch_ext_count(d); i++)
    if (a->ext[i] != b->ext[i]) return 0;
  return 1;
}

void arch_describe(const model_config *m, char *buf, size_t n) {
  const arch_desc *d = arch_get(m->arch);
  if (!n) return;
  buf[0] = '\0';
  if (!d) return;
  if (d->describe) d->describe(m, buf, n);
  for (int i = 0; i < arch_ext_count(d); i++) {
    size_t used = strlen(buf);
    char v[32];
    arch_ext_format(&d->ext_keys[i], m->ext[i], v, sizeof v);
    if (used + 1 < n) snprintf(buf + used, n - used, ", %s %s", d->ext_keys[i].key, v);
  }
}
