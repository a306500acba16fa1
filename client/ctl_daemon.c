/* ctl_daemon — see ctl_daemon.h. */
#define _GNU_SOURCE   /* strsignal, dprintf */
#include "ctl_daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsutil.h"
#include "wire.h"

#define DAEMON_READY_MS 10000       /* a private daemon must answer nodes_req within this */
#define DAEMON_EXIT_MS 15000        /* ... and exit within this after shutdown_req */

/* Where fsdpd is: next to this executable. */
int ctl_daemon_find(char *buf, size_t n) {
  char self[PATH_MAX];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  if (l <= 0) return ctl_fail("cannot read /proc/self/exe: %s", strerror(errno));
  self[l] = '\0';
  snprintf(buf, n, "%s/fsdpd", dirname(self));
  if (access(buf, X_OK) != 0)
    return ctl_fail("cannot run %s: %s (fsdpctl run starts the fsdpd that sits next to fsdpctl; build or install both)", buf,
                strerror(errno));
  return 0;
}

static int pidfd_open_(pid_t pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, pid, 0);
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}


/* 1 if the daemon has exited (status reaped), 0 if not after waiting up to MS. */
int ctl_daemon_wait(ctl_daemon *d, int ms) {
  if (d->reaped) return 1;
  double deadline = ctl_mono_ms() + ms;
  for (;;) {
    pid_t r = waitpid(d->pid, &d->status, WNOHANG);
    if (r == d->pid || (r < 0 && errno == ECHILD)) {
      d->reaped = 1;
      return 1;
    }
    double left = deadline - ctl_mono_ms();
    if (left <= 0) return 0;
    if (d->pidfd >= 0) {
      struct pollfd pfd = {d->pidfd, POLLIN, 0};
      poll(&pfd, 1, (int)left + 1);
    } else {
      poll(NULL, 0, left < 20 ? (int)left + 1 : 20);
    }
  }
}

void ctl_daemon_describe_exit(const ctl_daemon *d, char *buf, size_t n) {
  if (WIFEXITED(d->status))
    snprintf(buf, n, "exited with status %d", WEXITSTATUS(d->status));
  else if (WIFSIGNALED(d->status))
    snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(d->status), strsignal(WTERMSIG(d->status)));
  else
    snprintf(buf, n, "stopped");
}

/* The last non-empty line of the daemon's log, for a one-line failure message. */
static void last_log_line(const char *path, char *buf, size_t n) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    size_t l = strlen(line);
    while (l && (line[l - 1] == '\n' || line[l - 1] == '\r')) line[--l] = '\0';
    if (l) snprintf(buf, n, "%s", line);
  }
  fclose(f);
}

int ctl_daemon_start(ctl_daemon *d, const char *fsdpd, const char *state_dir, const jobspec_t *spec,
                        const char *level) {
  memset(d, 0, sizeof *d);
  d->pidfd = -1;
  snprintf(d->log, sizeof d->log, "%s/fsdpd.log", state_dir);
  char nworkers[16];
  snprintf(nworkers, sizeof nworkers, "%d", spec->world_size);
  const char *argv[16];
  int a = 0;
  argv[a++] = fsdpd;
  argv[a++] = "--state-dir";
  argv[a++] = state_dir;
  if (spec->device == DEVICE_CUDA) {
    argv[a++] = "--gpus";
    argv[a++] = "all";
  } else {
    argv[a++] = "--cpu-workers";
    argv[a++] = nworkers;
    argv[a++] = "--gpus";   /* a CPU job: do not probe (or hold) the machine's GPUs */
    argv[a++] = "none";
  }
  argv[a++] = "--foreground";
  if (level) {
    argv[a++] = "--log-level";
    argv[a++] = level;
  }
  argv[a] = NULL;
  int logfd;
  if (fsutil_open_append(AT_FDCWD, d->log, d->log, 0644, &logfd) != FSDP_OK)
    return ctl_fail("%s", fsdp_last_error());
  fflush(NULL);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(logfd);
    return ctl_fail("fork: %s", strerror(errno));
  }
  if (pid == 0) {
    /* Its own process group: a Ctrl-C at the terminal reaches fsdpctl only, which then cancels
     * the job and shuts the daemon down in order. It dies with us if we die. */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(logfd, 1);
    dup2(logfd, 2);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execv(fsdpd, (char *const *)argv);
    dprintf(2, "fsdpctl: cannot execute %s: %s\n", fsdpd, strerror(errno));
    _exit(127);
  }
  close(logfd);
  d->pid = pid;
  d->pidfd = pidfd_open_(pid);
  return 0;
}

/* Ask the daemon to shut down and reap it; SIGKILL if it does not exit in time. */
void ctl_daemon_stop(ctl_daemon *d, ctl_client *cl) {
  if (d->pid <= 0 || d->reaped) goto out;
  if (cl && cl->conn) {
    Fsdp__Msg req = WIRE_MSG_INIT, *m = NULL;
    Fsdp__ShutdownReq sr = FSDP__SHUTDOWN_REQ__INIT;
    req.body_case = FSDP__MSG__BODY_SHUTDOWN_REQ;
    req.shutdown_req = &sr;
    if (ctl_conn_call(cl->conn, &req, 5000, &m) != FSDP_OK) kill(d->pid, SIGTERM);
    wire_destroy(&m);
  } else {
    kill(d->pid, SIGTERM);
  }
  if (!ctl_daemon_wait(d, DAEMON_EXIT_MS)) {
    fprintf(stderr, "fsdpctl: fsdpd (pid %d) did not exit within %d s of shutdown; killing it\n", (int)d->pid,
            DAEMON_EXIT_MS / 1000);
    kill(d->pid, SIGKILL);
    ctl_daemon_wait(d, DAEMON_EXIT_MS);
  }
out:
  if (d->pidfd >= 0) close(d->pidfd);
  d->pidfd = -1;
}

