/* test_device — the device layer on the CPU (worker/device/device.h): bf16 rounding, the memory and
 * optimizer operations against plain loops, events (marks, tickets, waits across threads), and the
 * asynchronous devices' ordering: the stream runs in submission order, waits hold it back until a
 * producer completes the event, and the host's sync sees everything before it. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "device.h"
#include "mem.h"
#include "safetensors.h"

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* bf16 of x by the device's cast, widened back by the device. */
static uint16_t dev_round(device_t *d, float x) {
  float *src = d->op->alloc(d, MEM_WORKSPACE, 4);
  uint16_t *dst = d->op->alloc(d, MEM_WORKSPACE, 2);
  src[0] = x;
  d->kern->cast_bf16(d, dst, src, 1);
  d->op->sync(d);
  uint16_t r = dst[0];
  d->op->free(d, src);
  d->op->free(d, dst);
  return r;
}

static void test_bf16_rounding(device_t *d) {
  /* exact values stay */
  CHECK_EQ_INT(0x3f80, dev_round(d, 1.0f));
  CHECK_EQ_INT(0xbf80, dev_round(d, -1.0f));
  CHECK_EQ_INT(0x0000, dev_round(d, 0.0f));
  CHECK_EQ_INT(0x8000, dev_round(d, -0.0f));
  /* ties to even: 1 + 2^-8 lies halfway between 1 (even mantissa) and 1 + 2^-7: down */
  CHECK_EQ_INT(0x3f80, dev_round(d, from_bits(0x3f808000u)));
  /* 1 + 3·2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up */
  CHECK_EQ_INT(0x3f82, dev_round(d, from_bits(0x3f818000u)));
  /* just above and below a tie */
  CHECK_EQ_INT(0x3f81, dev_round(d, from_bits(0x3f808001u)));
  CHECK_EQ_INT(0x3f80, dev_round(d, from_bits(0x3f807fffu)));
  /* infinities stay, the largest finite floats round to infinity, NaN stays NaN (quiet) */
  CHECK_EQ_INT(0x7f80, dev_round(d, INFINITY));
  CHECK_EQ_INT(0xff80, dev_round(d, -INFINITY));
  CHECK_EQ_INT(0x7f80, dev_round(d, from_bits(0x7f7fffffu)));
  uint16_t n = dev_round(d, NAN);
  CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
  uint16_t sn = dev_round(d, from_bits(0x7f800001u));   /* a signalling NaN whose payload is in the dropped bits */
  CHECK((sn & 0x7f80) == 0x7f80 && (sn & 0x7f) != 0);
  /* subnormals round like any other value; the smallest ones to zero, ties to even */
  CHECK_EQ_INT(0x0001, dev_round(d, from_bits(0x00010000u)));   /* exactly representable */
  CHECK_EQ_INT(0x0000, dev_round(d, from_bits(0x00008000u)));   /* halfway to the smallest: even (0) */
  CHECK_EQ_INT(0x0002, dev_round(d, from_bits(0x00018000u)));   /* halfway between 1 and 2: even (2) */
  CHECK_EQ_INT(0x0000, dev_round(d, from_bits(0x00000001u)));
  /* the largest subnormal rounds up into the smallest normal */
  CHECK_EQ_INT(0x0080, dev_round(d, from_bits(0x007fffffu)));
  /* widening is exact: every bf16 pattern that is not NaN comes back bit for bit */
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = st_bf16_to_f32((uint16_t)h);
    if (isnan(f)) continue;
    if (st_f32_to_bf16(f) != h) bad++;
  }
  CHECK_EQ_INT(0, bad);
}

