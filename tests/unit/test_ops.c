/* test_ops — every GPT-2 operator of ops_cpu, and attention's grouped-query form (Llama's), against
 * references written here in double; Llama's other operators are in test_ops_llama.c.
 *
 * Forward: the float op against a naive double-precision forward on the same inputs.
 * Backward: the float op against central finite differences, in double, of the scalar objective
 * L = Σ w_i·out_i (fixed random w) through that double forward. Parameter gradients are pre-filled
 * with random values to check that backward ADDS (+=); activation gradients are pre-filled with NaN
 * to check that backward ASSIGNS (=) and never reads them.
 *
 * Tolerances. The references are exact to ~1e-15 relative; central differences in double with
 * h = 1e-5 on these smooth functions of O(1) inputs are exact to ~1e-9 (truncation ~h²·f''' ≈ 1e-10,
 * rounding ~1e-16·|L|/h ≈ 1e-10). What remains is float32 rounding in the op: eps = 6e-8 times sums
 * of at most ~100 O(1) terms gives ≲ 1e-5. So forwards use atol 1e-5 + rtol 1e-4 and gradients
 * atol 1e-4 + rtol 1e-3: ten times that margin, while a real bug (a lost term, a wrong index, a wrong
 * scale, = instead of +=) moves results by O(0.1–1).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "opcheck.h"
#include "ops_cpu.h"
#include "ops/exp.h"
#include "ops/softmax.h"

/* ---- encoder ---- */

typedef struct {
  int B, T, C;
  const int *inp;
  double *wte, *wpe, *w, *out;
} enc_ctx;

static double enc_objective(void *p) {
  enc_ctx *x = p;
  for (int bt = 0; bt < x->B * x->T; bt++)
    for (int c = 0; c < x->C; c++)
      x->out[bt * x->C + c] = x->wte[x->inp[bt] * x->C + c] + x->wpe[(bt % x->T) * x->C + c];
  return wdot(x->w, x->out, x->B * x->T * x->C);
}

static void test_encoder(void) {
  int B = 2, T = 7, C = 12, V = 5; /* V < B·T: tokens repeat, so dwte rows must sum */
  int inp[14];
  for (int i = 0; i < B * T; i++) inp[i] = (i * 3 + i / 4) % V;
  int N = B * T * C;
  float *wte = fnew(V * C), *wpe = fnew(T * C), *out = fnew(N), *dout = fnew(N);
  float *dwte = fnew(V * C), *dwpe = fnew(T * C);
  double *wte_d = dnew(V * C), *wpe_d = dnew(T * C), *w = dnew(N), *out_d = dnew(N);
  double *g_wte = dnew(V * C), *g_wpe = dnew(T * C);
  frand(wte, wte_d, V * C, 1.0);
  frand(wpe, wpe_d, T * C, 1.0);
  frand(dout, w, N, 1.0);
  enc_ctx x = {B, T, C, inp, wte_d, wpe_d, w, out_d};

  encoder_forward(out, inp, wte, wpe, B, T, C, NULL);
  enc_objective(&x);
  expect_close("encoder_forward out", out_d, out, N, FWD_ATOL, FWD_RTOL);

  double *pre_wte = dnew(V * C), *pre_wpe = dnew(T * C);
  frand(dwte, pre_wte, V * C, 1.0);
  frand(dwpe, pre_wpe, T * C, 1.0);
  encoder_backward(dwte, dwpe, dout, inp, B, T, C, -1, NULL);
  fd_grad(g_wte, wte_d, V * C, enc_objective, &x);
  fd_grad(g_wpe, wpe_d, T * C, enc_objective, &x);
  for (int i = 0; i < V * C; i++) g_wte[i] += pre_wte[i];
  for (int i = 0; i < T * C; i++) g_wpe[i] += pre_wpe[i];
  expect_close("encoder_backward dwte (+=)", g_wte, dwte, V * C, GRAD_ATOL, GRAD_RTOL);
  expect_close("encoder_backward dwpe (+=)", g_wpe, dwpe, T * C, GRAD_ATOL, GRAD_RTOL);

  free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
  free(wte_d), free(wpe_d), free(w), free(out_d), free(g_wte), free(g_wpe), free(pre_wte), free(pre_wpe);
}

/* ---- layernorm ---- */

typedef struct {
  int R, C;
  double *inp, *weight, *bias, *w, *out, *mean, *rstd;
} ln_ctx;

static double ln_objective(void *p) {
  ln_ctx *x = p;
  for (int r = 0; r < x->R; r++) {
    const double *v = x->inp + r * x->C;
    double m = 0, var = 0;
    for (int c = 0; c < x->C; c++) m += v[c];
    m /= x->C;
    for (int c = 0; c < x->C; c++) var += (v[c] - m) * (v[c] - m);
    var /= x->C;
    double rs = 1.0 / sqrt(var + 1e-5);
    for (int c = 0; c < x->C; c++) x->out[r * x->C + c] = (v[c] - m) * rs * x->weight[c] + x->bias[c];
    x->mean[r] = m;
    x->rstd[r] = rs;
  }
  return wdot(x->w, x->out, x->R * x->C);
}

