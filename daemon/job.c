/* job — see job.h. */
#include "job_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "asuser.h"
#include "jobresolve.h"
#include "ckpt.h"
#include "fsutil.h"
#include "kv.h"
#include "log.h"
#include "planmsg.h"
#include "st_model.h"

static void unrecorded_add(coord_t *c, uint64_t id, int state, const char *reason) {
  unrecorded_t *u = NULL;
  for (unrecorded_t *x = c->unrecorded; x; x = x->next)
    if (x->id == id) u = x;
  if (!u) {
    u = calloc(1, sizeof *u);
    if (!u) return;
    u->id = id;
    u->next = c->unrecorded;
    c->unrecorded = u;
  }
  u->state = state;
  u->at = loop_now_wall();
  snprintf(u->reason, sizeof u->reason, "%s", reason ? reason : "");
}

void job_retry_unrecorded(coord_t *c) {
  for (unrecorded_t **p = &c->unrecorded; *p;) {
    unrecorded_t *u = *p;
    if (jobs_db_set_state(c->db, u->id, u->state, u->reason[0] ? u->reason : NULL, u->at) != FSDP_OK) {
      p = &u->next;
      continue;
    }
    log_info("job %llu: state %s recorded at last", (unsigned long long)u->id, job_state_name(u->state));
    *p = u->next;
    free(u);
  }
}

void job_overlay_unrecorded(const coord_t *c, uint64_t id, int *state, const char **reason) {
  for (const unrecorded_t *u = c->unrecorded; u; u = u->next)
    if (u->id == id) {
      *state = u->state;
      *reason = u->reason;
    }
}

void job_destroy_unrecorded(coord_t *c) {
  while (c->unrecorded) {
    unrecorded_t *u = c->unrecorded;
    c->unrecorded = u->next;
    log_error("job %llu: its state %s was never recorded (the database would not take it)%s", (unsigned long long)u->id,
              job_state_name(u->state), u->state == ST_SUCCEEDED ? "; the next start records it from its steps" : "");
    free(u);
  }
}

/* Drop the steps in flight (the step pipeline's window) and what the coordinator kept of them. */
static void free_steps(job_t *j) {
  wire_destroy(&j->sv.rank_detail);
  if (j->sv.win) j->sv.win_free(j);
}

