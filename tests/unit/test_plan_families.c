/* test_plan_families — the plans of the families beyond GPT-2 against figures computed by hand:
 * Llama's names, parameter count, FLOPs and bad shapes, the model's math on the wire (planmsg), Gemma 3
 * with its LoRA columns, and Mistral's sliding-window FLOPs. */
#include "arch.h"
#include "ctl_planout.h"
#include "gemma3.h"
#include "llama.h"
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "planmsg.h"
#include "planspec.h"

static jobspec_t llama_of(int L, int H, int KV, int C, int F, int V, int T) {
  jobspec_t s = spec_of(L, H, C, V, T);
  s.model.arch = ARCH_LLAMA;
  s.model.n_kv_head = KV;
  s.model.ffn_dim = F;
  s.model.norm_eps = 1e-5;
  s.model.rope_theta = 500000;
  return s;
}

/* Llama: Hugging Face's names, shapes, order, gids and decay; the parameter count of Llama-3.2-1B
 * (untied: its published 1,235,814,400 with tied embeddings plus a 128256 x 2048 lm_head); FLOPs,
 * activation terms and the CUDA decay table by hand. */
static void test_llama(void) {
  plan_t *p = NULL;
  jobspec_t s = llama_of(16, 32, 8, 2048, 8192, 128256, 2048);
  CHECK_OK(plan_build(&s, 8, &p));
  CHECK_EQ_INT(1235814400LL + 128256LL * 2048, p->n_params);
  CHECK_EQ_INT(1235814400LL + 128256LL * 2048 - 2 * 128256LL * 2048, p->n_params_no_emb);
  /* 6·(Ψ − embed_tokens) + 12·L·C·T = 6·1,235,814,400 + 12·16·2048·2048 */
  CHECK_NEAR(7414886400.0 + 805306368.0, p->flops_per_token, 0, 0);
  CHECK_EQ_INT(2 + 7 * 16, p->n_decay);
  plan_destroy(&p);
  /* tied, as published: Ψ is Llama-3.2-1B's 1,235,814,400 (embed_tokens once), the head's matmul is
   * real compute through it (6·Ψ + 12·L·C·T), one 2-D root tensor; the table says so */
  s.model.tie_embeddings = 1;
  s.model.rope_scaling = ROPE_SCALING_LLAMA3;
  s.model.rope_factor = 32, s.model.rope_low_freq_factor = 1, s.model.rope_high_freq_factor = 4;
  s.model.rope_original_max_pos = 8192;
  CHECK_OK(plan_build(&s, 8, &p));
  if (p) {
    CHECK_EQ_INT(1235814400LL, p->n_params);
    CHECK_EQ_INT(1235814400LL - 128256LL * 2048, p->n_params_no_emb);
    CHECK_NEAR(6.0 * 1235814400.0 + 805306368.0, p->flops_per_token, 0, 0);
    CHECK_EQ_INT(1 + 7 * 16, p->n_decay);
    CHECK_EQ_INT(2, p->units[0].ntensors);
    CHECK(plan_find_tensor(p, "lm_head.weight", NULL) == NULL);
    CHECK_EQ_INT(LROOT_EMBED, plan_head_slot(p));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ctl_plan_print(p, f, 0);
    fclose(f);
    CHECK(strstr(buf, "tied: lm_head is model.embed_tokens.weight (one tensor, both uses); rope llama3 factor 32, "
                      "low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192") != NULL);
    CHECK(strstr(buf, "the tied embed_tokens counted once") != NULL);
    free(buf);
  }
  plan_destroy(&p);
  /* a hand-built llama3 scaling out of range is refused by the plan too */
  s.model.rope_high_freq_factor = 1;
  CHECK(plan_build(&s, 8, &p) == FSDP_ERR_RANGE);
  CHECK(strstr(fsdp_last_error(), "0 < low < high") != NULL);
  s = llama_of(16, 32, 8, 2048, 8192, 128256, 2048);

  /* tiny, by hand: root 2·16·8 + 8 = 264; layer 2·8 + 2·64 + 2·(2·2)·8 + 3·12·8 = 496 */
  const int64_t C = 8, KV = 4, F = 12;
  s = llama_of(2, 4, 2, 8, 12, 16, 4);
  s.batch_size = 2;
  s.grad_accum = 1;
  CHECK_OK(plan_build(&s, 2, &p));
  if (!p) return;
  CHECK_EQ_INT(1256, p->n_params);
  CHECK_EQ_INT(1256 - 256, p->n_params_no_emb);
  CHECK_NEAR(6.0 * (1256 - 128) + 12.0 * 2 * 8 * 4, p->flops_per_token, 0, 0);
  CHECK_EQ_INT(264, p->units[0].numel);
  CHECK_EQ_INT(496, p->units[1].numel);
  static const char *const root[LROOT_NT] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
  static const int64_t rshape[LROOT_NT][2] = {{16, 8}, {8, 0}, {16, 8}};
  for (int j = 0; j < LROOT_NT; j++) {
    const plan_tensor *t = &p->units[0].t[j];
    CHECK(!strcmp(t->name, root[j]));
    CHECK_EQ_INT(rshape[j][0], t->shape[0]);
    CHECK_EQ_INT(rshape[j][1], t->shape[1]);
    CHECK_EQ_INT(j, t->gid);
    CHECK_EQ_INT(rshape[j][1] != 0, t->decay);
  }
  static const char *const blk[9] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight"};
  const int64_t bshape[9][2] = {{C, 0}, {C, C}, {KV, C}, {KV, C}, {C, C}, {C, 0}, {F, C}, {F, C}, {C, F}};
  expect_blocks(p, 2, "layers.%d", "model.layers.%d.%s", "layers.%d.%s", LROOT_NT, 9, blk, bshape);
  CHECK(plan_find_tensor(p, "lm_head.weight", NULL) == &p->units[0].t[LROOT_HEAD]);
  CHECK(plan_find_tensor(p, "embed_tokens.weight", NULL) == &p->units[0].t[LROOT_EMBED]);
  CHECK(plan_find_tensor(p, "wte.weight", NULL) == NULL);
  CHECK(plan_find_tensor(p, "model.layers.2.input_layernorm.weight", NULL) == NULL);
  /* activations, B = 2, T = 4 on the CPU: BT = 8, Q = 16, ATT = B·H·T·T = 128
   *   block_saved = 8·(5·8 + 16 + 3·12) + 2·8 + 128 = 880; root_saved = 2·64 + 8 = 136
   *   bwd_ws = 3·64 + 8·12 + 8·24 + 128 = 608; head_ws = 8·16 + 8 + 64 = 200 */
  CHECK_EQ_INT(880, p->act.block_saved);
  CHECK_EQ_INT(136, p->act.root_saved);
  CHECK_EQ_INT(608, p->act.bwd_ws);
  CHECK_EQ_INT(200, p->act.head_ws);
  CHECK_EQ_INT(4 * 880, p->act.block_bytes);
  CHECK_EQ_INT(0, p->act.block_ws);
  CHECK_EQ_INT((int64_t)(2 * 4 * 880 + 4 * 136 + 8 * 2 * 4), (int64_t)p->mem[MEM_ACTIVATIONS]);
  CHECK_EQ_INT(4 * 608, (int64_t)p->mem[MEM_WORKSPACE]);
  plan_destroy(&p);
  /* checkpointing: a layer keeps its output; one working set of a whole layer's activations */
  s.ackpt = ACKPT_FULL;
  CHECK_OK(plan_build(&s, 2, &p));
  if (!p) return;
  CHECK_EQ_INT(64, p->act.block_saved);
  CHECK_EQ_INT(880, p->act.block_ws);
  plan_destroy(&p);
  /* CUDA: bf16 acts, fp32 statistics and attention state (B·H·T), 16 bytes per decay segment */
  s.ackpt = ACKPT_NONE;
  s.device = DEVICE_CUDA;
  s.param_dtype = DTYPE_BF16;
  CHECK_OK(plan_build(&s, 2, &p));
  if (!p) return;
  CHECK_EQ_INT(2 * 8 * (5 * 8 + 16 + 3 * 12) + 4 * (2 * 8 + 2 * 4 * 4), p->act.block_bytes);
  CHECK_EQ_INT(2 + 7 * 2, p->n_decay);
  plan_destroy(&p);

  /* the architecture's rules, checked again on a spec from the wire */
  s = llama_of(2, 4, 3, 8, 12, 16, 4);
  CHECK(plan_build(&s, 1, &p) == FSDP_ERR_INVALID);
  CHECK(strstr(fsdp_last_error(), "n_kv_head = 3 does not divide n_head = 4") != NULL);
  s = llama_of(2, 4, 2, 12, 12, 16, 4);
  CHECK(plan_build(&s, 1, &p) == FSDP_ERR_INVALID);
  CHECK(strstr(fsdp_last_error(), "head size 3 is odd") != NULL);
  s = llama_of(2, 4, 2, 8, 0, 16, 4);
  CHECK(plan_build(&s, 1, &p) == FSDP_ERR_RANGE);
}

