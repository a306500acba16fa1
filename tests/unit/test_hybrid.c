/* test_hybrid — sharding = hybrid across real worker processes (fork + gloo over a file store):
 * full sharding inside groups of G consecutive ranks, each shard's gradient all-reduced across the
 * N/G groups (docs/runtime.md, docs/comm.md).
 *
 * Equivalence: N = 4 as 2 groups of 2 and N = 6 as 3 × 2 compute what 1 rank with batch N·B
 * computes (losses to 1e-5 relative, weights to 2e-6 + 1e-5·|w|: test_runtime's bounds and their
 * reasons; only the order of fp32 sums differs). With bf16 reductions the bound is test_runtime's
 * bf16 one, 1e-3. The validation loss after the last step (runtime_eval) agrees the same way, and
 * a Llama (grouped-query attention) as 2 × 2 agrees with one rank to the same bounds.
 * Volume: the all-gather bytes of a hybrid rank are those of a full job of G ranks (measured on
 * both); the cross-group all-reduce carries the shard's bytes (2·(R−1)/R of it, R = N/G); every
 * kind of bytes, the inter-group part and every memory category's peak equal the plan's.
 * Failure: a rank that dies fails the others in bounded time, whichever communicator they wait on:
 * through the runtime, and directly on a group comm and on a replica comm.
 * Checkpoints: a hybrid job's checkpoint resumes into full sharding and a full job's into hybrid,
 * continuing the loss curve of an uninterrupted run.
 * Bad input: G not dividing N, and hybrid at N = G, are refused with one line.
 * The job, the forked ranks (with their group and replica comms) and the comparisons are
 * tests/unit/rtharness.h, shared with test_runtime.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "comm.h"
#include "comm_hybrid.h"
#include "jobspec.h"
#include "plan.h"
#include "ranks.h"
#include "rtharness.h"
#include "testfiles.h"

/* N = 4 as 2 × 2 and N = 6 as 3 × 2 against N = 1 at N·B = 12, with G = 1 and 2 micro-steps; and
 * the same in bf16 reductions against N = 1 in bf16 (test_runtime's bf16 bound). */
