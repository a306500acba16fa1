/* planfit — the planner's answer to "what batch fits on my GPUs, and what should I turn on?"
 * (`fsdpctl plan JOB.ini --device-memory BYTES --fit`). Built on the memory model of plan.h: the
 * largest per-rank batch_size whose predicted peak fits BYTES at the job's world size, sharding,
 * dtypes, checkpointing and offload, and the same answer for each single change that would let a
 * larger batch fit. Pure functions of their arguments; any thread. */
#ifndef FSDP_PLANFIT_H
#define FSDP_PLANFIT_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "jobspec.h"

#define PLANFIT_MAX_BATCH 4096   /* jobspec's batch_size range */
#define PLANFIT_MAX_LEVERS 6

typedef struct plan_lever {
  char change[96];        /* "activation_checkpointing = full", "world_size = 16", ... */
  int batch_size;         /* the largest batch that fits with this change alone (0: none) */
} plan_lever;

typedef struct plan_fit {
  uint64_t device_bytes;
  int world;
  int batch_size;         /* the largest per-rank batch that fits as configured (0: none) */
  uint64_t bytes_at_batch; /* the predicted peak at batch_size (or at 1 when nothing fits) */
  uint64_t missing;       /* nothing fits: bytes over device_bytes at batch 1 */
  int nlevers;
  plan_lever levers[PLANFIT_MAX_LEVERS];   /* only changes that fit a larger batch */
} plan_fit;

/* The largest batch in 1..PLANFIT_MAX_BATCH for which SPEC (its batch_size replaced) fits
 * DEVICE_BYTES per rank at WORLD ranks (≤ 0: spec->world_size); 0 if none. */
int plan_max_batch(const jobspec_t *spec, int world, uint64_t device_bytes);
fsdp_status plan_fit_compute(const jobspec_t *spec, int world, uint64_t device_bytes, plan_fit *out);
void plan_fit_print(const plan_fit *f, FILE *out);
/* {"batch_size": B, "device_memory": BYTES, "world": N, "bytes": ..., "missing_bytes": ...,
 *  "levers": [{"change": "...", "batch_size": B'}, ...]} (new reference). */
json_t *plan_fit_json(const plan_fit *f);

#endif
