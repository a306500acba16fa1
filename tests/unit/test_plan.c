/* test_plan — units, tensor layout, shard maps, parameter counts, the memory model and the
 * communication volumes against figures computed by hand, and the JSON the coordinator ships (the
 * families beyond GPT-2: test_plan_families). */
#include "ctl_planout.h"
#include "gpt2.h"
#include "plan.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "planspec.h"

static void test_param_counts(void) {
  plan_t *p = NULL;
  /* GPT-2 small as Hugging Face ships it: 124,439,808 parameters (tied wte, V 50257, 1024 positions) */
  jobspec_t s = spec_of(12, 12, 768, 50257, 1024);
  CHECK_OK(plan_build(&s, 1, &p));
  CHECK_EQ_INT(124439808, p->n_params);
  CHECK_EQ_INT(124439808 - 50257 * 768 - 1024 * 768, p->n_params_no_emb);
  CHECK_EQ_INT(13, p->nunits);
  /* 6·(Ψ − wpe) + 12·L·C·T = 6·123,653,376 + 113,246,208 */
  CHECK_NEAR(855166464.0, p->flops_per_token, 0, 0);
  CHECK_EQ_INT(50257, p->vocab_padded);   /* the CPU's classifier runs over V */
  CHECK_NEAR(0.0, p->pad_flops_per_token, 0, 0);
  plan_destroy(&p);
  /* on CUDA the classifier runs over Vp = 50304: 6·47·768 FLOPs per token more, and the padded
   * head (bf16) and its fp32 gradient, 50304·768·6 bytes, in the workspace */
  s.device = DEVICE_CUDA;
  CHECK_OK(plan_build(&s, 1, &p));
  CHECK_EQ_INT(50304, p->vocab_padded);
  CHECK_NEAR(6.0 * 47 * 768, p->pad_flops_per_token, 0, 0);
  CHECK_NEAR(855166464.0, p->flops_per_token, 0, 0);
  const int64_t BT = (int64_t)s.batch_size * 1024;
  CHECK_EQ_INT(2 * plan_classifier_chunk(BT, 50257) * 50304 + 50304 * 768 * 6 + 4 * BT + 2 * BT * 768,
               p->act.head_ws_bytes);
  s.device = DEVICE_CPU;
  plan_destroy(&p);
  /* packed rows from a token file: the rows' document starts, B·T int32, with the activations; a
   * synthetic stream has no documents, pack = false one per row: neither holds them */
  CHECK_OK(plan_build(&s, 1, &p));
  const uint64_t plain = p->mem[MEM_ACTIVATIONS];
  CHECK_EQ_INT(0, p->docs);
  plan_destroy(&p);
  jobspec_t sd = s;
  snprintf(sd.train, sizeof sd.train, "/data/chat_train.bin");
  sd.pack = 1;
  CHECK_OK(plan_build(&sd, 1, &p));
  CHECK_EQ_INT(1, p->docs);
  CHECK_EQ_INT(plain + 4 * BT, p->mem[MEM_ACTIVATIONS]);
  plan_destroy(&p);
  sd.pack = 0;
  CHECK_OK(plan_build(&sd, 1, &p));
  CHECK_EQ_INT(plain, p->mem[MEM_ACTIVATIONS]);
  plan_destroy(&p);
  CHECK(p == NULL);
  plan_destroy(&p);   /* NULL-safe */

  /* GPT-2 medium: 354,823,168 */
  s = spec_of(24, 16, 1024, 50257, 1024);
  CHECK_OK(plan_build(&s, 8, &p));
  CHECK_EQ_INT(354823168, p->n_params);
  plan_destroy(&p);

  /* tiny, by hand: root 16·8 + 4·8 + 8 + 8 = 176; block 12·64 + 13·8 = 872; 176 + 2·872 = 1920 */
  s = spec_of(2, 2, 8, 16, 4);
  CHECK_OK(plan_build(&s, 1, &p));
  CHECK_EQ_INT(1920, p->n_params);
  CHECK_EQ_INT(1920 - 128 - 32, p->n_params_no_emb);
  CHECK_EQ_INT(176, p->units[0].numel);
  CHECK_EQ_INT(872, p->units[1].numel);
  /* 6·(1920 − 32) + 12·2·8·4 = 11328 + 768 */
  CHECK_NEAR(12096.0, p->flops_per_token, 0, 0);
  plan_destroy(&p);
}

