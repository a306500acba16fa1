/* comm_hybrid — hybrid sharding's group and replica communicators; see comm_hybrid.h. */
#include "comm_hybrid.h"

#include <stdio.h>
#include <string.h>

#include "comm_boot.h"
#include "log.h"

#ifdef FSDP_HAVE_CUDA
static fsdp_status nccl_id(void *ctx, uint8_t id[COMM_BOOT_ID_BYTES]) {
  (void)ctx;
  return comm_nccl_get_unique_id(id);
}

/* One NCCL sub-communicator: split from WORLD, or from an id of its own through the store. */
static fsdp_status open_nccl(comm_t *world, const comm_hybrid_args *a, const char *name, int color, int key, int n,
                             comm_t **out) {
  fsdp_status rc = comm_nccl_split(world, color, key, n, out);
  if (rc != FSDP_ERR_UNSUPPORTED) return rc;
  comm_kv dir_kv = a->store_dir ? comm_dir_kv(a->store_dir) : (comm_kv){0};
  const comm_kv *kv = a->store_dir ? &dir_kv : a->kv;
  char k[256];
  snprintf(k, sizeof k, "%snccl-%s-%d", a->prefix ? a->prefix : "", name, color);
  uint8_t id[COMM_BOOT_ID_BYTES];
  TRY(comm_boot_exchange_id(kv, k, key, a->timeout_s, nccl_id, NULL, id));
  return comm_new_nccl(key, n, id, a->device, a->timeout_s, out);
}
#endif

/* One sub-communicator NAME-COLOR of N ranks in which this rank is KEY, of WORLD's backend. */
static fsdp_status open_sub(comm_t *world, const comm_hybrid_args *a, const char *name, int color, int key, int n,
                            comm_t **out) {
  const char *be = comm_backend_name(world);
  char prefix[256];
  snprintf(prefix, sizeof prefix, "%s%s%s-%d/", a->prefix ? a->prefix : "fsdp", a->prefix ? "" : "/", name, color);
#ifdef FSDP_HAVE_CUDA
  if (!strcmp(be, "nccl")) return open_nccl(world, a, name, color, key, n, out);
  if (!strcmp(be, "gloo-staged"))
    return comm_new_gloo_staged(key, n, a->store_dir, a->kv, prefix, a->timeout_s, a->device, a->stage_bytes, out);
#endif
  if (strcmp(be, "gloo") != 0)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "sharding = hybrid: no sub-communicators for the %s backend", be);
  return comm_new_gloo(key, n, a->store_dir, a->kv, prefix, a->timeout_s, out);
}

fsdp_status comm_hybrid_open(comm_t *world, const comm_hybrid_args *a, comm_t **group, comm_t **replica) {
  *group = *replica = NULL;
  int G = a->group;
  if (G < 1 || a->world % G || a->rank < 0 || a->rank >= a->world)
    return fsdp_set_error(FSDP_ERR_INVALID, "comm_hybrid_open: rank %d, world %d, group %d; the group must divide the "
                          "world", a->rank, a->world, G);
  int R = a->world / G;
  TRY(open_sub(world, a, "group", a->rank / G, a->rank % G, G, group));
  fsdp_status rc = open_sub(world, a, "shard", a->rank % G, a->rank / G, R, replica);
  if (rc != FSDP_OK) {
    comm_destroy(group);
    return rc;
  }
  log_debug("rank %d: hybrid group %d (rank %d of %d), shard %d across %d groups (rank %d)", a->rank, a->rank / G,
            a->rank % G, G, a->rank % G, R, a->rank / G);
  return FSDP_OK;
}
