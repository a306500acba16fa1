/* jobspec_keys — the job file's key table and enum names, shared by the parser (jobspec.c) and
 * the defaults writer (`fsdpctl plan --defaults`, jobspec_keys.c). Private to common/jobspec*.c:
 * everyone else reads jobspec.h. The table is static data; no state.
 */
#ifndef FSDP_JOBSPEC_KEYS_H
#define FSDP_JOBSPEC_KEYS_H

#include <stddef.h>

#include "jobspec.h"

typedef enum { KT_INT, KT_U64, KT_DBL, KT_ENUM, KT_NAME, KT_INIT, KT_TRAIN, KT_VAL, KT_DIR, KT_TEXT, KT_FROM } key_type;

/* Numeric bounds: lo/hi inclusive unless lo_open/hi_open. */
typedef struct keydef {
  const char *sec, *key;
  key_type type;
  size_t off;
  double lo, hi;
  int lo_open, hi_open;
  const char *const *names;   /* KT_ENUM */
  const char *help;           /* why the default is what it is; printed by --defaults */
} keydef;

#define JOBSPEC_MAX_KEYS 64     /* the table's length is checked against it at compile time */
#define JOBSPEC_NSECTIONS 7
#define JOBSPEC_SECTIONS_ALLOWED "[job] [model] [data] [optim] [fsdp] [checkpoint] [eval]"

extern const keydef jobspec_keys[];      /* in file order: section by section */
extern const int jobspec_nkeys;
extern const char *const jobspec_sections[];   /* JOBSPEC_NSECTIONS names, NULL-terminated */

/* What a key allows, for messages: "an integer in 1..4096", "full | grad_op | none | hybrid", or
 * the help text of a special key. */
void jobspec_key_allowed(const keydef *k, char *buf, size_t n);
/* V as written back: integers as integers, else the shortest %g that reads back as V. */
void jobspec_fmt_num(char *buf, size_t n, double v);
/* The four numbers of rope_scaling = llama3 (rope_factor, ...): required by it, refused without it. */
int jobspec_key_rope_scaling(const keydef *k);

#endif
