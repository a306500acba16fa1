/* runtime — see runtime.h. The schedule of one micro-step (DESIGN.md §4), for sharding full:
 *
 *   AG(root), AG(1..p) ▶ wait AG(root) ▶ embed ▶ AG(p+1)
 *   for u in 1..L: wait AG(u) ▶ fwd(u) ▶ free(u) ▶ AG(u+1+p)
 *   AG(L..L−p)  (overlaps the head) ▶ head fwd+bwd
 *   for u in L..1: wait AG(u) ▶ bwd(u) ▶ free(u) ▶ AG(u−1−p) ▶ RS(grad u)   (RS async)
 *   embed bwd ▶ RS(grad root) ▶ wait every RS ▶ free(root)
 *
 * grad_op gathers each unit once per micro-step and frees it after its backward; none has nothing to
 * gather, computes gradients straight into the shard and all-reduces each unit once per step, as
 * soon as its last backward is done. Gradients are accumulated over micro-steps in the reduce-scatter
 * itself: a rank adds its accumulated shard into its own block of the send buffer before reducing,
 * so the sum it receives is the new total.
 */
#include "runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt.h"
#include "log.h"
#include "mem.h"
#include "model_gpt2.h"
#include "optim.h"
#include "safetensors.h"
#include "tokens.h"

struct runtime {
  const jobspec_t *spec;
  const plan_t *p;
  int rank, world, L;
  comm_t *comm;
  float *param, *grad, *m, *v;   /* shard_total floats each */
  gpt2_acts *acts;
  tok_file *data;
  int *inp, *tgt;                /* B·T */

  /* gathered parameters: the root's own buffer, and a pool of block buffers (1+prefetch for full,
   * one per block for grad_op) handed out per unit */
  float *root_buf;
  int nslots;
  float **slot_buf;
  int *slot_unit;                /* -1 when free */
  float **gptr;                  /* per unit: where its gathered parameters are, NULL if not gathered */
  int *gslot;                    /* per unit: its pool slot */
  comm_req **greq;               /* per unit: pending all-gather */

  /* full-size unit gradients: the root's, and two alternating block buffers */
  float *droot;
  float *gbuf[2];
  comm_req *gbuf_req[2];
  int gnext;
  comm_req *root_req;
  comm_req **arreq;              /* sharding none: per-unit all-reduce */

  uint64_t phase_us[RT_NPHASE];

  /* set by runtime_restore: the step resumed after and the tokens consumed up to it */
  int ckpt_step0;
  uint64_t ckpt_tokens0;
};

static const char *const phase_names[RT_NPHASE] = {"allgather", "compute", "reducescatter", "optimizer"};
const char *rt_phase_name(rt_phase p) { return (unsigned)p < RT_NPHASE ? phase_names[p] : "unknown"; }

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int sharded(const runtime_t *rt) { return rt->p->sharding != SHARD_NONE; }

static float *alloc_f(mem_category cat, int64_t n) { return mem_alloc(cat, (size_t)n * sizeof(float)); }

#define ALLOC_OR(ptr, expr, rc, label)                                                   \
  do {                                                                                   \
    if (!((ptr) = (expr))) {                                                             \
      (rc) = FSDP_ERR_NOMEM;                                                             \
      goto label;                                                                        \
    }                                                                                    \
  } while (0)

/* Synthetic data is one fixed Markov stream whose length depends only on N·B·T, so that N ranks
 * with batch B and one rank with batch N·B read the same tokens. */
static int64_t synthetic_tokens(const runtime_t *rt) {
  int64_t per_batch = (int64_t)rt->world * rt->spec->batch_size * rt->p->model.seq_len;
  int64_t n = 4 * per_batch;
  if (n < (1 << 21)) n = 1 << 21;
  return n + 1;
}

