/* jobspec_keys — the key table (defaults and applicability in its rows), enum names, lookups and
 * the located error; see jobspec_keys.h. The parser, which applies the defaults, is jobspec.c, the
 * rules between keys jobspec_rules.c, the writers jobspec_canon.c. */
#include "jobspec_keys.h"

#include "arch.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- enum names ---- */

static const char *const shard_names[] = {"full", "grad_op", "none", "hybrid", NULL};
static const char *const device_names[] = {"cpu", "cuda", NULL};
static const char *const dtype_names[] = {"fp32", "bf16", NULL};
static const char *const comm_names[] = {"auto", "gloo", "nccl", NULL};
static const char *const sched_names[] = {"constant", "cosine", NULL};
static const char *const resume_names[] = {"auto", "never", NULL};
static const char *const bool_names[] = {"false", "true", NULL};
static const char *const ackpt_names[] = {"none", "full", NULL};
static const char *const base_dtype_names[] = {"auto", "bf16", "fp32", "nf4", NULL};
static const char *const adapters_names[] = {"auto", "sharded", "replicated", NULL};
static const char *const offload_names[] = {"none", "optimizer", NULL};
static const char *const arch_enum_names[] = {
#define FSDP_ARCH(ID, name) #name,
#include "models.def"
    NULL};
static const char *const rope_scaling_names[] = {"none", "llama3", "longrope", "linear", NULL};
static const char *const dropout_names[] = {"config", "none", NULL};

static const char *enum_name(const char *const *names, int n, int v) {
  return v >= 0 && v < n ? names[v] : "?";
}
const char *jobspec_shard_mode_name(shard_mode m) { return enum_name(shard_names, 4, (int)m); }
const char *jobspec_hybrid_error(int world, int group) {
  static _Thread_local char msg[320];
  if (world % group)
    snprintf(msg, sizeof msg, "[fsdp] shard_group = %d does not divide world_size = %d; allowed: a divisor of the world "
             "size below it (hybrid groups are shard_group consecutive ranks)", group, world);
  else
    snprintf(msg, sizeof msg, "[fsdp] sharding = hybrid with shard_group = world_size = %d is full sharding (one group); "
             "allowed: sharding = full, or a shard_group below the world size that divides it", world);
  return msg;
}
const char *jobspec_device_kind_name(device_kind d) { return enum_name(device_names, 2, (int)d); }
const char *jobspec_dtype_kind_name(dtype_kind d) { return enum_name(dtype_names, 2, (int)d); }
const char *jobspec_comm_kind_name(comm_kind c) { return enum_name(comm_names, 3, (int)c); }
const char *jobspec_lr_schedule_name(lr_schedule s) { return enum_name(sched_names, 2, (int)s); }
const char *jobspec_ackpt_mode_name(ackpt_mode m) { return enum_name(ackpt_names, 2, (int)m); }
const char *jobspec_base_dtype_name(base_dtype_kind b) { return enum_name(base_dtype_names, 4, (int)b); }
const char *jobspec_offload_mode_name(offload_mode m) { return enum_name(offload_names, 2, (int)m); }
const char *jobspec_arch_name(model_arch a) {
  return enum_name(arch_enum_names, (int)(sizeof arch_enum_names / sizeof *arch_enum_names) - 1, (int)a);
}
const char *jobspec_rope_scaling_name(rope_scaling_kind k) { return enum_name(rope_scaling_names, 4, (int)k); }
unsigned jobspec_rope_bit(rope_scaling_kind k) {
  return k == ROPE_SCALING_LLAMA3 ? KA_ROPE3 : k == ROPE_SCALING_LONGROPE ? KA_LONGROPE : k == ROPE_SCALING_LINEAR ? KA_LINEAR : 0;
}

/* ---- the key table ---- */

#define F(field) offsetof(jobspec_t, field)
/* A row: section, key, field, range, then the help, the default as the file writes it (NULL: none)
 * and, for the four llama3 rope numbers, .applies = KA_ROPE3 (which architectures read a [model] key is
 * their descriptors' word: models/arch.h). */