/* Record STATE (with REASON, may be NULL) in memory, jobs.db and job.log. */
static void record_state(coord_t *c, job_t *j, int state, const char *reason) {
  j->state = state;
  if (promx_set_state(&j->sv.px, j->id, j->spec.name, state) != FSDP_OK) log_warn("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
  job_publish_metrics(c);
  if (reason) snprintf(j->reason, sizeof j->reason, "%s", reason);
  if (jobs_db_set_state(c->db, j->id, state, reason, loop_now_wall()) != FSDP_OK) {
    /* Most often a full disk. The state is kept in memory, so that status and jobs still tell the
     * truth (and `submit --follow` ends), and written as soon as the database takes it. */
    log_error("job %llu: cannot record state %s: %s; answering from memory until it can be recorded",
              (unsigned long long)j->id, job_state_name(state), fsdp_last_error());
    unrecorded_add(c, j->id, state, reason);
  }
  if (reason && *reason) {
    job_log(j, "%s: %s", job_state_name(state), reason);
    log_info("job %llu %s: %s", (unsigned long long)j->id, job_state_name(state), reason);
  } else {
    job_log(j, "%s", job_state_name(state));
    log_info("job %llu %s", (unsigned long long)j->id, job_state_name(state));
  }
}

void job_destroy(job_t **jp) {
  if (!jp || !*jp) return;
  job_t *j = *jp;
  *jp = NULL;
  free_steps(j);
  if (j->sv.metrics) fclose(j->sv.metrics);
  promx_job_free(&j->sv.px);
  plan_destroy(&j->plan);
  planmsg_destroy(&j->plan_pb);
  free(j->ranks);
  free(j->spec_text);
  free(j->spec_path);
  free(j->base_dir);
  free(j);
}

/* Give back rank R's device slot. */
static void free_slot(coord_t *c, job_t *j, int r) {
  rank_st *rk = &j->ranks[r];
  if (rk->node < 0) return;
  node_t *n = &c->nodes[rk->node];
  slot_t *s = &n->slots[rk->slot];
  if (s->job_id == j->id && s->rank == (uint32_t)r) s->job_id = 0;
  rk->node = -1;
}

/* Send SIG to every live worker of J, one kill_req per node. */
static void send_kill(coord_t *c, job_t *j, int sig) {
  for (int i = 0; i < c->nnodes; i++) {
    int any = 0;
    for (int r = 0; r < j->world && !any; r++) any = j->ranks[r].alive && j->ranks[r].node == i;
    if (!any || c->nodes[i].lost) continue;
    Fsdp__KillReq k = FSDP__KILL_REQ__INIT;
    k.job_id = j->id;
    k.signal = sig;
    Fsdp__Msg m = WIRE_MSG_INIT;
    m.body_case = FSDP__MSG__BODY_KILL_REQ;
    m.kill_req = &k;
    coord_send(c, c->nodes[i].ident, c->nodes[i].ident_len, &m);
  }
}

void job_open_metrics(job_t *j) {
  char path[PATH_MAX + 128];
  snprintf(path, sizeof path, "%s/metrics.jsonl", j->job_dir);
  if (j->sv.metrics) fclose(j->sv.metrics);
  j->sv.metrics = NULL;
  int fd;
  if (fsutil_open_append(AT_FDCWD, path, path, 0644, &fd) != FSDP_OK) {
    log_warn("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
    return;
  }
  if (!(j->sv.metrics = fdopen(fd, "a"))) {
    log_warn("job %llu: cannot open %s: %s", (unsigned long long)j->id, path, strerror(errno));
    close(fd);
  }
}

/* Jobs are freed only here, at the end of a loop callback, never while a handler still holds a
 * pointer to one. */
int job_reap_drained(coord_t *c) {
  double now = loop_now_mono();
  int reaped = 0;
  for (job_t **p = &c->jobs; *p;) {
    job_t *j = *p;
    int waits = j->phase == JOB_RESTART_WAIT || j->phase == JOB_DRAINING;
    if (!waits || (j->nalive > 0 && now <= j->drain_until)) {
      p = &j->next;
      continue;
    }
    reaped = 1;
    if (job_event(c, j, JE_REAPED, NULL) != JOB_DONE) {
      p = &j->next;
      continue;
    }
    *p = j->next;
    promx_retire(&c->px_done, &j->sv.px, now);   /* its final figures stay visible a while */
    job_destroy(&j);
  }
  return reaped;
}

/* What every ending of an attempt lets go: its rendezvous keys, its step pipeline, its deadline. */
static void end_attempt(coord_t *c, job_t *j, const char *why) {
  kv_drop_job(c, j->id, why);
  if (j->sv.metrics) {
    fclose(j->sv.metrics);
    j->sv.metrics = NULL;
  }
  free_steps(j);
  j->deadline = 0;
  j->pending[0] = 0;
  j->drain_until = loop_now_mono() + DRAIN_LIMIT_S;
}

/* The job ends in STATE, recorded; its live workers get SIG (0: none, they are exiting on their own). */
static job_phase finish(coord_t *c, job_t *j, int state, const char *reason, int sig) {
  record_state(c, j, state, reason);
  end_attempt(c, j, state == ST_SUCCEEDED ? "the job has finished" : reason ? reason : "the job ended");
  double now = loop_now_mono();
  if (j->ranks && j->nalive > 0 && sig) {
    send_kill(c, j, sig);
    j->kill_at = sig == SIGKILL ? 0 : now + KILL_GRACE_S;
  } else if (j->nalive > 0) {
    j->kill_at = now + 10.0;   /* succeeded: they were told to stop; kill stragglers after 10 s */
  }
  return JOB_DRAINING;
}

/* The attempt failed (REASON names the rank): the job ends failed, or with restarts left waits for
 * its workers to be reaped and is queued again. */
static job_phase fail(coord_t *c, job_t *j, const char *reason) {
  /* Restart only what can continue: submit refuses max_restarts without checkpoints (ctl_submit). */
  if (j->attempt < j->spec.max_restarts && !c->shutting_down && j->spec.ckpt_every > 0 && j->spec.ckpt_dir[0] &&
      j->spec.resume == RESUME_AUTO) {
    char why[1200];
    j->attempt++;
    snprintf(why, sizeof why, "restart %d of %d from the newest checkpoint after: %s", j->attempt, j->spec.max_restarts,
             reason);
    record_state(c, j, ST_QUEUED, why);
    end_attempt(c, j, reason);
    if (j->ranks && j->nalive > 0) send_kill(c, j, SIGKILL);
    return JOB_RESTART_WAIT;
  }
  return finish(c, j, ST_FAILED, reason, SIGKILL);
}

/* A worker saves a checkpoint before it reports the step, so a rank that dies in between leaves a
 * complete checkpoint of a step the coordinator never recorded. Resuming from it would leave that
 * step out of metrics.jsonl for good: withdraw such checkpoints (their manifest, which is what
 * makes a checkpoint exist) so that the restart resumes from one whose steps are all recorded. */
typedef struct withdraw_args {
  const char *ckpt_dir;
  uint32_t done_step;
  int withdrawn[8];          /* the steps withdrawn, newest first (out) */
} withdraw_args;

static fsdp_status withdraw_as_owner(void *arg) {
  withdraw_args *a = arg;
  int s, k = 0;
  while (k < 8 && ckpt_latest(a->ckpt_dir, &s) == FSDP_OK && s > 0 && (uint32_t)s > a->done_step) {
    TRY(ckpt_withdraw(a->ckpt_dir, s));   /* never through a link (ckpt.h) */
    a->withdrawn[k++] = s;
  }
  return FSDP_OK;
}

static void withdraw_unrecorded_checkpoints(job_t *j) {
  if (!j->spec.ckpt_dir[0]) return;
  /* The checkpoint directory is the owner's: look at it and unlink there with the owner's rights. */
  withdraw_args a = {.ckpt_dir = j->spec.ckpt_dir, .done_step = j->sv.done_step};
  if (asuser_call(&j->owner, withdraw_as_owner, &a, &a, sizeof a) != FSDP_OK)
    log_warn("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
  for (int k = 0; k < 8 && a.withdrawn[k]; k++)
    job_log(j, "checkpoint of step %d withdrawn: the failed attempt recorded steps up to %u only (a rank died "
            "between saving it and reporting the step); the restart resumes from an earlier one", a.withdrawn[k], j->sv.done_step);
}

/* ---- the transitions: one function per (phase, event) pair that is not a no-op ---- */

typedef job_phase (*job_step_fn)(coord_t *c, job_t *j, const job_ev_args *a);

static job_phase on_start(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)a;
  JOB_ASSERT(j->ranks && j->nalive == 0);
  record_state(c, j, ST_STARTING, NULL);
  j->nready = j->nstopped = 0;
  j->deadline = loop_now_mono() + j->start_timeout;
  return JOB_STARTING;
}

static job_phase on_ready(coord_t *c, job_t *j, const job_ev_args *a) {
  JOB_ASSERT(j->ranks);
  rank_st *rk = &j->ranks[a->rank];
  if (rk->ready) return JOB_STARTING;
  if (j->nready > 0 && a->step != j->sv.start_step) {
    char why[256];
    snprintf(why, sizeof why, "rank %d starts at step %u but the others at step %u", a->rank, a->step, j->sv.start_step);
    return fail(c, j, why);
  }
  j->sv.start_step = a->step;
  rk->ready = 1;
  if (++j->nready < j->world) return JOB_STARTING;
  record_state(c, j, ST_RUNNING, NULL);   /* the step pipeline starts the steps (steps_on_ready) */
  j->deadline = loop_now_mono() + j->step_timeout;
  return JOB_RUNNING;
}

static job_phase on_recorded(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)c;
  JOB_ASSERT(a->step >= j->sv.done_step && a->step <= j->steps);
  j->sv.done_step = a->step;
  j->deadline = loop_now_mono() + j->step_timeout;
  return j->sv.done_step >= j->steps ? JOB_STOPPING : JOB_RUNNING;   /* the caller sends stop_cmd */
}

static job_phase on_stopped(coord_t *c, job_t *j, const job_ev_args *a) {
  JOB_ASSERT(j->ranks);
  rank_st *rk = &j->ranks[a->rank];
  if (!rk->stopped) rk->stopped = 1, j->nstopped++;
  if (j->nstopped < j->world) return JOB_STOPPING;
  if (j->stop_kind == JOB_STOP_SHUTDOWN) {
    char why[256];
    snprintf(why, sizeof why, "the daemon shut down after step %u, which saved a checkpoint; the job resumes from it",
             j->stop_at);
    return finish(c, j, ST_QUEUED, why, 0);
  }
  if (j->stop_kind == JOB_STOP_USER) {
    char why[PATH_MAX + 128];
    snprintf(why, sizeof why, "stopped by the user after step %u; its checkpoint is in %s", j->stop_at, j->spec.ckpt_dir);
    return finish(c, j, ST_CANCELLED, why, 0);
  }
  return finish(c, j, ST_SUCCEEDED, NULL, 0);
}

static job_phase on_error(coord_t *c, job_t *j, const job_ev_args *a) {
  JOB_ASSERT(j->ranks);
  j->ranks[a->rank].errored = 1;
  if (a->code != FSDP_ERR_COMM && a->code != FSDP_ERR_TIMEOUT) {
    char why[1200];
    snprintf(why, sizeof why, "rank %d failed: %s", a->rank, a->msg);
    return fail(c, j, why);
  }
  if (!j->pending[0]) {
    snprintf(j->pending, sizeof j->pending, "%s", a->msg);
    j->pending_rank = a->rank;
    j->pending_since = loop_now_mono();
    j->pending_until = j->pending_since + SECONDARY_GRACE_S;
  }
  return (job_phase)j->phase;
}

/* A rank exited (the facts are applied): after the stop, a clean exit is as good as its ack; the
 * rank that reported a communication error is leaving (steps_check waits for the cause); else the
 * attempt fails. */
static job_phase on_exit_live(coord_t *c, job_t *j, const job_ev_args *a) {
  JOB_ASSERT(j->ranks);
  const rank_st *rk = &j->ranks[a->rank];
  int clean = a->status == 0 && a->signal == 0;
  if (j->phase == JOB_STOPPING && clean && !rk->stopped) return on_stopped(c, j, a);
  if (rk->errored && j->pending[0] && !a->signal) return (job_phase)j->phase;
  if (rk->stopped) return (job_phase)j->phase;
  return fail(c, j, a->msg ? a->msg : "a rank exited");
}

static job_phase on_fail(coord_t *c, job_t *j, const job_ev_args *a) { return fail(c, j, a->msg); }

static job_phase on_unfit(coord_t *c, job_t *j, const job_ev_args *a) { return finish(c, j, ST_FAILED, a->msg, 0); }

static job_phase on_cancel(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)a;
  return finish(c, j, ST_CANCELLED, "cancelled by the user", SIGTERM);
}

