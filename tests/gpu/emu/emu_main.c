/* emu_main — gpu_check's kernel checks (the tiny shapes) against the host emulator of the kernels
 * (tests/gpu/emu/run.sh). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_check.h"

long emu_fault_hits(void);      /* emu.cpp */
long emu_attr_calls_made(void); /* emu.cpp */

/* The attention kernels' shared-memory attributes are set once per device and kernel: the first
 * round of calls sets them, a second round of forward and backward calls, through the tensor-core and the FMA kernels alike, makes
 * no cudaGetDevice, cudaDeviceGetAttribute or cudaFuncSetAttribute call. */
static void check_attention_attrs(void) {
  if (!check_selected("attention_attrs")) return;
  const int B = 1, T = 40, C = 128, NH = 2, hs = C / NH, C3 = 3 * C;
  const size_t n = (size_t)B * T * C3, no = (size_t)B * T * C;
  void *qkv = d_bf16(h_bf16_uniform(n, -1, 1), n), *dout = d_bf16(h_bf16_uniform(no, -1, 1), no);
  void *out = d_nan_bf16(no), *dqkv = d_nan_bf16(n);
  float *lse = d_nan_f32((size_t)B * NH * T), *scratch = dbuf((size_t)B * NH * T * (hs + 1) * sizeof(float));
  static const ops_attn_impl impls[] = {OPS_ATTN_TC, OPS_ATTN_FMA};
  const ops_attn_impl was = ops_cuda_attention_selected();
  long calls[2] = {0, 0};
  fsdp_status st = FSDP_OK;
  for (int round = 0; round < 2; round++) {
    const long before = emu_attr_calls_made();
    for (int i = 0; i < 2 && st == FSDP_OK; i++) {
      ops_cuda_attention_select(impls[i]);
      st = ops_cuda_attention_forward(out, lse, qkv, B, T, C, NH, NH, NULL, 0, &g_ctx);
      if (st == FSDP_OK)
        st = ops_cuda_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NH, NULL, 0, &g_ctx);
    }
    calls[round] = emu_attr_calls_made() - before;
  }
  ops_cuda_attention_select(was);
  char detail[160];
  snprintf(detail, sizeof detail, "attribute calls: %ld in the first round, %ld in the second (want 0)%s%s", calls[0],
           calls[1], st == FSDP_OK ? "" : "; ", st == FSDP_OK ? "" : fsdp_last_error());
  verdict("attention attributes set once per device and kernel", st == FSDP_OK && calls[0] > 0 && calls[1] == 0,
          detail);
  free_all();
}

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
    check_attention_attrs(); /* first: no attention kernel has run yet */
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
