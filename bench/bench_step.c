/* bench_step — one rank's GPT-2 (or, with --arch llama, a Llama of the same shape) training step on the CPU in fp32: forward + backward of the whole
 * model (every unit gathered, as model_forward_backward runs it), and AdamW over the shard, timed
 * separately. Reports tokens/s, achieved GFLOP/s (the plan's flops_per_token × tokens / time) and
 * the share of the step spent inside cblas_sgemm.
 *
 * GEMM share: this program defines cblas_sgemm itself, so the operators' calls land here; it times
 * each call and forwards it to OpenBLAS' own (dlsym RTLD_NEXT). Two clock reads per call against
 * calls of ≥ 10^5 FLOPs cost nothing measurable (compare --no-gemm-timing).
 *
 *   bench_step [--config tiny|small|n2|both] [--arch gpt2|llama] [--layers L] [--batch B] [--seq T] [--iters N]
 *              [--threads N] [--compute fp32|bf16] [--no-gemm-timing]
 * --compute bf16: the GEMMs as param_dtype = bf16 runs them on this CPU (gemm_bf16.h: bf16 inputs and
 * fp32 accumulation with AVX512-BF16 where it measures fast enough against fp32 FMA, or FSDP_CPU_BF16=on,
 * else fp32); the parameters are rounded to bf16 either way then, and the sgemm line counts only
 * what still goes to cblas_sgemm.
 * OpenMP threads that spin after a parallel region starve OpenBLAS' own threads (30× slower steps on
 * a busy 2-core machine), so unless OMP_WAIT_POLICY is set this program re-executes itself with
 * OMP_WAIT_POLICY=passive (libgomp reads it only at start-up).
 *
 * tiny:  L=2 C=64 H=4 V=64 T=32 B=8        small: GPT-2 small's shape (C=768 H=12 V=50257) with
 * L=2, T=256, B=2 unless overridden. n2: one rank's share of the N = 2 bench (bench/cpu_bf16_step.sh),
 * L=4 C=256 H=4 V=4096 T=128 B=2. See docs/performance.md for figures and the PyTorch comparison
 * (bench/torch_step.py).
 */
#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conditions.h"
#include "device.h"
#include "gemm_bf16.h"
#include "ops/bf16.h"
#include "jobspec.h"
#include "model.h"
#include "optim.h"
#include "plan.h"
#include "rng.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- sgemm interposition */

typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const enum CBLAS_TRANSPOSE,
                         const blasint, const blasint, const blasint, const float, const float *, const blasint,
                         const float *, const blasint, const float, float *, const blasint);
static sgemm_fn real_sgemm;
static int gemm_timing = 1;
static _Atomic long long gemm_ns, gemm_flops, gemm_calls;