/* A stop that checkpoints needs a running job that makes checkpoints (the shutdown's only a
 * [checkpoint] dir: the worker saves where the step says so, and resumes from dir) with a step
 * not yet sent: the next one carries the checkpoint flag and ends the job. */
static int set_stop(job_t *j, int kind) {
  if ((j->phase != JOB_RUNNING && j->phase != JOB_STOPPING) || (j->spec.ckpt_every <= 0 && kind != JOB_STOP_SHUTDOWN) ||
      !j->spec.ckpt_dir[0])
    return 0;
  if (j->stop_at) return 1;   /* already stopping */
  if (j->phase == JOB_STOPPING || j->sv.next_step > j->steps) return 0;   /* every step is sent: the last one checkpoints anyway */
  j->stop_at = j->sv.next_step;
  j->stop_kind = kind;
  j->steps = j->stop_at;
  job_log(j, "stop requested: stopping after step %u, which saves a checkpoint", j->stop_at);
  log_info("job %llu: stop requested; stopping after step %u with a checkpoint", (unsigned long long)j->id, j->stop_at);
  return 1;
}

static job_phase on_user_stop(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)a;
  if (set_stop(j, JOB_STOP_USER)) return (job_phase)j->phase;   /* the caller grants the stop's step (steps_stop) */
  return finish(c, j, ST_CANCELLED, "stopped by the user", SIGTERM);
}

