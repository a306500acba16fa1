/* relay — see relay.h. */
#include "relay.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "log.h"
#include "loop.h"
#include "stepagg.h"

#define RELAY_MAX_CKPT 64    /* granted checkpoint steps not yet sent */
#define RELAY_MAX_BATCH 64   /* node steps held for one node_step_report (NodeStepCmd.report_every) */

typedef struct rrank {
  uint32_t rank;
  uint8_t ident[WIRE_MAX_ENV_FRAME];
  size_t len;
} rrank;

typedef struct rstep {
  uint32_t step;             /* 0: unused */
  uint32_t n;                /* reports in */
  Fsdp__Msg **reps;          /* by local index, nranks of them */
} rstep;

typedef struct rjob {
  struct rjob *next;
  uint64_t id;
  rrank *ranks;
  int nranks;
  uint32_t expect;           /* this node's ranks of the job (node_step_cmd); 0 before the first */
  uint32_t last_step;        /* the job's last step (node_step_cmd): its StepCmd says last */
  uint32_t granted, sent, done;   /* the last step granted, sent to the ranks, reported up */
  uint32_t ckpt[RELAY_MAX_CKPT];
  int nckpt;
  uint32_t detail_every, detail_rank;
  uint32_t report_every;     /* NodeStepCmd.report_every */
  Fsdp__NodeStepReport *batch[RELAY_MAX_BATCH];   /* completed steps not yet sent up (copies) */
  int nbatch;
  rstep slot[RELAY_INFLIGHT];
} rjob;

struct relay {
  void *sock;
  loop_zsock *zs;
  char ep[128];
  relay_up_fn up;
  void *arg;
  rjob *jobs;
  stepagg *agg;              /* scratch: one node step at a time */
};

static int seq;

static rjob *find_job(relay *r, uint64_t id) {
  for (rjob *j = r->jobs; j; j = j->next)
    if (j->id == id) return j;
  return NULL;
}

static void batch_drop(rjob *j) {
  for (int i = 0; i < j->nbatch; i++) fsdp__node_step_report__free_unpacked(j->batch[i], NULL);
  j->nbatch = 0;
}

static void job_free(rjob *j) {
  batch_drop(j);
  for (int s = 0; s < RELAY_INFLIGHT; s++) {
    for (int i = 0; j->slot[s].reps && i < j->nranks; i++) wire_destroy(&j->slot[s].reps[i]);
    free(j->slot[s].reps);
  }
  free(j->ranks);
  free(j);
}

static rjob *get_job(relay *r, uint64_t id) {
  rjob *j = find_job(r, id);
  if (j) return j;
  j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->id = id;
  j->next = r->jobs;
  r->jobs = j;
  return j;
}

/* The job and local index of the worker whose identity is ID. */
static rjob *find_worker(relay *r, const uint8_t *id, size_t len, int *idx) {
  for (rjob *j = r->jobs; j; j = j->next)
    for (int i = 0; i < j->nranks; i++)
      if (j->ranks[i].len == len && !memcmp(j->ranks[i].ident, id, len)) {
        *idx = i;
        return j;
      }
  return NULL;
}

static fsdp_status add_rank(rjob *j, uint32_t rank, const uint8_t *id, size_t len) {
  int i = 0;
  while (i < j->nranks && j->ranks[i].rank != rank) i++;
  if (i == j->nranks) {   /* a new rank: every per-step array grows with it */
    rrank *nr = realloc(j->ranks, (size_t)(j->nranks + 1) * sizeof *nr);
    if (!nr) return fsdp_set_error(FSDP_ERR_NOMEM, "relay: out of memory");
    j->ranks = nr;
    for (int s = 0; s < RELAY_INFLIGHT; s++) {
      Fsdp__Msg **reps = realloc(j->slot[s].reps, (size_t)(j->nranks + 1) * sizeof *reps);
      if (!reps) return fsdp_set_error(FSDP_ERR_NOMEM, "relay: out of memory");
      reps[j->nranks] = NULL;
      j->slot[s].reps = reps;
    }
    j->nranks++;
  }
  j->ranks[i].rank = rank;
  memcpy(j->ranks[i].ident, id, len);
  j->ranks[i].len = len;
  return FSDP_OK;
}

static void send_down(relay *r, const uint8_t *id, size_t len, Fsdp__Msg *m) {
  wire_env env = {0};
  wire_env_push(&env, id, len);
  wire_env_push(&env, NULL, 0);
  fsdp_status rc = wire_send(r->sock, &env, m, ZMQ_DONTWAIT);
  if (rc != FSDP_OK) log_debug("relay: cannot send %s to a worker: %s", wire_body_name(m->body_case), fsdp_last_error());
}

