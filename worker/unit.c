/* unit — see unit.h. */
#include "unit.h"

#include <stdlib.h>

#include "nf4_base.h"

struct unit_pool {
  const plan_t *p;
  device_t *d;
  comm_t *comm;                  /* gathers: the shard group's (hybrid), else the world's */
  const char *shard;             /* the gather source: this rank's shard in param_dtype */
  int esz;                       /* its element size */
  const uint8_t *nf4;            /* NF4 base: the blocks' byte shards (the root's stays in shard), else NULL */
  uint16_t *deq;                 /* NF4 base: the block's dequantized bf16 working unit */
  reducer *red;
  reqs *q;
  int sharded, grad_op, convert, drop_wait;
  int root_parts;                /* [lora]: the frozen root is gathered in parts (unit_gather_root_part) */
  int64_t root_n;                /* the root's buffer: Pr elements, or the larger part's */
  int64_t part_lo, part_n;       /* the part the root's buffer holds */
  dev_event *root_ready;         /* root parts: the shard's part is in the buffer, to be all-reduced */
  int nslots;                    /* block slots; slot[nslots] is the root's */
  unit_slot *slot;
  void *root_act, *blk_act;      /* compute-form copies when convert */
  fsdp_unit *units;
};

static void *dalloc(device_t *d, int64_t n, int esz) { return d->op->alloc(d, MEM_GATHERED, (size_t)n * (size_t)esz); }

/* A block's gathered bytes: its padded elements in param_dtype, or its NF4 image. */
static int64_t block_bytes(const unit_pool *pool, const plan_unit *u) {
  return pool->nf4 ? pool->p->lora.nf4_padded : u->padded * pool->esz;
}

#define ALLOC_OR_FAIL(ptr, expr)         \
  do {                                   \
    if (!((ptr) = (expr))) goto fail;    \
  } while (0)

/* Gather buffers are allocated here, once, and reused: release returns a slot to the pool. */
static int alloc_slots(unit_pool *pool) {
  const plan_t *p = pool->p;
  int L = p->nunits - 1, regathers = !pool->grad_op;
  int64_t pb = 0;
  for (int u = 1; u <= L; u++)
    if (block_bytes(pool, &p->units[u]) > pb) pb = block_bytes(pool, &p->units[u]);
  pool->nslots = regathers ? 1 + p->prefetch : L;
  if (pool->nslots > L) pool->nslots = L;
  if (!(pool->slot = calloc((size_t)pool->nslots + 1, sizeof *pool->slot))) {
    fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the gather pool's table");
    return -1;
  }
  for (int s = 0; s <= pool->nslots; s++) {
    unit_slot *sl = &pool->slot[s];
    int64_t n = s == pool->nslots ? pool->root_n * pool->esz
                : regathers       ? pb
                                  : block_bytes(pool, &p->units[1 + s]);
    sl->unit = -1;
    if (!(sl->free = dev_event_new(pool->d)) || !(sl->buf = dalloc(pool->d, n, 1))) return -1;
  }
  return 0;
}

