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

#endif
