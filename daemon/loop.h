/* loop — the glue between libuv and ZeroMQ sockets (docs/design.md §1).
 *
 * A ZeroMQ socket's ZMQ_FD is edge-triggered: it only says "something changed", and a send can
 * consume the edge that announced a pending receive. So a uv_poll on ZMQ_FD only wakes the loop;
 * the work happens in a drain that calls the owner's callback while ZMQ_EVENTS has ZMQ_POLLIN.
 * The drain also runs from a uv_prepare handle before every blocking poll of the loop, which is
 * the "re-check after every send" rule applied once per iteration for every socket, so a message
 * whose edge was eaten by a send in any callback is still read. A drain handles at most
 * LOOP_DRAIN_BUDGET messages per socket and then keeps the loop spinning (uv_idle) so that one
 * busy socket cannot starve timers, child exits or the other sockets.
 *
 * The loop_zsock borrows the ZeroMQ socket (its owner closes it after loop_zsock_destroy); the
 * handle memory is freed in the uv close callback. Everything here runs on the loop's thread.
 */
#ifndef FSDP_DAEMON_LOOP_H
#define FSDP_DAEMON_LOOP_H

#include <stdint.h>
#include <uv.h>

#include "err.h"

#define LOOP_DRAIN_BUDGET 256

/* Called once per readable message: the callback must receive exactly one message (wire_recv
 * with ZMQ_DONTWAIT); a callback that reads nothing ends the drain for this round. */
typedef void (*loop_zsock_cb)(void *zsock, void *arg);

typedef struct loop_zsock loop_zsock;

fsdp_status loop_zsock_new(uv_loop_t *uv, void *zsock, loop_zsock_cb cb, void *arg, loop_zsock **out);
/* Stops watching; the handles are closed (freed in their close callbacks). NULL-safe. */
void loop_zsock_destroy(loop_zsock **z);
/* Drain now (also done automatically before every blocking poll). */
void loop_zsock_drain(loop_zsock *z);

/* Seconds since the Epoch, with sub-second precision (for timestamps in the database). */
double loop_now_wall(void);
/* Monotonic seconds (for deadlines). */
double loop_now_mono(void);
/* Milliseconds from now to the next multiple of PERIOD_MS of the wall clock at least a quarter
 * period away. Every node's agent beats on these boundaries, so that the coordinator receives a
 * cluster's heartbeats as one burst, read in one wake-up, rather than spread over the period (one
 * wake-up each). */
uint64_t loop_ms_to_boundary(uint64_t period_ms);

#endif
