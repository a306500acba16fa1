/* test_ctl_conn — fsdpctl's request/reply connection against a real ROUTER speaking the ctl
 * protocol in a thread: round trips, error replies, endpoint resolution, bounded failure when no
 * daemon listens (missing or stale socket file), a timed-out request whose late reply must not
 * answer the next one, and a signal interrupting a wait.
 * fsdpctl is an executable, not a library, so its modules are compiled into this test. */
#include <zmq.h>

#include "ctl_conn.h"
#include "wire.h"
#include "ctl_fmt.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static char g_dir[256], g_ep[300];
static pthread_t g_main;

/* The fake daemon: answers nodes_req and status_req; status of job 7 is held back until the next
 * request arrives (then answered, late, to the original sender); job 9 is never answered and the
 * main thread gets SIGUSR1; job 42 does not exist; shutdown_req ends the loop. */
static void *server(void *arg) {
  void *ctx = arg;
  void *r = zmq_socket(ctx, ZMQ_ROUTER);
  wire_socket_setup(r);
  if (zmq_bind(r, g_ep) != 0) {
    fprintf(stderr, "bind %s: %s\n", g_ep, zmq_strerror(zmq_errno()));
    zmq_close(r);
    return NULL;
  }
  wire_env held;
  int holding = 0, kicking = 0, idle_ms = 0;
  for (;;) {
    /* While job 9's caller has not noticed its signal, signal it again every 50 ms: a signal that
     * lands just before the caller blocks is only seen by the flag, not by the wait. */
    zmq_pollitem_t it = {r, 0, ZMQ_POLLIN, 0};
    int n = zmq_poll(&it, 1, 50);
    if (n < 0 && zmq_errno() == ETERM) break;
    if (n <= 0) {
      if (kicking) pthread_kill(g_main, SIGUSR1);
      if ((idle_ms += 50) > 10000) break;   /* the test is gone */
      continue;
    }
    idle_ms = 0;
    wire_env env;
    Fsdp__Msg *m = NULL;
    if (wire_recv(r, &env, &m, ZMQ_DONTWAIT) != FSDP_OK) continue;
    kicking = 0;
    Fsdp__Msg out = WIRE_MSG_INIT;
    int stop = 0;
    if (holding) {   /* answer the held request now, after its client gave up */
      Fsdp__JobInfo ji = FSDP__JOB_INFO__INIT;
      ji.id = 7, ji.name = "late", ji.state = FSDP__JOB_STATE__RUNNING;
      Fsdp__Msg late = WIRE_MSG_INIT;
      late.body_case = FSDP__MSG__BODY_STATUS_RESP, late.status_resp = &ji;
      wire_send(r, &held, &late, 0);
      holding = 0;
    }
    Fsdp__JobInfo ji = FSDP__JOB_INFO__INIT;
    Fsdp__Error er = FSDP__ERROR__INIT;
    Fsdp__NodesResp nr = FSDP__NODES_RESP__INIT;
    Fsdp__Ack ack = FSDP__ACK__INIT;
    switch (m->body_case) {
    case FSDP__MSG__BODY_NODES_REQ: out.body_case = FSDP__MSG__BODY_NODES_RESP, out.nodes_resp = &nr; break;
    case FSDP__MSG__BODY_STATUS_REQ:
      if (m->status_req->job_id == 7) {
        held = env;
        holding = 1;
        wire_destroy(&m);
        continue;
      }
      if (m->status_req->job_id == 9) {
        pthread_kill(g_main, SIGUSR1);
        kicking = 1;
        wire_destroy(&m);
        continue;
      }
      if (m->status_req->job_id == 42) {
        er.code = FSDP_ERR_NOTFOUND, er.message = "no job 42";
        out.body_case = FSDP__MSG__BODY_ERROR, out.error = &er;
        break;
      }
      ji.id = m->status_req->job_id, ji.name = "tiny", ji.state = FSDP__JOB_STATE__RUNNING;
      out.body_case = FSDP__MSG__BODY_STATUS_RESP, out.status_resp = &ji;
      break;
    case FSDP__MSG__BODY_SHUTDOWN_REQ: out.body_case = FSDP__MSG__BODY_ACK, out.ack = &ack, stop = 1; break;
    default: er.code = FSDP_ERR_INVALID, er.message = "unexpected"; out.body_case = FSDP__MSG__BODY_ERROR, out.error = &er;
    }
    wire_send(r, &env, &out, 0);
    wire_destroy(&m);
    (void)stop;   /* keep serving until the test shuts the context down */
  }
  zmq_close(r);
  return NULL;
}

