/* test_ops_llama — Llama's operators of ops_cpu (linear, RMSNorm, rotary, SwiGLU, the encoder
 * without positions) against references written here in double, as test_ops does for GPT-2's:
 * forwards against a naive double forward, backwards against central finite differences of
 * L = Σ w_i·out_i, parameter gradients pre-filled at random (+=), activation gradients with NaN (=).
 * Tolerances as derived in test_ops.c. Grouped-query attention is tested in test_ops.c. Last, the
 * CPU device's slots for these operators (device_cpu.c) against direct calls, bit for bit.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device.h"
#include "opcheck.h"
#include "ops_cpu.h"
#include "refrope.h"

/* ---- encoder without learned positions ---- */

static void test_encoder_no_wpe(void) {
  int B = 2, T = 5, C = 8, V = 4, N = B * T * C; /* V < B·T: tokens repeat */
  int inp[10];
  for (int i = 0; i < B * T; i++) inp[i] = (i * 3) % V;
  float *wte = fnew(V * C), *out = fnew(N), *dout = fnew(N), *dwte = fnew(V * C);
  double *pre = dnew(V * C), *ref = dnew(N > V * C ? N : V * C);
  frand(wte, NULL, V * C, 1.0);
  frand(dout, NULL, N, 1.0);
  ffill(out, N, NAN);
  encoder_forward(out, inp, wte, NULL, B, T, C, NULL);
  for (int bt = 0; bt < B * T; bt++)
    for (int c = 0; c < C; c++) ref[bt * C + c] = wte[inp[bt] * C + c];
  expect_close("encoder_forward out, wpe NULL", ref, out, N, 0.0, 0.0);
  frand(dwte, pre, V * C, 1.0);
  encoder_backward(dwte, NULL, dout, inp, B, T, C, -1, NULL);
  for (int i = 0; i < V * C; i++) ref[i] = pre[i];
  for (int bt = 0; bt < B * T; bt++)
    for (int c = 0; c < C; c++) ref[inp[bt] * C + c] += dout[bt * C + c];
  expect_close("encoder_backward dwte (+=), dwpe NULL", ref, dwte, V * C, FWD_ATOL, FWD_RTOL);
  /* pad_token_id = inp[1] (a token of the batch): its row keeps its value, every other row as above */
  const int pad = inp[1];
  frand(dwte, pre, V * C, 1.0);
  encoder_backward(dwte, NULL, dout, inp, B, T, C, pad, NULL);
  for (int i = 0; i < V * C; i++) ref[i] = pre[i];
  for (int bt = 0; bt < B * T; bt++)
    for (int c = 0; c < C && inp[bt] != pad; c++) ref[inp[bt] * C + c] += dout[bt * C + c];
  expect_close("encoder_backward dwte, pad row untouched", ref, dwte, V * C, FWD_ATOL, FWD_RTOL);
  free(wte), free(out), free(dout), free(dwte), free(pre), free(ref);
}

/* ---- linear (nn.Linear, weight [OC, C]) ---- */

typedef struct {
  int BT, C, OC;
  double *inp, *weight, *w, *out;
} lin_ctx;

static double lin_objective(void *p) {
  lin_ctx *x = p;
  for (int r = 0; r < x->BT; r++)
    for (int o = 0; o < x->OC; o++) {
      double s = 0;
      for (int c = 0; c < x->C; c++) s += x->inp[r * x->C + c] * x->weight[o * x->C + c];
      x->out[r * x->OC + o] = s;
    }
  return wdot(x->w, x->out, x->BT * x->OC);
}

