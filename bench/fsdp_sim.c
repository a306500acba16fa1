/* fsdp-sim — many simulated nodes and ranks in one process, against a real coordinator.
 *
 *   fsdp-sim --join ENDPOINT --nodes N [--ranks-per-node 8] [--name sim] [--step-ms 5] [--jitter-ms 1]
 *            [--procs P] [--independent] [--kill RANK@STEP] [--hang RANK@STEP] [--lose NODE@STEP] [--timeout-s T]
 *   fsdp-sim --check METRICS.jsonl --world N [--step-ms 5] [--jitter-ms 1]
 *   fsdp-sim --cost [--world N] [--ranks-per-node 8]
 *
 * Each simulated node is what `fsdpd --join` is, minus the processes: it registers with N CPU slots
 * (64 GiB each), beats, and runs the real relay (daemon/relay.h) that a node agent runs. A spawn_req
 * starts a simulated rank: its own DEALER socket connected to its node's relay, speaking the worker
 * protocol (worker_hello with the job's token, worker_ready after worker_setup, one step_report per
 * step_cmd after the step's time, an ack to stop_cmd), computing nothing. So the coordinator, the
 * relays, the sockets and the wire are the real ones; only the training is not there.
 *
 * Step time: step-ms ± jitter-ms, a deterministic function of (rank, step), in whole microseconds;
 * each rank reports its own, and every rank ends the step when the slowest one does, as ranks
 * joined by collectives do (--independent: each on its own time, the nodes' reports then spread
 * over the step instead of arriving together).
 * Figures: every per-rank figure is a known function of (rank, world, step, figure) (sim_value),
 * so that --check can recompute from scratch what the coordinator must have written for every step
 * (min, max and the ranks holding them, sums, counts, the median within its tolerance, the step time
 * and its rank, loss and tokens) and exits 1 naming the first difference. On a checkpoint step every
 * rank reports its save complete (StepReport.ckpt) with known times and size: --check verifies their
 * aggregate (the relays' ckpt_* figures: min, median, max, their ranks, sums) and the job's figures
 * of the save (the longest times, the bytes of every rank).
 * Faults: --kill R@S: rank R dies at step S (its socket closes, its node reports it killed by
 * SIGKILL, as an agent reports a reaped worker). --hang R@S: rank R stops answering at step S and
 * every other rank of this process reports a collective timeout T seconds later, as real ranks
 * waiting for it in a collective would. --lose N@S: node N (its index: the node named PREFIX-N)
 * goes silent when its ranks reach step S, as a machine that died: no heartbeat, no report, its
 * ranks' sockets left open; the other ranks time out as with --hang.
 *
 * --cost: what one node's report costs the coordinator apart from its transport: a batch of 16 steps
 * of one node's ranks (of a world of N, default 4096) as its relay builds it, packed once, then
 * unpacked and validated (wire_unpack), merged (stepagg_merge) and freed 2,000 times; prints µs per
 * node step (docs/performance.md "Scale").
 *
 * One thread per process: the uv loop (--procs P: P processes share the nodes). Ends on SIGTERM or SIGINT.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include <zmq.h>

#include "log.h"
#include "loop.h"
#include "relay.h"
#include "stepagg.h"
#include "wire.h"

#define SIM_MAX_QUEUE 16

typedef struct simnode simnode;

typedef struct simrank {
  simnode *node;
  uint64_t job;
  uint32_t rank, world;
  void *sock;
  uv_poll_t poll;                  /* its ZMQ_FD: see rank_drain */
  int draining;
  uv_timer_t timer;
  uint32_t queue[SIM_MAX_QUEUE];   /* steps received, not started */
  int ckpt[SIM_MAX_QUEUE];
  int nq;
  uint32_t cur;                    /* the step being "computed" (0: idle) */
  int cur_ckpt;
  int dead;
} simrank;

struct simnode {
  int idx;
  char name[64];
  void *sock;
  loop_zsock *zs;
  relay *relay;
  uint32_t node_id;
  uv_timer_t beat;
  uint64_t beat_ms;   /* the coordinator's heartbeat period */
  simrank **ranks;
  int nranks;
};

static struct {
  uv_loop_t *uv;
  void *zctx;
  const char *join;
  int nodes, per_node;
  double step_ms, jitter_ms, timeout_s;
  int procs;
  int independent;   /* --independent: each rank ends its step on its own time, not the slowest rank's */
  uint32_t kill_rank, kill_step, hang_rank, hang_step, lose_node, lose_step;   /* step 0: no such fault */
  simnode *node;
  uv_signal_t sig[2];
  char run_dir[64];   /* the relays' sockets (relay.h): a fresh private directory, removed at the end */
} S;

/* ---------------------------------------------------------------- the known figures */

static uint32_t mix(uint32_t a, uint32_t b) {
  uint32_t h = a * 2654435761u ^ (b + 0x9e3779b9u + (a << 6) + (a >> 2));
  h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
  return h;
}

