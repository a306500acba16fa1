/* runtime — see runtime.h. The step's schedule, as verbs of the FSDP units (unit.h; docs/design.md §4): gather
 * (unshard), wait (for the gather: the parameters in compute form), release (reshard) and reduce
 * (the gradient to its owners, reduce.h). One micro-step, for sharding full; every arrow is
 * device-stream order, collectives are ordered against it by events (device.h):
 *
 *   gather(root), gather(1..p) ▶ wait(root) ▶ embed ▶ gather(p+1)
 *   for u in 1..L: wait(u) ▶ fwd(u) ▶ release(u) ▶ gather(u+1+p)
 *   gather(L..L−p)  (overlaps the head) ▶ head fwd+bwd into grad(root)
 *   for u in L..1: wait(u) ▶ grad(u) ▶ bwd(u) ▶ release(u) ▶ gather(u−1−p) ▶ reduce(u)   (asynchronous)
 *   embed bwd ▶ release(root) ▶ reduce(root) ▶ the stream waits for every reduction (reduce_finish)
 *
 * release(u) records the event that the next gather into u's pool slot starts after; grad(u) is a
 * gradient buffer that the reduction which last read it is done with. The host waits for
 * collectives only at the end of the step (the watchdog), after the one read-back of the step's
 * scalars. grad_op gathers each unit once per micro-step and releases it after its backward; none
 * has nothing to gather (gather and release do nothing), computes gradients straight into the
 * shard and all-reduces each unit once per step, as soon as its last backward is done. hybrid is
 * full on its group's comm, and in the last micro-step all-reduces each unit's final gradient shard
 * on the replica comm as soon as it is final. The dtype and replica mechanics of reductions are the
 * reducer's (reduce.h); parameters in bf16 are converted to the compute dtype by wait (unit.h).
 * [lora]: the base's units have no gradient and nothing is reduced for them; the frozen root is
 * gathered in parts (the lookup's, released after the embedding; the head's, gathered before the
 * backward's first gathers and released after the head); sharded adapters are units of their own
 * (lora->opt), gathered, waited for and released with each block and reduced after its backward
 * by their reducer, as the base's blocks of a full job are; replicated ones are all-reduced once
 * per step with the step's scalars.
 */
#include "monotime.h"
#include "runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mem.h"
#include "nf4_base.h"
#include "optim.h"
#include "peft.h"
#include "runtime_priv.h"
#include "safetensors.h"
#include "st_model.h"
#include "stepstats.h"

_Static_assert((int)RT_NPHASE == STEPSTATS_NPHASE && (int)RT_NPHASE == (int)DEV_NTIMER, "one list of step phases");

static int hybrid(const runtime_t *rt) { return rt->p->sharding == SHARD_HYBRID; }
/* Blocks are released after their forward and gathered again for the backward (full; hybrid is
 * full inside its group). */
static int regathers(const runtime_t *rt) { return rt->p->sharding == SHARD_FULL || hybrid(rt); }

/* An allocation that says why it failed (the device's allocator, halloc, dev_event_new). */
#define ALLOC(ptr, expr)                              \
  do {                                                \
    if (!((ptr) = (expr))) return FSDP_ERR_NOMEM;     \
  } while (0)

static void *dalloc(runtime_t *rt, mem_category cat, int64_t n, int esz) {
  return rt->dev->op->alloc(rt->dev, cat, (size_t)n * (size_t)esz);
}

/* Host memory; its failure says so (the device's allocator says why for device memory). */
static void *halloc(size_t n, size_t size) {
  void *p = calloc(n, size);
  if (!p) fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes of host memory", n * size);
  return p;
}

/* Synthetic data is one fixed Markov stream whose length depends only on N·B·T, so that N ranks
 * with batch B and one rank with batch N·B read the same tokens. */
static int64_t synthetic_tokens(const runtime_t *rt) {
  int64_t per_batch = (int64_t)rt->world * rt->spec->batch_size * rt->p->model.seq_len;
  int64_t n = 4 * per_batch;
  if (n < (1 << 21)) n = 1 << 21;
  return n + 1;
}

/* The validation rows runtime_eval will read exist and fit the vocabulary: said at the start, not
 * at the first evaluation. */
static fsdp_status check_val(runtime_t *rt) {
  const plan_t *p = rt->p;
  int BT = p->batch_size * p->model.seq_len;
  int *a = calloc((size_t)BT, sizeof(int)), *b = calloc((size_t)BT, sizeof(int));
  fsdp_status rc = a && b ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the validation check");
  for (int m = 0; rc == FSDP_OK && m < rt->spec->eval_batches; m++)
    rc = tok_batch_docs(rt->val, m, rt->rank, rt->world, p->batch_size, p->model.seq_len, p->model.vocab_size, a, b,
                        NULL, NULL);
  free(a);
  free(b);
  if (rc != FSDP_OK) {
    char why[512];   /* the message is rewritten in the buffer it comes from */
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_set_error(rc, "[data] val %s: %s", rt->spec->val_synthetic ? "(synthetic)" : rt->spec->val, why);
  }
  return FSDP_OK;
}