static void test_layernorm(void) {
  int B = 2, T = 5, C = 16, R = B * T, N = R * C;
  float *inp = fnew(N), *weight = fnew(C), *bias = fnew(C), *out = fnew(N), *mean = fnew(R), *rstd = fnew(R);
  float *dout = fnew(N), *dinp = fnew(N), *dweight = fnew(C), *dbias = fnew(C);
  double *inp_d = dnew(N), *weight_d = dnew(C), *bias_d = dnew(C), *w = dnew(N), *out_d = dnew(N);
  double *mean_d = dnew(R), *rstd_d = dnew(R), *g = dnew(N), *pre_w = dnew(C), *pre_b = dnew(C);
  frand(inp, inp_d, N, 2.0);
  for (int i = 0; i < N; i++) inp_d[i] = inp[i] = inp[i] + (float)(i / C); /* rows with different means */
  frand(weight, weight_d, C, 1.0);
  frand(bias, bias_d, C, 1.0);
  frand(dout, w, N, 1.0);
  ln_ctx x = {R, C, inp_d, weight_d, bias_d, w, out_d, mean_d, rstd_d};

  layernorm_forward(out, mean, rstd, inp, weight, bias, B, T, C);
  ln_objective(&x);
  expect_close("layernorm_forward out", out_d, out, N, FWD_ATOL, FWD_RTOL);
  expect_close("layernorm_forward mean", mean_d, mean, R, FWD_ATOL, FWD_RTOL);
  expect_close("layernorm_forward rstd", rstd_d, rstd, R, FWD_ATOL, FWD_RTOL);

  ffill(dinp, N, NAN);
  frand(dweight, pre_w, C, 1.0);
  frand(dbias, pre_b, C, 1.0);
  layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C);
  fd_grad(g, inp_d, N, ln_objective, &x);
  expect_close("layernorm_backward dinp (=)", g, dinp, N, GRAD_ATOL, GRAD_RTOL);
  fd_grad(g, weight_d, C, ln_objective, &x);
  for (int i = 0; i < C; i++) g[i] += pre_w[i];
  expect_close("layernorm_backward dweight (+=)", g, dweight, C, GRAD_ATOL, GRAD_RTOL);
  fd_grad(g, bias_d, C, ln_objective, &x);
  for (int i = 0; i < C; i++) g[i] += pre_b[i];
  expect_close("layernorm_backward dbias (+=)", g, dbias, C, GRAD_ATOL, GRAD_RTOL);

  free(inp), free(weight), free(bias), free(out), free(mean), free(rstd), free(dout), free(dinp);
  free(dweight), free(dbias), free(inp_d), free(weight_d), free(bias_d), free(w), free(out_d);
  free(mean_d), free(rstd_d), free(g), free(pre_w), free(pre_b);
}

/* ---- matmul (Conv1D, weight [C, OC]) ---- */

typedef struct {
  int BT, C, OC;
  double *inp, *weight, *bias, *w, *out; /* bias NULL: none */
} mm_ctx;

static double mm_objective(void *p) {
  mm_ctx *x = p;
  for (int r = 0; r < x->BT; r++)
    for (int o = 0; o < x->OC; o++) {
      double s = x->bias ? x->bias[o] : 0.0;
      for (int c = 0; c < x->C; c++) s += x->inp[r * x->C + c] * x->weight[c * x->OC + o];
      x->out[r * x->OC + o] = s;
    }
  return wdot(x->w, x->out, x->BT * x->OC);
}

static void test_matmul(void) {
  int BT = 10, C = 16, OC = 12;
  float *inp = fnew(BT * C), *weight = fnew(C * OC), *bias = fnew(OC), *out = fnew(BT * OC);
  float *dout = fnew(BT * OC), *dinp = fnew(BT * C), *dweight = fnew(C * OC), *dbias = fnew(OC);
  double *inp_d = dnew(BT * C), *weight_d = dnew(C * OC), *bias_d = dnew(OC), *w = dnew(BT * OC);
  double *out_d = dnew(BT * OC), *g = dnew(C * OC + BT * C), *pre_w = dnew(C * OC), *pre_b = dnew(OC);
  frand(inp, inp_d, BT * C, 1.0);
  frand(weight, weight_d, C * OC, 1.0);
  frand(bias, bias_d, OC, 1.0);
  frand(dout, w, BT * OC, 1.0);
  mm_ctx x = {BT, C, OC, inp_d, weight_d, bias_d, w, out_d};

  matmul_forward(out, inp, weight, bias, BT, C, OC);
  mm_objective(&x);
  expect_close("matmul_forward out", out_d, out, BT * OC, FWD_ATOL, FWD_RTOL);
  x.bias = NULL;
  ffill(out, BT * OC, NAN);
  matmul_forward(out, inp, weight, NULL, BT, C, OC);
  mm_objective(&x);
  expect_close("matmul_forward out, bias NULL", out_d, out, BT * OC, FWD_ATOL, FWD_RTOL);
  x.bias = bias_d;

  ffill(dinp, BT * C, NAN);
  frand(dweight, pre_w, C * OC, 1.0);
  frand(dbias, pre_b, OC, 1.0);
  matmul_backward(dinp, dweight, dbias, dout, inp, weight, BT, C, OC);
  fd_grad(g, inp_d, BT * C, mm_objective, &x);
  expect_close("matmul_backward dinp (=)", g, dinp, BT * C, GRAD_ATOL, GRAD_RTOL);
  fd_grad(g, weight_d, C * OC, mm_objective, &x);
  for (int i = 0; i < C * OC; i++) g[i] += pre_w[i];
  expect_close("matmul_backward dweight (+=)", g, dweight, C * OC, GRAD_ATOL, GRAD_RTOL);
  fd_grad(g, bias_d, OC, mm_objective, &x);
  for (int i = 0; i < OC; i++) g[i] += pre_b[i];
  expect_close("matmul_backward dbias (+=)", g, dbias, OC, GRAD_ATOL, GRAD_RTOL);

  free(inp), free(weight), free(bias), free(out), free(dout), free(dinp), free(dweight), free(dbias);
  free(inp_d), free(weight_d), free(bias_d), free(w), free(out_d), free(g), free(pre_w), free(pre_b);
}