/* At the daemon's shutdown: keep the job for the next start. A running job with a [checkpoint] dir
 * and resume = auto stops at the next step, which saves a checkpoint, and is then recorded queued
 * (on_stopped); any other's workers get SIGTERM and it is recorded queued at once, to resume from
 * its newest checkpoint or start over. */
static job_phase on_shutdown(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)a;
  if (j->phase == JOB_RUNNING && (j->stop_at || j->sv.next_step > j->steps))
    return JOB_RUNNING;   /* ending on its own (a stop, or its last step is sent): coord_shutdown's deadline bounds it */
  if (j->spec.resume == RESUME_AUTO && set_stop(j, JOB_STOP_SHUTDOWN)) return JOB_RUNNING;
  if (j->spec.resume == RESUME_AUTO && j->spec.ckpt_dir[0])
    return finish(c, j, ST_QUEUED, "the daemon shut down; the job resumes from its newest checkpoint", SIGTERM);
  return finish(c, j, ST_QUEUED, "the daemon shut down; the job has no checkpoint to resume from and starts over", SIGTERM);
}

/* Queued: its record already says so; only memory is let go (job_reap_drained frees it). */
static job_phase on_shutdown_queued(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)c, (void)a;
  j->drain_until = loop_now_mono();
  return JOB_DRAINING;
}

static job_phase on_shutdown_restart(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)a;   /* queued in the record already; its workers are being killed */
  return finish(c, j, ST_QUEUED, "the daemon shut down before the restart; the job resumes from its newest checkpoint", 0);
}

static job_phase on_shutdown_late(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)a;
  return finish(c, j, ST_QUEUED, "the daemon shut down before the job's checkpoint was saved; it resumes from its "
                "newest checkpoint", SIGKILL);
}

static job_phase on_tick_draining(coord_t *c, job_t *j, const job_ev_args *a) {
  if (j->kill_at && a->now > j->kill_at) {
    send_kill(c, j, SIGKILL);
    j->kill_at = 0;
  }
  return JOB_DRAINING;
}

/* The failed attempt's workers are all reaped (or the drain limit passed): free its devices and
 * per-attempt state; the job is queued (its record already says so) and schedule_try starts it. */
static job_phase on_reaped_restart(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)a;
  withdraw_unrecorded_checkpoints(j);
  if (j->ranks)
    for (int r = 0; r < j->world; r++) free_slot(c, j, r);
  if (j->nalive > 0)
    log_warn("job %llu: %d workers of the failed attempt did not report their exit within %.0f s; restarting anyway",
             (unsigned long long)j->id, j->nalive, DRAIN_LIMIT_S);
  free(j->ranks);
  j->ranks = NULL;
  planmsg_destroy(&j->plan_pb);
  j->nready = j->nstopped = j->nalive = 0;
  j->sv.start_step = j->sv.next_step = j->sv.done_step = 0;
  j->kill_at = 0;
  return JOB_QUEUED;
}

