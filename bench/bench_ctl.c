/* bench_ctl — how many steps per second the coordinator can drive: fsdpd's control overhead.
 *
 *   build/bench/bench_ctl [--world N] [--steps S] [--metrics HOST:PORT]
 *
 * Starts a private embedded fsdpd whose "worker" is this very binary (--worker): in worker mode
 * (argv has --connect, as the agent spawns it) it speaks the worker protocol but computes nothing,
 * answering every step_cmd at once with a full step_report. So the job's steps/s measures only
 * the coordinator's round trip per step: receiving N reports, the metrics line, the SQLite row,
 * and the next step_cmd to N ranks, with two steps in flight. Prints steps/s and µs per step.
 * --metrics passes through to fsdpd: the same figure then includes rendering the Prometheus text
 * after every step (docs/performance.md compares the two).
 */
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "conditions.h"
#include "wire.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int send_body(void *s, Fsdp__Msg *m) {
  wire_env env = {0};
  wire_env_push(&env, NULL, 0);
  return wire_send(s, &env, m, 0) == FSDP_OK ? 0 : -1;
}

/* ---- worker mode: the protocol without the compute ---- */
static int fake_worker(int argc, char **argv) {
  const char *ep = NULL, *token = "";
  uint64_t job = 0;
  uint32_t rank = 0;
  for (int i = 1; i + 1 < argc; i++) {
    if (!strcmp(argv[i], "--connect")) ep = argv[i + 1];
    else if (!strcmp(argv[i], "--job")) job = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--rank")) rank = (uint32_t)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--token")) token = argv[i + 1];
  }
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
  wire_socket_setup(s);
  int to = 60000;
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
  zmq_connect(s, ep);
  Fsdp__Msg m = WIRE_MSG_INIT;
  Fsdp__WorkerHello h = FSDP__WORKER_HELLO__INIT;
  h.job_id = job, h.rank = rank, h.pid = (uint32_t)getpid(), h.token = (char *)token;
  m.body_case = FSDP__MSG__BODY_WORKER_HELLO, m.worker_hello = &h;
  send_body(s, &m);
  uint64_t peak[7] = {1, 2, 3, 4, 5, 6, 7}, phase[4] = {10, 20, 30, 40}, sent[3] = {100, 200, 8};
  int rc = 1;
  for (;;) {
    Fsdp__Msg *in = NULL;
    if (wire_recv(s, NULL, &in, 0) != FSDP_OK) break;
    Fsdp__Msg out = WIRE_MSG_INIT;
    if (in->body_case == FSDP__MSG__BODY_WORKER_SETUP) {
      Fsdp__WorkerReady r = FSDP__WORKER_READY__INIT;
      r.rank = rank;
      out.body_case = FSDP__MSG__BODY_WORKER_READY, out.worker_ready = &r;
      send_body(s, &out);
    } else if (in->body_case == FSDP__MSG__BODY_STEP_CMD) {
      Fsdp__RankStats st = FSDP__RANK_STATS__INIT;
      st.rank = rank;
      st.n_peak_bytes = st.n_cur_bytes = 7, st.peak_bytes = st.cur_bytes = peak;
      st.n_phase_us = 4, st.phase_us = phase;
      st.n_sent_bytes = 3, st.sent_bytes = sent;
      Fsdp__StepReport r = FSDP__STEP_REPORT__INIT;
      r.step = in->step_cmd->step, r.loss = 1.0, r.lr = 1e-3, r.grad_norm = 0.5, r.tokens = 1024, r.step_ms = 0.01;
      r.stats = &st;
      out.body_case = FSDP__MSG__BODY_STEP_REPORT, out.step_report = &r;
      send_body(s, &out);
    } else if (in->body_case == FSDP__MSG__BODY_STOP_CMD) {
      Fsdp__Ack a = FSDP__ACK__INIT;
      out.body_case = FSDP__MSG__BODY_ACK, out.ack = &a;
      send_body(s, &out);
      rc = 0;
      wire_destroy(&in);
      break;
    }
    wire_destroy(&in);
  }
  zmq_close(s);
  zmq_ctx_term(ctx);
  return rc;
}

