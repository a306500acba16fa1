/* jobresolve — a job resolved once: the one place where a parsed job file becomes what its ranks run.
 *
 * Resolving is two calls. jobspec_parse (or jobspec_load) reads the file: the key table's defaults,
 * from = DIR's config.json keys and weights, absolute paths; it reads the files the job names, so
 * the coordinator runs it as the job's owner (daemon/asuser.c). jobresolve_place then derives what
 * depends on where the job runs, and reads no file: world_size becomes the world it runs at,
 * sharding = hybrid without shard_group takes the placement's ranks per node, comm = auto becomes
 * the backend (nccl on cuda, gloo on cpu) unless each rank chooses for itself (standalone), and the
 * plan is built. The result, a jobspec_t in which no key is left to a default or to a later choice
 * and its plan, is what the coordinator sends its workers (jobspec_canonical_write: every key
 * explicit) and what `fsdpctl plan` prints; a worker reads it back (jobspec_canonical_read) and
 * re-derives nothing. Plain functions on the caller's data: any thread, no state.
 */
#ifndef FSDP_JOBRESOLVE_H
#define FSDP_JOBRESOLVE_H

#include "jobspec.h"
#include "plan.h"

/* Where the job runs, as far as its caller knows. */
typedef struct jobresolve_place {
  int world;            /* ranks; 0: the file's [fsdp] world_size */
  int ranks_per_node;   /* sharding = hybrid without shard_group: its G; 0: none known (an error then) */
  int comm_per_rank;    /* 1: comm = auto stays auto, each rank choosing by its visible GPUs (standalone) */
} jobresolve_place;

/* S, as parsed, resolved for PL in place, and its plan into *PLAN (the caller's; plan_destroy). On an
 * error S may be half resolved and *PLAN is NULL; the message says what is wrong. */
fsdp_status jobresolve_place_job(jobspec_t *s, const jobresolve_place *pl, plan_t **plan);

/* The comm backend a resolved job's ranks open: "nccl" or "gloo"; NULL while comm is still auto. */
const char *jobresolve_comm_name(const jobspec_t *s);

#endif
