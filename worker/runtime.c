/* runtime — see runtime.h. The schedule of one micro-step (DESIGN.md §4), for sharding full; every
 * arrow is device-stream order, collectives are ordered against it by events (device.h):
 *
 *   AG(root), AG(1..p) ▶ wait AG(root) ▶ embed ▶ AG(p+1)
 *   for u in 1..L: wait AG(u) ▶ fwd(u) ▶ release(u) ▶ AG(u+1+p) after release
 *   AG(L..L−p)  (overlaps the head) ▶ head fwd+bwd
 *   for u in L..1: wait AG(u) ▶ wait RS of the gradient buffer ▶ bwd(u) ▶ release(u) ▶ AG(u−1−p)
 *                  ▶ RS(grad u) after bwd                                   (RS async)
 *   embed bwd ▶ RS(grad root) ▶ wait every RS ▶ release(root)
 *
 * release(u) records the event that the next gather into u's pool slot starts after. The host
 * waits for collectives only at the end of the step (the watchdog), after the one read-back of the
 * step's scalars. grad_op gathers each unit once per micro-step and releases it after its
 * backward; none has nothing to gather, computes gradients straight into the shard and all-reduces
 * each unit once per step, as soon as its last backward is done. hybrid is full on its group's comm,
 * and in the last micro-step all-reduces each unit's final gradient shard on the replica comm (the
 * ranks of the other groups holding it) as soon as it is final; the stream waits for the last one
 * before the optimizer.
 *
 * Gradients: with reduce_dtype fp32, accumulation over micro-steps is folded into the
 * reduce-scatter: a rank adds its accumulated shard into its own block of the send buffer before
 * reducing, so the sum it receives is the new total. With bf16, the fp32 gradient is rounded into
 * a bf16 send buffer, reduce-scattered into a bf16 receive buffer, and added to the fp32 shard
 * (PyTorch FSDP's order: accumulation in fp32 after the reduction).
 * Mixed precision: with param_dtype bf16 the gathers move the bf16 copy of the shard; where the
 * compute dtype differs (the CPU computes in fp32) a gathered unit is converted into a compute
 * buffer and its slot released at once.
 */
#include "runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "mem.h"
#include "optim.h"
#include "runtime_priv.h"
#include "st_model.h"
#include "stepstats.h"

_Static_assert((int)RT_NPHASE == STEPSTATS_NPHASE && (int)RT_NPHASE == (int)DEV_NTIMER, "one list of step phases");

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int sharded(const runtime_t *rt) { return rt->p->sharding != SHARD_NONE; }
static int hybrid(const runtime_t *rt) { return rt->p->sharding == SHARD_HYBRID; }
/* Blocks are released after their forward and gathered again for the backward (full; hybrid is
 * full inside its group). */
static int regathers(const runtime_t *rt) { return rt->p->sharding == SHARD_FULL || hybrid(rt); }

#define ALLOC_OR(ptr, expr, rc, label)                                                   \
  do {                                                                                   \
    if (!((ptr) = (expr))) {                                                             \
      (rc) = FSDP_ERR_NOMEM;                                                             \
      goto label;                                                                        \
    }                                                                                    \
  } while (0)

static void *dalloc(runtime_t *rt, mem_category cat, int64_t n, int esz) {
  return rt->dev->op->alloc(rt->dev, cat, (size_t)n * (size_t)esz);
}

/* Synthetic data is one fixed Markov stream whose length depends only on N·B·T, so that N ranks
 * with batch B and one rank with batch N·B read the same tokens. */
static int64_t synthetic_tokens(const runtime_t *rt) {
  int64_t per_batch = (int64_t)rt->world * rt->spec->batch_size * rt->p->model.seq_len;
  int64_t n = 4 * per_batch;
  if (n < (1 << 21)) n = 1 << 21;
  return n + 1;
}

static fsdp_status alloc_gather_and_grads(runtime_t *rt) {
  const plan_t *p = rt->p;
  fsdp_status rc = FSDP_OK;
  int nu = p->nunits, pe = rt->bf16_params ? 2 : 4, ae = rt->dev->act_bytes;
  int64_t pb = 0, sb = 0;
  for (int u = 1; u < nu; u++)
    if (p->units[u].padded > pb) pb = p->units[u].padded, sb = p->units[u].shard_numel;
  if (rt->convert) {
    ALLOC_OR(rt->root_act, dalloc(rt, MEM_GATHERED, p->units[0].padded, ae), rc, out);
    ALLOC_OR(rt->blk_act, dalloc(rt, MEM_GATHERED, pb, ae), rc, out);
  }
  /* none, and hybrid's cross-group all-reduce: the gradient shard rounded to bf16 */
  if ((!sharded(rt) || hybrid(rt)) && rt->bf16_grads) ALLOC_OR(rt->ar16, dalloc(rt, MEM_COMM, p->shard_total, 2), rc, out);
  if (!sharded(rt)) return FSDP_OK;
  /* Pool buffers are allocated here, once, and reused: "release" returns a buffer to the pool. */
  rt->nslots = regathers(rt) ? 1 + p->prefetch : rt->L;
  if (rt->nslots > rt->L) rt->nslots = rt->L;
  ALLOC_OR(rt->slot_buf, calloc((size_t)rt->nslots, sizeof(void *)), rc, out);
  ALLOC_OR(rt->slot_unit, calloc((size_t)rt->nslots, sizeof(int)), rc, out);
  ALLOC_OR(rt->slot_free, calloc((size_t)rt->nslots + 1, sizeof(dev_event *)), rc, out);
  for (int s = 0; s < rt->nslots; s++) {
    int64_t n = regathers(rt) ? pb : p->units[1 + s].padded;
    ALLOC_OR(rt->slot_buf[s], dalloc(rt, MEM_GATHERED, n, pe), rc, out);
    rt->slot_unit[s] = -1;
  }
  for (int s = 0; s <= rt->nslots; s++) ALLOC_OR(rt->slot_free[s], dev_event_new(rt->dev), rc, out);
  ALLOC_OR(rt->root_buf, dalloc(rt, MEM_GATHERED, p->units[0].padded, pe), rc, out);
  ALLOC_OR(rt->droot, dalloc(rt, MEM_COMM, p->units[0].padded, 4), rc, out);
  if (!rt->bf16_grads) {
    for (int i = 0; i < 2; i++) ALLOC_OR(rt->gbuf[i], dalloc(rt, MEM_COMM, pb, 4), rc, out);
  } else {
    ALLOC_OR(rt->gcomp, dalloc(rt, MEM_COMM, pb, 4), rc, out);
    ALLOC_OR(rt->root16, dalloc(rt, MEM_COMM, p->units[0].padded, 2), rc, out);
    ALLOC_OR(rt->rootrecv16, dalloc(rt, MEM_COMM, p->units[0].shard_numel, 2), rc, out);
    for (int i = 0; i < 2; i++) {
      ALLOC_OR(rt->send16[i], dalloc(rt, MEM_COMM, pb, 2), rc, out);
      ALLOC_OR(rt->recv16[i], dalloc(rt, MEM_COMM, sb, 2), rc, out);
    }
  }
out:
  return rc;
}

