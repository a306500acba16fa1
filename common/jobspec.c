/* jobspec — the job file: one declarative table of every key (section, name, type, default,
 * range, help), a libinih pass over it, and the cross-field checks. See jobspec.h and docs/jobs.md.
 *
 * Line numbers: Debian's libinih is built without INI_HANDLER_LINENO, so the text is fed through
 * ini_parse_stream() with our own line reader, which counts lines and also (a) strips leading
 * whitespace, so an indented key is a key and never a multi-line continuation, (b) drops inline
 * "# comments" (inih itself only drops inline "; comments"), and (c) checks section headers, so an
 * unknown section is reported even when it holds no key. Errors are recorded with the job file and
 * line as the location (fsdp_set_error_at), so fsdp_last_error() reads "tiny.ini:7: ...".
 */
#include "jobspec.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JOBSPEC_MAX_FILE (1 << 20)   /* a job file is a few hundred bytes; refuse anything silly */

/* ---- enum names ---- */

static const char *const shard_names[] = {"full", "grad_op", "none", "hybrid", NULL};
static const char *const device_names[] = {"cpu", "cuda", NULL};
static const char *const dtype_names[] = {"fp32", "bf16", NULL};
static const char *const comm_names[] = {"auto", "gloo", "nccl", NULL};
static const char *const sched_names[] = {"constant", "cosine", NULL};
static const char *const resume_names[] = {"auto", "never", NULL};
static const char *const bool_names[] = {"false", "true", NULL};
static const char *const ackpt_names[] = {"none", "full", NULL};
static const char *const offload_names[] = {"none", "optimizer", NULL};
static const char *const arch_names[] = {"gpt2", "llama", NULL};

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
const char *jobspec_offload_mode_name(offload_mode m) { return enum_name(offload_names, 2, (int)m); }
const char *jobspec_arch_name(model_arch a) { return enum_name(arch_names, 2, (int)a); }

/* ---- the key table ---- */

typedef enum { KT_INT, KT_U64, KT_DBL, KT_ENUM, KT_NAME, KT_INIT, KT_TRAIN, KT_VAL, KT_DIR, KT_TEXT } key_type;

/* Numeric bounds: lo/hi inclusive unless lo_open/hi_open. */
typedef struct keydef {
  const char *sec, *key;
  key_type type;
  size_t off;
  double lo, hi;
  int lo_open, hi_open;
  const char *const *names;   /* KT_ENUM */
  const char *help;           /* why the default is what it is; printed by --defaults */
} keydef;

#define F(field) offsetof(jobspec_t, field)
#define INT(sec, key, field, lo, hi, help) {sec, key, KT_INT, F(field), lo, hi, 0, 0, NULL, help}
#define DBL(sec, key, field, lo, hi, lo_open, hi_open, help) \
  {sec, key, KT_DBL, F(field), lo, hi, lo_open, hi_open, NULL, help}
#define ENUM(sec, key, field, names, help) {sec, key, KT_ENUM, F(field), 0, 0, 0, 0, names, help}
#define SPECIAL(sec, key, type, field, help) {sec, key, type, F(field), 0, 0, 0, 0, NULL, help}

static const char *const sections[] = {"job", "model", "data", "optim", "fsdp", "checkpoint", "eval", NULL};
enum { NSECTIONS = 7 };
#define SECTIONS_ALLOWED "[job] [model] [data] [optim] [fsdp] [checkpoint] [eval]"

