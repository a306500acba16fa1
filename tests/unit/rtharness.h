/* rtharness — what test_runtime and test_hybrid share: one small job trained for STEPS steps by
 * real ranks (ranks.h: forked, gloo over a file store), each rank writing its result and final
 * shard, and the parent reassembling the model and comparing runs.
 *
 * A config says what differs from RT_JOB: the world, batch and accumulation, the sharding (group > 0:
 * hybrid with shard_group = group, the rank opening its group and replica comms as fsdp-worker
 * does), dtypes, prefetch, checkpointing and offload, the model (llama: RT_LLAMA, tied and rope-scaled
 * or not), a rank that dies,
 * the steps run, a checkpoint to write or to restore, an evaluation after the last step, and a
 * removed gather wait (the strict device's test). Every test's config names die_rank (-1: nobody)
 * and prefetch; the rest defaults to RT_JOB's.
 *
 * run() fills res[rank] (losses by step, 1-based), and the model from the shards of the first
 * shard_world ranks; g_replicas_differ counts the ranks whose shard differs from the same shard of
 * group 0 (hybrid: every replica must hold the same bits). compare() checks a run against a
 * reference run; expect_plan() checks every rank's bytes and memory peaks against the plan.
 * Header-only (static): each test owns its copy.
 */
#ifndef FSDP_TEST_RTHARNESS_H
#define FSDP_TEST_RTHARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "comm.h"
#include "comm_hybrid.h"
#include "jobspec.h"
#include "plan.h"
#include "ranks.h"
#include "runtime.h"
#include "testfiles.h"
#include "equiv.h"
#include "trace.h"

#define STEPS 5
#define MAXW 6   /* the most ranks a run has */

static const char *RT_JOB =
    "[job]\nname = rtharness\nsteps = 5\nseed = 7\n"
    "[model]\nn_layer = 3\nn_head = 2\nn_embd = 32\nvocab_size = 96\nseq_len = 16\n"
    "[data]\ntrain = synthetic:markov:11\nbatch_size = 4\ngrad_accum = 1\n"
    "[optim]\nlr = 1e-3\nmin_lr = 1e-4\nwarmup_steps = 2\nschedule = cosine\nweight_decay = 0.1\ngrad_clip = 1.0\n"
    "[fsdp]\nworld_size = 1\nprefetch = 1\ntimeout_s = 20\n";

/* A Llama of the same size, with grouped-query attention (two query heads per kv head). */
static const model_config RT_LLAMA = {.arch = ARCH_LLAMA, .n_layer = 3, .n_head = 4, .n_kv_head = 2, .n_embd = 32,
                                      .ffn_dim = 40, .vocab_size = 96, .seq_len = 16, .norm_eps = 1e-5,
                                      .rope_theta = 10000};

typedef struct result {
  double loss[STEPS + 1], gnorm[STEPS + 1];   /* by step, 1-based */
  uint64_t sent[COLL_NKIND], sent_inter[COLL_NKIND];   /* the last step's */
  uint64_t peak[MEM_NCAT], peak_total;
  double val_loss;                  /* runtime_eval after the last step, when eval_batches > 0 */
  int restored;
  int failed_step, fail_status;     /* failed_step −1: every step ran */
  double fail_after_s;
  int eval_unresolved;              /* spans: span boundaries runtime_eval left unresolved (below) */
  uint64_t host_alloc;              /* bytes the runtime asked the device's alloc_host for (offload's host memory) */
} result;

