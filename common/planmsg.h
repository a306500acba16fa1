/* planmsg — the plan on the wire: plan_t ⇄ the fsdp.Plan protobuf message.
 *
 * The coordinator builds the plan once and sends it in every worker_setup (planmsg_new); a worker
 * builds its own from the resolved job it was sent (jobresolve.h) for the fields the message does not
 * carry (memory model, FLOPs)
 * and refuses to run unless every unit, tensor, offset and shard of the two agree, and the model
 * math the units do not show (tie, norm eps, rotary base and scaling: PlanModel) too (planmsg_check),
 * so that a coordinator and a worker of different versions can never disagree silently about where
 * an element lives. planmsg_new allocates a tree owned by the caller (planmsg_destroy).
 */
#ifndef FSDP_PLANMSG_H
#define FSDP_PLANMSG_H

#include "fsdp.pb-c.h"
#include "plan.h"

fsdp_status planmsg_new(const plan_t *p, Fsdp__Plan **out);
void planmsg_destroy(Fsdp__Plan **m);
/* FSDP_OK when M describes exactly P's units, tensors and shards; otherwise names the first difference. */
fsdp_status planmsg_check(const Fsdp__Plan *m, const plan_t *p);

#endif