static const keydef keys[] = {
  SPECIAL("job", "name", KT_NAME, name,
          "1..63 characters of A-Z a-z 0-9 . _ -; default: the job file's name without its extension"),
  INT("job", "steps", steps, 1, 1e9, "optimizer steps (nanoGPT's max_iters)"),
  {"job", "seed", KT_U64, F(seed), 0, 0, 0, 0, NULL,
   "keys the counter-based initializer (nanoGPT and llm.c use 1337)"},
  INT("job", "max_restarts", max_restarts, 0, 1000,
      "times a failed job is restarted from its last checkpoint (0: fail at the first error)"),
  DBL("job", "restart_wait_s", restart_wait_s, 0, 86400, 0, 0,
      "how long a queued job that no longer fits the live cluster (a node was lost) may wait for it to return before it fails"),

  ENUM("model", "arch", model.arch, arch_names,
       "gpt2 (LayerNorm, GELU, learned positions, tied head) or llama (RMSNorm, rotary, GQA, SwiGLU, untied head)"),
  INT("model", "n_layer", model.n_layer, 1, 512, "L, transformer blocks (GPT-2 small: 12)"),
  INT("model", "n_head", model.n_head, 1, 256, "H, attention heads (GPT-2 small: 12)"),
  INT("model", "n_embd", model.n_embd, 1, 32768, "C, channels; a multiple of n_head (GPT-2 small: 768)"),
  INT("model", "vocab_size", model.vocab_size, 2, 16777216,
      "V, rows of the tied wte (GPT-2: 50257; llm.c pads to 50304 for speed)"),
  INT("model", "seq_len", model.seq_len, 1, 32768,
      "T, wpe rows and the training sequence length (GPT-2: 1024)"),
  INT("model", "n_kv_head", model.n_kv_head, 0, 256,
      "llama: key/value heads, dividing n_head (grouped-query attention); 0 = n_head (Llama-3.2-1B: 8)"),
  INT("model", "ffn_dim", model.ffn_dim, 0, 1048576,
      "llama: SwiGLU width, required (Llama-3.2-1B: 8192); 0 = unset (GPT-2's MLP is 4 x n_embd)"),
  DBL("model", "norm_eps", model.norm_eps, 0, 1, 1, 1, "llama: RMSNorm eps (Hugging Face rms_norm_eps: 1e-5)"),
  DBL("model", "rope_theta", model.rope_theta, 1, 1e9, 0, 0, "llama: rotary base (Llama 2: 10000, Llama 3: 500000)"),
  SPECIAL("model", "init", KT_INIT, init,
          "random (GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2L); Llama: N(0, 0.02), norms 1) or "
          "PATH.safetensors"),

  SPECIAL("data", "train", KT_TRAIN, train,
          "required: PATH to an llm.c token file, or synthetic:markov:SEED"),
  INT("data", "batch_size", batch_size, 1, 4096, "B, sequences per rank per micro-step (nanoGPT: 12)"),
  INT("data", "grad_accum", grad_accum, 1, 4096,
      "G, micro-steps per optimizer step (nanoGPT: 40 over 8 GPUs = 5 per rank)"),
  ENUM("data", "shuffle", shuffle, bool_names,
       "true: each epoch reads windows of seq_len+1 tokens in a permutation keyed by (seed, epoch); false: file order"),
  SPECIAL("data", "val", KT_VAL, val,
          "validation tokens for [eval] every: PATH to an llm.c token file, or synthetic:markov:SEED; no default (none)"),

  DBL("optim", "lr", lr, 0, 10, 1, 0, "peak learning rate (nanoGPT GPT-2: 6e-4)"),
  DBL("optim", "min_lr", min_lr, 0, 10, 0, 0, "floor of the cosine schedule, <= lr (nanoGPT: lr/10)"),
  INT("optim", "warmup_steps", warmup_steps, 0, 1e9, "linear warmup from 0 to lr (nanoGPT: 2000)"),
  ENUM("optim", "schedule", schedule, sched_names, "after warmup: constant, or cosine down to min_lr at the last step"),
  DBL("optim", "weight_decay", weight_decay, 0, 10, 0, 0, "AdamW decoupled decay on 2-D tensors only (nanoGPT: 0.1)"),
  DBL("optim", "beta1", beta1, 0, 1, 0, 1, "AdamW beta1 (nanoGPT: 0.9)"),
  DBL("optim", "beta2", beta2, 0, 1, 0, 1, "AdamW beta2 (nanoGPT: 0.95)"),
  DBL("optim", "eps", eps, 0, 1, 1, 0, "AdamW eps, outside the sqrt (PyTorch: 1e-8)"),
  DBL("optim", "grad_clip", grad_clip, 0, 1e6, 0, 0, "clip the global gradient norm to this; 0 = off (nanoGPT: 1.0)"),

  INT("fsdp", "world_size", world_size, 1, 4096, "ranks: one worker process per GPU or CPU slot"),
  ENUM("fsdp", "device", device, device_names, "cpu (fp32, gloo) or cuda"),
  ENUM("fsdp", "sharding", sharding, shard_names,
       "full (ZeRO-3), grad_op (ZeRO-2: params stay gathered forward->backward), none (DDP), hybrid (full inside "
       "groups of shard_group ranks, replicated across groups: FSDP HYBRID_SHARD)"),
  INT("fsdp", "shard_group", shard_group, 0, 4096,
      "G, ranks per shard group with sharding = hybrid; 0 = the ranks per node of the job's placement"),
  INT("fsdp", "prefetch", prefetch, 0, 4, "units gathered ahead of the one being computed: more overlap, more memory"),
  ENUM("fsdp", "activation_checkpointing", ackpt, ackpt_names,
       "full: each block keeps only its input and recomputes its forward in the backward (less memory, ~1/3 more compute)"),
  ENUM("fsdp", "offload", offload, offload_names,
       "optimizer: the fp32 master shard and AdamW state live in host memory and AdamW runs on the CPU (cuda only)"),
  ENUM("fsdp", "param_dtype", param_dtype, dtype_names, "dtype of gathered parameters (the fp32 master shard is rounded to it after each step)"),
  ENUM("fsdp", "reduce_dtype", reduce_dtype, dtype_names, "dtype of gradient reduce-scatters and all-reduces (accumulation stays fp32)"),
  ENUM("fsdp", "comm", comm, comm_names, "auto picks nccl on cuda and gloo on cpu"),
  DBL("fsdp", "timeout_s", timeout_s, 0, 86400, 1, 0, "a collective or peer silent this long fails the job"),

  SPECIAL("checkpoint", "dir", KT_DIR, ckpt_dir, "directory for checkpoints; no default (none)"),
  INT("checkpoint", "every", ckpt_every, 0, 1e9, "steps between checkpoints; 0 = off (needs dir otherwise)"),
  INT("checkpoint", "keep", ckpt_keep, 1, 1000, "newest checkpoints kept; older ones are deleted"),
  ENUM("checkpoint", "resume", resume, resume_names, "auto: continue from the newest checkpoint in dir if any"),

  INT("eval", "every", eval_every, 0, 1e9, "validation loss at steps K, 2K, ...; 0 = off (needs [data] val otherwise)"),
  INT("eval", "batches", eval_batches, 1, 1e6, "M: the validation loss is the mean over M micro-batches of world x B rows"),
  INT("eval", "sample_every", sample_every, 0, 1e9, "a sample in the job log at steps K, 2K, ...; 0 = off (needs sample_prompt)"),
  SPECIAL("eval", "sample_prompt", KT_TEXT, sample_prompt,
          "the prompt of those samples: text, one token per byte (each byte < vocab_size); no default"),
};
enum { NKEYS = sizeof keys / sizeof keys[0] };

