/* plan — the FSDP units, the shard map, and the per-rank memory and communication model.
 *
 * plan_build() turns a job spec and a world size into the one description of the job that every
 * part uses: the coordinator builds it, prints it (`fsdpctl plan`), refuses jobs that do not fit,
 * and sends it to workers; workers take every offset from it and recompute none. A plan is
 * immutable after plan_build() and owned by whoever built or received it (plan_destroy frees it).
 *
 * Units (docs/design.md §3, docs/models.md): GPT-2's unit 0, the root, holds wte [V,C], wpe [n_positions,C],
 * ln_f.weight [C], ln_f.bias [C]; unit 1+i holds block i in Hugging Face order (models/gpt2/gpt2.h).
 * Llama's root holds model.embed_tokens.weight [V,C], model.norm.weight [C], lm_head.weight [V,C]
 * (with tie_embeddings no lm_head: embed_tokens is used at both ends, as GPT-2's wte); unit 1+i
 * holds decoder layer i (models/llama/llama.h). Every architectural term comes from the model's
 * descriptor (models/arch.h); this module holds the shared arithmetic. Each unit's flat buffer of `numel`
 * elements is padded to `padded`, a multiple of shard_world × 64, and rank r owns elements
 * [(r mod shard_world)·shard_numel, +shard_numel) of it, where shard_numel = padded / shard_world.
 * shard_world is the world size for sharding full and grad_op, 1 for none (every rank holds all),
 * and G = shard_group for hybrid: groups of G consecutive ranks, each sharded G ways as full is, each
 * a full replica (R = N/G groups; ranks r mod G, r mod G + G, ... hold the same shard).
 *
 * Memory model (bytes per rank; pb = param_dtype bytes, cb = compute dtype bytes (4 on cpu, 2 on
 * cuda), S = Σ shard_numel, Pr = root padded, Pb = largest block padded, Sr, Sb their shard_numel,
 * Smax = the largest of those (0 with one rank: the ring's receive scratch), p = prefetch).
 * docs/memory.md derives each term.
 *   param_shard  = 4·S (+ 2·S with pb = 2)  fp32 master shard (and the bf16 copy that is gathered)
 *   grad_shard   = 4·S                     fp32 gradient shard (accumulated over micro-steps)
 *   optim_state  = 8·S                     AdamW m and v
 *   gathered     = full:    pb·(Pr + min(1+p, L)·Pb) + X  root kept, p blocks ahead of the one computed
 *                  grad_op: pb·Σ padded + X       every unit stays gathered forward→backward
 *                  hybrid:  as full (Pr, Pb padded for G ranks)
 *                  none:    X                     the "shard" is the whole model
 *                  X = cb·(Pr + Pb) when pb ≠ cb (a root and a block converted to the compute dtype)
 *   comm         = full, grad_op, reduce fp32: 4·(Pr + 2·Pb + Smax)  full-size unit gradients: the
 *                                     root's, held for the whole backward, and two blocks' (one being
 *                                     computed, one being reduce-scattered), plus the ring's scratch
 *                  reduce bf16: 4·(Pr + Pb) + 2·(Pr + 2·Pb) + 2·(Sr + 2·Sb + Smax)  fp32 gradients
 *                                     (root, one block), bf16 send (root, two blocks) and receive
 *                                     buffers, bf16 scratch
 *                  none: 0, or 2·S with reduce bf16 (the rounded gradient being all-reduced)
 *                  hybrid: as full, + 2·S with reduce bf16 (the rounded shard all-reduced across groups)
 *                  every mode: + 4·PLAN_STEP_SCALARS (the step's scalars on the device)
 *   activations  = L·act.block_bytes + act.block_ws_bytes + act.root_bytes + 8·B·T·G (+ 4·B·T with docs)
 *                  (the step's token ids, and the rows' document starts where they may be packed:
 *                  plan_docs_of; block_ws is 0 without activation checkpointing)
 *                  cpu: 4·(L·block_saved + block_ws + root_saved); cuda: act elements in bf16, statistics fp32
 *   workspace    = max(act.head_ws_bytes, act.bwd_ws_bytes)   cpu: 4·max(head_ws, bwd_ws)
 *                  cuda: + PLAN_CUDA_WORKSPACE_BYTES (cuBLASLt and reductions) + PLAN_CUDA_SCALAR_BYTES
 *                        + 16·n_decay (AdamW's decay-segment table: one [start, end) per 2-D tensor)
 *
 * Bytes each rank sends per optimizer step (ring accounting, as nccl-tests: an all-gather or
 * reduce-scatter of S total bytes sends S·(N−1)/N per rank, an all-reduce 2·S·(N−1)/N), with G
 * micro-steps: full gathers the root once and every block twice per micro-step, and reduce-scatters
 * every unit once per micro-step; grad_op gathers and reduce-scatters every unit once per
 * micro-step; none all-reduces every unit's gradient once per step (padded, in reduce dtype);
 * hybrid sends full's AG and RS figures with shard_world in place of N, and once per step all-reduces each
 * unit's gradient shard among the R ranks holding it: Σ_u ⌊2·(R−1)·rb·shard_numel_u / R⌋ (one
 * all-reduce per unit, each rounded down as comm.c counts it). sent_inter is the part sent over
 * communicators that span groups (hybrid: that all-reduce and the step's scalars, which go over
 * the whole world); the rest stays inside a group.
 * Every mode also all-reduces PLAN_STEP_SCALARS fp32 scalars once per step (loss, tokens,
 * squared gradient norm, a non-finite flag).
 */