static void test_tensors(void) {
  plan_t *p = NULL;
  jobspec_t s = spec_of(3, 4, 64, 256, 32);
  CHECK_OK(plan_build(&s, 2, &p));
  const int64_t C = 64;
  static const char *const blk[BLK_NT] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
  static const int64_t shape[BLK_NT][2] = {{C, 0}, {C, 0}, {C, 3 * C}, {3 * C, 0}, {C, C}, {C, 0},
                                           {C, 0}, {C, 0}, {C, 4 * C}, {4 * C, 0}, {4 * C, C}, {C, 0}};
  const plan_unit *r = &p->units[0];
  CHECK(!strcmp(r->name, "root"));
  CHECK_EQ_INT(ROOT_NT, r->ntensors);
  CHECK(!strcmp(r->t[ROOT_WTE].name, "wte.weight"));
  CHECK_EQ_INT(256, r->t[ROOT_WTE].shape[0]);
  CHECK_EQ_INT(64, r->t[ROOT_WTE].shape[1]);
  CHECK(!strcmp(r->t[ROOT_WPE].name, "wpe.weight"));
  CHECK_EQ_INT(32, r->t[ROOT_WPE].shape[0]);
  CHECK_EQ_INT(256 * 64, r->t[ROOT_WPE].offset);
  CHECK(!strcmp(r->t[ROOT_LNF_W].name, "ln_f.weight"));
  CHECK(!strcmp(r->t[ROOT_LNF_B].name, "ln_f.bias"));
  CHECK_EQ_INT(1, r->t[ROOT_LNF_B].ndim);
  CHECK_EQ_INT(1, r->t[ROOT_WTE].decay);
  CHECK_EQ_INT(0, r->t[ROOT_LNF_W].decay);
  expect_blocks(p, 3, "h.%d", "h.%d.%s", "transformer.h.%d.%s", 4, BLK_NT, blk, shape);
  int unit = -1;
  CHECK(plan_find_tensor(p, "transformer.wte.weight", &unit) == &r->t[ROOT_WTE]);
  CHECK_EQ_INT(0, unit);
  CHECK(plan_find_tensor(p, "transformer.h.2.mlp.c_fc.bias", NULL) == &p->units[3].t[BLK_FC_B]);
  CHECK(plan_find_tensor(p, "h.3.ln_1.weight", NULL) == NULL);   /* only 3 blocks */
  CHECK(plan_find_tensor(p, "h.0.ln_3.weight", NULL) == NULL);
  CHECK(plan_find_tensor(p, "lm_head.weight", NULL) == NULL);    /* tied: there is none */
  CHECK(plan_find_tensor(p, "h.x.ln_1.weight", NULL) == NULL);
  plan_destroy(&p);
}

/* Every element of every unit is owned by exactly one rank (sharded modes) or by every rank
 * (none), for world sizes 1..64, including sizes that divide no unit. */
static void test_shard_cover(void) {
  static const model_config cfgs[] = {{.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 16, .seq_len = 4},
                                       {.n_layer = 3, .n_head = 3, .n_embd = 24, .vocab_size = 97, .seq_len = 13},
                                       {.n_layer = 1, .n_head = 1, .n_embd = 5, .vocab_size = 3, .seq_len = 7}};
  int bad = 0;
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
    for (int mode = SHARD_FULL; mode <= SHARD_NONE; mode++)
      for (int w = 1; w <= 64; w++) {
        jobspec_t s = spec_of(cfgs[c].n_layer, cfgs[c].n_head, cfgs[c].n_embd, cfgs[c].vocab_size, cfgs[c].seq_len);
        s.sharding = (shard_mode)mode;
        plan_t *p = NULL;
        if (plan_build(&s, w, &p) != FSDP_OK) {
          bad++;
          continue;
        }
        int sw = mode == SHARD_NONE ? 1 : w;
        bad += p->world != w || p->shard_world != sw;
        int64_t base = 0;
        for (int u = 0; u < p->nunits; u++) {
          const plan_unit *pu = &p->units[u];
          bad += pu->padded % ((int64_t)sw * PLAN_PAD_ALIGN) != 0;
          bad += pu->padded < pu->numel || pu->padded - pu->numel >= (int64_t)sw * PLAN_PAD_ALIGN;
          bad += pu->shard_numel * sw != pu->padded;
          bad += pu->shard_base != base;
          base += pu->shard_numel;
          unsigned char *seen = calloc((size_t)pu->padded, 1);
          for (int r = 0; r < w; r++) {
            int64_t off = plan_shard_offset(p, u, r);
            bad += off < 0 || off + pu->shard_numel > pu->padded;
            for (int64_t k = 0; k < pu->shard_numel && off + k < pu->padded; k++) seen[off + k]++;
          }
          for (int64_t k = 0; k < pu->padded; k++) bad += seen[k] != (mode == SHARD_NONE ? w : 1);
          free(seen);
        }
        bad += p->shard_total != base;
        plan_destroy(&p);
      }
  CHECK_EQ_INT(0, bad);
}