fsdp_status runtime_new(const jobspec_t *spec, const plan_t *p, int rank, comm_t *comm, runtime_t **out) {
  fsdp_status rc = FSDP_OK;
  *out = NULL;
  if (rank < 0 || rank >= p->world || comm_world(comm) != p->world || comm_rank(comm) != rank)
    return fsdp_set_error(FSDP_ERR_INVALID, "rank %d of %d does not match the communicator (rank %d of %d)", rank,
                          p->world, comm_rank(comm), comm_world(comm));
  runtime_t *rt = calloc(1, sizeof *rt);
  if (!rt) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the runtime");
  rt->spec = spec, rt->p = p, rt->rank = rank, rt->world = p->world, rt->comm = comm;
  rt->L = p->model.n_layer;
  int nu = p->nunits, BT = p->batch_size * p->model.seq_len;
  int64_t S = p->shard_total;

  ALLOC_OR(rt->param, alloc_f(MEM_PARAM_SHARD, S), rc, fail);
  ALLOC_OR(rt->grad, alloc_f(MEM_GRAD_SHARD, S), rc, fail);
  ALLOC_OR(rt->m, alloc_f(MEM_OPTIM_STATE, S), rc, fail);
  ALLOC_OR(rt->v, alloc_f(MEM_OPTIM_STATE, S), rc, fail);
  ALLOC_OR(rt->acts, gpt2_acts_new(p), rc, fail);
  ALLOC_OR(rt->inp, mem_alloc(MEM_ACTIVATIONS, (size_t)BT * sizeof(int)), rc, fail);
  ALLOC_OR(rt->tgt, mem_alloc(MEM_ACTIVATIONS, (size_t)BT * sizeof(int)), rc, fail);
  ALLOC_OR(rt->gptr, calloc((size_t)nu, sizeof(float *)), rc, fail);
  ALLOC_OR(rt->gslot, calloc((size_t)nu, sizeof(int)), rc, fail);
  ALLOC_OR(rt->greq, calloc((size_t)nu, sizeof(comm_req *)), rc, fail);
  ALLOC_OR(rt->arreq, calloc((size_t)nu, sizeof(comm_req *)), rc, fail);

  if (sharded(rt)) {
    /* Pool buffers are allocated here, once, and reused: "free" returns a buffer to the pool. */
    int64_t pb = 0;
    for (int u = 1; u < nu; u++)
      if (p->units[u].padded > pb) pb = p->units[u].padded;
    rt->nslots = p->sharding == SHARD_FULL ? 1 + p->prefetch : rt->L;
    if (rt->nslots > rt->L) rt->nslots = rt->L;
    ALLOC_OR(rt->slot_buf, calloc((size_t)rt->nslots, sizeof(float *)), rc, fail);
    ALLOC_OR(rt->slot_unit, calloc((size_t)rt->nslots, sizeof(int)), rc, fail);
    for (int s = 0; s < rt->nslots; s++) {
      int64_t n = p->sharding == SHARD_FULL ? pb : p->units[1 + s].padded;
      ALLOC_OR(rt->slot_buf[s], alloc_f(MEM_GATHERED, n), rc, fail);
      rt->slot_unit[s] = -1;
    }
    ALLOC_OR(rt->root_buf, alloc_f(MEM_GATHERED, p->units[0].padded), rc, fail);
    ALLOC_OR(rt->droot, alloc_f(MEM_COMM, p->units[0].padded), rc, fail);
    for (int i = 0; i < 2; i++) ALLOC_OR(rt->gbuf[i], alloc_f(MEM_COMM, pb), rc, fail);
  }

  /* Parameters: this rank's shard only, never the whole model. */
  if (strcmp(spec->init, "random") == 0) {
    gpt2_init_shard(p, spec->seed, rank, rt->param);
  } else {
    st_file *f = NULL;
    TRY_GOTO(st_open(spec->init, &f), rc, fail);
    rc = st_load_shard(f, p, rank, rt->param);
    st_close(&f);
    if (rc != FSDP_OK) goto fail;
  }
  if (spec->synthetic)
    TRY_GOTO(tok_open_markov(spec->markov_seed, p->model.vocab_size, synthetic_tokens(rt), &rt->data), rc, fail);
  else
    TRY_GOTO(tok_open(spec->train, &rt->data), rc, fail);
  *out = rt;
  return FSDP_OK;
fail:
  if (rc == FSDP_ERR_NOMEM && !strstr(fsdp_last_error(), "allocate"))
    fsdp_set_error(rc, "rank %d: out of memory allocating its shards and buffers (plan predicts %.1f MiB)", rank,
                   (double)p->mem_total / (1 << 20));
  runtime_destroy(&rt);
  return rc;
}

/* ---- gathers ---- */

