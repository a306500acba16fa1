/* ctl_conn — fsdpctl's connection to the fsdpd control endpoint: one request, one reply.
 *
 * The daemon binds a ROUTER on its ctl endpoint; ctl_conn connects a DEALER (ZMQ_IMMEDIATE, so
 * nothing is queued for a peer that is not there) and sends [empty delimiter][Msg]. Every call has
 * a deadline: the connection must come up within the connect timeout and the reply must arrive
 * within the call's timeout, so a missing or wedged daemon is reported in bounded time and fsdpctl
 * never hangs. After a timeout the socket is reopened, so that a late reply can never be taken for
 * the answer to the next request.
 *
 * A tcp:// endpoint uses CURVE: $FSDP_SERVER_KEY names the daemon's public key file and
 * $FSDP_CLIENT_KEY this user's keypair file (fsdpctl's global --server-key / --client-key set
 * them); without both, opening a tcp:// endpoint fails (FSDP_ERR_INVALID), never in plaintext.
 *
 * Endpoint resolution: --ctl, else $FSDP_CTL, else ipc://STATE/ctl.sock where STATE is
 * $XDG_STATE_HOME/fsdpd or /var/lib/fsdpd (fsdpd's own --state-dir default).
 *
 * A ctl_conn owns its ZMQ context and socket; use it from one thread only. Calls are
 * interrupted by signals (EINTR): ctl_conn_call() then returns FSDP_ERR_CANCELLED so that a
 * Ctrl-C handler that only sets a flag is noticed promptly.
 */
#ifndef FSDP_CTL_CONN_H
#define FSDP_CTL_CONN_H

#include <stddef.h>

#include "err.h"
#include "fsdp.pb-c.h"

#define CTL_CONNECT_TIMEOUT_MS 3000   /* how long a daemon may take to accept the connection */
#define CTL_CALL_TIMEOUT_MS 30000     /* how long one request may take (submit plans the job) */

typedef struct ctl_conn ctl_conn;

/* The default state directory: $XDG_STATE_HOME/fsdpd if XDG_STATE_HOME is set and non-empty,
 * else /var/lib/fsdpd. */
fsdp_status ctl_default_state_dir(char *buf, size_t n);
/* FLAG (may be NULL), else $FSDP_CTL, else ipc://<default state dir>/ctl.sock. */
fsdp_status ctl_endpoint_resolve(const char *flag, char *buf, size_t n);

/* Connect to ENDPOINT. The connection itself is checked by the first call; an ipc:// endpoint
 * whose socket file does not exist fails here with FSDP_ERR_COMM. */
fsdp_status ctl_conn_open(const char *endpoint, ctl_conn **out);
void ctl_conn_destroy(ctl_conn **c);

/* Also watch FD (-1: none) during every wait: when it becomes readable (a pidfd: the daemon
 * process exited), the call fails at once with FSDP_ERR_COMM instead of waiting out its timeout. */
void ctl_conn_watch_fd(ctl_conn *c, int fd);

/* Send REQ and wait up to TIMEOUT_MS (≤ 0: CTL_CALL_TIMEOUT_MS) for the reply; *REPLY is owned by
 * the caller (wire_destroy). Errors: FSDP_ERR_COMM when the daemon cannot be reached (not listening,
 * connection not up within CTL_CONNECT_TIMEOUT_MS), FSDP_ERR_TIMEOUT when it accepted the request
 * but did not answer in time, FSDP_ERR_CANCELLED when a signal interrupted the wait. An `error`
 * reply is returned as a reply (the caller decides what it means), not as a failure. */
fsdp_status ctl_conn_call(ctl_conn *c, Fsdp__Msg *req, int timeout_ms, Fsdp__Msg **reply);

/* The standard one-line text for a failed open or call on ENDPOINT, without the "fsdpctl: " prefix:
 * "cannot reach fsdpd at ipc://...: is it running? (start it with `fsdpd` or use `fsdpctl run`)". */
void ctl_describe_failure(const char *endpoint, fsdp_status rc, char *buf, size_t n);

#endif