/* The tiny model below, by hand (L=3, H=2, C=8, V=16, T=4, B=3, G=2, world 4):
 *   root numel 176, block 872 (see test_param_counts).
 *   sharded, align 4·64 = 256: Pr = 256, Pb = 1024, shards 64 and 256, S = 64 + 3·256 = 832.
 *   none, align 64: Pr = 192, Pb = 896, S = 192 + 3·896 = 2880.
 *   BT = 12, BTC = 96, BHTT = 3·2·4·4 = 96:
 *     block_saved = 16·96 + 4·12 + 96 = 1680, root_saved = 2·96 + 2·12 = 216,
 *     head_ws = 12·16 + 12 + 96 = 300 (logits, losses, d lnf), bwd_ws = 7·96 + 96 = 768.
 *   activations = 4·(3·1680 + 216) + 8·12 (token ids) = 21120; workspace = 4·max(300, 768) = 3072.
 *   reduce-scatter scratch: the largest shard, max(64, 256) = 256 elements. */
static jobspec_t tiny_mem_spec(void) {
  jobspec_t s = spec_of(3, 2, 8, 16, 4);
  s.batch_size = 3;
  s.grad_accum = 2;
  return s;
}

static void test_memory_model(void) {
  plan_t *p = NULL;
  jobspec_t s = tiny_mem_spec();

  /* full, fp32, prefetch 1 */
  CHECK_OK(plan_build(&s, 4, &p));
  CHECK_EQ_INT(832, p->shard_total);
  CHECK_EQ_INT(1680, p->act.block_saved);
  CHECK_EQ_INT(216, p->act.root_saved);
  CHECK_EQ_INT(300, p->act.head_ws);
  CHECK_EQ_INT(768, p->act.bwd_ws);
  CHECK_EQ_INT(4 * 832, p->mem[MEM_PARAM_SHARD]);
  CHECK_EQ_INT(4 * 832, p->mem[MEM_GRAD_SHARD]);
  CHECK_EQ_INT(8 * 832, p->mem[MEM_OPTIM_STATE]);
  CHECK_EQ_INT(4 * (256 + 2 * 1024), p->mem[MEM_GATHERED]);   /* root + computed + 1 prefetched */
  CHECK_EQ_INT(4 * (256 + 2 * 1024 + 256) + 16, p->mem[MEM_COMM]);   /* + the step's 4 scalars */
  CHECK_EQ_INT(21120 + 96, p->mem[MEM_ACTIVATIONS]);                  /* + 8·B·T·G token ids */
  CHECK_EQ_INT(3072, p->mem[MEM_WORKSPACE]);
  CHECK_EQ_INT(3328 + 3328 + 6656 + 9216 + 21216 + 3072 + 10256, p->mem_total);   /* 57072 */
  /* sent: AG G·pb·(N−1)·(64 + 2·3·256) = 2·4·3·1600; RS 2·4·3·832; AR ⌊2·3·16/4⌋ */
  CHECK_EQ_INT(38400, p->sent_bytes[COLL_ALLGATHER]);
  CHECK_EQ_INT(19968, p->sent_bytes[COLL_REDUCESCATTER]);
  CHECK_EQ_INT(24, p->sent_bytes[COLL_ALLREDUCE]);
  plan_destroy(&p);

  /* full, bf16 params and reductions, prefetch 2 */
  s.param_dtype = s.reduce_dtype = DTYPE_BF16;
  s.prefetch = 2;
  CHECK_OK(plan_build(&s, 4, &p));
  /* bf16 gathers, then a root and a block widened to the CPU's fp32 */
  CHECK_EQ_INT(2 * (256 + 3 * 1024) + 4 * (256 + 1024), p->mem[MEM_GATHERED]);
  /* fp32 gradients (root, a block), bf16 send (root, 2 blocks), bf16 receive (root and 2 block
   * shards) and ring scratch (the largest shard), the scalars */
  CHECK_EQ_INT(4 * (256 + 1024) + 2 * (256 + 2 * 1024) + 2 * (64 + 2 * 256 + 256) + 16, p->mem[MEM_COMM]);
  CHECK_EQ_INT(4 * 832 + 2 * 832, p->mem[MEM_PARAM_SHARD]);      /* the fp32 master and its bf16 copy */
  CHECK_EQ_INT(19200, p->sent_bytes[COLL_ALLGATHER]);            /* 2·2·3·1600 */
  CHECK_EQ_INT(9984, p->sent_bytes[COLL_REDUCESCATTER]);         /* 2·2·3·832 */
  plan_destroy(&p);
  /* on CUDA the compute dtype is bf16: bf16 gathers are computed on as they are, fp32 ones converted */
  s.device = DEVICE_CUDA;
  CHECK_OK(plan_build(&s, 4, &p));
  CHECK_EQ_INT(2 * (256 + 3 * 1024), p->mem[MEM_GATHERED]);
  plan_destroy(&p);
  s.param_dtype = DTYPE_FP32;
  CHECK_OK(plan_build(&s, 4, &p));
  CHECK_EQ_INT(4 * (256 + 3 * 1024) + 2 * (256 + 1024), p->mem[MEM_GATHERED]);
  plan_destroy(&p);

  /* activation checkpointing: each block keeps its output (BTC = 96 floats); one working set of a
   * whole block (1,536 + 48 + 96 floats: the other activations plus the forward's scratch) */
  s = tiny_mem_spec();
  s.ackpt = ACKPT_FULL;
  CHECK_OK(plan_build(&s, 4, &p));
  CHECK_EQ_INT(96, p->act.block_saved);
  CHECK_EQ_INT(1680, p->act.block_ws);
  CHECK_EQ_INT(4 * (3 * 96 + 1680 + 216) + 8 * 12 * 2, p->mem[MEM_ACTIVATIONS]);   /* 8,928 */
  plan_destroy(&p);

  /* grad_op, fp32: every unit stays gathered */
  s = tiny_mem_spec();
  s.sharding = SHARD_GRAD_OP;
  CHECK_OK(plan_build(&s, 4, &p));
  CHECK_EQ_INT(4 * (256 + 3 * 1024), p->mem[MEM_GATHERED]);
  CHECK_EQ_INT(4 * (256 + 2 * 1024 + 256) + 16, p->mem[MEM_COMM]);
  CHECK_EQ_INT(19968, p->sent_bytes[COLL_ALLGATHER]);            /* 2·4·3·832 */
  CHECK_EQ_INT(19968, p->sent_bytes[COLL_REDUCESCATTER]);
  CHECK_EQ_INT(24, p->sent_bytes[COLL_ALLREDUCE]);
  plan_destroy(&p);

  /* none (DDP): whole model per rank, one all-reduce of the padded gradients + 4 scalars per step */
  s.sharding = SHARD_NONE;
  CHECK_OK(plan_build(&s, 4, &p));
  CHECK_EQ_INT(1, p->shard_world);
  CHECK_EQ_INT(2880, p->shard_total);
  CHECK_EQ_INT(0, p->mem[MEM_GATHERED]);
  CHECK_EQ_INT(16, p->mem[MEM_COMM]);
  CHECK_EQ_INT(11520 + 11520 + 23040 + 21216 + 3072 + 16, p->mem_total);   /* 70384 */
  CHECK_EQ_INT(0, p->sent_bytes[COLL_ALLGATHER]);
  CHECK_EQ_INT(0, p->sent_bytes[COLL_REDUCESCATTER]);
  CHECK_EQ_INT(17304, p->sent_bytes[COLL_ALLREDUCE]);            /* ⌊2·3·(4·2880 + 16)/4⌋ */
  plan_destroy(&p);

  /* one rank sends nothing */
  s = tiny_mem_spec();
  CHECK_OK(plan_build(&s, 1, &p));
  CHECK_EQ_INT(0, p->sent_bytes[COLL_ALLGATHER] + p->sent_bytes[COLL_REDUCESCATTER] + p->sent_bytes[COLL_ALLREDUCE]);
  plan_destroy(&p);
}