/* The validation rows runtime_eval will read exist and fit the vocabulary: said at the start, not
 * at the first evaluation. */
static fsdp_status check_val(runtime_t *rt) {
  const plan_t *p = rt->p;
  int BT = p->batch_size * p->model.seq_len;
  int *a = calloc((size_t)BT, sizeof(int)), *b = calloc((size_t)BT, sizeof(int));
  fsdp_status rc = a && b ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the validation check");
  for (int m = 0; rc == FSDP_OK && m < rt->spec->eval_batches; m++)
    rc = tok_batch(rt->val, m, rt->rank, rt->world, p->batch_size, p->model.seq_len, p->model.vocab_size, a, b);
  free(a);
  free(b);
  if (rc != FSDP_OK) {
    char why[512];   /* the message is rewritten in the buffer it comes from */
    snprintf(why, sizeof why, "%s", fsdp_user_message(fsdp_last_error()));
    return fsdp_set_error(rc, "[data] val %s: %s", rt->spec->val_synthetic ? "(synthetic)" : rt->spec->val, why);
  }
  return FSDP_OK;
}

fsdp_status runtime_new(const jobspec_t *spec, const plan_t *p, int rank, comm_t *comm, device_t *dev,
                        runtime_t **out) {
  fsdp_status rc = FSDP_OK;
  *out = NULL;
  if (rank < 0 || rank >= p->world || comm_world(comm) != p->world || comm_rank(comm) != rank)
    return fsdp_set_error(FSDP_ERR_INVALID, "rank %d of %d does not match the communicator (rank %d of %d)", rank,
                          p->world, comm_rank(comm), comm_world(comm));
  runtime_t *rt = calloc(1, sizeof *rt);
  if (!rt) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the runtime");
  rt->spec = spec, rt->p = p, rt->rank = rank, rt->world = p->world, rt->comm = comm, rt->dev = dev;
  rt->gcomm = comm;   /* hybrid: runtime_set_groups replaces it */
  rt->L = p->model.n_layer;
  rt->bf16_params = p->param_dtype == DTYPE_BF16;
  rt->bf16_grads = p->reduce_dtype == DTYPE_BF16;
  rt->convert = (rt->bf16_params ? 2 : 4) != dev->act_bytes;
  rt->gunit[0] = rt->gunit[1] = -1;
  int nu = p->nunits, G = spec->grad_accum;
  int64_t S = p->shard_total, BTG = (int64_t)p->batch_size * p->model.seq_len * G;

  if (dev->op->bind) TRY_GOTO(dev->op->bind(dev, p, rank), rc, fail);   /* per-job device state (CUDA) */
  rt->offload = spec->offload == OFFLOAD_OPTIMIZER;
  if (rt->offload) {   /* pinned host memory, outside the device's categories: the plan's host_bytes */
    ALLOC_OR(rt->param, dev->op->alloc_host(dev, (size_t)S * 4), rc, fail);
    ALLOC_OR(rt->m, dev->op->alloc_host(dev, (size_t)S * 4), rc, fail);
    ALLOC_OR(rt->v, dev->op->alloc_host(dev, (size_t)S * 4), rc, fail);
    ALLOC_OR(rt->hgrad, dev->op->alloc_host(dev, (size_t)S * 4), rc, fail);
    if (!rt->bf16_params) ALLOC_OR(rt->dparam, dalloc(rt, MEM_PARAM_SHARD, S, 4), rc, fail);
  } else {
    ALLOC_OR(rt->param, dalloc(rt, MEM_PARAM_SHARD, S, 4), rc, fail);
    ALLOC_OR(rt->m, dalloc(rt, MEM_OPTIM_STATE, S, 4), rc, fail);
    ALLOC_OR(rt->v, dalloc(rt, MEM_OPTIM_STATE, S, 4), rc, fail);
  }
  if (rt->bf16_params) ALLOC_OR(rt->lp, dalloc(rt, MEM_PARAM_SHARD, S, 2), rc, fail);
  ALLOC_OR(rt->grad, dalloc(rt, MEM_GRAD_SHARD, S, 4), rc, fail);
  ALLOC_OR(rt->acts, model_acts_new(p, dev), rc, fail);
  ALLOC_OR(rt->inp, dalloc(rt, MEM_ACTIVATIONS, BTG, sizeof(int)), rc, fail);
  ALLOC_OR(rt->tgt, dalloc(rt, MEM_ACTIVATIONS, BTG, sizeof(int)), rc, fail);
  if (!dev->host_accessible) {
    ALLOC_OR(rt->inp_h, calloc((size_t)BTG, sizeof(int)), rc, fail);
    ALLOC_OR(rt->tgt_h, calloc((size_t)BTG, sizeof(int)), rc, fail);
  }
  ALLOC_OR(rt->scal, dalloc(rt, MEM_COMM, PLAN_STEP_SCALARS, 4), rc, fail);
  ALLOC_OR(rt->scal_h, calloc(PLAN_STEP_SCALARS, sizeof(float)), rc, fail);
  ALLOC_OR(rt->gptr, calloc((size_t)nu, sizeof(void *)), rc, fail);
  ALLOC_OR(rt->gslot, calloc((size_t)nu, sizeof(int)), rc, fail);
  ALLOC_OR(rt->gdone, calloc((size_t)nu, sizeof(dev_event *)), rc, fail);
  for (int u = 0; u < nu; u++) ALLOC_OR(rt->gdone[u], dev_event_new(dev), rc, fail);
  ALLOC_OR(rt->gfree[0], dev_event_new(dev), rc, fail);
  ALLOC_OR(rt->gfree[1], dev_event_new(dev), rc, fail);
  ALLOC_OR(rt->root_done, dev_event_new(dev), rc, fail);
  ALLOC_OR(rt->ar_done, dev_event_new(dev), rc, fail);
  ALLOC_OR(rt->scal_done, dev_event_new(dev), rc, fail);
  ALLOC_OR(rt->ready, dev_event_new(dev), rc, fail);
  rt->cap_pend = G * 3 * nu + nu + 8;   /* per micro-step at most 2 gathers and 1 reduction per unit; hybrid:
                                          one cross-group all-reduce per unit per step */
  ALLOC_OR(rt->pend, calloc((size_t)rt->cap_pend, sizeof(comm_req *)), rc, fail);
  TRY_GOTO(alloc_gather_and_grads(rt), rc, fail);

  /* Parameters: this rank's shard only, never the whole model. */
  void *hp = NULL;
  TRY_GOTO(rt_host_buffer(rt, rt->param, (size_t)S * 4, &hp), rc, fail);
  if (strcmp(spec->init, "random") == 0) {
    model_init_shard(p, spec->seed, rank, hp);
  } else {
    st_model *f = NULL;   /* opens only the files that hold this rank's ranges */
    rc = st_model_open(spec->init, &f);
    if (rc == FSDP_OK) rc = st_model_load_shard(f, p, rank, hp);
    if (rc == FSDP_OK)
      log_info("rank %d: read its shard from %d of the %d files of %s", rank, st_model_opened(f),
           st_model_nfiles(f), spec->init);
    st_model_destroy(&f);
  }
  fsdp_status rc2 = rt_host_buffer_done(rt, rt->param, (size_t)S * 4, hp);
  if (rc == FSDP_OK) rc = rc2;
  if (rc != FSDP_OK) goto fail;
  TRY_GOTO(rt_refresh_lp(rt), rc, fail);
  if (spec->synthetic)
    TRY_GOTO(tok_open_markov(spec->markov_seed, p->model.vocab_size, synthetic_tokens(rt), &rt->data), rc, fail);
  else
    TRY_GOTO(tok_open(spec->train, &rt->data), rc, fail);
  tok_set_shuffle(rt->data, spec->shuffle, spec->seed);
  if (spec->val_synthetic)   /* validation reads its rows in file order */
    TRY_GOTO(tok_open_markov(spec->val_markov_seed, p->model.vocab_size, synthetic_tokens(rt), &rt->val), rc, fail);
  else if (spec->val[0])
    TRY_GOTO(tok_open(spec->val, &rt->val), rc, fail);
  if (rt->val && spec->eval_every > 0) TRY_GOTO(check_val(rt), rc, fail);
  *out = rt;
  return FSDP_OK;
fail:
  if (rc == FSDP_ERR_NOMEM && !strstr(fsdp_last_error(), "allocate"))
    fsdp_set_error(rc, "rank %d: out of memory allocating its shards and buffers (plan predicts %.1f MiB)", rank,
                   (double)p->mem_total / (1 << 20));
  runtime_destroy(&rt);
  return rc;
}