/* Every buffer of the runtime, allocated once: nothing is allocated inside a step. */
static fsdp_status alloc_state(runtime_t *rt) {
  const plan_t *p = rt->p;
  device_t *dev = rt->dev;
  int nu = p->nunits, G = rt->spec->grad_accum, bf16_params = p->param_dtype == DTYPE_BF16;
  int64_t S = p->shard_total, BTG = (int64_t)p->batch_size * p->model.seq_len * G;
  /* [lora]: the frozen base has no optimizer state; offload moves the adapters' (lora_new) */
  rt->offload = rt->spec->offload == OFFLOAD_OPTIMIZER && !p->lora.rank;
  if (rt->offload) {   /* pinned host memory, outside the device's categories: the plan's host_bytes */
    ALLOC(rt->param, dev->op->alloc_host(dev, (size_t)S * 4));
    ALLOC(rt->m, dev->op->alloc_host(dev, (size_t)S * 4));
    ALLOC(rt->v, dev->op->alloc_host(dev, (size_t)S * 4));
    ALLOC(rt->hgrad, dev->op->alloc_host(dev, (size_t)S * 4));
    if (!bf16_params) ALLOC(rt->dparam, dalloc(rt, MEM_PARAM_SHARD, S, 4));
  } else if (p->lora.nf4) {   /* the frozen NF4 base: the root's bf16 shard and the blocks' byte shards */
    S = p->units[0].shard_numel;
    ALLOC(rt->nf4, dalloc(rt, MEM_PARAM_SHARD, (int64_t)rt->L * p->lora.nf4_shard, 1));
  } else if (p->lora.rank) {   /* the frozen base: its shard only, in its own dtype (bf16: no fp32 master) */
    if (!bf16_params) ALLOC(rt->param, dalloc(rt, MEM_PARAM_SHARD, S, 4));
  } else {
    ALLOC(rt->param, dalloc(rt, MEM_PARAM_SHARD, S, 4));
    ALLOC(rt->m, dalloc(rt, MEM_OPTIM_STATE, S, 4));
    ALLOC(rt->v, dalloc(rt, MEM_OPTIM_STATE, S, 4));
  }
  if (bf16_params) ALLOC(rt->lp, dalloc(rt, MEM_PARAM_SHARD, S, 2));
  if (!p->lora.rank) ALLOC(rt->grad, dalloc(rt, MEM_GRAD_SHARD, S, 4));
  ALLOC(rt->acts, model_acts_new(p, dev));
  if (p->lora.rank) {
    TRY(lora_new(p, rt->rank, dev, &rt->lora));
    model_set_lora(rt->acts, rt->lora);
    ALLOC(rt->lora_ready, dev_event_new(dev));
    ALLOC(rt->lora_done, dev_event_new(dev));
  }
  ALLOC(rt->inp, dalloc(rt, MEM_ACTIVATIONS, BTG, sizeof(int)));
  ALLOC(rt->tgt, dalloc(rt, MEM_ACTIVATIONS, BTG, sizeof(int)));
  if (rt->spec->pack && (rt->masked || (rt->val && tok_masked(rt->val))))   /* packed rows, in training or eval */
    ALLOC(rt->seg_h, halloc((size_t)BTG, sizeof(int32_t)));
  if (!dev->host_accessible) {
    ALLOC(rt->inp_h, halloc((size_t)BTG, sizeof(int)));
    ALLOC(rt->tgt_h, halloc((size_t)BTG, sizeof(int)));
  }
  ALLOC(rt->scal, dalloc(rt, MEM_COMM, PLAN_STEP_SCALARS, 4));
  ALLOC(rt->scal_h, halloc(PLAN_STEP_SCALARS, sizeof(float)));
  ALLOC(rt->scal_ready, dev_event_new(dev));
  ALLOC(rt->scal_done, dev_event_new(dev));
  /* per micro-step at most 2 gathers and 1 reduction per unit; hybrid: one cross-group all-reduce
   * per unit per step; sharded adapters: as many again */
  int na = rt->lora && rt->lora->sharded ? nu : 0;
  TRY(reqs_init(&rt->reqs, G * 3 * (nu + na) + nu + na + 8));
  if (!rt->lora) TRY(reduce_new(p, rt->rank, dev, rt->grad, rt->comm, &rt->reqs, &rt->red));
  if (na) {
    lora_ctx *l = rt->lora;
    TRY(reduce_new(l->opt, rt->rank, dev, l->grad, rt->comm, &rt->reqs, &rt->ared));
    TRY(unit_pool_new(l->opt, dev, rt->comm, l->wact, NULL, rt->ared, &rt->reqs, &rt->apool, &rt->aunit));
  }
  const void *shard = rt->lp ? (const void *)rt->lp : rt->dparam ? (const void *)rt->dparam : (const void *)rt->param;
  return unit_pool_new(p, dev, rt->comm, shard, rt->nf4, rt->red, &rt->reqs, &rt->pool, &rt->unit);
}

