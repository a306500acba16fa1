/* relay — see relay.h. */
#define _GNU_SOURCE   /* O_PATH */
#include "relay.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "log.h"
#include "loop.h"
#include "stepagg.h"

#define RELAY_MAX_CKPT 64    /* granted checkpoint steps not yet sent */
#define RELAY_MAX_BATCH 64   /* node steps held for one node_step_report (NodeStepCmd.report_every) */
#define RELAY_PATH_MAX ((int)sizeof(((struct sockaddr_un *)0)->sun_path))   /* a unix socket's path, with its NUL */
#define RELAY_LOG_EVERY_S 10.0   /* refused or malformed messages: one log line per this long */

/* A worker this node started (relay_expect): only its process may speak as its job's rank. */
typedef struct rworker {
  uint64_t job;
  uint32_t rank;
  long uid, pid;
  uint8_t ident[WIRE_MAX_ENV_FRAME];   /* its connection, from its hello on; len 0 before */
  size_t len;
} rworker;

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
  char ep[RELAY_PATH_MAX + 8];   /* ipc://DIR/r-PID-N */
  int path_fd;               /* O_PATH descriptor of the socket file, for the workers */
  rworker *workers;
  int nworkers, capworkers;
  double bad_logged_at;
  unsigned bad_unlogged;
  relay_up_fn up;
  void *arg;
  rjob *jobs;
  stepagg *agg;              /* scratch: one node step at a time */
};

static int seq;