/* device = cuda, the tiny spec above (full, fp32, 4 ranks): act elements are bf16, statistics and
 * the attention state fp32; the attention state is the logsumexp, ATT = B·H·T = 3·2·4 = 24, and the
 * backward's attention scratch DATT = B·H·T·(hs + 1) = 24·5 = 120 (row sums, cuDNN's dQ accumulator).
 *   block_saved = 16·96 + 4·12 + 24 = 1608; block_bytes = 2·16·96 + 4·(4·12 + 24) = 3360
 *   root_bytes = 2·2·96 + 4·2·12 = 480; activations = 3·3360 + 480 + 8·12·2 = 10752
 *   logits scratch: one chunk of all 12 rows of V = 16 padded to 128, bf16: 2·12·128 = 3072, plus
 *   the head padded to 128 rows of C = 8, bf16, and its fp32 gradient: 128·8·6 = 6144; 9216
 *   head_ws_bytes = 9216 + 4·12 + 2·96 = 9456; bwd_ws_bytes = 2·7·96 + 4·120 = 1824
 *   workspace = 9456 + 32 MiB (ops workspace) + 256 (device scalars) + 16·(2 + 4·3) (decay segments) */
static void test_cuda_memory(void) {
  plan_t *p = NULL;
  jobspec_t s = tiny_mem_spec();
  s.device = DEVICE_CUDA;
  CHECK_OK(plan_build(&s, 4, &p));
  CHECK_EQ_INT(24, plan_attention_floats(DEVICE_CUDA, 3, 4, 2));
  CHECK_EQ_INT(96, plan_attention_floats(DEVICE_CPU, 3, 4, 2));
  CHECK_EQ_INT(120, plan_attention_scratch_floats(DEVICE_CUDA, 3, 4, 2, 4));
  CHECK_EQ_INT(96, plan_attention_scratch_floats(DEVICE_CPU, 3, 4, 2, 4));
  CHECK_EQ_INT(3072 + 128 * 8 * 6, plan_logits_bytes(DEVICE_CUDA, 12, 16, 8));   /* + the padded head */
  CHECK_EQ_INT(4 * 12 * 16, plan_logits_bytes(DEVICE_CPU, 12, 16, 8));
  CHECK_EQ_INT(1608, p->act.block_saved);
  CHECK_EQ_INT(3360, p->act.block_bytes);
  CHECK_EQ_INT(480, p->act.root_bytes);
  CHECK_EQ_INT(2304 + 12 + 96, p->act.head_ws);
  CHECK_EQ_INT(7 * 96 + 120, p->act.bwd_ws);
  CHECK_EQ_INT(9456, p->act.head_ws_bytes);
  CHECK_EQ_INT(1824, p->act.bwd_ws_bytes);
  CHECK_EQ_INT(10752, p->mem[MEM_ACTIVATIONS]);
  CHECK_EQ_INT(9456 + 33554432 + 256 + 224, p->mem[MEM_WORKSPACE]);
  /* the shards, gathers and reductions do not depend on the device (fp32 params: converted to bf16) */
  CHECK_EQ_INT(4 * 832, p->mem[MEM_PARAM_SHARD]);
  CHECK_EQ_INT(4 * (256 + 2 * 1024) + 2 * (256 + 1024), p->mem[MEM_GATHERED]);
  /* AdamW's decay-segment table on the device holds one segment per 2-D tensor: 2 + 4·L of them */
  int decay = 0;
  for (int u = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++) decay += p->units[u].t[t].decay;
  CHECK_EQ_INT(2 + 4 * 3, decay);
  /* gloo staged's pinned buffer: the largest unit's (4 + 1) shards of 256 fp32 (a block's
   * reduce-scatter: input and result) */
  CHECK_EQ_INT(4 * 5 * 256, plan_stage_bytes(p));
  plan_destroy(&p);
  /* GPT-2 124M on 2 ranks: the root's reduce-scatter, 3 · 19.7 M fp32, is staged in 64 MiB pieces */
  jobspec_t big = spec_of(12, 12, 768, 50257, 1024);
  big.device = DEVICE_CUDA;
  CHECK_OK(plan_build(&big, 2, &p));
  CHECK(4 * 3 * p->units[0].shard_numel > PLAN_STAGE_MAX_BYTES);
  CHECK_EQ_INT(PLAN_STAGE_MAX_BYTES, plan_stage_bytes(p));
  plan_destroy(&p);
  /* with activation checkpointing each block keeps its output (2·96 bytes) and one working set of a
   * whole block (3,360) is shared: 3·192 + 3360 + 480 + 192 */
  s.ackpt = ACKPT_FULL;
  CHECK_OK(plan_build(&s, 4, &p));
  CHECK_EQ_INT(192, p->act.block_bytes);
  CHECK_EQ_INT(3360, p->act.block_ws_bytes);
  CHECK_EQ_INT(4608, p->mem[MEM_ACTIVATIONS]);
  plan_destroy(&p);
  s.ackpt = ACKPT_NONE;
  /* the CPU figures of the same spec are unchanged by the device terms */
  s.device = DEVICE_CPU;
  CHECK_OK(plan_build(&s, 4, &p));
  CHECK_EQ_INT(4 * 1680, p->act.block_bytes);
  CHECK_EQ_INT(21216, p->mem[MEM_ACTIVATIONS]);
  CHECK_EQ_INT(3072, p->mem[MEM_WORKSPACE]);
  plan_destroy(&p);
}

