/* runtime_ckpt — the runtime's checkpoints, restore and export (docs/checkpoints.md), and the host
 * views of device memory they need; see runtime.h. Everything here runs between steps, with the
 * device stream idle. */
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "ckpt_async.h"
#include "log.h"
#include "mem.h"
#include "monotime.h"
#include "nf4_base.h"
#include "peft.h"
#include "runtime_priv.h"
#include "safetensors.h"
#include "trace.h"

/* ---- host views of device memory ---- */

/* With offload the master and AdamW state are host memory already (the base's, or [lora]'s adapters'). */
static int on_host(const runtime_t *rt, const void *ptr) {
  const lora_ctx *l = rt->lora;
  return rt->dev->host_accessible ||
         (rt->offload && (ptr == rt->param || ptr == rt->m || ptr == rt->v)) ||
         (l && l->offload && (ptr == l->param || ptr == l->m || ptr == l->v));
}

fsdp_status runtime_host_view(runtime_t *rt, const void *dptr, size_t bytes, void **view) {
  device_t *d = rt->dev;
  *view = NULL;
  if (on_host(rt, dptr)) {
    TRY(d->op->sync(d));
    *view = (void *)(uintptr_t)dptr;
    return FSDP_OK;
  }
  void *h = malloc(bytes ? bytes : 1);
  if (!h) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes of host staging", bytes);
  fsdp_status rc = d->op->download(d, h, dptr, bytes);
  if (rc != FSDP_OK) {
    free(h);
    return rc;
  }
  *view = h;
  return FSDP_OK;
}

void runtime_host_view_done(runtime_t *rt, void *view) {
  if (!on_host(rt, view)) free(view);
}

fsdp_status runtime_host_buffer(runtime_t *rt, void *dptr, size_t bytes, void **view) {
  *view = NULL;
  if (on_host(rt, dptr)) {
    TRY(rt->dev->op->sync(rt->dev));
    *view = dptr;
    return FSDP_OK;
  }
  /* zeroed, as a new shard is: its writer fills it whole, so there is nothing to download */
  *view = calloc(bytes ? bytes : 1, 1);
  return *view ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes of host staging", bytes);
}

fsdp_status runtime_host_buffer_done(runtime_t *rt, void *dptr, size_t bytes, void *view, int write) {
  if (!view || on_host(rt, dptr)) return FSDP_OK;
  fsdp_status rc = write ? rt->dev->op->upload(rt->dev, dptr, view, bytes) : FSDP_OK;
  free(view);
  return rc;
}

fsdp_status runtime_refresh_lp(runtime_t *rt) {
  device_t *d = rt->dev;
  int64_t S = rt->p->shard_total;
  if (rt->offload) {   /* from the host master: rounded on the host (staged in hgrad), or copied */
    if (!rt->lp) return d->op->upload(d, rt->dparam, rt->param, (size_t)S * sizeof(float));
    uint16_t *h = (uint16_t *)rt->hgrad;
    for (int64_t i = 0; i < S; i++) h[i] = st_f32_to_bf16(rt->param[i]);
    return d->op->upload(d, rt->lp, h, (size_t)S * sizeof(uint16_t));
  }
  if (!rt->lp || !rt->param) return FSDP_OK;   /* a frozen bf16 base was rounded once, at load */
  d->kern->cast_bf16(d, rt->lp, rt->param, S);
  return d->op->sync(d);
}

fsdp_status runtime_allreduce_host(runtime_t *rt, float *vals, int n) {
  device_t *d = rt->dev;
  if (n > PLAN_STEP_SCALARS) return fsdp_set_error(FSDP_ERR_INTERNAL, "runtime_allreduce_host: %d values", n);
  TRY(d->op->upload(d, rt->scal, vals, (size_t)n * sizeof(float)));
  TRY(comm_allreduce(rt->comm, rt->scal, (size_t)n, COMM_F32, NULL));
  return d->op->download(d, vals, rt->scal, (size_t)n * sizeof(float));
}

/* ---- the whole model on rank 0: export and samples ---- */