#define INT(s_, k_, f_, lo_, hi_, help_, def_, ...) \
  {.sec = s_, .key = k_, .type = KT_INT, .off = F(f_), .lo = lo_, .hi = hi_, .help = help_, .def = def_, __VA_ARGS__}
#define U64(s_, k_, f_, def_, help_) {.sec = s_, .key = k_, .type = KT_U64, .off = F(f_), .help = help_, .def = def_}
#define DBL(s_, k_, f_, lo_, hi_, lo_open_, hi_open_, help_, def_, ...)                                   \
  {.sec = s_, .key = k_, .type = KT_DBL, .off = F(f_), .lo = lo_, .hi = hi_, .lo_open = lo_open_, .hi_open = hi_open_, \
   .help = help_, .def = def_, __VA_ARGS__}
#define ENUM(s_, k_, f_, names_, help_, def_, ...) \
  {.sec = s_, .key = k_, .type = KT_ENUM, .off = F(f_), .names = names_, .help = help_, .def = def_, __VA_ARGS__}
#define SPECIAL(s_, k_, type_, f_, help_, def_) {.sec = s_, .key = k_, .type = type_, .off = F(f_), .help = help_, .def = def_}

const char *const jobspec_sections[] = {"job", "model", "data", "optim", "fsdp", "checkpoint", "eval", "lora", NULL};

