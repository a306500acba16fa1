/* ckpt_lora — a LoRA job's checkpoint (see ckpt.h): the adapters and their AdamW state in the rank
 * files of plan_lora_segment's layout (one whole file for replicated adapters, one per rank of a shard
 * group for sharded ones; either read into the whole segment), the [lora] settings and the
 * frozen base's identity in the manifest. The base itself is not saved: a resume reads it again from
 * where the job reads it, and refuses it when its content hash changed. Split from ckpt.c, which owns
 * the rank files of a full job. */
#define _GNU_SOURCE
#include "ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_rankfile.h"
#include "fsutil.h"
#include "nf4.h"
#include "peft.h"
#include "safetensors.h"
#include "st_model.h"

/* ---- the base's content hash ---- */

#define HASH_WHOLE ((uint64_t)64 << 20)   /* data read whole up to this; above it, samples */
#define HASH_SAMPLES 64
#define HASH_SAMPLE ((uint64_t)1 << 20)
#define INDEX_MAX ((size_t)64 << 20)

/* CRC32C of LEN bytes of FD from OFF into *CRC, in chunks of BUF. */
static fsdp_status crc_range(int fd, uint64_t off, uint64_t len, uint8_t *buf, uint32_t *crc, const char *path) {
  while (len > 0) {
    size_t n = len > HASH_SAMPLE ? (size_t)HASH_SAMPLE : (size_t)len;
    ssize_t r = pread(fd, buf, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return fsdp_set_error(FSDP_ERR_IO, "cannot read %s to hash the LoRA base: %s", path,
                            r < 0 ? strerror(errno) : "the file ended early");
    *crc = ckpt_crc32c(*crc, buf, (size_t)r);
    off += (uint64_t)r, len -= (uint64_t)r;
  }
  return FSDP_OK;
}

/* One .safetensors file: its size, its header whole, its data whole or sampled (ckpt.h). */
static fsdp_status hash_file(const char *path, uint8_t *buf, uint32_t *crc, uint64_t *total) {
  int fd;
  TRY(fsutil_open_read(AT_FDCWD, path, &fd));
  struct stat sb;
  uint64_t hlen = 0, size = 0;
  fsdp_status rc = fstat(fd, &sb) == 0 ? FSDP_OK : fsdp_set_error(FSDP_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  if (rc == FSDP_OK) size = (uint64_t)sb.st_size;
  if (rc == FSDP_OK && (size < 8 || pread(fd, &hlen, 8, 0) != 8 || hlen > size - 8))
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s is not a safetensors file (its header does not fit it)", path);
  if (rc == FSDP_OK) {
    *crc = ckpt_crc32c(*crc, &size, sizeof size);
    rc = crc_range(fd, 0, 8 + hlen, buf, crc, path);
  }
  uint64_t d0 = 8 + hlen, dlen = size - d0;
  if (rc == FSDP_OK && dlen <= HASH_WHOLE) rc = crc_range(fd, d0, dlen, buf, crc, path);
  for (int i = 0; rc == FSDP_OK && dlen > HASH_WHOLE && i < HASH_SAMPLES; i++)
    rc = crc_range(fd, d0 + (dlen - HASH_SAMPLE) / (HASH_SAMPLES - 1) * (uint64_t)i, HASH_SAMPLE, buf, crc, path);
  close(fd);
  *total += size;
  return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* An index: its text, then every shard it names, each once, by name. */
static fsdp_status hash_index(const char *path, uint8_t *buf, uint32_t *crc, uint64_t *total) {
  char *text = NULL;
  size_t len = 0;
  TRY(fsutil_read_all(AT_FDCWD, path, INDEX_MAX, &text, &len));
  *crc = ckpt_crc32c(*crc, text, len);
  *total += len;
  json_t *o = json_loadb(text, len, 0, NULL), *map = json_object_get(o, "weight_map"), *v;
  free(text);
  size_t n = 0, cap = json_object_size(map);
  const char **files = calloc(cap ? cap : 1, sizeof *files), *k;
  fsdp_status rc = json_is_object(map) && files ? FSDP_OK
                   : fsdp_set_error(FSDP_ERR_FORMAT, "%s has no weight_map to hash the LoRA base by", path);
  json_object_foreach(map, k, v) if (json_is_string(v)) files[n++] = json_string_value(v);
  if (n) qsort(files, n, sizeof *files, cmp_str);
  const char *slash = strrchr(path, '/');
  for (size_t i = 0; rc == FSDP_OK && i < n; i++) {
    if (i && !strcmp(files[i], files[i - 1])) continue;
    char shard[JOBSPEC_PATH_MAX * 2];
    snprintf(shard, sizeof shard, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path, files[i]);
    rc = hash_file(shard, buf, crc, total);
  }
  free(files);
  json_decref(o);
  return rc;
}

fsdp_status ckpt_base_of(const jobspec_t *spec, ckpt_base *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->init, sizeof out->init, "%s", spec->init);
  out->seed = spec->seed;
  if (!strcmp(spec->init, "random")) {
    snprintf(out->hash, sizeof out->hash, "random:%" PRIu64, spec->seed);
    return FSDP_OK;
  }
  uint8_t *buf = malloc(HASH_SAMPLE);
  if (!buf) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a buffer to hash the LoRA base");
  uint32_t crc = 0;
  uint64_t total = 0;
  size_t n = strlen(spec->init);
  fsdp_status rc = n > 11 && !strcmp(spec->init + n - 11, ".index.json") ? hash_index(spec->init, buf, &crc, &total)
                                                                         : hash_file(spec->init, buf, &crc, &total);
  free(buf);
  if (rc == FSDP_OK) snprintf(out->hash, sizeof out->hash, "crc32c:%08x:%" PRIu64, crc, total);
  return rc;
}

/* ---- the manifest's part ---- */

void ckpt_lora_manifest_write(void *obj, const plan_t *p, const ckpt_base *base) {
  json_t *o = obj, *t = json_array();
  for (int j = 0; j < p->lora.nmods; j++) json_array_append_new(t, json_string(p->lora.mod[j].path));
  json_object_set_new(o, "lora", json_pack("{s:i, s:f, s:o, s:I}", "rank", p->lora.rank, "alpha", p->lora.alpha,
                                           "targets", t, "numel", (json_int_t)p->lora.numel));
  if (p->lora.nf4) json_object_set_new(json_object_get(o, "lora"), "base_dtype", json_string("nf4"));
  json_object_set_new(o, "base", json_pack("{s:s, s:I, s:s}", "init", base->init, "seed", (json_int_t)base->seed,
                                           "hash", base->hash));
}

fsdp_status ckpt_lora_manifest_read(const void *obj, const char *path, ckpt_info *ci) {
  const json_t *o = obj, *l = json_object_get(o, "lora"), *b = json_object_get(o, "base");
  if (!l) return FSDP_OK;   /* a full job's */
  json_int_t r = 0, numel = 0, seed = 0;
  double alpha = 0;
  json_t *t = NULL;
  const char *init = NULL, *hash = NULL;
  json_error_t jerr;
  if (json_unpack_ex((json_t *)l, &jerr, 0, "{s:I, s:F, s:o, s:I}", "rank", &r, "alpha", &alpha, "targets", &t, "numel",
                     &numel) ||
      json_unpack_ex((json_t *)b, &jerr, 0, "{s:s, s:I, s:s}", "init", &init, "seed", &seed, "hash", &hash) ||
      r < 1 || r > 4096 || numel < 1 || !json_is_array(t) || !json_array_size(t) || strlen(hash) >= CKPT_HASH_MAX)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: its lora and base are not a LoRA checkpoint's (rank, alpha, targets, "
                          "numel; init, seed, hash)", path);
  ci->lora.rank = (int)r;
  ci->lora.alpha = alpha;
  ci->lora.numel = numel;
  const char *bd = json_string_value(json_object_get(l, "base_dtype"));   /* QLoRA's only */
  if (bd && strcmp(bd, "nf4"))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: lora.base_dtype '%s' is not nf4 (the one a manifest names)", path, bd);
  ci->lora.nf4 = bd != NULL;
  size_t i, used = 0;
  json_t *v;
  json_array_foreach(t, i, v) {
    const char *s = json_string_value(v);
    if (!s) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: lora.targets[%zu] is not a module name", path, i);
    used += (size_t)snprintf(ci->lora.targets + used, sizeof ci->lora.targets - used, "%s%s", used ? ", " : "", s);
    if (used >= sizeof ci->lora.targets) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: lora.targets is too long", path);
  }
  snprintf(ci->base.init, sizeof ci->base.init, "%s", init);
  ci->base.seed = (uint64_t)seed;
  snprintf(ci->base.hash, sizeof ci->base.hash, "%s", hash);
  return FSDP_OK;
}

/* ---- checking and loading ---- */

/* P's targets as the manifest lists them. */
static void targets_of(const plan_t *p, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  for (int j = 0; j < p->lora.nmods && used < n; j++)
    used += (size_t)snprintf(buf + used, n - used, "%s%s", j ? ", " : "", p->lora.mod[j].path);
}

fsdp_status ckpt_lora_check(const char *dir, const ckpt_info *ci, const plan_t *p, const ckpt_base *base) {
  const plan_lora *l = &p->lora;
  if (!ci->lora.rank && !l->rank) return FSDP_OK;
  if (!l->rank)
    return fsdp_set_error(FSDP_ERR_INVALID, "the checkpoint in %s (step %d) holds LoRA adapters (rank %d on %s), not a "
                          "model's weights; allowed: resume it with the same [lora], or fsdpctl export --merge it and "
                          "start from the merged folder", dir, ci->step, ci->lora.rank, ci->lora.targets);
  if (!ci->lora.rank)
    return fsdp_set_error(FSDP_ERR_INVALID, "the checkpoint in %s (step %d) holds a full model, not LoRA adapters; "
                          "allowed: resume it without [lora], or point [checkpoint] dir at an empty directory", dir,
                          ci->step);
  char want[JOBSPEC_TEXT_MAX];
  targets_of(p, want, sizeof want);
  if (ci->lora.rank != l->rank || ci->lora.alpha != l->alpha || strcmp(ci->lora.targets, want) ||
      ci->lora.numel != l->numel)
    return fsdp_set_error(FSDP_ERR_INVALID, "the checkpoint in %s (step %d) holds adapters of rank %d, alpha %g on %s; "
                          "this job's [lora] is rank %d, alpha %g on %s; allowed: the checkpoint's [lora]", dir,
                          ci->step, ci->lora.rank, ci->lora.alpha, ci->lora.targets, l->rank, l->alpha, want);
  /* the adapters fit the base as the job computed with it: NF4's dequantization is not the base */
  if (ci->lora.nf4 != l->nf4)
    return fsdp_set_error(FSDP_ERR_INVALID, "the checkpoint in %s (step %d) holds adapters trained over %s; this job's "
                          "base is %s ([lora] base_dtype = %s); allowed: base_dtype = %s, as the checkpoint's", dir,
                          ci->step, ci->lora.nf4 ? "their base quantized to NF4 (QLoRA, [lora] base_dtype = nf4)" :
                          "an unquantized base (bf16 or fp32)", l->nf4 ? "quantized to NF4" : "unquantized",
                          l->nf4 ? "nf4" : jobspec_dtype_kind_name(p->param_dtype),
                          ci->lora.nf4 ? "nf4" : "auto, bf16 or fp32");
  if (base && strcmp(base->hash, ci->base.hash))
    return fsdp_set_error(FSDP_ERR_INVALID, "the checkpoint in %s (step %d) holds adapters of the base %s (hash %s), but "
                          "this job's base %s hashes to %s: it changed or is another model; allowed: the base the "
                          "adapters were trained on", dir, ci->step, ci->base.init, ci->base.hash, base->init,
                          base->hash);
  return FSDP_OK;
}

fsdp_status ckpt_lora_load(const char *dir, const ckpt_info *ci, const plan_t *p, float *param, float *m, float *v,
                           int64_t *opt_step) {
  TRY(ckpt_lora_check(dir, ci, p, NULL));
  if (ci->world < 1 || ci->world > 4096)
    return fsdp_set_error(FSDP_ERR_FORMAT, "the LoRA checkpoint in %s (step %d) lists %d files; allowed: 1..%d", dir,
                          ci->step, ci->world, 4096);
  /* its writers' layout: one file of the whole segment (replicated adapters), or one per rank of a
   * shard group (sharded), each writer's part scattered into the whole */
  plan_t *seg = NULL;
  TRY(plan_lora_segment(p, ci->world, &seg));
  float *shard = ci->world > 1 ? malloc((size_t)seg->shard_total * sizeof *shard) : NULL;
  fsdp_status rc = ci->world == 1 || shard ? FSDP_OK
                   : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a buffer to read the LoRA checkpoint in %s", dir);
  float *dst[CKPT_NSEC] = {param, m, v};
  for (int q = 0; q < ci->world && rc == FSDP_OK; q++) {
    rank_file f = {.fd = -1};
    rc = ckpt_rankfile_open(dir, ci, seg, q, &f);
    for (int s = 0; s < CKPT_NSEC && rc == FSDP_OK; s++) {
      rc = ckpt_rankfile_read_section(&f, s, shard ? shard : dst[s]);
      if (rc == FSDP_OK && shard) plan_lora_scatter(p, ci->world, q, shard, dst[s]);
    }
    if (rc == FSDP_OK && opt_step && q == 0) *opt_step = f.opt_step;
    if (rc == FSDP_OK && opt_step && f.opt_step != *opt_step)
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "the LoRA checkpoint in %s (step %d): its files disagree on the optimizer's "
                          "step (%lld, %lld)", dir, ci->step, (long long)*opt_step, (long long)f.opt_step);
    ckpt_rankfile_close(&f);
  }
  free(shard);
  plan_destroy(&seg);
  return rc;
}