static void test_linear(void) {
  int BT = 10, C = 16, OC = 12; /* OC ≠ C: a transposed weight would not even fit */
  float *inp = fnew(BT * C), *weight = fnew(OC * C), *out = fnew(BT * OC), *dout = fnew(BT * OC);
  float *dinp = fnew(BT * C), *dweight = fnew(OC * C), *dw2 = fnew(OC * C);
  double *inp_d = dnew(BT * C), *weight_d = dnew(OC * C), *w = dnew(BT * OC), *out_d = dnew(BT * OC);
  double *g = dnew(OC * C + BT * C), *pre = dnew(OC * C), *pre2 = dnew(OC * C);
  frand(inp, inp_d, BT * C, 1.0);
  frand(weight, weight_d, OC * C, 1.0);
  frand(dout, w, BT * OC, 1.0);
  lin_ctx x = {BT, C, OC, inp_d, weight_d, w, out_d};

  ffill(out, BT * OC, NAN);
  linear_forward(out, inp, weight, BT, C, OC);
  lin_objective(&x);
  expect_close("linear_forward out", out_d, out, BT * OC, FWD_ATOL, FWD_RTOL);

  ffill(dinp, BT * C, NAN);
  frand(dweight, pre, OC * C, 1.0);
  linear_backward(dinp, dweight, dout, inp, weight, BT, C, OC);
  fd_grad(g, inp_d, BT * C, lin_objective, &x);
  expect_close("linear_backward dinp (=)", g, dinp, BT * C, GRAD_ATOL, GRAD_RTOL);
  fd_grad(g, weight_d, OC * C, lin_objective, &x);
  for (int i = 0; i < OC * C; i++) g[i] += pre[i];
  expect_close("linear_backward dweight (+=)", g, dweight, OC * C, GRAD_ATOL, GRAD_RTOL);
  /* dinp NULL: the weight gradient alone */
  frand(dw2, pre2, OC * C, 1.0);
  linear_backward(NULL, dw2, dout, inp, weight, BT, C, OC);
  for (int i = 0; i < OC * C; i++) g[i] += pre2[i] - pre[i];
  expect_close("linear_backward dweight (+=), dinp NULL", g, dw2, OC * C, GRAD_ATOL, GRAD_RTOL);

  free(inp), free(weight), free(out), free(dout), free(dinp), free(dweight), free(dw2);
  free(inp_d), free(weight_d), free(w), free(out_d), free(g), free(pre), free(pre2);
}

/* ---- RMSNorm ---- */

typedef struct {
  int R, C;
  double eps, woff;
  double *inp, *weight, *w, *out, *rstd;
} rms_ctx;

static double rms_objective(void *p) {
  rms_ctx *x = p;
  for (int r = 0; r < x->R; r++) {
    const double *v = x->inp + r * x->C;
    double ss = 0;
    for (int c = 0; c < x->C; c++) ss += v[c] * v[c];
    double rs = 1.0 / sqrt(ss / x->C + x->eps);
    for (int c = 0; c < x->C; c++) x->out[r * x->C + c] = v[c] * rs * (x->woff + x->weight[c]);
    x->rstd[r] = rs;
  }
  return wdot(x->w, x->out, x->R * x->C);
}

/* eps 1e-5 (Llama's default) on O(1) rows, and eps 0.25 on rows of ~0.3, where a lost eps moves
 * rstd by tens of percent; each with the weight's offset 0 (Llama) and 1 (Gemma: scale 1 + w). */
static void test_rmsnorm(void) {
  int R = 9, C = 20, N = R * C;
  double epss[] = {1e-5, 0.25, 1e-6, 0.25}, scales[] = {2.0, 0.3, 2.0, 0.3};
  for (int k = 0; k < 4; k++) {
    float eps = (float)epss[k], woff = k < 2 ? 0.0f : 1.0f;
    float *inp = fnew(N), *weight = fnew(C), *out = fnew(N), *rstd = fnew(R), *dout = fnew(N);
    float *dinp = fnew(N), *dweight = fnew(C);
    double *inp_d = dnew(N), *weight_d = dnew(C), *w = dnew(N), *out_d = dnew(N), *rstd_d = dnew(R);
    double *g = dnew(N), *pre = dnew(C);
    frand(inp, inp_d, N, scales[k]);
    frand(weight, weight_d, C, 1.0);
    frand(dout, w, N, 1.0);
    rms_ctx x = {R, C, (double)eps, (double)woff, inp_d, weight_d, w, out_d, rstd_d};
    char what[96];

    rmsnorm_forward(out, rstd, inp, weight, R, C, eps, woff);
    rms_objective(&x);
    snprintf(what, sizeof what, "rmsnorm_forward out, eps=%g, woff=%g", epss[k], woff);
    expect_close(what, out_d, out, N, FWD_ATOL, FWD_RTOL);
    snprintf(what, sizeof what, "rmsnorm_forward rstd, eps=%g, woff=%g", epss[k], woff);
    expect_close(what, rstd_d, rstd, R, FWD_ATOL, FWD_RTOL);

    ffill(dinp, N, NAN);
    frand(dweight, pre, C, 1.0);
    rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, R, C, woff);
    fd_grad(g, inp_d, N, rms_objective, &x);
    snprintf(what, sizeof what, "rmsnorm_backward dinp (=), eps=%g, woff=%g", epss[k], woff);
    expect_close(what, g, dinp, N, GRAD_ATOL, GRAD_RTOL);
    fd_grad(g, weight_d, C, rms_objective, &x);
    for (int i = 0; i < C; i++) g[i] += pre[i];
    snprintf(what, sizeof what, "rmsnorm_backward dweight (+=), eps=%g, woff=%g", epss[k], woff);
    expect_close(what, g, dweight, C, GRAD_ATOL, GRAD_RTOL);

    free(inp), free(weight), free(out), free(rstd), free(dout), free(dinp), free(dweight);
    free(inp_d), free(weight_d), free(w), free(out_d), free(rstd_d), free(g), free(pre);
  }
}

