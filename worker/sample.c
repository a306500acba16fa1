/* sample — see sample.h. */
#include "sample.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpe.h"
#include "ckpt.h"
#include "device.h"
#include "hfconfig.h"
#include "jobspec.h"
#include "model.h"
#include "peft.h"
#include "plan.h"
#include "rng.h"
#include "st_model.h"

#define TOKENIZER_MAGIC 20240328

/* ---- the model ---- */

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* The model shape from the config.json of the folder DIR (as save_pretrained or fsdpctl export write it,
 * transformers 4 or 5); seq_len, the sampling window, is the model's positions up to 1024 (a published
 * Llama's 131072 would size the CPU's attention buffers beyond any host), and within a longrope's
 * original context. */
static fsdp_status read_hf_config(const char *dir, model_config *m) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
    return fsdp_set_error(FSDP_ERR_RANGE, "path %s is too long", dir);
  hf_config hc;
  TRY(hf_config_load(path, &hc));
  *m = hc.model;
  m->seq_len = m->n_positions < 1024 ? m->n_positions : 1024;
  if (m->rope_scaling == ROPE_SCALING_LONGROPE && m->seq_len > m->rope_original_max_pos)
    m->seq_len = m->rope_original_max_pos;   /* fsdpd computes longrope's short factors only (docs/models.md) */
  return FSDP_OK;
}

/* A checkpoint root (its newest complete step), or one of its step-SSSSSSSS directories: the root
 * and the step. */
static fsdp_status checkpoint_of(const char *model, char *root, size_t cap, int *step) {
  char path[4096];
  size_t n = strlen(model);
  while (n > 1 && model[n - 1] == '/') n--;   /* trailing slashes */
  if (n >= sizeof path) return fsdp_set_error(FSDP_ERR_RANGE, "path %s is too long", model);
  memcpy(path, model, n);
  path[n] = '\0';
  char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  char *end = NULL;
  long s = !strncmp(base, "step-", 5) ? strtol(base + 5, &end, 10) : 0;
  if (end && end != base + 5 && !*end && s > 0 && s < (1L << 30)) {
    *step = (int)s;
    if (!slash) snprintf(root, cap, ".");
    else if (slash == path) snprintf(root, cap, "/");
    else snprintf(root, cap, "%.*s", (int)(slash - path), path);
    return FSDP_OK;
  }
  snprintf(root, cap, "%s", path);
  return ckpt_latest(root, step);
}

