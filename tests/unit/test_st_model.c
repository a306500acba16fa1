/* test_st_model — a Llama in four shard files with model.safetensors.index.json: every rank's shard
 * equals the one-file load, and each rank opens exactly the files that hold a tensor intersecting its
 * shard (counted); a missing file is refused by the check but not by a rank that never needs it; a
 * bad index is refused. A tied model's weights that also hold lm_head.weight: equal to the embedding,
 * read as the tied model (one file and an index); one element off, refused under a tied job and read
 * untied under a tied config (st_model_untie), for Llama and for GPT-2 and Gemma 3, which have no untied
 * form (refused). An index gets one file's architecture checks (a tied file under an untied job, another
 * architecture's file). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch.h"
#include "check.h"
#include "st_model.h"
#include "testfiles.h"
#include "tmpdir.h"

#define NFILES 4

static plan_t *planned(int world) {
  plan_t *p = NULL;
  CHECK_OK(plan_of_model((model_config){.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 3, .n_head = 4, .n_kv_head = 2, .n_embd = 8,
                              .ffn_dim = 12, .vocab_size = 20, .seq_len = 6, .norm_eps = 1e-5, .rope_theta = 10000}, world, &p));
  return p;
}

/* Tensor K (in plan order, of N) goes to file K·NFILES/N: contiguous groups, as transformers splits. */
static int file_of(int k, int n) { return k * NFILES / n; }

static void write_index(const char *name, const char *bad_file) {
  FILE *f = fopen(path_in(name), "w");
  fprintf(f, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {\"model.norm.weight\": \"%s\"}}\n", bad_file);
  fclose(f);
}

/* The sharded files and the one-file copy of the world-1 buffer W. */
static void write_model(const plan_t *p, const float *w) {
  int n = 0;
  for (int u = 0; u < p->nunits; u++) n += p->units[u].ntensors;
  st_writer *one = NULL, *part[NFILES] = {0};
  CHECK_OK(st_writer_new(path_in("one.safetensors"), &one));
  for (int f = 0; f < NFILES; f++) {
    char name[64];
    snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, NFILES);
    CHECK_OK(st_writer_new(path_in(name), &part[f]));
  }
  FILE *idx = fopen(path_in("model.safetensors.index.json"), "w");
  fprintf(idx, "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {");
  for (int u = 0, k = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++, k++) {
      const plan_tensor *pt = &p->units[u].t[t];
      const float *data = w + p->units[u].shard_base + pt->offset;
      CHECK_OK(st_writer_add(one, pt->name, "F32", pt->shape, pt->ndim, data));
      CHECK_OK(st_writer_add(part[file_of(k, n)], pt->name, "BF16", pt->shape, pt->ndim, data));
      fprintf(idx, "%s\"%s\": \"model-%05d-of-%05d.safetensors\"", k ? ", " : "", pt->name, file_of(k, n) + 1, NFILES);
    }
  fprintf(idx, "}}\n");
  fclose(idx);
  CHECK_OK(st_writer_finish(&one));
  for (int f = 0; f < NFILES; f++) CHECK_OK(st_writer_finish(&part[f]));
}

/* The files a rank of P needs: those holding a tensor that intersects its shard of any unit. */
static int files_needed(const plan_t *p, int rank, int *need) {
  int n = 0, count = 0;
  for (int u = 0; u < p->nunits; u++) n += p->units[u].ntensors;
  memset(need, 0, sizeof(int) * NFILES);
  for (int u = 0, k = 0; u < p->nunits; u++) {
    int64_t lo = plan_shard_offset(p, u, rank), hi = lo + p->units[u].shard_numel;
    for (int t = 0; t < p->units[u].ntensors; t++, k++) {
      const plan_tensor *pt = &p->units[u].t[t];
      if (pt->offset < hi && pt->offset + pt->numel > lo) need[file_of(k, n)] = 1;
    }
  }
  for (int f = 0; f < NFILES; f++) count += need[f];
  return count;
}