int jobspec_build_has_cuda(void) {
#ifdef FSDP_BUILD_CUDA
  return 1;
#else
  return 0;
#endif
}

fsdp_status jobspec_check_build(const jobspec_t *s) {
  if (s->device == DEVICE_CUDA && !jobspec_build_has_cuda())
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED,
                          "%s: [fsdp] device = cuda, but this build of fsdpd has no CUDA backend (nvcc, cuBLAS or NCCL "
                          "were not found when it was built); allowed here: device = cpu, or rebuild with "
                          "-DFSDP_CUDA=ON", s->path);
  return FSDP_OK;
}

void jobspec_defaults(jobspec_t *s) {
  memset(s, 0, sizeof *s);
  snprintf(s->path, sizeof s->path, "<string>");
  snprintf(s->name, sizeof s->name, "job");
  s->steps = 600000;              /* nanoGPT max_iters */
  s->seed = 1337;
  s->max_restarts = 0;
  s->restart_wait_s = 60;
  s->model = (model_config){.arch = ARCH_GPT2, .n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257,
                            .seq_len = 1024, .n_kv_head = 12, .norm_eps = 1e-5, .rope_theta = 10000};
  snprintf(s->init, sizeof s->init, "random");
  s->batch_size = 12;
  s->grad_accum = 5;
  s->lr = 6e-4;
  s->min_lr = 6e-5;
  s->warmup_steps = 2000;
  s->schedule = SCHED_COSINE;
  s->weight_decay = 0.1;
  s->beta1 = 0.9;
  s->beta2 = 0.95;
  s->eps = 1e-8;
  s->grad_clip = 1.0;
  s->world_size = 1;
  s->device = DEVICE_CPU;
  s->sharding = SHARD_FULL;
  s->prefetch = 1;
  s->param_dtype = DTYPE_FP32;
  s->reduce_dtype = DTYPE_FP32;
  s->comm = COMM_AUTO;
  s->timeout_s = 60;
  s->ckpt_every = 0;
  s->ckpt_keep = 2;
  s->resume = RESUME_AUTO;
  s->shuffle = 1;
  s->eval_every = 0;
  s->eval_batches = 20;   /* nanoGPT's eval_iters is 200 batches; 20 keeps small jobs fast */
  s->sample_every = 0;
}

/* ---- parse context ---- */

typedef struct pctx {
  jobspec_t *s;
  const char *origin;
  const char *base_dir;
  const char *p;             /* reader position in the text */
  int lineno;                /* the line the reader handed out last */
  int key_line[NKEYS];       /* where each key was set; 0 = default */
  int sec_line[NSECTIONS];   /* first header line of each section; 0 = absent */
  int nlines;
  fsdp_status err;           /* first error; its message is already recorded */
  int err_line;
} pctx;

#define PERR(c, line, st, ...)                                                 \
  do {                                                                         \
    if (!(c)->err) {                                                           \
      fsdp_set_error_at((st), (c)->origin, (line), __VA_ARGS__);               \
      (c)->err = (st);                                                         \
      (c)->err_line = (line);                                                  \
    }                                                                          \
  } while (0)

static int section_index(const char *name) {
  for (int i = 0; sections[i]; i++)
    if (!strcmp(sections[i], name)) return i;
  return -1;
}

static void trim_copy(char *dst, size_t n, const char *src, size_t len) {
  while (len && isspace((unsigned char)*src)) src++, len--;
  while (len && isspace((unsigned char)src[len - 1])) len--;
  if (len >= n) len = n - 1;
  memcpy(dst, src, len);
  dst[len] = '\0';
}

static void check_section_header(pctx *c, const char *line) {
  const char *close = strchr(line, ']');
  if (!close) return;   /* inih reports the syntax error */
  char name[64];
  trim_copy(name, sizeof name, line + 1, (size_t)(close - line - 1));
  int si = section_index(name);
  if (si < 0) {
    PERR(c, c->lineno, FSDP_ERR_INVALID,
         "unknown section [%s]; allowed: " SECTIONS_ALLOWED, name);
    return;
  }
  if (!c->sec_line[si]) c->sec_line[si] = c->lineno;
}

