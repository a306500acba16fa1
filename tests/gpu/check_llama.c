/* check_llama — gpu_check's checks of the Llama family's operators of worker/cuda/ops_cuda.h (the
 * encoder without positions (its backward skipping the pad row), linear with and without bias,
 * RMSNorm, Qwen3's q/k norms, rotary embeddings, SwiGLU, grouped-query attention, head_dim ≠ C / NH)
 * and Gemma 3's (the norms' 1 + w, GeGLU) against the CPU twins of
 * worker/ops/ops_cpu.h, on fresh random bf16 inputs. Tolerances: gpu_check.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "ops/bf16.h"
#include "ops_cpu.h"

/* A Llama shape: the common one plus the kv heads and the SwiGLU width. */
typedef struct llama_shape {
  shape s;
  int NKV, F;
  float theta;
} llama_shape;

/* tiny: head size 64, 4 query heads over 2 kv heads, T = 70 (ragged tiles), F = 88 (not a multiple
 * of 32); hs128: head size 128, 2 query heads sharing 1 kv head; 1b: Llama-3.2-1B's layer
 * (C = 2048, 32 heads over 8 kv heads, F = 8192, theta 500000) at B = 2, T = 1024. */
static const llama_shape kTinyL = {{"llama-tiny", 2, 70, 256, 4, 0, 0}, 2, 88, 10000.0f};
static const llama_shape kHs128L = {{"llama-hs128", 2, 70, 256, 2, 0, 0}, 1, 88, 10000.0f};
static const llama_shape k1bL = {{"llama-1b", 2, 1024, 2048, 32, 0, 1}, 8, 8192, 500000.0f};

/* ---- encoder without learned positions ---- */

static void check_encoder_nopos(const shape *s) {
  const int B = s->B, T = s->T, C = s->C, V = 37, BT = B * T;
  const size_t BTC = (size_t)BT * C, VC = (size_t)V * C;
  int *inp = hbuf((size_t)BT * sizeof(int));
  for (int i = 0; i < BT; i++) inp[i] = (int)(rng_next() % (uint64_t)V); /* V < BT: tokens repeat */
  float *wte = h_bf16_uniform(VC, -1, 1), *out = h_nan(BTC);
  int *d_inp = d_upload(inp, (size_t)BT * sizeof(int));
  void *d_wte = d_bf16(wte, VC), *d_out = d_nan_bf16(BTC);
  encoder_forward(out, inp, wte, NULL, B, T, C, NULL);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = BTC, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("encoder_forward(wpe NULL)", s->name, s->timed, fo,
                  ops_cuda_encoder_forward(d_out, d_inp, d_wte, NULL, B, T, C, NULL, &g_ctx));

  float *dout = h_bf16_uniform(BTC, -1, 1), *pre = h_uniform(VC, -1, 1), *dwte = h_copy(pre, VC);
  void *d_dout = d_bf16(dout, BTC);
  float *d_dwte = d_upload(pre, VC * sizeof(float));
  const int pad = inp[1];   /* a token of the batch as pad_token_id: its row keeps its value */
  encoder_backward(dwte, NULL, dout, inp, B, T, C, pad, NULL);
  out_t bo[] = {{.name = "dwte", .ref = dwte, .dev = d_dwte, .n = VC, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre}};
  RUN_AND_COMPARE("encoder_backward(dwpe NULL, pad row)", s->name, s->timed, bo,
                  ops_cuda_encoder_backward(d_dwte, NULL, d_dout, d_inp, B, T, C, pad, NULL, &g_ctx));
  free_all();
}

/* ---- linear (nn.Linear, weight [OC, C]) ---- */

