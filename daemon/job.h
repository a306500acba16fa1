/* job — the coordinator's job: its lifecycle, with restarts ([job] max_restarts) that queue a failed
 * attempt again to resume from its newest checkpoint, and the recovery of the database's jobs when
 * the daemon starts.
 *
 * A job has one lifecycle state (job_phase) and changes it only in job_event, through the transition
 * table in job.c: every (phase, event) pair is a transition or an explicit no-op, logged at debug
 * level. Scheduling, the step pipeline, the cluster service and the control server emit events and
 * read the phase; none of them sets it. Beside the phase, the job records an fsdp.JobState (queued,
 * starting, ... cancelled) in jobs.db and its job.log at each transition that users see.
 *
 *   queued ──START──▶ starting ──every RANK_READY──▶ running ──last STEP_RECORDED──▶ stopping
 *   (a failure with restarts left: restart_wait ──REAPED──▶ queued; any other end: draining)
 *   stopping ──every RANK_STOPPED──▶ draining (succeeded; a stop: cancelled; a shutdown's stop: queued)
 *   draining ──REAPED──▶ done (freed by job_reap_drained)
 *
 * docs/design.md has the table. The record is the job module's own (job_priv.h): the other files
 * read it through the accessors below and change it only through job_event and the verbs named here.
 * A job_t is created by job_from_spec (a submit, or a queued job found at start), lives in c->jobs
 * while it is active, and is freed only by job_reap_drained once it is done. Loop thread only.
 */
#ifndef FSDP_DAEMON_JOB_H
#define FSDP_DAEMON_JOB_H

#include "coord_core.h"

/* "queued", "starting", ... for a fsdp.JobState value. */
const char *job_state_name(int state);

typedef enum job_phase {
  JOB_QUEUED = 0,     /* waiting for devices: new, or again after a failed attempt */
  JOB_STARTING,       /* placed, workers spawned, waiting for every rank's worker_ready (start deadline) */
  JOB_RUNNING,        /* steps granted and recorded (step deadline); job_t.stop_at: a stop that ends it early */
  JOB_STOPPING,       /* every step recorded, stop_cmd sent: waiting for every rank's ack or clean exit */
  JOB_RESTART_WAIT,   /* the attempt failed with restarts left: its workers are killed; queued once reaped */
  JOB_DRAINING,       /* ended, its final state recorded: kept until its workers are reaped */
  JOB_DONE,           /* reaped: job_reap_drained frees it; no event may reach it */
  JOB_PHASES
} job_phase;

typedef enum job_ev {
  JE_START,           /* placed and about to spawn (schedule.c) */
  JE_RANK_READY,      /* .rank said worker_ready, resuming after step .step */
  JE_STEP_RECORDED,   /* every step up to .step is in metrics.jsonl and jobs.db; after the last, the stop */
  JE_RANK_STOPPED,    /* .rank acknowledged stop_cmd */
  JE_WORKER_ERROR,    /* .rank sent worker_error .code, .msg: a communication error is held SECONDARY_GRACE_S */
  JE_WORKER_EXIT,     /* .rank exited: .status, .signal; .msg is the failure's reason if it is one */
  JE_DEADLINE,        /* a start or step deadline, or a held error's grace, passed; .msg names the ranks */
  JE_NODE_LOST,       /* node .node was lost or stopped (.msg, naming the job's ranks on it when it has any) */
  JE_FAIL,            /* the attempt cannot go on: .msg (placement, a step that cannot be recorded) */
  JE_UNFIT,           /* queued, the live cluster lacked its devices for restart_wait_s: .msg */
  JE_USER_STOP,       /* fsdpctl stop: checkpoint at the next step not yet sent and end cancelled, else cancel */
  JE_CANCEL,          /* fsdpctl cancel */
  JE_SHUTDOWN,        /* the daemon shuts down: keep the job for the next start (job_event's table) */
  JE_SHUTDOWN_LATE,   /* the shutdown's grace passed before the job's checkpoint was saved */
  JE_TICK,            /* the periodic tick (.now): a draining job's stragglers get SIGKILL */
  JE_REAPED,          /* every worker was reaped, or the drain limit passed (job_reap_drained) */
  JOB_EVENTS
} job_ev;

/* A stop's end (job_t.stop_kind). */
enum { JOB_STOP_NONE = 0, JOB_STOP_USER, JOB_STOP_SHUTDOWN };

typedef struct job_ev_args {
  int rank;
  int node;
  uint32_t step;
  int code;                  /* worker_error's fsdp_status */
  int status, signal;        /* worker_exit */
  double now;                /* JE_TICK */
  const char *msg;
} job_ev_args;

/* Feed EV (ARGS: NULL for none) to J: the facts it carries are applied (a rank's exit or loss), then
 * the table's transition for J's phase runs, or an explicit no-op is logged. Returns the new phase.
 * J is never freed here. The invariants of the new phase are checked (JOB_ASSERT). */
