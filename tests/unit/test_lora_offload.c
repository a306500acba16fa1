/* test_lora_offload — [lora] with [fsdp] offload = optimizer (docs/memory.md "LoRA"), its host side
 * on the CPU device (the spec's device = cuda check is bypassed, as test_runtime's offload test
 * does): the adapters' fp32 master and AdamW m, v in host memory, their gradient brought down,
 * AdamW on the host, their compute form brought back up; the frozen base untouched.
 *
 * For both adapter layouts (replicated and sharded), 2 ranks, sharding full, a tiny Llama with
 * adapters on every projection, two micro-steps a step:
 *   - the same arithmetic as the device's AdamW (the CPU device runs optim_adamw_shard too, in the
 *     same order): the losses and gradient norms of every step and the trained adapters (the PEFT
 *     file runtime_save_adapters writes) are bit-identical to the job without offload;
 *   - every category's measured peak and the bytes sent are the plan's, and the device no longer
 *     holds the adapters' AdamW state (optim_state 0);
 *   - the bytes the runtime asked the device's alloc_host for are the plan's host_bytes, 16 per
 *     adapter element held (master, m, v, gradient staging).
 * The plan of the same jobs on device = cuda: the adapters' bf16 compute form alone stays on the
 * device (6 bytes an element less 4), AdamW's 8 leave, and host_bytes is 16 per element.
 * A checkpoint of the offloaded job resumes bit-identically; hybrid (2 groups of 2, a bf16 base) is
 * bit-identical too.
 * A planted fault (runtime_test_keep_adapters: the host's update never copied up) must fail the
 * comparison: the device keeps computing with the first adapters, so the losses part from step 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jobspec.h"
#include "plan.h"
#include "rtharness.h"
#include "tmpdir.h"

/* The whole of file PATH (malloc'd, *N bytes), or NULL. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) &&
        fread(buf, 1, (size_t)len, f) != (size_t)len) {
      free(buf);
      buf = NULL;
    }
    *n = (size_t)len;
  }
  fclose(f);
  return buf;
}

/* The adapters two runs wrote are the same bytes (1), differ (0), or could not be read (-1). */
static int same_adapters(const char *a, const char *b) {
  char pa[256], pb[256];
  snprintf(pa, sizeof pa, "%s/adapter_model.safetensors", a);
  snprintf(pb, sizeof pb, "%s/adapter_model.safetensors", b);
  size_t na = 0, nb = 0;
  unsigned char *x = slurp(pa, &na), *y = slurp(pb, &nb);
  int same = !x || !y ? -1 : na == nb && memcmp(x, y, na) == 0;
  free(x);
  free(y);
  return same;
}

/* The losses and gradient norms of every step are the same bits. */
static int same_losses(const result *a, const result *b) {
  for (int s = 1; s <= STEPS; s++)
    if (a->loss[s] != b->loss[s] || a->gnorm[s] != b->gnorm[s]) return 0;
  return 1;
}

static config job(adapters_kind layout, const char *dir) {
  config c = {.world = 2, .batch = 2, .accum = 2, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
              .timeout_s = 20, .param_dtype = DTYPE_FP32, .reduce_dtype = DTYPE_FP32, .llama = 1, .lora = 4,
              .adapters = layout};
  snprintf(c.adapter_dir, sizeof c.adapter_dir, "%s", path_in(dir));
  return c;
}