/* fgets-style reader over the text: one whole line per call (see the header comment). */
static char *line_reader(char *str, int num, void *stream) {
  pctx *c = stream;
  if (!*c->p) return NULL;
  const char *nl = strchr(c->p, '\n');
  size_t len = nl ? (size_t)(nl - c->p) : strlen(c->p);
  const char *line = c->p;
  c->p += len + (nl ? 1 : 0);
  c->lineno++;
  while (len && (*line == ' ' || *line == '\t')) line++, len--;
  /* An inline "#" comment starts at a '#' preceded by whitespace; a whole-line one is inih's. */
  for (size_t i = 1; i < len; i++)
    if (line[i] == '#' && (line[i - 1] == ' ' || line[i - 1] == '\t')) {
      len = i;
      break;
    }
  if (len && line[len - 1] == '\r') len--;
  if (len + 2 > (size_t)num) {
    if (*line != '#' && *line != ';')   /* a long comment is harmless: cut it */
      PERR(c, c->lineno, FSDP_ERR_INVALID, "line is longer than %d characters (the INI reader's limit)", num - 2);
    len = (size_t)num - 2;
  }
  memcpy(str, line, len);
  str[len] = '\n';
  str[len + 1] = '\0';
  if (*str == '[') {
    char tmp[256];
    trim_copy(tmp, sizeof tmp, str, len);
    check_section_header(c, tmp);
  }
  return str;
}

/* ---- value parsers ---- */

static void fmt_num(char *buf, size_t n, double v) {
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

static void fmt_range(const keydef *k, char *buf, size_t n) {
  char lo[32], hi[32];
  switch (k->type) {
  case KT_INT:
    snprintf(buf, n, "an integer in %.0f..%.0f", k->lo, k->hi);
    break;
  case KT_U64:
    snprintf(buf, n, "an integer in 0..%llu", (unsigned long long)UINT64_MAX);
    break;
  case KT_DBL:
    fmt_num(lo, sizeof lo, k->lo);
    fmt_num(hi, sizeof hi, k->hi);
    snprintf(buf, n, "a number %s %s and %s %s", k->lo_open ? ">" : ">=", lo, k->hi_open ? "<" : "<=", hi);
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

static int parse_i64(const char *v, long long *out) {
  if (!*v) return 0;
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || *end) return 0;
  *out = x;
  return 1;
}

static int parse_u64(const char *v, uint64_t *out) {
  if (!*v || *v == '-' || *v == '+' || !isdigit((unsigned char)*v)) return 0;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end) return 0;
  *out = (uint64_t)x;
  return 1;
}

static int parse_dbl(const char *v, double *out) {
  if (!*v) return 0;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (*end || !isfinite(x) || (errno == ERANGE && x != 0)) return 0;
  *out = x;
  return 1;
}

/* Lexically normalize an absolute path: collapse "//", "/./" and "dir/..". */
static void normalize_path(char *p) {
  char *out = p, *in = p;
  while (*in) {
    while (*in == '/') in++;
    if (!*in) break;
    char *seg = in;
    while (*in && *in != '/') in++;
    size_t len = (size_t)(in - seg);
    if (len == 1 && seg[0] == '.') continue;
    if (len == 2 && seg[0] == '.' && seg[1] == '.') {
      while (out > p && *--out != '/') {}
      continue;
    }
    *out++ = '/';
    memmove(out, seg, len);
    out += len;
  }
  if (out == p) *out++ = '/';
  *out = '\0';
}

/* PATH relative to the base directory, absolute; 0 if it does not fit. */
static int resolve_path(const pctx *c, const char *v, char *out, size_t n) {
  char tmp[2 * JOBSPEC_PATH_MAX];
  int w = v[0] == '/' ? snprintf(tmp, sizeof tmp, "%s", v) : snprintf(tmp, sizeof tmp, "%s/%s", c->base_dir, v);
  if (w < 0 || (size_t)w >= sizeof tmp) return 0;
  normalize_path(tmp);
  char real[PATH_MAX];
  const char *use = realpath(tmp, real) ? real : tmp;
  if (strlen(use) >= n) return 0;
  snprintf(out, n, "%s", use);
  return 1;
}

/* A readable regular file at the resolved path, or an error naming it. */
static int check_readable(pctx *c, const keydef *k, const char *raw, const char *abs) {
  struct stat st;
  if (stat(abs, &st) != 0 || access(abs, R_OK) != 0) {
    PERR(c, c->lineno, FSDP_ERR_NOTFOUND, "[%s] %s = %s: cannot read %s: %s", k->sec, k->key, raw, abs,
         strerror(errno));
    return 0;
  }
  if (!S_ISREG(st.st_mode)) {
    PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = %s: %s is not a regular file", k->sec, k->key, raw, abs);
    return 0;
  }
  return 1;
}

static void set_special(pctx *c, const keydef *k, const char *v) {
  jobspec_t *s = c->s;
  char *field = (char *)s + k->off;
  switch (k->type) {
  case KT_NAME: {
    size_t n = strlen(v);
    int ok = n >= 1 && n < sizeof s->name;
    for (size_t i = 0; ok && i < n; i++)
      ok = isalnum((unsigned char)v[i]) || v[i] == '.' || v[i] == '_' || v[i] == '-';
    if (!ok)
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[job] name = '%s' is not allowed; allowed: %s", v, k->help);
    else
      snprintf(s->name, sizeof s->name, "%s", v);
    break;
  }
  case KT_INIT: {
    if (!strcmp(v, "random")) {
      snprintf(s->init, sizeof s->init, "random");
      break;
    }
    size_t n = strlen(v), sfx = strlen(".safetensors");
    if (n <= sfx || strcmp(v + n - sfx, ".safetensors")) {
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[model] init = '%s' is not allowed; allowed: random | PATH.safetensors", v);
      break;
    }
    if (!resolve_path(c, v, s->init, sizeof s->init)) {
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[model] init: the path is longer than %d characters", JOBSPEC_PATH_MAX - 1);
      break;
    }
    check_readable(c, k, v, s->init);
    break;
  }
  case KT_TRAIN:
  case KT_VAL: {
    /* train and val take the same values: a token file or the synthetic chain */
    int is_val = k->type == KT_VAL;
    char *path = is_val ? s->val : s->train;
    int *synthetic = is_val ? &s->val_synthetic : &s->synthetic;
    uint64_t *mseed = is_val ? &s->val_markov_seed : &s->markov_seed;
    if (!strncmp(v, "synthetic:", 10)) {
      uint64_t seed;
      if (strncmp(v, "synthetic:markov:", 17) || !parse_u64(v + 17, &seed)) {
        PERR(c, c->lineno, FSDP_ERR_INVALID,
             "[data] %s = '%s' is not allowed; allowed: PATH (an llm.c token file) | synthetic:markov:SEED "
             "(SEED an integer in 0..%llu)", k->key, v, (unsigned long long)UINT64_MAX);
        break;
      }
      *synthetic = 1;
      *mseed = seed;
      path[0] = '\0';
      break;
    }
    if (!*v) {
      PERR(c, c->lineno, FSDP_ERR_INVALID,
           "[data] %s is empty; allowed: PATH (an llm.c token file) | synthetic:markov:SEED%s", k->key,
           is_val ? " (leave the key out for no validation)" : "");
      break;
    }
    *synthetic = 0;
    if (!resolve_path(c, v, path, JOBSPEC_PATH_MAX)) {
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[data] %s: the path is longer than %d characters", k->key,
           JOBSPEC_PATH_MAX - 1);
      break;
    }
    check_readable(c, k, v, path);
    break;
  }
  case KT_TEXT:
    if (strlen(v) >= JOBSPEC_TEXT_MAX)
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[%s] %s is %zu characters; allowed: at most %d", k->sec, k->key,
           strlen(v), JOBSPEC_TEXT_MAX - 1);
    else
      snprintf(field, JOBSPEC_TEXT_MAX, "%s", v);
    break;
  case KT_DIR:
    if (!*v) {
      field[0] = '\0';
    } else if (!resolve_path(c, v, field, JOBSPEC_PATH_MAX)) {
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[checkpoint] dir: the path is longer than %d characters", JOBSPEC_PATH_MAX - 1);
    }
    break;
  default:
    break;
  }
}

