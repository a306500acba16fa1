/* coordinator — see coordinator.h. This file is the cluster service (agents register, beat and
 * report worker exits and output; workers say hello and then talk to steps.c and kv.c), the
 * periodic tick (lost nodes, deadlines, kills) and the coordinator's lifetime. */
#define _GNU_SOURCE
#include "coordinator.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "coord_core.h"
#include "ctlsrv.h"
#include "fsutil.h"
#include "job.h"
#include "kv.h"
#include "log.h"
#include "schedule.h"
#include "steps.h"
#include "tracepull.h"
#include "statedir.h"
#include "zap.h"

static const char *sig_name(int sig) {
  const char *s = sigabbrev_np(sig);
  return s ? s : "?";
}

/* Node I is gone (WHY: "was lost (...)", "stopped (...)"): the jobs with a rank on it fail, its
 * devices are free, and it is dropped from the list cfg.forget_s later (forget_gone_nodes). */
static void node_lose(coord_t *c, int i, const char *why) {
  node_t *n = &c->nodes[i];
  n->lost = 1;
  n->gone_since = loop_now_mono();
  for (job_t *j = c->jobs; j; j = job_next(j)) {
    const rank_st *ranks = job_rank(j, 0);
    if (!ranks) continue;
    char list[128];   /* the job's live ranks on the node: "3", "8, 9, ..., 15 (8 ranks)" */
    int k = 0, last = -1;
    size_t len = 0;
    for (int r = 0; r < job_world(j); r++) {
      if (ranks[r].node != i || !ranks[r].alive) continue;
      if (k < 4) len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", k ? ", " : "", r);
      k++, last = r;
    }
    if (k > 5) snprintf(list + len, sizeof list - len, ", ..., %d (%d ranks)", last, k);
    else if (k == 5) snprintf(list + len, sizeof list - len, ", %d", last);
    if (!k) continue;
    char msg[512];
    snprintf(msg, sizeof msg, "node %s %s with rank%s %s on it", n->name, why, k > 1 ? "s" : "", list);
    job_event(c, j, JE_NODE_LOST, &(job_ev_args){.rank = -1, .node = i, .msg = msg});
  }
  job_publish_metrics(c);
}

/* Drop the nodes lost or stopped more than cfg.forget_s ago; ranks name nodes by index, so the
 * indices after a dropped one move down by one. */
static void forget_gone_nodes(coord_t *c, double now) {
  for (int i = c->nnodes - 1; i >= 0; i--) {
    node_t *n = &c->nodes[i];
    if (!n->lost || now - n->gone_since <= c->cfg.forget_s) continue;   /* most nodes, at every tick: nothing to read */
    int busy = 0;
    for (int s = 0; s < n->nslots; s++) busy |= n->slots[s].job_id != 0;
    if (busy) continue;
    log_info("node %u (%s) dropped from the node list: %s %.0f s ago", n->id, n->name, n->stopped ? "stopped" : "lost",
             now - n->gone_since);
    free(n->slots);
    memmove(n, n + 1, (size_t)(c->nnodes - i - 1) * sizeof *n);
    c->nnodes--;
    for (job_t *j = c->jobs; j; j = job_next(j)) job_node_dropped(j, i);
    job_publish_metrics(c);
  }
}