fsdp_status runtime_whole_plan(const runtime_t *rt, int batch_size, plan_t **out) {
  jobspec_t s = *rt->spec;
  s.world_size = 1;
  s.sharding = SHARD_NONE;
  s.batch_size = batch_size;
  s.grad_accum = 1;
  s.device = DEVICE_CPU;
  s.param_dtype = s.reduce_dtype = DTYPE_FP32;
  return plan_build(&s, 1, out);
}

/* An NF4 block U into BUF in bf16: its byte shards gathered into IMG, dequantized (nf4_base.h). */
static fsdp_status gather_nf4_block(runtime_t *rt, int u, uint8_t *img, uint16_t *buf) {
  const plan_t *p = rt->p;
  const uint8_t *src = rt->nf4 + (int64_t)(u - 1) * p->lora.nf4_shard;
  if (p->sharding != SHARD_NONE)
    TRY(comm_allgather(rt->gcomm, src, img, (size_t)p->lora.nf4_shard / 2, COMM_BF16, NULL));
  else
    rt->dev->op->copy(rt->dev, img, src, (size_t)p->lora.nf4_padded);
  nf4_base_dequant(rt->dev, &p->units[u], img, buf);
  return FSDP_OK;
}

/* runtime_gather_whole for a frozen bf16 or NF4 base (no fp32 shard): each unit's bf16 shards (an
 * NF4 block's bytes, after the first 2·pb bytes of BUF, dequantized) into BUF, widened into OUT on
 * rank 0. BUF: 4·pb bytes, pb the largest unit's padded elements. */
static fsdp_status gather_whole_bf16(runtime_t *rt, const plan_t *whole, int64_t pb, uint16_t *buf, float *out) {
  const plan_t *p = rt->p;
  fsdp_status rc = FSDP_OK;
  for (int u = 0; u < p->nunits && rc == FSDP_OK; u++) {
    const plan_unit *pu = &p->units[u];
    const uint16_t *src = rt->lp + pu->shard_base;
    if (rt->nf4 && u > 0)
      rc = gather_nf4_block(rt, u, (uint8_t *)(buf + pb), buf);
    else if (p->sharding != SHARD_NONE)
      rc = comm_allgather(rt->gcomm, src, buf, (size_t)pu->shard_numel, COMM_BF16, NULL);
    else
      rt->dev->op->copy(rt->dev, buf, src, (size_t)pu->padded * sizeof(uint16_t));
    void *view = NULL;
    if (rc == FSDP_OK && rt->rank == 0 && out &&
        (rc = runtime_host_view(rt, buf, (size_t)pu->numel * sizeof(uint16_t), &view)) == FSDP_OK) {
      const uint16_t *h = view;
      float *dst = out + whole->units[u].shard_base;
      for (int64_t i = 0; i < pu->numel; i++) dst[i] = st_bf16_to_f32(h[i]);
      runtime_host_view_done(rt, view);
    }
    /* the device's copy and dequantization read IMG and write BUF on its stream: done before the
     * next unit's gather overwrites them on this thread, and before the caller frees BUF */
    if (rc == FSDP_OK) rc = rt->dev->op->sync(rt->dev);
  }
  return rc;
}