/* Load MODEL into a world-1 plan: *P and the whole model in *PARAM (host). */
static fsdp_status load_model(const char *model, jobspec_t *spec, plan_t **p, float **param) {
  jobspec_defaults(spec);
  spec->world_size = 1;
  spec->sharding = SHARD_NONE;
  spec->batch_size = 1;
  struct stat sb;
  char dir[4096], weights[4096], cfg[4096 + 16];
  if (stat(model, &sb) != 0) return fsdp_set_error(FSDP_ERR_NOTFOUND, "%s: %s", model, strerror(errno));
  snprintf(cfg, sizeof cfg, "%s/config.json", model);
  int folder = S_ISDIR(sb.st_mode) && access(cfg, F_OK) == 0;   /* a Hugging Face model folder */
  if (S_ISREG(sb.st_mode) || folder) {
    if (!folder && !ends_with(model, ".safetensors") && !ends_with(model, ".safetensors.index.json"))
      return fsdp_set_error(FSDP_ERR_INVALID, "%s is neither a checkpoint directory nor a .safetensors file (nor a "
                            "model folder with config.json)", model);
    const char *slash = strrchr(model, '/');
    if (folder) snprintf(dir, sizeof dir, "%s", model);
    else if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - model), model);
    else snprintf(dir, sizeof dir, ".");
    if (folder) TRY(hf_weights_path(dir, weights, sizeof weights));
    else snprintf(weights, sizeof weights, "%s", model);
    TRY(read_hf_config(dir, &spec->model));
    TRY(plan_build(spec, 1, p));
    *param = calloc((size_t)(*p)->shard_total, sizeof(float));
    if (!*param) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the model");
    st_model *f = NULL;
    TRY(st_model_open(weights, &f));
    fsdp_status rc = st_model_load_shard(f, *p, 0, *param);
    st_model_destroy(&f);
    return rc;
  }
  if (!S_ISDIR(sb.st_mode))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s is neither a checkpoint directory nor a .safetensors file", model);
  char root[4096];
  int step = 0;
  fsdp_status rc = checkpoint_of(model, root, sizeof root, &step);
  if (rc == FSDP_ERR_NOTFOUND)
    return fsdp_set_error(FSDP_ERR_NOTFOUND, "%s holds no complete checkpoint (neither a checkpoint directory, "
                          "a step-* directory with manifest.json, nor a .safetensors file)", model);
  TRY(rc);
  TRY(ckpt_check_own_tree(root, step));   /* run as root: root's own checkpoints only (docs/cli.md) */
  ckpt_info ci;
  TRY(ckpt_read_manifest(root, step, &ci));
  /* Every rank file whole, every section's CRC32C, as export does: a corrupt checkpoint is refused,
   * never sampled from (the resharding read below checks only the sections it reads whole). */
  TRY(ckpt_verify(root, &ci, 0, 1));
  spec->model = ci.model;
  if (ci.lora.rank) {   /* a LoRA job's: its base, read again (its hash checked), with the adapters merged */
    TRY(ckpt_lora_merged(root, &ci, spec->batch_size, p, param));
    (*p)->lora = (plan_lora){0};   /* the adapters are in the weights now */
    return FSDP_OK;
  }
  TRY(plan_build(spec, 1, p));
  size_t n = (size_t)(*p)->shard_total;
  *param = calloc(n, sizeof(float));
  float *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
  if (!*param || !m || !v) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the model");
  if (rc == FSDP_OK) rc = ckpt_load_shard(root, &ci, spec, *p, 0, *param, m, v, NULL);
  free(m);
  free(v);
  return rc;
}

/* ---- decoding ---- */

/* llm.c's GPT-2 tokenizer file (tok, len: decoding only), or a tokenizer.json (bpe). */
typedef struct tokenizer {
  int n;
  char **tok;
  unsigned char *len;
  bpe_tokenizer *bpe;
} tokenizer;

static void tokenizer_free(tokenizer *t) {
  for (int i = 0; t->tok && i < t->n; i++) free(t->tok[i]);
  free(t->tok);
  free(t->len);
  bpe_destroy(&t->bpe);
  memset(t, 0, sizeof *t);
}

/* The tokenizer that comes with MODEL: tokenizer.json in an export folder, or beside an exported
 * .safetensors file; "" when there is none. */
static void model_tokenizer(const char *model, char *buf, size_t n) {
  struct stat sb;
  const char *slash = strrchr(model, '/');
  if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(buf, n, "%s/tokenizer.json", model);
  else if (slash) snprintf(buf, n, "%.*s/tokenizer.json", (int)(slash - model), model);
  else snprintf(buf, n, "tokenizer.json");
  if (stat(buf, &sb) != 0 || !S_ISREG(sb.st_mode)) buf[0] = 0;
}

/* llm.c's tokenizer file: 256 uint32 (magic 20240328, version, vocab size, ...), then per token a
 * length byte and its bytes. */
static fsdp_status tokenizer_load(const char *path, tokenizer *t) {
  memset(t, 0, sizeof *t);
  uint32_t h[256];
  struct stat sb;
  if (!stat(path, &sb) && S_ISDIR(sb.st_mode)) return bpe_load(path, &t->bpe);   /* a model folder */
  FILE *f = fopen(path, "rb");
  if (!f) return fsdp_set_error(FSDP_ERR_NOTFOUND, "cannot read the tokenizer %s: %s", path, strerror(errno));
  if (fread(h, 4, 1, f) != 1 || h[0] != TOKENIZER_MAGIC) {   /* not llm.c's: a tokenizer.json */
    fclose(f);
    return bpe_load(path, &t->bpe);
  }
  rewind(f);
  fsdp_status rc = FSDP_OK;
  if (fread(h, 4, 256, f) != 256 || h[0] != TOKENIZER_MAGIC || (h[1] != 1 && h[1] != 2) || h[2] < 1 ||
      h[2] > 16777216) {
    fclose(f);
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s is not an llm.c tokenizer file (magic %u, version 1 or 2)", path,
                          TOKENIZER_MAGIC);
  }
  t->n = (int)h[2];
  t->tok = calloc((size_t)t->n, sizeof *t->tok);
  t->len = calloc((size_t)t->n, 1);
  if (!t->tok || !t->len) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the tokenizer");
  for (int i = 0; rc == FSDP_OK && i < t->n; i++) {
    unsigned char l;
    if (fread(&l, 1, 1, f) != 1 || !(t->tok[i] = malloc(l ? l : 1)) || fread(t->tok[i], 1, l, f) != l) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s ends inside token %d of %d", path, i, t->n);
      break;
    }
    t->len[i] = l;
  }
  fclose(f);
  if (rc != FSDP_OK) tokenizer_free(t);
  return rc;
}