job_phase job_event(coord_t *c, job_t *j, job_ev ev, const job_ev_args *args);
job_phase job_phase_of(const job_t *j);
const char *job_phase_name(job_phase p);
const char *job_ev_name(job_ev ev);
/* The current attempt has workers that count: starting, running or stopping. */
int job_live(const job_t *j);
/* Ended: its final state is recorded (draining, done). */
int job_ended(const job_t *j);

/* The step pipeline's progress on a job (steps.h says what each means): held by the job, changed by
 * steps.c and by the job's transitions (job.c), reached from elsewhere through job_steps. */
typedef struct job_steps_view {
  uint32_t start_step, next_step, done_step;
  struct steps_win *win;     /* the steps granted and not yet recorded (steps.c); NULL before running */
  void (*win_free)(job_t *j);   /* steps.c's, set with win: frees it and clears win */
  uint32_t detail_rank;      /* `fsdpctl status --rank R` asked for R: R + 1, its figures ride on every step (0: none) */
  Fsdp__Msg *rank_detail;    /* the node_step_report that carried rank detail_rank's figures last */
  uint32_t rank_detail_step;
  FILE *metrics;
  promx_job *px;             /* its Prometheus figures and cumulative counters (promx.h); NULL before any */
  Fsdp__CkptSave ckpt;       /* the latest complete checkpoint save (metrics_ckpt; step 0: none yet) */
} job_steps_view;

/* Read access for the coordinator's other files (job_read.c): job_t's fields are the job module's
 * own, so scheduling, the step pipeline, the cluster service and the control server read a job
 * through these and change it only through job_event and the functions below. Loop thread only. */
job_t *job_next(const job_t *j);                 /* the next active job in c->jobs; NULL after the last */
uint64_t job_id(const job_t *j);                  /* 0 until job_admit */
int job_state(const job_t *j);                    /* the fsdp.JobState last recorded */
const char *job_reason(const job_t *j);           /* why it failed or was cancelled; "" if nothing */
int job_world(const job_t *j);
int job_kind(const job_t *j);                     /* fsdp.DeviceKind */
const char *job_name(const job_t *j);
const char *job_dir_of(const job_t *j);           /* STATE/jobs/ID; "" before job_admit */
const jobspec_t *job_spec(const job_t *j);        /* the job as resolved (jobresolve.h) */
const char *job_spec_path(const job_t *j);
const plan_t *job_plan(const job_t *j);
Fsdp__Plan *job_plan_msg(const job_t *j);         /* the plan as sent to workers; owned by J */
const char *job_token(const job_t *j);
const char *job_kv_prefix(const job_t *j);        /* this attempt's rendezvous namespace */
const peer_t *job_owner(const job_t *j);
uint32_t job_start_step(const job_t *j);          /* the attempt resumed after this step */
uint32_t job_next_step(const job_t *j);           /* the next step to grant */
uint32_t job_done_step(const job_t *j);           /* every step up to it is recorded */
const Fsdp__CkptSave *job_last_ckpt(const job_t *j);   /* step 0: none yet */
const promx_job *job_promx(const job_t *j);       /* NULL before its first record */
/* Rank R of the current attempt: NULL before placement or when R is out of range. The records are
 * contiguous: job_rank(j, 0)[r] is rank r for r < job_world(j). */
const rank_st *job_rank(const job_t *j, int r);
/* Rank R said hello from the socket IDENT (LEN bytes) at its node's relay. */
void job_rank_set_ident(job_t *j, int r, const uint8_t *ident, size_t len);
/* Node index NODE was dropped from c->nodes: the ranks on later nodes move down by one. */
void job_node_dropped(job_t *j, int node);
/* Give J its Prometheus record if it has none (a job queued at submit or at a restart). */
fsdp_status job_promx_ensure(job_t *j);
/* Make J (a new job from job_from_spec) active: a jobs.db row, its id and folder, queued first in
 * c->jobs. On failure J is not linked (the caller destroys it); fsdp_last_error says why. */
fsdp_status job_admit(coord_t *c, job_t *j);
/* Scheduling's part (schedule.c): a hybrid job without shard_group, resolved again at each start;
 * the time since which the live cluster lacks J's devices (0: it fits); placement. */
int job_auto_group(const job_t *j);
unsigned job_umask(const job_t *j);
double job_unfit_since(const job_t *j);
void job_set_unfit_since(job_t *j, double since);
/* Exchange J's plan and shard_group with *PLAN and *SHARD_GROUP (a regroup; again to undo it). */
void job_swap_plan(job_t *j, plan_t **plan, int *shard_group);
/* Placement of a queued job: rank records for its world (job_place_begin), each rank's node and slot
 * (job_rank_place), or, when the room was not there after all, none again (job_place_undo). */
