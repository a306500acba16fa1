/* reduce — see reduce.h. */
#include "reduce.h"

#include <stdlib.h>

struct reducer {
  const plan_t *p;
  int rank;
  device_t *d;
  float *grad;                   /* the gradient shard (borrowed) */
  comm_t *comm;                  /* none's all-reduces */
  comm_t *gcomm;                 /* reduce-scatters: the shard group's (hybrid), else comm */
  comm_t *rcomm;                 /* hybrid: the ranks of the other groups holding this shard, else NULL */
  reqs *q;
  int sharded, bf16;             /* sharding is not none; reduce_dtype is bf16 */
  int accumulate, last, across;  /* this micro-step (reduce_begin); across: hybrid's last */

  /* sharded: the root's gradient (fp32) and two alternating block buffers (fp32 for reduce fp32;
   * with bf16 one fp32 buffer and two bf16 send and receive buffers) */
  float *droot, *gbuf[2], *gcomp;
  uint16_t *root16, *rootrecv16, *send16[2], *recv16[2];
  int gunit[2];                  /* bf16: the unit whose receive buffer i holds an uncollected sum, or -1 */
  int next, cur;                 /* the block buffer handed out next, and last */
  uint16_t *ar16;                /* none and hybrid with bf16: the shard's gradient in bf16 */
  dev_event *gfree[2];           /* the reduction that last read block buffer i is done */
  dev_event *root_done, *ar_done, *ready;
};

static void *dalloc(device_t *d, int64_t n, int esz) { return d->op->alloc(d, MEM_COMM, (size_t)n * (size_t)esz); }

#define ALLOC_OR_FAIL(ptr, expr)         \
  do {                                   \
    if (!((ptr) = (expr))) goto fail;    \
  } while (0)

fsdp_status reduce_new(const plan_t *p, int rank, device_t *d, float *grad, comm_t *comm, reqs *q, reducer **out) {
  *out = NULL;
  reducer *r = calloc(1, sizeof *r);
  if (!r) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the gradient reducer");
  r->p = p, r->rank = rank, r->d = d, r->grad = grad, r->comm = r->gcomm = comm, r->q = q;
  r->sharded = p->sharding != SHARD_NONE;
  r->bf16 = p->reduce_dtype == DTYPE_BF16;
  r->gunit[0] = r->gunit[1] = -1;
  int64_t pb = 0, sb = 0, P0 = p->units[0].padded;
  for (int u = 1; u < p->nunits; u++)
    if (p->units[u].padded > pb) pb = p->units[u].padded, sb = p->units[u].shard_numel;
  for (int i = 0; i < 2; i++) ALLOC_OR_FAIL(r->gfree[i], dev_event_new(d));
  ALLOC_OR_FAIL(r->root_done, dev_event_new(d));
  ALLOC_OR_FAIL(r->ar_done, dev_event_new(d));
  ALLOC_OR_FAIL(r->ready, dev_event_new(d));
  if ((!r->sharded || p->sharding == SHARD_HYBRID) && r->bf16) ALLOC_OR_FAIL(r->ar16, dalloc(d, p->shard_total, 2));
  if (r->sharded) {
    ALLOC_OR_FAIL(r->droot, dalloc(d, P0, 4));
    if (!r->bf16) {
      for (int i = 0; i < 2; i++) ALLOC_OR_FAIL(r->gbuf[i], dalloc(d, pb, 4));
    } else {
      ALLOC_OR_FAIL(r->gcomp, dalloc(d, pb, 4));
      ALLOC_OR_FAIL(r->root16, dalloc(d, P0, 2));
      ALLOC_OR_FAIL(r->rootrecv16, dalloc(d, p->units[0].shard_numel, 2));
      for (int i = 0; i < 2; i++) {
        ALLOC_OR_FAIL(r->send16[i], dalloc(d, pb, 2));
        ALLOC_OR_FAIL(r->recv16[i], dalloc(d, sb, 2));
      }
    }
  }
  *out = r;
  return FSDP_OK;
fail:   /* the device's allocator or dev_event_new said why */
  reduce_destroy(&r);
  return FSDP_ERR_NOMEM;
}