/* One line per RELAY_LOG_EVERY_S for refused or malformed messages, with the count since the last. */
static void note_bad(relay *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_bad(relay *r, const char *fmt, ...) {
  double now = loop_now_mono();
  if (r->bad_logged_at != 0 && now - r->bad_logged_at < RELAY_LOG_EVERY_S) {
    r->bad_unlogged++;
    return;
  }
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (r->bad_unlogged) log_warn("relay: %s (and %u more refused since the last line)", line, r->bad_unlogged);
  else log_warn("relay: %s", line);
  r->bad_logged_at = now;
  r->bad_unlogged = 0;
}

static rworker *expected(relay *r, uint64_t job, uint32_t rank) {
  for (int i = 0; i < r->nworkers; i++)
    if (r->workers[i].job == job && r->workers[i].rank == rank) return &r->workers[i];
  return NULL;
}

static rworker *worker_by_ident(relay *r, const uint8_t *id, size_t len) {
  for (int i = 0; i < r->nworkers; i++)
    if (r->workers[i].len == len && len && !memcmp(r->workers[i].ident, id, len)) return &r->workers[i];
  return NULL;
}

void relay_expect(relay *r, uint64_t job, uint32_t rank, long uid, long pid) {
  rworker *w = expected(r, job, rank);
  if (!w) {
    if (r->nworkers == r->capworkers) {
      int cap = r->capworkers ? 2 * r->capworkers : 16;
      rworker *nw = realloc(r->workers, (size_t)cap * sizeof *nw);
      if (!nw) {   /* the worker cannot say hello: its job fails at its start timeout, as for any lost worker */
        log_error("relay: out of memory; job %llu rank %u cannot be admitted", (unsigned long long)job, rank);
        return;
      }
      r->workers = nw;
      r->capworkers = cap;
    }
    w = &r->workers[r->nworkers++];
  }
  *w = (rworker){.job = job, .rank = rank, .uid = uid, .pid = pid};
}

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
    note_bad(r, "job %llu rank %u: report for step %u outside %u..%u or from another rank; ignored",
             (unsigned long long)j->id, j->ranks[idx].rank, s, j->done + 1, j->sent);
    return;
  }
  rstep *sl = &j->slot[s % RELAY_INFLIGHT];
  if (sl->step != s) sl->step = s, sl->n = 0;
  if (sl->reps[idx]) {
    note_bad(r, "job %llu rank %u: second report for step %u; ignored", (unsigned long long)j->id, j->ranks[idx].rank, s);
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

/* A worker's hello: admitted only from the process this node started for that job's rank (its uid and
 * pid as the kernel gave them for the connection), which from then on is that rank's connection. */
static int admit_hello(relay *r, const wire_env *env, const Fsdp__WorkerHello *h) {
  rworker *e = expected(r, h->job_id, h->rank), *w = worker_by_ident(r, env->data[0], env->len[0]);
  const char *why = NULL;
  if (!e) why = "no such rank was started on this node";
  else if (env->peer_pid < 0) why = "its connection has no peer credentials";
  else if (env->peer_uid != e->uid || env->peer_pid != e->pid) why = "it is not the process started for that rank";
  else if (w && w != e) why = "its connection already speaks for another rank";
  else if (e->len && (e->len != env->len[0] || memcmp(e->ident, env->data[0], e->len))) why = "that rank said hello already";
  if (why) {
    note_bad(r, "refused a worker_hello for job %llu rank %u from uid %ld pid %ld: %s", (unsigned long long)h->job_id,
             h->rank, env->peer_uid, env->peer_pid, why);
    return 0;
  }
  memcpy(e->ident, env->data[0], env->len[0]);
  e->len = env->len[0];
  return 1;
}

/* The rank a worker's message names, where it names one; -1 otherwise. */
static long named_rank(const Fsdp__Msg *m) {
  switch (m->body_case) {
  case FSDP__MSG__BODY_WORKER_READY: return m->worker_ready->rank;
  case FSDP__MSG__BODY_WORKER_ERROR: return m->worker_error->rank;
  case FSDP__MSG__BODY_TRACE_SPANS: return m->trace_spans->rank;
  case FSDP__MSG__BODY_STEP_REPORT: return m->step_report->stats->rank;
  default: return -1;
  }
}

static void on_worker(void *sock, void *arg) {
  relay *r = arg;
  Fsdp__Msg *m = NULL;
  wire_env env;
  fsdp_status rc = wire_recv(sock, &env, &m, ZMQ_DONTWAIT);
  if (rc == FSDP_ERR_TIMEOUT) return;
  if (rc != FSDP_OK || env.n != 2 || env.len[1] != 0) {   /* [worker][""][body] */
    note_bad(r, "dropped a malformed message from uid %ld pid %ld: %s", env.peer_uid, env.peer_pid,
             rc != FSDP_OK ? fsdp_last_error() : "bad envelope");
    wire_destroy(&m);
    return;
  }
  rworker *w = NULL;
  int idx;
  switch (m->body_case) {
  case FSDP__MSG__BODY_WORKER_HELLO:
    if (admit_hello(r, &env, m->worker_hello)) r->up(r->arg, &env, m);
    break;
  /* what a worker says, once its hello made its connection its rank's; anything else on this socket
   * (e.g. an agent's agent_register) is not passed on in a worker's name */
  case FSDP__MSG__BODY_STEP_REPORT:
  case FSDP__MSG__BODY_WORKER_READY:
  case FSDP__MSG__BODY_WORKER_ERROR:
  case FSDP__MSG__BODY_ACK:
  case FSDP__MSG__BODY_KV_SET:
  case FSDP__MSG__BODY_KV_GET:
  case FSDP__MSG__BODY_TRACE_SPANS:
    w = worker_by_ident(r, env.data[0], env.len[0]);
    if (!w) {
      note_bad(r, "%s from uid %ld pid %ld, a connection that is no worker's of this node; ignored",
               wire_body_name(m->body_case), env.peer_uid, env.peer_pid);
    } else if (named_rank(m) >= 0 && named_rank(m) != (long)w->rank) {
      note_bad(r, "%s naming rank %ld from job %llu rank %u's connection; ignored", wire_body_name(m->body_case),
               named_rank(m), (unsigned long long)w->job, w->rank);
    } else if (m->body_case == FSDP__MSG__BODY_STEP_REPORT) {
      rjob *j = find_worker(r, env.data[0], env.len[0], &idx);
      if (j && j->id == w->job) on_report(r, j, idx, &m);
      else note_bad(r, "step_report from job %llu rank %u before its setup; ignored", (unsigned long long)w->job, w->rank);
    } else {
      r->up(r->arg, &env, m);
    }
    break;
  default: note_bad(r, "%s from a worker's socket; ignored", wire_body_name(m->body_case));
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

void relay_rank_gone(relay *r, uint64_t job, uint32_t rank, long pid) {
  rworker *w = expected(r, job, rank);
  if (w && w->pid == pid) *w = r->workers[--r->nworkers];   /* a restarted rank's new process keeps its entry */
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
int relay_socket_fd(const relay *r) { return r->path_fd; }

/* Bind R's ROUTER on a fresh name in DIR. The directory is this daemon's alone (mode 0700, checked
 * by the caller): nobody else can create, replace or reach a name in it, so the name cannot be
 * squatted and a stale one (an earlier fsdpd with this pid) can be removed. The socket file is
 * made connectable by everyone: only a process handed its O_PATH descriptor can reach it. */
static fsdp_status bind_in(relay *r, const char *dir) {
  char path[PATH_MAX];
  int n = snprintf(path, sizeof path, "%s/r-%d-%d", dir, (int)getpid(), seq++);
  if (n < 0 || n >= RELAY_PATH_MAX)
    return fsdp_set_error(FSDP_ERR_INVALID, "the workers' socket %s/r-PID-N would be longer than a unix socket's %d "
                          "bytes: use a shorter --state-dir", dir, RELAY_PATH_MAX - 1);
  if (unlink(path) != 0 && errno != ENOENT)
    return fsdp_set_error(FSDP_ERR_IO, "cannot remove the stale socket %s: %s", path, strerror(errno));
  memcpy(r->ep, "ipc://", 6);
  memcpy(r->ep + 6, path, (size_t)n + 1);
  if (zmq_bind(r->sock, r->ep) != 0)
    return fsdp_set_error(FSDP_ERR_COMM, "cannot bind the workers' endpoint %s: %s", r->ep, zmq_strerror(zmq_errno()));
  r->path_fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (r->path_fd < 0 || fstat(r->path_fd, &st) != 0 || !S_ISSOCK(st.st_mode) || chmod(path, 0666) != 0)
    return fsdp_set_error(FSDP_ERR_IO, "cannot open the workers' socket %s: %s", path, strerror(errno ? errno : EINVAL));
  return FSDP_OK;
}

fsdp_status relay_new(uv_loop_t *uv, void *zctx, const char *dir, relay_up_fn up, void *arg, relay **out) {
  *out = NULL;
  relay *r = calloc(1, sizeof *r);
  if (!r) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the relay");
  r->up = up;
  r->arg = arg;
  r->path_fd = -1;
  fsdp_status rc;
  TRY_GOTO(stepagg_new(&r->agg), rc, fail);
  r->sock = zmq_socket(zctx, ZMQ_ROUTER);
  if (!r->sock) {
    rc = fsdp_set_error(FSDP_ERR_COMM, "zmq_socket(ROUTER): %s", zmq_strerror(zmq_errno()));
    goto fail;
  }
  TRY_GOTO(wire_socket_setup(r->sock), rc, fail);
  int hwm = 0;
  zmq_setsockopt(r->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(r->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
  TRY_GOTO(bind_in(r, dir), rc, fail);
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
  if (r->path_fd >= 0) {
    close(r->path_fd);
    unlink(r->ep + strlen("ipc://"));
  }
  free(r->workers);
  while (r->jobs) {
    rjob *j = r->jobs;
    r->jobs = j->next;
    job_free(j);
  }
  stepagg_destroy(&r->agg);
  free(r);
}
