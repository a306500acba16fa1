/* check_util — gpu_check's checks of AdamW (against optim_adamw_shard) and of the vector utilities
 * of worker/cuda/ops_cuda.h, and the bf16 GEMM rate that later benchmarks use as the MFU denominator. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "jobspec.h"
#include "ops/bf16.h"
#include "ops/nf4.h"
#include "optim.h"
#include "plan.h"

/* ---- AdamW: one unit of five tensors (three decaying) plus padding, as one rank's shard ---- */

static void check_adamw(void) {
  static const int64_t sizes[] = {2304 * 768 + 5, 768, 3072 * 768, 2304, 1000003};
  static const int decays[] = {1, 0, 1, 0, 1};
  const int nt = (int)(sizeof sizes / sizeof sizes[0]);
  plan_unit *u = hbuf(sizeof *u);
  memset(u, 0, sizeof *u);
  snprintf(u->name, sizeof u->name, "test");
  int64_t off = 0;
  int64_t segs[2 * 5];
  int nseg = 0;
  for (int t = 0; t < nt; t++) {
    u->t[t].numel = sizes[t];
    u->t[t].offset = off;
    u->t[t].decay = decays[t];
    u->t[t].ndim = decays[t] ? 2 : 1;
    if (decays[t]) {
      segs[2 * nseg] = off;
      segs[2 * nseg + 1] = off + sizes[t];
      nseg++;
    }
    off += sizes[t];
  }
  u->ntensors = nt;
  u->numel = off;
  u->padded = (off + 1023) / 1024 * 1024; /* padding at the end: zero gradients and state */
  u->shard_numel = u->padded;
  plan_t p;
  memset(&p, 0, sizeof p);
  p.world = p.shard_world = 1;
  p.nunits = 1;
  p.units = u;
  p.shard_total = u->padded;
  jobspec_t spec;
  jobspec_defaults(&spec);
  spec.beta1 = 0.9;
  spec.beta2 = 0.95;
  spec.eps = 1e-8;
  spec.weight_decay = 0.1;
  const int step = 7;
  const double lr = 3e-4;
  const float grad_scale = 0.625f;

  const size_t n = (size_t)u->padded;
  float *w0 = h_uniform(n, -1, 1), *g = h_uniform(n, -0.01f, 0.01f), *m0 = h_uniform(n, -0.01f, 0.01f);
  float *v0 = h_uniform(n, 0, 1e-4f);
  for (size_t i = (size_t)u->numel; i < n; i++) g[i] = m0[i] = v0[i] = 0.0f;
  float *w = h_copy(w0, n), *m = h_copy(m0, n), *v = h_copy(v0, n);
  optim_adamw_shard(&p, 0, w, g, m, v, step, lr, (const optim_config[]){optim_config_of(&spec)}, grad_scale);

  float *d_w = d_upload(w0, n * sizeof(float)), *d_m = d_upload(m0, n * sizeof(float));
  float *d_v = d_upload(v0, n * sizeof(float)), *d_g = d_upload(g, n * sizeof(float));
  void *d_wbf = d_nan_bf16(n);
  int64_t *d_segs = d_upload(segs, sizeof(int64_t) * 2 * (size_t)nseg);
  ops_cuda_adamw_consts_t k = ops_cuda_adamw_consts(step, lr, spec.beta1, spec.beta2, spec.eps, spec.weight_decay,
                                                    grad_scale);
  out_t o[] = {{.name = "param", .ref = w, .dev = d_w, .n = n, .kind = OUT_F32, .tol = TOL_F32},
               {.name = "m", .ref = m, .dev = d_m, .n = n, .kind = OUT_F32, .tol = TOL_F32},
               {.name = "v", .ref = v, .dev = d_v, .n = n, .kind = OUT_F32, .tol = TOL_F32}};
  RUN_AND_COMPARE("adamw", "shard", 0, o, ops_cuda_adamw(d_w, d_wbf, d_m, d_v, d_g, (int64_t)n, d_segs, nseg, &k, &g_ctx));
  if (o[0].got) {
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += memcmp(&o[0].got[i], &w[i], sizeof(float)) != 0;
    /* the same IEEE operations in the same order: the CPU's bits, every one (a decay applied to
     * the wrong element moves a weight by lr·wd·|w|, far inside TOL_F32, but not its bits) */
    char detail[96];
    snprintf(detail, sizeof detail, "%zu of %zu parameters differ from the CPU's bits", diff, n);
    verdict("adamw[shard] param bit for bit", diff == 0, detail);
    /* the bf16 copy: exactly the rounding of the GPU's own fp32 result */
    float *wbf_ref = hbuf(n * sizeof(float));
    for (size_t i = 0; i < n; i++) wbf_ref[i] = bf16_round(o[0].got[i]);
    out_t ob[] = {{.name = "param_bf16 = rne(param)", .ref = wbf_ref, .dev = d_wbf, .n = n, .kind = OUT_BF16, .tol = 0}};
    fetch_outputs(ob, 1);
    compare("adamw", "shard", &ob[0], -1);
  }
  free_all();
}

