/* job_read — the job's read accessors and its admission (job.h). Loop thread only. */
#include "job_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <zmq.h>

#include "log.h"
#include "metricsrv.h"
#include "planmsg.h"

job_phase job_phase_of(const job_t *j) { return (job_phase)j->phase; }
int job_live(const job_t *j) { return j->phase == JOB_STARTING || j->phase == JOB_RUNNING || j->phase == JOB_STOPPING; }
int job_ended(const job_t *j) { return j->phase >= JOB_DRAINING; }
job_t *job_next(const job_t *j) { return j->next; }
uint64_t job_id(const job_t *j) { return j->id; }
int job_state(const job_t *j) { return j->state; }
const char *job_reason(const job_t *j) { return j->reason; }
int job_world(const job_t *j) { return j->world; }
int job_kind(const job_t *j) { return j->kind; }
const char *job_name(const job_t *j) { return j->spec.name; }
const char *job_dir_of(const job_t *j) { return j->job_dir; }
const jobspec_t *job_spec(const job_t *j) { return &j->spec; }
const char *job_spec_path(const job_t *j) { return j->spec_path; }
const plan_t *job_plan(const job_t *j) { return j->plan; }
Fsdp__Plan *job_plan_msg(const job_t *j) { return j->plan_pb; }
const char *job_token(const job_t *j) { return j->token; }
const char *job_kv_prefix(const job_t *j) { return j->kv_prefix; }
const peer_t *job_owner(const job_t *j) { return &j->owner; }
uint32_t job_start_step(const job_t *j) { return j->sv.start_step; }
uint32_t job_next_step(const job_t *j) { return j->sv.next_step; }
uint32_t job_done_step(const job_t *j) { return j->sv.done_step; }
const Fsdp__CkptSave *job_last_ckpt(const job_t *j) { return &j->sv.ckpt; }
const promx_job *job_promx(const job_t *j) { return j->sv.px; }

const rank_st *job_rank(const job_t *j, int r) {
  return j->ranks && r >= 0 && r < j->world ? &j->ranks[r] : NULL;
}

void job_rank_set_ident(job_t *j, int r, const uint8_t *ident, size_t len) {
  JOB_ASSERT(j->ranks && r >= 0 && r < j->world && len <= sizeof j->ranks[r].ident);
  memcpy(j->ranks[r].ident, ident, len);
  j->ranks[r].ident_len = len;
}

void job_node_dropped(job_t *j, int node) {
  for (int r = 0; j->ranks && r < j->world; r++)
    if (j->ranks[r].node > node) j->ranks[r].node--;
}

fsdp_status job_promx_ensure(job_t *j) {
  return j->sv.px ? FSDP_OK : promx_set_state(&j->sv.px, j->id, j->spec.name, j->state);
}

fsdp_status job_admit(coord_t *c, job_t *j) {
  JOB_ASSERT(j->id == 0 && j->phase == JOB_QUEUED);
  char jobs_parent[PATH_MAX + 16];
  snprintf(jobs_parent, sizeof jobs_parent, "%s/jobs", c->state_dir);
  jobs_db_row row = {.name = j->spec.name, .world = j->world, .device = j->kind, .steps = j->spec.steps,
                     .spec_text = j->spec_text, .spec_path = j->spec_path, .base_dir = j->base_dir, .job_dir = jobs_parent,
                     .owner_uid = j->owner.uid, .owner_gid = j->owner.gid, .owner = j->owner.name, .umask = (int)j->umask};
  /* The job directory is named by the id, which the insert assigns (jobs_db_insert appends it). */
  fsdp_status rc = jobs_db_insert(c->db, &row, loop_now_wall(), &j->id);
  if (rc != FSDP_OK) {
    log_error("submit: %s", fsdp_last_error());
    return rc;
  }
  snprintf(j->job_dir, sizeof j->job_dir, "%s/jobs/%llu", c->state_dir, (unsigned long long)j->id);
  char id[32];
  snprintf(id, sizeof id, "%llu", (unsigned long long)j->id);
  /* A new folder or none: an existing one (another job's, its id given again) is never appended to. */
  if (mkdirat(c->jobs_fd, id, 0755) != 0) {
    int e = errno;
    rc = fsdp_set_error(e == EEXIST ? FSDP_ERR_STATE : FSDP_ERR_IO, "cannot create the job's folder %s/jobs/%s: %s%s",
                        c->state_dir, id, strerror(e), e == EEXIST ? " (a job folder is never reused)" : "");
    log_error("job %s: %s", id, fsdp_last_error());
    jobs_db_set_state(c->db, j->id, ST_FAILED, fsdp_last_error(), loop_now_wall());
    return rc;
  }
  j->next = c->jobs;
  c->jobs = j;
  return FSDP_OK;
}

