/* gpu_check — the device-only checks of the CUDA backend, run by hand on a machine with an NVIDIA
 * GPU (tests/gpu/run.sh, docs/gpu.md); never by ctest, since CI has no GPU.
 *
 *   1. every operator of worker/ops_cuda.h against its CPU twin (worker/ops_cpu.h, the
 *      specification) on random inputs from a fixed seed, at a tiny shape and at a GPT-2-small-like
 *      one, comparing every output; the CUDA op's time (cudaEvent) is printed at the large shape;
 *   2. the NCCL comm with one rank (comm_nccl_get_unique_id + comm_new_nccl) and the staged gloo
 *      comm with world 1: all-gather, reduce-scatter, all-reduce on device buffers, fp32 and bf16;
 *   3. two processes: the staged gloo comm with both ranks on device 0, and, with two or more
 *      GPUs, NCCL with one GPU per rank (values, byte counters, bandwidth).
 *
 * Exit status: 0 when every check passed, 1 when one failed, 2 when there is no usable CUDA device
 * (no GPU, no driver), with a message saying so. One line per check: PASS or FAIL.
 */
#define _GNU_SOURCE
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <ftw.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "err.h"
#include "mem.h"
#include "ops_cpu.h"
#include "ops_cuda.h"

/* ---- tolerances ----
 * Both sides compute in fp32 from the same inputs and the same scalar formulas (the headers in
 * worker/ops/); they differ only in the ORDER of floating-point sums (OpenBLAS' blocking vs
 * cuBLAS' tiling, SIMD lanes vs warp shuffles) and in FMA contraction, never in the math. A sum
 * of K terms with random signs (or of positive terms) in fp32 has a rounding error that grows
 * like u·sqrt(K) relative to the size of its result (u = 2^-24, the unit roundoff), whatever the
 * order; the maximum over ~10^6 outputs stays within ~5 standard deviations of that. So each
 * output tensor with reduction length K is accepted element-wise when
 *
 *     |cuda − cpu| <= atol + rtol·|cpu|,   rtol = 32·u·sqrt(K),   atol = rtol·rms(cpu)
 *
 * 32 is a margin of ~8× over the expected worst case of the two errors combined. atol is scaled by
 * the tensor's RMS because an output near zero (a sum that cancels) keeps the absolute error of
 * its terms, not a relative one. K per output is given at each check: the reduction length (C for
 * a LayerNorm row, the inner dimension of a GEMM, B·T for a parameter gradient), T + head size for
 * attention's chained dot product → softmax → weighted sum, 4× that for its backward (two more
 * chained reductions), 1 for element-wise ops (a few ulps from FMA contraction in ops_expf's
 * polynomial: 32·u ≈ 1.9e-6 covers 16 ulps) except GELU's derivative, 64: it computes 1 − σ
 * next to σ ≈ 1 and multiplies that by 2·x·du/dx (≈ 35 at x = 5), so one rounding of σ becomes
 * ~35 u of the result; and 4 for the fused softmax/cross-entropy (its sums are in double).
 * Calibration: an emulation of the CUDA kernels' summation orders on the CPU (sequential fp32
 * sums, warp-strided partials, no FMA) stayed below 1/15 of these tolerances on every output at
 * both shapes (GELU's derivative at K = 1 reached 0.95 of it, hence its 64). A real bug (a
 * missing term, a wrong mask, a row off by one, an assignment instead of +=) moves outputs by
 * ~1/sqrt(K) of their RMS or more: far beyond these tolerances.
 *
 * TF32: the cuBLAS handle is set to CUBLAS_PEDANTIC_MATH, so every cublasSgemm is true fp32 (TF32
 * tensor cores round inputs to 10 mantissa bits, errors ~1e-3, which these tolerances would — and
 * should — reject). One extra check repeats a GEMM under CUBLAS_DEFAULT_MATH, the mode a
 * production handle gets: cublasSgemm stays fp32 there too (TF32 needs CUBLAS_TF32_TENSOR_OP_MATH
 * or a TF32 compute type), so it must pass as well. Non-finite values never pass: assigned
 * outputs are pre-filled with NaN on both sides, so an element a kernel forgets to write fails. */
#define TOL_C 32.0
#define UNIT_ROUNDOFF (FLT_EPSILON / 2)

static int g_pass, g_fail;
static cudaStream_t g_stream;
static cublasHandle_t g_blas;
static cudaEvent_t g_ev0, g_ev1;

/* ---- fatal errors of the harness itself (not of the code under test) ---- */

static void cu_fatal(cudaError_t e, const char *call, int line) {
  fprintf(stderr, "gpu_check: FATAL %s:%d: %s: %s (%s)\n", __FILE__, line, call, cudaGetErrorString(e),
          cudaGetErrorName(e));
  fflush(stdout);
  exit(1);
}
#define CU(call)                                     \
  do {                                               \
    cudaError_t e_ = (call);                         \
    if (e_ != cudaSuccess) cu_fatal(e_, #call, __LINE__); \
  } while (0)

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "gpu_check: FATAL: out of host memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

/* Buffers of the current check, freed by free_all() when it ends. */
#define MAX_BUFS 64
static void *g_hbufs[MAX_BUFS], *g_dbufs[MAX_BUFS];
static int g_nh, g_nd;

static void *hbuf(size_t bytes) {
  if (g_nh == MAX_BUFS) {
    fprintf(stderr, "gpu_check: FATAL: more than %d host buffers in one check\n", MAX_BUFS);
    exit(1);
  }
  return g_hbufs[g_nh++] = xmalloc(bytes);
}

static void *dbuf(size_t bytes) {
  if (g_nd == MAX_BUFS) {
    fprintf(stderr, "gpu_check: FATAL: more than %d device buffers in one check\n", MAX_BUFS);
    exit(1);
  }
  void *d = NULL;
  CU(cudaMalloc(&d, bytes ? bytes : 1));
  return g_dbufs[g_nd++] = d;
}

static void free_all(void) {
  for (int i = 0; i < g_nh; i++) free(g_hbufs[i]);
  for (int i = 0; i < g_nd; i++) CU(cudaFree(g_dbufs[i]));
  g_nh = g_nd = 0;
}

/* ---- fixed-seed random numbers (splitmix64) ---- */

static uint64_t g_rng = 0x6770755f63686bULL;

static uint64_t rng_next(void) {
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static float rng_uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)((double)(rng_next() >> 40) * (1.0 / 16777216.0));
}