void reduce_set_comms(reducer *r, comm_t *group, comm_t *replica) {
  r->gcomm = group;
  r->rcomm = replica;
}

void reduce_begin(reducer *r, int accumulate, int last) {
  r->accumulate = accumulate;
  r->last = last;
  r->across = r->rcomm && last;   /* hybrid: each final shard goes across the groups */
}

/* All-reduce N floats of the gradient shard from unit u's base on C, completing ar_done: with bf16
 * through ar16 (rounded on the stream first, then added back by from_ar16), with fp32 in place after
 * AFTER's latest mark (NULL: after the stream's work so far). The caller waits for ar_done's latest
 * mark (FIFO on one comm: every earlier one is done). */
static fsdp_status allreduce_grad(reducer *r, comm_t *c, int u, int64_t n, dev_event *after) {
  device_t *d = r->d;
  int64_t b = r->p->units[u].shard_base;
  void *buf = r->grad + b;
  comm_req *req = NULL;
  comm_trace_unit(c, u);
  if (r->bf16) {
    d->kern->cast_bf16(d, r->ar16 + b, r->grad + b, n);
    buf = r->ar16 + b;
    after = NULL;
  }
  if (!after) {
    d->op->record(d, r->ready);
    after = r->ready;
  }
  TRY(comm_allreduce_ev(c, buf, (size_t)n, r->bf16 ? COMM_BF16 : COMM_F32, after, r->ar_done, &req));
  return reqs_add(r->q, req);
}

/* Hybrid, last micro-step: unit u's final gradient shard across the groups, among the ranks that
 * hold the same shard; with fp32 after AFTER (the reduce-scatter that wrote it). */
static fsdp_status across_issue(reducer *r, int u, dev_event *after) {
  return allreduce_grad(r, r->rcomm, u, r->p->units[u].shard_numel, after);
}

/* bf16: fold the received sum of block buffer i into the fp32 shard, once it has arrived; in
 * hybrid's last micro-step the unit's shard is then final and goes across the groups. */
static fsdp_status bf16_collect(reducer *r, int i) {
  device_t *d = r->d;
  int u = r->gunit[i];
  if (u < 0) return FSDP_OK;
  const plan_unit *pu = &r->p->units[u];
  d->op->wait(d, r->gfree[i], DEV_T_REDUCE);
  d->kern->add(d, r->grad + pu->shard_base, r->recv16[i], DTYPE_BF16, pu->shard_numel);
  r->gunit[i] = -1;
  return r->across ? across_issue(r, u, NULL) : FSDP_OK;
}

fsdp_status reduce_buffer(reducer *r, int u, float **out) {
  device_t *d = r->d;
  const plan_unit *pu = &r->p->units[u];
  if (!r->sharded) {   /* none: straight into the shard, accumulating */
    *out = r->grad + pu->shard_base;
    return FSDP_OK;
  }
  float *g = r->droot;
  if (u > 0) {   /* the next block buffer, once the reduction that last read it is done */
    int i = r->cur = r->next;
    r->next ^= 1;
    if (r->bf16) {
      TRY(bf16_collect(r, i));
      g = r->gcomp;
    } else {
      d->op->wait(d, r->gfree[i], DEV_T_REDUCE);
      g = r->gbuf[i];
    }
  }
  d->op->zero(d, g, (size_t)pu->padded * sizeof(float));
  *out = g;
  return FSDP_OK;
}

