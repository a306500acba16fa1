/* ctl_tokdata — `fsdpctl gen-data --tokenizer`: text files to llm.c token files with a
 * tokenizer.json (common/bpe), on every core, the output the same for any thread count.
 *
 * Documents: each --text FILE is one document; a FILE ending in .jsonl holds one per line (the
 * "text" field of each JSON object); --doc-sep STR cuts plain files into documents at every STR
 * (removed). With --eos each document is preceded by the tokenizer's end-of-text token, as llm.c's
 * data scripts do. Documents are encoded independently, in chunks of about a megabyte that the
 * threads take in turn; the chunks' tokens are joined in document order, so the file does not
 * depend on the threads. Owned by ctl_data.c's gen-data, which parses the command line.
 */
#ifndef FSDP_CTL_TOKDATA_H
#define FSDP_CTL_TOKDATA_H

#include <stdint.h>

#include "err.h"

typedef struct tokdata_args {
  const char *tokenizer;   /* tokenizer.json or a folder holding one */
  char **files;            /* --text FILE... in order */
  int nfiles;
  const char *out, *val;   /* -o, --val (or NULL) */
  double frac;             /* --val-fraction */
  const char *doc_sep;     /* --doc-sep, C escapes decoded, or NULL */
  int eos;                 /* --eos */
  int threads;             /* --threads, 0: every online core */
  int json;
} tokdata_args;

/* Runs gen-data --tokenizer; returns the exit status, a one-line reason on stderr on failure. */
int ctl_tokdata(const tokdata_args *a);

/* gen-data's output, every mode's: NTRAIN tokens of TRAIN as the file OUT and, when VAL is not NULL, NVAL
 * tokens of VTOK as VAL; each written at its directory's descriptor, opened once (no name along the path
 * is looked up again), and all or nothing: on failure neither file is left. */
fsdp_status tokdata_write(const char *out, const uint32_t *train, int64_t ntrain, const char *val, const uint32_t *vtok,
                          int64_t nval, int vocab);

#endif
