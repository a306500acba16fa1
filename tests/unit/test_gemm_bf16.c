/* test_gemm_bf16 — the CPU's bf16 compute (worker/ops/gemm_bf16.h): bf16 inputs, fp32 accumulation.
 *
 * Part "gemm": every transposition, odd sizes (K odd: the pair padding; K > 256: several chunks),
 * alpha ≠ 1, beta 0 (C not read: NaN in it) and ≠ 0, against a double-precision reference:
 *   - the contract, sharp: against the exact product of the inputs ROUNDED to bf16, the error is
 *     only that of n ≈ K fp32 roundings, |C − ref_bf16| ≤ γ_n·Σ|terms| (γ_n = n·2^-24/(1 − n·2^-24));
 *     inputs truncated instead of rounded (the planted error) break it;
 *   - against the fp32 inputs, within gemm_bf16_error_bound (2u + u² + γ_n, u = 2^-8), and NOT
 *     within fp32's γ_n somewhere (the inputs really are rounded to bf16).
 * Both the AVX512-BF16 kernel (where the CPU has it) and the emulation (any CPU) are checked.
 * Part "loss": three steps of a small GPT-2 (bf16 parameters, as param_dtype = bf16 gathers them) on
 * CPU devices computing in fp32, in emulated bf16 and, where the CPU has it, with the kernel: the
 * bf16 losses stay within the documented tolerance of the fp32 path's (docs/performance.md, "bf16
 * on the CPU": Σ over the GEMMs on the forward path of 2u + γ_K, relative) and differ from them;
 * a loss planted 1.5 tolerances away fails. (The kernel and the emulation are not compared to fp32
 * precision here: a different order of fp32 sums moves an activation across a bf16 rounding
 * boundary now and then, and the next GEMM then sees a value 2^-8 away; the sharp comparison is
 * part "gemm"'s, per product.)
 * Part "choice": FSDP_CPU_BF16 and the measured rates decide (gemm_bf16_choose's table, rates
 * planted on both sides of GEMM_BF16_MIN_RATIO; "on" forces the kernel where the CPU has it), and
 * gemm_bf16_kind follows the probe on this CPU.
 * Part "fallback": with FSDP_CPU_BF16=off (a CPU without AVX512-BF16) a device asked for bf16
 * computes in fp32, bit for bit what a device never asked computes.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device.h"
#include "gemm_bf16.h"
#include "jobspec.h"
#include "model.h"
#include "ops/bf16.h"
#include "optim.h"
#include "plan.h"
#include "tokens.h"

static double gamma_n(int K) {
  double n = K + 2.0 * (K / 256 + 1) + 1, u32 = 1.0 / 16777216;
  return n * u32 / (1 - n * u32);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {   /* uniform in [-1, 1), varied exponents: some inputs ×2^±6 */
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  float x = (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1;
  int e = (int)(rng_state % 13) - 6;
  return ldexpf(x, e / 3);
}

static float trunc_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u &= 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}

/* element (i, k) of op(A) and (k, j) of op(B) */
#define OPA(i, k) (ta ? A[(size_t)(k) * lda + (i)] : A[(size_t)(i) * lda + (k)])
#define OPB(k, j) (tb ? B[(size_t)(j) * ldb + (k)] : B[(size_t)(k) * ldb + (j)])

typedef struct gemm_case {
  int ta, tb, M, N, K;
  float alpha, beta;
} gemm_case;

/* Counts the outputs of C outside the sharp contract bound (inputs rounded by ROUND) and outside
 * the documented bound against the fp32 inputs, and those outside fp32's own γ_n (bf16 visible). */
typedef struct gemm_verdict {
  int sharp_bad, bound_bad, fp32_like;
  double worst_sharp;   /* max |C − ref_bf16| / (γ_n·Σ|terms|) */
} gemm_verdict;