#ifndef FSDP_PLAN_H
#define FSDP_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "jobspec.h"

#define PLAN_PAD_ALIGN 64      /* elements per rank the padding rounds to */
#define PLAN_MAX_TENSORS 24    /* tensors per unit (a Llama-family layer with every bias and norm: 18) */
#define PLAN_STEP_SCALARS 4
/* The CUDA device's fixed allocations (worker/cuda/device_cuda.c allocates exactly these): the ops_cuda
 * workspace (OPS_CUDA_WORKSPACE_MIN) and a few device scalars; and the most bytes of bf16 logits the
 * classifier holds at once (plan_classifier_chunk). */
#define PLAN_CUDA_WORKSPACE_BYTES ((int64_t)32 << 20)
#define PLAN_CUDA_SCALAR_BYTES 256
/* cuda, [lora] base_dtype = nf4: the dequantization maps (16 NF4 codes and the 256 of the dynamic map,
 * fp32), in workspace from bind */
#define PLAN_NF4_MAPS_BYTES (4 * (16 + 256))
#define PLAN_CUDA_LOGITS_MAX_BYTES ((int64_t)2 << 30)

typedef enum {
  MEM_PARAM_SHARD = 0, MEM_GRAD_SHARD, MEM_OPTIM_STATE, MEM_GATHERED,
  MEM_ACTIVATIONS, MEM_WORKSPACE, MEM_COMM, MEM_NCAT
} mem_category;
const char *plan_mem_category_name(mem_category c);   /* "param_shard", ... as in docs/design.md §5 */

typedef enum { COLL_ALLGATHER = 0, COLL_REDUCESCATTER, COLL_ALLREDUCE, COLL_NKIND } coll_kind;
const char *plan_coll_kind_name(coll_kind k);          /* "allgather", "reducescatter", "allreduce" */

