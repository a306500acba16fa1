/* ctl_planout — `fsdpctl plan`'s output: a plan as a table for people and as JSON for scripts.
 * Called from fsdpctl's thread only. */
#ifndef FSDP_CTL_PLANOUT_H
#define FSDP_CTL_PLANOUT_H

#include <stdint.h>
#include <stdio.h>

#include "plan.h"

/* The human table (`fsdpctl plan`); DEVICE_BYTES > 0 adds whether it fits and the smallest world
 * that would. */
void ctl_plan_print(const plan_t *p, FILE *f, uint64_t device_bytes);
/* The same data as one JSON object (`fsdpctl plan --json`). */
fsdp_status ctl_plan_write_json(const plan_t *p, FILE *f, uint64_t device_bytes);

#endif