/* The logits slot is also the backward's dres: at least BTC act elements. CUDA, V = 16 (Vp 128),
 * C = 256, B·T = 4096: the logits 2·4096·128 = 1,048,576 bytes < 2·BTC = 2,097,152, so the slot is
 * 2·BTC: head_ws_bytes = 2,097,152 + 4·4096 + 2·1,048,576 = 4,210,688. */
static void test_logits_slot(void) {
  jobspec_t s = spec_of(1, 2, 256, 16, 1024);
  s.batch_size = 4;
  s.device = DEVICE_CUDA;
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 1, &p));
  CHECK_EQ_INT(4210688, p ? p->act.head_ws_bytes : 0);
  plan_destroy(&p);
}

/* The classifier's chunk on CUDA: every row while the bf16 logits fit in 2 GiB, else the fewest
 * equal chunks. GPT-2 (Vp = 50,304: 100,608 bytes a row, 21,345 rows fit): B·T = 16,384 is one
 * chunk of 1.65 GB; 32,768 two of 16,384; 50,000 three of 16,667. Llama 3 (V = 128,256, 8,371 rows
 * fit): 16,384 rows are two chunks of 8,192. */
static void test_classifier_chunk(void) {
  CHECK_EQ_INT(16384, plan_classifier_chunk(16384, 50257));
  CHECK_EQ_INT(2 * 16384 * 50304 + 50304 * 768 * 6, plan_logits_bytes(DEVICE_CUDA, 16384, 50257, 768));
  CHECK_EQ_INT(2 * 8192 * 128256, plan_logits_bytes(DEVICE_CUDA, 8192, 128256, 2048));   /* 1002·128: no copy */
  CHECK_EQ_INT(50304, plan_vocab_padded(DEVICE_CUDA, 50257));
  CHECK_EQ_INT(50257, plan_vocab_padded(DEVICE_CPU, 50257));
  CHECK_EQ_INT(16384, plan_classifier_chunk(32768, 50257));
  CHECK_EQ_INT(16667, plan_classifier_chunk(50000, 50257));
  CHECK_EQ_INT(8192, plan_classifier_chunk(16384, 128256));
  CHECK_EQ_INT(12, plan_classifier_chunk(12, 16));
  CHECK(2 * plan_classifier_chunk(1 << 20, 50257) * 50304 <= PLAN_CUDA_LOGITS_MAX_BYTES);
  CHECK_EQ_INT(1, plan_classifier_chunk(3, (int64_t)1 << 31));   /* one row larger than the budget */
  CHECK_EQ_INT(0, plan_classifier_chunk(0, 50257));
}