/* Figure I (stepagg order; the sim sends peak, cur, phase and sent) of RANK at STEP. */
static uint64_t sim_value(uint32_t rank, uint32_t world, uint32_t step, int i) {
  uint64_t spread = mix(rank, step * 131u + (uint32_t)i) % world;
  if (i < 2 * MEM_NCAT) return (1ull << 30) + (uint64_t)i * (1ull << 26) + spread * 4096;
  if (i < 2 * MEM_NCAT + STEPSTATS_NPHASE) return 1000 + (uint64_t)i * 100 + spread;
  return (1ull << 24) * (uint64_t)(i + 1) + spread * 64;
}

/* Figure K of the save RANK reports at checkpoint step STEP: blocked, wait (a quarter of blocked:
 * never more), write in µs, and the file's bytes; named as the relay names them. */
static uint64_t sim_ckpt(uint32_t rank, uint32_t world, uint32_t step, int k) {
  uint64_t spread = mix(rank ^ 0x5bd1e995u, step + (uint32_t)(k == 1 ? 0 : k)) % world;
  switch (k) {
  case 0: return 2000 + spread * 4;
  case 1: return (2000 + spread * 4) / 4;
  case 2: return 50000 + spread * 7;
  default: return (100ull << 20) + spread;
  }
}

static const char *const ckpt_names[4] = {"ckpt_blocked_us", "ckpt_wait_us", "ckpt_write_us", "ckpt_bytes"};

static uint64_t sim_step_us(uint32_t rank, uint32_t step) {
  double u = (double)mix(rank + 7919u, step) / 4294967296.0;
  double us = (S.step_ms + S.jitter_ms * (2 * u - 1)) * 1e3;
  return us < 1 ? 1 : (uint64_t)us;
}

static double sim_loss(uint32_t step) { return 10.0 / (1.0 + 0.01 * step); }

/* The slowest rank's time at STEP: when every rank of a real job is done with it, since the step ends
 * in collectives (the gradient norm's all-reduce, the optimizer after it). Computed once per step. */
static uint64_t slowest_us(uint32_t world, uint32_t step) {
  static uint32_t cached_step, cached_world;
  static uint64_t cached;
  if (step != cached_step || world != cached_world) {
    cached = 0;
    for (uint32_t r = 0; r < world; r++)
      if (sim_step_us(r, step) > cached) cached = sim_step_us(r, step);
    cached_step = step, cached_world = world;
  }
  return cached;
}

/* ---------------------------------------------------------------- simulated ranks */

static void rank_drain(simrank *k);

static void send_body(void *sock, Fsdp__Msg *m) {
  wire_env env = {0};
  wire_env_push(&env, NULL, 0);
  if (wire_send(sock, &env, m, ZMQ_DONTWAIT) != FSDP_OK) log_warn("sim: send %s: %s", wire_body_name(m->body_case), fsdp_last_error());
}

static void node_send(simnode *n, const wire_env *env, Fsdp__Msg *m) {
  wire_env own = {0};
  wire_env_push(&own, NULL, 0);
  if (wire_send(n->sock, env ? env : &own, m, ZMQ_DONTWAIT) != FSDP_OK)
    log_warn("sim node %s: send %s: %s", n->name, wire_body_name(m->body_case), fsdp_last_error());
}

static void relay_up(void *arg, const wire_env *env, Fsdp__Msg *m) { node_send(arg, env, m); }

/* The rank's process is gone: close its socket and report its end as an agent would. */
static void rank_exit(simrank *k, int status, int sig) {
  if (k->dead) return;
  k->dead = 1;
  uv_timer_stop(&k->timer);
  uv_close((uv_handle_t *)&k->poll, NULL);   /* the rank's memory stays until the process ends */
  zmq_close(k->sock);
  k->sock = NULL;
  relay_rank_gone(k->node->relay, k->job, k->rank, (long)getpid());
  Fsdp__WorkerExit ex = FSDP__WORKER_EXIT__INIT;
  ex.job_id = k->job, ex.rank = k->rank, ex.exit_status = status, ex.term_signal = sig, ex.node_id = k->node->node_id;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_EXIT, m.worker_exit = &ex;
  node_send(k->node, NULL, &m);
}

static void rank_report(simrank *k) {
  uint32_t step = k->cur, nfig = 2 * MEM_NCAT + STEPSTATS_NPHASE + COLL_NKIND;
  uint64_t v[2 * MEM_NCAT + STEPSTATS_NPHASE + COLL_NKIND];
  for (uint32_t i = 0; i < nfig; i++) v[i] = sim_value(k->rank, k->world, step, (int)i);
  Fsdp__CkptSave save = FSDP__CKPT_SAVE__INIT, *savep = &save;
  save.step = step, save.blocked_s = (double)sim_ckpt(k->rank, k->world, step, 0) / 1e6;
  save.wait_s = (double)sim_ckpt(k->rank, k->world, step, 1) / 1e6, save.write_s = (double)sim_ckpt(k->rank, k->world, step, 2) / 1e6;
  save.bytes = sim_ckpt(k->rank, k->world, step, 3);
  Fsdp__RankStats st = FSDP__RANK_STATS__INIT;
  st.rank = k->rank;
  st.n_peak_bytes = st.n_cur_bytes = MEM_NCAT, st.peak_bytes = v, st.cur_bytes = v + MEM_NCAT;
  st.n_phase_us = STEPSTATS_NPHASE, st.phase_us = v + 2 * MEM_NCAT;
  st.n_sent_bytes = COLL_NKIND, st.sent_bytes = v + 2 * MEM_NCAT + STEPSTATS_NPHASE;
  Fsdp__StepReport r = FSDP__STEP_REPORT__INIT;
  r.step = step, r.loss = sim_loss(step), r.lr = 1e-3, r.grad_norm = 0.5, r.tokens = 1024ull * k->world;
  r.step_ms = (double)sim_step_us(k->rank, step) / 1e3;
  r.stats = &st;
  if (k->cur_ckpt) r.n_ckpt = 1, r.ckpt = &savep;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_STEP_REPORT, m.step_report = &r;
  send_body(k->sock, &m);
  rank_drain(k);   /* the send may have taken the edge that announced a step_cmd */
}