/* ---- attention ---- */

typedef struct {
  int B, T, C, NH, NKV; /* qkv rows C + 2·NKV·hs: q, then NKV k heads, then NKV v heads */
  double *qkv, *w, *out, *att;
} attn_ctx;

static double attn_objective(void *p) {
  attn_ctx *x = p;
  int B = x->B, T = x->T, C = x->C, NH = x->NH, hs = C / NH, C3 = C + 2 * x->NKV * hs;
  double scale = 1.0 / sqrt((double)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const double *q = x->qkv + (b * T + t) * C3 + h * hs;
        int g = h / (NH / x->NKV); /* the kv head query head h reads */
        double *a = x->att + ((b * NH + h) * T + t) * T;
        double mx = -INFINITY, sum = 0;
        for (int t2 = 0; t2 < T; t2++) {
          if (t2 > t) { /* causal: masked */
            a[t2] = 0;
            continue;
          }
          const double *k = x->qkv + (b * T + t2) * C3 + C + g * hs;
          double s = 0;
          for (int i = 0; i < hs; i++) s += q[i] * k[i];
          a[t2] = s * scale;
          if (a[t2] > mx) mx = a[t2];
        }
        for (int t2 = 0; t2 <= t; t2++) sum += (a[t2] = exp(a[t2] - mx));
        for (int t2 = 0; t2 <= t; t2++) a[t2] /= sum;
        for (int i = 0; i < hs; i++) {
          double o = 0;
          for (int t2 = 0; t2 <= t; t2++) o += a[t2] * x->qkv[(b * T + t2) * C3 + C + (x->NKV + g) * hs + i];
          x->out[(b * T + t) * C + h * hs + i] = o;
        }
      }
  return wdot(x->w, x->out, B * T * C);
}

static void test_attention(void) {
  int B = 2, T = 6, C = 16, NH = 2, N = B * T * C, NQ = 3 * N, NA = B * NH * T * T;
  float *qkv = fnew(NQ), *out = fnew(N), *att = fnew(NA), *dout = fnew(N), *dqkv = fnew(NQ), *datt = fnew(NA);
  double *qkv_d = dnew(NQ), *w = dnew(N), *out_d = dnew(N), *att_d = dnew(NA), *g = dnew(NQ);
  frand(qkv, qkv_d, NQ, 1.5);
  frand(dout, w, N, 1.0);
  attn_ctx x = {B, T, C, NH, NH, qkv_d, w, out_d, att_d};

  ffill(att, NA, NAN);
  attention_forward(out, att, qkv, B, T, C, NH, NH, NULL, 0);
  attn_objective(&x);
  expect_close("attention_forward out", out_d, out, N, FWD_ATOL, FWD_RTOL);
  expect_close("attention_forward att", att_d, att, NA, FWD_ATOL, FWD_RTOL);
  int above_zero = 1;
  for (int bh = 0; bh < B * NH; bh++)
    for (int t = 0; t < T; t++)
      for (int t2 = t + 1; t2 < T; t2++) above_zero &= att[(bh * T + t) * T + t2] == 0.0f;
  CHECK(above_zero);

  ffill(dqkv, NQ, NAN);
  ffill(datt, NA, NAN);
  attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, NH, NULL, 0);
  fd_grad(g, qkv_d, NQ, attn_objective, &x);
  expect_close("attention_backward dqkv (=)", g, dqkv, NQ, GRAD_ATOL, GRAD_RTOL);

  /* Causality: changing token 3's k and v (every head) leaves the outputs of tokens 0..2 bit for
   * bit unchanged, and does change token 3's. */
  int tf = 3;
  float *out2 = fnew(N), *att2 = fnew(NA);
  for (int b = 0; b < B; b++)
    for (int c = C; c < 3 * C; c++) qkv[(b * T + tf) * 3 * C + c] += 0.5f;
  attention_forward(out2, att2, qkv, B, T, C, NH, NH, NULL, 0);
  int past_same = 1, present_moved = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        int i = (b * T + t) * C + c;
        if (t < tf) past_same &= out[i] == out2[i];
        if (t == tf) present_moved |= out[i] != out2[i];
      }
  CHECK(past_same);
  CHECK(present_moved);

  /* A longer sequence, forward only: rows of 1..40 keys, more heads. */
  int T2 = 40, C2 = 24, NH2 = 3, N2 = B * T2 * C2, NQ2 = 3 * N2, NA2 = B * NH2 * T2 * T2;
  float *q2 = fnew(NQ2), *o2 = fnew(N2), *a2 = fnew(NA2);
  double *q2d = dnew(NQ2), *w2 = dnew(N2), *o2d = dnew(N2), *a2d = dnew(NA2);
  frand(q2, q2d, NQ2, 2.0);
  attn_ctx x2 = {B, T2, C2, NH2, NH2, q2d, w2, o2d, a2d};
  attention_forward(o2, a2, q2, B, T2, C2, NH2, NH2, NULL, 0);
  attn_objective(&x2);
  expect_close("attention_forward out, T=40", o2d, o2, N2, FWD_ATOL, FWD_RTOL);
  expect_close("attention_forward att, T=40", a2d, a2, NA2, FWD_ATOL, FWD_RTOL);

  free(qkv), free(out), free(att), free(dout), free(dqkv), free(datt), free(qkv_d), free(w), free(out_d);
  free(att_d), free(g), free(out2), free(att2), free(q2), free(o2), free(a2), free(q2d), free(w2), free(o2d);
  free(a2d);
}