static void set_value(pctx *c, const keydef *k, const char *v) {
  char allowed[160];
  char *field = (char *)c->s + k->off;
  switch (k->type) {
  case KT_INT: {
    long long x;
    if (!parse_i64(v, &x)) {
      fmt_range(k, allowed, sizeof allowed);
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = '%s' is not an integer; allowed: %s", k->sec, k->key, v, allowed);
    } else if ((double)x < k->lo || (double)x > k->hi) {
      fmt_range(k, allowed, sizeof allowed);
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[%s] %s = %lld is out of range; allowed: %s", k->sec, k->key, x, allowed);
    } else {
      *(int *)field = (int)x;
    }
    break;
  }
  case KT_U64: {
    uint64_t x;
    if (!parse_u64(v, &x)) {
      fmt_range(k, allowed, sizeof allowed);
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = '%s' is not an integer; allowed: %s", k->sec, k->key, v, allowed);
    } else {
      *(uint64_t *)field = x;
    }
    break;
  }
  case KT_DBL: {
    double x;
    fmt_range(k, allowed, sizeof allowed);
    if (!parse_dbl(v, &x))
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = '%s' is not a number; allowed: %s", k->sec, k->key, v, allowed);
    else if (x < k->lo || (k->lo_open && x == k->lo) || x > k->hi || (k->hi_open && x == k->hi))
      PERR(c, c->lineno, FSDP_ERR_RANGE, "[%s] %s = %s is out of range; allowed: %s", k->sec, k->key, v, allowed);
    else
      *(double *)field = x;
    break;
  }
  case KT_ENUM: {
    for (int i = 0; k->names[i]; i++)
      if (!strcmp(v, k->names[i])) {
        *(int *)field = i;
        return;
      }
    fmt_range(k, allowed, sizeof allowed);
    PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s = '%s' is not allowed; allowed: %s", k->sec, k->key, v, allowed);
    break;
  }
  default:
    set_special(c, k, v);
  }
}

