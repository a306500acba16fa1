/* ctl_follow — see ctl_follow.h. */
#include "ctl_follow.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctl_fmt.h"
#include "wire.h"

#define CANCEL_WAIT_MS 20000   /* after Ctrl-C in run: how long the job may take to stop */

typedef struct progress {
  int tty;
  double t0_ms;           /* first observation while running, for the ETA */
  unsigned step0;
  int last_decile;        /* non-tty: printed up to this tenth */
  double last_print_ms;
  unsigned last_printed_step;
  Fsdp__JobState last_state;
  int drew;               /* tty: a line is on screen without its newline */
} progress;

static void progress_show(progress *p, const Fsdp__JobInfo *j, int final) {
  double now = ctl_mono_ms();
  if (j->state == FSDP__JOB_STATE__RUNNING && p->t0_ms == 0) {
    p->t0_ms = now;
    p->step0 = j->step;
  }
  double eta = -1;
  if (p->t0_ms > 0 && j->step > p->step0 && now > p->t0_ms) {
    double rate = (double)(j->step - p->step0) / ((now - p->t0_ms) / 1e3);   /* steps/s seen here */
    eta = (double)(j->steps - j->step) / rate;
  } else if (j->step > 0 && j->started_at > 0) {
    /* the daemon's clock: only until we have our own rate */
    eta = ctl_fmt_eta(j->step, j->steps, j->start_step, ctl_wall_now() - j->started_at);
  }
  if (j->state != FSDP__JOB_STATE__RUNNING) eta = NAN;   /* not started, or ended: no ETA */
  char line[512];
  ctl_fmt_progress(line, sizeof line, j->step, j->steps, j->step ? j->loss : 0, j->val_step ? j->val_loss : 0, j->tokens_per_s, eta, p->tty ? 30 : 20);
  if (j->state != FSDP__JOB_STATE__RUNNING) {
    size_t l = strlen(line);
    snprintf(line + l, sizeof line - l, "  (%s)", ctl_fmt_state(j->state));
  }
  if (p->tty) {
    printf("\r%s\033[K", line);
    if (final) printf("\n");
    p->drew = !final;
    fflush(stdout);
    return;
  }
  /* Not a terminal: a line per tenth of the run, per 5 s of progress, and per state change. */
  int decile = j->steps ? (int)(10ull * j->step / j->steps) : 0;
  int print = final || j->state != p->last_state || decile > p->last_decile ||
              (now - p->last_print_ms >= 5000 && j->step != p->last_printed_step);
  if (print) {
    printf("%s\n", line);
    fflush(stdout);
    p->last_decile = decile;
    p->last_print_ms = now;
    p->last_printed_step = j->step;
    p->last_state = j->state;
  }
}

static void progress_break(progress *p) {
  if (p->tty && p->drew) {
    printf("\n");
    fflush(stdout);
    p->drew = 0;
  }
}

/* Poll job ID until it ends. Returns 0 with *res filled when the job reached a final state, else
 * the exit status (the reason printed). DETACH: a Ctrl-C stops following (130). CANCEL: a Ctrl-C
 * cancels the job and keeps following until it stops (a second Ctrl-C, or CANCEL_WAIT_MS, gives up). */
int ctl_follow_job(ctl_client *cl, uint64_t id, ctl_follow_mode mode, ctl_follow_result *res) {
  memset(res, 0, sizeof *res);
  res->first_loss = NAN;
  res->last_loss = NAN;
  progress p = {0};
  p.tty = isatty(STDOUT_FILENO);
  p.last_decile = -1;
  p.last_state = FSDP__JOB_STATE__JOB_STATE_UNSPECIFIED;
  int cancel_sent = 0;
  double cancel_deadline = 0;
  for (;;) {
    if (ctl_interrupts) {
      progress_break(&p);
      if (mode == CTL_FOLLOW_DETACH) {
        ctl_fail("stopped following job %llu; it keeps running (`fsdpctl cancel %llu` stops it)", (unsigned long long)id,
             (unsigned long long)id);
        return EXIT_CANCELLED;
      }
      if (!cancel_sent) {
        ctl_interrupts = 0;
        fprintf(stderr, "fsdpctl: stopping job %llu (with a checkpoint if it makes them; Ctrl-C again to stop waiting)\n",
                (unsigned long long)id);
        ctl_client_stop(cl, id);   /* if it fails (the job just ended), following shows how it ended */
        cancel_sent = 1;
        cancel_deadline = ctl_mono_ms() + CANCEL_WAIT_MS;
      } else {
        ctl_fail("gave up waiting for job %llu to stop", (unsigned long long)id);
        return EXIT_CANCELLED;
      }
    }
    if (cancel_sent && ctl_mono_ms() > cancel_deadline) {
      progress_break(&p);
      ctl_fail("job %llu did not stop within %d s of being cancelled", (unsigned long long)id, CANCEL_WAIT_MS / 1000);
      return EXIT_CANCELLED;
    }
    Fsdp__Msg *m = NULL;
    int rc = ctl_client_status(cl, id, &m);
    if (rc == EXIT_CANCELLED && ctl_interrupts) continue;   /* the Ctrl-C interrupted the call: handle it above */
    if (rc != 0) {
      progress_break(&p);
      return rc;
    }
    const Fsdp__JobInfo *j = m->status_resp;
    if (j->step > 0 && isnan(res->first_loss)) res->first_loss = j->loss;
    int final = ctl_fmt_state_is_final(j->state);
    progress_show(&p, j, final);
    if (final) {
      res->state = j->state;
      res->step = j->step;
      res->steps = j->steps;
      res->last_loss = j->step ? j->loss : NAN;
      res->tokens_per_s = j->tokens_per_s;
      res->elapsed_s = j->started_at > 0 && j->finished_at > j->started_at ? j->finished_at - j->started_at : -1;
      snprintf(res->reason, sizeof res->reason, "%s", j->reason ? j->reason : "");
      snprintf(res->job_dir, sizeof res->job_dir, "%s", j->job_dir ? j->job_dir : "");
      snprintf(res->name, sizeof res->name, "%s", j->name ? j->name : "");
      wire_destroy(&m);
      return 0;
    }
    wire_destroy(&m);
    ctl_pause_ms(POLL_MS);
  }
}

/* The exit status of a followed job, with its one line on stderr when it did not succeed. */
int ctl_follow_exit_status(uint64_t id, const ctl_follow_result *r, const char *extra) {
  switch (r->state) {
  case FSDP__JOB_STATE__SUCCEEDED: return 0;
  case FSDP__JOB_STATE__CANCELLED:
    ctl_fail("job %llu was cancelled%s%s%s", (unsigned long long)id, r->reason[0] ? ": " : "", r->reason, extra ? extra : "");
    return EXIT_CANCELLED;
  default:
    ctl_fail("job %llu failed: %s%s", (unsigned long long)id, r->reason[0] ? r->reason : "no reason given", extra ? extra : "");
    return 1;
  }
}
