/* runtime — one rank's FSDP step executor (docs/design.md §4): gather a unit just before it is computed,
 * free it (back to the pool) right after, reduce-scatter its gradient to the owners, and update
 * only the local shard with AdamW.
 *
 * The runtime owns this rank's shards (parameters, gradients, AdamW m and v), the gather pool, the
 * unit-gradient buffers, the model's activations and the data reader; it borrows the plan, the spec
 * and the communicator, which must outlive it. Sharding full, grad_op, none and hybrid run one code
 * path with different plans: full re-gathers blocks for backward, grad_op keeps them gathered from
 * forward to backward, none computes straight on the (whole-model) shard and all-reduces gradients,
 * hybrid runs full inside its shard group and all-reduces each final shard across the groups.
 * prefetch = k keeps up to k units in flight ahead of the one being computed; 0 serializes.
 * All memory and compute go through the device layer (device.h): one schedule drives every device,
 * collectives are ordered against the device's stream by events. One thread drives a runtime;
 * collectives run on the communicator's own thread or stream.
 */
#ifndef FSDP_RUNTIME_H
#define FSDP_RUNTIME_H

#include <stdint.h>

#include "ckpt_async.h"
#include "comm.h"
#include "device.h"
#include "jobspec.h"
#include "plan.h"

typedef enum { RT_PHASE_ALLGATHER = 0, RT_PHASE_COMPUTE, RT_PHASE_REDUCESCATTER, RT_PHASE_OPTIMIZER, RT_NPHASE } rt_phase;
/* Their names: common/stepstats.h's stepstats_phase_names, in this order. */

typedef struct rt_report {
  int step;                      /* 1-based */
  double loss;                   /* mean over every trained token of every rank and micro-step, before this
                                    step's update; NaN when the step had none (masked data) */
  double lr, grad_norm;          /* grad_norm: global, before clipping */
  uint64_t tokens;               /* B·T·G·world */
  uint64_t trained;              /* the step's trained targets, every rank (= tokens for plain text) */
  double step_ms;                /* this rank's wall time for the step */
  uint64_t peak[MEM_NCAT], cur[MEM_NCAT], peak_total;   /* bytes, peaks within this step */
  uint64_t phase_us[RT_NPHASE];  /* device stream time blocked on gathers, computing, blocked on
                                    reductions, and in the optimizer (norm, scalar all-reduce, AdamW) */
  uint64_t sent[COLL_NKIND];     /* bytes this rank sent during this step, over every communicator */
  uint64_t sent_inter[COLL_NKIND];   /* the part sent across shard groups (hybrid; plan_t.sent_inter) */
  int has_val;                   /* val_loss and eval_ms are set (the caller's runtime_eval) */
  double val_loss, eval_ms;
  char sample[512];              /* [eval] sample_every: rank 0's sample (prompt + continuation), or "" */
  int has_start_val;             /* [eval] at_start: the first step's report carries the loss before it */
  double start_val_loss, start_eval_ms;
  ckpt_save_stats ckpt[2];       /* the saves that became complete after this step (the worker's, not */
  int nckpt;                     /* runtime_step's: an asynchronous one ends a step or more later) */
} rt_report;

typedef struct runtime runtime_t;

/* Allocate the shards and initialize them (random from spec->seed, or spec->init's .safetensors)
 * and open the training data. Collective-free. SPEC, PLAN, COMM and DEV are borrowed and must
 * outlive the runtime. */
fsdp_status runtime_new(const jobspec_t *spec, const plan_t *plan, int rank, comm_t *comm, device_t *dev,
                        runtime_t **out);
/* sharding = hybrid: the communicators of this rank's shard group (its rank r mod G of G) and of the
 * ranks holding the same shard in the other groups (rank r / G of N/G); borrowed, must outlive the
 * runtime. Gathers and reduce-scatters go to GROUP, each shard's gradient across REPLICA once per
 * step; the world's comm keeps the step's scalars. Before the first step. */
fsdp_status runtime_set_groups(runtime_t *rt, comm_t *group, comm_t *replica);
/* One optimizer step (G micro-steps). Collective: every rank calls it with the same STEP. */
fsdp_status runtime_step(runtime_t *rt, int step, rt_report *out);
/* Collective: the mean loss over the first BATCHES·N·B rows of the validation file ([data] val),
 * forward only, sharded as in training (every rank must call it with the same BATCHES); the time
 * it took in *MS. Between steps. */
