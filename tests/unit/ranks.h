/* ranks — the one forked-ranks harness of the tests that run real ranks (test_comm, test_runtime,
 * test_ckpt): fork WORLD children in a fresh run directory, each calling FN(rank, world, dir, arg)
 * and exiting with its return value; wait for them all with a deadline (a rank still running then
 * is killed and counts as failed), and report each rank's wait status. Children never outlive the
 * test (PR_SET_PDEATHSIG) and count their own checks. The run directory holds an empty `store`
 * directory (a gloo file store) and is the caller's to read results from, then ranks_cleanup(). */
#ifndef FSDP_TEST_RANKS_H
#define FSDP_TEST_RANKS_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "testfiles.h"

#define RANKS_MAX 8

typedef int (*ranks_fn)(int rank, int world, const char *dir, void *arg);

typedef struct ranks_run {
  int world;
  double deadline_s;      /* for the whole group */
  int release_fd;         /* -1, or a descriptor the parent closes once one rank is left (children
                             close it first): lets the last rank block until it is alone */
  char dir[64];           /* set by ranks_start: the run directory */
  int status[RANKS_MAX];  /* each rank's wait status; -1 when it was killed at the deadline */
} ranks_run;

/* Run FN in R->world forked ranks; returns how many failed (non-zero exit, a signal, the deadline). */
static inline int ranks_go(ranks_run *r, ranks_fn fn, void *arg) {
  snprintf(r->dir, sizeof r->dir, "/tmp/fsdp-ranks-XXXXXX");
  if (!mkdtemp(r->dir)) {
    perror("mkdtemp");
    return r->world;
  }
  char store[128];
  snprintf(store, sizeof store, "%s/store", r->dir);
  mkdir(store, 0700);
  pid_t pids[RANKS_MAX];
  fflush(NULL);
  for (int k = 0; k < r->world; k++) {
    pid_t p = fork();
    if (p == 0) {
      check_pass_ = check_fail_ = 0;       /* each rank counts its own checks */
      prctl(PR_SET_PDEATHSIG, SIGKILL);    /* never outlive the test */
      if (r->release_fd >= 0) close(r->release_fd);
      int rc = fn(k, r->world, r->dir, arg);
      fflush(NULL);
      _exit(rc);
    }
    pids[k] = p;
  }
  int failed = 0, left = r->world, release = r->release_fd;
  int done[RANKS_MAX] = {0};
  double deadline = now_s() + r->deadline_s;
  while (left > 0) {
    if (left == 1 && release >= 0) {   /* the last rank may now stop waiting */
      close(release);
      release = -1;
    }
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int k = 0; k < r->world; k++)
        if (pids[k] == p && !done[k]) {
          done[k] = 1;
          left--;
          r->status[k] = st;
          if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
        }
      continue;
    }
    if (now_s() > deadline) {
      fprintf(stderr, "world %d: deadline of %.0f s passed; killing %d rank(s)\n", r->world, r->deadline_s, left);
      for (int k = 0; k < r->world; k++)
        if (!done[k]) {
          kill(pids[k], SIGKILL);
          waitpid(pids[k], NULL, 0);
          r->status[k] = -1;
          failed++;
        }
      break;
    }
    struct timespec ts = {0, 5000000};   /* poll the children's state every 5 ms */
    nanosleep(&ts, NULL);
  }
  return failed;
}

/* What rank K's status says, for messages: "exit 3", "signal 9", "killed at the deadline". */
static inline const char *ranks_why(const ranks_run *r, int k, char *buf, size_t n) {
  int st = r->status[k];
  if (st == -1) snprintf(buf, n, "killed at the deadline");
  else if (WIFEXITED(st)) snprintf(buf, n, "exit %d", WEXITSTATUS(st));
  else snprintf(buf, n, "signal %d", WTERMSIG(st));
  return buf;
}

static inline void ranks_cleanup(ranks_run *r) {
  if (r->dir[0]) rm_rf(r->dir);
  r->dir[0] = '\0';
}

#endif
