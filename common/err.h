/* err — the one status enum of fsdpd, its messages, and the TRY macros.
 *
 * Library code returns fsdp_status to its caller and never exits; only main()s, tools and tests
 * do. A function that fails with a message worth keeping records it with fsdp_set_error(), which
 * stores the message in a thread-local buffer that the caller reads with fsdp_last_error(). The
 * message is for people: it never carries a source location. The location of the latest
 * fsdp_set_error() is kept apart (fsdp_last_error_where()) and written to the log at debug level
 * as each error is recorded, so `--log-level debug` traces where a failure came from.
 * A message may wrap the previous one: fsdp_set_error(rc, "cannot resume: %s", fsdp_last_error()).
 * Any thread may call these; the buffer is per thread.
 */
#ifndef FSDP_ERR_H
#define FSDP_ERR_H

#include <stddef.h>

typedef enum fsdp_status {
  FSDP_OK = 0,
  FSDP_ERR_INVALID,      /* bad argument or input: a spec, a file, a message */
  FSDP_ERR_NOMEM,        /* an allocation failed */
  FSDP_ERR_IO,           /* a read, write, open or rename failed */
  FSDP_ERR_FORMAT,       /* a file or message is malformed (magic, version, size, CRC) */
  FSDP_ERR_NOTFOUND,     /* a file, tensor, job or key does not exist */
  FSDP_ERR_RANGE,        /* a value is outside what is allowed */
  FSDP_ERR_TIMEOUT,      /* a deadline passed: a peer did not answer or a collective stalled */
  FSDP_ERR_COMM,         /* a collective or socket failed */
  FSDP_ERR_CUDA,         /* the CUDA runtime, cuBLAS or NCCL reported an error */
  FSDP_ERR_UNSUPPORTED,  /* asked for something this build or machine cannot do */
  FSDP_ERR_STATE,        /* the call is not valid in the current state */
  FSDP_ERR_CANCELLED,    /* stopped on request */
  FSDP_ERR_INTERNAL,     /* an invariant broke: a bug */
  FSDP_ERR_DENIED,       /* the caller may not do this (another user's job, a file it cannot read) */
  FSDP_STATUS_COUNT
} fsdp_status;

const char *fsdp_strerror(fsdp_status s);

/* Record the printf-message as this thread's last error (FMT's arguments may include
 * fsdp_last_error() itself), FILE:LINE as its location, and return `s`. */
fsdp_status fsdp_set_error_at(fsdp_status s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define fsdp_set_error(s, ...) fsdp_set_error_at((s), __FILE__, __LINE__, __VA_ARGS__)
/* This thread's last recorded message, or the status' generic text if none was recorded. */
const char *fsdp_last_error(void);
void fsdp_clear_error(void);
/* "file.c:123" of this thread's last fsdp_set_error(), or "" if none: for logs, never for users. */
const char *fsdp_last_error_where(void);

/* TRY(x): return x's status if it failed. TRY_GOTO(x, rc, label): keep it in rc and jump. */
#define TRY(x)                                  \
  do {                                          \
    fsdp_status try_rc_ = (x);                  \
    if (try_rc_ != FSDP_OK) return try_rc_;     \
  } while (0)
#define TRY_GOTO(x, rc, label)                  \
  do {                                          \
    (rc) = (x);                                 \
    if ((rc) != FSDP_OK) goto label;            \
  } while (0)

#endif
