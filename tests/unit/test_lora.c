/* test_lora — [lora]'s plan (targets, layout, refusals, memory terms against figures computed by
 * hand) and its operators (worker/model/lora.h) on the CPU device against a naive double-precision
 * reference of y += s·(x·Aᵀ)·Bᵀ and its gradients, on a fused column block as Llama's q|k|v uses. */
#include "lora.h"
#include "gpt2.h"
#include "llama.h"
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"

static jobspec_t gpt2_spec(int rank, const char *targets) {
  jobspec_t s;
  jobspec_defaults(&s);
  s.model = (model_config){.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 64, .seq_len = 8};
  s.batch_size = 2;
  s.grad_accum = 1;
  s.lora.rank = rank;
  s.lora.alpha = 8;
  snprintf(s.lora.targets, sizeof s.lora.targets, "%s", targets);
  return s;
}

static void test_gpt2_plan(void) {
  jobspec_t s = gpt2_spec(4, "c_attn, c_proj");
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 2, &p));
  if (!p) return;
  const plan_lora *l = &p->lora;
  CHECK_EQ_INT(3, l->nmods);   /* c_attn, attn.c_proj, mlp.c_proj: "c_proj" names both */
  CHECK(!strcmp(l->mod[0].path, "attn.c_attn") && l->mod[0].slot == BLK_ATTN_W);
  CHECK(!strcmp(l->mod[1].path, "attn.c_proj") && !strcmp(l->mod[2].path, "mlp.c_proj"));
  int64_t C = 16, r = 4;
  CHECK_EQ_INT(r * (C + 3 * C) + r * (C + C) + r * (4 * C + C), l->block_numel);
  CHECK_EQ_INT(2 * l->block_numel, l->numel);
  CHECK_EQ_INT(0, l->mod[0].a_off);
  CHECK_EQ_INT(r * C, l->mod[0].b_off);
  CHECK_EQ_INT(r * C + 3 * C * r, l->mod[1].a_off);
  CHECK_NEAR(2.0, l->scale, 0, 0);
  /* memory: the adapters replace the base's gradient and AdamW state; no reduce-scatter buffers */
  uint64_t NA = (uint64_t)l->numel, BT = 16;
  CHECK_EQ_INT(4 * NA, p->mem[MEM_GRAD_SHARD]);
  CHECK_EQ_INT(8 * NA, p->mem[MEM_OPTIM_STATE]);
  CHECK_EQ_INT(4 * (uint64_t)p->shard_total + 4 * NA, p->mem[MEM_PARAM_SHARD]);   /* an fp32 base */
  CHECK_EQ_INT(4 * PLAN_STEP_SCALARS, p->mem[MEM_COMM]);
  CHECK_EQ_INT(2 * 3 * BT * r, l->saved);
  CHECK_EQ_INT(BT * r, l->ws);
  CHECK_EQ_INT(0, p->sent_bytes[COLL_REDUCESCATTER]);
  /* 2·(N−1)/N = 1: the scalars, the adapters' gradient, and the frozen root's two parts (fp32): the
   * lookup's wte + wpe (64·16 + 8·16) and the head's tied wte through ln_f (the whole root, 1184) */
  CHECK_EQ_INT(4 * PLAN_STEP_SCALARS + 4 * NA + 4 * 1152 + 4 * 1184, p->sent_bytes[COLL_ALLREDUCE]);
  CHECK_EQ_INT(0, p->lora.sharded);   /* auto: two small blocks hold less replicated (test_sharded_plan) */
  char name[128];
  plan_lora_name(p, 1, 2, 1, name, sizeof name);
  CHECK(!strcmp(name, "base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight"));
  plan_destroy(&p);

  /* a bf16 base is held in bf16 alone: no fp32 master beside it */
  s.param_dtype = DTYPE_BF16;
  CHECK_OK(plan_build(&s, 2, &p));
  if (p) {
    CHECK_EQ_INT(2 * (uint64_t)p->shard_total + 4 * (uint64_t)p->lora.numel, p->mem[MEM_PARAM_SHARD]);
    plan_destroy(&p);
  }
  /* the default: peft's (c_attn); activation checkpointing keeps one block's x·Aᵀ */
  s = gpt2_spec(2, "");
  s.ackpt = ACKPT_FULL;
  CHECK_OK(plan_build(&s, 1, &p));
  if (p) {
    CHECK_EQ_INT(1, p->lora.nmods);
    CHECK_EQ_INT(BT * 2, p->lora.saved);
    plan_destroy(&p);
  }
  /* no LoRA: nothing changes */
  s = gpt2_spec(0, "");
  CHECK_OK(plan_build(&s, 2, &p));
  if (p) {
    CHECK_EQ_INT(0, p->lora.numel);
    CHECK_EQ_INT(4 * (uint64_t)p->shard_total, p->mem[MEM_GRAD_SHARD]);
    plan_destroy(&p);
  }
}

