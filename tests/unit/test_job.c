/* test_job — the job's lifecycle (daemon/job.h) driven through its one entry point, job_event, over a
 * coordinator filled in by hand: a real jobs.db in a temporary directory, one node whose agent is a
 * ZMQ DEALER on an inproc socket (so that what the job sends, kill_reqs, can be counted), no daemon,
 * no worker. Parts:
 *
 *  - table: every (phase, event) pair, for a job without checkpoints and for one that restarts from
 *    them, against this file's own table of the expected next phase; each event is then fed a second
 *    time (an event twice, or late: a step report after cancel, a worker exit during restart-wait,
 *    shutdown during starting are among the pairs). After each: the phase, the invariants job_event
 *    checks, memory and jobs.db agree on the recorded state, and the job is freed once (ASan).
 *  - scenarios: a whole life (queued → starting → running → stopping → draining → done: succeeded),
 *    a restart (restart-wait → queued → starting again), a user's stop at a checkpoint, and what each
 *    sends (kill_reqs to the agent).
 *  - random: a few hundred seeded interleavings of every event on a few jobs, half of them the job's
 *    own progress: ranks ready and steps reported through the real step pipeline (steps.h: one
 *    node_step_report per step, recorded in metrics.jsonl and jobs.db). No job ends in two states,
 *    none is lost, none runs after a cancel, every job ends done and freed, and metrics.jsonl and
 *    jobs.db agree on steps (each line is its step's row; without a restart, the same steps).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"
#include "coord_core.h"
#include "job_priv.h"
#include "log.h"
#include "stepagg.h"
#include "steps.h"
#include "tmpdir.h"

#define WORLD 2
#define NEV JOB_EVENTS
#define NPH JOB_PHASES

static void *zctx, *agent;   /* the node's agent: counts what the coordinator sends it */

/* A coordinator with one node of WORLD CPU slots, its cluster socket bound on inproc. */
static coord_t *coord_make(void) {
  coord_t *c = calloc(1, sizeof *c);
  c->cfg.heartbeat_s = 1;
  snprintf(c->state_dir, sizeof c->state_dir, "%s", tmp_dir);
  CHECK_OK(jobs_db_open(path_in("jobs.db"), &c->db));
  static int serial;
  char ep[64];
  snprintf(ep, sizeof ep, "inproc://cluster-%d", serial++);
  c->cluster = zmq_socket(zctx, ZMQ_ROUTER);
  CHECK(zmq_bind(c->cluster, ep) == 0);
  agent = zmq_socket(zctx, ZMQ_DEALER);
  zmq_setsockopt(agent, ZMQ_ROUTING_ID, "node0", 5);
  CHECK(zmq_connect(agent, ep) == 0);
  /* the ROUTER knows the agent once it spoke: one frame from it, read and dropped */
  zmq_send(agent, "hi", 2, 0);
  char buf[16];
  CHECK(zmq_recv(c->cluster, buf, sizeof buf, 0) == 5);
  CHECK(zmq_recv(c->cluster, buf, sizeof buf, 0) == 2);
  c->nnodes = 1;
  c->nodes = calloc(1, sizeof *c->nodes);
  node_t *n = &c->nodes[0];
  n->id = 1;
  snprintf(n->name, sizeof n->name, "node0");
  memcpy(n->ident, "node0", 5);
  n->ident_len = 5;
  n->nslots = WORLD;
  n->slots = calloc(WORLD, sizeof *n->slots);
  for (int s = 0; s < WORLD; s++) n->slots[s].kind = FSDP__DEVICE_KIND__DEVICE_KIND_CPU, n->slots[s].index = (uint32_t)s;
  return c;
}