fsdp_status job_place_begin(job_t *j);
void job_rank_place(job_t *j, int r, int node, int slot);
void job_place_undo(job_t *j);
/* Before JE_START: the plan message, a fresh worker token, the attempt's rendezvous namespace and
 * its start and step timeouts ([job] timeout_s). */
fsdp_status job_attempt_prepare(job_t *j);
/* Rank R's spawn request was sent: it is alive until its worker_exit. */
void job_rank_spawned(job_t *j, int r);
/* The step pipeline's part (steps.c): its progress, which it changes (job_steps_view); the last step
 * to train (a stop moves it earlier), the stop's step (0: none), the attempt (0 first), the current
 * deadline (0: none) and the timeouts it was set from. */
job_steps_view *job_steps(job_t *j);
const job_steps_view *job_steps_of(const job_t *j);   /* the same, to read */
uint32_t job_last_step(const job_t *j);
uint32_t job_stop_at(const job_t *j);
int job_attempt(const job_t *j);
double job_deadline(const job_t *j);
double job_start_timeout(const job_t *j);
double job_step_timeout(const job_t *j);
/* A communication error held for a more direct cause (SECONDARY_GRACE_S): its message, or NULL when
 * none is held; its rank, since when it is held and until when. job_held_error_defer holds it
 * until UNTIL. */
const char *job_held_error(const job_t *j, int *rank, double *since, double *until);
void job_held_error_defer(job_t *j, double until);
/* Append one line to J's job.log (coord_job_log). */
#define job_log(j, ...) coord_job_log(job_dir_of(j), __VA_ARGS__)

/* An invariant of the job's lifecycle, checked in every build: a violation is a defect, logged
 * with where it was found, and aborts (as libuv's handle asserts do). */
#define JOB_ASSERT(cond)                                                                              \
  do {                                                                                                \
    if (!(cond)) job_assert_failed(#cond, __FILE__, __LINE__);                                        \
  } while (0)
_Noreturn void job_assert_failed(const char *what, const char *file, int line);

/* A queued job (id 0, no directory yet) of OWNER (its workers get UMASK) from a job file's text:
 * parsed (file:line errors) with OWNER's rights (asuser.h: the paths it names are checked as that
 * user would see them; the weights it starts from, `init` or from = DIR's, are checked against the
 * model there too) and planned for its world size; a hybrid job without shard_group gets the ranks per node of C's
 * cluster (coord_ranks_per_node; 1 while no node is known, as at a restart; the start takes it
 * again). Errors are recorded for
 * fsdp_last_error. */
fsdp_status job_from_spec(const coord_t *c, const char *spec_text, const char *spec_path, const char *base_dir,
                          const peer_t *owner, unsigned umask, job_t **out);
/* The owner of a database row: its recorded user, or for a job from before owners were recorded,
 * the daemon's own user (whose rights it ran with). */
fsdp_status job_row_owner(const jobs_db_row *row, peer_t *out);
void job_destroy(job_t **j);   /* NULL-safe; clears *J */
/* (Re)open J's metrics.jsonl for appending, never through a link; on failure j->metrics is NULL
 * and the reason is logged. */
void job_open_metrics(job_t *j);

/* At start: of the jobs the database holds as starting or running, those with every step recorded
 * succeeded (only their final state was lost) and the others failed ("daemon restarted"); the
 * queued ones are queued again in their order. */
fsdp_status job_recover(coord_t *c);

/* States the database refused (a full disk): retried on every tick; status and list answer with
 * them meanwhile (job_overlay_unrecorded replaces *STATE and *REASON when ID has one). */
void job_retry_unrecorded(coord_t *c);
void job_overlay_unrecorded(const coord_t *c, uint64_t id, int *state, const char **reason);
/* At exit: log each state that was never recorded, and free them. */
void job_destroy_unrecorded(coord_t *c);

/* Feed JE_REAPED to the jobs whose workers are all reaped (or whose drain limit passed): a failed
 * attempt is queued again, an ended job is done and freed. Returns whether any was, so that the
 * caller schedules. Call it at the end of a loop callback: no handler may still hold a job pointer. */
int job_reap_drained(coord_t *c);


/* The active job with id ID; NULL when there is none. */
job_t *job_find(coord_t *c, uint64_t id);
/* The job and rank of the worker that sent ENV ([node ident][worker ident][""], relayed); NULL: none. */
job_t *job_find_worker(coord_t *c, const wire_env *env, int *rank);
/* Send M to rank R of J through its node's relay; nothing before its hello. */
void job_send_rank(coord_t *c, const job_t *j, int r, Fsdp__Msg *m);
/* The Prometheus text of C's jobs (active, then finished) and nodes, from a view of them (promx.h). */
fsdp_status job_render_metrics(const coord_t *c, char **text, size_t *len);
/* With --metrics: render the Prometheus text now and hand it to the HTTP server (metricsrv.h).
 * Called after every completed step and state change, and on every tick. */
void job_publish_metrics(coord_t *c);

#endif