/* [lora] adapters = sharded: block l's adapters padded to 2·64 and halved (GPT-2 C 16, r 4 on c_attn,
 * c_proj: 704 per block, Pa 768, Sa 384), every term counted by hand; auto's choice both ways. */
static void test_sharded_plan(void) {
  jobspec_t s = gpt2_spec(4, "c_attn, c_proj");
  s.lora.adapters = ADAPTERS_SHARDED;
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 2, &p));
  if (!p) return;
  const plan_lora *l = &p->lora;
  CHECK_EQ_INT(1, l->sharded);
  CHECK_EQ_INT(704, l->block_numel);
  CHECK_EQ_INT(768, l->a_padded);
  CHECK_EQ_INT(384, l->a_shard);
  uint64_t SA = 2 * 384, Pb = (uint64_t)p->units[1].padded, Sb = (uint64_t)p->units[1].shard_numel;
  CHECK_EQ_INT((int64_t)SA, plan_lora_held(p));
  CHECK_EQ_INT(4 * (uint64_t)p->shard_total + 4 * SA, p->mem[MEM_PARAM_SHARD]);   /* fp32 base; CPU: no bf16 form */
  CHECK_EQ_INT(4 * SA, p->mem[MEM_GRAD_SHARD]);
  CHECK_EQ_INT(8 * SA, p->mem[MEM_OPTIM_STATE]);
  /* the root's larger part (1184: tied, the whole root), two block slots, two adapter slots (fp32 on the CPU) */
  CHECK_EQ_INT(4 * (1184 + 2 * Pb) + 4 * 2 * 768, p->mem[MEM_GATHERED]);
  /* two fp32 block gradients of Pa and the ring's scratch of Sa, the scalars */
  CHECK_EQ_INT(4 * (2 * 768 + 384) + 4 * PLAN_STEP_SCALARS, p->mem[MEM_COMM]);
  /* blocks and adapters gathered twice, the adapters reduce-scattered once, in fp32 (N − 1 = 1) */
  CHECK_EQ_INT(4 * 2 * 2 * Sb + 4 * 2 * SA, p->sent_bytes[COLL_ALLGATHER]);
  CHECK_EQ_INT(4 * SA, p->sent_bytes[COLL_REDUCESCATTER]);
  CHECK_EQ_INT(4 * PLAN_STEP_SCALARS + 4 * 1152 + 4 * 1184, p->sent_bytes[COLL_ALLREDUCE]);
  plan_destroy(&p);
  /* hybrid, groups of 1 over 2 ranks: a block's adapters whole (unpadded) in each group, all-reduced across them */
  s.sharding = SHARD_HYBRID;
  s.shard_group = 1;
  CHECK_OK(plan_build(&s, 2, &p));
  if (p) {
    CHECK_EQ_INT(704, p->lora.a_padded);
    CHECK_EQ_INT(0, p->sent_bytes[COLL_REDUCESCATTER]);
    CHECK_EQ_INT(4 * PLAN_STEP_SCALARS + 2 * (2 * 4 * 704 / 2), p->sent_inter[COLL_ALLREDUCE]);
    plan_destroy(&p);
  }
  /* auto: replicated at world 1 and for these two small blocks (16·NA = 22,528 bytes against the shards'
   * 12,288 + the slots' 6,144 + the reduce buffers' 7,680), sharded with 8 blocks (90,112 against 62,976) */
  s = gpt2_spec(4, "c_attn, c_proj");
  CHECK_OK(plan_build(&s, 2, &p));
  if (p) CHECK_EQ_INT(0, p->lora.sharded);
  plan_destroy(&p);
  s.model.n_layer = 8;
  CHECK_OK(plan_build(&s, 2, &p));
  if (p) CHECK_EQ_INT(1, p->lora.sharded);
  plan_destroy(&p);
  CHECK_OK(plan_build(&s, 1, &p));
  if (p) CHECK_EQ_INT(0, p->lora.sharded);
  plan_destroy(&p);
  s.sharding = SHARD_NONE;
  s.lora.adapters = ADAPTERS_SHARDED;   /* a plan without sharding (jobspec refuses the job): whole */
  CHECK_OK(plan_build(&s, 2, &p));
  if (p) CHECK_EQ_INT(0, p->lora.sharded);
  plan_destroy(&p);
}