fsdp_status ckpt_lora_plan(const ckpt_info *ci, int batch_size, plan_t **out) {
  jobspec_t spec;
  jobspec_defaults(&spec);
  spec.model = ci->model;
  spec.world_size = 1;
  spec.sharding = SHARD_NONE;
  spec.batch_size = batch_size;
  spec.lora.rank = ci->lora.rank;
  spec.lora.alpha = ci->lora.alpha;
  snprintf(spec.lora.targets, sizeof spec.lora.targets, "%s", ci->lora.targets);
  if (ci->lora.nf4) spec.lora.base_dtype = BASE_NF4;
  snprintf(spec.from, sizeof spec.from, "%s", ci->source);
  TRY(plan_build(&spec, 1, out));
  if ((*out)->lora.numel == ci->lora.numel) return FSDP_OK;
  plan_destroy(out);
  return fsdp_set_error(FSDP_ERR_FORMAT, "the LoRA checkpoint of step %d: its manifest's numel %lld is not that of its "
                        "[lora] (%s)", ci->step, (long long)ci->lora.numel, ci->lora.targets);
}

/* A QLoRA base as its job computed with it (worker/nf4_base.h): WHOLE (P's one-rank layout) with every
 * block's 2-D tensors quantized to NF4 and dequantized to bf16, every other tensor rounded to bf16. */
