/* ctl_chat — `fsdpctl gen-data --chat`: conversations (JSONL) rendered with a model's chat template
 * (common/jinja), encoded with its tokenizer (common/bpe), and written with their loss mask and
 * document starts as a masked token file (common/tokmask.h). ctl_chat.c holds the command line,
 * the template and the output; ctl_chatrun.c reads the files and runs the lines on worker threads;
 * ctl_chatconv.c turns one line into tokens and mask (any thread, each with its own chat_ctx
 * bpe_state; the template, tokenizer and special tokens are shared read-only).
 */
#ifndef FSDP_CTL_CHAT_H
#define FSDP_CTL_CHAT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bpe.h"
#include "jinja.h"

typedef enum { CHAT_TRAIN_ASSISTANT, CHAT_TRAIN_LAST, CHAT_TRAIN_ALL } chat_train_on;

/* What every conversation is rendered and encoded with. */
typedef struct chat_ctx {
  const jinja_tmpl *tmpl;
  int has_generation;        /* the template marks {% generation %} blocks: its spans are the mask */
  json_t *special;           /* bos_token, eos_token, ... from tokenizer_config.json (an object) */
  const bpe_tokenizer *tok;
  bpe_state *st;
  chat_train_on train_on;
} chat_ctx;

/* One document's tokens and mask (one byte per token, 1: trained). */
typedef struct chat_doc {
  bpe_ids ids;
  uint8_t *mask;
  size_t cap_mask;
} chat_doc;

/* Line LINE (LEN bytes) of a JSONL file into DOC (emptied first): {"messages": [...]},
 * {"prompt", "completion"} or {"text"}. Returns 0, or -1 with what is wrong in WHY (one line,
 * without the file:line, which the caller adds). */
int chat_line(chat_ctx *c, const char *line, size_t len, chat_doc *doc, char *why, size_t whylen);

typedef struct chat_args {
  char **files;
  int nfiles;
  const char *model, *tokenizer, *template_path, *out, *val;
  double frac;
  int64_t seq_len;          /* 0: no limit */
  int drop_overlong;        /* --overlong drop (default truncate) */
  int strict;               /* --strict: a malformed line is fatal */
  int eos, json;
  int threads;              /* --threads, 0: every online core */
  chat_train_on train_on;
} chat_args;

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

/* Append N tokens of DOC (with the end-of-text token EOS first when EOS >= 0) as one document. */
int chat_append(out_buf *o, const chat_doc *d, size_t n, int64_t eos);
/* Every line of A's files through chat_line on A->threads threads (each with its own bpe_state
 * cloned from PROTO's tokenizer), then appended to O in file and line order; malformed lines are
 * named on stderr and counted in K (fatal with --strict). 0, or -1 after a one-line message. */
int chat_run(const chat_args *a, const chat_ctx *proto, out_buf *o, counts *k, int64_t eos);

/* The template text (malloc'd): A->template_path, or the folder A->model's (else A->tokenizer's)
 * tokenizer_config.json chat_template (a string, or a list of {name, template} whose "default" is
 * taken) or chat_template.jinja; its bos/eos/unk/pad tokens into SPECIAL, what messages call the
 * template into NAME. NULL after a line on stderr that starts "fsdpctl CMD: ". */
char *chat_template_text(const chat_args *a, const char *cmd, json_t *special, char *name, size_t namelen);

/* PATH's bytes, NUL-terminated (*N without the NUL), or NULL with errno. */
char *chat_slurp(const char *path, size_t *n);

/* Runs gen-data --chat with gen-data's ARGC/ARGV; returns the exit status. */
int ctl_chat(int argc, char **argv);

#endif