/* The sharded checkpoint layout round trip: each writer's shard scattered into the whole and picked
 * back, padding zero. */
static void test_scatter_pick(void) {
  jobspec_t s = gpt2_spec(4, "c_attn, c_proj");
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 1, &p));
  if (!p) return;
  int64_t NA = p->lora.numel, W = 3, Sa = plan_lora_padded(p, 3) / 3;
  CHECK_EQ_INT(768, plan_lora_padded(p, 3));   /* 704 rounded up to 3·64 */
  float *whole = calloc((size_t)NA, 4), *back = calloc((size_t)NA, 4), *sh = calloc((size_t)(2 * Sa), 4);
  for (int64_t i = 0; i < NA; i++) whole[i] = (float)(i + 1);
  for (int q = 0; q < W; q++) {
    plan_lora_pick(p, (int)W, q, whole, sh);
    for (int u = 0; u < 2; u++)
      for (int64_t i = 0; i < Sa; i++) {
        int64_t k = q * Sa + i;
        CHECK_NEAR(k < 704 ? (double)(u * 704 + k + 1) : 0.0, sh[u * Sa + i], 0, 0);
      }
    plan_lora_scatter(p, (int)W, q, sh, back);
  }
  CHECK(!memcmp(whole, back, (size_t)NA * 4));
  free(whole), free(back), free(sh);
  plan_destroy(&p);
}

static void test_refusals(void) {
  plan_t *p = NULL;
  jobspec_t s = gpt2_spec(4, "c_attn, q_proj");
  CHECK(plan_build(&s, 1, &p) == FSDP_ERR_INVALID && !p);
  CHECK(strstr(fsdp_last_error(), "'q_proj' is no module") && strstr(fsdp_last_error(), "c_attn, c_proj, c_fc"));
  s = gpt2_spec(17, "c_attn");   /* C = 16 */
  CHECK(plan_build(&s, 1, &p) == FSDP_ERR_RANGE && !p);
  CHECK(strstr(fsdp_last_error(), "rank = 17 is above the width of attn.c_attn") != NULL);
  s = gpt2_spec(4, " , ");
  CHECK(plan_build(&s, 1, &p) == FSDP_ERR_INVALID && !p);
}

static void test_llama_plan(void) {
  jobspec_t s;
  jobspec_defaults(&s);
  s.model = (model_config){.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 1, .n_head = 4, .n_kv_head = 2, .n_embd = 16,
                           .vocab_size = 64, .seq_len = 8, .ffn_dim = 24, .norm_eps = 1e-5, .rope_theta = 10000};
  s.batch_size = 1;
  s.lora.rank = 2;
  s.lora.alpha = 4;
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 1, &p));   /* peft's default: q_proj, v_proj */
  if (!p) return;
  CHECK_EQ_INT(2, p->lora.nmods);
  const plan_lora_mod *v = plan_lora_of(p, LBLK_V);
  CHECK(v && !strcmp(v->path, "self_attn.v_proj"));
  if (v) {   /* v's columns of the fused q|k|v rows: after q (C) and k (KV = 2·4) */
    CHECK_EQ_INT(16 + 8, v->col0);
    CHECK_EQ_INT(16 + 2 * 8, v->ld);
    CHECK_EQ_INT(8, v->out);
  }
  CHECK(plan_lora_of(p, LBLK_K) == NULL);
  plan_destroy(&p);
}

