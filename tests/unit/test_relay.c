/* test_relay — who may speak as a worker at a node's relay (daemon/relay.h): only the process the
 * agent started for a rank, as the kernel names the connection's peer (uid, pid), and from its hello
 * on only that connection, for that rank. Each refusal is followed on the same connection by a
 * message that passes, so that the refused one is known to have been read (no sleeps). As root, a
 * second user's process (fsdp_forge under setuid) reaching the socket through the relay's own
 * descriptor is refused as the wrong uid, then admitted once the relay expects that uid and pid. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"
#include "loop.h"
#include "relay.h"
#include "tmpdir.h"

#define MAX_UP 32

static struct {
  int n;
  Fsdp__Msg__BodyCase body[MAX_UP];
  uint64_t job[MAX_UP];
  uint32_t rank[MAX_UP];
} up;

static void on_up(void *arg, const wire_env *env, Fsdp__Msg *m) {
  (void)arg, (void)env;
  if (up.n == MAX_UP) return;
  up.body[up.n] = m->body_case;
  up.job[up.n] = m->body_case == FSDP__MSG__BODY_WORKER_HELLO ? m->worker_hello->job_id : 0;
  up.rank[up.n] = m->body_case == FSDP__MSG__BODY_WORKER_HELLO ? m->worker_hello->rank
                  : m->body_case == FSDP__MSG__BODY_WORKER_READY ? m->worker_ready->rank : 0;
  up.n++;
}

/* M on socket S as a worker sends it: [""][body]. */
static void send_msg(void *s, Fsdp__Msg *m) {
  wire_env env = {0};
  wire_env_push(&env, "", 0);
  CHECK(wire_send(s, &env, m, 0) == FSDP_OK);
}

static void send_hello(void *s, uint64_t job, uint32_t rank) {
  Fsdp__WorkerHello h = FSDP__WORKER_HELLO__INIT;
  h.job_id = job, h.rank = rank, h.token = "t";
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_HELLO, m.worker_hello = &h;
  send_msg(s, &m);
}

static void send_ready(void *s, uint32_t rank) {
  Fsdp__WorkerReady r = FSDP__WORKER_READY__INIT;
  r.rank = rank;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_READY, m.worker_ready = &r;
  send_msg(s, &m);
}

static void send_kv_get(void *s) {
  Fsdp__KvGet g = FSDP__KV_GET__INIT;
  g.key = "k";
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_KV_GET, m.kv_get = &g;
  send_msg(s, &m);
}

/* Run the loop until N messages went up (or 10 s passed: a failure). */
static int wait_up(uv_loop_t *uv, int n) {
  double deadline = loop_now_mono() + 10.0;
  while (up.n < n && loop_now_mono() < deadline) uv_run(uv, UV_RUN_NOWAIT);
  return up.n >= n;
}

static void *dealer(void *ctx, const char *ep) {
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  CHECK(zmq_connect(s, ep) == 0);
  return s;
}

