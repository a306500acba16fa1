/* reduce — how a unit's gradient reaches its owners (FSDP2's foreach_reduce): the buffers a
 * unit's gradient is computed in, the reduce-scatter into this rank's gradient shard in
 * reduce_dtype with accumulation over micro-steps, hybrid's all-reduce of each final shard across
 * the groups, and sharding none's all-reduce of the whole gradient (docs/runtime.md).
 *
 *   reduce_dtype fp32: two block buffers alternate (computing one overlaps reducing the other) and
 *     are reduce-scattered straight into the shard; from the second micro-step on, a rank first
 *     adds its accumulated shard into its own block of the send buffer, so the sum it receives is
 *     the new total. Hybrid's replica all-reduce runs in place on the shard, after the
 *     reduce-scatter that wrote it.
 *   reduce_dtype bf16: the gradient (one fp32 block buffer) is rounded into one of two bf16 send
 *     buffers, reduce-scattered into a bf16 receive buffer, and added to the fp32 shard once it
 *     has arrived (accumulation stays fp32, after the reduction, as PyTorch FSDP does): when the
 *     buffer is next needed, or at reduce_finish. Hybrid's and none's all-reduces go through a
 *     bf16 copy of the shard that is added back at the end.
 *   sharding none: a unit's gradient is computed straight into the shard, accumulating over the
 *     micro-steps, and all-reduced once per step, as soon as its last backward is done.
 *
 * The reducer owns those buffers (allocated once, in reduce_new: MEM_COMM) and its events; it
 * borrows the gradient shard, the communicators and the step's request table. Everything it
 * submits is ordered against the device's compute stream by events; one thread (the runtime's).
 */
#ifndef FSDP_REDUCE_H
#define FSDP_REDUCE_H

#include "comm.h"
#include "device.h"
#include "plan.h"
#include "reqs.h"

typedef struct reducer reducer;

/* GRAD: this rank's fp32 gradient shard (p->shard_total floats, device memory). COMM: the world's
 * communicator (none's all-reduces; the reduce-scatters until reduce_set_comms). Borrowed. */
fsdp_status reduce_new(const plan_t *p, int rank, device_t *d, float *grad, comm_t *comm, reqs *q, reducer **out);
/* sharding = hybrid: reduce-scatters on GROUP, each final shard across the groups on REPLICA. */
void reduce_set_comms(reducer *r, comm_t *group, comm_t *replica);
/* A micro-step starts: ACCUMULATE when the shard holds earlier micro-steps' sums, LAST for the
 * step's last micro-step (none's and hybrid's all-reduces run in it). */
void reduce_begin(reducer *r, int accumulate, int last);
/* The buffer unit U's gradient is computed into (+=), zeroed where it must be: the root's own, the
 * next of the two block buffers once the reduction that last read it is done, or (sharding none)
 * the unit's part of the shard. Submitted to the stream. */
fsdp_status reduce_buffer(reducer *r, int u, float **g);
/* Unit U's gradient in G (from reduce_buffer; for a block, the buffer last handed out) is complete
 * on the stream: reduce it. Asynchronous; its request joins the step's table. */
fsdp_status reduce_issue(reducer *r, int u, float *g);
/* After the micro-step's last reduce_issue: the stream waits until the shard holds every sum
 * (and in the last micro-step, for hybrid and none, the all-reduced sums), so that the next
 * micro-step or the optimizer can read it. */
fsdp_status reduce_finish(reducer *r);
/* The stream must be idle and no reduction in flight. NULL-safe; *r becomes NULL. */
void reduce_destroy(reducer **r);

#endif