typedef struct plan_tensor {
  char name[64];         /* Hugging Face name. GPT-2: without prefix ("wte.weight", "h.3.attn.c_attn.weight");
                            Llama: exactly as LlamaForCausalLM names it, "model." included
                            ("model.layers.3.self_attn.q_proj.weight", "lm_head.weight") */
  int gid;               /* global tensor index (RNG key): GPT-2 root 0..3, block i slot j → 4 + 12·i + j;
                            Llama root 0..2, layer i slot j → 3 + n·i + j, n its layer's tensors (9
                            for a plain Llama; models/llama/llama.h) */
  int ndim;              /* 1 or 2 */
  int64_t shape[2];      /* HF layout: GPT-2's c_attn.weight is [C, 3C] (Conv1D: in, out); Llama's
                            projections [out, in] (nn.Linear) */
  int64_t numel;
  int64_t offset;        /* first element in the unit's flat buffer */
  int decay;             /* AdamW weight decay applies (2-D tensors) */
  /* A part of a fused Hugging Face tensor (Phi-3's qkv_proj holds q, k and v; gate_up_proj gate and
   * up): name is the fused tensor's, which has hf_rows rows of shape[1] columns, this part its rows
   * [hf_row0, hf_row0 + shape[0]); the parts are adjacent in the unit in row order, so the fused
   * tensor is the flat buffer from its first part on. hf_rows 0: the tensor is whole. */
  int64_t hf_rows, hf_row0;
} plan_tensor;

/* Whether T is written to a weights file: a whole tensor, or the first part of a fused one (its
 * file shape into SHAPE: the fused tensor's). */
static inline int plan_tensor_file_shape(const plan_tensor *t, int64_t shape[2]) {
  shape[0] = t->hf_rows ? t->hf_rows : t->shape[0];
  shape[1] = t->shape[1];
  return t->hf_row0 == 0;
}

typedef struct plan_unit {
  char name[16];         /* "root", "h.0", ... (Llama: "root", "layers.0", ...) */
  int ntensors;
  plan_tensor t[PLAN_MAX_TENSORS];
  int64_t numel;         /* Σ tensor numel */
  int64_t padded;        /* numel rounded up to a multiple of shard_world·PLAN_PAD_ALIGN */
  int64_t shard_numel;   /* padded / shard_world: every rank's shard length */
  int64_t shard_base;    /* where this unit's shard starts in a rank's concatenated shard (Σ earlier shard_numel) */
} plan_unit;

/* Element counts of the activation buffers the model keeps, for one micro-batch of B·T tokens, and
 * their bytes on the plan's device. The model allocates exactly these (models/gpt2/model_gpt2.c and
 * models/llama/model_llama.c lay them out; models/<name>/<name>_arch.c compute them). The fields below give GPT-2's terms; the Llama
 * family's (QD = H·HD the q and attention-output width, Q = QD + 2·NKV·HD the qkv row, F = ffn_dim,
 * BTX = B·T·X; llama_act) are
 *   block_saved = BT·(4C + QD + Q + 3F) + 2·BT + ATT: ln1 BTC, rstd BT, qkv BTQ, atty BT·QD, att ATT,
 *                 res2 BTC, ln2 BTC, rstd BT, gate|up 2BTF, swiglu BTF, out BTC (checkpointing: out
 *                 only); with q/k norms also the pre-norm qkv BTQ and the heads' rstd BT·(H + NKV)
 *   root_saved  = 2·BTC + BT: x0 = embed_tokens[inp], the final norm's output and rstd
 *   head_ws     = GPT-2's;  block_ws = block_saved(none) with checkpointing (as GPT-2's)
 *   bwd_ws      = 2·BTC + BT·max(C, QD) + BTF + BT·max(2F, Q) + DATT: dres, dx, datty, d swiglu, d gate|up
 *                 or d qkv, datt; ATT = plan_attention_floats: B·H·T·T on the CPU, B·H·T on CUDA; DATT =
 *                 plan_attention_scratch_floats. Act elements are 4
 * bytes on the CPU and 2 (bf16) on CUDA; statistics, the attention state and losses are fp32. */
