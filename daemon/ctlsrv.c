/* ctlsrv — see ctlsrv.h. */
#include "ctlsrv.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "job.h"
#include "log.h"
#include "metrics.h"
#include "peer.h"
#include "schedule.h"
#include "steps.h"
#include "tracepull.h"
#include "zap.h"

static void fill_info(const coord_t *c, const jobs_db_row *row, Fsdp__JobInfo *ji, Fsdp__StepSummary *last) {
  ji->id = row->id;
  ji->name = row->name;
  ji->state = (Fsdp__JobState)row->state;
  ji->step = (uint32_t)row->step;
  ji->steps = (uint32_t)row->steps;
  ji->loss = row->loss;
  ji->tokens_per_s = row->tokens_per_s;
  ji->reason = row->reason;
  ji->world = (uint32_t)row->world;
  ji->device = (Fsdp__DeviceKind)row->device;
  ji->submitted_at = row->submitted_at;
  ji->started_at = row->started_at;
  ji->finished_at = row->finished_at;
  ji->job_dir = row->job_dir;
  ji->owner = *row->owner ? row->owner : (char *)c->self_name;   /* from before owners: the daemon's user */
  ji->owner_uid = row->owner_uid >= 0 ? row->owner_uid : (int64_t)geteuid();
  int state = ji->state;
  const char *reason = ji->reason;
  job_overlay_unrecorded(c, row->id, &state, &reason);
  ji->state = (Fsdp__JobState)state;
  ji->reason = (char *)reason;
  if (row->step > 0 && last) {
    last->step = (uint32_t)row->step;
    last->loss = row->loss;
    last->lr = row->last_lr;
    last->grad_norm = row->last_grad_norm;
    last->tokens = row->last_tokens;
    last->step_ms = row->last_step_ms;
    last->tokens_per_s = row->tokens_per_s;
    ji->last = last;
  }
}

/* Whether WHO may VERB job ID (its owner or an admin); if not, the refusal is the answer. A job that
 * does not exist passes: the request's own lookup answers "no job N". */
static int allowed(coord_t *c, const wire_env *env, const peer_t *who, uint64_t id, const char *verb) {
  if (who->admin) return 1;
  jobs_db_row row;
  if (jobs_db_get(c->db, id, &row) != FSDP_OK) return 1;
  /* a job from before owners were recorded is the daemon's own user's */
  int ok = peer_may(who, row.owner_uid >= 0 ? (uid_t)row.owner_uid : geteuid());
  if (!ok) {
    char msg[256];
    peer_refusal(msg, sizeof msg, id, *row.owner ? row.owner : c->self_name, verb);
    log_info("ctl: %s asked to %s job %llu: refused", who->name, verb, (unsigned long long)id);
    coord_reply_error(c->ctl, env, FSDP_ERR_DENIED, msg);
  }
  jobs_db_row_clear(&row);
  return ok;
}