/* ---- casts, fill, accumulate ---- */

static void check_casts(void) {
  const size_t n = (1u << 20) + 77;
  float *src = hbuf(n * sizeof(float));
  static const uint32_t special[] = {
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa12345u, 0xff812345u, /* NaNs: quiet, signalling, payloads */
      0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,              /* ±inf, ±0 */
      0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u,              /* denormals, ties */
      0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu,              /* largest floats: round to inf or not */
      0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u};             /* ties to even, just below and above */
  const size_t ns = sizeof special / sizeof special[0];
  for (size_t i = 0; i < n; i++) {
    uint32_t bits = (uint32_t)rng_next(); /* every exponent, every mantissa */
    if (i < ns) bits = special[i];
    memcpy(&src[i], &bits, sizeof bits);
  }
  float *ref = hbuf(n * sizeof(float));
  for (size_t i = 0; i < n; i++) ref[i] = bf16_to_f32(f32_to_bf16(src[i]));
  float *d_src = d_upload(src, n * sizeof(float));
  void *d_dst = d_nan_bf16(n);
  out_t o[] = {{.name = "dst", .ref = ref, .dev = d_dst, .n = n, .kind = OUT_BF16, .tol = 0}};
  RUN_AND_COMPARE("cast_f32_to_bf16", "1M+77", 0, o, ops_cuda_cast_f32_to_bf16(d_dst, d_src, (int64_t)n, &g_ctx));

  /* every bf16 bit pattern */
  const size_t nb = 65536;
  uint16_t *hb = hbuf(nb * sizeof(uint16_t));
  float *wide = hbuf(nb * sizeof(float));
  for (size_t i = 0; i < nb; i++) {
    hb[i] = (uint16_t)i;
    wide[i] = bf16_to_f32((uint16_t)i);
  }
  void *d_hb = d_upload(hb, nb * sizeof(uint16_t));
  float *d_wide = d_nan_f32(nb);
  out_t ow[] = {{.name = "dst", .ref = wide, .dev = d_wide, .n = nb, .kind = OUT_F32, .tol = 0}};
  RUN_AND_COMPARE("cast_bf16_to_f32", "all 65536", 0, ow, ops_cuda_cast_bf16_to_f32(d_wide, d_hb, (int64_t)nb, &g_ctx));

  float *fill = hbuf(n * sizeof(float));
  for (size_t i = 0; i < n; i++) fill[i] = 3.25f;
  float *d_fill = d_nan_f32(n);
  out_t of[] = {{.name = "dst", .ref = fill, .dev = d_fill, .n = n, .kind = OUT_F32, .tol = 0}};
  RUN_AND_COMPARE("fill_f32", "1M+77", 0, of, ops_cuda_fill_f32(d_fill, 3.25f, (int64_t)n, &g_ctx));

  /* dst += src: one fp32 addition per element, so bit for bit */
  float *dst0 = h_uniform(n, -1, 1), *a = h_uniform(n, -1, 1), *ab = h_bf16_uniform(n, -1, 1);
  float *acc = hbuf(n * sizeof(float)), *accb = hbuf(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    acc[i] = dst0[i] + a[i];
    accb[i] = dst0[i] + ab[i];
  }
  float *d_acc = d_upload(dst0, n * sizeof(float)), *d_accb = d_upload(dst0, n * sizeof(float));
  float *d_a = d_upload(a, n * sizeof(float));
  void *d_ab = d_bf16(ab, n);
  out_t oa[] = {{.name = "dst", .ref = acc, .dev = d_acc, .n = n, .kind = OUT_F32, .tol = 0}};
  RUN_AND_COMPARE("accumulate_f32", "1M+77", 0, oa, ops_cuda_accumulate_f32(d_acc, d_a, (int64_t)n, &g_ctx));
  out_t ob[] = {{.name = "dst", .ref = accb, .dev = d_accb, .n = n, .kind = OUT_F32, .tol = 0}};
  RUN_AND_COMPARE("accumulate_bf16", "1M+77", 0, ob, ops_cuda_accumulate_bf16(d_accb, d_ab, (int64_t)n, &g_ctx));
  free_all();
}