static gemm_verdict judge(const gemm_case *g, const float *A, int lda, const float *B, int ldb, const float *C0,
                          const float *C, float (*round)(float)) {
  gemm_verdict v = {0};
  int ta = g->ta, tb = g->tb;
  for (int i = 0; i < g->M; i++)
    for (int j = 0; j < g->N; j++) {
      double sb = 0, ab = 0, s32 = 0, a32 = 0;
      for (int k = 0; k < g->K; k++) {
        double x = OPA(i, k), y = OPB(k, j), xb = round(OPA(i, k)), yb = round(OPB(k, j));
        sb += xb * yb, ab += fabs(xb * yb), s32 += x * y, a32 += fabs(x * y);
      }
      double c0 = g->beta != 0 ? (double)g->beta * C0[(size_t)i * g->N + j] : 0, c = C[(size_t)i * g->N + j];
      double rb = g->alpha * sb + c0, r32 = g->alpha * s32 + c0;
      double absb = fabs(g->alpha) * ab + fabs(c0), abs32 = fabs(g->alpha) * a32 + fabs(c0);
      double sharp = gamma_n(g->K) * absb + 1e-30;
      if (!(fabs(c - rb) <= sharp)) v.sharp_bad++;
      if (fabs(c - rb) / sharp > v.worst_sharp) v.worst_sharp = fabs(c - rb) / sharp;
      if (!(fabs(c - r32) <= gemm_bf16_error_bound(g->K, fabs(g->alpha) * a32) + gamma_n(g->K) * fabs(c0))) v.bound_bad++;
      if (fabs(c - r32) <= gamma_n(g->K) * abs32) v.fp32_like++;
    }
  return v;
}

static void check_gemm_kind(gemm_kind kind) {
  static const int shapes[][3] = {{13, 37, 67}, {64, 96, 600}, {8, 32, 2}, {1, 1, 1}, {33, 17, 513}, {40, 70, 256}};
  gemm_bf16_set_active(kind);
  int cases = 0, planted_caught = 0, planted_total = 0;
  double worst = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int t = 0; t < 4; t++)
      for (int bi = 0; bi < 2; bi++) {
        gemm_case g = {t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], 0.75f, bi ? 0.5f : 0.0f};
        int lda = (g.ta ? g.M : g.K) + 3, ldb = (g.tb ? g.K : g.N) + 5;   /* leading dimensions wider than the rows */
        size_t na = (size_t)(g.ta ? g.K : g.M) * lda, nb = (size_t)(g.tb ? g.N : g.K) * ldb, nc = (size_t)g.M * g.N;
        float *A = malloc(na * 4), *B = malloc(nb * 4), *C0 = malloc(nc * 4), *C = malloc(nc * 4);
        for (size_t i = 0; i < na; i++) A[i] = frand();
        for (size_t i = 0; i < nb; i++) B[i] = frand();
        for (size_t i = 0; i < nc; i++) C0[i] = frand();
        for (size_t i = 0; i < nc; i++) C[i] = g.beta != 0 ? C0[i] : NAN;   /* beta = 0 must not read C */
        gemm_bf16(g.ta, g.tb, g.M, g.N, g.K, g.alpha, A, lda, B, ldb, g.beta, C, g.N);
        gemm_verdict v = judge(&g, A, lda, B, ldb, C0, C, bf16_round);
        if (v.sharp_bad || v.bound_bad)
          fprintf(stderr, "  %s %c%c M=%d N=%d K=%d beta=%g: %d outside the contract (worst %.2f of it), %d outside the bound\n",
                  gemm_kind_name(kind), g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.M, g.N, g.K, g.beta, v.sharp_bad,
                  v.worst_sharp, v.bound_bad);
        CHECK_EQ_INT(0, v.sharp_bad);
        CHECK_EQ_INT(0, v.bound_bad);
        if (g.K >= 64) CHECK(v.fp32_like < g.M * g.N);   /* some output shows the bf16 rounding */
        if (v.worst_sharp > worst) worst = v.worst_sharp;
        if (g.K >= 64) {   /* planted: the same result judged as if the inputs were truncated */
          planted_total++;
          planted_caught += judge(&g, A, lda, B, ldb, C0, C, trunc_bf16).sharp_bad > 0;
        }
        cases++;
        free(A), free(B), free(C0), free(C);
      }
  CHECK_EQ_INT(planted_total, planted_caught);
  printf("%s: %d cases within the contract (worst output at %.2f of γ_n·Σ|terms|) and the bound; "
         "truncated inputs caught in %d/%d\n",
         gemm_kind_name(kind), cases, worst, planted_caught, planted_total);
  gemm_bf16_set_active(GEMM_FP32);
}

static void test_gemm(void) {
  unsetenv("FSDP_CPU_BF16");
  printf("this CPU: %s by default; AVX512-BF16 %s\n", gemm_kind_name(gemm_bf16_kind()),
         gemm_bf16_cpu_has() ? "present" : "absent");
  check_gemm_kind(GEMM_BF16_EMULATED);
  if (gemm_bf16_cpu_has()) check_gemm_kind(GEMM_BF16);   /* the kernel, whether auto picks it or not */
  else printf("SKIP the AVX512-BF16 kernel: this CPU has no AVX512-BF16\n");
}

