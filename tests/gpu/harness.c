/* harness — gpu_check's buffers, random inputs, comparison and reporting (gpu_check.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "ops/bf16.h"

int g_pass, g_fail;
ops_cuda_ctx g_ctx;
cudaEvent_t g_ev0, g_ev1;

/* ---- fatal errors of the harness itself (not of the code under test) ---- */

void cu_fatal(cudaError_t e, const char *call, int line) {
  fprintf(stderr, "gpu_check: FATAL %s:%d: %s: %s (%s)\n", __FILE__, line, call, cudaGetErrorString(e),
          cudaGetErrorName(e));
  fflush(stdout);
  exit(1);
}

void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "gpu_check: FATAL: out of host memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

/* Buffers of the current check, freed by free_all() when it ends. */
#define MAX_BUFS 128
static void *g_hbufs[MAX_BUFS], *g_dbufs[MAX_BUFS];
static int g_nh, g_nd;

void *hbuf(size_t bytes) {
  if (g_nh == MAX_BUFS) {
    fprintf(stderr, "gpu_check: FATAL: more than %d host buffers in one check\n", MAX_BUFS);
    exit(1);
  }
  return g_hbufs[g_nh++] = xmalloc(bytes);
}

void *dbuf(size_t bytes) {
  if (g_nd == MAX_BUFS) {
    fprintf(stderr, "gpu_check: FATAL: more than %d device buffers in one check\n", MAX_BUFS);
    exit(1);
  }
  void *d = NULL;
  CU(cudaMalloc(&d, bytes ? bytes : 1));
  return g_dbufs[g_nd++] = d;
}

void free_all(void) {
  for (int i = 0; i < g_nh; i++) free(g_hbufs[i]);
  for (int i = 0; i < g_nd; i++) CU(cudaFree(g_dbufs[i]));
  g_nh = g_nd = 0;
}

/* ---- random numbers (splitmix64); main seeds them from the clock: fresh inputs every run ---- */

static uint64_t g_rng;

void rng_seed(uint64_t seed) { g_rng = seed; }

uint64_t rng_next(void) {
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

float rng_uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)((double)(rng_next() >> 40) * (1.0 / 16777216.0));
}