static Fsdp__Msg *call(void *s, Fsdp__Msg *req) {
  Fsdp__Msg *m = NULL;
  if (send_body(s, req) != 0 || wire_recv(s, NULL, &m, 0) != FSDP_OK) return NULL;
  return m;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--connect")) return fake_worker(argc, argv);
  bench_conditions_begin();
  int world = 4, steps = 2000;
  const char *metrics = NULL;
  for (int i = 1; i + 1 < argc; i++) {
    if (!strcmp(argv[i], "--world")) world = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--metrics")) metrics = argv[i + 1];
  }
  char self[PATH_MAX - 64], fsdpd[PATH_MAX], state[] = "/tmp/bench-ctl-XXXXXX", nw[16], log[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0 || !mkdtemp(state)) return 1;
  self[n] = '\0';
  snprintf(fsdpd, sizeof fsdpd, "%.*s/../fsdpd", (int)(strrchr(self, '/') - self), self);
  snprintf(nw, sizeof nw, "%d", world);
  snprintf(log, sizeof log, "%s/fsdpd.log", state);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 2);
    if (metrics)
      execl(fsdpd, "fsdpd", "--foreground", "--state-dir", state, "--cpu-workers", nw, "--gpus", "none", "--worker",
            self, "--log-level", "warn", "--metrics", metrics, (char *)NULL);
    else
      execl(fsdpd, "fsdpd", "--foreground", "--state-dir", state, "--cpu-workers", nw, "--gpus", "none", "--worker",
            self, "--log-level", "warn", (char *)NULL);
    _exit(127);
  }
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
  wire_socket_setup(s);
  int to = 30000;
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
  char ep[PATH_MAX];
  snprintf(ep, sizeof ep, "ipc://%s/ctl.sock", state);
  zmq_connect(s, ep);
  char spec[1024];
  snprintf(spec, sizeof spec,
           "[job]\nname = bench\nsteps = %d\n[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = 64\nseq_len = 16\n"
           "[data]\ntrain = synthetic:markov:1\nbatch_size = 2\n[fsdp]\nworld_size = %d\ndevice = cpu\n", steps, world);
  Fsdp__SubmitReq sr = FSDP__SUBMIT_REQ__INIT;
  sr.spec_text = spec, sr.spec_path = "bench.ini", sr.base_dir = state;
  Fsdp__Msg req = WIRE_MSG_INIT;
  req.body_case = FSDP__MSG__BODY_SUBMIT_REQ, req.submit_req = &sr;
  Fsdp__Msg *r = call(s, &req);
  int rc = 1;
  if (!r || r->body_case != FSDP__MSG__BODY_SUBMIT_RESP) {
    fprintf(stderr, "bench_ctl: submit failed: %s\n", r && r->body_case == FSDP__MSG__BODY_ERROR ? r->error->message : "no answer");
    goto out;
  }
  uint64_t id = r->submit_resp->job_id;
  wire_destroy(&r);
  double deadline = now_s() + 300;
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  req.body_case = FSDP__MSG__BODY_STATUS_REQ, req.status_req = &q;
  while (now_s() < deadline) {
    r = call(s, &req);
    if (r && r->body_case == FSDP__MSG__BODY_STATUS_RESP && r->status_resp->state >= FSDP__JOB_STATE__SUCCEEDED) {
      Fsdp__JobInfo *ji = r->status_resp;
      double secs = ji->finished_at - ji->started_at;
      if (ji->state == FSDP__JOB_STATE__SUCCEEDED && secs > 0) {
        printf("bench_ctl: world %d, %u steps in %.3f s: %.0f steps/s, %.1f us per step (%.2f us per rank-report)\n",
               world, ji->step, secs, ji->step / secs, 1e6 * secs / ji->step, 1e6 * secs / ji->step / world);
        rc = 0;
      } else {
        fprintf(stderr, "bench_ctl: job ended %d: %s\n", ji->state, ji->reason);
      }
      break;
    }
    wire_destroy(&r);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  wire_destroy(&r);
out:
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  zmq_close(s);
  zmq_ctx_term(ctx);
  char cmd[PATH_MAX];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
  if (rc == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", state);
  if (rc != 0) fprintf(stderr, "state kept in %s\n", state);
  bench_conditions_end();
  return rc;
}