typedef struct plan_act {
  int64_t block_saved;   /* per block, kept forward→backward: 16·BTC + 4·BT + ATT (with activation
                            checkpointing only its output, BTC):
                            ln1 BTC, ln1 mean+rstd 2BT, qkv 3BTC, atty BTC, att state ATT,
                            res2 BTC, ln2 BTC, ln2 mean+rstd 2BT, fch 4BTC, fch_gelu 4BTC, out BTC */
  int64_t root_saved;    /* x0 = wte+wpe BTC, lnf BTC, lnf mean+rstd 2BT: 2·BTC + 2·BT */
  int64_t head_ws;       /* logits/dlogits + per-token losses B·T + d lnf B·T·C (loss phase only);
                            logits: B·T·V on the CPU, one classifier chunk (plan_logits_bytes / 4) on
                            CUDA, at least BTC act elements (the backward's dres reuses that slot) */
  int64_t block_ws;      /* activation checkpointing: the one block working set that the forward
                            and the backward's recompute share: block_saved(none) − BTC, plus the
                            forward's BTC scratch (the workspace is the backward's then); else 0 */
  int64_t bwd_ws;        /* backward scratch reused by every block: 7·BTC + DATT
                            (dres BTC, dx BTC, dbuf 4BTC, datty BTC, datt DATT) */
  int64_t block_bytes, block_ws_bytes, root_bytes, head_ws_bytes, bwd_ws_bytes;   /* the same in bytes */
} plan_act;

/* Floats of one block's attention state: B·H·T·T on the CPU (the probabilities), B·H·T on CUDA
 * (the logsumexp of the fused kernels and of cuDNN, the same). */
int64_t plan_attention_floats(device_kind dev, int64_t B, int64_t T, int64_t H);
/* Floats of the attention backward's scratch (head size HS): B·H·T·T on the CPU (the probabilities'
 * gradient); B·H·T·(HS + 1) on CUDA: dO·O's row sums and, for cuDNN, its fp32 dQ accumulator
 * (ops_cuda_attention_backward). */
int64_t plan_attention_scratch_floats(device_kind dev, int64_t B, int64_t T, int64_t H, int64_t HS);
/* Rows per classifier chunk on CUDA: all BT rows when their bf16 logits (V rounded up to 128 per
 * row) fit in PLAN_CUDA_LOGITS_MAX_BYTES, else the fewest equal chunks that do (the last one
 * shorter). Each chunk reads and writes the fp32 dwte once (its GEMM's beta = 1), so fewer is
 * faster: GPT-2 124M at B·T = 16384 is one chunk (1.65 GB). */
int64_t plan_classifier_chunk(int64_t BT, int64_t V);
/* Whether SPEC's rows may hold several documents: pack = true with a token file (train or val) that
 * may be masked (a synthetic stream never is). The worker then allocates the rows' document starts,
 * B·T int32 of activations, up front (model_set_docs), and the plan counts them. */
int plan_docs_of(const jobspec_t *s);
/* The vocabulary the classifier's GEMMs run over: V on the CPU; on CUDA Vp = V rounded up to a
 * multiple of 128 (llm.c's padded vocabulary; zero rows that exist only inside the classifier
 * call, never in a unit, a checkpoint or an export: worker/cuda/ops_cuda_classifier.cu). */
int64_t plan_vocab_padded(device_kind dev, int64_t V);
/* Bytes of the classifier's scratch for BT rows of C channels: BT·V fp32 on the CPU; on CUDA one
 * chunk of plan_classifier_chunk rows of Vp bf16 logits, plus, when Vp ≠ V, the padded head (Vp·C
 * bf16) and its gradient (Vp·C fp32): ops_cuda_classifier_scratch_bytes. */
int64_t plan_logits_bytes(device_kind dev, int64_t BT, int64_t V, int64_t C);