static fsdp_status gather_issue(runtime_t *rt, int u) {
  const plan_unit *pu = &rt->p->units[u];
  float *dst;
  if (u == 0) {
    dst = rt->root_buf;
  } else {
    int s = -1;
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
    rt->gslot[u] = s;
    dst = rt->slot_buf[s];
  }
  rt->gptr[u] = dst;
  return comm_allgather(rt->comm, rt->param + pu->shard_base, dst, (size_t)pu->shard_numel, COMM_F32, &rt->greq[u]);
}

static fsdp_status gather_wait(runtime_t *rt, int u) {
  if (!rt->greq[u]) return FSDP_OK;
  uint64_t t = now_us();
  fsdp_status rc = comm_wait(&rt->greq[u]);
  rt->phase_us[RT_PHASE_ALLGATHER] += now_us() - t;
  return rc;
}

static void gather_free(runtime_t *rt, int u) {
  if (u > 0) rt->slot_unit[rt->gslot[u]] = -1;
  rt->gptr[u] = NULL;
}

/* ---- gradient reductions ---- */

static fsdp_status wait_req(runtime_t *rt, comm_req **req) {
  if (!*req) return FSDP_OK;
  uint64_t t = now_us();
  fsdp_status rc = comm_wait(req);
  rt->phase_us[RT_PHASE_REDUCESCATTER] += now_us() - t;
  return rc;
}

/* A zeroed full-size gradient buffer, once the reduce-scatter that last used it is done. */
static fsdp_status gbuf_acquire(runtime_t *rt, int64_t n, int *idx) {
  int i = rt->gnext;
  rt->gnext ^= 1;
  TRY(wait_req(rt, &rt->gbuf_req[i]));
  memset(rt->gbuf[i], 0, (size_t)n * sizeof(float));
  *idx = i;
  return FSDP_OK;
}

/* Reduce-scatter unit u's gradient SEND into this rank's gradient shard, accumulating. */
static fsdp_status rs_issue(runtime_t *rt, int u, float *send, int accumulate, comm_req **req) {
  const plan_unit *pu = &rt->p->units[u];
  float *mine = rt->grad + pu->shard_base;
  if (accumulate) {
    float *blk = send + plan_shard_offset(rt->p, u, rt->rank);
    for (int64_t i = 0; i < pu->shard_numel; i++) blk[i] += mine[i];
  }
  return comm_reduce_scatter(rt->comm, send, mine, (size_t)pu->shard_numel, COMM_F32, req);
}

/* ---- one micro-step ---- */

#define COMPUTE(rt, stmt)                                    \
  do {                                                       \
    uint64_t t_ = now_us();                                  \
    stmt;                                                    \
    (rt)->phase_us[RT_PHASE_COMPUTE] += now_us() - t_;       \
  } while (0)

