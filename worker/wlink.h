/* wlink — the worker's link to the coordinator (the worker side of the protocol in
 * docs/daemon.md): hello → setup → rendezvous through the coordinator's key-value service →
 * ready → step commands answered by step reports → stop. Between steps it also answers the
 * coordinator's trace pulls (trace_req) from the worker's span ring (wlink_set_trace).
 *
 * One DEALER socket connected to the coordinator's cluster endpoint, used only by the worker's main
 * thread (the gloo rendezvous callbacks run on that thread, inside comm_new_gloo). The link owns
 * the socket and the received setup message. A tcp:// endpoint uses CURVE with the key files named
 * by $FSDP_SERVER_KEY and $FSDP_CLIENT_KEY (set by the agent; common/curve.h); without them it fails.
 */
#ifndef FSDP_WLINK_H
#define FSDP_WLINK_H

#include <stdint.h>

#include "comm.h"
#include "runtime.h"
#include "trace.h"
#include "wire.h"

typedef struct wlink wlink;

/* Connect, say hello, and wait (up to timeout_s) for this rank's setup. */
fsdp_status wlink_open(const char *endpoint, uint64_t job_id, int rank, const char *token, double timeout_s,
                       wlink **out);
const Fsdp__WorkerSetup *wlink_setup(const wlink *l);
/* Rendezvous callbacks backed by the coordinator's key-value service. */
comm_kv wlink_kv(wlink *l);
fsdp_status wlink_ready(wlink *l, int start_step);
/* The span ring trace pulls are answered from (NULL: answered with no spans). */
void wlink_set_trace(wlink *l, const trace_t *t);
/* Wait for the next command: *step > 0 for a step (*checkpoint: save one after it; *last: no step
 * follows), 0 for stop. Trace pulls that arrive meanwhile are answered on the way. */
fsdp_status wlink_next(wlink *l, int *step, int *checkpoint, int *last);
fsdp_status wlink_report(wlink *l, int rank, const rt_report *r);
fsdp_status wlink_ack(wlink *l);
/* Tell the coordinator this worker failed (best effort; the exit status says it too). */
void wlink_error(wlink *l, int rank, fsdp_status code, const char *message);
void wlink_close(wlink **l);

#endif
