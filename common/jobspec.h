/* jobspec — a training job as described by its INI file (parsed with libinih).
 *
 * jobspec_load() reads a file; jobspec_parse() reads the same text handed over the wire (the
 * daemon receives the file's text and its directory, so relative paths resolve the same way).
 * Every key of every section exists in jobspec_t; an unknown section or key, a malformed number
 * or a value out of range is an error that names file:line and says what is allowed. Paths in
 * the result are absolute. The struct is plain data: copy it freely; no function here keeps it.
 * A parsed job is resolved for where it runs by jobresolve.h; jobspec_canonical_write/read carry
 * the result, every key explicit, from the coordinator to its workers.
 */
#ifndef FSDP_JOBSPEC_H
#define FSDP_JOBSPEC_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"

#define JOBSPEC_PATH_MAX 1024
#define JOBSPEC_TEXT_MAX 200     /* a text value: at most one INI line */

typedef enum { SHARD_FULL = 0, SHARD_GRAD_OP, SHARD_NONE, SHARD_HYBRID } shard_mode;
typedef enum { DEVICE_CPU = 0, DEVICE_CUDA } device_kind;
typedef enum { DTYPE_FP32 = 0, DTYPE_BF16 } dtype_kind;
typedef enum { COMM_AUTO = 0, COMM_GLOO, COMM_NCCL } comm_kind;
typedef enum { SCHED_CONSTANT = 0, SCHED_COSINE } lr_schedule;
typedef enum { RESUME_AUTO = 0, RESUME_NEVER } resume_mode;
/* [lora] base_dtype: the frozen base's storage. auto: param_dtype's; nf4: NormalFloat4 (worker/ops/nf4.h) */
typedef enum { BASE_AUTO = 0, BASE_BF16, BASE_FP32, BASE_NF4 } base_dtype_kind;
/* [lora] adapters: how the adapters are held (plan.h's plan_lora). auto: the plan decides */
typedef enum { ADAPTERS_AUTO = 0, ADAPTERS_SHARDED, ADAPTERS_REPLICATED } adapters_kind;
typedef enum { ACKPT_NONE = 0, ACKPT_FULL } ackpt_mode;      /* [fsdp] activation_checkpointing */
typedef enum { OFFLOAD_NONE = 0, OFFLOAD_OPTIMIZER } offload_mode;   /* [fsdp] offload */

typedef enum {   /* [model] arch: one per line of models/models.def (ARCH_GPT2, ARCH_LLAMA, ...) */
#define FSDP_ARCH(ID, name) ARCH_##ID,
#include "models.def"
} model_arch;
enum {   /* how many architectures models/models.def lists (arch_count() without the table) */
  ARCH_N = 0
#define FSDP_ARCH(ID, name) +1
#include "models.def"
};
/* [model] rope_scaling; linear (LlamaConfig's "linear"): every inverse frequency divided by rope_factor */
typedef enum { ROPE_SCALING_NONE = 0, ROPE_SCALING_LLAMA3, ROPE_SCALING_LONGROPE, ROPE_SCALING_LINEAR } rope_scaling_kind;

#define ROPE_MAX_FACTORS 256   /* longrope's per-frequency factors: one per pair of a head of up to 512 channels */
/* A list of numbers, one per rotary frequency ([model] rope_short_factor: "1.05, 1.1, ..."). */
typedef struct rope_factor_list {
  int n;
  double v[ROPE_MAX_FACTORS];
} rope_factor_list;

/* The model's shape ([model]); docs/models.md. Llama-only fields are 0 for GPT-2 except n_kv_head,
 * which is n_head (a hand-built config may leave it 0: plan_build reads 0 as n_head), and
 * tie_embeddings, which is 1 (plan_build makes it so for a hand-built GPT-2 config). */
