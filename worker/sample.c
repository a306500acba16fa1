/* sample — see sample.h. */
#include "sample.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt.h"
#include "device.h"
#include "jobspec.h"
#include "model.h"
#include "plan.h"
#include "rng.h"
#include "safetensors.h"

#define TOKENIZER_MAGIC 20240328

/* ---- the model ---- */

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* A positive integer KEY of the config O, or an error naming it. */
static fsdp_status config_int(json_t *o, const char *path, const char *key, int *v) {
  json_t *x = json_object_get(o, key);
  if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 16777216)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s must be a positive integer", path, key);
  *v = (int)json_integer_value(x);
  return FSDP_OK;
}

/* A LlamaConfig's shape (model_type "llama"), as fsdpctl export writes it. */
static fsdp_status llama_config(json_t *o, const char *path, model_config *m) {
  static const char *const keys[] = {"num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
                                     "max_position_embeddings", "num_key_value_heads", "intermediate_size"};
  int v[7];
  for (int i = 0; i < 7; i++) TRY(config_int(o, path, keys[i], &v[i]));
  json_t *eps = json_object_get(o, "rms_norm_eps"), *theta = json_object_get(o, "rope_theta");
  if (!json_is_number(eps) || !json_is_number(theta))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: rms_norm_eps and rope_theta must be numbers", path);
  /* What fsdpd's Llama does not compute is refused rather than run as a different model: a rotary
   * scaling other than llama3, a head size other than hidden_size / num_attention_heads, another
   * activation, biases. */
  json_t *scaling = json_object_get(o, "rope_scaling"), *hd = json_object_get(o, "head_dim");
  json_t *act = json_object_get(o, "hidden_act");
  const char *rtype = json_string_value(json_object_get(scaling, "rope_type"));
  if (!rtype) rtype = json_string_value(json_object_get(scaling, "type"));
  double rope[4] = {0, 0, 0, 0};   /* factor, low_freq_factor, high_freq_factor, original_max_position_embeddings */
  int llama3 = rtype && !strcmp(rtype, "llama3");
  if (scaling && !json_is_null(scaling) && !llama3 && !(rtype && !strcmp(rtype, "default")))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: rope_scaling (%s) is not computed by fsdpd; allowed: rope_scaling "
                          "null or llama3", path, rtype ? rtype : "set");
  static const char *const rkeys[4] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
  for (int i = 0; llama3 && i < 4; i++) {
    json_t *x = json_object_get(scaling, rkeys[i]);
    if (!json_is_number(x) || !(json_number_value(x) > 0))
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: rope_scaling llama3 needs a positive number %s", path, rkeys[i]);
    rope[i] = json_number_value(x);
  }
  if (hd && !json_is_null(hd) && (!json_is_integer(hd) || json_integer_value(hd) != v[2] / v[1]))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: head_dim must be hidden_size / num_attention_heads = %d", path,
                          v[2] / v[1]);
  if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: hidden_act must be silu (SwiGLU)", path);
  if (json_is_true(json_object_get(o, "attention_bias")) || json_is_true(json_object_get(o, "mlp_bias")))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: attention_bias and mlp_bias must be false (no biases)", path);
  *m = (model_config){.arch = ARCH_LLAMA, .n_layer = v[0], .n_head = v[1], .n_embd = v[2], .vocab_size = v[3],
                      .seq_len = v[4], .n_kv_head = v[5], .ffn_dim = v[6], .norm_eps = json_number_value(eps),
                      .rope_theta = json_number_value(theta),
                      .tie_embeddings = json_is_true(json_object_get(o, "tie_word_embeddings")),
                      .rope_scaling = llama3 ? ROPE_SCALING_LLAMA3 : ROPE_SCALING_NONE, .rope_factor = rope[0],
                      .rope_low_freq_factor = rope[1], .rope_high_freq_factor = rope[2],
                      .rope_original_max_pos = (int)rope[3]};
  return FSDP_OK;
}

/* The model shape from DIR/config.json (a Hugging Face GPT2Config or LlamaConfig, as fsdpctl export
 * writes them). */
