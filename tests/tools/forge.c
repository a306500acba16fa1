/* fsdp_forge — what another local user would try against a job's workers (tests/integration/
 * trust_workers.sh and test_relay). Not installed; the tests run it as that user.
 *
 *   fsdp_forge watch JOB RANK TOKEN_FILE TIMEOUT_S
 *       Wait for job JOB's rank RANK worker to appear in /proc, then, as fast as it can, send its
 *       hello with the job's token (from the worker's command line where it is there, else from
 *       TOKEN_FILE once it exists: a stolen token) to every endpoint it can name: the worker's
 *       --connect argument, every fsdpd socket in /proc/net/unix (paths and abstract names alike).
 *       Exit 0 and print "took over ..." when a worker_setup comes back (the attack won), 1 when none
 *       came within 2 s of sending or TIMEOUT_S in all.
 *   fsdp_forge hello ENDPOINT JOB RANK TOKEN [JOB RANK TOKEN...]
 *       Send each hello on one connection, then wait 5 s for a worker_setup: exit 0 when one came, 1
 *       when none did.
 *   fsdp_forge garbage ENDPOINT N
 *       Send N malformed messages (random bytes behind a valid envelope), then exit 0.
 */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "wire.h"

#define MAX_EPS 64

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *dealer(void *ctx, const char *ep) {
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 5000;   /* garbage: every queued message goes out before the close */
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_connect(s, ep) != 0) {
    zmq_close(s);
    return NULL;
  }
  return s;
}

static void send_hello(void *s, unsigned long long job, unsigned rank, const char *token) {
  Fsdp__WorkerHello h = FSDP__WORKER_HELLO__INIT;
  h.job_id = job;
  h.rank = rank;
  h.pid = (uint32_t)getpid();
  h.token = (char *)token;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_HELLO;
  m.worker_hello = &h;
  wire_env env = {0};
  wire_env_push(&env, "", 0);
  wire_send(s, &env, &m, ZMQ_DONTWAIT);
}

/* Wait until DEADLINE for a worker_setup on any of the N sockets; its index, or -1. */
static int wait_setup(void **socks, int n, double deadline) {
  zmq_pollitem_t it[MAX_EPS];
  for (int i = 0; i < n; i++) it[i] = (zmq_pollitem_t){socks[i], 0, ZMQ_POLLIN, 0};
  for (double left; (left = deadline - now_s()) > 0;) {
    if (zmq_poll(it, n, (long)(left * 1000) + 1) <= 0) continue;
    for (int i = 0; i < n; i++) {
      if (!(it[i].revents & ZMQ_POLLIN)) continue;
      Fsdp__Msg *m = NULL;
      wire_env env;
      if (wire_recv(socks[i], &env, &m, ZMQ_DONTWAIT) == FSDP_OK && m->body_case == FSDP__MSG__BODY_WORKER_SETUP) {
        wire_destroy(&m);
        return i;
      }
      wire_destroy(&m);
    }
  }
  return -1;
}

/* The pid of the process whose command line is fsdp-worker ... --job JOB --rank RANK; its --connect
 * and --token values (NULL when absent) into EP and TOKEN. */
static int find_worker(const char *job, const char *rank, char *ep, size_t epn, char *token, size_t tn) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int found = 0;
  for (struct dirent *e; !found && (e = readdir(d));) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    char path[300], buf[8192];
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *arg[64];
    int na = 0;
    for (size_t k = 0; k < n && na < 64; k += strlen(buf + k) + 1) arg[na++] = buf + k;
    if (na < 1 || !strstr(arg[0], "fsdp-worker")) continue;
    int job_ok = 0, rank_ok = 0;
    *ep = *token = '\0';
    for (int k = 0; k + 1 < na; k++) {
      if (!strcmp(arg[k], "--job")) job_ok = !strcmp(arg[k + 1], job);
      if (!strcmp(arg[k], "--rank")) rank_ok = !strcmp(arg[k + 1], rank);
      if (!strcmp(arg[k], "--connect")) snprintf(ep, epn, "%s", arg[k + 1]);
      if (!strcmp(arg[k], "--token")) snprintf(token, tn, "%s", arg[k + 1]);
    }
    found = job_ok && rank_ok;
  }
  closedir(d);
  return found;
}