static void test_memory_ops(device_t *d) {
  const int n = 1000;
  float *a = d->op->alloc(d, MEM_WORKSPACE, n * 4), *b = d->op->alloc(d, MEM_WORKSPACE, n * 4);
  uint16_t *h = d->op->alloc(d, MEM_WORKSPACE, n * 2);
  float *out = d->op->alloc(d, MEM_WORKSPACE, 8);
  for (int i = 0; i < n; i++) a[i] = (float)(i - 500) * 0.37f;
  d->kern->fill(d, b, 2.0f, n);
  d->kern->add(d, b, a, DTYPE_FP32, n);           /* b = 2 + a */
  d->kern->cast_bf16(d, h, a, n);
  d->kern->add(d, b, h, DTYPE_BF16, n);           /* b = 2 + a + bf16(a) */
  d->kern->sumsq(d, out, a, n, 0.5f);
  d->op->sync(d);
  int bad = 0;
  double sq = 0;
  for (int i = 0; i < n; i++) {
    float want = 2.0f + a[i];
    want += st_bf16_to_f32(st_f32_to_bf16(a[i]));
    bad += b[i] != want;
    sq += (double)a[i] * a[i];
  }
  CHECK_EQ_INT(0, bad);
  CHECK_NEAR(sq * 0.5, out[0], 0, 1e-7);
  CHECK(out[1] == 0.0f);
  a[7] = INFINITY;
  d->kern->sumsq(d, out, a, n, 1.0f);
  d->kern->to_act(d, b, h, DTYPE_BF16, n);        /* widen */
  d->op->copy(d, a, b, n * 4);
  d->op->zero(d, h, n * 2);
  d->op->sync(d);
  CHECK(out[1] == 1.0f);
  CHECK(a[3] == st_bf16_to_f32(st_f32_to_bf16((3 - 500) * 0.37f)));
  CHECK(h[n - 1] == 0);
  d->op->free(d, a);
  d->op->free(d, b);
  d->op->free(d, h);
  d->op->free(d, out);
}

/* ---- events across threads ---- */

typedef struct producer {
  dev_event *go;      /* the producer waits for this (a stream event) */
  uint64_t go_ticket;
  dev_event *done;    /* and then completes this */
  uint64_t done_ticket;
  float *buf;
} producer;

/* How long "the collective" takes: the stream must be seen blocked at least this long per round. */
#define PRODUCER_HOLD_NS 3000000L

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *producer_main(void *arg) {
  producer *p = arg;
  if (dev_event_host_wait(p->go, p->go_ticket, 30) != FSDP_OK) return NULL;
  /* A duration to be measured, not a synchronization: the stream waits on DONE whatever it lasts. */
  struct timespec hold = {0, PRODUCER_HOLD_NS};
  nanosleep(&hold, NULL);
  for (int i = 0; i < 256; i++) p->buf[i] = (float)i;   /* "the collective" writes its result */
  dev_event_complete(p->done, p->done_ticket);
  return NULL;
}

/* The stream fills a buffer, records GO; a producer thread (the comm) waits for GO, writes a
 * result and completes DONE; the stream waits on DONE and reads the result. On every device the
 * stream must see the producer's values, never the stale ones. */
