/* ckpt_manifest — the manifest of a checkpoint step (see ckpt.h): written last, by rank 0, once every
 * rank file is complete and synced (a step without it does not exist), and read back with the model
 * identity and the data position a resume needs. Split from ckpt.c, which writes the rank files. */
#define _GNU_SOURCE
#include "ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch.h"
#include "ckpt_priv.h"
#include "ckpt_rankfile.h"
#include "fsutil.h"

fsdp_status ckpt_write_manifest(const char *dir, const plan_t *p, int step, uint64_t tokens) {
  return ckpt_write_manifest_rows(dir, p, step, tokens, (int64_t)p->world * p->batch_size * p->grad_accum, NULL);
}

/* Beyond the shape (the architecture's own keys are written with it, by its descriptor): the published
 * position count where it differs from seq_len (so that a manifest of a model without it reads as
 * before), and the folder it came from ([model] from), which fsdpctl export carries the config and
 * tokenizer of. */
static void manifest_model_extras(json_t *model, json_t *o, const plan_t *p) {
  const model_config *m = &p->model;
  if (m->n_positions && m->n_positions != m->seq_len) json_object_set_new(model, "n_positions", json_integer(m->n_positions));
  if (p->source[0]) json_object_set_new(o, "source", json_string(p->source));
}

/* The longrope an architecture wrote beside rope_scaling ("rope_longrope": short_factor,
 * attention_factor, original_max_position_embeddings; models/phi3/), or -1 when it is malformed. */
static int read_longrope(const json_t *r, model_config *m) {
  const json_t *sf = json_object_get(r, "short_factor");
  json_int_t orig = json_integer_value(json_object_get(r, "original_max_position_embeddings"));
  double af = json_number_value(json_object_get(r, "attention_factor"));
  size_t n = json_array_size(sf);
  if (!n || n > ROPE_MAX_FACTORS || orig < 1 || orig > 16777216 || !(af > 0 && af <= 1e6)) return -1;
  for (size_t i = 0; i < n; i++) {
    const json_t *x = json_array_get(sf, i);
    if (!json_is_number(x) || !(json_number_value(x) > 0)) return -1;
    m->rope_short_factor.v[i] = json_number_value(x);
  }
  m->rope_short_factor.n = (int)n;
  m->rope_scaling = ROPE_SCALING_LONGROPE;
  m->rope_attention_factor = af;
  m->rope_original_max_pos = (int)orig;
  return 0;
}

/* The keys beyond the common shape; -1 when the architecture's own settings are malformed. */
static int read_model_extras(const json_t *o, ckpt_info *out) {
  const json_t *model = json_object_get(o, "model");
  model_config *m = &out->model;
  json_int_t npos = json_integer_value(json_object_get(model, "n_positions"));
  m->n_positions = npos > m->seq_len && npos <= (1 << 24) ? (int)npos : m->seq_len;
  const arch_desc *d = arch_get(m->arch);
  m->pad_token_id = -1;   /* the architecture's reader sets it where it has one */
  if (d && d->manifest_read) d->manifest_read(model, m);
  snprintf(out->source, sizeof out->source, "%s", json_string_value(json_object_get(o, "source")) ?
           json_string_value(json_object_get(o, "source")) : "");
  return arch_ext_read(model, m);
}