void runtime_test_drop_gather_wait(runtime_t *rt, int on) { rt->drop_gather_wait = on; }

fsdp_status runtime_set_groups(runtime_t *rt, comm_t *group, comm_t *replica) {
  const plan_t *p = rt->p;
  if (!hybrid(rt)) return fsdp_set_error(FSDP_ERR_STATE, "runtime_set_groups: sharding is %s, not hybrid",
                                         jobspec_shard_mode_name(p->sharding));
  if (!group || !replica || comm_world(group) != p->shard_world || comm_rank(group) != plan_group_rank(p, rt->rank) ||
      comm_world(replica) != p->ngroups || comm_rank(replica) != plan_group_of(p, rt->rank))
    return fsdp_set_error(FSDP_ERR_INVALID, "rank %d: the hybrid communicators (group rank %d of %d, replica rank %d of "
                          "%d) do not match the plan's %d groups of %d", rt->rank, group ? comm_rank(group) : -1,
                          group ? comm_world(group) : 0, replica ? comm_rank(replica) : -1,
                          replica ? comm_world(replica) : 0, p->ngroups, p->shard_world);
  rt->gcomm = group;
  rt->rcomm = replica;
  if (rt->trace) runtime_set_trace(rt, rt->trace);
  return FSDP_OK;
}

/* ---- spans (trace.h) ---- */