fsdp_status runtime_gather_whole(runtime_t *rt, const plan_t *whole, float *out) {
  const plan_t *p = rt->p;
  device_t *d = rt->dev;
  fsdp_status rc = FSDP_OK;
  int64_t pb = 0;
  for (int u = 0; u < p->nunits; u++)
    if (p->units[u].padded > pb) pb = p->units[u].padded;
  TRY(d->op->sync(d));
  float *buf = d->op->alloc(d, MEM_WORKSPACE, (size_t)pb * sizeof(float));   /* one unit at a time */
  if (!buf) return FSDP_ERR_NOMEM;
  if (!rt->param) {   /* a frozen bf16 base: gathered in bf16, widened on rank 0 */
    rc = gather_whole_bf16(rt, whole, pb, (uint16_t *)buf, out);
    d->op->free(d, buf);
    return rc;
  }
  for (int u = 0; u < p->nunits && rc == FSDP_OK; u++) {
    const plan_unit *pu = &p->units[u];
    float *src = rt->param + pu->shard_base;
    if (rt->offload) {   /* the host master's shard to the device first, into this rank's block */
      float *stage = buf + plan_shard_offset(p, u, rt->rank);
      rc = d->op->upload(d, stage, src, (size_t)pu->shard_numel * sizeof(float));
      src = stage;
    }
    if (rc != FSDP_OK) break;
    if (p->sharding != SHARD_NONE)   /* in place when staged: send == recv + rank·count is allowed */
      rc = comm_allgather(rt->gcomm, src, buf, (size_t)pu->shard_numel, COMM_F32, NULL);
    else if (src != buf)
      d->op->copy(d, buf, src, (size_t)pu->padded * sizeof(float));
    void *view = NULL;
    if (rc == FSDP_OK && rt->rank == 0 && out && (rc = runtime_host_view(rt, buf, (size_t)pu->numel * sizeof(float), &view)) == FSDP_OK) {
      memcpy(out + whole->units[u].shard_base, view, (size_t)pu->numel * sizeof(float));
      runtime_host_view_done(rt, view);
    }
    if (rc == FSDP_OK) rc = d->op->sync(d);   /* the stream's copy into BUF done before its reuse or free */
  }
  d->op->free(d, buf);
  return rc;
}

fsdp_status runtime_save(runtime_t *rt, const char *path) {
  plan_t *w = NULL;
  float *whole = NULL;
  float **units = NULL;
  TRY(runtime_whole_plan(rt, 1, &w));
  fsdp_status rc = FSDP_OK;
  if (rt->rank == 0) {
    whole = calloc((size_t)w->shard_total, sizeof(float));
    units = calloc((size_t)w->nunits, sizeof(float *));
    if (!whole || !units) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the whole model for export");
  }
  /* every rank takes part in the gathers, also when rank 0 could not allocate */
  fsdp_status grc = runtime_gather_whole(rt, w, whole ? whole : NULL);
  if (rc == FSDP_OK) rc = grc;
  if (rc == FSDP_OK && rt->rank == 0) {
    for (int u = 0; u < w->nunits; u++) units[u] = whole + w->units[u].shard_base;
    rc = st_save_units(path, w, units);
  }
  free(units);
  free(whole);
  plan_destroy(&w);
  return rc;
}

/* Sharded adapters, whole on every rank of the shard group: its shards all-gathered (a blocking
 * collective into a buffer of W·L·Sa floats, outside any step) and put in order into WHOLE. */
static fsdp_status gather_adapters(runtime_t *rt, float *whole) {
  lora_ctx *l = rt->lora;
  device_t *d = rt->dev;
  int W = rt->p->shard_world;
  size_t n = (size_t)l->n;
  /* offload: the master is host memory, which the comm does not read; gathered from a device copy */
  float *all = d->op->alloc(d, MEM_WORKSPACE, (size_t)(W + (l->offload ? 1 : 0)) * n * sizeof(float));
  if (!all) return FSDP_ERR_NOMEM;
  float *src = l->offload ? all + (size_t)W * n : l->param;
  void *view = NULL;
  fsdp_status rc = d->op->sync(d);
  if (rc == FSDP_OK && l->offload) rc = d->op->upload(d, src, l->param, n * sizeof(float));
  if (rc == FSDP_OK) rc = comm_allgather(rt->gcomm, src, all, n, COMM_F32, NULL);
  if (rc == FSDP_OK) rc = runtime_host_view(rt, all, (size_t)W * n * sizeof(float), &view);
  for (int q = 0; rc == FSDP_OK && q < W; q++) plan_lora_scatter(rt->p, W, q, (const float *)view + (size_t)q * n, whole);
  if (view) runtime_host_view_done(rt, view);
  d->op->free(d, all);
  return rc;
}