static float *h_uniform(size_t n, float lo, float hi) {
  float *p = hbuf(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = rng_uniform(lo, hi);
  return p;
}

/* All bits set: a quiet NaN in every float. */
static float *h_nan(size_t n) {
  float *p = hbuf(n * sizeof(float));
  memset(p, 0xFF, n * sizeof(float));
  return p;
}

static void *d_upload(const void *h, size_t bytes) {
  void *d = dbuf(bytes);
  if (bytes) CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

static float *d_nan(size_t n) {
  float *d = dbuf(n * sizeof(float));
  CU(cudaMemset(d, 0xFF, n * sizeof(float)));
  return d;
}

/* ---- comparing and reporting ---- */

typedef struct shape {
  const char *name;
  int B, T, C, NH, V;
  int timed;   /* time the CUDA op (the large shape) */
} shape;

static const shape kTiny = {"tiny", 2, 8, 16, 2, 37, 0};
static const shape kGpt2 = {"gpt2", 4, 256, 768, 12, 50257, 1};

typedef struct out_t {
  const char *name;
  const float *ref;   /* host: the CPU twin's result */
  const void *dev;    /* device: the CUDA op's result (float, or double when dbl) */
  size_t n;
  double k;           /* reduction length behind each element (tolerance, see the top) */
  int dbl;
  float *got;         /* host copy of dev, filled after the first run */
} out_t;

static void fetch(out_t *o, int n) {
  for (int i = 0; i < n; i++) {
    o[i].got = hbuf(o[i].n * sizeof(float));
    if (o[i].dbl) {
      double *tmp = hbuf(o[i].n * sizeof(double));
      CU(cudaMemcpy(tmp, o[i].dev, o[i].n * sizeof(double), cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < o[i].n; j++) o[i].got[j] = (float)tmp[j];
    } else {
      CU(cudaMemcpy(o[i].got, o[i].dev, o[i].n * sizeof(float), cudaMemcpyDeviceToHost));
    }
  }
}

static void compare(const char *op, const shape *s, const out_t *o, double ms) {
  double ss = 0;
  for (size_t i = 0; i < o->n; i++)
    if (isfinite(o->ref[i])) ss += (double)o->ref[i] * o->ref[i];
  double rms = o->n ? sqrt(ss / (double)o->n) : 0;
  double rtol = TOL_C * UNIT_ROUNDOFF * sqrt(o->k < 1 ? 1 : o->k);
  double atol = rtol * (rms > FLT_MIN ? rms : FLT_MIN);
  double max_abs = 0, max_rel = 0;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < o->n; i++) {
    double r = o->ref[i], g = o->got[i];
    int ok;
    if (!isfinite(r) || !isfinite(g)) {
      ok = 0;   /* never acceptable: an unwritten element, an overflow, or a broken reference */
      max_abs = INFINITY;
    } else {
      double d = fabs(g - r);
      if (d > max_abs) max_abs = d;
      if (fabs(r) > atol && d / fabs(r) > max_rel) max_rel = d / fabs(r);   /* where relative makes sense */
      ok = d <= atol + rtol * fabs(r);
    }
    if (!ok && bad++ == 0) first = i;
  }
  char name[96];
  snprintf(name, sizeof name, "%s[%s] %s", op, s->name, o->name);
  char tbuf[32] = "";
  if (ms >= 0) snprintf(tbuf, sizeof tbuf, "  cuda %8.3f ms", ms);
  printf("%-50s n=%-9zu max_abs %.2e max_rel %.2e (atol %.1e rtol %.1e)%s  %s\n", name, o->n, max_abs, max_rel,
         atol, rtol, tbuf, bad ? "FAIL" : "PASS");
  if (bad) {
    printf("    %zu of %zu elements outside the tolerance; first at [%zu]: cpu %.9g cuda %.9g\n", bad, o->n, first,
           (double)o->ref[first], (double)o->got[first]);
    g_fail++;
  } else {
    g_pass++;
  }
}

static void report_failure(const char *op, const shape *s, fsdp_status st, cudaError_t se) {
  printf("%s[%s]: FAIL: ", op, s->name);
  if (st != FSDP_OK) printf("the op returned %s: %s\n", fsdp_strerror(st), fsdp_last_error());
  else printf("the op faulted on the device: %s (%s)\n", cudaGetErrorString(se), cudaGetErrorName(se));
  g_fail++;
  if (se != cudaSuccess) {
    /* A fault while a kernel ran leaves the CUDA context unusable: nothing after it means anything. */
    printf("gpu_check: the CUDA context is unusable after a device fault; stopping. %d passed, %d failed\n", g_pass,
           g_fail);
    fflush(stdout);
    exit(1);
  }
}

/* Runs CALL (an fsdp_status expression that enqueues CUDA work on g_stream) once and fetches the
 * outputs; on the timed shape runs it once more between two events (parameter gradients then hold
 * a second accumulation, in-place buffers their second transformation; the results were fetched
 * already). Then compares every output. */
#define RUN_AND_COMPARE(op, s, outs, CALL)                                                   \
  do {                                                                                       \
    int n_ = (int)(sizeof(outs) / sizeof((outs)[0]));                                        \
    fsdp_clear_error();                                                                      \
    fsdp_status st_ = (CALL);                                                                \
    cudaError_t se_ = cudaStreamSynchronize(g_stream);                                       \
    if (st_ != FSDP_OK || se_ != cudaSuccess) {                                              \
      report_failure((op), (s), st_, se_);                                                   \
      break;                                                                                 \
    }                                                                                        \
    fetch((outs), n_);                                                                       \
    float ms_ = -1.0f;                                                                       \
    if ((s)->timed) {                                                                        \
      CU(cudaEventRecord(g_ev0, g_stream));                                                  \
      st_ = (CALL);                                                                          \
      CU(cudaEventRecord(g_ev1, g_stream));                                                  \
      se_ = cudaEventSynchronize(g_ev1);                                                     \
      if (st_ != FSDP_OK || se_ != cudaSuccess) {                                            \
        report_failure((op), (s), st_, se_);                                                 \
        break;                                                                               \
      }                                                                                      \
      CU(cudaEventElapsedTime(&ms_, g_ev0, g_ev1));                                          \
    }                                                                                        \
    for (int i_ = 0; i_ < n_; i_++) compare((op), (s), &(outs)[i_], i_ == 0 ? ms_ : -1.0);   \
  } while (0)

/* ---- the operators ---- */

static void check_encoder(const shape *s) {
  int B = s->B, T = s->T, C = s->C, V = s->V, BT = B * T;
  size_t BTC = (size_t)BT * C, VC = (size_t)V * C, TC = (size_t)T * C;
  int *inp = hbuf((size_t)BT * sizeof(int));
  for (int i = 0; i < BT; i++) inp[i] = (int)(rng_next() % (uint64_t)V);
  for (int i = 3; i < BT; i += 5) inp[i] = inp[0];   /* repeated tokens: their dwte rows accumulate */
  float *wte = h_uniform(VC, -1, 1), *wpe = h_uniform(TC, -1, 1);
  int *d_inp = d_upload(inp, (size_t)BT * sizeof(int));
  float *d_wte = d_upload(wte, VC * sizeof(float)), *d_wpe = d_upload(wpe, TC * sizeof(float));

  float *out = h_nan(BTC), *d_out = d_nan(BTC);
  encoder_forward(out, inp, wte, wpe, B, T, C);
  CU(cudaDeviceSynchronize());
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = BTC, .k = 1}};
  RUN_AND_COMPARE("encoder_forward", s, fo, ops_cuda_encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C, g_stream));

  float *dout = h_uniform(BTC, -1, 1);
  float *dwte = h_uniform(VC, -1, 1), *dwpe = h_uniform(TC, -1, 1);   /* accumulated into: nonzero */
  float *d_dout = d_upload(dout, BTC * sizeof(float));
  float *d_dwte = d_upload(dwte, VC * sizeof(float)), *d_dwpe = d_upload(dwpe, TC * sizeof(float));
  encoder_backward(dwte, dwpe, dout, inp, B, T, C);
  CU(cudaDeviceSynchronize());
  out_t bo[] = {{.name = "dwte", .ref = dwte, .dev = d_dwte, .n = VC, .k = BT},
                {.name = "dwpe", .ref = dwpe, .dev = d_dwpe, .n = TC, .k = B}};
  RUN_AND_COMPARE("encoder_backward", s, bo,
                  ops_cuda_encoder_backward(d_dwte, d_dwpe, d_dout, d_inp, B, T, C, g_stream));
  free_all();
}

