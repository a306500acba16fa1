/* test_coordinator_ctl — fsdpd's control endpoint and job lifecycle, end to end, without fsdpctl
 * and without the real worker: the test forks fsdpd (embedded coordinator + agent), talks wire to
 * it over ipc, and gives it a fake worker script (--worker) whose behaviour it picks (exit 3,
 * kill itself with SIGKILL, or sleep), so that every failure path, queueing, cancellation,
 * restart and garbage input is exercised on any machine in a few seconds.
 *
 * Daemon 5 also gets two fake GPU agents: the test itself registers them on the cluster endpoint
 * with GPUs and the host memory they report, beats for them, records the spawn_reqs they get and
 * answers kill_reqs with worker exits. It checks that the reported host memory reaches `nodes`, and,
 * in a build with the CUDA backend (a CPU-only build refuses device = cuda jobs before any
 * placement), that offload = optimizer jobs are refused, placed and held by the nodes' host memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"
#include "jobspec.h"
#include "plan.h"
#include "schedule.h"
#include "wire.h"

static char fsdpd_path[PATH_MAX];
static char state[PATH_MAX - 256];
static void *zctx;
static const char *heartbeat = "0.2";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *tiny_spec(int world, const char *extra_model) {
  static char buf[2048];
  snprintf(buf, sizeof buf,
           "[job]\nname = t\nsteps = 3\n[model]\nn_layer = %s\nn_head = 2\nn_embd = %s\nvocab_size = %s\nseq_len = 16\n"
           "[data]\ntrain = synthetic:markov:1\nbatch_size = 2\n[fsdp]\nworld_size = %d\ndevice = cpu\n",
           extra_model ? "200" : "1", extra_model ? "16384" : "32", extra_model ? "50257" : "64", world);
  return buf;
}

static pid_t start_daemon(const char *mode, int tag) {
  char log[PATH_MAX], worker[PATH_MAX], pids[PATH_MAX];
  snprintf(log, sizeof log, "%s/daemon-%d.log", state, tag);
  snprintf(worker, sizeof worker, "%s/fake-worker.sh", state);
  snprintf(pids, sizeof pids, "%s/fake.pids", state);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 2);
    /* the fake worker reads its mode from a file: workers get only a short list of the daemon's
     * environment (daemon/agent.c worker_env_passes) */
    char mode_file[PATH_MAX + 16];
    snprintf(mode_file, sizeof mode_file, "%s/fake.mode", state);
    FILE *mf = fopen(mode_file, "w");
    if (!mf || fprintf(mf, "%s\n", mode) < 0 || fclose(mf) != 0) _exit(126);
    setenv("FAKE_MODE", mode, 1);   /* not passed on: the workers must not see it */
    setenv("CUDA_VISIBLE_DEVICES", "3", 1);   /* the agent passes it on: GPU indices count within it */
    unsetenv("OMP_NUM_THREADS");
    execl(fsdpd_path, "fsdpd", "--foreground", "--state-dir", state, "--cpu-workers", "2", "--gpus", "none",
          "--worker", worker, "--heartbeat", heartbeat, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Wait for PID to exit within TIMEOUT seconds; returns its wait status or -1. */
static int wait_exit(pid_t pid, double timeout) {
  double end = now_s() + timeout;
  int st;
  while (now_s() < end) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);   /* polling a condition with a deadline, not synchronizing by sleep */
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

static void *ctl_connect(void) {
  void *s = zmq_socket(zctx, ZMQ_DEALER);
  wire_socket_setup(s);
  int to = 10000;
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
  char ep[PATH_MAX + 16];
  snprintf(ep, sizeof ep, "ipc://%s/ctl.sock", state);
  zmq_connect(s, ep);
  return s;
}

/* One request, one reply. */
static Fsdp__Msg *call(void *s, Fsdp__Msg *req) {
  wire_env env = {0};
  wire_env_push(&env, NULL, 0);
  if (wire_send(s, &env, req, 0) != FSDP_OK) return NULL;
  Fsdp__Msg *m = NULL;
  if (wire_recv(s, &env, &m, 0) != FSDP_OK) return NULL;
  return m;
}

static Fsdp__Msg *submit(void *s, const char *text) {
  Fsdp__SubmitReq r = FSDP__SUBMIT_REQ__INIT;
  r.spec_text = (char *)text;
  r.spec_path = "test.ini";
  r.base_dir = state;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_SUBMIT_REQ;
  m.submit_req = &r;
  return call(s, &m);
}

static uint64_t submit_ok(void *s, const char *text) {
  Fsdp__Msg *m = submit(s, text);
  uint64_t id = 0;
  CHECK(m && m->body_case == FSDP__MSG__BODY_SUBMIT_RESP);
  if (m && m->body_case == FSDP__MSG__BODY_SUBMIT_RESP) id = m->submit_resp->job_id;
  else if (m && m->body_case == FSDP__MSG__BODY_ERROR) fprintf(stderr, "submit: %s\n", m->error->message);
  wire_destroy(&m);
  return id;
}

static Fsdp__Msg *job_query(void *s, Fsdp__Msg__BodyCase which, uint64_t id) {
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = which;
  if (which == FSDP__MSG__BODY_STATUS_REQ) m.status_req = &q;
  else m.cancel_req = &q;
  return call(s, &m);
}

/* Poll job ID's status until its state is STATE (or terminal), within TIMEOUT seconds. */
static int wait_state(void *s, uint64_t id, int state_want, double timeout, char *reason, size_t rlen) {
  double end = now_s() + timeout;
  int st = -1;
  while (now_s() < end) {
    Fsdp__Msg *m = job_query(s, FSDP__MSG__BODY_STATUS_REQ, id);
    if (m && m->body_case == FSDP__MSG__BODY_STATUS_RESP) {
      st = m->status_resp->state;
      if (reason) snprintf(reason, rlen, "%s", m->status_resp->reason);
    }
    wire_destroy(&m);
    if (st == state_want || (st >= 4 && state_want < 4)) return st;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return st;
}

static void shutdown_daemon(void *s, pid_t pid) {
  Fsdp__ShutdownReq q = FSDP__SHUTDOWN_REQ__INIT;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_SHUTDOWN_REQ;
  m.shutdown_req = &q;
  Fsdp__Msg *r = call(s, &m);
  CHECK(r && r->body_case == FSDP__MSG__BODY_ACK);
  wire_destroy(&r);
  int st = wait_exit(pid, 15);
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void kill_fake_workers(void) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/fake.pids", state);
  FILE *f = fopen(path, "r");
  if (!f) return;
  int pid;
  while (fscanf(f, "%d", &pid) == 1)
    if (pid > 1) kill(pid, SIGKILL);
  fclose(f);
  unlink(path);
}

/* Wait until the fake workers wrote N pids (they were spawned and run), within TIMEOUT seconds. */
static int wait_fake_workers(int n, double timeout) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/fake.pids", state);
  double end = now_s() + timeout;
  int count = 0;
  while (now_s() < end) {
    count = 0;
    FILE *f = fopen(path, "r");
    int pid;
    if (f) {
      while (fscanf(f, "%d", &pid) == 1) count++;
      fclose(f);
    }
    if (count >= n) break;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return count;
}

static int file_contains(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char buf[65536];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return strstr(buf, needle) != NULL;
}

/* Lines of PATH that contain NEEDLE. */
static int count_lines(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
  fclose(f);
  return n;
}

/* The nodes (the embedded agent with its two CPU slots, each with MemAvailable/2 bytes), and
 * unknown job ids. */
static void test_nodes_and_unknown(void *s) {
  Fsdp__NodesReq nq = FSDP__NODES_REQ__INIT;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_NODES_REQ;
  m.nodes_req = &nq;
  Fsdp__Msg *r = call(s, &m);
  CHECK(r && r->body_case == FSDP__MSG__BODY_NODES_RESP);
  if (r && r->body_case == FSDP__MSG__BODY_NODES_RESP) {
    CHECK_EQ_INT(1, r->nodes_resp->n_nodes);
    if (r->nodes_resp->n_nodes == 1) {
      CHECK_EQ_INT(2, r->nodes_resp->nodes[0]->n_slots);
      CHECK(!r->nodes_resp->nodes[0]->lost);
      for (size_t i = 0; i < r->nodes_resp->nodes[0]->n_slots; i++) {
        CHECK_EQ_INT(FSDP__DEVICE_KIND__DEVICE_KIND_CPU, r->nodes_resp->nodes[0]->slots[i]->kind);
        CHECK(r->nodes_resp->nodes[0]->slots[i]->mem_bytes > 0);
      }
    }
  }
  wire_destroy(&r);

  /* unknown job ids */
  r = job_query(s, FSDP__MSG__BODY_STATUS_REQ, 42);
  CHECK(r && r->body_case == FSDP__MSG__BODY_ERROR);
  if (r && r->body_case == FSDP__MSG__BODY_ERROR) {
    CHECK_EQ_INT(FSDP_ERR_NOTFOUND, r->error->code);
    CHECK(strstr(r->error->message, "no job 42") != NULL);
  }
  wire_destroy(&r);
  r = job_query(s, FSDP__MSG__BODY_CANCEL_REQ, 42);
  CHECK(r && r->body_case == FSDP__MSG__BODY_ERROR && r->error->code == FSDP_ERR_NOTFOUND);
  wire_destroy(&r);
}

static const char junk[] = "\xff\xfe this is not a protobuf message \x01\x02";

/* Garbage on the control endpoint, with and without a delimiter, raw bytes on its Unix socket, and a
 * cluster message there: each answered or dropped, nothing crashes. */
static void test_ctl_garbage(void *s) {
  Fsdp__Msg m = WIRE_MSG_INIT, *r = NULL;
  /* garbage after the delimiter: an error reply naming the problem */
  zmq_send(s, "", 0, ZMQ_SNDMORE);
  zmq_send(s, junk, sizeof junk, 0);
  Fsdp__Msg *g = NULL;
  wire_env env;
  CHECK_OK(wire_recv(s, &env, &g, 0));
  CHECK(g && g->body_case == FSDP__MSG__BODY_ERROR);
  if (g && g->body_case == FSDP__MSG__BODY_ERROR) CHECK(strstr(g->error->message, "malformed") != NULL);
  wire_destroy(&g);

  /* garbage without a delimiter, from another client */
  void *s2 = ctl_connect();
  zmq_send(s2, junk, 5, 0);
  char buf[4096];
  int n = zmq_recv(s2, buf, sizeof buf, 0);
  CHECK(n > 0);
  zmq_close(s2);

  /* raw bytes on the Unix socket itself (not even ZMTP) */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (snprintf(sa.sun_path, sizeof sa.sun_path, "%s/ctl.sock", state) >= (int)sizeof sa.sun_path) CHECK(0);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
    char raw[1024];
    for (size_t i = 0; i < sizeof raw; i++) raw[i] = (char)(i * 131 + 7);
    CHECK(write(fd, raw, sizeof raw) > 0);
  }
  close(fd);

  /* a cluster message on the control endpoint */
  Fsdp__Heartbeat hb = FSDP__HEARTBEAT__INIT;
  m.body_case = FSDP__MSG__BODY_HEARTBEAT;
  m.heartbeat = &hb;
  r = call(s, &m);
  CHECK(r && r->body_case == FSDP__MSG__BODY_ERROR && r->error->code == FSDP_ERR_INVALID);
  wire_destroy(&r);
}

/* The cluster endpoint: garbage, a hello with a wrong token, a kv_get from a stranger. */
static void test_cluster_garbage(void) {
  Fsdp__Msg m = WIRE_MSG_INIT, *r = NULL;
  wire_env env;
  void *cl = zmq_socket(zctx, ZMQ_DEALER);
  wire_socket_setup(cl);
  int to = 10000;
  zmq_setsockopt(cl, ZMQ_RCVTIMEO, &to, sizeof to);
  char cep[PATH_MAX + 16];
  snprintf(cep, sizeof cep, "ipc://%s/cluster.sock", state);
  zmq_connect(cl, cep);
  zmq_send(cl, "", 0, ZMQ_SNDMORE);
  zmq_send(cl, junk, sizeof junk, 0);
  Fsdp__WorkerHello wh = FSDP__WORKER_HELLO__INIT;
  wh.job_id = 1, wh.rank = 0, wh.token = "wrong";
  m.body_case = FSDP__MSG__BODY_WORKER_HELLO;
  m.worker_hello = &wh;
  wire_env de = {0};
  wire_env_push(&de, NULL, 0);
  CHECK_OK(wire_send(cl, &de, &m, 0));
  Fsdp__KvGet kg = FSDP__KV_GET__INIT;
  kg.key = "nccl_id";
  m.body_case = FSDP__MSG__BODY_KV_GET;
  m.kv_get = &kg;
  CHECK_OK(wire_send(cl, &de, &m, 0));
  r = NULL;
  CHECK_OK(wire_recv(cl, &env, &r, 0));   /* only the kv_get is answered: garbage and bad hellos are dropped */
  CHECK(r && r->body_case == FSDP__MSG__BODY_ERROR && r->error->code == FSDP_ERR_NOTFOUND);
  wire_destroy(&r);
  zmq_close(cl);
}

/* A flood of garbage is answered, but logged at most once per 10 s with a count, not per message;
 * the daemon still serves. */
static void test_flood(void *s) {
  Fsdp__Msg m = WIRE_MSG_INIT, *r = NULL;
  wire_env env;
  void *s3 = ctl_connect();
  for (int i = 0; i < 2000; i++) {
    zmq_send(s3, "", 0, ZMQ_SNDMORE);
    zmq_send(s3, junk, sizeof junk, 0);
  }
  Fsdp__ListReq flq = FSDP__LIST_REQ__INIT;
  m.body_case = FSDP__MSG__BODY_LIST_REQ;
  m.list_req = &flq;
  wire_env fe = {0};
  wire_env_push(&fe, NULL, 0);
  CHECK_OK(wire_send(s3, &fe, &m, 0));
  int replies = 0, listed = 0;
  while (!listed) {   /* one peer's requests are served in order: the list reply comes last */
    Fsdp__Msg *x = NULL;
    if (wire_recv(s3, &env, &x, 0) != FSDP_OK) break;
    listed = x->body_case == FSDP__MSG__BODY_LIST_RESP;
    replies++;
    wire_destroy(&x);
  }
  CHECK_EQ_INT(2001, replies);
  zmq_close(s3);
  char dlog[PATH_MAX];
  snprintf(dlog, sizeof dlog, "%s/daemon-1.log", state);
  int lines = count_lines(dlog, "malformed");
  if (lines > 5) fprintf(stderr, "%d log lines about malformed messages after a flood of 2000\n", lines);
  CHECK(lines >= 1 && lines <= 5);

  /* still serving */
  Fsdp__ListReq lq = FSDP__LIST_REQ__INIT;
  m.body_case = FSDP__MSG__BODY_LIST_REQ;
  m.list_req = &lq;
  r = call(s, &m);
  CHECK(r && r->body_case == FSDP__MSG__BODY_LIST_RESP);
  wire_destroy(&r);
}

/* Bad job files: a syntax error naming its line, more ranks than the cluster, a model that does not fit. */
static void test_bad_specs(void *s) {
  Fsdp__Msg *r = NULL;
  r = submit(s, "[job\nsteps = x\n");
  CHECK(r && r->body_case == FSDP__MSG__BODY_ERROR && r->error->code != FSDP_OK);
  if (r && r->body_case == FSDP__MSG__BODY_ERROR) CHECK(strstr(r->error->message, "test.ini:1") != NULL);   /* names the line */
  wire_destroy(&r);
  r = submit(s, tiny_spec(4, NULL));
  CHECK(r && r->body_case == FSDP__MSG__BODY_ERROR);
  if (r && r->body_case == FSDP__MSG__BODY_ERROR) CHECK(strstr(r->error->message, "cluster has 2") != NULL);
  wire_destroy(&r);
  r = submit(s, tiny_spec(2, "huge"));
  CHECK(r && r->body_case == FSDP__MSG__BODY_ERROR);
  if (r && r->body_case == FSDP__MSG__BODY_ERROR) {
    CHECK(strstr(r->error->message, "per rank") != NULL);
    CHECK(strstr(r->error->message, "fits") != NULL);
  }
  wire_destroy(&r);
}

static void test_basic_and_garbage(void *s) {
  test_nodes_and_unknown(s);
  test_ctl_garbage(s);
  test_cluster_garbage();
  test_flood(s);
  test_bad_specs(s);
}

/* ---------------------------------------------------------------- fake GPU agents (daemon 5) */

#define FAKE_MAX_SPAWN 64

typedef struct fake_agent {
  void *sock;
  const char *name;
  int ngpu;
  uint64_t host_mem;
  uint32_t node_id;          /* 0 until welcomed */
  int nspawn;
  uint64_t spawn_job[FAKE_MAX_SPAWN];
  uint32_t spawn_rank[FAKE_MAX_SPAWN];
  int spawn_alive[FAKE_MAX_SPAWN];
  double beat_at;
} fake_agent;

static void fake_send(fake_agent *a, Fsdp__Msg *m) {
  wire_env env = {0};
  wire_env_push(&env, NULL, 0);
  CHECK_OK(wire_send(a->sock, &env, m, 0));
}

static void fake_register(fake_agent *a) {
  a->sock = zmq_socket(zctx, ZMQ_DEALER);
  wire_socket_setup(a->sock);
  char ep[PATH_MAX + 16];
  snprintf(ep, sizeof ep, "ipc://%s/cluster.sock", state);
  zmq_connect(a->sock, ep);
  Fsdp__DeviceSlot slots[8], *ptrs[8];
  for (int i = 0; i < a->ngpu; i++) {
    fsdp__device_slot__init(&slots[i]);
    slots[i].kind = FSDP__DEVICE_KIND__DEVICE_KIND_CUDA;
    slots[i].index = (uint32_t)i;
    slots[i].name = "Fake H100";
    slots[i].mem_bytes = 80ull << 30;
    ptrs[i] = &slots[i];
  }
  Fsdp__AgentRegister reg = FSDP__AGENT_REGISTER__INIT;
  reg.name = (char *)a->name;
  reg.n_gpus = (size_t)a->ngpu;
  reg.gpus = ptrs;
  reg.pid = (uint32_t)getpid();
  reg.host_mem_bytes = a->host_mem;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_AGENT_REGISTER;
  m.agent_register = &reg;
  fake_send(a, &m);
}

/* Beat, take the messages waiting: record spawns, answer kills with the ranks' exits. */
static void fake_pump(fake_agent *a) {
  for (;;) {
    wire_env env = {0};
    Fsdp__Msg *m = NULL;
    if (wire_recv(a->sock, &env, &m, ZMQ_DONTWAIT) != FSDP_OK) break;
    if (m->body_case == FSDP__MSG__BODY_AGENT_WELCOME) {
      a->node_id = m->agent_welcome->node_id;
    } else if (m->body_case == FSDP__MSG__BODY_SPAWN_REQ && a->nspawn < FAKE_MAX_SPAWN) {
      a->spawn_job[a->nspawn] = m->spawn_req->job_id;
      a->spawn_rank[a->nspawn] = m->spawn_req->rank;
      a->spawn_alive[a->nspawn++] = 1;
    } else if (m->body_case == FSDP__MSG__BODY_KILL_REQ) {
      for (int k = 0; k < a->nspawn; k++) {
        if (!a->spawn_alive[k] || a->spawn_job[k] != m->kill_req->job_id) continue;
        a->spawn_alive[k] = 0;
        Fsdp__WorkerExit ex = FSDP__WORKER_EXIT__INIT;
        ex.job_id = a->spawn_job[k];
        ex.rank = a->spawn_rank[k];
        ex.exit_status = -1;
        ex.term_signal = m->kill_req->signal ? m->kill_req->signal : SIGTERM;
        ex.node_id = a->node_id;
        Fsdp__Msg e = WIRE_MSG_INIT;
        e.body_case = FSDP__MSG__BODY_WORKER_EXIT;
        e.worker_exit = &ex;
        fake_send(a, &e);
      }
    }
    wire_destroy(&m);
  }
  if (a->node_id && now_s() >= a->beat_at) {
    Fsdp__Heartbeat hb = FSDP__HEARTBEAT__INIT;
    hb.node_id = a->node_id;
    Fsdp__Msg m = WIRE_MSG_INIT;
    m.body_case = FSDP__MSG__BODY_HEARTBEAT;
    m.heartbeat = &hb;
    fake_send(a, &m);
    a->beat_at = now_s() + 0.2;
  }
}

static int fake_spawns(const fake_agent *a, uint64_t job) {
  int n = 0;
  for (int k = 0; k < a->nspawn; k++) n += a->spawn_job[k] == job;
  return n;
}

/* Pump both fakes until A has WANT_A and B WANT_B spawns of JOB (JOB 0: until both are welcomed), at
 * most SECONDS; 1 when that happened. */
static int fake_pump_until(fake_agent *a, fake_agent *b, uint64_t job, int want_a, int want_b, double seconds) {
  double end = now_s() + seconds;
  for (;;) {
    fake_pump(a);
    fake_pump(b);
    if (job && fake_spawns(a, job) >= want_a && fake_spawns(b, job) >= want_b) return 1;
    if (!job && a->node_id && b->node_id) return 1;
    if (now_s() >= end) return 0;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);   /* polling sockets with a deadline */
  }
}