/* ---- the choice ---- */

/* gemm_bf16_choose's table, with planted rates on both sides of the threshold, and the probe's
 * answer on this CPU driving gemm_bf16_kind. */
static void test_choice(void) {
  const gemm_bf16_rates slow = {40e9, 82e9}, fast = {160e9, 80e9}, even = {80e9, 80e9}, none = {0, 0},
                        below = {55e9, 82e9}, above = {60e9, 82e9};   /* 0.67 and 0.73 of FMA */
  static const struct {
    const char *env;
    int has;
    int rate;   /* 0 slow, 1 fast, 2 even, 3 none, 4 below, 5 above the threshold */
    gemm_kind want;
  } rows[] = {
      {"auto", 1, 0, GEMM_FP32},   {"auto", 1, 1, GEMM_BF16},   {"auto", 1, 2, GEMM_BF16},
      {"auto", 1, 3, GEMM_FP32},   {"auto", 1, 4, GEMM_FP32},   {"auto", 1, 5, GEMM_BF16},
      {"auto", 0, 1, GEMM_FP32},   {"on", 1, 0, GEMM_BF16},
      {"on", 0, 1, GEMM_FP32},     {"off", 1, 1, GEMM_FP32},    {"emulate", 0, 0, GEMM_BF16_EMULATED},
      {"emulate", 1, 1, GEMM_BF16_EMULATED},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const gemm_bf16_rates all[] = {slow, fast, even, none, below, above};
    gemm_bf16_rates r = all[rows[i].rate];
    gemm_kind got = gemm_bf16_choose(rows[i].env, rows[i].has, r);
    if (got != rows[i].want)
      fprintf(stderr, "  FSDP_CPU_BF16=%s has=%d rates %.0f/%.0f: %s, want %s\n", rows[i].env, rows[i].has, r.bf16 / 1e9,
              r.fp32 / 1e9, gemm_kind_name(got), gemm_kind_name(rows[i].want));
    CHECK_EQ_INT(rows[i].want, got);
  }
  CHECK(gemm_bf16_env_valid("auto") && gemm_bf16_env_valid("on") && gemm_bf16_env_valid("off") &&
        gemm_bf16_env_valid("emulate"));
  CHECK(!gemm_bf16_env_valid("yes") && !gemm_bf16_env_valid("") && !gemm_bf16_env_valid("AUTO"));
  gemm_bf16_rates cpu = gemm_bf16_rates_of_cpu();
  unsetenv("FSDP_CPU_BF16");
  CHECK_EQ_INT(gemm_bf16_choose("auto", gemm_bf16_cpu_has(), cpu), gemm_bf16_kind());
  if (gemm_bf16_cpu_has()) {
    CHECK(cpu.bf16 > 0 && cpu.fp32 > 0);
    setenv("FSDP_CPU_BF16", "on", 1);
    CHECK_EQ_INT(GEMM_BF16, gemm_bf16_kind());
    unsetenv("FSDP_CPU_BF16");
    printf("choice: this CPU's vdpbf16ps %.1f G multiply-adds/s, fp32 FMA %.1f (%.2fx): auto runs %s\n", cpu.bf16 / 1e9,
           cpu.fp32 / 1e9, cpu.bf16 / cpu.fp32, gemm_kind_name(gemm_bf16_kind()));
  } else {
    CHECK(cpu.bf16 == 0 && cpu.fp32 == 0);
    printf("choice: no AVX512-BF16, auto runs %s\n", gemm_kind_name(gemm_bf16_kind()));
  }
}

/* ---- the model ---- */

#define LSTEPS 3
static const char *JOB =
    "[job]\nname = gemm_bf16\nsteps = 3\nseed = 5\n"
    "[model]\nn_layer = 2\nn_head = 2\nn_embd = 64\nvocab_size = 128\nseq_len = 32\n"
    "[data]\ntrain = synthetic:markov:3\nbatch_size = 4\n"
    "[optim]\nlr = 1e-3\nwarmup_steps = 1\n"
    "[fsdp]\nworld_size = 1\nparam_dtype = bf16\n";

/* LSTEPS steps on one CPU device whose GEMMs run as FSDP_CPU_BF16 = ENV says (NULL: unset), the
 * parameters rounded to bf16 before each forward as param_dtype = bf16 gathers them. Returns the
 * dtype the device computed in; losses in LOSS. */