/* The plan on the wire carries the model's math that the units do not show: a worker whose plan
 * has the same units but another rope scaling (or theta) refuses it; the same plan passes. */
static void test_planmsg_model(void) {
  jobspec_t s = llama_of(2, 4, 2, 8, 12, 16, 4);
  plan_t *p = NULL, *q = NULL;
  Fsdp__Plan *m = NULL;
  CHECK_OK(plan_build(&s, 2, &p));
  s.model.rope_scaling = ROPE_SCALING_LLAMA3;
  s.model.rope_factor = 8, s.model.rope_low_freq_factor = 1, s.model.rope_high_freq_factor = 4;
  s.model.rope_original_max_pos = 8192;
  CHECK_OK(plan_build(&s, 2, &q));
  if (p && q) {
    CHECK_OK(planmsg_new(p, &m));
    CHECK_OK(planmsg_check(m, p));
    CHECK(planmsg_check(m, q) == FSDP_ERR_INVALID);
    CHECK(strstr(fsdp_last_error(), "the model (arch, tie, norm_eps, rope_theta or rope scaling)") != NULL);
    planmsg_destroy(&m);
    CHECK_OK(planmsg_new(q, &m));
    CHECK_OK(planmsg_check(m, q));
    CHECK(m->model->rope_scaling == 1 && m->model->rope_original_max_pos == 8192 && !m->model->tie_embeddings);
  }
  planmsg_destroy(&m);
  plan_destroy(&p);
  plan_destroy(&q);
}

