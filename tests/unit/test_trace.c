/* test_trace — the worker's span ring (worker/trace.h): begin/end nesting per lane, wrap-around and
 * the whole steps it retains, the step filter, concurrent writers (no record lost before a
 * wrap, none torn), and a reader during writers that wrap it (no torn record returned). */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "check.h"
#include "trace.h"

static void test_nesting(void) {
  trace_t *t = NULL;
  CHECK_OK(trace_new(&t));
  trace_begin(t, TRACE_STREAM, 100);                        /* the step */
  trace_begin(t, TRACE_STREAM, 110);
  trace_end(t, TRACE_STREAM, TRACE_FORWARD, 3, 1, 120);     /* forward 3 inside it */
  trace_end(t, TRACE_STREAM, TRACE_STEP, TRACE_NO_UNIT, 1, 200);
  trace_end(t, TRACE_STREAM, TRACE_STEP, TRACE_NO_UNIT, 1, 300);   /* no open span: nothing */
  trace_add(t, TRACE_COMM, TRACE_ALLGATHER, 3, 1, 105, 109);
  trace_span *v = NULL;
  size_t n = 0;
  CHECK_OK(trace_collect(t, 1, 1, &v, &n));
  CHECK_EQ_INT(3, n);
  if (n == 3) {
    CHECK_EQ_INT(TRACE_FORWARD, v[0].kind);
    CHECK_EQ_INT(110, v[0].t0_us);
    CHECK_EQ_INT(120, v[0].t1_us);
    CHECK_EQ_INT(3, v[0].unit);
    CHECK_EQ_INT(TRACE_STEP, v[1].kind);
    CHECK_EQ_INT(100, v[1].t0_us);
    CHECK_EQ_INT(200, v[1].t1_us);
    CHECK_EQ_INT(TRACE_COMM, v[2].lane);
  }
  free(v);
  int first, last;
  trace_retained(t, &first, &last);
  CHECK_EQ_INT(1, first);
  CHECK_EQ_INT(1, last);
  trace_destroy(&t);
  CHECK(t == NULL);
}

/* PER spans a step for STEPS steps: the ring keeps the newest TRACE_RING, and the steps it
 * reports as retained are whole. */
static void test_wrap(void) {
  trace_t *t = NULL;
  CHECK_OK(trace_new(&t));
  int per = 1000, steps = TRACE_RING / per + 5;
  for (int s = 1; s <= steps; s++)
    for (int k = 0; k < per; k++) trace_add(t, TRACE_HOST, TRACE_FORWARD, k, s, (uint64_t)s * 10000 + k, (uint64_t)s * 10000 + k + 1);
  int first, last;
  trace_retained(t, &first, &last);
  int64_t total = (int64_t)steps * per, oldest = total - TRACE_RING;   /* the index of the oldest record kept */
  int oldest_step = (int)(oldest / per) + 1;
  CHECK_EQ_INT(steps, last);
  CHECK_EQ_INT(oldest_step + 1, first);   /* the oldest step is partial (oldest % per != 0) */
  CHECK(oldest % per != 0);
  trace_span *v = NULL;
  size_t n = 0;
  CHECK_OK(trace_collect(t, first, last, &v, &n));
  CHECK_EQ_INT((int64_t)(last - first + 1) * per, n);
  int ordered = 1;
  for (size_t i = 1; i < n; i++) ordered &= v[i].t0_us > v[i - 1].t0_us;
  CHECK(ordered);
  free(v);
  /* asking for the partial step returns only what is left of it */
  CHECK_OK(trace_collect(t, oldest_step, oldest_step, &v, &n));
  CHECK_EQ_INT((int64_t)oldest_step * per - oldest, n);
  free(v);
  /* a range with nothing in it */
  CHECK_OK(trace_collect(t, steps + 1, steps + 9, &v, &n));
  CHECK_EQ_INT(0, n);
  free(v);
  trace_destroy(&t);
}

typedef struct writer {
  trace_t *t;
  int id, n;
} writer;

static void *write_main(void *arg) {
  writer *w = arg;
  /* every field derives from (id, k), so a torn record is detectable */
  for (int k = 0; k < w->n; k++)
    trace_add(w->t, (trace_lane)w->id, TRACE_ALLGATHER, w->id, k, (uint64_t)k * 3 + (uint64_t)w->id,
              (uint64_t)k * 3 + (uint64_t)w->id + 7);
  return NULL;
}

