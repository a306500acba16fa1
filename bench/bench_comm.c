/* bench_comm — all-gather and reduce-scatter bandwidth of the gloo backend, nccl-tests style.
 *
 *   build/bench/bench_comm [--world N] [--iters K] [--warmup W] [--min-bytes B] [--max-bytes B]
 *                          [--timeout S]
 *
 * Forks N ranks on this machine that rendezvous through a fresh file store (TCP over loopback).
 * For each size S (the whole gathered buffer, 64 KiB to 256 MiB by ×4), each rank runs W warm-up
 * and K timed iterations of each collective; an iteration's time is that of the slowest rank
 * (barrier, time the blocking call, all-gather the times, take the max) and the table shows the
 * median. nccl-tests' convention: algbw = S/t, busbw = algbw·(N−1)/N, in GB/s (1e9 bytes/s).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conditions.h"
#include "comm.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct {
  int world, iters, warmup;
  size_t min_bytes, max_bytes;
  double timeout_s;
} opts_t;

/* Time one collective of total size S: returns the median over iterations of the slowest rank. */
static fsdp_status time_op(comm_t *c, const opts_t *o, int rs, float *big, float *small, size_t count,
                           double *median) {
  int n = comm_world(c);
  double *t = calloc((size_t)o->iters, sizeof *t);
  float *all = calloc((size_t)n, sizeof *all);
  fsdp_status st = FSDP_OK;
  for (int it = -o->warmup; it < o->iters && st == FSDP_OK; it++) {
    if ((st = comm_barrier(c)) != FSDP_OK) break;
    double t0 = now_s();
    st = rs ? comm_reduce_scatter(c, big, small, count, COMM_F32, NULL)
            : comm_allgather(c, small, big, count, COMM_F32, NULL);
    float dt = (float)(now_s() - t0);
    if (st != FSDP_OK) break;
    if ((st = comm_allgather(c, &dt, all, 1, COMM_F32, NULL)) != FSDP_OK) break;
    if (it < 0) continue;
    double mx = 0;
    for (int r = 0; r < n; r++) mx = all[r] > mx ? all[r] : mx;
    t[it] = mx;
  }
  if (st == FSDP_OK) {
    qsort(t, (size_t)o->iters, sizeof *t, cmp_double);
    *median = o->iters % 2 ? t[o->iters / 2] : 0.5 * (t[o->iters / 2 - 1] + t[o->iters / 2]);
  }
  free(t);
  free(all);
  return st;
}

static int rank_main(int rank, const opts_t *o, const char *dir) {
  comm_t *c = NULL;
  fsdp_status st = comm_new_gloo(rank, o->world, dir, NULL, "bench", o->timeout_s, &c);
  if (st != FSDP_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, fsdp_last_error());
    return 1;
  }
  int n = o->world;
  size_t maxcount = o->max_bytes / sizeof(float) / (size_t)n;
  float *big = malloc(maxcount * (size_t)n * sizeof(float)), *small = malloc(maxcount * sizeof(float));
  if (!big || !small) {
    fprintf(stderr, "rank %d: cannot allocate %zu bytes\n", rank, o->max_bytes);
    return 1;
  }
  for (size_t i = 0; i < maxcount * (size_t)n; i++) big[i] = (float)(i % 251);
  for (size_t i = 0; i < maxcount; i++) small[i] = (float)(i % 13);
  if (rank == 0) {
    printf("# bench_comm: gloo %s, world %d, fp32, TCP over loopback\n", "0.5.0", n);
    printf("# time = median over %d iterations (after %d warm-up) of the slowest rank's time\n", o->iters, o->warmup);
    printf("# algbw = S/t with S the whole gathered size; busbw = algbw*(n-1)/n; GB/s = 1e9 bytes/s\n");
    printf("#%12s %12s  %24s  %24s\n", "", "", "all-gather", "reduce-scatter");
    printf("#%12s %12s  %9s %7s %7s  %9s %7s %7s\n", "size(B)", "count", "time(us)", "algbw", "busbw", "time(us)",
           "algbw", "busbw");
    fflush(stdout);
  }
  int rc = 0;
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 4) {
    size_t count = bytes / sizeof(float) / (size_t)n;   /* elements per rank */
    size_t S = count * (size_t)n * sizeof(float);
    double tag = 0, trs = 0;
    if ((st = time_op(c, o, 0, big, small, count, &tag)) != FSDP_OK ||
        (st = time_op(c, o, 1, big, small, count, &trs)) != FSDP_OK) {
      fprintf(stderr, "rank %d: %s\n", rank, fsdp_last_error());
      rc = 1;
      break;
    }
    if (rank == 0) {
      double ag_alg = (double)S / tag / 1e9, rs_alg = (double)S / trs / 1e9;
      double f = (double)(n - 1) / n;
      printf(" %12zu %12zu  %9.1f %7.2f %7.2f  %9.1f %7.2f %7.2f\n", S, count * (size_t)n, tag * 1e6, ag_alg,
             ag_alg * f, trs * 1e6, rs_alg, rs_alg * f);
      fflush(stdout);
    }
  }
  free(big);
  free(small);
  comm_destroy(&c);
  return rc;
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench_comm [--world N (2)] [--iters K (5)] [--warmup W (1)] [--min-bytes B (65536)]\n"
          "                  [--max-bytes B (268435456)] [--timeout S (60)]\n");
}

int main(int argc, char **argv) {
  opts_t o = {.world = 2, .iters = 5, .warmup = 1, .min_bytes = 64 << 10, .max_bytes = 256 << 20, .timeout_s = 60};
  bench_conditions_begin();
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--world")) o.world = atoi(v);
    else if (!strcmp(a, "--iters")) o.iters = atoi(v);
    else if (!strcmp(a, "--warmup")) o.warmup = atoi(v);
    else if (!strcmp(a, "--min-bytes")) o.min_bytes = strtoull(v, NULL, 0);
    else if (!strcmp(a, "--max-bytes")) o.max_bytes = strtoull(v, NULL, 0);
    else if (!strcmp(a, "--timeout")) o.timeout_s = atof(v);
    else {
      fprintf(stderr, "bench_comm: unknown option %s\n", a);
      usage();
      return 2;
    }
  }
  if (o.world < 1 || o.world > 64 || o.iters < 1 || o.warmup < 0 || o.min_bytes < 4 * (size_t)o.world ||
      o.max_bytes < o.min_bytes || !(o.timeout_s > 0)) {
    fprintf(stderr, "bench_comm: allowed: 1 <= world <= 64, iters >= 1, warmup >= 0, "
                    "4·world <= min-bytes <= max-bytes, timeout > 0\n");
    return 2;
  }
  char dir[] = "/tmp/fsdp-bench-comm-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("bench_comm: mkdtemp");
    return 1;
  }
  fflush(NULL);
  pid_t *pids = calloc((size_t)o.world, sizeof *pids);
  for (int r = 0; r < o.world; r++) {
    pid_t p = fork();
    if (p == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);   /* never outlive the bench */
      _exit(rank_main(r, &o, dir));
    }
    if (p < 0) {
      perror("bench_comm: fork");
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      o.world = r;
      break;
    }
    pids[r] = p;
  }
  int rc = 0;
  for (int r = 0; r < o.world; r++) {
    int status;
    if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      rc = 1;
      /* One rank failed: the others fail within the timeout on their own; no need to wait longer. */
      for (int q = r + 1; q < o.world; q++) kill(pids[q], SIGTERM);
    }
  }
  free(pids);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "bench_comm: could not remove %s\n", dir);
  bench_conditions_end();
  return rc;
}