static void check_layernorm(const shape *s) {
  int B = s->B, T = s->T, C = s->C, BT = B * T;
  size_t n = (size_t)BT * C;
  float *inp = h_uniform(n, -1, 1);
  for (size_t i = 0; i < n; i++) inp[i] += 1.5f;   /* a mean away from 0: exercises the two-pass variance */
  float *w = h_uniform((size_t)C, 0.5f, 1.5f), *b = h_uniform((size_t)C, -0.5f, 0.5f);
  float *d_inp = d_upload(inp, n * sizeof(float));
  float *d_w = d_upload(w, (size_t)C * sizeof(float)), *d_b = d_upload(b, (size_t)C * sizeof(float));

  float *out = h_nan(n), *mean = h_nan((size_t)BT), *rstd = h_nan((size_t)BT);
  float *d_out = d_nan(n), *d_mean = d_nan((size_t)BT), *d_rstd = d_nan((size_t)BT);
  layernorm_forward(out, mean, rstd, inp, w, b, B, T, C);
  CU(cudaDeviceSynchronize());
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = n, .k = C},
                {.name = "mean", .ref = mean, .dev = d_mean, .n = (size_t)BT, .k = C},
                {.name = "rstd", .ref = rstd, .dev = d_rstd, .n = (size_t)BT, .k = C}};
  RUN_AND_COMPARE("layernorm_forward", s, fo,
                  ops_cuda_layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, B, T, C, g_stream));

  /* Backward from the CPU's mean and rstd on both sides, so that it is tested on its own. */
  float *dout = h_uniform(n, -1, 1);
  float *dinp = h_nan(n), *dw = h_uniform((size_t)C, -1, 1), *db = h_uniform((size_t)C, -1, 1);
  float *d_dout = d_upload(dout, n * sizeof(float));
  float *d_mean_ref = d_upload(mean, (size_t)BT * sizeof(float));
  float *d_rstd_ref = d_upload(rstd, (size_t)BT * sizeof(float));
  float *d_dinp = d_nan(n);
  float *d_dw = d_upload(dw, (size_t)C * sizeof(float)), *d_db = d_upload(db, (size_t)C * sizeof(float));
  layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, B, T, C);
  CU(cudaDeviceSynchronize());
  out_t bo[] = {{.name = "dinp", .ref = dinp, .dev = d_dinp, .n = n, .k = C},
                {.name = "dweight", .ref = dw, .dev = d_dw, .n = (size_t)C, .k = BT},
                {.name = "dbias", .ref = db, .dev = d_db, .n = (size_t)C, .k = BT}};
  RUN_AND_COMPARE("layernorm_backward", s, bo,
                  ops_cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean_ref, d_rstd_ref, B, T, C,
                                              g_stream));
  free_all();
}

/* Conv1D C → OC over B·T rows. full = 0: no bias, and backward without dinp and dbias (NULL). */
static void check_matmul(const shape *s, const char *fwd_name, const char *bwd_name, int C, int OC, int full) {
  int BT = s->B * s->T;
  size_t nin = (size_t)BT * C, nout = (size_t)BT * OC, nw = (size_t)C * OC;
  float *inp = h_uniform(nin, -1, 1), *w = h_uniform(nw, -1, 1), *bias = full ? h_uniform((size_t)OC, -1, 1) : NULL;
  float *d_inp = d_upload(inp, nin * sizeof(float)), *d_w = d_upload(w, nw * sizeof(float));
  float *d_bias = full ? d_upload(bias, (size_t)OC * sizeof(float)) : NULL;

  float *out = h_nan(nout), *d_out = d_nan(nout);
  matmul_forward(out, inp, w, bias, BT, C, OC);
  CU(cudaDeviceSynchronize());
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = nout, .k = C + 1}};
  RUN_AND_COMPARE(fwd_name, s, fo, ops_cuda_matmul_forward(d_out, d_inp, d_w, d_bias, BT, C, OC, g_blas, g_stream));

  float *dout = h_uniform(nout, -1, 1), *d_dout = d_upload(dout, nout * sizeof(float));
  float *dw = h_uniform(nw, -1, 1), *d_dw = d_upload(dw, nw * sizeof(float));
  if (full) {
    float *dinp = h_nan(nin), *d_dinp = d_nan(nin);
    float *db = h_uniform((size_t)OC, -1, 1), *d_db = d_upload(db, (size_t)OC * sizeof(float));
    matmul_backward(dinp, dw, db, dout, inp, w, BT, C, OC);
    CU(cudaDeviceSynchronize());
    out_t bo[] = {{.name = "dinp", .ref = dinp, .dev = d_dinp, .n = nin, .k = OC},
                  {.name = "dweight", .ref = dw, .dev = d_dw, .n = nw, .k = BT},
                  {.name = "dbias", .ref = db, .dev = d_db, .n = (size_t)OC, .k = BT}};
    RUN_AND_COMPARE(bwd_name, s, bo,
                    ops_cuda_matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, BT, C, OC, g_blas, g_stream));
  } else {
    matmul_backward(NULL, dw, NULL, dout, inp, w, BT, C, OC);
    CU(cudaDeviceSynchronize());
    out_t bo[] = {{.name = "dweight", .ref = dw, .dev = d_dw, .n = nw, .k = BT}};
    RUN_AND_COMPARE(bwd_name, s, bo,
                    ops_cuda_matmul_backward(NULL, d_dw, NULL, d_dout, d_inp, d_w, BT, C, OC, g_blas, g_stream));
  }
  free_all();
}