static void check_linear(const shape *s, const char *label, int C, int OC, int want_dinp, int with_bias) {
  const int BT = s->B * s->T;
  const size_t nin = (size_t)BT * C, nout = (size_t)BT * OC, nw = (size_t)OC * C;
  const float a = sqrtf(3.0f / (float)C);
  float *inp = h_bf16_uniform(nin, -1, 1), *w = h_bf16_uniform(nw, -a, a), *out = h_nan(nout);
  float *bias = with_bias ? h_bf16_uniform((size_t)OC, -1, 1) : NULL;
  void *d_inp = d_bf16(inp, nin), *d_w = d_bf16(w, nw), *d_out = d_nan_bf16(nout);
  void *d_bias = with_bias ? d_bf16(bias, (size_t)OC) : NULL;
  char fname[96], bname[96];
  snprintf(fname, sizeof fname, "linear_forward(%s%s)", label, with_bias ? ", bias" : "");
  snprintf(bname, sizeof bname, "linear_backward(%s%s)", label, with_bias ? ", dbias" : "");
  linear_forward(out, inp, w, BT, C, OC);
  if (with_bias) bias_forward(out, bias, BT, OC);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = nout, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE(fname, s->name, s->timed, fo, ops_cuda_linear_forward(d_out, d_inp, d_w, d_bias, BT, C, OC, &g_ctx));

  float *dout = h_bf16_uniform(nout, -1, 1), *pre = h_uniform(nw, -1, 1), *dw = h_copy(pre, nw), *dinp = h_nan(nin);
  float *bpre = h_uniform((size_t)OC, -1, 1), *db = h_copy(bpre, (size_t)OC);
  void *d_dout = d_bf16(dout, nout), *d_dinp = want_dinp ? d_nan_bf16(nin) : NULL;
  float *d_dw = d_upload(pre, nw * sizeof(float));
  float *d_db = with_bias ? d_upload(bpre, (size_t)OC * sizeof(float)) : NULL;
  linear_backward(want_dinp ? dinp : NULL, dw, dout, inp, w, BT, C, OC);
  if (with_bias) bias_backward(db, dout, BT, OC);
  out_t bo[] = {{.name = "dweight", .ref = dw, .dev = d_dw, .n = nw, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre},
                {.name = "dinp", .ref = dinp, .dev = d_dinp, .n = nin, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "dbias", .ref = db, .dev = d_db, .n = (size_t)OC, .kind = OUT_F32, .tol = TOL_BF16,
                 .prefill = bpre}};
  if (want_dinp && with_bias) {
    RUN_AND_COMPARE(bname, s->name, s->timed, bo,
                    ops_cuda_linear_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, BT, C, OC, &g_ctx));
  } else if (want_dinp) {
    out_t bo2[] = {bo[0], bo[1]};
    RUN_AND_COMPARE(bname, s->name, s->timed, bo2,
                    ops_cuda_linear_backward(d_dinp, d_dw, NULL, d_dout, d_inp, d_w, BT, C, OC, &g_ctx));
  } else {
    out_t bo1[] = {bo[0]};
    RUN_AND_COMPARE(bname, s->name, s->timed, bo1,
                    ops_cuda_linear_backward(NULL, d_dw, NULL, d_dout, d_inp, d_w, BT, C, OC, &g_ctx));
  }
  free_all();
}

/* ---- Qwen3's q_norm / k_norm on the q and k heads of a qkv buffer (v copied) ---- */