/* ---- rotary embeddings ---- */

/* Hugging Face's formulation, written independently of the pairwise one in ops/rope.h:
 * inv_freq_i = 1/theta^(2i/HS) for i < HS/2 (llama3: rescaled by band, ref_inv_freq), emb =
 * cat(t·inv_freq, t·inv_freq), y = x·cos(emb) + rotate_half(x)·sin(emb), rotate_half(x) =
 * cat(−x[HS/2:], x[:HS/2]); on every q and k head of each (B,T,C + 2·NKV·HS) row; v is copied. */
typedef struct {
  int B, T, NH, NKV, HS;
  double theta;
  const double *scaling;   /* NULL, or llama3's {factor, low_freq_factor, high_freq_factor, original} */
  double *qkv, *w, *out;
} rope_ctx;

static rope_freqs plain_rope(double theta) { return rope_freqs_of(theta, 0, 0, 0, 0, 0); }

static double rope_objective(void *p) {
  rope_ctx *x = p;
  int HS = x->HS, half = HS / 2, C3 = (x->NH + 2 * x->NKV) * HS, n = x->B * x->T * C3;
  for (int i = 0; i < n; i++) x->out[i] = x->qkv[i];
  for (int bt = 0; bt < x->B * x->T; bt++)
    for (int h = 0; h < x->NH + x->NKV; h++) {
      const double *v = x->qkv + (size_t)bt * C3 + h * HS;
      double *o = x->out + (size_t)bt * C3 + h * HS;
      for (int j = 0; j < HS; j++) {
        double emb = (bt % x->T) * ref_inv_freq(j % half, HS, x->theta, x->scaling);
        double rot = j < half ? -v[j + half] : v[j - half];
        o[j] = v[j] * cos(emb) + rot * sin(emb);
      }
    }
  return wdot(x->w, x->out, n);
}

/* HS = 4, theta = 10000, position 1, x = (1, 2, 3, 4): inv_freq = (1, 0.01), so
 * y = (1·cos 1 − 3·sin 1, 2·cos 0.01 − 4·sin 0.01, 3·cos 1 + 1·sin 1, 4·cos 0.01 + 2·sin 0.01),
 * worked out by hand to the digits below; position 0 is the identity. */
static void test_rope_example(void) {
  float qkv[2 * 12];
  for (int i = 0; i < 24; i++) qkv[i] = (float)(i % 4 + 1); /* q = k = v = (1, 2, 3, 4) */
  rope_freqs plain = plain_rope(10000);
  rope_forward(qkv, 1, 2, 1, 1, 4, &plain, NULL);
  const double want[4] = {-1.98411065, 1.95990067, 2.46237790, 4.01979967};
  const double t0[4] = {1, 2, 3, 4};
  expect_close("rope_forward position 0 q (identity)", t0, qkv, 4, 0.0, 0.0);
  expect_close("rope_forward position 0 k (identity)", t0, qkv + 4, 4, 0.0, 0.0);
  expect_close("rope_forward hand example, q", want, qkv + 12, 4, 1e-6, 1e-6);
  expect_close("rope_forward hand example, k", want, qkv + 16, 4, 1e-6, 1e-6);
  expect_close("rope_forward leaves v", t0, qkv + 20, 4, 0.0, 0.0);
}