static int on_key(void *user, const char *section, const char *name, const char *value) {
  pctx *c = user;
  if (c->err) return 0;
  char sec[64];
  trim_copy(sec, sizeof sec, section, strlen(section));
  if (!*sec) {
    PERR(c, c->lineno, FSDP_ERR_INVALID, "key '%s' is outside any section; put it under one of "
         SECTIONS_ALLOWED, name);
    return 0;
  }
  if (section_index(sec) < 0) return 0;   /* reported by the reader */
  for (int i = 0; i < NKEYS; i++) {
    if (strcmp(keys[i].sec, sec) || strcmp(keys[i].key, name)) continue;
    if (c->key_line[i]) {
      PERR(c, c->lineno, FSDP_ERR_INVALID, "[%s] %s is set twice (first at line %d); set each key once",
           sec, name, c->key_line[i]);
      return 0;
    }
    c->key_line[i] = c->lineno;
    set_value(c, &keys[i], value);
    return !c->err;
  }
  char allowed[256];
  size_t used = 0;
  allowed[0] = '\0';
  for (int i = 0; i < NKEYS && used < sizeof allowed; i++)
    if (!strcmp(keys[i].sec, sec))
      used += (size_t)snprintf(allowed + used, sizeof allowed - used, "%s%s", used ? ", " : "", keys[i].key);
  PERR(c, c->lineno, FSDP_ERR_INVALID, "unknown key '%s' in [%s]; allowed: %s", name, sec, allowed);
  return 0;
}

static int key_index(const char *sec, const char *key) {
  for (int i = 0; i < NKEYS; i++)
    if (!strcmp(keys[i].sec, sec) && !strcmp(keys[i].key, key)) return i;
  return -1;
}

/* The line to blame for a cross-field problem: the first of the keys that was set, else the
 * section header, else 0. */
static int blame(const pctx *c, const char *sec, const char *k1, const char *k2) {
  int i1 = key_index(sec, k1), i2 = k2 ? key_index(sec, k2) : -1;
  if (i1 >= 0 && c->key_line[i1]) return c->key_line[i1];
  if (i2 >= 0 && c->key_line[i2]) return c->key_line[i2];
  int si = section_index(sec);
  return si >= 0 ? c->sec_line[si] : 0;
}

/* Keys that only Llama reads: an error under arch = gpt2, commented out in the defaults. */
static int llama_only(const keydef *k) {
  return !strcmp(k->sec, "model") && (!strcmp(k->key, "n_kv_head") || !strcmp(k->key, "ffn_dim") ||
                                      !strcmp(k->key, "norm_eps") || !strcmp(k->key, "rope_theta"));
}

/* The architecture's own rules; n_kv_head = 0 becomes n_head. */
static void model_checks(pctx *c) {
  model_config *m = &c->s->model;
  if (m->arch == ARCH_GPT2) {
    for (int i = 0; i < NKEYS; i++)
      if (c->key_line[i] && llama_only(&keys[i]))
        PERR(c, c->key_line[i], FSDP_ERR_INVALID,
             "[model] %s applies to arch = llama only; GPT-2 has n_kv_head = n_head, an MLP of 4 x n_embd, LayerNorm "
             "eps 1e-5 and learned positions; remove the key or set arch = llama", keys[i].key);
    m->n_kv_head = m->n_head;
    return;
  }
  if (!c->key_line[key_index("model", "n_kv_head")] || !m->n_kv_head) m->n_kv_head = m->n_head;
  if (m->n_head % m->n_kv_head)
    PERR(c, blame(c, "model", "n_kv_head", "n_head"), FSDP_ERR_INVALID,
         "[model] n_kv_head = %d does not divide n_head = %d; allowed: a divisor of n_head (n_head itself is plain "
         "multi-head attention)", m->n_kv_head, m->n_head);
  else if (m->n_embd % m->n_head == 0 && (m->n_embd / m->n_head) % 2)
    PERR(c, blame(c, "model", "n_embd", "n_head"), FSDP_ERR_INVALID,
         "[model] head size n_embd / n_head = %d is odd; rotary embeddings rotate pairs of channels, so allowed: an "
         "even head size", m->n_embd / m->n_head);
  if (m->ffn_dim <= 0)
    PERR(c, blame(c, "model", "ffn_dim", "arch"), FSDP_ERR_INVALID,
         "[model] arch = llama needs ffn_dim, the SwiGLU width; allowed: an integer in 1..1048576 (Llama-3.2-1B: 8192)");
}

