/* coordinator — see coordinator.h. */
#define _GNU_SOURCE
#include "coordinator.h"

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ckpt.h"
#include "curve.h"
#include "jobs_db.h"
#include "jobspec.h"
#include "log.h"
#include "loop.h"
#include "metrics.h"
#include "planmsg.h"
#include "wire.h"

#define LOST_BEATS 3
#define TICK_MS 250
#define START_TIMEOUT_MIN_S 120.0   /* spawn → every rank ready; covers a cold start of a big model */
#define STEP_TIMEOUT_MIN_S 300.0    /* no step finished for this long (or 2·spec timeout_s) fails the job */
#define KILL_GRACE_S 3.0            /* SIGTERM → SIGKILL for cancelled jobs */
#define DRAIN_LIMIT_S 30.0
#define SECONDARY_GRACE_S 1.0       /* see job_t.pending */          /* a job's devices are freed at the latest this long after it ended */
#define LOG_CHUNK_DEFAULT 65536u
#define LOG_CHUNK_MAX (WIRE_MAX_STRING - 4096)

enum { ST_QUEUED = 1, ST_STARTING, ST_RUNNING, ST_SUCCEEDED, ST_FAILED, ST_CANCELLED };
static const char *const state_names[] = {"?", "queued", "starting", "running", "succeeded", "failed", "cancelled"};

typedef struct slot {
  int kind;                  /* fsdp.DeviceKind */
  uint32_t index;
  char name[128];
  uint64_t mem;
  uint64_t job_id;           /* 0: free */
  uint32_t rank;
} slot_t;

typedef struct node {
  uint32_t id;
  char name[256];
  uint8_t ident[WIRE_MAX_ENV_FRAME];
  size_t ident_len;
  int lost;
  double last_seen;          /* monotonic */
  double last_seen_wall;
  slot_t *slots;
  int nslots;
} node_t;

typedef struct rank_st {
  int node;                  /* index into c->nodes */
  int slot;
  uint8_t ident[WIRE_MAX_ENV_FRAME];
  size_t ident_len;          /* 0 until hello */
  int alive;                 /* spawned, no worker_exit yet */
  int ready, stopped;
  int errored;               /* sent worker_error: its own exit is a consequence, not a cause */
} rank_st;

typedef struct job {
  struct job *next;
  uint64_t id;
  int state;
  int done;                  /* terminal; kept until its workers are reaped (drain) */
  char reason[1024];
  char *spec_text, *spec_path, *base_dir;
  char job_dir[PATH_MAX + 64];
  jobspec_t spec;
  plan_t *plan;
  Fsdp__Plan *plan_pb;
  int world, kind;
  char token[40];
  rank_st *ranks;
  int nready, nstopped, nalive;
  uint32_t start_step, next_step, done_step, steps;
  Fsdp__Msg **reports[2];    /* reports[s % 2][rank] for the (up to) two steps in flight */
  int nreports[2];
  FILE *metrics;
  double deadline;           /* monotonic: start or step timeout; 0 none */
  double kill_at, drain_until;
  double step_timeout, start_timeout;
  /* A communication error is often the echo of another rank's death (its peer's socket closed
   * before that rank's exit reached us): such a failure waits SECONDARY_GRACE_S for a more
   * direct cause (a rank killed by a signal, exiting on its own, a non-communication error). */
  char pending[1024];
  double pending_until;
  /* Restarts ([job] max_restarts, docs/checkpoints.md): attempt counts from 0; a failed attempt with
   * restarts left kills its workers and waits (restart_pending) until they are reaped, then the job
   * is queued again. Each attempt has its own rendezvous namespace, so no stale key is ever read. */
  int attempt;
  int restart_pending;
  char kv_prefix[64];
} job_t;

typedef struct kv_entry {
  struct kv_entry *next;
  char *key;
  uint8_t *val;
  size_t len;
} kv_entry;

typedef struct kv_wait {
  struct kv_wait *next;
  uint64_t job_id;
  char *key;
  wire_env env;
} kv_wait;

struct coord {
  uv_loop_t *uv;
  coord_config cfg;
  char state_dir[PATH_MAX];
  char ctl_ep[PATH_MAX + 16], listen_ep[PATH_MAX + 16];
  void *ctl, *cluster;
  loop_zsock *ctl_zs, *cluster_zs;
  int ctl_bound;
  jobs_db *db;
  node_t *nodes;
  int nnodes;
  uint32_t next_node_id;
  job_t *jobs;               /* active jobs (queued, starting, running, draining), by id */
  kv_entry *kv;
  kv_wait *kv_waits;
  uv_timer_t tick;
  uv_timer_t bind_timer;     /* embedded: serve ctl after 3 s even if no agent registered */
  int bind_timer_used;
  int handles;
  void *zctx;
  int shutting_down;
  void (*shutdown_done)(void *);
  void *shutdown_arg;
  double shutdown_deadline;
  uint64_t bad_msgs;
  /* CURVE (tcp:// endpoints): the server keypair from STATE/keys/ and the ZAP handler that admits
   * clients listed in STATE/keys/authorized (plus this daemon's own key: the embedded agent). */
  int curve;
  char server_pub[CURVE_KEY_LEN + 1], server_sec[CURVE_KEY_LEN + 1];
  char authorized_path[PATH_MAX + 32];
  void *zap;
  loop_zsock *zap_zs;
  char last_rejected[CURVE_KEY_LEN + 1];
  double last_rejected_at;
};

/* ---------------------------------------------------------------- small helpers */

/* Append one timestamped line to DIR/job.log, the coordinator's record of a job. */
static void job_log_dir(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_log_dir(const char *dir, const char *fmt, ...) {
  char path[PATH_MAX + 128], line[2048];
  snprintf(path, sizeof path, "%s/job.log", dir);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%SZ ", &tm);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    if (write(fd, line, (size_t)n) < 0) log_warn("cannot write %s: %s", path, strerror(errno));
    close(fd);
  }
}
#define job_log(j, ...) job_log_dir((j)->job_dir, __VA_ARGS__)

static const char *sig_name(int sig) {
  const char *s = sigabbrev_np(sig);
  return s ? s : "?";
}

static fsdp_status mkdir_p(const char *path, mode_t mode) {
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
      *p = '/';
    }
  if (mkdir(tmp, mode) != 0 && errno != EEXIST) return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  return FSDP_OK;
}

static void env_ident(wire_env *env, const uint8_t *ident, size_t len) {
  env->n = 0;
  wire_env_push(env, ident, len);
  wire_env_push(env, NULL, 0);
}

static void cluster_send(coord_t *c, const uint8_t *ident, size_t len, Fsdp__Msg *m) {
  wire_env env;
  env_ident(&env, ident, len);
  fsdp_status rc = wire_send(c->cluster, &env, m, ZMQ_DONTWAIT);
  if (rc != FSDP_OK)
    log_warn("cannot send %s on the cluster socket: %s", wire_body_name(m->body_case),
             rc == FSDP_ERR_TIMEOUT ? "peer queue full" : fsdp_last_error());
}

static void reply(void *sock, const wire_env *env, Fsdp__Msg *m) {
  fsdp_status rc = wire_send(sock, env, m, ZMQ_DONTWAIT);
  if (rc != FSDP_OK && rc != FSDP_ERR_TIMEOUT) log_warn("cannot send %s: %s", wire_body_name(m->body_case), fsdp_last_error());
}

static void reply_error(void *sock, const wire_env *env, fsdp_status code, const char *msg) {
  Fsdp__Error e = FSDP__ERROR__INIT;
  e.code = (uint32_t)code;
  e.message = (char *)msg;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_ERROR;
  m.error = &e;
  reply(sock, env, &m);
}

static void reply_ack(void *sock, const wire_env *env) {
  Fsdp__Ack a = FSDP__ACK__INIT;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_ACK;
  m.ack = &a;
  reply(sock, env, &m);
}

/* The message recorded by fsdp_set_error, without the "source.c:123: " prefix of our own code
 * (users see it); a prefix that names their file ("job.ini:7: ") is kept. */
static const char *user_error(void) {
  const char *e = fsdp_last_error();
  const char *p = strstr(e, ": ");
  if (!p || p - e > 64) return e;
  const char *colon = p;
  while (colon > e && colon[-1] >= '0' && colon[-1] <= '9') colon--;
  if (colon == p || colon == e || colon[-1] != ':') return e;   /* not "...:<digits>: " */
  size_t nlen = (size_t)(colon - 1 - e);
  if ((nlen > 2 && !strncmp(colon - 3, ".c:", 3)) || (nlen > 3 && !strncmp(colon - 4, ".cc:", 4))) return p + 2;
  return e;
}

static job_t *find_job(coord_t *c, uint64_t id) {
  for (job_t *j = c->jobs; j; j = j->next)
    if (j->id == id) return j;
  return NULL;
}

static node_t *find_node_ident(coord_t *c, const uint8_t *id, size_t len) {
  for (int i = 0; i < c->nnodes; i++)
    if (c->nodes[i].ident_len == len && !memcmp(c->nodes[i].ident, id, len)) return &c->nodes[i];
  return NULL;
}

static job_t *find_worker(coord_t *c, const uint8_t *id, size_t len, int *rank) {
  for (job_t *j = c->jobs; j; j = j->next) {
    if (!j->ranks) continue;
    for (int r = 0; r < j->world; r++)
      if (j->ranks[r].ident_len == len && !memcmp(j->ranks[r].ident, id, len)) {
        *rank = r;
        return j;
      }
  }
  return NULL;
}

/* ---------------------------------------------------------------- job lifecycle */