/* [lora] base_dtype = nf4: a block's NF4 image counted by hand (Llama C 64, KV 32, F 128: q and o 4096
 * elements, k and v 2048, gate, up and down 8192; n/2 codes + n/64 scale codes + one group scale + the
 * offset each, the two norms in bf16), the memory terms from it, and the refusals. */
static void test_nf4_plan(void) {
  jobspec_t s;
  jobspec_defaults(&s);
  s.model = (model_config){.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 64,
                           .vocab_size = 64, .seq_len = 8, .ffn_dim = 128, .norm_eps = 1e-5, .rope_theta = 10000};
  s.batch_size = 1;
  s.lora.rank = 2;
  s.lora.alpha = 4;
  s.lora.base_dtype = BASE_NF4;
  s.param_dtype = DTYPE_BF16;
  s.grad_accum = 1;   /* the gathers: the root once, each block twice (N − 1 = 1) */
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 2, &p));
  if (!p) return;
  int64_t q = 2048 + 64 + 4 + 4, k = 1024 + 32 + 4 + 4, g = 4096 + 128 + 4 + 4;
  CHECK_EQ_INT(2 * q + 2 * k + 3 * g + 2 * 2 * 64, p->lora.nf4_block);
  CHECK_EQ_INT(19328, p->lora.nf4_padded);   /* 19320 rounded up to 2·64 */
  CHECK_EQ_INT(9664, p->lora.nf4_shard);
  uint64_t NA = (uint64_t)p->lora.numel, Pr = (uint64_t)p->units[0].padded, Pb = (uint64_t)p->units[1].padded;
  CHECK_EQ_INT(2 * (uint64_t)p->units[0].shard_numel + 2 * 9664 + 4 * NA, p->mem[MEM_PARAM_SHARD]);
  /* full, prefetch 1, two blocks: the root's larger part (the head's: norm 64 + lm_head 64·64, not
   * the whole root Pr), both slots; the working unit; the CPU's fp32 copies */
  uint64_t R = 64 + 64 * 64;
  CHECK(R < Pr);
  CHECK_EQ_INT(2 * R + 2 * 19328 + 2 * Pb + 4 * (R + Pb), p->mem[MEM_GATHERED]);
  CHECK_EQ_INT(2 * Pb, plan_lora_dequant_bytes(p));
  CHECK_EQ_INT(2 * 2 * 9664, p->sent_bytes[COLL_ALLGATHER]);   /* the blocks twice; the root is all-reduced */
  CHECK_EQ_INT(4 * PLAN_STEP_SCALARS + 4 * NA + 2 * 4096 + 2 * R, p->sent_bytes[COLL_ALLREDUCE]);
  plan_destroy(&p);
  /* a width that is not a multiple of 64 is refused at plan, in one line */
  s.model.n_embd = 96, s.model.n_head = 4, s.model.ffn_dim = 160;
  CHECK(plan_build(&s, 2, &p) == FSDP_ERR_UNSUPPORTED && !p);
  CHECK(strstr(fsdp_last_error(), "base_dtype = nf4") && strstr(fsdp_last_error(), "multiple of 64") &&
        !strchr(fsdp_last_error(), '\n'));
  /* the job file: nf4 without [lora], and a base dtype against param_dtype, refused; bf16 sets param_dtype */
  static const char *head = "[job]\nsteps = 1\n[model]\nn_layer = 1\nn_head = 2\nn_embd = 64\nvocab_size = 64\n"
                            "seq_len = 8\n[data]\ntrain = synthetic:markov:1\n";
  char text[1024];
  jobspec_t js;
  snprintf(text, sizeof text, "%s[lora]\nbase_dtype = nf4\n", head);
  CHECK(jobspec_parse(text, "t.ini", "/tmp", &js) != FSDP_OK && strstr(fsdp_last_error(), "needs [lora] rank > 0"));
  snprintf(text, sizeof text, "%s[fsdp]\nparam_dtype = fp32\n[lora]\nrank = 2\nbase_dtype = bf16\n", head);
  CHECK(jobspec_parse(text, "t.ini", "/tmp", &js) != FSDP_OK && strstr(fsdp_last_error(), "disagree"));
  snprintf(text, sizeof text, "%s[lora]\nrank = 2\nbase_dtype = bf16\n", head);
  CHECK_OK(jobspec_parse(text, "t.ini", "/tmp", &js));
  CHECK(js.param_dtype == DTYPE_BF16);
}

