/* envknob — the table of FSDP_* environment variables; see envknob.h. */
#include "envknob.h"

#include <stdlib.h>

const envknob envknobs[ENV_NKNOBS] = {
  [ENV_CTL] = {"FSDP_CTL", NULL, "fsdpctl: the daemon's ctl endpoint when --ctl is not given (default ipc://STATE/ctl.sock)"},
  [ENV_SERVER_KEY] = {"FSDP_SERVER_KEY", NULL, "fsdpctl, fsdpd --join: the coordinator's public CURVE key file for tcp://"},
  [ENV_CLIENT_KEY] = {"FSDP_CLIENT_KEY", NULL, "fsdpctl, fsdpd --join: this client's CURVE keypair file for tcp://"},
  [ENV_WORKER] = {"FSDP_WORKER", NULL, "fsdpctl sample: the fsdp-worker to run (default the one next to fsdpctl)"},
  [ENV_GNUPLOT] = {"FSDP_GNUPLOT", NULL, "fsdpctl plot: the gnuplot to run (default gnuplot on PATH)"},
  [ENV_CPU_DEVICE] = {"FSDP_CPU_DEVICE", "sync", "fsdp-worker: the CPU device, sync | async | strict (tests run the asynchronous ones)"},
  [ENV_CPU_BF16] = {"FSDP_CPU_BF16", "auto", "fsdp-worker, param_dtype = bf16 on the CPU: auto (AVX512-BF16 GEMMs where the CPU has them at >= 0.71 of fp32 FMA's measured rate, else fp32) | on (AVX512-BF16 GEMMs wherever the CPU has them) | off (fp32) | emulate (bf16-rounded inputs, fp32 GEMMs)"},
  [ENV_TRACE] = {"FSDP_TRACE", "1", "fsdp-worker: 1 records spans for fsdpctl trace, 0 records none"},
  [ENV_GLOO_IFACE] = {"FSDP_GLOO_IFACE", NULL, "fsdp-worker: the network interface gloo binds (before FSDP_GLOO_HOST)"},
  [ENV_GLOO_HOST] = {"FSDP_GLOO_HOST", NULL, "fsdp-worker: the host name or address gloo binds (default the host name)"},
  [ENV_CUDNN_LIB] = {"FSDP_CUDNN_LIB", NULL, "fsdp-worker (cuda): the libcudnn to open before the system's and a PyTorch wheel's"},
  [ENV_CUDA_ATTN] = {"FSDP_CUDA_ATTN", "cudnn", "fsdp-worker (cuda): the attention kernel, cudnn | tc | fma"},
  [ENV_SUM_ORDER] = {"FSDP_SUM_ORDER", NULL, "tests (test_runtime, test_hybrid only): split_k and/or reverse_ring sum GEMMs and the reduce-scatter ring in another order"},
  [ENV_FAULT] = {"FSDP_FAULT", NULL, "tests (test_runtime only): drop_reduce_scatter plants a fault the equivalence tests must catch"},
  [ENV_TEST_CKPT_PAUSE] = {"FSDP_TEST_CKPT_PAUSE", NULL, "tests (the binaries built for them only): POINT:STEP holds a checkpoint writer at POINT (begin, mid, manifest)"},
  [ENV_TEST_CKPT_PAUSE_DIR] = {"FSDP_TEST_CKPT_PAUSE_DIR", NULL, "tests: where a held writer says so and waits for its release"},
};

const char *envknob_get(envknob_id id) {
  const char *v = getenv(envknobs[id].name);
  return v && *v ? v : envknobs[id].def;
}
