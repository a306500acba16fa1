/* test_runtime — FSDP across real worker processes (fork + gloo over loopback, file-store rendezvous).
 *
 * Equivalence: N ranks with batch B must compute what 1 rank with batch N·B computes, for sharding
 * full, grad_op and none, with and without gradient accumulation. Tolerances (justified):
 *   - loss: 1e-5 relative. Both sides compute the same per-token losses; only the order of the
 *     fp32 gradient sums differs (a sgemm over N·B rows vs N sgemms plus a reduce-scatter), which
 *     perturbs weights by ~1e-7 relative per step; after 5 steps the loss moves far less than 1e-5.
 *     (The bar is 1e-4: a larger difference is a bug.)
 *   - weights: |Δ| ≤ 2e-6 + 1e-5·|w|. AdamW moves each weight by at most ~lr = 1e-3 per step and
 *     the update m/sqrt(v) is scale-free, so fp32 reassociation in the gradient (relative ~1e-6)
 *     changes a weight by ≲ 1e-9 per step, except where a gradient is near zero and its sign flips
 *     under rounding — there the update can differ by up to ~lr·|g|/eps-level terms, bounded by
 *     the 2e-6 absolute slack for these 5 steps (measured max is printed).
 * The same holds with parameters gathered in bf16; bf16 reductions are checked to 1e-3 (below), and
 * one rank with bf16 parameters is bit-identical to a hand-written mixed-precision reference.
 * Communication volume: the bytes each rank sends per step equal the plan's figure; bf16 halves them.
 * Memory: the peak of every category equals the plan's, to the byte.
 * Ordering: every test runs on the CPU device FSDP_CPU_DEVICE names (ctest: sync and strict), and a
 * removed wait must make the strict device compute wrong losses.
 * Failure: a rank that dies makes the others fail with a timeout error within timeout_s (+ margin).
 * Llama (part "llama"): the same equivalence, checkpointing and volume/memory checks for a Llama with
 * grouped-query attention (n_kv_head = n_head / 2); and N = 2 against N = 1 for a tied Llama with
 * llama3 rope scaling (the root's one embedding tensor gets both ends' gradients on every rank).
 * The job, the forked ranks and the comparisons are tests/unit/rtharness.h, shared with test_hybrid.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "jobspec.h"
#include "model.h"
#include "optim.h"
#include "plan.h"
#include "ranks.h"
#include "rtharness.h"
#include "safetensors.h"
#include "testfiles.h"
#include "tokens.h"

/* N = 2 and 4 against N = 1 at fixed N·B·G, in every sharding mode, G = 1 and 2, for parameters
 * gathered in fp32 and in bf16 (fp32 reductions: the sums are then the same up to fp32 order). */
static void test_equivalence(dtype_kind pdt, int llama) {
  static const shard_mode modes[] = {SHARD_FULL, SHARD_GRAD_OP, SHARD_NONE};
  for (int accum = 1; accum <= 2; accum++) {
    config ref = {.world = 1, .batch = 4, .accum = accum, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
                  .timeout_s = 20, .param_dtype = pdt, .llama = llama};
    result rref[MAXW];
    float *mref = NULL;
    int64_t n = 0;
    CHECK(run(&ref, rref, &mref, &n) == 0);
    for (int mi = 0; mi < 3; mi++) {
      for (int world = 2; world <= 4; world *= 2) {
        config c = ref;
        c.world = world;
        c.batch = 4 / world;
        c.sharding = modes[mi];
        result res[MAXW];
        float *m = NULL;
        int64_t nm = 0;
        CHECK(run(&c, res, &m, &nm) == 0);
        CHECK_EQ_INT(n, nm);
        char what[128];
        snprintf(what, sizeof what, "equivalence %s params %-7s N=%d B=%d G=%d vs N=1 B=4",
                 jobspec_dtype_kind_name(pdt), jobspec_shard_mode_name(c.sharding), world, c.batch, accum);
        compare(what, &rref[0], mref, res, world, m, n, RT_LOSS_RTOL, RT_W_ATOL, RT_W_RTOL);
        free(m);
      }
    }
    printf("losses (%s params, N=1, G=%d): %.6f %.6f %.6f %.6f %.6f\n", jobspec_dtype_kind_name(pdt), accum, rref[0].loss[1],
           rref[0].loss[2], rref[0].loss[3], rref[0].loss[4], rref[0].loss[5]);
    CHECK(rref[0].loss[5] < rref[0].loss[1]);
    free(mref);
  }
}

/* A tied Llama with llama3 rope scaling: N = 2 (full) against N = 1, G = 1, the equivalence tolerances;
 * the plan has no lm_head and the model's Ψ counts embed_tokens once. */