fsdp_status unit_pool_new(const plan_t *p, device_t *d, comm_t *comm, const void *shard, const uint8_t *nf4,
                          reducer *red, reqs *q, unit_pool **out, fsdp_unit **units) {
  *out = NULL;
  *units = NULL;
  unit_pool *pool = calloc(1, sizeof *pool);
  if (!pool || !(pool->units = calloc((size_t)p->nunits, sizeof *pool->units))) {
    free(pool);
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the table of %d units", p->nunits);
  }
  pool->p = p, pool->d = d, pool->comm = comm, pool->shard = shard, pool->nf4 = nf4, pool->red = red, pool->q = q;
  pool->esz = p->param_dtype == DTYPE_BF16 ? 2 : 4;
  pool->sharded = p->sharding != SHARD_NONE;
  pool->grad_op = p->sharding == SHARD_GRAD_OP;
  pool->convert = pool->esz != d->act_bytes;
  pool->root_parts = p->lora.rank && pool->sharded;
  pool->root_n = pool->root_parts ? plan_root_part_max(p) : p->units[0].padded;
  int64_t pb = 0;
  for (int u = 1; u < p->nunits; u++)
    if (p->units[u].padded > pb) pb = p->units[u].padded;
  for (int u = 0; u < p->nunits; u++) pool->units[u] = (fsdp_unit){.id = u, .pu = &p->units[u], .pool = pool};
  if (pool->convert) {
    ALLOC_OR_FAIL(pool->root_act, dalloc(d, pool->sharded ? pool->root_n : p->units[0].padded, d->act_bytes));
    ALLOC_OR_FAIL(pool->blk_act, dalloc(d, pb, d->act_bytes));
  }
  if (nf4) ALLOC_OR_FAIL(pool->deq, dalloc(d, pb, 2));
  if (pool->sharded) {
    if (alloc_slots(pool) != 0) goto fail;
    for (int u = 0; u < p->nunits; u++) ALLOC_OR_FAIL(pool->units[u].arrived, dev_event_new(d));
    if (pool->root_parts) ALLOC_OR_FAIL(pool->root_ready, dev_event_new(d));
  }
  *out = pool;
  *units = pool->units;
  return FSDP_OK;
fail:   /* the device's allocator or dev_event_new said why */
  unit_pool_destroy(&pool);
  return FSDP_ERR_NOMEM;
}

void unit_pool_set_comm(unit_pool *pool, comm_t *group) { pool->comm = group; }

void unit_pool_test_drop_wait(unit_pool *pool, int on) { pool->drop_wait = on; }

void unit_pool_destroy(unit_pool **pp) {
  unit_pool *pool = pp ? *pp : NULL;
  if (!pool) return;
  device_t *d = pool->d;
  for (int s = 0; pool->slot && s <= pool->nslots; s++) {
    d->op->free(d, pool->slot[s].buf);
    dev_event_destroy(&pool->slot[s].free);
  }
  for (int u = 0; u < pool->p->nunits; u++) dev_event_destroy(&pool->units[u].arrived);
  dev_event_destroy(&pool->root_ready);
  d->op->free(d, pool->root_act);
  d->op->free(d, pool->blk_act);
  d->op->free(d, pool->deq);
  free(pool->slot);
  free(pool->units);
  free(pool);
  *pp = NULL;
}

/* The unit's part of this rank's shard (param_dtype; an NF4 block's bytes). */
static const void *shard_of(const fsdp_unit *u) {
  const unit_pool *pool = u->pool;
  if (pool->nf4 && u->id > 0) return pool->nf4 + (int64_t)(u->id - 1) * pool->p->lora.nf4_shard;
  return pool->shard + u->pu->shard_base * pool->esz;
}

/* A free slot: the root's own; grad_op's, one per block; else the first the pool has free. */
static unit_slot *slot_for(unit_pool *pool, int id) {
  if (id == 0) return &pool->slot[pool->nslots];
  if (pool->grad_op) return &pool->slot[id - 1];
  for (int s = 0; s < pool->nslots; s++)
    if (pool->slot[s].unit < 0) return &pool->slot[s];
  return NULL;
}

fsdp_status unit_gather(fsdp_unit *u) {
  unit_pool *pool = u->pool;
  if (!pool->sharded) return FSDP_OK;
  unit_slot *s = slot_for(pool, u->id);
  if (!s) return fsdp_set_error(FSDP_ERR_INTERNAL, "gather pool exhausted at unit %d (%d slots)", u->id, pool->nslots);
  if (u->id > 0) s->unit = u->id;
  u->slot = s;
  u->gathered = s->buf;
  comm_req *r = NULL;
  comm_trace_unit(pool->comm, u->id);
  /* an NF4 block's bytes travel as pairs (a gather only copies; nf4_shard is a multiple of 64) */
  size_t count = pool->nf4 && u->id > 0 ? (size_t)pool->p->lora.nf4_shard / 2 : (size_t)u->pu->shard_numel;
  TRY(comm_allgather_ev(pool->comm, shard_of(u), s->buf, count, pool->esz == 2 ? COMM_BF16 : COMM_F32, s->free,
                        u->arrived, &r));
  return reqs_add(pool->q, r);
}

