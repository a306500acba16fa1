/* jobspec_rules — the rules between a job file's keys; see jobspec_rules.h. Each rule blames the line
 * of the first key it names that the file sets, else its section's header. */
#include "jobspec_rules.h"

#include "arch.h"
#include "hfconfig.h"
#include "st_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The line to blame for a cross-field problem: the first of the keys that was set, else the
 * section header, else 0. */
static int blame(const jobspec_ctx *c, const char *sec, const char *k1, const char *k2) {
  int i1 = jobspec_key_index(sec, k1), i2 = k2 ? jobspec_key_index(sec, k2) : -1;
  if (i1 >= 0 && c->key_line[i1]) return c->key_line[i1];
  if (i2 >= 0 && c->key_line[i2]) return c->key_line[i2];
  int si = jobspec_section_index(sec);
  return si >= 0 ? c->sec_line[si] : 0;
}

/* A [model] value as the file would write it. */
static void model_value(const keydef *k, const jobspec_t *s, char *buf, size_t n) {
  const char *field = (const char *)s + k->off;
  if (k->type == KT_DBL) jobspec_fmt_num(buf, n, *(const double *)field);
  else if (k->type == KT_ENUM) snprintf(buf, n, "%s", k->names[*(const int *)field]);
  else snprintf(buf, n, "%d", *(const int *)field);
}

static int model_value_eq(const keydef *k, const jobspec_t *a, const jobspec_t *b) {
  if (k->type == KT_DBL) {
    double x = *(const double *)((const char *)a + k->off), y = *(const double *)((const char *)b + k->off);
    return fabs(x - y) <= 1e-9 * fabs(y);
  }
  return *(const int *)((const char *)a + k->off) == *(const int *)((const char *)b + k->off);
}

/* [model] from = DIR: config.json sets the model; a key the file also sets must agree with it; init
 * becomes the folder's weights. seq_len stays the job's (default: the model's positions, at most 1024). */
static void apply_from(jobspec_ctx *c) {
  jobspec_t *s = c->s;
  if (!s->from[0]) return;
  int line = c->key_line[jobspec_key_index("model", "from")];
  if (c->key_line[jobspec_key_index("model", "init")]) {
    PERR(c, line, FSDP_ERR_INVALID, "[model] from and init both name the weights; allowed: one of them (from = DIR "
         "reads DIR's config.json and weights)");
    return;
  }
  char cfg[JOBSPEC_PATH_MAX + 16], msg[600];
  snprintf(cfg, sizeof cfg, "%s/config.json", s->from);
  jobspec_t h = *s;
  hf_config hc;
  fsdp_status rc = hf_config_load(cfg, &hc);
  int untie = 0;
  if (rc == FSDP_OK) rc = hf_weights_path(s->from, s->init, sizeof s->init);
  if (rc == FSDP_OK) rc = st_model_untie(s->init, &hc.model, &untie);
  if (rc != FSDP_OK) {
    snprintf(msg, sizeof msg, "%s", fsdp_last_error());
    PERR(c, line, rc, "[model] from: %s", msg);
    return;
  }
  if (hc.dropout_key[0] && !s->no_dropout) {
    PERR(c, line, FSDP_ERR_UNSUPPORTED, "[model] from: %s has %s = %g%s, a dropout, which fsdpd does not apply; allowed: "
         "0 there, or [model] dropout = none to train without it", cfg, hc.dropout_key, hc.dropout,
         hc.dropout_default ? " (the config class's default: the key is absent)" : "");
    return;
  }
  if (hc.dropout_key[0]) snprintf(s->dropout_off, sizeof s->dropout_off, "%s = %g", hc.dropout_key, hc.dropout);
  h.model = hc.model;
  for (int i = 0; i < jobspec_nkeys; i++) {
    const keydef *k = &jobspec_keys[i];
    const char *ck = c->key_line[i] && !strcmp(k->sec, "model") ? hf_config_key(h.model.arch, k->key) : NULL;
    if (!ck || model_value_eq(k, s, &h) || (!strcmp(k->key, "n_positions") && !s->model.n_positions)) continue;
    char mine[48], theirs[48];
    model_value(k, s, mine, sizeof mine);
    model_value(k, &h, theirs, sizeof theirs);
    PERR(c, c->key_line[i], FSDP_ERR_INVALID, "[model] %s = %s, but %s has %s = %s; allowed: the value of config.json, "
         "or leave the key out (from sets it)", k->key, mine, cfg, ck, theirs);
    return;
  }
  int T = s->model.seq_len, npos = h.model.n_positions;
  s->model = h.model;
  if (untie) s->model.tie_embeddings = 0;   /* both tensors in the weights, different: transformers' untied model */
  s->model.seq_len = c->key_line[jobspec_key_index("model", "seq_len")] ? T : npos < 1024 ? npos : 1024;
}

