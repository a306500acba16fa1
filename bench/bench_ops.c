/* bench_ops — per-operator timing of ops_cpu at GPT-2-small sizes, and the split of one training
 * step's operator time between GEMMs (OpenBLAS) and the OpenMP loops.
 *
 *   build/bench/bench_ops [B] [T] [reps] [cpu]   defaults: B=1 T=1024 reps=3 (C=768, NH=12, V=50257, L=12)
 *
 * With a fourth argument "cpu" the clock is the process' CPU time instead of wall time: on a shared,
 * loaded machine, run with OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 and "cpu" to measure the work
 * each op costs, free of the other tenants.
 * Each op is timed as the median of `reps` runs after one warm-up. The step estimate multiplies
 * the per-block ops by L=12 and adds the embedding, the final LayerNorm and the tied head; it
 * counts operator time only (no optimizer, no collectives).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <omp.h>

#include "conditions.h"
#include "ops_cpu.h"

static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(bench_clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *buf(size_t n) {
  float *p = malloc(n * sizeof(float));
  if (!p) {
    fprintf(stderr, "bench_ops: out of memory allocating %zu floats\n", n);
    exit(1);
  }
  unsigned s = 12345u;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    p[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.2f;
  }
  return p;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int reps = 3;

#define TIME(var, stmt)                                       \
  do {                                                        \
    double t_[64];                                            \
    stmt;                                                     \
    for (int r_ = 0; r_ < reps; r_++) {                       \
      double t0_ = now_s();                                   \
      stmt;                                                   \
      t_[r_] = now_s() - t0_;                                 \
    }                                                         \
    qsort(t_, (size_t)reps, sizeof(double), cmp_double);      \
    var = t_[reps / 2] * 1e3;                                 \
  } while (0)

int main(int argc, char **argv) {
  int B = argc > 1 ? atoi(argv[1]) : 1, T = argc > 2 ? atoi(argv[2]) : 1024;
  reps = argc > 3 ? atoi(argv[3]) : 3;
  if (argc > 4 && strcmp(argv[4], "cpu") == 0) bench_clock = CLOCK_PROCESS_CPUTIME_ID;
  if (B < 1 || T < 1 || reps < 1 || reps > 64) {
    fprintf(stderr, "usage: bench_ops [B>=1] [T>=1] [reps 1..64]\n");
    return 2;
  }
  int C = 768, NH = 12, V = 50257, L = 12, BT = B * T;
  size_t n = (size_t)BT * C;
  printf("bench_ops: B=%d T=%d C=%d NH=%d V=%d, %d OpenMP threads, %s time\n", B, T, C, NH, V,
         omp_get_max_threads(), bench_clock == CLOCK_MONOTONIC ? "wall" : "process CPU");
  bench_conditions_begin();
  printf("OpenBLAS threads: %d\n", openblas_get_num_threads());

  float *x = buf(n), *y = buf(n), *dy = buf(n), *dx = buf(n), *mean = buf(BT), *rstd = buf(BT);
  float *lnw = buf(C), *lnb = buf(C), *dlnw = buf(C), *dlnb = buf(C);
  float *qkvw = buf((size_t)C * 3 * C), *qkvb = buf(3 * C), *dqkvw = buf((size_t)C * 3 * C), *dqkvb = buf(3 * C);
  float *qkv = buf(3 * n), *dqkv = buf(3 * n);
  float *att = buf((size_t)B * NH * T * T), *datt = buf((size_t)B * NH * T * T);
  float *fcw = buf((size_t)C * 4 * C), *fcb = buf(4 * C), *dfcw = buf((size_t)C * 4 * C), *dfcb = buf(4 * C);
  float *h = buf(4 * n), *g = buf(4 * n), *dh = buf(4 * n), *dg = buf(4 * n);
  float *wte = buf((size_t)V * C), *dwte = buf((size_t)V * C), *wpe = buf((size_t)T * C), *dwpe = buf((size_t)T * C);
  float *logits = buf((size_t)BT * V), *losses = buf(BT);
  int *tok = malloc(sizeof(int) * (size_t)BT);
  for (int i = 0; i < BT; i++) tok[i] = (i * 7919) % V;

  double t_enc_f, t_enc_b, t_ln_f, t_ln_b, t_qkv_f, t_qkv_b, t_att_f, t_att_b, t_fc_f, t_fc_b;
  double t_gelu_f, t_gelu_b, t_res, t_cls_f, t_cls_b, t_xent, t_proj_f, t_proj_b, t_fcp_f, t_fcp_b;
  TIME(t_enc_f, encoder_forward(x, tok, wte, wpe, B, T, C, NULL));
  TIME(t_enc_b, encoder_backward(dwte, dwpe, dy, tok, B, T, C, -1, NULL));
  TIME(t_ln_f, layernorm_forward(y, mean, rstd, x, lnw, lnb, B, T, C));
  TIME(t_ln_b, layernorm_backward(dx, dlnw, dlnb, dy, x, lnw, mean, rstd, B, T, C));
  TIME(t_qkv_f, matmul_forward(qkv, x, qkvw, qkvb, BT, C, 3 * C));
  TIME(t_qkv_b, matmul_backward(dx, dqkvw, dqkvb, dqkv, x, qkvw, BT, C, 3 * C));
  TIME(t_att_f, attention_forward(y, att, qkv, B, T, C, NH, NH, NULL, 0));
  TIME(t_att_b, attention_backward(dqkv, datt, dy, qkv, att, B, T, C, NH, NH, NULL, 0));
  TIME(t_proj_f, matmul_forward(y, x, qkvw, qkvb, BT, C, C));
  TIME(t_proj_b, matmul_backward(dx, dqkvw, dqkvb, dy, x, qkvw, BT, C, C));
  TIME(t_fc_f, matmul_forward(h, x, fcw, fcb, BT, C, 4 * C));
  TIME(t_fc_b, matmul_backward(dx, dfcw, dfcb, dh, x, fcw, BT, C, 4 * C));
  TIME(t_gelu_f, gelu_forward(g, h, 4 * BT * C));
  TIME(t_gelu_b, gelu_backward(dh, h, dg, 4 * BT * C));
  TIME(t_fcp_f, matmul_forward(y, g, fcw, qkvb, BT, 4 * C, C));
  TIME(t_fcp_b, matmul_backward(dg, dfcw, dfcb, dy, g, fcw, BT, 4 * C, C));
  TIME(t_res, residual_forward(y, x, dy, BT * C));
  TIME(t_cls_f, linear_forward(logits, x, wte, BT, C, V));
  TIME(t_cls_b, linear_backward(dx, dwte, logits, x, wte, BT, C, V));
  TIME(t_xent, softmax_xent_forward_backward(logits, losses, tok, BT, V, 1.0f / BT));

  printf("%-28s %10s %10s\n", "op (median ms)", "forward", "backward");
  printf("%-28s %10.2f %10.2f\n", "encoder", t_enc_f, t_enc_b);
  printf("%-28s %10.2f %10.2f\n", "layernorm", t_ln_f, t_ln_b);
  printf("%-28s %10.2f %10.2f\n", "matmul c_attn (C->3C)", t_qkv_f, t_qkv_b);
  printf("%-28s %10.2f %10.2f\n", "attention", t_att_f, t_att_b);
  printf("%-28s %10.2f %10.2f\n", "matmul attn.c_proj (C->C)", t_proj_f, t_proj_b);
  printf("%-28s %10.2f %10.2f\n", "matmul c_fc (C->4C)", t_fc_f, t_fc_b);
  printf("%-28s %10.2f %10.2f\n", "gelu", t_gelu_f, t_gelu_b);
  printf("%-28s %10.2f %10.2f\n", "matmul mlp.c_proj (4C->C)", t_fcp_f, t_fcp_b);
  printf("%-28s %10.2f %10s\n", "residual", t_res, "-");
  printf("%-28s %10.2f %10.2f\n", "classifier (tied head)", t_cls_f, t_cls_b);
  printf("%-28s %10.2f %10s\n", "softmax+xent (fwd+bwd)", t_xent, "-");

  double gemm_blk = t_qkv_f + t_qkv_b + t_proj_f + t_proj_b + t_fc_f + t_fc_b + t_fcp_f + t_fcp_b;
  double attn_blk = t_att_f + t_att_b;
  double other_blk = 2 * (t_ln_f + t_ln_b) + t_gelu_f + t_gelu_b + 2 * t_res;
  double gemm = L * gemm_blk + t_cls_f + t_cls_b;
  double attn = L * attn_blk;
  double other = L * other_blk + t_enc_f + t_enc_b + t_ln_f + t_ln_b + t_xent;
  double total = gemm + attn + other;
  double flops = 2.0 * BT * C * (3.0 * C + C + 4.0 * C + 4.0 * C) * 3 * L + 2.0 * BT * C * (double)V * 3;
  printf("step estimate (L=%d): %.1f ms = GEMM %.1f (%.0f%%, %.0f GFLOP/s) + attention %.1f (%.0f%%) + "
         "other loops %.1f (%.0f%%)\n",
         L, total, gemm, 100 * gemm / total, flops / gemm * 1e-6, attn, 100 * attn / total, other,
         100 * other / total);
  bench_conditions_end();
  return 0;
}