/* The adapters: peft's initialization from the seed, or [lora] init_from, whole, then (sharded)
 * this rank's shard of it. */
static fsdp_status init_adapters(runtime_t *rt) {
  lora_ctx *l = rt->lora;
  const plan_t *p = rt->p;
  size_t bytes = (size_t)l->n * sizeof(float);
  void *hp = NULL;
  float *whole = NULL;
  TRY(runtime_host_buffer(rt, l->param, bytes, &hp));
  fsdp_status rc = FSDP_OK;
  if (l->sharded && !(whole = halloc((size_t)p->lora.numel, sizeof *whole))) rc = FSDP_ERR_NOMEM;
  float *dst = whole ? whole : hp;
  if (rc == FSDP_OK && rt->spec->lora.init_from[0]) rc = peft_load(p, rt->spec->lora.init_from, dst, "[lora] init_from");
  else if (rc == FSDP_OK) lora_init_values(p, rt->spec->seed, dst);
  if (rc == FSDP_OK && whole) plan_lora_pick(p, p->shard_world, plan_group_rank(p, rt->rank), whole, hp);
  free(whole);
  fsdp_status rc2 = runtime_host_buffer_done(rt, l->param, bytes, hp, rc == FSDP_OK);
  if (rc == FSDP_OK) rc = rc2;
  if (rc == FSDP_OK) rc = lora_refresh(l);
  return rc;
}

/* A frozen bf16 base (no fp32 shard): the loaded fp32 values HP rounded into the bf16 shard. */
static fsdp_status round_frozen_base(runtime_t *rt, const float *hp) {
  int64_t S = rt->p->shard_total;
  void *lp = NULL;
  TRY(runtime_host_buffer(rt, rt->lp, (size_t)S * sizeof(uint16_t), &lp));
  for (int64_t i = 0; i < S; i++) ((uint16_t *)lp)[i] = st_f32_to_bf16(hp[i]);
  return runtime_host_buffer_done(rt, rt->lp, (size_t)S * sizeof(uint16_t), lp, 1);
}

/* An NF4 base: the root's bf16 shard and the blocks' NF4 shards, quantized at load (nf4_base.h). */
static fsdp_status init_nf4_base(runtime_t *rt) {
  const plan_t *p = rt->p;
  size_t rb = (size_t)p->units[0].shard_numel * sizeof(uint16_t), nb = (size_t)rt->L * (size_t)p->lora.nf4_shard;
  void *root = NULL, *blocks = NULL;
  fsdp_status rc = runtime_host_buffer(rt, rt->lp, rb, &root);
  if (rc == FSDP_OK) rc = runtime_host_buffer(rt, rt->nf4, nb, &blocks);
  if (rc == FSDP_OK) rc = nf4_base_load(rt->spec, p, rt->rank, root, blocks);
  fsdp_status rc2 = runtime_host_buffer_done(rt, rt->nf4, nb, blocks, rc == FSDP_OK);
  fsdp_status rc3 = runtime_host_buffer_done(rt, rt->lp, rb, root, rc == FSDP_OK);
  if (rc == FSDP_OK) rc = rc2 != FSDP_OK ? rc2 : rc3;
  if (rc == FSDP_OK)
    log_info("rank %d: quantized its part of the base to NF4 (%lld bytes of blocks)", rt->rank, (long long)nb);
  return rc;
}

/* Parameters: this rank's shard only, never the whole model, from the seed or spec->init. A frozen
 * bf16 base is read through a host buffer of fp32 that is freed once it is rounded. */
static fsdp_status init_params(runtime_t *rt) {
  size_t bytes = (size_t)rt->p->shard_total * sizeof(float);
  void *hp = NULL;
  fsdp_status rc = FSDP_OK;
  if (rt->nf4) {
    TRY(init_nf4_base(rt));
    return init_adapters(rt);
  }
  if (rt->param) TRY(runtime_host_buffer(rt, rt->param, bytes, &hp));
  else if (!(hp = halloc(bytes, 1))) return FSDP_ERR_NOMEM;
  if (strcmp(rt->spec->init, "random") == 0) {
    model_init_shard(rt->p, rt->spec->seed, rt->rank, hp);
  } else {
    st_model *f = NULL;   /* opens only the files that hold this rank's ranges */
    rc = st_model_open(rt->spec->init, &f);
    if (rc == FSDP_OK) rc = st_model_load_shard(f, rt->p, rt->rank, hp);
    if (rc == FSDP_OK)
      log_info("rank %d: read its shard from %d of the %d files of %s", rt->rank, st_model_opened(f),
               st_model_nfiles(f), rt->spec->init);
    st_model_destroy(&f);
  }
  fsdp_status rc2 = FSDP_OK;
  if (rt->param) {
    rc2 = runtime_host_buffer_done(rt, rt->param, bytes, hp, rc == FSDP_OK);
  } else {
    if (rc == FSDP_OK) rc2 = round_frozen_base(rt, hp);
    free(hp);
  }
  if (rc == FSDP_OK) rc = rc2;
  if (rc == FSDP_OK && rt->lora) rc = init_adapters(rt);
  return rc == FSDP_OK ? runtime_refresh_lp(rt) : rc;
}