/* init = FILE whose folder's config.json is another architecture's: refused, not read as the job's. */
static void check_init_folder(jobspec_ctx *c) {
  const jobspec_t *s = c->s;
  int line = c->key_line[jobspec_key_index("model", "init")];
  if (s->from[0] || !line || !strcmp(s->init, "random") || hf_check_init_folder(s->init, s->model.arch) == FSDP_OK)
    return;
  char msg[600];
  snprintf(msg, sizeof msg, "%s", fsdp_last_error());
  PERR(c, line, FSDP_ERR_INVALID, "[model] init: %s", msg);
}

/* An architecture's own settings (models/arch.h's ext_keys): its defaults, or config.json's under from =
 * DIR; one the file sets must be its architecture's, in range and, under from, what config.json says. */
static void ext_rules(jobspec_ctx *c) {
  model_config *m = &c->s->model;
  const arch_desc *d = arch_get(m->arch);
  int from = c->s->from[0] != 0;
  if (!from) arch_ext_defaults(m);
  for (int i = 0; i < c->next; i++) {
    const char *key = c->ext[i].key, *v = c->ext[i].value;
    int j = arch_ext_index(d, key), line = c->ext[i].line;
    if (j < 0) {
      const char *owner = arch_key_owner(d, key)->name;
      PERR(c, line, FSDP_ERR_INVALID, "[model] %s applies to arch = %s only; %s; remove the key or set arch = %s", key,
           owner, d->why_not, owner);
      return;
    }
    const arch_ext_key *k = &d->ext_keys[j];
    char allowed[160], theirs[32];
    double x;
    if (!arch_ext_parse(k, v, &x)) {
      arch_ext_allowed(k, allowed, sizeof allowed);
      PERR(c, line, FSDP_ERR_INVALID, "[model] %s = '%s' is not allowed; allowed: %s", key, v, allowed);
      return;
    }
    if (from && x != m->ext[j]) {
      const char *hk = arch_hf_key_of(d, key);
      arch_ext_format(k, m->ext[j], theirs, sizeof theirs);
      PERR(c, line, FSDP_ERR_INVALID, "[model] %s = %s, but %s/config.json has %s = %s; allowed: the value of "
           "config.json, or leave the key out (from sets it)", key, v, c->s->from, hk ? hk : key, theirs);
      return;
    }
    m->ext[j] = x;
  }
}

/* The rope_scaling kinds of KA_* bits A, "llama3 | linear", into BUF. */
static const char *rope_kinds(unsigned a, char *buf, size_t n) {
  static const rope_scaling_kind kinds[] = {ROPE_SCALING_LLAMA3, ROPE_SCALING_LONGROPE, ROPE_SCALING_LINEAR};
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && used < n; i++)
    if (a & jobspec_rope_bit(kinds[i]))
      used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? " | " : "", jobspec_rope_scaling_name(kinds[i]));
  return buf;
}

