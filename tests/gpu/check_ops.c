/* check_ops — gpu_check's checks of GPT-2's operators of worker/cuda/ops_cuda.h (encoder, LayerNorm,
 * matmul with its epilogues, fused attention, GELU, residual, fused classifier) against the CPU
 * twins of worker/ops/ops_cpu.h, on fresh random bf16 inputs; check_llama.c has Llama's. Tolerances:
 * gpu_check.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "ops/bf16.h"
#include "ops/softmax.h"
#include "ops_cpu.h"
#include "plan.h"

/* tiny: ragged tiles everywhere (T = 70 is not a multiple of 64), head size 64; hs128: head size
 * 128 (32×32 tiles); long: attention over 9 key tiles, the last one ragged, with one head;
 * gpt2: GPT-2 small at T = 1024. */
static const shape kTiny = {"tiny", 2, 70, 128, 2, 37, 0};
static const shape kHs128 = {"hs128", 2, 100, 256, 2, 37, 0};
static const shape kLong = {"long", 1, 520, 64, 1, 37, 0};
static const shape kGpt2 = {"gpt2", 4, 1024, 768, 12, 50257, 1};
/* rows: B·T = 1500 rows, so every column sum has six row slices (folded by their last blocks) and
 * the embedding's token chains (V = 37) cross two link tiles; C = 64 takes the 128-bit paths,
 * rows-odd's C = 36 the element-by-element ones. */
static const shape kRows = {"rows", 3, 500, 64, 1, 37, 0};
static const shape kRowsOdd = {"rows-odd", 3, 500, 36, 1, 37, 0};

static int *h_tokens(size_t n, int V) {
  int *t = hbuf(n * sizeof(int));
  for (size_t i = 0; i < n; i++) t[i] = (int)(rng_next() % (uint64_t)V);
  return t;
}

/* ---- encoder ---- */

static void check_encoder(const shape *s) {
  const int B = s->B, T = s->T, C = s->C, V = s->V, BT = B * T;
  const size_t BTC = (size_t)BT * C, VC = (size_t)V * C, TC = (size_t)T * C;
  int *inp = h_tokens((size_t)BT, V);
  for (int i = 3; i < BT; i += 5) inp[i] = inp[0]; /* repeated tokens: their dwte rows accumulate */
  for (int i = 7; i < BT; i += 11) inp[i] = inp[1];
  float *wte = h_bf16_uniform(VC, -1, 1), *wpe = h_bf16_uniform(TC, -1, 1);
  int *d_inp = d_upload(inp, (size_t)BT * sizeof(int));
  void *d_wte = d_bf16(wte, VC), *d_wpe = d_bf16(wpe, TC);

  float *out = h_nan(BTC);
  void *d_out = d_nan_bf16(BTC);
  encoder_forward(out, inp, wte, wpe, B, T, C, NULL);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = BTC, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("encoder_forward", s->name, s->timed, fo,
                  ops_cuda_encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C, NULL, &g_ctx));

  float *dout = h_bf16_uniform(BTC, -1, 1);
  float *pre_wte = h_uniform(VC, -1, 1), *pre_wpe = h_uniform(TC, -1, 1); /* accumulated into: nonzero */
  float *dwte = h_copy(pre_wte, VC), *dwpe = h_copy(pre_wpe, TC);
  void *d_dout = d_bf16(dout, BTC);
  float *d_dwte = d_upload(pre_wte, VC * sizeof(float)), *d_dwpe = d_upload(pre_wpe, TC * sizeof(float));
  encoder_backward(dwte, dwpe, dout, inp, B, T, C, -1, NULL);
  out_t bo[] = {{.name = "dwte", .ref = dwte, .dev = d_dwte, .n = VC, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_wte},
                {.name = "dwpe", .ref = dwpe, .dev = d_dwpe, .n = TC, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_wpe}};
  RUN_AND_COMPARE("encoder_backward", s->name, s->timed, bo,
                  ops_cuda_encoder_backward(d_dwte, d_dwpe, d_dout, d_inp, B, T, C, -1, NULL, &g_ctx));
  /* dout read by dwpe and by the chains, dwpe and each distinct token's dwte row read and written,
   * the tokens and the links (next, has_prev) */
  const double rows = BT < V ? BT : V;
  roofline_add("encoder_backward", s->name, 4.0 * BTC + 8.0 * TC + 8.0 * rows * C + 16.0 * BT, 2.0 * BTC);
  free_all();
}

/* ---- LayerNorm ---- */