static fsdp_status read_hf_config(const char *st_path, model_config *m) {
  char path[4096];
  const char *slash = strrchr(st_path, '/');
  int w = slash ? snprintf(path, sizeof path, "%.*s/config.json", (int)(slash - st_path), st_path)
                : snprintf(path, sizeof path, "config.json");
  if (w < 0 || (size_t)w >= sizeof path) return fsdp_set_error(FSDP_ERR_RANGE, "path %s is too long", st_path);
  json_error_t err;
  json_t *o = json_load_file(path, 0, &err);
  if (!o)
    return fsdp_set_error(FSDP_ERR_NOTFOUND, "%s needs its config.json beside it (as fsdpctl export writes): %s: %s",
                          st_path, path, err.text);
  static const char *const keys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "n_positions"};
  int v[5];
  fsdp_status rc = FSDP_OK;
  const char *type = json_string_value(json_object_get(o, "model_type"));
  if (type && !strcmp(type, "llama")) {
    rc = llama_config(o, path, m);
    json_decref(o);
    return rc;
  }
  for (int i = 0; i < 5 && rc == FSDP_OK; i++) rc = config_int(o, path, keys[i], &v[i]);
  json_decref(o);
  if (rc == FSDP_OK)
    *m = (model_config){.n_layer = v[0], .n_head = v[1], .n_embd = v[2], .vocab_size = v[3], .seq_len = v[4],
                        .n_kv_head = v[1]};
  return rc;
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
  if (stat(model, &sb) != 0) return fsdp_set_error(FSDP_ERR_NOTFOUND, "%s: %s", model, strerror(errno));
  if (S_ISREG(sb.st_mode)) {
    if (!ends_with(model, ".safetensors"))
      return fsdp_set_error(FSDP_ERR_INVALID, "%s is neither a checkpoint directory nor a .safetensors file", model);
    TRY(read_hf_config(model, &spec->model));
    TRY(plan_build(spec, 1, p));
    *param = calloc((size_t)(*p)->shard_total, sizeof(float));
    if (!*param) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the model");
    st_file *f = NULL;
    TRY(st_open(model, &f));
    fsdp_status rc = st_load_shard(f, *p, 0, *param);
    st_destroy(&f);
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
  ckpt_info ci;
  TRY(ckpt_read_manifest(root, step, &ci));
  spec->model = ci.model;
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

typedef struct tokenizer {
  int n;
  char **tok;
  unsigned char *len;
} tokenizer;

static void tokenizer_free(tokenizer *t) {
  for (int i = 0; t->tok && i < t->n; i++) free(t->tok[i]);
  free(t->tok);
  free(t->len);
  memset(t, 0, sizeof *t);
}

/* llm.c's tokenizer file: 256 uint32 (magic 20240328, version, vocab size, ...), then per token a
 * length byte and its bytes. */
static fsdp_status tokenizer_load(const char *path, tokenizer *t) {
  memset(t, 0, sizeof *t);
  FILE *f = fopen(path, "rb");
  if (!f) return fsdp_set_error(FSDP_ERR_NOTFOUND, "cannot read the tokenizer %s: %s", path, strerror(errno));
  uint32_t h[256];
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

fsdp_status sample_generate(const plan_t *p, const float *param, int *ids, int plen, int total, double temperature,
                            int top_k, uint64_t seed) {
  const int V = p->model.vocab_size, T = p->model.seq_len, C = p->model.n_embd;
  if (p->batch_size != 1 || p->shard_world != 1)
    return fsdp_set_error(FSDP_ERR_INTERNAL, "sample_generate needs a world-1 plan of batch 1");
  fsdp_status rc = FSDP_OK;
  device_t *dev = NULL;
  model_acts *acts = NULL;
  void **units = calloc((size_t)p->nunits, sizeof(void *));
  int *window = calloc((size_t)T, sizeof(int));
  float *lnf = malloc((size_t)C * sizeof(float)), *logits = malloc((size_t)V * sizeof(float));
  double *w = malloc((size_t)V * sizeof(double));
  if (!units || !window || !lnf || !logits || !w) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the sampler");
  if (rc == FSDP_OK) rc = device_new_cpu(DEV_CPU_SYNC, &dev);
  if (rc == FSDP_OK && !(acts = model_acts_new(p, dev))) rc = FSDP_ERR_NOMEM;
  for (int u = 0; rc == FSDP_OK && u < p->nunits; u++) units[u] = (void *)(uintptr_t)(param + p->units[u].shard_base);
  const float *head = param + p->units[0].shard_base + p->units[0].t[plan_head_slot(p)].offset;
  for (int n = plen; rc == FSDP_OK && n < total; n++) {
    /* the last T tokens; positions after the window's end are padding the causal mask ignores */
    int start = n > T ? n - T : 0, len = n - start;
    memset(window, 0, (size_t)T * sizeof(int));
    memcpy(window, ids + start, (size_t)len * sizeof(int));
    model_embed_forward(acts, p, units[0], window);
    for (int l = 0; l < p->model.n_layer; l++) model_block_forward(acts, p, l, units[1 + l]);
    model_head_forward(acts, p, units[0], NULL, NULL);
    rc = dev->op->download(dev, lnf, (const float *)model_final_hidden(acts) + (int64_t)(len - 1) * C,
                           (size_t)C * sizeof(float));
    for (int v = 0; rc == FSDP_OK && v < V; v++) {   /* the head (wte or lm_head) on the last position */
      float s = 0;
      for (int c = 0; c < C; c++) s += lnf[c] * head[(int64_t)v * C + c];
      logits[v] = s;
    }
    ids[n] = pick(logits, V, temperature, top_k, rng_uniform(seed, 0x5a4d, (uint64_t)(n - plen)), w);
  }
  model_acts_destroy(&acts);
  device_destroy(&dev);
  free(units);
  free(window);
  free(lnf);
  free(logits);
  free(w);
  return rc;
}

int sample_run(const sample_args *a) {
  jobspec_t spec;
  plan_t *p = NULL;
  float *param = NULL;
  int *ids = NULL;
  tokenizer tk = {0};
  fsdp_status rc = FSDP_OK;
  int bad_input = 0;
  if ((rc = load_model(a->model, &spec, &p, &param)) != FSDP_OK) {
    bad_input = rc == FSDP_ERR_NOTFOUND || rc == FSDP_ERR_INVALID || rc == FSDP_ERR_FORMAT;
    goto out;
  }
  const int V = p->model.vocab_size;
  if (a->tokenizer) {
    if ((rc = tokenizer_load(a->tokenizer, &tk)) != FSDP_OK) {
      bad_input = 1;
      goto out;
    }
    if (tk.n < V) {
      rc = fsdp_set_error(FSDP_ERR_INVALID, "the tokenizer %s has %d tokens, the model's vocabulary %d", a->tokenizer,
                          tk.n, V);
      bad_input = 1;
      goto out;
    }
  }
  int plen = 0;
  if ((rc = sample_prompt_ids(a->prompt, V, NULL, &plen)) != FSDP_OK) {
    bad_input = 1;
    goto out;
  }
  int total = plen + a->tokens;
  if (!(ids = calloc((size_t)total, sizeof(int)))) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the sampler");
    goto out;
  }
  sample_prompt_ids(a->prompt, V, ids, &plen);
  TRY_GOTO(sample_generate(p, param, ids, plen, total, a->temperature, a->top_k, a->seed), rc, out);
  int binary = V != 256 && !a->tokenizer;
  for (int n = plen; n < total; n++) {
    if (binary) printf(n > plen ? " %d" : "%d", ids[n]);
    else if (a->tokenizer) fwrite(tk.tok[ids[n]], 1, tk.len[ids[n]], stdout);
    else putchar(ids[n]);
  }
  if (binary || a->tokenizer || ids[total - 1] != '\n') putchar('\n');
  fflush(stdout);
out:
  if (rc != FSDP_OK) fprintf(stderr, "sample: %s\n", fsdp_user_message(fsdp_last_error()));
  tokenizer_free(&tk);
  free(param);
  free(ids);
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