static void test_equivalence(void) {
  for (int accum = 1; accum <= 2; accum++) {
    config ref = {.world = 1, .batch = 12, .accum = accum, .sharding = SHARD_FULL, .prefetch = 1, .die_rank = -1,
                  .timeout_s = 20, .eval_batches = 2};
    result rref[MAXW];
    float *mref = NULL;
    int64_t n = 0;
    CHECK(run(&ref, rref, &mref, &n) == 0);
    for (int world = 4; world <= 6; world += 2) {
      config c = ref;
      c.world = world;
      c.group = 2;
      c.batch = 12 / world;
      result res[MAXW];
      float *m = NULL;
      int64_t nm = 0;
      CHECK(run(&c, res, &m, &nm) == 0);
      CHECK_EQ_INT(n, nm);
      CHECK_EQ_INT(0, g_replicas_differ);
      char what[128];
      snprintf(what, sizeof what, "hybrid N=%d as %d x 2, B=%d, G=%d vs N=1 B=12", world, world / 2, c.batch, accum);
      compare(what, &rref[0], mref, res, world, m, n, RT_LOSS_RTOL, RT_W_ATOL, RT_W_RTOL);
      /* the validation loss: forward only, gathered in the groups, summed over the world */
      for (int r = 0; r < world; r++) CHECK(res[r].val_loss == res[0].val_loss);
      CHECK(rref[0].val_loss > 1.0);   /* it ran: a loss near the chain's, not a zeroed result */
      CHECK_NEAR(rref[0].val_loss, res[0].val_loss, 0, RT_LOSS_RTOL);   /* the same mean, summed in another order */
      free(m);
    }
    printf("losses (N=1, B=12, G=%d): %.6f %.6f %.6f %.6f %.6f; val_loss %.6f\n", accum, rref[0].loss[1], rref[0].loss[2],
           rref[0].loss[3], rref[0].loss[4], rref[0].loss[5], rref[0].val_loss);
    CHECK(rref[0].loss[5] < rref[0].loss[1]);
    free(mref);
  }
  config ref = {.world = 1, .batch = 12, .accum = 2, .sharding = SHARD_FULL, .prefetch = 1, .die_rank = -1,
                .timeout_s = 20, .param_dtype = DTYPE_BF16, .reduce_dtype = DTYPE_BF16};
  result rref[MAXW], res[MAXW];
  CHECK(run(&ref, rref, NULL, NULL) == 0);
  config c = ref;
  c.world = 6, c.group = 3, c.batch = 2;
  CHECK(run(&c, res, NULL, NULL) == 0);
  CHECK_EQ_INT(0, g_replicas_differ);
  compare("hybrid bf16/bf16 N=6 as 2 x 3, B=2, G=2 vs N=1 B=12", &rref[0], NULL, res, 6, NULL, 0, RT_BF16_LOSS_RTOL, 0, 0);

  /* the model does not matter to the sharding: a Llama, N = 4 as 2 x 2 against one rank */
  config lref = {.world = 1, .batch = 12, .accum = 2, .sharding = SHARD_FULL, .prefetch = 1, .die_rank = -1,
                 .timeout_s = 20, .llama = 1};
  float *mref = NULL, *m = NULL;
  int64_t n = 0, nm = 0;
  CHECK(run(&lref, rref, &mref, &n) == 0);
  c = lref;
  c.world = 4, c.group = 2, c.batch = 3;
  CHECK(run(&c, res, &m, &nm) == 0);
  CHECK_EQ_INT(n, nm);
  CHECK_EQ_INT(0, g_replicas_differ);
  compare("hybrid Llama N=4 as 2 x 2, B=3, G=2 vs N=1 B=12", &rref[0], mref, res, 4, m, n, RT_LOSS_RTOL, RT_W_ATOL, RT_W_RTOL);
  CHECK(rref[0].loss[5] < rref[0].loss[1]);
  free(m);
  free(mref);
}

/* Bytes and peak memory equal the plan; the all-gathers are a G-rank full job's; the cross-group
 * all-reduce carries each shard once (2·(R−1)/R of its bytes), plus the world's step scalars. */
static void test_volume_and_memory(void) {
  static const struct { int world, group; dtype_kind pdt, rdt; int accum; } v[] = {
    {4, 2, DTYPE_FP32, DTYPE_FP32, 1}, {4, 2, DTYPE_BF16, DTYPE_BF16, 2}, {6, 2, DTYPE_FP32, DTYPE_FP32, 2},
    {6, 3, DTYPE_BF16, DTYPE_FP32, 1},
  };
  for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
    config c = {.world = v[k].world, .group = v[k].group, .batch = 2, .accum = v[k].accum, .prefetch = 1,
                .die_rank = -1, .timeout_s = 20, .param_dtype = v[k].pdt, .reduce_dtype = v[k].rdt};
    config f = c;   /* the full job of G ranks */
    f.world = c.group, f.group = 0, f.sharding = SHARD_FULL;
    result res[MAXW], rf[MAXW];
    CHECK(run(&c, res, NULL, NULL) == 0);
    CHECK(run(&f, rf, NULL, NULL) == 0);
    plan_t *p = plan_of(&c);
    if (!p) return;
    uint64_t R = (uint64_t)(c.world / c.group), rb = (uint64_t)jobspec_dtype_bytes(c.reduce_dtype), across = 0;
    for (int u = 0; u < p->nunits; u++) across += 2 * (R - 1) * rb * (uint64_t)p->units[u].shard_numel / R;
    uint64_t scalars = 2 * (uint64_t)(c.world - 1) * 4 * PLAN_STEP_SCALARS / (uint64_t)c.world;
    for (int r = 0; r < c.world; r++) {
      CHECK_EQ_INT(rf[0].sent[COLL_ALLGATHER], res[r].sent[COLL_ALLGATHER]);
      CHECK_EQ_INT(rf[0].sent[COLL_REDUCESCATTER], res[r].sent[COLL_REDUCESCATTER]);
      CHECK_EQ_INT(across + scalars, res[r].sent_inter[COLL_ALLREDUCE]);
      CHECK_EQ_INT(across + scalars, res[r].sent[COLL_ALLREDUCE]);
      CHECK_EQ_INT(0, res[r].sent_inter[COLL_ALLGATHER] + res[r].sent_inter[COLL_REDUCESCATTER]);
    }
    expect_plan(p, res, c.world);
    printf("volume hybrid N=%d G=%d %s/%s accum %d: ag %llu (full N=%d: %llu) rs %llu, inter-group ar %llu "
           "(shard %llu + scalars %llu); peak %llu B (= plan)\n", c.world, c.group, jobspec_dtype_kind_name(c.param_dtype),
           jobspec_dtype_kind_name(c.reduce_dtype), c.accum, (unsigned long long)res[0].sent[0], c.group,
           (unsigned long long)rf[0].sent[0], (unsigned long long)res[0].sent[1],
           (unsigned long long)res[0].sent_inter[2], (unsigned long long)across, (unsigned long long)scalars,
           (unsigned long long)res[0].peak_total);
    plan_destroy(&p);
  }
}

