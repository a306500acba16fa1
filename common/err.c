/* err — status strings and the per-thread last-error message. */
#include "err.h"

#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_msg[1024];
static _Thread_local char last_where[96];
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
  /* Formatted apart first: an argument may be fsdp_last_error(), i.e. last_msg itself. */
  char msg[sizeof last_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(last_msg, msg, sizeof msg);
  const char *base = strrchr(file, '/');
  snprintf(last_where, sizeof last_where, "%s:%d", base ? base + 1 : file, line);
  last_status = s;
  log_emit(LOG_DEBUG, file, line, "error recorded (%s): %s", fsdp_strerror(s), msg);
  return s;
}

const char *fsdp_last_error(void) {
  if (last_msg[0]) return last_msg;
  return fsdp_strerror(last_status);
}

const char *fsdp_last_error_where(void) { return last_where; }

void fsdp_clear_error(void) {
  last_msg[0] = '\0';
  last_where[0] = '\0';
  last_status = FSDP_OK;
}