/* ---- sampling ---- */

/* The next token from LOGITS (V): greedy at temperature 0, else top-k softmax with draw U in [0,1). */
static int pick(const float *logits, int V, double temperature, int top_k, double u, double *w) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (logits[v] > logits[best]) best = v;
  if (temperature <= 0) return best;
  /* the top_k-th largest logit is the cut (ties at the cut all stay in) */
  double cut = -INFINITY;
  if (top_k > 0 && top_k < V) {
    for (int v = 0; v < V; v++) w[v] = logits[v];
    for (int k = 0; k < top_k; k++) {   /* partial selection: O(k·V), k is small */
      int m = -1;
      for (int v = 0; v < V; v++)
        if (w[v] > -INFINITY && (m < 0 || w[v] > w[m])) m = v;
      cut = w[m];
      w[m] = -INFINITY;
    }
  }
  double z = 0;
  for (int v = 0; v < V; v++) {
    w[v] = logits[v] >= cut ? exp((logits[v] - logits[best]) / temperature) : 0.0;
    z += w[v];
  }
  double acc = 0, target = u * z;
  for (int v = 0; v < V; v++) {
    acc += w[v];
    if (w[v] > 0 && target < acc) return v;
  }
  return best;
}

/* The model on a synchronous CPU device of its own: a forward over a window, the head at one position. */
typedef struct sampler {
  const plan_t *p;
  device_t *dev;
  model_acts *acts;
  void **units;
  int *window;         /* T token ids */
  float *lnf;          /* C: the final hidden state at one position */
  const float *head;   /* [V, C]: wte or lm_head (embed_tokens when tied) */
} sampler;

static void sampler_free(sampler *s) {
  model_acts_destroy(&s->acts);
  dev_destroy(&s->dev);
  free(s->units);
  free(s->window);
  free(s->lnf);
}

static fsdp_status sampler_init(sampler *s, const plan_t *p, const float *param) {
  *s = (sampler){.p = p};
  if (p->batch_size != 1 || p->shard_world != 1)
    return fsdp_set_error(FSDP_ERR_INTERNAL, "the sampler needs a world-1 plan of batch 1");
  s->units = calloc((size_t)p->nunits, sizeof(void *));
  s->window = calloc((size_t)p->model.seq_len, sizeof(int));
  s->lnf = malloc((size_t)p->model.n_embd * sizeof(float));
  fsdp_status rc = FSDP_OK;
  if (!s->units || !s->window || !s->lnf) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the sampler");
  if (rc == FSDP_OK) rc = dev_new_cpu(DEV_CPU_SYNC, &s->dev);
  if (rc == FSDP_OK && !(s->acts = model_acts_new(p, s->dev))) rc = FSDP_ERR_NOMEM;
  for (int u = 0; rc == FSDP_OK && u < p->nunits; u++) s->units[u] = (void *)(uintptr_t)(param + p->units[u].shard_base);
  s->head = param + p->units[0].shard_base + p->units[0].t[plan_head_slot(p)].offset;
  if (rc != FSDP_OK) sampler_free(s);
  return rc;
}