/* LoRA ([lora], docs/models.md "LoRA", docs/memory.md "LoRA"; common/plan_lora.c): the base is frozen
 * and every block carries adapters on its target projections: A [r, in] and B [out, r] (nn.Linear's
 * layout, peft's names lora_A, lora_B), y += (alpha / r)·(x·Aᵀ)·Bᵀ, laid out block by block and, in a
 * block, module by module, A then B (the adapters' segment, NA = numel elements). The adapters are
 * not in the base's units; they are held one of two ways ([lora] adapters):
 *   replicated  one fp32 segment whole on every rank: its gradient all-reduced over the world once
 *               per step, AdamW run on the whole segment by every rank alike;
 *   sharded     block l's adapters are a unit of their own (plan_lora_units), sharded over the shard
 *               group as the base's blocks are (Pa = block_numel padded to shard_world·64, Sa =
 *               Pa / shard_world): fp32 master, gradient and AdamW m, v of Sa per block per rank;
 *               all-gathered in the compute dtype beside block l's base gather, their gradient
 *               reduce-scattered in reduce_dtype after block l's backward (hybrid: then all-reduced
 *               across the groups), AdamW on the shard only.
 * auto (the default) takes sharded where it holds less per rank: sharding ≠ none and the sharded
 * plan's per-rank total is below the replicated one's (world 1, sharding none, or adapters so small
 * that the gather slots and reduce buffers outweigh what sharding saves: replicated).
 * Memory per rank, NA = numel, SA = L·Sa, e = the compute dtype's bytes (4 CPU, 2 CUDA):
 *   param_shard = pb·S (the frozen base in its own dtype: bf16 or fp32, no master)
 *                 NF4: 2·Sr + L·nf4_shard
 *                 + replicated 4·NA (+ 2·NA act copy on CUDA) | sharded 4·SA (+ 2·SA on CUDA)
 *   grad_shard  = replicated 4·NA | sharded 4·SA      optim_state = replicated 8·NA | sharded 8·SA
 *   offload = optimizer: the adapters' param_shard is their compute form alone, e·NA | e·SA, and
 *                 optim_state 0; host_bytes = 16·NA | 16·SA (master, m, v, gradient staging)
 *   gathered (NF4, full and hybrid): 2·Pr + min(1+p, L)·nf4_padded + 2·Pb (the dequantized working
 *                 unit) + cb·(Pr + Pb) on the CPU (the fp32 compute copies); grad_op: L·nf4_padded
 *                 in place of the slots; none: the working unit and the copies
 *                 + sharded: e·slots·Pa (slots = min(1+p, L), grad_op L)
 *   allgather sent (NF4, full): G·(N−1)·(2·Sr + 2·L·nf4_shard): the blocks' bytes are NF4's
 *                 + sharded: G·(Ns−1)·e·SA·(2, grad_op 1)
 *   comm: 4·PLAN_STEP_SCALARS (no reduce-scatter of the frozen base) + sharded: the adapters'
 *                 reduce buffers (reduce.h): fp32 4·(2·Pa + Sa), bf16 8·Pa + 2·(3·Sa) (+ 2·SA hybrid)
 *   reducescatter sent: replicated 0 | sharded G·(Ns−1)·rb·SA; allreduce: the scalars + replicated
 *                 2·(N−1)·4·NA/N | sharded hybrid L·(2·(R−1)·rb·Sa/R)
 *   activations += Lk·m·BT·r act elements: each module's x·Aᵀ·scale, kept for its backward
 *                  (Lk = L, or 1 with activation checkpointing), m = the block's targets
 *   workspace += BT·r act elements: the adapters' scratch (s·dy·B; their products read and accumulate
 *                in place); NF4 on CUDA: + PLAN_NF4_MAPS_BYTES (the dequantization maps) */