static fsdp_status micro_step(runtime_t *rt, int k, int last, float dscale, double *loss) {
  const plan_t *p = rt->p;
  int L = rt->L, sh = sharded(rt), full = p->sharding == SHARD_FULL;
  int ahead = 1 + p->prefetch;   /* units live at once: the one computed plus `prefetch` ahead */
  float *root, *droot;
  int next = 1;   /* the next block to gather */
  if (sh) {
    /* the root, and with prefetch the first blocks in flight while the root is waited for */
    TRY(gather_issue(rt, 0));
    while (next <= L && next <= p->prefetch) TRY(gather_issue(rt, next++));
    TRY(gather_wait(rt, 0));
    root = rt->gptr[0];
    droot = rt->droot;
  } else {
    root = rt->param + p->units[0].shard_base;
    droot = rt->grad + p->units[0].shard_base;
  }
#define UNIT(u) (sh ? rt->gptr[u] : rt->param + p->units[u].shard_base)

  COMPUTE(rt, gpt2_embed_forward(rt->acts, p, root, rt->inp));

  /* forward */
  if (sh)
    while (next <= L && next <= ahead) TRY(gather_issue(rt, next++));
  for (int u = 1; u <= L; u++) {
    if (sh) TRY(gather_wait(rt, u));
    COMPUTE(rt, gpt2_block_forward(rt->acts, p, u - 1, UNIT(u)));
    if (full) gather_free(rt, u);
    if (sh && next <= L) TRY(gather_issue(rt, next++));
  }

  /* backward: full re-gathers from the last block down; the first gathers overlap the head */
  int prev = L;
  if (full)
    while (prev >= 1 && L - prev < ahead) TRY(gather_issue(rt, prev--));
  if (sh) COMPUTE(rt, memset(droot, 0, (size_t)p->units[0].padded * sizeof(float)));
  double l;
  COMPUTE(rt, l = gpt2_head_forward_backward(rt->acts, p, root, droot, rt->tgt, dscale));
  *loss = l;

  for (int u = L; u >= 1; u--) {
    float *dunit;
    int gi = 0;
    if (sh) {
      TRY(gather_wait(rt, u));
      TRY(gbuf_acquire(rt, p->units[u].padded, &gi));
      dunit = rt->gbuf[gi];
    } else {
      dunit = rt->grad + p->units[u].shard_base;
    }
    COMPUTE(rt, gpt2_block_backward(rt->acts, p, u - 1, UNIT(u), dunit));
    if (sh) {
      gather_free(rt, u);
      if (full && prev >= 1) TRY(gather_issue(rt, prev--));
      uint64_t t = now_us();
      fsdp_status rc = rs_issue(rt, u, dunit, k > 0, &rt->gbuf_req[gi]);
      rt->phase_us[RT_PHASE_COMPUTE] += now_us() - t;
      TRY(rc);
    } else if (last) {
      TRY(comm_allreduce(rt->comm, dunit, (size_t)p->units[u].padded, COMM_F32, &rt->arreq[u]));
    }
  }
  COMPUTE(rt, gpt2_embed_backward(rt->acts, p, droot, rt->inp));
  if (sh) {
    TRY(rs_issue(rt, 0, droot, k > 0, &rt->root_req));
    /* The shard segments must hold the new sums before the next micro-step adds to them. */
    TRY(wait_req(rt, &rt->root_req));
    for (int i = 0; i < 2; i++) TRY(wait_req(rt, &rt->gbuf_req[i]));
    gather_free(rt, 0);
  } else if (last) {
    TRY(comm_allreduce(rt->comm, droot, (size_t)p->units[0].padded, COMM_F32, &rt->arreq[0]));
  }
#undef UNIT
  return FSDP_OK;
}

fsdp_status runtime_step(runtime_t *rt, int step, rt_report *out) {
  const plan_t *p = rt->p;
  const jobspec_t *s = rt->spec;
  int G = s->grad_accum, B = p->batch_size, T = p->model.seq_len;
  uint64_t t0 = now_us(), sent0[COLL_NKIND], sent1[COLL_NKIND];
  memset(out, 0, sizeof *out);
  memset(rt->phase_us, 0, sizeof rt->phase_us);
  mem_reset_peaks();
  comm_sent_bytes(rt->comm, sent0);
  uint64_t tokens = (uint64_t)B * T * G * rt->world;
  float dscale = (float)(1.0 / (double)tokens);

  COMPUTE(rt, memset(rt->grad, 0, (size_t)p->shard_total * sizeof(float)));
  double loss_sum = 0;
  for (int k = 0; k < G; k++) {
    int64_t mb = (int64_t)(step - 1) * G + k;
    TRY(tok_batch(rt->data, mb, rt->rank, rt->world, B, T, p->model.vocab_size, rt->inp, rt->tgt));
    double l;
    TRY(micro_step(rt, k, k == G - 1, dscale, &l));
    loss_sum += l;
  }
  for (int u = 0; u < p->nunits; u++) TRY(wait_req(rt, &rt->arreq[u]));

  /* Global gradient norm and loss: one all-reduce of PLAN_STEP_SCALARS floats. */
  uint64_t t = now_us();
  double sq = 0;
  for (int64_t i = 0; i < p->shard_total; i++) sq += (double)rt->grad[i] * rt->grad[i];
  if (!sharded(rt)) sq /= rt->world;   /* every rank holds the whole gradient */
  float scal[PLAN_STEP_SCALARS] = {(float)loss_sum, (float)sq, isfinite(sq) ? 0.0f : 1.0f, (float)((double)B * T * G)};
  TRY(comm_allreduce(rt->comm, scal, PLAN_STEP_SCALARS, COMM_F32, NULL));
  if (scal[2] != 0.0f)
    return fsdp_set_error(FSDP_ERR_RANGE, "step %d: the gradient is not finite on %.0f rank(s) (loss %.4g); "
                          "lower optim.lr or enable optim.grad_clip", step, scal[2], scal[0] / scal[3]);
  double norm = sqrt((double)scal[1]);
  double lr = optim_lr(s, step);
  double clip = optim_clip_scale(norm, s->grad_clip);
  optim_adamw_shard(p, rt->rank, rt->param, rt->grad, rt->m, rt->v, step, lr, s, (float)clip);
  rt->phase_us[RT_PHASE_OPTIMIZER] += now_us() - t;

  comm_sent_bytes(rt->comm, sent1);
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
  memcpy(out->phase_us, rt->phase_us, sizeof out->phase_us);
  for (int i = 0; i < COLL_NKIND; i++) out->sent[i] = sent1[i] - sent0[i];
  return FSDP_OK;
}