typedef struct config {
  int world, group, batch, accum;   /* group > 0: sharding hybrid with shard_group = group */
  shard_mode sharding;              /* when group = 0 */
  int prefetch;
  dtype_kind param_dtype, reduce_dtype;
  ackpt_mode ackpt;
  int offload;                      /* offload = optimizer, on the CPU device (the host side of it) */
  int llama;                        /* RT_JOB's model replaced by RT_LLAMA; 2: tied, with llama3 rope scaling */
  int die_rank, die_step;           /* -1: nobody dies */
  double timeout_s;
  int drop_wait;                    /* runtime_test_drop_gather_wait, on the strict device */
  int first, last;                  /* steps run (0, 0: 1..STEPS) */
  int restore, ckpt_at;             /* restore from ckdir first; checkpoint after step ckpt_at */
  int eval_batches;                 /* > 0: runtime_eval after the last step (val = synthetic:markov:13) */
  int spans;                        /* record spans, the device resolving them as CUDA's does (below) */
  int swap_shards;                  /* a planted fault: ranks 0 and 1's shards placed in each other's place */
  int lora;                         /* > 0: [lora] rank = lora on every projection (Llama), the base frozen;
                                       no shard is written (a bf16 base has no fp32 one) */
  adapters_kind adapters;           /* [lora] adapters (0: auto) */
  char adapter_dir[128];            /* with lora: the trained adapters written there (runtime_save_adapters) */
  int keep_adapters;                /* a planted fault: runtime_test_keep_adapters (offload's update not brought up) */
  int nf4;                          /* with lora: RT_LLAMA at widths of 64 and [lora] base_dtype = nf4
                                       (param_dtype bf16); 2: the same widths, base_dtype = bf16 */
  double lr_scale;                  /* > 0: RT_JOB's lr and min_lr times it */
  char ckdir[128];
} config;

/* config.spans: the device's ops wrapped so that they count span boundaries (dev_ops.trace) not yet
 * followed by a sync() or timers(), which is when the CUDA device turns its timing events into spans
 * (device_cuda.c): a boundary still pending when the runtime returns is a span a trace pull between
 * steps cannot see yet. */
static dev_ops g_span_ops;
static const dev_ops *g_span_inner;
static int g_span_pending;
static void span_trace(device_t *d, trace_t *t, int end, trace_kind k, int unit, int step) {
  g_span_pending++;
  g_span_inner->trace(d, t, end, k, unit, step);
}
static fsdp_status span_sync(device_t *d) {
  g_span_pending = 0;
  return g_span_inner->sync(d);
}
static void span_timers(device_t *d, uint64_t us[DEV_NTIMER]) {
  g_span_pending = 0;
  g_span_inner->timers(d, us);
}

/* Every rank's device counts the bytes asked of its alloc_host (result.host_alloc). */
static dev_ops g_host_ops;
static const dev_ops *g_host_inner;
static uint64_t g_host_alloc;
static void *host_count_alloc(device_t *d, size_t bytes) {
  g_host_alloc += bytes;
  return g_host_inner->alloc_host(d, bytes);
}
static fsdp_status count_host(device_t *dev) {
  g_host_inner = dev->op;
  g_host_ops = *dev->op;
  g_host_ops.alloc_host = host_count_alloc;
  dev->op = &g_host_ops;
  return FSDP_OK;
}

/* The CPU device every rank runs on: FSDP_CPU_DEVICE (ctest runs the tests as sync and strict). */
static dev_cpu_mode g_mode;