static void check_attention(const shape *s) {
  int B = s->B, T = s->T, C = s->C, NH = s->NH, hs = C / NH;
  size_t nqkv = (size_t)B * T * 3 * C, natt = (size_t)B * NH * T * T, nout = (size_t)B * T * C;
  float *qkv = h_uniform(nqkv, -1.5f, 1.5f), *d_qkv = d_upload(qkv, nqkv * sizeof(float));

  float *out = h_nan(nout), *att = h_nan(natt), *d_out = d_nan(nout), *d_att = d_nan(natt);
  attention_forward(out, att, qkv, B, T, C, NH);
  CU(cudaDeviceSynchronize());
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = nout, .k = T + hs},
                {.name = "att", .ref = att, .dev = d_att, .n = natt, .k = T + hs}};
  RUN_AND_COMPARE("attention_forward", s, fo, ops_cuda_attention_forward(d_out, d_att, d_qkv, B, T, C, NH, g_stream));

  /* Backward from the CPU's att on both sides. datt is scratch (not compared); NaN on both sides
   * so that reading it before writing would show in dqkv. */
  float *dout = h_uniform(nout, -1, 1), *d_dout = d_upload(dout, nout * sizeof(float));
  float *d_att_ref = d_upload(att, natt * sizeof(float));
  float *dqkv = h_nan(nqkv), *datt = h_nan(natt), *d_dqkv = d_nan(nqkv), *d_datt = d_nan(natt);
  attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
  CU(cudaDeviceSynchronize());
  out_t bo[] = {{.name = "dqkv", .ref = dqkv, .dev = d_dqkv, .n = nqkv, .k = 4.0 * (T + hs)}};
  RUN_AND_COMPARE("attention_backward", s, bo,
                  ops_cuda_attention_backward(d_dqkv, d_datt, d_dout, d_qkv, d_att_ref, B, T, C, NH, g_stream));
  free_all();
}

static void check_elementwise(const shape *s) {
  int N = s->B * s->T * 4 * s->C;   /* the MLP's hidden activations */
  float *x = h_uniform((size_t)N, -5, 5), *d_x = d_upload(x, (size_t)N * sizeof(float));
  float *out = h_nan((size_t)N), *d_out = d_nan((size_t)N);
  gelu_forward(out, x, N);
  CU(cudaDeviceSynchronize());
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = (size_t)N, .k = 1}};
  RUN_AND_COMPARE("gelu_forward", s, fo, ops_cuda_gelu_forward(d_out, d_x, N, g_stream));

  float *dout = h_uniform((size_t)N, -1, 1), *d_dout = d_upload(dout, (size_t)N * sizeof(float));
  float *dinp = h_nan((size_t)N), *d_dinp = d_nan((size_t)N);
  gelu_backward(dinp, x, dout, N);
  CU(cudaDeviceSynchronize());
  out_t bo[] = {{.name = "dinp", .ref = dinp, .dev = d_dinp, .n = (size_t)N, .k = 64}};   /* see the top */
  RUN_AND_COMPARE("gelu_backward", s, bo, ops_cuda_gelu_backward(d_dinp, d_x, d_dout, N, g_stream));

  int R = s->B * s->T * s->C;
  float *res = h_nan((size_t)R), *d_res = d_nan((size_t)R);
  residual_forward(res, x, dout, R);
  CU(cudaDeviceSynchronize());
  out_t ro[] = {{.name = "out", .ref = res, .dev = d_res, .n = (size_t)R, .k = 1}};
  RUN_AND_COMPARE("residual_forward", s, ro, ops_cuda_residual_forward(d_res, d_x, d_dout, R, g_stream));
  free_all();
}

static void check_classifier(const shape *s) {
  int BT = s->B * s->T, C = s->C, V = s->V;
  size_t nin = (size_t)BT * C, nw = (size_t)V * C, nl = (size_t)BT * V;
  float *inp = h_uniform(nin, -1, 1), *wte = h_uniform(nw, -1, 1);
  float *d_inp = d_upload(inp, nin * sizeof(float)), *d_wte = d_upload(wte, nw * sizeof(float));
  float *logits = h_nan(nl), *d_logits = d_nan(nl);
  classifier_forward(logits, inp, wte, BT, C, V);
  CU(cudaDeviceSynchronize());
  out_t fo[] = {{.name = "logits", .ref = logits, .dev = d_logits, .n = nl, .k = C}};
  RUN_AND_COMPARE("classifier_forward", s, fo,
                  ops_cuda_classifier_forward(d_logits, d_inp, d_wte, BT, C, V, g_blas, g_stream));

  float *dl = h_uniform(nl, -1, 1), *d_dl = d_upload(dl, nl * sizeof(float));
  float *dinp = h_nan(nin), *d_dinp = d_nan(nin);
  float *dwte = h_uniform(nw, -1, 1), *d_dwte = d_upload(dwte, nw * sizeof(float));
  classifier_backward(dinp, dwte, dl, inp, wte, BT, C, V);
  CU(cudaDeviceSynchronize());
  out_t bo[] = {{.name = "dinp", .ref = dinp, .dev = d_dinp, .n = nin, .k = V},
                {.name = "dwte", .ref = dwte, .dev = d_dwte, .n = nw, .k = BT}};
  RUN_AND_COMPARE("classifier_backward", s, bo,
                  ops_cuda_classifier_backward(d_dinp, d_dwte, d_dl, d_inp, d_wte, BT, C, V, g_blas, g_stream));
  free_all();
}