static void rank_next(simrank *k);

/* The step at which some rank stops answering (--hang, --lose), 0 none. */
static uint32_t silent_step(void) { return S.hang_step ? S.hang_step : S.lose_step; }

static void on_step_done(uv_timer_t *t) {
  simrank *k = t->data;
  if (silent_step() && k->cur == silent_step()) {   /* the others' collective timed out waiting for the hung rank */
    Fsdp__WorkerError e = FSDP__WORKER_ERROR__INIT;
    e.rank = k->rank, e.code = FSDP_ERR_TIMEOUT;
    e.message = "a collective timed out (simulated: a peer stopped answering)";
    Fsdp__Msg m = WIRE_MSG_INIT;
    m.body_case = FSDP__MSG__BODY_WORKER_ERROR, m.worker_error = &e;
    send_body(k->sock, &m);
    k->cur = 0;
    rank_drain(k);
    return;
  }
  rank_report(k);
  k->cur = 0;
  rank_next(k);
}

static void rank_next(simrank *k) {
  if (k->cur || !k->nq || k->dead) return;
  k->cur = k->queue[0], k->cur_ckpt = k->ckpt[0];
  memmove(k->queue, k->queue + 1, (size_t)--k->nq * sizeof *k->queue);
  memmove(k->ckpt, k->ckpt + 1, (size_t)k->nq * sizeof *k->ckpt);
  if (S.kill_step && k->rank == S.kill_rank && k->cur == S.kill_step) {
    log_warn("sim: rank %u dies at step %u", k->rank, k->cur);   /* the moment, for the tests */
    rank_exit(k, -1, SIGKILL);
    return;
  }
  if (S.lose_step && k->cur == S.lose_step && (uint32_t)k->node->idx == S.lose_node) {
    if (uv_is_active((uv_handle_t *)&k->node->beat)) {
      log_warn("sim: node %s is lost at step %u", k->node->name, k->cur);   /* the moment, for the tests */
      uv_timer_stop(&k->node->beat);
    }
    return;   /* never reports again */
  }
  if (silent_step() && k->cur == silent_step()) {
    if (S.hang_step && k->rank == S.hang_rank) {
      log_warn("sim: rank %u hangs at step %u", k->rank, k->cur);
      return;   /* never reports again */
    }
    uv_timer_start(&k->timer, on_step_done, (uint64_t)(S.timeout_s * 1000), 0);
    return;
  }
  uint64_t us = S.independent ? sim_step_us(k->rank, k->cur) : slowest_us(k->world, k->cur);
  uv_timer_start(&k->timer, on_step_done, (us + 999) / 1000, 0);
}

static void on_rank_msg(simrank *k) {
  Fsdp__Msg *m = NULL;
  if (wire_recv(k->sock, NULL, &m, ZMQ_DONTWAIT) != FSDP_OK) return;
  Fsdp__Msg out = WIRE_MSG_INIT;
  switch (m->body_case) {
  case FSDP__MSG__BODY_WORKER_SETUP: {
    k->world = m->worker_setup->world;
    Fsdp__WorkerReady r = FSDP__WORKER_READY__INIT;
    r.rank = k->rank;
    out.body_case = FSDP__MSG__BODY_WORKER_READY, out.worker_ready = &r;
    send_body(k->sock, &out);
    break;
  }
  case FSDP__MSG__BODY_STEP_CMD:
    if (k->nq < SIM_MAX_QUEUE) k->queue[k->nq] = m->step_cmd->step, k->ckpt[k->nq++] = m->step_cmd->checkpoint;
    rank_next(k);
    break;
  case FSDP__MSG__BODY_STOP_CMD: {
    Fsdp__Ack a = FSDP__ACK__INIT;
    out.body_case = FSDP__MSG__BODY_ACK, out.ack = &a;
    send_body(k->sock, &out);
    wire_destroy(&m);
    rank_exit(k, 0, 0);
    return;
  }
  default: break;
  }
  wire_destroy(&m);
}

/* A rank's socket is read here rather than through loop.h: loop.h re-checks every socket before each
 * poll of the loop, which for thousands of ranks in one process costs more than the ranks' own work.
 * So the edge-triggered ZMQ_FD is handled locally: drain on its wake-up and after every send. */
static void rank_drain(simrank *k) {
  if (k->draining) return;
  k->draining = 1;
  int ev = 0;
  size_t len = sizeof ev;
  while (!k->dead && zmq_getsockopt(k->sock, ZMQ_EVENTS, &ev, &len) == 0 && (ev & ZMQ_POLLIN)) on_rank_msg(k);
  k->draining = 0;
}

