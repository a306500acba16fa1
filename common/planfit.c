/* planfit — see planfit.h. */
#include "planfit.h"

#include <string.h>

#include "plan.h"

/* Predicted peak per rank of SPEC with batch B at WORLD ranks; UINT64_MAX if it cannot be planned. */
static uint64_t bytes_at(const jobspec_t *spec, int world, int b) {
  jobspec_t s = *spec;
  s.batch_size = b;
  plan_t *p = NULL;
  if (plan_build(&s, world, &p) != FSDP_OK) return UINT64_MAX;
  uint64_t t = p->mem_total;
  plan_destroy(&p);
  return t;
}

int plan_max_batch(const jobspec_t *spec, int world, uint64_t device_bytes) {
  if (world <= 0) world = spec->world_size;
  if (bytes_at(spec, world, 1) > device_bytes) return 0;
  int lo = 1, hi = PLANFIT_MAX_BATCH;   /* memory grows with the batch: lo fits, find the last that does */
  if (bytes_at(spec, world, hi) <= device_bytes) return hi;
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    if (bytes_at(spec, world, mid) <= device_bytes) lo = mid;
    else hi = mid;
  }
  return lo;
}

static void lever(plan_fit *f, const jobspec_t *s, int world, const char *change) {
  int b = plan_max_batch(s, world, f->device_bytes);
  if (b <= f->batch_size || f->nlevers == PLANFIT_MAX_LEVERS) return;
  plan_lever *l = &f->levers[f->nlevers++];
  snprintf(l->change, sizeof l->change, "%s", change);
  l->batch_size = b;
}

fsdp_status plan_fit_compute(const jobspec_t *spec, int world, uint64_t device_bytes, plan_fit *f) {
  memset(f, 0, sizeof *f);
  if (world <= 0) world = spec->world_size;
  if (!device_bytes) return fsdp_set_error(FSDP_ERR_INVALID, "--fit needs --device-memory BYTES");
  f->device_bytes = device_bytes;
  f->world = world;
  uint64_t one = bytes_at(spec, world, 1);
  if (one == UINT64_MAX) return FSDP_ERR_INVALID;   /* plan_build said why */
  f->batch_size = plan_max_batch(spec, world, device_bytes);
  f->bytes_at_batch = f->batch_size ? bytes_at(spec, world, f->batch_size) : one;
  if (!f->batch_size) f->missing = one - device_bytes;

  jobspec_t s;
  char what[96];
  if (spec->ackpt == ACKPT_NONE) {
    s = *spec;
    s.ackpt = ACKPT_FULL;
    lever(f, &s, world, "activation_checkpointing = full");
  }
  if (spec->sharding != SHARD_FULL) {
    s = *spec;
    s.sharding = SHARD_FULL;
    lever(f, &s, world, "sharding = full");
  }
  if (spec->param_dtype == DTYPE_FP32 || spec->reduce_dtype == DTYPE_FP32) {
    s = *spec;
    s.param_dtype = s.reduce_dtype = DTYPE_BF16;
    lever(f, &s, world, "param_dtype = bf16, reduce_dtype = bf16");
  }
  if (spec->device == DEVICE_CUDA && spec->offload == OFFLOAD_NONE) {
    s = *spec;
    s.offload = OFFLOAD_OPTIMIZER;
    lever(f, &s, world, "offload = optimizer");
  }
  /* hybrid: the shards are shard_group-way whatever the world size; a group twice as large halves them */
  int g2 = 2 * spec->shard_group;
  if (spec->sharding == SHARD_HYBRID && spec->shard_group > 0 && g2 < world && world % g2 == 0) {
    s = *spec;
    s.shard_group = g2;
    snprintf(what, sizeof what, "shard_group = %d", g2);
    lever(f, &s, world, what);
  }
  if (spec->sharding != SHARD_NONE && world * 2 <= 4096) {
    snprintf(what, sizeof what, "world_size = %d", world * 2);
    lever(f, spec, world * 2, what);
  }
  return FSDP_OK;
}

static void human(uint64_t b, char *buf, size_t n) {
  if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
  else snprintf(buf, n, "%.1f MiB", (double)b / (double)(1 << 20));
}

void plan_fit_print(const plan_fit *f, FILE *out) {
  char a[32], b[32], c[32];
  human(f->device_bytes, a, sizeof a);
  human(f->bytes_at_batch, b, sizeof b);
  fprintf(out, "\nFit in %s per rank at world %d\n", a, f->world);
  if (f->batch_size) {
    fprintf(out, "  largest batch_size that fits: %d (predicted peak %s per rank)\n", f->batch_size, b);
  } else {
    human(f->missing, c, sizeof c);
    fprintf(out, "  nothing fits: batch_size 1 needs %s per rank, %s more than the device has\n", b, c);
  }
  if (!f->nlevers) {
    fprintf(out, "  no single change (checkpointing, sharding, dtypes, offload, world size) fits a larger batch\n");
    return;
  }
  fprintf(out, "  a larger batch fits with one change:\n");
  for (int i = 0; i < f->nlevers; i++)
    fprintf(out, "    %-42s batch_size %d\n", f->levers[i].change, f->levers[i].batch_size);
}

json_t *plan_fit_json(const plan_fit *f) {
  json_t *levers = json_array();
  for (int i = 0; i < f->nlevers; i++)
    json_array_append_new(levers, json_pack("{s:s, s:i}", "change", f->levers[i].change, "batch_size",
                                            f->levers[i].batch_size));
  return json_pack("{s:i, s:I, s:i, s:I, s:I, s:o}", "batch_size", f->batch_size, "device_memory",
                   (json_int_t)f->device_bytes, "world", f->world, "bytes", (json_int_t)f->bytes_at_batch,
                   "missing_bytes", (json_int_t)f->missing, "levers", levers);
}