static fsdp_status xent_and_sum(float *logits, float *losses, const int *targets, int BT, int V, float dscale,
                                double *sum) {
  TRY(ops_cuda_softmax_xent_forward_backward(logits, losses, targets, BT, V, dscale, g_stream));
  return ops_cuda_loss_sum(sum, losses, BT, g_stream);
}

static void check_softmax_xent(const shape *s) {
  int BT = s->B * s->T, V = s->V;
  size_t nl = (size_t)BT * V;
  float dscale = 1.0f / (float)BT;
  float *logits = h_uniform(nl, -8, 8);
  int *tgt = hbuf((size_t)BT * sizeof(int));
  for (int i = 0; i < BT; i++) tgt[i] = (int)(rng_next() % (uint64_t)V);
  float *d_logits = d_upload(logits, nl * sizeof(float));   /* before the CPU overwrites them */
  int *d_tgt = d_upload(tgt, (size_t)BT * sizeof(int));
  float *losses = h_nan((size_t)BT), *d_losses = d_nan((size_t)BT);
  double *d_sum = dbuf(sizeof(double));
  CU(cudaMemset(d_sum, 0xFF, sizeof(double)));
  float *sum = hbuf(sizeof(float));
  *sum = (float)softmax_xent_forward_backward(logits, losses, tgt, BT, V, dscale);
  CU(cudaDeviceSynchronize());
  out_t o[] = {{.name = "dlogits", .ref = logits, .dev = d_logits, .n = nl, .k = 4},
               {.name = "losses", .ref = losses, .dev = d_losses, .n = (size_t)BT, .k = 4},
               {.name = "loss_sum", .ref = sum, .dev = d_sum, .n = 1, .k = 4, .dbl = 1}};
  RUN_AND_COMPARE("softmax_xent+loss_sum", s, o, xent_and_sum(d_logits, d_losses, d_tgt, BT, V, dscale, d_sum));
  free_all();
}

static void check_ops(const shape *s) {
  printf("\n== operators, shape %s: B=%d T=%d C=%d NH=%d V=%d ==\n", s->name, s->B, s->T, s->C, s->NH, s->V);
  check_encoder(s);
  check_layernorm(s);
  if (s->timed) {   /* GPT-2's c_fc and its c_proj */
    check_matmul(s, "matmul_forward(c_fc)", "matmul_backward(c_fc)", s->C, 4 * s->C, 1);
    check_matmul(s, "matmul_forward(c_proj)", "matmul_backward(c_proj)", 4 * s->C, s->C, 1);
  } else {          /* c_attn, and the variant without bias, dinp, dbias */
    check_matmul(s, "matmul_forward(c_attn)", "matmul_backward(c_attn)", s->C, 3 * s->C, 1);
    check_matmul(s, "matmul_forward(no bias)", "matmul_backward(no dinp,dbias)", s->C, 3 * s->C, 0);
  }
  check_attention(s);
  check_elementwise(s);
  check_classifier(s);
  check_softmax_xent(s);
  fflush(stdout);
}

/* ---- comms ---- */

static void verdict(const char *name, int ok, const char *detail) {
  printf("%-50s %s%s%s\n", name, ok ? "PASS" : "FAIL", detail && *detail ? ": " : "", detail ? detail : "");
  if (ok) g_pass++;
  else g_fail++;
}

/* With one rank every collective's result is its input, bit for bit, and nothing is sent (the
 * ring accounting counts S·(N−1)/N). */
static void check_comm_world1(comm_t *c, const char *label, const char *backend) {
  char name[96], detail[256];
  snprintf(name, sizeof name, "%s backend name", label);
  snprintf(detail, sizeof detail, "\"%s\"", comm_backend_name(c));
  verdict(name, strcmp(comm_backend_name(c), backend) == 0 && comm_world(c) == 1 && comm_rank(c) == 0, detail);
  const size_t n = 1000003;   /* odd: no multiple of any vector width */
  for (int t = 0; t < 2; t++) {
    comm_dtype dt = t ? COMM_BF16 : COMM_F32;
    const char *dn = t ? "bf16" : "f32";
    size_t bytes = n * comm_dtype_size(dt);
    uint8_t *src = hbuf(bytes), *got = hbuf(bytes);
    for (size_t i = 0; i < n; i++) {
      float f = rng_uniform(-4, 4);
      if (dt == COMM_F32) {
        memcpy(src + 4 * i, &f, 4);
      } else {
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t h = (uint16_t)(u >> 16);   /* a bf16 value: the top half of a float */
        memcpy(src + 2 * i, &h, 2);
      }
    }
    void *d_send = d_upload(src, bytes), *d_recv = dbuf(bytes), *d_buf = d_upload(src, bytes);
    void *d_inpl = d_upload(src, bytes);
    CU(cudaMemset(d_recv, 0xFF, bytes));
    CU(cudaDeviceSynchronize());   /* NCCL's stream does not wait for the legacy stream's copies */
    for (int k = 0; k < 4; k++) {
      static const char *const what[] = {"all-gather", "reduce-scatter (async)", "all-reduce (async, in place)",
                                         "all-gather (in place)"};
      comm_req *req = NULL;
      fsdp_status st;
      void *res = d_recv;
      fsdp_clear_error();
      if (k == 0) {
        st = comm_allgather(c, d_send, d_recv, n, dt, NULL);
      } else if (k == 1) {
        CU(cudaMemset(d_recv, 0xFF, bytes));
        CU(cudaDeviceSynchronize());
        st = comm_reduce_scatter(c, d_send, d_recv, n, dt, &req);
        if (st == FSDP_OK) st = comm_wait(&req);
      } else if (k == 2) {
        st = comm_allreduce(c, d_buf, n, dt, &req);
        if (st == FSDP_OK) st = comm_wait(&req);
        res = d_buf;
      } else {
        st = comm_allgather(c, d_inpl, d_inpl, n, dt, NULL);
        res = d_inpl;
      }
      snprintf(name, sizeof name, "%s %s %s", label, what[k], dn);
      if (st != FSDP_OK) {
        snprintf(detail, sizeof detail, "%s: %s", fsdp_strerror(st), fsdp_last_error());
        verdict(name, 0, detail);
        continue;
      }
      CU(cudaMemcpy(got, res, bytes, cudaMemcpyDeviceToHost));
      size_t diff = 0;
      for (size_t i = 0; i < bytes; i++) diff += got[i] != src[i];
      snprintf(detail, sizeof detail, "n=%zu, %zu of %zu bytes differ from the input", n, diff, bytes);
      verdict(name, diff == 0, detail);
    }
  }
  fsdp_clear_error();
  fsdp_status st = comm_barrier(c);
  snprintf(name, sizeof name, "%s barrier", label);
  verdict(name, st == FSDP_OK, st == FSDP_OK ? "" : fsdp_last_error());
  uint64_t sent[COLL_NKIND];
  comm_sent_bytes(c, sent);
  snprintf(name, sizeof name, "%s sent bytes (world 1: all 0)", label);
  snprintf(detail, sizeof detail, "all-gather %llu, reduce-scatter %llu, all-reduce %llu",
           (unsigned long long)sent[COLL_ALLGATHER], (unsigned long long)sent[COLL_REDUCESCATTER],
           (unsigned long long)sent[COLL_ALLREDUCE]);
  verdict(name, sent[COLL_ALLGATHER] == 0 && sent[COLL_REDUCESCATTER] == 0 && sent[COLL_ALLREDUCE] == 0, detail);
  free_all();
}