/* The plan of C on device = cuda: offload's adapter terms against the same job's without it. */
static void check_cuda_plan(const config *c) {
  jobspec_t s;
  make_spec(c, &s);
  s.device = DEVICE_CUDA;
  plan_t *on = NULL, *off = NULL;
  CHECK_OK(plan_build(&s, c->world, &on));
  s.offload = OFFLOAD_NONE;
  CHECK_OK(plan_build(&s, c->world, &off));
  if (!on || !off) goto out;
  uint64_t n = (uint64_t)plan_lora_held(on);
  CHECK_EQ_INT(on->lora.sharded, off->lora.sharded);
  CHECK_EQ_INT(off->mem[MEM_PARAM_SHARD] - 4 * n, on->mem[MEM_PARAM_SHARD]);   /* 6·n → the bf16 form's 2·n */
  CHECK_EQ_INT(8 * n, off->mem[MEM_OPTIM_STATE]);
  CHECK_EQ_INT(0, on->mem[MEM_OPTIM_STATE]);
  CHECK_EQ_INT(off->mem[MEM_GRAD_SHARD], on->mem[MEM_GRAD_SHARD]);
  CHECK_EQ_INT(16 * n, on->host_bytes);
  CHECK_EQ_INT(0, off->host_bytes);
  CHECK_EQ_INT(off->mem_total - 12 * n, on->mem_total);
  printf("  cuda plan: device %llu B without offload, %llu B with (12·%llu less), host %llu B\n",
         (unsigned long long)off->mem_total, (unsigned long long)on->mem_total, (unsigned long long)n,
         (unsigned long long)on->host_bytes);
out:
  plan_destroy(&on);
  plan_destroy(&off);
}

static void test_layout(adapters_kind layout) {
  const char *name = layout == ADAPTERS_SHARDED ? "sharded" : "replicated";
  char d0[32], d1[32], d2[32];
  snprintf(d0, sizeof d0, "%s-device", name);
  snprintf(d1, sizeof d1, "%s-offload", name);
  snprintf(d2, sizeof d2, "%s-fault", name);
  config c0 = job(layout, d0), c1 = job(layout, d1), c2 = job(layout, d2);
  c1.offload = c2.offload = 1;
  c2.keep_adapters = 1;
  result r0[MAXW], r1[MAXW], r2[MAXW];
  CHECK(run(&c0, r0, NULL, NULL) == 0);
  CHECK(run(&c1, r1, NULL, NULL) == 0);
  plan_t *p0 = plan_of(&c0), *p1 = plan_of(&c1);
  if (!p0 || !p1) goto out;
  CHECK_EQ_INT(layout == ADAPTERS_SHARDED, p1->lora.sharded);
  uint64_t n = (uint64_t)plan_lora_held(p1);
  int losses = same_losses(&r0[0], &r1[0]), adapters = same_adapters(c0.adapter_dir, c1.adapter_dir);
  CHECK(losses);
  CHECK_EQ_INT(1, adapters);
  expect_plan(p0, r0, c0.world);
  expect_plan(p1, r1, c1.world);
  CHECK_EQ_INT(8 * n, r0[0].peak[MEM_OPTIM_STATE]);
  CHECK_EQ_INT(0, r1[0].peak[MEM_OPTIM_STATE]);
  CHECK_EQ_INT(16 * n, p1->host_bytes);
  for (int r = 0; r < c1.world; r++) {
    CHECK_EQ_INT(p1->host_bytes, r1[r].host_alloc);
    CHECK_EQ_INT(0, r0[r].host_alloc);
  }
  printf("lora offload, adapters %s (%llu elements a rank): losses %s, adapters %s; optim_state %llu B → %llu B "
         "(= plan), host alloc %llu B (= plan's host_bytes)\n", name, (unsigned long long)n,
         losses ? "bit-identical" : "DIFFERENT", adapters == 1 ? "bit-identical" : "DIFFERENT",
         (unsigned long long)r0[0].peak[MEM_OPTIM_STATE], (unsigned long long)r1[0].peak[MEM_OPTIM_STATE],
         (unsigned long long)r1[0].host_alloc);
  check_cuda_plan(&c1);

  /* a checkpoint after step 2 (the host master and AdamW state read as host memory), resumed by a
   * job with offload: steps 3..5 and the adapters as the uninterrupted job's, bit for bit */
  char d3[32];
  snprintf(d3, sizeof d3, "%s-resumed", name);
  config a = c1, b = job(layout, d3);
  b.offload = 1;
  snprintf(a.ckdir, sizeof a.ckdir, "%s", path_in(name));
  snprintf(b.ckdir, sizeof b.ckdir, "%s", a.ckdir);
  a.adapter_dir[0] = '\0';
  a.last = a.ckpt_at = 2;
  b.restore = 1, b.first = 3;
  result ra[MAXW], rb[MAXW];
  CHECK(run(&a, ra, NULL, NULL) == 0);
  CHECK(run(&b, rb, NULL, NULL) == 0);
  CHECK_EQ_INT(2, rb[0].restored);
  int resumed = 1;
  for (int s = 3; s <= STEPS; s++) resumed &= rb[0].loss[s] == r1[0].loss[s];
  int radapters = same_adapters(c1.adapter_dir, b.adapter_dir);
  CHECK(resumed);
  CHECK_EQ_INT(1, radapters);
  printf("  resumed after step 2 with offload: steps 3..%d %s, adapters %s\n", STEPS,
         resumed ? "bit-identical" : "DIFFERENT", radapters == 1 ? "bit-identical" : "DIFFERENT");

  /* the control: the update never brought up */
  CHECK(run(&c2, r2, NULL, NULL) == 0);
  int flosses = same_losses(&r0[0], &r2[0]), fadapters = same_adapters(c0.adapter_dir, c2.adapter_dir);
  CHECK(r2[0].loss[1] == r0[0].loss[1]);   /* step 1 computes with the first adapters on both */
  CHECK(!flosses);
  CHECK_EQ_INT(0, fadapters);
  printf("  planted fault (the update not copied up): losses %s from step 2 (step %d: %.9f against %.9f), adapters %s\n",
         flosses ? "the same (NOT CAUGHT)" : "differ", STEPS, r2[0].loss[STEPS], r0[0].loss[STEPS],
         fadapters == 0 ? "differ" : "the same (NOT CAUGHT)");
out:
  plan_destroy(&p0);
  plan_destroy(&p1);
}

