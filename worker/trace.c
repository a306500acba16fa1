/* trace — see trace.h. The ring is a seqlock per slot: a writer claims index i with one atomic
 * increment, takes the slot (seq SEQ_WRITING, by compare-and-swap, so that two writers a lap apart
 * never write one slot at once), writes the record and publishes it (seq i + 1, release); a reader
 * keeps a record only when it saw seq i + 1 both before and after copying it. */
#include "trace.h"

#include "envknob.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_WRITING (1ull << 63)

typedef struct slot {
  _Atomic uint64_t seq;   /* 0: never written; SEQ_WRITING: being written; i + 1: holds record i */
  trace_span s;
} slot;

struct trace {
  slot *ring;
  _Atomic uint64_t head;  /* records claimed so far */
  _Atomic int step;
  uint64_t open[TRACE_NLANE][TRACE_DEPTH];   /* each lane's open spans (its writer thread's) */
  int depth[TRACE_NLANE];
};

fsdp_status trace_new(trace_t **out) {
  *out = NULL;
  trace_t *t = calloc(1, sizeof *t);
  if (t) t->ring = calloc(TRACE_RING, sizeof *t->ring);
  if (!t || !t->ring) {
    free(t);
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the span ring (%d spans)", TRACE_RING);
  }
  *out = t;
  return FSDP_OK;
}

fsdp_status trace_from_env(trace_t **out) {
  *out = NULL;
  const char *v = envknob_get(ENV_TRACE);
  if (!strcmp(v, "0")) return FSDP_OK;
  if (strcmp(v, "1") != 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "FSDP_TRACE=%s; allowed: 1 (record spans, the default) or 0 (off)", v);
  return trace_new(out);
}

void trace_destroy(trace_t **pt) {
  if (!pt || !*pt) return;
  free((*pt)->ring);
  free(*pt);
  *pt = NULL;
}

void trace_add(trace_t *t, trace_lane lane, trace_kind kind, int unit, int step, uint64_t t0_us, uint64_t t1_us) {
  if (!t) return;
  uint64_t i = atomic_fetch_add_explicit(&t->head, 1, memory_order_relaxed);
  slot *s = &t->ring[i % TRACE_RING];
  /* Take the slot for writing; a writer lapped by a whole ring may still hold it, and then this
   * record is dropped rather than mixed with that one's. */
  uint64_t seen = atomic_load_explicit(&s->seq, memory_order_relaxed);
  if ((seen & SEQ_WRITING) ||
      !atomic_compare_exchange_strong_explicit(&s->seq, &seen, SEQ_WRITING, memory_order_relaxed, memory_order_relaxed))
    return;
  atomic_thread_fence(memory_order_release);
  s->s = (trace_span){.t0_us = t0_us, .t1_us = t1_us, .step = step, .unit = (int16_t)unit, .kind = (uint8_t)kind,
                      .lane = (uint8_t)lane};
  atomic_store_explicit(&s->seq, i + 1, memory_order_release);
}

void trace_begin(trace_t *t, trace_lane lane, uint64_t t_us) {
  if (!t) return;
  int d = t->depth[lane]++;
  if (d < TRACE_DEPTH) t->open[lane][d] = t_us;
}

void trace_end(trace_t *t, trace_lane lane, trace_kind kind, int unit, int step, uint64_t t_us) {
  if (!t || t->depth[lane] == 0) return;
  int d = --t->depth[lane];
  if (d < TRACE_DEPTH) trace_add(t, lane, kind, unit, step, t->open[lane][d], t_us);
}

void trace_set_step(trace_t *t, int step) {
  if (t) atomic_store_explicit(&t->step, step, memory_order_relaxed);
}
int trace_step(const trace_t *t) { return t ? atomic_load_explicit(&((trace_t *)t)->step, memory_order_relaxed) : 0; }

/* Record I, if it is still in the ring and published; 0 otherwise. */
static int read_record(const trace_t *t, uint64_t i, trace_span *out) {
  slot *s = &t->ring[i % TRACE_RING];
  if (atomic_load_explicit(&s->seq, memory_order_acquire) != i + 1) return 0;
  *out = s->s;
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&s->seq, memory_order_relaxed) == i + 1;
}

/* The oldest record index still in the ring, and the number claimed. */
static void bounds(const trace_t *t, uint64_t *lo, uint64_t *hi) {
  *hi = atomic_load_explicit(&((trace_t *)t)->head, memory_order_acquire);
  *lo = *hi > TRACE_RING ? *hi - TRACE_RING : 0;
}

void trace_retained(const trace_t *t, int *first, int *last) {
  *first = *last = 0;
  uint64_t lo, hi;
  bounds(t, &lo, &hi);
  trace_span a = {0}, b = {0};   /* read_record fills them before any use; -O3 cannot see it */
  int have_a = 0, have_b = 0;
  for (uint64_t i = lo; i < hi && !have_a; i++) have_a = read_record(t, i, &a);
  for (uint64_t i = hi; i > lo && !have_b; i--) have_b = read_record(t, i - 1, &b);
  if (!have_a || !have_b) return;
  /* After a wrap the oldest step may have lost its first spans: only the next one is whole. */
  int f = lo > 0 ? a.step + 1 : a.step;
  if (f > b.step) return;
  *first = f;
  *last = b.step;
}

fsdp_status trace_collect(const trace_t *t, int a, int b, trace_span **out, size_t *n) {
  *out = NULL;
  *n = 0;
  uint64_t lo, hi;
  bounds(t, &lo, &hi);
  trace_span *v = malloc((size_t)(hi - lo ? hi - lo : 1) * sizeof *v);
  if (!v) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %llu spans", (unsigned long long)(hi - lo));
  size_t k = 0;
  for (uint64_t i = lo; i < hi; i++) {
    trace_span s;
    if (read_record(t, i, &s) && s.step >= a && s.step <= b) v[k++] = s;
  }
  *out = v;
  *n = k;
  return FSDP_OK;
}