/* ---- reductions ---- */

static void check_reductions(void) {
  const size_t n = 10000019; /* prime: slices of unequal length */
  float *x = h_uniform(n, -1, 1);
  double ss = 0;
  for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float ref = (float)ss, flag0 = 0, flag1 = 1;
  float *d_x = d_upload(x, n * sizeof(float));
  float *d_ss = d_nan_f32(1);
  int *d_flag = dbuf(sizeof(int));
  CU(cudaMemset(d_flag, 0xFF, sizeof(int)));
  out_t o[] = {{.name = "sumsq", .ref = &ref, .dev = d_ss, .n = 1, .kind = OUT_F32, .tol = TOL_F32},
               {.name = "nonfinite = 0", .ref = &flag0, .dev = d_flag, .n = 1, .kind = OUT_I32, .tol = 0}};
  RUN_AND_COMPARE("sumsq", "10M", 1, o, ops_cuda_sumsq(d_ss, d_flag, d_x, (int64_t)n, &g_ctx));
  /* a NaN, then an inf, in the last slice: the flag must say so */
  for (int k = 0; k < 2; k++) {
    float bad = k ? INFINITY : NAN;
    CU(cudaMemcpy(d_x + n - 2, &bad, sizeof bad, cudaMemcpyHostToDevice));
    out_t of[] = {{.name = k ? "nonfinite = 1 (an inf)" : "nonfinite = 1 (a NaN)", .ref = &flag1, .dev = d_flag, .n = 1,
                   .kind = OUT_I32, .tol = 0}};
    RUN_AND_COMPARE("sumsq", "10M", 0, of, ops_cuda_sumsq(d_ss, d_flag, d_x, (int64_t)n, &g_ctx));
  }

  const int nl = 16384;
  float *losses = h_uniform((size_t)nl, 0, 11);
  double s = 5.0;
  for (int i = 0; i < nl; i++) s += losses[i];
  float lref = (float)s, start = 5.0f;
  float *d_l = d_upload(losses, (size_t)nl * sizeof(float)), *d_acc = d_upload(&start, sizeof start);
  out_t ol[] = {{.name = "acc (5 + sum)", .ref = &lref, .dev = d_acc, .n = 1, .kind = OUT_F32, .tol = TOL_F32}};
  RUN_AND_COMPARE("loss_sum", "16384", 0, ol, ops_cuda_loss_sum(d_acc, d_l, nl, &g_ctx));
  free_all();
}

/* ---- NF4 dequantization: the CPU's bits (nf4_record_dequantize_bf16) from a record at an odd byte
 * address (as a block's image packs them), and a planted fault (the record's offset zeroed) that must
 * not pass; EMU_FAULT=nf4_offset drops it in the kernel ---- */

static void check_nf4(void) {
  const int64_t n = 64 * 256 + 64 * 5;   /* a full group of scales and a partial one */
  const size_t rb = (size_t)nf4_bytes(n);
  float *x = h_uniform((size_t)n, -0.1f, 0.1f);
  uint8_t *rec = hbuf(rb + 1);   /* the record at rec + 1 */
  if (nf4_record_write(x, n, rec + 1) != 0) {
    verdict("nf4_dequantize: quantize", 0, "nf4_record_write failed");
    return;
  }
  uint16_t *hb = hbuf((size_t)n * sizeof(uint16_t));
  float *ref = hbuf((size_t)n * sizeof(float)), maps[16 + 256];
  nf4_record_dequantize_bf16(rec + 1, n, hb);
  for (int64_t i = 0; i < n; i++) ref[i] = bf16_to_f32(hb[i]);
  for (int i = 0; i < 16; i++) maps[i] = nf4_code[i];
  for (int i = 0; i < 256; i++) maps[16 + i] = nf4_dynamic(i);
  uint8_t *d_rec = d_upload(rec, rb + 1);
  float *d_maps = d_upload(maps, sizeof maps);
  void *d_out = d_nan_bf16((size_t)n);
  out_t o[] = {{.name = "out", .ref = ref, .dev = d_out, .n = (size_t)n, .kind = OUT_BF16, .tol = 0}};
  RUN_AND_COMPARE("nf4_dequantize", "1 group + 5 blocks, unaligned", 0, o,
                  ops_cuda_nf4_dequantize(d_out, d_rec + 1, d_maps, n, &g_ctx));
  memset(rec + 1 + rb - 4, 0, 4);   /* the offset, last in the record */
  uint8_t *d_bad = d_upload(rec, rb + 1);
  fsdp_status st = ops_cuda_nf4_dequantize(d_out, d_bad + 1, d_maps, n, &g_ctx);
  out_t of = {.name = "fault", .ref = ref, .dev = d_out, .n = (size_t)n, .kind = OUT_BF16};
  size_t diff = 0;
  if (st == FSDP_OK) {
    fetch_outputs(&of, 1);
    for (int64_t i = 0; i < n; i++) diff += of.got[i] != ref[i];
  }
  char detail[96];
  snprintf(detail, sizeof detail, "%zu of %lld values differ from the reference (must be > 0)", diff, (long long)n);
  verdict("planted fault: nf4_dequantize without the scales' offset", st == FSDP_OK && diff > 0, detail);
  free_all();
}