fsdp_status runtime_save(runtime_t *rt, const char *path) {
  const plan_t *p = rt->p;
  fsdp_status rc = FSDP_OK;
  float **units = calloc((size_t)p->nunits, sizeof(float *));
  if (!units) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the export table");
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *pu = &p->units[u];
    ALLOC_OR(units[u], alloc_f(MEM_WORKSPACE, pu->padded), rc, out);
    if (sharded(rt))
      TRY_GOTO(comm_allgather(rt->comm, rt->param + pu->shard_base, units[u], (size_t)pu->shard_numel, COMM_F32, NULL),
               rc, out);
    else
      memcpy(units[u], rt->param + pu->shard_base, (size_t)pu->padded * sizeof(float));
  }
  if (rt->rank == 0) rc = st_save_units(path, p, units);
out:
  for (int u = 0; u < p->nunits; u++) mem_free(units[u]);
  free(units);
  return rc;
}

const float *runtime_param_shard(const runtime_t *rt) { return rt->param; }

void runtime_destroy(runtime_t **prt) {
  runtime_t *rt = prt ? *prt : NULL;
  if (!rt) return;
  /* Outstanding collectives reference our buffers: let them finish (or fail) first. */
  if (rt->greq)
    for (int u = 0; u < rt->p->nunits; u++) comm_wait(&rt->greq[u]);
  if (rt->arreq)
    for (int u = 0; u < rt->p->nunits; u++) comm_wait(&rt->arreq[u]);
  for (int i = 0; i < 2; i++) comm_wait(&rt->gbuf_req[i]);
  comm_wait(&rt->root_req);
  mem_free(rt->param);
  mem_free(rt->grad);
  mem_free(rt->m);
  mem_free(rt->v);
  gpt2_acts_destroy(&rt->acts);
  mem_free(rt->inp);
  mem_free(rt->tgt);
  tok_close(&rt->data);
  for (int s = 0; rt->slot_buf && s < rt->nslots; s++) mem_free(rt->slot_buf[s]);
  free(rt->slot_buf);
  free(rt->slot_unit);
  mem_free(rt->root_buf);
  mem_free(rt->droot);
  for (int i = 0; i < 2; i++) mem_free(rt->gbuf[i]);
  free(rt->gptr);
  free(rt->gslot);
  free(rt->greq);
  free(rt->arreq);
  free(rt);
  *prt = NULL;
}

/* ---- checkpoints (common/ckpt.h, docs/checkpoints.md) ---- */

/* Sum one flag over the ranks: how many ranks had a failure. Also the barrier the protocol needs. */
static fsdp_status count_failures(runtime_t *rt, int failed, int *nfailed) {
  float f = failed ? 1.0f : 0.0f;
  TRY(comm_allreduce(rt->comm, &f, 1, COMM_F32, NULL));
  *nfailed = (int)f;
  return FSDP_OK;
}