/* An offload = optimizer GPT-2 job on device = cuda of WORLD ranks, N_LAYER blocks of GPT-2 XL's width. */
static const char *offload_spec(int world, int n_layer) {
  static char buf[1024];
  snprintf(buf, sizeof buf,
           "[job]\nname = off\nsteps = 3\n[model]\nn_layer = %d\nn_head = 25\nn_embd = 1600\nvocab_size = 50257\n"
           "seq_len = 1024\n[data]\ntrain = synthetic:markov:1\nbatch_size = 1\n[fsdp]\nworld_size = %d\ndevice = cuda\n"
           "offload = optimizer\n", n_layer, world);
  return buf;
}

static uint64_t offload_host_bytes(int world, int n_layer) {
  jobspec_t spec;
  plan_t *p = NULL;
  uint64_t hb = 0;
  CHECK_OK(jobspec_parse(offload_spec(world, n_layer), "offload.ini", state, &spec));
  if (plan_build(&spec, world, &p) == FSDP_OK) hb = p->host_bytes;
  plan_destroy(&p);
  return hb;
}

static void test_offload_host_memory(void *s, fake_agent *a, fake_agent *b) {
  /* gpu-a (4 GPUs) holds 3 ranks of a 4-rank job, gpu-b (2 GPUs) one */
  uint64_t hb = offload_host_bytes(4, 48);
  CHECK(hb > 0);
  a->host_mem = 4 * hb;   /* usable 3.6 hb */
  b->host_mem = 2 * hb;   /* usable 1.8 hb */
  fake_register(a);
  fake_register(b);
  CHECK(fake_pump_until(a, b, 0, 0, 0, 5));
  CHECK(a->node_id && b->node_id);

  /* nodes: the reported host memory is kept; the embedded agent measured its own */
  Fsdp__NodesReq nq = FSDP__NODES_REQ__INIT;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_NODES_REQ;
  m.nodes_req = &nq;
  Fsdp__Msg *r = call(s, &m);
  CHECK(r && r->body_case == FSDP__MSG__BODY_NODES_RESP);
  int seen = 0;
  for (size_t i = 0; r && r->body_case == FSDP__MSG__BODY_NODES_RESP && i < r->nodes_resp->n_nodes; i++) {
    const Fsdp__NodeInfo *ni = r->nodes_resp->nodes[i];
    seen++;
    if (!strcmp(ni->name, "gpu-a")) CHECK(ni->host_mem_bytes == a->host_mem && ni->n_slots == 4);
    else if (!strcmp(ni->name, "gpu-b")) CHECK(ni->host_mem_bytes == b->host_mem && ni->n_slots == 2);
    else CHECK(ni->host_mem_bytes > 0);   /* the embedded agent: its MemAvailable */
  }
  CHECK_EQ_INT(3, seen);
  wire_destroy(&r);

  if (!jobspec_build_has_cuda()) {
    printf("offload placement through the daemon: skipped, this build has no CUDA backend and refuses device = cuda "
           "jobs at submit (tests/unit/test_schedule.c covers the fit and room functions); registration and nodes "
           "checked\n");
    return;
  }
  /* twice the blocks: about twice the bytes per rank; gpu-a holds 1, gpu-b none: refused at submit */
  r = submit(s, offload_spec(4, 96));
  CHECK(r && r->body_case == FSDP__MSG__BODY_ERROR);
  if (r && r->body_case == FSDP__MSG__BODY_ERROR) {
    printf("refused: %s\n", r->error->message);
    CHECK(strstr(r->error->message, "offload = optimizer needs") && strstr(r->error->message, "per node for 4 ranks"));
    CHECK(strstr(r->error->message, "node gpu-a reports") && strstr(r->error->message, "offload = none"));
  }
  wire_destroy(&r);
  /* 4 ranks fit 3 + 1: placed so, not 4 on gpu-a (which has 4 free GPUs) */
  fake_pump(a), fake_pump(b);
  uint64_t j1 = submit_ok(s, offload_spec(4, 48));
  CHECK(fake_pump_until(a, b, j1, 3, 1, 5));
  CHECK_EQ_INT(3, fake_spawns(a, j1));
  CHECK_EQ_INT(1, fake_spawns(b, j1));
  /* the same job again fits the cluster, but not now: gpu-a's and gpu-b's free GPUs have no memory left */
  fake_pump(a), fake_pump(b);
  uint64_t j2 = submit_ok(s, offload_spec(4, 48));
  fake_pump_until(a, b, j2, 1, 0, 1.0);
  CHECK_EQ_INT(0, fake_spawns(a, j2) + fake_spawns(b, j2));
  CHECK_EQ_INT(FSDP__JOB_STATE__QUEUED, wait_state(s, j2, FSDP__JOB_STATE__QUEUED, 1, NULL, 0));
  /* j1 ends: its ranks exit (the fakes answer the kill), the memory is free, j2 starts */
  r = job_query(s, FSDP__MSG__BODY_CANCEL_REQ, j1);
  CHECK(r && r->body_case == FSDP__MSG__BODY_ACK);
  wire_destroy(&r);
  CHECK(fake_pump_until(a, b, j2, 3, 1, 10));
  CHECK_EQ_INT(3, fake_spawns(a, j2));
  CHECK_EQ_INT(1, fake_spawns(b, j2));
  fake_pump(a), fake_pump(b);
  CHECK_EQ_INT(FSDP__JOB_STATE__CANCELLED, wait_state(s, j1, FSDP__JOB_STATE__CANCELLED, 5, NULL, 0));
}