static void test_tied_equivalence(void) {
  config ref = {.world = 1, .batch = 4, .accum = 1, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
                .timeout_s = 20, .llama = 2};
  plan_t *p = plan_of(&ref);
  if (p) {
    CHECK_EQ_INT(2, p->units[0].ntensors);
    CHECK_EQ_INT((int64_t)RT_LLAMA.vocab_size * RT_LLAMA.n_embd + RT_LLAMA.n_embd, p->units[0].numel);
  }
  plan_destroy(&p);
  result rref[MAXW], res[MAXW];
  float *mref = NULL, *m = NULL;
  int64_t n = 0, nm = 0;
  CHECK(run(&ref, rref, &mref, &n) == 0);
  config c = ref;
  c.world = 2, c.batch = 2;
  CHECK(run(&c, res, &m, &nm) == 0);
  CHECK_EQ_INT(n, nm);
  compare("equivalence tied llama3-rope Llama full N=2 B=2 vs N=1 B=4", &rref[0], mref, res, 2, m, nm, 1e-5, 2e-6, 1e-5);
  printf("losses (tied, llama3 rope, N=1): %.6f .. %.6f\n", rref[0].loss[1], rref[0].loss[5]);
  CHECK(rref[0].loss[5] < rref[0].loss[1]);
  free(mref);
  free(m);
}

/* bf16 reductions round every rank's partial sum (and each hop of the ring) to bf16, so N ranks no
 * longer sum the same numbers in the same precision as one rank. The gradient then differs by about
 * bf16's relative precision (2^-8) per element; AdamW's update m/sqrt(v) is scale-free and moves a
 * weight by ~lr per step whatever the rounding, so after 5 steps weights differ by well under lr and
 * the loss by far less than 1e-4 relative (measured: 2.4e-6). */
static void test_bf16_reductions(void) {
  config ref = {.world = 1, .batch = 4, .accum = 2, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
                .timeout_s = 20, .param_dtype = DTYPE_BF16, .reduce_dtype = DTYPE_BF16};
  result rref[MAXW];
  CHECK(run(&ref, rref, NULL, NULL) == 0);
  static const shard_mode modes[] = {SHARD_FULL, SHARD_GRAD_OP, SHARD_NONE};
  for (int mi = 0; mi < 3; mi++) {
    config c = ref;
    c.world = 2;
    c.batch = 2;
    c.sharding = modes[mi];
    result res[MAXW];
    CHECK(run(&c, res, NULL, NULL) == 0);
    char what[128];
    snprintf(what, sizeof what, "bf16 reductions %-7s N=2 B=2 G=2 vs N=1 B=4", jobspec_shard_mode_name(c.sharding));
    compare(what, &rref[0], NULL, res, 2, NULL, 0, 1e-4, 0, 0);   /* bf16 sums: 2.4e-6 measured, 40x room */
  }
}

/* PyTorch FSDP's MixedPrecision(param_dtype=bf16) with fp32 compute, written out by hand on one
 * process: every parameter rounded to bf16 before each forward, the fp32 gradient applied to the
 * fp32 master by AdamW. One rank must match it bit for bit (the same operations in the same order);
 * two ranks to the equivalence tolerance. */
/* The reference, in a child process (OpenMP's threads do not survive a fork, and the ranks are
 * forked from this process later): writes the losses and the final shard to DIR/ref-*. */
static int bf16_reference_child(int rank, int world, const char *dir, void *arg) {
  const config *c1 = arg;
  (void)rank, (void)world;
  jobspec_t s;
  make_spec(c1, &s);
  plan_t *p = NULL;
  device_t *dev = NULL;
  if (plan_build(&s, 1, &p) != FSDP_OK || dev_new_cpu(DEV_CPU_SYNC, &dev) != FSDP_OK) _exit(3);
  const int B = 4, T = p->model.seq_len, BT = B * T;
  int64_t S = p->shard_total;
  float *w = calloc((size_t)S, 4), *wb = calloc((size_t)S, 4), *g = calloc((size_t)S, 4);
  float *m = calloc((size_t)S, 4), *v = calloc((size_t)S, 4);
  void **units = calloc((size_t)p->nunits, sizeof(void *));
  float **dunits = calloc((size_t)p->nunits, sizeof(float *));
  int *inp = calloc((size_t)BT, sizeof(int)), *tgt = calloc((size_t)BT, sizeof(int));
  model_acts *a = model_acts_new(p, dev);
  tok_file *tf = NULL;
  int64_t ntok = 4 * (int64_t)BT;
  if (ntok < (1 << 21)) ntok = 1 << 21;   /* the runtime's synthetic stream length */
  if (tok_open_markov(s.markov_seed, p->model.vocab_size, ntok + 1, &tf) != FSDP_OK) _exit(4);
  tok_set_shuffle(tf, s.shuffle, s.seed);
  model_init_shard(p, s.seed, 0, w);
  for (int u = 0; u < p->nunits; u++) {
    units[u] = wb + p->units[u].shard_base;
    dunits[u] = g + p->units[u].shard_base;
  }
  double loss[STEPS];
  for (int step = 1; step <= STEPS; step++) {
    for (int64_t i = 0; i < S; i++) wb[i] = st_bf16_to_f32(st_f32_to_bf16(w[i]));
    memset(g, 0, (size_t)S * 4);
    if (tok_batch(tf, step - 1, 0, 1, B, T, p->model.vocab_size, inp, tgt) != FSDP_OK) _exit(4);
    float l = 0;
    model_forward_backward(p, a, units, dunits, inp, tgt, 1.0f / (float)BT, &l);
    double sq = 0;
    for (int64_t i = 0; i < S; i++) sq += (double)g[i] * g[i];
    loss[step - 1] = l / (float)BT;
    double clip = optim_clip_scale(sqrt((double)(float)sq), s.grad_clip);
    optim_adamw_shard(p, 0, w, g, m, v, step, optim_lr(&s, step), (const optim_config[]){optim_config_of(&s)},
                      (float)clip);
  }
  char path[512];
  snprintf(path, sizeof path, "%s/ref-loss", dir);
  if (write_all(path, loss, sizeof loss)) _exit(5);
  snprintf(path, sizeof path, "%s/ref-shard", dir);
  if (write_all(path, w, (size_t)S * 4)) _exit(5);
  return 0;
}

