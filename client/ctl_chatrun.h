/* ctl_chatrun — gen-data --chat's lines on every core: the files read and their lines listed on the
 * caller's thread, each line through chat_line (ctl_chatconv.h) on worker threads, the results
 * appended to one token buffer in file and line order, so the output does not depend on the number
 * of threads. The out_buf is the caller's (it frees ids, mask, starts and doc_at).
 */
#ifndef FSDP_CTL_CHATRUN_H
#define FSDP_CTL_CHATRUN_H

#include <stddef.h>
#include <stdint.h>

#include "ctl_chatconv.h"

/* The files and what the run does with their lines. */
typedef struct chat_input {
  char **files;
  int nfiles;
  int64_t seq_len;          /* 0: no limit */
  int drop_overlong;        /* --overlong drop (default truncate) */
  int strict;               /* --strict: a malformed line is fatal */
  int threads;              /* --threads, 0: every online core */
} chat_input;

typedef struct out_buf {
  uint32_t *ids;
  uint8_t *mask, *starts;
  size_t n, cap;
  size_t *doc_at;   /* each conversation's first token, for the --val split */
  size_t ndocs, capdocs;
} out_buf;

typedef struct counts {
  size_t lines, convs, malformed, truncated, dropped;
} counts;

/* Every line of IN's files through chat_line on IN->threads threads (each with its own bpe_state
 * cloned from PROTO's tokenizer), then appended to O in file and line order; malformed lines are
 * named on stderr and counted in K (fatal with --strict). 0, or -1 after a one-line message. */
int chat_run(const chat_input *in, const chat_ctx *proto, out_buf *o, counts *k, int64_t eos);

/* PATH's bytes, NUL-terminated (*N without the NUL), or NULL with errno. */
char *chat_slurp(const char *path, size_t *n);

#endif