static void test_sharded(void) {
  plan_t *p1 = planned(1), *p4 = planned(4);
  float *w = malloc(sizeof(float) * (size_t)p1->shard_total);
  for (int64_t i = 0; i < p1->shard_total; i++) w[i] = st_bf16_to_f32(st_f32_to_bf16((float)((i * 37) % 101) / 17.0f));
  write_model(p1, w);
  st_file *one = NULL;
  CHECK_OK(st_open(path_in("one.safetensors"), &one));
  float *want = malloc(sizeof(float) * (size_t)p4->shard_total), *got = malloc(sizeof(float) * (size_t)p4->shard_total);
  int fewer = 0, need[NFILES];
  for (int r = 0; r < p4->world; r++) {
    st_model *m = NULL;
    CHECK_OK(st_model_open(path_in("model.safetensors.index.json"), &m));
    CHECK_EQ_INT(0, st_model_opened(m));   /* opening the index opens no shard */
    CHECK_EQ_INT(NFILES, st_model_nfiles(m));
    CHECK_OK(st_model_load_shard(m, p4, r, got));
    CHECK_OK(st_load_shard(one, p4, r, want));
    CHECK(!memcmp(got, want, sizeof(float) * (size_t)p4->shard_total));
    int n = files_needed(p4, r, need);
    CHECK_EQ_INT(n, st_model_opened(m));
    fewer += n < NFILES;
    CHECK_OK(st_model_check(m, p4));
    CHECK_EQ_INT(NFILES, st_model_opened(m));
    st_model_destroy(&m);
  }
  CHECK(fewer > 0);   /* the test means something: some rank does without some file */
  /* a missing file: the check refuses it; a rank that never needs it loads */
  int r_without = -1, gone = -1;
  for (int r = 0; r < p4->world && r_without < 0; r++) {
    files_needed(p4, r, need);
    for (int f = 0; f < NFILES && r_without < 0; f++)
      if (!need[f]) r_without = r, gone = f;
  }
  char name[64];
  snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", gone + 1, NFILES);
  CHECK(rename(path_in(name), path_in("aside")) == 0);
  CHECK(st_model_check_path(path_in("model.safetensors.index.json"), p4) == FSDP_ERR_NOTFOUND);
  CHECK(strstr(fsdp_last_error(), name) != NULL);
  st_model *m = NULL;
  CHECK_OK(st_model_open(path_in("model.safetensors.index.json"), &m));
  CHECK_OK(st_model_load_shard(m, p4, r_without, got));
  st_model_destroy(&m);
  /* a rank (or fsdpctl sample) that needs it: the tensor is listed, its file is what is missing */
  int r_with = -1;
  for (int r = 0; r < p4->world && r_with < 0; r++)
    if (files_needed(p4, r, need), need[gone]) r_with = r;
  CHECK(r_with >= 0);
  CHECK_OK(st_model_open(path_in("model.safetensors.index.json"), &m));
  CHECK(st_model_load_shard(m, p4, r_with, got) == FSDP_ERR_IO);
  CHECK(strstr(fsdp_last_error(), "lists tensor") && strstr(fsdp_last_error(), name) &&
        strstr(fsdp_last_error(), "which is missing") && !strstr(fsdp_last_error(), "is not in"));
  st_model_destroy(&m);
  CHECK(rename(path_in("aside"), path_in(name)) == 0);
  /* the one file through st_model: one file, the same values */
  CHECK_OK(st_model_open(path_in("one.safetensors"), &m));
  CHECK_OK(st_model_load_shard(m, p4, 1, got));
  CHECK_OK(st_load_shard(one, p4, 1, want));
  CHECK(!memcmp(got, want, sizeof(float) * (size_t)p4->shard_total) && st_model_nfiles(m) == 1);
  st_model_destroy(&m);
  /* an index missing a tensor, and one that names a file outside its folder */
  write_index("short.safetensors.index.json", "model-00001-of-00004.safetensors");
  CHECK(st_model_check_path(path_in("short.safetensors.index.json"), p4) == FSDP_ERR_NOTFOUND);
  CHECK(strstr(fsdp_last_error(), "model.embed_tokens.weight") && strstr(fsdp_last_error(), "short.safetensors.index.json"));
  write_index("escape.safetensors.index.json", "../x.safetensors");
  CHECK(st_model_open(path_in("escape.safetensors.index.json"), &m) == FSDP_ERR_FORMAT && !m);
  CHECK(strstr(fsdp_last_error(), "'../x.safetensors'") != NULL);
  st_destroy(&one);
  free(w);
  free(want);
  free(got);
  plan_destroy(&p1);
  plan_destroy(&p4);
}

/* P's tensors from the world-1 buffer W in NAME (.safetensors), and with HEAD >= 0 an lm_head.weight
 * that copies the embedding, its element HEAD - 1 one float step up when HEAD > 0;
 * SPLIT: the head in a second file, both listed by NAME.index.json. */