/* rope_scaling = llama3, longrope and linear need their numbers, and they mean nothing without them. */
static void rope_checks(jobspec_ctx *c) {
  model_config *m = &c->s->model;
  unsigned bit = jobspec_rope_bit(m->rope_scaling);
  const char *kind = jobspec_rope_scaling_name(m->rope_scaling);
  char missing[200] = "";
  size_t used = 0;
  for (int i = 0; i < jobspec_nkeys; i++) {
    const keydef *k = &jobspec_keys[i];
    if (!(k->applies & KA_ROPE)) continue;
    if (!(k->applies & bit) && c->key_line[i]) {
      char kinds[64];
      PERR(c, c->key_line[i], FSDP_ERR_INVALID, "[model] %s applies to rope_scaling = %s only; remove the key or set "
           "rope_scaling = %s", k->key, rope_kinds(k->applies, kinds, sizeof kinds), kinds);
      return;
    }
    if ((k->applies & bit) && !c->key_line[i] && used < sizeof missing)
      used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%s", used ? ", " : "", k->key);
  }
  if (used)
    PERR(c, blame(c, "model", "rope_scaling", NULL), FSDP_ERR_INVALID,
         "[model] rope_scaling = %s needs %s; missing: %s", kind, m->rope_scaling == ROPE_SCALING_LLAMA3
         ? "rope_factor, rope_low_freq_factor, rope_high_freq_factor and rope_original_max_position_embeddings "
           "(Llama-3.1: 8, 1, 4, 8192)" : m->rope_scaling == ROPE_SCALING_LINEAR
         ? "rope_factor (config.json's factor: positions are divided by it)" : "rope_short_factor, rope_attention_factor and "
           "rope_original_max_position_embeddings (Phi-3's config.json: short_factor, attention_factor, "
           "original_max_position_embeddings)", missing);
  else if (m->rope_scaling == ROPE_SCALING_LLAMA3 && !(m->rope_high_freq_factor > m->rope_low_freq_factor))
    PERR(c, blame(c, "model", "rope_high_freq_factor", "rope_low_freq_factor"), FSDP_ERR_INVALID,
         "[model] rope_high_freq_factor = %g is not above rope_low_freq_factor = %g; allowed: high > low (the band "
         "between them is interpolated)", m->rope_high_freq_factor, m->rope_low_freq_factor);
}

/* The architecture's own rules (its descriptor, models/arch.h); n_kv_head = 0 becomes n_head. */
static void model_checks(jobspec_ctx *c) {
  model_config *m = &c->s->model;
  int from = c->s->from[0] != 0;   /* config.json set the model (apply_from; hfconfig checked its rope) */
  const arch_desc *d = arch_get(m->arch);
  for (int i = 0; i < jobspec_nkeys; i++)
    if (c->key_line[i] && !strcmp(jobspec_keys[i].sec, "model") && !arch_key_applies(d, jobspec_keys[i].key))
      PERR(c, c->key_line[i], FSDP_ERR_INVALID, "[model] %s applies to arch = %s only; %s; remove the key or set arch = %s",
           jobspec_keys[i].key, arch_key_owner(d, jobspec_keys[i].key)->name, d->why_not,
           arch_key_owner(d, jobspec_keys[i].key)->name);
  if (d->always_tied) {
    int tie = jobspec_key_index("model", "tie_word_embeddings");
    if (c->key_line[tie] && !m->tie_embeddings)
      PERR(c, c->key_line[tie], FSDP_ERR_INVALID,
           "[model] tie_word_embeddings = false: %s; allowed with arch = %s: true (or leave the key out)", d->tied_why,
           d->name);
    m->tie_embeddings = 1;
  } else if (!from && !c->key_line[jobspec_key_index("model", "tie_word_embeddings")]) {
    m->tie_embeddings = 0;   /* LlamaConfig's */
  }
  if (d->rotary && !from) rope_checks(c);
  if (!arch_key_applies(d, "n_kv_head") || (!c->key_line[jobspec_key_index("model", "n_kv_head")] && !from) || !m->n_kv_head)
    m->n_kv_head = m->n_head;
  if (m->n_positions && m->seq_len > m->n_positions)
    PERR(c, blame(c, "model", "seq_len", "n_positions"), FSDP_ERR_RANGE,
         "[model] seq_len = %d is beyond the model's %d positions (%s); allowed: seq_len <= %d", m->seq_len,
         m->n_positions, hf_config_key(m->arch, "n_positions"), m->n_positions);
  if (m->rope_scaling == ROPE_SCALING_LONGROPE && m->seq_len > m->rope_original_max_pos)
    PERR(c, blame(c, "model", "seq_len", NULL), FSDP_ERR_UNSUPPORTED,
         "[model] seq_len = %d is above longrope's original_max_position_embeddings = %d: transformers switches to the "
         "long factors there, which fsdpd does not compute; allowed: seq_len <= %d", m->seq_len,
         m->rope_original_max_pos, m->rope_original_max_pos);
  if (arch_key_applies(d, "n_kv_head") && m->n_head % m->n_kv_head)
    PERR(c, blame(c, "model", "n_kv_head", "n_head"), FSDP_ERR_INVALID,
         "[model] n_kv_head = %d does not divide n_head = %d; allowed: a divisor of n_head (n_head itself is plain "
         "multi-head attention)", m->n_kv_head, m->n_head);
  else if (d->rotary && !m->head_dim && m->n_embd % m->n_head == 0 && (m->n_embd / m->n_head) % 2)
    PERR(c, blame(c, "model", "n_embd", "n_head"), FSDP_ERR_INVALID,
         "[model] head size n_embd / n_head = %d is odd; rotary embeddings rotate pairs of channels, so allowed: an "
         "even head size", m->n_embd / m->n_head);
  if (!arch_key_applies(d, "ffn_dim"))
    return;
  if (m->ffn_dim <= 0)
    PERR(c, blame(c, "model", "ffn_dim", "arch"), FSDP_ERR_INVALID,
         "[model] arch = %s needs ffn_dim, the SwiGLU width; allowed: an even integer in 2..1048576 (Llama-3.2-1B: 8192)",
         d->name);
  else if (m->ffn_dim % 2 && from)   /* the activations' layout keeps its fp32 buffers aligned only then (plan.c) */
    PERR(c, c->key_line[jobspec_key_index("model", "from")], FSDP_ERR_UNSUPPORTED,
         "[model] from: %s/config.json has %s = %d, an odd SwiGLU width, which fsdpd does not compute; allowed: an even "
         "%s", c->s->from, hf_config_key(m->arch, "ffn_dim"), m->ffn_dim, hf_config_key(m->arch, "ffn_dim"));
  else if (m->ffn_dim % 2)
    PERR(c, blame(c, "model", "ffn_dim", NULL), FSDP_ERR_INVALID,
         "[model] ffn_dim = %d is odd; allowed: an even SwiGLU width (Llama's are multiples of 256)", m->ffn_dim);
}

