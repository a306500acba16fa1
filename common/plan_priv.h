/* plan_priv — what plan.c (the shared model) and the architectures' descriptors (models/<name>/<name>_arch.c:
 * their units) share. Not for other modules: they use plan.h. */
#ifndef FSDP_PLAN_PRIV_H
#define FSDP_PLAN_PRIV_H

#include "plan.h"

/* Append tensor NAME of shape [d0] (d1 = 0) or [d0, d1] to U at its current end; 2-D decays. */
void plan_add_tensor(plan_unit *u, const char *name, int gid, int64_t d0, int64_t d1);
/* The same for rows [ROW0, ROW0 + D0) of the fused tensor NAME of HF_ROWS × D1 (plan_tensor.hf_rows);
 * add the parts one after another, in row order. */
void plan_add_part(plan_unit *u, const char *name, int gid, int64_t d0, int64_t d1, int64_t hf_rows, int64_t row0);

/* plan_lora.c: P's LoRA layout from SPEC's [lora] (P's model and units built), refusing an unknown
 * target or a rank above a target's width in one line; and its memory terms added to P's. */
fsdp_status plan_lora_build(const jobspec_t *spec, plan_t *p);
void plan_lora_memory(plan_t *p);
/* SENT (sharding MODE's) with LoRA: no reduce-scatter; the adapters' gradient all-reduced once per step;
 * an NF4 base's gathers in its bytes. */
void plan_lora_sent(const plan_t *p, shard_mode mode, uint64_t sent[COLL_NKIND]);

#endif