static void set_state(coord_t *c, job_t *j, int state, const char *reason) {
  j->state = state;
  if (reason) snprintf(j->reason, sizeof j->reason, "%s", reason);
  if (jobs_db_set_state(c->db, j->id, state, reason, loop_now_wall()) != FSDP_OK)
    log_error("job %llu: cannot record state %s: %s", (unsigned long long)j->id, state_names[state], fsdp_last_error());
  if (reason && *reason) {
    job_log(j, "%s: %s", state_names[state], reason);
    log_info("job %llu %s: %s", (unsigned long long)j->id, state_names[state], reason);
  } else {
    job_log(j, "%s", state_names[state]);
    log_info("job %llu %s", (unsigned long long)j->id, state_names[state]);
  }
}

static void free_reports(job_t *j) {
  for (int s = 0; s < 2; s++) {
    if (!j->reports[s]) continue;
    for (int r = 0; r < j->world; r++) wire_free(&j->reports[s][r]);
    j->nreports[s] = 0;
  }
}

static void job_free(job_t *j) {
  free_reports(j);
  free(j->reports[0]);
  free(j->reports[1]);
  if (j->metrics) fclose(j->metrics);
  plan_destroy(&j->plan);
  planmsg_free(&j->plan_pb);
  free(j->ranks);
  free(j->spec_text);
  free(j->spec_path);
  free(j->base_dir);
  free(j);
}

static void kv_drop_job(coord_t *c, uint64_t job_id, const char *why) {
  char prefix[64];
  int plen = snprintf(prefix, sizeof prefix, "job-%llu/", (unsigned long long)job_id);
  for (kv_entry **p = &c->kv; *p;) {
    if (!strncmp((*p)->key, prefix, (size_t)plen)) {
      kv_entry *e = *p;
      *p = e->next;
      free(e->key);
      free(e->val);
      free(e);
    } else {
      p = &(*p)->next;
    }
  }
  for (kv_wait **p = &c->kv_waits; *p;) {
    if ((*p)->job_id == job_id) {
      kv_wait *w = *p;
      *p = w->next;
      reply_error(c->cluster, &w->env, FSDP_ERR_CANCELLED, why);
      free(w->key);
      free(w);
    } else {
      p = &(*p)->next;
    }
  }
}

static void free_slot(coord_t *c, job_t *j, int r) {
  rank_st *rk = &j->ranks[r];
  if (rk->node < 0) return;
  node_t *n = &c->nodes[rk->node];
  slot_t *s = &n->slots[rk->slot];
  if (s->job_id == j->id && s->rank == (uint32_t)r) s->job_id = 0;
  rk->node = -1;
}

static void send_kill(coord_t *c, job_t *j, int sig) {
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
    cluster_send(c, c->nodes[i].ident, c->nodes[i].ident_len, &m);
  }
}

static void try_schedule(coord_t *c);
static void job_reset_attempt(coord_t *c, job_t *j);
static void bind_ctl(coord_t *c);
static void requeue(coord_t *c);
static void note_restart_failures(coord_t *c);

/* Free the jobs that ended and whose workers are all reaped (or whose drain limit passed), then
 * schedule. Jobs are freed only here, at the end of a loop callback, never while a handler still
 * holds a pointer to one. */
static void reap_drained(coord_t *c) {
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
      for (int r = 0; r < j->world; r++) free_slot(c, j, r);
    if (j->nalive > 0)
      log_warn("job %llu: %d workers did not report their exit within %.0f s; their devices are freed anyway",
               (unsigned long long)j->id, j->nalive, DRAIN_LIMIT_S);
    *p = j->next;
    job_free(j);
    reaped = 1;
  }
  if (reaped) try_schedule(c);
}

/* Move J to a terminal STATE; its live workers get SIG (0: none, they are exiting on their own). */
static void job_finish(coord_t *c, job_t *j, int state, const char *reason, int sig) {
  if (j->done) return;
  j->done = 1;
  set_state(c, j, state, reason);
  kv_drop_job(c, j->id, state == ST_SUCCEEDED ? "the job has finished" : reason ? reason : "the job ended");
  if (j->metrics) {
    fclose(j->metrics);
    j->metrics = NULL;
  }
  free_reports(j);
  double now = loop_now_mono();
  j->deadline = 0;
  j->drain_until = now + DRAIN_LIMIT_S;
  if (j->ranks && j->nalive > 0 && sig) {
    send_kill(c, j, sig);
    j->kill_at = sig == SIGKILL ? 0 : now + KILL_GRACE_S;
  } else if (j->nalive > 0) {
    j->kill_at = now + 10.0;   /* succeeded: they were told to stop; kill stragglers after 10 s */
  }
}

static void job_fail(coord_t *c, job_t *j, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void job_fail(coord_t *c, job_t *j, const char *fmt, ...) {
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
    set_state(c, j, ST_QUEUED, why);
    kv_drop_job(c, j->id, reason);
    free_reports(j);
    if (j->metrics) {
      fclose(j->metrics);
      j->metrics = NULL;
    }
    j->deadline = 0;
    j->pending[0] = 0;
    j->drain_until = loop_now_mono() + DRAIN_LIMIT_S;
    if (j->ranks && j->nalive > 0) send_kill(c, j, SIGKILL);
    return;
  }
  job_finish(c, j, ST_FAILED, reason, SIGKILL);
}

/* The failed attempt's workers are all reaped (or the drain limit passed): free its devices and
 * per-attempt state; the job is queued (its state already says so) and try_schedule starts it. */
static void job_reset_attempt(coord_t *c, job_t *j) {
  if (j->ranks)
    for (int r = 0; r < j->world; r++) free_slot(c, j, r);
  if (j->nalive > 0)
    log_warn("job %llu: %d workers of the failed attempt did not report their exit within %.0f s; restarting anyway",
             (unsigned long long)j->id, j->nalive, DRAIN_LIMIT_S);
  free_reports(j);
  free(j->reports[0]);
  free(j->reports[1]);
  j->reports[0] = j->reports[1] = NULL;
  free(j->ranks);
  j->ranks = NULL;
  planmsg_free(&j->plan_pb);
  j->nready = j->nstopped = j->nalive = 0;
  j->start_step = j->next_step = j->done_step = 0;
  j->kill_at = 0;
  j->pending[0] = 0;
  j->restart_pending = 0;
}

/* ---------------------------------------------------------------- scheduling */

static int node_free_slots(const node_t *n, int kind) {
  if (n->lost) return 0;
  int f = 0;
  for (int s = 0; s < n->nslots; s++) f += n->slots[s].kind == kind && n->slots[s].job_id == 0;
  return f;
}

static void send_spawn(coord_t *c, job_t *j, int r, int local_ranks) {
  rank_st *rk = &j->ranks[r];
  node_t *n = &c->nodes[rk->node];
  char job[32], rank[32], local[64], jobenv[64];
  snprintf(job, sizeof job, "%llu", (unsigned long long)j->id);
  snprintf(rank, sizeof rank, "%d", r);
  snprintf(local, sizeof local, "FSDPD_LOCAL_RANKS=%d", local_ranks);
  snprintf(jobenv, sizeof jobenv, "FSDPD_JOB_ID=%llu", (unsigned long long)j->id);
  char *argv[] = {"fsdp-worker", "--connect", c->listen_ep, "--job", job, "--rank", rank, "--token", j->token,
                  "--log-level", (char *)(c->cfg.worker_log_level ? c->cfg.worker_log_level : "info")};
  char *env[] = {local, jobenv};
  Fsdp__SpawnReq s = FSDP__SPAWN_REQ__INIT;
  s.job_id = j->id;
  s.rank = (uint32_t)r;
  s.n_argv = sizeof argv / sizeof argv[0];
  s.argv = argv;
  s.n_env = 2;
  s.env = env;
  s.cwd = j->job_dir;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_SPAWN_REQ;
  m.spawn_req = &s;
  cluster_send(c, n->ident, n->ident_len, &m);
  rk->alive = 1;
  j->nalive++;
}