/* [lora] base_dtype: refused without adapters; bf16 | fp32 is the dtype the base is held and gathered
 * in, so it sets param_dtype, and nf4 sets bf16 (the root's dtype and the dequantized unit's); a file
 * that sets param_dtype to another dtype is refused. */
static void lora_base_dtype(jobspec_ctx *c) {
  jobspec_t *s = c->s;
  base_dtype_kind b = s->lora.base_dtype;
  if (b == BASE_AUTO) return;
  int line = blame(c, "lora", "base_dtype", NULL);
  if (s->lora.rank == 0) {
    PERR(c, line, FSDP_ERR_INVALID, "[lora] base_dtype = %s applies to a frozen base, so it needs [lora] rank > 0; "
         "allowed without [lora]: base_dtype = auto (every weight trained in param_dtype)", jobspec_base_dtype_name(b));
    return;
  }
  dtype_kind want = b == BASE_FP32 ? DTYPE_FP32 : DTYPE_BF16;   /* nf4: the root and the dequantized unit are bf16 */
  if (c->key_line[jobspec_key_index("fsdp", "param_dtype")] && s->param_dtype != want)
    PERR(c, line, FSDP_ERR_INVALID, "[lora] base_dtype = %s and [fsdp] param_dtype = %s disagree: the frozen base is "
         "gathered in its own dtype; allowed: the same dtype in both, or one of them left out",
         jobspec_base_dtype_name(b), jobspec_dtype_kind_name(s->param_dtype));
  s->param_dtype = want;
}

/* [lora]: what the adapters' path does not do is refused here; the targets against the model in plan_build. */
static void lora_checks(jobspec_ctx *c) {
  const jobspec_t *s = c->s;
  lora_base_dtype(c);
  if (s->lora.rank == 0) return;   /* no LoRA: the other [lora] keys are not read */
  if (s->lora.dropout != 0.0)
    PERR(c, blame(c, "lora", "dropout", NULL), FSDP_ERR_UNSUPPORTED,
         "[lora] dropout = %g is not implemented; allowed: 0 (no dropout on the adapters' input)", s->lora.dropout);
  if (s->sample_every > 0)
    PERR(c, blame(c, "eval", "sample_every", NULL), FSDP_ERR_UNSUPPORTED,
         "[eval] sample_every = %d with [lora]: samples from base + adapters are not built yet; allowed: sample_every = 0",
         s->sample_every);
  if (s->lora.adapters == ADAPTERS_SHARDED && s->sharding == SHARD_NONE)
    PERR(c, blame(c, "lora", "adapters", "sharding"), FSDP_ERR_INVALID,
         "[lora] adapters = sharded with [fsdp] sharding = none: nothing is sharded there; allowed: adapters = auto | "
         "replicated, or sharding = full | hybrid | grad_op");
}