static void coord_free(coord_t **cp) {
  coord_t *c = *cp;
  while (c->jobs) {
    job_t *j = c->jobs;
    c->jobs = j->next;
    job_destroy(&j);
  }
  while (c->px_done) {
    promx_job *px = c->px_done;
    c->px_done = px->next;
    promx_job_free(&px);
  }
  job_destroy_unrecorded(c);
  jobs_db_destroy(&c->db);
  free(c->nodes[0].slots);
  free(c->nodes);
  int linger = 0;
  zmq_setsockopt(agent, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(c->cluster, ZMQ_LINGER, &linger, sizeof linger);
  zmq_close(agent);
  zmq_close(c->cluster);
  free(c);
  *cp = NULL;
}

/* kill_reqs the agent received since the last call. */
static int kills_sent(void) {
  int n = 0;
  for (;;) {
    wire_env env;
    Fsdp__Msg *m = NULL;
    if (wire_recv(agent, &env, &m, ZMQ_DONTWAIT) != FSDP_OK) break;
    n += m->body_case == FSDP__MSG__BODY_KILL_REQ;
    wire_destroy(&m);
  }
  return n;
}

static const char *spec(int restarts) {
  static char buf[1024];
  snprintf(buf, sizeof buf,
           "[job]\nname = t\nsteps = 3\nmax_restarts = %d\n[model]\nn_layer = 1\nn_head = 2\nn_embd = 32\n"
           "vocab_size = 64\nseq_len = 16\n[data]\ntrain = synthetic:markov:1\nbatch_size = 2\n[fsdp]\nworld_size = %d\n"
           "device = cpu\n%s%s%s",
           restarts, WORLD, restarts ? "[checkpoint]\ndir = " : "", restarts ? path_in("ckpt") : "",
           restarts ? "\nevery = 1\nresume = auto\n" : "");
  return buf;
}

/* A queued job in C's list and in jobs.db, as a submit leaves it. */
static job_t *submit(coord_t *c, int restarts) {
  peer_t owner;
  CHECK_OK(peer_from_uid(geteuid(), geteuid(), &owner));
  job_t *j = NULL;
  CHECK_OK(job_from_spec(c, spec(restarts), "t.ini", tmp_dir, &owner, 022, &j));
  if (!j) exit(1);
  jobs_db_row row = {.name = j->spec.name, .world = j->world, .device = j->kind, .steps = j->spec.steps,
                     .spec_text = j->spec_text, .spec_path = j->spec_path, .base_dir = j->base_dir, .job_dir = tmp_dir,
                     .owner_uid = j->owner.uid, .owner_gid = j->owner.gid, .owner = j->owner.name, .umask = 022};
  CHECK_OK(jobs_db_insert(c->db, &row, 0, &j->id));
  snprintf(j->job_dir, sizeof j->job_dir, "%s/%llu", tmp_dir, (unsigned long long)j->id);   /* its own metrics.jsonl */
  CHECK(mkdir(j->job_dir, 0755) == 0);
  j->next = c->jobs;
  c->jobs = j;
  return j;
}

static job_ev_args ev_args(job_ev ev) {
  static char msg[64];
  snprintf(msg, sizeof msg, "test %s", job_ev_name(ev));
  job_ev_args a = {.rank = 0, .node = 0, .msg = msg, .now = 1e12};
  if (ev == JE_STEP_RECORDED) a.step = 3;               /* the last: the stop */
  if (ev == JE_WORKER_ERROR) a.code = FSDP_ERR_INVALID;   /* not a communication error: it fails the attempt */
  return a;
}

/* What schedule.c does around JE_START: place every rank on node 0, then spawn it. */
static void start(coord_t *c, job_t *j) {
  j->ranks = calloc(WORLD, sizeof *j->ranks);
  for (int r = 0; r < WORLD; r++) {
    j->ranks[r].node = 0, j->ranks[r].slot = r;
    c->nodes[0].slots[r].job_id = j->id, c->nodes[0].slots[r].rank = (uint32_t)r;
  }
  j->start_timeout = j->step_timeout = 60;
  CHECK_EQ_INT(JOB_STARTING, job_event(c, j, JE_START, NULL));
  job_open_metrics(j);
  for (int r = 0; r < WORLD; r++) j->ranks[r].alive = 1;
  j->nalive = WORLD;
}

/* What steps.c does: every rank ready at step 0, the steps granted from 1. */
static void run(coord_t *c, job_t *j) {
  for (int r = 0; r < WORLD; r++) {
    job_ev_args a = {.rank = r, .node = -1, .step = 0};
    job_event(c, j, JE_RANK_READY, &a);
  }
  CHECK_EQ_INT(JOB_RUNNING, job_phase_of(j));
  j->sv.done_step = 0, j->sv.next_step = 1;
}

/* A job of C brought to phase P by the events that lead there. */
static job_t *job_in(coord_t *c, job_phase p, int restarts) {
  job_t *j = submit(c, restarts);
  job_ev_args a = ev_args(JE_FAIL);
  switch (p) {
  case JOB_QUEUED: break;
  case JOB_STARTING: start(c, j); break;
  case JOB_RUNNING: start(c, j), run(c, j); break;
  case JOB_STOPPING:
    start(c, j), run(c, j);
    j->sv.next_step = 4;   /* steps 1..3 granted */
    a.step = 3;
    CHECK_EQ_INT(JOB_STOPPING, job_event(c, j, JE_STEP_RECORDED, &a));
    break;
  case JOB_RESTART_WAIT:
    start(c, j), run(c, j);
    CHECK_EQ_INT(restarts ? JOB_RESTART_WAIT : JOB_DRAINING, job_event(c, j, JE_FAIL, &a));
    break;
  case JOB_DRAINING: start(c, j), run(c, j), job_event(c, j, JE_CANCEL, NULL); break;
  default: CHECK(0);
  }
  return j;
}

/* The next phase of each (phase, event) pair as this test expects it, for the events of ev_args,
 * with restarts (R) or without (P) where they differ. -1: the pair is not reached (RESTART_WAIT
 * without restarts). */
#define Q JOB_QUEUED
#define S JOB_STARTING
#define U JOB_RUNNING
#define T JOB_STOPPING
#define W JOB_RESTART_WAIT
#define D JOB_DRAINING
#define X JOB_DONE
static const int want_plain[NPH][NEV] = {
  /*          start rdy rec stp err exit dl lost fail unfit ustop cancel shut late tick reap */
  [JOB_QUEUED]   = {S, Q, Q, Q, Q, Q, Q, Q, D, D, D, D, D, D, Q, Q},
  [JOB_STARTING] = {S, S, S, S, D, D, D, D, D, S, D, D, D, D, S, S},
  [JOB_RUNNING]  = {U, U, T, U, D, D, D, D, D, U, D, D, D, D, U, U},
  [JOB_STOPPING] = {T, T, T, T, D, T, D, D, D, T, D, D, T, D, T, T},
  [JOB_DRAINING] = {D, D, D, D, D, D, D, D, D, D, D, D, D, D, D, X},
};
static const int want_restart[NPH][NEV] = {
  /*          start rdy rec stp err exit dl lost fail unfit ustop cancel shut late tick reap */
  [JOB_QUEUED]       = {S, Q, Q, Q, Q, Q, Q, Q, W, D, D, D, D, D, Q, Q},
  [JOB_STARTING]     = {S, S, S, S, W, W, W, W, W, S, D, D, D, D, S, S},
  [JOB_RUNNING]      = {U, U, T, U, W, W, W, W, W, U, U, D, U, D, U, U},
  [JOB_STOPPING]     = {T, T, T, T, W, T, W, W, W, T, D, D, T, D, T, T},
  [JOB_RESTART_WAIT] = {W, W, W, W, W, W, W, W, W, W, D, D, D, D, W, Q},
  [JOB_DRAINING]     = {D, D, D, D, D, D, D, D, D, D, D, D, D, D, D, X},
};

/* Memory and jobs.db say the same state. */
static void check_recorded(coord_t *c, const job_t *j) {
  jobs_db_row row;
  CHECK_OK(jobs_db_get(c->db, j->id, &row));
  CHECK_EQ_INT(j->state, row.state);
  jobs_db_row_clear(&row);
}

/* Feed EV to J (a job of C) as its caller would: JE_REAPED only once its workers are gone. Frees a
 * job that became done, as job_reap_drained does; returns its phase then. */
static job_phase feed(coord_t *c, job_t *j, job_ev ev) {
  job_ev_args a = ev_args(ev);
  if (ev == JE_START && j->phase == JOB_QUEUED) {   /* as schedule_start: placed first */
    start(c, j);
    return job_phase_of(j);
  }
  if (ev == JE_WORKER_EXIT && !(j->ranks && j->ranks[0].alive)) return job_phase_of(j);   /* the coordinator drops it */
  if (ev == JE_REAPED) {
    if (j->phase != JOB_RESTART_WAIT && j->phase != JOB_DRAINING) return job_event(c, j, ev, &a);   /* the no-op */
    j->drain_until = 0;   /* the drain limit passed: reaped whatever is alive */
    for (job_t *x = c->jobs; x; x = x->next)
      if (x == j) {
        job_phase before = job_phase_of(j);
        job_reap_drained(c);
        for (job_t *y = c->jobs; y; y = y->next)
          if (y == j) return job_phase_of(j);
        CHECK_EQ_INT(JOB_DRAINING, before);
        return JOB_DONE;
      }
  }
  return job_event(c, j, ev, &a);
}

static void part_table(void) {
  for (int restarts = 0; restarts <= 1; restarts++) {
    const int (*want)[NEV] = restarts ? want_restart : want_plain;
    for (int p = 0; p < JOB_DONE; p++) {
      if (p == JOB_RESTART_WAIT && !restarts) continue;
      for (int e = 0; e < NEV; e++) {
        coord_t *c = coord_make();
        job_t *j = job_in(c, (job_phase)p, restarts);
        CHECK_EQ_INT(p, job_phase_of(j));
        int state_before = j->state;
        kills_sent();
        job_phase got = feed(c, j, (job_ev)e);
        if ((int)got != want[p][e])
          fprintf(stderr, "restarts %d: %s + %s: expected %s, got %s\n", restarts, job_phase_name((job_phase)p),
                  job_ev_name((job_ev)e), job_phase_name((job_phase)want[p][e]), job_phase_name(got));
        CHECK_EQ_INT(want[p][e], got);
        if (got == JOB_DONE) {
          CHECK(c->jobs == NULL);
          coord_free(&c);
          continue;
        }
        check_recorded(c, j);
        if (got == (job_phase)p && p != JOB_RUNNING && p != JOB_STARTING) CHECK_EQ_INT(state_before, j->state);
        if (got == JOB_DRAINING && p != JOB_DRAINING) CHECK(jobs_db_terminal(j->state) || j->state == ST_QUEUED);
        if (got == JOB_RESTART_WAIT && p != JOB_RESTART_WAIT) CHECK_EQ_INT(ST_QUEUED, j->state);
        /* ending an attempt whose workers live kills them (but for a shutdown's queue of a queued job) */
        int live = p == JOB_STARTING || p == JOB_RUNNING || p == JOB_STOPPING || p == JOB_RESTART_WAIT;
        int kills = (got == JOB_DRAINING || got == JOB_RESTART_WAIT) && live && j->nalive > 0 && j->state != ST_SUCCEEDED;
        if (p == JOB_RESTART_WAIT) kills = got == JOB_DRAINING && e != JE_SHUTDOWN && e != JE_SHUTDOWN_LATE;
        if (p == JOB_DRAINING) kills = e == JE_TICK;   /* the cancel's SIGTERM had its grace: SIGKILL */
        int sent = kills_sent();
        if (sent != kills)
          fprintf(stderr, "restarts %d: %s + %s: expected %d kill_req, got %d\n", restarts, job_phase_name((job_phase)p),
                  job_ev_name((job_ev)e), kills, sent);
        CHECK_EQ_INT(kills, sent);
        /* the same event again: late, or twice */
        job_phase again = feed(c, j, (job_ev)e);
        CHECK_EQ_INT(want[got][e], again);
        if (again != JOB_DONE) check_recorded(c, j);
        coord_free(&c);
      }
    }
  }
}

/* Queued to done: every rank ready, every step recorded, every rank's ack: succeeded. */
static void part_life(void) {
  coord_t *c = coord_make();
  job_t *j = job_in(c, JOB_RUNNING, 0);
  CHECK_EQ_INT(ST_RUNNING, j->state);
  j->sv.next_step = 4;
  job_ev_args a = {.rank = -1, .node = -1, .step = 1};
  CHECK_EQ_INT(JOB_RUNNING, job_event(c, j, JE_STEP_RECORDED, &a));
  CHECK_EQ_INT(1, j->sv.done_step);
  a.step = 3;
  CHECK_EQ_INT(JOB_STOPPING, job_event(c, j, JE_STEP_RECORDED, &a));
  a.rank = 0;
  CHECK_EQ_INT(JOB_STOPPING, job_event(c, j, JE_RANK_STOPPED, &a));
  CHECK_EQ_INT(JOB_STOPPING, job_event(c, j, JE_RANK_STOPPED, &a));   /* twice: counted once */
  CHECK_EQ_INT(1, j->nstopped);
  /* rank 1 exits 0 after the stop: as good as its ack */
  a = (job_ev_args){.rank = 1, .node = -1, .status = 0, .msg = "exit"};
  CHECK_EQ_INT(JOB_DRAINING, job_event(c, j, JE_WORKER_EXIT, &a));
  CHECK_EQ_INT(ST_SUCCEEDED, j->state);
  CHECK_EQ_INT(0, kills_sent());   /* told to stop: no signal */
  CHECK(j->kill_at > 0);           /* rank 0 has 10 s to exit */
  a = (job_ev_args){.rank = -1, .node = -1, .now = j->kill_at + 1};
  CHECK_EQ_INT(JOB_DRAINING, job_event(c, j, JE_TICK, &a));
  CHECK_EQ_INT(1, kills_sent());
  CHECK_EQ_INT(0, j->kill_at);
  a = (job_ev_args){.rank = 0, .node = -1, .status = 0, .msg = "exit"};
  job_event(c, j, JE_WORKER_EXIT, &a);
  CHECK_EQ_INT(0, j->nalive);
  CHECK_EQ_INT(1, job_reap_drained(c));
  CHECK(c->jobs == NULL);
  CHECK_EQ_INT(0, c->nodes[0].slots[0].job_id);
  coord_free(&c);
}

/* A failed attempt with restarts left: killed, queued again once reaped, and started afresh; its
 * second failure (no restart left) ends it failed. A comm error is held, not a failure. */
static void part_restart(void) {
  coord_t *c = coord_make();
  job_t *j = job_in(c, JOB_RUNNING, 1);
  job_ev_args a = {.rank = 1, .node = -1, .code = FSDP_ERR_COMM, .msg = "peer closed"};
  CHECK_EQ_INT(JOB_RUNNING, job_event(c, j, JE_WORKER_ERROR, &a));
  CHECK(j->pending[0] != 0);
  a = (job_ev_args){.rank = 1, .node = -1, .status = 1, .msg = "rank 1 exited with status 1"};
  CHECK_EQ_INT(JOB_RUNNING, job_event(c, j, JE_WORKER_EXIT, &a));   /* the rank that reported it leaves */
  a = (job_ev_args){.rank = 0, .node = -1, .signal = 9, .msg = "rank 0 was killed by signal 9"};
  CHECK_EQ_INT(JOB_RESTART_WAIT, job_event(c, j, JE_WORKER_EXIT, &a));
  CHECK_EQ_INT(ST_QUEUED, j->state);
  CHECK_EQ_INT(1, j->attempt);
  CHECK(strstr(j->reason, "rank 0 was killed") != NULL);
  CHECK_EQ_INT(1, job_reap_drained(c));
  CHECK_EQ_INT(JOB_QUEUED, job_phase_of(j));
  CHECK(j->ranks == NULL);
  start(c, j);
  run(c, j);
  a = (job_ev_args){.rank = -1, .node = 0, .msg = "node node0 was lost"};
  CHECK_EQ_INT(JOB_DRAINING, job_event(c, j, JE_NODE_LOST, &a));
  CHECK_EQ_INT(ST_FAILED, j->state);
  CHECK_EQ_INT(0, j->nalive);
  CHECK_EQ_INT(0, kills_sent() > 1);   /* the first attempt's SIGKILL at most: the node is gone */
  job_reap_drained(c);
  CHECK(c->jobs == NULL);
  coord_free(&c);
}

/* fsdpctl stop of a job with checkpoints: the next step not yet sent is its last; once acked, it
 * ends cancelled with its checkpoint named. A shutdown's stop ends queued. */
static void part_stop(void) {
  for (int shut = 0; shut <= 1; shut++) {
    coord_t *c = coord_make();
    job_t *j = job_in(c, JOB_RUNNING, 1);
    j->sv.next_step = 3;   /* steps 1, 2 sent */
    CHECK_EQ_INT(JOB_RUNNING, job_event(c, j, shut ? JE_SHUTDOWN : JE_USER_STOP, NULL));
    CHECK_EQ_INT(3, j->stop_at);
    CHECK_EQ_INT(3, j->steps);
    job_ev_args a = {.rank = -1, .node = -1, .step = 3};
    CHECK_EQ_INT(JOB_STOPPING, job_event(c, j, JE_STEP_RECORDED, &a));
    for (int r = 0; r < WORLD; r++) job_event(c, j, JE_RANK_STOPPED, &(job_ev_args){.rank = r, .node = -1});
    CHECK_EQ_INT(JOB_DRAINING, job_phase_of(j));
    CHECK_EQ_INT(shut ? ST_QUEUED : ST_CANCELLED, j->state);
    CHECK(strstr(j->reason, shut ? "the daemon shut down after step 3" : "stopped by the user after step 3") != NULL);
    coord_free(&c);
  }
}

/* Random interleavings: JOBS jobs of C, events picked by a seeded generator as the coordinator
 * could deliver them, then the end every job reaches (a cancel, then reaped). */
static uint64_t rng_state;
static uint32_t rnd(uint32_t n) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 33) % n;
}