static void job_start(coord_t *c, job_t *j) {
  /* Pack ranks by node: the nodes with the most free devices of the kind first, filled in order. */
  int *order = calloc((size_t)c->nnodes, sizeof *order), *cnt = calloc((size_t)c->nnodes, sizeof *cnt);
  j->ranks = calloc((size_t)j->world, sizeof *j->ranks);
  j->reports[0] = calloc((size_t)j->world, sizeof *j->reports[0]);
  j->reports[1] = calloc((size_t)j->world, sizeof *j->reports[1]);
  if (!order || !cnt || !j->ranks || !j->reports[0] || !j->reports[1]) {
    free(order), free(cnt);
    job_fail(c, j, "out of memory while starting the job");
    return;
  }
  for (int i = 0; i < c->nnodes; i++) order[i] = i;
  for (int i = 1; i < c->nnodes; i++)   /* insertion sort by free slots, descending; stable */
    for (int k = i; k > 0 && node_free_slots(&c->nodes[order[k]], j->kind) > node_free_slots(&c->nodes[order[k - 1]], j->kind); k--) {
      int t = order[k];
      order[k] = order[k - 1];
      order[k - 1] = t;
    }
  int r = 0;
  for (int oi = 0; oi < c->nnodes && r < j->world; oi++) {
    node_t *n = &c->nodes[order[oi]];
    if (n->lost) continue;
    for (int s = 0; s < n->nslots && r < j->world; s++) {
      slot_t *sl = &n->slots[s];
      if (sl->kind != j->kind || sl->job_id) continue;
      sl->job_id = j->id;
      sl->rank = (uint32_t)r;
      j->ranks[r].node = order[oi];
      j->ranks[r].slot = s;
      cnt[order[oi]]++;
      r++;
    }
  }
  free(order);
  if (planmsg_new(j->plan, &j->plan_pb) != FSDP_OK) {
    free(cnt);
    job_fail(c, j, "%s", user_error());
    return;
  }
  uint8_t rnd[16];
  if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
    for (size_t i = 0; i < sizeof rnd; i++) rnd[i] = (uint8_t)(rand() ^ (int)(loop_now_mono() * 1e6));
  for (size_t i = 0; i < sizeof rnd; i++) sprintf(j->token + 2 * i, "%02x", rnd[i]);
  char path[PATH_MAX + 128];
  snprintf(path, sizeof path, "%s/metrics.jsonl", j->job_dir);
  j->metrics = fopen(path, "a");
  if (!j->metrics) log_warn("job %llu: cannot open %s: %s", (unsigned long long)j->id, path, strerror(errno));
  /* attempt 0 keeps the plain "job-ID/"; later attempts nest under it, so kv_drop_job drops them too */
  if (j->attempt == 0) snprintf(j->kv_prefix, sizeof j->kv_prefix, "job-%llu/", (unsigned long long)j->id);
  else snprintf(j->kv_prefix, sizeof j->kv_prefix, "job-%llu/a%d/", (unsigned long long)j->id, j->attempt);
  set_state(c, j, ST_STARTING, NULL);
  char where[1024];
  int wn = 0;
  for (int i = 0; i < c->nnodes; i++)
    if (cnt[i] && wn < (int)sizeof where - 64) wn += snprintf(where + wn, sizeof where - (size_t)wn, "%s%s×%d", wn ? ", " : "", c->nodes[i].name, cnt[i]);
  job_log(j, "ranks on %s", wn ? where : "-");
  for (int k = 0; k < j->world; k++) send_spawn(c, j, k, cnt[j->ranks[k].node]);
  free(cnt);
  double t = 2 * j->spec.timeout_s;
  j->start_timeout = t > START_TIMEOUT_MIN_S ? t : START_TIMEOUT_MIN_S;
  j->deadline = loop_now_mono() + j->start_timeout;
  j->step_timeout = t > STEP_TIMEOUT_MIN_S ? t : STEP_TIMEOUT_MIN_S;
}

static void try_schedule(coord_t *c) {
  if (c->shutting_down) return;
  /* Strict FIFO: the oldest queued job starts first; later jobs wait behind it. */
  for (;;) {
    job_t *head = NULL;
    for (job_t *j = c->jobs; j; j = j->next)
      if (j->state == ST_QUEUED && !j->done && !j->restart_pending && (!head || j->id < head->id)) head = j;
    if (!head) return;
    int free_n = 0;
    for (int i = 0; i < c->nnodes; i++) free_n += node_free_slots(&c->nodes[i], head->kind);
    if (free_n < head->world) return;
    job_start(c, head);
  }
}

/* ---------------------------------------------------------------- step driving */

static void send_to_rank(coord_t *c, job_t *j, int r, Fsdp__Msg *m) {
  rank_st *rk = &j->ranks[r];
  if (rk->ident_len) cluster_send(c, rk->ident, rk->ident_len, m);
}

static void send_step(coord_t *c, job_t *j, uint32_t step) {
  Fsdp__StepCmd s = FSDP__STEP_CMD__INIT;
  s.step = step;
  s.checkpoint = ckpt_due(&j->spec, (int)step);   /* every K-th step and the last (docs/checkpoints.md) */
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_STEP_CMD;
  m.step_cmd = &s;
  for (int r = 0; r < j->world; r++) send_to_rank(c, j, r, &m);
  j->next_step = step + 1;
}

static void send_stop(coord_t *c, job_t *j) {
  Fsdp__StopCmd s = FSDP__STOP_CMD__INIT;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_STOP_CMD;
  m.stop_cmd = &s;
  for (int r = 0; r < j->world; r++) send_to_rank(c, j, r, &m);
  j->next_step = j->steps + 1;
}

/* Keep two steps in flight: step s+1 is sent before the reports of step s arrive. */
static void fill_window(coord_t *c, job_t *j) {
  while (j->next_step <= j->steps && j->next_step <= j->done_step + 2) send_step(c, j, j->next_step);
  if (j->done_step >= j->steps && j->next_step == j->steps + 1) {
    send_stop(c, j);
    j->next_step = j->steps + 2;   /* stop sent */
  }
}