/* Rows of documents for a masked stream F ([data] KEY), and pack = false refused on a plain one. */
static fsdp_status data_rows(runtime_t *rt, tok_file *f, const char *key) {
  if (!tok_masked(f) && rt->spec->pack) return FSDP_OK;   /* plain text: the continuous stream */
  fsdp_status rc = tok_set_rows(f, rt->spec->pack, rt->p->model.seq_len);
  if (rc != FSDP_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_set_error(rc, "[data] %s: %s", key, why);
  }
  return FSDP_OK;
}

/* The training data and, with [data] val, the validation data (opened before the buffers: masked
 * data decides some of them). */
static fsdp_status open_data(runtime_t *rt) {
  const jobspec_t *spec = rt->spec;
  int V = rt->p->model.vocab_size;
  if (spec->synthetic)
    TRY(tok_open_markov(spec->markov_seed, V, synthetic_tokens(rt), &rt->data));
  else
    TRY(tok_open(spec->train, &rt->data));
  tok_set_shuffle(rt->data, spec->shuffle, spec->seed);
  TRY(data_rows(rt, rt->data, "train"));
  rt->masked = tok_masked(rt->data);
  if (spec->val_synthetic)   /* validation reads its rows in file order */
    TRY(tok_open_markov(spec->val_markov_seed, V, synthetic_tokens(rt), &rt->val));
  else if (spec->val[0])
    TRY(tok_open(spec->val, &rt->val));
  if (rt->val) TRY(data_rows(rt, rt->val, "val"));
  return FSDP_OK;
}

fsdp_status runtime_new(const jobspec_t *spec, const plan_t *p, int rank, comm_t *comm, device_t *dev,
                        runtime_t **out) {
  fsdp_status rc = FSDP_OK;
  *out = NULL;
  if (rank < 0 || rank >= p->world || comm_world(comm) != p->world || comm_rank(comm) != rank)
    return fsdp_set_error(FSDP_ERR_INVALID, "rank %d of %d does not match the communicator (rank %d of %d)", rank,
                          p->world, comm_rank(comm), comm_world(comm));
  if (p->lora.nf4 && p->param_dtype != DTYPE_BF16)   /* the rules set it (jobspec_rules.c) */
    return fsdp_set_error(FSDP_ERR_INVALID, "[lora] base_dtype = nf4 holds its root and working unit in bf16; "
                          "allowed: param_dtype = bf16");
  runtime_t *rt = calloc(1, sizeof *rt);
  if (!rt) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the runtime");
  rt->spec = spec, rt->p = p, rt->rank = rank, rt->world = p->world, rt->comm = comm, rt->dev = dev;
  rt->optim = optim_config_of(spec);
  rt->gcomm = comm;   /* hybrid: runtime_set_groups replaces it */
  rt->L = p->model.n_layer;
  if (dev->op->bind) TRY_GOTO(dev->op->bind(dev, p, rank), rc, fail);   /* per-job device state (CUDA) */
  TRY_GOTO(open_data(rt), rc, fail);
  rc = alloc_state(rt);
  if (rc == FSDP_ERR_NOMEM) {   /* the allocator said what failed; say what it was for */
    char why[512];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    fsdp_set_error(rc, "rank %d: out of memory allocating its shards and buffers (plan predicts %.1f MiB): %s", rank,
                   (double)p->mem_total / (1 << 20), why);
  }
  if (rc != FSDP_OK) goto fail;
  TRY_GOTO(init_params(rt), rc, fail);
  if (rt->val && spec->eval_every > 0) TRY_GOTO(check_val(rt), rc, fail);
  *out = rt;
  return FSDP_OK;
fail:
  runtime_destroy(&rt);
  return rc;
}

void runtime_test_drop_gather_wait(runtime_t *rt, int on) { unit_pool_test_drop_wait(rt->pool, on); }
void runtime_test_keep_adapters(runtime_t *rt, int on) { rt->test_keep_adapters = on; }

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
  unit_pool_set_comm(rt->pool, group);
  if (rt->red) reduce_set_comms(rt->red, group, replica);   /* [lora]: no reducer */
  if (rt->apool) {   /* sharded adapters: as the base's blocks */
    unit_pool_set_comm(rt->apool, group);
    reduce_set_comms(rt->ared, group, replica);
  }
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

/* ---- one micro-step ---- */

/* A block's verbs: the base's unit and, with sharded adapters, the adapters' unit beside it (its
 * gathered form and gradient buffer handed to the adapters' verbs, lora_set_block). */