/* Against the double formulation, forward and backward by finite differences: GPT-2-like heads
 * (NKV = NH) and grouped ones (NKV = NH/2) at Llama 2's and Llama 3's theta, and llama3's scaling
 * with a frequency in each of its bands (HS 6 at theta 10: wavelengths 6.3, 13.5 and 29.2 against
 * the band edges 20/2 = 10 and 20/1 = 20 of original 20, high 2, low 1); v untouched bit for bit;
 * and backward ∘ forward = identity. */
static void test_rope(void) {
  int B = 2, T = 5, HS = 6;
  int nhs[] = {2, 4, 4}, nkvs[] = {2, 2, 2};
  double thetas[] = {10000.0, 500000.0, 10.0};
  static const double llama3[4] = {4, 1, 2, 20};
  const double *scalings[] = {NULL, NULL, llama3};
  for (int k = 0; k < 3; k++) {
    int NH = nhs[k], NKV = nkvs[k], C3 = (NH + 2 * NKV) * HS, n = B * T * C3;
    float *qkv = fnew(n), *y = fnew(n), *dy = fnew(n), *back = fnew(n);
    double *qkv_d = dnew(n), *w = dnew(n), *out_d = dnew(n), *g = dnew(n);
    frand(qkv, qkv_d, n, 1.5);
    frand(dy, w, n, 1.0);
    const double *sc = scalings[k];
    rope_ctx x = {B, T, NH, NKV, HS, thetas[k], sc, qkv_d, w, out_d};
    rope_freqs rf = sc ? rope_freqs_of(thetas[k], 1, sc[0], sc[1], sc[2], (int)sc[3]) : plain_rope(thetas[k]);
    char what[96];

    memcpy(y, qkv, sizeof(float) * n);
    rope_forward(y, B, T, NH, NKV, HS, &rf, NULL);
    rope_objective(&x);
    snprintf(what, sizeof what, "rope_forward, NH=%d NKV=%d theta=%g", NH, NKV, thetas[k]);
    expect_close(what, out_d, y, n, FWD_ATOL, FWD_RTOL);
    int v_same = 1;
    for (int bt = 0; bt < B * T; bt++)
      for (int c = (NH + NKV) * HS; c < C3; c++) v_same &= y[bt * C3 + c] == qkv[bt * C3 + c];
    CHECK(v_same);

    rope_backward(dy, B, T, NH, NKV, HS, &rf, NULL);
    fd_grad(g, qkv_d, n, rope_objective, &x);
    snprintf(what, sizeof what, "rope_backward (in place), NH=%d NKV=%d theta=%g", NH, NKV, thetas[k]);
    expect_close(what, g, dy, n, GRAD_ATOL, GRAD_RTOL);

    memcpy(back, y, sizeof(float) * n);
    rope_backward(back, B, T, NH, NKV, HS, &rf, NULL);
    snprintf(what, sizeof what, "rope_backward(rope_forward(x)) = x, NH=%d NKV=%d", NH, NKV);
    expect_close(what, qkv_d, back, n, FWD_ATOL, FWD_RTOL);

    free(qkv), free(y), free(dy), free(back), free(qkv_d), free(w), free(out_d), free(g);
  }
}

/* llama3's inverse frequencies against transformers' own (5.23, _compute_llama3_parameters via
 * ROPE_INIT_FUNCTIONS["llama3"], head_dim 32, rope_theta 10000, factor 8, low_freq_factor 1,
 * high_freq_factor 8, original_max_position_embeddings 128; printed with %.9g, which reads back as
 * the same float): bit for bit. The config puts 2 frequencies in the high band (wavelength < 16:
 * unchanged), 4 between (interpolated) and 10 in the low band (wavelength > 128: divided by 8). */
