/* ctl_daemon — the private fsdpd that `fsdpctl run` starts, watches and stops.
 *
 * The daemon is the fsdpd next to fsdpctl, started with --foreground in its own process group
 * (a terminal Ctrl-C reaches fsdpctl only) and with PR_SET_PDEATHSIG, so it dies with fsdpctl.
 * fsdpctl waits until it answers and offers the job's devices, and at the end asks it to shut
 * down (SIGKILL if it does not exit in time). A pidfd, where the kernel has one, makes every wait
 * notice the daemon's death at once. Single-threaded.
 */
#ifndef FSDP_CTL_DAEMON_H
#define FSDP_CTL_DAEMON_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

#include "ctl_client.h"

typedef struct ctl_daemon {
  pid_t pid;
  int pidfd;        /* readable once the daemon exits; -1 where the kernel lacks pidfd_open */
  int reaped;
  int status;
  char log[PATH_MAX];
  pid_t janitor;    /* see ctl_daemon_janitor; 0: none */
  int janitor_fd;
} ctl_daemon;

/* Where fsdpd is: next to this executable. 0 or 1 (the reason printed). */
int ctl_daemon_find(char *buf, size_t n);
/* Start FSDPD with STATE_DIR, sized to SPEC, logging to STATE_DIR/fsdpd.log at LEVEL (may be NULL). */
int ctl_daemon_start(ctl_daemon *d, const char *fsdpd, const char *state_dir, const jobspec_t *spec, const char *level);
/* 1 if the daemon has exited (status reaped), 0 if not after waiting up to MS. */
int ctl_daemon_wait(ctl_daemon *d, int ms);
/* "exited with status 3", "was killed by signal 9 (Killed)". */
void ctl_daemon_describe_exit(const ctl_daemon *d, char *buf, size_t n);
/* Connect CL to ENDPOINT once the daemon answers and offers SPEC's devices. *CITE_LOG says whether
 * the failure message names the daemon's log. */
int ctl_daemon_ready(ctl_daemon *d, ctl_client *cl, const char *endpoint, const jobspec_t *spec, int *cite_log);
/* Ask the daemon to shut down through CL (may be NULL: SIGTERM) and reap it; SIGKILL if it does
 * not exit in time. */
void ctl_daemon_stop(ctl_daemon *d, ctl_client *cl);

/* For a temporary STATE_DIR: start a small process that removes it if fsdpctl dies without saying
 * so (kill -9), once the daemon has exited. ctl_daemon_janitor_release tells it that fsdpctl
 * cleaned up itself and reaps it. Call after ctl_daemon_start and before any connection opens. */
int ctl_daemon_janitor(ctl_daemon *d, const char *state_dir);
void ctl_daemon_janitor_release(ctl_daemon *d);

#endif