/* At a fixed B·T the CUDA activations (and workspace) do not grow with T: the fused attention
 * keeps B·H·T floats, not B·H·T·T; the CPU's do grow. GPT-2 small, B·T = 8192. */
static void test_cuda_act_flat_in_t(void) {
  static const int T[] = {256, 1024, 2048};
  uint64_t act[3], ws[3], cpu[3];
  for (int i = 0; i < 3; i++) {
    jobspec_t s = spec_of(12, 12, 768, 50257, T[i]);
    s.batch_size = 8192 / T[i];
    s.grad_accum = 1;
    s.device = DEVICE_CUDA;
    s.param_dtype = s.reduce_dtype = DTYPE_BF16;
    plan_t *p = NULL;
    CHECK_OK(plan_build(&s, 8, &p));
    act[i] = p ? p->mem[MEM_ACTIVATIONS] : 0;
    ws[i] = p ? p->mem[MEM_WORKSPACE] : 0;
    plan_destroy(&p);
    s.device = DEVICE_CPU;
    CHECK_OK(plan_build(&s, 8, &p));
    cpu[i] = p ? p->mem[MEM_ACTIVATIONS] : 0;
    plan_destroy(&p);
  }
  /* 12·(32·8192·768 + 16·8192 + 4·8192·12) + (4·8192·768 + 8·8192) + 8·8192, by hand */
  CHECK_EQ_INT(12ull * (201326592ull + 131072ull + 393216ull) + 25165824ull + 65536ull + 65536ull, act[0]);
  CHECK_EQ_INT(act[0], act[1]);
  CHECK_EQ_INT(act[0], act[2]);
  CHECK_EQ_INT(ws[0], ws[1]);
  CHECK_EQ_INT(ws[0], ws[2]);
  CHECK(cpu[1] > cpu[0] && cpu[2] > cpu[1]);
}

static void test_min_world(void) {
  jobspec_t s = spec_of(12, 12, 768, 50257, 1024);
  s.batch_size = 1;
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 8, &p));
  uint64_t budget = p->mem_total;
  plan_destroy(&p);
  int w = plan_min_world(&s, budget, 4096);
  CHECK(w >= 1 && w <= 8);
  CHECK_OK(plan_build(&s, w, &p));
  CHECK(p->mem_total <= budget);
  plan_destroy(&p);
  if (w > 1) {
    CHECK_OK(plan_build(&s, w - 1, &p));
    CHECK(p->mem_total > budget);
    plan_destroy(&p);
  }
  CHECK_EQ_INT(1, plan_min_world(&s, UINT64_MAX, 64));
  CHECK_EQ_INT(0, plan_min_world(&s, 1024, 64));   /* activations alone exceed 1 KiB */
}