#define PLAN_LORA_MAX 8
typedef struct plan_lora_mod {
  char path[32];       /* in a block, as Hugging Face names it: "attn.c_attn", "self_attn.q_proj" */
  int slot;            /* the block slot of its (frozen) base weight */
  int64_t in, out;     /* x is (BT, in); its output is out wide ... */
  int64_t col0, ld;    /* ... at columns [col0, col0 + out) of rows ld wide (a fused q|k|v, gate|up) */
  int64_t a_off, b_off;   /* A and B in the block's adapters */
} plan_lora_mod;
typedef struct plan_lora {
  int rank;            /* r; 0: no LoRA, every weight trained */
  double alpha;
  float scale;         /* alpha / r */
  int nmods;
  plan_lora_mod mod[PLAN_LORA_MAX];
  int64_t block_numel; /* Σ r·(in + out) over the targets */
  int64_t numel;       /* L·block_numel: every adapter element */
  int64_t saved, ws;   /* act elements: the kept x·Aᵀ of every block, and the scratch */
  int sharded;         /* the adapters' layout: 1 sharded in their own units, 0 replicated (see above) */
  int64_t a_padded, a_shard;   /* sharded: Pa and Sa (one block's adapters padded, one rank's part) */
  /* the frozen base's storage ([lora] base_dtype): param_dtype's, or NF4 (worker/ops/nf4.h). With
   * NF4 every 2-D tensor of a block is quantized (nf4_bytes: codes, scale codes, group scales,
   * offset), its 1-D tensors stay bf16, and the root (embeddings, head, final norm) is bf16, as
   * transformers' 4-bit loading leaves them. A block's image of nf4_block bytes is padded to
   * nf4_padded, a multiple of shard_world·64, and sharded as bytes (nf4_shard each); it is gathered
   * whole and dequantized into one bf16 working unit of the largest block (Pb elements) */
  int nf4;
  int64_t nf4_block, nf4_padded, nf4_shard;
} plan_lora;

typedef struct plan {
  model_config model;
  char source[JOBSPEC_PATH_MAX];   /* [model] from: the Hugging Face folder the model came from, or "" */
  int world;             /* ranks */
  int shard_world;       /* ranks per shard group: the world for full and grad_op, 1 for none, G for hybrid */
  int ngroups;           /* world / shard_world for hybrid (replicas of the model), else 1 (none: world) */
  shard_mode sharding;
  int prefetch;
  dtype_kind param_dtype, reduce_dtype;
  device_kind device;           /* its compute dtype: fp32 on cpu, bf16 on cuda */
  ackpt_mode ackpt;             /* activation checkpointing */
  offload_mode offload;
  int batch_size, grad_accum;   /* B, G */
  int docs;                     /* rows may hold several documents (plan_docs_of): the B·T int32 device
                                   copy of their starts is allocated with the activations */
  int nunits;            /* 1 + n_layer */
  plan_unit *units;
  int64_t shard_total;   /* S = Σ shard_numel: the length of every rank's concatenated shard */
  int64_t n_params;      /* Ψ: GPT-2's tied wte counted once; Llama's embed_tokens and lm_head both, or
                            the tied embed_tokens once */
  int64_t n_params_no_emb;      /* Ψ without the embeddings: GPT-2 wte and wpe; Llama embed_tokens and lm_head
                                   (tied: embed_tokens) */
  double flops_per_token;       /* 6 per parameter a token multiplies with, forward and backward, plus the
                                   attention scores and weighted sum, 12·L·C·T (PaLM appendix B):
                                   GPT-2 6·(Ψ − wpe) + 12·L·C·T (the tied head is real compute through wte,
                                   the wpe lookup is not); Llama 6·(Ψ − V·C) + 12·L·C·T (the embed_tokens
                                   lookup is no matmul, lm_head is; GQA shares k and v but every query head
                                   still scores T keys, so the attention term is unchanged); a tied Llama
                                   6·Ψ + 12·L·C·T (its one embedding tensor is the head's matmul) */
  int64_t vocab_padded;         /* the classifier GEMMs' vocabulary: V, or on CUDA Vp (plan_vocab_padded) */
  double pad_flops_per_token;   /* what the padded rows add on CUDA, 6·(Vp − V)·C (not in flops_per_token,
                                   which counts the model's FLOPs, as MFU does) */
  int n_decay;                  /* 2-D tensors (AdamW decays them): GPT-2 2 + 4·L, Llama 2 + 7·L (tied 1 + 7·L) */
  plan_act act;
  plan_lora lora;               /* lora.rank 0: no LoRA */
  uint64_t mem[MEM_NCAT];       /* predicted peak bytes per category (model above) */
  uint64_t mem_total;           /* Σ mem */
  uint64_t host_bytes;          /* host memory: offload = optimizer's 16·S (fp32 master, AdamW m and
                                   v, gradient staging; [lora]: the adapters', 16·NA or 16·SA) plus
                                   snapshot_bytes; 0 when neither */
  uint64_t snapshot_bytes;      /* [checkpoint] async: 12·S, the checkpoint snapshot (param, m, v) */
  uint64_t sent_bytes[COLL_NKIND];  /* bytes one rank sends per optimizer step */
  uint64_t sent_inter[COLL_NKIND];  /* the part of them sent over communicators that span shard groups
                                       (hybrid: the cross-group all-reduce and the step's scalars);
                                       the rest stays inside a group. 0 in the other modes */
} plan_t;