/* The forward over IDS[0, LEN), LEN <= T; positions after LEN are padding the causal mask ignores. */
static void sampler_forward(sampler *s, const int *ids, int len) {
  const plan_t *p = s->p;
  memset(s->window, 0, (size_t)p->model.seq_len * sizeof(int));
  memcpy(s->window, ids, (size_t)len * sizeof(int));
  model_embed_forward(s->acts, p, s->units[0], s->window);
  for (int l = 0; l < p->model.n_layer; l++) model_block_forward(s->acts, p, l, s->units[1 + l]);
  model_head_forward(s->acts, p, s->units[0], NULL, NULL);
}

/* LOGITS (V) at position POS of the last forward. */
static fsdp_status sampler_logits(sampler *s, int pos, float *logits) {
  const int V = s->p->model.vocab_size, C = s->p->model.n_embd;
  TRY(s->dev->op->download(s->dev, s->lnf, (const float *)model_final_hidden(s->acts) + (int64_t)pos * C,
                           (size_t)C * sizeof(float)));
  for (int v = 0; v < V; v++) {
    float x = 0;
    for (int c = 0; c < C; c++) x += s->lnf[c] * s->head[(int64_t)v * C + c];
    logits[v] = x;
  }
  return FSDP_OK;
}

fsdp_status sample_generate(const plan_t *p, const float *param, int *ids, int plen, int total, double temperature,
                            int top_k, uint64_t seed, const int *stop, int nstop, int *end) {
  const int V = p->model.vocab_size, T = p->model.seq_len;
  sampler s;
  TRY(sampler_init(&s, p, param));
  float *logits = malloc((size_t)V * sizeof(float));
  double *w = malloc((size_t)V * sizeof(double));
  fsdp_status rc = logits && w ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the sampler");
  int n = plen, stopped = 0;
  for (; rc == FSDP_OK && n < total && !stopped; n++) {
    int start = n > T ? n - T : 0, len = n - start;   /* the last T tokens */
    sampler_forward(&s, ids + start, len);
    rc = sampler_logits(&s, len - 1, logits);
    if (rc == FSDP_OK) ids[n] = pick(logits, V, temperature, top_k, rng_uniform(seed, 0x5a4d, (uint64_t)(n - plen)), w);
    for (int k = 0; rc == FSDP_OK && k < nstop; k++) stopped |= ids[n] == stop[k];
  }
  if (end) *end = stopped ? n - 1 : n;
  sampler_free(&s);
  free(logits);
  free(w);
  return rc;
}

/* --logits: the logits of every prompt position, one JSON array of arrays on stdout. */
static fsdp_status print_logits(const plan_t *p, const float *param, const int *ids, int plen) {
  const int V = p->model.vocab_size;
  if (plen > p->model.seq_len)
    return fsdp_set_error(FSDP_ERR_RANGE, "--logits: the prompt has %d tokens, the model's context %d", plen,
                          p->model.seq_len);
  sampler s;
  TRY(sampler_init(&s, p, param));
  float *logits = malloc((size_t)V * sizeof(float));
  fsdp_status rc = logits ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the logits");
  if (rc == FSDP_OK) sampler_forward(&s, ids, plen);
  for (int t = 0; rc == FSDP_OK && t < plen; t++) {
    rc = sampler_logits(&s, t, logits);
    for (int v = 0; rc == FSDP_OK && v < V; v++) printf("%s%.9g", v ? "," : t ? ",[" : "[[", logits[v]);
    printf("]");
  }
  printf("]\n");
  sampler_free(&s);
  free(logits);
  return rc;
}

/* The prompt's ids in *IDS (malloc'd with room for EXTRA more), *N of them: the tokenizer.json's
 * encoding (with its special tokens, as transformers' tokenizer(prompt) does), else its bytes. */
static fsdp_status prompt_ids(const tokenizer *tk, const char *prompt, int V, int **ids, int *n, int extra) {
  if (!tk->bpe) {
    TRY(sample_prompt_ids(prompt, V, NULL, n));
    if (!(*ids = calloc((size_t)(*n + extra), sizeof **ids)))
      return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the sampler");
    return sample_prompt_ids(prompt, V, *ids, n);
  }
  bpe_state *st = NULL;
  bpe_ids v = {0};
  fsdp_status rc = bpe_state_new(tk->bpe, &st);
  if (rc == FSDP_OK) rc = bpe_encode(st, prompt, strlen(prompt), 1, &v);
  bpe_state_destroy(&st);
  if (rc == FSDP_OK && v.n == 0) rc = fsdp_set_error(FSDP_ERR_INVALID, "the prompt is empty; give at least one token");
  if (rc == FSDP_OK && !(*ids = calloc(v.n + (size_t)extra, sizeof **ids)))
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the sampler");
  for (size_t i = 0; rc == FSDP_OK && i < v.n; i++) (*ids)[i] = (int)v.v[i];
  *n = (int)v.n;
  free(v.v);
  return rc;
}

