/* test_planfit — `fsdpctl plan --fit` checked against the plan itself: over several models, world
 * sizes, memories and options, the batch it names fits and the next does not; when nothing fits, the
 * missing bytes are exactly the excess at batch 1; each lever it names fits the larger batch it says
 * (and the next does not). */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "jobspec.h"
#include "plan.h"
#include "planfit.h"

static uint64_t total(const jobspec_t *s, int world, int b) {
  jobspec_t t = *s;
  t.batch_size = b;
  plan_t *p = NULL;
  if (plan_build(&t, world, &p) != FSDP_OK) return UINT64_MAX;
  uint64_t x = p->mem_total;
  plan_destroy(&p);
  return x;
}

/* B is the largest batch for S at WORLD in MEM: B fits, B + 1 does not (or B is the maximum). */
static int is_largest(const jobspec_t *s, int world, uint64_t mem, int b) {
  if (b == 0) return total(s, world, 1) > mem;
  return total(s, world, b) <= mem && (b == PLANFIT_MAX_BATCH || total(s, world, b + 1) > mem);
}

/* The spec LEVER describes, applied to S. */
static int apply(const char *lever, jobspec_t *s, int *world) {
  if (!strcmp(lever, "activation_checkpointing = full")) s->ackpt = ACKPT_FULL;
  else if (!strcmp(lever, "sharding = full")) s->sharding = SHARD_FULL;
  else if (!strcmp(lever, "param_dtype = bf16, reduce_dtype = bf16")) s->param_dtype = s->reduce_dtype = DTYPE_BF16;
  else if (!strcmp(lever, "offload = optimizer")) s->offload = OFFLOAD_OPTIMIZER;
  else if (sscanf(lever, "shard_group = %d", &s->shard_group) == 1) return 0;
  else if (sscanf(lever, "world_size = %d", world) != 1) return -1;
  return 0;
}

int main(void) {
  static const model_config models[] = {
    {.n_layer = 2, .n_head = 2, .n_embd = 64, .vocab_size = 256, .seq_len = 64},
    {.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .seq_len = 1024},   /* GPT-2 small */
    {.n_layer = 24, .n_head = 16, .n_embd = 1024, .vocab_size = 50257, .seq_len = 1024},  /* GPT-2 medium */
  };
  static const uint64_t mems[] = {1ull << 20, 64ull << 20, 1ull << 30, 16ull << 30, 80ull << 30, 141ull << 30};
  int checked = 0, levers = 0, none = 0, group_levers = 0;
  for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++)
    for (int variant = 0; variant < 5; variant++)
      for (size_t k = 0; k < sizeof mems / sizeof mems[0]; k++) {
        jobspec_t s;
        jobspec_defaults(&s);
        s.model = models[mi];
        s.world_size = variant == 0 ? 1 : 8;
        s.sharding = variant == 2 ? SHARD_GRAD_OP : variant == 4 ? SHARD_HYBRID : SHARD_FULL;
        if (variant == 4) s.shard_group = 2;   /* 4 groups of 2: shard_group = 4 is a lever */
        s.device = variant == 3 ? DEVICE_CUDA : DEVICE_CPU;
        if (variant == 3) s.param_dtype = s.reduce_dtype = DTYPE_BF16;
        plan_fit f;
        CHECK_OK(plan_fit_compute(&s, 0, mems[k], &f));
        CHECK(is_largest(&s, s.world_size, mems[k], f.batch_size));
        if (f.batch_size == 0) {
          none++;
          CHECK_EQ_INT(total(&s, s.world_size, 1) - mems[k], f.missing);
        } else {
          CHECK_EQ_INT(total(&s, s.world_size, f.batch_size), f.bytes_at_batch);
        }
        for (int i = 0; i < f.nlevers; i++) {
          jobspec_t t = s;
          int world = s.world_size;
          CHECK(apply(f.levers[i].change, &t, &world) == 0);
          CHECK(f.levers[i].batch_size > f.batch_size);
          CHECK(is_largest(&t, world, mems[k], f.levers[i].batch_size));
          levers++;
          group_levers += !strncmp(f.levers[i].change, "shard_group = ", 14);
        }
        checked++;
      }
  printf("%d fit answers checked against the plan (%d with nothing fitting), %d levers\n", checked, none, levers);
  CHECK(none > 0 && levers > 0 && group_levers > 0);   /* hybrid: a larger shard group is offered where it helps */
  plan_fit f;
  jobspec_t s;
  jobspec_defaults(&s);
  CHECK(plan_fit_compute(&s, 1, 0, &f) == FSDP_ERR_INVALID);   /* --fit needs a device memory */
  return check_done();
}