static void on_register(coord_t *c, const wire_env *env, const Fsdp__AgentRegister *reg) {
  const uint8_t *id = env->data[0];
  size_t idlen = env->len[0];
  node_t *n = coord_find_node(c, id, idlen);
  if (!n) {
    /* A new connection under the name of a known node: the same node, so that `nodes` never lists
     * a name twice. From the same agent process (a new socket: reconnected, or replaced after a
     * refused key) it keeps what runs on it; from a new process (the agent was restarted, perhaps
     * before the coordinator found it lost), the previous one is gone, and what ran under it with
     * it. Two live agents given the same --name would take the entry from each other at every
     * registration: each time logged. */
    for (int i = 0; i < c->nnodes && !n; i++) {
      if (strcmp(c->nodes[i].name, reg->name) != 0) continue;
      n = &c->nodes[i];
      if (n->pid == reg->pid) {
        log_info("node %u (%s) registered again from a new connection", n->id, n->name);
      } else {
        if (!n->lost) node_lose(c, i, "was restarted (a new agent process registered under its name)");
        log_info("node %u (%s) is back, from a new agent process (pid %u)", n->id, n->name, reg->pid);
      }
      memcpy(n->ident, id, idlen);
      n->ident_len = idlen;
    }
  }
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
  log_info("node %u (%s, pid %u) joined: %d device slots, %.1f GiB of host memory available", n->id, n->name, reg->pid,
           n->nslots, (double)reg->host_mem_bytes / (1u << 30));
  job_publish_metrics(c);
welcome:
  n->host_mem = reg->host_mem_bytes;   /* the same agent measured it once; a new one again */
  n->pid = reg->pid;
  n->lost = 0;
  n->stopped = 0;
  n->last_seen = loop_now_mono();
  n->last_seen_wall = loop_now_wall();
  Fsdp__AgentWelcome w = FSDP__AGENT_WELCOME__INIT;
  w.node_id = n->id;
  w.heartbeat_s = c->cfg.heartbeat_s;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_AGENT_WELCOME;
  m.agent_welcome = &w;
  coord_send(c, id, idlen, &m);
  if (!c->ctl_bound && c->cfg.wait_first_node) ctlsrv_bind(c);
  schedule_try(c);
}

static void on_worker_exit(coord_t *c, node_t *n, const Fsdp__WorkerExit *ex) {
  job_t *j = job_find(c, ex->job_id);
  const rank_st *rk = j && ex->rank <= INT_MAX ? job_rank(j, (int)ex->rank) : NULL;
  if (!rk) {
    log_debug("exit of job %llu rank %u: no such running job", (unsigned long long)ex->job_id, ex->rank);
    return;
  }
  if (!rk->alive) return;
  if (rk->node >= 0 && &c->nodes[rk->node] != n) {
    log_warn("node %s reports the exit of job %llu rank %u, which runs elsewhere; ignored", n->name,
             (unsigned long long)job_id(j), ex->rank);
    return;
  }
  /* the reason, should the job decide that the exit fails it (job.c: on_exit_live) */
  char why[600];
  int clean = ex->exit_status == 0 && ex->term_signal == 0;
  if (ex->term_signal)
    snprintf(why, sizeof why, "rank %u was killed by signal %d (SIG%s) on node %s", ex->rank, ex->term_signal,
             sig_name(ex->term_signal), n->name);
  else if (ex->exit_status == 127 && !rk->ident_len)
    snprintf(why, sizeof why, "rank %u could not be started on node %s (exit status 127; see worker-%u.log)", ex->rank,
             n->name, ex->rank);
  else
    snprintf(why, sizeof why, "rank %u exited with status %d%s on node %s", ex->rank, ex->exit_status,
             clean ? " before the job finished" : "", n->name);
  job_ev_args a = {.rank = (int)ex->rank, .node = -1, .status = ex->exit_status, .signal = ex->term_signal, .msg = why};
  job_event(c, j, JE_WORKER_EXIT, &a);
  schedule_try(c);
}

static void on_log_chunk(coord_t *c, const Fsdp__LogChunk *lc) {
  job_t *j = job_find(c, lc->job_id);
  char path[PATH_MAX + 128];
  if (j) {
    snprintf(path, sizeof path, "%s/worker-%u.log", job_dir_of(j), lc->rank);
  } else {   /* a finished job's last lines: the directory is the standard one */
    snprintf(path, sizeof path, "%s/jobs/%llu/worker-%u.log", c->state_dir, (unsigned long long)lc->job_id, lc->rank);
    struct stat st;
    char dir[PATH_MAX + 128];
    snprintf(dir, sizeof dir, "%s/jobs/%llu", c->state_dir, (unsigned long long)lc->job_id);
    if (stat(dir, &st) != 0) return;
  }
  int fd;
  if (fsutil_open_append(AT_FDCWD, path, path, 0644, &fd) != FSDP_OK) {
    log_warn("%s", fsdp_last_error());
    return;
  }
  if (write(fd, lc->data.data, lc->data.len) != (ssize_t)lc->data.len) log_warn("short write to %s", path);
  close(fd);
}

