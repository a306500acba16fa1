/* kv — the rendezvous store that a job's workers use to exchange their collective bootstrap
 * (gloo addresses, the NCCL unique id): kv_set stores a value, kv_get answers it, or parks the
 * request until the kv_set that creates the key arrives.
 *
 * Keys live under the job attempt's prefix ("job-ID/", "job-ID/aN/" for restart N), so attempts and
 * jobs never see each other's keys. When a job ends its keys are dropped and parked gets are
 * answered with an error. Loop thread only.
 */
#ifndef FSDP_DAEMON_KV_H
#define FSDP_DAEMON_KV_H

#include "coord_core.h"

/* A kv_set or kv_get from a worker of job JOB_ID, whose keys live under PREFIX (its attempt's
 * namespace; a key given without it gets it). */
void kv_on_set(coord_t *c, const wire_env *env, uint64_t job_id, const char *prefix, const Fsdp__KvSet *s);
void kv_on_get(coord_t *c, const wire_env *env, uint64_t job_id, const char *prefix, const Fsdp__KvGet *g);
/* Drop every key of job JOB_ID and answer its parked gets with error{CANCELLED, WHY}. */
void kv_drop_job(coord_t *c, uint64_t job_id, const char *why);
/* Free every key and parked get (the daemon is going away; nothing is answered). */
void kv_destroy_all(coord_t *c);

#endif
