/* steps — the step pipeline of a running job: two steps in flight, reports collected per step,
 * one metrics.jsonl line and one database row per completed step, then the stop.
 *
 * When every rank is ready (steps_on_ready) steps start_step+1 and +2 are sent at once; when all
 * reports of step s are in, step s+2 is sent. Reports are kept in two buffers (step mod 2); a
 * report outside the steps in flight, from the wrong rank, or a duplicate is logged and ignored.
 * After the last step every rank gets stop_cmd. Loop thread only.
 */
#ifndef FSDP_DAEMON_STEPS_H
#define FSDP_DAEMON_STEPS_H

#include "coord_core.h"

/* Rank R of J is ready to train from RD->start_step; the last one starts the steps. */
void steps_on_ready(coord_t *c, job_t *j, int r, const Fsdp__WorkerReady *rd);
/* A step report from rank R; takes *MP when it keeps it. */
void steps_on_report(coord_t *c, job_t *j, int r, Fsdp__Msg **mp);

#endif