void check_util_ops(void) {
  printf("\n== AdamW and utilities ==\n");
  check_adamw();
  check_nf4();
  check_casts();
  check_reductions();
  fflush(stdout);
}

/* ---- bf16 GEMM rate ---- */

static void gemm_rate(int M, int K, int N, const char *label) {
  const size_t na = (size_t)M * K, nb = (size_t)K * N;
  /* random data (zeros run faster than real data on some GPUs); a 1M-element random block tiled */
  const size_t blk = 1u << 20;
  float *r = h_bf16_uniform(blk, -1, 1);
  float *ha = hbuf(na * sizeof(float));
  for (size_t i = 0; i < na; i++) ha[i] = r[(i * 7919) % blk];
  void *d_a = d_bf16(ha, na);
  for (size_t i = 0; i < nb && i < na; i++) ha[i] = r[(i * 104729 + 13) % blk];
  void *d_b = d_bf16(ha, nb <= na ? nb : na);
  void *d_c = dbuf((size_t)M * N * sizeof(uint16_t));
  fsdp_status st = FSDP_OK;
  for (int i = 0; i < 3 && st == FSDP_OK; i++) st = ops_cuda_matmul_forward(d_c, NULL, d_a, d_b, NULL, M, K, N, &g_ctx);
  const int iters = 20;
  CU(cudaEventRecord(g_ev0, g_ctx.stream));
  for (int i = 0; i < iters && st == FSDP_OK; i++)
    st = ops_cuda_matmul_forward(d_c, NULL, d_a, d_b, NULL, M, K, N, &g_ctx);
  CU(cudaEventRecord(g_ev1, g_ctx.stream));
  cudaError_t se = cudaEventSynchronize(g_ev1);
  char name[96];
  snprintf(name, sizeof name, "bf16 GEMM rate %s (M=%d K=%d N=%d)", label, M, K, N);
  if (st != FSDP_OK || se != cudaSuccess) {
    report_failure(name, "rate", st, se);
    free_all();
    return;
  }
  float ms = 0;
  CU(cudaEventElapsedTime(&ms, g_ev0, g_ev1));
  const double t = ms / 1e3 / iters, flops = 2.0 * M * (double)K * N;
  printf("%-60s %.3f ms per GEMM  %.1f TFLOP/s\n", name, t * 1e3, flops / t / 1e12);
  if (M == 8192 && K == 8192 && N == 8192) g_gemm_tflops = flops / t / 1e12;   /* the roofline's compute roof */
  free_all();
}

void measure_gemm_rate(void) {
  printf("\n== bf16 GEMM rate (cuBLASLt through ops_cuda_matmul_forward, random inputs, mean of 20 after 3 warm-up) ==\n");
  gemm_rate(8192, 8192, 8192, "8192^3");
  gemm_rate(16384, 768, 3072, "GPT-2 c_fc at B*T=16384");
  fflush(stdout);
}

/* Device-to-device copy of 1 GiB (read and write counted: 2 GiB moved), mean of 10 after 2: the
 * roofline's memory roof. */
void measure_copy_rate(void) {
  const size_t n = (size_t)1 << 30;
  void *a = dbuf(n), *b = dbuf(n);
  for (int i = 0; i < 2; i++) CU(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_ctx.stream));
  CU(cudaEventRecord(g_ev0, g_ctx.stream));
  for (int i = 0; i < 10; i++) CU(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_ctx.stream));
  CU(cudaEventRecord(g_ev1, g_ctx.stream));
  CU(cudaEventSynchronize(g_ev1));
  float ms = 0;
  CU(cudaEventElapsedTime(&ms, g_ev0, g_ev1));
  g_copy_gbs = 2.0 * (double)n * 10 / (ms / 1e3) / 1e9;
  printf("%-60s %.0f GB/s\n", "device copy rate, 1 GiB (read + write)", g_copy_gbs);
  free_all();
}