static void test_ordering(device_t *d, const char *what) {
  float *buf = d->op->alloc(d, MEM_WORKSPACE, 256 * 4), *copy = d->op->alloc(d, MEM_WORKSPACE, 256 * 4);
  dev_event *go = dev_event_new(d), *done = dev_event_new(d);
  CHECK_EQ_INT(0, dev_event_last(go));
  uint64_t us[DEV_NTIMER];
  d->op->timers(d, us);   /* reads and resets: what follows counts from here */
  double t0 = wall_s();
  for (int round = 0; round < 20; round++) {
    d->kern->fill(d, buf, -1.0f, 256);
    d->op->record(d, go);
    producer p = {.go = go, .go_ticket = dev_event_last(go), .done = done, .buf = buf};
    p.done_ticket = dev_event_mark(done);
    pthread_t th;
    pthread_create(&th, NULL, producer_main, &p);
    d->op->wait(d, done, DEV_T_GATHER);
    d->op->copy(d, copy, buf, 256 * 4);
    CHECK_OK(d->op->sync(d));
    pthread_join(th, NULL);
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += copy[i] != (float)i;
    CHECK_EQ_INT(0, bad);
  }
  CHECK_EQ_INT(20, dev_event_last(go));
  double wall_us = (wall_s() - t0) * 1e6;
  d->op->timers(d, us);
  double blocked = (double)us[DEV_T_GATHER], busy = (double)us[DEV_T_COMPUTE];
  printf("%s: 20 rounds ordered; stream blocked %.3f ms on the producer, busy %.3f ms, wall %.3f ms\n", what,
         blocked / 1e3, busy / 1e3, wall_us / 1e3);
  /* The wait timer sees every round's hold (the producer starts holding only after GO, which the
   * stream records before it waits), and no timer can exceed the wall time that passed. */
  CHECK(blocked >= 20 * (PRODUCER_HOLD_NS / 1e3) * 0.9);
  CHECK(blocked <= wall_us);
  CHECK(busy <= wall_us);
  CHECK_EQ_INT(0, us[DEV_T_REDUCE]);   /* nothing ran or waited under the reduce timer */
  /* a wait on a mark nobody completes times out on the host */
  uint64_t t = dev_event_mark(done);
  CHECK(dev_event_host_wait(done, t, 0.05) == FSDP_ERR_TIMEOUT);
  dev_event_complete(done, t);
  CHECK_OK(dev_event_host_wait(done, t, 0.05));
  /* an earlier mark is complete once a later one is */
  CHECK_OK(dev_event_host_wait(done, t - 1, 0.05));
  dev_event_destroy(&go);
  dev_event_destroy(&done);
  CHECK(go == NULL);
  d->op->free(d, buf);
  d->op->free(d, copy);
}

/* Strict devices' events are demanded only by a wait: what lets a lazy collective run. */
static void test_demand(void) {
  device_t *s = NULL, *a = NULL;
  CHECK_OK(dev_new_cpu(DEV_CPU_STRICT, &s));
  CHECK_OK(dev_new_cpu(DEV_CPU_ASYNC, &a));
  dev_event *es = dev_event_new(s), *ea = dev_event_new(a);
  CHECK(dev_event_lazy(es) && !dev_event_lazy(ea));
  uint64_t t = dev_event_mark(es);
  CHECK(!dev_event_demanded(es, t));
  CHECK(dev_event_demanded(ea, dev_event_mark(ea)));   /* eager devices: always */
  s->op->wait(s, es, DEV_T_GATHER);                     /* the stream now waits for it */
  /* the stream thread reaches the wait on its own time: poll the condition, 10 s at most */
  int demanded = 0;
  for (int i = 0; i < 10000 && !(demanded = dev_event_demanded(es, t)); i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  CHECK(demanded);
  dev_event_complete(es, t);
  CHECK_OK(s->op->sync(s));
  dev_event_destroy(&es);
  dev_event_destroy(&ea);
  dev_destroy(&s);
  dev_destroy(&a);
}

static void test_env(void) {
  dev_cpu_mode m;
  setenv("FSDP_CPU_DEVICE", "strict", 1);
  CHECK_OK(dev_cpu_mode_from_env(&m));
  CHECK(m == DEV_CPU_STRICT);
  setenv("FSDP_CPU_DEVICE", "gpu", 1);
  CHECK(dev_cpu_mode_from_env(&m) == FSDP_ERR_INVALID);
  CHECK(strstr(fsdp_last_error(), "allowed: sync, async, strict") != NULL);
  unsetenv("FSDP_CPU_DEVICE");
  CHECK_OK(dev_cpu_mode_from_env(&m));
  CHECK(m == DEV_CPU_SYNC);
}

int main(void) {
  static const dev_cpu_mode modes[] = {DEV_CPU_SYNC, DEV_CPU_ASYNC, DEV_CPU_STRICT};
  for (int i = 0; i < 3; i++) {
    device_t *d = NULL;
    CHECK_OK(dev_new_cpu(modes[i], &d));
    if (!d) return 1;
    test_bf16_rounding(d);
    test_memory_ops(d);
    test_ordering(d, d->op->name);
    dev_destroy(&d);
    CHECK(d == NULL);
  }
  test_demand();
  test_env();
  mem_stats st;
  mem_get_stats(&st);
  CHECK_EQ_INT(0, (int64_t)st.cur[MEM_WORKSPACE]);
  return check_done();
}