static void step_complete(coord_t *c, job_t *j, uint32_t step) {
  int b = step % 2;
  Fsdp__StepReport **reps = malloc((size_t)j->world * sizeof *reps);
  if (!reps) {
    job_fail(c, j, "out of memory while recording step %u", step);
    return;
  }
  for (int r = 0; r < j->world; r++) reps[r] = j->reports[b][r]->step_report;
  char *line = NULL;
  Fsdp__StepSummary sum = FSDP__STEP_SUMMARY__INIT;
  metrics_summarize(reps, (size_t)j->world, &sum);
  if (metrics_line(reps, (size_t)j->world, &line) == FSDP_OK) {
    if (j->metrics) {
      fputs(line, j->metrics);
      fputc('\n', j->metrics);
      fflush(j->metrics);
    }
  } else {
    log_error("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
  }
  jobs_db_step st = {.step = (int)step, .loss = sum.loss, .lr = sum.lr, .grad_norm = sum.grad_norm,
                     .tokens = sum.tokens, .step_ms = sum.step_ms, .tokens_per_s = sum.tokens_per_s};
  if (jobs_db_add_step(c->db, j->id, &st, line ? line : "{}") != FSDP_OK)
    log_error("job %llu: cannot record step %u: %s", (unsigned long long)j->id, step, fsdp_last_error());
  free(line);
  free(reps);
  for (int r = 0; r < j->world; r++) wire_free(&j->reports[b][r]);
  j->nreports[b] = 0;
  j->done_step = step;
  j->deadline = loop_now_mono() + j->step_timeout;
  log_debug("job %llu step %u: loss %.4f, %.0f tokens/s", (unsigned long long)j->id, step, sum.loss, sum.tokens_per_s);
}

static void on_step_report(coord_t *c, job_t *j, int r, Fsdp__Msg **mp) {
  Fsdp__StepReport *rep = (*mp)->step_report;
  if (j->state != ST_RUNNING || j->done) return;
  if (rep->step <= j->done_step || rep->step >= j->next_step || rep->step > j->steps) {
    log_warn("job %llu rank %d: report for step %u outside the steps in flight (%u..%u); ignored",
             (unsigned long long)j->id, r, rep->step, j->done_step + 1, j->next_step - 1);
    return;
  }
  if (rep->stats->rank != (uint32_t)r) {
    log_warn("job %llu rank %d: report carries rank %u; ignored", (unsigned long long)j->id, r, rep->stats->rank);
    return;
  }
  int b = rep->step % 2;
  if (j->reports[b][r]) {
    log_warn("job %llu rank %d: second report for step %u; ignored", (unsigned long long)j->id, r, rep->step);
    return;
  }
  j->reports[b][r] = *mp;
  *mp = NULL;
  j->nreports[b]++;
  /* Complete in order: the next step to finish is done_step+1; its successor may already be full. */
  while (!j->done && j->done_step < j->steps && j->nreports[(j->done_step + 1) % 2] == j->world) {
    step_complete(c, j, j->done_step + 1);
    fill_window(c, j);
  }
}

static void check_stopped(coord_t *c, job_t *j) {
  if (!j->done && !j->restart_pending && j->nstopped == j->world) job_finish(c, j, ST_SUCCEEDED, NULL, 0);
}

/* ---------------------------------------------------------------- cluster service */

static void on_register(coord_t *c, const wire_env *env, const Fsdp__AgentRegister *reg) {
  const uint8_t *id = env->data[0];
  size_t idlen = env->len[0];
  node_t *n = find_node_ident(c, id, idlen);
  if (n) {
    /* The same agent again (its welcome was lost, or it was declared lost): keep its busy slots. */
    for (int s = 0; s < n->nslots; s++)
      if (n->slots[s].job_id) {
        log_info("node %u (%s) registered again with jobs on it; keeping its id", n->id, n->name);
        goto welcome;
      }
    free(n->slots);
    n->slots = NULL;
    n->nslots = 0;
  } else {
    node_t *nn = realloc(c->nodes, (size_t)(c->nnodes + 1) * sizeof *nn);
    if (!nn) {
      log_error("cannot add node %s: out of memory", reg->name);
      return;
    }
    c->nodes = nn;
    n = &c->nodes[c->nnodes++];
    memset(n, 0, sizeof *n);
    n->id = ++c->next_node_id;
    memcpy(n->ident, id, idlen);
    n->ident_len = idlen;
  }
  snprintf(n->name, sizeof n->name, "%s", reg->name);
  size_t ncpu_slots = 0;
  for (size_t i = 0; i < reg->n_gpus; i++) ncpu_slots += reg->gpus[i]->kind == FSDP__DEVICE_KIND__DEVICE_KIND_CPU;
  /* CPU slots: those listed (with their memory), else cpu_slots entries of unknown memory. */
  size_t total = reg->n_gpus + (ncpu_slots ? 0 : reg->cpu_slots);
  n->slots = calloc(total ? total : 1, sizeof *n->slots);
  if (!n->slots) {
    log_error("cannot add node %s: out of memory", reg->name);
    return;
  }
  n->nslots = 0;
  for (size_t i = 0; !ncpu_slots && i < reg->cpu_slots; i++) {
    slot_t *s = &n->slots[n->nslots++];
    s->kind = FSDP__DEVICE_KIND__DEVICE_KIND_CPU;
    s->index = (uint32_t)i;
    snprintf(s->name, sizeof s->name, "cpu");
  }
  for (size_t i = 0; i < reg->n_gpus; i++) {
    slot_t *s = &n->slots[n->nslots++];
    s->kind = reg->gpus[i]->kind;
    s->index = reg->gpus[i]->index;
    s->mem = reg->gpus[i]->mem_bytes;
    snprintf(s->name, sizeof s->name, "%s", reg->gpus[i]->name);
  }
  log_info("node %u (%s, pid %u) joined: %d device slots", n->id, n->name, reg->pid, n->nslots);
welcome:
  n->lost = 0;
  n->last_seen = loop_now_mono();
  n->last_seen_wall = loop_now_wall();
  Fsdp__AgentWelcome w = FSDP__AGENT_WELCOME__INIT;
  w.node_id = n->id;
  w.heartbeat_s = c->cfg.heartbeat_s;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_AGENT_WELCOME;
  m.agent_welcome = &w;
  cluster_send(c, id, idlen, &m);
  if (!c->ctl_bound && c->cfg.wait_first_node) bind_ctl(c);
  try_schedule(c);
}

static void on_worker_exit(coord_t *c, node_t *n, const Fsdp__WorkerExit *ex) {
  job_t *j = find_job(c, ex->job_id);
  if (!j || !j->ranks || ex->rank >= (uint32_t)j->world) {
    log_debug("exit of job %llu rank %u: no such running job", (unsigned long long)ex->job_id, ex->rank);
    return;
  }
  rank_st *rk = &j->ranks[ex->rank];
  if (!rk->alive) return;
  if (rk->node >= 0 && &c->nodes[rk->node] != n) {
    log_warn("node %s reports the exit of job %llu rank %u, which runs elsewhere; ignored", n->name,
             (unsigned long long)j->id, ex->rank);
    return;
  }
  rk->alive = 0;
  j->nalive--;
  free_slot(c, j, (int)ex->rank);
  int clean = ex->exit_status == 0 && ex->term_signal == 0;
  if (!j->done) {
    if (clean && j->next_step > j->steps + 1 && !rk->stopped) {   /* exited 0 after stop: as good as its ack */
      rk->stopped = 1;
      j->nstopped++;
      check_stopped(c, j);
    } else if (rk->errored && j->pending[0] && !ex->term_signal) {
      /* the rank that reported a communication error is leaving: wait for the cause (on_tick) */
    } else if (!rk->stopped) {
      if (ex->term_signal)
        job_fail(c, j, "rank %u was killed by signal %d (SIG%s)", ex->rank, ex->term_signal, sig_name(ex->term_signal));
      else if (ex->exit_status == 127 && !rk->ident_len)
        job_fail(c, j, "rank %u could not be started on node %s (exit status 127; see worker-%u.log)", ex->rank,
                 n->name, ex->rank);
      else
        job_fail(c, j, "rank %u exited with status %d%s", ex->rank, ex->exit_status,
                 clean ? " before the job finished" : "");
    }
  }
  try_schedule(c);
}

static void on_log_chunk(coord_t *c, const Fsdp__LogChunk *lc) {
  job_t *j = find_job(c, lc->job_id);
  char path[PATH_MAX + 128];
  if (j) {
    snprintf(path, sizeof path, "%s/worker-%u.log", j->job_dir, lc->rank);
  } else {   /* a finished job's last lines: the directory is the standard one */
    snprintf(path, sizeof path, "%s/jobs/%llu/worker-%u.log", c->state_dir, (unsigned long long)lc->job_id, lc->rank);
    struct stat st;
    char dir[PATH_MAX + 128];
    snprintf(dir, sizeof dir, "%s/jobs/%llu", c->state_dir, (unsigned long long)lc->job_id);
    if (stat(dir, &st) != 0) return;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    log_warn("cannot open %s: %s", path, strerror(errno));
    return;
  }
  if (write(fd, lc->data.data, lc->data.len) != (ssize_t)lc->data.len) log_warn("short write to %s", path);
  close(fd);
}

static void on_worker_hello(coord_t *c, const wire_env *env, const Fsdp__WorkerHello *h) {
  job_t *j = find_job(c, h->job_id);
  if (!j || j->done || !j->ranks || h->rank >= (uint32_t)j->world || strcmp(h->token, j->token) != 0) {
    log_warn("worker_hello for job %llu rank %u (pid %u) with an unknown job, rank or token; ignored",
             (unsigned long long)h->job_id, h->rank, h->pid);
    return;
  }
  rank_st *rk = &j->ranks[h->rank];
  if (rk->node < 0 || !rk->alive) {
    log_warn("worker_hello for job %llu rank %u, which is not running; ignored", (unsigned long long)j->id, h->rank);
    return;
  }
  if (rk->ident_len && (rk->ident_len != env->len[0] || memcmp(rk->ident, env->data[0], env->len[0]))) {
    log_warn("job %llu rank %u said hello twice from different sockets; ignored", (unsigned long long)j->id, h->rank);
    return;
  }
  memcpy(rk->ident, env->data[0], env->len[0]);
  rk->ident_len = env->len[0];
  node_t *n = &c->nodes[rk->node];
  slot_t *sl = &n->slots[rk->slot];
  Fsdp__WorkerSetup s = FSDP__WORKER_SETUP__INIT;
  s.job_id = j->id;
  s.rank = h->rank;
  s.world = (uint32_t)j->world;
  s.spec_text = j->spec_text;
  s.spec_path = j->spec_path;
  s.base_dir = j->base_dir;
  s.plan = j->plan_pb;
  s.comm = (char *)(j->spec.comm == COMM_NCCL ? "nccl"
                    : j->spec.comm == COMM_GLOO ? "gloo"
                    : j->kind == FSDP__DEVICE_KIND__DEVICE_KIND_CUDA ? "nccl" : "gloo");
  s.kv_prefix = j->kv_prefix;
  s.job_dir = j->job_dir;
  s.device_index = sl->kind == FSDP__DEVICE_KIND__DEVICE_KIND_CUDA ? (int32_t)sl->index : -1;
  s.start_step = 0;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_SETUP;
  m.worker_setup = &s;
  cluster_send(c, rk->ident, rk->ident_len, &m);
  log_debug("job %llu rank %u (pid %u) said hello; setup sent", (unsigned long long)j->id, h->rank, h->pid);
}

/* A job that resumes from the checkpoint of step S (a restart) keeps in metrics.jsonl only the
 * lines of steps ≤ S: the failed attempt's later steps are about to be trained again, and the file
 * must keep one line per step. The file is rewritten beside itself and renamed over. */
static void metrics_truncate(job_t *j, uint32_t last_step) {
  char path[PATH_MAX + 128], tmp[PATH_MAX + 160];
  snprintf(path, sizeof path, "%s/metrics.jsonl", j->job_dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (j->metrics) fflush(j->metrics);
  FILE *in = fopen(path, "r");
  if (!in) return;
  FILE *out = fopen(tmp, "w");
  if (!out) {
    log_warn("job %llu: cannot rewrite %s: %s", (unsigned long long)j->id, path, strerror(errno));
    fclose(in);
    return;
  }
  char *line = NULL;
  size_t cap = 0;
  int dropped = 0;
  while (getline(&line, &cap, in) > 0) {
    json_t *o = json_loads(line, 0, NULL);
    json_int_t step = o ? json_integer_value(json_object_get(o, "step")) : 0;
    json_decref(o);
    if (step > (json_int_t)last_step) dropped++;
    else fputs(line, out);
  }
  free(line);
  fclose(in);
  if (fclose(out) != 0 || rename(tmp, path) != 0) {
    log_warn("job %llu: cannot rewrite %s: %s", (unsigned long long)j->id, path, strerror(errno));
    unlink(tmp);
    return;
  }
  if (j->metrics) fclose(j->metrics);
  j->metrics = fopen(path, "a");
  if (dropped) job_log(j, "metrics.jsonl: dropped %d line(s) after step %u, which the restart trains again", dropped, last_step);
}

static void on_worker_ready(coord_t *c, job_t *j, int r, const Fsdp__WorkerReady *rd) {
  if (j->done || j->state != ST_STARTING || j->ranks[r].ready) return;
  if (rd->rank != (uint32_t)r) {
    log_warn("job %llu: rank %d says it is rank %u; ignored", (unsigned long long)j->id, r, rd->rank);
    return;
  }
  if (j->nready > 0 && rd->start_step != j->start_step) {
    job_fail(c, j, "rank %d starts at step %u but the others at step %u", r, rd->start_step, j->start_step);
    return;
  }
  j->start_step = rd->start_step;
  j->ranks[r].ready = 1;
  if (++j->nready < j->world) return;
  set_state(c, j, ST_RUNNING, NULL);
  if (j->start_step > 0) {
    job_log(j, "resuming from the checkpoint of step %u%s", j->start_step,
            j->start_step >= j->steps ? ": at or past the last step, nothing to train" : "");
    metrics_truncate(j, j->start_step);
  }
  if (j->start_step > j->steps) j->start_step = j->steps;
  j->done_step = j->start_step;
  j->next_step = j->start_step + 1;
  j->deadline = loop_now_mono() + j->step_timeout;
  fill_window(c, j);
}

static fsdp_status kv_key(job_t *j, const char *key, char *out, size_t cap) {
  const char *prefix = j->kv_prefix;
  size_t plen = strlen(prefix);
  /* Keys are namespaced by the job's kv_prefix; a key given without it gets it. */
  int n = strncmp(key, prefix, plen) == 0 ? snprintf(out, cap, "%s", key) : snprintf(out, cap, "%s%s", prefix, key);
  if (n < 0 || (size_t)n >= cap) return fsdp_set_error(FSDP_ERR_RANGE, "kv key '%s' is too long", key);
  return FSDP_OK;
}

static void kv_answer(coord_t *c, const wire_env *env, const kv_entry *e) {
  Fsdp__KvResp r = FSDP__KV_RESP__INIT;
  r.found = 1;
  r.value.data = e->val;
  r.value.len = e->len;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_KV_RESP;
  m.kv_resp = &r;
  reply(c->cluster, env, &m);
}

static void on_kv_set(coord_t *c, const wire_env *env, job_t *j, const Fsdp__KvSet *s) {
  char key[512];
  if (kv_key(j, s->key, key, sizeof key) != FSDP_OK) {
    reply_error(c->cluster, env, FSDP_ERR_RANGE, user_error());
    return;
  }
  kv_entry *e = NULL;
  for (kv_entry *x = c->kv; x; x = x->next)
    if (!strcmp(x->key, key)) e = x;
  if (!e) {
    e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key))) {
      free(e);
      reply_error(c->cluster, env, FSDP_ERR_NOMEM, "out of memory");
      return;
    }
    e->next = c->kv;
    c->kv = e;
  }
  free(e->val);
  e->val = malloc(s->value.len ? s->value.len : 1);
  e->len = s->value.len;
  if (s->value.len) memcpy(e->val, s->value.data, s->value.len);
  reply_ack(c->cluster, env);
  for (kv_wait **p = &c->kv_waits; *p;) {
    if (!strcmp((*p)->key, key)) {
      kv_wait *w = *p;
      *p = w->next;
      kv_answer(c, &w->env, e);
      free(w->key);
      free(w);
    } else {
      p = &(*p)->next;
    }
  }
}