/* Gemma 3's plan (skipped while models/models.def does not register it): Ψ by hand, four norms and
 * q/k norms a layer, the tied embed_tokens once, the head's matmul through it; names, the plan's lines. */
static void test_gemma3(void) {
  const arch_desc *g = arch_by_name("gemma3");
  if (!g) {
    printf("test_gemma3: gemma3 is not registered in models/models.def; skipped\n");
    return;
  }
  jobspec_t s;
  CHECK_OK(jobspec_parse("[model]\narch = gemma3\nn_layer = 2\nn_head = 2\nn_kv_head = 1\nn_embd = 32\nhead_dim = 16\n"
                         "ffn_dim = 64\nvocab_size = 300\nseq_len = 16\nsliding_window = 8\nrope_scaling = linear\n"
                         "rope_factor = 8\nsliding_window_pattern = 2\n[data]\ntrain = synthetic:markov:1\nbatch_size = 2\n"
                         "grad_accum = 1\n", "g.ini", "/", &s));
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 2, &p));
  if (!p) return;
  /* root V·C + C; a layer 4·C norms + (2·16 + 2·16)·32 q|k|v + 2·16 q/k norms + 32·32 o + 3·64·32 mlp */
  int64_t root = 300 * 32 + 32, layer = 4 * 32 + 64 * 32 + 2 * 16 + 32 * 32 + 3 * 64 * 32;
  CHECK_EQ_INT(root + 2 * layer, p->n_params);
  CHECK_EQ_INT(root + 2 * layer - 300 * 32, p->n_params_no_emb);
  /* attention: layer 1 global (full, 12·H·HD·T), layer 0 in its window of 8 at T = 16: Σ_t min(t + 1, 8)
   * = 36 + 8·8 of full causal attention's 136 scores */
  CHECK_NEAR(6.0 * (double)(root + 2 * layer) + 12.0 * 32 * 16 * (1 + 100.0 / 136), p->flops_per_token, 1e-6, 0);
  CHECK_EQ_INT(1 + 7 * 2, p->n_decay);
  CHECK_EQ_INT(2, p->units[0].ntensors);
  CHECK_EQ_INT(13, p->units[1].ntensors);
  CHECK(plan_find_tensor(p, "model.layers.1.post_feedforward_layernorm.weight", NULL) != NULL);
  CHECK(plan_find_tensor(p, "layers.0.self_attn.k_norm.weight", NULL) != NULL);
  CHECK(plan_find_tensor(p, "lm_head.weight", NULL) == NULL);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ctl_plan_print(p, f, 0);
  fclose(f);
  CHECK(strstr(buf, "layer l global iff (l + 1) % 2 == 0: full causal attention, rope theta 10000 linear factor 8; "
                    "others sliding window 8, rope theta 10000 unscaled") != NULL);
  CHECK(strstr(buf, "query_pre_attn_scalar^-1/2 = 256^-1/2") != NULL);
  free(buf);
  plan_destroy(&p);
  /* [lora]: peft's default q_proj, v_proj over the fused q|k|v rows, as model_gemma3.c runs them */
  s.lora.rank = 2;
  s.lora.alpha = 4;
  CHECK_OK(plan_build(&s, 2, &p));
  if (p) {
    const plan_lora_mod *v = plan_lora_of(p, G3_V);
    CHECK_EQ_INT(2, p->lora.nmods);
    CHECK(v && v->col0 == 32 + 16 && v->ld == 32 + 2 * 16 && v->out == 16);
    plan_destroy(&p);
  }
}