static void test_bf16_reference(void) {
  config c1 = {.world = 1, .batch = 4, .accum = 1, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
               .timeout_s = 20, .param_dtype = DTYPE_BF16};
  plan_t *p = plan_of(&c1);
  if (!p) return;
  char path[512];
  ranks_run rr = {.world = 1, .deadline_s = 120, .release_fd = -1};
  CHECK_EQ_INT(0, ranks_go(&rr, bf16_reference_child, &c1));
  const char *dir = rr.dir;
  double loss[STEPS] = {0};
  float *w = calloc((size_t)p->shard_total, 4);
  snprintf(path, sizeof path, "%s/ref-loss", dir);
  CHECK(read_all(path, loss, sizeof loss) == 0);
  snprintf(path, sizeof path, "%s/ref-shard", dir);
  CHECK(read_all(path, w, (size_t)p->shard_total * 4) == 0);
  ranks_cleanup(&rr);
  result r1[MAXW], r2[MAXW];
  float *m1 = NULL, *m2 = NULL;
  int64_t n1 = 0, n2 = 0;
  CHECK(run(&c1, r1, &m1, &n1) == 0);
  config c2 = c1;
  c2.world = 2, c2.batch = 2;
  CHECK(run(&c2, r2, &m2, &n2) == 0);
  int64_t exact = 0, close2 = 0, k = 0;
  for (int u = 0; u < p->nunits && m1 && m2; u++)
    for (int64_t i = 0; i < p->units[u].numel; i++, k++) {
      float ref = w[p->units[u].shard_base + i];
      exact += m1[k] == ref;
      close2 += fabs((double)m2[k] - ref) <= 2e-6 + 1e-5 * fabs(ref);
    }
  for (int st = 0; st < STEPS; st++) {
    CHECK(r1[0].loss[st + 1] == loss[st]);
    CHECK_NEAR(loss[st], r2[0].loss[st + 1], 0, RT_LOSS_RTOL);   /* two ranks: sums in another order */
  }
  CHECK_EQ_INT(k, exact);
  CHECK_EQ_INT(k, close2);
  printf("bf16 reference: %lld/%lld weights bit-identical at N=1, %lld within tolerance at N=2; losses %.6f .. %.6f\n",
         (long long)exact, (long long)k, (long long)close2, loss[0], loss[STEPS - 1]);
  /* bf16 gathers are not a no-op: the fp32 run differs */
  result rf[MAXW];
  config cf = c1;
  cf.param_dtype = DTYPE_FP32;
  CHECK(run(&cf, rf, NULL, NULL) == 0);
  CHECK(rf[0].loss[STEPS] != r1[0].loss[STEPS]);
  free(m1);
  free(m2);
  free(w);
  plan_destroy(&p);
}

/* Forward-only loss of the full model on the validation rows, one process (a child: see above). */
typedef struct eval_ref {
  const config *c;
  const float *model;
} eval_ref;

static int eval_reference_child(int rank, int world, const char *dir, void *arg) {
  const config *c = ((const eval_ref *)arg)->c;
  const float *model = ((const eval_ref *)arg)->model;
  (void)rank, (void)world;
  config c1 = *c;
  c1.world = 1, c1.batch = c->world * c->batch;
  jobspec_t s;
  make_spec(&c1, &s);
  plan_t *p = NULL;
  device_t *dev = NULL;
  if (plan_build(&s, 1, &p) != FSDP_OK || dev_new_cpu(DEV_CPU_SYNC, &dev) != FSDP_OK) _exit(3);
  float *w = calloc((size_t)p->shard_total, 4);
  void **units = calloc((size_t)p->nunits, sizeof(void *));
  int64_t off = 0;
  for (int u = 0; u < p->nunits; u++) {   /* MODEL is the unpadded units back to back */
    memcpy(w + p->units[u].shard_base, model + off, (size_t)p->units[u].numel * 4);
    off += p->units[u].numel;
    units[u] = w + p->units[u].shard_base;
  }
  const int B = c1.batch, T = p->model.seq_len;
  int *inp = calloc((size_t)B * T, sizeof(int)), *tgt = calloc((size_t)B * T, sizeof(int));
  model_acts *a = model_acts_new(p, dev);
  tok_file *tf = NULL;
  int64_t ntok = 4 * (int64_t)B * T;
  if (ntok < (1 << 21)) ntok = 1 << 21;
  if (!a || tok_open_markov(13, p->model.vocab_size, ntok + 1, &tf) != FSDP_OK) _exit(4);
  float sum = 0;
  for (int m = 0; m < c->eval_batches; m++) {
    if (tok_batch(tf, m, 0, 1, B, T, p->model.vocab_size, inp, tgt) != FSDP_OK) _exit(4);
    model_embed_forward(a, p, units[0], inp);
    for (int l = 0; l < p->model.n_layer; l++) model_block_forward(a, p, l, units[1 + l]);
    model_head_forward(a, p, units[0], tgt, &sum);
  }
  double val = sum / ((double)c->eval_batches * B * T);
  char path[512];
  snprintf(path, sizeof path, "%s/ref-val", dir);
  if (write_all(path, &val, sizeof val)) _exit(5);
  return 0;
}