/* The fake worker the daemons start (FAKE_MODE: exit3, kill9, or sleep). */
static void write_fake_worker(void) {
  char script[PATH_MAX];
  snprintf(script, sizeof script, "%s/fake-worker.sh", state);
  FILE *f = fopen(script, "w");
  /* In exit3 mode rank 0 starts talking late, so that rank 1's exit usually fails the job (and
   * rank 0 is killed) before rank 0 wrote anything: the test must read the log of the rank that
   * the reason names, whichever it is. */
  fprintf(f, "#!/bin/sh\nFAKE_PIDS=%s/fake.pids\n[ -z \"$FAKE_MODE\" ] || { echo \"FAKE_MODE leaked\"; exit 5; }\n"
             "FAKE_MODE=$(cat %s/fake.mode)\necho $$ >> \"$FAKE_PIDS\"\n"
             "rank=; prev=; for a in \"$@\"; do [ \"$prev\" = --rank ] && rank=$a; prev=$a; done\n"
             "[ \"$FAKE_MODE\" = exit3 ] && [ \"$rank\" = 0 ] && sleep 1\n"
             "echo \"fake worker $*\"\n"
             "echo \"token=${FSDPD_WORKER_TOKEN:+set}\"\n"
             "echo \"threads=$OMP_NUM_THREADS blas=$OPENBLAS_NUM_THREADS cvd=${CUDA_VISIBLE_DEVICES-unset}\"\n"
             "case \"$FAKE_MODE\" in\n  exit3) exit 3;;\n  kill9) kill -9 $$;;\n  *) exec sleep 60;;\nesac\n",
             state, state);
  fclose(f);
  chmod(script, 0755);
}