/* The ids of the list S (decimal, separated by spaces or commas) in *IDS (malloc'd with room for
 * EXTRA more), *N of them, each in [0, V); WHAT names the list in a refusal. */
static fsdp_status parse_ids(const char *s, int V, const char *what, int **ids, int *n, int extra) {
  size_t cap = strlen(s) / 2 + 1;
  *n = 0;
  if (!(*ids = calloc(cap + (size_t)extra, sizeof **ids))) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the sampler");
  for (const char *q = s; *q;) {
    if (*q == ' ' || *q == ',') {
      q++;
      continue;
    }
    char *e;
    errno = 0;
    long v = strtol(q, &e, 10);
    if (e == q || errno || v < 0 || v >= V)
      return fsdp_set_error(FSDP_ERR_INVALID, "%s: '%.20s' is not a token id of the model (0..%d)", what, q, V - 1);
    (*ids)[(*n)++] = (int)v;
    q = e;
  }
  if (!*n) return fsdp_set_error(FSDP_ERR_INVALID, "%s is empty; give at least one token id", what);
  return FSDP_OK;
}

/* The continuation ids[plen..total) as text: the decoding of the whole that follows the prompt's
 * own decoding (decoders that strip or join look at neighbours), else the new ids decoded alone.
 * Ids the tokenizer does not have (a padded vocabulary) have no text. */
static fsdp_status print_decoded(const bpe_tokenizer *t, const int *ids, int plen, int total) {
  uint32_t *u = malloc((size_t)total * sizeof *u);
  if (!u) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the sampler");
  int m = 0, mp = 0;
  for (int i = 0; i < total; i++) {
    if (ids[i] < bpe_vocab_size(t)) u[m++] = (uint32_t)ids[i];
    if (i + 1 == plen) mp = m;
  }
  char *all = NULL, *pre = NULL, *cont = NULL;
  size_t nall, npre, ncont;
  fsdp_status rc = bpe_decode(t, u, (size_t)m, 0, &all, &nall);
  if (rc == FSDP_OK) rc = bpe_decode(t, u, (size_t)mp, 0, &pre, &npre);
  if (rc == FSDP_OK && npre <= nall && !memcmp(all, pre, npre)) fwrite(all + npre, 1, nall - npre, stdout);
  else if (rc == FSDP_OK && (rc = bpe_decode(t, u + mp, (size_t)(m - mp), 0, &cont, &ncont)) == FSDP_OK)
    fwrite(cont, 1, ncont, stdout);
  if (rc == FSDP_OK) putchar('\n');
  free(all), free(pre), free(cont), free(u);
  return rc;
}

/* --adapter DIR: a PEFT LoRA folder merged into the whole model PARAM of P (peft_merge). */
static fsdp_status apply_adapter(const char *dir, const jobspec_t *spec, const plan_t *p, float *param) {
  jobspec_t s = *spec;
  TRY(peft_read_config(dir, &s));
  plan_t *pl = NULL;
  fsdp_status brc = plan_build(&s, 1, &pl);
  if (brc != FSDP_OK) return fsdp_set_error(brc, "--adapter %s: %s", dir, fsdp_last_error());
  fsdp_status rc = pl->shard_total == p->shard_total ? FSDP_OK
                   : fsdp_set_error(FSDP_ERR_INTERNAL, "--adapter %s: the model's layout changed with [lora]", dir);
  float *ad = rc == FSDP_OK ? malloc((size_t)pl->lora.numel * sizeof *ad) : NULL;
  if (rc == FSDP_OK && !ad) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the adapters of %s", dir);
  if (rc == FSDP_OK) rc = peft_load(pl, dir, ad, "--adapter");
  if (rc == FSDP_OK) peft_merge(pl, param, ad);
  free(ad);
  plan_destroy(&pl);
  return rc;
}

