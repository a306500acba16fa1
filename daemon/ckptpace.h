/* ckptpace — what an asynchronous checkpoint write costs the steps it overlaps, from the job's step
 * times as the coordinator records them (metrics.jsonl's checkpoint line, docs/observability.md).
 *
 * A save of step S that the report of step C completes (C > S) was written while steps S+1..C ran:
 * their mean step time against the mean of the latest CKPTPACE_BASE steps before the save that no
 * write overlapped is the steps' slowdown while the write was in flight. The first step of an
 * attempt is left out of that baseline (its warm-up: first-touch of the buffers, the first
 * gathers). The step times are the slowest rank's; they exclude the time a save blocked training
 * (the worker times the step apart from its save), so a synchronous save overlaps no step.
 * Owned by the job's step pipeline (steps.c), one per attempt; loop thread only; no I/O. */
#ifndef FSDP_DAEMON_CKPTPACE_H
#define FSDP_DAEMON_CKPTPACE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp.pb-c.h"

#define CKPTPACE_BASE 4   /* the baseline's steps: recent enough to share the write's conditions */

typedef struct ckptpace {
  uint32_t first;                  /* the attempt's first recorded step (0: none yet) */
  double base[CKPTPACE_BASE];      /* the latest step times no write overlapped, a ring */
  int nbase, next;
  uint32_t flight;                 /* the save whose write is in flight (0: none) */
  uint32_t flight_n;               /* the steps it overlapped so far, and their summed step time */
  double flight_ms;
  double before_ms;                /* the baseline's mean when that save began (0: none) */
} ckptpace;

/* Step STEP, recorded in order, took STEP_MS; SAVES: it saves a checkpoint; DONE[0..NDONE): the
 * saves its report completed, whose inflight_steps, inflight_step_ms and before_step_ms are set
 * (zero for a save that overlapped no step). A save of STEP that its own report does not complete
 * is in flight from then on. */
void ckptpace_step(ckptpace *p, uint32_t step, double step_ms, int saves, Fsdp__CkptSave *done, size_t ndone);

#endif
