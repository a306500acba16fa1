/* testfiles — helpers shared by the tests that fork ranks and exchange results through files
 * (test_runtime, test_ckpt): whole-file reads and writes, clean-up, a clock, and putting a rank's
 * shard back into the full (unpadded) model. */
#ifndef FSDP_TESTFILES_H
#define FSDP_TESTFILES_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plan.h"

/* Write or read exactly N bytes; 0 on success, -1 otherwise. */
static inline int write_all(const char *path, const void *buf, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return -1;
  ssize_t w = write(fd, buf, n);
  close(fd);
  return w == (ssize_t)n ? 0 : -1;
}

static inline int read_all(const char *path, void *buf, size_t n) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t r = read(fd, buf, n);
  close(fd);
  return r == (ssize_t)n ? 0 : -1;
}

static inline void rm_rf(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Whether files A and B exist and hold the same bytes. */
static inline int files_equal(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int eq = fa && fb;
  while (eq) {
    int x = fgetc(fa), y = fgetc(fb);
    eq = x == y;
    if (x == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return eq;
}

/* Plan *P of model M for WORLD ranks with one sequence per rank and step: full sharding, or none
 * on one rank. */
static inline fsdp_status plan_of_model(model_config m, int world, plan_t **p) {
  jobspec_t spec;
  jobspec_defaults(&spec);
  spec.model = m;
  spec.batch_size = spec.grad_accum = 1;
  spec.world_size = world;
  spec.sharding = world == 1 ? SHARD_NONE : SHARD_FULL;
  return plan_build(&spec, world, p);
}

/* Copy RANK's shard (p->shard_total floats) into FULL, the units' unpadded buffers concatenated. */
static inline void place_shard(const plan_t *p, int rank, const float *shard, float *full) {
  int64_t base = 0;
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *pu = &p->units[u];
    int64_t off = plan_shard_offset(p, u, rank);
    for (int64_t i = 0; i < pu->shard_numel; i++)
      if (off + i < pu->numel) full[base + off + i] = shard[pu->shard_base + i];
    base += pu->numel;
  }
}

/* The forked ranks share the machine's cores: one OpenMP/BLAS thread each, and OpenMP threads that
 * sleep rather than spin when idle. libgomp reads its settings when the program loads, before
 * main(), so they are set in the environment and the test re-executes itself once (as fsdp-worker
 * does). */
static inline void single_threaded_ranks(char **argv) {
  const char *pol = getenv("OMP_WAIT_POLICY");
  if (pol && !strcmp(pol, "passive")) return;
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);
  perror("re-executing with OMP_WAIT_POLICY=passive");   /* go on as we are */
}

#endif