static void on_worker_hello(coord_t *c, const wire_env *env, const Fsdp__WorkerHello *h) {
  node_t *via = env->n == 3 && env->len[1] ? coord_find_node(c, env->data[0], env->len[0]) : NULL;
  job_t *j = via ? job_find(c, h->job_id) : NULL;
  const rank_st *rk = j && h->rank <= INT_MAX ? job_rank(j, (int)h->rank) : NULL;
  if (!rk || job_ended(j) || strcmp(h->token, job_token(j)) != 0) {
    log_warn("worker_hello for job %llu rank %u (pid %u) with an unknown job, rank or token; ignored",
             (unsigned long long)h->job_id, h->rank, h->pid);
    return;
  }
  if (rk->node < 0 || !rk->alive) {
    log_warn("worker_hello for job %llu rank %u, which is not running; ignored", (unsigned long long)job_id(j), h->rank);
    return;
  }
  if (&c->nodes[rk->node] != via) {   /* a worker speaks through the relay of the node it was started on */
    log_warn("worker_hello for job %llu rank %u from node %s, where it does not run; ignored", (unsigned long long)job_id(j),
             h->rank, via->name);
    return;
  }
  if (rk->ident_len && (rk->ident_len != env->len[1] || memcmp(rk->ident, env->data[1], env->len[1]))) {
    log_warn("job %llu rank %u said hello twice from different sockets; ignored", (unsigned long long)job_id(j), h->rank);
    return;
  }
  job_rank_set_ident(j, (int)h->rank, env->data[1], env->len[1]);
  node_t *n = &c->nodes[rk->node];
  slot_t *sl = &n->slots[rk->slot];
  Fsdp__WorkerSetup s = FSDP__WORKER_SETUP__INIT;
  s.job_id = job_id(j);
  s.rank = h->rank;
  s.world = (uint32_t)job_world(j);
  char *resolved = NULL;   /* the job as resolved at submit and placement (jobresolve.h): every key explicit */
  if (jobspec_canonical_write(job_spec(j), &resolved) != FSDP_OK) {
    log_error("job %llu: cannot send its setup: %s", (unsigned long long)job_id(j), fsdp_last_error());
    return;
  }
  s.resolved = resolved;
  s.spec_path = (char *)job_spec_path(j);
  s.plan = job_plan_msg(j);
  s.kv_prefix = (char *)job_kv_prefix(j);
  s.job_dir = (char *)job_dir_of(j);
  s.device_index = sl->kind == FSDP__DEVICE_KIND__DEVICE_KIND_CUDA ? (int32_t)sl->index : -1;
  s.start_step = 0;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_SETUP;
  m.worker_setup = &s;
  job_send_rank(c, j, (int)h->rank, &m);
  free(resolved);
  log_debug("job %llu rank %u (pid %u) said hello; setup sent", (unsigned long long)job_id(j), h->rank, h->pid);
}

/* The cluster socket is reachable by every local user when the daemon runs as root (their workers
 * connect to it): only an admin (root, the daemon's user, a node's key) may register as an agent,
 * and a worker's hello must come from its job's owner (or an admin), so that a token read from
 * another user's process list is of no use. */