/* Hand the granted steps to the ranks, at most RELAY_INFLIGHT beyond the last one reported. */
static void pump(relay *r, rjob *j) {
  while (j->sent < j->granted && j->sent < j->done + RELAY_INFLIGHT) {
    Fsdp__StepCmd s = FSDP__STEP_CMD__INIT;
    s.step = ++j->sent;
    s.last = s.step == j->last_step;
    for (int k = 0; k < j->nckpt; k++)
      if (j->ckpt[k] == s.step) {
        s.checkpoint = 1;
        j->ckpt[k] = j->ckpt[--j->nckpt];
        break;
      }
    Fsdp__Msg m = WIRE_MSG_INIT;
    m.body_case = FSDP__MSG__BODY_STEP_CMD;
    m.step_cmd = &s;
    for (int i = 0; i < j->nranks; i++) send_down(r, j->ranks[i].ident, j->ranks[i].len, &m);
  }
}

static void on_grant(relay *r, const Fsdp__NodeStepCmd *g) {
  rjob *j = get_job(r, g->job_id);
  if (!j) {
    log_error("relay: out of memory for job %llu", (unsigned long long)g->job_id);
    return;
  }
  if (!j->granted || g->first_step <= j->done) {   /* the first grant (a resumed job starts later), or a restart */
    for (int k = 0; k < RELAY_INFLIGHT; k++) {
      for (int i = 0; i < j->nranks; i++) wire_destroy(&j->slot[k].reps[i]);
      j->slot[k].step = j->slot[k].n = 0;
    }
    j->done = j->sent = g->first_step - 1;
    j->granted = 0;
    j->nckpt = 0;
    batch_drop(j);
  }
  uint32_t last = g->first_step + g->count - 1;
  if (last > j->granted) j->granted = last;
  j->expect = g->expect;
  j->last_step = g->last_step;
  j->detail_every = g->detail_every;
  j->detail_rank = g->detail_rank;
  j->report_every = g->report_every;
  for (size_t k = 0; k < g->n_checkpoint_steps && j->nckpt < RELAY_MAX_CKPT; k++) j->ckpt[j->nckpt++] = g->checkpoint_steps[k];
  pump(r, j);
}

static int wants_detail(const rjob *j, uint32_t step, uint32_t rank) {
  return (j->detail_every && step % j->detail_every == 0) || (j->detail_rank && j->detail_rank - 1 == rank);
}

/* The saves that became complete after the step, as rank RANK saw them: extra figures of A
 * (fsdp.proto's NodeStepReport: ckpt_* for the first, ckpt2_* for a second). */
static fsdp_status add_ckpt(stepagg *a, const Fsdp__StepReport *rep, uint32_t rank) {
  static const char *const fig[4] = {"blocked_us", "wait_us", "write_us", "bytes"};
  for (size_t i = 0; i < rep->n_ckpt && i < 2; i++) {
    const Fsdp__CkptSave *k = rep->ckpt[i];
    uint64_t v[4] = {(uint64_t)llround(k->blocked_s * 1e6), (uint64_t)llround(k->wait_s * 1e6), (uint64_t)llround(k->write_s * 1e6),
                     k->bytes};
    for (int f = 0; f < 4; f++) {
      char name[32];
      snprintf(name, sizeof name, "ckpt%s_%s", i ? "2" : "", fig[f]);
      TRY(stepagg_add_value(a, name, v[f], rank));
    }
  }
  return FSDP_OK;
}

/* Send the batched steps up as one node_step_report: the first, the others in its `more`. */
static void batch_flush(relay *r, rjob *j) {
  if (!j->nbatch) return;
  Fsdp__NodeStepReport *head = j->batch[0];
  head->more = j->batch + 1;
  head->n_more = (size_t)j->nbatch - 1;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_NODE_STEP_REPORT;
  m.node_step_report = head;
  r->up(r->arg, NULL, &m);
  head->more = NULL, head->n_more = 0;
  batch_drop(j);
}

/* NR (step STEP) up: now, or into the batch (a copy: NR borrows the ranks' reports) that goes up
 * at a multiple of report_every, the last granted step or the job's last. */
static void send_step(relay *r, rjob *j, uint32_t step, const Fsdp__NodeStepReport *nr) {
  if (j->report_every <= 1) {
    Fsdp__Msg m = WIRE_MSG_INIT;
    m.body_case = FSDP__MSG__BODY_NODE_STEP_REPORT;
    m.node_step_report = (Fsdp__NodeStepReport *)nr;
    r->up(r->arg, NULL, &m);
    return;
  }
  size_t len = fsdp__node_step_report__get_packed_size(nr);
  uint8_t *buf = malloc(len ? len : 1);
  Fsdp__NodeStepReport *copy = NULL;
  if (buf && fsdp__node_step_report__pack(nr, buf) == len) copy = fsdp__node_step_report__unpack(NULL, len, buf);
  free(buf);
  if (!copy) {
    log_error("relay: job %llu step %u: out of memory; the report is lost", (unsigned long long)j->id, step);
    return;
  }
  j->batch[j->nbatch++] = copy;
  if (step % j->report_every == 0 || step >= j->granted || step == j->last_step || j->nbatch == RELAY_MAX_BATCH) batch_flush(r, j);
}