static void check_layernorm(const shape *s) {
  const int B = s->B, T = s->T, C = s->C, BT = B * T;
  const size_t n = (size_t)BT * C;
  float *inp = h_uniform(n, -1, 1);
  for (size_t i = 0; i < n; i++) inp[i] = bf16_round(inp[i] + 1.5f); /* a mean away from 0: the two-pass variance */
  float *w = h_bf16_uniform((size_t)C, 0.5f, 1.5f), *b = h_bf16_uniform((size_t)C, -0.5f, 0.5f);
  void *d_inp = d_bf16(inp, n), *d_w = d_bf16(w, (size_t)C), *d_b = d_bf16(b, (size_t)C);

  float *out = h_nan(n), *mean = h_nan((size_t)BT), *rstd = h_nan((size_t)BT);
  void *d_out = d_nan_bf16(n), *d_mean = d_nan_f32((size_t)BT), *d_rstd = d_nan_f32((size_t)BT);
  layernorm_forward(out, mean, rstd, inp, w, b, B, T, C);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = n, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "mean", .ref = mean, .dev = d_mean, .n = (size_t)BT, .kind = OUT_F32, .tol = TOL_F32},
                {.name = "rstd", .ref = rstd, .dev = d_rstd, .n = (size_t)BT, .kind = OUT_F32, .tol = TOL_F32}};
  RUN_AND_COMPARE("layernorm_forward", s->name, s->timed, fo,
                  ops_cuda_layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, B, T, C, &g_ctx));
  roofline_add("layernorm_forward", s->name, 4.0 * n + 8.0 * BT + 4.0 * C, 8.0 * n);

  /* Backward from the CPU's mean and rstd on both sides, so that it is tested on its own. */
  float *dout = h_bf16_uniform(n, -1, 1);
  float *pre_w = h_uniform((size_t)C, -1, 1), *pre_b = h_uniform((size_t)C, -1, 1);
  float *dinp = h_nan(n), *dw = h_copy(pre_w, (size_t)C), *db = h_copy(pre_b, (size_t)C);
  void *d_dout = d_bf16(dout, n), *d_dinp = d_nan_bf16(n);
  float *d_mean_ref = d_upload(mean, (size_t)BT * sizeof(float));
  float *d_rstd_ref = d_upload(rstd, (size_t)BT * sizeof(float));
  float *d_dw = d_upload(pre_w, (size_t)C * sizeof(float)), *d_db = d_upload(pre_b, (size_t)C * sizeof(float));
  layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, B, T, C);
  out_t bo[] = {{.name = "dinp", .ref = dinp, .dev = d_dinp, .n = n, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "dweight", .ref = dw, .dev = d_dw, .n = (size_t)C, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_w},
                {.name = "dbias", .ref = db, .dev = d_db, .n = (size_t)C, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_b}};
  RUN_AND_COMPARE("layernorm_backward", s->name, s->timed, bo,
                  ops_cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean_ref, d_rstd_ref, B, T, C,
                                              &g_ctx));
  roofline_add("layernorm_backward", s->name, 10.0 * n + 8.0 * BT, 16.0 * n);   /* dinp pass + dparams pass */

  /* Accumulated into the residual stream's gradient (nonzero): dres += dinp, compared by increments. */
  float *pre_res = h_bf16_uniform(n, -1, 1), *dres = hbuf(n * sizeof(float));
  for (size_t i = 0; i < n; i++) dres[i] = bf16_round(pre_res[i] + dinp[i]);
  void *d_dres = d_bf16(pre_res, n);
  float *d_dw2 = d_upload(pre_w, (size_t)C * sizeof(float)), *d_db2 = d_upload(pre_b, (size_t)C * sizeof(float));
  out_t ao[] = {{.name = "dres", .ref = dres, .dev = d_dres, .n = n, .kind = OUT_BF16, .tol = TOL_BF16, .prefill = pre_res},
                {.name = "dweight", .ref = dw, .dev = d_dw2, .n = (size_t)C, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_w},
                {.name = "dbias", .ref = db, .dev = d_db2, .n = (size_t)C, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_b}};
  RUN_AND_COMPARE("layernorm_backward_acc", s->name, s->timed, ao,
                  ops_cuda_layernorm_backward_acc(d_dres, d_dw2, d_db2, d_dout, d_inp, d_w, d_mean_ref, d_rstd_ref, B,
                                                  T, C, &g_ctx));
  roofline_add("layernorm_backward_acc", s->name, 12.0 * n + 8.0 * BT, 17.0 * n);   /* dres read and written */
  free_all();
}

/* The fused residual + LayerNorm against the CPU's residual_forward (rounded to bf16, as stored)
 * then layernorm_forward; res in place over a, as the model may. */
static void check_residual_layernorm(const shape *s) {
  const int B = s->B, T = s->T, C = s->C, BT = B * T;
  const size_t n = (size_t)BT * C;
  float *a = h_bf16_uniform(n, 0.5f, 2.5f), *b = h_bf16_uniform(n, -1, 1);
  float *w = h_bf16_uniform((size_t)C, 0.5f, 1.5f), *bias = h_bf16_uniform((size_t)C, -0.5f, 0.5f);
  void *d_a = d_bf16(a, n), *d_b = d_bf16(b, n), *d_w = d_bf16(w, (size_t)C), *d_bias = d_bf16(bias, (size_t)C);
  float *res = h_nan(n), *out = h_nan(n), *mean = h_nan((size_t)BT), *rstd = h_nan((size_t)BT);
  residual_forward(res, a, b, (int)n);
  for (size_t i = 0; i < n; i++) res[i] = bf16_round(res[i]);
  layernorm_forward(out, mean, rstd, res, w, bias, B, T, C);
  void *d_out = d_nan_bf16(n), *d_mean = d_nan_f32((size_t)BT), *d_rstd = d_nan_f32((size_t)BT);
  out_t fo[] = {{.name = "res", .ref = res, .dev = d_a, .n = n, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "out", .ref = out, .dev = d_out, .n = n, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "mean", .ref = mean, .dev = d_mean, .n = (size_t)BT, .kind = OUT_F32, .tol = TOL_F32},
                {.name = "rstd", .ref = rstd, .dev = d_rstd, .n = (size_t)BT, .kind = OUT_F32, .tol = TOL_F32}};
  RUN_AND_COMPARE("residual_layernorm_forward", s->name, s->timed, fo,
                  ops_cuda_residual_layernorm_forward(d_a, d_out, d_mean, d_rstd, d_a, d_b, d_w, d_bias, B, T, C,
                                                      &g_ctx));
  roofline_add("residual_layernorm_forward", s->name, 8.0 * n + 8.0 * BT, 9.0 * n);
  free_all();
}

/* ---- matmul ---- */

enum {
  MM_BIAS = 1,       /* forward with a bias; backward with dbias */
  MM_GELU = 2,       /* forward with the GELU epilogue (pre_gelu saved) */
  MM_DINP = 4,       /* backward wants dinp */
  MM_DGELU = 8,      /* backward applies gelu'(pre_gelu) to dinp (the previous layer's fused GELU) */
  MM_ALIAS = 16,     /* backward writes dinp over inp (the model's c_proj: its input is dead then) */
};

/* GEMMs run with an epilogue so far, and cuBLASLt heuristic queries: defined by the emulator
 * (tests/gpu/emu), absent on a GPU. */
