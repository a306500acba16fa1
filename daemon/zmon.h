/* zmon — a ZeroMQ socket's monitor events on the libuv loop: zmq_socket_monitor publishes them on
 * an inproc PAIR, which is read through loop_zsock like every other socket (edge-triggered
 * ZMQ_FD, drained while readable). fsdpd watches CURVE handshakes with it: the agent its DEALER
 * to the coordinator, the coordinator its tcp:// ROUTERs (docs/daemon.md, "CURVE").
 *
 * The creator owns the zmon and destroys it before closing the watched socket, which it keeps
 * owning. Loop thread only.
 */
#ifndef FSDP_DAEMON_ZMON_H
#define FSDP_DAEMON_ZMON_H

#include <stdint.h>
#include <uv.h>

#include "err.h"

/* One event: its ZMQ_EVENT_* bit, its value (a file descriptor, an errno, a protocol error code:
 * see zmq_socket_monitor(3)) and the endpoint it concerns. */
typedef void (*zmon_cb)(void *arg, int event, uint32_t value, const char *endpoint);

typedef struct zmon zmon;

/* Watch EVENTS (a ZMQ_EVENT_* mask) of SOCK, created in ZCTX; CB(ARG, ...) is called on UV's loop. */
fsdp_status zmon_new(uv_loop_t *uv, void *zctx, void *sock, int events, zmon_cb cb, void *arg, zmon **out);
/* Stop watching (SOCK must still be open) and free; NULL-safe, clears *M. */
void zmon_destroy(zmon **m);

#endif