static void test_rope_llama3_freqs(void) {
  static const float hf[16] = {1, 0.562341332f, 0.254647911f, 0.0805267394f, 0.0254647918f, 0.00805267226f,
                               0.00395284733f, 0.00222284929f, 0.00124999997f, 0.000702926656f, 0.000395284733f,
                               0.000222284929f, 0.000125000006f, 7.02926627e-05f, 3.95284733e-05f, 2.22284925e-05f};
  const rope_freqs r = rope_freqs_of(10000, 1, 8, 1, 8, 128), plain = plain_rope(10000);
  int bands[3] = {0, 0, 0}, same = 1;   /* high, between, low */
  for (int i = 0; i < 16; i++) {
    float got = rope_inv_freq(i, 32, &r), base = rope_inv_freq(i, 32, &plain);
    if (got != hf[i]) {
      fprintf(stderr, "llama3 inv_freq[%d]: expected %.9g (transformers), got %.9g\n", i, (double)hf[i], (double)got);
      same = 0;
    }
    bands[got == base ? 0 : got == base / 8 ? 2 : 1]++;
    if (got != base && got != base / 8) CHECK(got > base / 8 && got < base);
  }
  CHECK(same);
  CHECK(bands[0] == 2 && bands[1] == 4 && bands[2] == 10);
  /* the angle is t times the scaled frequency, in fp32 */
  CHECK(rope_angle(100, 3, 32, &r) == 100.0f * hf[3]);
}

/* ---- SwiGLU ---- */

typedef struct {
  int BT, F;
  double *gu, *w, *out;
} swiglu_ctx;

static double swiglu_objective(void *p) {
  swiglu_ctx *x = p;
  for (int r = 0; r < x->BT; r++)
    for (int i = 0; i < x->F; i++) {
      double g = x->gu[r * 2 * x->F + i], u = x->gu[r * 2 * x->F + x->F + i];
      x->out[r * x->F + i] = g / (1.0 + exp(-g)) * u;
    }
  return wdot(x->w, x->out, x->BT * x->F);
}

static void test_swiglu(void) {
  int BT = 6, F = 11, N = BT * F, NG = 2 * N;
  float *gu = fnew(NG), *out = fnew(N), *dout = fnew(N), *dgu = fnew(NG);
  double *gu_d = dnew(NG), *w = dnew(N), *out_d = dnew(N), *g = dnew(NG);
  frand(gu, gu_d, NG, 4.0);
  frand(dout, w, N, 1.0);
  swiglu_ctx x = {BT, F, gu_d, w, out_d};
  ffill(out, N, NAN);
  swiglu_forward(out, gu, BT, F);
  swiglu_objective(&x);
  expect_close("swiglu_forward out", out_d, out, N, FWD_ATOL, FWD_RTOL);
  ffill(dgu, NG, NAN);
  swiglu_backward(dgu, gu, dout, BT, F);
  fd_grad(g, gu_d, NG, swiglu_objective, &x);
  expect_close("swiglu_backward dgu (=)", g, dgu, NG, GRAD_ATOL, GRAD_RTOL);

  /* Saturated gates (gate, up) = (−60, 2) and (60, 3): silu(−60) is a tiny negative and
   * silu(60) = 60, with finite gradients (ops_expf clamps, so σ never meets inf). */
  float sg[4] = {-60.0f, 60.0f, 2.0f, 3.0f}, so[2], sd[4], one[2] = {1.0f, 1.0f};
  swiglu_forward(so, sg, 1, 2);
  swiglu_backward(sd, sg, one, 1, 2);
  CHECK(fabsf(so[0]) < 1e-20f && so[1] == 180.0f);
  CHECK(fabsf(sd[0]) < 1e-20f && fabsf(sd[1] - 3.0f) < 1e-6f && fabsf(sd[2]) < 1e-20f && sd[3] == 60.0f);
  free(gu), free(out), free(dout), free(dgu), free(gu_d), free(w), free(out_d), free(g);
}

/* ---- GeGLU (Gemma): gelu_tanh(gate)·up, transformers' gelu_pytorch_tanh written out in double ---- */

static double swiglu_objective_geglu(void *p) {
  swiglu_ctx *x = p;
  for (int r = 0; r < x->BT; r++)
    for (int i = 0; i < x->F; i++) {
      double g = x->gu[r * 2 * x->F + i], u = x->gu[r * 2 * x->F + x->F + i];
      x->out[r * x->F + i] = 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
    }
  return wdot(x->w, x->out, x->BT * x->F);
}

