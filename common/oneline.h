/* oneline — text from elsewhere (a path a job names, a worker's reason, a peer's message) made safe
 * to write as one line of a log or a terminal: every control character is escaped, so the text can
 * neither start a line of its own (a forged log entry) nor drive a terminal (escape sequences).
 *
 * Escapes: \n \r \t as such; every other byte below 0x20 and 0x7f as \xHH; the C1 controls as
 * UTF-8 (0xc2 0x80..0x9f) as \u0080..\u009f. Everything else, other UTF-8 included, is kept. A
 * backslash is kept as it is: the escapes are for readers, and no reader parses them back.
 *
 * Plain functions, no state; any thread.
 */
#ifndef FSDP_ONELINE_H
#define FSDP_ONELINE_H

#include <stddef.h>

/* SRC (N bytes; a NUL among them is escaped as \x00) escaped into DST (CAP bytes, CAP >= 1,
 * always NUL-terminated); an escape that does not fit whole is left out with everything after it.
 * Returns the length written. */
size_t oneline_escape(char *dst, size_t cap, const char *src, size_t n);
/* The same for a NUL-terminated SRC. */
size_t oneline_escape_str(char *dst, size_t cap, const char *src);
/* 1 when S (NUL-terminated) holds nothing oneline_escape would change. */
int oneline_clean(const char *s);

#endif