/* [lora] with the adapters sharded in groups of 2 over 4 ranks (each block's adapters reduce-scattered
 * in the group, then all-reduced across the groups; the frozen root gathered in parts): the losses
 * are one rank's with the same rows (replicated adapters), and every peak and byte sent is the plan's. */
static void test_lora_sharded(void) {
  config ref = {.world = 1, .batch = 12, .accum = 2, .sharding = SHARD_FULL, .prefetch = 1, .die_rank = -1,
                .timeout_s = 20, .llama = 1, .lora = 4};
  result rref[MAXW], res[MAXW];
  CHECK(run(&ref, rref, NULL, NULL) == 0);
  config c = ref;
  c.world = 4, c.group = 2, c.batch = 3, c.adapters = ADAPTERS_SHARDED;
  CHECK(run(&c, res, NULL, NULL) == 0);
  plan_t *p = plan_of(&c), *p1 = plan_of(&ref);
  if (!p || !p1) return;
  CHECK_EQ_INT(1, p->lora.sharded);
  CHECK_EQ_INT(0, p1->lora.sharded);
  CHECK(p->sent_bytes[COLL_REDUCESCATTER] > 0 && p->sent_inter[COLL_REDUCESCATTER] == 0);
  compare("lora hybrid N=4 as 2 x 2, adapters sharded, vs N=1 B=12 replicated", &rref[0], NULL, res, 4, NULL, 0,
          RT_LOSS_RTOL, 0, 0);
  expect_plan(p, res, c.world);
  printf("lora hybrid N=4 G=2, adapters sharded (Sa %lld of %lld per block): rs %llu, inter-group ar %llu; peak %llu B "
         "(= plan); losses %.6f .. %.6f (N=1: %.6f .. %.6f)\n", (long long)p->lora.a_shard, (long long)p->lora.block_numel,
         (unsigned long long)res[0].sent[COLL_REDUCESCATTER], (unsigned long long)res[0].sent_inter[COLL_ALLREDUCE],
         (unsigned long long)res[0].peak_total, res[0].loss[1], res[0].loss[STEPS], rref[0].loss[1], rref[0].loss[STEPS]);
  plan_destroy(&p);
  plan_destroy(&p1);
}

/* A rank that dies mid-job: every survivor fails its step in bounded time, those of its group (in
 * a gather) and those of the other group (in the cross-group all-reduce or the step's scalars). A
 * survivor blocked on a survivor that already failed sees that peer's exit (its sockets close), so
 * the bound is one timeout plus the margin of test_runtime's dead-rank test. */