const keydef jobspec_keys[] = {
  SPECIAL("job", "name", KT_NAME, name,
          "1..63 characters of A-Z a-z 0-9 . _ -; default: the job file's name without its extension", "job"),
  INT("job", "steps", steps, 1, 1e9, "optimizer steps (nanoGPT's max_iters)", "600000"),
  U64("job", "seed", seed, "1337", "keys the counter-based initializer (nanoGPT and llm.c use 1337)"),
  INT("job", "max_restarts", max_restarts, 0, 1000,
      "times a failed job is restarted from its last checkpoint (0: fail at the first error)", "0"),
  DBL("job", "restart_wait_s", restart_wait_s, 0, 86400, 0, 0,
      "how long a queued job that no longer fits the live cluster (a node was lost) may wait for it to return before it fails", "60"),

  ENUM("model", "arch", model.arch, arch_enum_names,
       "the architecture, one of models/models.def's (docs/models.md's table tells them apart: gpt2 is GPT-2 with "
       "LayerNorm, GELU, learned positions and a tied head; the others are rotary)", "gpt2"),
  INT("model", "n_layer", model.n_layer, 1, 512, "L, transformer blocks (GPT-2 small: 12)", "12"),
  INT("model", "n_head", model.n_head, 1, 256, "H, attention heads (GPT-2 small: 12)", "12"),
  INT("model", "n_embd", model.n_embd, 1, 32768, "C, channels; a multiple of n_head (GPT-2 small: 768)", "768"),
  INT("model", "vocab_size", model.vocab_size, 2, 16777216,
      "V, rows of the tied wte (GPT-2: 50257; llm.c pads to 50304 for speed)", "50257"),
  INT("model", "seq_len", model.seq_len, 1, 32768,
      "T, wpe rows and the training sequence length (GPT-2: 1024)", "1024"),
  INT("model", "n_kv_head", model.n_kv_head, 0, 256,
      "llama: key/value heads, dividing n_head (grouped-query attention); 0 = n_head (Llama-3.2-1B: 8)", "12"),
  INT("model", "ffn_dim", model.ffn_dim, 0, 1048576,
      "llama: SwiGLU width, required and even (Llama-3.2-1B: 8192); 0 = unset (GPT-2's MLP is 4 x n_embd)", NULL),
  DBL("model", "norm_eps", model.norm_eps, 0, 1, 1, 1, "llama: RMSNorm eps (Hugging Face rms_norm_eps: 1e-5)", "1e-5"),
  DBL("model", "rope_theta", model.rope_theta, 1, 1e9, 0, 0, "llama: rotary base (Llama 2: 10000, Llama 3: 500000)", "10000"),
  INT("model", "n_positions", model.n_positions, 0, 1 << 24,
      "the model's published positions: GPT-2's wpe rows (n_positions), Llama's max_position_embeddings; at least "
      "seq_len; 0 = seq_len", "0"),
  ENUM("model", "tie_word_embeddings", model.tie_embeddings, bool_names,
       "true: one tensor is both the input embedding and the output head (GPT-2 always; Llama-3.2-1B, Qwen2.5-0.5B); "
       "default: true for gpt2, false for llama (Hugging Face LlamaConfig's)", "true"),
  ENUM("model", "rope_scaling", model.rope_scaling, rope_scaling_names,
       "llama: rotary scaling (Hugging Face rope_scaling's rope_type): none, llama3 (Llama-3.1/3.2: long "
       "wavelengths divided by rope_factor, short ones kept, a smooth band between; needs the four rope_* keys below), "
       "or longrope (Phi-3 within its pretraining context: needs rope_short_factor, rope_attention_factor and "
       "rope_original_max_position_embeddings), or linear (every inverse frequency divided by rope_factor: "
       "positions interpolated; Gemma 3's global layers)", "none"),
  DBL("model", "rope_factor", model.rope_factor, 1, 1e6, 0, 0,
      "llama, rope_scaling = llama3 or linear: factor (Llama-3.1: 8, Llama-3.2: 32; linear: positions / factor)", NULL,
      .applies = KA_ROPE3 | KA_LINEAR),
  DBL("model", "rope_low_freq_factor", model.rope_low_freq_factor, 0, 1e6, 1, 0,
      "llama, rope_scaling = llama3: low_freq_factor (Llama-3.1: 1)", NULL, .applies = KA_ROPE3),
  DBL("model", "rope_high_freq_factor", model.rope_high_freq_factor, 0, 1e6, 1, 0,
      "llama, rope_scaling = llama3: high_freq_factor, above rope_low_freq_factor (Llama-3.1: 4)", NULL, .applies = KA_ROPE3),
  INT("model", "rope_original_max_position_embeddings", model.rope_original_max_pos, 1, 16777216,
      "llama, rope_scaling = llama3: original_max_position_embeddings, the context the model was pretrained at "
      "(Llama-3.1: 8192); longrope: seq_len at most this", NULL, .applies = KA_ROPE3 | KA_LONGROPE),
  INT("model", "head_dim", model.head_dim, 0, 1024,
      "llama, qwen2, qwen3: each attention head's width, even (Qwen3: 128); q_proj is n_head x head_dim wide; "
      "0 = n_embd / n_head", "0"),
  ENUM("model", "attention_bias", model.attention_bias, bool_names,
       "llama, qwen3: q_proj, k_proj, v_proj and o_proj have biases (Hugging Face attention_bias; Qwen2's q/k/v "
       "biases come with arch = qwen2)", "false"),
  ENUM("model", "mlp_bias", model.mlp_bias, bool_names,
       "llama: gate_proj, up_proj and down_proj have biases (Hugging Face mlp_bias)", "false"),
  {.sec = "model", .key = "rope_short_factor", .type = KT_FACTORS, .off = F(model.rope_short_factor), .lo = 0,
   .hi = 1e6, .lo_open = 1, .help = "rope_scaling = longrope: short_factor, one number per rotary frequency (head "
   "size / 2 of them, separated by commas), dividing each inverse frequency", .applies = KA_LONGROPE},
  DBL("model", "rope_attention_factor", model.rope_attention_factor, 0, 1e6, 1, 0,
      "rope_scaling = longrope: attention_factor, multiplying the rotary cos and sin (Phi-3-mini-128k: 1.19)", NULL,
      .applies = KA_LONGROPE),
  INT("model", "sliding_window", model.sliding_window, 0, 1 << 24,
      "mistral: the sliding window of attention, token t sees tokens t-W+1 .. t (config.json sliding_window; "
      "Mistral-7B-v0.1: 4096); 0 = full causal attention (config.json null)", "0"),
  INT("model", "pad_token_id", model.pad_token_id, -1, 16777215,
      "llama, qwen2, qwen3, phi3, mistral, gemma3: the padding token, below vocab_size, whose embedding row only a tied "
      "head trains (nn.Embedding's padding_idx; config.json pad_token_id); -1 = none", "-1"),
  ENUM("model", "dropout", no_dropout, dropout_names,
       "fsdpd applies no dropout: config (from = DIR's config.json, refused where a dropout there is not 0: GPT2Config's "
       "attn_pdrop, resid_pdrop, embd_pdrop are 0.1 unless set) or none (train without it; fsdpctl plan says so)",
       "config"),
  SPECIAL("model", "from", KT_FROM, from,
          "a Hugging Face model folder (config.json, model.safetensors or model.safetensors.index.json and its "
          "shards): the architecture, every shape key and the weights; no default", NULL),
  SPECIAL("model", "init", KT_INIT, init,
          "random (GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2L); Llama: N(0, 0.02), norms 1, the "
          "pad_token_id row 0), "
          "PATH.safetensors or PATH/model.safetensors.index.json", "random"),

  SPECIAL("data", "train", KT_TRAIN, train,
          "required: PATH to an llm.c token file (or a glob, or several separated by spaces: one stream in "
          "name order), or synthetic:markov:SEED", NULL),
  INT("data", "batch_size", batch_size, 1, 4096, "B, sequences per rank per micro-step (nanoGPT: 12)", "12"),
  INT("data", "grad_accum", grad_accum, 1, 4096,
      "G, micro-steps per optimizer step (nanoGPT: 40 over 8 GPUs = 5 per rank)", "5"),
  ENUM("data", "shuffle", shuffle, bool_names,
       "true: each epoch reads windows of seq_len+1 tokens in a permutation keyed by (seed, epoch); false: file order", "true"),
  ENUM("data", "pack", pack, bool_names,
       "masked data (gen-data --chat): true puts whole documents back to back in rows of seq_len, each attending "
       "only to itself with positions from 0; false one document per row; the rest of a row is padding without "
       "loss. A plain token file is one continuous stream: false is refused there", "true"),
  SPECIAL("data", "val", KT_VAL, val,
          "validation tokens for [eval] every: PATH to an llm.c token file (or a glob or list, as train), or "
          "synthetic:markov:SEED; no default (none)", NULL),

  DBL("optim", "lr", lr, 0, 10, 1, 0, "peak learning rate (nanoGPT GPT-2: 6e-4)", "6e-4"),
  DBL("optim", "min_lr", min_lr, 0, 10, 0, 0, "floor of the cosine schedule, <= lr (nanoGPT: lr/10)", "6e-5"),
  INT("optim", "warmup_steps", warmup_steps, 0, 1e9, "linear warmup from 0 to lr (nanoGPT: 2000)", "2000"),
  ENUM("optim", "schedule", schedule, sched_names, "after warmup: constant, or cosine down to min_lr at the last step", "cosine"),
  DBL("optim", "weight_decay", weight_decay, 0, 10, 0, 0, "AdamW decoupled decay on 2-D tensors only (nanoGPT: 0.1)", "0.1"),
  DBL("optim", "beta1", beta1, 0, 1, 0, 1, "AdamW beta1 (nanoGPT: 0.9)", "0.9"),
  DBL("optim", "beta2", beta2, 0, 1, 0, 1, "AdamW beta2 (nanoGPT: 0.95)", "0.95"),
  DBL("optim", "eps", eps, 0, 1, 1, 0, "AdamW eps, outside the sqrt (PyTorch: 1e-8)", "1e-8"),
  DBL("optim", "grad_clip", grad_clip, 0, 1e6, 0, 0, "clip the global gradient norm to this; 0 = off (nanoGPT: 1.0)", "1"),

  INT("fsdp", "world_size", world_size, 1, 4096, "ranks: one worker process per GPU or CPU slot", "1"),
  ENUM("fsdp", "device", device, device_names, "cpu (fp32, gloo) or cuda", "cpu"),
  ENUM("fsdp", "sharding", sharding, shard_names,
       "full (ZeRO-3), grad_op (ZeRO-2: params stay gathered forward->backward), none (DDP), hybrid (full inside "
       "groups of shard_group ranks, replicated across groups: FSDP HYBRID_SHARD)", "full"),
  INT("fsdp", "shard_group", shard_group, 0, 4096,
      "G, ranks per shard group with sharding = hybrid; 0 = the ranks per node of the job's placement", "0"),
  INT("fsdp", "prefetch", prefetch, 0, 4, "units gathered ahead of the one being computed: more overlap, more memory", "1"),
  ENUM("fsdp", "activation_checkpointing", ackpt, ackpt_names,
       "full: each block keeps only its input and recomputes its forward in the backward (less memory, ~1/3 more compute)", "none"),
  ENUM("fsdp", "offload", offload, offload_names,
       "optimizer: the fp32 master shard and AdamW state live in host memory and AdamW runs on the CPU (cuda only)", "none"),
  ENUM("fsdp", "param_dtype", param_dtype, dtype_names, "dtype of gathered parameters (the fp32 master shard is rounded to it after each step)", "fp32"),
  ENUM("fsdp", "reduce_dtype", reduce_dtype, dtype_names, "dtype of gradient reduce-scatters and all-reduces (accumulation stays fp32)", "fp32"),
  ENUM("fsdp", "comm", comm, comm_names, "auto picks nccl on cuda and gloo on cpu", "auto"),
  DBL("fsdp", "timeout_s", timeout_s, 0, 86400, 1, 0, "a collective or peer silent this long fails the job", "60"),

  SPECIAL("checkpoint", "dir", KT_DIR, ckpt_dir, "directory for checkpoints; no default (none)", ""),
  INT("checkpoint", "every", ckpt_every, 0, 1e9, "steps between checkpoints; 0 = off (needs dir otherwise)", "0"),
  INT("checkpoint", "keep", ckpt_keep, 1, 1000, "newest checkpoints kept; older ones are deleted", "2"),
  ENUM("checkpoint", "async", ckpt_async, bool_names,
       "true: a save copies the shards to host memory and a writer thread writes them while training goes on", "true"),
  ENUM("checkpoint", "resume", resume, resume_names, "auto: continue from the newest checkpoint in dir if any", "auto"),

  INT("eval", "every", eval_every, 0, 1e9, "validation loss at steps K, 2K, ...; 0 = off (needs [data] val otherwise)", "0"),
  INT("eval", "batches", eval_batches, 1, 1e6, "M: the validation loss is the mean over M micro-batches of world x B rows", "20"),
  ENUM("eval", "at_start", eval_at_start, bool_names,
       "true: the validation loss before the first step, as step 0 of metrics.jsonl (needs [data] val)", "false"),
  INT("eval", "sample_every", sample_every, 0, 1e9, "a sample in the job log at steps K, 2K, ...; 0 = off (needs sample_prompt)", "0"),
  SPECIAL("eval", "sample_prompt", KT_TEXT, sample_prompt,
          "the prompt of those samples: text, one token per byte (each byte < vocab_size); no default", NULL),

  INT("lora", "rank", lora.rank, 0, 4096,
      "r, the adapters' rank: 0 = no LoRA (every weight trained); else the base is frozen and only adapters "
      "A [r, in], B [out, r] on the target projections are trained (peft's r)", "0"),
  DBL("lora", "alpha", lora.alpha, 0, 1e6, 1, 0, "the adapters' output is scaled by alpha / rank (peft's lora_alpha)", "8"),
  DBL("lora", "dropout", lora.dropout, 0, 1, 0, 1,
      "dropout on the adapters' input (peft's lora_dropout); only 0 is implemented", "0"),
  SPECIAL("lora", "targets", KT_TEXT, lora.targets,
          "Hugging Face module names, comma-separated (llama, qwen2, qwen3, mistral, gemma3: q_proj, k_proj, v_proj, "
          "o_proj, gate_proj, up_proj, down_proj; phi3: qkv_proj, o_proj, gate_up_proj, down_proj; gpt2: c_attn, "
          "c_proj, c_fc); default: peft's for the family (q_proj, v_proj; gpt2: c_attn; phi3: none, required)",
          NULL),
  SPECIAL("lora", "init_from", KT_DIR, lora.init_from,
          "a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) to continue from; default: A "
          "Kaiming-uniform from [job] seed, B zero (peft's)", ""),
  ENUM("lora", "base_dtype", lora.base_dtype, base_dtype_names,
       "the frozen base's storage: auto = param_dtype; bf16 | fp32 (held and gathered in it, no fp32 master); nf4 = "
       "QLoRA's NormalFloat4 (bitsandbytes' format: blocks of 64, double-quantized scales), quantized at load, "
       "gathered in 4 bits, dequantized to bf16 per block", "auto"),
  ENUM("lora", "adapters", lora.adapters, adapters_names,
       "how the adapters are held: sharded = in units of their own, sharded over the shard group as the base is "
       "(gathered per block, gradient reduce-scattered, AdamW on the shard); replicated = whole on every rank "
       "(gradient all-reduced once per step); auto = whichever the plan says holds less per rank (fsdpctl plan "
       "names it)", "auto"),
};
const int jobspec_nkeys = (int)(sizeof jobspec_keys / sizeof jobspec_keys[0]);
_Static_assert(sizeof jobspec_keys / sizeof jobspec_keys[0] <= JOBSPEC_MAX_KEYS, "raise JOBSPEC_MAX_KEYS");