long emu_lt_epilogue_runs(int epilogue) __attribute__((weak));
long emu_lt_heuristic_calls(void) __attribute__((weak));

static void check_matmul(const shape *s, const char *label, int C, int OC, int flags) {
  const int BT = s->B * s->T;
  const size_t nin = (size_t)BT * C, nout = (size_t)BT * OC, nw = (size_t)C * OC;
  const float a = sqrtf(3.0f / (float)C); /* pre-activations of order 1: GELU is nonlinear there */
  float *inp = h_bf16_uniform(nin, -1, 1), *w = h_bf16_uniform(nw, -a, a);
  float *bias = (flags & MM_BIAS) ? h_bf16_uniform((size_t)OC, -0.5f, 0.5f) : NULL;
  void *d_inp = d_bf16(inp, nin), *d_w = d_bf16(w, nw), *d_bias = bias ? d_bf16(bias, (size_t)OC) : NULL;
  char fname[96], bname[96];
  snprintf(fname, sizeof fname, "matmul_forward(%s)", label);
  snprintf(bname, sizeof bname, "matmul_backward(%s)", label);

  float *pre = h_nan(nout), *out = h_nan(nout);
  void *d_out = d_nan_bf16(nout), *d_pre = (flags & MM_GELU) ? d_nan_bf16(nout) : NULL;
  matmul_forward(pre, inp, w, bias, BT, C, OC);
  if (flags & MM_GELU) gelu_forward(out, pre, (int)nout);
  out_t fo[] = {{.name = "out", .ref = (flags & MM_GELU) ? out : pre, .dev = d_out, .n = nout, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "pre_gelu", .ref = pre, .dev = d_pre, .n = nout, .kind = OUT_BF16, .tol = TOL_BF16}};
  if (flags & MM_GELU) {
    RUN_AND_COMPARE(fname, s->name, s->timed, fo,
                    ops_cuda_matmul_forward(d_out, d_pre, d_inp, d_w, d_bias, BT, C, OC, &g_ctx));
  } else {
    out_t fo1[] = {fo[0]};
    RUN_AND_COMPARE(fname, s->name, s->timed, fo1,
                    ops_cuda_matmul_forward(d_out, NULL, d_inp, d_w, d_bias, BT, C, OC, &g_ctx));
  }
  roofline_add(fname, s->name, 2.0 * ((double)nin + nw + ((flags & MM_GELU) ? 2.0 : 1.0) * nout),
               2.0 * BT * (double)C * OC);
  if (emu_lt_heuristic_calls && check_selected(fname)) { /* the GEMM's plan is kept: a second call asks nothing */
    const long h0 = emu_lt_heuristic_calls();
    const fsdp_status st = ops_cuda_matmul_forward(d_out, (flags & MM_GELU) ? d_pre : NULL, d_inp, d_w, d_bias, BT, C,
                                                   OC, &g_ctx);
    CU(cudaStreamSynchronize(g_ctx.stream));
    char name[160], detail[96];
    snprintf(name, sizeof name, "%s[%s] plan kept", fname, s->name);
    snprintf(detail, sizeof detail, "status %d, %ld heuristic queries on the second call (0 expected)", (int)st,
             emu_lt_heuristic_calls() - h0);
    verdict(name, st == FSDP_OK && emu_lt_heuristic_calls() == h0, detail);
  }

  float *dout = h_bf16_uniform(nout, -1, 1);
  void *d_dout = d_bf16(dout, nout);
  float *pre_dw = h_uniform(nw, -1, 1), *dw = h_copy(pre_dw, nw), *d_dw = d_upload(pre_dw, nw * sizeof(float));
  float *pre_db = h_uniform((size_t)OC, -1, 1), *db = h_copy(pre_db, (size_t)OC);
  float *d_db = (flags & MM_BIAS) ? d_upload(pre_db, (size_t)OC * sizeof(float)) : NULL;
  float *dinp = h_nan(nin), *pg = NULL;
  void *d_dinp = (flags & MM_DINP) ? d_nan_bf16(nin) : NULL, *d_pg = NULL;
  matmul_backward((flags & MM_DINP) ? dinp : NULL, dw, (flags & MM_BIAS) ? db : NULL, dout, inp, w, BT, C, OC);
  if (flags & MM_DGELU) {
    pg = h_bf16_uniform(nin, -3, 3);
    d_pg = d_bf16(pg, nin);
    float *dx = h_nan(nin);
    gelu_backward(dx, pg, dinp, (int)nin);
    dinp = dx;
  }
  out_t bo[] = {{.name = "dweight", .ref = dw, .dev = d_dw, .n = nw, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_dw},
                {.name = "dbias", .ref = db, .dev = d_db, .n = (size_t)OC, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_db},
                {.name = "dinp", .ref = dinp, .dev = d_dinp, .n = nin, .kind = OUT_BF16, .tol = TOL_BF16}};
  const long dgelu_runs = emu_lt_epilogue_runs ? emu_lt_epilogue_runs(CUBLASLT_EPILOGUE_DGELU) : 0;
  if (flags & MM_ALIAS) { /* dinp over a copy of inp */
    CU(cudaMemcpy(d_dinp, d_inp, nin * sizeof(uint16_t), cudaMemcpyDeviceToDevice));
    RUN_AND_COMPARE(bname, s->name, 0, bo,
                    ops_cuda_matmul_backward(d_dinp, d_dw, d_db, d_dout, d_dinp, d_w, d_pg, BT, C, OC, &g_ctx));
  } else if ((flags & MM_BIAS) && (flags & MM_DINP)) {
    RUN_AND_COMPARE(bname, s->name, s->timed, bo,
                    ops_cuda_matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_pg, BT, C, OC, &g_ctx));
  } else if (flags & MM_DINP) {
    out_t bo2[] = {bo[0], bo[2]};
    RUN_AND_COMPARE(bname, s->name, s->timed, bo2,
                    ops_cuda_matmul_backward(d_dinp, d_dw, NULL, d_dout, d_inp, d_w, d_pg, BT, C, OC, &g_ctx));
  } else {
    out_t bo1[] = {bo[0]};
    RUN_AND_COMPARE(bname, s->name, s->timed, bo1,
                    ops_cuda_matmul_backward(NULL, d_dw, NULL, d_dout, d_inp, d_w, NULL, BT, C, OC, &g_ctx));
  }
  if (emu_lt_epilogue_runs && (flags & MM_DGELU)) { /* the fused path where cuBLASLt has it, else the fallback */
    /* EMU_LT_REFUSE_EPILOGUES (emu.cpp): cublasLtMatmul refuses the fused GEMM, the fallback runs */
    const long want = C % 8 == 0 && !getenv("EMU_LT_REFUSE_EPILOGUES") ? 1 : 0, got = emu_lt_epilogue_runs(CUBLASLT_EPILOGUE_DGELU) - dgelu_runs;
    char name[160], detail[96];
    snprintf(name, sizeof name, "%s[%s] DGELU epilogue %s", bname, s->name, want ? "used" : "refused: fallback");
    snprintf(detail, sizeof detail, "DGELU GEMMs: expected %ld, got %ld", want, got);
    verdict(name, got == want, detail);
  }
  /* dinp = dout·Wᵀ (reading pre_gelu in the DGELU epilogue) and dW += inpᵀ·dout (fp32 read and
   * written); dbias re-reads dout */
  roofline_add(bname, s->name, 2.0 * (2.0 * nout + ((flags & MM_DGELU) ? 3.0 : 2.0) * nin + nw) + 8.0 * nw,
               4.0 * BT * (double)C * OC);
  free_all();
}