static void make_spec(const config *c, jobspec_t *s) {
  if (jobspec_parse(RT_JOB, "rtharness.ini", "/tmp", s) != FSDP_OK) {
    fprintf(stderr, "job text: %s\n", fsdp_last_error());
    exit(2);
  }
  if (c->llama) s->model = RT_LLAMA;
  if (c->llama == 2) {   /* head size 8: wavelengths 6.3, 63, 628, 6283 against the edges 100/10 and 100/1:
                            one frequency kept, one interpolated, two divided */
    s->model.tie_embeddings = 1;
    s->model.rope_scaling = ROPE_SCALING_LLAMA3;
    s->model.rope_factor = 8, s->model.rope_low_freq_factor = 1, s->model.rope_high_freq_factor = 10;
    s->model.rope_original_max_pos = 100;
  }
  s->world_size = c->world;
  s->batch_size = c->batch;
  s->grad_accum = c->accum;
  s->prefetch = c->prefetch;
  s->sharding = c->group ? SHARD_HYBRID : c->sharding;
  s->shard_group = c->group;
  s->timeout_s = c->timeout_s;
  s->param_dtype = c->param_dtype;
  s->reduce_dtype = c->reduce_dtype;
  s->ackpt = c->ackpt;
  if (c->offload) s->offload = OFFLOAD_OPTIMIZER;   /* jobspec refuses it on cpu; the runtime runs it */
  snprintf(s->ckpt_dir, sizeof s->ckpt_dir, "%s", c->ckdir);
  if (c->eval_batches) s->val_synthetic = 1, s->val_markov_seed = 13;
  if (c->lr_scale > 0) s->lr *= c->lr_scale, s->min_lr *= c->lr_scale;
  if (c->lora) {
    s->lora.rank = c->lora;
    s->lora.alpha = 2.0 * c->lora;
    snprintf(s->lora.targets, sizeof s->lora.targets, "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
    s->lora.adapters = c->adapters;
  }
  if (c->nf4) {   /* NF4 quantizes rows in blocks of 64 */
    s->model.n_embd = 64, s->model.ffn_dim = 128;
    s->lora.base_dtype = c->nf4 == 1 ? BASE_NF4 : BASE_BF16;
  }
}

/* The plan of C's job on its world (a failed build is a failed check: NULL). */
static plan_t *plan_of(const config *c) {
  jobspec_t spec;
  make_spec(c, &spec);
  plan_t *p = NULL;
  CHECK_OK(plan_build(&spec, c->world, &p));
  return p;
}

/* One rank: the world comm, with hybrid the group and replica comms; train; write the result and
 * the final shard. */
static int child(int rank, int world, const char *dir, void *arg) {
  const config *c = arg;
  (void)world;
  jobspec_t spec;
  make_spec(c, &spec);
  plan_t *plan = NULL;
  comm_t *comm = NULL, *gcomm = NULL, *rcomm = NULL;
  device_t *dev = NULL;
  runtime_t *rt = NULL;
  result res;
  memset(&res, 0, sizeof res);
  res.failed_step = -1;
  char store[512], path[600];
  snprintf(store, sizeof store, "%s/store", dir);
  comm_hybrid_args ha = {.rank = rank, .world = c->world, .group = c->group, .store_dir = store, .prefix = "t/",
                         .timeout_s = c->timeout_s, .device = -1};
  if (plan_build(&spec, c->world, &plan) != FSDP_OK ||
      comm_new_gloo(rank, c->world, store, NULL, "t/", spec.timeout_s, &comm) != FSDP_OK ||
      dev_new_cpu(c->drop_wait ? DEV_CPU_STRICT : g_mode, &dev) != FSDP_OK ||
      count_host(dev) != FSDP_OK || runtime_new(&spec, plan, rank, comm, dev, &rt) != FSDP_OK ||
      (c->group && (comm_hybrid_open(comm, &ha, &gcomm, &rcomm) != FSDP_OK ||
                    runtime_set_groups(rt, gcomm, rcomm) != FSDP_OK))) {
    fprintf(stderr, "rank %d setup: %s\n", rank, fsdp_last_error());
    _exit(3);
  }
  if (c->drop_wait) runtime_test_drop_gather_wait(rt, 1);
  if (c->keep_adapters) runtime_test_keep_adapters(rt, 1);
  trace_t *tr = NULL;
  if (c->spans) {
    if (trace_new(&tr) != FSDP_OK) _exit(3);
    g_span_inner = dev->op;
    g_span_ops = *dev->op;
    g_span_ops.trace = span_trace, g_span_ops.sync = span_sync, g_span_ops.timers = span_timers;
    dev->op = &g_span_ops;
    runtime_set_trace(rt, tr);
  }
  if (c->restore && runtime_restore(rt, c->ckdir, &res.restored) != FSDP_OK) {
    fprintf(stderr, "rank %d restore: %s\n", rank, fsdp_last_error());
    _exit(4);
  }
  int first = c->first ? c->first : 1, last = c->last ? c->last : STEPS;
  for (int s = first; s <= last; s++) {
    if (rank == c->die_rank && s == c->die_step) _exit(7);   /* dies mid-job, without a word */
    rt_report r;
    double t = now_s();
    fsdp_status rc = runtime_step(rt, s, &r);
    if (rc != FSDP_OK) {
      res.failed_step = s;
      res.fail_status = rc;
      res.fail_after_s = now_s() - t;
      fprintf(stderr, "rank %d step %d failed (expected where a rank dies): %s\n", rank, s, fsdp_last_error());
      break;
    }
    res.loss[s] = r.loss;
    res.gnorm[s] = r.grad_norm;
    memcpy(res.sent, r.sent, sizeof res.sent);
    memcpy(res.sent_inter, r.sent_inter, sizeof res.sent_inter);
    memcpy(res.peak, r.peak, sizeof res.peak);
    res.peak_total = r.peak_total;
    ckpt_save_stats st;
    if (s == c->ckpt_at && runtime_checkpoint(rt, c->ckdir, s, &st) != FSDP_OK) {
      fprintf(stderr, "rank %d checkpoint: %s\n", rank, fsdp_last_error());
      _exit(6);
    }
  }
  double eval_ms = 0;
  if (c->eval_batches && res.failed_step < 0 && runtime_eval(rt, c->eval_batches, &res.val_loss, &eval_ms) != FSDP_OK) {
    fprintf(stderr, "rank %d eval: %s\n", rank, fsdp_last_error());
    _exit(6);
  }
  res.eval_unresolved = g_span_pending;
  res.host_alloc = g_host_alloc;
  if (c->adapter_dir[0] && res.failed_step < 0 && runtime_save_adapters(rt, c->adapter_dir) != FSDP_OK) {
    fprintf(stderr, "rank %d save adapters: %s\n", rank, fsdp_last_error());
    _exit(6);
  }
  snprintf(path, sizeof path, "%s/result-%d", dir, rank);
  if (write_all(path, &res, sizeof res)) _exit(4);
  snprintf(path, sizeof path, "%s/shard-%d", dir, rank);
  if (res.failed_step < 0 && !c->lora && write_all(path, runtime_param_shard(rt), (size_t)plan->shard_total * sizeof(float)))
    _exit(5);
  if (res.failed_step < 0) {   /* a failed comm cannot be torn down politely; the process exits */
    runtime_destroy(&rt);
    dev_destroy(&dev);
    comm_destroy(&rcomm);
    comm_destroy(&gcomm);
    comm_destroy(&comm);
  }
  trace_destroy(&tr);
  plan_destroy(&plan);
  return 0;
}

/* Ranks of the last run() whose final shard differs from the same shard in group 0. */
static int g_replicas_differ;

/* Run C; res[rank]; *model (may be NULL) = the whole model (unpadded units back to back) from the
 * shards of ranks 0..shard_world−1. Every rank but die_rank must exit 0 and leave its result, and
 * its shard unless its step failed. */
static int run(const config *c, result res[MAXW], float **model, int64_t *nmodel) {
  ranks_run rr = {.world = c->world, .deadline_s = 180, .release_fd = -1};
  ranks_go(&rr, child, (void *)(uintptr_t)c);
  char path[600], why[64];
  int ok = 1;
  for (int r = 0; r < c->world; r++) {
    int st = rr.status[r];
    if (r != c->die_rank && (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
      fprintf(stderr, "rank %d ended: %s\n", r, ranks_why(&rr, r, why, sizeof why));
      ok = 0;
    }
  }
  jobspec_t spec;
  make_spec(c, &spec);
  plan_t *plan = NULL;
  if (plan_build(&spec, c->world, &plan) != FSDP_OK) return -1;
  int64_t total = 0;
  for (int u = 0; u < plan->nunits; u++) total += plan->units[u].numel;
  size_t sbytes = (size_t)plan->shard_total * sizeof(float);
  float *full = calloc((size_t)total, sizeof(float)), *shards = malloc(sbytes * (size_t)c->world);
  g_replicas_differ = 0;
  for (int r = 0; r < c->world; r++) {
    if (r == c->die_rank) continue;
    snprintf(path, sizeof path, "%s/result-%d", rr.dir, r);
    if (read_all(path, &res[r], sizeof res[r])) {
      ok = 0;
      continue;
    }
    if (res[r].failed_step >= 0 || c->lora) continue;
    float *mine = shards + (size_t)r * plan->shard_total;
    snprintf(path, sizeof path, "%s/shard-%d", rr.dir, r);
    if (read_all(path, mine, sbytes) != 0) {
      ok = 0;
      continue;
    }
    if (r < plan->shard_world) place_shard(plan, c->swap_shards && r < 2 ? 1 - r : r, mine, full);
    else g_replicas_differ += memcmp(mine, shards + (size_t)(r % plan->shard_world) * plan->shard_total, sbytes) != 0;
  }
  free(shards);
  if (model) *model = full, *nmodel = total;
  else free(full);
  plan_destroy(&plan);
  ranks_cleanup(&rr);
  return ok ? 0 : -1;
}

/* The bounds every equivalence comparison of fp32 runs uses (docs/testing.md, "Tolerances"):
 * losses: the same per-token losses summed in another fp32 order, ~1e-7 relative per step;
 * weights: AdamW's scale-free update moves a well-conditioned weight by ~lr × the gradient's
 * relative rounding (~1e-7) per step, far inside 2e-6 + 1e-5·|w| after 5 steps. */
#define RT_LOSS_RTOL 1e-5
#define RT_W_ATOL 2e-6
#define RT_W_RTOL 1e-5
/* bf16 reductions round every partial sum to bf16 (2^-8 relative): the loss moves by ~1e-6 after
 * 5 steps (measured 2.4e-6), 1e-3 leaves room and still catches a lost reduction (~1e-2). */
#define RT_BF16_LOSS_RTOL 1e-3

/* RES (WORLD ranks, model M of N floats or NULL) against the reference REF (model MREF): every
 * rank reports the same losses; each step's loss within LOSS_RTOL and grad norm within
 * 10·LOSS_RTOL of the reference's; the weights as equiv_weights() judges them (equiv.h). Prints
 * WHAT with the worst differences.
 * Returns the number of failed checks. */
static int compare(const char *what, const result *ref, const float *mref, const result *res, int world,
                   const float *m, int64_t n, double loss_rtol, double w_atol, double w_rtol) {
  int failed_before = check_fail_;
  double maxl = 0, maxw = 0;
  for (int s = 1; s <= STEPS; s++) {
    for (int r = 0; r < world; r++) CHECK(res[r].loss[s] == res[0].loss[s]);
    CHECK_NEAR(ref->loss[s], res[0].loss[s], 0, loss_rtol);
    CHECK_NEAR(ref->gnorm[s], res[0].gnorm[s], 0, 10 * loss_rtol);   /* 1e-4 with fp32 */
    double d = fabs(res[0].loss[s] - ref->loss[s]) / fabs(ref->loss[s]);
    if (d > maxl) maxl = d;
  }
  if (m && mref) {
    jobspec_t s;
    if (jobspec_parse(RT_JOB, "rtharness.ini", "/tmp", &s) != FSDP_OK) abort();
    int64_t beyond = 0;
    equiv_weights(&s, STEPS, mref, m, n, w_atol, w_rtol, &maxw, &beyond);
    printf("%s: max loss rel diff %.2e, max weight abs diff %.2e (%lld of %lld beyond %.0e + %.0e|w|)\n", what, maxl,
           maxw, (long long)beyond, (long long)n, w_atol, w_rtol);
  } else {
    printf("%s: max loss rel diff %.2e\n", what, maxl);
  }
  return check_fail_ - failed_before;
}

/* Every rank's bytes sent (all and inter-group, by kind) and memory peaks (by category and in
 * all) are the plan's, to the byte. */
static void expect_plan(const plan_t *p, const result *res, int world) {
  for (int r = 0; r < world; r++) {
    for (int k = 0; k < COLL_NKIND; k++) {
      CHECK_EQ_INT(p->sent_bytes[k], res[r].sent[k]);
      CHECK_EQ_INT(p->sent_inter[k], res[r].sent_inter[k]);
    }
    for (int k = 0; k < MEM_NCAT; k++) {
      if (res[r].peak[k] != p->mem[k])
        fprintf(stderr, "  rank %d %s: measured %llu, plan %llu\n", r, plan_mem_category_name((mem_category)k),
                (unsigned long long)res[r].peak[k], (unsigned long long)p->mem[k]);
      CHECK_EQ_INT(p->mem[k], res[r].peak[k]);
    }
    CHECK_EQ_INT(p->mem_total, res[r].peak_total);
  }
}

/* The start of a test's main(): ranks forked from one thread, no SIGPIPE, the CPU device mode
 * from FSDP_CPU_DEVICE. Returns 0, or 2 (printed) on a bad mode. */
static int rt_harness_start(char **argv) {
  single_threaded_ranks(argv);
  signal(SIGPIPE, SIG_IGN);
  if (dev_cpu_mode_from_env(&g_mode) != FSDP_OK) {
    fprintf(stderr, "%s\n", fsdp_last_error());
    return 2;
  }
  return 0;
}

#endif
