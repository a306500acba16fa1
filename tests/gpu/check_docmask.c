/* check_docmask — packed rows (documents, model_set_docs) and the sliding window on the CUDA
 * kernels against their CPU twins (worker/ops/docmask.h): attention forward and backward on both of
 * fsdpd's own kernels, the tensor cores (what a masked call runs with cuDNN selected) and the FMA
 * ones, which skip the key tiles no query of a tile sees; rope with
 * positions restarting per document, and GPT-2's encoder (wpe's row is the position in the
 * document, dwpe summed over the documents' tokens at each position).
 *
 * Rows: row 0 holds documents of 40, 53 and 47 tokens (boundaries inside tiles, one document over
 * two tiles), row 1 one of 10 and one of 130; the window (37) is not a multiple of any tile. Each
 * masked result must match the CPU; planted faults must NOT: the same CUDA call without the
 * documents (or the window) against the masked reference fails the norm-wise tolerance.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu_check.h"
#include "ops_cpu.h"
#include "ops/softmax.h"

#define WINDOW 37

static int32_t *h_seg(int B, int T) {
  static const int lens[2][3] = {{40, 53, 47}, {10, 130, 0}};
  int32_t *seg = hbuf((size_t)B * T * sizeof(int32_t));
  for (int b = 0; b < B; b++)
    for (int t = 0, d = 0, start = 0; t < T; t++) {
      if (d < 2 && lens[b % 2][d] && t == start + lens[b % 2][d]) start += lens[b % 2][d++];
      seg[(size_t)b * T + t] = start;
    }
  return seg;
}

/* ‖got − ref‖₂ / ‖ref‖₂ of a device result (a planted fault's distance from the masked reference). */
static double rel_err(const float *ref, const void *dev, size_t n, out_kind kind) {
  out_t o = {.name = "fault", .ref = ref, .dev = dev, .n = n, .kind = kind};
  fetch_outputs(&o, 1);
  double ss = 0, sd = 0;
  for (size_t i = 0; i < n; i++) {
    ss += (double)ref[i] * ref[i];
    sd += ((double)o.got[i] - ref[i]) * ((double)o.got[i] - ref[i]);
  }
  return ss > 0 ? sqrt(sd / ss) : sqrt(sd);
}

static void planted(const char *what, const char *shape, double rel) {
  char name[224], detail[112];
  snprintf(name, sizeof name, "planted fault: %s[%s]", what, shape);
  snprintf(detail, sizeof detail, "relative error %.3g against the masked reference (must exceed %g)", rel, TOL_BF16);
  verdict(name, rel > TOL_BF16, detail);
}