int job_auto_group(const job_t *j) { return j->auto_group; }
unsigned job_umask(const job_t *j) { return j->umask; }
double job_unfit_since(const job_t *j) { return j->unfit_since; }
void job_set_unfit_since(job_t *j, double since) { j->unfit_since = since; }

void job_swap_plan(job_t *j, plan_t **plan, int *shard_group) {
  plan_t *p = j->plan;
  int g = j->spec.shard_group;
  j->plan = *plan, j->spec.shard_group = *shard_group;
  *plan = p, *shard_group = g;
}

fsdp_status job_place_begin(job_t *j) {
  JOB_ASSERT(j->phase == JOB_QUEUED && !j->ranks);
  j->ranks = calloc((size_t)j->world, sizeof *j->ranks);
  return j->ranks ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "out of memory while starting the job");
}

void job_rank_place(job_t *j, int r, int node, int slot) {
  JOB_ASSERT(j->phase == JOB_QUEUED && j->ranks && r >= 0 && r < j->world);
  j->ranks[r].node = node;
  j->ranks[r].slot = slot;
}

void job_place_undo(job_t *j) {
  JOB_ASSERT(j->phase == JOB_QUEUED);
  free(j->ranks);
  j->ranks = NULL;
}

fsdp_status job_attempt_prepare(job_t *j) {
  JOB_ASSERT(j->phase == JOB_QUEUED && j->ranks);
  fsdp_status rc = planmsg_new(j->plan, &j->plan_pb);
  if (rc != FSDP_OK) return rc;
  uint8_t rnd[16];
  if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
    for (size_t i = 0; i < sizeof rnd; i++) rnd[i] = (uint8_t)(rand() ^ (int)(loop_now_mono() * 1e6));
  for (size_t i = 0; i < sizeof rnd; i++) sprintf(j->token + 2 * i, "%02x", rnd[i]);
  /* attempt 0 keeps the plain "job-ID/"; later attempts nest under it, so kv_drop_job drops them too */
  if (j->attempt == 0) snprintf(j->kv_prefix, sizeof j->kv_prefix, "job-%llu/", (unsigned long long)j->id);
  else snprintf(j->kv_prefix, sizeof j->kv_prefix, "job-%llu/a%d/", (unsigned long long)j->id, j->attempt);
  double t = 2 * j->spec.timeout_s;
  j->start_timeout = t > START_TIMEOUT_MIN_S ? t : START_TIMEOUT_MIN_S;
  j->step_timeout = t;   /* no step for 2 x timeout_s: every collective in it would have timed out by then */
  return FSDP_OK;
}

void job_rank_spawned(job_t *j, int r) {
  JOB_ASSERT(j->ranks && r >= 0 && r < j->world && !j->ranks[r].alive);
  j->ranks[r].alive = 1;
  j->nalive++;
}

job_steps_view *job_steps(job_t *j) { return &j->sv; }
const job_steps_view *job_steps_of(const job_t *j) { return &j->sv; }
uint32_t job_last_step(const job_t *j) { return j->steps; }
uint32_t job_stop_at(const job_t *j) { return j->stop_at; }
int job_attempt(const job_t *j) { return j->attempt; }
double job_deadline(const job_t *j) { return j->deadline; }
double job_start_timeout(const job_t *j) { return j->start_timeout; }
double job_step_timeout(const job_t *j) { return j->step_timeout; }

const char *job_held_error(const job_t *j, int *rank, double *since, double *until) {
  *rank = j->pending_rank, *since = j->pending_since, *until = j->pending_until;
  return j->pending[0] ? j->pending : NULL;
}

void job_held_error_defer(job_t *j, double until) {
  JOB_ASSERT(j->pending[0]);
  j->pending_until = until;
}