static void serve_submit(coord_t *c, const wire_env *env, const peer_t *who, const Fsdp__SubmitReq *req) {
  if (c->shutting_down) {
    coord_reply_error(c->ctl, env, FSDP_ERR_STATE, "fsdpd is shutting down and accepts no new jobs");
    return;
  }
  job_t *j = NULL;
  fsdp_status rc = peer_can_run(who, geteuid());
  if (rc == FSDP_OK)
    rc = job_from_spec(c, req->spec_text, req->spec_path, *req->base_dir ? req->base_dir : c->state_dir, who,
                       req->umask_set ? req->umask : 022, &j);
  if (rc != FSDP_OK) {
    log_warn("submit refused: %s", fsdp_last_error());
    coord_reply_error(c->ctl, env, rc, fsdp_last_error());
    return;
  }
  /* Fit: enough devices of the kind in the whole cluster, and the plan fits the smallest of them. */
  char msg[1024];
  rc = schedule_fit(c, j, msg, sizeof msg);
  if (rc != FSDP_OK) {
    log_warn("submit refused: %s", msg);
    coord_reply_error(c->ctl, env, rc, msg);
    goto fail;
  }
  rc = job_admit(c, j);
  if (rc != FSDP_OK) {
    coord_reply_error(c->ctl, env, rc, fsdp_last_error());
    goto fail;
  }
  const char *kname = coord_kind_name(job_kind(j));
  int steps = job_spec(j)->steps;
  job_log(j, "queued: %s, %d %s, %d steps", job_name(j), job_world(j), kname, steps);
  log_info("job %llu (%s) queued: %d %s, %d steps, %.2f GiB per rank; owner %s", (unsigned long long)job_id(j),
           job_name(j), job_world(j), kname, steps, (double)job_plan(j)->mem_total / (1u << 30), job_owner(j)->name);
  Fsdp__SubmitResp sr = FSDP__SUBMIT_RESP__INIT;
  sr.job_id = job_id(j);
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_SUBMIT_RESP;
  m.submit_resp = &sr;
  coord_reply(c->ctl, env, &m);
  schedule_try(c);
  return;
fail:
  job_destroy(&j);
}

static void serve_status(coord_t *c, const wire_env *env, uint64_t id, int32_t rank1) {
  jobs_db_row row;
  fsdp_status rc = jobs_db_get(c->db, id, &row);
  if (rc != FSDP_OK) {
    coord_reply_error(c->ctl, env, rc, fsdp_last_error());
    return;
  }
  Fsdp__JobInfo ji = FSDP__JOB_INFO__INIT;
  Fsdp__StepSummary last = FSDP__STEP_SUMMARY__INIT;
  fill_info(c, &row, &ji, &last);
  const job_t *j = job_find(c, id);
  if (j && (job_phase_of(j) == JOB_RUNNING || job_phase_of(j) == JOB_STOPPING)) ji.start_step = job_start_step(j);
  Fsdp__CkptSave ck;
  if (j && job_last_ckpt(j)->step) {
    ck = *job_last_ckpt(j);
    ji.ckpt = &ck;
  }
  int vstep = 0;
  if (jobs_db_last_val(c->db, id, &vstep, &ji.val_loss) != FSDP_OK)
    log_warn("job %llu: %s", (unsigned long long)id, fsdp_last_error());
  ji.val_step = (uint32_t)vstep;
  /* The last step's per-rank figures (memory, time split, traffic) come from its metrics line. */
  char *json = NULL;
  if (row.step > 0 && jobs_db_step_json(c->db, id, row.step, &json) == FSDP_OK && metrics_parse_line(json, &last) != FSDP_OK)
    log_warn("job %llu step %d: %s", (unsigned long long)id, row.step, fsdp_last_error());
  free(json);
  /* --rank R (rank1 = R + 1): that rank's own figures instead of the others' (steps.h) */
  Fsdp__StepSummary one = last;
  const Fsdp__RankStats *rs = NULL;
  if (rank1 > 0) {
    if (rank1 > row.world) {
      char msg[128];
      snprintf(msg, sizeof msg, "job %llu has ranks 0..%d: no rank %d", (unsigned long long)id, row.world - 1, rank1 - 1);
      coord_reply_error(c->ctl, env, FSDP_ERR_RANGE, msg);
      metrics_free_line(&last);
      jobs_db_row_clear(&row);
      return;
    }
    rs = steps_rank_detail(j && !job_ended(j) ? (job_t *)j : NULL, (uint32_t)(rank1 - 1), &last, &one.detail_step);
    one.ranks = (Fsdp__RankStats **)&rs;
    one.n_ranks = rs != NULL;
    one.agg = NULL;
    ji.last = &one;
  }
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_STATUS_RESP;
  m.status_resp = &ji;
  coord_reply(c->ctl, env, &m);
  metrics_free_line(&last);
  jobs_db_row_clear(&row);
}