static dtype_kind train(const char *env, int ask_bf16, double loss[LSTEPS]) {
  if (env) setenv("FSDP_CPU_BF16", env, 1);
  else unsetenv("FSDP_CPU_BF16");
  jobspec_t s;
  plan_t *p = NULL;
  device_t *dev = NULL;
  if (jobspec_parse(JOB, "gemm_bf16.ini", "/tmp", &s) != FSDP_OK || plan_build(&s, 1, &p) != FSDP_OK ||
      dev_new_cpu(DEV_CPU_SYNC, &dev) != FSDP_OK) {
    fprintf(stderr, "setup: %s\n", fsdp_last_error());
    exit(2);
  }
  dtype_kind got = ask_bf16 ? dev_cpu_set_compute(dev, DTYPE_BF16) : DTYPE_FP32;
  const int B = s.batch_size, T = p->model.seq_len, BT = B * T;
  int64_t S = p->shard_total;
  float *w = calloc((size_t)S, 4), *wb = calloc((size_t)S, 4), *g = calloc((size_t)S, 4);
  float *m = calloc((size_t)S, 4), *v = calloc((size_t)S, 4);
  void **units = calloc((size_t)p->nunits, sizeof(void *));
  float **dunits = calloc((size_t)p->nunits, sizeof(float *));
  int *inp = calloc((size_t)BT, sizeof(int)), *tgt = calloc((size_t)BT, sizeof(int));
  model_acts *a = model_acts_new(p, dev);
  tok_file *tf = NULL;
  if (!a || tok_open_markov(s.markov_seed, p->model.vocab_size, 1 << 16, &tf) != FSDP_OK) exit(2);
  model_init_shard(p, s.seed, 0, w);
  for (int u = 0; u < p->nunits; u++) {
    units[u] = wb + p->units[u].shard_base;
    dunits[u] = g + p->units[u].shard_base;
  }
  optim_config oc = optim_config_of(&s);
  for (int step = 1; step <= LSTEPS; step++) {
    for (int64_t i = 0; i < S; i++) wb[i] = bf16_round(w[i]);
    memset(g, 0, (size_t)S * 4);
    if (tok_batch(tf, step - 1, 0, 1, B, T, p->model.vocab_size, inp, tgt) != FSDP_OK) exit(2);
    float l = 0;
    model_forward_backward(p, a, units, dunits, inp, tgt, 1.0f / (float)BT, &l);
    loss[step - 1] = l / (float)BT;
    optim_adamw_shard(p, 0, w, g, m, v, step, optim_lr(&s, step), &oc, 1.0f);
  }
  model_acts_destroy(&a);
  tok_destroy(&tf);
  dev_destroy(&dev);
  plan_destroy(&p);
  free(w), free(wb), free(g), free(m), free(v), free(units), free(dunits), free(inp), free(tgt);
  return got;
}

/* The documented tolerance of the loss against the fp32 path, relative: Σ over the GEMMs that the
 * forward runs one after another, of 2u + γ_K (u = 2^-8: both inputs rounded; K the GEMM's inner
 * dimension). Per GPT-2 block: c_attn (K = C), q·kᵀ (K = C/NH), probabilities·v (K = T), c_proj
 * (K = C), c_fc (K = C), the MLP's c_proj (K = 4C); then the head (K = C). */
static double loss_rtol(int L, int C, int NH, int T) {
  const double u = 1.0 / 256;
  int ks[] = {C, C / NH, T, C, C, 4 * C};
  double r = 2 * u + gamma_n(C);
  for (int l = 0; l < L; l++)
    for (int i = 0; i < 6; i++) r += 2 * u + gamma_n(ks[i]);
  return r;
}

static int within(const double *ref, const double *got, double rtol) {
  int ok = 1;
  for (int i = 0; i < LSTEPS; i++) ok &= fabs(got[i] - ref[i]) <= rtol * fabs(ref[i]);
  return ok;
}