static void cross_checks(pctx *c) {
  const jobspec_t *s = c->s;
  if (s->model.n_embd % s->model.n_head)
    PERR(c, blame(c, "model", "n_embd", "n_head"), FSDP_ERR_INVALID,
         "[model] n_embd = %d is not divisible by n_head = %d; allowed: n_embd a multiple of n_head",
         s->model.n_embd, s->model.n_head);
  model_checks(c);
  if (s->min_lr > s->lr)
    PERR(c, blame(c, "optim", "min_lr", "lr"), FSDP_ERR_RANGE,
         "[optim] min_lr = %g is above lr = %g; allowed: 0 <= min_lr <= lr", s->min_lr, s->lr);
  if (s->device == DEVICE_CPU && s->offload != OFFLOAD_NONE)
    PERR(c, blame(c, "fsdp", "offload", "device"), FSDP_ERR_UNSUPPORTED,
         "[fsdp] offload = %s moves optimizer state off the GPU, so it needs device = cuda; allowed with device = cpu: "
         "offload = none (the state is in host memory already)", jobspec_offload_mode_name(s->offload));
  if (s->device == DEVICE_CPU && s->comm == COMM_NCCL)
    PERR(c, blame(c, "fsdp", "comm", "device"), FSDP_ERR_UNSUPPORTED,
         "[fsdp] comm = nccl needs device = cuda; allowed with device = cpu: comm = auto | gloo");
  /* only against a world_size the file sets: `fsdpctl plan --world N` and standalone --world choose another (plan_build checks then) */
  if (s->sharding == SHARD_HYBRID && s->shard_group > 0 && c->key_line[key_index("fsdp", "world_size")] &&
      (s->world_size % s->shard_group || s->world_size == s->shard_group))
    PERR(c, blame(c, "fsdp", "shard_group", "world_size"), FSDP_ERR_INVALID, "%s", jobspec_hybrid_error(s->world_size, s->shard_group));
  if (s->sharding != SHARD_HYBRID && s->shard_group > 0)
    PERR(c, blame(c, "fsdp", "shard_group", "sharding"), FSDP_ERR_INVALID,
         "[fsdp] shard_group = %d applies to sharding = hybrid only; allowed with sharding = %s: shard_group = 0",
         s->shard_group, jobspec_shard_mode_name(s->sharding));
  if (s->ckpt_every > 0 && !s->ckpt_dir[0])
    PERR(c, blame(c, "checkpoint", "every", NULL), FSDP_ERR_INVALID,
         "[checkpoint] every = %d needs a dir; set [checkpoint] dir = PATH, or every = 0 for none", s->ckpt_every);
  if (s->eval_every > 0 && !jobspec_has_val(s))
    PERR(c, blame(c, "eval", "every", NULL), FSDP_ERR_INVALID,
         "[eval] every = %d needs validation tokens; set [data] val = PATH | synthetic:markov:SEED, or every = 0 "
         "for none", s->eval_every);
  if (s->sample_every > 0 && !s->sample_prompt[0])
    PERR(c, blame(c, "eval", "sample_every", NULL), FSDP_ERR_INVALID,
         "[eval] sample_every = %d needs a prompt; set [eval] sample_prompt = TEXT, or sample_every = 0 for none",
         s->sample_every);
  for (const unsigned char *q = (const unsigned char *)s->sample_prompt; *q; q++)
    if (*q >= s->model.vocab_size) {
      PERR(c, blame(c, "eval", "sample_prompt", NULL), FSDP_ERR_RANGE,
           "[eval] sample_prompt: byte %u at offset %d is outside the vocabulary (vocab_size = %d); allowed: "
           "text whose bytes are all < vocab_size (one token per byte)",
           *q, (int)(q - (const unsigned char *)s->sample_prompt), s->model.vocab_size);
      break;
    }
  if (s->max_restarts > 0 && (s->ckpt_every <= 0 || s->resume != RESUME_AUTO))   /* else a restart trains from step 0 */
    PERR(c, blame(c, "job", "max_restarts", NULL), FSDP_ERR_INVALID,
         "[job] max_restarts = %d restarts from the newest checkpoint, so it needs [checkpoint] every > 0 (with a "
         "dir) and resume = auto; set them, or max_restarts = 0", s->max_restarts);
  if (!c->key_line[key_index("data", "train")]) {
    int line = c->sec_line[section_index("data")];
    PERR(c, line ? line : c->nlines, FSDP_ERR_INVALID,
         "[data] train is required (no default); allowed: PATH (an llm.c token file) | synthetic:markov:SEED");
  }
}

static void default_name(jobspec_t *s, const char *origin) {
  const char *b = strrchr(origin, '/');
  b = b ? b + 1 : origin;
  if (!*b || *b == '<') return;   /* "<string>": keep "job" */
  size_t n = strcspn(b, ".");
  if (!n) return;
  if (n >= sizeof s->name) n = sizeof s->name - 1;
  for (size_t i = 0; i < n; i++)
    s->name[i] = isalnum((unsigned char)b[i]) || b[i] == '_' || b[i] == '-' ? b[i] : '-';
  s->name[n] = '\0';
}

fsdp_status jobspec_parse(const char *text, const char *origin, const char *base_dir, jobspec_t *out) {
  if (!origin) origin = "<string>";
  if (!text || !out) return fsdp_set_error(FSDP_ERR_INVALID, "jobspec_parse: NULL text or output");
  char cwd[PATH_MAX];
  if (!base_dir || base_dir[0] != '/') {
    if (!getcwd(cwd, sizeof cwd)) return fsdp_set_error(FSDP_ERR_IO, "getcwd: %s", strerror(errno));
    if (base_dir && *base_dir) {
      size_t n = strlen(cwd);
      if (n + 1 + strlen(base_dir) >= sizeof cwd)
        return fsdp_set_error(FSDP_ERR_RANGE, "base directory %s is too long", base_dir);
      snprintf(cwd + n, sizeof cwd - n, "/%s", base_dir);
    }
    base_dir = cwd;
  }
  jobspec_t s;
  jobspec_defaults(&s);
  snprintf(s.path, sizeof s.path, "%s", origin);
  default_name(&s, origin);
  pctx c = {.s = &s, .origin = origin, .base_dir = base_dir, .p = text};
  for (const char *q = text; *q; q++) c.nlines += *q == '\n';
  if (text[0] && text[strlen(text) - 1] != '\n') c.nlines++;
  int rc = ini_parse_stream(line_reader, &c, on_key, &c);
  if (rc < 0) return fsdp_set_error_at(FSDP_ERR_NOMEM, origin, 0, "the INI parser ran out of memory");
  if (rc > 0 && (!c.err || rc < c.err_line)) {
    c.err = 0;
    PERR(&c, rc, FSDP_ERR_FORMAT, "syntax error; allowed lines: [section], key = value, # comment or ; comment");
  }
  if (!c.err) cross_checks(&c);
  if (c.err) return c.err;
  *out = s;
  return FSDP_OK;
}