/* The Llama family's members share its descriptor: Mistral's adapters are Llama's (peft's default
 * q_proj, v_proj, named as MistralForCausalLM's). Phi-3's fused projections are one module each, as
 * peft wraps Phi3ForCausalLM's nn.Linear: qkv_proj one adapter over all of q|k|v's columns, gate_up_proj
 * over gate|up's; peft has no default for phi3, so a job without targets is refused, and Llama's
 * unfused names are no Phi-3 module. */
static void test_family_members(void) {
  jobspec_t s;
  jobspec_defaults(&s);
  s.model = (model_config){.arch = ARCH_MISTRAL, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 16,
                           .vocab_size = 64, .seq_len = 8, .ffn_dim = 24, .norm_eps = 1e-5, .rope_theta = 10000,
                           .sliding_window = 4};
  s.batch_size = 1;
  s.lora.rank = 2;
  s.lora.alpha = 4;
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 1, &p));
  if (p) {
    CHECK_EQ_INT(2, p->lora.nmods);
    CHECK(plan_lora_of(p, LBLK_Q) && plan_lora_of(p, LBLK_V) && !plan_lora_of(p, LBLK_K));
    char name[128];
    plan_lora_name(p, 1, 1, 0, name, sizeof name);
    CHECK(!strcmp(name, "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"));
    plan_destroy(&p);
  }
  s.model.arch = ARCH_PHI3;
  s.model.sliding_window = 0;
  CHECK(plan_build(&s, 1, &p) == FSDP_ERR_INVALID && !p);
  CHECK(strstr(fsdp_last_error(), "[lora] targets is required with arch = phi3") &&
        strstr(fsdp_last_error(), "allowed: qkv_proj, o_proj, gate_up_proj, down_proj") &&
        !strchr(fsdp_last_error(), '\n'));
  snprintf(s.lora.targets, sizeof s.lora.targets, "q_proj, o_proj");
  CHECK(plan_build(&s, 1, &p) == FSDP_ERR_INVALID && !p);
  CHECK(strstr(fsdp_last_error(), "'q_proj' is no module of a phi3 block"));
  snprintf(s.lora.targets, sizeof s.lora.targets, "qkv_proj, o_proj, gate_up_proj, down_proj");
  CHECK_OK(plan_build(&s, 1, &p));
  if (!p) return;
  CHECK_EQ_INT(4, p->lora.nmods);
  const int64_t C = 16, Q = 16 + 2 * 8, F = 24, r = 2;   /* KV = 2 heads of 4 */
  const plan_lora_mod *qkv = plan_lora_of(p, LBLK_Q), *gu = plan_lora_of(p, LBLK_GATE), *o = plan_lora_of(p, LBLK_O);
  CHECK(!plan_lora_of(p, LBLK_K) && !plan_lora_of(p, LBLK_V) && !plan_lora_of(p, LBLK_UP) && plan_lora_of(p, LBLK_DOWN));
  CHECK(qkv && gu && o);
  if (qkv && gu && o) {
    CHECK(!strcmp(qkv->path, "self_attn.qkv_proj") && !strcmp(gu->path, "mlp.gate_up_proj"));
    CHECK(qkv->in == C && qkv->out == Q && qkv->col0 == 0 && qkv->ld == Q);
    CHECK(gu->in == C && gu->out == 2 * F && gu->col0 == 0 && gu->ld == 2 * F);
    CHECK(o->in == C && o->out == C && o->ld == C);
  }
  CHECK_EQ_INT(r * C + Q * r + r * C + C * r + r * C + 2 * F * r + r * F + C * r, p->lora.block_numel);
  char name[128];
  plan_lora_name(p, 1, 0, 1, name, sizeof name);
  CHECK(!strcmp(name, "base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight"));
  plan_destroy(&p);
}

