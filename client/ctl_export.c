/* ctl_export — `fsdpctl export`: a checkpoint (any world size, any sharding) to a Hugging Face model
 * folder (hfdir.h: config.json, weights in one or many safetensors files, the source folder's tokenizer)
 * or to one consolidated .safetensors file with config.json beside it, with no daemon and no workers.
 * Every rank file is verified whole (every CRC32C) first; the parameters are then resharded into a
 * single whole-model "shard" through the same loader a resuming worker uses. Holds the model three
 * times in memory (the loader also restores AdamW m and v), which is fine for the CPU-sized models it
 * is meant for. The output is an fsutil_out (one descriptor of its directory, everything removed on
 * failure); run as root, the checkpoint, the source folder and --tokenizer must be root's alone
 * (docs/cli.md, "Run as root"). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "ctl.h"
#include "fsutil.h"
#include "ctl_fmt.h"
#include "hfconfig.h"
#include "hfdir.h"
#include "ctl_export_tok.h"
#include "jobspec.h"
#include "peft.h"
#include "plan.h"
#include "safetensors.h"

/* NAME.safetensors and config.json beside it (fsdpd's own GPT2Config or LlamaConfig) in the directory
 * OUT holds. */
static fsdp_status export_file(fsutil_out *out, const char *name, const plan_t *p, float *const *units) {
  TRY(st_save_units_at(out->dirfd, out->shown, name, p, units));
  TRY(fsutil_out_claim(out, name));
  json_t *o = hf_config_json(&p->model, NULL, "float32");
  char *text = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) : NULL;
  json_decref(o);
  if (!text) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory building %s/config.json", out->shown);
  fsdp_status rc = fsutil_out_write(out, "config.json", text, strlen(text), 0644);
  free(text);
  return rc;
}

/* The model's source folder ([model] from, in the manifest): kept when its config.json can be read,
 * dropped with a warning when it is gone; any other refusal (another user's link, another user's tree
 * run as root) fails the export. */
static fsdp_status source_folder(const char *source, const char **out) {
  char cfg[PATH_MAX + 16];
  int fd;
  *out = NULL;
  if (!*source) return FSDP_OK;
  snprintf(cfg, sizeof cfg, "%s/config.json", source);
  fsdp_status rc = fsutil_open_read(AT_FDCWD, cfg, &fd);
  if (rc == FSDP_ERR_NOTFOUND) {
    fprintf(stderr, "fsdpctl export: warning: the model came from %s, whose config.json is gone: writing fsdpd's own "
                    "config and no tokenizer files\n", source);
    return FSDP_OK;
  }
  TRY(rc);
  close(fd);
  *out = source;
  return FSDP_OK;
}

