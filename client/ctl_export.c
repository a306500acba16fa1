/* ctl_export — `fsdpctl export`: a checkpoint (any world size, any sharding) to one consolidated
 * Hugging Face .safetensors file (GPT-2 or Llama names), with no daemon and no workers. Every rank file is verified
 * whole (every CRC32C) first; the parameters are then resharded into a single whole-model "shard"
 * through the same loader a resuming worker uses. Holds the model three times in memory (the loader
 * also restores AdamW m and v), which is fine for the CPU-sized models it is meant for. Beside the
 * file it writes config.json, a Hugging Face GPT2Config or LlamaConfig, so that
 * GPT2LMHeadModel.from_pretrained(DIR) or LlamaForCausalLM.from_pretrained(DIR) loads the export
 * directly. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "ctl.h"
#include "jobspec.h"
#include "plan.h"
#include "safetensors.h"

/* DIR/config.json for OUT = DIR/NAME.safetensors (DIR "." when OUT has no slash). */
static int config_path(const char *out, char *buf, size_t n) {
  const char *slash = strrchr(out, '/');
  int w = slash ? snprintf(buf, n, "%.*s/config.json", (int)(slash - out), out)
                : snprintf(buf, n, "config.json");
  return w > 0 && (size_t)w < n;
}

/* A GPT2Config for transformers: the shapes, and the GPT-2 choices fsdpd's model makes (GELU tanh
 * approximation = gelu_new, LayerNorm eps 1e-5, tied head). GPT-2's special token 50256 is named only
 * when the vocabulary holds it; a byte-level model has none. Written through PATH.tmp and renamed. */
/* A LlamaConfig: the shapes and fsdpd's Llama (SiLU, no biases; the head tied or not, the rope
 * scaling llama3 or null, as the job's). bos/eos/pad ids are null: LlamaConfig's defaults (bos 1,
 * eos 2) would make generate() stop at a byte-level model's token 2; fsdpd's models have no special
 * tokens. */
static json_t *llama_config(const model_config *m) {
  json_t *rope = plan_rope_scaling_json(m);
  return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:o, s:s, s:b, s:b, s:b, s:f, "
                   "s:n, s:n, s:n, s:s}",
                   "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size", m->n_embd,
                   "intermediate_size", m->ffn_dim, "num_attention_heads", m->n_head, "num_key_value_heads",
                   m->n_kv_head, "head_dim", m->n_embd / m->n_head, "num_hidden_layers", m->n_layer, "vocab_size",
                   m->vocab_size, "max_position_embeddings", m->seq_len, "rms_norm_eps", m->norm_eps, "rope_theta",
                   m->rope_theta, "rope_scaling", rope, "hidden_act", "silu", "tie_word_embeddings", m->tie_embeddings,
                   "attention_bias", 0,
                   "mlp_bias", 0, "initializer_range", 0.02, "bos_token_id", "eos_token_id", "pad_token_id",
                   "torch_dtype", "float32");
}

static fsdp_status write_hf_config(const char *path, const model_config *m) {
  json_t *special = m->vocab_size > 50256 ? json_integer(50256) : json_null();
  json_t *o = m->arch == ARCH_LLAMA ? llama_config(m) : json_pack("{s:s, s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:b, s:O, s:O, s:s}",
                        "model_type", "gpt2", "architectures", "GPT2LMHeadModel", "n_layer", m->n_layer,
                        "n_head", m->n_head, "n_embd", m->n_embd, "vocab_size", m->vocab_size,
                        "n_positions", m->seq_len, "n_ctx", m->seq_len, "activation_function", "gelu_new",
                        "layer_norm_epsilon", 1e-5, "tie_word_embeddings", 1, "bos_token_id", special,
                        "eos_token_id", special, "torch_dtype", "float32");
  json_decref(special);
  char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) : NULL;
  json_decref(o);
  if (!text) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory building %s", path);
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
    free(text);
    return fsdp_set_error(FSDP_ERR_RANGE, "path %s is too long", path);
  }
  FILE *fp = fopen(tmp, "w");
  if (!fp) {
    fsdp_status rc = fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    free(text);
    return rc;
  }
  int ok = fputs(text, fp) >= 0 && fputc('\n', fp) != EOF && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
  int err = errno;
  if (fclose(fp) != 0 && ok) ok = 0, err = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, err = errno;
  free(text);
  if (!ok) {
    unlink(tmp);
    return fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", path, strerror(err));
  }
  return FSDP_OK;
}

static void export_usage(FILE *f) {
  fprintf(f,
          "usage: fsdpctl export CHECKPOINT_DIR -o OUT.safetensors [--step S]\n"
          "\n"
          "Write the model of a checkpoint ([checkpoint] dir of a job; the newest complete step unless\n"
          "--step) as one Hugging Face .safetensors file (F32) and beside it config.json. GPT-2: names like\n"
          "h.0.attn.c_attn.weight, tied lm_head = wte, a GPT2Config; Llama: LlamaForCausalLM's names\n"
          "(model.layers.0.self_attn.q_proj.weight, lm_head.weight), a LlamaConfig. Named\n"
          "DIR/model.safetensors, from_pretrained(DIR) loads it; `init = OUT.safetensors` in a job file\n"
          "loads it back.\n");
}