/* T = 300 crosses ops_cpu's causal row blocks (256 rows), so the blocked products are checked at
 * and across a block edge: forward in full, backward by finite differences on a sample of
 * elements (all of q, k, v; tokens at both ends of both blocks and spread between). */
static void test_attention_long(void) {
  int B = 1, T = 300, C = 8, NH = 2, N = B * T * C, NQ = 3 * N, NA = B * NH * T * T;
  float *qkv = fnew(NQ), *out = fnew(N), *att = fnew(NA), *dout = fnew(N), *dqkv = fnew(NQ), *datt = fnew(NA);
  double *qkv_d = dnew(NQ), *w = dnew(N), *out_d = dnew(N), *att_d = dnew(NA);
  frand(qkv, qkv_d, NQ, 2.0);
  frand(dout, w, N, 1.0);
  attn_ctx x = {B, T, C, NH, NH, qkv_d, w, out_d, att_d};
  attention_forward(out, att, qkv, B, T, C, NH, NH, NULL, 0);
  attn_objective(&x);
  expect_close("attention_forward out, T=300", out_d, out, N, FWD_ATOL, FWD_RTOL);
  expect_close("attention_forward att, T=300", att_d, att, NA, FWD_ATOL, FWD_RTOL);
  ffill(dqkv, NQ, NAN);
  ffill(datt, NA, NAN);
  attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, NH, NULL, 0);
  int tokens[] = {0, 1, 2, 100, 254, 255, 256, 257, 280, 298, 299};
  int nt = (int)(sizeof tokens / sizeof tokens[0]), ns = nt * 3 * C;
  double *fd = dnew(ns), *g1 = dnew(1);
  float *got = fnew(ns);
  for (int k = 0; k < ns; k++) {
    int i = tokens[k / (3 * C)] * 3 * C + k % (3 * C); /* every column of q, k and v of the token */
    fd_grad(g1, qkv_d + i, 1, attn_objective, &x);
    fd[k] = g1[0];
    got[k] = dqkv[i];
  }
  expect_close("attention_backward dqkv (=), T=300 sample", fd, got, ns, GRAD_ATOL, GRAD_RTOL);
  int all_set = 1; /* every dqkv element written (the NaN fill is gone) */
  for (int i = 0; i < NQ; i++) all_set &= !isnan(dqkv[i]);
  CHECK(all_set);
  free(qkv), free(out), free(att), free(dout), free(dqkv), free(datt), free(qkv_d), free(w), free(out_d);
  free(att_d), free(fd), free(g1), free(got);
}

/* GQA as multi-head: FULL (BT, 3C) gets QKV's (BT, C + 2·NKV·HS) q heads and, for each query head
 * h, a copy of kv head h / (NH/NKV); KV_FOLD takes DFULL, the gradient of such a FULL, back to the
 * GQA layout in REF (assigned), each shared kv head's gradient the sum of its copies'. */
static void kv_expand(float *full, const float *qkv, int BT, int NH, int NKV, int hs) {
  int C = NH * hs, C3 = C + 2 * NKV * hs, rep = NH / NKV;
  for (int bt = 0; bt < BT; bt++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < hs; i++) {
        const float *r = qkv + (size_t)bt * C3;
        float *f = full + (size_t)bt * 3 * C;
        f[h * hs + i] = r[h * hs + i];
        f[C + h * hs + i] = r[C + h / rep * hs + i];
        f[2 * C + h * hs + i] = r[C + (NKV + h / rep) * hs + i];
      }
}

static void kv_fold(double *ref, const float *dfull, int BT, int NH, int NKV, int hs) {
  int C = NH * hs, C3 = C + 2 * NKV * hs, rep = NH / NKV;
  for (int i = 0; i < BT * C3; i++) ref[i] = 0.0;
  for (int bt = 0; bt < BT; bt++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < hs; i++) {
        const float *f = dfull + (size_t)bt * 3 * C;
        double *r = ref + (size_t)bt * C3;
        r[h * hs + i] = f[h * hs + i];
        r[C + h / rep * hs + i] += f[C + h * hs + i];
        r[C + (NKV + h / rep) * hs + i] += f[2 * C + h * hs + i];
      }
}

