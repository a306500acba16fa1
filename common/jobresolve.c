/* jobresolve — the placement-dependent part of resolving a job; see jobresolve.h. */
#include "jobresolve.h"

fsdp_status jobresolve_place_job(jobspec_t *s, const jobresolve_place *pl, plan_t **plan) {
  *plan = NULL;
  if (pl->world > 0) s->world_size = pl->world;
  if (s->sharding == SHARD_HYBRID && s->shard_group == 0 && pl->ranks_per_node > 0) s->shard_group = pl->ranks_per_node;
  /* the coordinator's rule: one GPU per rank, so NCCL; a standalone rank looks at its own GPUs */
  if (s->comm == COMM_AUTO && !pl->comm_per_rank) s->comm = s->device == DEVICE_CUDA ? COMM_NCCL : COMM_GLOO;
  return plan_build(s, s->world_size, plan);
}

const char *jobresolve_comm_name(const jobspec_t *s) {
  return s->comm == COMM_AUTO ? NULL : jobspec_comm_kind_name(s->comm);
}