fsdp_status runtime_save_adapters(runtime_t *rt, const char *dir) {
  if (!rt->lora) return fsdp_set_error(FSDP_ERR_STATE, "--save-adapter %s: the job has no [lora] adapters", dir);
  if (rt->lora->sharded) {   /* every rank of the group takes part in the gather; rank 0 writes */
    float *whole = malloc((size_t)rt->p->lora.numel * sizeof *whole);
    if (!whole) return fsdp_set_error(FSDP_ERR_NOMEM, "--save-adapter %s: cannot allocate the adapters", dir);
    fsdp_status rc = rt->rank < rt->p->shard_world ? gather_adapters(rt, whole) : FSDP_OK;
    if (rc == FSDP_OK && rt->rank == 0) rc = peft_save(rt->p, whole, dir, rt->spec->from);
    free(whole);
    return rc;
  }
  if (rt->rank != 0) return FSDP_OK;
  void *view = NULL;
  TRY(runtime_host_view(rt, rt->lora->param, (size_t)rt->lora->n * sizeof(float), &view));
  fsdp_status rc = peft_save(rt->p, view, dir, rt->spec->from);
  runtime_host_view_done(rt, view);
  return rc;
}

/* ---- checkpoints (common/ckpt.h, docs/checkpoints.md) ---- */

/* Sum one flag over the ranks: how many ranks had a failure. Also the barrier the protocol needs. */
static fsdp_status count_failures(runtime_t *rt, int failed, int *nfailed, char *ranks, size_t n) {
  /* Summed over ranks: how many failed, and the sum of their ranks, which names the rank exactly
   * when one failed (each failed rank also reports its own reason to the coordinator). */
  float f[2] = {failed ? 1.0f : 0.0f, failed ? (float)rt->rank : 0.0f};
  TRY(runtime_allreduce_host(rt, f, 2));
  *nfailed = (int)f[0];
  if (*nfailed == 1) snprintf(ranks, n, "rank %d", (int)f[1]);
  else snprintf(ranks, n, "%d ranks", *nfailed);
  return FSDP_OK;
}

/* What a checkpoint records as its writer: this plan, or for hybrid the full-sharding plan of one
 * group (the same units, padding and shards: every group holds a full replica, so group 0 alone
 * writes, as a full job of G ranks would; it loads into any world size and sharding), or for [lora]
 * the adapters' segment (plan_lora_segment: replicated, whole on every rank, so rank 0 alone writes;
 * sharded, each rank of the first shard group writes its shard). */
static fsdp_status save_plan(const runtime_t *rt, plan_t **out) {
  *out = NULL;
  if (rt->lora) return plan_lora_segment(rt->p, rt->lora->sharded ? rt->p->shard_world : 1, out);
  if (rt->p->sharding != SHARD_HYBRID) return FSDP_OK;
  jobspec_t s = *rt->spec;
  s.sharding = SHARD_FULL;
  s.shard_group = 0;
  return plan_build(&s, rt->p->shard_world, out);
}

/* [lora]: the base's identity and content hash (ckpt_base_of), taken once. */
static fsdp_status lora_base(runtime_t *rt) {
  if (rt->lora_base_known) return FSDP_OK;
  TRY(ckpt_base_of(rt->spec, &rt->lora_base));
  rt->lora_base_known = 1;
  return FSDP_OK;
}

/* The end of a save, once every rank's write has ended (RC: this rank's): a barrier that tells every
 * rank whether all files are complete and synced; then rank 0 writes the manifest and prunes, or,
 * after a failure, removes the step directory (no partial newer step stays behind); a second
 * barrier, so that every rank returns the same status. */