static void on_kv_get(coord_t *c, const wire_env *env, job_t *j, const Fsdp__KvGet *g) {
  char key[512];
  if (kv_key(j, g->key, key, sizeof key) != FSDP_OK) {
    reply_error(c->cluster, env, FSDP_ERR_RANGE, user_error());
    return;
  }
  for (kv_entry *x = c->kv; x; x = x->next)
    if (!strcmp(x->key, key)) {
      kv_answer(c, env, x);
      return;
    }
  kv_wait *w = calloc(1, sizeof *w);
  if (!w || !(w->key = strdup(key))) {
    free(w);
    reply_error(c->cluster, env, FSDP_ERR_NOMEM, "out of memory");
    return;
  }
  w->job_id = j->id;
  w->env = *env;
  w->next = c->kv_waits;
  c->kv_waits = w;
}

static void on_cluster(void *sock, void *arg) {
  coord_t *c = arg;
  Fsdp__Msg *m = NULL;
  wire_env env;
  fsdp_status rc = wire_recv(sock, &env, &m, ZMQ_DONTWAIT);
  if (rc == FSDP_ERR_TIMEOUT) return;
  if (rc != FSDP_OK || env.n < 1) {
    c->bad_msgs++;
    log_warn("cluster: dropped a malformed message (%llu so far): %s", (unsigned long long)c->bad_msgs,
             rc != FSDP_OK ? fsdp_last_error() : "no envelope");
    wire_free(&m);
    return;
  }
  const uint8_t *id = env.data[0];
  size_t idlen = env.len[0];
  node_t *n = NULL;
  job_t *j = NULL;
  int r = -1;
  switch (m->body_case) {
  case FSDP__MSG__BODY_AGENT_REGISTER: on_register(c, &env, m->agent_register); break;
  case FSDP__MSG__BODY_HEARTBEAT:
    n = find_node_ident(c, id, idlen);
    if (!n || n->id != m->heartbeat->node_id) {
      log_debug("heartbeat from unknown node %u; asking it to register", m->heartbeat->node_id);
      reply_error(sock, &env, FSDP_ERR_NOTFOUND, "unknown node: register again");
      break;
    }
    if (n->lost) log_info("node %u (%s) is back", n->id, n->name);
    n->lost = 0;
    n->last_seen = loop_now_mono();
    n->last_seen_wall = loop_now_wall();
    break;
  case FSDP__MSG__BODY_WORKER_EXIT:
  case FSDP__MSG__BODY_LOG_CHUNK:
    n = find_node_ident(c, id, idlen);
    if (!n) {
      log_warn("%s from an unregistered agent; ignored", wire_body_name(m->body_case));
      break;
    }
    n->last_seen = loop_now_mono();
    if (m->body_case == FSDP__MSG__BODY_WORKER_EXIT) on_worker_exit(c, n, m->worker_exit);
    else on_log_chunk(c, m->log_chunk);
    break;
  case FSDP__MSG__BODY_WORKER_HELLO: on_worker_hello(c, &env, m->worker_hello); break;
  default:
    j = find_worker(c, id, idlen, &r);
    if (!j) {
      log_warn("%s from an unknown peer; ignored", wire_body_name(m->body_case));
      if (m->body_case == FSDP__MSG__BODY_KV_GET || m->body_case == FSDP__MSG__BODY_KV_SET)
        reply_error(sock, &env, FSDP_ERR_NOTFOUND, "unknown worker: say worker_hello first");
      break;
    }
    switch (m->body_case) {
    case FSDP__MSG__BODY_WORKER_READY: on_worker_ready(c, j, r, m->worker_ready); break;
    case FSDP__MSG__BODY_STEP_REPORT: on_step_report(c, j, r, &m); break;
    case FSDP__MSG__BODY_WORKER_ERROR: {
      if (j->done || j->restart_pending) break;   /* a failed attempt's echo: never held against the next one */
      j->ranks[r].errored = 1;
      uint32_t code = m->worker_error->code;
      if (code == FSDP_ERR_COMM || code == FSDP_ERR_TIMEOUT) {
        if (!j->pending[0]) {
          snprintf(j->pending, sizeof j->pending, "rank %d failed: %s", r, m->worker_error->message);
          j->pending_until = loop_now_mono() + SECONDARY_GRACE_S;
        }
      } else {
        job_fail(c, j, "rank %d failed: %s", r, m->worker_error->message);
      }
      break;
    }
    case FSDP__MSG__BODY_ACK:
      if (!j->done && j->next_step > j->steps + 1 && !j->ranks[r].stopped) {
        j->ranks[r].stopped = 1;
        j->nstopped++;
        check_stopped(c, j);
      }
      break;
    case FSDP__MSG__BODY_KV_SET:
      if (j->done || j->restart_pending) reply_error(sock, &env, FSDP_ERR_CANCELLED, j->reason);
      else on_kv_set(c, &env, j, m->kv_set);
      break;
    case FSDP__MSG__BODY_KV_GET:
      if (j->done || j->restart_pending) reply_error(sock, &env, FSDP_ERR_CANCELLED, j->reason);
      else on_kv_get(c, &env, j, m->kv_get);
      break;
    default: log_warn("job %llu rank %d: unexpected %s; ignored", (unsigned long long)j->id, r, wire_body_name(m->body_case));
    }
  }
  wire_free(&m);
  reap_drained(c);
}

/* ---------------------------------------------------------------- ctl service */