/* Attention of B×T rows with documents (USE_SEG) and/or WINDOW on IMPL: forward (out, lse) and backward. */
static void check_attention_masked(const char *name, int B, int T, int C, int NH, int NKV, int use_seg, int window,
                                   ops_attn_impl impl) {
  const int hs = C / NH, C3 = C + 2 * NKV * hs;
  const size_t nqkv = (size_t)B * T * C3, natt = (size_t)B * NH * T * T, nout = (size_t)B * T * C;
  const size_t nlse = (size_t)B * NH * T;
  char shape[96];
  snprintf(shape, sizeof shape, "%s%s%s, %s", name, use_seg ? " documents" : "", window ? " window 37" : "",
           impl == OPS_ATTN_TC ? "tensor cores" : impl == OPS_ATTN_FMA ? "fp32 FMA" : "cuDNN selected");
  const ops_attn_impl was = ops_cuda_attention_selected();
  ops_cuda_attention_select(impl);
  const int32_t *seg = use_seg ? h_seg(B, T) : NULL;
  const int32_t *d_seg = seg ? d_upload(seg, (size_t)B * T * sizeof(int32_t)) : NULL;
  float *qkv = h_bf16_uniform(nqkv, -1.5f, 1.5f);
  void *d_qkv = d_bf16(qkv, nqkv);
  float *out = h_nan(nout), *att = h_nan(natt), *lse = h_nan(nlse);
  void *d_out = d_nan_bf16(nout), *d_lse = d_nan_f32(nlse);
  attention_forward(out, att, qkv, B, T, C, NH, NKV, seg, window);
  const float scale = attn_scale(hs);
  for (int b = 0; b < B; b++)   /* lse at each row's largest probability, as check_attention */
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *a = att + (((size_t)b * NH + h) * T + t) * T;
        int jm = t;
        for (int j = 0; j <= t; j++)
          if (a[j] > a[jm]) jm = j;
        const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
        const float *k = qkv + ((size_t)b * T + jm) * C3 + C + (size_t)(h / (NH / NKV)) * hs;
        double dot = 0;
        for (int c = 0; c < hs; c++) dot += (double)q[c] * k[c];
        lse[((size_t)b * NH + h) * T + t] = (float)(dot * scale - log((double)a[jm]));
      }
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = nout, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "lse", .ref = lse, .dev = d_lse, .n = nlse, .kind = OUT_F32, .tol = TOL_F32}};
  RUN_AND_COMPARE("attention_forward(masked)", shape, 0, fo,
                  ops_cuda_attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, NKV, d_seg, window, &g_ctx));

  float *dout = h_bf16_uniform(nout, -1, 1), *dqkv = h_nan(nqkv), *datt = h_nan(natt);
  void *d_dout = d_bf16(dout, nout), *d_dqkv = d_nan_bf16(nqkv);
  float *d_scratch = d_nan_f32(nlse * (size_t)(hs + 1));
  attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, NKV, seg, window);
  out_t bo[] = {{.name = "dqkv", .ref = dqkv, .dev = d_dqkv, .n = nqkv, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("attention_backward(masked)", shape, 0, bo,
                  ops_cuda_attention_backward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, NKV, d_seg,
                                              window, &g_ctx));
  char ran[160], why[320] = "";
  snprintf(ran, sizeof ran, "attention(masked) ran its kernel[%s]", shape);
  /* cuDNN selected: documents run the tensor cores; the window runs cuDNN's graph, or the tensor
   * cores where cuDNN has no engine for it (the stub's case; GPU_CHECK_ATTN_FALLBACK=0 forbids it) */
  ops_attn_impl want = impl;
  if (impl == OPS_ATTN_CUDNN) {
    const char *fb = getenv("GPU_CHECK_ATTN_FALLBACK");
    ops_cuda_attention_note(why, sizeof why);
    if (use_seg || ((!fb || atoi(fb)) && ops_cuda_attention_ran(0) == OPS_ATTN_TC && why[0])) want = OPS_ATTN_TC;
  }
  verdict(ran, ops_cuda_attention_ran(0) == want && ops_cuda_attention_ran(1) == want, why);

  /* planted: the plain causal kernels (the mask dropped) against the masked reference */
  CU(cudaMemset(d_out, 0xFF, nout * sizeof(uint16_t)));
  if (ops_cuda_attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, NKV, NULL, 0, &g_ctx) == FSDP_OK &&
      cudaStreamSynchronize(g_ctx.stream) == cudaSuccess)
    planted("attention_forward without the mask", shape, rel_err(out, d_out, nout, OUT_BF16));
  else
    verdict("planted fault: attention_forward without the mask", 0, "the call failed");
  ops_cuda_attention_select(was);
  free_all();
}