static fsdp_status settle(runtime_t *rt, const plan_t *p, const char *dir, int step, fsdp_status rc) {
  if (rc != FSDP_OK) log_error("checkpoint step %d: %s", step, fsdp_last_error());
  char err[1024];
  snprintf(err, sizeof err, "%s", fsdp_last_error());
  int nbad = 0;
  char who[64];
  TRY(count_failures(rt, rc != FSDP_OK, &nbad, who, sizeof who));   /* every rank's file is fsync'ed past this point */
  if (nbad) {   /* removed before any rank returns: the job ends with the first rank's error */
    if (rt->rank == 0 && ckpt_discard(dir, step) != FSDP_OK)
      log_warn("checkpoint step %d: removing what it left: %s", step, fsdp_last_error());
    int ignored;
    TRY(count_failures(rt, 0, &ignored, who, sizeof who));
  }
  if (rc != FSDP_OK) return fsdp_set_error(rc, "%s", err);
  /* the echo of other ranks' failures: the coordinator waits for their own messages (JE_WORKER_ERROR,
   * daemon/job.h) */
  if (nbad) return fsdp_set_error(FSDP_ERR_COMM, "checkpoint step %d: %s could not write its file (see its log)",
                                  step, who);
  if (rt->rank == 0) {
    uint64_t per_step = (uint64_t)p->batch_size * p->model.seq_len * rt->spec->grad_accum * rt->world;
    uint64_t tokens = rt->ckpt_tokens0 + (uint64_t)(step - rt->ckpt_step0) * per_step;
    rc = rt->lora ? lora_base(rt) : FSDP_OK;
    if (rc == FSDP_OK)
      rc = ckpt_write_manifest_rows(dir, p, step, tokens, (int64_t)rt->world * p->batch_size * rt->spec->grad_accum,
                                    rt->lora ? &rt->lora_base : NULL);
    if (rc == FSDP_OK && ckpt_prune(dir, rt->spec->ckpt_keep) != FSDP_OK)
      log_warn("checkpoint step %d: pruning old checkpoints: %s", step, fsdp_last_error());
    if (rc != FSDP_OK) {
      log_error("checkpoint step %d: %s", step, fsdp_last_error());
      snprintf(err, sizeof err, "%s", fsdp_last_error());
      if (ckpt_discard(dir, step) != FSDP_OK) log_warn("checkpoint step %d: removing it: %s", step, fsdp_last_error());
    }
  }
  TRY(count_failures(rt, rc != FSDP_OK, &nbad, who, sizeof who));
  if (rc != FSDP_OK) return fsdp_set_error(rc, "%s", err);
  if (nbad) return fsdp_set_error(FSDP_ERR_COMM, "checkpoint step %d: rank 0 could not write the manifest (see its log)", step);
  return FSDP_OK;
}

/* The shards a save writes: parameters, AdamW m and v (the adapters' alone under [lora]). */
static void save_sources(const runtime_t *rt, const float *src[CKPT_NSEC]) {
  src[0] = rt->param, src[1] = rt->m, src[2] = rt->v;
  if (rt->lora) src[0] = rt->lora->param, src[1] = rt->lora->m, src[2] = rt->lora->v;
}

/* This rank's shards as host memory: views (runtime_host_view) for a synchronous save, or device
 * copies into the snapshot BUF (ckpt_async_buffers) for an asynchronous one whose shards are not
 * host memory (those are read in place: live_shards). */
static fsdp_status shard_views(runtime_t *rt, size_t bytes, float *const buf[CKPT_NSEC], void *view[CKPT_NSEC]) {
  const float *src[CKPT_NSEC];
  save_sources(rt, src);
  device_t *d = rt->dev;
  for (int s = 0; s < CKPT_NSEC; s++) {
    if (!buf) TRY(runtime_host_view(rt, src[s], bytes, &view[s]));
    else TRY(d->op->snapshot(d, buf[s], src[s], bytes));
  }
  return FSDP_OK;
}

/* The shards a save writes, in *LIVE, when they are host memory (all three are or none: on_host):
 * an asynchronous save then reads them where they are until the optimizer's next update
 * (ckpt_async_start_live), and takes no snapshot. */
static int live_shards(runtime_t *rt, const float *live[CKPT_NSEC]) {
  save_sources(rt, live);
  for (int s = 0; s < CKPT_NSEC; s++)
    if (!on_host(rt, live[s])) return 0;
  return 1;
}

void runtime_checkpoint_detach(runtime_t *rt) {
  if (!rt->live_save) return;
  double dt = ckpt_async_detach(rt->live_save);
  rt->live_save = NULL;
  if (dt > 0.01) log_info("checkpoint: the optimizer waited %.3f s for the save in flight to copy what it had left", dt);
}