static fsdp_status block_gather(runtime_t *rt, int u) {
  TRY(unit_gather(&rt->unit[u]));
  return rt->apool ? unit_gather(&rt->aunit[u]) : FSDP_OK;
}
static const void *block_wait(runtime_t *rt, int u) {
  const void *w = unit_wait(&rt->unit[u]);
  if (rt->apool) lora_set_block(rt->lora, unit_wait(&rt->aunit[u]), NULL);
  return w;
}
static void block_release(runtime_t *rt, int u) {
  unit_release(&rt->unit[u]);
  if (rt->apool) unit_release(&rt->aunit[u]);
}

/* [lora]'s frozen root is gathered in parts where it is sharded: what the lookup reads, released
 * after the lookup, and what the head reads, gathered for the head (unit_gather_root_part). */
static int root_parts(const runtime_t *rt) { return rt->lora && rt->p->sharding != SHARD_NONE; }
static fsdp_status root_gather(runtime_t *rt, int part) {
  return root_parts(rt) ? unit_gather_root_part(&rt->unit[0], part) : unit_gather(&rt->unit[0]);
}

/* The forward half of the schedule: the root and the blocks gathered as they are computed (with
 * `prefetch` in flight), each block released after its forward when RELEASE; *W0 gets the root's
 * parameters in compute form, which stay until the caller releases the root (root parts: NULL, the
 * lookup's part released after the lookup). */
static fsdp_status forward(runtime_t *rt, const int *inp, int release, const void **w0) {
  const plan_t *p = rt->p;
  fsdp_unit *root = &rt->unit[0];
  int L = rt->L, ahead = 1 + p->prefetch;
  int next = 1;   /* the next block to gather */
  /* the root, and with prefetch the first blocks in flight while the root is waited for */
  TRY(root_gather(rt, 0));
  while (next <= L && next <= p->prefetch) TRY(block_gather(rt, next++));
  *w0 = unit_wait(root);
  span(rt, 0, TRACE_FORWARD, 0);
  model_embed_forward(rt->acts, p, *w0, inp);
  span(rt, 1, TRACE_FORWARD, 0);
  if (root_parts(rt)) {
    unit_release(root);
    *w0 = NULL;
  }
  while (next <= L && next <= ahead) TRY(block_gather(rt, next++));
  for (int u = 1; u <= L; u++) {
    const void *w = block_wait(rt, u);
    span(rt, 0, TRACE_FORWARD, u);
    model_block_forward(rt->acts, p, u - 1, w);
    span(rt, 1, TRACE_FORWARD, u);
    if (release) block_release(rt, u);
    if (next <= L) TRY(block_gather(rt, next++));
  }
  return FSDP_OK;
}

/* Micro-step K of the step (LAST: the step's last): forward, loss, backward, and every unit's
 * gradient reduced; see the schedule at the top. */
static fsdp_status micro_step(runtime_t *rt, int k, int last, float dscale) {
  const plan_t *p = rt->p;
  fsdp_unit *unit = rt->unit, *root = &unit[0];
  int L = rt->L, full = regathers(rt);
  int ahead = 1 + p->prefetch;   /* units live at once: the one computed plus `prefetch` ahead */
  int64_t BT = (int64_t)p->batch_size * p->model.seq_len;
  const int *inp = rt->inp + k * BT, *tgt = rt->tgt + k * BT;
  const void *w0 = NULL;
  TRY(model_set_docs(rt->acts, p, rt->seg_h ? rt->seg_h + k * BT : NULL));
  TRY(forward(rt, inp, full, &w0));   /* grad_op keeps the blocks gathered for the backward */

  /* backward: full re-gathers from the last block down; the first gathers overlap the head (root
   * parts: after the head's part, which it waits for first) */
  int prev = L;
  if (root_parts(rt)) {
    TRY(root_gather(rt, 1));
    w0 = unit_wait(root);
  }
  if (full)
    while (prev >= 1 && L - prev < ahead) TRY(block_gather(rt, prev--));
  /* [lora]: no unit of the base has a gradient; replicated adapters accumulate theirs in place,
   * sharded ones in their units' buffers, reduced as the base's would be */
  int frozen = rt->lora != NULL;
  if (!frozen) {
    reduce_begin(rt->red, k > 0, last);
    TRY(unit_grad(root));   /* the head's gradient goes to the root (GPT-2's tied wte) */
  }
  if (rt->ared) reduce_begin(rt->ared, k > 0, last);
  span(rt, 0, TRACE_LOSS, 0);
  model_head_forward_backward(rt->acts, p, w0, root->grad, tgt, dscale, rt->scal);
  span(rt, 1, TRACE_LOSS, 0);
  if (root_parts(rt)) unit_release(root);
  for (int u = L; u >= 1; u--) {
    fsdp_unit *b = &unit[u], *a = rt->apool ? &rt->aunit[u] : NULL;
    const void *w = block_wait(rt, u);
    if (!frozen) TRY(unit_grad(b));
    if (a) {
      TRY(unit_grad(a));
      lora_set_block(rt->lora, rt->lora->wblk, a->grad);
    }
    span(rt, 0, TRACE_BACKWARD, u);
    model_block_backward(rt->acts, p, u - 1, w, b->grad);
    span(rt, 1, TRACE_BACKWARD, u);
    block_release(rt, u);
    if (full && prev >= 1) TRY(block_gather(rt, prev--));
    if (!frozen) TRY(unit_reduce(b));
    if (a) TRY(unit_reduce(a));
  }
  span(rt, 0, TRACE_BACKWARD, 0);
  model_embed_backward(rt->acts, p, root->grad, inp);
  span(rt, 1, TRACE_BACKWARD, 0);
  if (!root_parts(rt)) unit_release(root);
  if (frozen) return rt->ared ? reduce_finish(rt->ared) : FSDP_OK;
  TRY(unit_reduce(root));
  return reduce_finish(rt->red);   /* the shard holds the sums before the next micro-step adds to them */
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
  rt->trained = 0;
  for (int k = 0; k < G; k++) {
    int64_t mb = (int64_t)(step - 1) * G + k, o = (int64_t)k * B * T, n;
    TRY(tok_batch_docs(rt->data, mb, rt->rank, rt->world, B, T, p->model.vocab_size, ih + o, th + o,
                       rt->seg_h ? rt->seg_h + o : NULL, &n));
    rt->trained += n;
  }
  if (rt->inp_h) {
    TRY(rt->dev->op->upload(rt->dev, rt->inp, ih, bytes));
    TRY(rt->dev->op->upload(rt->dev, rt->tgt, th, bytes));
  }
  return FSDP_OK;
}