static void test_concurrent(void) {
  trace_t *t = NULL;
  CHECK_OK(trace_new(&t));
  enum { NW = TRACE_NLANE };
  writer w[NW];
  pthread_t th[NW];
  int per = TRACE_RING / NW;   /* together exactly fill the ring: nothing may be lost */
  for (int i = 0; i < NW; i++) {
    w[i] = (writer){.t = t, .id = i, .n = per};
    CHECK_EQ_INT(0, pthread_create(&th[i], NULL, write_main, &w[i]));
  }
  for (int i = 0; i < NW; i++) pthread_join(th[i], NULL);
  trace_span *v = NULL;
  size_t n = 0;
  CHECK_OK(trace_collect(t, 0, per, &v, &n));
  CHECK_EQ_INT((int64_t)per * NW, n);
  int count[NW] = {0}, torn = 0;
  for (size_t i = 0; i < n; i++) {
    int id = v[i].lane;
    if (id >= NW || v[i].unit != id || v[i].t0_us != (uint64_t)v[i].step * 3 + (uint64_t)id ||
        v[i].t1_us != v[i].t0_us + 7) {
      torn++;
      continue;
    }
    count[id]++;
  }
  CHECK_EQ_INT(0, torn);
  for (int i = 0; i < NW; i++) CHECK_EQ_INT(per, count[i]);
  free(v);
  trace_destroy(&t);
}

/* A reader while writers wrap the ring several times (the seqlock's other half): every record it
 * returns is whole (a torn one fails the (id, k) relation) and of the lap it reads (each writer's
 * records in its order), and it never returns more than the ring. */
typedef struct reader {
  trace_t *t;
  atomic_int *stop;
  long collects, torn, out_of_order, too_many, failed;
} reader;

static void *read_main(void *arg) {
  reader *r = arg;
  while (!atomic_load(r->stop)) {
    trace_span *v = NULL;
    size_t n = 0;
    if (trace_collect(r->t, 0, INT_MAX, &v, &n) != FSDP_OK) {
      r->failed++;
      continue;
    }
    r->collects++;
    if (n > TRACE_RING) r->too_many++;
    int lastk[TRACE_NLANE];
    for (int l = 0; l < TRACE_NLANE; l++) lastk[l] = -1;
    for (size_t i = 0; i < n; i++) {
      int l = v[i].lane < TRACE_NLANE ? v[i].lane : 0;
      if (v[i].unit != v[i].lane || v[i].t0_us != (uint64_t)v[i].step * 3 + v[i].lane || v[i].t1_us != v[i].t0_us + 7)
        r->torn++;
      else if (v[i].step <= lastk[l])   /* a writer's records come in its order: no record of another lap */
        r->out_of_order++;
      else
        lastk[l] = v[i].step;
    }
    free(v);
    int first, last;
    trace_retained(r->t, &first, &last);
  }
  return NULL;
}

static void test_concurrent_reader(void) {
  trace_t *t = NULL;
  CHECK_OK(trace_new(&t));
  enum { NW = 4 };
  writer w[NW];
  pthread_t th[NW], rd;
  atomic_int stop = 0;
  reader r = {.t = t, .stop = &stop};
  CHECK_EQ_INT(0, pthread_create(&rd, NULL, read_main, &r));
  for (int i = 0; i < NW; i++) {
    w[i] = (writer){.t = t, .id = i, .n = 6 * TRACE_RING};   /* together: the ring 24 times over, more writers than cores */
    CHECK_EQ_INT(0, pthread_create(&th[i], NULL, write_main, &w[i]));
  }
  for (int i = 0; i < NW; i++) pthread_join(th[i], NULL);
  atomic_store(&stop, 1);
  pthread_join(rd, NULL);
  CHECK(r.collects > 0);
  CHECK_EQ_INT(0, r.failed);
  CHECK_EQ_INT(0, r.torn);
  CHECK_EQ_INT(0, r.out_of_order);
  CHECK_EQ_INT(0, r.too_many);
  trace_destroy(&t);
}

static void test_env(void) {
  trace_t *t = NULL;
  setenv("FSDP_TRACE", "0", 1);
  CHECK_OK(trace_from_env(&t));
  CHECK(t == NULL);
  trace_add(t, TRACE_HOST, TRACE_STEP, TRACE_NO_UNIT, 1, 0, 1);   /* NULL-safe */
  setenv("FSDP_TRACE", "yes", 1);
  CHECK_EQ_INT(FSDP_ERR_INVALID, trace_from_env(&t));
  setenv("FSDP_TRACE", "1", 1);
  CHECK_OK(trace_from_env(&t));
  CHECK(t != NULL);
  trace_destroy(&t);
}

int main(void) {
  test_nesting();
  test_wrap();
  test_concurrent();
  test_concurrent_reader();
  test_env();
  return check_done();
}