/* The synchronous save with P as the writer's plan; the ranks beyond P's world write no file. */
static fsdp_status checkpoint_as(runtime_t *rt, const plan_t *p, const char *dir, int step, ckpt_save_stats *st) {
  uint64_t t0 = monotime_us();
  size_t bytes = (size_t)p->shard_total * sizeof(float);
  void *h[CKPT_NSEC] = {NULL, NULL, NULL};
  fsdp_status rc = FSDP_OK;
  if (rt->rank < p->world) {
    rc = shard_views(rt, bytes, NULL, h);
    if (rc == FSDP_OK) rc = ckpt_write_rank(dir, p, rt->rank, step, step, h[0], h[1], h[2]);
    st->bytes = ckpt_rank_file_bytes(p);
  }
  for (int s = 0; s < CKPT_NSEC; s++) runtime_host_view_done(rt, h[s]);
  TRY(settle(rt, p, dir, step, rc));
  st->step = step;
  st->t0_us = t0, st->t1_us = monotime_us();
  st->blocked_s = st->write_s = (double)(st->t1_us - t0) / 1e6;
  trace_add(rt->trace, TRACE_HOST, TRACE_CKPT_SNAPSHOT, TRACE_NO_UNIT, step, t0, st->t1_us);
  trace_add(rt->trace, TRACE_CKPT, TRACE_CKPT_WRITE, TRACE_NO_UNIT, step, t0, st->t1_us);
  if (rt->rank == 0) log_info("checkpoint of step %d written to %s in %.2f s", step, dir, st->write_s);
  return FSDP_OK;
}

fsdp_status runtime_checkpoint(runtime_t *rt, const char *dir, int step, ckpt_save_stats *st) {
  plan_t *group = NULL;
  *st = (ckpt_save_stats){0};
  TRY(save_plan(rt, &group));
  fsdp_status rc = checkpoint_as(rt, group ? group : rt->p, dir, step, st);
  plan_destroy(&group);
  return rc;
}

fsdp_status runtime_checkpoint_settle(runtime_t *rt, ckpt_async *a, int wait, ckpt_save_stats *done) {
  *done = (ckpt_save_stats){0};
  if (!a || !ckpt_async_pending(a)) return FSDP_OK;   /* the same on every rank */
  if (!wait) {   /* every rank's write has ended, or the save stays in flight */
    int nbusy = 0;
    char who[64];
    TRY(count_failures(rt, !ckpt_async_finished(a), &nbusy, who, sizeof who));
    if (nbusy) return FSDP_OK;
  }
  ckpt_save_stats st;
  fsdp_status rc = ckpt_async_wait(a, &st);
  TRY(settle(rt, ckpt_async_plan(a), ckpt_async_dir(a), st.step, rc));
  if (st.bytes) trace_add(rt->trace, TRACE_CKPT, TRACE_CKPT_WRITE, TRACE_NO_UNIT, st.step, st.t0_us, st.t1_us);
  if (rt->rank == 0)
    log_info("checkpoint of step %d written to %s in %.2f s (training blocked %.3f s)", st.step, ckpt_async_dir(a),
             st.write_s, st.blocked_s);
  *done = st;
  return FSDP_OK;
}

fsdp_status runtime_checkpoint_prepare(runtime_t *rt, ckpt_async *a) {
  plan_t *group = NULL;
  TRY(save_plan(rt, &group));
  const plan_t *p = group ? group : rt->p;
  float *buf[CKPT_NSEC];
  fsdp_status rc = rt->rank < p->world ? ckpt_async_buffers(a, rt->dev, (size_t)p->shard_total * sizeof(float), buf) : FSDP_OK;
  plan_destroy(&group);
  return rc;
}