fsdp_status reduce_issue(reducer *r, int u, float *g) {
  device_t *d = r->d;
  const plan_unit *pu = &r->p->units[u];
  /* none: once per step, as soon as the unit's last backward is done */
  if (!r->sharded) return r->last ? allreduce_grad(r, r->comm, u, pu->padded, NULL) : FSDP_OK;
  int i = r->cur;
  dev_event *done = u == 0 ? r->root_done : r->gfree[i];
  float *mine = r->grad + pu->shard_base;
  comm_req *req = NULL;
  comm_trace_unit(r->gcomm, u);
  if (!r->bf16) {
    if (r->accumulate) d->kern->add(d, g + plan_shard_offset(r->p, u, r->rank), mine, DTYPE_FP32, pu->shard_numel);
    d->op->record(d, r->ready);
    TRY(comm_reduce_scatter_ev(r->gcomm, g, mine, (size_t)pu->shard_numel, COMM_F32, r->ready, done, &req));
    TRY(reqs_add(r->q, req));
    return r->across ? across_issue(r, u, done) : FSDP_OK;
  }
  uint16_t *send = u == 0 ? r->root16 : r->send16[i], *recv = u == 0 ? r->rootrecv16 : r->recv16[i];
  d->kern->cast_bf16(d, send, g, pu->padded);
  d->op->record(d, r->ready);
  TRY(comm_reduce_scatter_ev(r->gcomm, send, recv, (size_t)pu->shard_numel, COMM_BF16, r->ready, done, &req));
  if (u > 0) r->gunit[i] = u;
  return reqs_add(r->q, req);
}

/* The shard's gradient from the bf16 all-reduced copy (none and hybrid with bf16). */
static void from_ar16(reducer *r) {
  device_t *d = r->d;
  d->op->zero(d, r->grad, (size_t)r->p->shard_total * sizeof(float));
  d->kern->add(d, r->grad, r->ar16, DTYPE_BF16, r->p->shard_total);
}

fsdp_status reduce_finish(reducer *r) {
  device_t *d = r->d;
  if (!r->sharded) {
    if (!r->last) return FSDP_OK;
    d->op->wait(d, r->ar_done, DEV_T_REDUCE);   /* its latest mark: the last all-reduce, FIFO */
    if (r->bf16) from_ar16(r);
    return FSDP_OK;
  }
  /* The shard must hold the new sums before the next micro-step adds to it. */
  if (r->bf16) {
    for (int i = 0; i < 2; i++) TRY(bf16_collect(r, i));
    const plan_unit *root = &r->p->units[0];
    d->op->wait(d, r->root_done, DEV_T_REDUCE);
    d->kern->add(d, r->grad + root->shard_base, r->rootrecv16, DTYPE_BF16, root->shard_numel);
    if (r->across && root->shard_numel) TRY(across_issue(r, 0, NULL));   /* [lora]'s adapter units: an empty root */
  } else {
    d->op->wait(d, r->root_done, DEV_T_REDUCE);
    for (int i = 0; i < 2; i++) d->op->wait(d, r->gfree[i], DEV_T_REDUCE);
  }
  if (r->across) {   /* the optimizer reads the replicated sums */
    d->op->wait(d, r->ar_done, DEV_T_REDUCE);
    if (r->bf16) from_ar16(r);
  }
  r->across = 0;
  return FSDP_OK;
}

void reduce_destroy(reducer **pr) {
  reducer *r = pr ? *pr : NULL;
  if (!r) return;
  device_t *d = r->d;
  d->op->free(d, r->droot);
  d->op->free(d, r->gcomp);
  d->op->free(d, r->root16);
  d->op->free(d, r->rootrecv16);
  d->op->free(d, r->ar16);
  for (int i = 0; i < 2; i++) {
    d->op->free(d, r->gbuf[i]);
    d->op->free(d, r->send16[i]);
    d->op->free(d, r->recv16[i]);
    dev_event_destroy(&r->gfree[i]);
  }
  dev_event_destroy(&r->root_done);
  dev_event_destroy(&r->ar_done);
  dev_event_destroy(&r->ready);
  free(r);
  *pr = NULL;
}