fsdp_status ckpt_write_manifest_rows(const char *dir, const plan_t *p, int step, uint64_t tokens, int64_t rows_per_step,
                                     const ckpt_base *base) {
  json_t *o = json_object(), *model = json_object(), *files = json_array();
  json_object_set_new(o, "format", json_string("fsdpd-checkpoint"));
  json_object_set_new(o, "version", json_integer(CKPT_VERSION));
  json_object_set_new(o, "step", json_integer(step));
  json_object_set_new(o, "world", json_integer(p->world));
  json_object_set_new(o, "sharding", json_string(jobspec_shard_mode_name(p->sharding)));
  json_object_set_new(model, "arch", json_string(jobspec_arch_name(p->model.arch)));
  json_object_set_new(model, "n_layer", json_integer(p->model.n_layer));
  json_object_set_new(model, "n_head", json_integer(p->model.n_head));
  json_object_set_new(model, "n_embd", json_integer(p->model.n_embd));
  json_object_set_new(model, "vocab_size", json_integer(p->model.vocab_size));
  json_object_set_new(model, "seq_len", json_integer(p->model.seq_len));
  arch_model_json(model, &p->model);   /* the architecture's keys beyond the shape, its own settings */
  manifest_model_extras(model, o, p);
  json_object_set_new(o, "model", model);
  json_object_set_new(o, "n_params", json_integer(p->n_params));
  json_object_set_new(o, "tokens", json_integer((json_int_t)tokens));
  json_object_set_new(o, "batch_size", json_integer(p->batch_size));
  json_object_set_new(o, "grad_accum", json_integer(p->grad_accum));
  json_object_set_new(o, "rows_per_step", json_integer((json_int_t)rows_per_step));
  for (int r = 0; r < p->world; r++) {
    char f[32];
    snprintf(f, sizeof f, "rank-%d.bin", r);
    json_array_append_new(files, json_string(f));
  }
  json_object_set_new(o, "files", files);
  if (p->lora.rank && base) ckpt_lora_manifest_write(o, p, base);
  char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(o);
  if (!text) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot format the checkpoint manifest");

  char sdir[PATH_MAX];
  ckpt_step_dir(dir, step, sdir, sizeof sdir);
  int dfd = -1, sfd = -1;
  fsutil_atomic a = FSUTIL_ATOMIC_INIT;
  fsdp_status rc;
  TRY_GOTO(ckpt_open_step_dir(dir, step, 0, &dfd, &sfd), rc, out);
  /* The rank files' directory entries must be durable before the manifest says they exist. */
  TRY_GOTO(fsutil_fsync_dir(sfd, sdir), rc, out);
  ckpt_test_pause("manifest", step, 0);
  TRY_GOTO(fsutil_atomic_begin(sfd, sdir, CKPT_MANIFEST, 0644, &a), rc, out);
  TRY_GOTO(fsutil_write_full(a.fd, text, strlen(text), a.shown), rc, out);
  TRY_GOTO(fsutil_write_full(a.fd, "\n", 1, a.shown), rc, out);
  TRY_GOTO(fsutil_atomic_commit(&a), rc, out);   /* rename, then the step directory's fsync */
  rc = fsutil_fsync_dir(dfd, dir);
out:
  fsutil_atomic_abort(&a);
  if (sfd >= 0) close(sfd);
  if (dfd >= 0) close(dfd);
  free(text);
  return rc;
}

/* ---- manifest ---- */

static int shard_mode_parse(const char *s, shard_mode *out) {
  for (int m = SHARD_FULL; m <= SHARD_NONE; m++)
    if (!strcmp(s, jobspec_shard_mode_name((shard_mode)m))) {
      *out = (shard_mode)m;
      return 0;
    }
  return -1;
}

static int arch_parse(const char *s, model_arch *out) {
  const arch_desc *d = arch_by_name(s);
  if (!d) return -1;
  *out = d->id;
  return 0;
}