static void test_bad_input(void) {
  jobspec_t s = spec_of(2, 2, 8, 16, 4);
  plan_t *p = (plan_t *)&s;   /* must be cleared on failure */
  CHECK(plan_build(&s, 5000, &p) != FSDP_OK);
  CHECK(p == NULL);
  s.model.n_embd = 9;
  CHECK(plan_build(&s, 1, &p) != FSDP_OK);
  s = spec_of(2, 2, 8, 16, 4);
  s.world_size = 3;
  CHECK_OK(plan_build(&s, 0, &p));   /* world ≤ 0: the spec's world_size */
  CHECK_EQ_INT(3, p->world);
  plan_destroy(&p);
}

static void test_json_and_table(void) {
  jobspec_t s = tiny_mem_spec();
  plan_t *p = NULL;
  CHECK_OK(plan_build(&s, 4, &p));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK_OK(ctl_plan_write_json(p, f, 40000));
  fclose(f);
  json_error_t err;
  json_t *j = json_loads(buf, 0, &err);
  CHECK(j != NULL);
  if (j) {
    CHECK_EQ_INT(1920 + 872, json_integer_value(json_object_get(j, "n_params")));
    CHECK_EQ_INT(4, json_integer_value(json_object_get(j, "world")));
    json_t *units = json_object_get(j, "units");
    CHECK_EQ_INT(4, json_array_size(units));
    json_t *u1 = json_array_get(units, 1);
    CHECK_EQ_INT(1024, json_integer_value(json_object_get(u1, "padded")));
    json_t *t = json_array_get(json_object_get(u1, "tensors"), BLK_ATTN_W);
    CHECK(!strcmp(json_string_value(json_object_get(t, "name")), "h.0.attn.c_attn.weight"));
    CHECK_EQ_INT(24, json_integer_value(json_array_get(json_object_get(t, "shape"), 1)));
    json_t *sh = json_object_get(u1, "shards");
    CHECK_EQ_INT(4, json_array_size(sh));
    CHECK_EQ_INT(768, json_integer_value(json_object_get(json_array_get(sh, 3), "offset")));
    CHECK_EQ_INT(256, json_integer_value(json_object_get(json_array_get(sh, 3), "length")));
    json_t *mem = json_object_get(j, "memory");
    CHECK_EQ_INT(57072, json_integer_value(json_object_get(mem, "total")));
    CHECK_EQ_INT(21216, json_integer_value(json_object_get(mem, "activations")));
    json_t *modes = json_object_get(j, "sent_bytes_by_sharding");
    CHECK_EQ_INT(17304, json_integer_value(json_object_get(json_object_get(modes, "none"), "allreduce")));
    CHECK_EQ_INT(38400, json_integer_value(json_object_get(json_object_get(modes, "full"), "allgather")));
    json_t *dm = json_object_get(j, "device_memory");
    CHECK(json_is_false(json_object_get(dm, "fits")));
    /* the smallest world that fits 40000 bytes, checked against plan_min_world */
    CHECK_EQ_INT(plan_min_world(&s, 40000, 4096), json_integer_value(json_object_get(dm, "min_world")));
    json_decref(j);
  }
  free(buf);

  buf = NULL;
  f = open_memstream(&buf, &len);
  ctl_plan_print(p, f, 1 << 20);
  fclose(f);
  CHECK(strstr(buf, "h.0.attn.c_attn.weight") != NULL);
  CHECK(strstr(buf, "fits") != NULL);
  CHECK(strstr(buf, "55.7 KiB") != NULL);   /* 57072 bytes, one decimal */
  free(buf);
  plan_destroy(&p);
  CHECK(!strcmp(plan_mem_category_name(MEM_OPTIM_STATE), "optim_state"));
  CHECK(!strcmp(plan_coll_kind_name(COLL_REDUCESCATTER), "reducescatter"));
}

/* Hybrid: the shards, memory and gathers of a full job of G ranks; on top, each shard's gradient
 * all-reduced across the R = N/G groups once per step (one all-reduce per unit, each rounded down
 * as the comm counts it) and, with bf16 reductions, the bf16 copy of the shard that carries it. */
