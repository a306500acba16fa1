/* oneline — see oneline.h. */
#include "oneline.h"

#include <stdio.h>
#include <string.h>

/* Bytes [*I..) of SRC: the escape of the character there in ESC (NUL-terminated; "" when it is
 * kept as it is), and how many source bytes it covers. */
static size_t escape_at(const unsigned char *s, size_t n, size_t i, char esc[8]) {
  unsigned char c = s[i];
  esc[0] = '\0';
  if (c == '\n') memcpy(esc, "\\n", 3);
  else if (c == '\r') memcpy(esc, "\\r", 3);
  else if (c == '\t') memcpy(esc, "\\t", 3);
  else if (c < 0x20 || c == 0x7f) snprintf(esc, 8, "\\x%02x", c);
  else if (c == 0xc2 && i + 1 < n && s[i + 1] >= 0x80 && s[i + 1] <= 0x9f) {
    snprintf(esc, 8, "\\u%04x", s[i + 1]);
    return 2;
  }
  return 1;
}

size_t oneline_escape(char *dst, size_t cap, const char *src, size_t n) {
  const unsigned char *s = (const unsigned char *)src;
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    char esc[8];
    size_t used = escape_at(s, n, i, esc);
    size_t el = esc[0] ? strlen(esc) : used;
    if (o + el + 1 > cap) break;
    memcpy(dst + o, esc[0] ? esc : (const char *)s + i, el);
    o += el;
    i += used;
  }
  dst[o] = '\0';
  return o;
}

size_t oneline_escape_str(char *dst, size_t cap, const char *src) {
  return oneline_escape(dst, cap, src, strlen(src));
}

int oneline_clean(const char *s) {
  size_t n = strlen(s);
  for (size_t i = 0; i < n; i++) {
    char esc[8];
    escape_at((const unsigned char *)s, n, i, esc);
    if (esc[0]) return 0;
  }
  return 1;
}
