/* ctl_chat — `fsdpctl gen-data --chat`: conversations (JSONL) rendered with a model's chat template
 * (common/jinja), encoded with its tokenizer (common/bpe), and written with their loss mask and
 * document starts as a masked token file (common/tokmask.h). This module holds the command line,
 * the template and the output; ctl_chatrun.h reads the files and runs the lines on worker threads,
 * ctl_chatconv.h turns one line into tokens and mask.
 */
#ifndef FSDP_CTL_CHAT_H
#define FSDP_CTL_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "ctl_chatconv.h"
#include "ctl_chatrun.h"

typedef struct chat_args {
  chat_input in;            /* the files, and what the run does with their lines */
  const char *model, *tokenizer, *template_path, *out, *val;
  double frac;
  int eos, json;
  chat_train_on train_on;
} chat_args;

/* The template text (malloc'd): A->template_path, or the folder A->model's (else A->tokenizer's)
 * tokenizer_config.json chat_template (a string, or a list of {name, template} whose "default" is
 * taken) or chat_template.jinja; its bos/eos/unk/pad tokens into SPECIAL, what messages call the
 * template into NAME. NULL after a line on stderr that starts "fsdpctl CMD: ". */
char *chat_template_text(const chat_args *a, const char *cmd, json_t *special, char *name, size_t namelen);

/* Runs gen-data --chat with gen-data's ARGC/ARGV; returns the exit status. */
int ctl_chat(int argc, char **argv);

#endif