/* runtime_eval: the mean forward-only loss over the first M·N·B validation rows, sharded as in
 * training, equals one process's loss on the same rows with the same (final) weights. M = 20 (the
 * job default) issues more gathers than a training step keeps in flight: each batch's are waited for
 * before the next, so no evaluation fails for its length. */
static void test_eval(void) {
  static const shard_mode modes[] = {SHARD_FULL, SHARD_GRAD_OP, SHARD_NONE, SHARD_FULL};
  static const int batches[] = {3, 3, 3, 20};
  for (int mi = 0; mi < 4; mi++) {
    config c = {.world = 2, .batch = 2, .accum = 1, .prefetch = 1, .sharding = modes[mi], .die_rank = -1,
                .timeout_s = 20, .eval_batches = batches[mi]};
    result res[MAXW];
    float *m = NULL;
    int64_t n = 0;
    CHECK(run(&c, res, &m, &n) == 0);
    if (!m) continue;
    char path[512];
    eval_ref er = {&c, m};
    ranks_run rr = {.world = 1, .deadline_s = 120, .release_fd = -1};
    CHECK_EQ_INT(0, ranks_go(&rr, eval_reference_child, &er));
    double ref = 0;
    snprintf(path, sizeof path, "%s/ref-val", rr.dir);
    CHECK(read_all(path, &ref, sizeof ref) == 0);
    ranks_cleanup(&rr);
    CHECK(res[0].val_loss == res[1].val_loss);
    CHECK_NEAR(ref, res[0].val_loss, 0, RT_LOSS_RTOL);   /* the same mean over ranks, another order */
    printf("eval %-7s N=2, %d batches: val_loss %.7f, one process on the same rows %.7f\n",
           jobspec_shard_mode_name(c.sharding), c.eval_batches, res[0].val_loss, ref);
    free(m);
  }
}

/* An evaluation's spans are resolved before runtime_eval returns: the CUDA device turns its span
 * boundaries into spans at a sync() or timers() (device_cuda.c), and the worker answers a trace pull
 * right after the step and its evaluation, so no boundary may be left for the next step's timers(). */
static void test_eval_spans(void) {
  config c = {.world = 1, .batch = 2, .accum = 1, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
              .timeout_s = 20, .eval_batches = 2, .spans = 1, .first = 1, .last = 1};
  result res[MAXW];
  CHECK(run(&c, res, NULL, NULL) == 0);
  CHECK_EQ_INT(0, res[0].eval_unresolved);
}

/* Run A and B; whether they give bit-identical losses and final weights (checked, and returned). */
static int run_same(const config *a, const config *b, result ra[MAXW], result rb[MAXW]) {
  float *ma = NULL, *mb = NULL;
  int64_t na = 0, nb = 0;
  CHECK(run(a, ra, &ma, &na) == 0);
  CHECK(run(b, rb, &mb, &nb) == 0);
  int same = na == nb && ma && mb && !memcmp(ma, mb, (size_t)na * sizeof(float));
  for (int s = 1; s <= STEPS; s++) same &= ra[0].loss[s] == rb[0].loss[s];
  CHECK(same);
  free(ma);
  free(mb);
  return same;
}

/* Activation checkpointing recomputes each block's forward in its backward with the same operators
 * on the same inputs: losses and weights are bit-identical to no checkpointing, for N = 1, 2, 4 in
 * every mode (with grad_accum 2), and the activations fall to what the plan predicts. */
static void test_ackpt(int llama) {
  static const shard_mode modes[] = {SHARD_FULL, SHARD_GRAD_OP, SHARD_NONE};
  for (int mi = 0; mi < 3; mi++)
    for (int world = 1; world <= 4; world *= 2) {
      config c = {.world = world, .batch = 4 / world, .accum = 2, .prefetch = 1, .sharding = modes[mi],
                  .die_rank = -1, .timeout_s = 20, .llama = llama};
      result r0[MAXW], r1[MAXW];
      config c1 = c;
      c1.ackpt = ACKPT_FULL;
      int same = run_same(&c, &c1, r0, r1);
      c = c1;
      plan_t *p = plan_of(&c);
      if (p) {
        CHECK_EQ_INT(p->mem[MEM_ACTIVATIONS], r1[0].peak[MEM_ACTIVATIONS]);
        CHECK(r1[0].peak[MEM_ACTIVATIONS] < r0[0].peak[MEM_ACTIVATIONS]);
        printf("checkpointing %-7s N=%d: losses and weights %s; activations %llu B (plan %llu), without %llu B\n",
               jobspec_shard_mode_name(c.sharding), world, same ? "bit-identical" : "DIFFERENT",
               (unsigned long long)r1[0].peak[MEM_ACTIVATIONS],
               (unsigned long long)p->mem[MEM_ACTIVATIONS], (unsigned long long)r0[0].peak[MEM_ACTIVATIONS]);
      }
      plan_destroy(&p);
    }
}