/* Node 0's node_step_report of STEP for J (both ranks), as its relay folds them, through the wire. */
static void node_report(coord_t *c, job_t *j, uint32_t step) {
  stepagg *agg = NULL;
  CHECK_OK(stepagg_new(&agg));
  Fsdp__RankStats st[WORLD];
  for (int r = 0; r < WORLD; r++) {
    fsdp__rank_stats__init(&st[r]);
    st[r].rank = (uint32_t)r;
    CHECK_OK(stepagg_add_rank(agg, &st[r], 10.0 + r, 0));
  }
  Fsdp__StepAgg am;
  CHECK_OK(stepagg_to_msg(agg, 0, &am));
  Fsdp__StepReport first = FSDP__STEP_REPORT__INIT;
  first.step = step, first.loss = 4.0 / step, first.lr = 1e-3, first.tokens = 64, first.step_ms = 10;
  first.stats = &st[0];
  Fsdp__NodeStepReport nr = FSDP__NODE_STEP_REPORT__INIT;
  nr.job_id = j->id, nr.first_rank = 0, nr.first = &first, nr.agg = &am, nr.step_ms = 11, nr.step_ms_rank = 1;
  Fsdp__Msg m = WIRE_MSG_INIT, *out = NULL;
  m.body_case = FSDP__MSG__BODY_NODE_STEP_REPORT, m.node_step_report = &nr;
  uint8_t *buf = NULL;
  size_t len = 0;
  CHECK_OK(wire_pack(&m, &buf, &len));
  CHECK_OK(wire_unpack(buf, len, &out));
  free(buf);
  stepagg_msg_free(&am);
  stepagg_destroy(&agg);
  steps_on_node_report(c, &c->nodes[0], &out);
  wire_destroy(&out);
}