static void test_hybrid(void) {
  jobspec_t s = tiny_mem_spec();
  plan_t *full = NULL, *p = NULL;
  CHECK_OK(plan_build(&s, 4, &full));
  s.sharding = SHARD_HYBRID;
  s.shard_group = 4;
  CHECK_OK(plan_build(&s, 8, &p));
  if (!p || !full) return;
  CHECK_EQ_INT(8, p->world);
  CHECK_EQ_INT(4, p->shard_world);
  CHECK_EQ_INT(2, p->ngroups);
  CHECK_EQ_INT(832, p->shard_total);
  for (int u = 0; u < p->nunits; u++) {
    CHECK_EQ_INT(full->units[u].padded, p->units[u].padded);
    for (int r = 0; r < 8; r++) CHECK_EQ_INT(plan_shard_offset(full, u, r % 4), plan_shard_offset(p, u, r));
  }
  CHECK_EQ_INT(1, plan_group_of(p, 5));
  CHECK_EQ_INT(1, plan_group_rank(p, 5));
  for (int k = 0; k < MEM_NCAT; k++) CHECK_EQ_INT(full->mem[k], p->mem[k]);   /* fp32: the AR is in place */
  CHECK_EQ_INT(38400, p->sent_bytes[COLL_ALLGATHER]);        /* full at 4's */
  CHECK_EQ_INT(19968, p->sent_bytes[COLL_REDUCESCATTER]);
  /* R = 2: each shard once (4·(64 + 3·256) = 3328), and the scalars over 8 ranks ⌊2·7·16/8⌋ = 28 */
  CHECK_EQ_INT(3328 + 28, p->sent_bytes[COLL_ALLREDUCE]);
  CHECK_EQ_INT(3328 + 28, p->sent_inter[COLL_ALLREDUCE]);
  CHECK_EQ_INT(0, p->sent_inter[COLL_ALLGATHER] + p->sent_inter[COLL_REDUCESCATTER]);
  CHECK_EQ_INT(0, full->sent_inter[COLL_ALLREDUCE]);
  plan_destroy(&p);

  /* R = 3: ⌊2·2·4·64/3⌋ + 3·⌊2·2·4·256/3⌋ = 341 + 3·1365; scalars ⌊2·11·16/12⌋ = 29 */
  CHECK_OK(plan_build(&s, 12, &p));
  if (p) CHECK_EQ_INT(341 + 3 * 1365 + 29, p->sent_bytes[COLL_ALLREDUCE]);
  plan_destroy(&p);

  /* bf16 reductions: + 2·S of comm for the rounded shard, and half the all-reduced bytes */
  s.reduce_dtype = DTYPE_BF16;
  s.world_size = 8;
  plan_t *fb = NULL;
  jobspec_t sf = s;
  sf.sharding = SHARD_FULL;
  sf.shard_group = 0;
  CHECK_OK(plan_build(&sf, 4, &fb));
  CHECK_OK(plan_build(&s, 8, &p));
  if (p && fb) {
    CHECK_EQ_INT(fb->mem[MEM_COMM] + 2 * 832, p->mem[MEM_COMM]);
    CHECK_EQ_INT(fb->mem_total + 2 * 832, p->mem_total);
    CHECK_EQ_INT(1664 + 28, p->sent_bytes[COLL_ALLREDUCE]);
  }
  plan_destroy(&fb);

  /* JSON and the table say both traffic classes */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK_OK(ctl_plan_write_json(p, f, 0));
  fclose(f);
  json_t *j = json_loads(buf, 0, NULL);
  CHECK(j != NULL);
  if (j) {
    CHECK(!strcmp(json_string_value(json_object_get(j, "sharding")), "hybrid"));
    CHECK_EQ_INT(2, json_integer_value(json_object_get(j, "groups")));
    CHECK_EQ_INT(1664 + 28, json_integer_value(json_object_get(json_object_get(j, "sent_bytes_inter_group"), "allreduce")));
    CHECK_EQ_INT(19200, json_integer_value(json_object_get(json_object_get(j, "sent_bytes_intra_group"), "allgather")) / 2);
    CHECK(json_object_get(json_object_get(j, "sent_bytes_by_sharding"), "hybrid") != NULL);
    json_decref(j);
  }
  free(buf);
  buf = NULL;
  f = open_memstream(&buf, &len);
  ctl_plan_print(p, f, 0);
  fclose(f);
  CHECK(strstr(buf, "2 shard groups of 4 consecutive ranks") != NULL);
  CHECK(strstr(buf, "  intra ") != NULL && strstr(buf, "  inter ") != NULL);
  CHECK(strstr(buf, "hybrid") != NULL && strstr(buf, "<- this plan") != NULL);
  free(buf);
  plan_destroy(&p);
  plan_destroy(&full);

  /* bad shard groups: one line each */
  s.shard_group = 3;
  CHECK(plan_build(&s, 8, &p) == FSDP_ERR_INVALID);
  CHECK(strstr(fsdp_last_error(), "does not divide world_size = 8") != NULL);
  s.shard_group = 8;
  CHECK(plan_build(&s, 8, &p) == FSDP_ERR_INVALID);
  CHECK(strstr(fsdp_last_error(), "is full sharding") != NULL);
  CHECK(p == NULL);
}

int main(void) {
  test_param_counts();
  test_tensors();
  test_shard_cover();
  test_memory_model();
  test_cuda_memory();
  test_cuda_act_flat_in_t();
  test_logits_slot();
  test_classifier_chunk();
  test_min_world();
  test_bad_input();
  test_json_and_table();
  test_hybrid();
  return check_done();
}