static void on_usr1(int s) { (void)s; }

static fsdp_status status_call(ctl_conn *c, uint64_t id, int timeout_ms, Fsdp__Msg **reply) {
  Fsdp__Msg req = WIRE_MSG_INIT;
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  req.body_case = FSDP__MSG__BODY_STATUS_REQ, req.status_req = &q;
  return ctl_conn_call(c, &req, timeout_ms, reply);
}

static void test_resolve(void) {
  char b[1024];
  unsetenv("FSDP_CTL");
  setenv("XDG_STATE_HOME", "/tmp/xdg", 1);
  CHECK_OK(ctl_endpoint_resolve(NULL, b, sizeof b));
  CHECK(!strcmp(b, "ipc:///tmp/xdg/fsdpd/ctl.sock"));
  setenv("XDG_STATE_HOME", "", 1);
  CHECK_OK(ctl_endpoint_resolve(NULL, b, sizeof b));
  CHECK(!strcmp(b, "ipc:///var/lib/fsdpd/ctl.sock"));
  unsetenv("XDG_STATE_HOME");
  CHECK_OK(ctl_endpoint_resolve(NULL, b, sizeof b));
  CHECK(!strcmp(b, "ipc:///var/lib/fsdpd/ctl.sock"));
  setenv("FSDP_CTL", "tcp://10.0.0.1:7071", 1);
  CHECK_OK(ctl_endpoint_resolve(NULL, b, sizeof b));
  CHECK(!strcmp(b, "tcp://10.0.0.1:7071"));
  CHECK_OK(ctl_endpoint_resolve("ipc:///x/ctl.sock", b, sizeof b));   /* the flag wins */
  CHECK(!strcmp(b, "ipc:///x/ctl.sock"));
  CHECK_EQ_INT(FSDP_ERR_INVALID, ctl_endpoint_resolve("localhost:7071", b, sizeof b));
  unsetenv("FSDP_CTL");
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double ms_since(double t0) { return now_ms() - t0; }

static void test_unreachable(void) {
  char ep[400], msg[1024];
  ctl_conn *c = NULL;
  snprintf(ep, sizeof ep, "ipc://%s/missing.sock", g_dir);
  double t0 = now_ms();
  CHECK_EQ_INT(FSDP_ERR_COMM, ctl_conn_open(ep, &c));
  CHECK(c == NULL);
  CHECK(ms_since(t0) < 100);
  ctl_describe_failure(ep, FSDP_ERR_COMM, msg, sizeof msg);
  CHECK(strstr(msg, "cannot reach fsdpd at ipc://") && strstr(msg, "is it running?"));

  /* A socket file nobody listens on (a daemon that died): the call fails within the connect timeout. */
  char path[100];
  snprintf(path, sizeof path, "%.80s/stale.sock", g_dir);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  close(fd);
  snprintf(ep, sizeof ep, "ipc://%s", path);
  CHECK_OK(ctl_conn_open(ep, &c));
  Fsdp__Msg *m = NULL;
  t0 = now_ms();
  CHECK_EQ_INT(FSDP_ERR_COMM, status_call(c, 1, 1000, &m));
  double el = ms_since(t0);
  CHECK(m == NULL);
  CHECK(el >= CTL_CONNECT_TIMEOUT_MS - 50 && el < CTL_CONNECT_TIMEOUT_MS + 1500);
  ctl_conn_destroy(&c);
  CHECK(c == NULL);
  ctl_conn_destroy(&c);   /* NULL-safe */
}

static void test_round_trips(void) {
  void *sctx = zmq_ctx_new();
  pthread_t th;
  snprintf(g_ep, sizeof g_ep, "ipc://%s/ctl.sock", g_dir);
  pthread_create(&th, NULL, server, sctx);
  /* Wait for the bind (the socket file appears) with a deadline. */
  double t0 = now_ms();
  ctl_conn *c = NULL;
  while (ctl_conn_open(g_ep, &c) != FSDP_OK && ms_since(t0) < 5000) zmq_poll(NULL, 0, 10);
  CHECK(c != NULL);
  if (!c) return;

  Fsdp__Msg req = WIRE_MSG_INIT, *m = NULL;
  Fsdp__NodesReq nr = FSDP__NODES_REQ__INIT;
  req.body_case = FSDP__MSG__BODY_NODES_REQ, req.nodes_req = &nr;
  CHECK_OK(ctl_conn_call(c, &req, 2000, &m));
  CHECK(m && m->body_case == FSDP__MSG__BODY_NODES_RESP);
  wire_destroy(&m);

  CHECK_OK(status_call(c, 5, 2000, &m));
  CHECK(m && m->body_case == FSDP__MSG__BODY_STATUS_RESP && m->status_resp->id == 5);
  wire_destroy(&m);

  /* An error reply is a reply. */
  CHECK_OK(status_call(c, 42, 2000, &m));
  CHECK(m && m->body_case == FSDP__MSG__BODY_ERROR && m->error->code == FSDP_ERR_NOTFOUND);
  CHECK(m && !strcmp(m->error->message, "no job 42"));
  wire_destroy(&m);

  /* A request not answered in time: TIMEOUT after about its timeout, and its late reply is never
   * taken for the answer to the next request. */
  t0 = now_ms();
  CHECK_EQ_INT(FSDP_ERR_TIMEOUT, status_call(c, 7, 300, &m));
  double el = ms_since(t0);
  CHECK(el >= 290 && el < 2000);
  CHECK(m == NULL);
  CHECK_OK(status_call(c, 8, 2000, &m));
  CHECK(m && m->body_case == FSDP__MSG__BODY_STATUS_RESP && m->status_resp->id == 8);
  wire_destroy(&m);
  CHECK_OK(status_call(c, 5, 2000, &m));   /* and the connection still works after that */
  CHECK(m && m->status_resp && m->status_resp->id == 5);
  wire_destroy(&m);

  /* A signal ends the wait at once with CANCELLED (Ctrl-C in fsdpctl run). */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, NULL);
  t0 = now_ms();
  CHECK_EQ_INT(FSDP_ERR_CANCELLED, status_call(c, 9, 10000, &m));
  CHECK(ms_since(t0) < 5000);
  CHECK_OK(status_call(c, 6, 2000, &m));
  CHECK(m && m->status_resp && m->status_resp->id == 6);
  wire_destroy(&m);

  Fsdp__ShutdownReq sr = FSDP__SHUTDOWN_REQ__INIT;
  req.body_case = FSDP__MSG__BODY_SHUTDOWN_REQ, req.shutdown_req = &sr;
  CHECK_OK(ctl_conn_call(c, &req, 2000, &m));
  CHECK(m && m->body_case == FSDP__MSG__BODY_ACK);
  wire_destroy(&m);
  ctl_conn_destroy(&c);
  zmq_ctx_shutdown(sctx);   /* ends the server's poll with ETERM */
  pthread_join(th, NULL);
  zmq_ctx_term(sctx);
}

int main(void) {
  g_main = pthread_self();
  snprintf(g_dir, sizeof g_dir, "/tmp/test_ctl_conn.XXXXXX");
  if (!mkdtemp(g_dir)) return 1;
  test_resolve();
  test_unreachable();
  test_round_trips();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
  return check_done();
}