/* Every rank of the node reported step S (slot SL): one node_step_report up. */
static void complete(relay *r, rjob *j, rstep *sl) {
  Fsdp__NodeStepReport nr = FSDP__NODE_STEP_REPORT__INIT;
  Fsdp__StepAgg agg;
  Fsdp__RankStats **detail = calloc((size_t)j->nranks, sizeof *detail);
  stepagg_reset(r->agg);
  const Fsdp__StepReport *first = NULL;
  double start_ms = 0;   /* [eval] at_start: the node's slowest rank */
  fsdp_status rc = detail ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  for (int i = 0; rc == FSDP_OK && i < j->nranks; i++) {
    const Fsdp__StepReport *rep = sl->reps[i] ? sl->reps[i]->step_report : NULL;
    if (!rep) continue;
    uint32_t rank = j->ranks[i].rank;
    rc = stepagg_add_rank(r->agg, rep->stats, rep->step_ms, rep->has_val ? rep->eval_ms : 0);
    if (rc == FSDP_OK) rc = add_ckpt(r->agg, rep, rank);
    if (!first || rank < nr.first_rank) first = rep, nr.first_rank = rank;
    if (rep->step_ms > nr.step_ms || (rep->step_ms == nr.step_ms && rank < nr.step_ms_rank))
      nr.step_ms = rep->step_ms, nr.step_ms_rank = rank;
    if (rep->has_val && rep->eval_ms > nr.eval_ms) nr.eval_ms = rep->eval_ms;
    if (rep->has_start_val && rep->start_eval_ms > start_ms) start_ms = rep->start_eval_ms;
    if (wants_detail(j, sl->step, rank)) detail[nr.n_detail++] = rep->stats;
  }
  if (rc == FSDP_OK) rc = stepagg_to_msg(r->agg, 0, &agg);
  if (rc == FSDP_OK) {
    Fsdp__StepReport f = *first;   /* its global figures; the node's own are in agg */
    f.stats = NULL;
    if (f.has_start_val) f.start_eval_ms = start_ms;
    nr.job_id = j->id;
    nr.first = &f;
    nr.agg = &agg;
    nr.detail = detail;
    send_step(r, j, sl->step, &nr);
    stepagg_msg_free(&agg);
  } else {
    log_error("relay: job %llu step %u: cannot aggregate: %s", (unsigned long long)j->id, sl->step, fsdp_last_error());
  }
  free(detail);
  for (int i = 0; i < j->nranks; i++) wire_destroy(&sl->reps[i]);
  sl->n = 0;
  sl->step = 0;
}

static void on_report(relay *r, rjob *j, int idx, Fsdp__Msg **mp) {
  uint32_t s = (*mp)->step_report->step;
  if (s <= j->done || s > j->sent || (*mp)->step_report->stats->rank != j->ranks[idx].rank) {
    log_warn("relay: job %llu rank %u: report for step %u outside %u..%u or from another rank; ignored",
             (unsigned long long)j->id, j->ranks[idx].rank, s, j->done + 1, j->sent);
    return;
  }
  rstep *sl = &j->slot[s % RELAY_INFLIGHT];
  if (sl->step != s) sl->step = s, sl->n = 0;
  if (sl->reps[idx]) {
    log_warn("relay: job %llu rank %u: second report for step %u; ignored", (unsigned long long)j->id, j->ranks[idx].rank, s);
    return;
  }
  sl->reps[idx] = *mp;
  *mp = NULL;
  sl->n++;
  /* complete in order: the node's next step may already be full behind this one */
  for (;;) {
    rstep *next = &j->slot[(j->done + 1) % RELAY_INFLIGHT];
    if (!j->expect || next->step != j->done + 1 || next->n < j->expect) break;
    complete(r, j, next);
    j->done++;
  }
  pump(r, j);
}