void runtime_set_trace(runtime_t *rt, trace_t *t) {
  rt->trace = t;
  comm_set_trace(rt->comm, t, TRACE_COMM);
  if (rt->gcomm != rt->comm) comm_set_trace(rt->gcomm, t, TRACE_COMM_GROUP);
  if (rt->rcomm) comm_set_trace(rt->rcomm, t, TRACE_COMM_REPLICA);
}

/* Open (END = 0) or close a span on the compute stream, taken when the stream gets there. */
static void span(runtime_t *rt, int end, trace_kind k, int unit) {
  if (rt->trace && rt->dev->op->trace) rt->dev->op->trace(rt->dev, rt->trace, end, k, unit, trace_step(rt->trace));
}

static fsdp_status pend(runtime_t *rt, comm_req *r) {
  if (!r) return FSDP_OK;
  if (rt->npend == rt->cap_pend) {   /* cannot happen with the schedule below; never drop a request */
    comm_wait(&r);
    return fsdp_set_error(FSDP_ERR_INTERNAL, "more than %d collectives in one step", rt->cap_pend);
  }
  rt->pend[rt->npend++] = r;
  return FSDP_OK;
}

/* Host-side: wait every collective of the step (they are complete or about to be). */
static fsdp_status wait_pending(runtime_t *rt) {
  fsdp_status rc = FSDP_OK;
  for (int i = 0; i < rt->npend; i++) {
    fsdp_status r = comm_wait(&rt->pend[i]);
    if (rc == FSDP_OK) rc = r;
  }
  rt->npend = 0;
  return rc;
}

/* ---- gathers ---- */

static const void *shard_src(const runtime_t *rt, int u) {
  int64_t b = rt->p->units[u].shard_base;
  return rt->lp ? (const void *)(rt->lp + b) : rt->dparam ? (const void *)(rt->dparam + b) : (const void *)(rt->param + b);
}

static fsdp_status gather_issue(runtime_t *rt, int u) {
  const plan_unit *pu = &rt->p->units[u];
  void *dst;
  int s = rt->nslots;   /* the root's */
  if (u == 0) {
    dst = rt->root_buf;
  } else {
    s = -1;
    if (rt->p->sharding == SHARD_GRAD_OP) {
      s = u - 1;
    } else {
      for (int i = 0; i < rt->nslots; i++)
        if (rt->slot_unit[i] < 0) {
          s = i;
          break;
        }
    }
    if (s < 0) return fsdp_set_error(FSDP_ERR_INTERNAL, "gather pool exhausted at unit %d (%d slots)", u, rt->nslots);
    rt->slot_unit[s] = u;
    dst = rt->slot_buf[s];
  }
  rt->gslot[u] = s;
  rt->gptr[u] = dst;
  comm_req *r = NULL;
  comm_trace_unit(rt->gcomm, u);
  TRY(comm_allgather_ev(rt->gcomm, shard_src(rt, u), dst, (size_t)pu->shard_numel, rt->lp ? COMM_BF16 : COMM_F32,
                        rt->slot_free[s], rt->gdone[u], &r));
  return pend(rt, r);
}

/* Unit u's parameters in compute form, ordered after its gather. */
static const void *unit_ready(runtime_t *rt, int u) {
  device_t *d = rt->dev;
  const plan_unit *pu = &rt->p->units[u];
  const void *src;
  if (sharded(rt)) {
    if (!(rt->drop_gather_wait && u > 0)) d->op->wait(d, rt->gdone[u], DEV_T_GATHER);
    src = rt->gptr[u];
  } else {
    src = shard_src(rt, u);
  }
  if (!rt->convert) return src;
  void *act = u == 0 ? rt->root_act : rt->blk_act;
  d->op->to_act(d, act, src, rt->p->param_dtype, pu->padded);
  if (sharded(rt)) d->op->record(d, rt->slot_free[rt->gslot[u]]);   /* the slot's last reader */
  return act;
}

/* After the last compute that reads unit u: its slot may be gathered into again. */
static void gather_release(runtime_t *rt, int u) {
  if (!rt->convert) rt->dev->op->record(rt->dev, rt->slot_free[rt->gslot[u]]);
  if (u > 0) rt->slot_unit[rt->gslot[u]] = -1;
  rt->gptr[u] = NULL;
}

/* ---- gradient reductions ---- */

static fsdp_status xar_issue(runtime_t *rt, int u, dev_event *after);

/* bf16 reductions: fold the received sum of buffer i into the fp32 shard, once it has arrived;
 * in hybrid's last micro-step the unit's shard is then final and goes across the groups. */
static fsdp_status bf16_collect(runtime_t *rt, int i) {
  device_t *d = rt->dev;
  int u = rt->gunit[i];
  if (u < 0) return FSDP_OK;
  const plan_unit *pu = &rt->p->units[u];
  d->op->wait(d, rt->gfree[i], DEV_T_REDUCE);
  d->op->add(d, rt->grad + pu->shard_base, rt->recv16[i], DTYPE_BF16, pu->shard_numel);
  rt->gunit[i] = -1;
  return rt->xar_now ? xar_issue(rt, u, NULL) : FSDP_OK;
}

/* A zeroed fp32 gradient buffer for a block, once the reduce-scatter that last used it is done. */
static fsdp_status gbuf_acquire(runtime_t *rt, int64_t n, int *idx, float **out) {
  device_t *d = rt->dev;
  int i = rt->gnext;
  rt->gnext ^= 1;
  *idx = i;
  float *g;
  if (rt->bf16_grads) {
    TRY(bf16_collect(rt, i));
    g = rt->gcomp;
  } else {
    d->op->wait(d, rt->gfree[i], DEV_T_REDUCE);
    g = rt->gbuf[i];
  }
  d->op->zero(d, g, (size_t)n * sizeof(float));
  *out = g;
  return FSDP_OK;
}

/* Reduce-scatter unit u's fp32 gradient G into this rank's gradient shard (accumulating), ordered
 * after the compute that produced it; DONE completes when it has. */