/* Every line of job ID's metrics.jsonl is its database row of that step, word for word, one per
 * step; the database holds no step the file lacks but those a restart trains again (the file keeps
 * the resumed-from steps only, steps.c: metrics_truncate; the rows are replaced as they come). */
static int lines_checked, restarted_checked;   /* over every sequence: the check compared something */
static void check_steps_agree(coord_t *c, uint64_t id, int restarted) {
  char path[256];
  snprintf(path, sizeof path, "%s/%llu/metrics.jsonl", tmp_dir, (unsigned long long)id);
  FILE *f = fopen(path, "r");
  int lines = 0, rows = 0, last = 0;
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  while (f && (n = getline(&line, &cap, f)) > 0) {
    if (line[n - 1] == '\n') line[--n] = 0;
    const char *at = strstr(line, "\"step\":");
    int step = at ? atoi(at + 7) : -1;
    CHECK(step == last + 1);   /* one line per step, in order */
    last = step;
    char *json = NULL;
    CHECK_OK(jobs_db_step_json(c->db, id, step, &json));
    if (json && strcmp(line, json) != 0) {
      fprintf(stderr, "job %llu step %d: metrics.jsonl has\n  %s\nand jobs.db\n  %s\n", (unsigned long long)id, step, line, json);
      CHECK(0);
    }
    free(json);
    lines++;
  }
  free(line);
  if (f) fclose(f);
  CHECK_OK(jobs_db_step_count(c->db, id, &rows));
  CHECK(rows >= lines);
  if (!restarted) CHECK_EQ_INT(lines, rows);   /* no restart: the same steps exactly */
  lines_checked += lines, restarted_checked += restarted && rows > 0;
}