/* Grouped-query attention with NKV = NH/2, NH/4 and 1 kv heads: forward against the double
 * reference, backward against finite differences (a shared kv head's dk, dv sum over its query
 * heads), every dqkv element assigned. And it is multi-head attention (NKV = NH, the path GPT-2
 * takes and the tests above check) over a qkv whose kv heads are copied out to each query head of
 * their group: the same outputs, and each shared kv head's gradient the sum of its copies'. */
static void test_attention_gqa(void) {
  int B = 2, T = 7, NH = 8, hs = 4, C = NH * hs, N = B * T * C, NA = B * NH * T * T, NQf = 3 * N;
  int nkvs[] = {NH / 2, NH / 4, 1};
  for (int k = 0; k < 3; k++) {
    int NKV = nkvs[k], C3 = C + 2 * NKV * hs, NQ = B * T * C3;
    float *qkv = fnew(NQ), *out = fnew(N), *att = fnew(NA), *dout = fnew(N), *dqkv = fnew(NQ), *datt = fnew(NA);
    double *qkv_d = dnew(NQ), *w = dnew(N), *out_d = dnew(N), *att_d = dnew(NA), *g = dnew(NQ);
    frand(qkv, qkv_d, NQ, 1.5);
    frand(dout, w, N, 1.0);
    attn_ctx x = {B, T, C, NH, NKV, qkv_d, w, out_d, att_d};
    char what[96];

    attention_forward(out, att, qkv, B, T, C, NH, NKV, NULL, 0);
    attn_objective(&x);
    snprintf(what, sizeof what, "attention_forward out, NKV=%d of NH=%d", NKV, NH);
    expect_close(what, out_d, out, N, FWD_ATOL, FWD_RTOL);
    ffill(dqkv, NQ, NAN);
    ffill(datt, NA, NAN);
    attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, NKV, NULL, 0);
    fd_grad(g, qkv_d, NQ, attn_objective, &x);
    snprintf(what, sizeof what, "attention_backward dqkv (=), NKV=%d of NH=%d", NKV, NH);
    expect_close(what, g, dqkv, NQ, GRAD_ATOL, GRAD_RTOL);

    /* The copies: head h of the (B,T,3C) buffer holds q_h and kv head h / rep. */
    float *full = fnew(NQf), *outf = fnew(N), *attf = fnew(NA), *dfull = fnew(NQf);
    kv_expand(full, qkv, B * T, NH, NKV, hs);
    attention_forward(outf, attf, full, B, T, C, NH, NH, NULL, 0);
    attention_backward(dfull, datt, dout, full, attf, B, T, C, NH, NH, NULL, 0);
    double *ref = dnew(NQ);
    for (int i = 0; i < N; i++) ref[i] = outf[i];
    snprintf(what, sizeof what, "attention_forward NKV=%d = multi-head on copied kv heads", NKV);
    expect_close(what, ref, out, N, FWD_ATOL, FWD_RTOL);
    kv_fold(ref, dfull, B * T, NH, NKV, hs);
    snprintf(what, sizeof what, "attention_backward NKV=%d = multi-head, kv gradients summed", NKV);
    expect_close(what, ref, dqkv, NQ, FWD_ATOL, FWD_RTOL);

    free(qkv), free(out), free(att), free(dout), free(dqkv), free(datt), free(qkv_d), free(w), free(out_d);
    free(att_d), free(g), free(full), free(outf), free(attf), free(dfull), free(ref);
  }
}

/* Grouped-query attention over more than one row block (T > ATT_BLOCK = 256 in ops_cpu.c): the
 * first query head of a group assigns each block's dk, dv rows and the others add to them, so with
 * dqkv NaN beforehand every element must come out as multi-head attention's on copied kv heads,
 * the kv gradients summed over the group. */
static void test_attention_gqa_blocks(void) {
  const int B = 1, T = 300, NH = 4, hs = 2, C = NH * hs, N = B * T * C, NA = B * NH * T * T;
  for (int NKV = 1; NKV <= 2; NKV++) {
    int C3 = C + 2 * NKV * hs, NQ = B * T * C3;
    float *qkv = fnew(NQ), *out = fnew(N), *att = fnew(NA), *dout = fnew(N), *dqkv = fnew(NQ), *datt = fnew(NA);
    float *full = fnew(3 * N), *outf = fnew(N), *attf = fnew(NA), *dfull = fnew(3 * N);
    double *qd = dnew(NQ), *wd = dnew(N), *ref = dnew(NQ);
    frand(qkv, qd, NQ, 1.5);
    frand(dout, wd, N, 1.0);
    kv_expand(full, qkv, B * T, NH, NKV, hs);
    attention_forward(out, att, qkv, B, T, C, NH, NKV, NULL, 0);
    ffill(dqkv, NQ, NAN);
    ffill(datt, NA, NAN);
    attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, NKV, NULL, 0);
    attention_forward(outf, attf, full, B, T, C, NH, NH, NULL, 0);
    ffill(datt, NA, NAN);
    attention_backward(dfull, datt, dout, full, attf, B, T, C, NH, NH, NULL, 0);
    kv_fold(ref, dfull, B * T, NH, NKV, hs);
    char what[96];
    snprintf(what, sizeof what, "attention_backward T=%d (2 row blocks) NKV=%d of NH=%d = multi-head, kv summed", T,
             NKV, NH);
    expect_close(what, ref, dqkv, NQ, FWD_ATOL, FWD_RTOL);
    free(qkv), free(out), free(att), free(dout), free(dqkv), free(datt), free(full), free(outf), free(attf);
    free(dfull), free(qd), free(wd), free(ref);
  }
}