fsdp_status unit_gather_root_part(fsdp_unit *u, int part) {
  unit_pool *pool = u->pool;
  if (!pool->sharded) return FSDP_OK;
  if (u->id != 0 || !pool->root_parts)
    return fsdp_set_error(FSDP_ERR_INTERNAL, "unit %d: gathered in parts, but only a [lora] job's root is", u->id);
  const plan_t *p = pool->p;
  device_t *d = pool->d;
  int e = pool->esz;
  int64_t lo, hi;
  plan_root_part(p, part, &lo, &hi);
  unit_slot *s = &pool->slot[pool->nslots];
  u->slot = s;
  pool->part_lo = lo, pool->part_n = hi - lo;
  /* in stream order after the buffer's last reader: zeros, and this rank's part of its shard */
  int64_t a0 = plan_shard_offset(p, 0, comm_rank(pool->comm)), a = a0 > lo ? a0 : lo;
  int64_t b = a0 + u->pu->shard_numel < hi ? a0 + u->pu->shard_numel : hi;
  d->op->zero(d, s->buf, (size_t)(hi - lo) * (size_t)e);
  if (a < b) d->op->copy(d, (char *)s->buf + (a - lo) * e, (const char *)shard_of(u) + (a - a0) * e, (size_t)(b - a) * (size_t)e);
  d->op->record(d, pool->root_ready);
  u->gathered = (char *)s->buf - lo * e;   /* the root's flat base: tensors at their offsets */
  comm_req *r = NULL;
  comm_trace_unit(pool->comm, 0);
  TRY(comm_allreduce_ev(pool->comm, s->buf, (size_t)(hi - lo), e == 2 ? COMM_BF16 : COMM_F32, pool->root_ready,
                        u->arrived, &r));
  return reqs_add(pool->q, r);
}

const void *unit_wait(fsdp_unit *u) {
  unit_pool *pool = u->pool;
  device_t *d = pool->d;
  const void *src = shard_of(u);
  if (pool->sharded) {
    if (!(pool->drop_wait && u->id > 0)) d->op->wait(d, u->arrived, DEV_T_GATHER);
    src = u->gathered;
  }
  if (pool->nf4 && u->id > 0) {   /* dequantized right after the gather: the slot's last reader */
    nf4_base_dequant(d, u->pu, src, pool->deq);
    if (pool->sharded) d->op->record(d, u->slot->free);
    src = pool->deq;
  }
  int part = u->id == 0 && pool->root_parts;   /* the root's buffer holds one part of it */
  if (!pool->convert) return src;
  void *act = u->id == 0 ? pool->root_act : pool->blk_act;
  if (part) {
    d->kern->to_act(d, act, (const char *)src + pool->part_lo * pool->esz, pool->p->param_dtype, pool->part_n);
    act = (char *)act - pool->part_lo * d->act_bytes;
  } else {
    d->kern->to_act(d, act, src, pool->p->param_dtype, u->pu->padded);
  }
  if (pool->sharded) d->op->record(d, u->slot->free);   /* the slot's last reader */
  return act;
}

void unit_release(fsdp_unit *u) {
  unit_pool *pool = u->pool;
  if (!pool->sharded) return;
  if (!pool->convert) pool->d->op->record(pool->d, u->slot->free);
  if (u->id > 0) u->slot->unit = -1;
  u->gathered = NULL;
}

fsdp_status unit_grad(fsdp_unit *u) { return reduce_buffer(u->pool->red, u->id, &u->grad); }

fsdp_status unit_reduce(fsdp_unit *u) {
  float *g = u->grad;
  u->grad = NULL;
  return reduce_issue(u->pool->red, u->id, g);
}