static fsdp_status nf4_dequantized(const plan_t *p, float *whole) {
  int64_t most = NF4_BLOCK;   /* the largest tensor's elements */
  for (int u = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++)
      if (p->units[u].t[t].numel > most) most = p->units[u].t[t].numel;
  uint8_t *rec = malloc((size_t)nf4_bytes(most / NF4_BLOCK * NF4_BLOCK + NF4_BLOCK));
  uint16_t *h = malloc((size_t)most * sizeof *h);
  fsdp_status rc = rec && h ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the NF4 base's buffers");
  for (int u = 0; u < p->nunits && rc == FSDP_OK; u++)
    for (int t = 0; t < p->units[u].ntensors && rc == FSDP_OK; t++) {
      const plan_tensor *pt = &p->units[u].t[t];
      float *x = whole + p->units[u].shard_base + pt->offset;
      if (u > 0 && pt->ndim == 2) {
        if (nf4_record_write(x, pt->numel, rec) != 0)
          rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot quantize %s to NF4", pt->name);
        else nf4_record_dequantize_bf16(rec, pt->numel, h);
      } else {
        for (int64_t i = 0; i < pt->numel; i++) h[i] = st_f32_to_bf16(x[i]);
      }
      for (int64_t i = 0; rc == FSDP_OK && i < pt->numel; i++) x[i] = st_bf16_to_f32(h[i]);
    }
  free(rec);
  free(h);
  return rc;
}