static fsdp_status rs_issue(runtime_t *rt, int u, float *g, int i, int accumulate, dev_event *done) {
  device_t *d = rt->dev;
  const plan_unit *pu = &rt->p->units[u];
  float *mine = rt->grad + pu->shard_base;
  comm_req *r = NULL;
  comm_trace_unit(rt->gcomm, u);
  if (!rt->bf16_grads) {
    if (accumulate) d->op->add(d, g + plan_shard_offset(rt->p, u, rt->rank), mine, DTYPE_FP32, pu->shard_numel);
    d->op->record(d, rt->ready);
    TRY(comm_reduce_scatter_ev(rt->gcomm, g, mine, (size_t)pu->shard_numel, COMM_F32, rt->ready, done, &r));
    return pend(rt, r);
  }
  uint16_t *send = u == 0 ? rt->root16 : rt->send16[i], *recv = u == 0 ? rt->rootrecv16 : rt->recv16[i];
  d->op->cast_bf16(d, send, g, pu->padded);
  d->op->record(d, rt->ready);
  TRY(comm_reduce_scatter_ev(rt->gcomm, send, recv, (size_t)pu->shard_numel, COMM_BF16, rt->ready, done, &r));
  if (u > 0) rt->gunit[i] = u;
  return pend(rt, r);
}

/* Sharding none: all-reduce unit u's gradient (in the shard) once its last backward is done. */
static fsdp_status ar_issue(runtime_t *rt, int u) {
  device_t *d = rt->dev;
  const plan_unit *pu = &rt->p->units[u];
  comm_req *r = NULL;
  comm_trace_unit(rt->comm, u);
  if (rt->bf16_grads) {
    d->op->cast_bf16(d, rt->ar16 + pu->shard_base, rt->grad + pu->shard_base, pu->padded);
    d->op->record(d, rt->ready);
    TRY(comm_allreduce_ev(rt->comm, rt->ar16 + pu->shard_base, (size_t)pu->padded, COMM_BF16, rt->ready,
                          rt->ar_done, &r));
  } else {
    d->op->record(d, rt->ready);
    TRY(comm_allreduce_ev(rt->comm, rt->grad + pu->shard_base, (size_t)pu->padded, COMM_F32, rt->ready,
                          rt->ar_done, &r));
  }
  return pend(rt, r);
}

/* Hybrid, last micro-step: all-reduce unit u's final gradient shard among the ranks of the other
 * groups that hold the same shard (rt->rcomm), after AFTER's latest mark (fp32: the reduce-scatter
 * that wrote it, in place) or, in bf16, after it is rounded into ar16 on the stream. Completes
 * ar_done; the caller waits for its latest mark (FIFO on one comm: every earlier one is done). */
static fsdp_status xar_issue(runtime_t *rt, int u, dev_event *after) {
  device_t *d = rt->dev;
  const plan_unit *pu = &rt->p->units[u];
  comm_req *r = NULL;
  comm_trace_unit(rt->rcomm, u);
  if (rt->bf16_grads) {
    d->op->cast_bf16(d, rt->ar16 + pu->shard_base, rt->grad + pu->shard_base, pu->shard_numel);
    d->op->record(d, rt->ready);
    TRY(comm_allreduce_ev(rt->rcomm, rt->ar16 + pu->shard_base, (size_t)pu->shard_numel, COMM_BF16, rt->ready,
                          rt->ar_done, &r));
  } else {
    TRY(comm_allreduce_ev(rt->rcomm, rt->grad + pu->shard_base, (size_t)pu->shard_numel, COMM_F32, after,
                          rt->ar_done, &r));
  }
  return pend(rt, r);
}

/* ---- one micro-step ---- */

/* The forward half of the schedule: the root and the blocks gathered as they are computed (with
 * `prefetch` in flight), each block released after its forward when RELEASE; *ROOT gets the root's
 * parameters in compute form, which stay until the caller releases unit 0. */
static fsdp_status forward(runtime_t *rt, const int *inp, int release, const void **root) {
  const plan_t *p = rt->p;
  int L = rt->L, sh = sharded(rt), ahead = 1 + p->prefetch;
  int next = 1;   /* the next block to gather */
  if (sh) {
    /* the root, and with prefetch the first blocks in flight while the root is waited for */
    TRY(gather_issue(rt, 0));
    while (next <= L && next <= p->prefetch) TRY(gather_issue(rt, next++));
  }
  *root = unit_ready(rt, 0);
  span(rt, 0, TRACE_FORWARD, 0);
  model_embed_forward(rt->acts, p, *root, inp);
  span(rt, 1, TRACE_FORWARD, 0);
  if (sh)
    while (next <= L && next <= ahead) TRY(gather_issue(rt, next++));
  for (int u = 1; u <= L; u++) {
    const void *unit = unit_ready(rt, u);
    span(rt, 0, TRACE_FORWARD, u);
    model_block_forward(rt->acts, p, u - 1, unit);
    span(rt, 1, TRACE_FORWARD, u);
    if (sh && release) gather_release(rt, u);
    if (sh && next <= L) TRY(gather_issue(rt, next++));
  }
  return FSDP_OK;
}

