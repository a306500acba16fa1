/* jobs_db — the coordinator's SQLite store: jobs, their state transitions, per-step metrics.
 *
 * One database file (STATE/jobs.db) in WAL mode with synchronous=NORMAL: a step's row and the
 * job's progress are one short transaction, so the coordinator can record every step without
 * becoming the bottleneck, and a crash loses at most the last transactions, never consistency.
 * Schema (docs/daemon.md):
 *   jobs(id, name, state, reason, world, device, steps, step, loss, tokens_per_s, spec_text,
 *        spec_path, base_dir, job_dir, submitted_at, started_at, finished_at,
 *        owner_uid, owner_gid, owner, umask)        the submitter; -1 and '' in jobs from before
 *                                                   owners were recorded (a database of that age
 *                                                   gets the columns when it is opened)
 *   job_transitions(job_id, state, reason, at)          one row per state change
 *   job_steps(job_id, step, loss, lr, grad_norm, tokens, step_ms, tokens_per_s, json)
 * States are fsdp.JobState values (1 queued … 6 cancelled). Times are seconds since the Epoch.
 *
 * The handle owns its prepared statements; use it from one thread (the coordinator's loop).
 */
#ifndef FSDP_DAEMON_JOBS_DB_H
#define FSDP_DAEMON_JOBS_DB_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct jobs_db jobs_db;

/* One job row. Strings are owned by the row (jobs_db_row_clear frees them). */
typedef struct jobs_db_row {
  uint64_t id;
  char *name;
  int state;
  char *reason;
  int world;
  int device;          /* fsdp.DeviceKind */
  int steps;
  int step;            /* last completed step */
  double loss, tokens_per_s;
  char *spec_text, *spec_path, *base_dir, *job_dir;
  double submitted_at, started_at, finished_at;   /* 0 when not reached */
  /* The last step's scalars (from job_steps), valid when step > 0. */
  double last_lr, last_grad_norm, last_step_ms;
  uint64_t last_tokens;
  /* The submitter (docs/operations.md, "Trust model"): uid -1 and owner "" for a job submitted
   * before owners were recorded; umask is the one its workers get. */
  int64_t owner_uid, owner_gid;
  char *owner;
  int umask;
} jobs_db_row;

typedef struct jobs_db_step {
  int step;
  double loss, lr, grad_norm;
  uint64_t tokens;
  double step_ms, tokens_per_s;
} jobs_db_step;

/* Open (or create) the database at PATH. A database whose pages are damaged (SQLite's quick_check,
 * or a file that is no database) is FSDP_ERR_STATE: one line naming PATH and the remedy. */
fsdp_status jobs_db_open(const char *path, jobs_db **out);
/* Ids are never given twice: the next job's id is above LAST (the newest job folder), above every
 * id ever given (AUTOINCREMENT), whatever rows a lost transaction took with it. */
fsdp_status jobs_db_ids_above(jobs_db *db, uint64_t last);
void jobs_db_destroy(jobs_db **db);

/* Insert a queued job (row->id is ignored; the new id is returned). Records the 'queued' transition.
 * row->job_dir is the PARENT of job directories: the job's is stored as PARENT/ID. */
fsdp_status jobs_db_insert(jobs_db *db, const jobs_db_row *row, double now, uint64_t *id);
/* Move job ID to STATE (reason may be NULL); records a transition; sets started_at on 'running'
 * and finished_at on a terminal state. */
fsdp_status jobs_db_set_state(jobs_db *db, uint64_t id, int state, const char *reason, double now);
/* Append one step (JSON: the metrics.jsonl line) and update the job's progress, in one transaction. */
fsdp_status jobs_db_add_step(jobs_db *db, uint64_t id, const jobs_db_step *s, const char *json);
/* FSDP_ERR_NOTFOUND ("no job 42") when there is no such job. */
fsdp_status jobs_db_get(jobs_db *db, uint64_t id, jobs_db_row *out);
/* The newest LIMIT jobs (0: all), newest first; free with jobs_db_rows_destroy. */
fsdp_status jobs_db_list(jobs_db *db, uint32_t limit, jobs_db_row **rows, size_t *n);
/* The same with starting and running jobs first (each part newest first): a long queue of newer
 * jobs does not push the running ones out of LIMIT. */
fsdp_status jobs_db_list_running_first(jobs_db *db, uint32_t limit, jobs_db_row **rows, size_t *n);
/* How many jobs are in each state: COUNTS[state] for fsdp.JobState 0..6. */
#define JOBS_DB_NSTATES 7
fsdp_status jobs_db_state_counts(jobs_db *db, uint32_t counts[JOBS_DB_NSTATES]);
void jobs_db_rows_destroy(jobs_db_row **rows, size_t n);
void jobs_db_row_clear(jobs_db_row *row);
/* Mark every job that had started (starting or running) as failed with REASON; *count is how
 * many. Queued jobs are left queued: the coordinator queues them again. */
fsdp_status jobs_db_fail_started(jobs_db *db, const char *reason, double now, int *count);
/* The states job ID went through, in order (at most max entries); *n is how many were written. */
fsdp_status jobs_db_transitions(jobs_db *db, uint64_t id, int *states, double *at, size_t max, size_t *n);
/* The metrics line stored for STEP of job ID (malloc'd; FSDP_ERR_NOTFOUND when none). */
fsdp_status jobs_db_step_json(jobs_db *db, uint64_t id, int step, char **json);
/* The newest step of job ID whose metrics line has a val_loss, and that loss; *step = 0 if none. */
fsdp_status jobs_db_last_val(jobs_db *db, uint64_t id, int *step, double *val_loss);
/* How many step rows job ID has. */
fsdp_status jobs_db_step_count(jobs_db *db, uint64_t id, int *count);

static inline int jobs_db_terminal(int state) { return state >= 4; }   /* succeeded, failed, cancelled */

#endif
