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
 * Who may speak as a worker: the agent tells the relay which process it started for each rank
 * (relay_expect: the job, the rank, the uid it runs as and its pid). The relay's socket is a unix
 * socket in a directory only this daemon's user can enter (--state-dir's run/, mode 0700); a worker
 * reaches it through the O_PATH descriptor the agent hands it (relay_socket_fd, as
 * ipc:///proc/self/fd/N), so no other process can connect at all, and nobody can squat its name.
 * Behind that, every hello is checked against the connection's credentials, which the kernel gave
 * libzmq when it accepted the connection (SO_PEERCRED, wire_env.peer_uid/peer_pid): only the
 * process started for job J's rank R may say hello as it, and from then on only that connection
 * speaks for R (a message naming another rank is dropped). The worker protocol's other messages
 * (ready, error, ack, kv, trace spans, step reports) pass only on such a connection; anything else
 * is dropped. Refused and malformed messages are logged at most one line per 10 s, with a count.
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

/* Bind a ROUTER on a fresh unix socket DIR/r-PID-N; DIR must be a directory only this daemon's user
 * can enter (the caller checks it). */
fsdp_status relay_new(uv_loop_t *uv, void *zctx, const char *dir, relay_up_fn up, void *arg, relay **out);
void relay_destroy(relay **r);   /* NULL-safe; clears *R; removes the socket file */
/* ipc://DIR/r-PID-N: what this daemon's own user connects to (the simulator, tests). */
const char *relay_endpoint(const relay *r);
/* An O_PATH descriptor of the socket file (close-on-exec): a worker given it as descriptor N connects
 * to ipc:///proc/self/fd/N. Owned by the relay. */
int relay_socket_fd(const relay *r);
/* The process PID, running as UID, is job JOB's rank RANK: only it may say hello as that rank (a
 * restart's new process replaces the old one's entry). */
void relay_expect(relay *r, uint64_t job, uint32_t rank, long uid, long pid);

/* A message from the coordinator (ENV as the agent's DEALER received it). Returns 1 when the relay
 * took it (a worker's message or node_step_cmd; *M may be taken), 0 when it is the agent's own. */
int relay_from_coord(relay *r, const wire_env *env, Fsdp__Msg **m);
/* Rank RANK of JOB on this node is gone (its process PID was reaped): the relay forgets it, and the
 * job once it has no rank left. */
void relay_rank_gone(relay *r, uint64_t job, uint32_t rank, long pid);

#endif