/* The model's published positions: GPT-2's wpe rows (n_positions; 0 in a hand-built config is seq_len). */
static inline int64_t plan_positions(const model_config *m) {
  return m->n_positions > m->seq_len ? m->n_positions : m->seq_len;
}
/* The pinned host buffer of a staged comm (gloo staged on CUDA, worker/cuda/comm_stage_cuda.c),
 * allocated once when the comm is made: room for the plan's largest collective, (shard_world + 1)·
 * shard_numel fp32 elements of a unit (a reduce-scatter's input and result; no all-gather or
 * all-reduce of the plan is larger), at most PLAN_STAGE_MAX_BYTES (a larger collective is staged in
 * pieces). Host memory, counted under comm while the comm lives. */
#define PLAN_STAGE_MAX_BYTES ((int64_t)64 << 20)
int64_t plan_stage_bytes(const plan_t *p);

/* Build the plan of SPEC for WORLD ranks (WORLD ≤ 0: spec->world_size). */
fsdp_status plan_build(const jobspec_t *spec, int world, plan_t **out);
void plan_destroy(plan_t **p);

/* Rank r's shard of unit u: [offset, offset + plan->units[u].shard_numel) in the unit's flat buffer. */
static inline int64_t plan_shard_offset(const plan_t *p, int u, int rank) {
  return p->shard_world == 1 ? 0 : (int64_t)(rank % p->shard_world) * p->units[u].shard_numel;
}
/* Hybrid: rank r is rank r mod G of shard group r / G, and rank r / G among the ranks of the other
 * groups that hold the same shard (its replica group, shard index r mod G). */
static inline int plan_group_of(const plan_t *p, int rank) { return rank / p->shard_world; }
static inline int plan_group_rank(const plan_t *p, int rank) { return rank % p->shard_world; }
/* The root tensor slot the output head multiplies with: GPT-2's wte, Llama's lm_head, or a tied Llama's
 * embed_tokens (the architecture's descriptor, models/arch.h). */
int plan_head_slot(const plan_t *p);

/* Find a tensor by Hugging Face name, in any form the architecture's descriptor takes (GPT-2 with or
 * without "transformer.", Llama with or without "model."; lm_head.weight has none). */