static fsdp_status micro_step(runtime_t *rt, int k, int last, float dscale) {
  const plan_t *p = rt->p;
  device_t *d = rt->dev;
  int L = rt->L, sh = sharded(rt), full = regathers(rt);
  int ahead = 1 + p->prefetch;   /* units live at once: the one computed plus `prefetch` ahead */
  int64_t BT = (int64_t)p->batch_size * p->model.seq_len;
  const int *inp = rt->inp + k * BT, *tgt = rt->tgt + k * BT;
  float *droot = sh ? rt->droot : rt->grad + p->units[0].shard_base;
  const void *root = NULL;
  TRY(forward(rt, inp, full, &root));   /* grad_op keeps the blocks gathered for the backward */

  /* backward: full re-gathers from the last block down; the first gathers overlap the head */
  int prev = L;
  if (full)
    while (prev >= 1 && L - prev < ahead) TRY(gather_issue(rt, prev--));
  if (sh) d->op->zero(d, droot, (size_t)p->units[0].padded * sizeof(float));
  span(rt, 0, TRACE_LOSS, 0);
  model_head_forward_backward(rt->acts, p, root, droot, tgt, dscale, rt->scal);
  span(rt, 1, TRACE_LOSS, 0);

  rt->xar_now = hybrid(rt) && last;   /* hybrid: each final shard goes across the groups */
  for (int u = L; u >= 1; u--) {
    const void *unit = unit_ready(rt, u);
    int gi = 0;
    float *dunit = rt->grad + p->units[u].shard_base;
    if (sh) TRY(gbuf_acquire(rt, p->units[u].padded, &gi, &dunit));
    span(rt, 0, TRACE_BACKWARD, u);
    model_block_backward(rt->acts, p, u - 1, unit, dunit);
    span(rt, 1, TRACE_BACKWARD, u);
    if (sh) {
      gather_release(rt, u);
      if (full && prev >= 1) TRY(gather_issue(rt, prev--));
      TRY(rs_issue(rt, u, dunit, gi, k > 0, rt->gfree[gi]));
      if (rt->xar_now && !rt->bf16_grads) TRY(xar_issue(rt, u, rt->gfree[gi]));
    } else if (last) {
      TRY(ar_issue(rt, u));
    }
  }
  span(rt, 0, TRACE_BACKWARD, 0);
  model_embed_backward(rt->acts, p, droot, inp);
  span(rt, 1, TRACE_BACKWARD, 0);
  if (sh) {
    gather_release(rt, 0);
    TRY(rs_issue(rt, 0, droot, 0, k > 0, rt->root_done));
    /* The shard must hold the new sums before the next micro-step adds to it. */
    if (rt->bf16_grads) {
      for (int i = 0; i < 2; i++) TRY(bf16_collect(rt, i));
      d->op->wait(d, rt->root_done, DEV_T_REDUCE);
      d->op->add(d, rt->grad + p->units[0].shard_base, rt->rootrecv16, DTYPE_BF16, p->units[0].shard_numel);
      if (rt->xar_now) TRY(xar_issue(rt, 0, NULL));
    } else {
      if (rt->xar_now) TRY(xar_issue(rt, 0, rt->root_done));
      d->op->wait(d, rt->root_done, DEV_T_REDUCE);
      for (int i = 0; i < 2; i++) d->op->wait(d, rt->gfree[i], DEV_T_REDUCE);
    }
    if (rt->xar_now) {   /* the optimizer reads the replicated sums */
      d->op->wait(d, rt->ar_done, DEV_T_REDUCE);
      if (rt->bf16_grads) {
        d->op->zero(d, rt->grad, (size_t)p->shard_total * sizeof(float));
        d->op->add(d, rt->grad, rt->ar16, DTYPE_BF16, p->shard_total);
      }
    }
    rt->xar_now = 0;
  } else if (last) {
    TRY(ar_issue(rt, 0));
    d->op->wait(d, rt->ar_done, DEV_T_REDUCE);   /* its latest mark: the last all-reduce, FIFO */
    if (rt->bf16_grads) {
      d->op->zero(d, rt->grad, (size_t)p->shard_total * sizeof(float));
      d->op->add(d, rt->grad, rt->ar16, DTYPE_BF16, p->shard_total);
    }
  }
  return FSDP_OK;
}

/* Bytes sent so far over every communicator of this rank (TOTAL), and over those that span shard
 * groups (INTER: hybrid's replica comm and the world's step scalars; 0 otherwise), as the plan splits them. */
static void sent_now(const runtime_t *rt, uint64_t total[COLL_NKIND], uint64_t inter[COLL_NKIND]) {
  uint64_t w[COLL_NKIND], g[COLL_NKIND] = {0}, x[COLL_NKIND] = {0};
  comm_sent_bytes(rt->comm, w);
  if (rt->gcomm != rt->comm) comm_sent_bytes(rt->gcomm, g);
  if (rt->rcomm) comm_sent_bytes(rt->rcomm, x);
  for (int i = 0; i < COLL_NKIND; i++) {
    total[i] = w[i] + g[i] + x[i];
    inter[i] = rt->rcomm ? w[i] + x[i] : 0;
  }
}

/* The step's token ids: G micro-batches, read on the host and brought to the device at once. */
static fsdp_status load_batches(runtime_t *rt, int step) {
  const plan_t *p = rt->p;
  int G = rt->spec->grad_accum, B = p->batch_size, T = p->model.seq_len;
  size_t bytes = (size_t)G * B * T * sizeof(int);
  int *ih = rt->inp_h ? rt->inp_h : rt->inp, *th = rt->tgt_h ? rt->tgt_h : rt->tgt;
  for (int k = 0; k < G; k++) {
    int64_t mb = (int64_t)(step - 1) * G + k;
    TRY(tok_batch(rt->data, mb, rt->rank, rt->world, B, T, p->model.vocab_size, ih + (int64_t)k * B * T,
                  th + (int64_t)k * B * T));
  }
  if (rt->inp_h) {
    TRY(rt->dev->op->upload(rt->dev, rt->inp, ih, bytes));
    TRY(rt->dev->op->upload(rt->dev, rt->tgt, th, bytes));
  }
  return FSDP_OK;
}