/* WOFF 1: Gemma 3's q/k norms, which scale by 1 + w (weights around 0 then, as trained ones are). */
static void check_qk_norm(const shape *s, int NH, int NKV, int HD, int in_place, float woff) {
  const int BT = s->B * s->T, NQK = NH + NKV;
  const size_t n = (size_t)BT * (NH + 2 * NKV) * HD, nr = (size_t)BT * NQK;
  const float eps = 1e-6f;
  float *inp = h_uniform(n, -1, 1);
  for (size_t i = 0; i < n; i++) inp[i] = bf16_round(inp[i] * (float)(1 + i / HD % 5)); /* heads of different scales */
  float *wq = h_bf16_uniform((size_t)HD, 0.5f - woff, 4.0f - woff), *wk = h_bf16_uniform((size_t)HD, -2.0f, 2.0f);
  void *d_inp = d_bf16(inp, n), *d_wq = d_bf16(wq, (size_t)HD), *d_wk = d_bf16(wk, (size_t)HD);
  char fname[96], bname[96];
  snprintf(fname, sizeof fname, "qk_norm_forward(NH=%d, NKV=%d, HD=%d, woff=%g%s)", NH, NKV, HD, woff,
           in_place ? ", in place" : "");
  snprintf(bname, sizeof bname, "qk_norm_backward(NH=%d, NKV=%d, HD=%d, woff=%g%s)", NH, NKV, HD, woff,
           in_place ? ", in place" : "");

  float *out = h_nan(n), *rstd = h_nan(nr);
  void *d_out = in_place ? d_inp : d_nan_bf16(n), *d_rstd = d_nan_f32(nr);
  qk_norm_forward(out, rstd, inp, wq, wk, BT, NH, NKV, HD, eps, woff);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = n, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "rstd", .ref = rstd, .dev = d_rstd, .n = nr, .kind = OUT_F32, .tol = TOL_F32}};
  RUN_AND_COMPARE(fname, s->name, s->timed, fo,
                  ops_cuda_qk_norm_forward(d_out, d_rstd, d_inp, d_wq, d_wk, BT, NH, NKV, HD, eps, woff, &g_ctx));

  /* Backward from the CPU's rstd and the original input on both sides. */
  float *dout = h_bf16_uniform(n, -1, 1), *dinp = h_nan(n);
  float *pq = h_uniform((size_t)HD, -1, 1), *pk = h_uniform((size_t)HD, -1, 1);
  float *dwq = h_copy(pq, (size_t)HD), *dwk = h_copy(pk, (size_t)HD);
  void *d_x = d_bf16(inp, n), *d_dout = d_bf16(dout, n), *d_dinp = in_place ? d_dout : d_nan_bf16(n);
  float *d_rs = d_upload(rstd, nr * sizeof(float)), *d_dwq = d_upload(pq, (size_t)HD * sizeof(float));
  float *d_dwk = d_upload(pk, (size_t)HD * sizeof(float));
  qk_norm_backward(dinp, dwq, dwk, dout, inp, wq, wk, rstd, BT, NH, NKV, HD, woff);
  out_t bo[] = {{.name = "dinp", .ref = dinp, .dev = d_dinp, .n = n, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "dwq", .ref = dwq, .dev = d_dwq, .n = (size_t)HD, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pq},
                {.name = "dwk", .ref = dwk, .dev = d_dwk, .n = (size_t)HD, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pk}};
  RUN_AND_COMPARE(bname, s->name, s->timed, bo,
                  ops_cuda_qk_norm_backward(d_dinp, d_dwq, d_dwk, d_dout, d_x, d_wq, d_wk, d_rs, BT, NH, NKV, HD,
                                            woff, &g_ctx));
  free_all();
}

/* ---- RMSNorm ---- */