static void on_worker(void *sock, void *arg) {
  relay *r = arg;
  Fsdp__Msg *m = NULL;
  wire_env env;
  fsdp_status rc = wire_recv(sock, &env, &m, ZMQ_DONTWAIT);
  if (rc == FSDP_ERR_TIMEOUT) return;
  if (rc != FSDP_OK || env.n != 2 || env.len[1] != 0) {   /* [worker][""][body] */
    log_warn("relay: dropped a malformed message from a worker: %s", rc != FSDP_OK ? fsdp_last_error() : "bad envelope");
    wire_destroy(&m);
    return;
  }
  int idx;
  switch (m->body_case) {
  case FSDP__MSG__BODY_STEP_REPORT: {
    rjob *j = find_worker(r, env.data[0], env.len[0], &idx);
    if (j) on_report(r, j, idx, &m);
    else log_warn("relay: step_report from an unknown worker; ignored");
    break;
  }
  /* what a worker says; anything else on this socket (anyone on the host can connect to it, e.g. an
   * agent's agent_register) is not passed on in a worker's name */
  case FSDP__MSG__BODY_WORKER_HELLO:
  case FSDP__MSG__BODY_WORKER_READY:
  case FSDP__MSG__BODY_WORKER_ERROR:
  case FSDP__MSG__BODY_ACK:
  case FSDP__MSG__BODY_KV_SET:
  case FSDP__MSG__BODY_KV_GET:
  case FSDP__MSG__BODY_TRACE_SPANS: r->up(r->arg, &env, m); break;
  default: log_warn("relay: %s from a worker's socket; ignored", wire_body_name(m->body_case));
  }
  wire_destroy(&m);
}

int relay_from_coord(relay *r, const wire_env *env, Fsdp__Msg **mp) {
  Fsdp__Msg *m = *mp;
  if (m->body_case == FSDP__MSG__BODY_NODE_STEP_CMD) {
    on_grant(r, m->node_step_cmd);
    return 1;
  }
  if (env->n < 2 || env->len[0] == 0) return 0;   /* the agent's own: [""][body] */
  if (m->body_case == FSDP__MSG__BODY_WORKER_SETUP) {
    rjob *j = get_job(r, m->worker_setup->job_id);
    if (!j || add_rank(j, m->worker_setup->rank, env->data[0], env->len[0]) != FSDP_OK)
      log_error("relay: cannot record job %llu rank %u: out of memory", (unsigned long long)m->worker_setup->job_id,
                m->worker_setup->rank);
  }
  wire_env down = *env;
  fsdp_status rc = wire_send(r->sock, &down, m, ZMQ_DONTWAIT);
  if (rc != FSDP_OK) log_debug("relay: cannot pass %s to a worker: %s", wire_body_name(m->body_case), fsdp_last_error());
  return 1;
}

void relay_rank_gone(relay *r, uint64_t job, uint32_t rank) {
  for (rjob **p = &r->jobs; *p; p = &(*p)->next) {
    rjob *j = *p;
    if (j->id != job) continue;
    for (int i = 0; i < j->nranks; i++)
      if (j->ranks[i].rank == rank) j->ranks[i].len = 0;   /* no identity matches an empty one */
    int live = 0;
    for (int i = 0; i < j->nranks; i++) live += j->ranks[i].len != 0;
    if (!live) {
      *p = j->next;
      job_free(j);
    }
    return;
  }
}

const char *relay_endpoint(const relay *r) { return r->ep; }

fsdp_status relay_new(uv_loop_t *uv, void *zctx, const char *endpoint, relay_up_fn up, void *arg, relay **out) {
  *out = NULL;
  relay *r = calloc(1, sizeof *r);
  if (!r) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the relay");
  r->up = up;
  r->arg = arg;
  fsdp_status rc;
  TRY_GOTO(stepagg_new(&r->agg), rc, fail);
  if (endpoint) snprintf(r->ep, sizeof r->ep, "%s", endpoint);
  else snprintf(r->ep, sizeof r->ep, "ipc://@fsdpd-relay-%d-%d", (int)getpid(), seq++);
  r->sock = zmq_socket(zctx, ZMQ_ROUTER);
  if (!r->sock) {
    rc = fsdp_set_error(FSDP_ERR_COMM, "zmq_socket(ROUTER): %s", zmq_strerror(zmq_errno()));
    goto fail;
  }
  TRY_GOTO(wire_socket_setup(r->sock), rc, fail);
  int hwm = 0;
  zmq_setsockopt(r->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(r->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
  if (zmq_bind(r->sock, r->ep) != 0) {
    rc = fsdp_set_error(FSDP_ERR_COMM, "cannot bind the workers' endpoint %s: %s", r->ep, zmq_strerror(zmq_errno()));
    goto fail;
  }
  TRY_GOTO(loop_zsock_new(uv, r->sock, on_worker, r, &r->zs), rc, fail);
  *out = r;
  return FSDP_OK;
fail:
  relay_destroy(&r);
  return rc;
}

void relay_destroy(relay **p) {
  if (!p || !*p) return;
  relay *r = *p;
  *p = NULL;
  loop_zsock_destroy(&r->zs);
  if (r->sock) zmq_close(r->sock);
  while (r->jobs) {
    rjob *j = r->jobs;
    r->jobs = j->next;
    job_free(j);
  }
  stepagg_destroy(&r->agg);
  free(r);
}