fsdp_status runtime_step(runtime_t *rt, int step, rt_report *out) {
  const plan_t *p = rt->p;
  const jobspec_t *s = rt->spec;
  device_t *d = rt->dev;
  int G = s->grad_accum, B = p->batch_size, T = p->model.seq_len;
  uint64_t t0 = now_us(), sent0[COLL_NKIND], sent1[COLL_NKIND], us[DEV_NTIMER];
  memset(out, 0, sizeof *out);
  trace_set_step(rt->trace, step);
  trace_begin(rt->trace, TRACE_HOST, t0);
  mem_reset_peaks();
  uint64_t inter0[COLL_NKIND], inter1[COLL_NKIND];
  sent_now(rt, sent0, inter0);
  uint64_t tokens = (uint64_t)B * T * G * rt->world;
  float dscale = (float)(1.0 / (double)tokens);

  /* The previous step ended with the stream idle: the token buffers are free. */
  TRY(load_batches(rt, step));
  d->op->timers(d, us);   /* start this step's count */
  d->op->set_timer(d, DEV_T_COMPUTE);
  span(rt, 0, TRACE_STEP, TRACE_NO_UNIT);
  d->op->zero(d, rt->grad, (size_t)p->shard_total * sizeof(float));
  d->op->zero(d, rt->scal, PLAN_STEP_SCALARS * sizeof(float));
  fsdp_status rc = FSDP_OK;
  if (hybrid(rt) && !rt->rcomm)
    return fsdp_set_error(FSDP_ERR_STATE, "sharding = hybrid: the group communicators were not set (runtime_set_groups)");
  for (int k = 0; k < G && rc == FSDP_OK; k++) rc = micro_step(rt, k, k == G - 1, dscale);

  /* Global gradient norm and loss: one all-reduce of PLAN_STEP_SCALARS floats on the device, the
   * step's one read-back. */
  comm_req *sreq = NULL;
  if (rc == FSDP_OK) {
    d->op->set_timer(d, DEV_T_OPTIM);
    span(rt, 0, TRACE_OPTIMIZER, TRACE_NO_UNIT);
    /* every shard is held by ngroups ranks (none: every rank holds everything) */
    d->op->sumsq(d, rt->scal + 1, rt->grad, p->shard_total, p->ngroups > 1 ? 1.0f / (float)p->ngroups : 1.0f);
    d->op->fill(d, rt->scal + 3, (float)((double)B * T * G), 1);
    d->op->record(d, rt->ready);
    rc = comm_allreduce_ev(rt->comm, rt->scal, PLAN_STEP_SCALARS, COMM_F32, rt->ready, rt->scal_done, &sreq);
    if (rc == FSDP_OK) d->op->wait(d, rt->scal_done, DEV_T_OPTIM);
  }
  fsdp_status wrc = wait_pending(rt);   /* the watchdog: every collective of the step */
  if (rc == FSDP_OK) rc = wrc;
  wrc = comm_wait(&sreq);
  if (rc == FSDP_OK) rc = wrc;
  if (rc != FSDP_OK) return rc;
  float *scal = rt->scal_h;
  TRY(d->op->download(d, scal, rt->scal, PLAN_STEP_SCALARS * sizeof(float)));
  if (scal[2] != 0.0f)
    return fsdp_set_error(FSDP_ERR_RANGE, "step %d: the gradient is not finite on %.0f rank(s) (loss %.4g); "
                          "lower optim.lr or enable optim.grad_clip", step, scal[2], scal[0] / scal[3]);
  double norm = sqrt((double)scal[1]);
  double lr = optim_lr(s, step);
  double clip = optim_clip_scale(norm, s->grad_clip);
  uint64_t host_optim = 0;
  if (rt->offload) {   /* the gradient shard to the host, AdamW there, the gathered form back */
    uint64_t t1 = now_us();
    TRY(d->op->download(d, rt->hgrad, rt->grad, (size_t)p->shard_total * sizeof(float)));
    optim_adamw_shard(p, rt->rank, rt->param, rt->hgrad, rt->m, rt->v, step, lr, s, (float)clip);
    TRY(rt_refresh_lp(rt));
    host_optim = now_us() - t1;
  } else {
    d->op->adamw(d, p, rt->rank, rt->param, rt->grad, rt->m, rt->v, rt->lp, step, lr, s, (float)clip);
  }
  span(rt, 1, TRACE_OPTIMIZER, TRACE_NO_UNIT);
  span(rt, 1, TRACE_STEP, TRACE_NO_UNIT);
  d->op->set_timer(d, DEV_T_COMPUTE);
  TRY(d->op->sync(d));   /* the step is done: its report and a checkpoint see the update */
  d->op->timers(d, us);
  /* The host's AdamW (offload): the CPU devices' timers charge only the work their stream runs, so
   * it is added here; CUDA's timing events span it already (the stream waits for the upload). */
  if (d->host_accessible) us[DEV_T_OPTIM] += host_optim;

  sent_now(rt, sent1, inter1);
  out->step = step;
  out->loss = scal[0] / scal[3];
  out->lr = lr;
  out->grad_norm = norm;
  out->tokens = tokens;
  out->step_ms = (double)(now_us() - t0) / 1000.0;
  mem_stats ms;
  mem_get_stats(&ms);
  memcpy(out->peak, ms.peak, sizeof out->peak);
  memcpy(out->cur, ms.cur, sizeof out->cur);
  out->peak_total = ms.peak_total;
  for (int i = 0; i < RT_NPHASE; i++) out->phase_us[i] = us[i];   /* rt_phase and dev_timer agree */
  for (int i = 0; i < COLL_NKIND; i++) {
    out->sent[i] = sent1[i] - sent0[i];
    out->sent_inter[i] = inter1[i] - inter0[i];
  }
  trace_end(rt->trace, TRACE_HOST, TRACE_STEP, TRACE_NO_UNIT, step, trace_now_us());
  return FSDP_OK;
}

/* ---- validation ---- */