/* offload = optimizer (its host side, on the CPU device): the fp32 master and AdamW state in host
 * memory, AdamW on the host, the device keeping only what the gathers read. The same operations in
 * the same order: bit-identical to no offload, with fp32 and bf16 parameters; the device's memory
 * by category is the plan's. */
static void test_offload(void) {
  static const shard_mode modes[] = {SHARD_FULL, SHARD_NONE};
  for (int mi = 0; mi < 2; mi++)
    for (int bf = 0; bf < 2; bf++) {
      config c = {.world = 2, .batch = 2, .accum = 2, .prefetch = 1, .sharding = modes[mi], .die_rank = -1,
                  .timeout_s = 20, .param_dtype = bf ? DTYPE_BF16 : DTYPE_FP32};
      result r0[MAXW], r1[MAXW];
      config c1 = c;
      c1.offload = 1;
      int same = run_same(&c, &c1, r0, r1);
      c = c1;
      plan_t *p = plan_of(&c);
      if (p) {
        for (int k = 0; k < MEM_NCAT; k++) CHECK_EQ_INT(p->mem[k], r1[0].peak[k]);
        CHECK_EQ_INT(16 * (uint64_t)p->shard_total, p->host_bytes);
        printf("offload %-7s %s params: %s; device param_shard %llu B, optim_state %llu B (= plan), host %llu B\n",
               jobspec_shard_mode_name(c.sharding), jobspec_dtype_kind_name(c.param_dtype), same ? "bit-identical" : "DIFFERENT",
               (unsigned long long)r1[0].peak[MEM_PARAM_SHARD], (unsigned long long)r1[0].peak[MEM_OPTIM_STATE],
               (unsigned long long)p->host_bytes);
      }
      plan_destroy(&p);
    }
}

/* Bytes sent and peak memory by category equal the plan, in every mode and dtype; bf16 gathers
 * send half the bytes of fp32 ones, bf16 reductions half of fp32 reductions. */
static void test_volume_and_memory(int llama) {
  static const shard_mode modes[] = {SHARD_FULL, SHARD_GRAD_OP, SHARD_NONE};
  static const dtype_kind dts[][2] = {{DTYPE_FP32, DTYPE_FP32}, {DTYPE_BF16, DTYPE_FP32}, {DTYPE_BF16, DTYPE_BF16}};
  /* every mode with prefetch 0 and 2; accumulation (which doubles the gathers and reduce-scatters
   * of full and grad_op, but not none's all-reduce) once per mode; the three dtype pairs */
  for (int mi = 0; mi < 3; mi++) {
    uint64_t sent[3][COLL_NKIND];   /* prefetch 0, G = 1, by dtype pair */
    for (int v = 0; v < 6; v++) {   /* v = 5: activation checkpointing, bf16 parameters, G = 2 */
      int pf = v == 1 ? 2 : 0, accum = v == 2 || v == 5 ? 2 : 1, di = v < 3 ? 0 : v == 5 ? 1 : v - 2;
      config c = {.world = 2, .batch = 2, .accum = accum, .prefetch = pf, .sharding = modes[mi], .die_rank = -1,
                  .timeout_s = 20, .param_dtype = dts[di][0], .reduce_dtype = dts[di][1],
                  .ackpt = v == 5 ? ACKPT_FULL : ACKPT_NONE, .llama = llama};
      result res[MAXW];
      CHECK(run(&c, res, NULL, NULL) == 0);
      plan_t *p = plan_of(&c);
      if (!p) return;
      expect_plan(p, res, c.world);
      printf("volume %-7s %s/%s prefetch %d G=%d: sent ag %llu rs %llu ar %llu (= plan); peak %llu B (= plan)\n",
             jobspec_shard_mode_name(c.sharding), jobspec_dtype_kind_name(c.param_dtype), jobspec_dtype_kind_name(c.reduce_dtype), c.prefetch,
             accum, (unsigned long long)res[0].sent[0], (unsigned long long)res[0].sent[1],
             (unsigned long long)res[0].sent[2], (unsigned long long)res[0].peak_total);
      if (v == 0 || v == 3 || v == 4) memcpy(sent[di], res[0].sent, sizeof sent[di]);
      plan_destroy(&p);
    }
    CHECK_EQ_INT(sent[0][COLL_ALLGATHER], 2 * sent[1][COLL_ALLGATHER]);
    CHECK_EQ_INT(sent[0][COLL_REDUCESCATTER], sent[1][COLL_REDUCESCATTER]);
    CHECK_EQ_INT(sent[1][COLL_REDUCESCATTER], 2 * sent[2][COLL_REDUCESCATTER]);
    /* none all-reduces the gradient, and the 16 bytes of step scalars in fp32 (N = 2: 2·S·(N−1)/N = S) */
    CHECK_EQ_INT(sent[1][COLL_ALLREDUCE] - 16, 2 * (sent[2][COLL_ALLREDUCE] - 16));
  }
}