/* Rope on rows of documents: positions restart in each (CPU twin), and without SEG they do not. */
static void check_rope_docs(void) {
  const int B = 2, T = 140, NH = 4, NKV = 2, HS = 64, C3 = (NH + 2 * NKV) * HS;
  const size_t n = (size_t)B * T * C3;
  const rope_freqs r = rope_freqs_of(10000.0, 0, 0, 0, 0, 0);
  const int32_t *seg = h_seg(B, T), *d_seg = d_upload(seg, (size_t)B * T * sizeof(int32_t));
  float *x = h_bf16_uniform(n, -1, 1), *y = h_copy(x, n);
  void *d_x = d_bf16(x, n);
  rope_forward(y, B, T, NH, NKV, HS, &r, seg);
  out_t fo[] = {{.name = "qkv", .ref = y, .dev = d_x, .n = n, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("rope_forward(documents)", "rope-docs", 0, fo,
                  ops_cuda_rope_forward(d_x, B, T, NH, NKV, HS, &r, d_seg, &g_ctx));
  float *dy = h_bf16_uniform(n, -1, 1), *dx = h_copy(dy, n);
  void *d_d = d_bf16(dy, n);
  rope_backward(dx, B, T, NH, NKV, HS, &r, seg);
  out_t bo[] = {{.name = "dqkv", .ref = dx, .dev = d_d, .n = n, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("rope_backward(documents)", "rope-docs", 0, bo,
                  ops_cuda_rope_backward(d_d, B, T, NH, NKV, HS, &r, d_seg, &g_ctx));
  void *d_p = d_bf16(x, n);   /* planted: positions running on */
  if (ops_cuda_rope_forward(d_p, B, T, NH, NKV, HS, &r, NULL, &g_ctx) == FSDP_OK &&
      cudaStreamSynchronize(g_ctx.stream) == cudaSuccess)
    planted("rope_forward with positions running on", "rope-docs", rel_err(y, d_p, n, OUT_BF16));
  free_all();
}

/* GPT-2's encoder on rows of documents: wpe's row is the position in the document. */
static void check_encoder_docs(void) {
  const int B = 2, T = 140, C = 64, V = 37, BT = B * T;
  const size_t BTC = (size_t)BT * C, VC = (size_t)V * C, TC = (size_t)T * C;
  const int32_t *seg = h_seg(B, T), *d_seg = d_upload(seg, (size_t)BT * sizeof(int32_t));
  int *inp = hbuf((size_t)BT * sizeof(int));
  for (int i = 0; i < BT; i++) inp[i] = (int)(rng_next() % (uint64_t)V);
  int *d_inp = d_upload(inp, (size_t)BT * sizeof(int));
  float *wte = h_bf16_uniform(VC, -1, 1), *wpe = h_bf16_uniform(TC, -1, 1), *out = h_nan(BTC);
  void *d_wte = d_bf16(wte, VC), *d_wpe = d_bf16(wpe, TC), *d_out = d_nan_bf16(BTC);
  encoder_forward(out, inp, wte, wpe, B, T, C, seg);
  out_t fo[] = {{.name = "out", .ref = out, .dev = d_out, .n = BTC, .kind = OUT_BF16, .tol = TOL_BF16}};
  RUN_AND_COMPARE("encoder_forward(documents)", "encoder-docs", 0, fo,
                  ops_cuda_encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C, d_seg, &g_ctx));
  float *dout = h_bf16_uniform(BTC, -1, 1), *pre_wte = h_uniform(VC, -1, 1), *pre_wpe = h_uniform(TC, -1, 1);
  float *dwte = h_copy(pre_wte, VC), *dwpe = h_copy(pre_wpe, TC);
  void *d_dout = d_bf16(dout, BTC);
  float *d_dwte = d_upload(pre_wte, VC * sizeof(float)), *d_dwpe = d_upload(pre_wpe, TC * sizeof(float));
  encoder_backward(dwte, dwpe, dout, inp, B, T, C, -1, seg);
  out_t bo[] = {{.name = "dwte", .ref = dwte, .dev = d_dwte, .n = VC, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_wte},
                {.name = "dwpe", .ref = dwpe, .dev = d_dwpe, .n = TC, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre_wpe}};
  RUN_AND_COMPARE("encoder_backward(documents)", "encoder-docs", 0, bo,
                  ops_cuda_encoder_backward(d_dwte, d_dwpe, d_dout, d_inp, B, T, C, -1, d_seg, &g_ctx));
  CU(cudaMemset(d_out, 0xFF, BTC * sizeof(uint16_t)));   /* planted: positions running on */
  if (ops_cuda_encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C, NULL, &g_ctx) == FSDP_OK &&
      cudaStreamSynchronize(g_ctx.stream) == cudaSuccess)
    planted("encoder_forward with positions running on", "encoder-docs", rel_err(out, d_out, BTC, OUT_BF16));
  free_all();
}

void check_docmask_ops(void) {
  printf("\n== packed rows and the sliding window: attention, rope, encoder ==\n");
  static const ops_attn_impl impls[] = {OPS_ATTN_TC, OPS_ATTN_FMA};
  for (int i = 0; i < 2; i++) {
    check_attention_masked("hs64 gqa", 2, 140, 128, 2, 1, 1, 0, impls[i]);
    check_attention_masked("hs64 gqa", 2, 140, 128, 2, 1, 0, WINDOW, impls[i]);
    check_attention_masked("hs64 gqa", 2, 140, 128, 2, 1, 1, WINDOW, impls[i]);
    check_attention_masked("hs128", 2, 140, 256, 2, 2, 1, WINDOW, impls[i]);
  }
  check_attention_masked("hs64 gqa", 2, 140, 128, 2, 1, 1, 0, OPS_ATTN_CUDNN);
  check_attention_masked("hs64 gqa", 2, 140, 128, 2, 1, 0, WINDOW, OPS_ATTN_CUDNN);
  check_rope_docs();
  check_encoder_docs();
  fflush(stdout);
}