static void test_loss(void) {
  double l32[LSTEPS], lem[LSTEPS], lk[LSTEPS], planted[LSTEPS];
  const double tol = loss_rtol(2, 64, 2, 32);
  CHECK_EQ_INT(DTYPE_FP32, train(NULL, 0, l32));
  CHECK_EQ_INT(DTYPE_BF16, train("emulate", 1, lem));
  double dem = 0;
  for (int i = 0; i < LSTEPS; i++) dem = fmax(dem, fabs(lem[i] - l32[i]) / l32[i]);
  CHECK(within(l32, lem, tol));
  CHECK(dem > 0);   /* bf16 compute is not a no-op */
  /* planted: a loss one tolerance and a half away from the fp32 path's fails the check */
  memcpy(planted, lem, sizeof planted);
  planted[LSTEPS - 1] = l32[LSTEPS - 1] * (1 + 1.5 * tol);
  CHECK(!within(l32, planted, tol));
  printf("loss: fp32 %.6f %.6f %.6f; emulated bf16 %.6f %.6f %.6f: %.2e relative (tolerance %.3f)\n", l32[0], l32[1],
         l32[2], lem[0], lem[1], lem[2], dem, tol);
  unsetenv("FSDP_CPU_BF16");
  if (!gemm_bf16_cpu_has()) {
    printf("SKIP the AVX512-BF16 kernel's losses: this CPU has no AVX512-BF16\n");
    return;
  }
  CHECK_EQ_INT(DTYPE_BF16, train("on", 1, lk));
  double dk = 0, dke = 0;
  for (int i = 0; i < LSTEPS; i++) {
    dk = fmax(dk, fabs(lk[i] - l32[i]) / l32[i]);
    dke = fmax(dke, fabs(lk[i] - lem[i]) / lem[i]);
  }
  CHECK(within(l32, lk, tol));
  CHECK(dk > 0);
  printf("loss: kernel %.6f %.6f %.6f: %.2e relative to fp32, %.2e to the emulation\n", lk[0], lk[1], lk[2], dk, dke);
}

/* ---- the fallback ---- */

static void test_fallback(void) {
  setenv("FSDP_CPU_BF16", "off", 1);
  CHECK_EQ_INT(GEMM_FP32, gemm_bf16_kind());
  device_t *plain = NULL, *asked = NULL;
  CHECK_OK(dev_new_cpu(DEV_CPU_SYNC, &plain));
  CHECK_OK(dev_new_cpu(DEV_CPU_SYNC, &asked));
  if (!plain || !asked) return;
  CHECK_EQ_INT(DTYPE_FP32, dev_cpu_set_compute(asked, DTYPE_BF16));
  const int BT = 48, C = 96, OC = 80;
  float *inp = malloc(BT * C * 4), *w = malloc(C * OC * 4), *bias = malloc(OC * 4);
  float *o1 = malloc(BT * OC * 4), *o2 = malloc(BT * OC * 4);
  for (int i = 0; i < BT * C; i++) inp[i] = frand();
  for (int i = 0; i < C * OC; i++) w[i] = bf16_round(frand());
  for (int i = 0; i < OC; i++) bias[i] = frand();
  plain->kern->matmul_forward(plain, o1, inp, w, bias, BT, C, OC);
  asked->kern->matmul_forward(asked, o2, inp, w, bias, BT, C, OC);
  CHECK(memcmp(o1, o2, (size_t)BT * OC * 4) == 0);
  /* and without the override, on this CPU, bf16 is what the CPU has */
  unsetenv("FSDP_CPU_BF16");
  device_t *native = NULL;
  CHECK_OK(dev_new_cpu(DEV_CPU_SYNC, &native));
  if (native) {
    dtype_kind dt = dev_cpu_set_compute(native, DTYPE_BF16);
    CHECK_EQ_INT(gemm_bf16_kind() == GEMM_BF16 ? DTYPE_BF16 : DTYPE_FP32, dt);
    native->kern->matmul_forward(native, o2, inp, w, bias, BT, C, OC);
    if (dt == DTYPE_BF16) CHECK(memcmp(o1, o2, (size_t)BT * OC * 4) != 0);   /* the inputs rounded */
    else CHECK(memcmp(o1, o2, (size_t)BT * OC * 4) == 0);   /* auto chose fp32: the fp32 path, bit for bit */
    dev_destroy(&native);
  }
  printf("fallback: FSDP_CPU_BF16=off computes fp32, bit-identical to a plain device\n");
  free(inp), free(w), free(bias), free(o1), free(o2);
  dev_destroy(&plain);
  dev_destroy(&asked);
}

int main(int argc, char **argv) {
  const char *part = argc > 1 ? argv[1] : "all";
  int all = strcmp(part, "all") == 0;
  if (all || strcmp(part, "gemm") == 0) test_gemm();
  if (all || strcmp(part, "choice") == 0) test_choice();
  if (all || strcmp(part, "loss") == 0) test_loss();
  if (all || strcmp(part, "fallback") == 0) test_fallback();
  return check_done();
}