/* ---- attention ---- */

/* After a call with cuDNN selected: whether cuDNN ran both directions; if not, says why (the
 * tensor cores ran instead). GPU_CHECK_ATTN_FALLBACK=1 (the stub-libcudnn test) requires that
 * fallback; GPU_CHECK_ATTN_FALLBACK=0 (a GPU node that has libcudnn) forbids it. */
static int attention_ran_cudnn(const char *shape, int NKV) {
  const int f = ops_cuda_attention_ran(0), b = ops_cuda_attention_ran(1);
  const int ran = f == OPS_ATTN_CUDNN && b == OPS_ATTN_CUDNN;
  char why[320], detail[400];
  ops_cuda_attention_note(why, sizeof why);
  snprintf(detail, sizeof detail, "[%s] NKV=%d: forward on %s, backward on %s%s%s", shape, NKV,
           f == OPS_ATTN_CUDNN ? "cuDNN" : "tensor cores", b == OPS_ATTN_CUDNN ? "cuDNN" : "tensor cores",
           ran ? "" : ": ", ran ? "" : why);
  const char *want = getenv("GPU_CHECK_ATTN_FALLBACK");
  if (want && *want) {
    const int fell = f == OPS_ATTN_TC && b == OPS_ATTN_TC && why[0];
    verdict("attention with cuDNN selected", atoi(want) ? fell : ran, detail);
  } else {
    printf("  attention with cuDNN selected %s\n", detail);
  }
  return ran;
}

