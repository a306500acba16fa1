/* job_priv — the job record, private to the job module (job.c, job_read.c; and the unit tests that
 * drive it or build jobs by hand). Everything else reads a job through job.h. Loop thread only. */
#ifndef FSDP_DAEMON_JOB_PRIV_H
#define FSDP_DAEMON_JOB_PRIV_H

#include "job.h"

struct job {
  struct job *next;
  uint64_t id;
  int phase;                 /* its lifecycle (job.h: job_phase): changed by job_event alone */
  int state;                 /* the fsdp.JobState recorded in jobs.db, set with the phase */
  char reason[1024];
  char *spec_text, *spec_path, *base_dir;
  char job_dir[PATH_MAX + 64];
  peer_t owner;              /* the submitter: its workers run with its uid, groups and umask */
  unsigned umask;
  jobspec_t spec;
  plan_t *plan;
  Fsdp__Plan *plan_pb;
  int world, kind;
  int auto_group;            /* hybrid without shard_group: G = the ranks per node, taken again at each start */
  char token[40];
  rank_st *ranks;
  int nready, nstopped, nalive;
  uint32_t steps;
  job_steps_view sv;         /* the step pipeline's progress (job_steps) */
  double deadline;           /* monotonic: start or step timeout (starting, running, stopping); 0 none */
  double kill_at, drain_until;   /* draining: SIGKILL the stragglers at kill_at (0: none); draining and
                                  * restart-wait: their workers are given up on at drain_until */
  double step_timeout, start_timeout;
  /* A communication error is often the echo of another rank's death (its peer's socket closed
   * before that rank's exit reached us): such a failure waits SECONDARY_GRACE_S for a more
   * direct cause (a rank killed by a signal, exiting on its own, a non-communication error). */
  char pending[1024];
  int pending_rank;
  double pending_since, pending_until;
  /* Restarts ([job] max_restarts, docs/checkpoints.md): attempt counts from 0; a failed attempt with
   * restarts left kills its workers and waits (JOB_RESTART_WAIT) until they are reaped, then the job
   * is queued again. Each attempt has its own rendezvous namespace, so no stale key is ever read. */
  int attempt;
  char kv_prefix[64];
  double unfit_since;        /* queued but the live cluster has too few devices since then (0: fits) */
  uint32_t stop_at;          /* a stop (job.h: JE_USER_STOP, JE_SHUTDOWN): the step that checkpoints and ends the job (0: none) */
  int stop_kind;             /* job.h: job_stop, what the stop ends in */
};

#endif