fsdp_status runtime_checkpoint(runtime_t *rt, const char *dir, int step) {
  const plan_t *p = rt->p;
  uint64_t t0 = now_us();
  fsdp_status rc = ckpt_write_rank(dir, p, rt->rank, step, step, rt->param, rt->m, rt->v);
  if (rc != FSDP_OK) log_error("checkpoint step %d: %s", step, fsdp_last_error());
  char err[1024];
  snprintf(err, sizeof err, "%s", fsdp_last_error());
  int nbad = 0;
  TRY(count_failures(rt, rc != FSDP_OK, &nbad));   /* every rank's file is fsync'ed past this point */
  if (rc != FSDP_OK) return fsdp_set_error(rc, "%s", err);
  if (nbad) return fsdp_set_error(FSDP_ERR_IO, "checkpoint step %d: %d rank(s) could not write their file (see their logs)",
                                  step, nbad);
  if (rt->rank == 0) {
    uint64_t per_step = (uint64_t)p->batch_size * p->model.seq_len * rt->spec->grad_accum * rt->world;
    uint64_t tokens = rt->ckpt_tokens0 + (uint64_t)(step - rt->ckpt_step0) * per_step;
    rc = ckpt_write_manifest(dir, p, step, tokens);
    if (rc == FSDP_OK && ckpt_prune(dir, rt->spec->ckpt_keep) != FSDP_OK)
      log_warn("checkpoint step %d: pruning old checkpoints: %s", step, fsdp_last_error());
    if (rc != FSDP_OK) {
      log_error("checkpoint step %d: %s", step, fsdp_last_error());
      snprintf(err, sizeof err, "%s", fsdp_last_error());
    }
  }
  TRY(count_failures(rt, rc != FSDP_OK, &nbad));
  if (rc != FSDP_OK) return fsdp_set_error(rc, "%s", err);
  if (nbad) return fsdp_set_error(FSDP_ERR_IO, "checkpoint step %d: rank 0 could not write the manifest (see its log)", step);
  if (rt->rank == 0) log_info("checkpoint of step %d written to %s in %.2f s", step, dir, (double)(now_us() - t0) / 1e6);
  return FSDP_OK;
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
  TRY(comm_allreduce(rt->comm, agree, 3, COMM_F32, NULL));
  if (rc != FSDP_OK) return fsdp_set_error(rc, "%s", err);
  if (agree[0] != 0) return fsdp_set_error(FSDP_ERR_IO, "%.0f rank(s) could not read %s (see their logs)", agree[0], dir);
  if (agree[1] != (float)(s >> 12) * rt->world || agree[2] != (float)(s & 4095) * rt->world)
    return fsdp_set_error(FSDP_ERR_STATE, "ranks see different newest checkpoints in %s (this one: step %d); "
                          "the directory must be shared and not written meanwhile", dir, s);
  if (s == 0) {
    if (rt->rank == 0) log_info("no complete checkpoint in %s: starting from step 0", dir);
    return FSDP_OK;
  }

  uint64_t t0 = now_us();
  ckpt_info ci;
  int64_t ostep = -1;
  rc = ckpt_read_manifest(dir, s, &ci);
  /* A partial (resharding) read cannot check the CRCs of what it reads: the ranks split the rank
   * files between them and each verifies its share whole. Same layout: every rank reads its own
   * file whole, and that read checks every CRC. */
  if (rc == FSDP_OK && !ckpt_same_layout(&ci, p)) rc = ckpt_verify(dir, &ci, rt->rank, rt->world);
  if (rc == FSDP_OK) rc = ckpt_load_shard(dir, &ci, rt->spec, p, rt->rank, rt->param, rt->m, rt->v, &ostep);
  if (rc == FSDP_OK && ostep != s)
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "checkpoint step %d in %s: its files say the optimizer took %lld steps", s, dir,
                        (long long)ostep);
  if (rc != FSDP_OK) log_error("restoring step %d: %s", s, fsdp_last_error());
  snprintf(err, sizeof err, "%s", fsdp_last_error());
  int nbad = 0;
  TRY(count_failures(rt, rc != FSDP_OK, &nbad));
  if (rc != FSDP_OK) return fsdp_set_error(rc, "%s", err);
  if (nbad) return fsdp_set_error(FSDP_ERR_FORMAT, "%d rank(s) could not restore checkpoint step %d from %s (see their logs)",
                                  nbad, s, dir);
  rt->ckpt_step0 = s;
  rt->ckpt_tokens0 = ci.tokens;
  int64_t rows = (int64_t)p->world * p->batch_size * rt->spec->grad_accum;
  if (rt->rank == 0) {
    log_info("resumed from checkpoint step %d in %s (written by %d rank(s), sharding %s) in %.2f s", s, dir, ci.world,
             shard_mode_name(ci.sharding), (double)(now_us() - t0) / 1e6);
    if (ci.rows_per_step != rows)
      log_warn("N·B·G changed from %lld to %lld rows per step: the data order does not continue where it stopped",
               (long long)ci.rows_per_step, (long long)rows);
  }
  *step = s;
  return FSDP_OK;
}