static void test_dead_rank(void) {
  for (int die = 0; die < 2; die++) {
    config c = {.world = 4, .group = 2, .batch = 3, .accum = 1, .prefetch = 1, .die_rank = die ? 3 : 0, .die_step = 3,
                .timeout_s = 2};
    result res[MAXW];
    double t = now_s();
    CHECK(run(&c, res, NULL, NULL) == 0);
    double worst = 0;
    for (int r = 0; r < c.world; r++) {
      if (r == c.die_rank) continue;
      CHECK_EQ_INT(3, res[r].failed_step);
      CHECK(res[r].fail_status == FSDP_ERR_TIMEOUT || res[r].fail_status == FSDP_ERR_COMM);
      CHECK(res[r].fail_after_s < c.timeout_s + 3);
      if (res[r].fail_after_s > worst) worst = res[r].fail_after_s;
    }
    printf("dead rank %d of 4 (2 x 2): every survivor failed step 3 within %.2f s (timeout_s %.0f); run %.1f s\n",
           c.die_rank, worst, c.timeout_s, now_s() - t);
  }
}

/* Directly on the sub-communicators: rank 3 of 2 × 2 exits; rank 2 (its group) fails in the group
 * comm, rank 1 (its shard index) in the replica comm, each within the timeout plus a margin. */
typedef struct comm_result {
  int status;
  double after_s;
} comm_result;

static int comm_child(int rank, int world, const char *dir, void *arg) {
  (void)arg;
  char store[512], path[600];
  snprintf(store, sizeof store, "%s/store", dir);
  comm_t *comm = NULL, *g = NULL, *x = NULL;
  comm_hybrid_args a = {.rank = rank, .world = world, .group = 2, .store_dir = store, .prefix = "c/", .timeout_s = 2,
                        .device = -1};
  if (comm_new_gloo(rank, world, store, NULL, "c/", 2, &comm) != FSDP_OK || comm_hybrid_open(comm, &a, &g, &x) != FSDP_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, fsdp_last_error());
    return 3;
  }
  CHECK_EQ_INT(rank % 2, comm_rank(g));
  CHECK_EQ_INT(2, comm_world(g));
  CHECK_EQ_INT(rank / 2, comm_rank(x));
  CHECK_EQ_INT(2, comm_world(x));
  /* both comms work: the group sums its ranks, the replica comm the ranks of one shard index */
  float v = (float)rank;
  CHECK_OK(comm_allreduce(g, &v, 1, COMM_F32, NULL));
  CHECK_EQ_INT(rank / 2 * 4 + 1, (int)v);   /* {0,1} → 1, {2,3} → 5 */
  v = (float)rank;
  CHECK_OK(comm_allreduce(x, &v, 1, COMM_F32, NULL));
  CHECK_EQ_INT(2 * (rank % 2) + 2, (int)v);   /* {0,2} → 2, {1,3} → 4 */
  CHECK_OK(comm_barrier(comm));
  if (rank == 3) _exit(7);
  comm_result res = {0, 0};
  double t = now_s();
  v = 1;
  if (rank == 2) res.status = comm_allreduce(g, &v, 1, COMM_F32, NULL);
  if (rank == 1) res.status = comm_allreduce(x, &v, 1, COMM_F32, NULL);
  res.after_s = now_s() - t;
  snprintf(path, sizeof path, "%s/comm-%d", dir, rank);
  if (write_all(path, &res, sizeof res)) return 4;
  return check_fail_ ? 1 : 0;   /* the failed comms are not torn down: the process exits */
}