static void one_sequence(uint64_t seed) {
  enum { JOBS = 3, EVENTS = 60 };
  rng_state = seed;
  coord_t *c = coord_make();
  job_t *js[JOBS];
  uint64_t ids[JOBS];
  int cancelled[JOBS] = {0}, ended_state[JOBS] = {0}, restarted[JOBS] = {0};
  for (int k = 0; k < JOBS; k++) js[k] = submit(c, (int)rnd(2)), ids[k] = js[k]->id;
  for (int i = 0; i <= EVENTS; i++) {
    for (int x = 0; x < JOBS; x++) restarted[x] |= js[x] && js[x]->attempt > 0;
    if (i == EVENTS) break;
    int k = (int)rnd(JOBS);
    job_t *j = js[k];
    if (!j) continue;
    job_ev ev = (job_ev)rnd(NEV);
    if (rnd(2)) {   /* half the time the job's own progress, so that sequences reach the steps */
      static const job_ev progress[JOB_PHASES] = {[JOB_QUEUED] = JE_START, [JOB_STARTING] = JE_RANK_READY,
                                                  [JOB_RUNNING] = JE_STEP_RECORDED, [JOB_STOPPING] = JE_RANK_STOPPED,
                                                  [JOB_RESTART_WAIT] = JE_REAPED, [JOB_DRAINING] = JE_REAPED};
      ev = progress[j->phase];
    }
    if (ev == JE_SHUTDOWN || ev == JE_SHUTDOWN_LATE) c->shutting_down = 1;
    if (ev == JE_START) {
      if (j->phase != JOB_QUEUED || c->shutting_down) continue;   /* schedule_try starts queued jobs only */
      start(c, j);
      continue;
    }
    if (ev == JE_RANK_READY) {   /* through the step pipeline: the last ready rank starts the steps */
      if (j->phase != JOB_STARTING) continue;
      Fsdp__WorkerReady rd = FSDP__WORKER_READY__INIT;
      rd.rank = rnd(WORLD);
      steps_on_ready(c, j, (int)rd.rank, &rd);
      continue;
    }
    if (ev == JE_UNFIT && j->phase != JOB_QUEUED) continue;   /* fits_live looks at queued jobs only */
    int was_ended = job_ended(j);
    int state_then = j->state;
    job_ev_args a = ev_args(ev);
    a.rank = (int)rnd(WORLD);
    if (ev == JE_STEP_RECORDED) {   /* node 0 reports the next step: recorded, and after the last, the stop */
      if (j->phase != JOB_RUNNING || j->sv.done_step + 1 >= j->sv.next_step) continue;
      node_report(c, j, j->sv.done_step + 1);
      continue;
    }
    if (ev == JE_WORKER_EXIT && !(j->ranks && j->ranks[a.rank].alive)) continue;
    if ((ev == JE_RANK_STOPPED || ev == JE_WORKER_ERROR) && !j->ranks) continue;
    if (ev == JE_REAPED) {
      if (job_reap_drained(c))
        for (int x = 0; x < JOBS; x++) {
          int found = 0;
          for (job_t *y = c->jobs; y; y = y->next) found |= y == js[x];
          if (!found) js[x] = NULL;
        }
      continue;
    }
    job_event(c, j, ev, &a);
    if (ev == JE_CANCEL) cancelled[k] = 1;
    if (was_ended) CHECK_EQ_INT(state_then, j->state);   /* one end, never a second */
    if (cancelled[k]) CHECK(job_ended(j));                /* nothing runs after a cancel */
    if (job_ended(j) && !ended_state[k]) ended_state[k] = j->state;
  }
  /* every job ends: a cancel where it has not, then its workers gone */
  for (int k = 0; k < JOBS; k++) {
    if (!js[k]) continue;
    job_event(c, js[k], JE_CANCEL, NULL);
    CHECK(job_ended(js[k]));
    if (!ended_state[k]) ended_state[k] = js[k]->state;
    CHECK_EQ_INT(ended_state[k], js[k]->state);
    js[k]->drain_until = 0;
  }
  job_reap_drained(c);
  CHECK(c->jobs == NULL);   /* none lost: every job reached done and was freed, once */
  for (int k = 0; k < JOBS; k++) {   /* jobs.db holds each job's one end, and metrics.jsonl's steps */
    jobs_db_row row;
    CHECK_OK(jobs_db_get(c->db, ids[k], &row));
    CHECK_EQ_INT(ended_state[k], row.state);
    jobs_db_row_clear(&row);
    check_steps_agree(c, ids[k], restarted[k]);
  }
  coord_free(&c);
}

static void part_random(void) {
  for (uint64_t seed = 1; seed <= 300; seed++) {
    int before = check_fail_;
    one_sequence(seed);
    if (check_fail_ != before) fprintf(stderr, "random: seed %llu failed\n", (unsigned long long)seed);
  }
  fprintf(stderr, "random: %d metrics lines checked against jobs.db, %d restarted jobs with steps\n", lines_checked,
          restarted_checked);
  CHECK(lines_checked > 100 && restarted_checked > 0);
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  tmpdir_make("test_job");
  log_set_level(LOG_ERROR);
  zctx = zmq_ctx_new();
  part_table();
  part_life();
  part_restart();
  part_stop();
  part_random();
  zmq_ctx_term(zctx);
  tmpdir_remove();
  return check_done();
}