static job_phase on_reaped_drained(coord_t *c, job_t *j, const job_ev_args *a) {
  (void)a;
  if (j->ranks)
    for (int r = 0; r < j->world; r++) free_slot(c, j, r);
  if (j->nalive > 0)
    log_warn("job %llu: %d workers did not report their exit within %.0f s; their devices are freed anyway",
             (unsigned long long)j->id, j->nalive, DRAIN_LIMIT_S);
  return JOB_DONE;
}

/* One cell: a transition, or why the event changes nothing in that phase. */
typedef struct job_cell {
  job_step_fn fn;
  const char *noop;
} job_cell;

#define T(f) {f, NULL}
#define N(why) {NULL, why}
#define NO_WORKERS N("the job has no workers")
#define STALE N("an echo of the attempt that ended: never held against the next one")
#define ENDED N("the job has ended")
#define NOT_DUE N("nothing is due in this phase")

static const job_cell table[JOB_PHASES][JOB_EVENTS] = {
  [JOB_QUEUED] = {
    [JE_START] = T(on_start), [JE_RANK_READY] = NO_WORKERS, [JE_STEP_RECORDED] = NO_WORKERS,
    [JE_RANK_STOPPED] = NO_WORKERS, [JE_WORKER_ERROR] = NO_WORKERS, [JE_WORKER_EXIT] = NO_WORKERS,
    [JE_DEADLINE] = N("a queued job has no deadline"), [JE_NODE_LOST] = NO_WORKERS, [JE_FAIL] = T(on_fail),
    [JE_UNFIT] = T(on_unfit), [JE_USER_STOP] = T(on_user_stop), [JE_CANCEL] = T(on_cancel),
    [JE_SHUTDOWN] = T(on_shutdown_queued), [JE_SHUTDOWN_LATE] = T(on_shutdown_queued), [JE_TICK] = NOT_DUE,
    [JE_REAPED] = N("nothing to reap"),
  },
  [JOB_STARTING] = {
    [JE_START] = N("already started"), [JE_RANK_READY] = T(on_ready), [JE_STEP_RECORDED] = N("no step is granted yet"),
    [JE_RANK_STOPPED] = N("no stop was sent"), [JE_WORKER_ERROR] = T(on_error), [JE_WORKER_EXIT] = T(on_exit_live),
    [JE_DEADLINE] = T(on_fail), [JE_NODE_LOST] = T(on_fail), [JE_FAIL] = T(on_fail),
    [JE_UNFIT] = N("only a queued job waits for devices"), [JE_USER_STOP] = T(on_user_stop), [JE_CANCEL] = T(on_cancel),
    [JE_SHUTDOWN] = T(on_shutdown), [JE_SHUTDOWN_LATE] = T(on_shutdown_late), [JE_TICK] = NOT_DUE,
    [JE_REAPED] = N("its workers count until the attempt ends"),
  },
  [JOB_RUNNING] = {
    [JE_START] = N("already started"), [JE_RANK_READY] = N("every rank is ready already"),
    [JE_STEP_RECORDED] = T(on_recorded), [JE_RANK_STOPPED] = N("no stop was sent"), [JE_WORKER_ERROR] = T(on_error),
    [JE_WORKER_EXIT] = T(on_exit_live), [JE_DEADLINE] = T(on_fail), [JE_NODE_LOST] = T(on_fail), [JE_FAIL] = T(on_fail),
    [JE_UNFIT] = N("only a queued job waits for devices"), [JE_USER_STOP] = T(on_user_stop), [JE_CANCEL] = T(on_cancel),
    [JE_SHUTDOWN] = T(on_shutdown), [JE_SHUTDOWN_LATE] = T(on_shutdown_late), [JE_TICK] = NOT_DUE,
    [JE_REAPED] = N("its workers count until the attempt ends"),
  },
  [JOB_STOPPING] = {
    [JE_START] = N("already started"), [JE_RANK_READY] = N("every rank is ready already"),
    [JE_STEP_RECORDED] = N("every step is recorded"), [JE_RANK_STOPPED] = T(on_stopped), [JE_WORKER_ERROR] = T(on_error),
    [JE_WORKER_EXIT] = T(on_exit_live), [JE_DEADLINE] = T(on_fail), [JE_NODE_LOST] = T(on_fail), [JE_FAIL] = T(on_fail),
    [JE_UNFIT] = N("only a queued job waits for devices"),
    [JE_USER_STOP] = T(on_user_stop), [JE_CANCEL] = T(on_cancel),
    [JE_SHUTDOWN] = N("ending on its own: coord_shutdown's deadline bounds it"), [JE_SHUTDOWN_LATE] = T(on_shutdown_late),
    [JE_TICK] = NOT_DUE, [JE_REAPED] = N("its workers count until the attempt ends"),
  },
  [JOB_RESTART_WAIT] = {
    [JE_START] = N("its workers are not reaped yet"), [JE_RANK_READY] = STALE, [JE_STEP_RECORDED] = STALE,
    [JE_RANK_STOPPED] = STALE, [JE_WORKER_ERROR] = STALE, [JE_WORKER_EXIT] = STALE, [JE_DEADLINE] = STALE,
    [JE_NODE_LOST] = N("the attempt has failed already"), [JE_FAIL] = N("the attempt has failed already"),
    [JE_UNFIT] = N("not waiting for devices yet"), [JE_USER_STOP] = T(on_cancel), [JE_CANCEL] = T(on_cancel),
    [JE_SHUTDOWN] = T(on_shutdown_restart), [JE_SHUTDOWN_LATE] = T(on_shutdown_restart), [JE_TICK] = NOT_DUE,
    [JE_REAPED] = T(on_reaped_restart),
  },
  [JOB_DRAINING] = {
    [JE_START] = ENDED, [JE_RANK_READY] = ENDED, [JE_STEP_RECORDED] = ENDED, [JE_RANK_STOPPED] = ENDED,
    [JE_WORKER_ERROR] = ENDED, [JE_WORKER_EXIT] = ENDED, [JE_DEADLINE] = ENDED, [JE_NODE_LOST] = ENDED, [JE_FAIL] = ENDED,
    [JE_UNFIT] = ENDED, [JE_USER_STOP] = ENDED, [JE_CANCEL] = ENDED, [JE_SHUTDOWN] = ENDED, [JE_SHUTDOWN_LATE] = ENDED,
    [JE_TICK] = T(on_tick_draining), [JE_REAPED] = T(on_reaped_drained),
  },
};