/* [lora]'s frozen base is held in its own dtype: a bf16 base as its bf16 shard alone (2·S bytes, no
 * fp32 master), an fp32 base as its fp32 shard (4·S); every category's measured peak is the plan's,
 * and the two bases train to the same losses within bf16's rounding of the weights. */
static void test_lora_frozen_base(void) {
  double loss[2] = {0, 0};
  for (int di = 0; di < 2; di++) {
    dtype_kind dt = di ? DTYPE_BF16 : DTYPE_FP32;
    config c = {.world = 2, .batch = 2, .accum = 1, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
                .timeout_s = 20, .param_dtype = dt, .reduce_dtype = DTYPE_FP32, .llama = 1, .lora = 4};
    result res[MAXW];
    CHECK(run(&c, res, NULL, NULL) == 0);
    plan_t *p = plan_of(&c);
    if (!p) return;
    expect_plan(p, res, c.world);
    /* the adapter elements a rank holds: NA replicated, L·Sa sharded (the plan's auto choice) */
    uint64_t base = (uint64_t)jobspec_dtype_bytes(dt) * (uint64_t)p->shard_total, NA = (uint64_t)plan_lora_held(p);
    CHECK_EQ_INT(base + 4 * NA, res[0].peak[MEM_PARAM_SHARD]);
    CHECK_EQ_INT(4 * NA, res[0].peak[MEM_GRAD_SHARD]);
    CHECK_EQ_INT(8 * NA, res[0].peak[MEM_OPTIM_STATE]);
    printf("lora frozen base %s, adapters %s: param_shard peak %llu B = %d·S + 4·%s (= plan)\n",
           jobspec_dtype_kind_name(dt), p->lora.sharded ? "sharded" : "replicated",
           (unsigned long long)res[0].peak[MEM_PARAM_SHARD], jobspec_dtype_bytes(dt), p->lora.sharded ? "L·Sa" : "NA");
    loss[di] = res[0].loss[STEPS];
    plan_destroy(&p);
  }
  /* bf16 weights (2^-8 relative) move a loss of ~4.5 by far less than 1e-2; a lost base would not */
  CHECK_NEAR(loss[0], loss[1], 0, 1e-2);
}

/* [lora] with the adapters sharded and reduce_dtype = bf16 against fp32 (2 ranks, full, an fp32 base so
 * that the reduction is the one rounding apart): every peak and byte is the plan's, the adapters'
 * reduce-scatter sends half the bytes (the plan's G·(W−1)·rb·L·Sa, rb = 2 against 4), and the training
 * is fp32's within what bf16 reductions allow. Each rank's part of a gradient element is rounded to bf16
 * (u = 2^-8) and so is their sum: |g' − g| ≤ 2u·(|g0| + |g1|) per element, so step 1's global norm (the
 * same weights in both runs; the ranks' rows from one Markov chain, ‖gr‖ ≈ ‖g‖) is within 4u·‖g‖, and
 * step 1's loss, computed before any reduction, is bit for bit. After it AdamW's update m/√v of each
 * element is off by at most c·4u of itself (c ≤ 3 over 5 steps at β = 0.9, 0.95: m and √v move
 * together), so to first order a loss is off by at most c·4u of the path the updates moved it:
 * |L's − Ls| ≤ 12u·Σk<s |Lk+1 − Lk|. The control: fp32 with 4 × lr (every update 300% larger) fails it. */
static int lora_reduce_within(const result *a, const result *b, double *worst) {
  double u = 1.0 / 256, path = 0;
  int ok = a->loss[1] == b->loss[1] && fabs(a->gnorm[1] - b->gnorm[1]) <= 4 * u * a->gnorm[1];
  *worst = 0;
  for (int s = 2; s <= STEPS; s++) {
    path += fabs(a->loss[s] - a->loss[s - 1]);
    double bound = 12 * u * path, d = fabs(a->loss[s] - b->loss[s]);
    *worst = fmax(*worst, d / bound);
    ok &= d <= bound;
  }
  return ok;
}

static void test_lora_bf16_reduce(void) {
  result res[3][MAXW];
  plan_t *p[2] = {NULL, NULL};
  for (int k = 0; k < 3; k++) {   /* fp32, bf16, and the control: fp32 at 4 × lr */
    config c = {.world = 2, .batch = 2, .accum = 1, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
                .timeout_s = 20, .param_dtype = DTYPE_FP32, .reduce_dtype = k == 1 ? DTYPE_BF16 : DTYPE_FP32,
                .llama = 1, .lora = 4, .adapters = ADAPTERS_SHARDED, .lr_scale = k == 2 ? 4 : 0};
    CHECK(run(&c, res[k], NULL, NULL) == 0);
    if (k == 2) break;
    if (!(p[k] = plan_of(&c))) goto out;
    CHECK(p[k]->lora.sharded);
    expect_plan(p[k], res[k], c.world);
  }
  uint64_t rs32 = res[0][0].sent[COLL_REDUCESCATTER], rs16 = res[1][0].sent[COLL_REDUCESCATTER];
  CHECK(rs16 > 0);
  CHECK_EQ_INT(rs32, 2 * rs16);
  double w, wc;
  int ok = lora_reduce_within(&res[0][0], &res[1][0], &w);
  int ctl = lora_reduce_within(&res[0][0], &res[2][0], &wc);
  printf("lora sharded, reduce bf16 vs fp32: reduce-scatter %llu B vs %llu B (= plan); step-1 loss %s, gnorm %.7f vs "
         "%.7f; steps 2..%d at most %.2g of the bound; the 4 x lr control %.2g of it (%s)\n",
         (unsigned long long)rs16, (unsigned long long)rs32,
         res[0][0].loss[1] == res[1][0].loss[1] ? "equal" : "DIFFERS",
         res[1][0].gnorm[1], res[0][0].gnorm[1], STEPS, w, wc, ctl ? "PASSES: the bound is too loose" : "fails it");
  CHECK(ok);
  CHECK(!ctl);
out:
  plan_destroy(&p[0]);
  plan_destroy(&p[1]);
}