/* The coordinator's lookups and sends through its jobs, and its Prometheus text: here, in the job
 * module, so that coord_core needs nothing of a job. */
job_t *job_find(coord_t *c, uint64_t id) {
  for (job_t *j = c->jobs; j; j = job_next(j))
    if (job_id(j) == id) return j;
  return NULL;
}

job_t *job_find_worker(coord_t *c, const wire_env *env, int *rank) {
  if (env->n != 3 || env->len[1] == 0) return NULL;
  node_t *n = coord_find_node(c, env->data[0], env->len[0]);
  if (!n) return NULL;
  int ni = (int)(n - c->nodes);
  for (job_t *j = c->jobs; j; j = job_next(j)) {
    const rank_st *ranks = job_rank(j, 0);
    for (int r = 0; ranks && r < job_world(j); r++) {
      const rank_st *rk = &ranks[r];
      if (rk->node == ni && rk->ident_len == env->len[1] && !memcmp(rk->ident, env->data[1], env->len[1])) {
        *rank = r;
        return j;
      }
    }
  }
  return NULL;
}

void job_send_rank(coord_t *c, const job_t *j, int r, Fsdp__Msg *m) {
  const rank_st *rk = job_rank(j, r);
  if (!rk->ident_len || rk->node < 0) return;
  const node_t *n = &c->nodes[rk->node];
  wire_env env = {0};
  wire_env_push(&env, n->ident, n->ident_len);
  wire_env_push(&env, rk->ident, rk->ident_len);
  wire_env_push(&env, NULL, 0);
  fsdp_status rc = wire_send(c->cluster, &env, m, ZMQ_DONTWAIT);
  if (rc != FSDP_OK)
    log_warn("cannot send %s to job %llu rank %d: %s", wire_body_name(m->body_case), (unsigned long long)job_id(j), r,
             rc == FSDP_ERR_TIMEOUT ? "peer queue full" : fsdp_last_error());
}

fsdp_status job_render_metrics(const coord_t *c, char **text, size_t *len) {
  size_t njobs = 0, k = 0;
  for (const job_t *j = c->jobs; j; j = job_next(j)) njobs += job_promx(j) != NULL;
  for (const promx_job *px = c->px_done; px; px = px->next) njobs++;
  const promx_job **jobs = malloc((njobs ? njobs : 1) * sizeof *jobs);
  promx_node *nodes = calloc(c->nnodes ? (size_t)c->nnodes : 1, sizeof *nodes);
  fsdp_status rc = FSDP_ERR_NOMEM;
  if (!jobs || !nodes) {
    fsdp_set_error(rc, "cannot render the metrics: out of memory");
    goto out;
  }
  for (const job_t *j = c->jobs; j; j = job_next(j))   /* the active jobs' records first, then the finished ones' */
    if (job_promx(j)) jobs[k++] = job_promx(j);
  for (const promx_job *px = c->px_done; px; px = px->next) jobs[k++] = px;
  for (int i = 0; i < c->nnodes; i++) {
    const node_t *n = &c->nodes[i];
    nodes[i].name = n->name;
    nodes[i].up = !n->lost;
    for (int s = 0; s < n->nslots; s++)
      nodes[i].devices[n->slots[s].kind != FSDP__DEVICE_KIND__DEVICE_KIND_CPU][n->slots[s].job_id != 0]++;
  }
  promx_view v = {.jobs = jobs, .njobs = njobs, .nodes = nodes, .nnodes = (size_t)c->nnodes, .bad_msgs = c->bad_msgs};
  rc = promx_render(&v, text, len);
out:
  free(jobs);
  free(nodes);
  return rc;
}

void job_publish_metrics(coord_t *c) {
  if (!c->cfg.metrics) return;
  /* a job queued at submit or after a daemon restart has had no state change yet: give it a record */
  for (job_t *j = c->jobs; j; j = job_next(j))
    if (job_promx_ensure(j) != FSDP_OK) log_warn("%s", fsdp_last_error());
  char *text = NULL;
  size_t len = 0;
  if (job_render_metrics(c, &text, &len) != FSDP_OK || metricsrv_publish(c->cfg.metrics, text, len) != FSDP_OK)
    log_warn("cannot publish the metrics: %s", fsdp_last_error());
  free(text);
}