const char *job_phase_name(job_phase p) {
  static const char *const names[JOB_PHASES] = {"queued", "starting", "running", "stopping", "restart_wait", "draining",
                                                "done"};
  return p >= 0 && p < JOB_PHASES ? names[p] : "?";
}

const char *job_ev_name(job_ev ev) {
  static const char *const names[JOB_EVENTS] = {
      "start", "rank_ready", "step_recorded", "rank_stopped", "worker_error", "worker_exit", "deadline", "node_lost",
      "fail", "unfit", "user_stop", "cancel", "shutdown", "shutdown_late", "tick", "reaped"};
  return ev >= 0 && ev < JOB_EVENTS ? names[ev] : "?";
}

void job_assert_failed(const char *what, const char *file, int line) {
  log_error("job lifecycle: invariant %s does not hold (%s:%d)", what, file, line);
  abort();
}

/* The facts an event carries hold whatever the phase: a rank that exited, or whose node was lost,
 * is no longer alive and its device is free. */
static void apply_facts(coord_t *c, job_t *j, job_ev ev, const job_ev_args *a) {
  if (ev == JE_WORKER_EXIT && j->ranks && j->ranks[a->rank].alive) {   /* a second report of it changes nothing */
    j->ranks[a->rank].alive = 0;
    j->nalive--;
    free_slot(c, j, a->rank);
  } else if (ev == JE_NODE_LOST && j->ranks) {
    for (int r = 0; r < j->world; r++) {
      if (j->ranks[r].node != a->node || !j->ranks[r].alive) continue;
      j->ranks[r].alive = 0;
      j->nalive--;
      free_slot(c, j, r);
    }
  }
}

/* What each phase promises (job.h); checked after every event. */
static void check_invariants(const job_t *j) {
  JOB_ASSERT(j->phase >= JOB_QUEUED && j->phase < JOB_PHASES);
  JOB_ASSERT(j->nalive >= 0 && j->nalive <= (j->ranks ? j->world : 0));
  JOB_ASSERT(j->nstopped >= 0 && j->nstopped <= j->world && j->nready >= 0 && j->nready <= j->world);
  JOB_ASSERT(!j->stop_at || (j->stop_kind != JOB_STOP_NONE && j->stop_at == j->steps));
  switch ((job_phase)j->phase) {
  case JOB_QUEUED: JOB_ASSERT(j->nalive == 0 && !j->sv.win && !j->sv.metrics); break;
  case JOB_STARTING: JOB_ASSERT(j->ranks && j->deadline > 0 && !j->sv.win); break;
  case JOB_RUNNING: JOB_ASSERT(j->ranks && j->nready == j->world && j->deadline > 0); break;
  case JOB_STOPPING: JOB_ASSERT(j->ranks && j->sv.done_step >= j->steps && j->nstopped < j->world); break;
  case JOB_RESTART_WAIT:
  case JOB_DRAINING: JOB_ASSERT(!j->sv.win && !j->sv.metrics && !j->deadline && !j->pending[0]); break;
  case JOB_DONE: JOB_ASSERT(!j->sv.win && !j->sv.metrics); break;
  case JOB_PHASES: break;
  }
}