static void test_dead_rank_comms(void) {
  ranks_run rr = {.world = 4, .deadline_s = 60, .release_fd = -1};
  ranks_go(&rr, comm_child, NULL);
  char path[600], why[64];
  for (int r = 0; r < 3; r++) {
    if (!WIFEXITED(rr.status[r]) || WEXITSTATUS(rr.status[r]) != 0) {
      fprintf(stderr, "rank %d ended: %s\n", r, ranks_why(&rr, r, why, sizeof why));
      CHECK(0);
    }
  }
  for (int r = 1; r <= 2; r++) {
    comm_result res = {0, 0};
    snprintf(path, sizeof path, "%s/comm-%d", rr.dir, r);
    CHECK(read_all(path, &res, sizeof res) == 0);
    CHECK(res.status == FSDP_ERR_TIMEOUT || res.status == FSDP_ERR_COMM);
    CHECK(res.after_s < 2 + 3);
    printf("dead rank 3: rank %d failed in its %s comm with %s after %.2f s (timeout_s 2)\n", r,
           r == 2 ? "group" : "replica", fsdp_strerror((fsdp_status)res.status), res.after_s);
  }
  ranks_cleanup(&rr);
}

/* Checkpoints: hybrid 4 = 2 × 2 writes step 2 (group 0's shards, a full job of 2 ranks to the
 * checkpoint); full N = 2 resumes it; full N = 2's checkpoint resumes into hybrid 4; and hybrid
 * 2 × 2's resumes into hybrid 6 = 2 × 3 (another group size: the shards are cut anew). All
 * continue the uninterrupted hybrid run's losses (to fp32 order, 1e-5). */
static void test_checkpoints(void) {
  config straight = {.world = 4, .group = 2, .batch = 3, .accum = 1, .prefetch = 1, .die_rank = -1, .timeout_s = 20};
  result rs[MAXW];
  float *ms = NULL;
  int64_t n = 0;
  CHECK(run(&straight, rs, &ms, &n) == 0);
  static const char *const what[] = {"hybrid 2 x 2 -> full N=2", "full N=2 -> hybrid 2 x 2", "hybrid 2 x 2 -> hybrid 2 x 3"};
  for (int dir = 0; dir < 3; dir++) {
    config a = straight, b = straight;
    char ck[] = "/tmp/fsdp-hybrid-ckpt-XXXXXX";
    if (!mkdtemp(ck)) return;
    if (dir == 1) a.world = 2, a.group = 0, a.batch = 6, a.sharding = SHARD_FULL;   /* full → hybrid */
    else if (dir == 0) b.world = 2, b.group = 0, b.batch = 6, b.sharding = SHARD_FULL;   /* hybrid → full */
    else b.world = 6, b.group = 3, b.batch = 2;                              /* hybrid G = 2 → G = 3 */
    snprintf(a.ckdir, sizeof a.ckdir, "%s", ck);
    snprintf(b.ckdir, sizeof b.ckdir, "%s", ck);
    a.last = a.ckpt_at = 2;
    b.restore = 1, b.first = 3;
    result ra[MAXW], rb[MAXW];
    float *mb = NULL;
    int64_t nb = 0;
    CHECK(run(&a, ra, NULL, NULL) == 0);
    ckpt_info ci;
    CHECK_OK(ckpt_read_manifest(ck, 2, &ci));
    CHECK_EQ_INT(2, ci.world);                 /* hybrid: group 0's two files */
    CHECK_EQ_INT(SHARD_FULL, ci.sharding);
    CHECK_EQ_INT(12, ci.rows_per_step);        /* N·B·G of the job that trained it */
    CHECK(run(&b, rb, &mb, &nb) == 0);
    CHECK_EQ_INT(2, rb[0].restored);
    CHECK_EQ_INT(n, nb);
    double maxl = 0, maxw = 0;
    for (int s = 3; s <= STEPS; s++) {
      CHECK_NEAR(rs[0].loss[s], rb[0].loss[s], 0, RT_LOSS_RTOL);   /* resharded: sums in another order */
      double d = fabs(rb[0].loss[s] - rs[0].loss[s]) / rs[0].loss[s];
      if (d > maxl) maxl = d;
    }
    jobspec_t js;
    CHECK_OK(jobspec_parse(RT_JOB, "rtharness.ini", "/tmp", &js));
    int64_t beyond = 0;
    CHECK(mb && ms);
    if (mb && ms) equiv_weights(&js, STEPS, ms, mb, n, RT_W_ATOL, RT_W_RTOL, &maxw, &beyond);   /* equiv.h */
    printf("checkpoint %s: steps 3..5 vs uninterrupted hybrid: max loss rel diff %.2e, max weight abs diff %.2e\n",
           what[dir], maxl, maxw);
    free(mb);
    rm_rf(ck);
  }
  free(ms);
}

