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
  [FSDP_ERR_DENIED] = "not permitted",
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

/* Whether [S, E) is the name of a source file of ours or a library's: .c, .cc, .cu, .h. */
static int is_source_name(const char *s, const char *e) {
  const char *dot = e;
  while (dot > s && dot[-1] != '.') dot--;
  if (dot <= s + 1) return 0;
  for (const char *q = s; q < dot - 1; q++)
    if (!isalnum((unsigned char)*q) && *q != '_' && *q != '-') return 0;
  size_t elen = (size_t)(e - dot);
  return (elen == 1 && !strncmp(dot, "c", 1)) || (elen == 2 && !strncmp(dot, "cc", 2)) ||
         (elen == 2 && !strncmp(dot, "cu", 2)) || (elen == 1 && !strncmp(dot, "h", 1));
}

/* One "name.ext:LINE: " prefix at the start of P (a source file: .c, .cc, .cu, .h), or NULL. */
static const char *skip_source_location(const char *p) {
  const char *colon = strchr(p, ':');
  if (!colon || colon - p > 64 || !is_source_name(p, colon) || !isdigit((unsigned char)colon[1])) return NULL;
  const char *s = colon + 1;
  while (isdigit((unsigned char)*s)) s++;
  if (s[0] != ':' || s[1] != ' ') return NULL;
  return s + 2;
}

const char *fsdp_user_message(const char *msg) {
  const char *p = msg, *q;
  while ((q = skip_source_location(p)) != NULL) p = q;
  return p;
}

/* A bracketed location as libraries write them, "[./gloo/transport/tcp/pair.cc:81] ", at P, or NULL. */
static const char *skip_bracketed_location(const char *p) {
  if (*p != '[') return NULL;
  const char *end = strchr(p, ']');
  if (!end || end - p > 200) return NULL;
  const char *colon = end;
  while (colon > p && isdigit((unsigned char)colon[-1])) colon--;
  if (colon == end || colon[-1] != ':') return NULL;
  const char *name = colon - 1;
  while (name > p && name[-1] != '/' && name[-1] != '[') name--;
  if (!is_source_name(name, colon - 1)) return NULL;
  return end[1] == ' ' ? end + 2 : end + 1;
}

char *fsdp_user_text(char *dst, size_t n, const char *msg) {
  size_t k = 0;
  const char *p = msg;
  int at_word = 1;
  while (*p && n) {
    const char *q = at_word ? skip_source_location(p) : NULL;
    if (!q && at_word) q = skip_bracketed_location(p);
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