/* ---- GELU, residual ---- */

typedef struct {
  int N;
  double *inp, *w;
} gelu_ctx;

static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

static double gelu_objective(void *p) {
  gelu_ctx *x = p;
  double s = 0;
  for (int i = 0; i < x->N; i++) s += x->w[i] * gelu_ref(x->inp[i]);
  return s;
}

static void test_gelu_residual(void) {
  int N = 64;
  float *inp = fnew(N), *out = fnew(N), *dout = fnew(N), *dinp = fnew(N);
  double *inp_d = dnew(N), *w = dnew(N), *ref = dnew(N), *g = dnew(N);
  frand(inp, inp_d, N, 4.0);
  float tails[] = {-20.0f, -8.0f, 8.0f, 20.0f, 0.0f}; /* saturated tanh both ways, and 0 */
  for (int i = 0; i < 5; i++) inp_d[i] = inp[i] = tails[i];
  frand(dout, w, N, 1.0);
  gelu_ctx x = {N, inp_d, w};

  gelu_forward(out, inp, N);
  for (int i = 0; i < N; i++) ref[i] = gelu_ref(inp_d[i]);
  expect_close("gelu_forward out", ref, out, N, FWD_ATOL, FWD_RTOL);
  ffill(dinp, N, NAN);
  gelu_backward(dinp, inp, dout, N);
  fd_grad(g, inp_d, N, gelu_objective, &x);
  expect_close("gelu_backward dinp (=)", g, dinp, N, GRAD_ATOL, GRAD_RTOL);

  /* residual: a float add is exact to the rounding of the sum, so compare bit for bit. */
  float *a = fnew(N), *b = fnew(N);
  frand(a, NULL, N, 3.0);
  frand(b, NULL, N, 3.0);
  residual_forward(out, a, b, N);
  int same = 1;
  for (int i = 0; i < N; i++) same &= out[i] == a[i] + b[i];
  CHECK(same);

  free(inp), free(out), free(dout), free(dinp), free(inp_d), free(w), free(ref), free(g), free(a), free(b);
}

/* ---- classifier (tied head, wte [V, C]) ---- */

typedef struct {
  int BT, C, V;
  double *inp, *wte, *w, *out;
} cls_ctx;

static double cls_objective(void *p) {
  cls_ctx *x = p;
  for (int r = 0; r < x->BT; r++)
    for (int v = 0; v < x->V; v++) {
      double s = 0;
      for (int c = 0; c < x->C; c++) s += x->inp[r * x->C + c] * x->wte[v * x->C + c];
      x->out[r * x->V + v] = s;
    }
  return wdot(x->w, x->out, x->BT * x->V);
}

static void test_classifier(void) {
  int BT = 8, C = 16, V = 11;
  float *inp = fnew(BT * C), *wte = fnew(V * C), *logits = fnew(BT * V), *dlogits = fnew(BT * V);
  float *dinp = fnew(BT * C), *dwte = fnew(V * C);
  double *inp_d = dnew(BT * C), *wte_d = dnew(V * C), *w = dnew(BT * V), *out_d = dnew(BT * V);
  double *g = dnew(V * C + BT * C), *pre = dnew(V * C);
  frand(inp, inp_d, BT * C, 1.0);
  frand(wte, wte_d, V * C, 1.0);
  frand(dlogits, w, BT * V, 1.0);
  cls_ctx x = {BT, C, V, inp_d, wte_d, w, out_d};

  linear_forward(logits, inp, wte, BT, C, V);   /* the head: wte [V, C] as the weight */
  cls_objective(&x);
  expect_close("head linear_forward logits", out_d, logits, BT * V, FWD_ATOL, FWD_RTOL);
  ffill(dinp, BT * C, NAN);
  frand(dwte, pre, V * C, 1.0);
  linear_backward(dinp, dwte, dlogits, inp, wte, BT, C, V);
  fd_grad(g, inp_d, BT * C, cls_objective, &x);
  expect_close("head linear_backward dinp (=)", g, dinp, BT * C, GRAD_ATOL, GRAD_RTOL);
  fd_grad(g, wte_d, V * C, cls_objective, &x);
  for (int i = 0; i < V * C; i++) g[i] += pre[i];
  expect_close("head linear_backward dwte (+=)", g, dwte, V * C, GRAD_ATOL, GRAD_RTOL);

  free(inp), free(wte), free(logits), free(dlogits), free(dinp), free(dwte);
  free(inp_d), free(wte_d), free(w), free(out_d), free(g), free(pre);
}

/* ---- fused softmax + cross-entropy ---- */

typedef struct {
  int BT, V;
  const int *targets;
  double *logits, *losses, dscale;
} xent_ctx;