/* The operators on one fused target (Llama's v_proj) against a double reference: y's other columns
 * untouched, its own += s·(x·Aᵀ)·Bᵀ; dx += ((s·dy_v·B)·A); dA += (s·dy_v·B)ᵀ·x; dB += dy_vᵀ·(s·x·Aᵀ). */
static void test_operators(void) {
  jobspec_t s;
  jobspec_defaults(&s);
  s.model = (model_config){.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 1, .n_head = 4, .n_kv_head = 2, .n_embd = 16,
                           .vocab_size = 64, .seq_len = 4, .ffn_dim = 24, .norm_eps = 1e-5, .rope_theta = 10000};
  s.batch_size = 2;
  s.lora.rank = 3;
  s.lora.alpha = 6;
  snprintf(s.lora.targets, sizeof s.lora.targets, "v_proj");
  plan_t *p = NULL;
  device_t *d = NULL;
  lora_ctx *l = NULL;
  CHECK_OK(plan_build(&s, 1, &p));
  CHECK_OK(dev_new_cpu(DEV_CPU_SYNC, &d));
  if (!p || !d) return;
  CHECK_OK(lora_new(p, 0, d, &l));
  if (!l) return;
  const plan_lora_mod *m = plan_lora_of(p, LBLK_V);
  int BT = 8, r = 3, in = (int)m->in, out = (int)m->out, ld = (int)m->ld, c0 = (int)m->col0;
  double sc = 2.0;
  float *x = calloc((size_t)BT * in, 4), *y = calloc((size_t)BT * ld, 4), *y0 = calloc((size_t)BT * ld, 4);
  float *dy = calloc((size_t)BT * ld, 4), *dx = calloc((size_t)BT * in, 4);
  for (int i = 0; i < BT * in; i++) x[i] = (float)rng_normal(1, 1, (uint64_t)i);
  for (int i = 0; i < BT * ld; i++) y0[i] = y[i] = (float)rng_normal(1, 2, (uint64_t)i);
  for (int i = 0; i < BT * ld; i++) dy[i] = (float)rng_normal(1, 3, (uint64_t)i);
  for (int i = 0; i < BT * in; i++) dx[i] = 0.5f;
  for (int64_t i = 0; i < l->n; i++) l->param[i] = (float)(0.3 * rng_normal(1, 4, (uint64_t)i));
  const float *A = l->param + m->a_off, *B = l->param + m->b_off;
  lora_forward(l, 0, LBLK_V, y, x);
  lora_forward(l, 0, LBLK_Q, y, x);   /* not a target: nothing */
  lora_backward(l, 0, LBLK_V, dx, dy, x);
  CHECK_OK(d->op->sync(d));
  double worst_y = 0, worst_dx = 0, worst_da = 0, worst_db = 0;
  for (int t = 0; t < BT; t++) {
    double h[3], g[3];
    for (int k = 0; k < r; k++) {
      h[k] = 0;
      for (int i = 0; i < in; i++) h[k] += (double)x[t * in + i] * A[k * in + i];
      g[k] = 0;
      for (int o = 0; o < out; o++) g[k] += (double)dy[t * ld + c0 + o] * B[o * r + k];
      g[k] *= sc;   /* d(x·Aᵀ) */
    }
    for (int c = 0; c < ld; c++) {
      double want = y0[t * ld + c];
      if (c >= c0 && c < c0 + out)
        for (int k = 0; k < r; k++) want += sc * h[k] * B[(c - c0) * r + k];
      worst_y = fmax(worst_y, fabs(want - y[t * ld + c]));
    }
    for (int i = 0; i < in; i++) {
      double want = 0.5;
      for (int k = 0; k < r; k++) want += g[k] * A[k * in + i];
      worst_dx = fmax(worst_dx, fabs(want - dx[t * in + i]));
    }
  }
  for (int k = 0; k < r; k++)
    for (int i = 0; i < in; i++) {
      double want = 0;
      for (int t = 0; t < BT; t++) {
        double gk = 0;
        for (int o = 0; o < out; o++) gk += (double)dy[t * ld + c0 + o] * B[o * r + k];
        want += sc * gk * x[t * in + i];
      }
      worst_da = fmax(worst_da, fabs(want - l->grad[m->a_off + k * in + i]));
    }
  for (int o = 0; o < out; o++)
    for (int k = 0; k < r; k++) {
      double want = 0;
      for (int t = 0; t < BT; t++) {
        double hk = 0;
        for (int i = 0; i < in; i++) hk += (double)x[t * in + i] * A[k * in + i];
        want += dy[t * ld + c0 + o] * sc * hk;
      }
      worst_db = fmax(worst_db, fabs(want - l->grad[m->b_off + o * r + k]));
    }
  /* fp32 sums of at most 16·3·8 products of O(1) values: a few 1e-6 */
  CHECK_NEAR(0, worst_y, 1e-5, 0);
  CHECK_NEAR(0, worst_dx, 1e-5, 0);
  CHECK_NEAR(0, worst_da, 1e-4, 0);
  CHECK_NEAR(0, worst_db, 1e-4, 0);
  /* peft's initialization: A within ±1/√in, B zero */
  lora_init_values(p, 7, l->param);
  double amax = 0, bmax = 0;
  for (int i = 0; i < r * in; i++) amax = fmax(amax, fabs(l->param[m->a_off + i]));
  for (int i = 0; i < out * r; i++) bmax = fmax(bmax, fabs(l->param[m->b_off + i]));
  CHECK(amax > 0.5 / sqrt(in) && amax <= 1.0 / sqrt(in));
  CHECK(bmax == 0);
  free(x), free(y), free(y0), free(dy), free(dx);
  lora_destroy(&l);
  dev_destroy(&d);
  plan_destroy(&p);
}

