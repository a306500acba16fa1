/* arch — the table of architectures, from models/models.def; see arch.h. */
#include "arch.h"

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
    if (table[i] != d && listed(table[i]->job_keys, key)) return table[i];
  return NULL;
}

const char *arch_hf_key_of(const arch_desc *d, const char *key) {
  for (const arch_hf_key *k = d->hf_keys; k && k->ini; k++)
    if (!strcmp(k->ini, key)) return k->hf;
  return NULL;
}