/* NKV kv heads (NKV = NH: multi-head attention as GPT-2's; fewer: grouped-query, Llama's). */
void check_attention(const shape *s, int NKV) {
  const int B = s->B, T = s->T, C = s->C, NH = s->NH, hs = C / NH, C3 = C + 2 * NKV * hs;
  const size_t nqkv = (size_t)B * T * C3, natt = (size_t)B * NH * T * T, nout = (size_t)B * T * C;
  const size_t nlse = (size_t)B * NH * T;
  float *qkv = h_bf16_uniform(nqkv, -1.5f, 1.5f);
  void *d_qkv = d_bf16(qkv, nqkv);

  float *out = h_nan(nout), *att = h_nan(natt), *lse = h_nan(nlse);
  void *d_out = d_nan_bf16(nout), *d_lse = d_nan_f32(nlse);
  attention_forward(out, att, qkv, B, T, C, NH, NKV, NULL, 0);
  /* lse from the CPU's probabilities: at the row's largest probability p_j (≥ 1/T, so its log is
   * accurate), lse = s_j − log p_j with s_j = scale·q·k_j recomputed in double. */
  const float scale = attn_scale(hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *a = att + (((size_t)b * NH + h) * T + t) * T;
        int jm = 0;
        for (int j = 1; j <= t; j++)
          if (a[j] > a[jm]) jm = j;
        const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
        const float *k = qkv + ((size_t)b * T + jm) * C3 + C + (size_t)(h / (NH / NKV)) * hs;
        double dot = 0;
        for (int c = 0; c < hs; c++) dot += (double)q[c] * k[c];
        lse[((size_t)b * NH + h) * T + t] = (float)(dot * scale - log((double)a[jm]));
      }
  /* Backward from the GPU forward's own out and lse (what it saves), against the CPU's from its att. */
  float *dout = h_bf16_uniform(nout, -1, 1), *dqkv = h_nan(nqkv), *datt = h_nan(natt);
  void *d_dout = d_bf16(dout, nout), *d_dqkv = d_nan_bf16(nqkv);
  float *d_scratch = d_nan_f32(nlse * (size_t)(hs + 1)); /* plan_attention_scratch_floats */
  attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, NKV, NULL, 0);

  /* every implementation, then back to the process default. cuDNN first, so that its outputs are
   * kept and compared with the tensor cores' (the second opinion): each is within TOL_BF16 of the
   * fp32 reference, so by the triangle inequality the two are within 2·TOL_BF16 of each other. */
  const ops_attn_impl was = ops_cuda_attention_selected();
  static const ops_attn_impl impls[] = {OPS_ATTN_CUDNN, OPS_ATTN_TC, OPS_ATTN_FMA};
  static const char *const impl_names[] = {[OPS_ATTN_TC] = "tensor cores", [OPS_ATTN_FMA] = "fp32 FMA",
                                           [OPS_ATTN_CUDNN] = "cuDNN"};
  float *keep[3] = {NULL, NULL, NULL}; /* cuDNN's out, lse, dqkv, when cuDNN ran both */
  int tc_done = 0;                      /* cuDNN fell back: the tensor cores were checked then */
  for (int i = 0; i < 3; i++) {
    if (impls[i] == OPS_ATTN_TC && tc_done) continue;
    char fname[96], bname[96];
    snprintf(fname, sizeof fname, "attention_forward(%s, NKV=%d)", impl_names[impls[i]], NKV);
    snprintf(bname, sizeof bname, "attention_backward(%s, NKV=%d)", impl_names[impls[i]], NKV);
    ops_cuda_attention_select(impls[i]);
    CU(cudaMemset(d_out, 0xFF, nout * sizeof(uint16_t)));
    CU(cudaMemset(d_lse, 0xFF, nlse * sizeof(float)));
    CU(cudaMemset(d_dqkv, 0xFF, nqkv * sizeof(uint16_t)));
    out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = nout, .kind = OUT_BF16, .tol = TOL_BF16},
                  {.name = "lse", .ref = lse, .dev = d_lse, .n = nlse, .kind = OUT_F32, .tol = TOL_F32}};
    RUN_AND_COMPARE(fname, s->name, s->timed, fo,
                    ops_cuda_attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, NKV, NULL, 0, &g_ctx));
    const double f_ms = g_last_ms;
    out_t bo[] = {{.name = "dqkv", .ref = dqkv, .dev = d_dqkv, .n = nqkv, .kind = OUT_BF16, .tol = TOL_BF16}};
    RUN_AND_COMPARE(bname, s->name, s->timed, bo,
                    ops_cuda_attention_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, NKV, NULL, 0, &g_ctx));
    const double b_ms = g_last_ms;
    if (impls[i] == OPS_ATTN_CUDNN && !attention_ran_cudnn(s->name, NKV)) {
      tc_done = ops_cuda_attention_ran(0) == OPS_ATTN_TC && ops_cuda_attention_ran(1) == OPS_ATTN_TC;
      continue;
    }
    /* causal: half of the T×T scores, 2 GEMMs of hs each (4·hs FLOPs per score); backward: S and dP
     * recomputed, dV, dK and dQ: 5 GEMMs of hs per score (S twice: 7 as the tensor-core code does) */
    const double scores = (double)B * NH * T * (T + 1) / 2;
    g_last_ms = f_ms;
    roofline_add(fname, s->name, 2.0 * (nqkv + nout) + 4.0 * nlse, 4.0 * hs * scores);
    g_last_ms = b_ms;
    roofline_add(bname, s->name, 2.0 * (2.0 * nqkv + 2.0 * nout) + 4.0 * nlse, 10.0 * hs * scores);
    if (!fo[0].got || !fo[1].got || !bo[0].got) continue; /* a call failed (reported) */
    if (impls[i] == OPS_ATTN_CUDNN) {
      keep[0] = h_copy(fo[0].got, nout), keep[1] = h_copy(fo[1].got, nlse), keep[2] = h_copy(bo[0].got, nqkv);
    } else if (impls[i] == OPS_ATTN_TC && keep[0]) {
      out_t vs[] = {{.name = "out", .ref = keep[0], .n = nout, .tol = 2 * TOL_BF16, .got = fo[0].got},
                    {.name = "lse", .ref = keep[1], .n = nlse, .tol = 2 * TOL_F32, .got = fo[1].got},
                    {.name = "dqkv", .ref = keep[2], .n = nqkv, .tol = 2 * TOL_BF16, .got = bo[0].got}};
      for (int k = 0; k < 3; k++) compare("attention(cuDNN vs tensor cores)", s->name, &vs[k], -1.0);
    }
  }
  ops_cuda_attention_select(was);
  free_all();
}

/* ---- GELU, residual ---- */

