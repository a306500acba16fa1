/* sum_order — the CPU operators' and the gloo adapter's test hooks (ops_cpu.h, comm.h), linked only
 * into the test binaries that reorder the sums or plant the reduce-scatter fault (tests/CMakeLists.txt:
 * test_runtime, test_hybrid); fsdp-worker keeps the weak no-ops of ops_cpu.c and comm_gloo.cc.
 * Each reads its variable once per process (the ranks are forked processes) and caches the answer;
 * any thread.
 */
#include <string.h>

#include "comm.h"
#include "envknob.h"
#include "ops/ops_cpu.h"

/* 1 when WORD is in KNOB's value, else 0; cached in *CACHE (-1: not read yet). */
static int knob_has(int *cache, envknob_id knob, const char *word) {
  int on = __atomic_load_n(cache, __ATOMIC_RELAXED);
  if (on < 0) {
    const char *v = envknob_get(knob);
    on = v && strstr(v, word) != NULL;
    __atomic_store_n(cache, on, __ATOMIC_RELAXED);
  }
  return on;
}

/* FSDP_SUM_ORDER=split_k: every CPU GEMM as two over the halves of its inner dimension. */
int ops_test_split_k(void) {
  static int on = -1;
  return knob_has(&on, ENV_SUM_ORDER, "split_k");
}

/* FSDP_SUM_ORDER=reverse_ring: gloo's reduce-scatter ring runs the other way round. */
int comm_test_reverse_ring(void) {
  static int on = -1;
  return knob_has(&on, ENV_SUM_ORDER, "reverse_ring");
}

/* FSDP_FAULT=drop_reduce_scatter: every rank keeps its own partial block instead of the sum. */
int comm_test_drop_reduce_scatter(void) {
  static int on = -1;
  return knob_has(&on, ENV_FAULT, "drop_reduce_scatter");
}