int sample_run(const sample_args *a) {
  jobspec_t spec;
  plan_t *p = NULL;
  float *param = NULL;
  int *ids = NULL, *stop = NULL;
  tokenizer tk = {0};
  fsdp_status rc = FSDP_OK;
  int bad_input = 0;
  if ((rc = load_model(a->model, &spec, &p, &param)) != FSDP_OK ||
      (a->adapter && (rc = apply_adapter(a->adapter, &spec, p, param)) != FSDP_OK)) {
    bad_input = rc == FSDP_ERR_NOTFOUND || rc == FSDP_ERR_INVALID || rc == FSDP_ERR_FORMAT || rc == FSDP_ERR_UNSUPPORTED;
    goto out;
  }
  const int V = p->model.vocab_size;
  char found[4096];
  const char *tpath = a->tokenizer;
  if (!tpath && V != 256) {   /* byte-level models need none; others use the one that comes with them */
    model_tokenizer(a->model, found, sizeof found);
    tpath = found[0] ? found : NULL;
  }
  if (tpath) {
    if ((rc = tokenizer_load(tpath, &tk)) != FSDP_OK) {
      bad_input = 1;
      goto out;
    }
    int64_t tn = tk.bpe ? bpe_vocab_size(tk.bpe) : tk.n;
    if (tk.bpe ? tn > V : tn < V) {
      rc = fsdp_set_error(FSDP_ERR_INVALID, "the tokenizer %s has %lld tokens, the model's vocabulary %d", tpath,
                          (long long)tn, V);
      bad_input = 1;
      goto out;
    }
  }
  int plen = 0, nstop = 0, total, end;
  rc = a->prompt_ids ? parse_ids(a->prompt_ids, V, "--prompt-ids", &ids, &plen, a->tokens)
                     : prompt_ids(&tk, a->prompt, V, &ids, &plen, a->tokens);
  if (rc == FSDP_OK && a->stop_ids) rc = parse_ids(a->stop_ids, V, "--stop-ids", &stop, &nstop, 0);
  if (rc != FSDP_OK) {
    bad_input = rc != FSDP_ERR_NOMEM;
    goto out;
  }
  total = plen + a->tokens;
  if (a->logits) {
    rc = print_logits(p, param, ids, plen);
    goto out;
  }
  TRY_GOTO(sample_generate(p, param, ids, plen, total, a->temperature, a->top_k, a->seed, stop, nstop, &end), rc, out);
  if (tk.bpe) {
    TRY_GOTO(print_decoded(tk.bpe, ids, plen, end), rc, out);
  } else {
    int binary = V != 256 && !tpath;
    for (int n = plen; n < end; n++) {
      if (binary) printf(n > plen ? " %d" : "%d", ids[n]);
      else if (tpath) fwrite(tk.tok[ids[n]], 1, tk.len[ids[n]], stdout);
      else putchar(ids[n]);
    }
    if (binary || tpath || ids[end - 1] != '\n') putchar('\n');
  }
  fflush(stdout);
out:
  /* sample mode is what `fsdpctl sample` runs (it execs this worker): the user's line is fsdpctl's */
  if (rc != FSDP_OK) fprintf(stderr, "fsdpctl: %s\n", fsdp_last_error());
  tokenizer_free(&tk);
  free(param);
  free(ids);
  free(stop);
  plan_destroy(&p);
  return rc == FSDP_OK ? 0 : bad_input ? 2 : 1;
}

fsdp_status sample_prompt_ids(const char *prompt, int V, int *ids, int *n) {
  size_t plen = strlen(prompt);
  if (plen == 0) return fsdp_set_error(FSDP_ERR_INVALID, "the prompt is empty; give at least one byte");
  for (size_t i = 0; i < plen; i++) {
    unsigned char b = (unsigned char)prompt[i];
    if (b >= V)
      return fsdp_set_error(FSDP_ERR_RANGE, "prompt byte %zu (0x%02x) is outside the model's vocabulary of %d tokens; "
                            "allowed: bytes below %d", i, b, V, V);
    if (ids) ids[i] = b;
  }
  *n = (int)plen;
  return FSDP_OK;
}
