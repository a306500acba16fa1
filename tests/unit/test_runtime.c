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
 * Communication volume: the bytes each rank sends per step equal the plan's figure.
 * Memory: gathered peak ≤ root + (1 + prefetch)·largest block; total peak within 10% of the plan.
 * Failure: a rank that dies makes the others fail with a timeout error within timeout_s (+ margin).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "testfiles.h"
#include "comm.h"
#include "jobspec.h"
#include "plan.h"
#include "runtime.h"

#define STEPS 5
#define MAXW 4

static const char *JOB =
    "[job]\nname = equiv\nsteps = 5\nseed = 7\n"
    "[model]\nn_layer = 3\nn_head = 2\nn_embd = 32\nvocab_size = 96\nseq_len = 16\n"
    "[data]\ntrain = synthetic:markov:11\nbatch_size = 4\ngrad_accum = 1\n"
    "[optim]\nlr = 1e-3\nmin_lr = 1e-4\nwarmup_steps = 2\nschedule = cosine\nweight_decay = 0.1\ngrad_clip = 1.0\n"
    "[fsdp]\nworld_size = 1\nprefetch = 1\ntimeout_s = 20\n";

typedef struct result {
  double loss[STEPS], gnorm[STEPS];
  uint64_t sent[COLL_NKIND];       /* step STEPS */
  uint64_t peak[MEM_NCAT], peak_total;
  int failed_step;                 /* for the dead-rank test */
  int fail_status;
  double fail_after_s;
} result;

typedef struct config {
  int world, batch, accum, prefetch;
  shard_mode sharding;
  int die_rank, die_step;          /* -1: nobody dies */
  double timeout_s;
} config;

static void make_spec(const config *c, jobspec_t *s) {
  if (jobspec_parse(JOB, "test_runtime.ini", "/tmp", s) != FSDP_OK) {
    fprintf(stderr, "job text: %s\n", fsdp_last_error());
    exit(2);
  }
  s->world_size = c->world;
  s->batch_size = c->batch;
  s->grad_accum = c->accum;
  s->prefetch = c->prefetch;
  s->sharding = c->sharding;
  s->timeout_s = c->timeout_s;
}

/* One rank, in a forked child: train STEPS steps, write the result and the final shard. */
static void child(const config *c, int rank, const char *dir) {
  alarm(120);   /* a hung child dies rather than hanging the test */
  jobspec_t spec;
  make_spec(c, &spec);
  plan_t *plan = NULL;
  comm_t *comm = NULL;
  runtime_t *rt = NULL;
  result res;
  memset(&res, 0, sizeof res);
  res.failed_step = -1;
  char path[512];
  snprintf(path, sizeof path, "%s/store", dir);
  if (plan_build(&spec, c->world, &plan) != FSDP_OK || comm_new_gloo(rank, c->world, path, NULL, "t", spec.timeout_s, &comm) != FSDP_OK ||
      runtime_new(&spec, plan, rank, comm, &rt) != FSDP_OK) {
    fprintf(stderr, "rank %d setup: %s\n", rank, fsdp_last_error());
    _exit(3);
  }
  for (int s = 1; s <= STEPS; s++) {
    if (rank == c->die_rank && s == c->die_step) _exit(7);   /* dies mid-job, without a word */
    rt_report r;
    double t = now_s();
    fsdp_status rc = runtime_step(rt, s, &r);
    if (rc != FSDP_OK) {
      res.failed_step = s;
      res.fail_status = rc;
      res.fail_after_s = now_s() - t;
      fprintf(stderr, "rank %d step %d failed as expected? %s\n", rank, s, fsdp_last_error());
      break;
    }
    res.loss[s - 1] = r.loss;
    res.gnorm[s - 1] = r.grad_norm;
    memcpy(res.sent, r.sent, sizeof res.sent);
    memcpy(res.peak, r.peak, sizeof res.peak);
    res.peak_total = r.peak_total;
  }
  snprintf(path, sizeof path, "%s/result-%d", dir, rank);
  if (write_all(path, &res, sizeof res)) _exit(4);
  snprintf(path, sizeof path, "%s/shard-%d", dir, rank);
  if (res.failed_step < 0 && write_all(path, runtime_param_shard(rt), (size_t)plan->shard_total * sizeof(float))) _exit(5);
  /* A failed comm cannot be torn down politely; the process exits. */
  if (res.failed_step < 0) {
    runtime_destroy(&rt);
    comm_destroy(&comm);
  }
  plan_destroy(&plan);
  _exit(0);
}

/* Run a configuration; fill res[rank] and the full model (unpadded units concatenated) in *model. */
static int run(const config *c, result res[MAXW], float **model, int64_t *nmodel) {
  char dir[] = "/tmp/fsdp-rt-XXXXXX";
  if (!mkdtemp(dir)) return -1;
  char path[512];
  snprintf(path, sizeof path, "%s/store", dir);
  mkdir(path, 0700);
  pid_t pids[MAXW];
  fflush(NULL);
  for (int r = 0; r < c->world; r++) {
    pids[r] = fork();
    if (pids[r] == 0) child(c, r, dir);
  }
  int ok = 1;
  for (int r = 0; r < c->world; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    int expect_death = r == c->die_rank;
    if (!expect_death && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      fprintf(stderr, "rank %d ended with status 0x%x\n", r, st);
      ok = 0;
    }
  }
  jobspec_t spec;
  make_spec(c, &spec);
  plan_t *plan = NULL;
  if (plan_build(&spec, c->world, &plan) != FSDP_OK) return -1;
  int64_t total = 0;
  for (int u = 0; u < plan->nunits; u++) total += plan->units[u].numel;
  float *full = calloc((size_t)total, sizeof(float));
  float *shard = malloc((size_t)plan->shard_total * sizeof(float));
  for (int r = 0; r < c->world; r++) {
    if (r == c->die_rank) continue;
    snprintf(path, sizeof path, "%s/result-%d", dir, r);
    if (read_all(path, &res[r], sizeof res[r])) ok = 0;
    snprintf(path, sizeof path, "%s/shard-%d", dir, r);
    if (model && read_all(path, shard, (size_t)plan->shard_total * sizeof(float)) == 0) place_shard(plan, r, shard, full);
  }
  free(shard);
  if (model) {
    *model = full;
    *nmodel = total;
  } else {
    free(full);
  }
  plan_destroy(&plan);
  rm_rf(dir);
  return ok ? 0 : -1;
}