static void test_geglu(void) {
  int BT = 6, F = 11, N = BT * F, NG = 2 * N;
  float *gu = fnew(NG), *out = fnew(N), *dout = fnew(N), *dgu = fnew(NG);
  double *gu_d = dnew(NG), *w = dnew(N), *out_d = dnew(N), *g = dnew(NG);
  frand(gu, gu_d, NG, 4.0);
  frand(dout, w, N, 1.0);
  swiglu_ctx x = {BT, F, gu_d, w, out_d};
  ffill(out, N, NAN);
  geglu_forward(out, gu, BT, F);
  swiglu_objective_geglu(&x);
  expect_close("geglu_forward out", out_d, out, N, FWD_ATOL, FWD_RTOL);
  ffill(dgu, NG, NAN);
  geglu_backward(dgu, gu, dout, BT, F);
  fd_grad(g, gu_d, NG, swiglu_objective_geglu, &x);
  expect_close("geglu_backward dgu (=)", g, dgu, NG, GRAD_ATOL, GRAD_RTOL);
  free(gu), free(out), free(dout), free(dgu), free(gu_d), free(w), free(out_d), free(g);
}

/* ---- determinism: RMSNorm's weight gradient does not depend on the thread count ---- */

static void test_thread_independence(void) {
  int R = 66, C = 80, N = R * C;
  float *inp = fnew(N), *wt = fnew(C), *out = fnew(N), *rstd = fnew(R), *dout = fnew(N);
  float *dx[2] = {fnew(N), fnew(N)}, *dw[2] = {fnew(C), fnew(C)};
  frand(inp, NULL, N, 1.0);
  frand(wt, NULL, C, 1.0);
  frand(dout, NULL, N, 1.0);
  rmsnorm_forward(out, rstd, inp, wt, R, C, 1e-5f, 0.0f);
  int saved = omp_get_max_threads(), threads[2] = {1, 3};
  for (int k = 0; k < 2; k++) {
    omp_set_num_threads(threads[k]);
    rmsnorm_backward(dx[k], dw[k], dout, inp, wt, rstd, R, C, 0.0f);
  }
  omp_set_num_threads(saved);
  CHECK(memcmp(dx[0], dx[1], sizeof(float) * N) == 0);
  CHECK(memcmp(dw[0], dw[1], sizeof(float) * C) == 0);
  free(inp), free(wt), free(out), free(rstd), free(dout);
  for (int k = 0; k < 2; k++) free(dx[k]), free(dw[k]);
}

/* ---- the CPU device's slots: each packs its arguments into a task for the stream thread ---- */

enum { S_LIN, S_DLIN_X, S_DLIN_W, S_RMS, S_RSTD, S_DRMS_X, S_DRMS_W, S_ROPE, S_ATT, S_OUT, S_DATT, S_DQKV, S_SW, S_DGU,
       S_ENC, S_DWTE, S_N };

/* Every Llama slot on the asynchronous CPU device (arguments through its task ring) against the
 * direct calls on the same inputs: the same bits. Parameter gradients start from the same values. */