/* Mistral's attention FLOPs over its window: W = 4 at T = 16 counts Σ_t min(t + 1, 4) = 10 + 12·4 of
 * the 136 causal scores, a layer; a window of T or more, and none, count full attention. */
static void test_window_flops(void) {
  double attn[3];
  const char *windows[3] = {"4", "16", "0"};
  for (int i = 0; i < 3; i++) {
    char ini[512];
    snprintf(ini, sizeof ini, "[model]\narch = mistral\nn_layer = 3\nn_head = 2\nn_kv_head = 1\nn_embd = 16\n"
             "ffn_dim = 32\nvocab_size = 64\nseq_len = 16\nsliding_window = %s\n[data]\ntrain = synthetic:markov:1\n"
             "batch_size = 1\ngrad_accum = 1\n", windows[i]);
    jobspec_t s;
    plan_t *p = NULL;
    CHECK_OK(jobspec_parse(ini, "m.ini", "/", &s));
    CHECK_OK(plan_build(&s, 1, &p));
    if (!p) return;
    attn[i] = p->flops_per_token - 6.0 * (double)(p->n_params - 64 * 16);   /* untied: embed_tokens is a lookup */
    plan_destroy(&p);
  }
  CHECK_NEAR(12.0 * 3 * 16 * 16 * 58.0 / 136, attn[0], 1e-6, 0);
  CHECK_NEAR(12.0 * 3 * 16 * 16, attn[1], 1e-6, 0);
  CHECK_NEAR(12.0 * 3 * 16 * 16, attn[2], 1e-6, 0);
}

int main(void) {
  test_llama();
  test_planmsg_model();
  test_gemma3();
  test_window_flops();
  return check_done();
}
