/* bpe_text — see bpe_text.h. */
#include "bpe_text.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

fsdp_status bpe_str_put(bpe_str *s, const void *p, size_t n) {
  if (s->n + n + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 256;
    while (cap < s->n + n + 1) cap *= 2;
    char *q = realloc(s->p, cap);
    if (!q) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory (%zu bytes of text)", cap);
    s->p = q;
    s->cap = cap;
  }
  if (n) memcpy(s->p + s->n, p, n);
  s->n += n;
  s->p[s->n] = 0;
  return FSDP_OK;
}

int32_t bpe_utf8_next(const char *s, size_t n, size_t *len) {
  const unsigned char *u = (const unsigned char *)s;
  if (u[0] < 0x80 || n < 2) return *len = 1, u[0];
  if (u[0] < 0xe0) return *len = 2, (u[0] & 0x1f) << 6 | (u[1] & 0x3f);
  if (u[0] < 0xf0 || n < 4) return *len = 3, (u[0] & 0x0f) << 12 | (u[1] & 0x3f) << 6 | (u[2] & 0x3f);
  return *len = 4, (u[0] & 0x07) << 18 | (u[1] & 0x3f) << 12 | (u[2] & 0x3f) << 6 | (u[3] & 0x3f);
}

size_t bpe_utf8_put(int32_t cp, char *out) {
  return (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out);
}