/* The optimizer phase's collective part: the local squared gradient norm and the trained-token
 * count (B·T·G for plain text) beside the loss sum, one all-reduce of PLAN_STEP_SCALARS floats on the device (skipped when not
 * OK: a micro-step failed), the watchdog over every collective of the step, and the step's one
 * read-back into rt->scal_h. */
static fsdp_status step_scalars(runtime_t *rt, int ok) {
  const plan_t *p = rt->p;
  device_t *d = rt->dev;
  comm_req *sreq = NULL;
  fsdp_status rc = FSDP_OK;
  if (ok) {
    d->op->set_timer(d, DEV_T_OPTIM);
    span(rt, 0, TRACE_OPTIMIZER, TRACE_NO_UNIT);
    if (rt->lora && !rt->lora->sharded) {   /* the adapters' gradient, whole on every rank: summed over the world first */
      lora_ctx *l = rt->lora;
      comm_req *areq = NULL;
      d->op->record(d, rt->lora_ready);
      rc = comm_allreduce_ev(rt->comm, l->grad, (size_t)l->n, COMM_F32, rt->lora_ready, rt->lora_done, &areq);
      if (rc == FSDP_OK) rc = reqs_add(&rt->reqs, areq);
      if (rc == FSDP_OK) d->op->wait(d, rt->lora_done, DEV_T_OPTIM);
      d->kern->sumsq(d, rt->scal + 1, l->grad, l->n, 1.0f / (float)p->world);
    } else {
      /* every shard is held by ngroups ranks (none: every rank holds everything); sharded adapters
       * as the base's shards */
      const float *g = rt->lora ? rt->lora->grad : rt->grad;
      int64_t n = rt->lora ? rt->lora->n : p->shard_total;
      d->kern->sumsq(d, rt->scal + 1, g, n, p->ngroups > 1 ? 1.0f / (float)p->ngroups : 1.0f);
    }
    d->kern->fill(d, rt->scal + 3, (float)rt->trained, 1);
    d->op->record(d, rt->scal_ready);
    if (rc == FSDP_OK) rc = comm_allreduce_ev(rt->comm, rt->scal, PLAN_STEP_SCALARS, COMM_F32, rt->scal_ready, rt->scal_done, &sreq);
    if (rc == FSDP_OK) d->op->wait(d, rt->scal_done, DEV_T_OPTIM);
  }
  fsdp_status wrc = reqs_wait(&rt->reqs);   /* the watchdog: every collective of the step */
  if (rc == FSDP_OK) rc = wrc;
  wrc = comm_wait(&sreq);
  if (rc == FSDP_OK) rc = wrc;
  if (rc != FSDP_OK || !ok) return rc;
  return d->op->download(d, rt->scal_h, rt->scal, PLAN_STEP_SCALARS * sizeof(float));
}

/* [lora]: AdamW over the adapters only, the segment (replicated) or this rank's shard: on the device,
 * or with offload on the host (their gradient down, their compute form back up; *HOST_US: its
 * time), as the base's shard below. */