/* One forward pass over the micro-batch in token slot 0, its Σ loss into rt->scal[0]: the
 * forward half of micro_step's schedule, every unit released after its forward. */
static fsdp_status eval_forward(runtime_t *rt) {
  const void *root = NULL;
  TRY(forward(rt, rt->inp, 1, &root));
  model_head_forward(rt->acts, rt->p, root, rt->tgt, rt->scal);
  if (sharded(rt)) gather_release(rt, 0);
  return FSDP_OK;
}

fsdp_status runtime_eval(runtime_t *rt, int batches, double *val_loss, double *ms) {
  const plan_t *p = rt->p;
  device_t *d = rt->dev;
  int B = p->batch_size, T = p->model.seq_len;
  uint64_t t0 = now_us();
  if (!rt->val) return fsdp_set_error(FSDP_ERR_STATE, "no validation data: set [data] val");
  if (batches < 1) return fsdp_set_error(FSDP_ERR_RANGE, "eval batches %d; allowed: >= 1", batches);
  d->op->zero(d, rt->scal, PLAN_STEP_SCALARS * sizeof(float));
  fsdp_status rc = FSDP_OK;
  trace_begin(rt->trace, TRACE_HOST, t0);
  span(rt, 0, TRACE_EVAL, TRACE_NO_UNIT);
  for (int m = 0; m < batches && rc == FSDP_OK; m++) {
    /* the stream is idle here (the previous forward was waited for below), so the token buffers
     * are free; the validation rows are the first batches·N·B of the file, rank r's B of each */
    int *ih = rt->inp_h ? rt->inp_h : rt->inp, *th = rt->tgt_h ? rt->tgt_h : rt->tgt;
    TRY(d->op->sync(d));
    TRY(tok_batch(rt->val, m, rt->rank, rt->world, B, T, p->model.vocab_size, ih, th));
    if (rt->inp_h) {
      TRY(d->op->upload(d, rt->inp, ih, (size_t)B * T * sizeof(int)));
      TRY(d->op->upload(d, rt->tgt, th, (size_t)B * T * sizeof(int)));
    }
    rc = eval_forward(rt);
  }
  span(rt, 1, TRACE_EVAL, TRACE_NO_UNIT);
  fsdp_status wrc = wait_pending(rt);
  if (rc == FSDP_OK) rc = wrc;
  TRY(rc);
  float v[2];
  TRY(d->op->download(d, v, rt->scal, sizeof(float)));
  /* The stream is idle after the download; a sync also turns the evaluation's span boundaries into
   * spans on CUDA (resolved only at a sync or timers()), before a trace pull can ask for them. */
  TRY(d->op->sync(d));
  v[1] = (float)((double)batches * B * T);
  TRY(rt_allreduce_host(rt, v, 2));   /* Σ loss and Σ tokens over the ranks */
  *val_loss = (double)v[0] / (double)v[1];
  *ms = (double)(now_us() - t0) / 1000.0;
  trace_end(rt->trace, TRACE_HOST, TRACE_EVAL, TRACE_NO_UNIT, trace_step(rt->trace), now_us());
  return FSDP_OK;
}

const float *runtime_param_shard(const runtime_t *rt) { return rt->param; }

void runtime_destroy(runtime_t **prt) {
  runtime_t *rt = prt ? *prt : NULL;
  if (!rt) return;
  device_t *d = rt->dev;
  /* Outstanding collectives reference our buffers: let them finish (or fail) first, then the
   * stream that may still read them. */
  if (rt->pend) wait_pending(rt);
  d->op->sync(d);
  if (rt->offload) {
    d->op->free_host(d, rt->param);
    d->op->free_host(d, rt->m);
    d->op->free_host(d, rt->v);
    d->op->free_host(d, rt->hgrad);
  } else {
    d->op->free(d, rt->param);
    d->op->free(d, rt->m);
    d->op->free(d, rt->v);
  }
  d->op->free(d, rt->dparam);
  d->op->free(d, rt->lp);
  d->op->free(d, rt->grad);
  model_acts_destroy(&rt->acts);
  d->op->free(d, rt->inp);
  d->op->free(d, rt->tgt);
  free(rt->inp_h);
  free(rt->tgt_h);
  d->op->free(d, rt->scal);
  free(rt->scal_h);
  tok_destroy(&rt->data);
  tok_destroy(&rt->val);
  for (int s = 0; rt->slot_buf && s < rt->nslots; s++) d->op->free(d, rt->slot_buf[s]);
  for (int s = 0; rt->slot_free && s <= rt->nslots; s++) dev_event_destroy(&rt->slot_free[s]);
  free(rt->slot_buf);
  free(rt->slot_unit);
  free(rt->slot_free);
  d->op->free(d, rt->root_buf);
  d->op->free(d, rt->root_act);
  d->op->free(d, rt->blk_act);
  d->op->free(d, rt->droot);
  d->op->free(d, rt->gcomp);
  d->op->free(d, rt->root16);
  d->op->free(d, rt->rootrecv16);
  d->op->free(d, rt->ar16);
  for (int i = 0; i < 2; i++) {
    d->op->free(d, rt->gbuf[i]);
    d->op->free(d, rt->send16[i]);
    d->op->free(d, rt->recv16[i]);
    dev_event_destroy(&rt->gfree[i]);
  }
  for (int u = 0; rt->gdone && u < rt->p->nunits; u++) dev_event_destroy(&rt->gdone[u]);
  dev_event_destroy(&rt->root_done);
  dev_event_destroy(&rt->ar_done);
  dev_event_destroy(&rt->scal_done);
  dev_event_destroy(&rt->ready);
  free(rt->gptr);
  free(rt->gslot);
  free(rt->gdone);
  free(rt->pend);
  free(rt);
  *prt = NULL;
}
