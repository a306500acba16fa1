/* ctl_samplechat — the prompt of `fsdpctl sample MODEL --chat QUESTION [--system TEXT]`: rendered
 * with the chat template (add_generation_prompt), encoded with the tokenizer, and the ids that end
 * the assistant's turn (see ctl_samplechat.c for how they are found). fsdpctl's thread only. */
#ifndef FSDP_CTL_SAMPLECHAT_H
#define FSDP_CTL_SAMPLECHAT_H

#include <stddef.h>

typedef struct sample_chat_args {
  const char *model;           /* MODEL as given to sample */
  const char *tokenizer;       /* --tokenizer FILE|DIR, or NULL: the model folder's */
  const char *template_path;   /* --template FILE.jinja, or NULL: the model folder's */
  const char *question;        /* --chat */
  const char *system;          /* --system, or NULL */
} sample_chat_args;

typedef struct sample_chat_prompt_t {
  char *text;          /* the rendered conversation */
  size_t text_n;
  char *prompt_ids;    /* its ids, "1 2 3" (what the worker's --prompt-ids takes) */
  char *stop_ids;      /* the end-of-turn ids, the same way; "" when none was found */
  size_t nstop;
} sample_chat_prompt_t;

/* 0, or 2 (bad input) / 1 after one line on stderr. OUT is the caller's to free, in every case. */
int sample_chat_prompt(const sample_chat_args *a, sample_chat_prompt_t *out);
void sample_chat_prompt_free(sample_chat_prompt_t *p);

#endif
