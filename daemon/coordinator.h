/* coordinator — the cluster role of fsdpd: jobs, scheduling, and the ctl, cluster and KV services.
 *
 * It binds a ROUTER for fsdpctl at cfg->ctl and a ROUTER for agents and workers at cfg->listen
 * (docs/daemon.md gives the message sequences). A tcp:// endpoint is a CURVE server with the
 * keypair in STATE/keys/ (created on first use), and a ZAP handler on the loop admits only the
 * client keys listed in STATE/keys/authorized plus the daemon's own (common/curve.h). Jobs are validated
 * with the planner at submit (a spec that cannot fit the devices it would get is refused with the
 * plan's reason), stored in SQLite (jobs_db), queued FIFO, given devices packed by node, spawned
 * through the agents, and driven step by step with up to two steps in flight; every step becomes
 * one metrics.jsonl line and one database row. Failures (a worker exit, a worker error, a lost
 * node, a silent job) fail the job with a reason naming the rank, kill its other workers and free
 * its devices — or, for a job with [job] max_restarts left (which needs checkpoints), queue it
 * again to resume from its newest checkpoint (docs/checkpoints.md).
 *
 * The coordinator owns its sockets, jobs and database; it borrows the uv loop and the ZeroMQ
 * context. Everything runs on the loop's thread.
 */
#ifndef FSDP_DAEMON_COORDINATOR_H
#define FSDP_DAEMON_COORDINATOR_H

#include <uv.h>

#include "err.h"
#include "fsdp.pb-c.h"

typedef struct coord_config {
  const char *state_dir;     /* created mode 0700; holds jobs.db, jobs/ID/ and the ipc sockets */
  const char *ctl;           /* fsdpctl endpoint */
  const char *listen;        /* agents' and workers' endpoint */
  double heartbeat_s;        /* agents beat this often; a node is lost after 3 missed beats */
  double forget_s;           /* a lost or stopped node is dropped from the node list this long after */
  const char *worker_log_level;   /* passed to workers as --log-level */
  int wait_first_node;       /* bind ctl only once an agent has registered (embedded daemon) */
  void (*on_shutdown_req)(void *arg);   /* a ctl shutdown_req was acknowledged */
  struct metricsrv *metrics; /* --metrics: where the Prometheus text is published (borrowed); NULL: off */
  void *arg;
} coord_config;

typedef struct coord coord_t;

fsdp_status coord_new(uv_loop_t *uv, void *zctx, const coord_config *cfg, coord_t **out);
/* Stop accepting work and keep every job for the next start (JE_SHUTDOWN, job.h: queued ones stay
 * queued, running ones are stopped at a checkpoint or killed, and queued again), and call DONE(ARG)
 * once every worker is reaped or GRACE_S seconds have passed (what is still running then is
 * killed and queued again, to resume from its newest checkpoint). */
void coord_shutdown(coord_t *c, double grace_s, void (*done)(void *), void *arg);
/* Closes sockets and the database. NULL-safe. */
void coord_destroy(coord_t **c);

#endif