/* Every unix socket of an fsdpd that /proc/net/unix lists, as ipc:// endpoints. */
static int listed_sockets(char eps[][300], int max) {
  FILE *f = fopen("/proc/net/unix", "r");
  if (!f) return 0;
  char line[1024];
  int n = 0;
  while (n < max && fgets(line, sizeof line, f)) {
    char *p = strrchr(line, ' ');
    if (!p) continue;
    p++;
    p[strcspn(p, "\n")] = '\0';
    if (!strstr(p, "fsdpd") && !strstr(p, "/run/r-")) continue;
    int dup = 0;
    for (int i = 0; i < n; i++) dup |= !strcmp(eps[i] + 6, p);
    if (!dup) snprintf(eps[n++], 300, "ipc://%s", p);
  }
  fclose(f);
  return n;
}

static int cmd_watch(const char *job, const char *rank, const char *token_file, double timeout_s) {
  double deadline = now_s() + timeout_s;
  char ep[300], token[128];
  while (!find_worker(job, rank, ep, sizeof ep, token, sizeof token))
    if (now_s() > deadline) {
      printf("no worker of job %s rank %s appeared\n", job, rank);
      return 1;
    }
  while (!*token && now_s() < deadline) {   /* not on the command line: wait for the stolen one */
    FILE *f = fopen(token_file, "r");
    if (f) {
      if (fgets(token, sizeof token, f)) token[strcspn(token, "\n")] = '\0';
      fclose(f);
    }
  }
  char eps[MAX_EPS][300];
  int n = 0;
  if (*ep) snprintf(eps[n++], sizeof eps[0], "%s", ep);
  n += listed_sockets(eps + n, MAX_EPS - n);
  void *ctx = zmq_ctx_new(), *socks[MAX_EPS];
  int ns = 0;
  const char *used[MAX_EPS];
  for (int i = 0; i < n; i++) {
    void *s = dealer(ctx, eps[i]);
    if (!s) continue;
    send_hello(s, strtoull(job, NULL, 10), (unsigned)strtoul(rank, NULL, 10), token);
    used[ns] = eps[i];
    socks[ns++] = s;
  }
  double answer_by = now_s() + 2.0;   /* an admitted hello is answered in milliseconds */
  int won = wait_setup(socks, ns, answer_by < deadline ? answer_by : deadline);
  if (won >= 0) printf("took over job %s rank %s through %s\n", job, rank, used[won]);
  else printf("no endpoint of %d tried answered the forged hello\n", ns);
  for (int i = 0; i < ns; i++) zmq_close(socks[i]);
  zmq_ctx_term(ctx);
  return won >= 0 ? 0 : 1;
}

static int cmd_hello(const char *ep, int nargs, char **args) {
  void *ctx = zmq_ctx_new(), *s = dealer(ctx, ep);
  if (!s) return 2;
  for (int i = 0; i + 2 < nargs; i += 3)
    send_hello(s, strtoull(args[i], NULL, 10), (unsigned)strtoul(args[i + 1], NULL, 10), args[i + 2]);
  int won = wait_setup(&s, 1, now_s() + 5.0);
  printf(won >= 0 ? "took over: a worker_setup came back\n" : "no worker_setup came back\n");
  zmq_close(s);
  zmq_ctx_term(ctx);
  return won >= 0 ? 0 : 1;
}

static int cmd_garbage(const char *ep, long n) {
  void *ctx = zmq_ctx_new(), *s = dealer(ctx, ep);
  if (!s) return 2;
  unsigned char junk[64];
  srand((unsigned)getpid());
  for (long i = 0; i < n; i++) {
    for (size_t k = 0; k < sizeof junk; k++) junk[k] = (unsigned char)rand();
    zmq_send(s, "", 0, ZMQ_SNDMORE);
    zmq_send(s, junk, 1 + (size_t)rand() % sizeof junk, 0);
  }
  zmq_close(s);   /* the linger sends what is queued */
  zmq_ctx_term(ctx);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 6 && !strcmp(argv[1], "watch")) return cmd_watch(argv[2], argv[3], argv[4], atof(argv[5]));
  if (argc >= 6 && !strcmp(argv[1], "hello")) return cmd_hello(argv[2], argc - 3, argv + 3);
  if (argc == 4 && !strcmp(argv[1], "garbage")) return cmd_garbage(argv[2], atol(argv[3]));
  fprintf(stderr, "usage: fsdp_forge watch JOB RANK TOKEN_FILE TIMEOUT_S | hello ENDPOINT JOB RANK TOKEN... | "
                  "garbage ENDPOINT N\n");
  return 2;
}
