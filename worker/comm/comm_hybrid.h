/* comm_hybrid — the two sub-communicators of sharding = hybrid (docs/comm.md): one per shard group
 * (G consecutive ranks: rank r is rank r mod G of group r / G; gathers and reduce-scatters) and one
 * per shard index across the groups (rank r is rank r / G among the ranks r mod G, r mod G + G, ...:
 * the cross-group all-reduce of each shard's gradient).
 *
 * Each is a new comm of the same backend as the world's: gloo (and gloo staged) rendezvous over the
 * same store under their own prefix ("PREFIXgroup-K/", "PREFIXshard-J/") with group-local ranks;
 * NCCL splits the world's communicator (ncclCommSplit) or, before NCCL 2.18, makes each from a
 * unique id of its own exchanged through the store ("PREFIXnccl-group-K", "PREFIXnccl-shard-J").
 * Every rank creates the group comm first, then the replica comm. The caller owns both results
 * (comm_destroy), and destroys them before the world's comm. Worker main thread, at startup.
 */
#ifndef FSDP_COMM_HYBRID_H
#define FSDP_COMM_HYBRID_H

#include "comm.h"

typedef struct comm_hybrid_args {
  int rank, world, group;     /* this rank, N, G (G divides N) */
  const char *store_dir;      /* the world's rendezvous: a directory or the KV, as for comm_new_gloo */
  const comm_kv *kv;
  const char *prefix;         /* the world's prefix; NULL: "fsdp" */
  double timeout_s;
  int device;                 /* the GPU of gloo staged and NCCL comms; -1 for CPU workers */
  size_t stage_bytes;         /* gloo staged's pinned buffer (plan_stage_bytes) */
} comm_hybrid_args;

/* Open this rank's group and replica comms next to WORLD (borrowed; NCCL splits it). */
fsdp_status comm_hybrid_open(comm_t *world, const comm_hybrid_args *a, comm_t **group, comm_t **replica);

#endif