static int cluster_peer_ok(coord_t *c, const wire_env *env, const Fsdp__Msg *m) {
  if (m->body_case != FSDP__MSG__BODY_AGENT_REGISTER && m->body_case != FSDP__MSG__BODY_WORKER_HELLO) return 1;
  peer_t p;
  const job_t *j = NULL;
  char why[512];
  if (peer_resolve(env->user_id, geteuid(), &p) != FSDP_OK) {
    snprintf(why, sizeof why, "from an unidentified peer: %s", fsdp_last_error());
  } else {
    if (p.admin) return 1;
    j = m->body_case == FSDP__MSG__BODY_WORKER_HELLO ? job_find(c, m->worker_hello->job_id) : NULL;
    if (j && job_owner(j)->uid == p.uid) return 1;
    snprintf(why, sizeof why, "from %s: %s", p.name, j ? "the job is not theirs" : "only root or the daemon's own user may run an agent");
  }
  /* a refused agent registers again every second: one line per BAD_LOG_EVERY_S */
  double now = loop_now_mono();
  if (c->refused_logged_at == 0 || now - c->refused_logged_at >= BAD_LOG_EVERY_S) {
    log_warn("cluster: refused %s %s", wire_body_name(m->body_case), why);
    c->refused_logged_at = now;
  }
  return 0;
}