/* daemon 1: workers exit with status 3 */
static uint64_t daemon1_exit3(void) {
  char reason[1024];
  pid_t d = start_daemon("exit3", 1);
  void *s = ctl_connect();
  test_basic_and_garbage(s);
  uint64_t j1 = submit_ok(s, tiny_spec(2, NULL));
  CHECK_EQ_INT(FSDP__JOB_STATE__FAILED, wait_state(s, j1, FSDP__JOB_STATE__FAILED, 10, reason, sizeof reason));
  CHECK(strstr(reason, "rank") && strstr(reason, "status 3"));
  /* The rank the reason names exited on its own, after its last line; the other one may have been
   * killed before it wrote anything. */
  int failed_rank = -1;
  CHECK(sscanf(reason, "rank %d exited", &failed_rank) == 1 && failed_rank >= 0 && failed_rank < 2);
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/jobs/%llu/worker-%d.log", state, (unsigned long long)j1, failed_rank);
  double end = now_s() + 5;
  while (!file_contains(path, "threads=") && now_s() < end) {   /* its last line */
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  CHECK(file_contains(path, "fake worker"));
  CHECK(!file_contains(path, "--token"));   /* the token is in the environment, never on the command line */
  CHECK(file_contains(path, "token=set"));
  /* two ranks on this node: max(1, ncpu / 2) threads each; the agent's CUDA_VISIBLE_DEVICES kept, so
   * the device_index it sends counts among the GPUs the worker sees too */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  char want[96];
  snprintf(want, sizeof want, "threads=%ld blas=%ld cvd=3", ncpu / 2 > 1 ? ncpu / 2 : 1, ncpu / 2 > 1 ? ncpu / 2 : 1);
  CHECK(file_contains(path, want));
  shutdown_daemon(s, d);
  zmq_close(s);
  kill_fake_workers();
  return j1;
}

/* daemon 2: the failed job survives a restart; a second job queues behind the first */
static void daemon2_restart(uint64_t j1, uint64_t *j2_out, uint64_t *j3_out) {
  char reason[1024];
  pid_t d = start_daemon("sleep", 2);
  void *s = ctl_connect();
  CHECK_EQ_INT(FSDP__JOB_STATE__FAILED, wait_state(s, j1, FSDP__JOB_STATE__FAILED, 5, reason, sizeof reason));
  CHECK(strstr(reason, "status 3") != NULL);
  uint64_t j2 = submit_ok(s, tiny_spec(2, NULL));
  uint64_t j3 = submit_ok(s, tiny_spec(1, NULL));
  CHECK_EQ_INT(FSDP__JOB_STATE__STARTING, wait_state(s, j2, FSDP__JOB_STATE__STARTING, 5, NULL, 0));
  CHECK_EQ_INT(FSDP__JOB_STATE__QUEUED, wait_state(s, j3, FSDP__JOB_STATE__QUEUED, 1, NULL, 0));
  CHECK_EQ_INT(2, wait_fake_workers(2, 10));   /* both workers of j2 run: the kill below orphans them */
  kill(d, SIGKILL);
  CHECK(wait_exit(d, 5) != -1);
  zmq_close(s);
  kill_fake_workers();
  *j2_out = j2, *j3_out = j3;
}

/* daemon 3: the started job failed ('daemon restarted'), the queued one is queued again and
 * starts; cancel frees the devices for the queue */
static uint64_t daemon3_requeue(uint64_t j2, uint64_t j3) {
  char reason[1024];
  Fsdp__Msg *r = NULL;
  pid_t d = start_daemon("sleep", 3);
  void *s = ctl_connect();
  CHECK_EQ_INT(FSDP__JOB_STATE__FAILED, wait_state(s, j2, FSDP__JOB_STATE__FAILED, 5, reason, sizeof reason));
  CHECK(strstr(reason, "daemon restarted") != NULL);
  CHECK_EQ_INT(FSDP__JOB_STATE__STARTING, wait_state(s, j3, FSDP__JOB_STATE__STARTING, 5, NULL, 0));
  r = job_query(s, FSDP__MSG__BODY_CANCEL_REQ, j3);
  CHECK(r && r->body_case == FSDP__MSG__BODY_ACK);
  wire_destroy(&r);
  CHECK_EQ_INT(FSDP__JOB_STATE__CANCELLED, wait_state(s, j3, FSDP__JOB_STATE__CANCELLED, 5, NULL, 0));
  uint64_t j4 = submit_ok(s, tiny_spec(2, NULL));
  uint64_t j5 = submit_ok(s, tiny_spec(2, NULL));
  CHECK_EQ_INT(FSDP__JOB_STATE__STARTING, wait_state(s, j4, FSDP__JOB_STATE__STARTING, 5, NULL, 0));
  CHECK_EQ_INT(FSDP__JOB_STATE__QUEUED, wait_state(s, j5, FSDP__JOB_STATE__QUEUED, 1, NULL, 0));
  r = job_query(s, FSDP__MSG__BODY_CANCEL_REQ, j4);
  CHECK(r && r->body_case == FSDP__MSG__BODY_ACK);
  wire_destroy(&r);
  CHECK_EQ_INT(FSDP__JOB_STATE__CANCELLED, wait_state(s, j4, FSDP__JOB_STATE__CANCELLED, 5, NULL, 0));
  CHECK_EQ_INT(FSDP__JOB_STATE__STARTING, wait_state(s, j5, FSDP__JOB_STATE__STARTING, 10, NULL, 0));
  r = job_query(s, FSDP__MSG__BODY_CANCEL_REQ, j4);   /* cancelling a finished job is an error */
  CHECK(r && r->body_case == FSDP__MSG__BODY_ERROR && r->error->code == FSDP_ERR_STATE);
  wire_destroy(&r);
  /* SIGTERM: the starting job is queued again (docs/operations.md §1) and the daemon exits 0 */
  kill(d, SIGTERM);
  int st = wait_exit(d, 15);
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  zmq_close(s);
  kill_fake_workers();
  return j5;
}

/* daemon 4: a worker killed by SIGKILL fails its job, naming the rank and the signal */
static void daemon4_kill9(uint64_t j5) {
  char reason[1024];
  pid_t d = start_daemon("kill9", 4);
  void *s = ctl_connect();
  /* j5, queued again by the SIGTERM, starts here, where workers die of SIGKILL */
  CHECK_EQ_INT(FSDP__JOB_STATE__FAILED, wait_state(s, j5, FSDP__JOB_STATE__FAILED, 10, reason, sizeof reason));
  CHECK(strstr(reason, "signal 9 (SIGKILL)") != NULL);
  uint64_t j6 = submit_ok(s, tiny_spec(2, NULL));
  CHECK_EQ_INT(FSDP__JOB_STATE__FAILED, wait_state(s, j6, FSDP__JOB_STATE__FAILED, 10, reason, sizeof reason));
  CHECK(strstr(reason, "signal 9 (SIGKILL)") != NULL && strstr(reason, "rank") != NULL);
  shutdown_daemon(s, d);
  zmq_close(s);
  kill_fake_workers();
}

/* daemon 5: fake GPU agents and offload's host memory; beats every second (lost after 3 s), so
 * that a ctl call between two pumps never loses a fake node */
static void daemon5_fake_gpus(void) {
  Fsdp__Msg *r = NULL;
  heartbeat = "1";
  pid_t d = start_daemon("sleep", 5);
  void *s = ctl_connect();
  fake_agent fa = {.name = "gpu-a", .ngpu = 4}, fb = {.name = "gpu-b", .ngpu = 2};
  test_offload_host_memory(s, &fa, &fb);
  /* shutdown cancels j2; the fakes answer its kills while the daemon waits for them */
  Fsdp__ShutdownReq sq = FSDP__SHUTDOWN_REQ__INIT;
  Fsdp__Msg sm = WIRE_MSG_INIT;
  sm.body_case = FSDP__MSG__BODY_SHUTDOWN_REQ;
  sm.shutdown_req = &sq;
  r = call(s, &sm);
  CHECK(r && r->body_case == FSDP__MSG__BODY_ACK);
  wire_destroy(&r);
  double dl = now_s() + 15;
  int st5 = -1;
  while (now_s() < dl) {
    if (fa.sock) fake_pump(&fa);
    if (fb.sock) fake_pump(&fb);
    if (waitpid(d, &st5, WNOHANG) == d) break;
    st5 = -1;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (st5 == -1) kill(d, SIGKILL), waitpid(d, NULL, 0);
  CHECK(st5 != -1 && WIFEXITED(st5) && WEXITSTATUS(st5) == 0);
  if (fa.sock) zmq_close(fa.sock);
  if (fb.sock) zmq_close(fb.sock);
  zmq_close(s);
  kill_fake_workers();
}

int main(void) {
  char self[PATH_MAX - 32];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  CHECK(n > 0);
  self[n > 0 ? n : 0] = '\0';
  *strrchr(self, '/') = '\0';
  snprintf(fsdpd_path, sizeof fsdpd_path, "%s/../fsdpd", self);
  if (access(fsdpd_path, X_OK) != 0) {
    fprintf(stderr, "fsdpd not built at %s\n", fsdpd_path);
    return 1;
  }
  snprintf(state, sizeof state, "/tmp/fsdpd-test-XXXXXX");
  CHECK(mkdtemp(state) != NULL);
  write_fake_worker();
  zctx = zmq_ctx_new();
  uint64_t j1 = daemon1_exit3(), j2 = 0, j3 = 0;
  daemon2_restart(j1, &j2, &j3);
  uint64_t j5 = daemon3_requeue(j2, j3);
  daemon4_kill9(j5);
  daemon5_fake_gpus();

  zmq_ctx_term(zctx);
  if (check_fail_ == 0 && !getenv("FSDPD_TEST_KEEP")) {
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", state);
  } else {
    fprintf(stderr, "state kept in %s\n", state);
  }
  return check_done();
}