static void fill_info(const jobs_db_row *row, Fsdp__JobInfo *ji, Fsdp__StepSummary *last) {
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

static void ctl_submit(coord_t *c, const wire_env *env, const Fsdp__SubmitReq *req) {
  if (c->shutting_down) {
    reply_error(c->ctl, env, FSDP_ERR_STATE, "fsdpd is shutting down and accepts no new jobs");
    return;
  }
  job_t *j = calloc(1, sizeof *j);
  if (!j) {
    reply_error(c->ctl, env, FSDP_ERR_NOMEM, "out of memory");
    return;
  }
  char msg[1024];
  const char *origin = *req->spec_path ? req->spec_path : "<submitted job>";
  const char *base = *req->base_dir ? req->base_dir : c->state_dir;
  fsdp_status rc = jobspec_parse(req->spec_text, origin, base, &j->spec);
  if (rc != FSDP_OK) {
    log_warn("submit refused: %s", fsdp_last_error());
    reply_error(c->ctl, env, rc, user_error());
    goto fail;
  }
  if (j->spec.max_restarts > 0 && (j->spec.ckpt_every <= 0 || j->spec.resume != RESUME_AUTO)) {
    /* A restart without a checkpoint to resume from would silently train from step 0 again. */
    snprintf(msg, sizeof msg, "%s: [job] max_restarts = %d restarts from the newest checkpoint, so it needs "
             "[checkpoint] every > 0 (with a dir) and resume = auto; set them, or max_restarts = 0",
             origin, j->spec.max_restarts);
    log_warn("submit refused: %s", msg);
    reply_error(c->ctl, env, FSDP_ERR_INVALID, msg);
    goto fail;
  }
  j->world = j->spec.world_size;
  j->kind = j->spec.device == DEVICE_CUDA ? FSDP__DEVICE_KIND__DEVICE_KIND_CUDA : FSDP__DEVICE_KIND__DEVICE_KIND_CPU;
  rc = plan_build(&j->spec, j->world, &j->plan);
  if (rc != FSDP_OK) {
    log_warn("submit refused: %s", fsdp_last_error());
    reply_error(c->ctl, env, rc, user_error());
    goto fail;
  }
  /* Fit: enough devices of the kind in the whole cluster, and the plan fits the smallest of them. */
  const char *kname = j->kind == FSDP__DEVICE_KIND__DEVICE_KIND_CUDA ? "GPUs" : "CPU slots";
  int total = 0, live_nodes = 0;
  uint64_t min_mem = 0;
  for (int i = 0; i < c->nnodes; i++) {
    if (c->nodes[i].lost) continue;
    live_nodes++;
    for (int s = 0; s < c->nodes[i].nslots; s++) {
      const slot_t *sl = &c->nodes[i].slots[s];
      if (sl->kind != j->kind) continue;
      total++;
      if (sl->mem && (!min_mem || sl->mem < min_mem)) min_mem = sl->mem;
    }
  }
  if (j->world > total) {
    snprintf(msg, sizeof msg, "the job needs %d %s but the cluster has %d (on %d node%s)", j->world, kname, total,
             live_nodes, live_nodes == 1 ? "" : "s");
    log_warn("submit refused: %s", msg);
    reply_error(c->ctl, env, FSDP_ERR_RANGE, msg);
    goto fail;
  }
  if (min_mem && j->plan->mem_total > min_mem) {
    int mw = plan_min_world(&j->spec, min_mem, total);
    int n = snprintf(msg, sizeof msg, "the job needs %.2f GiB per rank at world size %d, device has %.2f GiB; ",
                     (double)j->plan->mem_total / (1u << 30), j->world, (double)min_mem / (1u << 30));
    if (mw > 0) snprintf(msg + n, sizeof msg - (size_t)n, "the smallest world size that fits is %d", mw);
    else snprintf(msg + n, sizeof msg - (size_t)n, "no world size up to %d (the %s in the cluster) fits", total, kname);
    log_warn("submit refused: %s", msg);
    reply_error(c->ctl, env, FSDP_ERR_RANGE, msg);
    goto fail;
  }
  j->spec_text = strdup(req->spec_text);
  j->spec_path = strdup(req->spec_path);
  j->base_dir = strdup(base);
  j->steps = (uint32_t)j->spec.steps;
  if (!j->spec_text || !j->spec_path || !j->base_dir) {
    reply_error(c->ctl, env, FSDP_ERR_NOMEM, "out of memory");
    goto fail;
  }
  char jobs_parent[PATH_MAX + 16];
  snprintf(jobs_parent, sizeof jobs_parent, "%s/jobs", c->state_dir);
  jobs_db_row row = {.name = j->spec.name, .world = j->world, .device = j->kind, .steps = j->spec.steps,
                     .spec_text = j->spec_text, .spec_path = j->spec_path, .base_dir = j->base_dir, .job_dir = jobs_parent};
  /* The job directory is named by the id, which the insert assigns (jobs_db_insert appends it). */
  rc = jobs_db_insert(c->db, &row, loop_now_wall(), &j->id);
  if (rc != FSDP_OK) {
    log_error("submit: %s", fsdp_last_error());
    reply_error(c->ctl, env, rc, user_error());
    goto fail;
  }
  snprintf(j->job_dir, sizeof j->job_dir, "%s/jobs/%llu", c->state_dir, (unsigned long long)j->id);
  if (mkdir_p(j->job_dir, 0755) != FSDP_OK) log_error("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
  j->state = ST_QUEUED;
  j->next = c->jobs;
  c->jobs = j;
  job_log(j, "queued: %s, %d %s, %d steps", j->spec.name, j->world, kname, j->spec.steps);
  log_info("job %llu (%s) queued: %d %s, %d steps, %.2f GiB per rank", (unsigned long long)j->id, j->spec.name,
           j->world, kname, j->spec.steps, (double)j->plan->mem_total / (1u << 30));
  Fsdp__SubmitResp sr = FSDP__SUBMIT_RESP__INIT;
  sr.job_id = j->id;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_SUBMIT_RESP;
  m.submit_resp = &sr;
  reply(c->ctl, env, &m);
  try_schedule(c);
  return;
fail:
  job_free(j);
}

static void ctl_status(coord_t *c, const wire_env *env, uint64_t id) {
  jobs_db_row row;
  fsdp_status rc = jobs_db_get(c->db, id, &row);
  if (rc != FSDP_OK) {
    reply_error(c->ctl, env, rc, user_error());
    return;
  }
  Fsdp__JobInfo ji = FSDP__JOB_INFO__INIT;
  Fsdp__StepSummary last = FSDP__STEP_SUMMARY__INIT;
  fill_info(&row, &ji, &last);
  /* The last step's per-rank figures (memory, time split, traffic) come from its metrics line. */
  char *json = NULL;
  if (row.step > 0 && jobs_db_step_json(c->db, id, row.step, &json) == FSDP_OK && metrics_parse_ranks(json, &last) != FSDP_OK)
    log_warn("job %llu step %d: %s", (unsigned long long)id, row.step, fsdp_last_error());
  free(json);
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_STATUS_RESP;
  m.status_resp = &ji;
  reply(c->ctl, env, &m);
  metrics_free_ranks(&last);
  jobs_db_row_clear(&row);
}

static void ctl_list(coord_t *c, const wire_env *env, uint32_t limit) {
  jobs_db_row *rows = NULL;
  size_t n = 0;
  fsdp_status rc = jobs_db_list(c->db, limit, &rows, &n);
  if (rc != FSDP_OK) {
    reply_error(c->ctl, env, rc, user_error());
    return;
  }
  Fsdp__JobInfo *infos = calloc(n ? n : 1, sizeof *infos), **ptrs = calloc(n ? n : 1, sizeof *ptrs);
  Fsdp__StepSummary *lasts = calloc(n ? n : 1, sizeof *lasts);
  if (!infos || !ptrs || !lasts) {
    reply_error(c->ctl, env, FSDP_ERR_NOMEM, "out of memory");
  } else {
    for (size_t i = 0; i < n; i++) {
      fsdp__job_info__init(&infos[i]);
      fsdp__step_summary__init(&lasts[i]);
      fill_info(&rows[i], &infos[i], &lasts[i]);
      ptrs[i] = &infos[i];
    }
    Fsdp__ListResp lr = FSDP__LIST_RESP__INIT;
    lr.n_jobs = n;
    lr.jobs = ptrs;
    Fsdp__Msg m = WIRE_MSG_INIT;
    m.body_case = FSDP__MSG__BODY_LIST_RESP;
    m.list_resp = &lr;
    reply(c->ctl, env, &m);
  }
  free(infos);
  free(ptrs);
  free(lasts);
  jobs_db_rows_free(&rows, n);
}

static void ctl_cancel(coord_t *c, const wire_env *env, uint64_t id) {
  job_t *j = find_job(c, id);
  if (!j || j->done) {
    jobs_db_row row;
    fsdp_status rc = jobs_db_get(c->db, id, &row);
    if (rc != FSDP_OK) {
      reply_error(c->ctl, env, rc, user_error());
      return;
    }
    char msg[256];
    snprintf(msg, sizeof msg, "job %llu has already %s", (unsigned long long)id, state_names[row.state]);
    jobs_db_row_clear(&row);
    reply_error(c->ctl, env, FSDP_ERR_STATE, msg);
    return;
  }
  job_finish(c, j, ST_CANCELLED, "cancelled by the user", SIGTERM);
  reply_ack(c->ctl, env);
  try_schedule(c);
}

static void ctl_logs(coord_t *c, const wire_env *env, const Fsdp__LogsReq *q) {
  jobs_db_row row;
  fsdp_status rc = jobs_db_get(c->db, q->job_id, &row);
  if (rc != FSDP_OK) {
    reply_error(c->ctl, env, rc, user_error());
    return;
  }
  char path[PATH_MAX + 128];
  if (q->rank < 0) snprintf(path, sizeof path, "%s/job.log", row.job_dir);
  else snprintf(path, sizeof path, "%s/worker-%d.log", row.job_dir, q->rank);
  job_t *j = find_job(c, q->job_id);
  int done = jobs_db_terminal(row.state) && !j;   /* terminal and every worker reaped: no more output */
  if (q->rank >= row.world) {
    char msg[128];
    snprintf(msg, sizeof msg, "job %llu has ranks 0..%d; rank %d does not exist", (unsigned long long)q->job_id,
             row.world - 1, q->rank);
    jobs_db_row_clear(&row);
    reply_error(c->ctl, env, FSDP_ERR_RANGE, msg);
    return;
  }
  jobs_db_row_clear(&row);
  size_t max = q->max_bytes ? q->max_bytes : LOG_CHUNK_DEFAULT;
  if (max > LOG_CHUNK_MAX) max = LOG_CHUNK_MAX;
  uint8_t *buf = malloc(max);
  if (!buf) {
    reply_error(c->ctl, env, FSDP_ERR_NOMEM, "out of memory");
    return;
  }
  ssize_t n = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
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
  reply(c->ctl, env, &m);
  free(buf);
}

static void ctl_nodes(coord_t *c, const wire_env *env) {
  size_t total = 0;
  for (int i = 0; i < c->nnodes; i++) total += (size_t)c->nodes[i].nslots;
  Fsdp__NodeInfo *infos = calloc((size_t)c->nnodes + 1, sizeof *infos), **ptrs = calloc((size_t)c->nnodes + 1, sizeof *ptrs);
  Fsdp__DeviceSlot *slots = calloc(total + 1, sizeof *slots), **sptrs = calloc(total + 1, sizeof *sptrs);
  if (!infos || !ptrs || !slots || !sptrs) {
    reply_error(c->ctl, env, FSDP_ERR_NOMEM, "out of memory");
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
  reply(c->ctl, env, &m);
out:
  free(infos);
  free(ptrs);
  free(slots);
  free(sptrs);
}

static void on_ctl(void *sock, void *arg) {
  coord_t *c = arg;
  Fsdp__Msg *m = NULL;
  wire_env env;
  fsdp_status rc = wire_recv(sock, &env, &m, ZMQ_DONTWAIT);
  if (rc == FSDP_ERR_TIMEOUT) return;
  if (rc != FSDP_OK) {
    c->bad_msgs++;
    log_warn("ctl: malformed request: %s", fsdp_last_error());
    if (env.n >= 1) {
      char msg[1200];
      snprintf(msg, sizeof msg, "malformed request (expected one fsdp.Msg of protocol version %d after an empty "
               "delimiter frame): %s", FSDP__VERSION__PROTO_VERSION, user_error());
      reply_error(sock, &env, rc, msg);
    }
    return;
  }
  log_debug("ctl: %s", wire_body_name(m->body_case));
  switch (m->body_case) {
  case FSDP__MSG__BODY_SUBMIT_REQ: ctl_submit(c, &env, m->submit_req); break;
  case FSDP__MSG__BODY_STATUS_REQ: ctl_status(c, &env, m->status_req->job_id); break;
  case FSDP__MSG__BODY_LIST_REQ: ctl_list(c, &env, m->list_req->limit); break;
  case FSDP__MSG__BODY_CANCEL_REQ: ctl_cancel(c, &env, m->cancel_req->job_id); break;
  case FSDP__MSG__BODY_LOGS_REQ: ctl_logs(c, &env, m->logs_req); break;
  case FSDP__MSG__BODY_NODES_REQ: ctl_nodes(c, &env); break;
  case FSDP__MSG__BODY_SHUTDOWN_REQ:
    log_info("shutdown requested over ctl");
    reply_ack(sock, &env);
    if (c->cfg.on_shutdown_req) c->cfg.on_shutdown_req(c->cfg.arg);
    break;
  default: {
    char msg[256];
    snprintf(msg, sizeof msg, "%s is not a control request (allowed: submit, status, list, cancel, logs, nodes, shutdown)",
             wire_body_name(m->body_case));
    log_warn("ctl: %s", msg);
    reply_error(sock, &env, FSDP_ERR_INVALID, msg);
  }
  }
  wire_free(&m);
  reap_drained(c);
}

/* ---------------------------------------------------------------- timers */

static void on_tick(uv_timer_t *t) {
  coord_t *c = t->data;
  double now = loop_now_mono();
  double lost_after = LOST_BEATS * c->cfg.heartbeat_s;
  for (int i = 0; i < c->nnodes; i++) {
    node_t *n = &c->nodes[i];
    if (n->lost || now - n->last_seen <= lost_after) continue;
    n->lost = 1;
    log_warn("node %u (%s) is lost: no heartbeat for %.1f s", n->id, n->name, now - n->last_seen);
    for (job_t *j = c->jobs; j; j = j->next) {
      if (!j->ranks) continue;
      for (int r = 0; r < j->world; r++) {
        if (j->ranks[r].node != i || !j->ranks[r].alive) continue;
        if (!j->done) job_fail(c, j, "node %s was lost (no heartbeat for %.1f s) with rank %d on it", n->name, now - n->last_seen, r);
        j->ranks[r].alive = 0;
        j->nalive--;
        free_slot(c, j, r);
      }
    }
  }
  for (job_t *j = c->jobs, *next; j; j = next) {
    next = j->next;
    if (!j->done && j->pending[0] && now > j->pending_until) job_fail(c, j, "%s", j->pending);
    if (!j->done && j->deadline && now > j->deadline) {
      if (j->state == ST_STARTING) {
        int r = 0;
        while (r < j->world && j->ranks[r].ready) r++;
        job_fail(c, j, "rank %d was not ready within %.0f s of its start", r < j->world ? r : 0, j->start_timeout);
      } else {
        int b = (j->done_step + 1) % 2, r = 0;
        while (r < j->world && j->reports[b][r]) r++;
        job_fail(c, j, "rank %d sent no report for step %u within %.0f s", r < j->world ? r : 0, j->done_step + 1,
                 j->step_timeout);
      }
    }
    if (j->done && j->kill_at && now > j->kill_at) {
      send_kill(c, j, SIGKILL);
      j->kill_at = 0;
    }
  }
  reap_drained(c);
  try_schedule(c);
  if (c->shutting_down && c->shutdown_done && (!c->jobs || now > c->shutdown_deadline)) {
    void (*done)(void *) = c->shutdown_done;
    c->shutdown_done = NULL;
    done(c->shutdown_arg);
  }
}

/* ---------------------------------------------------------------- lifetime */

static fsdp_status bind_socket(coord_t *c, int type, const char *ep, void **out) {
  void *s = zmq_socket(c->zctx, type);
  if (!s) return fsdp_set_error(FSDP_ERR_COMM, "zmq_socket: %s", zmq_strerror(zmq_errno()));
  fsdp_status rc = wire_socket_setup(s);
  int hwm = 0, one = 1;
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  if (rc == FSDP_OK && curve_is_tcp(ep)) rc = c->curve ? curve_server_apply(s, c->server_sec)
                                                       : fsdp_set_error(FSDP_ERR_INTERNAL, "%s: CURVE keys not loaded", ep);
  if (rc == FSDP_OK && zmq_bind(s, ep) != 0)
    rc = fsdp_set_error(FSDP_ERR_COMM, "cannot bind %s: %s (is another fsdpd running on it?)", ep, zmq_strerror(zmq_errno()));
  if (rc != FSDP_OK) {
    zmq_close(s);
    return rc;
  }
  *out = s;
  return FSDP_OK;
}

/* ---------------------------------------------------------------- ZAP (RFC 27) for CURVE clients */

/* Receive one frame into BUF (NUL-terminated when it fits); -1 when none, else its length. */
static int zap_frame(void *sock, char *buf, size_t cap, int *more) {
  zmq_msg_t f;
  zmq_msg_init(&f);
  if (zmq_msg_recv(&f, sock, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&f);
    return -1;
  }
  size_t len = zmq_msg_size(&f);
  memcpy(buf, zmq_msg_data(&f), len < cap ? len : cap);
  if (len < cap) buf[len] = '\0';
  *more = zmq_msg_more(&f);
  zmq_msg_close(&f);
  return (int)len;
}

static void zap_send(void *sock, const char *data, size_t len, int more) {
  if (zmq_send(sock, data, len, more ? ZMQ_SNDMORE : 0) < 0)
    log_warn("ZAP reply: %s", zmq_strerror(zmq_errno()));
}

static void on_zap(void *sock, void *arg) {
  coord_t *c = arg;
  /* Request: version, request id, domain, address, routing id, mechanism, credentials... */
  char fr[7][256];
  int len[7] = {0}, nf = 0, more = 1;
  while (more) {
    char scratch[256];
    char *dst = nf < 7 ? fr[nf] : scratch;
    int l = zap_frame(sock, dst, 256, &more);
    if (l < 0) {
      if (nf == 0) return;   /* nothing to read: ends this drain */
      break;
    }
    if (nf < 7) len[nf] = l;
    nf++;
  }
  if (nf < 6 || len[0] != 3 || memcmp(fr[0], "1.0", 3) || len[1] > 255) {
    log_warn("ZAP: malformed request (%d frames); refused", nf);
    /* REP: every request must be answered before the next can be read. */
    zap_send(sock, "1.0", 3, 1);
    zap_send(sock, nf >= 2 ? fr[1] : "", nf >= 2 && len[1] <= 255 ? (size_t)len[1] : 0, 1);
    zap_send(sock, "500", 3, 1);
    zap_send(sock, "malformed", 9, 1);
    zap_send(sock, "", 0, 1);
    zap_send(sock, "", 0, 0);
    return;
  }
  const char *status = "400", *text = "not authorized";
  char z85[CURVE_KEY_LEN + 1] = "";
  if (len[5] == 5 && !memcmp(fr[5], "CURVE", 5) && nf >= 7 && len[6] == 32) {
    zmq_z85_encode(z85, (const uint8_t *)fr[6], 32);
    int listed = !strcmp(z85, c->server_pub);
    if (!listed && curve_authorized(c->authorized_path, z85, &listed) != FSDP_OK)
      log_error("ZAP: %s", fsdp_last_error());
    if (listed) status = "200", text = "OK";
  } else {
    text = "only CURVE is accepted";
  }
  if (*status != '2') {
    double now = loop_now_mono();
    /* A rejected client reconnects every few hundred ms: log each key once a minute. */
    if (strcmp(z85, c->last_rejected) || now - c->last_rejected_at > 60.0) {
      char addr[64];
      snprintf(addr, sizeof addr, "%.*s", len[3] < 63 ? len[3] : 63, fr[3]);
      log_warn("rejected a %.*s connection from %s: key %s is not in %s (add it there to admit that client)",
               len[5] < 16 ? len[5] : 16, fr[5], addr, *z85 ? z85 : "(none)", c->authorized_path);
      snprintf(c->last_rejected, sizeof c->last_rejected, "%s", z85);
      c->last_rejected_at = now;
    }
  } else {
    log_debug("admitted CURVE client %s", z85);
  }
  zap_send(sock, "1.0", 3, 1);
  zap_send(sock, fr[1], (size_t)len[1], 1);
  zap_send(sock, status, 3, 1);
  zap_send(sock, text, strlen(text), 1);
  zap_send(sock, *status == '2' ? z85 : "", *status == '2' ? strlen(z85) : 0, 1);
  zap_send(sock, "", 0, 0);
}

/* Load (or create) the server keys and start the ZAP handler: before any CURVE socket binds, so
 * that no connection is ever admitted without the check. */
static fsdp_status curve_setup(coord_t *c) {
  char dir[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/keys", c->state_dir);
  int created = 0;
  TRY(curve_server_keys(dir, c->server_pub, c->server_sec, &created));
  snprintf(c->authorized_path, sizeof c->authorized_path, "%s/authorized", dir);
  if (created) log_info("created the CURVE server keypair in %s (public key %s)", dir, c->server_pub);
  c->zap = zmq_socket(c->zctx, ZMQ_REP);
  if (!c->zap) return fsdp_set_error(FSDP_ERR_COMM, "zmq_socket(REP): %s", zmq_strerror(zmq_errno()));
  if (zmq_bind(c->zap, "inproc://zeromq.zap.01") != 0)
    return fsdp_set_error(FSDP_ERR_COMM, "cannot bind the ZAP handler inproc://zeromq.zap.01: %s", zmq_strerror(zmq_errno()));
  TRY(loop_zsock_new(c->uv, c->zap, on_zap, c, &c->zap_zs));
  c->curve = 1;
  log_info("tcp:// endpoints use CURVE (server key %s/server.pub); clients admitted from %s", dir, c->authorized_path);
  return FSDP_OK;
}

static void bind_ctl(coord_t *c) {
  if (c->ctl_bound) return;
  c->ctl_bound = 1;
  /* A stale socket file from a crashed daemon blocks nothing for ipc://, but remove it so that
   * clients waiting for the file do not connect to a dead one. */
  if (!strncmp(c->ctl_ep, "ipc://", 6)) unlink(c->ctl_ep + 6);
  if (bind_socket(c, ZMQ_ROUTER, c->ctl_ep, &c->ctl) != FSDP_OK ||
      loop_zsock_new(c->uv, c->ctl, on_ctl, c, &c->ctl_zs) != FSDP_OK) {
    log_error("cannot serve the control endpoint: %s", fsdp_last_error());
    return;
  }
  log_info("serving fsdpctl on %s", c->ctl_ep);
}

/* Before the jobs that were running when the daemon died are failed: say so in their job.log. */
static void note_restart_failures(coord_t *c) {
  jobs_db_row *rows = NULL;
  size_t n = 0;
  if (jobs_db_list(c->db, 0, &rows, &n) != FSDP_OK) return;
  for (size_t i = 0; i < n; i++)
    if ((rows[i].state == ST_STARTING || rows[i].state == ST_RUNNING) && *rows[i].job_dir)
      job_log_dir(rows[i].job_dir, "failed: daemon restarted (it was %s at step %d)", state_names[rows[i].state], rows[i].step);
  jobs_db_rows_free(&rows, n);
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
    job_t *j = calloc(1, sizeof *j);
    if (!j) break;
    j->id = r->id;
    j->state = ST_QUEUED;
    snprintf(j->job_dir, sizeof j->job_dir, "%s", r->job_dir);
    j->spec_text = r->spec_text, r->spec_text = NULL;
    j->spec_path = r->spec_path, r->spec_path = NULL;
    j->base_dir = r->base_dir, r->base_dir = NULL;
    fsdp_status rc = jobspec_parse(j->spec_text, *j->spec_path ? j->spec_path : "<submitted job>", j->base_dir, &j->spec);
    if (rc == FSDP_OK) rc = plan_build(&j->spec, j->spec.world_size, &j->plan);
    if (rc != FSDP_OK) {
      char reason[1200];
      snprintf(reason, sizeof reason, "cannot queue again after a daemon restart: %s", user_error());
      set_state(c, j, ST_FAILED, reason);
      job_free(j);
      continue;
    }
    j->world = j->spec.world_size;
    j->kind = j->spec.device == DEVICE_CUDA ? FSDP__DEVICE_KIND__DEVICE_KIND_CUDA : FSDP__DEVICE_KIND__DEVICE_KIND_CPU;
    j->steps = (uint32_t)j->spec.steps;
    j->next = c->jobs;
    c->jobs = j;
    job_log(j, "queued again after a daemon restart");
    log_info("job %llu (%s) queued again after the restart", (unsigned long long)j->id, j->spec.name);
  }
  jobs_db_rows_free(&rows, n);
}

static void on_first_node_timeout(uv_timer_t *t) {
  coord_t *c = t->data;
  if (!c->ctl_bound) {
    log_warn("no agent registered yet; serving the control endpoint anyway");
    bind_ctl(c);
  }
}


fsdp_status coord_new(uv_loop_t *uv, void *zctx, const coord_config *cfg, coord_t **out) {
  *out = NULL;
  coord_t *c = calloc(1, sizeof *c);
  if (!c) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the coordinator");
  c->uv = uv;
  c->cfg = *cfg;
  c->zctx = zctx;
  c->zctx = zctx;
  snprintf(c->state_dir, sizeof c->state_dir, "%s", cfg->state_dir);
  snprintf(c->ctl_ep, sizeof c->ctl_ep, "%s", cfg->ctl);
  snprintf(c->listen_ep, sizeof c->listen_ep, "%s", cfg->listen);
  fsdp_status rc;
  char path[PATH_MAX + 128];
  TRY_GOTO(mkdir_p(c->state_dir, 0700), rc, fail);
  chmod(c->state_dir, 0700);
  snprintf(path, sizeof path, "%s/jobs", c->state_dir);
  TRY_GOTO(mkdir_p(path, 0755), rc, fail);
  snprintf(path, sizeof path, "%s/jobs.db", c->state_dir);
  TRY_GOTO(jobs_db_open(path, &c->db), rc, fail);
  int nfail = 0;
  note_restart_failures(c);
  TRY_GOTO(jobs_db_fail_started(c->db, "daemon restarted", loop_now_wall(), &nfail), rc, fail);
  if (nfail) log_warn("%d jobs were running when the daemon stopped; marked failed ('daemon restarted')", nfail);
  requeue(c);
  if (!strncmp(c->listen_ep, "ipc://", 6)) unlink(c->listen_ep + 6);
  if (curve_is_tcp(c->listen_ep) || curve_is_tcp(c->ctl_ep)) TRY_GOTO(curve_setup(c), rc, fail);
  TRY_GOTO(bind_socket(c, ZMQ_ROUTER, c->listen_ep, &c->cluster), rc, fail);
  TRY_GOTO(loop_zsock_new(uv, c->cluster, on_cluster, c, &c->cluster_zs), rc, fail);
  uv_timer_init(uv, &c->tick);
  c->tick.data = c;
  uv_timer_start(&c->tick, on_tick, TICK_MS, TICK_MS);
  log_info("cluster endpoint %s; state in %s", c->listen_ep, c->state_dir);
  if (!cfg->wait_first_node) {
    bind_ctl(c);
  } else if (!c->bind_timer_used) {
    c->bind_timer_used = 1;
    uv_timer_init(uv, &c->bind_timer);
    c->bind_timer.data = c;
    uv_timer_start(&c->bind_timer, on_first_node_timeout, 3000, 0);
    uv_unref((uv_handle_t *)&c->bind_timer);
  }
  *out = c;
  return FSDP_OK;
fail:
  loop_zsock_destroy(&c->cluster_zs);
  if (c->cluster) zmq_close(c->cluster);
  loop_zsock_destroy(&c->zap_zs);
  if (c->zap) zmq_close(c->zap);
  jobs_db_close(&c->db);
  free(c);
  return rc;
}

void coord_shutdown(coord_t *c, double grace_s, void (*done)(void *), void *arg) {
  c->shutting_down = 1;
  c->shutdown_done = done;
  c->shutdown_arg = arg;
  c->shutdown_deadline = loop_now_mono() + grace_s;
  for (job_t *j = c->jobs, *next; j; j = next) {
    next = j->next;
    if (!j->done) job_finish(c, j, ST_CANCELLED, "the daemon shut down", SIGTERM);
  }
  reap_drained(c);
  if (!c->jobs && c->shutdown_done) {
    c->shutdown_done = NULL;
    done(arg);
  }
}

static void on_handle_close(uv_handle_t *h) {
  coord_t *c = h->data;
  if (--c->handles == 0) free(c);
}

void coord_destroy(coord_t **p) {
  if (!p || !*p) return;
  coord_t *c = *p;
  *p = NULL;
  while (c->jobs) {
    job_t *j = c->jobs;
    c->jobs = j->next;
    job_free(j);
  }
  while (c->kv) {
    kv_entry *e = c->kv;
    c->kv = e->next;
    free(e->key);
    free(e->val);
    free(e);
  }
  while (c->kv_waits) {
    kv_wait *w = c->kv_waits;
    c->kv_waits = w->next;
    free(w->key);
    free(w);
  }
  loop_zsock_destroy(&c->ctl_zs);
  loop_zsock_destroy(&c->cluster_zs);
  /* Let the last replies (the shutdown ack, kill requests to agents) leave: zmq_ctx_term waits
   * at most this long for them. */
  int linger = 500;
  if (c->ctl) zmq_setsockopt(c->ctl, ZMQ_LINGER, &linger, sizeof linger), zmq_close(c->ctl);
  if (c->cluster) zmq_setsockopt(c->cluster, ZMQ_LINGER, &linger, sizeof linger), zmq_close(c->cluster);
  loop_zsock_destroy(&c->zap_zs);
  if (c->zap) linger = 0, zmq_setsockopt(c->zap, ZMQ_LINGER, &linger, sizeof linger), zmq_close(c->zap);
  if (!strncmp(c->ctl_ep, "ipc://", 6) && c->ctl) unlink(c->ctl_ep + 6);
  if (!strncmp(c->listen_ep, "ipc://", 6)) unlink(c->listen_ep + 6);
  jobs_db_close(&c->db);
  for (int i = 0; i < c->nnodes; i++) free(c->nodes[i].slots);
  free(c->nodes);
  c->handles = 1 + c->bind_timer_used;
  if (c->bind_timer_used) uv_close((uv_handle_t *)&c->bind_timer, on_handle_close);
  uv_close((uv_handle_t *)&c->tick, on_handle_close);
}