/* When DIR is a checkpoint's step directory (DIR/manifest.json and a name step-N), point DIR at its
 * parent (in ROOT) and *STEP at N; a different --step is an error. Else leave both alone. */
static int step_dir_split(const char *dir, char *root, size_t n, int *step) {
  char manifest[PATH_MAX + 32], tmp[PATH_MAX];
  snprintf(manifest, sizeof manifest, "%s/%s", dir, CKPT_MANIFEST);
  snprintf(tmp, sizeof tmp, "%s", dir);
  size_t len = strlen(tmp);
  while (len > 1 && tmp[len - 1] == '/') tmp[--len] = '\0';
  const char *base = strrchr(tmp, '/');
  base = base ? base + 1 : tmp;
  int s = 0, used = 0;
  if (access(manifest, F_OK) != 0 || sscanf(base, "step-%d%n", &s, &used) != 1 || base[used] || s < 1) {
    snprintf(root, n, "%s", dir);
    return 0;
  }
  if (*step && *step != s) {
    fprintf(stderr, "fsdpctl export: %s is the checkpoint of step %d, but --step says %d\n", dir, s, *step);
    return 1;
  }
  *step = s;
  if (base == tmp) snprintf(root, n, ".");
  else snprintf(root, n, "%.*s", (int)(base - tmp - 1 > 0 ? base - tmp - 1 : 1), tmp);
  return 0;
}

int ctl_export(int argc, char **argv) {
  static const struct option opts[] = {
    {"output", required_argument, NULL, 'o'}, {"step", required_argument, NULL, 's'},
    {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
  const char *out = NULL;
  long step = 0;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "o:s:h", opts, NULL)) != -1) {
    if (c == 'o') out = optarg;
    else if (c == 's') {
      char *end;
      errno = 0;
      step = strtol(optarg, &end, 10);
      if (errno || *end || step < 1) {
        fprintf(stderr, "fsdpctl export: --step '%s' must be a positive step number\n", optarg);
        return 2;
      }
    } else if (c == 'h') {
      export_usage(stdout);
      return 0;
    } else {
      export_usage(stderr);
      return 2;
    }
  }
  if (optind != argc - 1 || !out) {
    fprintf(stderr, "fsdpctl export: needs a checkpoint directory and -o OUT.safetensors\n");
    export_usage(stderr);
    return 2;
  }
  int s = (int)step;
  /* A step-* directory itself (what `ls CKPT_DIR` shows) names the checkpoint root and the step. */
  char root[PATH_MAX];
  const char *dir = argv[optind];
  if (step_dir_split(dir, root, sizeof root, &s) != 0) return 1;
  plan_t *p = NULL;
  float *param = NULL, *m = NULL, *v = NULL, **units = NULL;
  fsdp_status rc = FSDP_OK;
  dir = root;
  if (!s) TRY_GOTO(ckpt_latest(dir, &s), rc, fail);
  ckpt_info ci;
  TRY_GOTO(ckpt_read_manifest(dir, s, &ci), rc, fail);
  TRY_GOTO(ckpt_verify(dir, &ci, 0, 1), rc, fail);

  /* One rank holding everything: sharding none, world 1. */
  jobspec_t spec;
  jobspec_defaults(&spec);
  spec.model = ci.model;
  spec.world_size = 1;
  spec.sharding = SHARD_NONE;
  spec.batch_size = ci.batch_size;
  spec.grad_accum = ci.grad_accum;
  TRY_GOTO(plan_build(&spec, 1, &p), rc, fail);
  size_t n = (size_t)p->shard_total;
  param = malloc(n * sizeof *param), m = malloc(n * sizeof *m), v = malloc(n * sizeof *v);
  units = calloc((size_t)p->nunits, sizeof *units);
  if (!param || !m || !v || !units) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu MiB for the model", 3 * n * sizeof(float) >> 20);
    goto fail;
  }
  TRY_GOTO(ckpt_load_shard(dir, &ci, &spec, p, 0, param, m, v, NULL), rc, fail);
  for (int u = 0; u < p->nunits; u++) units[u] = param + p->units[u].shard_base;
  char cfg[4096];
  if (!config_path(out, cfg, sizeof cfg)) {
    rc = fsdp_set_error(FSDP_ERR_RANGE, "output path %s is too long", out);
    goto fail;
  }
  TRY_GOTO(st_save_units(out, p, units), rc, fail);
  TRY_GOTO(write_hf_config(cfg, &ci.model), rc, fail);
  printf("wrote %s and %s: step %d of a %d-rank %s checkpoint, %lld parameters\n", out, cfg, ci.step,
         ci.world, jobspec_shard_mode_name(ci.sharding), (long long)p->n_params);
fail:
  if (rc != FSDP_OK) fprintf(stderr, "fsdpctl export: %s\n", fsdp_user_message(fsdp_last_error()));
  free(units);
  free(param);
  free(m);
  free(v);
  plan_destroy(&p);
  return rc == FSDP_OK ? 0 : 1;
}