static void on_cluster(void *sock, void *arg) {
  coord_t *c = arg;
  Fsdp__Msg *m = NULL;
  wire_env env;
  fsdp_status rc = wire_recv(sock, &env, &m, ZMQ_DONTWAIT);
  if (rc == FSDP_ERR_TIMEOUT) return;
  if (rc != FSDP_OK || env.n < 1) {
    coord_note_bad(c, "cluster", rc != FSDP_OK ? fsdp_last_error() : "no envelope");
    wire_destroy(&m);
    return;
  }
  if (!cluster_peer_ok(c, &env, m)) {
    wire_destroy(&m);
    return;
  }
  const uint8_t *id = env.data[0];
  size_t idlen = env.len[0];
  node_t *n = NULL;
  job_t *j = NULL;
  int r = -1;
  /* a worker's message through its node's relay ([agent][worker][""]) speaks for that worker only */
  int relayed = env.n == 3 && env.len[1] > 0;
  int agents_own = m->body_case == FSDP__MSG__BODY_AGENT_REGISTER || m->body_case == FSDP__MSG__BODY_HEARTBEAT ||
                   m->body_case == FSDP__MSG__BODY_WORKER_EXIT || m->body_case == FSDP__MSG__BODY_LOG_CHUNK ||
                   m->body_case == FSDP__MSG__BODY_NODE_STEP_REPORT;
  if (relayed && agents_own) {
    log_warn("%s from behind a node's relay; ignored", wire_body_name(m->body_case));
    wire_destroy(&m);
    return;
  }
  switch (m->body_case) {
  case FSDP__MSG__BODY_AGENT_REGISTER: on_register(c, &env, m->agent_register); break;
  case FSDP__MSG__BODY_HEARTBEAT:
    n = coord_find_node(c, id, idlen);
    if (!n || n->id != m->heartbeat->node_id) {
      log_debug("heartbeat from unknown node %u; asking it to register", m->heartbeat->node_id);
      coord_reply_error(sock, &env, FSDP_ERR_NOTFOUND, "unknown node: register again");
      break;
    }
    if (n->lost) log_info("node %u (%s) is back", n->id, n->name);
    n->lost = 0;
    n->stopped = 0;
    n->last_seen = loop_now_mono();
    n->last_seen_wall = loop_now_wall();
    break;
  case FSDP__MSG__BODY_AGENT_BYE:
    n = coord_find_node(c, id, idlen);
    if (!n || n->id != m->agent_bye->node_id || n->stopped) break;
    log_info("node %u (%s) stopped: its agent shut down", n->id, n->name);
    node_lose(c, (int)(n - c->nodes), "stopped (its agent shut down)");
    n->stopped = 1;
    break;
  case FSDP__MSG__BODY_WORKER_EXIT:
  case FSDP__MSG__BODY_LOG_CHUNK:
    n = coord_find_node(c, id, idlen);
    if (!n) {
      log_warn("%s from an unregistered agent; ignored", wire_body_name(m->body_case));
      break;
    }
    n->last_seen = loop_now_mono();
    if (m->body_case == FSDP__MSG__BODY_WORKER_EXIT) on_worker_exit(c, n, m->worker_exit);
    else on_log_chunk(c, m->log_chunk);
    break;
  case FSDP__MSG__BODY_WORKER_HELLO: on_worker_hello(c, &env, m->worker_hello); break;
  case FSDP__MSG__BODY_NODE_STEP_REPORT:
    n = coord_find_node(c, id, idlen);
    if (!n) {
      log_warn("node_step_report from an unregistered agent; ignored");
      break;
    }
    n->last_seen = loop_now_mono();   /* as good as a heartbeat */
    steps_on_node_report(c, n, &m);
    break;
  default:
    j = job_find_worker(c, &env, &r);
    if (!j) {
      log_warn("%s from an unknown peer; ignored", wire_body_name(m->body_case));
      if (m->body_case == FSDP__MSG__BODY_KV_GET || m->body_case == FSDP__MSG__BODY_KV_SET)
        coord_reply_error(sock, &env, FSDP_ERR_NOTFOUND, "unknown worker: say worker_hello first");
      break;
    }
    switch (m->body_case) {
    case FSDP__MSG__BODY_WORKER_READY: steps_on_ready(c, j, r, m->worker_ready); break;
    case FSDP__MSG__BODY_TRACE_SPANS: tracepull_on_spans(c, j, r, &m); break;
    case FSDP__MSG__BODY_WORKER_ERROR: {
      /* the message is validated on receipt; the worker's log has where it came from */
      job_ev_args a = {.rank = r, .node = -1, .code = m->worker_error->code, .msg = m->worker_error->message};
      job_event(c, j, JE_WORKER_ERROR, &a);
      break;
    }
    case FSDP__MSG__BODY_ACK: job_event(c, j, JE_RANK_STOPPED, &(job_ev_args){.rank = r, .node = -1}); break;
    case FSDP__MSG__BODY_KV_SET:
      if (!job_live(j)) coord_reply_error(sock, &env, FSDP_ERR_CANCELLED, job_reason(j));
      else kv_on_set(c, &env, job_id(j), job_kv_prefix(j), m->kv_set);
      break;
    case FSDP__MSG__BODY_KV_GET:
      if (!job_live(j)) coord_reply_error(sock, &env, FSDP_ERR_CANCELLED, job_reason(j));
      else kv_on_get(c, &env, job_id(j), job_kv_prefix(j), m->kv_get);
      break;
    default: log_warn("job %llu rank %d: unexpected %s; ignored", (unsigned long long)job_id(j), r, wire_body_name(m->body_case));
    }
  }
  wire_destroy(&m);
  if (job_reap_drained(c)) schedule_try(c);
}

