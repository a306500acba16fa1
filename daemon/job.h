/* job — the coordinator's job state machine: queued → starting → running → succeeded, failed or
 * cancelled, with restarts ([job] max_restarts) that queue a failed attempt again to resume from
 * its newest checkpoint, and the recovery of the database's jobs when the daemon starts.
 *
 * A job_t is created by job_from_spec (a submit, or a queued job found at start), lives in
 * c->jobs while it is active, and is freed only by job_reap_drained once it ended and its workers
 * are reaped. Every state change is recorded in jobs.db and the job's job.log. Loop thread only.
 */
#ifndef FSDP_DAEMON_JOB_H
#define FSDP_DAEMON_JOB_H

#include "coord_core.h"

/* "queued", "starting", ... for a fsdp.JobState value. */
const char *job_state_name(int state);

/* A queued job (id 0, no directory yet) of OWNER (its workers get UMASK) from a job file's text:
 * parsed (file:line errors) with OWNER's rights (asuser.h: the paths it names are checked as that
 * user would see them; the weights it starts from, `init` or from = DIR's, are checked against the
 * model there too) and planned for its world size; a hybrid job without shard_group gets the ranks per node of C's
 * cluster (schedule_ranks_per_node; 1 while no node is known, as at a restart; the start takes it
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

/* Record STATE (with REASON, may be NULL) in memory, jobs.db and job.log. */
void job_set_state(coord_t *c, job_t *j, int state, const char *reason);
/* Move J to a terminal STATE; its live workers get SIG (0: none, they are exiting on their own). */
void job_finish(coord_t *c, job_t *j, int state, const char *reason, int sig);
/* Fail the current attempt with a reason naming the rank: the job ends failed, or with restarts
 * left it is queued again once its workers are reaped. */
void job_fail(coord_t *c, job_t *j, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* At the daemon's shutdown: keep J for the next start. A queued job stays queued (its record
 * already says so); a running job with a [checkpoint] dir and resume = auto is stopped at the next
 * step, which saves a checkpoint, and then recorded queued (job_check_stopped); any other job's
 * workers get SIGTERM and it is recorded queued at once, to resume from its newest checkpoint or
 * start over. J may be freed: call it while walking c->jobs with the next pointer kept aside. */
void job_shutdown(coord_t *c, job_t *j);
/* Succeed J once every rank acknowledged its stop. */
void job_check_stopped(coord_t *c, job_t *j);

/* States the database refused (a full disk): retried on every tick; status and list answer with
 * them meanwhile (job_overlay_unrecorded replaces *STATE and *REASON when ID has one). */
void job_retry_unrecorded(coord_t *c);
void job_overlay_unrecorded(const coord_t *c, uint64_t id, int *state, const char **reason);
/* At exit: log each state that was never recorded, and free them. */
void job_destroy_unrecorded(coord_t *c);

/* Drop the reports of the steps in flight. */
void job_free_reports(job_t *j);
/* Give back rank R's device slot. */
void job_free_slot(coord_t *c, job_t *j, int r);
/* Send SIG to every live worker of J, one kill_req per node. */
void job_send_kill(coord_t *c, job_t *j, int sig);
/* Free the jobs that ended and whose workers are all reaped (or whose drain limit passed), restart
 * failed attempts whose workers are gone, then schedule. Call it at the end of a loop callback:
 * no handler may still hold a job pointer. */
void job_reap_drained(coord_t *c);

#endif