static void write_tied(const char *name, const plan_t *p, const float *w, int head, int split) {
  char file[96], second[96];
  snprintf(file, sizeof file, "%s.safetensors", name);
  snprintf(second, sizeof second, "%s-head.safetensors", name);
  st_writer *a = NULL, *b = NULL;
  CHECK_OK(st_writer_new(path_in(file), &a));
  if (split) CHECK_OK(st_writer_new(path_in(second), &b));
  char idx[112];
  snprintf(idx, sizeof idx, "%s.safetensors.index.json", name);
  FILE *ix = split ? fopen(path_in(idx), "w") : NULL;
  float *h = NULL;   /* the head's values: the writer reads them at finish */
  if (ix) fprintf(ix, "{\"metadata\": {}, \"weight_map\": {");
  for (int u = 0, k = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++, k++) {
      const plan_tensor *pt = &p->units[u].t[t];
      CHECK_OK(st_writer_add(a, pt->name, "F32", pt->shape, pt->ndim, w + p->units[u].shard_base + pt->offset));
      if (ix) fprintf(ix, "%s\"%s\": \"%s\"", k ? ", " : "", pt->name, file);
    }
  if (head >= 0) {
    int u = -1;
    const plan_tensor *e = plan_find_tensor(p, p->model.arch == ARCH_GPT2 ? "wte.weight" : "model.embed_tokens.weight", &u);
    h = malloc(sizeof(float) * (size_t)e->numel);
    memcpy(h, w + p->units[u].shard_base + e->offset, sizeof(float) * (size_t)e->numel);
    if (head > 0) h[head - 1] = nextafterf(h[head - 1], INFINITY);
    CHECK_OK(st_writer_add(split ? b : a, "lm_head.weight", "F32", e->shape, 2, h));
    if (ix) fprintf(ix, ", \"lm_head.weight\": \"%s\"", split ? second : file);
  }
  if (ix) fprintf(ix, "}}\n"), fclose(ix);
  CHECK_OK(st_writer_finish(&a));
  if (split) CHECK_OK(st_writer_finish(&b));
  free(h);
}

/* Every rank of P from PATH (st_model) equals the load of the file without a head, REF; or, with
 * NEEDLE, each is refused with a message holding it. */
static void check_tied(const plan_t *p, const char *path, const char *ref, const char *needle) {
  float *got = malloc(sizeof(float) * (size_t)p->shard_total), *want = malloc(sizeof(float) * (size_t)p->shard_total);
  for (int r = 0; r < p->world; r++) {
    st_model *m = NULL, *o = NULL;
    CHECK_OK(st_model_open(path_in(path), &m));
    CHECK_OK(st_model_open(path_in(ref), &o));
    fsdp_status rc = st_model_load_shard(m, p, r, got);
    if (needle) {
      CHECK(rc == FSDP_ERR_INVALID && strstr(fsdp_last_error(), needle));
      if (!strstr(fsdp_last_error(), needle)) fprintf(stderr, "  %s: got: %s\n", path, fsdp_last_error());
    } else {
      CHECK_OK(rc);
      CHECK_OK(st_model_load_shard(o, p, r, want));
      CHECK(!memcmp(got, want, sizeof(float) * (size_t)p->shard_total));
    }
    st_model_destroy(&m);
    st_model_destroy(&o);
  }
  CHECK(needle ? st_model_check_path(path_in(path), p) == FSDP_ERR_INVALID : st_model_check_path(path_in(path), p) == FSDP_OK);
  free(got);
  free(want);
}

static int untie_of(const char *path, const model_config *m) {
  int untie = -1;
  CHECK_OK(st_model_untie(path_in(path), m, &untie));
  return untie;
}

