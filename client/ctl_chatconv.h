/* ctl_chatconv — one JSONL line of `fsdpctl gen-data --chat` to tokens and a loss mask: the
 * conversation rendered with the model's chat template (common/jinja) and encoded with its tokenizer
 * (common/bpe). Any thread, each with its own chat_ctx bpe_state; the template, tokenizer and
 * special tokens are shared read-only.
 */
#ifndef FSDP_CTL_CHATCONV_H
#define FSDP_CTL_CHATCONV_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

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

#endif