static void on_tick(uv_timer_t *t) {
  coord_t *c = t->data;
  double now = loop_now_mono();
  double lost_after = LOST_BEATS * c->cfg.heartbeat_s;
  /* A node is lost when its agent went silent, not when the loop was too busy to read it (a large
   * step to record, thousands of node reports queued behind it): read everything waiting first, and
   * let a tick that comes late declare nothing. */
  int late = c->last_tick > 0 && now - c->last_tick > 4 * TICK_MS / 1000.0;
  int ev = 0;
  size_t evlen = sizeof ev;
  while (c->cluster && zmq_getsockopt(c->cluster, ZMQ_EVENTS, &ev, &evlen) == 0 && (ev & ZMQ_POLLIN)) on_cluster(c->cluster, c);
  now = loop_now_mono();
  c->last_tick = now;
  for (int i = 0; i < c->nnodes && !late; i++) {
    node_t *n = &c->nodes[i];
    if (n->lost || now - n->last_seen <= lost_after) continue;
    char why[96];
    snprintf(why, sizeof why, "was lost (no heartbeat for %.1f s)", now - n->last_seen);
    log_warn("node %u (%s) is lost: no heartbeat for %.1f s", n->id, n->name, now - n->last_seen);
    node_lose(c, i, why);
  }
  forget_gone_nodes(c, now);
  for (job_t *j = c->jobs; j; j = job_next(j)) {
    steps_check(c, j, now);
    job_event(c, j, JE_TICK, &(job_ev_args){.rank = -1, .node = -1, .now = now});
  }
  tracepull_check(c, now);
  job_retry_unrecorded(c);
  job_reap_drained(c);
  schedule_try(c);
  promx_expire(&c->px_done, now);
  job_publish_metrics(c);
  if (c->shutting_down && c->shutdown_done && (!c->jobs || now > c->shutdown_deadline)) {
    for (job_t *j = c->jobs; j; j = job_next(j))   /* a stop for the shutdown that did not finish in time */
      job_event(c, j, JE_SHUTDOWN_LATE, NULL);
    void (*done)(void *) = c->shutdown_done;
    c->shutdown_done = NULL;
    done(c->shutdown_arg);
  }
}


static void on_first_node_timeout(uv_timer_t *t) {
  coord_t *c = t->data;
  if (!c->ctl_bound) {
    log_warn("no agent registered yet; serving the control endpoint anyway");
    ctlsrv_bind(c);
  }
}