static fsdp_status adapters_update(runtime_t *rt, int step, double lr, float clip, uint64_t *host_us) {
  lora_ctx *l = rt->lora;
  device_t *d = rt->dev;
  if (!l->offload) {
    d->kern->adamw(d, l->opt, l->rank, l->param, l->grad, l->m, l->v, NULL, step, lr, &rt->optim, clip);
    return lora_refresh(l);
  }
  uint64_t t1 = monotime_us();
  TRY(d->op->download(d, l->hgrad, l->grad, (size_t)l->n * sizeof(float)));
  optim_adamw_shard(l->opt, l->rank, l->param, l->hgrad, l->m, l->v, step, lr, &rt->optim, clip);
  if (!rt->test_keep_adapters) TRY(lora_refresh(l));
  *host_us = monotime_us() - t1;
  return FSDP_OK;
}

/* AdamW on the local shard with learning rate LR and clipping factor CLIP: on the device, or with
 * offload on the host (the gradient shard down, the gathered form back up; *HOST_US: its time). */
static fsdp_status optimizer_update(runtime_t *rt, int step, double lr, float clip, uint64_t *host_us) {
  const plan_t *p = rt->p;
  device_t *d = rt->dev;
  *host_us = 0;
  runtime_checkpoint_detach(rt);
  if (rt->lora) return adapters_update(rt, step, lr, clip, host_us);
  if (!rt->offload) {
    d->kern->adamw(d, p, rt->rank, rt->param, rt->grad, rt->m, rt->v, rt->lp, step, lr, &rt->optim, clip);
    return FSDP_OK;
  }
  uint64_t t1 = monotime_us();
  TRY(d->op->download(d, rt->hgrad, rt->grad, (size_t)p->shard_total * sizeof(float)));
  optim_adamw_shard(p, rt->rank, rt->param, rt->hgrad, rt->m, rt->v, step, lr, &rt->optim, clip);
  TRY(runtime_refresh_lp(rt));
  *host_us = monotime_us() - t1;
  return FSDP_OK;
}

fsdp_status runtime_step(runtime_t *rt, int step, rt_report *out) {
  const plan_t *p = rt->p;
  const jobspec_t *s = rt->spec;
  device_t *d = rt->dev;
  int G = s->grad_accum, B = p->batch_size, T = p->model.seq_len;
  uint64_t t0 = monotime_us(), sent0[COLL_NKIND], sent1[COLL_NKIND], us[DEV_NTIMER];
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
  if (rt->lora) d->op->zero(d, rt->lora->grad, (size_t)rt->lora->n * sizeof(float));
  else d->op->zero(d, rt->grad, (size_t)p->shard_total * sizeof(float));
  d->op->zero(d, rt->scal, PLAN_STEP_SCALARS * sizeof(float));
  if (hybrid(rt) && !rt->rcomm)
    return fsdp_set_error(FSDP_ERR_STATE, "sharding = hybrid: the group communicators were not set (runtime_set_groups)");
  fsdp_status rc = FSDP_OK;
  for (int k = 0; k < G && rc == FSDP_OK; k++) rc = micro_step(rt, k, k == G - 1, dscale);
  fsdp_status src = step_scalars(rt, rc == FSDP_OK);
  if (rc == FSDP_OK) rc = src;
  TRY(rc);
  float *scal = rt->scal_h;
  if (scal[2] != 0.0f)
    return fsdp_set_error(FSDP_ERR_RANGE, "step %d: the gradient is not finite on %.0f rank(s) (loss %.4g); "
                          "lower optim.lr or enable optim.grad_clip", step, scal[2], scal[0] / scal[3]);
  /* The backward scaled every token's gradient by 1/tokens (all of them, known before the step);
   * the mean over the trained ones is that times tokens/trained, applied once, folded into the
   * clip factor AdamW multiplies by anyway (docs/design.md §6). Plain text: exactly 1. */
  double rescale = rt->masked && scal[3] > 0 ? (double)tokens / (double)scal[3] : 1.0;
  double norm = sqrt((double)scal[1]) * rescale;
  double lr = optim_lr(s, step);
  uint64_t host_optim = 0;
  /* A step without a trained token (masked data) has no loss and no gradient: no update, as a
   * step that Trainer skips; the schedule still advances. */
  if (scal[3] > 0)
    TRY(optimizer_update(rt, step, lr, (float)(optim_clip_scale(norm, s->grad_clip) * rescale), &host_optim));
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
  out->loss = scal[3] > 0 ? scal[0] / scal[3] : NAN;
  out->lr = lr;
  out->grad_norm = norm;
  out->tokens = tokens;
  out->trained = (uint64_t)scal[3];
  out->step_ms = (double)(monotime_us() - t0) / 1000.0;
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
  trace_end(rt->trace, TRACE_HOST, TRACE_STEP, TRACE_NO_UNIT, step, monotime_us());
  return FSDP_OK;
}

/* ---- validation ---- */

/* One forward pass over the micro-batch in token slot 0, its Σ loss into rt->scal[0]: the
 * forward half of micro_step's schedule, every unit released after its forward. */