fsdp_status ckpt_read_manifest(const char *dir, int step, ckpt_info *out) {
  char path[PATH_MAX + 64];
  int fd;
  fsdp_status orc = ckpt_open_in_step(dir, step, CKPT_MANIFEST, &fd, path, sizeof path);
  if (orc == FSDP_ERR_NOTFOUND)
    return fsdp_set_error(orc, "%s does not exist: step %d is not a complete checkpoint", path, step);
  TRY(orc);
  json_error_t jerr;
  json_t *o = json_loadfd(fd, 0, &jerr);
  close(fd);
  if (!o) return fsdp_set_error(FSDP_ERR_FORMAT, "%s:%d: %s", path, jerr.line, jerr.text);
  fsdp_status rc = FSDP_OK;
  memset(out, 0, sizeof *out);
  const char *fmt = NULL, *sh = NULL, *arch = NULL;
  json_int_t ver = 0, st = -1, world = 0, tokens = 0, B = 0, G = 0, rows = 0;
  json_int_t L = 0, H = 0, C = 0, V = 0, T = 0, KV = 0, F = 0;
  double eps = 1e-5, theta = 10000;
  int tie = 0;
  json_t *files = NULL, *rope = NULL;
  /* an architecture's own keys are absent for the others (GPT-2 has none); tie_word_embeddings and
   * rope_scaling in checkpoints of an fsdpd that had neither (untied, unscaled) */
  if (json_unpack_ex(o, &jerr, 0, "{s:s, s:I, s:I, s:I, s:s, s:{s:s, s:I, s:I, s:I, s:I, s:I, s?I, s?I, s?F, s?F, "
                     "s?b, s?o}, s:I, s:I, s:I, s:I, s:o}",
                     "format", &fmt, "version", &ver, "step", &st, "world", &world, "sharding", &sh, "model", "arch",
                     &arch, "n_layer", &L, "n_head", &H, "n_embd", &C, "vocab_size", &V, "seq_len", &T, "n_kv_head",
                     &KV, "ffn_dim", &F, "norm_eps", &eps, "rope_theta", &theta, "tie_word_embeddings", &tie,
                     "rope_scaling", &rope, "tokens",
                     &tokens, "batch_size", &B, "grad_accum", &G, "rows_per_step", &rows, "files", &files) != 0) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s", path, jerr.text);
    goto out;
  }
  if (strcmp(fmt, "fsdpd-checkpoint") != 0 || ver != CKPT_VERSION) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: format '%s' version %lld; this build reads fsdpd-checkpoint version %d",
                        path, fmt, (long long)ver, CKPT_VERSION);
    goto out;
  }
  if (st != step || world < 1 || world > 65536 || L < 1 || H < 1 || C < 1 || V < 1 || T < 1 || L > 100000 ||
      C > 1 << 20 || V > 1 << 24 || T > 1 << 24 || tokens < 0 || !json_is_array(files) ||
      json_array_size(files) != (size_t)world || arch_parse(arch, &out->model.arch) || shard_mode_parse(sh, &out->sharding) ||
      KV < 0 || KV > H || F < 0 || F > 1 << 20 ||
      /* the architecture's own keys consistent (Llama: n_kv_head and ffn_dim present) */
      arch_get(out->model.arch)->manifest_fix(&(model_config){.arch = out->model.arch, .n_kv_head = (int)KV,
                                                              .ffn_dim = (int)F, .tie_embeddings = tie})) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: inconsistent manifest (step %lld in directory step %d, world %lld, "
                        "%zu files, arch '%s', sharding '%s')", path, (long long)st, step, (long long)world,
                        json_array_size(files), arch, sh);
    goto out;
  }
  for (json_int_t r = 0; r < world; r++) {
    char want[32];
    snprintf(want, sizeof want, "rank-%lld.bin", (long long)r);
    const char *f = json_string_value(json_array_get(files, (size_t)r));
    if (!f || strcmp(f, want) != 0) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: files[%lld] is '%s', expected '%s'", path, (long long)r, f ? f : "?", want);
      goto out;
    }
  }
  out->step = step;
  out->world = (int)world;
  out->model = (model_config){.arch = out->model.arch, .n_layer = (int)L, .n_head = (int)H, .n_embd = (int)C,
                              .vocab_size = (int)V, .seq_len = (int)T, .n_kv_head = KV ? (int)KV : (int)H,
                              .ffn_dim = (int)F, .norm_eps = eps, .rope_theta = theta,
                              .tie_embeddings = tie};
  arch_get(out->model.arch)->manifest_fix(&out->model);   /* GPT-2: always tied */
  const char *rope_type = json_string_value(json_object_get(rope, "rope_type"));
  if (rope_type && !strcmp(rope_type, "linear")) {
    model_config *m = &out->model;
    if (json_unpack_ex(rope, &jerr, 0, "{s:s, s:F}", "rope_type", &rope_type, "factor", &m->rope_factor) != 0 ||
        !(m->rope_factor >= 1 && m->rope_factor <= 1e6)) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: model.rope_scaling is not a linear scaling this build reads", path);
      goto out;
    }
    m->rope_scaling = ROPE_SCALING_LINEAR;
  } else if (rope && !json_is_null(rope)) {
    const char *type = NULL;
    json_int_t orig = 0;
    model_config *m = &out->model;
    if (json_unpack_ex(rope, &jerr, 0, "{s:s, s:F, s:F, s:F, s:I}", "rope_type", &type, "factor", &m->rope_factor,
                       "low_freq_factor", &m->rope_low_freq_factor, "high_freq_factor", &m->rope_high_freq_factor,
                       "original_max_position_embeddings", &orig) != 0 || strcmp(type, "llama3") ||
        orig < 1 || orig > 16777216) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: model.rope_scaling is not a llama3 scaling this build reads", path);
      goto out;
    }
    m->rope_scaling = ROPE_SCALING_LLAMA3;
    m->rope_original_max_pos = (int)orig;
  }
  if (read_model_extras(o, out)) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: the model's %s settings are not ones this build reads", path,
                        arch_get(out->model.arch)->name);
    goto out;
  }
  TRY_GOTO(ckpt_lora_manifest_read(o, path, out), rc, out);
  const json_t *lr = json_object_get(json_object_get(o, "model"), "rope_longrope");
  if (lr && (out->model.rope_scaling != ROPE_SCALING_NONE || read_longrope(lr, &out->model))) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: model.rope_longrope is not a longrope scaling this build reads", path);
    goto out;
  }
  out->tokens = (uint64_t)tokens;
  out->batch_size = (int)B;
  out->grad_accum = (int)G;
  out->rows_per_step = rows;
out:
  json_decref(o);
  return rc;
}
