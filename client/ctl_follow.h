/* ctl_follow — following a job until it ends: the progress bar on a terminal (one line redrawn),
 * a line per tenth of the run, per 5 s and per state change elsewhere, and the exit status that
 * the job's final state maps to (0 succeeded, 1 failed, 130 cancelled).
 *
 * It polls the daemon's status every POLL_MS; Ctrl-C either stops following (DETACH: submit
 * --follow) or stops the job and keeps following until it ended (CANCEL: run). Single-threaded.
 */
#ifndef FSDP_CTL_FOLLOW_H
#define FSDP_CTL_FOLLOW_H

#include "ctl_client.h"

typedef enum { CTL_FOLLOW_DETACH, CTL_FOLLOW_CANCEL } ctl_follow_mode;

typedef struct ctl_follow_result {
  Fsdp__JobState state;
  double first_loss;    /* loss at the first step seen, NaN if none */
  double last_loss;
  unsigned step, steps;
  double tokens_per_s;
  double elapsed_s;     /* started_at → finished_at */
  char reason[1024];
  char job_dir[1024];
  char name[64];
} ctl_follow_result;

/* Poll job ID until it ends. Returns 0 with *RES filled when the job reached a final state, else
 * the exit status (the reason printed). DETACH: a Ctrl-C stops following (130). CANCEL: a Ctrl-C
 * stops the job (checkpointing first when it checkpoints) and keeps following until it ended (a
 * second Ctrl-C, or CANCEL_WAIT_MS, gives up). */
int ctl_follow_job(ctl_client *cl, uint64_t id, ctl_follow_mode mode, ctl_follow_result *res);
/* The exit status of a followed job, with its one line on stderr when it did not succeed; EXTRA
 * (may be NULL) is appended to that line. */
int ctl_follow_exit_status(uint64_t id, const ctl_follow_result *r, const char *extra);

#endif
