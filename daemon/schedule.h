/* schedule — scheduling and placement: which queued job starts, on which devices.
 *
 * Jobs start first-in, first-out: the oldest queued job starts when enough devices of its kind are
 * free, and later ones wait behind it. Ranks are packed by node: the nodes with the most free
 * devices of the kind first, consecutive ranks on the same node; a hybrid job's shard groups whole on
 * a node first (a group split across nodes is said in the job's log). Starting a job assigns its slots,
 * makes its worker token and rendezvous prefix, and sends one spawn_req per rank to the agents.
 *
 * Host memory: a job with [fsdp] offload = optimizer pins plan.host_bytes of host memory per rank, so
 * a node takes at most as many of its ranks as the host memory its agent reported (AgentRegister
 * host_mem_bytes, less SCHEDULE_HOST_RESERVE_PCT, less what offload ranks already placed there pin)
 * holds. A node that reported none (0) is not limited.
 * Loop thread only.
 */
#ifndef FSDP_DAEMON_SCHEDULE_H
#define FSDP_DAEMON_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "coord_core.h"

/* The share of a node's reported host memory that placement never hands to offloaded state: the OS,
 * the agent, the workers' own heap and data readers, the CUDA context and driver live there. */
#define SCHEDULE_HOST_RESERVE_PCT 10

/* HOST_MEM less the reserve: what offloaded state may pin on a node that reported HOST_MEM. */
uint64_t schedule_host_usable(uint64_t host_mem);
/* The ranks of HOST_BYTES each that fit on a node that reported HOST_MEM of host memory, of which
 * USED is already pinned by offload ranks placed there: (usable − USED) / HOST_BYTES, 0 when none.
 * INT_MAX when nothing limits them: HOST_BYTES 0 (no offload) or HOST_MEM 0 (the node reported none). */
int schedule_host_ranks(uint64_t host_mem, uint64_t used, uint64_t host_bytes);

/* The ranks of J the live cluster can place now: each node's free devices of J's kind, for an offload
 * job at most as many per node as schedule_host_ranks allows next to the offload ranks already there.
 * J starts when this reaches its world size (and J heads the queue). */
int schedule_room(const coord_t *c, const job_t *j);

/* Start every queued job that can start now, in order. */
void schedule_try(coord_t *c);
/* Whether J can ever run on the live cluster: enough devices of its kind, its plan fits the smallest
 * of them, and (offload) the nodes' host memory holds its ranks' offloaded state. Otherwise the
 * reason, for the user, in MSG (FSDP_ERR_RANGE). */
fsdp_status schedule_fit(const coord_t *c, const job_t *j, char *msg, size_t n);
/* Hybrid without shard_group (J->auto_group), as J starts: G becomes the ranks per node of the live
 * cluster, J's plan is rebuilt with it and checked as at submit (schedule_fit: a smaller group holds
 * more per rank). FSDP_OK, J unchanged when G is; else the reason for the user in MSG and J unchanged
 * (schedule_try fails it: it cannot run on this cluster). */
fsdp_status schedule_regroup(const coord_t *c, job_t *j, char *msg, size_t n);

#endif