/* dscale·Σ losses, losses by log-sum-exp in double */
static double xent_objective(void *p) {
  xent_ctx *x = p;
  double total = 0;
  for (int r = 0; r < x->BT; r++) {
    const double *z = x->logits + r * x->V;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < x->V; j++) mx = z[j] > mx ? z[j] : mx;
    for (int j = 0; j < x->V; j++) s += exp(z[j] - mx);
    x->losses[r] = log(s) + mx - z[x->targets[r]];
    total += x->losses[r];
  }
  return x->dscale * total;
}

static void test_softmax_xent(void) {
  int BT = 8, V = 11, N = BT * V;
  int targets[8] = {0, 10, 3, 3, 7, 1, 5, 9};
  float dscale = 0.25f;
  float *logits = fnew(N), *losses = fnew(BT);
  double *logits_d = dnew(N), *losses_d = dnew(BT), *g = dnew(N);
  frand(logits, logits_d, N, 4.0);
  /* Row 1 far from 0 (a naive exp overflows at 89); row 2 peaked on its target. */
  for (int j = 0; j < V; j++) logits_d[V + j] = logits[V + j] = 1000.0f + logits[V + j];
  logits_d[2 * V + 3] = logits[2 * V + 3] = 30.0f;
  xent_ctx x = {BT, V, targets, logits_d, losses_d, dscale};

  double got = softmax_xent_forward_backward(logits, losses, targets, BT, V, dscale);
  double want = xent_objective(&x) / dscale;
  expect_close("softmax_xent losses", losses_d, losses, BT, FWD_ATOL, FWD_RTOL);
  CHECK_NEAR(want, got, FWD_ATOL, FWD_RTOL);
  fd_grad(g, logits_d, N, xent_objective, &x);
  expect_close("softmax_xent dlogits", g, logits, N, GRAD_ATOL, GRAD_RTOL);
  /* Each row of dlogits sums to 0 (softmax sums to 1, minus the one-hot). */
  double worst = 0;
  for (int r = 0; r < BT; r++) {
    double s = 0;
    for (int j = 0; j < V; j++) s += logits[r * V + j];
    worst = fabs(s) > worst ? fabs(s) : worst;
  }
  CHECK_NEAR(0.0, worst, 1e-6, 0);

  /* A target outside [0, V) (a caller bug) gives a NaN loss, and dscale·softmax as gradient. */
  float row[11], lo[1];
  double p_ref[11], zsum = 0;
  for (int j = 0; j < V; j++) zsum += exp((double)(row[j] = (float)j * 0.3f));
  for (int j = 0; j < V; j++) p_ref[j] = dscale * exp((double)row[j]) / zsum;
  int bad = V;
  CHECK(isnan(softmax_xent_forward_backward(row, lo, &bad, 1, V, dscale)));
  CHECK(isnan(lo[0]));
  expect_close("softmax_xent dlogits, invalid target", p_ref, row, V, FWD_ATOL, FWD_RTOL);

  /* An untrained token (target −1, masked data): loss 0 and no gradient, beside a trained row whose
   * loss and gradient stay as they are alone. */
  float two[22], two_lo[2], one[11], one_lo[1];
  for (int j = 0; j < V; j++) two[j] = one[j] = two[V + j] = (float)j * 0.3f;
  int tg[2] = {XENT_NO_TARGET, 4}, t1 = 4;
  double both = softmax_xent_forward_backward(two, two_lo, tg, 2, V, dscale);
  double alone = softmax_xent_forward_backward(one, one_lo, &t1, 1, V, dscale);
  CHECK(two_lo[0] == 0.0f && both == alone);
  double zero[11] = {0}, one_d[11];
  for (int j = 0; j < V; j++) one_d[j] = one[j];
  expect_close("softmax_xent dlogits, untrained row", zero, two, V, 0, 0);
  expect_close("softmax_xent dlogits, the trained row beside it", one_d, two + V, V, 0, 0);

  free(logits), free(losses), free(logits_d), free(losses_d), free(g);
}

/* ---- the shared scalar math (ops/exp.h) over its whole range ---- */