#define MODEL_EXT_MAX 8
typedef struct model_config {
  model_arch arch;
  int n_layer;     /* L */
  int n_head;      /* H */
  int n_embd;      /* C, divisible by H */
  int vocab_size;  /* V */
  int seq_len;     /* T: the training sequence length, at most n_positions */
  int n_kv_head;   /* NKV: Llama's key/value heads, dividing H (grouped-query attention); H for GPT-2 */
  int ffn_dim;     /* F: Llama's SwiGLU width (required for llama); GPT-2's MLP is 4·C */
  double norm_eps;     /* Llama's RMSNorm eps (1e-5) */
  double rope_theta;   /* Llama's rotary base (10000) */
  int n_positions;     /* the published position count: GPT-2's wpe rows, Llama's max_position_embeddings
                          (rotary has no table; an export writes it); 0 = seq_len */
  int tie_embeddings;  /* Llama: lm_head is embed_tokens (one tensor, both uses); GPT-2 always ties */
  /* Llama's rotary scaling (Hugging Face rope_scaling / rope_parameters); with ROPE_SCALING_NONE the
   * four numbers are 0. llama3: Llama-3.1/3.2's bands of wavelength (worker/ops/rope.h); linear:
   * rope_factor alone. */
  rope_scaling_kind rope_scaling;
  double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_original_max_pos;   /* original_max_position_embeddings (llama3 and longrope) */
  /* The Llama family's attention and MLP choices (docs/models.md; models/llama/llama.h's slots), 0 for
   * GPT-2. Llama's config allows head_dim, attention_bias and mlp_bias; Qwen2 has q/k/v biases and no
   * o_proj bias; Qwen3 q_norm/k_norm and its own head_dim. */
  int head_dim;        /* HD: each head's width; q is NH·HD wide, k and v NKV·HD, o_proj [C, NH·HD]; 0 = C / H */
  int attention_bias;  /* q_proj, k_proj, v_proj and o_proj have biases ([model] attention_bias) */
  int qkv_bias;        /* q_proj, k_proj and v_proj have biases, o_proj none (Qwen2's; its descriptor sets it) */
  int mlp_bias;        /* gate_proj, up_proj and down_proj have biases ([model] mlp_bias) */
  int qk_norm;         /* an RMSNorm (weight [HD], norm_eps) on every q and k head before rope (Qwen3's) */
  /* longrope (Phi-3's, within its pretraining context: seq_len <= rope_original_max_pos): inv_freq_i
   * divided by short_factor[i], cos and sin multiplied by attention_factor; 0 otherwise. */
  rope_factor_list rope_short_factor;
  double rope_attention_factor;
  /* Mistral's sliding-window attention (config.json sliding_window, [model] sliding_window): query t
   * sees keys t − W < s ≤ t (worker/ops/docmask.h). 0: full causal attention (null in config.json,
   * every other architecture); a window of seq_len or more computes the same as none. */
  int sliding_window;
  /* The Llama family's pad_token_id (config.json's; [model] pad_token_id): the token whose embedding row
   * the lookup's gradient skips, as nn.Embedding's padding_idx (a tied head still trains it); −1:
   * none (GPT-2 always: its wte has no padding_idx). A hand-built config must set it. */
  int pad_token_id;
  /* An architecture's own [model] keys (models/arch.h's arch_desc.ext_keys: key i is ext[i]), for a
   * family whose settings no other shares (Gemma 3's query_pre_attn_scalar, ...): its folder names
   * and reads them, common code only parses, writes back and compares them. 0 where none. */
  double ext[MODEL_EXT_MAX];
} model_config;

typedef struct jobspec {
  char path[JOBSPEC_PATH_MAX];     /* the file it came from ("<string>" if none), for messages */
  /* [job] */
  char name[64];
  int steps;
  uint64_t seed;
  int max_restarts;
  double restart_wait_s;     /* a queued job that cannot fit the live cluster fails after waiting this long */
  /* [model] */
  model_config model;              /* with model.arch: one of models/models.def */
  char from[JOBSPEC_PATH_MAX];     /* a Hugging Face model folder (absolute), or "": its config.json sets the
                                      model and init names its weights (hfconfig.h) */
  char init[JOBSPEC_PATH_MAX];     /* "random" or an absolute path to a .safetensors file or a
                                      model.safetensors.index.json (st_model.h) */
  int no_dropout;                  /* [model] dropout = none: train without the dropout config.json names (fsdpd
                                      applies none; a non-zero one is refused otherwise) */
  char dropout_off[64];            /* what that leaves out, "attn_pdrop = 0.1", for fsdpctl plan; "" if nothing
                                      (derived by the parse of from = DIR; not carried to workers) */
  /* [data] */
  char train[JOBSPEC_PATH_MAX];    /* absolute path to an llm.c token file, or "" when synthetic */
  int synthetic;                   /* train = synthetic:markov:SEED */
  uint64_t markov_seed;
  int batch_size;                  /* B: sequences per rank per micro-step */
  int grad_accum;                  /* G: micro-steps per optimizer step */
  int shuffle;                     /* 1: shuffled windows of T+1 keyed by seed (tokens.h); 0: file order */
  int pack;                        /* masked data: 1 documents packed in rows, 0 one per row (tokens.h) */
  char val[JOBSPEC_PATH_MAX];      /* absolute path to the validation token file, or "" */
  int val_synthetic;               /* val = synthetic:markov:SEED */
  uint64_t val_markov_seed;
  /* [optim] */
  double lr, min_lr;
  int warmup_steps;
  lr_schedule schedule;
  double weight_decay, beta1, beta2, eps, grad_clip;   /* grad_clip 0 = off */
  /* [fsdp] */
  int world_size;
  device_kind device;
  shard_mode sharding;
  int shard_group;                 /* hybrid: G ranks per shard group; 0 = the ranks per node of the placement */
  int prefetch;                    /* units gathered ahead of compute, 0..4 */
  ackpt_mode ackpt;                /* full: a block keeps its input, recomputes its forward in backward */
  offload_mode offload;            /* optimizer: fp32 master and AdamW state in host memory (cuda) */
  dtype_kind param_dtype, reduce_dtype;
  comm_kind comm;
  double timeout_s;                /* a collective or peer silent this long fails the job */
  /* [checkpoint] */
  char ckpt_dir[JOBSPEC_PATH_MAX]; /* absolute, or "" for none */
  int ckpt_every;                  /* steps; 0 = off */
  int ckpt_keep;
  int ckpt_async;                  /* 1: snapshot to host memory, written by a thread (docs/checkpoints.md) */
  resume_mode resume;
  /* [eval] (parsed and validated here; the worker acts on them: docs/jobs.md) */
  int eval_every;                  /* validation loss at steps K, 2K, ...; 0 = off (needs val otherwise) */
  int eval_batches;                /* M: micro-batches of N·B rows per validation loss */
  int eval_at_start;               /* 1: the validation loss before the first step (metrics.jsonl step 0) */
  int sample_every;                /* a sample in the job log at steps K, 2K, ...; 0 = off */
  char sample_prompt[JOBSPEC_TEXT_MAX];  /* its prompt: text, one token per byte; "" unless set */
  /* [lora] (docs/models.md "LoRA"): rank 0 = off */
  struct {
    int rank;
    double alpha, dropout;
    char targets[JOBSPEC_TEXT_MAX];      /* comma-separated module names; "" = the family's default */
    char init_from[JOBSPEC_PATH_MAX];    /* a PEFT adapter folder (absolute), or "" */
    base_dtype_kind base_dtype;          /* resolved at parse: bf16 | fp32 set param_dtype; auto stays auto */
    adapters_kind adapters;              /* sharded | replicated | auto (plan_lora_memory decides) */
  } lora;
} jobspec_t;

