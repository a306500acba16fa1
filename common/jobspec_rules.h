/* jobspec_rules — the rules between a job file's keys, checked once every line is read (jobspec.c's
 * parser reads the lines): [model] from = DIR's config.json against the keys the file sets, an
 * architecture's keys and own settings (models/arch.h) under that architecture only, the rope
 * scaling's numbers, seq_len against the positions, the [lora], [fsdp], [checkpoint] and [eval]
 * rules. Private to common/jobspec*.c. The context is the parser's, one per parse, one thread.
 */
#ifndef FSDP_JOBSPEC_RULES_H
#define FSDP_JOBSPEC_RULES_H

#include "jobspec.h"
#include "jobspec_keys.h"

#define JOBSPEC_MAX_EXT 16   /* architectures' own [model] settings one file may set */

/* What the parser saw: the job so far, where each key was set, the first error. */
typedef struct jobspec_ctx {
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
  /* [model] keys that are some architecture's own settings, as written: the rules read them once
   * the architecture is known */
  struct {
    char key[64];
    char value[JOBSPEC_TEXT_MAX];
    int line;
  } ext[JOBSPEC_MAX_EXT];
  int next;
} jobspec_ctx;

/* Record the first error of C at LINE (jobspec_error's "ORIGIN:LINE: message"); later ones are dropped. */
#define PERR(c, line, st, ...)                                                 \
  do {                                                                         \
    if (!(c)->err) {                                                           \
      jobspec_error((st), (c)->origin, (line), __VA_ARGS__);                   \
      (c)->err = (st);                                                         \
      (c)->err_line = (line);                                                  \
    }                                                                          \
  } while (0)

/* Every rule between C's keys; the first broken one becomes C's error. Fills what the rules derive
 * (from = DIR's model and weights, n_kv_head = 0 as n_head, an architecture's own settings). */
void jobspec_rules_check(jobspec_ctx *c);

#endif
