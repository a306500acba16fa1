/* bench_trace — what one span costs (worker/trace.h): the ring's trace_add, a begin/end pair on
 * one lane, and a span taken on the compute stream (dev_ops.trace: two pseudo-ops) on each CPU
 * device mode, from submission until the stream has run them.
 *
 *   build/bench/bench_trace [--spans N] [--repeats R]
 *
 * Each figure is the median over R repeats of N spans, in ns per span. A step records
 * G·(5L + 5) + 4 spans (docs/observability.md), so the cost per step is that many times these.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conditions.h"
#include "device.h"
#include "monotime.h"
#include "trace.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

int main(int argc, char **argv) {
  long n = 200000, reps = 7;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--spans") && i + 1 < argc) n = atol(argv[++i]);
    else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) reps = atol(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_trace [--spans N] [--repeats R]\n");
      return 2;
    }
  }
  if (n < 1 || reps < 1 || reps > 1000) {
    fprintf(stderr, "bench_trace: --spans and --repeats must be positive (repeats at most 1000)\n");
    return 2;
  }
  bench_conditions_begin();
  trace_t *t = NULL;
  if (trace_new(&t) != FSDP_OK) {
    fprintf(stderr, "bench_trace: %s\n", fsdp_last_error());
    return 1;
  }
  double v[1000];
  printf("%-34s %10s\n", "what", "ns/span");
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) trace_add(t, TRACE_COMM, TRACE_ALLGATHER, (int)(i & 15), 1, (uint64_t)i, (uint64_t)i + 1);
    v[r] = (now_ns() - t0) / (double)n;
  }
  printf("%-34s %10.1f\n", "trace_add (comm thread)", median(v, (int)reps));
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
      trace_begin(t, TRACE_HOST, monotime_us());
      trace_end(t, TRACE_HOST, TRACE_STEP, TRACE_NO_UNIT, 1, monotime_us());
    }
    v[r] = (now_ns() - t0) / (double)n;
  }
  printf("%-34s %10.1f\n", "begin + end with the clock (host)", median(v, (int)reps));
  static const struct { dev_cpu_mode mode; const char *name; } modes[] = {
    {DEV_CPU_SYNC, "stream span, CPU device sync"}, {DEV_CPU_ASYNC, "stream span, CPU device async"}};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    device_t *d = NULL;
    if (dev_new_cpu(modes[m].mode, &d) != FSDP_OK) {
      fprintf(stderr, "bench_trace: %s\n", fsdp_last_error());
      return 1;
    }
    for (int r = 0; r < reps; r++) {
      double t0 = now_ns();
      for (long i = 0; i < n; i++) {
        d->op->trace(d, t, 0, TRACE_FORWARD, 1, 1);
        d->op->trace(d, t, 1, TRACE_FORWARD, 1, 1);
      }
      d->op->sync(d);
      v[r] = (now_ns() - t0) / (double)n;
    }
    printf("%-34s %10.1f\n", modes[m].name, median(v, (int)reps));
    dev_destroy(&d);
  }
  trace_destroy(&t);
  bench_conditions_end();
  return 0;
}