/* Hybrid sharding, 2 groups of 2, the adapters sharded in each group (their final shards all-reduced
 * across the groups, then updated on the host), over a bf16 base: bit-identical to the same job
 * without offload. */
static void test_hybrid(void) {
  config c0 = job(ADAPTERS_SHARDED, "hybrid-device"), c1 = job(ADAPTERS_SHARDED, "hybrid-offload");
  c0.world = c1.world = 4, c0.group = c1.group = 2, c0.batch = c1.batch = 1;
  c0.param_dtype = c1.param_dtype = DTYPE_BF16;
  c1.offload = 1;
  result r0[MAXW], r1[MAXW];
  CHECK(run(&c0, r0, NULL, NULL) == 0);
  CHECK(run(&c1, r1, NULL, NULL) == 0);
  plan_t *p1 = plan_of(&c1);
  if (!p1) return;
  int losses = same_losses(&r0[0], &r1[0]), adapters = same_adapters(c0.adapter_dir, c1.adapter_dir);
  CHECK(losses);
  CHECK_EQ_INT(1, adapters);
  expect_plan(p1, r1, c1.world);
  for (int r = 0; r < c1.world; r++) CHECK_EQ_INT(p1->host_bytes, r1[r].host_alloc);
  printf("lora offload, hybrid 2 x 2, bf16 base, adapters sharded: losses %s, adapters %s; peaks and host %llu B (= plan)\n",
         losses ? "bit-identical" : "DIFFERENT", adapters == 1 ? "bit-identical" : "DIFFERENT",
         (unsigned long long)p1->host_bytes);
  plan_destroy(&p1);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)compare;   /* rtharness.h's; the comparisons here are bit for bit */
  if (rt_harness_start(argv)) return 2;
  tmpdir_make("test_lora_offload");
  printf("CPU device mode: %s\n", g_mode == DEV_CPU_SYNC ? "sync" : g_mode == DEV_CPU_ASYNC ? "async" : "strict");
  test_layout(ADAPTERS_REPLICATED);
  test_layout(ADAPTERS_SHARDED);
  test_hybrid();
  tmpdir_remove();
  return check_done();
}
