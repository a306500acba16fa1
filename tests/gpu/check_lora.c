/* check_lora — gpu_check's check of a LoRA step's device work (worker/model/lora.c): for one target
 * of GPT-2 (c_attn, the whole fused row) and two of Llama (k_proj, a column block of q|k|v; down_proj)
 * the forward y[:, cols] += s·(x·Aᵀ)·Bᵀ, the backward (dB += s·gᵀ·h, dh = s·g·B, dA += dhᵀ·x,
 * dx += dh·A, g read in place from dy's columns), all through ops_cuda_gemm, then AdamW over the
 * block's adapter segment [A | B] with its gradient, as the runtime runs it (one decayed tensor:
 * lora.c's opt plan), against the CPU's gemm_strided and optim_adamw_shard. Tolerances: gpu_check.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_check.h"
#include "jobspec.h"
#include "ops/bf16.h"
#include "ops_cpu.h"
#include "optim.h"
#include "plan.h"

/* One target: x (BT, in), its output out wide at columns [col0, col0 + out) of rows ld wide. */
typedef struct lora_target {
  const char *name;
  int BT, in, out, col0, ld, r;
  float scale;
} lora_target;

static void check_target(const lora_target *t) {
  const int BT = t->BT, in = t->in, out = t->out, ld = t->ld, r = t->r;
  const float s = t->scale;
  const size_t nx = (size_t)BT * in, ny = (size_t)BT * ld, nh = (size_t)BT * r, na = (size_t)r * in,
               nb = (size_t)out * r, n = na + nb;
  const float ax = 1.0f / sqrtf((float)in);
  /* the adapter segment [A | B] in fp32 (param) and its bf16 compute form */
  float *seg = hbuf(n * sizeof(float));
  for (size_t i = 0; i < na; i++) seg[i] = bf16_round(rng_uniform(-ax, ax));
  for (size_t i = na; i < n; i++) seg[i] = bf16_round(rng_uniform(-0.5f, 0.5f));
  const float *A = seg, *B = seg + na;
  float *x = h_bf16_uniform(nx, -1, 1), *y0 = h_bf16_uniform(ny, -1, 1), *y = h_copy(y0, ny), *h = h_nan(nh);
  void *d_seg = d_bf16(seg, n), *d_x = d_bf16(x, nx), *d_y = d_bf16(y0, ny), *d_h = d_nan_bf16(nh);
  const void *d_A = d_seg, *d_B = (const uint16_t *)d_seg + na;

  gemm_strided(0, 1, BT, r, in, 1.0f, x, in, A, in, 0.0f, h, r);
  gemm_strided(0, 1, BT, out, r, s, h, r, B, r, 1.0f, y + t->col0, ld);
  out_t fo[] = {{.name = "h = x·Aᵀ", .ref = h, .dev = d_h, .n = nh, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "y (its columns += s·h·Bᵀ)", .ref = y, .dev = d_y, .n = ny, .kind = OUT_BF16, .tol = TOL_BF16}};
  fsdp_status st = FSDP_OK;
#define G(...) (st = st == FSDP_OK ? ops_cuda_gemm(__VA_ARGS__, &g_ctx) : st)
  RUN_AND_COMPARE("lora_forward", t->name, 0, fo,
                  (G(0, 1, BT, r, in, 1.0f, d_x, in, d_A, in, 0.0f, d_h, r, 0),
                   G(0, 1, BT, out, r, s, d_h, r, d_B, r, 1.0f, (uint16_t *)d_y + t->col0, ld, 0), st));

  /* the backward, from the same bf16 h on both sides; gradients start nonzero (accumulated) */
  float *hb = fo[0].got ? h_copy(fo[0].got, nh) : h;
  void *d_hb = d_bf16(hb, nh);
  float *dy = h_bf16_uniform(ny, -1, 1), *dx0 = h_bf16_uniform(nx, -1, 1), *dx = h_copy(dx0, nx);
  float *pre = h_uniform(n, -1, 1), *grad = h_copy(pre, n), *dh = h_nan(nh);   /* a prefill as large as the sums */
  void *d_dy = d_bf16(dy, ny), *d_dx = d_bf16(dx0, nx), *d_dh = d_nan_bf16(nh);
  float *d_grad = d_upload(pre, n * sizeof(float));
  const float *g = dy + t->col0;
  const void *d_g = (const uint16_t *)d_dy + t->col0;
  gemm_strided(1, 0, out, r, BT, s, g, ld, hb, r, 1.0f, grad + na, r);
  gemm_strided(0, 0, BT, r, out, s, g, ld, B, r, 0.0f, dh, r);
  gemm_strided(1, 0, r, in, BT, 1.0f, dh, r, x, in, 1.0f, grad, in);
  gemm_strided(0, 0, BT, in, r, 1.0f, dh, r, A, in, 1.0f, dx, in);
  out_t bo[] = {{.name = "dA | dB", .ref = grad, .dev = d_grad, .n = n, .kind = OUT_F32, .tol = TOL_BF16, .prefill = pre},
                {.name = "dh = s·g·B", .ref = dh, .dev = d_dh, .n = nh, .kind = OUT_BF16, .tol = TOL_BF16},
                {.name = "dx (+= dh·A)", .ref = dx, .dev = d_dx, .n = nx, .kind = OUT_BF16, .tol = TOL_BF16}};
  st = FSDP_OK;
  RUN_AND_COMPARE("lora_backward", t->name, 0, bo,
                  (G(1, 0, out, r, BT, s, d_g, ld, d_hb, r, 1.0f, d_grad + na, r, 1),
                   G(0, 0, BT, r, out, s, d_g, ld, d_B, r, 0.0f, d_dh, r, 0),
                   G(1, 0, r, in, BT, 1.0f, d_dh, r, d_x, in, 1.0f, d_grad, in, 1),
                   G(0, 0, BT, in, r, 1.0f, d_dh, r, d_A, in, 1.0f, d_dx, in, 0), st));
#undef G

  /* AdamW over the segment with the device's gradient on both sides: one decayed 2-D tensor */
  if (bo[0].got) {
    plan_unit *u = hbuf(sizeof *u);
    memset(u, 0, sizeof *u);
    snprintf(u->name, sizeof u->name, "lora.0");
    u->ntensors = 1;
    u->t[0] = (plan_tensor){.ndim = 2, .numel = (int64_t)n, .decay = 1};
    u->numel = u->padded = u->shard_numel = (int64_t)n;
    plan_t p;
    memset(&p, 0, sizeof p);
    p.world = p.shard_world = p.ngroups = 1;
    p.nunits = 1;
    p.units = u;
    p.shard_total = (int64_t)n;
    jobspec_t spec;
    jobspec_defaults(&spec);
    const optim_config oc = optim_config_of(&spec);
    float *gg = bo[0].got, *w = h_copy(seg, n), *m = hbuf(n * sizeof(float)), *v = hbuf(n * sizeof(float));
    memset(m, 0, n * sizeof(float));
    memset(v, 0, n * sizeof(float));
    float *d_w = d_upload(seg, n * sizeof(float)), *d_m = d_upload(m, n * sizeof(float));
    float *d_v = d_upload(v, n * sizeof(float)), *d_gg = d_upload(gg, n * sizeof(float));
    optim_adamw_shard(&p, 0, w, gg, m, v, 1, 1e-3, &oc, 1.0f);
    const int64_t segs[2] = {0, (int64_t)n};
    int64_t *d_segs = d_upload(segs, sizeof segs);
    ops_cuda_adamw_consts_t k = ops_cuda_adamw_consts(1, 1e-3, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, 1.0f);
    out_t ao[] = {{.name = "A | B after AdamW", .ref = w, .dev = d_w, .n = n, .kind = OUT_F32, .tol = TOL_F32}};
    RUN_AND_COMPARE("lora_adamw", t->name, 0, ao,
                    ops_cuda_adamw(d_w, NULL, d_m, d_v, d_gg, (int64_t)n, d_segs, 1, &k, &g_ctx));
  }
  free_all();
}

void check_lora_ops(void) {
  /* GPT-2 C = 64: c_attn (64 → 192, the whole row); Llama C = 64, 4 heads of 16 over 2 kv heads
   * (q|k|v 128 wide: k at columns 64..95), F = 88: down_proj (88 → 64); rank 8, alpha 16; T = 70
   * rows of ragged tiles */
  static const lora_target targets[] = {{"gpt2 c_attn", 140, 64, 192, 0, 192, 8, 2.0f},
                                        {"llama k_proj", 140, 64, 32, 64, 128, 8, 2.0f},
                                        {"llama down_proj", 140, 88, 64, 0, 64, 8, 2.0f}};
  printf("\n== LoRA: the adapters' products and AdamW, rank 8 ==\n");
  for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) check_target(&targets[i]);
  fflush(stdout);
}