static void test_tied_head(void) {
  model_config llama = {.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 1, .n_head = 4, .n_kv_head = 2, .n_embd = 8,
                        .ffn_dim = 12, .vocab_size = 20, .seq_len = 6, .norm_eps = 1e-5, .rope_theta = 10000,
                        .tie_embeddings = 1};
  model_config gpt2 = {.arch = ARCH_GPT2, .pad_token_id = -1, .n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 20,
                       .seq_len = 6, .n_positions = 6};
  const arch_desc *g3 = arch_by_name("gemma3");   /* always tied, as GPT-2 */
  model_config gemma3 = {.arch = g3 ? g3->id : ARCH_GPT2, .pad_token_id = -1, .n_layer = 1, .n_head = 2, .n_kv_head = 1,
                         .n_embd = 8, .head_dim = 4, .ffn_dim = 16, .vocab_size = 20, .seq_len = 6, .norm_eps = 1e-6,
                         .rope_theta = 1e6, .sliding_window = 4, .tie_embeddings = 1};
  arch_ext_defaults(&gemma3);
  const model_config *ms[3] = {&llama, &gpt2, &gemma3};
  for (int a = 0; a < (g3 ? 3 : 2); a++) {
    plan_t *p1 = NULL, *p2 = NULL;
    CHECK_OK(plan_of_model(*ms[a], 1, &p1));
    CHECK_OK(plan_of_model(*ms[a], 2, &p2));
    if (!p1 || !p2) return;
    float *w = malloc(sizeof(float) * (size_t)p1->shard_total);
    for (int64_t i = 0; i < p1->shard_total; i++) w[i] = (float)((i * 37) % 101) / 17.0f;
    write_tied("nohead", p1, w, -1, 0);
    write_tied("same", p1, w, 0, 0);
    write_tied("split", p1, w, 0, 1);
    write_tied("off", p1, w, 7, 0);
    write_tied("offsplit", p1, w, 7, 1);
    const char *off = a == 2 ? "holds lm_head.weight different from model.embed_tokens.weight: an untied head, which "
                               "arch = gemma3 does not have"
                      : a ? "an untied head, which arch = gpt2 does not have"
                          : "holds an untied model (lm_head.weight, different from model.embed_tokens.weight)";
    check_tied(p2, "same.safetensors", "nohead.safetensors", NULL);
    check_tied(p2, "split.safetensors.index.json", "nohead.safetensors", NULL);
    check_tied(p2, "off.safetensors", "nohead.safetensors", off);
    check_tied(p2, "offsplit.safetensors.index.json", "nohead.safetensors", off);
    /* a tied config over them: untied only for the different head, and only where there is an untied form */
    CHECK_EQ_INT(0, untie_of("nohead.safetensors", ms[a]));
    CHECK_EQ_INT(0, untie_of("same.safetensors", ms[a]));
    CHECK_EQ_INT(0, untie_of("split.safetensors.index.json", ms[a]));
    CHECK_EQ_INT(!a, untie_of("off.safetensors", ms[a]));   /* GPT-2, Gemma 3: refused by the loader (above) */
    CHECK_EQ_INT(!a, untie_of("offsplit.safetensors.index.json", ms[a]));
    free(w);
    plan_destroy(&p1);
    plan_destroy(&p2);
  }
}

/* An index gets the checks of one file before any tensor is missed: a tied Llama's weights under an
 * untied job (llama_file_check), and a GPT-2's under a Llama job (another architecture), refused alike
 * in one file and through the index. */
static void test_index_arch(void) {
  model_config tied = {.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 1, .n_head = 4, .n_kv_head = 2, .n_embd = 8,
                       .ffn_dim = 12, .vocab_size = 20, .seq_len = 6, .norm_eps = 1e-5, .rope_theta = 10000,
                       .tie_embeddings = 1};
  model_config untied = tied, gpt2 = {.arch = ARCH_GPT2, .pad_token_id = -1, .n_layer = 1, .n_head = 2, .n_embd = 8,
                                      .vocab_size = 20, .seq_len = 6, .n_positions = 6};
  untied.tie_embeddings = 0;
  plan_t *pt = NULL, *pu = NULL, *pg = NULL;
  CHECK_OK(plan_of_model(tied, 1, &pt));
  CHECK_OK(plan_of_model(untied, 2, &pu));
  CHECK_OK(plan_of_model(gpt2, 1, &pg));
  if (!pt || !pu || !pg) return;
  int64_t n = pt->shard_total > pg->shard_total ? pt->shard_total : pg->shard_total;
  float *w = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) w[i] = (float)(i % 13) / 7.0f;
  write_tied("tiedllama", pt, w, -1, 1);
  write_tied("gpt2w", pg, w, -1, 1);
  const char *nohead = "holds no lm_head.weight (a tied model's head is model.embed_tokens.weight); the job has "
                       "tie_word_embeddings = false: set it true";
  const char *other = "holds a GPT-2 model (wte.weight, h.0.…); the job is arch = llama";
  check_tied(pu, "tiedllama.safetensors", "tiedllama.safetensors", nohead);
  check_tied(pu, "tiedllama.safetensors.index.json", "tiedllama.safetensors", nohead);
  check_tied(pu, "gpt2w.safetensors", "gpt2w.safetensors", other);
  check_tied(pu, "gpt2w.safetensors.index.json", "gpt2w.safetensors", other);
  free(w);
  plan_destroy(&pt);
  plan_destroy(&pu);
  plan_destroy(&pg);
}

int main(void) {
  tmpdir_make("test_st_model");
  test_sharded();
  test_tied_head();
  test_index_arch();
  tmpdir_remove();
  return check_done();
}