static void on_rank_poll(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  rank_drain(h->data);
}

/* The value of the request's environment variable NAME. */
static const char *env_of(const Fsdp__SpawnReq *r, const char *name) {
  size_t len = strlen(name);
  for (size_t i = 0; i < r->n_env; i++)
    if (!strncmp(r->env[i], name, len) && r->env[i][len] == '=') return r->env[i] + len + 1;
  return NULL;
}

static void spawn(simnode *n, const Fsdp__SpawnReq *r) {
  const char *token = env_of(r, WIRE_WORKER_TOKEN_ENV);
  simrank *k = calloc(1, sizeof *k);
  simrank **rs = realloc(n->ranks, (size_t)(n->nranks + 1) * sizeof *rs);
  if (!k || !rs || !token) {
    free(k);
    if (rs) n->ranks = rs;
    log_error("sim node %s: cannot start rank %u", n->name, r->rank);
    return;
  }
  n->ranks = rs;
  n->ranks[n->nranks++] = k;
  k->node = n, k->job = r->job_id, k->rank = r->rank;
  k->sock = zmq_socket(S.zctx, ZMQ_DEALER);
  wire_socket_setup(k->sock);
  zmq_connect(k->sock, relay_endpoint(n->relay));
  relay_expect(n->relay, k->job, k->rank, (long)getuid(), (long)getpid());   /* every simulated rank is this process */
  uv_timer_init(S.uv, &k->timer);
  k->timer.data = k;
  int fd;
  size_t fdlen = sizeof fd;
  zmq_getsockopt(k->sock, ZMQ_FD, &fd, &fdlen);
  uv_poll_init(S.uv, &k->poll, fd);
  k->poll.data = k;
  uv_poll_start(&k->poll, UV_READABLE, on_rank_poll);
  Fsdp__WorkerHello h = FSDP__WORKER_HELLO__INIT;
  h.job_id = r->job_id, h.rank = r->rank, h.pid = (uint32_t)getpid(), h.token = (char *)token;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_HELLO, m.worker_hello = &h;
  send_body(k->sock, &m);
  rank_drain(k);
}

/* ---------------------------------------------------------------- simulated nodes */

static void send_register(simnode *n) {
  Fsdp__DeviceSlot slots[64], *ptrs[64];
  int ns = S.per_node < 64 ? S.per_node : 64;
  for (int i = 0; i < ns; i++) {
    fsdp__device_slot__init(&slots[i]);
    slots[i].kind = FSDP__DEVICE_KIND__DEVICE_KIND_CPU, slots[i].index = (uint32_t)i, slots[i].name = "cpu";
    slots[i].mem_bytes = 64ull << 30;
    ptrs[i] = &slots[i];
  }
  Fsdp__AgentRegister reg = FSDP__AGENT_REGISTER__INIT;
  reg.name = n->name, reg.cpu_slots = (uint32_t)ns, reg.n_gpus = (size_t)ns, reg.gpus = ptrs;
  reg.pid = (uint32_t)getpid(), reg.host_mem_bytes = 1ull << 40;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_AGENT_REGISTER, m.agent_register = &reg;
  node_send(n, NULL, &m);
}

static void on_beat(uv_timer_t *t) {
  simnode *n = t->data;
  if (!n->node_id) {   /* register every second until welcomed */
    send_register(n);
    uv_timer_start(&n->beat, on_beat, 1000, 0);
    return;
  }
  Fsdp__Heartbeat hb = FSDP__HEARTBEAT__INIT;
  hb.node_id = n->node_id;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_HEARTBEAT, m.heartbeat = &hb;
  node_send(n, NULL, &m);
  uv_timer_start(&n->beat, on_beat, loop_ms_to_boundary(n->beat_ms), 0);
}

static void on_node_msg(void *sock, void *arg) {
  simnode *n = arg;
  Fsdp__Msg *m = NULL;
  wire_env env;
  if (wire_recv(sock, &env, &m, ZMQ_DONTWAIT) != FSDP_OK) return;
  if (relay_from_coord(n->relay, &env, &m)) {
    wire_destroy(&m);
    return;
  }
  switch (m->body_case) {
  case FSDP__MSG__BODY_AGENT_WELCOME: {   /* beat as often and when the coordinator says, as an agent does */
    n->node_id = m->agent_welcome->node_id;
    uint64_t ms = (uint64_t)(m->agent_welcome->heartbeat_s * 1000);
    n->beat_ms = ms < 10 ? 10 : ms;
    uv_timer_start(&n->beat, on_beat, loop_ms_to_boundary(n->beat_ms), 0);
    break;
  }
  case FSDP__MSG__BODY_SPAWN_REQ: spawn(n, m->spawn_req); break;
  case FSDP__MSG__BODY_KILL_REQ:
    for (int i = 0; i < n->nranks; i++)
      if (n->ranks[i]->job == m->kill_req->job_id) rank_exit(n->ranks[i], -1, m->kill_req->signal ? m->kill_req->signal : SIGKILL);
    break;
  case FSDP__MSG__BODY_ERROR: n->node_id = 0; send_register(n); break;   /* the coordinator forgot us */
  default: break;
  }
  wire_destroy(&m);
}

