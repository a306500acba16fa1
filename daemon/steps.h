/* steps — the step pipeline of a running job: two steps in flight, reports collected per step,
 * one metrics.jsonl line and one database row per completed step, then the stop.
 *
 * When every rank is ready (steps_on_ready) steps start_step+1 and +2 are sent at once; when all
 * reports of step s are in, step s+2 is sent. Reports are kept in two buffers (step mod 2); a
 * report outside the steps in flight, from the wrong rank, or a duplicate is logged and ignored.
 * After the last step every rank gets stop_cmd. Loop thread only.
 */
#ifndef FSDP_DAEMON_STEPS_H
#define FSDP_DAEMON_STEPS_H

#include "coord_core.h"

/* Rank R of J is ready to train from RD->start_step; the last one starts the steps. */
void steps_on_ready(coord_t *c, job_t *j, int r, const Fsdp__WorkerReady *rd);
/* A step report from rank R; takes *MP when it keeps it. */
void steps_on_report(coord_t *c, job_t *j, int r, Fsdp__Msg **mp);

/* A worker_error from rank R. A communication error or timeout is held for SECONDARY_GRACE_S
 * (a direct cause, such as the exit of the rank that died, wins); any other error fails the job. */
void steps_on_error(coord_t *c, job_t *j, int r, const Fsdp__WorkerError *e);
/* On every tick: a held error whose grace passed fails the job, naming the ranks that went silent
 * (or the lost node, if one is about to be declared); a passed start or step deadline fails it,
 * naming every rank that did not arrive. */
void steps_check(coord_t *c, job_t *j, double now);

/* A user's stop of running job J that checkpoints: the next step not yet sent saves a checkpoint
 * and is its last; the job then ends cancelled ("stopped by the user after step N"), or for the
 * daemon's shutdown (j->stop_for_shutdown, which needs only [checkpoint] dir) is queued again.
 * Returns 0 when there is nothing to checkpoint (not running, no [checkpoint], or every step
 * already sent): the caller cancels instead. */
int steps_stop(coord_t *c, job_t *j);

#endif