fsdp_status jobspec_load(const char *path, jobspec_t *out) {
  if (!path || !out) return fsdp_set_error(FSDP_ERR_INVALID, "jobspec_load: NULL path or output");
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    return fsdp_set_error_at(e == ENOENT ? FSDP_ERR_NOTFOUND : FSDP_ERR_IO, path, 0,
                             "cannot open the job file: %s", strerror(e));
  }
  char *text = malloc(JOBSPEC_MAX_FILE + 1);
  if (!text) {
    fclose(f);
    return fsdp_set_error(FSDP_ERR_NOMEM, "no memory for the job file");
  }
  size_t n = fread(text, 1, JOBSPEC_MAX_FILE + 1, f);
  int rerr = ferror(f);
  fclose(f);
  fsdp_status rc;
  if (rerr) {
    rc = fsdp_set_error_at(FSDP_ERR_IO, path, 0, "cannot read the job file (is it a directory?)");
    goto out;
  }
  if (n > JOBSPEC_MAX_FILE) {
    rc = fsdp_set_error_at(FSDP_ERR_RANGE, path, 0, "the job file is larger than %d bytes", JOBSPEC_MAX_FILE);
    goto out;
  }
  text[n] = '\0';
  if (strlen(text) != n) {
    rc = fsdp_set_error_at(FSDP_ERR_FORMAT, path, 0, "the job file contains a NUL byte; allowed: INI text");
    goto out;
  }
  char real[PATH_MAX], dir[PATH_MAX];
  if (!realpath(path, real)) {
    rc = fsdp_set_error_at(FSDP_ERR_IO, path, 0, "cannot resolve the job file's path: %s", strerror(errno));
    goto out;
  }
  snprintf(dir, sizeof dir, "%s", real);
  char *slash = strrchr(dir, '/');
  if (slash == dir) slash[1] = '\0';
  else if (slash) *slash = '\0';
  rc = jobspec_parse(text, path, dir, out);
out:
  free(text);
  return rc;
}

/* ---- the commented defaults ---- */

static void write_value(FILE *f, const keydef *k, const jobspec_t *d) {
  const char *field = (const char *)d + k->off;
  char num[32];
  switch (k->type) {
  case KT_INT: fprintf(f, "%d", *(const int *)field); break;
  case KT_U64: fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)field); break;
  case KT_DBL: fmt_num(num, sizeof num, *(const double *)field); fputs(num, f); break;
  case KT_ENUM: fputs(k->names[*(const int *)field], f); break;
  default: fputs(field, f); break;
  }
}

void jobspec_write_defaults(FILE *f) {
  jobspec_t d;
  jobspec_defaults(&d);
  fprintf(f,
          "# fsdpd job file: every key with its default (GPT-2 small, nanoGPT's training recipe).\n"
          "# Comments start with # or ;. Relative paths are relative to this file's directory.\n"
          "# Keys shown commented out have no default. docs/jobs.md describes each one.\n");
  const char *cur = "";
  for (int i = 0; i < NKEYS; i++) {
    const keydef *k = &keys[i];
    if (strcmp(cur, k->sec)) {
      fprintf(f, "\n[%s]\n", k->sec);
      cur = k->sec;
    }
    char allowed[160];
    fmt_range(k, allowed, sizeof allowed);
    if (k->type >= KT_NAME) fprintf(f, "# %s\n", k->help);
    else fprintf(f, "# %s; allowed: %s\n", k->help, allowed);
    if (k->type == KT_NAME) fprintf(f, "; name = tiny\n");
    else if (k->type == KT_TRAIN) fprintf(f, "; train = synthetic:markov:1\n");
    else if (k->type == KT_VAL) fprintf(f, "; val = synthetic:markov:2\n");
    else if (k->type == KT_TEXT) fprintf(f, "; %s = To be, or not to be\n", k->key);
    else if (k->type == KT_DIR) fprintf(f, "; dir = checkpoints\n");
    else if (llama_only(k)) {   /* the default model is GPT-2, which refuses them */
      fprintf(f, "; %s = ", k->key);
      write_value(f, k, &d);
      fputc('\n', f);
    } else {
      fprintf(f, "%s = ", k->key);
      write_value(f, k, &d);
      fputc('\n', f);
    }
  }
}
