/* emu_main — gpu_check's kernel checks (the tiny shapes) against the host emulator of the kernels
 * (tests/gpu/emu/run.sh). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_check.h"

long emu_fault_hits(void); /* emu.cpp */

/* No argument: every check but the documents' and the window's; "docmask": those alone (two ctests,
 * so that each stays within its time limit on a loaded machine). */
int main(int argc, char **argv) {
  const char *seed_env = getenv("GPU_CHECK_SEED");
  uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL);
  rng_seed(seed);
  printf("emulated kernels (tests/gpu/emu): GPU_CHECK_SEED=%llu\n", (unsigned long long)seed);
  g_ctx.workspace_bytes = OPS_CUDA_WORKSPACE_MIN;
  CU(cudaMalloc(&g_ctx.workspace, g_ctx.workspace_bytes));
  if (argc > 1 && !strcmp(argv[1], "docmask")) {
    check_docmask_ops();
  } else {
    check_model_ops(0);
    check_llama_ops(0);
    check_util_ops();
    check_lora_ops();
  }
  const char *fault = getenv("EMU_FAULT");
  if (fault && *fault) { /* a planted fault: the run passes when the fault ran and a check caught it */
    const long hits = emu_fault_hits();
    const int caught = hits > 0 && g_fail > 0;
    printf("\nemu: planted fault %s hit %ld times; %d checks passed, %d failed: %s\n", fault, hits, g_pass, g_fail,
           caught ? "CAUGHT (PASS)" : hits ? "NOT CAUGHT (FAIL)" : "NEVER HIT (FAIL)");
    return caught ? 0 : 1;
  }
  if (g_pass + g_fail == 0) {
    printf("\nemu: no check ran (GPU_CHECK_ONLY=%s): FAIL\n", getenv("GPU_CHECK_ONLY"));
    return 1;
  }
  printf("\nemu: %d checks passed, %d failed: %s\n", g_pass, g_fail, g_fail ? "FAIL" : "PASS");
  return g_fail ? 1 : 0;
}
