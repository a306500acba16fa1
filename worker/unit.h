/* unit — the FSDP unit as a type (FSDP2's FSDPParamGroup): one unit of the plan (the root, or one
 * transformer block), where its gathered parameters are, the pool slot they occupy, the event that
 * says its gather has arrived, and the buffer its gradient is computed in; and the four verbs of
 * its life in a step (docs/runtime.md):
 *
 *   unit_gather   unshard: all-gather the unit's shard into a free pool slot, once the slot's last
 *                 reader is done; asynchronous (FSDP2's unshard);
 *   unit_wait     the stream waits for that gather; the parameters in compute form (wait_for_unshard);
 *   unit_release  after the last compute that reads them: the slot may be gathered into again (reshard);
 *   unit_reduce   its gradient, complete on the stream, goes to its owners (post_backward), through
 *                 the reducer (reduce.h, FSDP2's foreach_reduce);
 * and unit_grad, the gradient buffer for its backward (the reducer's). A [lora] job's frozen root is
 * gathered in parts instead (unit_gather_root_part): what the lookup reads, released after it, and
 * what the head reads, released after the head, into one buffer of the larger part.
 *
 * The pool (unit_pool) is what the units share: the gather buffers, allocated once (the root's
 * own, and 1 + prefetch block slots of the largest block's size for full and hybrid, one per block
 * for grad_op: release hands a slot back, so the `gathered` memory is exactly the plan's), the
 * compute-form copies (one for the root, one for the block being computed) where the compute dtype
 * differs from param_dtype, and the units themselves. With sharding none nothing is gathered:
 * gather and release do nothing and wait gives the unit's part of the (whole-model) shard.
 *
 * An NF4 base ([lora] base_dtype = nf4, nf4_base.h): the blocks' shards are byte images, gathered as
 * bytes into slots of nf4_padded bytes, and wait dequantizes the gathered image into the pool's one
 * bf16 working unit (then the compute-form copy, where the compute dtype is not bf16); the root is
 * gathered in bf16 as a bf16 base's.
 *
 * The pool borrows the device, the communicator, the gather source (the shard in param_dtype), the
 * reducer and the step's request table, which must outlive it. One thread (the runtime's); every
 * verb only submits: the device's stream and the communicator run the work, ordered by events.
 */
#ifndef FSDP_UNIT_H
#define FSDP_UNIT_H

#include "comm.h"
#include "device.h"
#include "plan.h"
#include "reduce.h"
#include "reqs.h"

typedef struct unit_pool unit_pool;

/* A gather buffer of the pool; FREE is recorded after its last reader. */
typedef struct unit_slot {
  void *buf;                 /* param_dtype elements (an NF4 block's: bytes) */
  int unit;                  /* the unit gathered into it, or -1 */
  dev_event *free;
} unit_slot;

typedef struct fsdp_unit {
  int id;                    /* its index in the plan: 0 the root, 1..L the blocks */
  const plan_unit *pu;
  unit_pool *pool;
  void *gathered;            /* its gathered parameters while gathered, else NULL */
  unit_slot *slot;           /* the pool slot they are in (the root: its own) */
  dev_event *arrived;        /* its gather has completed */
  float *grad;               /* its gradient during its backward (unit_grad to unit_reduce), else NULL */
} fsdp_unit;

/* The pool and p->nunits units (*UNITS, owned by the pool). COMM gathers (the world's; hybrid's
 * group after unit_pool_set_comm); SHARD: this rank's shard in param_dtype (device memory); NF4: an
 * NF4 base's block shards (L·nf4_shard bytes, SHARD then holds the root's only), else NULL. */
fsdp_status unit_pool_new(const plan_t *p, device_t *d, comm_t *comm, const void *shard, const uint8_t *nf4,
                          reducer *red, reqs *q, unit_pool **out, fsdp_unit **units);
void unit_pool_set_comm(unit_pool *pool, comm_t *group);
/* Tests only: unit_wait of a block skips the stream's wait for its gather (runtime_test_drop_gather_wait). */
void unit_pool_test_drop_wait(unit_pool *pool, int on);
/* The stream must be idle and no gather in flight. NULL-safe; *pool becomes NULL. */
void unit_pool_destroy(unit_pool **pool);

fsdp_status unit_gather(fsdp_unit *u);
/* [lora] (p->lora.rank, sharding ≠ none): gather part PART of the frozen root U (plan_root_part) into
 * the root's buffer: each rank's part of its shard added to zeros, all-reduced in place (the parts
 * are not shard-aligned); asynchronous, as unit_gather. unit_wait then gives the root's compute form
 * valid over that part only, and unit_release frees the buffer for the other part. */
fsdp_status unit_gather_root_part(fsdp_unit *u, int part);
const void *unit_wait(fsdp_unit *u);
void unit_release(fsdp_unit *u);
/* u->grad: a buffer for the gradient its backward accumulates (+=), from the reducer. */
fsdp_status unit_grad(fsdp_unit *u);
/* After its backward: reduce u->grad; u->grad becomes NULL. */
fsdp_status unit_reduce(fsdp_unit *u);

#endif