fsdp_status runtime_eval(runtime_t *rt, int batches, double *val_loss, double *ms);
/* The world-1 plan of the same model (sharding none, fp32, cpu) with BATCH_SIZE, whose layout
 * runtime_gather_whole fills. */
fsdp_status runtime_whole_plan(const runtime_t *rt, int batch_size, plan_t **out);
/* Collective: the whole model (fp32 master weights; a frozen bf16 base widened) into OUT (WHOLE->shard_total floats, host) on
 * rank 0; the other ranks pass NULL. */
fsdp_status runtime_gather_whole(runtime_t *rt, const plan_t *whole, float *out);
/* Collective: gather the whole model; rank 0 writes it as Hugging Face GPT-2 .safetensors. */
fsdp_status runtime_save(runtime_t *rt, const char *path);
/* A [lora] job: rank 0 writes the adapters (whole on every rank) as a PEFT folder DIR (peft.h). */
fsdp_status runtime_save_adapters(runtime_t *rt, const char *dir);
/* Record spans in T (trace.h; NULL: stop): the step on the host lane, every forward, loss, backward
 * and the optimizer on the compute-stream lane (through the device), every collective on its comm's
 * lane (comm_set_trace: the world comm's, and with hybrid sharding the group's and the replica
 * comm's, also when runtime_set_groups comes later), each named with its unit. T must outlive the
 * runtime. Between steps. */
void runtime_set_trace(runtime_t *rt, trace_t *t);
/* Tests only: skip the device wait between a block's gather and the compute that reads it, so
 * that a test can show the asynchronous devices catch a missing wait. */
void runtime_test_drop_gather_wait(runtime_t *rt, int on);
/* Tests only: [lora] with offload = optimizer, the host's AdamW update not copied back up into the
 * adapters' compute form (the device keeps computing with the old adapters), so that a test can
 * show its comparison catches a lost upload. */
void runtime_test_keep_adapters(runtime_t *rt, int on);
/* This rank's fp32 parameter shard (plan->shard_total floats, device memory), for tests; NULL for a
 * [lora] job's frozen bf16 base, which has none. */
const float *runtime_param_shard(const runtime_t *rt);
void runtime_destroy(runtime_t **rt);

/* Checkpoints (docs/checkpoints.md). Collective: every rank writes its file of step STEP under DIR;
 * after a barrier, rank 0 writes the manifest and keeps spec->ckpt_keep checkpoints; after a
 * failure rank 0 removes the step directory. Every rank returns the same status. *ST: its figures. */
fsdp_status runtime_checkpoint(runtime_t *rt, const char *dir, int step, ckpt_save_stats *st);
/* The same, asynchronous ([checkpoint] async = true): settle the save in flight if any (waiting for
 * it: *DONE gets its figures, step 0 when none), copy this rank's shards into A's host snapshot and
 * hand it to A's writer thread; training may go on at once. The manifest is written by a later
 * runtime_checkpoint_settle. Collective; every rank passes its own A. */
fsdp_status runtime_checkpoint_async(runtime_t *rt, ckpt_async *a, const char *dir, int step, ckpt_save_stats *done);
/* Allocate A's snapshot for this runtime before the first step, so that the first save does not
 * pay for it (allocation and first-touch page faults: seconds for a GPT-2 124M shard). */
fsdp_status runtime_checkpoint_prepare(runtime_t *rt, ckpt_async *a);
/* Collective, between steps: when A holds a save in flight and every rank's write has ended (WAIT:
 * after waiting for this rank's), write its manifest as runtime_checkpoint does; *DONE gets the
 * settled save's figures, step 0 when none was settled. Call it at every step boundary (WAIT = 0:
 * one scalar all-reduce while a save is in flight) and at the end of a run (WAIT = 1). */
fsdp_status runtime_checkpoint_settle(runtime_t *rt, ckpt_async *a, int wait, ckpt_save_stats *done);
/* Collective: restore parameters, AdamW m and v from the newest complete checkpoint in DIR,
 * resharding from whatever world size and sharding wrote it; *STEP gets its step (training
 * continues at *STEP + 1), or 0 when DIR holds no complete checkpoint (nothing is changed).
 * A different model, a corrupt file or a CRC mismatch fails on every rank. */
fsdp_status runtime_restore(runtime_t *rt, const char *dir, int *step);

#endif