/* [lora] base_dtype = nf4: the blocks held, gathered and sent as NF4 bytes and dequantized into one
 * bf16 working unit; in every sharding the measured peaks per category and the bytes sent are the
 * plan's (nf4_memory, nf4_allgather), the gathers carry the blocks' NF4 bytes (nf4_padded, a quarter
 * of bf16's and some), and the base is the same whatever the world: 2 ranks full, grad_op or none,
 * 4 hybrid (2 groups of 2) and 1 train to the same losses (the batch of 4 rows split among them).
 * The bf16 base of the same model trains to other losses (the base is quantized), within NF4's
 * error of them. */
static void test_qlora(void) {
  const shard_mode modes[] = {SHARD_FULL, SHARD_HYBRID, SHARD_GRAD_OP, SHARD_NONE};
  double ref[STEPS + 1] = {0};
  for (int mi = 0; mi < 5; mi++) {
    int one = mi == 4, hyb = mi == 1;   /* one rank; hybrid: 2 groups of 2 */
    config c = {.world = one ? 1 : hyb ? 4 : 2, .batch = one ? 4 : hyb ? 1 : 2, .accum = 1, .prefetch = 1,
                .sharding = one ? SHARD_NONE : modes[mi], .group = hyb ? 2 : 0,
                .die_rank = -1, .timeout_s = 20, .param_dtype = DTYPE_BF16, .reduce_dtype = DTYPE_FP32, .llama = 1,
                .lora = 4, .nf4 = 1};
    result res[MAXW];
    CHECK(run(&c, res, NULL, NULL) == 0);
    plan_t *p = plan_of(&c);
    if (!p) return;
    CHECK(p->lora.nf4);
    expect_plan(p, res, c.world);
    if (c.sharding == SHARD_FULL) {   /* each block's NF4 shard twice (N = 2), and its adapters' fp32 shard twice
                                         when sharded; the root is all-reduced in parts, not gathered */
      uint64_t L = (uint64_t)p->model.n_layer, ad = p->lora.sharded ? 2 * L * 4 * (uint64_t)p->lora.a_shard : 0;
      CHECK_EQ_INT(2 * L * (uint64_t)p->lora.nf4_shard + ad, res[0].sent[COLL_ALLGATHER]);
      CHECK(4 * (uint64_t)p->lora.nf4_padded < 2 * 2 * (uint64_t)p->units[1].padded);
    }
    printf("qlora %-7s world %d: nf4 block %lld B (bf16 %lld B), sent ag %llu, peak %llu B (= plan); loss %.7f\n",
           jobspec_shard_mode_name(p->sharding), c.world, (long long)p->lora.nf4_block,
           (long long)(2 * p->units[1].numel), (unsigned long long)res[0].sent[COLL_ALLGATHER],
           (unsigned long long)res[0].peak_total, res[0].loss[STEPS]);
    for (int s = 1; s <= STEPS; s++) {
      if (mi == 0) ref[s] = res[0].loss[s];
      else CHECK_NEAR(res[0].loss[s], ref[s], 0, 1e-5);
    }
    plan_destroy(&p);
  }
  /* the control: the same model with its base in bf16 (not quantized) */
  config b = {.world = 2, .batch = 2, .accum = 1, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
              .timeout_s = 20, .param_dtype = DTYPE_BF16, .reduce_dtype = DTYPE_FP32, .llama = 1, .lora = 4, .nf4 = 2};
  result res[MAXW];
  CHECK(run(&b, res, NULL, NULL) == 0);
  double d = fabs(res[0].loss[STEPS] - ref[STEPS]);
  printf("qlora: step-%d loss over the bf16 base %.7f, over its NF4 quantization %.7f\n", STEPS, res[0].loss[STEPS],
         ref[STEPS]);
  CHECK(d > 1e-4 && d < 5e-2);
}

/* The asynchronous device exists to catch a missing wait: without the wait between each block's
 * gather and its compute, the strict device (collectives run only when waited for) computes on
 * buffers that do not hold the block yet, every time, and the losses are wrong. */
