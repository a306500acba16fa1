/* relay — a node agent's half of the step path: the endpoint its workers connect to, and the
 * aggregation of their step reports into one per node per step (docs/performance.md "Scale").
 *
 * The relay binds a ROUTER on a local endpoint (relay_endpoint; the agent passes it to its workers as
 * --connect). What a worker sends goes up to the coordinator unchanged, with the worker's identity
 * as one more envelope frame, so that the coordinator's ROUTER sees [agent][worker][""][body]; what
 * the coordinator addresses to [agent][worker] comes back down to that worker. The agent's own
 * messages keep their single empty frame. Two messages are not relayed:
 *  - node_step_cmd (coordinator → relay): steps granted to this node's ranks of a job; the relay
 *    sends each rank step_cmd itself, keeping two steps in flight per rank as the coordinator once did;
 *  - step_report (worker → relay): kept until every one of the node's ranks of that job has reported
 *    the step, then folded (stepagg.h) into one node_step_report, with every rank's figures of the
 *    checkpoint saves the reports carry as extra figures. A large job's node batches its steps
 *    (NodeStepCmd.report_every): one message up per that many steps, so that the coordinator reads
 *    one message per node per batch (docs/performance.md "Scale").
 * A worker is known as rank R of job J from the worker_setup the coordinator sends it through here.
 * Only the worker protocol's messages are passed up (hello, ready, error, ack, kv, trace spans): the
 * endpoint is an abstract unix socket any local user can reach, and a worker's hello still needs its
 * job's token; the coordinator likewise ignores an agent's messages that come from behind a relay.
 *
 * Ownership: the agent (or the simulator) owns the relay and its socket; the relay sends upward
 * through UP(ARG, ...). Loop thread only.
 */
#ifndef FSDP_DAEMON_RELAY_H
#define FSDP_DAEMON_RELAY_H

#include <uv.h>

#include "err.h"
#include "wire.h"

#define RELAY_INFLIGHT 2   /* steps a rank is handed beyond the node's last reported one */

typedef struct relay relay;
/* Send M with envelope ENV (NULL: the agent's own empty frame) to the coordinator. */
typedef void (*relay_up_fn)(void *arg, const wire_env *env, Fsdp__Msg *m);

/* Bind a ROUTER on ENDPOINT (NULL: a fresh abstract ipc://@fsdpd-relay-PID-N). */
fsdp_status relay_new(uv_loop_t *uv, void *zctx, const char *endpoint, relay_up_fn up, void *arg, relay **out);
void relay_destroy(relay **r);   /* NULL-safe; clears *R */
const char *relay_endpoint(const relay *r);

/* A message from the coordinator (ENV as the agent's DEALER received it). Returns 1 when the relay
 * took it (a worker's message or node_step_cmd; *M may be taken), 0 when it is the agent's own. */
int relay_from_coord(relay *r, const wire_env *env, Fsdp__Msg **m);
/* Rank RANK of JOB on this node is gone (its process was reaped): the relay forgets it, and the job
 * once it has no rank left. */
void relay_rank_gone(relay *r, uint64_t job, uint32_t rank);

#endif