job_phase job_event(coord_t *c, job_t *j, job_ev ev, const job_ev_args *args) {
  static const job_ev_args none = {.rank = -1, .node = -1};
  const job_ev_args *a = args ? args : &none;
  JOB_ASSERT(ev >= 0 && ev < JOB_EVENTS);
  JOB_ASSERT(j->phase != JOB_DONE);   /* a done job is freed at once: nothing may still hold it */
  int ranked = ev == JE_RANK_READY || ev == JE_RANK_STOPPED || ev == JE_WORKER_ERROR || ev == JE_WORKER_EXIT;
  JOB_ASSERT(!ranked || !j->ranks || (a->rank >= 0 && a->rank < j->world));
  apply_facts(c, j, ev, a);
  job_phase from = (job_phase)j->phase;
  const job_cell *cell = &table[from][ev];
  if (!cell->fn) {
    log_debug("job %llu: %s while %s: ignored (%s)", (unsigned long long)j->id, job_ev_name(ev), job_phase_name(from),
              cell->noop);
  } else {
    j->phase = cell->fn(c, j, a);
    if (j->phase != (int)from)
      log_debug("job %llu: %s: %s -> %s", (unsigned long long)j->id, job_ev_name(ev), job_phase_name(from),
                job_phase_name((job_phase)j->phase));
  }
  check_invariants(j);
  return (job_phase)j->phase;
}

const char *job_state_name(int state) {
  static const char *const names[] = {"?", "queued", "starting", "running", "succeeded", "failed", "cancelled"};
  return state >= ST_QUEUED && state <= ST_CANCELLED ? names[state] : names[0];
}

typedef struct parse_args {
  const char *text, *origin, *base_dir;
  jobspec_t *spec;
} parse_args;

/* The weights a job starts from must be its plan's model (every tensor, its shape): refused at submit,
 * not at the workers' load. Only names and shapes are compared, which no sharding changes: a plan of
 * sharding none stands in for the job's (a hybrid one's group is not known here). A spec that cannot
 * be planned is left to the job's own plan_build, which says why. */
static fsdp_status check_init(const jobspec_t *spec) {
  if (!strcmp(spec->init, "random")) return FSDP_OK;
  jobspec_t s = *spec;
  s.sharding = SHARD_NONE;
  s.shard_group = 0;
  plan_t *p = NULL;
  if (plan_build(&s, s.world_size, &p) != FSDP_OK) return FSDP_OK;
  fsdp_status rc = st_model_check_path(spec->init, p);
  plan_destroy(&p);
  return rc;
}

/* Every look at the job's files, in one child with the owner's rights: the parse (the paths it names,
 * from = DIR's config.json) and the weights' check (init, an index and its shards), so that root never
 * opens them and a refusal says only what the owner could see anyway. */
static fsdp_status parse_as_owner(void *arg) {
  parse_args *a = arg;
  TRY(jobspec_parse(a->text, a->origin, a->base_dir, a->spec));
  return check_init(a->spec);
}

fsdp_status job_row_owner(const jobs_db_row *row, peer_t *out) {
  uid_t self = geteuid();
  return peer_from_uid(row->owner_uid >= 0 ? (uid_t)row->owner_uid : self, self, out);
}

fsdp_status job_from_spec(const coord_t *c, const char *spec_text, const char *spec_path, const char *base_dir,
                          const peer_t *owner, unsigned umask, job_t **out) {
  *out = NULL;
  job_t *j = calloc(1, sizeof *j);
  if (!j) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  fsdp_status rc;
  j->spec_text = strdup(spec_text);
  j->spec_path = strdup(spec_path);
  j->base_dir = strdup(base_dir);
  if (!j->spec_text || !j->spec_path || !j->base_dir) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
    goto fail;
  }
  j->owner = *owner;
  j->umask = umask & 0777;
  parse_args pa = {spec_text, *spec_path ? spec_path : "<submitted job>", base_dir, &j->spec};
  TRY_GOTO(asuser_call(owner, parse_as_owner, &pa, &j->spec, sizeof j->spec), rc, fail);
  TRY_GOTO(jobspec_check_build(&j->spec), rc, fail);   /* a CUDA job needs a CUDA build */
  j->kind = j->spec.device == DEVICE_CUDA ? FSDP__DEVICE_KIND__DEVICE_KIND_CUDA : FSDP__DEVICE_KIND__DEVICE_KIND_CPU;
  /* the rest of the resolution (jobresolve.h): hybrid's default shard_group is the ranks per node of
   * the cluster, here for the fit check and again when the job starts (schedule_regroup). With no node
   * registered yet (the queue reloaded at a restart, before the agents are back) 1 holds its place. */
  j->auto_group = j->spec.sharding == SHARD_HYBRID && j->spec.shard_group == 0;
  int g = j->auto_group ? coord_ranks_per_node(c, j->kind, j->spec.world_size) : 0;
  jobresolve_place pl = {.world = j->spec.world_size, .ranks_per_node = g > 0 ? g : 1};
  if ((rc = jobresolve_place_job(&j->spec, &pl, &j->plan)) != FSDP_OK) {
    if (j->auto_group) {
      char why[512];
      snprintf(why, sizeof why, "%s", fsdp_last_error());
      fsdp_set_error(rc, "sharding = hybrid without shard_group takes the ranks per node of the cluster (%d %s on the "
                     "largest node here): %s", pl.ranks_per_node, coord_kind_name(j->kind), why);
    }
    goto fail;
  }
  char *canon = NULL;   /* what every worker_setup carries (on_worker_hello): refused here, not there */
  TRY_GOTO(jobspec_canonical_write(&j->spec, &canon), rc, fail);
  free(canon);
  j->world = j->spec.world_size;
  j->steps = (uint32_t)j->spec.steps;
  j->state = ST_QUEUED;
  j->phase = JOB_QUEUED;
  *out = j;
  return FSDP_OK;
