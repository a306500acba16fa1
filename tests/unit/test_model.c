/* test_model — GPT-2 forward and backward (worker/model_gpt2) against an independent double-precision
 * reference written here from the GPT-2 definition, and its gradient against central finite
 * differences of that reference.
 *
 * Tolerance. The reference runs in double, and its central differences with h = 1e-5 have
 * truncation error ~h²·|f'''|/6 ≈ 1e-11 and rounding error ~1e-16·|L|/h ≈ 1e-11: exact for our
 * purpose. The model runs in fp32 (unit roundoff u = 2^-24 ≈ 6e-8). Each gradient element is the
 * end of a chain of ~20 operators (10 per block, backward through both blocks and the head), each
 * a sum over at most max(B·T, 4C) = 32 terms; LayerNorm (1/σ) and softmax amplify forward errors
 * only O(1) at these magnitudes. Rounding errors add like a random walk, so the expected error is
 * ~sqrt(20·32)·u ≈ 1.5e-6 relative to the largest gradient G, and the worst case (linear growth)
 * 20·32·u ≈ 4e-5. We accept |g − g_ref| ≤ 4e-5·G + 1e-4·|g_ref|: the worst-case bound, and still
 * ~10^4 below what a missing term, a wrong index or a wrong sign produces (errors of order G).
 * The test prints the measured worst error / tolerance so the margin stays visible.
 */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "gradcheck.h"
#include "jobspec.h"
#include "plan.h"

/* ---------------------------------------------------------------- double reference model */

/* Tensor SLOT of unit U in the reference weights W (unit u's unpadded flat buffer, in double). */
#define P(u, slot) (w[u] + p->units[u].t[slot].offset)

static void ref_layernorm(double *out, const double *x, const double *g, const double *b, int N, int C) {
  for (int n = 0; n < N; n++) {
    const double *xn = x + (size_t)n * C;
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += xn[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (xn[c] - m) * (xn[c] - m);
    v /= C;
    double rs = 1.0 / sqrt(v + 1e-5);
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (xn[c] - m) * rs * g[c] + b[c];
  }
}

/* Conv1D: out[n, o] = b[o] + Σ_c x[n, c]·w[c, o], w is [C, OC]. */
static void ref_conv1d(double *out, const double *x, const double *w, const double *b, int N, int C, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = b[o];
      for (int c = 0; c < C; c++) s += x[(size_t)n * C + c] * w[(size_t)c * OC + o];
      out[(size_t)n * OC + o] = s;
    }
}

static double ref_gelu(double x) {
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* Mean cross-entropy over B·T tokens. */
static double ref_loss(const plan_t *p, double *const *w, const int *inp, const int *tgt) {
  const int B = p->batch_size, T = p->model.seq_len, C = p->model.n_embd, NH = p->model.n_head;
  const int V = p->model.vocab_size, L = p->model.n_layer, N = B * T, hs = C / NH;
  double *x = malloc(sizeof(double) * N * C), *h = malloc(sizeof(double) * N * C);
  double *qkv = malloc(sizeof(double) * N * 3 * C), *y = malloc(sizeof(double) * N * C);
  double *f = malloc(sizeof(double) * N * 4 * C), *t = malloc(sizeof(double) * N * C);
  double *lg = malloc(sizeof(double) * V);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      x[n * C + c] = P(0, ROOT_WTE)[(size_t)inp[n] * C + c] + P(0, ROOT_WPE)[(n % T) * C + c];
  for (int l = 0; l < L; l++) {
    int u = 1 + l;
    ref_layernorm(h, x, P(u, BLK_LN1_W), P(u, BLK_LN1_B), N, C);
    ref_conv1d(qkv, h, P(u, BLK_ATTN_W), P(u, BLK_ATTN_B), N, C, 3 * C);
    for (int b = 0; b < B; b++)
      for (int hd = 0; hd < NH; hd++)
        for (int i = 0; i < T; i++) {
          const double *q = qkv + (size_t)(b * T + i) * 3 * C + hd * hs;
          double s[64], mx = -1e300, z = 0;
          for (int j = 0; j <= i; j++) {
            const double *k = qkv + (size_t)(b * T + j) * 3 * C + C + hd * hs;
            double d = 0;
            for (int e = 0; e < hs; e++) d += q[e] * k[e];
            s[j] = d / sqrt((double)hs);
            if (s[j] > mx) mx = s[j];
          }
          for (int j = 0; j <= i; j++) z += (s[j] = exp(s[j] - mx));
          for (int e = 0; e < hs; e++) {
            double acc = 0;
            for (int j = 0; j <= i; j++) acc += s[j] / z * qkv[(size_t)(b * T + j) * 3 * C + 2 * C + hd * hs + e];
            y[(size_t)(b * T + i) * C + hd * hs + e] = acc;
          }
        }
    ref_conv1d(t, y, P(u, BLK_ATTNPROJ_W), P(u, BLK_ATTNPROJ_B), N, C, C);
    for (int i = 0; i < N * C; i++) x[i] += t[i];
    ref_layernorm(h, x, P(u, BLK_LN2_W), P(u, BLK_LN2_B), N, C);
    ref_conv1d(f, h, P(u, BLK_FC_W), P(u, BLK_FC_B), N, C, 4 * C);
    for (int i = 0; i < N * 4 * C; i++) f[i] = ref_gelu(f[i]);
    ref_conv1d(t, f, P(u, BLK_FCPROJ_W), P(u, BLK_FCPROJ_B), N, 4 * C, C);
    for (int i = 0; i < N * C; i++) x[i] += t[i];
  }
  ref_layernorm(h, x, P(0, ROOT_LNF_W), P(0, ROOT_LNF_B), N, C);
  double loss = 0;
  for (int n = 0; n < N; n++) {
    double mx = -1e300, z = 0;
    for (int v = 0; v < V; v++) {
      double d = 0;
      for (int c = 0; c < C; c++) d += h[n * C + c] * P(0, ROOT_WTE)[(size_t)v * C + c];
      lg[v] = d;
      if (d > mx) mx = d;
    }
    for (int v = 0; v < V; v++) z += exp(lg[v] - mx);
    loss += mx + log(z) - lg[tgt[n]];
  }
  free(x); free(h); free(qkv); free(y); free(f); free(t); free(lg);
  return loss / N;
}

/* ---------------------------------------------------------------- tests */

static device_t *g_dev;   /* the synchronous CPU device */

/* Gradient of the mean loss vs finite differences of the double reference, every parameter; then
 * accumulation and activation checkpointing (gradcheck.h). */
static void test_gradcheck(void) {
  gradcheck_model((model_config){.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 16, .seq_len = 5}, 2, g_dev,
                  ref_loss);
}

/* At init the logits are nearly zero, so the loss is ≈ ln V: logit std σ ≈ 0.02·sqrt(C) (unit-
 * variance LN output times N(0, 0.02²) embeddings), and E[loss] ≈ ln V + σ²/2 = ln V + 0.005 here. */
static void test_init_loss(void) {
  gradcheck_init_loss((model_config){.n_layer = 2, .n_head = 4, .n_embd = 32, .vocab_size = 64, .seq_len = 16}, 4,
                      g_dev);
}

int main(void) {
  if (dev_new_cpu(DEV_CPU_SYNC, &g_dev) != FSDP_OK) return 2;
  test_gradcheck();
  test_init_loss();
  dev_destroy(&g_dev);
  return check_done();
}
