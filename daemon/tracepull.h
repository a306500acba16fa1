/* tracepull — `fsdpctl trace` in the coordinator: a ctl trace_req for a running job is forwarded to
 * every rank (trace_req with a pull id), each worker answers with its spans between two steps
 * (trace_spans), and once every rank has answered the coordinator replies with one trace_resp:
 * the ranks' spans and the plan's unit names.
 *
 * Interleaving with the steps: a worker reads its link in order, so each rank answers after exactly
 * the step commands sent before the pull — the same steps on every rank; the default range is the
 * last TRACEPULL_DEFAULT_STEPS of those. A pull is answered with an error when the job ends or
 * restarts before every rank answered, or when TRACEPULL_TIMEOUT_S pass (naming the silent ranks),
 * so that a dead or slow rank never holds the ctl call. Steps that a rank's ring no longer holds
 * whole (worker/trace.h: TRACE_RING spans) are refused with the steps it does hold.
 *
 * The coordinator owns its pending pulls (c->pulls). Loop thread only.
 */
#ifndef FSDP_DAEMON_TRACEPULL_H
#define FSDP_DAEMON_TRACEPULL_H

#include "coord_core.h"

#define TRACEPULL_DEFAULT_STEPS 3
#define TRACEPULL_TIMEOUT_S 25.0   /* below fsdpctl's 30 s call timeout, so the user sees why */
/* worker/trace.h's TRACE_RING, for messages: a rank whose steps each record more spans than that
 * holds no whole step, and answers as one that records none (first_kept = last_kept = 0). */
#define TRACEPULL_RING_SPANS 65536

/* A ctl trace_req with envelope ENV: refused at once, or forwarded to J's ranks. */
void tracepull_request(coord_t *c, const wire_env *env, const Fsdp__TraceReq *req);
/* Rank R of J answered; takes *MP when it keeps it. */
void tracepull_on_spans(coord_t *c, job_t *j, int r, Fsdp__Msg **mp);
/* On every tick: answer pulls whose job ended or whose deadline passed. */
void tracepull_check(coord_t *c, double now);
/* At exit: drop every pending pull (unanswered). */
void tracepull_destroy_all(coord_t *c);

#endif
