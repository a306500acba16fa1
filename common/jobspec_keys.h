/* jobspec_keys — the job file's key table (every key's type, range, default, applicability and help)
 * and enum names, shared by the parser (jobspec.c), its rules (jobspec_rules.c), the resolved form
 * and the defaults writer (`fsdpctl plan --defaults`; jobspec_canon.c). Private to common/jobspec*.c:
 * everyone else reads jobspec.h. The table is static data; no state.
 */
#ifndef FSDP_JOBSPEC_KEYS_H
#define FSDP_JOBSPEC_KEYS_H

#include <stddef.h>
#include <stdio.h>

#include "jobspec.h"

typedef enum { KT_INT, KT_U64, KT_DBL, KT_ENUM, KT_FACTORS, KT_NAME, KT_INIT, KT_TRAIN, KT_VAL, KT_DIR, KT_TEXT, KT_FROM } key_type;

/* Which jobs read a key beyond its architecture (keydef.applies; 0: every job that reads it): KA_ROPE3
 * for the numbers of rope_scaling = llama3, KA_LONGROPE for those of rope_scaling = longrope (required
 * by it, refused without it), KA_LINEAR for rope_scaling = linear's factor. A key set in a file that does not apply to the job is an error; one that
 * does not apply keeps its default (0 where none). KT_FACTORS: a rope_factor_list, numbers in lo..hi
 * separated by commas. */
enum { KA_ROPE3 = 1u << 0, KA_LONGROPE = 1u << 1, KA_LINEAR = 1u << 2 };
#define KA_ROPE (KA_ROPE3 | KA_LONGROPE | KA_LINEAR)
/* The KA_ROPE bit of rope_scaling kind K (0 for none). */
unsigned jobspec_rope_bit(rope_scaling_kind k);

/* One key: where it lives, its type and range (lo/hi inclusive unless lo_open/hi_open), its
 * default, which jobs read it, and its help. The defaults are text as a file would write it, applied
 * by the parser's own code (jobspec_defaults), so a default is range-checked like any value. */
typedef struct keydef {
  const char *sec, *key;
  key_type type;
  size_t off;
  double lo, hi;
  int lo_open, hi_open;
  const char *const *names;   /* KT_ENUM */
  const char *help;           /* why the default is what it is; printed by --defaults */
  const char *def;            /* the default; NULL: none (required, or not set: 0 or "") */
  unsigned applies;           /* KA_* bits; 0: every job */
} keydef;

#define JOBSPEC_MAX_KEYS 128    /* the table's length is checked against it at compile time */
#define JOBSPEC_NSECTIONS 8
#define JOBSPEC_SECTIONS_ALLOWED "[job] [model] [data] [optim] [fsdp] [checkpoint] [eval] [lora]"

extern const keydef jobspec_keys[];      /* in file order: section by section */
extern const int jobspec_nkeys;
extern const char *const jobspec_sections[];   /* JOBSPEC_NSECTIONS names, NULL-terminated */

/* What a key allows, for messages: "an integer in 1..4096", "full | grad_op | none | hybrid", or
 * the help text of a special key. */
void jobspec_key_allowed(const keydef *k, char *buf, size_t n);
/* V as written back: integers as integers, else the shortest %g that reads back as V. */
void jobspec_fmt_num(char *buf, size_t n, double v);
/* Whether a job of architecture A reads K: every key outside [model], and the [model] keys its
 * descriptor lists (models/arch.h); the KA_ROPE3 keys only under rope_scaling = llama3 besides. */
int jobspec_key_applies(const keydef *k, model_arch a);
/* The index of [SEC] KEY in jobspec_keys / of section NAME in jobspec_sections, or -1. */
int jobspec_key_index(const char *sec, const char *key);
int jobspec_section_index(const char *name);
/* A job file's error, located for its reader: "ORIGIN:LINE: message" (LINE 0: "ORIGIN: message"),
 * ORIGIN as the caller named the file. */
fsdp_status jobspec_error(fsdp_status st, const char *origin, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A KT_FACTORS value: written "1.05, 1.1" (-1 on a write error); read from V (0 when V is not such a list). */
int jobspec_fmt_factors(FILE *f, const rope_factor_list *l);
int jobspec_parse_factors(const char *v, rope_factor_list *out);

#endif
