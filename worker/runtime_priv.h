/* runtime_priv — the runtime's state, shared by runtime.c (the step schedule) and runtime_ckpt.c
 * (checkpoints, restore, export). Not for other modules: they use runtime.h. */
#ifndef FSDP_RUNTIME_PRIV_H
#define FSDP_RUNTIME_PRIV_H

#include "device.h"
#include "model.h"
#include "runtime.h"
#include "tokens.h"

struct runtime {
  const jobspec_t *spec;
  const plan_t *p;
  int rank, world, L;
  comm_t *comm;                  /* every rank: the step's scalars, checkpoints' agreement */
  comm_t *gcomm;                 /* gathers and reduce-scatters: the shard group's (hybrid), else comm */
  comm_t *rcomm;                 /* hybrid: the ranks of the other groups holding this shard, else NULL */
  int xar_now;                   /* hybrid's last micro-step: final shards go across the groups */
  device_t *dev;
  int bf16_params, bf16_grads;   /* param_dtype, reduce_dtype are bf16 */
  int convert;                   /* gathered parameters need converting to the compute dtype */

  /* this rank's shards, fp32 on the device (shard_total elements each), and the bf16 copy that is
   * gathered when param_dtype = bf16 (AdamW writes it) */
  float *param, *grad, *m, *v;
  uint16_t *lp;
  /* offload = optimizer: param, m and v are in host memory, AdamW runs on the host over them, and
   * the device keeps what the gathers read: lp (bf16) or dparam (an fp32 copy); hgrad stages the
   * gradient shard on the host (and the bf16 copy on its way to the device) */
  int offload;
  float *dparam, *hgrad;
  model_acts *acts;
  tok_file *data;
  tok_file *val;                 /* [data] val, or NULL */
  int *inp, *tgt;                /* G·B·T token ids on the device: the whole step's micro-batches */
  int *inp_h, *tgt_h;            /* host staging when the device is not host memory */
  float *scal;                   /* PLAN_STEP_SCALARS device floats: Σ loss, Σ g², non-finite, count */
  float *scal_h;

  /* gathered parameters (param dtype): the root's buffer and a pool of block buffers (1+prefetch for
   * full, one per block for grad_op); slot_free[s] is recorded after the slot's last read */
  void *root_buf;
  int nslots;
  void **slot_buf;
  int *slot_unit;                /* -1 when free */
  dev_event **slot_free;         /* nslots + 1: the root's is the last */
  void **gptr;                   /* per unit: where its gathered parameters are, NULL if not gathered */
  int *gslot;                    /* per unit: its pool slot (the root: nslots) */
  dev_event **gdone;             /* per unit: its gather completed */
  void *root_act, *blk_act;      /* compute-form copies when convert */

  /* gradients of units being reduced: the root's (fp32), and two alternating block buffers (fp32
   * for reduce fp32; with bf16 one fp32 buffer and two bf16 send and receive buffers) */
  float *droot, *gbuf[2], *gcomp;
  uint16_t *root16, *rootrecv16, *send16[2], *recv16[2];
  int gunit[2];                  /* bf16: the unit whose reduce-scatter buffer i holds, or -1 */
  int gnext;
  dev_event *gfree[2], *root_done, *ar_done, *scal_done, *ready;
  uint16_t *ar16;                /* sharding none, reduce bf16: the gradient in bf16 */

  comm_req **pend;               /* every request of the step, waited at its end */
  int npend, cap_pend;

  int drop_gather_wait;          /* test switch: runtime_test_drop_gather_wait */
  trace_t *trace;                /* spans (runtime_set_trace); NULL: none */
  uint64_t phase_us[RT_NPHASE];

  /* set by runtime_restore: the step resumed after and the tokens consumed up to it */
  int ckpt_step0;
  uint64_t ckpt_tokens0;
};

/* Host views of device memory: the pointer itself on a host-accessible device (after a sync),
 * else a malloc'd copy (download) that host_view_done frees. */
fsdp_status rt_host_view(runtime_t *rt, const void *dptr, size_t bytes, void **view);
void rt_host_view_done(runtime_t *rt, void *view);
/* Bring the host-written contents of VIEW (from rt_host_buffer) to DPTR. */
fsdp_status rt_host_buffer(runtime_t *rt, void *dptr, size_t bytes, void **view);
fsdp_status rt_host_buffer_done(runtime_t *rt, void *dptr, size_t bytes, void *view);
/* Round the fp32 shard to the bf16 copy (param_dtype = bf16), after init and restore. */
fsdp_status rt_refresh_lp(runtime_t *rt);
/* Sum N ≤ PLAN_STEP_SCALARS floats over the ranks through device memory (NCCL reads no host
 * memory). Collective. */
fsdp_status rt_allreduce_host(runtime_t *rt, float *vals, int n);

#endif
