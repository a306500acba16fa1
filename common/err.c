/* err — status strings and the per-thread last-error message. */
#include "err.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_msg[1024];
static _Thread_local fsdp_status last_status;

static const char *const status_text[FSDP_STATUS_COUNT] = {
  [FSDP_OK] = "success",
  [FSDP_ERR_INVALID] = "invalid argument or input",
  [FSDP_ERR_NOMEM] = "out of memory",
  [FSDP_ERR_IO] = "I/O error",
  [FSDP_ERR_FORMAT] = "malformed data",
  [FSDP_ERR_NOTFOUND] = "not found",
  [FSDP_ERR_RANGE] = "value out of range",
  [FSDP_ERR_TIMEOUT] = "timed out",
  [FSDP_ERR_COMM] = "communication error",
  [FSDP_ERR_CUDA] = "CUDA error",
  [FSDP_ERR_UNSUPPORTED] = "not supported by this build or machine",
  [FSDP_ERR_STATE] = "invalid state for this operation",
  [FSDP_ERR_CANCELLED] = "cancelled",
  [FSDP_ERR_INTERNAL] = "internal error",
};

const char *fsdp_strerror(fsdp_status s) {
  if ((unsigned)s >= FSDP_STATUS_COUNT) return "unknown status";
  return status_text[s];
}

fsdp_status fsdp_set_error_at(fsdp_status s, const char *file, int line, const char *fmt, ...) {
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  int n = snprintf(last_msg, sizeof last_msg, "%s:%d: ", base, line);
  if (n < 0 || (size_t)n >= sizeof last_msg) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg + n, sizeof last_msg - (size_t)n, fmt, ap);
  va_end(ap);
  last_status = s;
  return s;
}

const char *fsdp_last_error(void) {
  if (last_msg[0]) return last_msg;
  return fsdp_strerror(last_status);
}

void fsdp_clear_error(void) {
  last_msg[0] = '\0';
  last_status = FSDP_OK;
}

/* One "name.ext:LINE: " prefix at the start of P (a source file of ours: .c, .cc, .cu, .h), or NULL. */
static const char *skip_source_location(const char *p) {
  const char *s = p;
  while (*s && (isalnum((unsigned char)*s) || *s == '_' || *s == '-')) s++;
  if (s == p || *s != '.') return NULL;
  const char *ext = s++;
  while (*s && isalnum((unsigned char)*s)) s++;
  size_t elen = (size_t)(s - ext);
  int source = (elen == 2 && !strncmp(ext, ".c", 2)) || (elen == 3 && !strncmp(ext, ".cc", 3)) ||
               (elen == 3 && !strncmp(ext, ".cu", 3)) || (elen == 2 && !strncmp(ext, ".h", 2));
  if (!source || *s != ':' || !isdigit((unsigned char)s[1])) return NULL;
  s++;
  while (isdigit((unsigned char)*s)) s++;
  if (s[0] != ':' || s[1] != ' ') return NULL;
  return s + 2;
}

const char *fsdp_user_message(const char *msg) {
  const char *p = msg, *q;
  while ((q = skip_source_location(p)) != NULL) p = q;
  return p;
}

char *fsdp_user_text(char *dst, size_t n, const char *msg) {
  size_t k = 0;
  const char *p = msg;
  int at_word = 1;
  while (*p && n) {
    const char *q = at_word ? skip_source_location(p) : NULL;
    if (q) {
      p = q;
      continue;
    }
    if (k + 1 < n) dst[k++] = *p;
    at_word = *p == ' ';
    p++;
  }
  if (n) dst[k < n ? k : n - 1] = '\0';
  return dst;
}