fail:
  job_destroy(&j);
  return rc;
}

/* Before the jobs that were running when the daemon died are failed: a job whose every step is
 * recorded finished its work, and only its final state was lost (the database refused it, most
 * often a full disk, until the daemon stopped): it succeeded. The others' job.log says why they
 * fail. */
static void settle_started_jobs(coord_t *c) {
  jobs_db_row *rows = NULL;
  size_t n = 0;
  if (jobs_db_list(c->db, 0, &rows, &n) != FSDP_OK) return;
  for (size_t i = 0; i < n; i++) {
    jobs_db_row *r = &rows[i];
    if (r->state != ST_STARTING && r->state != ST_RUNNING) continue;
    if (r->steps > 0 && r->step >= r->steps) {
      if (jobs_db_set_state(c->db, r->id, ST_SUCCEEDED, NULL, loop_now_wall()) != FSDP_OK) {
        log_error("job %llu: cannot record state succeeded: %s", (unsigned long long)r->id, fsdp_last_error());
        continue;
      }
      if (*r->job_dir)
        coord_job_log(r->job_dir, "succeeded: all %d steps were recorded before the daemon stopped (its final state "
                      "was not: the database refused it)", r->steps);
      log_info("job %llu succeeded: all %d steps were recorded before the daemon stopped", (unsigned long long)r->id, r->steps);
    } else if (*r->job_dir) {
      coord_job_log(r->job_dir, "failed: daemon restarted (it was %s at step %d)", job_state_name(r->state), r->step);
    }
  }
  jobs_db_rows_destroy(&rows, n);
}

/* Jobs that were queued when the daemon stopped are queued again, in their order. */
static void requeue(coord_t *c) {
  jobs_db_row *rows = NULL;
  size_t n = 0;
  if (jobs_db_list(c->db, 0, &rows, &n) != FSDP_OK) {
    log_error("cannot list the queued jobs: %s", fsdp_last_error());
    return;
  }
  for (size_t i = n; i-- > 0;) {   /* newest first in the list: walk it backwards */
    jobs_db_row *r = &rows[i];
    if (r->state != ST_QUEUED) continue;
    job_t *j = NULL;
    peer_t owner;
    if (job_row_owner(r, &owner) != FSDP_OK ||
        job_from_spec(c, r->spec_text, r->spec_path, r->base_dir, &owner, (unsigned)r->umask, &j) != FSDP_OK) {
      char reason[1200];
      snprintf(reason, sizeof reason, "cannot queue again after a daemon restart: %s", fsdp_last_error());
      if (jobs_db_set_state(c->db, r->id, ST_FAILED, reason, loop_now_wall()) != FSDP_OK)
        log_error("job %llu: cannot record state failed: %s", (unsigned long long)r->id, fsdp_last_error());
      coord_job_log(r->job_dir, "failed: %s", reason);
      log_warn("job %llu failed: %s", (unsigned long long)r->id, reason);
      continue;
    }
    j->id = r->id;
    snprintf(j->job_dir, sizeof j->job_dir, "%s", r->job_dir);
    j->next = c->jobs;
    c->jobs = j;
    job_log(j, "queued again after a daemon restart");
    log_info("job %llu (%s) queued again after the restart", (unsigned long long)j->id, j->spec.name);
  }
  jobs_db_rows_destroy(&rows, n);
}

fsdp_status job_recover(coord_t *c) {
  int nfail = 0;
  settle_started_jobs(c);
  TRY(jobs_db_fail_started(c->db, "daemon restarted", loop_now_wall(), &nfail));
  if (nfail) log_warn("%d jobs were running when the daemon stopped; marked failed ('daemon restarted')", nfail);
  requeue(c);
  return FSDP_OK;
}