void cblas_sgemm(const enum CBLAS_ORDER Order, const enum CBLAS_TRANSPOSE TransA, const enum CBLAS_TRANSPOSE TransB,
                 const blasint M, const blasint N, const blasint K, const float alpha, const float *A,
                 const blasint lda, const float *B, const blasint ldb, const float beta, float *C,
                 const blasint ldc) {
  if (!gemm_timing) {
    real_sgemm(Order, TransA, TransB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  double t0 = now_s();
  real_sgemm(Order, TransA, TransB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  gemm_ns += (long long)((now_s() - t0) * 1e9);
  gemm_flops += 2LL * M * N * K;
  gemm_calls++;
}

/* ---------------------------------------------------------------- one configuration */

typedef struct cfg {
  const char *name;
  int L, C, H, V, T, B;
} cfg;

/* this process's CPU time (all threads): beside the wall time on a loaded machine, where another
 * process's time slices inflate the wall clock and not this */
static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int compute_bf16;   /* --compute bf16 */
static int llama;   /* --arch llama: the same shape as Llama (GQA of H/2 kv heads, SwiGLU of 4C, untied) */

static int run(const cfg *c, int iters, int threads) {
  jobspec_t s;
  jobspec_defaults(&s);
  s.model = (model_config){.n_layer = c->L, .n_head = c->H, .n_embd = c->C, .vocab_size = c->V, .seq_len = c->T};
  if (llama)
    s.model = (model_config){.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = c->L, .n_head = c->H, .n_embd = c->C,
                             .vocab_size = c->V, .seq_len = c->T, .n_kv_head = c->H / 2, .ffn_dim = 4 * c->C,
                             .norm_eps = 1e-5, .rope_theta = 10000};
  s.batch_size = c->B;
  s.grad_accum = 1;
  s.world_size = 1;
  s.device = DEVICE_CPU;
  s.param_dtype = s.reduce_dtype = DTYPE_FP32;
  plan_t *p = NULL;
  if (plan_build(&s, 1, &p) != FSDP_OK) {
    fprintf(stderr, "bench_step: plan_build: %s\n", fsdp_last_error());
    return 1;
  }
  const int BT = c->B * c->T;
  const int64_t S = p->shard_total;
  float *w = malloc(sizeof(float) * S), *g = calloc((size_t)S, sizeof(float));
  float *m = calloc((size_t)S, sizeof(float)), *v = calloc((size_t)S, sizeof(float));
  float **units = malloc(sizeof(float *) * p->nunits), **dunits = malloc(sizeof(float *) * p->nunits);
  int *inp = malloc(sizeof(int) * BT), *tgt = malloc(sizeof(int) * BT);
  device_t *dev = NULL;
  if (dev_new_cpu(DEV_CPU_SYNC, &dev) != FSDP_OK) return 1;
  const char *gemm_name = compute_bf16 && dev_cpu_set_compute(dev, DTYPE_BF16) == DTYPE_BF16 ? gemm_kind_name(gemm_bf16_kind()) : "fp32";
  model_acts *a = model_acts_new(p, dev);
  if (!w || !g || !m || !v || !units || !dunits || !inp || !tgt || !a) {
    fprintf(stderr, "bench_step: out of memory for %s\n", c->name);
    return 1;
  }
  model_init_shard(p, 1337, 0, w);
  if (compute_bf16)   /* the values param_dtype = bf16 gathers */
    for (int64_t i = 0; i < S; i++) w[i] = bf16_round(w[i]);
  for (int u = 0; u < p->nunits; u++) {
    units[u] = w + p->units[u].shard_base;
    dunits[u] = g + p->units[u].shard_base;
  }
  for (int i = 0; i < BT; i++) {
    inp[i] = (int)(rng_uniform(5, 0, (uint64_t)i) * c->V);
    tgt[i] = (int)(rng_uniform(5, 1, (uint64_t)i) * c->V);
  }

  double *tf = malloc(sizeof(double) * iters), *to = malloc(sizeof(double) * iters), *tc = malloc(sizeof(double) * iters);
  double loss = 0, gemm_s = 0, flops_gemm = 0, calls = 0;
  for (int it = -1; it < iters; it++) {       /* it = -1: warm-up, not counted */
    gemm_ns = gemm_flops = gemm_calls = 0;
    double t0 = now_s(), c0 = cpu_s();
    float lsum = 0;
    model_forward_backward(p, a, (void *const *)units, dunits, inp, tgt, 1.0f / BT, &lsum);
    double l = lsum / BT;
    double t1 = now_s(), c1 = cpu_s();
    if (it == -1) loss = l;      /* at init: ≈ ln V */
    if (it >= 0) {
      gemm_s += (double)gemm_ns * 1e-9;
      flops_gemm += (double)gemm_flops;
      calls = (double)gemm_calls;
    }
    optim_adamw_shard(p, 0, w, g, m, v, it + 2, 1e-4, (const optim_config[]){optim_config_of(&s)}, 1.0f);
    double t2 = now_s();
    memset(g, 0, sizeof(float) * S);
    if (it >= 0) {
      tf[it] = t1 - t0;
      to[it] = t2 - t1;
      tc[it] = c1 - c0;
    }
  }
  double sum_f = 0;
  for (int i = 0; i < iters; i++) sum_f += tf[i];
  qsort(tf, (size_t)iters, sizeof(double), cmp_double);
  qsort(to, (size_t)iters, sizeof(double), cmp_double);
  qsort(tc, (size_t)iters, sizeof(double), cmp_double);
  double med = tf[iters / 2], med_o = to[iters / 2];
  double step_flops = p->flops_per_token * BT;
  printf("%s %s: L=%d C=%d H=%d V=%d T=%d B=%d params=%lld threads=%d iters=%d OMP_WAIT_POLICY=%s OpenBLAS=%s GEMMs=%s\n",
         jobspec_arch_name(s.model.arch), c->name, c->L, c->C, c->H, c->V, c->T, c->B, (long long)p->n_params, threads, iters,
         getenv("OMP_WAIT_POLICY"), openblas_get_corename(), gemm_name);
  if (compute_bf16 && gemm_bf16_cpu_has()) {
    gemm_bf16_rates r = gemm_bf16_rates_of_cpu();
    printf("  bf16      vdpbf16ps %.1f G multiply-adds/s, fp32 FMA %.1f (%.2fx; FSDP_CPU_BF16=auto runs the kernel from "
           "%.2fx, =on always)\n", r.bf16 / 1e9, r.fp32 / 1e9, r.bf16 / r.fp32, GEMM_BF16_MIN_RATIO);
  }
  printf("  fwd+bwd   median %.4f s  min %.4f s  %.0f tokens/s  %.1f GFLOP/s (plan: %.3g FLOP/token), init loss %.4f\n", med,
         tf[0], BT / med, step_flops / med * 1e-9, p->flops_per_token, loss);
  printf("  fwd+bwd   CPU time median %.4f s (all threads)\n", tc[iters / 2]);
  printf("  adamw     median %.4f s  (%.1f%% of fwd+bwd, %.2f GB/s at 28 B moved per parameter)\n", med_o,
         100 * med_o / med, 28.0 * S / med_o * 1e-9);
  if (gemm_timing)
    printf("  sgemm     %.1f%% of fwd+bwd time (%.0f calls/step, %.1f GFLOP/s inside sgemm, %.1f%% of plan FLOPs)\n",
           100 * gemm_s / sum_f, calls, flops_gemm / gemm_s * 1e-9, 100 * flops_gemm / (step_flops * iters));
  free(tf); free(to); free(tc); free(w); free(g); free(m); free(v); free(units); free(dunits); free(inp); free(tgt);
  model_acts_destroy(&a);
  dev_destroy(&dev);
  plan_destroy(&p);
  return 0;
}

int main(int argc, char **argv) {
  if (!getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "bench_step: could not re-execute with OMP_WAIT_POLICY=passive; continuing without\n");
  }
  bench_conditions_begin();
  const char *which = "both";
  int L = 0, B = 0, T = 0, iters = 0, threads = omp_get_max_threads();
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(k, "--no-gemm-timing")) { gemm_timing = 0; continue; }
    if (!val) { fprintf(stderr, "bench_step: %s needs a value\n", k); return 2; }
    if (!strcmp(k, "--config")) which = val;
    else if (!strcmp(k, "--arch")) llama = !strcmp(val, "llama");
    else if (!strcmp(k, "--layers")) L = atoi(val);
    else if (!strcmp(k, "--batch")) B = atoi(val);
    else if (!strcmp(k, "--seq")) T = atoi(val);
    else if (!strcmp(k, "--iters")) iters = atoi(val);
    else if (!strcmp(k, "--threads")) threads = atoi(val);
    else if (!strcmp(k, "--compute") && (!strcmp(val, "fp32") || !strcmp(val, "bf16"))) compute_bf16 = !strcmp(val, "bf16");
    else {
      fprintf(stderr, "bench_step: unknown option %s (allowed: --config tiny|small|n2|both, --arch gpt2|llama, --layers, --batch, --seq, "
                      "--iters, --threads, --compute fp32|bf16, --no-gemm-timing)\n", k);
      return 2;
    }
    i++;
  }
  if (threads < 1) threads = 1;
  real_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
  if (!real_sgemm) {
    fprintf(stderr, "bench_step: cannot find OpenBLAS' cblas_sgemm: %s\n", dlerror());
    return 1;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  cfg tiny = {"tiny", 2, 64, 4, 64, 32, 8};
  cfg small = {"gpt2-small-shape", 2, 768, 12, 50257, 256, 2};
  cfg n2 = {"n2-rank", 4, 256, 4, 4096, 128, 2};
  int rc = 0;
  if (!strcmp(which, "n2")) {
    if (L) n2.L = L;
    if (B) n2.B = B;
    if (T) n2.T = T;
    rc |= run(&n2, iters ? iters : 20, threads);
  }
  if (!strcmp(which, "tiny") || !strcmp(which, "both")) {
    if (L) tiny.L = L;
    if (B) tiny.B = B;
    if (T) tiny.T = T;
    rc |= run(&tiny, iters ? iters : 50, threads);
  }
  if (!strcmp(which, "small") || !strcmp(which, "both")) {
    if (L) small.L = L;
    if (B) small.B = B;
    if (T) small.T = T;
    rc |= run(&small, iters ? iters : 5, threads);
  }
  bench_conditions_end();
  return rc;
}