/* [lora] on device = cuda is accepted (it was refused), and planned beyond the same job without
 * LoRA: the adapters' fp32 master and bf16 compute form, fp32 gradient and AdamW state, bf16 x·Aᵀ
 * and scratch, and AdamW's decay table of the adapters' L tensors (16 bytes each) */
static void test_cuda(void) {
  const char *text = "[model]\narch = gpt2\nn_layer = 2\nn_head = 2\nn_embd = 128\nvocab_size = 64\nseq_len = 8\n"
                     "[data]\ntrain = synthetic:markov:1\nbatch_size = 2\n[fsdp]\ndevice = cuda\nworld_size = 1\n"
                     "[lora]\nrank = 4\nalpha = 8\n";
  jobspec_t s, base;
  CHECK_OK(jobspec_parse(text, "lora-cuda.ini", ".", &s));
  base = s;
  base.lora.rank = 0;
  plan_t *p = NULL, *pb = NULL;
  CHECK_OK(plan_build(&s, 1, &p));
  CHECK_OK(plan_build(&base, 1, &pb));
  if (p && pb) {
    uint64_t NA = (uint64_t)p->lora.numel, BT = 16, r = 4, L = 2;
    CHECK_EQ_INT(6 * NA, p->mem[MEM_PARAM_SHARD] - pb->mem[MEM_PARAM_SHARD]);
    CHECK_EQ_INT(4 * NA, p->mem[MEM_GRAD_SHARD]);
    CHECK_EQ_INT(8 * NA, p->mem[MEM_OPTIM_STATE]);
    CHECK_EQ_INT(2 * L * BT * r, p->mem[MEM_ACTIVATIONS] - pb->mem[MEM_ACTIVATIONS]);
    CHECK_EQ_INT(2 * BT * r + 16 * L, p->mem[MEM_WORKSPACE] - pb->mem[MEM_WORKSPACE]);
  }
  plan_destroy(&p);
  plan_destroy(&pb);
}

int main(void) {
  test_cuda();
  test_gpt2_plan();
  test_sharded_plan();
  test_scatter_pick();
  test_refusals();
  test_llama_plan();
  test_nf4_plan();
  test_family_members();
  test_operators();
  return check_done();
}