static void test_expf(void) {
  /* ≤ 2 ulp promised; 4 ulp (4.8e-7 relative) checked, on a dense sweep of the clamped range. */
  double worst = 0;
  float worst_x = 0;
  for (int i = 0; i < 175000; i++) { /* x in [-87, 88) */
    float x = -87.0f + 0.001f * (float)i;
    double rel = fabs((double)ops_expf(x) - exp((double)x)) / exp((double)x);
    if (rel > worst) worst = rel, worst_x = x;
  }
  printf("ops_expf: worst relative error %.3g at x = %g\n", worst, worst_x);
  CHECK_NEAR(0.0, worst, 4.8e-7, 0);
  /* Clamped ends: finite and normal, never inf, 0 or a denormal; NaN propagates. */
  CHECK(ops_expf(-1000.0f) > 0.0f && ops_expf(-1000.0f) <= 1.7e-38f && isnormal(ops_expf(-1000.0f)));
  CHECK(ops_expf(-INFINITY) > 0.0f && isnormal(ops_expf(-INFINITY)));
  CHECK(isfinite(ops_expf(1000.0f)) && ops_expf(1000.0f) > 1e38f);
  CHECK(isfinite(ops_expf(INFINITY)));
  CHECK(isnan(ops_expf(NAN)));
  CHECK_EQ_INT(1, ops_expf(0.0f) == 1.0f);
  /* GELU through it, against tanh in double, on a dense sweep (including the saturated tails). */
  int n = 40001;
  float *x = fnew(n), *y = fnew(n), *dy = fnew(n), *ones = fnew(n);
  double *ref = dnew(n), *dref = dnew(n);
  for (int i = 0; i < n; i++) {
    x[i] = -20.0f + 0.001f * (float)i;
    ones[i] = 1.0f;
    double xd = x[i], u = sqrt(2.0 / M_PI) * (xd + 0.044715 * xd * xd * xd), th = tanh(u);
    ref[i] = gelu_ref(xd);
    dref[i] = 0.5 * (1 + th) + 0.5 * xd * (1 - th * th) * sqrt(2.0 / M_PI) * (1 + 3 * 0.044715 * xd * xd);
  }
  gelu_forward(y, x, n);
  gelu_backward(dy, x, ones, n);
  expect_close("gelu_forward sweep", ref, y, n, 1e-6, 1e-5);
  expect_close("gelu_backward sweep (analytic derivative)", dref, dy, n, 1e-6, 1e-5);
  free(x), free(y), free(dy), free(ones), free(ref), free(dref);
}

/* ---- determinism: gradient reductions do not depend on the thread count ---- */

static void test_thread_independence(void) {
  int B = 2, T = 33, C = 80, NH = 4, V = 7, N = B * T * C, NQ = 3 * N, NA = B * NH * T * T;
  int *inp = calloc((size_t)B * T, sizeof(int));
  for (int i = 0; i < B * T; i++) inp[i] = (i * 5) % V;
  float *qkv = fnew(NQ), *att = fnew(NA), *out = fnew(N), *dout = fnew(N), *datt = fnew(NA);
  float *dq[2] = {fnew(NQ), fnew(NQ)}, *dwte[2] = {fnew(V * C), fnew(V * C)}, *dwpe[2] = {fnew(T * C), fnew(T * C)};
  float *mean = fnew(B * T), *rstd = fnew(B * T), *wt = fnew(C), *bs = fnew(C), *dx[2] = {fnew(N), fnew(N)};
  float *dw[2] = {fnew(C), fnew(C)}, *db[2] = {fnew(C), fnew(C)};
  int NKV = NH / 2, NG = B * T * (C + 2 * NKV * (C / NH)); /* grouped-query: qkv's first NG floats */
  float *dg[2] = {fnew(NG), fnew(NG)}, *att_g = fnew(NA);
  frand(qkv, NULL, NQ, 1.0);
  frand(dout, NULL, N, 1.0);
  frand(wt, NULL, C, 1.0);
  frand(bs, NULL, C, 1.0);
  attention_forward(out, att, qkv, B, T, C, NH, NH, NULL, 0);
  attention_forward(out, att_g, qkv, B, T, C, NH, NKV, NULL, 0);
  layernorm_forward(out, mean, rstd, dout, wt, bs, B, T, C);
  int saved = omp_get_max_threads();
  int threads[2] = {1, 3};
  for (int k = 0; k < 2; k++) {
    omp_set_num_threads(threads[k]);
    attention_backward(dq[k], datt, dout, qkv, att, B, T, C, NH, NH, NULL, 0);
    attention_backward(dg[k], datt, dout, qkv, att_g, B, T, C, NH, NKV, NULL, 0);
    encoder_backward(dwte[k], dwpe[k], dout, inp, B, T, C, -1, NULL);
    layernorm_backward(dx[k], dw[k], db[k], qkv, dout, wt, mean, rstd, B, T, C);
  }
  omp_set_num_threads(saved);
  CHECK(memcmp(dq[0], dq[1], sizeof(float) * NQ) == 0);
  CHECK(memcmp(dg[0], dg[1], sizeof(float) * NG) == 0);
  CHECK(memcmp(dwte[0], dwte[1], sizeof(float) * V * C) == 0);
  CHECK(memcmp(dwpe[0], dwpe[1], sizeof(float) * T * C) == 0);
  CHECK(memcmp(dx[0], dx[1], sizeof(float) * N) == 0);
  CHECK(memcmp(dw[0], dw[1], sizeof(float) * C) == 0);
  CHECK(memcmp(db[0], db[1], sizeof(float) * C) == 0);
  free(inp), free(qkv), free(att), free(out), free(dout), free(datt), free(mean), free(rstd), free(wt), free(bs);
  for (int k = 0; k < 2; k++) free(dq[k]), free(dwte[k]), free(dwpe[k]), free(dx[k]), free(dw[k]), free(db[k]);
  for (int k = 0; k < 2; k++) free(dg[k]);
  free(att_g);
}

int main(void) {
  test_encoder();
  test_layernorm();
  test_matmul();
  test_attention();
  test_attention_long();
  test_attention_gqa();
  test_attention_gqa_blocks();
  test_gelu_residual();
  test_classifier();
  test_softmax_xent();
  test_expf();
  test_thread_independence();
  return check_done();
}