static void check_elementwise(const shape *s) {
  const size_t N = (size_t)s->B * s->T * 4 * s->C; /* the MLP's hidden activations */
  float *x = h_bf16_uniform(N, -5, 5), *dout = h_bf16_uniform(N, -1, 1);
  void *d_x = d_bf16(x, N);
  float *out = h_nan(N);
  void *d_out = d_nan_bf16(N);
  gelu_forward(out, x, (int)N);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = N, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("gelu_forward", s->name, s->timed, fo, ops_cuda_gelu_forward(d_out, d_x, (int64_t)N, &g_ctx));
  roofline_add("gelu_forward", s->name, 4.0 * N, 15.0 * N);
  /* 2 bytes off a 16-byte boundary, N − 1 elements: the element-by-element path (VEC = false) */
  float *out1 = h_nan(N - 1);
  void *d_out1 = d_nan_bf16(N);
  gelu_forward(out1, x + 1, (int)(N - 1));
  out_t fo1[] = {{.name = "out", .ref = out1, .dev = (uint16_t *)d_out1 + 1, .n = N - 1, .kind = OUT_BF16,
                  .tol = TOL_BF16}};
  RUN_AND_COMPARE("gelu_forward(unaligned)", s->name, 0, fo1,
                  ops_cuda_gelu_forward((ops_bf16 *)d_out1 + 1, (const ops_bf16 *)d_x + 1, (int64_t)N - 1, &g_ctx));

  /* in place: dinp = dout (the form matmul_backward uses); not timed, since a second run would
   * apply gelu' twice to the same buffer (harmless, but the timing would say nothing new) */
  float *dinp = h_nan(N);
  void *d_buf = d_bf16(dout, N);
  gelu_backward(dinp, x, dout, (int)N);
  out_t bo[] = {{.name = "dinp (in place)", .ref = dinp, .dev = d_buf, .n = N, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("gelu_backward", s->name, 0, bo, ops_cuda_gelu_backward(d_buf, d_x, d_buf, (int64_t)N, &g_ctx));

  const size_t R = (size_t)s->B * s->T * s->C;
  float *res = h_nan(R);
  void *d_b = d_bf16(dout, R), *d_res = d_nan_bf16(R);
  residual_forward(res, x, dout, (int)R);
  out_t ro[] = {{.name = "out", .ref = res, .dev = d_res, .n = R, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("residual_forward", s->name, s->timed, ro,
                  ops_cuda_residual_forward(d_res, d_x, d_b, (int64_t)R, &g_ctx));
  roofline_add("residual_forward", s->name, 6.0 * R, (double)R);
  free_all();
}

/* ---- fused classifier ---- */

/* The row kernel alone: n rows of bf16 logits at row stride ld (ld = Vp: 128-bit path, its padding
 * must stay as it was; ld = V odd: the element-by-element path). Rows 1 and 2 are shifted by +1000
 * and −1000 (only the max-subtracted values matter), row 3 has one large logit. */
static void check_xent(const shape *s, int n, int ld) {
  const int V = s->V;
  const size_t N = (size_t)n * ld;
  const float dscale = 0.37f / (float)n;
  float *z = h_bf16_uniform(N, -8, 8), *ref = hbuf((size_t)n * V * sizeof(float)), *losses = h_nan((size_t)n);
  for (int r = 0; r < n; r++)
    for (int j = V; j < ld; j++) z[(size_t)r * ld + j] = 0.0f; /* padding: must stay 0 */
  for (int j = 0; n > 2 && j < V; j++) z[(size_t)ld + j] = bf16_round(1000.0f + z[(size_t)ld + j]);
  for (int j = 0; n > 2 && j < V; j++) z[(size_t)2 * ld + j] = bf16_round(z[(size_t)2 * ld + j] - 1000.0f);
  if (n > 3) z[(size_t)3 * ld + V / 2] = 60.0f;
  int *tgt = h_tokens((size_t)n, V);
  if (n > 3) tgt[3] = V / 2;
  if (n > 4) tgt[4] = XENT_NO_TARGET; /* an untrained token (masked data): loss 0, gradient 0 */
  if (n > 5) tgt[n - 1] = XENT_NO_TARGET;
  for (int r = 0; r < n; r++) memcpy(ref + (size_t)r * V, z + (size_t)r * ld, (size_t)V * sizeof(float));
  softmax_xent_forward_backward(ref, losses, tgt, n, V, dscale);
  float *want = hbuf(N * sizeof(float)); /* the gradient rows at stride ld, padding 0 */
  memcpy(want, z, N * sizeof(float));
  for (int r = 0; r < n; r++) memcpy(want + (size_t)r * ld, ref + (size_t)r * V, (size_t)V * sizeof(float));
  void *d_z = d_bf16(z, N);
  int *d_tgt = d_upload(tgt, (size_t)n * sizeof(int));
  float *d_losses = d_nan_f32((size_t)n);
  char shape_name[64];
  snprintf(shape_name, sizeof shape_name, "%s,n=%d,ld=%d", s->name, n, ld);
  out_t o[] = {{.name = "losses", .ref = losses, .dev = d_losses, .n = (size_t)n, .kind = OUT_F32, .tol = TOL_BF16},
               {.name = "dlogits", .ref = want, .dev = d_z, .n = N, .kind = OUT_BF16, .tol = TOL_BF16}};
  /* in place, so a second (timed) run would read gradients: time a copy of the logits instead */
  RUN_AND_COMPARE("classifier_xent", shape_name, 0, o,
                  ops_cuda_xent_inplace(d_z, d_losses, d_tgt, n, V, ld, dscale, &g_ctx));
  { /* the same bits again from the same logits: the row reductions go in a fixed order */
    void *d_z2 = d_bf16(z, N);
    float *d_losses2 = d_nan_f32((size_t)n);
    uint16_t *g1 = hbuf(N * 2), *g2 = hbuf(N * 2);
    float *l1 = hbuf((size_t)n * 4), *l2 = hbuf((size_t)n * 4);
    const fsdp_status st = ops_cuda_xent_inplace(d_z2, d_losses2, d_tgt, n, V, ld, dscale, &g_ctx);
    CU(cudaStreamSynchronize(g_ctx.stream));
    CU(cudaMemcpy(g1, d_z, N * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(g2, d_z2, N * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(l1, d_losses, (size_t)n * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(l2, d_losses2, (size_t)n * 4, cudaMemcpyDeviceToHost));
    char name[160];
    snprintf(name, sizeof name, "classifier_xent[%s] bitwise reproducible", shape_name);
    verdict(name, st == FSDP_OK && memcmp(g1, g2, N * 2) == 0 && memcmp(l1, l2, (size_t)n * 4) == 0, "");
  }
  if (s->timed) {
    void *d_t = d_bf16(z, N);
    float ms = 0;
    CU(cudaEventRecord(g_ev0, g_ctx.stream));
    fsdp_status st = ops_cuda_xent_inplace(d_t, d_losses, d_tgt, n, V, ld, dscale, &g_ctx);
    CU(cudaEventRecord(g_ev1, g_ctx.stream));
    CU(cudaEventSynchronize(g_ev1));
    CU(cudaEventElapsedTime(&ms, g_ev0, g_ev1));
    g_last_ms = st == FSDP_OK ? ms : -1;
    /* the row read once from memory (the second read hits L2) and written once, in bf16 */
    roofline_add("classifier_xent", shape_name, 4.0 * n * V + 8.0 * n, 10.0 * n * V);
  }
  free_all();
}

/* dwte and the targets' losses over STEPS micro-steps (dscale = 1/(steps·BT)): each micro-step's
 * chunks accumulate into the same dwte, as the runtime's do. */
static fsdp_status classifier_steps(float *losses, ops_bf16 *dinp, float *dwte, void *scratch, const ops_bf16 *inp,
                                    const ops_bf16 *wte, const int *tgt, int steps, int BT, int C, int V, int chunk,
                                    float dscale) {
  for (int k = 0; k < steps; k++)
    TRY(ops_cuda_classifier_forward_backward(losses + (size_t)k * BT, dinp ? dinp + (size_t)k * BT * C : NULL, dwte,
                                             scratch, inp + (size_t)k * BT * C, wte, tgt + (size_t)k * BT, BT, C, V,
                                             chunk, dscale, &g_ctx));
  return FSDP_OK;
}

static void check_classifier(const shape *s, int BT, int chunk, int steps) {
  const int C = s->C, V = s->V, Vp = (V + 127) / 128 * 128;
  const size_t nin = (size_t)steps * BT * C, nw = (size_t)V * C, nwp = (size_t)Vp * C, nl = (size_t)steps * BT;
  const float dscale = 1.0f / (float)(steps * BT);
  char shape_name[64];
  snprintf(shape_name, sizeof shape_name, "%s,BT=%d,chunk=%d%s", s->name, BT, chunk, steps > 1 ? ",2 steps" : "");
  float *inp = h_bf16_uniform(nin, -1, 1), *wte = h_bf16_uniform(nw, -0.1f, 0.1f);
  int *tgt = h_tokens(nl, V);
  for (size_t i = 1; i < nl; i += 3) tgt[i] = XENT_NO_TARGET; /* masked data: every third token untrained */
  const void *d_inp = d_bf16(inp, nin);
  /* wte padded to Vp rows of NaN: the padding must never be read */
  void *d_wte = d_nan_bf16(nwp), *d_wte_v = d_bf16(wte, nw);
  CU(cudaMemcpy(d_wte, d_wte_v, nw * sizeof(uint16_t), cudaMemcpyDeviceToDevice));
  int *d_tgt = d_upload(tgt, nl * sizeof(int));
  void *scratch = dbuf(ops_cuda_classifier_scratch_bytes(chunk, V, C));

  /* the CPU twin on logits rounded to bf16, as the GEMM writes them */
  float *logits = h_nan((size_t)BT * V), *losses = h_nan(nl), *dinp = h_nan(nin);
  float *pre_dwte = h_uniform(nw, -1, 1), *dwte = h_copy(pre_dwte, nw);
  for (int k = 0; k < steps; k++) {
    const float *x = inp + (size_t)k * BT * C;
    linear_forward(logits, x, wte, BT, C, V);   /* the head: wte [V, C] as the weight */
    for (size_t i = 0; i < (size_t)BT * V; i++) logits[i] = bf16_round(logits[i]);
    softmax_xent_forward_backward(logits, losses + (size_t)k * BT, tgt + (size_t)k * BT, BT, V, dscale);
    linear_backward(dinp + (size_t)k * BT * C, dwte, logits, x, wte, BT, C, V);
  }

  /* dwte padded to Vp rows of 7.0: they must stay 7.0 */
  float *pad = hbuf((nwp - nw) * sizeof(float));
  for (size_t i = 0; i < nwp - nw; i++) pad[i] = 7.0f;
  float *d_dwte = dbuf(nwp * sizeof(float));
  CU(cudaMemcpy(d_dwte, pre_dwte, nw * sizeof(float), cudaMemcpyHostToDevice));
  CU(cudaMemcpy(d_dwte + nw, pad, (nwp - nw) * sizeof(float), cudaMemcpyHostToDevice));
  float *d_losses = d_nan_f32(nl), *d_losses_fwd = d_nan_f32(nl);
  void *d_dinp = d_nan_bf16(nin);
  out_t o[] = {{.name = "losses", .ref = losses, .dev = d_losses, .n = nl, .kind = OUT_F32, .tol = TOL_BF16},
               {.name = "dinp", .ref = dinp, .dev = d_dinp, .n = nin, .kind = OUT_BF16, .tol = TOL_BF16},
               {.name = "dwte", .ref = dwte, .dev = d_dwte, .n = nw, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_dwte}};
  RUN_AND_COMPARE("classifier_forward_backward", shape_name, s->timed, o,
                  classifier_steps(d_losses, d_dinp, d_dwte, scratch, d_inp, d_wte, d_tgt, steps, BT, C, V, chunk,
                                   dscale));
  /* three GEMMs of 2·BT·V·C; the bf16 logits written, read and rewritten by the row kernel, read
   * by both backward GEMMs; per chunk, wte read by two GEMMs and dwte (fp32) read and written
   * once; inp read by two GEMMs, dinp written; with V not a multiple of 128, the head's padded copy
   * (read and written, bf16) and the padded dwte added into dwte (two fp32 reads, one write) */
  const double chunks = (double)((BT + chunk - 1) / chunk), padding = Vp != V ? (4.0 + 12.0) * nw : 0.0;
  roofline_add("classifier_forward_backward", shape_name,
               steps * (2.0 * BT * V * 5 + (4.0 + 8.0) * nw * chunks + 2.0 * 3 * BT * C + padding),
               steps * 6.0 * BT * (double)V * C);
  float *got_pad = hbuf((nwp - nw) * sizeof(float));
  CU(cudaMemcpy(got_pad, d_dwte + nw, (nwp - nw) * sizeof(float), cudaMemcpyDeviceToHost));
  char name[160];
  snprintf(name, sizeof name, "classifier_forward_backward[%s] dwte padding rows untouched", shape_name);
  verdict(name, memcmp(got_pad, pad, (nwp - nw) * sizeof(float)) == 0, "");

  out_t fo[] = {{.name = "losses (loss only)", .ref = losses, .dev = d_losses_fwd, .n = nl, .kind = OUT_F32, .tol = TOL_BF16}};
  RUN_AND_COMPARE("classifier_forward_backward", shape_name, 0, fo,
                  classifier_steps(d_losses_fwd, NULL, NULL, scratch, d_inp, d_wte, d_tgt, steps, BT, C, V, chunk,
                                   dscale));
  /* a frozen head ([lora]): dinp without dwte, the same losses and dinp */
  float *d_losses_fz = d_nan_f32(nl);
  void *d_dinp_fz = d_nan_bf16(nin);
  out_t zo[] = {{.name = "losses (frozen head)", .ref = losses, .dev = d_losses_fz, .n = nl, .kind = OUT_F32, .tol = TOL_BF16},
                {.name = "dinp (frozen head)", .ref = dinp, .dev = d_dinp_fz, .n = nin, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("classifier_forward_backward", shape_name, 0, zo,
                  classifier_steps(d_losses_fz, d_dinp_fz, NULL, scratch, d_inp, d_wte, d_tgt, steps, BT, C, V, chunk,
                                   dscale));
  free_all();
}

/* The device's classifier scratch (ops_cuda_classifier_scratch_bytes of plan_classifier_chunk
 * rows, with the padded head where V is not a multiple of 128) is exactly the planner's logits
 * slot (plan_logits_bytes), for GPT-2's, Llama 3's and odd vocabularies at several B·T. */
static void check_classifier_plan(void) {
  static const int64_t bt[] = {1, 12, 1024, 16384, 50000, 131072}, v[] = {16, 37, 50257, 128256};
  int ok = 1;
  char detail[160] = "";
  for (size_t i = 0; i < sizeof bt / sizeof *bt; i++)
    for (size_t j = 0; j < sizeof v / sizeof *v; j++) {
      const int64_t chunk = plan_classifier_chunk(bt[i], v[j]), plan = plan_logits_bytes(DEVICE_CUDA, bt[i], v[j], 768);
      const size_t dev = ops_cuda_classifier_scratch_bytes((int)chunk, (int)v[j], 768);
      if ((int64_t)dev != plan && ok) {
        ok = 0;
        snprintf(detail, sizeof detail, "BT=%lld V=%lld: device %zu bytes, plan %lld", (long long)bt[i],
                 (long long)v[j], dev, (long long)plan);
      }
    }
  verdict("classifier scratch = the planner's logits bytes", ok, detail);
}

static void check_shape(const shape *s) {
  printf("\n== operators, shape %s: B=%d T=%d C=%d NH=%d V=%d ==\n", s->name, s->B, s->T, s->C, s->NH, s->V);
  check_encoder(s);
  check_layernorm(s);
  check_residual_layernorm(s);
  if (s->timed) { /* GPT-2's c_attn, c_fc with its GELU, c_proj with the GELU's backward */
    check_matmul(s, "c_attn", s->C, 3 * s->C, MM_BIAS | MM_DINP);
    check_matmul(s, "c_fc+gelu", s->C, 4 * s->C, MM_BIAS | MM_GELU | MM_DINP);
    check_matmul(s, "c_proj+dgelu", 4 * s->C, s->C, MM_BIAS | MM_DINP | MM_DGELU);
  } else {
    check_matmul(s, "c_attn", s->C, 3 * s->C, MM_BIAS | MM_DINP);
    check_matmul(s, "gelu", s->C, 4 * s->C, MM_BIAS | MM_GELU | MM_DINP | MM_DGELU);
    check_matmul(s, "no bias, no dinp", s->C, 3 * s->C, 0);
    check_matmul(s, "no bias, gelu", s->C, 2 * s->C, MM_GELU | MM_DINP);
    check_matmul(s, "odd OC=37 gelu", s->C, 37, MM_BIAS | MM_GELU | MM_DINP);
    check_matmul(s, "odd OC=37", s->C, 37, MM_BIAS | MM_DINP);   /* no BIAS-epilogue algorithm: the bias kernel */
    check_matmul(s, "dinp over inp, dgelu", s->C, 2 * s->C, MM_BIAS | MM_DINP | MM_DGELU | MM_ALIAS);
    check_matmul(s, "odd C=37 dgelu", 37, 64, MM_BIAS | MM_DINP | MM_DGELU);   /* no DGELU algorithm: the kernel */
  }
  check_attention(s, s->NH);
  check_elementwise(s);
  if (s->timed) { /* the GPU: the planner's one chunk; then three chunks over two micro-steps */
    check_xent(s, s->B * s->T, (s->V + 127) / 128 * 128);
    check_classifier(s, 1024, (int)plan_classifier_chunk(1024, s->V), 1);
    check_classifier(s, 1024, 384, 2);
  } else {
    check_xent(s, 9, (s->V + 127) / 128 * 128);
    check_xent(s, 9, s->V);   /* an odd row stride: the element-by-element path */
    check_classifier(s, s->B * s->T, 64, 1);
    check_classifier(s, s->T, 32, 2);   /* three chunks (32, 32, 6) in each of two micro-steps */
    check_classifier_plan();
  }
  fflush(stdout);
}

/* The column sums (LayerNorm's dweight and dbias, the matmul's dbias over OC columns) and the
 * embedding's backward over many rows. */
static void check_rows(const shape *s, int OC) {
  printf("\n== column sums and embedding chains, shape %s: B=%d T=%d C=%d V=%d, dbias over %d columns ==\n", s->name,
         s->B, s->T, s->C, s->V, OC);
  check_encoder(s);
  check_layernorm(s);
  check_matmul(s, "dbias", s->C, OC, MM_BIAS | MM_DINP);
  fflush(stdout);
}

void check_model_ops(int large) {
  check_shape(&kTiny);
  check_rows(&kRows, 40);
  check_rows(&kRowsOdd, 37);
  printf("\n== attention, shape %s: B=%d T=%d C=%d NH=%d (head size %d) ==\n", kHs128.name, kHs128.B, kHs128.T,
         kHs128.C, kHs128.NH, kHs128.C / kHs128.NH);
  check_attention(&kHs128, kHs128.NH);
  printf("\n== attention, shape %s: B=%d T=%d C=%d NH=%d ==\n", kLong.name, kLong.B, kLong.T, kLong.C, kLong.NH);
  check_attention(&kLong, kLong.NH);
  if (large) check_shape(&kGpt2);
}