static void serve_list(coord_t *c, const wire_env *env, const Fsdp__ListReq *q) {
  jobs_db_row *rows = NULL;
  size_t n = 0;
  uint32_t counts[JOBS_DB_NSTATES];
  fsdp_status rc = q->running_first ? jobs_db_list_running_first(c->db, q->limit, &rows, &n)
                                    : jobs_db_list(c->db, q->limit, &rows, &n);
  if (rc == FSDP_OK) rc = jobs_db_state_counts(c->db, counts);
  if (rc != FSDP_OK) {
    coord_reply_error(c->ctl, env, rc, fsdp_last_error());
    jobs_db_rows_destroy(&rows, n);
    return;
  }
  Fsdp__JobInfo *infos = calloc(n ? n : 1, sizeof *infos), **ptrs = calloc(n ? n : 1, sizeof *ptrs);
  Fsdp__StepSummary *lasts = calloc(n ? n : 1, sizeof *lasts);
  if (!infos || !ptrs || !lasts) {
    coord_reply_error(c->ctl, env, FSDP_ERR_NOMEM, "out of memory");
  } else {
    for (size_t i = 0; i < n; i++) {
      fsdp__job_info__init(&infos[i]);
      fsdp__step_summary__init(&lasts[i]);
      fill_info(c, &rows[i], &infos[i], &lasts[i]);
      ptrs[i] = &infos[i];
    }
    Fsdp__ListResp lr = FSDP__LIST_RESP__INIT;
    lr.n_jobs = n;
    lr.jobs = ptrs;
    lr.n_state_jobs = JOBS_DB_NSTATES;
    lr.state_jobs = counts;
    Fsdp__Msg m = WIRE_MSG_INIT;
    m.body_case = FSDP__MSG__BODY_LIST_RESP;
    m.list_resp = &lr;
    coord_reply(c->ctl, env, &m);
  }
  free(infos);
  free(ptrs);
  free(lasts);
  jobs_db_rows_destroy(&rows, n);
}

/* Cancel job ID, or with STOP first let it save a checkpoint when it makes them (steps_stop). */
static void serve_cancel(coord_t *c, const wire_env *env, uint64_t id, int stop) {
  job_t *j = job_find(c, id);
  if (!j || job_ended(j)) {
    jobs_db_row row;
    fsdp_status rc = jobs_db_get(c->db, id, &row);
    if (rc != FSDP_OK) {
      coord_reply_error(c->ctl, env, rc, fsdp_last_error());
      return;
    }
    char msg[256];
    snprintf(msg, sizeof msg, "job %llu has already %s", (unsigned long long)id, job_state_name(row.state));
    jobs_db_row_clear(&row);
    coord_reply_error(c->ctl, env, FSDP_ERR_STATE, msg);
    return;
  }
  if (stop) steps_stop(c, j, JE_USER_STOP);   /* a checkpoint first where the job makes them, else a cancel */
  else job_event(c, j, JE_CANCEL, NULL);
  coord_reply_ack(c->ctl, env);
  schedule_try(c);
}

