/* ctl_client — how fsdpctl's daemon commands talk to fsdpd, and the plumbing they share.
 *
 * A ctl_client is one connection to the control endpoint (ctl_conn) with fsdpctl's way of failing:
 * every call that fails prints exactly one "fsdpctl: ..." line on stderr and returns the exit
 * status (1, or 130 when a Ctrl-C interrupted it). ctl_client_request is the whole life of a
 * one-request command: open, call, print the reply, close. Exit statuses: 0 success; 1 failure;
 * 2 usage error; 130 cancelled or interrupted. Single-threaded; SIGINT and SIGTERM only count in
 * ctl_interrupts (after ctl_catch_interrupts), which the waits notice (zmq_poll returns EINTR).
 */
#ifndef FSDP_CTL_CLIENT_H
#define FSDP_CTL_CLIENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_conn.h"
#include "fsdp.pb-c.h"
#include "jobspec.h"

#define EXIT_USAGE 2
#define EXIT_CANCELLED 130
#define POLL_MS 500   /* status and log polling while following (display only) */

/* Options every daemon command shares. */
typedef struct ctl_common_opts {
  const char *ctl;
  int json;
} ctl_common_opts;

enum {
  OPT_CTL = 1000, OPT_JSON, OPT_HELP, OPT_FOLLOW, OPT_RANK, OPT_EVENTS, OPT_LIMIT, OPT_STATE_DIR, OPT_KEEP,
  OPT_LOG_LEVEL
};

typedef struct ctl_client {
  char endpoint[1024];
  ctl_conn *conn;
  const char *daemon_log;   /* run: the private daemon's log, named when the daemon is lost */
  int lost;                 /* run: the private daemon went away during a call */
} ctl_client;

extern volatile sig_atomic_t ctl_interrupts;
/* Count SIGINT and SIGTERM in ctl_interrupts instead of dying (no SA_RESTART). */
void ctl_catch_interrupts(void);
/* Print "fsdpctl: MESSAGE" on stderr, one line (control characters escaped: oneline.h); returns 1. */
int ctl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "fsdpctl: MESSAGE" on stderr, one line (control characters escaped), for a warning. */
void ctl_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "fsdpctl CMD: WHAT" and the usage line; returns EXIT_USAGE. */
int ctl_usage_error(const char *cmd, const char *usage, const char *what);
int ctl_parse_job_id(const char *cmd, const char *usage, const char *s, uint64_t *id);
double ctl_wall_now(void);
double ctl_mono_ms(void);
/* Wait MS milliseconds for nothing in particular (display polling); a signal ends it early. */
void ctl_pause_ms(int ms);

/* Connect to FLAG (or $FSDP_CTL, or the default endpoint); 0 or the exit status. */
int ctl_client_open(ctl_client *cl, const char *flag);
void ctl_client_close(ctl_client *cl);
/* One request; on success *REPLY has body EXPECT. Prints the one-line reason and returns the exit
 * status otherwise (1, or 130 when interrupted). JOB_ID (or 0) names the job in "no job N". */
int ctl_client_call(ctl_client *cl, Fsdp__Msg *req, Fsdp__Msg__BodyCase expect, uint64_t job_id, int timeout_ms,
                    Fsdp__Msg **reply);
/* A whole one-request command: open FLAG, call, hand the reply to PRINT (may be NULL), close. */
int ctl_client_request(const char *flag, Fsdp__Msg *req, Fsdp__Msg__BodyCase expect, uint64_t job_id,
                       void (*print)(const Fsdp__Msg *reply, void *arg), void *arg);
int ctl_client_status(ctl_client *cl, uint64_t id, Fsdp__Msg **reply);
/* Stop job ID: the daemon lets it save a checkpoint first when it makes them, else cancels it. */
int ctl_client_stop(ctl_client *cl, uint64_t id);
int ctl_client_submit(ctl_client *cl, char *text, char *abs, char *dir, uint64_t *id);

/* Load and check the job file locally, then read its text (malloc'd), absolute path and directory. */
int ctl_load_job_file(const char *path, jobspec_t *spec, char **text, char *abs, size_t absn, char *dir, size_t dirn);

#endif