void jobspec_rules_check(jobspec_ctx *c) {
  const jobspec_t *s = c->s;
  apply_from(c);
  check_init_folder(c);
  ext_rules(c);
  if (s->model.n_embd % s->model.n_head)
    PERR(c, blame(c, "model", "n_embd", "n_head"), FSDP_ERR_INVALID,
         "[model] n_embd = %d is not divisible by n_head = %d; allowed: n_embd a multiple of n_head",
         s->model.n_embd, s->model.n_head);
  model_checks(c);
  if (s->min_lr > s->lr && s->schedule == SCHED_COSINE)   /* constant never reads min_lr */
    PERR(c, blame(c, "optim", "min_lr", "lr"), FSDP_ERR_RANGE,
         "[optim] min_lr = %g%s is above lr = %g; allowed: 0 <= min_lr <= lr (the cosine schedule's floor), or "
         "schedule = constant", s->min_lr, c->key_line[jobspec_key_index("optim", "min_lr")] ? "" : " (the default)", s->lr);
  if (s->device == DEVICE_CPU && s->offload != OFFLOAD_NONE)
    PERR(c, blame(c, "fsdp", "offload", "device"), FSDP_ERR_UNSUPPORTED,
         "[fsdp] offload = %s moves optimizer state off the GPU, so it needs device = cuda; allowed with device = cpu: "
         "offload = none (the state is in host memory already)", jobspec_offload_mode_name(s->offload));
  if (s->device == DEVICE_CPU && s->comm == COMM_NCCL)
    PERR(c, blame(c, "fsdp", "comm", "device"), FSDP_ERR_UNSUPPORTED,
         "[fsdp] comm = nccl needs device = cuda; allowed with device = cpu: comm = auto | gloo");
  /* only against a world_size the file sets: `fsdpctl plan --world N` and standalone --world choose another (plan_build checks then) */
  if (s->sharding == SHARD_HYBRID && s->shard_group > 0 && c->key_line[jobspec_key_index("fsdp", "world_size")] &&
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
  if (s->eval_at_start && !jobspec_has_val(s))
    PERR(c, blame(c, "eval", "at_start", NULL), FSDP_ERR_INVALID,
         "[eval] at_start = true needs validation tokens; set [data] val = PATH | synthetic:markov:SEED, or "
         "at_start = false");
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
  if (!s->pack && (s->synthetic || s->val_synthetic))   /* a token file's kind is the job file check's (tokmask.h) */
    PERR(c, blame(c, "data", "pack", NULL), FSDP_ERR_INVALID,
         "[data] pack = false: the synthetic stream is one continuous stream without documents; allowed: pack = true "
         "(the default) with synthetic:markov, or a masked file made by gen-data --chat");
  if (s->max_restarts > 0 && (s->ckpt_every <= 0 || s->resume != RESUME_AUTO))   /* else a restart trains from step 0 */
    PERR(c, blame(c, "job", "max_restarts", NULL), FSDP_ERR_INVALID,
         "[job] max_restarts = %d restarts from the newest checkpoint, so it needs [checkpoint] every > 0 (with a "
         "dir) and resume = auto; set them, or max_restarts = 0", s->max_restarts);
  lora_checks(c);
  if (!c->key_line[jobspec_key_index("data", "train")]) {
    int line = c->sec_line[jobspec_section_index("data")];
    PERR(c, line ? line : c->nlines, FSDP_ERR_INVALID,
         "[data] train is required (no default); allowed: PATH (an llm.c token file) | synthetic:markov:SEED");
  }
}

int jobspec_lr_warning(const jobspec_t *s, char *buf, size_t n) {
  if (s->warmup_steps < s->steps || s->lr <= 0) return 0;
  double last = s->lr * (double)s->steps / (double)(s->warmup_steps + 1);
  snprintf(buf, n, "warning: warmup_steps = %d >= steps = %d: the learning rate rises for the whole job and "
           "ends at %.3g, never reaching lr = %.3g; set warmup_steps to a few %% of steps (docs/data.md, "
           "fine-tuning)", s->warmup_steps, s->steps, last, s->lr);
  return 1;
}