static void test_missing_wait_is_caught(void) {
  config c = {.world = 2, .batch = 2, .accum = 1, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
              .timeout_s = 20};
  result good[MAXW], bad[MAXW];
  CHECK(run(&c, good, NULL, NULL) == 0);
  c.drop_wait = 1;
  CHECK(run(&c, bad, NULL, NULL) == 0);
  double maxd = 0;
  for (int s = 1; s <= STEPS; s++) {
    double d = isfinite(bad[0].loss[s]) ? fabs(bad[0].loss[s] - good[0].loss[s]) / good[0].loss[s] : INFINITY;
    if (d > maxd) maxd = d;
  }
  printf("missing gather wait on the strict device: max loss rel diff %.2e (equivalence tolerance 1e-5)\n", maxd);
  CHECK(maxd > 1e-3);
}

static void test_dead_rank(void) {
  config c = {.world = 2, .batch = 2, .accum = 1, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = 1, .die_step = 3, .timeout_s = 2};
  result res[MAXW];
  double t = now_s();
  CHECK(run(&c, res, NULL, NULL) == 0);
  double took = now_s() - t;
  CHECK_EQ_INT(3, res[0].failed_step);
  CHECK(res[0].fail_status == FSDP_ERR_TIMEOUT || res[0].fail_status == FSDP_ERR_COMM);
  CHECK(res[0].fail_after_s < c.timeout_s + 3);
  printf("dead rank: survivor failed step 3 with %s after %.2f s (timeout_s %.0f); whole run %.1f s\n",
         fsdp_strerror(res[0].fail_status), res[0].fail_after_s, c.timeout_s, took);
}

/* The tolerances of compare() must still catch a real fault. Two are planted into an N = 2 run
 * that is otherwise the equivalence test's (full sharding, G = 2): ranks 0 and 1 holding each
 * other's shard, and every reduce-scatter dropped (each rank keeps its own partial gradient,
 * FSDP_FAULT=drop_reduce_scatter). compare() must report failures for each; they are then taken
 * back from the failure count, since here failing is the expected outcome. */
static void test_planted_faults(int llama) {
  config ref = {.world = 1, .batch = 4, .accum = 2, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1,
                .timeout_s = 20, .llama = llama};
  result rref[MAXW], res[MAXW];
  float *mref = NULL, *m = NULL;
  int64_t n = 0, nm = 0;
  CHECK(run(&ref, rref, &mref, &n) == 0);
  config c = ref;
  c.world = 2;
  c.batch = 2;
  printf("planted faults: the FAILED lines of the next two comparisons are expected\n");
  for (int fault = 0; fault < 2; fault++) {
    c.swap_shards = fault == 0;
    if (fault == 1) setenv("FSDP_FAULT", "drop_reduce_scatter", 1);
    CHECK(run(&c, res, &m, &nm) == 0);
    unsetenv("FSDP_FAULT");
    const char *what = fault == 0 ? "planted fault: shards of ranks 0 and 1 swapped" : "planted fault: reduce-scatter dropped";
    int failed = compare(what, &rref[0], mref, res, 2, m, nm, RT_LOSS_RTOL, RT_W_ATOL, RT_W_RTOL);
    check_fail_ -= failed;
    CHECK(failed > 0);
    free(m);
    m = NULL;
  }
  free(mref);
}

/* One part of the file per ctest test (tests/CMakeLists.txt), so that they run in parallel:
 * test_runtime PART, PART = equivalence | mixed | volume | ordering | ackpt | llama | qlora (no PART: all). */
int main(int argc, char **argv) {
  if (rt_harness_start(argv)) return 2;
  const char *part = argc > 1 ? argv[1] : "all";
  int all = !strcmp(part, "all");
  if (!all && strcmp(part, "equivalence") && strcmp(part, "mixed") && strcmp(part, "volume") && strcmp(part, "ordering") &&
      strcmp(part, "ackpt") && strcmp(part, "llama") && strcmp(part, "qlora")) {
    fprintf(stderr, "test_runtime: unknown part '%s'; allowed: equivalence, mixed, volume, ordering, ackpt, llama, qlora, "
            "all\n",
            part);
    return 2;
  }
  printf("CPU device mode: %s\n", g_mode == DEV_CPU_SYNC ? "sync" : g_mode == DEV_CPU_ASYNC ? "async" : "strict");
  if (all || !strcmp(part, "equivalence")) {
    test_equivalence(DTYPE_FP32, 0);
    test_planted_faults(0);
    test_eval();
    test_eval_spans();
  }
  if (all || !strcmp(part, "mixed")) {
    test_equivalence(DTYPE_BF16, 0);
    test_bf16_reductions();
    test_bf16_reference();
  }
  if (all || !strcmp(part, "volume")) test_volume_and_memory(0);
  if (all || !strcmp(part, "ackpt")) {
    test_ackpt(0);
    test_offload();
  }
  if (all || !strcmp(part, "ordering")) {
    test_missing_wait_is_caught();
    test_dead_rank();
  }
  if (all || !strcmp(part, "llama")) {
    test_equivalence(DTYPE_FP32, 1);
    test_planted_faults(1);
    test_tied_equivalence();
    test_ackpt(1);
    test_volume_and_memory(1);
    test_lora_frozen_base();
    test_lora_bf16_reduce();
  }
  if (all || !strcmp(part, "qlora")) {
    test_qlora();
  }
  return check_done();
}
