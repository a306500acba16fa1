/* test_hfdir — a model folder written from whole units: split as transformers splits (a new file when
 * the next tensor would pass the size, a larger tensor alone), read back through the index equal to
 * the units (bf16-rounded), config.json that reads back as the model; an existing folder with files
 * or a link in its place is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "hfconfig.h"
#include "hfdir.h"
#include "st_model.h"
#include "testfiles.h"
#include "tmpdir.h"

static plan_t *planned(int world) {
  plan_t *p = NULL;
  CHECK_OK(plan_of_model((model_config){.arch = ARCH_LLAMA, .pad_token_id = -1, .n_layer = 2, .n_head = 2, .n_kv_head = 1, .n_embd = 8,
                              .ffn_dim = 16, .vocab_size = 40, .seq_len = 8, .norm_eps = 1e-5, .rope_theta = 1e4}, world, &p));
  return p;
}

static void test_folder(void) {
  plan_t *p = planned(1), *p2 = planned(2);
  float *w = malloc(sizeof(float) * (size_t)p->shard_total), *units[3];
  for (int64_t i = 0; i < p->shard_total; i++) w[i] = (float)((i * 13) % 29) / 7.0f - 2.0f;
  for (int u = 0; u < p->nunits; u++) units[u] = w + p->units[u].shard_base;
  /* bf16, 700 bytes a file: embed_tokens and lm_head (640 bytes each) and the blocks' 256-byte
   * projections decide the split; count it as transformers would */
  uint64_t max = 700, used = 0;
  int want = 0, open_file = 0;
  for (int u = 0; u < p->nunits; u++)
    for (int t = 0; t < p->units[u].ntensors; t++) {
      uint64_t size = 2 * (uint64_t)p->units[u].t[t].numel;
      if (size > max) want++;
      else if (!open_file || used + size > max) want++, open_file = 1, used = size;
      else used += size;
    }
  char out[128], path[192];
  snprintf(out, sizeof out, "%s/export", tmp_dir);
  int nfiles = 0;
  hfdir_opts o = {.dtype = DTYPE_BF16, .max_shard = max};
  CHECK_OK(hfdir_write(out, p, units, &o, &nfiles));
  CHECK_EQ_INT(want, nfiles);
  CHECK(nfiles >= 3);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
  float *got = calloc((size_t)p2->shard_total, sizeof(float)), *ref = calloc((size_t)p2->shard_total, sizeof(float));
  float *wb = malloc(sizeof(float) * (size_t)p->shard_total);
  for (int64_t i = 0; i < p->shard_total; i++) wb[i] = st_bf16_to_f32(st_f32_to_bf16(w[i]));
  for (int r = 0; r < 2; r++) {   /* every rank's shard of the folder = the rounded model's */
    CHECK_OK(st_model_check_path(path, p2));
    st_model *m = NULL;
    CHECK_OK(st_model_open(path, &m));
    CHECK_OK(st_model_load_shard(m, p2, r, got));
    st_model_destroy(&m);
    for (int u = 0; u < p2->nunits; u++) {
      int64_t lo = plan_shard_offset(p2, u, r), n = p2->units[u].numel - lo < p2->units[u].shard_numel
                                                        ? p2->units[u].numel - lo : p2->units[u].shard_numel;
      memset(ref + p2->units[u].shard_base, 0, sizeof(float) * (size_t)p2->units[u].shard_numel);
      if (n > 0) memcpy(ref + p2->units[u].shard_base, wb + p->units[u].shard_base + lo, sizeof(float) * (size_t)n);
    }
    CHECK(!memcmp(got, ref, sizeof(float) * (size_t)p2->shard_total));
  }
  hf_config hc;
  snprintf(path, sizeof path, "%s/config.json", out);
  CHECK_OK(hf_config_load(path, &hc));
  CHECK(hc.model.n_layer == 2 && hc.model.n_kv_head == 1 && hc.model.ffn_dim == 16 && !strcmp(hc.dtype, "bfloat16"));
  /* one file when it fits, named as transformers names it */
  snprintf(out, sizeof out, "%s/one", tmp_dir);
  o = (hfdir_opts){.dtype = DTYPE_FP32, .max_shard = HFDIR_MAX_SHARD_DEFAULT};
  CHECK_OK(hfdir_write(out, p, units, &o, &nfiles));
  snprintf(path, sizeof path, "%s/model.safetensors", out);
  CHECK(nfiles == 1 && access(path, R_OK) == 0);
  /* a folder with files in it, and a link where the folder should be */
  CHECK(hfdir_write(out, p, units, &o, &nfiles) == FSDP_ERR_INVALID && strstr(fsdp_last_error(), "is not empty"));
  snprintf(path, sizeof path, "%s/link", tmp_dir);
  CHECK(symlink(out, path) == 0);
  CHECK(hfdir_write(path, p, units, &o, &nfiles) == FSDP_ERR_INVALID && strstr(fsdp_last_error(), "a link"));
  free(w);
  free(wb);
  free(got);
  free(ref);
  plan_destroy(&p);
  plan_destroy(&p2);
}

int main(void) {
  tmpdir_make("test_hfdir");
  test_folder();
  tmpdir_remove();
  return check_done();
}