const plan_tensor *plan_find_tensor(const plan_t *p, const char *name, int *unit);
/* NF4 ([lora] base_dtype = nf4): the bytes of the dequantized bf16 working unit (counted in gathered); 0 otherwise. */
uint64_t plan_lora_dequant_bytes(const plan_t *p);
/* LoRA's module of block slot SLOT, or NULL when no target adapts it (or no LoRA). */
const plan_lora_mod *plan_lora_of(const plan_t *p, int slot);
/* The adapters' segment as a checkpoint's plan (P with lora.rank ≥ 1) for W writers: sharding none
 * (W = 1: unit l = block l's adapters whole, unpadded) or full (W > 1: unit l padded to W·64 and
 * sharded, Sa each), one 2-D tensor per unit, shard_total = L·Sa; P's model, source, batch,
 * grad_accum and lora. A LoRA checkpoint is this plan's (ckpt.h): replicated adapters are written
 * by rank 0 alone (W = 1), sharded ones by each rank of a shard group (W = shard_world); either
 * loads into any world size and layout through plan_lora_scatter / plan_lora_pick. */
fsdp_status plan_lora_segment(const plan_t *p, int W, plan_t **out);
/* The sharded adapters' units, as the runtime gathers, reduces and updates them: P's world,
 * sharding, prefetch, reduce_dtype and device, param_dtype the compute dtype's (fp32 on the CPU,
 * bf16 on CUDA), unit 0 an empty root and unit l = block l−1's adapters (Pa, Sa, one decayed 2-D
 * tensor), lora.rank 0 (none of it is frozen). P must have lora.sharded. */
fsdp_status plan_lora_units(const plan_t *p, plan_t **out);
/* [lora]'s frozen root in two parts (docs/memory.md "LoRA"), [*LO, *HI) of the root's flat buffer:
 * PART 0 what the lookup reads (the root's tensors before its first 1-D one, the final norm), PART 1
 * what the head reads (the final norm on; tied, from 0: the head is the embedding). With sharding ≠
 * none each is gathered when it is needed and released after (an all-reduce of each rank's part of
 * its shard, added to zeros), into one buffer of plan_root_part_max elements. */
void plan_root_part(const plan_t *p, int part, int64_t *lo, int64_t *hi);
int64_t plan_root_part_max(const plan_t *p);
/* The adapter elements one rank holds (fp32 master, gradient, m, v each): NA, or sharded L·Sa. */
static inline int64_t plan_lora_held(const plan_t *p) {
  return p->lora.sharded ? (int64_t)p->model.n_layer * p->lora.a_shard : p->lora.numel;
}
/* The adapters' own bytes per rank by category in P's layout (what plan_lora_memory added to
 * P->mem) and in host memory (*HOST: offload = optimizer's 16·held, else 0). */
void plan_lora_adapter_memory(const plan_t *p, uint64_t mem[MEM_NCAT], uint64_t *host);
/* A block's adapters padded for W ranks (W = 1: block_numel). */
int64_t plan_lora_padded(const plan_t *p, int W);
/* Writer Q of W's L·Sa shard SHARD into the whole segment WHOLE (NA floats; padding dropped), and
 * the reverse: rank Q of W's shard out of WHOLE (padding zero). */
void plan_lora_scatter(const plan_t *p, int W, int q, const float *shard, float *whole);
void plan_lora_pick(const plan_t *p, int W, int q, const float *whole, float *shard);
/* Adapter tensor names as peft writes them: "base_model.model.transformer.h.3.attn.c_attn.lora_A.weight"
 * for block LAYER, module M, B = 0 (lora_A) or 1 (lora_B). */
void plan_lora_name(const plan_t *p, int layer, int m, int b, char *buf, size_t n);
/* Smallest world size (≤ max_world) whose predicted per-rank total fits in device_bytes, or 0. */
int plan_min_world(const jobspec_t *spec, uint64_t device_bytes, int max_world);

/* The same search for P's model and settings (plan_min_world up to the largest world allowed). */
int plan_min_world_of(const plan_t *p, uint64_t device_bytes);
/* What each rank of P would send per optimizer step with sharding MODE instead (the table's
 * comparison of modes; hybrid uses P's own group). */
void plan_sent_bytes_if(const plan_t *p, shard_mode mode, uint64_t sent[COLL_NKIND]);

#endif