static void test_cpu_device_slots(void) {
  device_t *d = NULL;
  CHECK_OK(dev_new_cpu(DEV_CPU_ASYNC, &d));
  if (!d) return;
  const int B = 2, T = 5, NH = 4, NKV = 2, HS = 4, C = NH * HS, BT = B * T, F = 6, OC = 7, V = 3;
  const int C3 = C + 2 * NKV * HS;
  const int len[S_N] = {BT * OC, BT * C3, OC * C3, BT * C3, BT, BT * C3, C3, BT * C3, B * NH * T * T, BT * C,
                        B * NH * T * T, BT * C3, BT * F, BT * 2 * F, BT * C, V * C};
  int inp[10];
  for (int i = 0; i < BT; i++) inp[i] = i % V;
  float *x = fnew(BT * C3), *w = fnew(OC * C3), *gu = fnew(BT * 2 * F), *dy = fnew(BT * C3), *pre = fnew(OC * C3);
  frand(x, NULL, BT * C3, 1.0);
  frand(w, NULL, OC * C3, 1.0);
  frand(gu, NULL, BT * 2 * F, 2.0);
  frand(dy, NULL, BT * C3, 1.0);
  frand(pre, NULL, OC * C3, 1.0);
  float *r[2][S_N];
  /* llama3 scaling: every field of the frequencies goes through the task's arguments */
  const rope_freqs rf = rope_freqs_of(10000, 1, 8, 1, 4, 12);
  for (int k = 0; k < 2; k++) { /* k = 0: direct calls; k = 1: through the device */
    float **b = r[k];
    for (int i = 0; i < S_N; i++) b[i] = fnew(len[i]);
    memcpy(b[S_DLIN_W], pre, sizeof(float) * OC * C3);
    memcpy(b[S_DRMS_W], pre, sizeof(float) * C3);
    memcpy(b[S_DWTE], pre, sizeof(float) * V * C);
    memcpy(b[S_ROPE], x, sizeof(float) * BT * C3);
    if (k == 0) {
      linear_forward(b[S_LIN], x, w, BT, C3, OC);
      linear_backward(b[S_DLIN_X], b[S_DLIN_W], dy, x, w, BT, C3, OC);
      rmsnorm_forward(b[S_RMS], b[S_RSTD], x, w, BT, C3, 1e-5f, 1.0f);
      rmsnorm_backward(b[S_DRMS_X], b[S_DRMS_W], dy, x, w, b[S_RSTD], BT, C3, 1.0f);
      rope_forward(b[S_ROPE], B, T, NH, NKV, HS, &rf, NULL);
      attention_forward(b[S_OUT], b[S_ATT], b[S_ROPE], B, T, C, NH, NKV, NULL, 0);
      attention_backward(b[S_DQKV], b[S_DATT], dy, b[S_ROPE], b[S_ATT], B, T, C, NH, NKV, NULL, 0);
      rope_backward(b[S_DQKV], B, T, NH, NKV, HS, &rf, NULL);
      swiglu_forward(b[S_SW], gu, BT, F);
      swiglu_backward(b[S_DGU], gu, b[S_SW], BT, F);
      encoder_forward(b[S_ENC], inp, w, NULL, B, T, C, NULL);
      encoder_backward(b[S_DWTE], NULL, b[S_ENC], inp, B, T, C, -1, NULL);
    } else {
      const dev_kernels *o = d->kern;
      o->linear_forward(d, b[S_LIN], x, w, NULL, BT, C3, OC);
      o->linear_backward(d, b[S_DLIN_X], b[S_DLIN_W], NULL, dy, x, w, BT, C3, OC);
      o->rmsnorm_forward(d, b[S_RMS], b[S_RSTD], x, w, BT, C3, 1e-5f, 1.0f);
      o->rmsnorm_backward(d, b[S_DRMS_X], b[S_DRMS_W], dy, x, w, b[S_RSTD], BT, C3, 1.0f);
      o->rope_forward(d, b[S_ROPE], B, T, NH, NKV, HS, &rf, NULL);
      o->attention_forward(d, b[S_OUT], b[S_ATT], b[S_ROPE], B, T, C, NH, NKV, NULL, 0);
      o->attention_backward(d, b[S_DQKV], b[S_DATT], dy, b[S_ROPE], b[S_OUT], b[S_ATT], B, T, C, NH, NKV, NULL, 0);
      o->rope_backward(d, b[S_DQKV], B, T, NH, NKV, HS, &rf, NULL);
      o->swiglu_forward(d, b[S_SW], gu, BT, F);
      o->swiglu_backward(d, b[S_DGU], gu, b[S_SW], BT, F);
      o->encoder_forward(d, b[S_ENC], inp, w, NULL, B, T, C, NULL);
      o->encoder_backward(d, b[S_DWTE], NULL, b[S_ENC], inp, B, T, C, -1, NULL);
      CHECK_OK(d->op->sync(d));
    }
  }
  static const char *const names[S_N] = {"linear out", "linear dinp", "linear dweight", "rmsnorm out", "rmsnorm rstd",
                                         "rmsnorm dinp", "rmsnorm dweight", "rope", "attention probabilities",
                                         "attention out", "attention scratch", "attention dqkv, rope backward",
                                         "swiglu out", "swiglu dgu", "encoder out", "encoder dwte"};
  for (int i = 0; i < S_N; i++) {
    int eq = memcmp(r[0][i], r[1][i], sizeof(float) * (size_t)len[i]) == 0;
    if (!eq) fprintf(stderr, "CPU device slot differs from the direct call: %s\n", names[i]);
    CHECK(eq);
  }
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < S_N; i++) free(r[k][i]);
  free(x), free(w), free(gu), free(dy), free(pre);
  dev_destroy(&d);
}

int main(void) {
  test_encoder_no_wpe();
  test_linear();
  test_rmsnorm();
  test_rope_example();
  test_rope();
  test_rope_llama3_freqs();
  test_swiglu();
  test_geglu();
  test_thread_independence();
  test_cpu_device_slots();
  return check_done();
}