/* WOFF 0: Llama's scale w; 1: Gemma's 1 + w (weights around 0 then). */
static void check_rmsnorm(const shape *s, float eps, float woff) {
  const int BT = s->B * s->T, C = s->C;
  const size_t n = (size_t)BT * C;
  float *inp = h_uniform(n, -1, 1);
  for (size_t i = 0; i < n; i++) inp[i] = bf16_round(inp[i] * (float)(1 + i / C % 7)); /* rows of different scales */
  float *w = h_bf16_uniform((size_t)C, 0.5f - woff, 1.5f - woff);
  void *d_inp = d_bf16(inp, n), *d_w = d_bf16(w, (size_t)C);
  char fname[64], bname[64];
  snprintf(fname, sizeof fname, "rmsnorm_forward(eps=%g, woff=%g)", eps, woff);
  snprintf(bname, sizeof bname, "rmsnorm_backward(eps=%g, woff=%g)", eps, woff);

  float *out = h_nan(n), *rstd = h_nan((size_t)BT);
  void *d_out = d_nan_bf16(n), *d_rstd = d_nan_f32((size_t)BT);
  rmsnorm_forward(out, rstd, inp, w, BT, C, eps, woff);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = n, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "rstd", .ref = rstd, .dev = d_rstd, .n = (size_t)BT, .kind = OUT_F32, .tol = TOL_F32}};
  RUN_AND_COMPARE(fname, s->name, s->timed, fo,
                  ops_cuda_rmsnorm_forward(d_out, d_rstd, d_inp, d_w, BT, C, eps, woff, &g_ctx));

  /* Backward from the CPU's rstd on both sides, so that it is tested on its own. */
  float *dout = h_bf16_uniform(n, -1, 1), *pre = h_uniform((size_t)C, -1, 1), *dw = h_copy(pre, (size_t)C);
  float *dinp = h_nan(n);
  void *d_dout = d_bf16(dout, n), *d_dinp = d_nan_bf16(n);
  float *d_rstd_ref = d_upload(rstd, (size_t)BT * sizeof(float)), *d_dw = d_upload(pre, (size_t)C * sizeof(float));
  rmsnorm_backward(dinp, dw, dout, inp, w, rstd, BT, C, woff);
  out_t bo[] = {{.name = "dinp", .ref = dinp, .dev = d_dinp, .n = n, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "dweight", .ref = dw, .dev = d_dw, .n = (size_t)C, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre}};
  RUN_AND_COMPARE(bname, s->name, s->timed, bo,
                  ops_cuda_rmsnorm_backward(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd_ref, BT, C, woff, &g_ctx));

  /* Accumulated into the residual stream's gradient (nonzero): dres += dinp, compared by increments. */
  float *pre_res = h_bf16_uniform(n, -1, 1), *dres = hbuf(n * sizeof(float));
  for (size_t i = 0; i < n; i++) dres[i] = bf16_round(pre_res[i] + dinp[i]);
  void *d_dres = d_bf16(pre_res, n);
  float *d_dw2 = d_upload(pre, (size_t)C * sizeof(float));
  char aname[80];
  snprintf(aname, sizeof aname, "rmsnorm_backward_acc(eps=%g, woff=%g)", eps, woff);
  out_t ao[] = {{.name = "dres", .ref = dres, .dev = d_dres, .n = n, .kind = OUT_BF16, .tol = TOL_BF16, .prefill = pre_res},
                {.name = "dweight", .ref = dw, .dev = d_dw2, .n = (size_t)C, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre}};
  RUN_AND_COMPARE(aname, s->name, s->timed, ao,
                  ops_cuda_rmsnorm_backward_acc(d_dres, d_dw2, d_dout, d_inp, d_w, d_rstd_ref, BT, C, woff, &g_ctx));
  free_all();
}

/* ---- rotary embeddings (in place on a whole qkv buffer: v must come back unchanged) ---- */

/* SCALED: llama3's scaling with every band present at head size 64 and theta 10000 (wavelengths
 * 6.3 .. 4.6e4 against the edges 64/4 = 16 and 64/1 = 64), factor 8. */