static void serve_logs(coord_t *c, const wire_env *env, const Fsdp__LogsReq *q) {
  jobs_db_row row;
  fsdp_status rc = jobs_db_get(c->db, q->job_id, &row);
  if (rc != FSDP_OK) {
    coord_reply_error(c->ctl, env, rc, fsdp_last_error());
    return;
  }
  char path[PATH_MAX + 128];
  if (q->rank < 0) snprintf(path, sizeof path, "%s/job.log", row.job_dir);
  else snprintf(path, sizeof path, "%s/worker-%d.log", row.job_dir, q->rank);
  job_t *j = job_find(c, q->job_id);
  int done = jobs_db_terminal(row.state) && !j;   /* terminal and every worker reaped: no more output */
  if (q->rank >= row.world) {
    char msg[128];
    snprintf(msg, sizeof msg, "job %llu has ranks 0..%d; rank %d does not exist", (unsigned long long)q->job_id,
             row.world - 1, q->rank);
    jobs_db_row_clear(&row);
    coord_reply_error(c->ctl, env, FSDP_ERR_RANGE, msg);
    return;
  }
  jobs_db_row_clear(&row);
  size_t max = q->max_bytes ? q->max_bytes : LOG_CHUNK_DEFAULT;
  if (max > LOG_CHUNK_MAX) max = LOG_CHUNK_MAX;
  uint8_t *buf = malloc(max);
  if (!buf) {
    coord_reply_error(c->ctl, env, FSDP_ERR_NOMEM, "out of memory");
    return;
  }
  ssize_t n = 0;
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    n = pread(fd, buf, max, (off_t)q->offset);
    if (n < 0) n = 0;
    close(fd);
  }
  Fsdp__LogsResp lr = FSDP__LOGS_RESP__INIT;
  lr.data.data = buf;
  lr.data.len = (size_t)n;
  lr.next_offset = q->offset + (uint64_t)n;
  lr.job_done = done && (size_t)n < max;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_LOGS_RESP;
  m.logs_resp = &lr;
  coord_reply(c->ctl, env, &m);
  free(buf);
}

static void serve_nodes(coord_t *c, const wire_env *env) {
  size_t total = 0;
  for (int i = 0; i < c->nnodes; i++) total += (size_t)c->nodes[i].nslots;
  Fsdp__NodeInfo *infos = calloc((size_t)c->nnodes + 1, sizeof *infos), **ptrs = calloc((size_t)c->nnodes + 1, sizeof *ptrs);
  Fsdp__DeviceSlot *slots = calloc(total + 1, sizeof *slots), **sptrs = calloc(total + 1, sizeof *sptrs);
  if (!infos || !ptrs || !slots || !sptrs) {
    coord_reply_error(c->ctl, env, FSDP_ERR_NOMEM, "out of memory");
    goto out;
  }
  size_t k = 0;
  double now_m = loop_now_mono(), now_w = loop_now_wall();
  for (int i = 0; i < c->nnodes; i++) {
    node_t *n = &c->nodes[i];
    Fsdp__NodeInfo *ni = &infos[i];
    fsdp__node_info__init(ni);
    ni->id = n->id;
    ni->name = n->name;
    ni->lost = n->lost != 0;
    ni->stopped = n->stopped != 0;
    ni->host_mem_bytes = n->host_mem;
    ni->last_seen = now_w - (now_m - n->last_seen);
    ni->slots = &sptrs[k];
    for (int s = 0; s < n->nslots; s++, k++) {
      fsdp__device_slot__init(&slots[k]);
      slots[k].kind = (Fsdp__DeviceKind)n->slots[s].kind;
      slots[k].index = n->slots[s].index;
      slots[k].job_id = n->slots[s].job_id;
      slots[k].rank = n->slots[s].rank;
      slots[k].name = n->slots[s].name;
      slots[k].mem_bytes = n->slots[s].mem;
      sptrs[k] = &slots[k];
    }
    ni->n_slots = (size_t)n->nslots;
    ptrs[i] = ni;
  }
  Fsdp__NodesResp nr = FSDP__NODES_RESP__INIT;
  nr.n_nodes = (size_t)c->nnodes;
  nr.nodes = ptrs;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_NODES_RESP;
  m.nodes_resp = &nr;
  coord_reply(c->ctl, env, &m);
out:
  free(infos);
  free(ptrs);
  free(slots);
  free(sptrs);
}