/* ---- formatting ---- */

void jobspec_fmt_num(char *buf, size_t n, double v) {
  /* integers as integers, else the shortest %g that reads back as v */
  if (v == floor(v) && fabs(v) < 1e15) {
    snprintf(buf, n, "%.0f", v);
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) return;
  }
}

int jobspec_fmt_factors(FILE *f, const rope_factor_list *l) {
  char num[32];
  for (int i = 0; i < l->n; i++) {
    jobspec_fmt_num(num, sizeof num, l->v[i]);
    if (fprintf(f, "%s%s", i ? ", " : "", num) < 0) return -1;
  }
  return 0;
}

int jobspec_parse_factors(const char *v, rope_factor_list *out) {
  rope_factor_list l = {0};
  const char *p = v;
  while (*p) {
    char *end;
    while (*p == ' ') p++;
    errno = 0;
    double x = strtod(p, &end);
    if (end == p || errno || !isfinite(x) || l.n == ROPE_MAX_FACTORS) return 0;
    l.v[l.n++] = x;
    for (p = end; *p == ' '; p++) {}
    if (*p == ',') p++;
    else if (*p) return 0;
  }
  if (!l.n) return 0;
  *out = l;
  return 1;
}

void jobspec_key_allowed(const keydef *k, char *buf, size_t n) {
  char lo[32], hi[32];
  switch (k->type) {
  case KT_INT:
    snprintf(buf, n, "an integer in %.0f..%.0f", k->lo, k->hi);
    break;
  case KT_U64:
    snprintf(buf, n, "an integer in 0..%llu", (unsigned long long)UINT64_MAX);
    break;
  case KT_DBL:
    jobspec_fmt_num(lo, sizeof lo, k->lo);
    jobspec_fmt_num(hi, sizeof hi, k->hi);
    snprintf(buf, n, "a number %s %s and %s %s", k->lo_open ? ">" : ">=", lo, k->hi_open ? "<" : "<=", hi);
    break;
  case KT_FACTORS:
    jobspec_fmt_num(lo, sizeof lo, k->lo);
    jobspec_fmt_num(hi, sizeof hi, k->hi);
    snprintf(buf, n, "up to %d numbers > %s and <= %s, separated by commas", ROPE_MAX_FACTORS, lo, hi);
    break;
  case KT_ENUM: {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; k->names[i] && used < n; i++)
      used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? " | " : "", k->names[i]);
    break;
  }
  default:
    snprintf(buf, n, "%s", k->help);
  }
}

/* ---- lookups, messages ---- */

int jobspec_key_index(const char *sec, const char *key) {
  for (int i = 0; i < jobspec_nkeys; i++)
    if (!strcmp(jobspec_keys[i].sec, sec) && !strcmp(jobspec_keys[i].key, key)) return i;
  return -1;
}

int jobspec_section_index(const char *name) {
  for (int i = 0; jobspec_sections[i]; i++)
    if (!strcmp(jobspec_sections[i], name)) return i;
  return -1;
}

fsdp_status jobspec_error(fsdp_status st, const char *origin, int line, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (line > 0) return fsdp_set_error(st, "%s:%d: %s", origin, line, msg);
  return fsdp_set_error(st, "%s: %s", origin, msg);
}

int jobspec_key_applies(const keydef *k, model_arch a) { return strcmp(k->sec, "model") || arch_key_applies(arch_get(a), k->key); }