static void check_rope(const llama_shape *l, int scaled) {
  const shape *s = &l->s;
  const int B = s->B, T = s->T, NH = s->NH, NKV = l->NKV, HS = s->C / NH;
  const size_t n = (size_t)B * T * (NH + 2 * NKV) * HS;
  const rope_freqs r = scaled ? rope_freqs_of(l->theta, 1, 8, 1, 4, 64) : rope_freqs_of(l->theta, 0, 0, 0, 0, 0);
  float *x = h_bf16_uniform(n, -2, 2), *y = h_copy(x, n);
  void *d_x = d_bf16(x, n);
  char fname[96], bname[96];
  const char *how = scaled ? ", llama3 8/1/4/64" : "";
  snprintf(fname, sizeof fname, "rope_forward(NKV=%d, theta=%g%s)", NKV, l->theta, how);
  snprintf(bname, sizeof bname, "rope_backward(NKV=%d, theta=%g%s)", NKV, l->theta, how);
  rope_forward(y, B, T, NH, NKV, HS, &r, NULL);
  out_t fo[] = {{.name = "qkv (in place)", .ref = y, .dev = d_x, .n = n, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE(fname, s->name, s->timed, fo, ops_cuda_rope_forward(d_x, B, T, NH, NKV, HS, &r, NULL, &g_ctx));

  float *dy = h_bf16_uniform(n, -1, 1), *dx = h_copy(dy, n);
  void *d_d = d_bf16(dy, n);
  rope_backward(dx, B, T, NH, NKV, HS, &r, NULL);
  out_t bo[] = {{.name = "dqkv (in place)", .ref = dx, .dev = d_d, .n = n, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE(bname, s->name, s->timed, bo, ops_cuda_rope_backward(d_d, B, T, NH, NKV, HS, &r, NULL, &g_ctx));
  free_all();
}

/* ---- SwiGLU ---- */

static void check_swiglu(const shape *s, int F) {
  const int BT = s->B * s->T;
  const size_t n = (size_t)BT * F;
  float *gu = h_bf16_uniform(2 * n, -6, 6), *out = h_nan(n);
  void *d_gu = d_bf16(gu, 2 * n), *d_out = d_nan_bf16(n);
  swiglu_forward(out, gu, BT, F);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = n, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("swiglu_forward", s->name, s->timed, fo, ops_cuda_swiglu_forward(d_out, d_gu, BT, F, &g_ctx));

  float *dout = h_bf16_uniform(n, -1, 1), *dgu = h_nan(2 * n);
  void *d_dout = d_bf16(dout, n), *d_dgu = d_nan_bf16(2 * n);
  swiglu_backward(dgu, gu, dout, BT, F);
  out_t bo[] = {{.name = "dgu", .ref = dgu, .dev = d_dgu, .n = 2 * n, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("swiglu_backward", s->name, s->timed, bo,
                  ops_cuda_swiglu_backward(d_dgu, d_gu, d_dout, BT, F, &g_ctx));
  free_all();
}

/* ---- GeGLU (Gemma's MLP) ---- */

static void check_geglu(const shape *s, int F) {
  const int BT = s->B * s->T;
  const size_t n = (size_t)BT * F;
  float *gu = h_bf16_uniform(2 * n, -6, 6), *out = h_nan(n);
  void *d_gu = d_bf16(gu, 2 * n), *d_out = d_nan_bf16(n);
  char fname[48], bname[48];
  snprintf(fname, sizeof fname, "geglu_forward(F=%d)", F);
  snprintf(bname, sizeof bname, "geglu_backward(F=%d)", F);
  geglu_forward(out, gu, BT, F);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = n, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE(fname, s->name, s->timed, fo, ops_cuda_geglu_forward(d_out, d_gu, BT, F, &g_ctx));

  float *dout = h_bf16_uniform(n, -1, 1), *dgu = h_nan(2 * n);
  void *d_dout = d_bf16(dout, n), *d_dgu = d_nan_bf16(2 * n);
  geglu_backward(dgu, gu, dout, BT, F);
  out_t bo[] = {{.name = "dgu", .ref = dgu, .dev = d_dgu, .n = 2 * n, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE(bname, s->name, s->timed, bo, ops_cuda_geglu_backward(d_dgu, d_gu, d_dout, BT, F, &g_ctx));
  free_all();
}

/* Gemma 3's operators beyond the Llama family's at the tiny shape: its norms scaled by 1 + w (the
 * row norm over C, the q/k head norms over head_dim 128), and GeGLU at F = 88 (element by element:
 * not a multiple of 8) and F = 96 (128-bit loads). */
static void check_gemma_shape(const llama_shape *l) {
  const shape *s = &l->s;
  printf("\n== Gemma 3 operators, shape %s: B=%d T=%d C=%d NH=%d NKV=%d F=%d ==\n", s->name, s->B, s->T, s->C, s->NH,
         l->NKV, l->F);
  check_rmsnorm(s, 1e-6f, 1.0f);
  check_qk_norm(s, s->NH, l->NKV, 128, 1, 1.0f);
  check_geglu(s, l->F);
  check_geglu(s, 96);
  fflush(stdout);
}

/* One Llama decoder layer's operators at shape L, in the order the model runs them. */
static void check_llama_shape(const llama_shape *l) {
  const shape *s = &l->s;
  const int C = s->C, HS = C / s->NH;
  printf("\n== Llama operators, shape %s: B=%d T=%d C=%d NH=%d NKV=%d F=%d ==\n", s->name, s->B, s->T, C, s->NH,
         l->NKV, l->F);
  check_encoder_nopos(s);
  check_rmsnorm(s, 1e-5f, 0.0f);
  check_linear(s, "q,k,v", C, C + 2 * l->NKV * HS, 1, 0);
  check_rope(l, 0);
  check_rope(l, 1);
  check_attention(s, l->NKV);
  check_linear(s, "o", C, C, 1, 0);
  check_linear(s, "gate,up", C, 2 * l->F, 1, 0);
  check_swiglu(s, l->F);
  check_linear(s, "down", l->F, C, 1, 0);
  if (!s->timed) {
    check_rmsnorm(s, 0.25f, 0.0f); /* an eps that matters */
    check_linear(s, "odd OC=37, no dinp", C, 37, 0, 0);
  }
  fflush(stdout);
}

/* The Llama family beyond Llama at the tiny shape (C = 256, 4 heads, 2 kv heads, T = 70) with
 * head_dim 128 ≠ C / NH = 64 (Qwen3's kind: q is 512 wide, o_proj [256, 512]): q/k/v with their
 * biases, q_norm / k_norm (apart and in place), rope and attention over head size 128 with the q
 * width 512, o_proj with its bias, and an odd-width bias (the epilogue's unvectorized case). */
static void check_family_shape(const llama_shape *l) {
  const shape *s = &l->s;
  const int C = s->C, NH = s->NH, NKV = l->NKV, HD = 128, QD = NH * HD;
  printf("\n== Llama family operators, shape %s: B=%d T=%d C=%d NH=%d NKV=%d head_dim=%d ==\n", s->name, s->B, s->T, C,
         NH, NKV, HD);
  check_linear(s, "q,k,v", C, QD + 2 * NKV * HD, 1, 1);
  check_qk_norm(s, NH, NKV, HD, 0, 0.0f);
  check_qk_norm(s, NH, NKV, HD, 1, 0.0f);
  llama_shape wide = *l;   /* the attention's and rope's view: q width NH·HD */
  wide.s.C = QD;
  check_rope(&wide, 0);
  check_attention(&wide.s, NKV);
  check_linear(s, "o", QD, C, 1, 1);
  check_linear(s, "gate,up", C, 2 * l->F, 1, 1);
  check_linear(s, "odd OC=37", C, 37, 1, 1);
  fflush(stdout);
}

/* RMSNorm's weight gradient over B·T = 1500 rows (six row slices folded by their last blocks), at
 * C = 64 (the 128-bit path) and C = 36 (element by element). */
static const shape kRowsL = {"llama-rows", 3, 500, 64, 1, 0, 0};
static const shape kRowsOddL = {"llama-rows-odd", 3, 500, 36, 1, 0, 0};

void check_llama_ops(int large) {
  check_llama_shape(&kTinyL);
  check_family_shape(&kTinyL);
  check_gemma_shape(&kTinyL);
  printf("\n== RMSNorm over many rows: B=%d T=%d, C=%d and C=%d ==\n", kRowsL.B, kRowsL.T, kRowsL.C, kRowsOddL.C);
  check_rmsnorm(&kRowsL, 1e-5f, 0.0f);
  check_rmsnorm(&kRowsOddL, 1e-5f, 0.0f);
  check_rmsnorm(&kRowsOddL, 1e-6f, 1.0f);
  const shape *h = &kHs128L.s;
  printf("\n== grouped-query attention, shape %s: B=%d T=%d C=%d NH=%d NKV=%d (head size %d) ==\n", h->name, h->B,
         h->T, h->C, h->NH, kHs128L.NKV, h->C / h->NH);
  check_attention(h, kHs128L.NKV);
  check_attention(&kTinyL.s, 1); /* every query head on one kv head */
  if (large) check_llama_shape(&k1bL);
}