static void export_usage(FILE *f) {
  fprintf(f,
          "usage: fsdpctl export CHECKPOINT_DIR -o DIR [--step S] [--dtype fp32|bf16] [--max-shard-size SIZE]\n"
          "                      [--tokenizer FILE|DIR]\n"
          "       fsdpctl export CHECKPOINT_DIR -o OUT.safetensors [--step S] [--tokenizer FILE|DIR]\n"
          "       fsdpctl export LORA_CHECKPOINT_DIR -o DIR [--step S] [--merge [--dtype fp32|bf16]\n"
          "                      [--max-shard-size SIZE] [--tokenizer FILE|DIR]]\n"
          "\n"
          "Write the model of a checkpoint ([checkpoint] dir of a job; the newest complete step unless\n"
          "--step) as a Hugging Face model folder: DIR (created; an existing one must be empty) gets\n"
          "config.json, the weights (model.safetensors, or model-0000K-of-0000N.safetensors and\n"
          "model.safetensors.index.json above --max-shard-size), and, for a model that came from a folder\n"
          "([model] from), that folder's config fields and tokenizer files, so that\n"
          "AutoModelForCausalLM.from_pretrained(DIR) and AutoTokenizer.from_pretrained(DIR) load it.\n"
          "\n"
          "  --dtype fp32|bf16      the weights' dtype (default: the source folder's, else fp32)\n"
          "  --max-shard-size SIZE  bytes per weights file, as transformers' max_shard_size (default 50GB;\n"
          "                         KB MB GB are powers of 1000, KiB MiB GiB of 1024)\n"
          "  --tokenizer FILE|DIR   copy a tokenizer.json (or a model folder's, with its tokenizer_config.json\n"
          "                         and special_tokens_map.json) into the export, for AutoTokenizer and sample\n"
          "\n"
          "With -o OUT.safetensors: one F32 file with config.json (fsdpd's own) beside it. GPT-2: names like\n"
          "h.0.attn.c_attn.weight, tied lm_head = wte, a GPT2Config; Llama: LlamaForCausalLM's names\n"
          "(model.layers.0.self_attn.q_proj.weight, lm_head.weight unless tied), a LlamaConfig.\n"
          "\n"
          "A LoRA job's checkpoint exports as a PEFT adapter folder (adapter_config.json and\n"
          "adapter_model.safetensors, which PeftModel.from_pretrained(base, DIR) loads); with --merge as\n"
          "the model folder of its base with the adapters merged (the base's files, whose content hash the\n"
          "checkpoint holds, read again; the base's dtype unless --dtype).\n");
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

typedef struct export_args {
  const char *out, *dtype, *tokenizer;
  long step;
  uint64_t max_shard;
  int folder_flags;   /* --dtype or --max-shard-size given */
  int merge;          /* --merge: a LoRA checkpoint's adapters merged into its base */
} export_args;

/* Returns -1 to go on, else the exit status (usage printed). */
static int export_parse(int argc, char **argv, export_args *a) {
  static const struct option opts[] = {
    {"output", required_argument, NULL, 'o'}, {"step", required_argument, NULL, 's'},
    {"dtype", required_argument, NULL, 'd'}, {"max-shard-size", required_argument, NULL, 'm'},
    {"tokenizer", required_argument, NULL, 'z'}, {"merge", no_argument, NULL, 'M'}, {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};
  *a = (export_args){.max_shard = HFDIR_MAX_SHARD_DEFAULT};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "o:s:h", opts, NULL)) != -1) {
    a->folder_flags |= c == 'd' || c == 'm';
    if (c == 'o') a->out = optarg;
    else if (c == 'M') a->merge = 1;
    else if (c == 'z') a->tokenizer = optarg;
    else if (c == 'd') {
      a->dtype = optarg;
      if (strcmp(optarg, "fp32") && strcmp(optarg, "bf16")) {
        fprintf(stderr, "fsdpctl export: --dtype '%s' is not allowed; allowed: fp32 | bf16\n", optarg);
        return 2;
      }
    } else if (c == 'm') {
      if (!(a->max_shard = ctl_parse_bytes(optarg))) {
        fprintf(stderr, "fsdpctl export: --max-shard-size '%s' is not allowed; allowed: a positive size such as "
                        "5GB, 500MB or 2GiB\n", optarg);
        return 2;
      }
    } else if (c == 's') {
      char *end;
      errno = 0;
      a->step = strtol(optarg, &end, 10);
      if (errno || *end || a->step < 1) {
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
  if (optind != argc - 1 || !a->out) {
    fprintf(stderr, "fsdpctl export: needs a checkpoint directory and -o DIR (or -o OUT.safetensors)\n");
    export_usage(stderr);
    return 2;
  }
  return -1;
}

/* The model folder O of plan P's whole model UNITS (hfdir.h: the source folder's config and tokenizer
 * when it is there, the dtype of --dtype or the source's), and the line that says what was written:
 * step S of WHAT (the checkpoint, as the user knows it). */
static fsdp_status export_folder(fsutil_out *o, const plan_t *p, float *const *units, const ckpt_info *ci,
                                 const export_args *a, const char *what) {
  char copied[256] = "";
  hfdir_opts ho = {.max_shard = a->max_shard};
  TRY(source_folder(ci->source, &ho.source));
  ho.dtype = a->dtype ? (strcmp(a->dtype, "bf16") ? DTYPE_FP32 : DTYPE_BF16)
                      : ho.source ? hfdir_source_dtype(ho.source) : DTYPE_FP32;
  int nfiles = 0;
  TRY(hfdir_write_to(o, p, units, &ho, &nfiles));
  if (a->tokenizer) TRY(export_tokenizer(a->tokenizer, o, copied, sizeof copied));
  printf("wrote %s: step %d of %s, %lld parameters, %s in %d file%s%s%s%s%s\n", a->out, ci->step, what,
         (long long)p->n_params,
         jobspec_dtype_kind_name(ho.dtype), nfiles, nfiles == 1 ? "" : "s", ho.source ? ", config and tokenizer of " : "",
         ho.source ? ho.source : "", a->tokenizer ? ", tokenizer " : "", copied);
  return FSDP_OK;
}

/* A LoRA checkpoint CI: the PEFT adapter folder, or with --merge the merged model folder. */
static fsdp_status export_lora(const char *dir, const ckpt_info *ci, const export_args *a, int one_file) {
  if (!ci->lora.rank)
    return fsdp_set_error(FSDP_ERR_INVALID, "--merge: the checkpoint in %s (step %d) is a full model's, with no LoRA "
                          "adapters to merge; allowed: --merge of a LoRA job's checkpoint", dir, ci->step);
  if (one_file)
    return fsdp_set_error(FSDP_ERR_INVALID, "-o %s: a LoRA checkpoint exports as a folder (-o DIR: the PEFT adapter, or "
                          "with --merge the merged model)", a->out);
  if (!a->merge && (a->folder_flags || a->tokenizer))
    return fsdp_set_error(FSDP_ERR_INVALID, "--dtype, --max-shard-size and --tokenizer apply to --merge; the PEFT "
                          "adapter folder holds the adapters alone (fp32)");
  plan_t *p = NULL;
  float *whole = NULL, *ad = NULL, **units = NULL;
  fsutil_out o = FSUTIL_OUT_INIT;
  fsdp_status rc = FSDP_OK;
  if (!a->merge) {
    TRY(ckpt_lora_plan(ci, 1, &p));
    size_t na = (size_t)p->lora.numel;
    ad = malloc(3 * na * sizeof *ad);
    rc = ad ? ckpt_lora_load(dir, ci, p, ad, ad + na, ad + 2 * na, NULL)
            : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the adapters");
    /* the base folder the adapters go with (base_model_name_or_path): the model folder it came from, else
     * none (null): a random base, or a weights file alone, is no path from_pretrained loads */
    if (rc == FSDP_OK) rc = peft_save(p, ad, a->out, ci->source);
    char base[JOBSPEC_PATH_MAX + 96];
    if (ci->source[0]) snprintf(base, sizeof base, "base %s", ci->source);
    else if (!strcmp(ci->base.init, "random"))
      snprintf(base, sizeof base, "no base folder (init = random, seed %llu)", (unsigned long long)ci->base.seed);
    else snprintf(base, sizeof base, "no base folder (the weights file %s)", ci->base.init);
    if (rc == FSDP_OK)
      printf("wrote %s: the PEFT adapter of step %d (rank %d, alpha %g on %s), %lld adapter parameters, %s\n", a->out,
             ci->step, ci->lora.rank, ci->lora.alpha, ci->lora.targets, (long long)p->lora.numel, base);
    goto out;
  }
  TRY_GOTO(ckpt_lora_merged(dir, ci, 1, &p, &whole), rc, out);
  units = calloc((size_t)p->nunits, sizeof *units);
  if (!units) TRY_GOTO(fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the unit table"), rc, out);
  for (int u = 0; u < p->nunits; u++) units[u] = whole + p->units[u].shard_base;
  TRY_GOTO(fsutil_out_dir(a->out, &o), rc, out);
  /* not ci->world and ci->sharding: those are the adapters' file's (plan_lora_segment's one rank) */
  char what[JOBSPEC_TEXT_MAX + JOBSPEC_PATH_MAX + 128];
  snprintf(what, sizeof what, "a LoRA job's checkpoint, its adapters (rank %d, alpha %g on %s) merged into the base %s",
           ci->lora.rank, ci->lora.alpha, ci->lora.targets, ci->base.init);
  rc = export_folder(&o, p, units, ci, a, what);
out:
  if (rc == FSDP_OK) fsutil_out_close(&o);
  else fsutil_out_discard(&o);
  free(units);
  free(whole);
  free(ad);
  plan_destroy(&p);
  return rc;
}

int ctl_export(int argc, char **argv) {
  export_args a;
  int prc = export_parse(argc, argv, &a);
  if (prc >= 0) return prc;
  fsutil_reads_own_tree(1);   /* run as root: root's own files only (docs/cli.md, "Run as root") */
  const char *out = a.out;
  int folder_flags = a.folder_flags;
  long step = a.step;
  size_t olen = strlen(out);
  int one_file = olen > 12 && !strcmp(out + olen - 12, ".safetensors");
  if (one_file && folder_flags) {
    fprintf(stderr, "fsdpctl export: --dtype and --max-shard-size apply to a folder (-o DIR); -o %s writes one F32 "
                    "file\n", out);
    return 2;
  }
  int s = (int)step;
  /* A step-* directory itself (what `ls CKPT_DIR` shows) names the checkpoint root and the step. */
  char root[PATH_MAX];
  const char *dir = argv[optind];
  if (step_dir_split(dir, root, sizeof root, &s) != 0) return 1;
  plan_t *p = NULL;
  float *param = NULL, *m = NULL, *v = NULL, **units = NULL;
  fsutil_out o = FSUTIL_OUT_INIT;
  fsdp_status rc = FSDP_OK;
  dir = root;
  if (!s) TRY_GOTO(ckpt_latest(dir, &s), rc, out);
  TRY_GOTO(ckpt_check_own_tree(dir, s), rc, out);   /* run as root: root's own checkpoints only */
  ckpt_info ci;
  TRY_GOTO(ckpt_read_manifest(dir, s, &ci), rc, out);
  TRY_GOTO(ckpt_verify(dir, &ci, 0, 1), rc, out);
  if (ci.lora.rank || a.merge) {   /* its own output, written and closed (or removed) there */
    rc = export_lora(dir, &ci, &a, one_file);
    goto out;
  }

  /* One rank holding everything: sharding none, world 1. */
  jobspec_t spec;
  jobspec_defaults(&spec);
  spec.model = ci.model;
  spec.world_size = 1;
  spec.sharding = SHARD_NONE;
  spec.batch_size = ci.batch_size;
  spec.grad_accum = ci.grad_accum;
  TRY_GOTO(plan_build(&spec, 1, &p), rc, out);
  size_t n = (size_t)p->shard_total;
  param = malloc(n * sizeof *param), m = malloc(n * sizeof *m), v = malloc(n * sizeof *v);
  units = calloc((size_t)p->nunits, sizeof *units);
  if (!param || !m || !v || !units) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu MiB for the model", 3 * n * sizeof(float) >> 20);
    goto out;
  }
  TRY_GOTO(ckpt_load_shard(dir, &ci, &spec, p, 0, param, m, v, NULL), rc, out);
  for (int u = 0; u < p->nunits; u++) units[u] = param + p->units[u].shard_base;
  char copied[256] = "";
  const char *name = NULL;
  /* every file is written at one descriptor of the output folder, and all of them go if any fails */
  if (one_file) TRY_GOTO(fsutil_out_parent(out, &o, &name), rc, out);
  else TRY_GOTO(fsutil_out_dir(out, &o), rc, out);
  if (one_file) {
    /* first: a tokenizer that cannot be used is refused before anything is written */
    if (a.tokenizer) TRY_GOTO(export_tokenizer(a.tokenizer, &o, copied, sizeof copied), rc, out);
    TRY_GOTO(export_file(&o, name, p, units), rc, out);
    printf("wrote %s and its config.json%s%s: step %d of a %d-rank %s checkpoint, %lld parameters\n", out,
           a.tokenizer ? " with " : "", copied, ci.step, ci.world, jobspec_shard_mode_name(ci.sharding),
           (long long)p->n_params);
    goto out;
  }
  char what[64];
  snprintf(what, sizeof what, "a %d-rank %s checkpoint", ci.world, jobspec_shard_mode_name(ci.sharding));
  rc = export_folder(&o, p, units, &ci, &a, what);
out:
  if (rc != FSDP_OK) fprintf(stderr, "fsdpctl export: %s\n", fsdp_last_error());
  if (rc == FSDP_OK) fsutil_out_close(&o);
  else fsutil_out_discard(&o);   /* a failed export leaves nothing of itself */
  free(units);
  free(param);
  free(m);
  free(v);
  plan_destroy(&p);
  return rc == FSDP_OK ? 0 : 1;
}