static int node_start(simnode *n, int idx, const char *prefix) {
  n->idx = idx;
  snprintf(n->name, sizeof n->name, "%s-%d", prefix, idx);
  n->sock = zmq_socket(S.zctx, ZMQ_DEALER);
  wire_socket_setup(n->sock);
  int hwm = 0;
  zmq_setsockopt(n->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(n->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
  if (zmq_connect(n->sock, S.join) != 0) {
    fprintf(stderr, "fsdp-sim: --join %s: %s\n", S.join, zmq_strerror(zmq_errno()));
    return -1;
  }
  if (relay_new(S.uv, S.zctx, S.run_dir, relay_up, n, &n->relay) != FSDP_OK ||
      loop_zsock_new(S.uv, n->sock, on_node_msg, n, &n->zs) != FSDP_OK) {
    fprintf(stderr, "fsdp-sim: %s\n", fsdp_last_error());
    return -1;
  }
  uv_timer_init(S.uv, &n->beat);
  n->beat.data = n;
  uv_timer_start(&n->beat, on_beat, 0, 0);   /* registers now, then every second until welcomed */
  return 0;
}

static void on_signal(uv_signal_t *h, int sig) {
  (void)sig;
  uv_stop(h->loop);
}

/* ---------------------------------------------------------------- --check */

static int fail_line(int lineno, const char *what, long long want, long long got) {
  fprintf(stderr, "fsdp-sim --check: line %d: %s: expected %lld, got %lld\n", lineno, what, want, got);
  return 1;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The figure FIG of the line's aggregate against the values V[r] of every rank r (N of them). */
static int check_fig(int ln, json_t *fig, const char *name, const uint64_t *v, uint32_t n, uint64_t *tmp) {
  if (!json_is_object(fig)) {
    fprintf(stderr, "fsdp-sim --check: line %d: no aggregate for %s\n", ln, name);
    return 1;
  }
  uint64_t mn = v[0], mx = v[0], sum = 0;
  uint32_t mnr = 0, mxr = 0;
  for (uint32_t r = 0; r < n; r++) {
    if (v[r] < mn) mn = v[r], mnr = r;
    if (v[r] > mx) mx = v[r], mxr = r;
    sum += v[r];
  }
  memcpy(tmp, v, n * sizeof *v);
  qsort(tmp, n, sizeof *tmp, cmp_u64);
  double med = (double)tmp[(n - 1) / 2];
  char what[160];
#define EXPECT(key, want)                                                                    \
  do {                                                                                       \
    long long got_ = (long long)json_integer_value(json_object_get(fig, key));               \
    snprintf(what, sizeof what, "%s.%s", name, key);                                         \
    if (got_ != (long long)(want)) return fail_line(ln, what, (long long)(want), got_);      \
  } while (0)
  EXPECT("min", mn);
  EXPECT("min_rank", mnr);
  EXPECT("max", mx);
  EXPECT("max_rank", mxr);
  EXPECT("sum", sum);
#undef EXPECT
  double got = (double)json_integer_value(json_object_get(fig, "median"));
  if (fabs(got - med) > STEPAGG_MEDIAN_RTOL * med) {
    snprintf(what, sizeof what, "%s.median (tolerance %.0f %%)", name, STEPAGG_MEDIAN_RTOL * 100);
    return fail_line(ln, what, (long long)med, (long long)got);
  }
  return 0;
}

/* A checkpoint step's figures: every rank's (EXTRA: ckpt_*) and the job's (SAVE: the longest
 * times over the ranks, the bytes of every rank's file). */
static int check_ckpt(int ln, uint32_t step, uint32_t world, json_t *extra, json_t *save, uint64_t *v, uint64_t *tmp) {
  static const char *const job_key[4] = {"blocked_s", "wait_s", "write_s", "bytes"};
  static const char *const rank_key[4] = {"blocked_rank", NULL, "write_rank", NULL};
  for (int e = 0; e < 4; e++) {
    uint64_t mx = 0, sum = 0;
    uint32_t mxr = 0;
    for (uint32_t r = 0; r < world; r++) {
      v[r] = sim_ckpt(r, world, step, e), sum += v[r];
      if (v[r] > mx) mx = v[r], mxr = r;
    }
    char rk[48];
    snprintf(rk, sizeof rk, "checkpoint[0].%s", rank_key[e] ? rank_key[e] : "ranks");
    long long got_rank = json_integer_value(json_object_get(save, rank_key[e] ? rank_key[e] : "ranks"));
    if (got_rank != (rank_key[e] ? (long long)mxr : (long long)world)) return fail_line(ln, rk, rank_key[e] ? mxr : world, got_rank);
    char nm[64];
    snprintf(nm, sizeof nm, "extra.%s", ckpt_names[e]);
    if (check_fig(ln, json_object_get(extra, ckpt_names[e]), nm, v, world, tmp)) return 1;
    double got = json_number_value(json_object_get(save, job_key[e]));
    double want = e == 3 ? (double)sum : (double)mx / 1e6;
    snprintf(nm, sizeof nm, "checkpoint[0].%s (x1e6)", job_key[e]);
    if (fabs(got - want) > 1e-9 * want) return fail_line(ln, nm, (long long)(want * 1e6), (long long)(got * 1e6));
  }
  if (json_integer_value(json_object_get(save, "step")) != step)
    return fail_line(ln, "checkpoint[0].step", step, json_integer_value(json_object_get(save, "step")));
  return 0;
}

/* Every step's line of METRICS against the figures every rank of WORLD sent. */
static int check(const char *path, uint32_t world) {
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    return 1;
  }
  uint64_t *v = malloc(world * sizeof *v), *tmp = malloc(world * sizeof *tmp);
  char *line = NULL;
  size_t cap = 0;
  int ln = 0, bad = 0, ckpt_lines = 0;
  static const char *const groups[] = {"peak_bytes", "cur_bytes", "phase_us", "sent_bytes"};
  static const int glen[] = {MEM_NCAT, MEM_NCAT, STEPSTATS_NPHASE, COLL_NKIND};
  Fsdp__StepAgg names = FSDP__STEP_AGG__INIT;
  names.n_std = STEPAGG_NSTD;
  while (!bad && getline(&line, &cap, f) > 0) {
    ln++;
    json_t *o = json_loads(line, 0, NULL), *agg = json_object_get(o, "agg");
    uint32_t step = (uint32_t)json_integer_value(json_object_get(o, "step"));
    if (!o || !agg || !step) {
      fprintf(stderr, "fsdp-sim --check: line %d: not a step line with an aggregate\n", ln);
      json_decref(o);
      bad = 1;
      break;
    }
    if (json_integer_value(json_object_get(agg, "ranks")) != world) bad = fail_line(ln, "agg.ranks", world, json_integer_value(json_object_get(agg, "ranks")));
    int i = 0;
    for (int g = 0; !bad && g < 4; g++)
      for (int k = 0; !bad && k < glen[g]; k++, i++) {
        const char *group, *key;
        stepstats_figure_name(&names, (size_t)i, &group, &key);
        for (uint32_t r = 0; r < world; r++) v[r] = sim_value(r, world, step, i);
        char nm[96];
        snprintf(nm, sizeof nm, "%s.%s", groups[g], key);
        bad = check_fig(ln, json_object_get(json_object_get(agg, group), key), nm, v, world, tmp);
      }
    for (uint32_t r = 0; !bad && r < world; r++) v[r] = sim_step_us(r, step);
    if (!bad) bad = check_fig(ln, json_object_get(agg, "step_us"), "step_us", v, world, tmp);
    /* the job-wide figures are exact: the slowest rank's time and its rank, tokens/s from it, the loss */
    uint64_t mx = 0;
    uint32_t mxr = 0;
    for (uint32_t r = 0; r < world; r++)
      if (sim_step_us(r, step) > mx) mx = sim_step_us(r, step), mxr = r;
    double step_ms = json_number_value(json_object_get(o, "step_ms"));
    if (!bad && step_ms != (double)mx / 1e3) bad = fail_line(ln, "step_ms (us)", (long long)mx, (long long)(step_ms * 1e3));
    if (!bad && json_integer_value(json_object_get(o, "step_ms_rank")) != mxr)
      bad = fail_line(ln, "step_ms_rank", mxr, json_integer_value(json_object_get(o, "step_ms_rank")));
    if (!bad && fabs(json_number_value(json_object_get(o, "loss")) - sim_loss(step)) > 1e-11 * sim_loss(step))   /* 12 digits */
      bad = fail_line(ln, "loss (x1e9)", (long long)(sim_loss(step) * 1e9), (long long)(json_number_value(json_object_get(o, "loss")) * 1e9));
    double tps = json_number_value(json_object_get(o, "tokens_per_s")), want_tps = 1024.0 * world * 1000.0 / ((double)mx / 1e3);
    if (!bad && fabs(tps - want_tps) > 1e-9 * want_tps) bad = fail_line(ln, "tokens_per_s", (long long)want_tps, (long long)tps);
    json_t *extra = json_object_get(agg, "extra"), *saves = json_object_get(o, "checkpoint");
    if (!bad && (extra != NULL) != (json_array_size(saves) == 1)) {
      fprintf(stderr, "fsdp-sim --check: line %d: checkpoint figures without a save, or a save without them\n", ln);
      bad = 1;
    }
    if (!bad && extra) bad = check_ckpt(ln, step, world, extra, json_array_get(saves, 0), v, tmp);
    ckpt_lines += extra != NULL;
    json_t *ranks = json_object_get(o, "ranks");   /* a detail step: every rank, its own figures */
    for (size_t r = 0; !bad && ranks && r < json_array_size(ranks); r++) {
      json_t *jr = json_array_get(ranks, r);
      long long got = json_integer_value(json_object_get(json_object_get(jr, "peak_bytes"), "param_shard"));
      if (json_integer_value(json_object_get(jr, "rank")) != (json_int_t)r) bad = fail_line(ln, "ranks[].rank", (long long)r, json_integer_value(json_object_get(jr, "rank")));
      else if (got != (long long)sim_value((uint32_t)r, world, step, 0)) bad = fail_line(ln, "ranks[].peak_bytes.param_shard", (long long)sim_value((uint32_t)r, world, step, 0), got);
    }
    if (!bad && ranks && json_array_size(ranks) != world) bad = fail_line(ln, "ranks[] entries", world, (long long)json_array_size(ranks));
    json_decref(o);
  }
  free(line), free(v), free(tmp);
  fclose(f);
  if (!bad) printf("fsdp-sim --check: %d steps of %u ranks: every aggregated figure matches (%d checkpoint steps)\n", ln, world, ckpt_lines);
  return bad;
}

/* ---------------------------------------------------------------- --cost */

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cost(uint32_t world) {
  enum { K = 16, ITERS = 2000 };
  stepagg *node = NULL, *coord = NULL;
  if (stepagg_new(&node) != FSDP_OK || stepagg_new(&coord) != FSDP_OK) return 1;
  Fsdp__StepAgg aggs[K];
  Fsdp__StepReport first[K];
  Fsdp__NodeStepReport reps[K], *more[K];
  for (uint32_t s = 0; s < K; s++) {   /* node 100's ranks, as complete() folds them */
    stepagg_reset(node);
    for (uint32_t r = 100u * (uint32_t)S.per_node; r < 101u * (uint32_t)S.per_node; r++) {
      uint64_t v[2 * MEM_NCAT + STEPSTATS_NPHASE + COLL_NKIND];
      for (int i = 0; i < (int)(sizeof v / sizeof *v); i++) v[i] = sim_value(r, world, s + 1, i);
      Fsdp__RankStats st = FSDP__RANK_STATS__INIT;
      st.rank = r, st.n_peak_bytes = st.n_cur_bytes = MEM_NCAT, st.peak_bytes = v, st.cur_bytes = v + MEM_NCAT;
      st.n_phase_us = STEPSTATS_NPHASE, st.phase_us = v + 2 * MEM_NCAT;
      st.n_sent_bytes = COLL_NKIND, st.sent_bytes = v + 2 * MEM_NCAT + STEPSTATS_NPHASE;
      if (stepagg_add_rank(node, &st, (double)sim_step_us(r, s + 1) / 1e3, 0) != FSDP_OK) return 1;
    }
    if (stepagg_to_msg(node, 0, &aggs[s]) != FSDP_OK) return 1;
    fsdp__step_report__init(&first[s]);
    first[s].step = s + 1, first[s].loss = sim_loss(s + 1), first[s].tokens = 1024ull * world;
    fsdp__node_step_report__init(&reps[s]);
    reps[s].job_id = 1, reps[s].first = &first[s], reps[s].agg = &aggs[s], reps[s].step_ms = S.step_ms;
    more[s] = &reps[s];
  }
  reps[0].more = more + 1, reps[0].n_more = K - 1;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_NODE_STEP_REPORT, m.node_step_report = &reps[0];
  uint8_t *buf;
  size_t len;
  if (wire_pack(&m, &buf, &len) != FSDP_OK) return 1;
  double unpack = 0, merge = 0;
  for (int it = 0; it < ITERS; it++) {
    double t0 = mono_s();
    Fsdp__Msg *u = NULL;
    if (wire_unpack(buf, len, &u) != FSDP_OK) {
      fprintf(stderr, "fsdp-sim --cost: %s\n", fsdp_last_error());
      return 1;
    }
    double t1 = mono_s();
    const Fsdp__NodeStepReport *h = u->node_step_report;
    fsdp_status rc = stepagg_merge(coord, h->agg);
    for (size_t i = 0; rc == FSDP_OK && i < h->n_more; i++) rc = stepagg_merge(coord, h->more[i]->agg);
    double t2 = mono_s();
    wire_destroy(&u);
    unpack += t1 - t0 + mono_s() - t2, merge += t2 - t1;
    if (rc != FSDP_OK) return 1;
    if (it % 64 == 63) stepagg_reset(coord);   /* as many nodes as a step of 512 nodes merges, about */
  }
  printf("fsdp-sim --cost: a batch of %d steps of %d ranks: %zu bytes; per node step %.2f us to unpack, validate and "
         "free, %.2f us to merge (%zu histogram pairs)\n", K, S.per_node, len, unpack / ITERS / K * 1e6, merge / ITERS / K * 1e6,
         aggs[0].n_hist_bucket);
  for (int s = 0; s < K; s++) stepagg_msg_free(&aggs[s]);
  free(buf);
  stepagg_destroy(&node), stepagg_destroy(&coord);
  return 0;
}

/* ---------------------------------------------------------------- main */

static int parse_fault(const char *s, uint32_t *rank, uint32_t *step) {
  unsigned r, st;
  if (sscanf(s, "%u@%u", &r, &st) != 2 || st == 0) {
    fprintf(stderr, "fsdp-sim: fault '%s': expected N@STEP (a rank, or a node for --lose; STEP >= 1)\n", s);
    return -1;
  }
  *rank = r, *step = st;
  return 0;
}

/* The relays' socket files (every process's), then their directory. */
static void remove_run_dir(void) {
  DIR *d = opendir(S.run_dir);
  if (d) {
    for (struct dirent *e; (e = readdir(d));)
      if (e->d_name[0] != '.') unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
  }
  rmdir(S.run_dir);
}

int main(int argc, char **argv) {
  const char *name = "sim", *check_path = NULL;
  uint32_t world = 0;
  int run_cost = 0;
  S.per_node = 8, S.step_ms = 5, S.jitter_ms = 1, S.timeout_s = 10, S.procs = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = 1;
    if (!strcmp(a, "--independent") || !strcmp(a, "--cost")) {   /* the flags without a value */
      *(!strcmp(a, "--cost") ? &run_cost : &S.independent) = 1;
      continue;
    }
    if (!v) used = 0;
    else if (!strcmp(a, "--join")) S.join = v;
    else if (!strcmp(a, "--nodes")) S.nodes = atoi(v);
    else if (!strcmp(a, "--ranks-per-node")) S.per_node = atoi(v);
    else if (!strcmp(a, "--name")) name = v;
    else if (!strcmp(a, "--step-ms")) S.step_ms = atof(v);
    else if (!strcmp(a, "--jitter-ms")) S.jitter_ms = atof(v);
    else if (!strcmp(a, "--procs")) S.procs = atoi(v);
    else if (!strcmp(a, "--timeout-s")) S.timeout_s = atof(v);
    else if (!strcmp(a, "--kill")) { if (parse_fault(v, &S.kill_rank, &S.kill_step)) return 2; }
    else if (!strcmp(a, "--hang")) { if (parse_fault(v, &S.hang_rank, &S.hang_step)) return 2; }
    else if (!strcmp(a, "--lose")) { if (parse_fault(v, &S.lose_node, &S.lose_step)) return 2; }
    else if (!strcmp(a, "--check")) check_path = v;
    else if (!strcmp(a, "--world")) world = (uint32_t)atoi(v);
    else used = 0;
    if (!used) {
      fprintf(stderr, "fsdp-sim: unknown or incomplete option %s (see the comment at the top of bench/fsdp_sim.c)\n", a);
      return 2;
    }
    i++;
  }
  if (S.hang_step && S.lose_step) {
    fprintf(stderr, "fsdp-sim: --hang and --lose: one silent fault at a time\n");
    return 2;
  }
  if (S.jitter_ms < 0 || S.jitter_ms > S.step_ms) {
    fprintf(stderr, "fsdp-sim: --jitter-ms %g: allowed 0..--step-ms\n", S.jitter_ms);
    return 2;
  }
  if (run_cost) return S.per_node < 1 || S.per_node > 64 ? 2 : cost(world ? world : 4096);
  if (check_path) {
    if (world < 1) {
      fprintf(stderr, "fsdp-sim: --check needs --world N (N >= 1)\n");
      return 2;
    }
    return check(check_path, world);
  }
  if (!S.join || S.nodes < 1 || S.per_node < 1 || S.per_node > 64 || S.procs < 1 || S.procs > S.nodes) {
    fprintf(stderr, "fsdp-sim: needs --join ENDPOINT and --nodes N >= 1 (--ranks-per-node 1..64, --procs 1..N)\n");
    return 2;
  }
  /* --procs P: P processes, each with its share of the nodes (one loop per process: a machine's
   * cores serve several); the first waits for the others and passes SIGTERM on. */
  snprintf(S.run_dir, sizeof S.run_dir, "/tmp/fsdp-sim-XXXXXX");
  if (!mkdtemp(S.run_dir)) {
    fprintf(stderr, "fsdp-sim: cannot create a directory for the relays' sockets: %s\n", strerror(errno));
    return 1;
  }
  pid_t self = getpid();
  int first = 0, count = S.nodes;
  pid_t kids[256];
  int nkids = 0;
  for (int p = 1; p < S.procs && p < 256; p++) {
    pid_t pid = fork();
    if (pid == 0) {
      first = p * S.nodes / S.procs, count = (p + 1) * S.nodes / S.procs - first;
      nkids = 0;
      break;
    }
    if (pid > 0) kids[nkids++] = pid;
  }
  if (nkids || S.procs == 1) count = S.nodes / S.procs;
  /* Three descriptors per simulated rank (its socket, both ends of its connection) and a few per node. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  log_set_level(LOG_WARN);
  S.uv = uv_default_loop();
  S.zctx = zmq_ctx_new();
  zmq_ctx_set(S.zctx, ZMQ_MAX_SOCKETS, 2 * count * (S.per_node + 2) + 64);
  S.node = calloc((size_t)count, sizeof *S.node);
  if (!S.node) return 1;
  for (int i = 0; i < count; i++)
    if (node_start(&S.node[i], first + i, name) != 0) return 1;
  for (int i = 0; i < 2; i++) {
    uv_signal_init(S.uv, &S.sig[i]);
    uv_signal_start(&S.sig[i], on_signal, i ? SIGINT : SIGTERM);
  }
  uv_run(S.uv, UV_RUN_DEFAULT);
  for (int k = 0; k < nkids; k++) kill(kids[k], SIGTERM);
  for (int k = 0; k < nkids; k++) waitpid(kids[k], NULL, 0);
  /* a tool's end: the process exit closes every socket; nothing is left to flush but the sockets' names */
  if (getpid() == self) remove_run_dir();
  return 0;
}