static uint64_t mem_comm_now(void) {
  mem_stats ms;
  mem_get_stats(&ms);
  return ms.cur[MEM_COMM];
}

static void check_comms_world1(void) {
  printf("\n== comms, world 1, device 0 ==\n");
  char detail[512];
  uint64_t m0 = mem_comm_now();
  uint8_t id[128];
  comm_t *c = NULL;
  fsdp_clear_error();
  fsdp_status st = comm_nccl_get_unique_id(id);
  if (st == FSDP_OK) st = comm_new_nccl(0, 1, id, 0, 60.0, &c);
  snprintf(detail, sizeof detail, "%s", st == FSDP_OK ? "" : fsdp_last_error());
  verdict("nccl[1] comm_nccl_get_unique_id + comm_new_nccl", st == FSDP_OK, detail);
  if (st == FSDP_OK) {
    verdict("nccl[1] comm_nccl_stream is set", comm_nccl_stream(c) != NULL, "");
    check_comm_world1(c, "nccl[1]", "nccl");
    comm_destroy(&c);
    uint64_t m1 = mem_comm_now();
    snprintf(detail, sizeof detail, "MEM_COMM %llu bytes before, %llu after destroy", (unsigned long long)m0,
             (unsigned long long)m1);
    verdict("nccl[1] comm_destroy returns MEM_COMM bytes", c == NULL && m1 == m0, detail);
  }

  fsdp_clear_error();
  st = comm_new_gloo_staged(0, 1, NULL, NULL, "gpu_check", 60.0, 0, &c);
  verdict("gloo-staged[1] comm_new_gloo_staged (no rendezvous)", st == FSDP_OK, st == FSDP_OK ? "" : fsdp_last_error());
  if (st == FSDP_OK) {
    check_comm_world1(c, "gloo-staged[1]", "gloo-staged");
    comm_destroy(&c);
  }
  fflush(stdout);
}

/* ---- NCCL with two processes, one GPU each (forked before any CUDA call) ---- */

static int write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, void *p, size_t n) {
  char *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Small integers, exact in bf16 (up to 256) and in any summation order. */
static float rank_value(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 61 + 1)); }

static void put_value(void *buf, comm_dtype dt, size_t i, float f) {
  if (dt == COMM_F32) {
    ((float *)buf)[i] = f;
  } else {
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
  }
}