fsdp_status coord_new(uv_loop_t *uv, void *zctx, const coord_config *cfg, coord_t **out) {
  *out = NULL;
  coord_t *c = calloc(1, sizeof *c);
  if (!c) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the coordinator");
  c->uv = uv;
  c->cfg = *cfg;
  c->zctx = zctx;
  snprintf(c->state_dir, sizeof c->state_dir, "%s", cfg->state_dir);
  peer_t self;
  snprintf(c->self_name, sizeof c->self_name, "%s", peer_from_uid(geteuid(), geteuid(), &self) == FSDP_OK ? self.name : "?");
  snprintf(c->ctl_ep, sizeof c->ctl_ep, "%s", cfg->ctl);
  snprintf(c->listen_ep, sizeof c->listen_ep, "%s", cfg->listen);
  fsdp_status rc;
  char path[PATH_MAX + 128];
  int sfd = -1;
  c->jobs_fd = -1;
  /* As root, its users' workers connect to the cluster socket in here: others may pass through the
   * directory (0711: no listing); each thing in it keeps its own, private, mode. */
  mode_t state_mode = geteuid() == 0 ? 0711 : 0700;
  TRY_GOTO(fsutil_dir_open(AT_FDCWD, c->state_dir, state_mode, FSUTIL_TRUSTED_LINKS, &sfd), rc, fail);
  /* jobs/ (and each job's directory in it) is never reached through a link */
  rc = fsutil_dir_open(sfd, "jobs", 0700, FSUTIL_NO_LINKS, &c->jobs_fd);
  if (rc == FSDP_OK && fchmod(sfd, state_mode) != 0)
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot chmod %s: %s", c->state_dir, strerror(errno));
  if (rc == FSDP_OK && fchmod(c->jobs_fd, 0700) != 0)
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot chmod %s/jobs: %s", c->state_dir, strerror(errno));
  close(sfd);
  if (rc != FSDP_OK) goto fail;
  snprintf(path, sizeof path, "%s/jobs.db", c->state_dir);
  char jobs_shown[PATH_MAX + 16];
  snprintf(jobs_shown, sizeof jobs_shown, "%s/jobs", c->state_dir);
  uint64_t last_folder = 0;   /* a lost database, or ids that would take existing folders, refuse to start */
  TRY_GOTO(statedir_jobs_db_prepare(path, c->jobs_fd, jobs_shown, &last_folder), rc, fail);
  TRY_GOTO(jobs_db_open(path, &c->db), rc, fail);
  TRY_GOTO(jobs_db_ids_above(c->db, last_folder), rc, fail);
  TRY_GOTO(job_recover(c), rc, fail);
  if (!strncmp(c->listen_ep, "ipc://", 6)) unlink(c->listen_ep + 6);
  TRY_GOTO(zap_setup(c, curve_is_tcp(c->listen_ep) || curve_is_tcp(c->ctl_ep)), rc, fail);
  TRY_GOTO(zap_bind_socket(c, ZMQ_ROUTER, c->listen_ep, &c->cluster), rc, fail);
  coord_open_socket_file(c->listen_ep);
  TRY_GOTO(loop_zsock_new(uv, c->cluster, on_cluster, c, &c->cluster_zs), rc, fail);
  uv_timer_init(uv, &c->tick);
  c->tick.data = c;
  uv_timer_start(&c->tick, on_tick, TICK_MS, TICK_MS);
  log_info("cluster endpoint %s; state in %s", c->listen_ep, c->state_dir);
  if (!cfg->wait_first_node) {
    ctlsrv_bind(c);
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
  zap_unwatch_all(c);
  if (c->cluster) zmq_close(c->cluster);
  loop_zsock_destroy(&c->zap_zs);
  if (c->zap) zmq_close(c->zap);
  jobs_db_destroy(&c->db);
  if (c->jobs_fd >= 0) close(c->jobs_fd);
  free(c);
  return rc;
}

void coord_shutdown(coord_t *c, double grace_s, void (*done)(void *), void *arg) {
  c->shutting_down = 1;
  c->shutdown_done = done;
  c->shutdown_arg = arg;
  c->shutdown_deadline = loop_now_mono() + grace_s;
  for (job_t *j = c->jobs; j; j = job_next(j)) steps_stop(c, j, JE_SHUTDOWN);   /* job.c's table: what a shutdown does */
  job_reap_drained(c);
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
    c->jobs = job_next(j);
    job_destroy(&j);
  }
  kv_destroy_all(c);
  tracepull_destroy_all(c);
  job_destroy_unrecorded(c);
  while (c->px_done) {
    promx_job *px = c->px_done;
    c->px_done = px->next;
    promx_job_free(&px);
  }
  loop_zsock_destroy(&c->ctl_zs);
  loop_zsock_destroy(&c->cluster_zs);
  zap_unwatch_all(c);
  /* Let the last replies (the shutdown ack, kill requests to agents) leave: zmq_ctx_term waits
   * at most this long for them, and returns as soon as they are out (a ROUTER drops what is
   * addressed to a peer that is gone). 500 ms lost the shutdown ack on a loaded machine. */
  int linger = 5000;
  if (c->ctl) zmq_setsockopt(c->ctl, ZMQ_LINGER, &linger, sizeof linger), zmq_close(c->ctl);
  if (c->cluster) zmq_setsockopt(c->cluster, ZMQ_LINGER, &linger, sizeof linger), zmq_close(c->cluster);
  loop_zsock_destroy(&c->zap_zs);
  if (c->zap) linger = 0, zmq_setsockopt(c->zap, ZMQ_LINGER, &linger, sizeof linger), zmq_close(c->zap);
  if (!strncmp(c->ctl_ep, "ipc://", 6) && c->ctl) unlink(c->ctl_ep + 6);
  if (!strncmp(c->listen_ep, "ipc://", 6)) unlink(c->listen_ep + 6);
  jobs_db_destroy(&c->db);
  if (c->jobs_fd >= 0) close(c->jobs_fd);
  for (int i = 0; i < c->nnodes; i++) free(c->nodes[i].slots);
  free(c->nodes);
  free(c->node_hash);
  c->handles = 1 + c->bind_timer_used;
  if (c->bind_timer_used) uv_close((uv_handle_t *)&c->bind_timer, on_handle_close);
  uv_close((uv_handle_t *)&c->tick, on_handle_close);
}
