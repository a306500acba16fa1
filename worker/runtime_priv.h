/* runtime_priv — the runtime's state, shared by runtime.c (the step schedule) and runtime_ckpt.c
 * (checkpoints, restore, export). Not for other modules: they use runtime.h. */
#ifndef FSDP_RUNTIME_PRIV_H
#define FSDP_RUNTIME_PRIV_H

#include "device.h"
#include "lora.h"
#include "model.h"
#include "runtime.h"
#include "reduce.h"
#include "reqs.h"
#include "tokens.h"
#include "unit.h"

struct runtime {
  const jobspec_t *spec;
  optim_config optim;      /* AdamW's hyperparameters, from spec once */
  const plan_t *p;
  int rank, world, L;
  comm_t *comm;                  /* every rank: the step's scalars, checkpoints' agreement */
  comm_t *gcomm;                 /* gathers and reduce-scatters: the shard group's (hybrid), else comm */
  comm_t *rcomm;                 /* hybrid: the ranks of the other groups holding this shard, else NULL */
  device_t *dev;

  /* this rank's shards, fp32 on the device (shard_total elements each), and the bf16 copy that is
   * gathered when param_dtype = bf16 (AdamW writes it); a [lora] job's frozen base is one shard in
   * its own dtype: param (fp32) or lp (bf16, param NULL) */
  float *param, *grad, *m, *v;
  uint16_t *lp;
  /* [lora] base_dtype = nf4: lp is the root's bf16 shard alone, and nf4 the blocks' NF4 shards (L
   * byte shards of nf4_shard, nf4_base.h) */
  uint8_t *nf4;
  /* offload = optimizer: param, m and v are in host memory, AdamW runs on the host over them, and
   * the device keeps what the gathers read: lp (bf16) or dparam (an fp32 copy); hgrad stages the
   * gradient shard on the host (and the bf16 copy on its way to the device). [lora]: 0, the base
   * has no optimizer state; the adapters' offload is lora->offload (lora.h) */
  int offload;
  float *dparam, *hgrad;
  model_acts *acts;
  tok_file *data;
  tok_file *val;                 /* [data] val, or NULL */
  int *inp, *tgt;                /* G·B·T token ids on the device: the whole step's micro-batches */
  int *inp_h, *tgt_h;            /* host staging when the device is not host memory */
  /* masked data (tokens.h: rows of documents): targets −1 where untrained; with pack = true the
   * rows' document starts, G·B·T on the host for model_set_docs; the trained targets of this
   * rank's step (load_batches), which the step's count all-reduces */
  int masked;
  int32_t *seg_h;                /* NULL unless masked and packed */
  int64_t trained;
  float *scal;                   /* PLAN_STEP_SCALARS device floats: Σ loss, Σ g², non-finite, count */
  float *scal_h;
  dev_event *scal_ready, *scal_done;   /* the scalars' all-reduce: after the norm, before the read-back */

  /* the FSDP units (unit.h: gathered buffers, pool slots, gradients) and what reduces their
   * gradients (reduce.h); every collective of the step waits in reqs until its end */
  unit_pool *pool;
  fsdp_unit *unit;               /* p->nunits, owned by the pool */
  reducer *red;
  reqs reqs;

  /* [lora]: the adapters (the model reads them; the runtime zeroes, reduces and updates them),
   * and the events that order a replicated gradient's all-reduce; the base then has no gradient,
   * optimizer state or reducer (grad, m, v, red NULL) */
  lora_ctx *lora;
  dev_event *lora_ready, *lora_done;
  /* [lora] adapters = sharded: the adapters' own units (lora->opt), gathered and released beside
   * the base's blocks, and their reducer (its gradient shard: lora->grad); else NULL */
  unit_pool *apool;
  fsdp_unit *aunit;
  reducer *ared;
  int test_keep_adapters;        /* runtime_test_keep_adapters: offload's update not brought up (a planted fault) */

  trace_t *trace;                /* spans (runtime_set_trace); NULL: none */
  /* an asynchronous save whose writer reads the live shards (runtime_checkpoint_async on host
   * memory): detached before the optimizer changes them (runtime_checkpoint_detach); else NULL */
  ckpt_async *live_save;

  /* set by runtime_restore: the step resumed after and the tokens consumed up to it */
  int ckpt_step0;
  uint64_t ckpt_tokens0;
  /* [lora] on rank 0: the base's identity and hash for the checkpoints' manifests, taken once
   * (at the restore or the first save) */
  ckpt_base lora_base;
  int lora_base_known;
};

/* Host views of device memory: the pointer itself on a host-accessible device (after a sync),
 * else a malloc'd copy (download) that host_view_done frees. */
fsdp_status runtime_host_view(runtime_t *rt, const void *dptr, size_t bytes, void **view);
void runtime_host_view_done(runtime_t *rt, void *view);
/* A host buffer whose contents will become DPTR's whole: DPTR itself on a host-accessible device
 * (after a sync), else a zeroed malloc'd buffer (nothing is downloaded). runtime_host_buffer_done
 * uploads it to DPTR when WRITE and frees it; NULL VIEW: nothing. */
fsdp_status runtime_host_buffer(runtime_t *rt, void *dptr, size_t bytes, void **view);
fsdp_status runtime_host_buffer_done(runtime_t *rt, void *dptr, size_t bytes, void *view, int write);
/* Round the fp32 shard to the bf16 copy (param_dtype = bf16), after init and restore. */
fsdp_status runtime_refresh_lp(runtime_t *rt);
/* Before the optimizer changes the shards: a save in flight that reads them goes on from a copy of
 * what it has left (ckpt_async_detach). runtime_ckpt.c. */
void runtime_checkpoint_detach(runtime_t *rt);
/* Sum N ≤ PLAN_STEP_SCALARS floats over the ranks through device memory (NCCL reads no host
 * memory). Collective. */
fsdp_status runtime_allreduce_host(runtime_t *rt, float *vals, int n);

#endif
