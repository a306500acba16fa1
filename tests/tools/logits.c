/* fsdp_logits — the logits of fsdpd's forward for the integration tests that compare them with
 * transformers (tests/integration/llama_rope.sh); a test tool, not a test.
 *
 *   fsdp_logits JOB.ini TOKENS OUT
 *
 * JOB.ini's model with its [model] init file, one rank, batch 1, on the synchronous CPU device
 * (fp32); TOKENS holds seq_len int32 ids; OUT receives seq_len × vocab_size float64 logits, row by
 * row: the final norm's output of every position times the head (plan_head_slot: lm_head, or the tied
 * embed_tokens), accumulated in double as the sampler's head is (worker/sample.c). Exit 0, or 1 with
 * one line on stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "err.h"
#include "jobspec.h"
#include "model.h"
#include "plan.h"
#include "safetensors.h"

static fsdp_status read_tokens(const char *path, int *ids, int n, int V) {
  FILE *f = fopen(path, "rb");
  if (!f) return fsdp_set_error(FSDP_ERR_IO, "cannot open %s", path);
  size_t got = fread(ids, sizeof(int), (size_t)n, f);
  fclose(f);
  if (got != (size_t)n) return fsdp_set_error(FSDP_ERR_FORMAT, "%s holds fewer than %d int32 tokens", path, n);
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V) return fsdp_set_error(FSDP_ERR_RANGE, "token %d at %d is outside 0..%d", ids[i], i, V - 1);
  return FSDP_OK;
}

static fsdp_status logits(const char *job, const char *tokens, const char *out) {
  jobspec_t s;
  TRY(jobspec_load(job, &s));
  s.batch_size = 1, s.grad_accum = 1, s.world_size = 1, s.sharding = SHARD_FULL, s.device = DEVICE_CPU;
  s.param_dtype = s.reduce_dtype = DTYPE_FP32;
  plan_t *p = NULL;
  TRY(plan_build(&s, 1, &p));
  const int T = p->model.seq_len, C = p->model.n_embd, V = p->model.vocab_size;
  fsdp_status rc = FSDP_OK;
  st_file *f = NULL;
  device_t *dev = NULL;
  model_acts *acts = NULL;
  float *param = malloc((size_t)p->shard_total * sizeof(float)), *h = malloc((size_t)T * C * sizeof(float));
  void **units = calloc((size_t)p->nunits, sizeof(void *));
  int *ids = malloc((size_t)T * sizeof(int));
  double *lg = malloc((size_t)T * V * sizeof(double));
  if (!param || !h || !units || !ids || !lg) rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  if (rc == FSDP_OK) rc = st_open(s.init, &f);
  if (rc == FSDP_OK) rc = st_load_shard(f, p, 0, param);
  if (rc == FSDP_OK) rc = read_tokens(tokens, ids, T, V);
  if (rc == FSDP_OK) rc = dev_new_cpu(DEV_CPU_SYNC, &dev);
  if (rc == FSDP_OK && !(acts = model_acts_new(p, dev))) rc = FSDP_ERR_NOMEM;
  if (rc == FSDP_OK) {
    for (int u = 0; u < p->nunits; u++) units[u] = param + p->units[u].shard_base;
    model_embed_forward(acts, p, units[0], ids);
    for (int l = 0; l < p->model.n_layer; l++) model_block_forward(acts, p, l, units[1 + l]);
    model_head_forward(acts, p, units[0], NULL, NULL);
    rc = dev->op->download(dev, h, model_final_hidden(acts), (size_t)T * C * sizeof(float));
  }
  if (rc == FSDP_OK) {
    const float *head = param + p->units[0].t[plan_head_slot(p)].offset;
    for (int t = 0; t < T; t++)
      for (int v = 0; v < V; v++) {
        double acc = 0;
        for (int c = 0; c < C; c++) acc += (double)h[(size_t)t * C + c] * head[(size_t)v * C + c];
        lg[(size_t)t * V + v] = acc;
      }
    FILE *o = fopen(out, "wb");
    if (!o || fwrite(lg, sizeof(double), (size_t)T * V, o) != (size_t)T * V) rc = fsdp_set_error(FSDP_ERR_IO, "cannot write %s", out);
    if (o && fclose(o) != 0 && rc == FSDP_OK) rc = fsdp_set_error(FSDP_ERR_IO, "cannot write %s", out);
  }
  model_acts_destroy(&acts);
  dev_destroy(&dev);
  st_destroy(&f);
  plan_destroy(&p);
  free(param), free(h), free(units), free(ids), free(lg);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: fsdp_logits JOB.ini TOKENS OUT\n");
    return 2;
  }
  if (logits(argv[1], argv[2], argv[3]) != FSDP_OK) {
    fprintf(stderr, "fsdp_logits: %s\n", fsdp_last_error());
    return 1;
  }
  return 0;
}