/* A validation source is set: [data] val = PATH or synthetic:markov:SEED. */
static inline int jobspec_has_val(const jobspec_t *s) { return s->val[0] || s->val_synthetic; }

/* Every key's default, from the key table's rows (jobspec_keys.c): what a job that sets no key holds. */
void jobspec_defaults(jobspec_t *s);
/* Whether this build has the CUDA backend, and the check `fsdpctl plan` and the daemon's submit make
 * with it: a device = cuda job is refused, with one line, by a build without it. */
int jobspec_build_has_cuda(void);
fsdp_status jobspec_check_build(const jobspec_t *s);
/* A one-line warning (no refusal) into BUF when the learning rate never reaches [optim] lr:
 * warmup_steps ≥ steps (the schedule's warmup is lr·(i+1)/(warmup_steps+1) at step i+1). Returns 1
 * with the line written, 0 when there is nothing to say. fsdpctl plan, submit and run print it. */
int jobspec_lr_warning(const jobspec_t *s, char *buf, size_t n);
fsdp_status jobspec_load(const char *path, jobspec_t *out);
/* Parse TEXT as if it were the file ORIGIN; relative paths are relative to BASE_DIR. */
fsdp_status jobspec_parse(const char *text, const char *origin, const char *base_dir, jobspec_t *out);
/* The resolved job as text (jobspec_canon.c): what the coordinator sends its workers in worker_setup.
 * The writer puts every key of the table on its own line (train and val as written, paths absolute,
 * from = DIR's keys and every derived value explicit) under a first line naming
 * JOBSPEC_CANON_VERSION; it fails only for a value that does not fit on one line (*TEXT is malloc'd,
 * the caller's). The reader takes exactly that form back, from zero: no default of its own build, no
 * derived key, no file is read; a missing, repeated or unknown key, a value out of the table's range
 * or another version is an error. ORIGIN names the job in messages and becomes OUT's path. */
#define JOBSPEC_CANON_VERSION 1
fsdp_status jobspec_canonical_write(const jobspec_t *s, char **text);
fsdp_status jobspec_canonical_read(const char *text, const char *origin, jobspec_t *out);
/* The defaults as a commented job file (`fsdpctl plan --defaults`). */
void jobspec_write_defaults(FILE *f);

const char *jobspec_shard_mode_name(shard_mode m);
/* The one-line message for sharding = hybrid with shard_group GROUP at world WORLD when GROUP does not
 * divide WORLD or equals it (then it is full sharding). Thread-local buffer. */
const char *jobspec_hybrid_error(int world, int group);
const char *jobspec_device_kind_name(device_kind d);
const char *jobspec_dtype_kind_name(dtype_kind d);
const char *jobspec_comm_kind_name(comm_kind c);
const char *jobspec_lr_schedule_name(lr_schedule s);
const char *jobspec_ackpt_mode_name(ackpt_mode m);        /* "none", "full" */
const char *jobspec_base_dtype_name(base_dtype_kind b);   /* "auto", "bf16", "fp32", "nf4" */
const char *jobspec_offload_mode_name(offload_mode m);    /* "none", "optimizer" */
const char *jobspec_arch_name(model_arch a);              /* "gpt2", "llama" */
const char *jobspec_rope_scaling_name(rope_scaling_kind k);   /* "none", "llama3", "longrope", "linear" */
static inline int jobspec_dtype_bytes(dtype_kind d) { return d == DTYPE_BF16 ? 2 : 4; }

#endif