static float get_value(const void *buf, comm_dtype dt, size_t i) {
  if (dt == COMM_F32) return ((const float *)buf)[i];
  uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The two-process checks: NCCL with one GPU per rank, or the staged gloo comm with both ranks on
 * device 0 (what it exists for: workers sharing a GPU). */
typedef enum { MP_NCCL = 0, MP_STAGED } mp_kind;
static const char *const kMpLabel[] = {"nccl[2]", "gloo-staged[2]"};

#define CHILD_FAIL(...)                                    \
  do {                                                     \
    printf("%s rank %d: FAIL: ", kMpLabel[kind], rank);   \
    printf(__VA_ARGS__);                                   \
    printf("\n");                                          \
    fails++;                                               \
  } while (0)

/* id_fd: NCCL's unique id goes from rank 0 to rank 1 through this pipe end; store_dir: the gloo
 * rendezvous directory (staged). */
static int mp_rank_main(mp_kind kind, int rank, int world, int id_fd, const char *store_dir) {
  uint8_t id[128];
  int fails = 0;
  comm_t *c = NULL;
  if (kind == MP_STAGED) {
    if (comm_new_gloo_staged(rank, world, store_dir, NULL, "gpu_check", 60.0, 0, &c) != FSDP_OK) {
      CHILD_FAIL("comm_new_gloo_staged on device 0: %s", fsdp_last_error());
      return 1;
    }
  } else if (rank == 0) {
    fsdp_status st = comm_nccl_get_unique_id(id);
    if (st != FSDP_OK) {
      CHILD_FAIL("comm_nccl_get_unique_id: %s", fsdp_last_error());
      return 1;
    }
    for (int r = 1; r < world; r++)
      if (write_all(id_fd, id, sizeof id) != 0) {
        CHILD_FAIL("cannot pass the unique id through the pipe: %s", strerror(errno));
        return 1;
      }
  } else if (read_all(id_fd, id, sizeof id) != 0) {
    CHILD_FAIL("no unique id from rank 0 (it failed before sending it)");
    return 1;
  }
  if (kind == MP_NCCL) {
    close(id_fd);
    if (comm_new_nccl(rank, world, id, rank, 60.0, &c) != FSDP_OK) {
      CHILD_FAIL("comm_new_nccl on device %d: %s", rank, fsdp_last_error());
      return 1;
    }
  }
  const size_t n = 1000003;
  uint64_t want[COLL_NKIND] = {0};
  for (int t = 0; t < 2; t++) {
    comm_dtype dt = t ? COMM_BF16 : COMM_F32;
    size_t esz = comm_dtype_size(dt), big = (size_t)world * n;
    void *h = xmalloc(big * esz), *d_send = NULL, *d_recv = NULL;
    CU(cudaMalloc(&d_send, big * esz));
    CU(cudaMalloc(&d_recv, big * esz));
    /* all-gather: block r of the result is rank r's input */
    for (size_t i = 0; i < n; i++) put_value(h, dt, i, rank_value(rank, i));
    CU(cudaMemcpy(d_send, h, n * esz, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    if (comm_allgather(c, d_send, d_recv, n, dt, NULL) != FSDP_OK) CHILD_FAIL("all-gather: %s", fsdp_last_error());
    want[COLL_ALLGATHER] += n * esz * (uint64_t)(world - 1);
    CU(cudaMemcpy(h, d_recv, big * esz, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (int r = 0; r < world; r++)
      for (size_t i = 0; i < n; i++) bad += get_value(h, dt, (size_t)r * n + i) != rank_value(r, i);
    if (bad) CHILD_FAIL("all-gather %s: %zu wrong elements", t ? "bf16" : "f32", bad);
    /* reduce-scatter: element j of every rank's input is (rank+1)·(j%61+1); the sum over ranks is
     * world(world+1)/2·(j%61+1) */
    for (size_t j = 0; j < big; j++) put_value(h, dt, j, rank_value(rank, j));
    CU(cudaMemcpy(d_send, h, big * esz, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    comm_req *req = NULL;
    if (comm_reduce_scatter(c, d_send, d_recv, n, dt, &req) != FSDP_OK || comm_wait(&req) != FSDP_OK)
      CHILD_FAIL("reduce-scatter: %s", fsdp_last_error());
    want[COLL_REDUCESCATTER] += n * esz * (uint64_t)(world - 1);
    CU(cudaMemcpy(h, d_recv, n * esz, cudaMemcpyDeviceToHost));
    float tri = (float)(world * (world + 1) / 2);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += get_value(h, dt, i) != tri * (float)(((size_t)rank * n + i) % 61 + 1);
    if (bad) CHILD_FAIL("reduce-scatter %s: %zu wrong elements", t ? "bf16" : "f32", bad);
    /* all-reduce in place */
    for (size_t i = 0; i < n; i++) put_value(h, dt, i, rank_value(rank, i));
    CU(cudaMemcpy(d_recv, h, n * esz, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    if (comm_allreduce(c, d_recv, n, dt, &req) != FSDP_OK || comm_wait(&req) != FSDP_OK)
      CHILD_FAIL("all-reduce: %s", fsdp_last_error());
    want[COLL_ALLREDUCE] += 2 * n * esz * (uint64_t)(world - 1) / (uint64_t)world;
    CU(cudaMemcpy(h, d_recv, n * esz, cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += get_value(h, dt, i) != tri * (float)(i % 61 + 1);
    if (bad) CHILD_FAIL("all-reduce %s: %zu wrong elements", t ? "bf16" : "f32", bad);
    CU(cudaFree(d_send));
    CU(cudaFree(d_recv));
    free(h);
  }
  if (comm_barrier(c) != FSDP_OK) CHILD_FAIL("barrier: %s", fsdp_last_error());
  uint64_t sent[COLL_NKIND];
  comm_sent_bytes(c, sent);
  for (int k = 0; k < COLL_NKIND; k++)
    if (sent[k] != want[k])
      CHILD_FAIL("comm_sent_bytes[%d] = %llu, expected %llu", k, (unsigned long long)sent[k],
                 (unsigned long long)want[k]);

  /* Bandwidth, nccl-tests' way: S = the whole gathered size, algbw = S/t, busbw = algbw·(n−1)/n. */
  if (!fails) {
    /* fp32 elements per rank: 128 MiB with NCCL, 16 MiB through the host (gloo over loopback) */
    const size_t per = kind == MP_NCCL ? (size_t)32 << 20 : (size_t)4 << 20;
    void *d_send = NULL, *d_recv = NULL;
    CU(cudaMalloc(&d_send, per * 4));
    CU(cudaMalloc(&d_recv, per * 4 * (size_t)world));
    CU(cudaMemset(d_send, 0, per * 4));
    CU(cudaDeviceSynchronize());
    for (int k = 0; k < 2; k++) {
      const int warm = 3, iters = 10;
      double t0 = 0;
      for (int it = 0; it < warm + iters && !fails; it++) {
        if (it == warm) t0 = now_s();
        fsdp_status st = k == 0 ? comm_allgather(c, d_send, d_recv, per, COMM_F32, NULL)
                                : comm_reduce_scatter(c, d_recv, d_send, per, COMM_F32, NULL);
        if (st != FSDP_OK) CHILD_FAIL("%s bandwidth run: %s", k ? "reduce-scatter" : "all-gather", fsdp_last_error());
      }
      double t = (now_s() - t0) / iters, S = (double)per * 4 * world;
      if (!fails && rank == 0)
        printf("%s %-15s S=%.0f MiB  time %.3f ms  algbw %.2f GB/s  busbw %.2f GB/s\n", kMpLabel[kind],
               k ? "reduce-scatter" : "all-gather", S / (1 << 20), 1e3 * t, S / t / 1e9,
               S / t / 1e9 * (world - 1) / world);
    }
    CU(cudaFree(d_send));
    CU(cudaFree(d_recv));
  }
  comm_destroy(&c);
  printf("%s rank %d: %s (all-gather, reduce-scatter, all-reduce in f32 and bf16, barrier, sent bytes)\n",
         kMpLabel[kind], rank, fails ? "FAIL" : "PASS");
  fflush(stdout);
  return fails ? 1 : 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  remove(path);   /* best effort: a leftover rendezvous file in /tmp harms nothing */
  return 0;
}

/* Runs a two-rank check in two forked children (before this process touches CUDA); returns 1
 * when both ranks passed. */
static int check_two_ranks(mp_kind kind) {
  const int world = 2;
  const char *label = kMpLabel[kind];
  const double limit_s = 150;
  char store[] = "/tmp/gpu_check_store.XXXXXX";
  if (kind == MP_STAGED && !mkdtemp(store)) {
    printf("%s: FAIL: mkdtemp %s: %s\n", label, store, strerror(errno));
    return 0;
  }
  int fd[2];
  if (pipe(fd) != 0) {
    printf("%s: FAIL: pipe: %s\n", label, strerror(errno));
    return 0;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid[2];
  for (int r = 0; r < world; r++) {
    pid[r] = fork();
    if (pid[r] < 0) {
      printf("%s: FAIL: fork: %s\n", label, strerror(errno));
      if (r == 1) {
        kill(pid[0], SIGKILL);
        waitpid(pid[0], NULL, 0);
      }
      close(fd[0]);
      close(fd[1]);
      return 0;
    }
    if (pid[r] == 0) {
      close(r == 0 ? fd[0] : fd[1]);
      int rc = mp_rank_main(kind, r, world, r == 0 ? fd[1] : fd[0], store);
      fflush(stdout);
      _exit(rc);
    }
  }
  close(fd[0]);
  close(fd[1]);
  int ok = 1, left = world;
  int done[2] = {0, 0};
  double deadline = now_s() + limit_s;
  while (left > 0) {
    for (int r = 0; r < world; r++) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pid[r], &status, WNOHANG) == pid[r]) {
        done[r] = 1;
        left--;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          ok = 0;
          if (WIFSIGNALED(status)) printf("%s rank %d: FAIL: killed by signal %d\n", label, r, WTERMSIG(status));
        }
      }
    }
    if (left > 0 && now_s() > deadline) {
      printf("%s: FAIL: the ranks did not finish within %.0f s; killing them\n", label, limit_s);
      for (int r = 0; r < world; r++)
        if (!done[r]) {
          kill(pid[r], SIGKILL);
          waitpid(pid[r], NULL, 0);
        }
      ok = 0;
      break;
    }
    if (left > 0) {
      struct timespec ts = {0, 20 * 1000 * 1000};   /* polling the children's exit, with a deadline */
      nanosleep(&ts, NULL);
    }
  }
  if (kind == MP_STAGED) nftw(store, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return ok;
}

/* ---- device probe (in a child, so that the parent can still fork NCCL ranks afterwards) ---- */

/* Returns the device count, or -1 with the reason in why. */
static int probe_devices(char *why, size_t len) {
  int fd[2];
  if (pipe(fd) != 0) {
    snprintf(why, len, "pipe: %s", strerror(errno));
    return -1;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, len, "fork: %s", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    close(fd[0]);
    char msg[512];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) snprintf(msg, sizeof msg, "E cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(e),
                                   cudaGetErrorName(e));
    else snprintf(msg, sizeof msg, "N %d", n);
    write_all(fd[1], msg, strlen(msg) + 1);
    _exit(0);
  }
  close(fd[1]);
  char msg[512] = "";
  size_t got = 0;
  for (;;) {
    ssize_t r = read(fd[0], msg + got, sizeof msg - 1 - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  msg[got] = '\0';
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (msg[0] == 'N') return atoi(msg + 2);
  if (msg[0] == 'E') snprintf(why, len, "%s", msg + 2);
  else if (WIFSIGNALED(status)) snprintf(why, len, "the CUDA probe was killed by signal %d", WTERMSIG(status));
  else snprintf(why, len, "the CUDA probe exited without an answer (status %d)", status);
  return -1;
}

int main(int argc, char **argv) {
  (void)argc;
  /* The CPU reference's GEMMs: OpenBLAS picks its kernels when it loads; on CPUs it does not know
   * it falls back to slow SSE3 ones unless OPENBLAS_CORETYPE says otherwise (as fsdp-worker does). */
  const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : ops_cpu_blas_better_core();
  if (core) {
    setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv);   /* returns only on failure: then run with the slow kernels */
  }
  setvbuf(stdout, NULL, _IOLBF, 0);

  char why[512] = "";
  int ndev = probe_devices(why, sizeof why);
  if (ndev <= 0) {
    fprintf(stderr,
            "gpu_check: no CUDA device: %s. These checks need an NVIDIA GPU and its driver; run "
            "tests/gpu/run.sh on such a machine (docs/gpu.md).\n",
            ndev == 0 ? "cudaGetDeviceCount found 0 devices" : why);
    return 2;
  }
  printf("gpu_check: %d CUDA device(s)\n", ndev);

  /* The two-process checks first: their ranks are forked before this process makes any CUDA call. */
  printf("\n== comms, two processes ==\n");
  if (ndev >= 2) {
    verdict("nccl[2] two ranks on devices 0 and 1", check_two_ranks(MP_NCCL), "");
  } else {
    printf("nccl[2]: SKIPPED: needs 2 GPUs (NCCL does not run two ranks on one device); this machine has 1\n");
  }
  verdict("gloo-staged[2] two ranks sharing device 0", check_two_ranks(MP_STAGED), "");

  CU(cudaSetDevice(0));
  struct cudaDeviceProp prop;
  CU(cudaGetDeviceProperties(&prop, 0));
  int rt = 0, drv = 0;
  CU(cudaRuntimeGetVersion(&rt));
  CU(cudaDriverGetVersion(&drv));
  printf("\ndevice 0: %s, compute capability %d.%d, %d SMs, %.1f GiB; CUDA runtime %d, driver %d\n", prop.name,
         prop.major, prop.minor, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30), rt, drv);
  CU(cudaStreamCreate(&g_stream));
  CU(cudaEventCreate(&g_ev0));
  CU(cudaEventCreate(&g_ev1));
  cublasStatus_t bs = cublasCreate(&g_blas);
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetMathMode(g_blas, CUBLAS_PEDANTIC_MATH);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "gpu_check: FATAL: cuBLAS handle: %s\n", cublasGetStatusString(bs));
    return 1;
  }

  check_ops(&kTiny);
  check_ops(&kGpt2);

  /* The mode a production handle has by default: plain fp32 as well, unless TF32 is forced on. */
  printf("\n== one GEMM under CUBLAS_DEFAULT_MATH (NVIDIA_TF32_OVERRIDE=%s) ==\n",
         getenv("NVIDIA_TF32_OVERRIDE") ? getenv("NVIDIA_TF32_OVERRIDE") : "unset");
  if (cublasSetMathMode(g_blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
    verdict("cublasSetMathMode(CUBLAS_DEFAULT_MATH)", 0, "");
  } else {
    check_matmul(&kGpt2, "matmul_forward(c_fc,default-math)", "matmul_backward(c_fc,default-math)", kGpt2.C,
                 4 * kGpt2.C, 1);
  }

  check_comms_world1();

  cublasDestroy(g_blas);
  cudaEventDestroy(g_ev0);
  cudaEventDestroy(g_ev1);
  cudaStreamDestroy(g_stream);
  printf("\ngpu_check: %d checks passed, %d failed: %s\n", g_pass, g_fail, g_fail ? "FAIL" : "PASS");
  return g_fail ? 1 : 0;
}