fsdp_status runtime_checkpoint_async(runtime_t *rt, ckpt_async *a, const char *dir, int step, ckpt_save_stats *done) {
  uint64_t t0 = monotime_us();
  TRY(runtime_checkpoint_settle(rt, a, 1, done));   /* at most one save in flight */
  double wait_s = (double)(monotime_us() - t0) / 1e6;
  if (wait_s > 0.001 && rt->rank == 0)
    log_info("checkpoint step %d waited %.2f s for the save of step %d to end", step, wait_s, done->step);
  plan_t *group = NULL;
  TRY(save_plan(rt, &group));
  const plan_t *p = group ? group : rt->p;
  size_t bytes = (size_t)p->shard_total * sizeof(float);
  float *buf[CKPT_NSEC];
  const float *live[CKPT_NSEC];
  int writes = rt->rank < p->world, is_live = writes && live_shards(rt, live);
  fsdp_status rc = FSDP_OK;
  if (writes) {
    rc = ckpt_async_buffers(a, rt->dev, bytes, buf);
    if (rc == FSDP_OK) rc = is_live ? rt->dev->op->sync(rt->dev) : shard_views(rt, bytes, buf, NULL);
  }
  int nbad = 0;
  char who[64];
  fsdp_status arc = count_failures(rt, rc != FSDP_OK, &nbad, who, sizeof who);
  if (rc == FSDP_OK && arc == FSDP_OK && nbad)
    rc = fsdp_set_error(FSDP_ERR_COMM, "checkpoint step %d: %s could not take the snapshot (see its log)", step, who);
  if (rc == FSDP_OK) rc = arc;
  if (rc != FSDP_OK) {
    plan_destroy(&group);
    return rc;
  }
  uint64_t t1 = monotime_us();
  trace_add(rt->trace, TRACE_HOST, TRACE_CKPT_SNAPSHOT, TRACE_NO_UNIT, step, t0, t1);
  ckpt_save_stats st = {.step = step, .wait_s = wait_s, .blocked_s = (double)(t1 - t0) / 1e6};
  if (is_live) {
    ckpt_async_start_live(a, dir, p, &group, rt->rank, step, &st, live);
    rt->live_save = a;
  } else {
    ckpt_async_start(a, dir, p, &group, rt->rank, step, &st);
  }
  return FSDP_OK;
}

/* This rank's shards from the checkpoint CI, resharded from its writer's layout. */
static fsdp_status restore_shards(runtime_t *rt, const char *dir, const ckpt_info *ci, int64_t *ostep) {
  const plan_t *p = rt->p;
  fsdp_status rc = FSDP_OK;
  /* A partial (resharding) read cannot check the CRCs of what it reads: the ranks split the rank
   * files between them and each verifies its share whole. Same layout: every rank reads its own
   * file whole, and that read checks every CRC. */
  if (!ckpt_same_layout(ci, p)) rc = ckpt_verify(dir, ci, rt->rank, rt->world);
  size_t bytes = (size_t)p->shard_total * sizeof(float);
  float *dst[3] = {rt->param, rt->m, rt->v};
  void *h[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 3 && rc == FSDP_OK; i++) rc = runtime_host_buffer(rt, dst[i], bytes, &h[i]);
  if (rc == FSDP_OK) rc = ckpt_load_shard(dir, ci, rt->spec, p, rt->rank, h[0], h[1], h[2], ostep);
  /* every staging buffer is freed, written back only after a complete load (a failed restore fails
   * on every rank: the shards are not trained on) */
  int loaded = rc == FSDP_OK;
  for (int i = 0; i < 3; i++) {
    fsdp_status wrc = runtime_host_buffer_done(rt, dst[i], bytes, h[i], loaded);
    if (rc == FSDP_OK) rc = wrc;
  }
  return rc == FSDP_OK ? runtime_refresh_lp(rt) : rc;
}

/* [lora]: the adapters and their AdamW state, whole, from the checkpoint's files (every rank reads
 * them: whoever wrote them, they load into any world size and layout), then (sharded) this rank's
 * shard of them; the base stays as init read it. Rank 0 checks that the base's content hash is the
 * checkpoint's (the others' refusal follows from its). */
static fsdp_status restore_adapters(runtime_t *rt, const char *dir, const ckpt_info *ci, int64_t *ostep) {
  lora_ctx *l = rt->lora;
  const plan_t *p = rt->p;
  if (rt->rank == 0) TRY(lora_base(rt));
  TRY(ckpt_lora_check(dir, ci, p, rt->rank == 0 ? &rt->lora_base : NULL));
  size_t bytes = (size_t)l->n * sizeof(float), na = (size_t)p->lora.numel;
  float *dst[3] = {l->param, l->m, l->v};
  void *h[3] = {NULL, NULL, NULL};
  float *whole = l->sharded ? malloc(3 * na * sizeof *whole) : NULL;
  fsdp_status rc = !l->sharded || whole ? FSDP_OK
                   : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes of host memory to read the adapters",
                                    3 * na * sizeof *whole);
  for (int i = 0; i < 3 && rc == FSDP_OK; i++) rc = runtime_host_buffer(rt, dst[i], bytes, &h[i]);
  if (rc == FSDP_OK && whole) {
    rc = ckpt_lora_load(dir, ci, p, whole, whole + na, whole + 2 * na, ostep);
    for (int i = 0; i < 3 && rc == FSDP_OK; i++)
      plan_lora_pick(p, p->shard_world, plan_group_rank(p, rt->rank), whole + i * na, h[i]);
  } else if (rc == FSDP_OK) {
    rc = ckpt_lora_load(dir, ci, p, h[0], h[1], h[2], ostep);
  }
  free(whole);
  int loaded = rc == FSDP_OK;
  for (int i = 0; i < 3; i++) {
    fsdp_status wrc = runtime_host_buffer_done(rt, dst[i], bytes, h[i], loaded);
    if (rc == FSDP_OK) rc = wrc;
  }
  if (rc == FSDP_OK) rc = lora_refresh(l);
  return rc;
}