float *h_uniform(size_t n, float lo, float hi) {
  float *p = hbuf(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = rng_uniform(lo, hi);
  return p;
}

float *h_bf16_uniform(size_t n, float lo, float hi) {
  float *p = hbuf(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = bf16_round(rng_uniform(lo, hi));
  return p;
}

/* All bits set: a quiet NaN in every float. */
float *h_copy(const float *src, size_t n) {
  float *p = hbuf(n * sizeof(float));
  memcpy(p, src, n * sizeof(float));
  return p;
}

float *h_nan(size_t n) {
  float *p = hbuf(n * sizeof(float));
  memset(p, 0xFF, n * sizeof(float));
  return p;
}

void *d_upload(const void *h, size_t bytes) {
  void *d = dbuf(bytes);
  if (bytes) CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

void *d_bf16(const float *h, size_t n) {
  uint16_t *b = xmalloc(n * sizeof(uint16_t));
  for (size_t i = 0; i < n; i++) b[i] = f32_to_bf16(h[i]);
  void *d = d_upload(b, n * sizeof(uint16_t));
  free(b);
  return d;
}

void *d_nan_f32(size_t n) {
  void *d = dbuf(n * sizeof(float));
  CU(cudaMemset(d, 0xFF, n * sizeof(float)));
  return d;
}

/* 0xFFFF: a NaN in every bf16 */
void *d_nan_bf16(size_t n) {
  void *d = dbuf(n * sizeof(uint16_t));
  CU(cudaMemset(d, 0xFF, n * sizeof(uint16_t)));
  return d;
}

/* ---- comparing and reporting ---- */

void fetch_outputs(out_t *o, int n) {
  for (int i = 0; i < n; i++) {
    o[i].got = hbuf(o[i].n * sizeof(float));
    if (o[i].kind == OUT_BF16) {
      uint16_t *tmp = hbuf(o[i].n * sizeof(uint16_t));
      CU(cudaMemcpy(tmp, o[i].dev, o[i].n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < o[i].n; j++) o[i].got[j] = bf16_to_f32(tmp[j]);
    } else if (o[i].kind == OUT_I32) {
      int *tmp = hbuf(o[i].n * sizeof(int));
      CU(cudaMemcpy(tmp, o[i].dev, o[i].n * sizeof(int), cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < o[i].n; j++) o[i].got[j] = (float)tmp[j];
    } else {
      CU(cudaMemcpy(o[i].got, o[i].dev, o[i].n * sizeof(float), cudaMemcpyDeviceToHost));
    }
  }
}

void compare(const char *op, const char *shape, const out_t *o, double ms) {
  double ss_ref = 0, ss_d = 0, max_abs = 0;
  size_t bad = 0, first = 0, nonfinite = 0, imax = 0;
  if (o->tol == 0) { /* bit for bit */
    for (size_t i = 0; i < o->n; i++)
      if (memcmp(&o->ref[i], &o->got[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  } else {
    for (size_t i = 0; i < o->n; i++) {
      double r = o->ref[i], g = o->got[i];
      if (o->prefill) {
        r -= o->prefill[i];
        g -= o->prefill[i];
      }
      if (!isfinite(r) || !isfinite(g)) {
        if (nonfinite++ == 0 && bad == 0) first = i;
        continue;
      }
      ss_ref += r * r;
      ss_d += (g - r) * (g - r);
    }
    double rms = o->n ? sqrt(ss_ref / (double)o->n) : 0;
    for (size_t i = 0; i < o->n; i++) {
      double r = o->ref[i], g = o->got[i];
      if (o->prefill) {
        r -= o->prefill[i];
        g -= o->prefill[i];
      }
      if (!isfinite(r) || !isfinite(g)) continue;
      double d = fabs(g - r);
      if (d > max_abs) {
        max_abs = d;
        imax = i;
      }
      if (d > 16 * o->tol * (fabs(r) + rms) && bad++ == 0 && nonfinite == 0) first = i;
    }
  }
  double rel = ss_ref > 0 ? sqrt(ss_d / ss_ref) : sqrt(ss_d);
  int ok = bad == 0 && nonfinite == 0 && (o->tol == 0 || rel <= o->tol);
  char name[112], tbuf[32] = "";
  snprintf(name, sizeof name, "%s[%s] %s", op, shape, o->name);
  if (ms >= 0) snprintf(tbuf, sizeof tbuf, "  cuda %8.3f ms", ms);
  if (o->tol == 0)
    printf("%-60s n=%-10zu bit-exact %s%s  %s\n", name, o->n, bad ? "no" : "yes", tbuf, ok ? "PASS" : "FAIL");
  else
    printf("%-60s n=%-10zu rel %.2e (tol %.0e) max_abs %.2e%s  %s\n", name, o->n, rel, o->tol, max_abs, tbuf,
           ok ? "PASS" : "FAIL");
  if (!ok && bad == 0 && nonfinite == 0) first = imax; /* only the norm failed: show the worst element */
  if (!ok) {
    printf("    %zu elements over the element-wise bound, %zu not finite; first at [%zu]: cpu %.9g cuda %.9g%s\n", bad,
           nonfinite, first, (double)o->ref[first], (double)o->got[first], o->prefill ? " (before the prefill is subtracted)" : "");
    g_fail++;
  } else {
    g_pass++;
  }
}

void report_failure(const char *op, const char *shape, fsdp_status st, cudaError_t se) {
  printf("%s[%s]: FAIL: ", op, shape);
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
  (void)cudaGetLastError(); /* a refused launch leaves nothing for the next check */
}


int check_selected(const char *op) {
  const char *only = getenv("GPU_CHECK_ONLY");
  if (!only || !*only) return 1;
  for (const char *p = only; *p;) {
    const char *e = strchr(p, ',');
    const size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n && strncmp(op, p, n) == 0) return 1;
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

void verdict(const char *name, int ok, const char *detail) {
  if (!check_selected(name)) return;
  printf("%-50s %s%s%s\n", name, ok ? "PASS" : "FAIL", detail && *detail ? ": " : "", detail ? detail : "");
  if (ok) g_pass++;
  else g_fail++;
}

/* ---- the roofline ---- */

double g_last_ms = -1, g_copy_gbs = 0, g_gemm_tflops = 0;

typedef struct roof {
  char op[64], shape[32];
  double ms, bytes, flops;
} roof;
static roof g_roof[64];
static int g_nroof;

void roofline_add(const char *op, const char *shape, double bytes, double flops) {
  if (g_last_ms <= 0 || g_nroof == (int)(sizeof g_roof / sizeof *g_roof)) return;
  roof *r = &g_roof[g_nroof++];
  snprintf(r->op, sizeof r->op, "%s", op);
  snprintf(r->shape, sizeof r->shape, "%s", shape);
  r->ms = g_last_ms;
  r->bytes = bytes;
  r->flops = flops;
}

void roofline_print(void) {
  printf("\n== roofline: each timed kernel against this run's copy bandwidth (%.0f GB/s) and bf16 GEMM rate "
         "(%.1f TFLOP/s) ==\n", g_copy_gbs, g_gemm_tflops);
  for (int i = 0; i < g_nroof; i++) {
    const roof *r = &g_roof[i];
    const double s = r->ms / 1e3, gbs = r->bytes / s / 1e9, tf = r->flops / s / 1e12;
    const double fb = g_copy_gbs > 0 ? gbs / g_copy_gbs : 0, ff = g_gemm_tflops > 0 ? tf / g_gemm_tflops : 0;
    /* the roof of a kernel is the nearer of the two: the time its bytes or its FLOPs need at best */
    const double t_mem = g_copy_gbs > 0 ? r->bytes / (g_copy_gbs * 1e9) : 0;
    const double t_math = g_gemm_tflops > 0 ? r->flops / (g_gemm_tflops * 1e12) : 0;
    printf("roofline %-34s %-8s %9.3f ms %9.1f MB %9.2f GFLOP %7.0f GB/s (%3.0f %% copy) %7.1f TFLOP/s "
           "(%3.0f %% GEMM)  %s-bound, %3.0f %% of its roof\n",
           r->op, r->shape, r->ms, r->bytes / 1e6, r->flops / 1e9, gbs, 100 * fb, tf, 100 * ff,
           t_mem >= t_math ? "memory" : "math", 100 * (t_mem > t_math ? t_mem : t_math) / s);
  }
  fflush(stdout);
}