static void test_equivalence(void) {
  static const shard_mode modes[] = {SHARD_FULL, SHARD_GRAD_OP, SHARD_NONE};
  for (int accum = 1; accum <= 2; accum++) {
    config ref = {.world = 1, .batch = 4, .accum = accum, .prefetch = 1, .sharding = SHARD_FULL, .die_rank = -1, .timeout_s = 20};
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
        double maxl = 0, maxw = 0;
        for (int s = 0; s < STEPS; s++) {
          for (int r = 0; r < world; r++) CHECK(res[r].loss[s] == res[0].loss[s]);   /* every rank reports the same */
          CHECK_NEAR(rref[0].loss[s], res[0].loss[s], 0, 1e-5);
          CHECK_NEAR(rref[0].gnorm[s], res[0].gnorm[s], 0, 1e-4);
          double d = fabs(res[0].loss[s] - rref[0].loss[s]) / fabs(rref[0].loss[s]);
          if (d > maxl) maxl = d;
        }
        int bad = 0;
        for (int64_t i = 0; i < n && m; i++) {
          double d = fabs((double)m[i] - mref[i]);
          if (d > maxw) maxw = d;
          if (d > 2e-6 + 1e-5 * fabs(mref[i])) bad++;
        }
        CHECK_EQ_INT(0, bad);
        printf("equivalence %-7s N=%d B=%d G=%d vs N=1 B=4: max loss rel diff %.2e, max weight abs diff %.2e\n",
               shard_mode_name(c.sharding), world, c.batch, accum, maxl, maxw);
        free(m);
      }
    }
    printf("losses (N=1, G=%d): %.6f %.6f %.6f %.6f %.6f\n", accum, rref[0].loss[0], rref[0].loss[1], rref[0].loss[2],
           rref[0].loss[3], rref[0].loss[4]);
    CHECK(rref[0].loss[4] < rref[0].loss[0]);
    free(mref);
  }
}

static void test_volume_and_memory(void) {
  static const shard_mode modes[] = {SHARD_FULL, SHARD_GRAD_OP, SHARD_NONE};
  /* every mode with prefetch 0 and 2; accumulation (which doubles the gathers and reduce-scatters
   * of full and grad_op, but not none's all-reduce) once per mode */
  for (int mi = 0; mi < 3; mi++)
    for (int v = 0; v < 3; v++) {
      int pf = v == 1 ? 2 : 0, accum = v == 2 ? 2 : 1;
        config c = {.world = 2, .batch = 2, .accum = accum, .prefetch = pf, .sharding = modes[mi], .die_rank = -1, .timeout_s = 20};
        result res[MAXW];
        CHECK(run(&c, res, NULL, NULL) == 0);
        jobspec_t spec;
        make_spec(&c, &spec);
        plan_t *p = NULL;
        CHECK_OK(plan_build(&spec, c.world, &p));
        if (!p) return;
        int64_t pb = 0;
        for (int u = 1; u < p->nunits; u++)
          if (p->units[u].padded > pb) pb = p->units[u].padded;
        for (int r = 0; r < c.world; r++) {
          for (int k = 0; k < COLL_NKIND; k++) CHECK_EQ_INT(p->sent_bytes[k], res[r].sent[k]);
          if (c.sharding == SHARD_FULL)
            CHECK(res[r].peak[MEM_GATHERED] <= 4 * (uint64_t)(p->units[0].padded + (1 + c.prefetch) * pb));
          CHECK_NEAR((double)p->mem_total, (double)res[r].peak_total, 0, 0.10);
          for (int k = 0; k < MEM_NCAT; k++)
            if (res[r].peak[k] != p->mem[k] && r == 0)
              printf("  %s: measured %llu, plan %llu\n", mem_category_name((mem_category)k),
                     (unsigned long long)res[r].peak[k], (unsigned long long)p->mem[k]);
        }
        printf("volume %-7s prefetch %d G=%d: sent ag %llu rs %llu ar %llu (plan %llu %llu %llu); peak %llu B, plan %llu B (%.1f%%)\n",
               shard_mode_name(c.sharding), c.prefetch, accum, (unsigned long long)res[0].sent[0],
               (unsigned long long)res[0].sent[1], (unsigned long long)res[0].sent[2],
               (unsigned long long)p->sent_bytes[0], (unsigned long long)p->sent_bytes[1],
               (unsigned long long)p->sent_bytes[2], (unsigned long long)res[0].peak_total,
               (unsigned long long)p->mem_total, 100.0 * ((double)res[0].peak_total / (double)p->mem_total - 1));
        plan_destroy(&p);
      }
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

int main(void) {
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  signal(SIGPIPE, SIG_IGN);
  test_equivalence();
  test_volume_and_memory();
  test_dead_rank();
  return check_done();
}