fsdp_status runtime_restore(runtime_t *rt, const char *dir, int *step) {
  const plan_t *p = rt->p;
  *step = 0;
  int s = 0;
  fsdp_status rc = ckpt_latest(dir, &s);
  if (rc == FSDP_ERR_NOTFOUND) s = 0, rc = FSDP_OK;
  /* Every rank must pick the same checkpoint: sum (failed, step high bits, step low bits). */
  float agree[3] = {rc != FSDP_OK, (float)(s >> 12), (float)(s & 4095)};
  char err[1024];
  snprintf(err, sizeof err, "%s", fsdp_last_error());
  TRY(runtime_allreduce_host(rt, agree, 3));
  if (rc != FSDP_OK) return fsdp_set_error(rc, "%s", err);
  if (agree[0] != 0) return fsdp_set_error(FSDP_ERR_IO, "%.0f rank(s) could not read %s (see their logs)", agree[0], dir);
  if (agree[1] != (float)(s >> 12) * rt->world || agree[2] != (float)(s & 4095) * rt->world)
    return fsdp_set_error(FSDP_ERR_STATE, "ranks see different newest checkpoints in %s (this one: step %d); "
                          "the directory must be shared and not written meanwhile", dir, s);
  if (s == 0) {
    if (rt->rank == 0) log_info("no complete checkpoint in %s: starting from step 0", dir);
    return FSDP_OK;
  }

  uint64_t t0 = monotime_us();
  ckpt_info ci;
  int64_t ostep = -1;
  rc = ckpt_read_manifest(dir, s, &ci);
  if (rc == FSDP_OK) rc = rt->lora ? restore_adapters(rt, dir, &ci, &ostep) : restore_shards(rt, dir, &ci, &ostep);
  if (rc == FSDP_OK && ostep != s)
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "checkpoint step %d in %s: its files say the optimizer took %lld steps", s, dir,
                        (long long)ostep);
  if (rc != FSDP_OK) log_error("restoring step %d: %s", s, fsdp_last_error());
  snprintf(err, sizeof err, "%s", fsdp_last_error());
  int nbad = 0;
  char who[64];
  TRY(count_failures(rt, rc != FSDP_OK, &nbad, who, sizeof who));
  if (rc != FSDP_OK) return fsdp_set_error(rc, "%s", err);
  if (nbad)   /* a peer's failure: secondary, so the coordinator names the rank that failed (above) */
    return fsdp_set_error(FSDP_ERR_COMM, "%s could not restore checkpoint step %d from %s (see its log)", who, s, dir);
  rt->ckpt_step0 = s;
  rt->ckpt_tokens0 = ci.tokens;
  int64_t rows = (int64_t)p->world * p->batch_size * rt->spec->grad_accum;
  if (rt->rank == 0) {
    log_info("resumed from checkpoint step %d in %s (written by %d rank(s), sharding %s) in %.2f s", s, dir, ci.world,
             jobspec_shard_mode_name(ci.sharding), (double)(monotime_us() - t0) / 1e6);
    if (ci.rows_per_step != rows)
      log_warn("N·B·G changed from %lld to %lld rows per step: the data order does not continue where it stopped",
               (long long)ci.rows_per_step, (long long)rows);
  }
  *step = s;
  return FSDP_OK;
}