static void test_same_user(uv_loop_t *uv, void *ctx, relay *r) {
  long uid = (long)getuid(), pid = (long)getpid();
  void *a = dealer(ctx, relay_endpoint(r));
  /* the hello of a rank started as another process: refused; then its own rank's: admitted */
  relay_expect(r, 7, 0, uid, pid + 1);
  relay_expect(r, 7, 1, uid, pid);
  send_hello(a, 7, 0);
  send_hello(a, 7, 1);
  CHECK(wait_up(uv, 1));
  CHECK_EQ_INT(1, up.n);
  CHECK(up.body[0] == FSDP__MSG__BODY_WORKER_HELLO && up.job[0] == 7 && up.rank[0] == 1);
  /* that connection speaks for rank 1 only */
  send_ready(a, 0);
  send_ready(a, 1);
  CHECK(wait_up(uv, 2));
  CHECK_EQ_INT(2, up.n);
  CHECK(up.body[1] == FSDP__MSG__BODY_WORKER_READY && up.rank[1] == 1);
  /* a second connection of the same process: rank 1 said hello already; its own rank 2 passes */
  void *b = dealer(ctx, relay_endpoint(r));
  relay_expect(r, 7, 2, uid, pid);
  send_hello(b, 7, 1);
  send_hello(b, 7, 2);
  CHECK(wait_up(uv, 3));
  CHECK_EQ_INT(3, up.n);
  CHECK(up.rank[2] == 2);
  /* a connection that said no hello: its kv request is not passed on in anyone's name */
  void *c = dealer(ctx, relay_endpoint(r));
  relay_expect(r, 7, 3, uid, pid);
  send_kv_get(c);
  send_hello(c, 7, 3);
  CHECK(wait_up(uv, 4));
  CHECK_EQ_INT(4, up.n);
  CHECK(up.body[3] == FSDP__MSG__BODY_WORKER_HELLO && up.rank[3] == 3);
  /* a rank that is gone: its process's hello is refused; a restart's new process is expected instead */
  relay_rank_gone(r, 7, 0, pid + 1);
  void *d = dealer(ctx, relay_endpoint(r));
  relay_expect(r, 7, 4, uid, pid);
  send_hello(d, 7, 0);
  send_hello(d, 7, 4);
  CHECK(wait_up(uv, 5));
  CHECK_EQ_INT(5, up.n);
  CHECK(up.rank[4] == 4);
  zmq_close(a), zmq_close(b), zmq_close(c), zmq_close(d);
}

/* As root: fsdp_forge as uid 65534, given the relay's descriptor as fd 3, sends hellos for ranks 5
 * (expected as root: refused) and 6 (expected as 65534 with the forger's pid: admitted). */
static void test_other_user(uv_loop_t *uv, relay *r, const char *forge) {
  int before = up.n;
  pid_t kid = fork();
  if (kid == 0) {
    if (dup2(relay_socket_fd(r), 3) != 3 || setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    execl(forge, forge, "hello", "ipc:///proc/self/fd/3", "8", "5", "t", "8", "6", "t", (char *)NULL);
    _exit(4);
  }
  CHECK(kid > 0);
  relay_expect(r, 8, 5, 0, kid);       /* the right pid, the wrong user */
  relay_expect(r, 8, 6, 65534, kid);
  CHECK(wait_up(uv, before + 1));
  CHECK_EQ_INT(before + 1, up.n);
  CHECK(up.job[before] == 8 && up.rank[before] == 6);
  kill(kid, SIGTERM);
  waitpid(kid, NULL, 0);
}

int main(int argc, char **argv) {
  (void)argc;
  tmpdir_make("test_relay");
  uv_loop_t *uv = uv_default_loop();
  void *ctx = zmq_ctx_new();
  relay *r = NULL;
  CHECK(relay_new(uv, ctx, tmp_dir, on_up, NULL, &r) == FSDP_OK);
  if (!r) return check_done();
  /* the socket is in the given directory; the worker's endpoint is the descriptor */
  char expect_prefix[128];
  snprintf(expect_prefix, sizeof expect_prefix, "ipc://%s/r-", tmp_dir);
  CHECK(!strncmp(relay_endpoint(r), expect_prefix, strlen(expect_prefix)));
  CHECK(relay_socket_fd(r) >= 0 && (fcntl(relay_socket_fd(r), F_GETFD) & FD_CLOEXEC));
  test_same_user(uv, ctx, r);
  char forge[4096];
  snprintf(forge, sizeof forge, "%s", argv[0]);
  char *slash = strrchr(forge, '/');
  snprintf(slash ? slash + 1 : forge, sizeof forge - (size_t)(slash ? slash + 1 - forge : 0), "fsdp_forge");
  if (getuid() == 0 && access(forge, X_OK) == 0) test_other_user(uv, r, forge);
  else printf("test_relay: another user's process not tried (needs root and %s)\n", forge);
  /* the socket file goes with the relay */
  char path[256];
  snprintf(path, sizeof path, "%s", relay_endpoint(r) + 6);
  relay_destroy(&r);
  CHECK(access(path, F_OK) != 0);
  zmq_ctx_term(ctx);
  tmpdir_remove();
  return check_done();
}