/* Bad input: one line each, saying what is wrong and what is allowed. */
static void test_bad_input(void) {
  static const struct { const char *fsdp; const char *says; } bad[] = {
    {"world_size = 6\nsharding = hybrid\nshard_group = 4\n", "does not divide world_size = 6"},
    {"world_size = 4\nsharding = hybrid\nshard_group = 4\n", "is full sharding"},
    {"world_size = 4\nsharding = full\nshard_group = 2\n", "applies to sharding = hybrid only"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    char text[2048];   /* RT_JOB without its world_size line, then the case's [fsdp] keys */
    const char *ws = strstr(RT_JOB, "world_size = 1\n");
    snprintf(text, sizeof text, "%.*s%s%s", (int)(ws - RT_JOB), RT_JOB, ws + strlen("world_size = 1\n"), bad[k].fsdp);
    jobspec_t s;
    fsdp_status rc = jobspec_parse(text, "bad.ini", "/tmp", &s);
    const char *msg = fsdp_last_error();
    CHECK(rc != FSDP_OK);
    CHECK(strstr(msg, bad[k].says) != NULL);
    CHECK(strchr(msg, '\n') == NULL);
    printf("refused: %s\n", msg);
  }
  /* the same through plan_build, for a world given elsewhere (fsdpctl plan --world, --standalone) */
  jobspec_t s;
  CHECK_OK(jobspec_parse(RT_JOB, "ok.ini", "/tmp", &s));
  s.sharding = SHARD_HYBRID;
  s.shard_group = 2;
  plan_t *p = NULL;
  CHECK(plan_build(&s, 3, &p) != FSDP_OK);
  CHECK(strstr(fsdp_last_error(), "does not divide") != NULL);
  CHECK(plan_build(&s, 2, &p) != FSDP_OK);
  CHECK(strstr(fsdp_last_error(), "is full sharding") != NULL);
  s.shard_group = 0;
  CHECK(plan_build(&s, 4, &p) != FSDP_OK);
  CHECK(strstr(fsdp_last_error(), "shard_group is not set") != NULL);
  CHECK(p == NULL);
}

/* One part per ctest test (tests/CMakeLists.txt): equivalence | volume | failure | ckpt (no PART: all). */
int main(int argc, char **argv) {
  if (rt_harness_start(argv)) return 2;
  const char *part = argc > 1 ? argv[1] : "all";
  int all = !strcmp(part, "all");
  if (!all && strcmp(part, "equivalence") && strcmp(part, "volume") && strcmp(part, "failure") && strcmp(part, "ckpt")) {
    fprintf(stderr, "test_hybrid: unknown part '%s'; allowed: equivalence, volume, failure, ckpt, all\n", part);
    return 2;
  }
  test_bad_input();
  if (all || !strcmp(part, "equivalence")) test_equivalence();
  if (all || !strcmp(part, "volume")) {
    test_volume_and_memory();
    test_lora_sharded();
  }
  if (all || !strcmp(part, "failure")) {
    test_dead_rank();
    test_dead_rank_comms();
  }
  if (all || !strcmp(part, "ckpt")) test_checkpoints();
  return check_done();
}
