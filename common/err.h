/* err — the one status enum of fsdpd, its messages, and the TRY macros.
 *
 * Library code returns fsdp_status to its caller and never exits; only main()s, tools and tests
 * do. A function that fails with a message worth keeping records it with fsdp_set_error(), which
 * stores "file:line: message" in a thread-local buffer that the caller reads with fsdp_last_error().
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

/* Record "file:line: printf-message" as this thread's last error and return `s`. */
fsdp_status fsdp_set_error_at(fsdp_status s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define fsdp_set_error(s, ...) fsdp_set_error_at((s), __FILE__, __LINE__, __VA_ARGS__)
/* This thread's last recorded message, or the status' generic text if none was recorded. */
const char *fsdp_last_error(void);
void fsdp_clear_error(void);
/* MSG without the leading "source.c:123: " locations that fsdp_set_error adds (nested ones too:
 * "runtime.c:507: ckpt.c:584: no manifest" -> "no manifest"); a location the user can act on,
 * such as a job file's "job.ini:7: ", is kept. Returns a pointer into MSG. Logs keep the
 * locations; messages for users (replies, job reasons, fsdpctl's stderr) go through this. */
const char *fsdp_user_message(const char *msg);
/* MSG into DST (N bytes, truncated, NUL-terminated) without any source location, wherever one
 * starts a word: "rank 1: cannot resume: ckpt.c:584: bad CRC" -> "rank 1: cannot resume: bad CRC"
 * (messages that come from workers wrap each other's). Returns DST. */
char *fsdp_user_text(char *dst, size_t n, const char *msg);

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
