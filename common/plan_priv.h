/* plan_priv — what plan.c (the shared model, GPT-2's units) and plan_llama.c (Llama's units and
 * activation terms) share. Not for other modules: they use plan.h. */
#ifndef FSDP_PLAN_PRIV_H
#define FSDP_PLAN_PRIV_H

#include "plan.h"

/* Append tensor NAME of shape [d0] (d1 = 0) or [d0, d1] to U at its current end; 2-D decays. */
void plan_add_tensor(plan_unit *u, const char *name, int gid, int64_t d0, int64_t d1);

/* Llama: element counts of the root and of one decoder layer, the activation terms (plan.h's
 * plan_act, Llama's lines), and the units' tensors (p->units allocated, p->model set). */
int64_t plan_llama_root_numel(const model_config *m);
int64_t plan_llama_block_numel(const model_config *m);
plan_act plan_llama_act(const model_config *m, int B, device_kind dev, ackpt_mode ackpt);
void plan_llama_units(plan_t *p);
/* A hand-built model's rope scaling in range (jobspec refuses a job file's with its line). */
fsdp_status plan_llama_check_rope(const model_config *m);
/* NAME with or without "model."; NULL if the plan has no such tensor. */
const plan_tensor *plan_llama_find(const plan_t *p, const char *name, int *unit);

#endif