static fsdp_status eval_forward(runtime_t *rt) {
  const void *root = NULL;
  TRY(forward(rt, rt->inp, 1, &root));
  if (root_parts(rt)) {
    TRY(root_gather(rt, 1));
    root = unit_wait(&rt->unit[0]);
  }
  model_head_forward(rt->acts, rt->p, root, rt->tgt, rt->scal);
  unit_release(&rt->unit[0]);
  return FSDP_OK;
}

fsdp_status runtime_eval(runtime_t *rt, int batches, double *val_loss, double *ms) {
  const plan_t *p = rt->p;
  device_t *d = rt->dev;
  int B = p->batch_size, T = p->model.seq_len;
  uint64_t t0 = monotime_us();
  if (!rt->val) return fsdp_set_error(FSDP_ERR_STATE, "no validation data: set [data] val");
  if (batches < 1) return fsdp_set_error(FSDP_ERR_RANGE, "eval batches %d; allowed: >= 1", batches);
  d->op->zero(d, rt->scal, PLAN_STEP_SCALARS * sizeof(float));
  fsdp_status rc = FSDP_OK;
  int64_t trained = 0;   /* Σ over the batches of this rank's trained targets (B·T each for plain text) */
  trace_begin(rt->trace, TRACE_HOST, t0);
  span(rt, 0, TRACE_EVAL, TRACE_NO_UNIT);
  for (int m = 0; m < batches && rc == FSDP_OK; m++) {
    /* the stream is idle here (the previous forward was waited for below), so the token buffers
     * are free; the validation rows are the first batches·N·B of the file, rank r's B of each */
    int *ih = rt->inp_h ? rt->inp_h : rt->inp, *th = rt->tgt_h ? rt->tgt_h : rt->tgt;
    TRY(d->op->sync(d));
    int64_t n;
    TRY(tok_batch_docs(rt->val, m, rt->rank, rt->world, B, T, p->model.vocab_size, ih, th, rt->seg_h, &n));
    trained += n;
    TRY(model_set_docs(rt->acts, p, rt->seg_h));
    if (rt->inp_h) {
      TRY(d->op->upload(d, rt->inp, ih, (size_t)B * T * sizeof(int)));
      TRY(d->op->upload(d, rt->tgt, th, (size_t)B * T * sizeof(int)));
    }
    rc = eval_forward(rt);
    /* reqs holds one training step's collectives; every batch gathers every unit again, so each
     * batch's are waited for here (the next batch syncs the stream anyway), or [eval] batches
     * would be bounded by the table's size */
    fsdp_status wrc = reqs_wait(&rt->reqs);
    if (rc == FSDP_OK) rc = wrc;
  }
  span(rt, 1, TRACE_EVAL, TRACE_NO_UNIT);
  TRY(rc);
  /* Σ loss is on the device already: Σ tokens beside it, both summed over the ranks there (NCCL
   * reads no host memory), then the one read-back. The sync also turns the evaluation's span
   * boundaries into spans on CUDA (resolved only at a sync or timers()), before a trace pull can
   * ask for them. */
  d->kern->fill(d, rt->scal + 1, (float)trained, 1);
  TRY(d->op->sync(d));
  TRY(comm_allreduce(rt->comm, rt->scal, 2, COMM_F32, NULL));
  float v[2];
  TRY(d->op->download(d, v, rt->scal, sizeof v));
  *val_loss = v[1] > 0 ? (double)v[0] / (double)v[1] : NAN;   /* no trained target: no loss */
  *ms = (double)(monotime_us() - t0) / 1000.0;
  trace_end(rt->trace, TRACE_HOST, TRACE_EVAL, TRACE_NO_UNIT, trace_step(rt->trace), monotime_us());
  return FSDP_OK;
}

const float *runtime_param_shard(const runtime_t *rt) { return rt->param; }

void runtime_destroy(runtime_t **prt) {
  runtime_t *rt = prt ? *prt : NULL;
  if (!rt) return;
  device_t *d = rt->dev;
  /* Outstanding collectives reference our buffers: let them finish (or fail) first, then the
   * stream that may still read them. */
  reqs_wait(&rt->reqs);
  d->op->sync(d);
  unit_pool_destroy(&rt->pool);
  reduce_destroy(&rt->red);
  unit_pool_destroy(&rt->apool);
  reduce_destroy(&rt->ared);
  reqs_fini(&rt->reqs);
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
  d->op->free(d, rt->nf4);
  d->op->free(d, rt->grad);
  model_acts_destroy(&rt->acts);
  lora_destroy(&rt->lora);
  dev_event_destroy(&rt->lora_ready);
  dev_event_destroy(&rt->lora_done);
  d->op->free(d, rt->inp);
  d->op->free(d, rt->tgt);
  free(rt->inp_h);
  free(rt->tgt_h);
  free(rt->seg_h);
  d->op->free(d, rt->scal);
  free(rt->scal_h);
  tok_destroy(&rt->data);
  tok_destroy(&rt->val);
  dev_event_destroy(&rt->scal_ready);
  dev_event_destroy(&rt->scal_done);
  free(rt);
  *prt = NULL;
}