fsdp_status ckpt_lora_merged(const char *dir, const ckpt_info *ci, int batch_size, plan_t **p, float **whole) {
  *whole = NULL;
  TRY(ckpt_lora_plan(ci, batch_size, p));
  fsdp_status rc = FSDP_OK;
  if (!strcmp(ci->base.init, "random"))
    rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "the LoRA checkpoint in %s (step %d) was trained over a random base "
                        "(init = random, seed %llu), which has no files to merge into; allowed: export the adapters "
                        "(without --merge), or train over a base read from files", dir, ci->step,
                        (unsigned long long)ci->base.seed);
  jobspec_t bs;
  jobspec_defaults(&bs);
  snprintf(bs.init, sizeof bs.init, "%s", ci->base.init);
  ckpt_base now;
  if (rc == FSDP_OK) rc = ckpt_base_of(&bs, &now);
  if (rc == FSDP_OK) rc = ckpt_lora_check(dir, ci, *p, &now);
  size_t n = (size_t)(*p)->shard_total, na = (size_t)(*p)->lora.numel;
  float *w = rc == FSDP_OK ? calloc(n, sizeof *w) : NULL, *ad = w ? calloc(3 * na, sizeof *ad) : NULL;
  if (rc == FSDP_OK && !ad) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the model to merge the adapters into");
  st_model *f = NULL;
  if (rc == FSDP_OK) rc = st_model_open(ci->base.init, &f);
  if (rc == FSDP_OK) rc = st_model_load_shard(f, *p, 0, w);
  st_model_destroy(&f);
  if (rc == FSDP_OK && (*p)->lora.nf4) rc = nf4_dequantized(*p, w);
  if (rc == FSDP_OK) rc = ckpt_lora_load(dir, ci, *p, ad, ad + na, ad + 2 * na, NULL);
  if (rc == FSDP_OK) peft_merge(*p, w, ad);
  free(ad);
  if (rc != FSDP_OK) {
    free(w);
    plan_destroy(p);
    return rc;
  }
  *whole = w;
  return FSDP_OK;
}
