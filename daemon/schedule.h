/* schedule — scheduling and placement: which queued job starts, on which devices.
 *
 * Jobs start first-in, first-out: the oldest queued job starts when enough devices of its kind are
 * free, and later ones wait behind it. Ranks are packed by node: the nodes with the most free
 * devices of the kind first, consecutive ranks on the same node; a hybrid job's shard groups whole on
 * a node first (a group split across nodes is said in the job's log). Starting a job assigns its slots,
 * makes its worker token and rendezvous prefix, and sends one spawn_req per rank to the agents.
 * Loop thread only.
 */
#ifndef FSDP_DAEMON_SCHEDULE_H
#define FSDP_DAEMON_SCHEDULE_H

#include <stddef.h>

#include "coord_core.h"

/* Start every queued job that can start now, in order. */
void schedule_try(coord_t *c);
/* Whether J can ever run on the live cluster: enough devices of its kind, and its plan fits the
 * smallest of them. Otherwise the reason, for the user, in MSG (FSDP_ERR_RANGE). */
fsdp_status schedule_fit(const coord_t *c, const job_t *j, char *msg, size_t n);
/* The ranks per node of a job of WORLD ranks of KIND packed as schedule_try packs them: the most
 * devices of KIND on one live node, at most WORLD (0 with none). Hybrid's default shard_group, taken
 * at submit (job_from_spec) and again when the job starts. */
int schedule_ranks_per_node(const coord_t *c, int kind, int world);
/* "GPUs" or "CPU slots". */
const char *schedule_kind_name(int kind);

#endif