static void ctlsrv_on_msg(void *sock, void *arg) {
  coord_t *c = arg;
  Fsdp__Msg *m = NULL;
  wire_env env;
  fsdp_status rc = wire_recv(sock, &env, &m, ZMQ_DONTWAIT);
  if (rc == FSDP_ERR_TIMEOUT) return;
  if (rc != FSDP_OK) {
    coord_note_bad(c, "ctl", fsdp_last_error());
    if (env.n >= 1) {
      char msg[1200];
      snprintf(msg, sizeof msg, "malformed request (expected one fsdp.Msg of protocol version %d after an empty "
               "delimiter frame): %s", FSDP__VERSION__PROTO_VERSION, fsdp_last_error());
      coord_reply_error(sock, &env, rc, msg);
    }
    return;
  }
  log_debug("ctl: %s", wire_body_name(m->body_case));
  peer_t who;
  if (peer_resolve(env.user_id, geteuid(), &who) != FSDP_OK) {
    log_warn("ctl: %s refused: %s", wire_body_name(m->body_case), fsdp_last_error());
    coord_reply_error(sock, &env, FSDP_ERR_DENIED, fsdp_last_error());
    wire_destroy(&m);
    return;
  }
  switch (m->body_case) {
  case FSDP__MSG__BODY_SUBMIT_REQ: serve_submit(c, &env, &who, m->submit_req); break;
  case FSDP__MSG__BODY_STATUS_REQ: serve_status(c, &env, m->status_req->job_id, m->status_req->rank); break;
  case FSDP__MSG__BODY_LIST_REQ: serve_list(c, &env, m->list_req); break;
  case FSDP__MSG__BODY_CANCEL_REQ:
    if (allowed(c, &env, &who, m->cancel_req->job_id, "cancel")) serve_cancel(c, &env, m->cancel_req->job_id, 0);
    break;
  case FSDP__MSG__BODY_STOP_REQ:
    if (allowed(c, &env, &who, m->stop_req->job_id, "stop")) serve_cancel(c, &env, m->stop_req->job_id, 1);
    break;
  case FSDP__MSG__BODY_LOGS_REQ:
    if (allowed(c, &env, &who, m->logs_req->job_id, "read the logs of")) serve_logs(c, &env, m->logs_req);
    break;
  case FSDP__MSG__BODY_NODES_REQ: serve_nodes(c, &env); break;
  case FSDP__MSG__BODY_TRACE_REQ:
    if (allowed(c, &env, &who, m->trace_req->job_id, "trace")) tracepull_request(c, &env, m->trace_req);
    break;
  case FSDP__MSG__BODY_SHUTDOWN_REQ:
    if (!who.admin) {
      coord_reply_error(sock, &env, FSDP_ERR_DENIED, "only an admin (root or the user fsdpd runs as) may shut fsdpd down");
      break;
    }
    log_info("shutdown requested over ctl by %s", who.name);
    coord_reply_ack(sock, &env);
    if (c->cfg.on_shutdown_req) c->cfg.on_shutdown_req(c->cfg.arg);
    break;
  default: {
    char msg[256];
    snprintf(msg, sizeof msg, "%s is not a control request (allowed: submit, status, list, cancel, stop, logs, nodes, trace, shutdown)",
             wire_body_name(m->body_case));
    log_warn("ctl: %s", msg);
    coord_reply_error(sock, &env, FSDP_ERR_INVALID, msg);
  }
  }
  wire_destroy(&m);
  if (job_reap_drained(c)) schedule_try(c);
}

void ctlsrv_bind(coord_t *c) {
  if (c->ctl_bound) return;
  c->ctl_bound = 1;
  /* A stale socket file from a crashed daemon blocks nothing for ipc://, but remove it so that
   * clients waiting for the file do not connect to a dead one. */
  if (!strncmp(c->ctl_ep, "ipc://", 6)) unlink(c->ctl_ep + 6);
  if (zap_bind_socket(c, ZMQ_ROUTER, c->ctl_ep, &c->ctl) != FSDP_OK ||
      loop_zsock_new(c->uv, c->ctl, ctlsrv_on_msg, c, &c->ctl_zs) != FSDP_OK) {
    log_error("cannot serve the control endpoint: %s", fsdp_last_error());
    return;
  }
  coord_open_socket_file(c->ctl_ep);
  log_info("serving fsdpctl on %s", c->ctl_ep);
}
