/* job — see job.h. */
#include "job.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "asuser.h"
#include "jobresolve.h"
#include "ckpt.h"
#include "fsutil.h"
#include "kv.h"
#include "log.h"
#include "steps.h"
#include "planmsg.h"
#include "schedule.h"
#include "steps.h"

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

void job_set_state(coord_t *c, job_t *j, int state, const char *reason) {
  j->state = state;
  if (promx_set_state(&j->px, j->id, j->spec.name, state) != FSDP_OK) log_warn("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
  coord_publish_metrics(c);
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

void job_free_reports(job_t *j) { steps_free(j); }

void job_destroy(job_t **jp) {
  if (!jp || !*jp) return;
  job_t *j = *jp;
  *jp = NULL;
  job_free_reports(j);
  if (j->metrics) fclose(j->metrics);
  promx_job_free(&j->px);
  plan_destroy(&j->plan);
  planmsg_destroy(&j->plan_pb);
  free(j->ranks);
  free(j->spec_text);
  free(j->spec_path);
  free(j->base_dir);
  free(j);
}

void job_free_slot(coord_t *c, job_t *j, int r) {
  rank_st *rk = &j->ranks[r];
  if (rk->node < 0) return;
  node_t *n = &c->nodes[rk->node];
  slot_t *s = &n->slots[rk->slot];
  if (s->job_id == j->id && s->rank == (uint32_t)r) s->job_id = 0;
  rk->node = -1;
}

void job_send_kill(coord_t *c, job_t *j, int sig) {
  /* One kill_req per node that still runs ranks of this job. */
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
  if (j->metrics) fclose(j->metrics);
  j->metrics = NULL;
  int fd;
  if (fsutil_open_append(AT_FDCWD, path, path, 0644, &fd) != FSDP_OK) {
    log_warn("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
    return;
  }
  if (!(j->metrics = fdopen(fd, "a"))) {
    log_warn("job %llu: cannot open %s: %s", (unsigned long long)j->id, path, strerror(errno));
    close(fd);
  }
}

static void job_reset_attempt(coord_t *c, job_t *j);

/* Jobs are freed only here, at the end of a loop callback, never while a handler still holds a
 * pointer to one. */
void job_reap_drained(coord_t *c) {
  double now = loop_now_mono();
  int reaped = 0;
  for (job_t **p = &c->jobs; *p;) {
    job_t *j = *p;
    if (!j->done && j->restart_pending && (j->nalive == 0 || now > j->drain_until)) {
      job_reset_attempt(c, j);
      reaped = 1;
    }
    if (!j->done || (j->nalive > 0 && now <= j->drain_until)) {
      p = &j->next;
      continue;
    }
    if (j->ranks)
      for (int r = 0; r < j->world; r++) job_free_slot(c, j, r);
    if (j->nalive > 0)
      log_warn("job %llu: %d workers did not report their exit within %.0f s; their devices are freed anyway",
               (unsigned long long)j->id, j->nalive, DRAIN_LIMIT_S);
    *p = j->next;
    promx_retire(&c->px_done, &j->px, now);   /* its final figures stay visible a while */
    job_destroy(&j);
    reaped = 1;
  }
  if (reaped) schedule_try(c);
}

void job_finish(coord_t *c, job_t *j, int state, const char *reason, int sig) {
  if (j->done) return;
  j->done = 1;
  job_set_state(c, j, state, reason);
  kv_drop_job(c, j->id, state == ST_SUCCEEDED ? "the job has finished" : reason ? reason : "the job ended");
  if (j->metrics) {
    fclose(j->metrics);
    j->metrics = NULL;
  }
  job_free_reports(j);
  double now = loop_now_mono();
  j->deadline = 0;
  j->drain_until = now + DRAIN_LIMIT_S;
  if (j->ranks && j->nalive > 0 && sig) {
    job_send_kill(c, j, sig);
    j->kill_at = sig == SIGKILL ? 0 : now + KILL_GRACE_S;
  } else if (j->nalive > 0) {
    j->kill_at = now + 10.0;   /* succeeded: they were told to stop; kill stragglers after 10 s */
  }
}

void job_fail(coord_t *c, job_t *j, const char *fmt, ...) {
  if (j->done || j->restart_pending) return;   /* already ending, or this attempt already failed */
  char reason[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  /* Restart only what can continue: submit refuses max_restarts without checkpoints (ctl_submit). */
  if (j->attempt < j->spec.max_restarts && !c->shutting_down && j->spec.ckpt_every > 0 &&
      j->spec.ckpt_dir[0] && j->spec.resume == RESUME_AUTO) {
    char why[1200];
    j->attempt++;
    snprintf(why, sizeof why, "restart %d of %d from the newest checkpoint after: %s", j->attempt, j->spec.max_restarts,
             reason);
    j->restart_pending = 1;
    job_set_state(c, j, ST_QUEUED, why);
    kv_drop_job(c, j->id, reason);
    job_free_reports(j);
    if (j->metrics) {
      fclose(j->metrics);
      j->metrics = NULL;
    }
    j->deadline = 0;
    j->pending[0] = 0;
    j->drain_until = loop_now_mono() + DRAIN_LIMIT_S;
    if (j->ranks && j->nalive > 0) job_send_kill(c, j, SIGKILL);
    return;
  }
  job_finish(c, j, ST_FAILED, reason, SIGKILL);
}

/* The failed attempt's workers are all reaped (or the drain limit passed): free its devices and
 * per-attempt state; the job is queued (its state already says so) and try_schedule starts it. */
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
  withdraw_args a = {.ckpt_dir = j->spec.ckpt_dir, .done_step = j->done_step};
  if (asuser_call(&j->owner, withdraw_as_owner, &a, &a, sizeof a) != FSDP_OK)
    log_warn("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
  for (int k = 0; k < 8 && a.withdrawn[k]; k++)
    job_log(j, "checkpoint of step %d withdrawn: the failed attempt recorded steps up to %u only (a rank died "
            "between saving it and reporting the step); the restart resumes from an earlier one", a.withdrawn[k], j->done_step);
}

static void job_reset_attempt(coord_t *c, job_t *j) {
  withdraw_unrecorded_checkpoints(j);
  if (j->ranks)
    for (int r = 0; r < j->world; r++) job_free_slot(c, j, r);
  if (j->nalive > 0)
    log_warn("job %llu: %d workers of the failed attempt did not report their exit within %.0f s; restarting anyway",
             (unsigned long long)j->id, j->nalive, DRAIN_LIMIT_S);
  job_free_reports(j);
  free(j->ranks);
  j->ranks = NULL;
  planmsg_destroy(&j->plan_pb);
  j->nready = j->nstopped = j->nalive = 0;
  j->start_step = j->next_step = j->done_step = 0;
  j->kill_at = 0;
  j->pending[0] = 0;
  j->restart_pending = 0;
}

void job_check_stopped(coord_t *c, job_t *j) {
  if (j->done || j->restart_pending || j->nstopped != j->world) return;
  if (j->stop_at && j->stop_for_shutdown) {
    char why[256];
    snprintf(why, sizeof why, "the daemon shut down after step %u, which saved a checkpoint; the job resumes from it",
             j->stop_at);
    job_finish(c, j, ST_QUEUED, why, 0);
  } else if (j->stop_at) {
    char why[PATH_MAX + 128];
    snprintf(why, sizeof why, "stopped by the user after step %u; its checkpoint is in %s", j->stop_at, j->spec.ckpt_dir);
    job_finish(c, j, ST_CANCELLED, why, 0);
  } else {
    job_finish(c, j, ST_SUCCEEDED, NULL, 0);
  }
}

/* The queued job's record already says queued: only memory is let go. */
static void drop_queued(coord_t *c, job_t *j) {
  for (job_t **p = &c->jobs; *p; p = &(*p)->next)
    if (*p == j) {
      *p = j->next;
      break;
    }
  job_destroy(&j);
}

void job_shutdown(coord_t *c, job_t *j) {
  if (j->done) return;
  if (j->restart_pending) {   /* queued in the record already; its workers are being killed */
    job_finish(c, j, ST_QUEUED, "the daemon shut down before the restart; the job resumes from its newest checkpoint", 0);
    return;
  }
  if (j->state == ST_QUEUED) {
    drop_queued(c, j);
    return;
  }
  if (j->stop_at || (j->state == ST_RUNNING && j->next_step > j->steps))
    return;   /* ending on its own (a stop, or its last step is sent): coord_shutdown's deadline bounds it */
  if (j->spec.resume == RESUME_AUTO) {
    /* a shutdown's stop needs only [checkpoint] dir (steps_stop); job_check_stopped queues the job
     * once the checkpoint of its last step is saved */
    j->stop_for_shutdown = 1;
    if (steps_stop(c, j)) return;
    j->stop_for_shutdown = 0;
  }
  if (j->spec.resume == RESUME_AUTO && j->spec.ckpt_dir[0])
    job_finish(c, j, ST_QUEUED, "the daemon shut down; the job resumes from its newest checkpoint", SIGTERM);
  else
    job_finish(c, j, ST_QUEUED, "the daemon shut down; the job has no checkpoint to resume from and starts over", SIGTERM);
}

const char *job_state_name(int state) {
  static const char *const names[] = {"?", "queued", "starting", "running", "succeeded", "failed", "cancelled"};
  return state >= ST_QUEUED && state <= ST_CANCELLED ? names[state] : names[0];
}

typedef struct parse_args {
  const char *text, *origin, *base_dir;
  jobspec_t *spec;
} parse_args;

static fsdp_status parse_as_owner(void *arg) {
  parse_args *a = arg;
  return jobspec_parse(a->text, a->origin, a->base_dir, a->spec);
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
  int g = j->auto_group ? schedule_ranks_per_node(c, j->kind, j->spec.world_size) : 0;
  jobresolve_place pl = {.world = j->spec.world_size, .ranks_per_node = g > 0 ? g : 1};
  if ((rc = jobresolve_place_job(&j->spec, &pl, &j->plan)) != FSDP_OK) {
    if (j->auto_group) {
      char why[512];
      snprintf(why, sizeof why, "%s", fsdp_last_error());
      fsdp_set_error(rc, "sharding = hybrid without shard_group takes the ranks per node of the cluster (%d %s on the "
                     "largest node here): %s", pl.ranks_per_node, schedule_kind_name(j->kind), why);
    }
    goto fail;
  }
  char *canon = NULL;   /* what every worker_setup carries (on_worker_hello): refused here, not there */
  TRY_GOTO(jobspec_canonical_write(&j->spec, &canon), rc, fail);
  free(canon);
  j->world = j->spec.world_size;
  j->steps = (uint32_t)j->spec.steps;
  j->state = ST_QUEUED;
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