/* Wait until the private daemon answers and offers enough free devices of the job's kind. */
int ctl_daemon_ready(ctl_daemon *d, ctl_client *cl, const char *endpoint, const jobspec_t *spec, int *cite_log) {
  *cite_log = 1;
  double deadline = ctl_mono_ms() + DAEMON_READY_MS;
  int want = spec->world_size, have = -1;
  int cuda = spec->device == DEVICE_CUDA;
  memset(cl, 0, sizeof *cl);
  snprintf(cl->endpoint, sizeof cl->endpoint, "%.1000s", endpoint);
  for (;;) {
    if (ctl_interrupts) {
      *cite_log = 0;
      ctl_fail("interrupted before the job was submitted");
      return EXIT_CANCELLED;
    }
    if (ctl_daemon_wait(d, 0)) {
      char how[128], line[512];
      ctl_daemon_describe_exit(d, how, sizeof how);
      last_log_line(d->log, line, sizeof line);
      return ctl_fail("fsdpd %s before it was ready%s%s (log: %s)", how, line[0] ? ": " : "", line, d->log);
    }
    if (ctl_mono_ms() > deadline) {
      if (have >= 0 && cuda)
        break;
      if (have >= 0)
        return ctl_fail("fsdpd offers %d free CPU slots after %d s; the job needs %d (log: %s)", have, DAEMON_READY_MS / 1000,
                    want, d->log);
      return ctl_fail("fsdpd did not answer at %s within %d s (log: %s)", endpoint, DAEMON_READY_MS / 1000, d->log);
    }
    if (!cl->conn) {
      fsdp_status rc = ctl_conn_open(endpoint, &cl->conn);
      if (rc == FSDP_ERR_COMM) {   /* socket not bound yet */
        ctl_daemon_wait(d, 20);
        continue;
      }
      if (rc != FSDP_OK) return ctl_fail("%s", fsdp_last_error());
      ctl_conn_watch_fd(cl->conn, d->pidfd);
      cl->daemon_log = d->log;
    }
    Fsdp__Msg req = WIRE_MSG_INIT, *m = NULL;
    Fsdp__NodesReq nr = FSDP__NODES_REQ__INIT;
    req.body_case = FSDP__MSG__BODY_NODES_REQ;
    req.nodes_req = &nr;
    fsdp_status rc = ctl_conn_call(cl->conn, &req, 2000, &m);
    if (rc == FSDP_ERR_CANCELLED) continue;
    if (rc != FSDP_OK || m->body_case != FSDP__MSG__BODY_NODES_RESP) {
      wire_destroy(&m);
      ctl_daemon_wait(d, 20);
      continue;
    }
    int nodes = 0, slots = 0;
    for (size_t i = 0; i < m->nodes_resp->n_nodes; i++) {
      const Fsdp__NodeInfo *ni = m->nodes_resp->nodes[i];
      if (ni->lost) continue;
      nodes++;
      for (size_t s = 0; s < ni->n_slots; s++) {
        const Fsdp__DeviceSlot *sl = ni->slots[s];
        if (sl->job_id == 0 && (sl->kind == FSDP__DEVICE_KIND__DEVICE_KIND_CUDA) == cuda) slots++;
      }
    }
    wire_destroy(&m);
    if (nodes > 0) have = slots;
    if (have >= want) return 0;
    if (cuda && nodes > 0) break;   /* the embedded agent registers every GPU at once */
    ctl_daemon_wait(d, 20);
  }
  *cite_log = 0;
  if (have == 0)
    return ctl_fail("job asks for device = cuda with world_size %d but this machine has no CUDA devices", want);
  return ctl_fail("job asks for device = cuda with world_size %d but this machine has only %d CUDA device%s", want, have,
              have == 1 ? "" : "s");
}

int ctl_daemon_janitor(ctl_daemon *d, const char *state_dir) {
  int fds[2];
  d->janitor_fd = -1;
  d->janitor = 0;
  if (pipe2(fds, O_CLOEXEC) != 0) return ctl_fail("pipe: %s", strerror(errno));
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return ctl_fail("fork: %s", strerror(errno));
  }
  if (pid == 0) {
    /* The janitor: it outlives fsdpctl only to clean up after it. Its own process group keeps a
     * terminal Ctrl-C away; fsdpctl says "done" on the pipe, or dies and the pipe reads EOF. */
    setpgid(0, 0);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    close(fds[1]);
    char b;
    ssize_t n;
    while ((n = read(fds[0], &b, 1)) < 0 && errno == EINTR) {
    }
    if (n == 1) _exit(0);
    /* fsdpctl is gone: its daemon got SIGTERM (PDEATHSIG) and shuts down; remove the state once it
     * has (the daemon's own shutdown is bounded; the deadline only guards against a wedged one). */
    int pfd = pidfd_open_(d->pid);
    for (int waited = 0; kill(d->pid, 0) == 0 && waited < 60000; waited += 50) {
      if (pfd >= 0) {
        struct pollfd p = {pfd, POLLIN, 0};
        if (poll(&p, 1, 50) > 0) break;
      } else {
        poll(NULL, 0, 50);
      }
    }
    fsutil_remove_tree(state_dir);
    _exit(0);
  }
  close(fds[0]);
  d->janitor = pid;
  d->janitor_fd = fds[1];
  return 0;
}

void ctl_daemon_janitor_release(ctl_daemon *d) {
  if (d->janitor <= 0) return;
  if (write(d->janitor_fd, "x", 1) != 1) kill(d->janitor, SIGKILL);
  close(d->janitor_fd);
  waitpid(d->janitor, NULL, 0);
  d->janitor = 0;
  d->janitor_fd = -1;
}
