/* bpe_text — the tokenizer's text primitives, below every other bpe_*.c file: growable bytes
 * (bpe_str) and UTF-8 code points (read one, write one). bpe_str is owned by its holder, which
 * frees p; any thread, on its own strings.
 */
#ifndef FSDP_BPE_TEXT_H
#define FSDP_BPE_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Growable bytes, always NUL-terminated after N bytes once anything was put. */
typedef struct bpe_str {
  char *p;
  size_t n, cap;
} bpe_str;
/* Append N bytes of P (N = 0: only make sure of the NUL). */
fsdp_status bpe_str_put(bpe_str *s, const void *p, size_t n);

/* The code point at S (N ≥ 1 bytes, valid UTF-8) and its length. */
int32_t bpe_utf8_next(const char *s, size_t n, size_t *len);
/* CP's UTF-8 bytes into OUT (room for 4); their count. */
size_t bpe_utf8_put(int32_t cp, char *out);

#endif
