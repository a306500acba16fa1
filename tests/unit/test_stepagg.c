/* test_stepagg — figures of known per-rank values folded per node, sent over the wire, merged as the
 * coordinator does, against the same figures computed directly over all ranks: min, max and the
 * ranks holding them (the lowest rank on a tie), sum, count, the median within STEPAGG_MEDIAN_RTOL,
 * an extra figure only some ranks send, and equal values (exact median).
 */
#include "stepagg.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "steps.h"
#include "wire.h"

#define WORLD 37
#define NFIG (2 * MEM_NCAT + STEPSTATS_NPHASE + COLL_NKIND)

/* Rank r's figure i: spread over a wide range so the histogram has many buckets; rank 5 and rank 30
 * tie on the largest peak_bytes.param_shard, ranks 2 and 11 on the smallest. */
static uint64_t value(uint32_t r, int i) {
  if (i == 0) return r == 5 || r == 30 ? 9000000 : r == 2 || r == 11 ? 1000 : 5000 + r * 7919u % 1000003u;
  return (uint64_t)(i + 1) * 1000 + (r * 2654435761u + (uint32_t)i * 40503u) % 100000u;
}

static void stats(uint32_t r, Fsdp__RankStats *s, uint64_t *v, Fsdp__Figure *ex, Fsdp__Figure **exp) {
  fsdp__rank_stats__init(s);
  for (int i = 0; i < NFIG; i++) v[i] = value(r, i);
  s->rank = r;
  s->n_peak_bytes = s->n_cur_bytes = MEM_NCAT, s->peak_bytes = v, s->cur_bytes = v + MEM_NCAT;
  s->n_phase_us = STEPSTATS_NPHASE, s->phase_us = v + 2 * MEM_NCAT;
  s->n_sent_bytes = COLL_NKIND, s->sent_bytes = v + 2 * MEM_NCAT + STEPSTATS_NPHASE;
  if (r % 3 == 0) {   /* a checkpoint figure from every third rank only */
    fsdp__figure__init(ex);
    ex->name = "ckpt_write_us";
    ex->value = 100 + (r * 37u) % 50u;
    *exp = ex;
    s->n_extra = 1, s->extra = exp;
  }
}

static int cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Figure I of M against the values V of the ranks in RANKS (N of them). */
static void expect_fig(const Fsdp__StepAgg *m, size_t i, const uint64_t *v, const uint32_t *ranks, size_t n) {
  uint64_t mn = v[0], mx = v[0], sum = 0, sorted[WORLD];
  uint32_t mnr = ranks[0], mxr = ranks[0];
  for (size_t k = 0; k < n; k++) {
    if (v[k] < mn || (v[k] == mn && ranks[k] < mnr)) mn = v[k], mnr = ranks[k];
    if (v[k] > mx || (v[k] == mx && ranks[k] < mxr)) mx = v[k], mxr = ranks[k];
    sum += v[k];
    sorted[k] = v[k];
  }
  qsort(sorted, n, sizeof *sorted, cmp);
  double med = (double)sorted[(n - 1) / 2];
  CHECK_EQ_INT(n, m->count[i]);
  CHECK_EQ_INT(mn, m->min[i]);
  CHECK_EQ_INT(mnr, m->min_rank[i]);
  CHECK_EQ_INT(mx, m->max[i]);
  CHECK_EQ_INT(mxr, m->max_rank[i]);
  CHECK_EQ_INT(sum, m->sum[i]);
  CHECK_NEAR(med, (double)m->median[i], 0, STEPAGG_MEDIAN_RTOL);
}

/* K, the steps between every-rank details: every step up to 64 ranks, 100 up to 512, then growing
 * with the world so that the detail's share of the coordinator's work per step stays the same. */
static void test_detail_every(void) {
  CHECK_EQ_INT(1, steps_detail_every(1));
  CHECK_EQ_INT(1, steps_detail_every(64));
  CHECK_EQ_INT(100, steps_detail_every(65));
  CHECK_EQ_INT(100, steps_detail_every(512));
  CHECK_EQ_INT(200, steps_detail_every(513));
  CHECK_EQ_INT(800, steps_detail_every(4096));
  for (int w = 513; w <= 16384; w += 97)   /* ranks per step of detail, amortized: at most 512 / 100 */
    CHECK((double)w / steps_detail_every(w) <= 512.0 / 100);
}

int main(void) {
  test_detail_every();
  /* three nodes of 13, 12 and 12 ranks (rank r on node r * 7 % 3: interleaved), each folded by its
   * own aggregate as a relay does */
  stepagg *node[3], *all;
  for (int k = 0; k < 3; k++) CHECK_OK(stepagg_new(&node[k]));
  CHECK_OK(stepagg_new(&all));
  for (uint32_t r = 0; r < WORLD; r++) {
    Fsdp__RankStats s;
    uint64_t v[NFIG];
    Fsdp__Figure ex, *exp;
    stats(r, &s, v, &ex, &exp);
    CHECK_OK(stepagg_add_rank(node[r * 7 % 3], &s, 10.0 + r % 4, 0));
  }
  /* each node's aggregate crosses the wire in a node_step_report, then merges at the "coordinator" */
  for (int k = 0; k < 3; k++) {
    Fsdp__StepAgg am;
    CHECK_OK(stepagg_to_msg(node[k], 0, &am));
    Fsdp__StepReport first = FSDP__STEP_REPORT__INIT;
    Fsdp__NodeStepReport nr = FSDP__NODE_STEP_REPORT__INIT;
    nr.first = &first, nr.agg = &am;
    Fsdp__Msg m = WIRE_MSG_INIT, *out = NULL;
    m.body_case = FSDP__MSG__BODY_NODE_STEP_REPORT, m.node_step_report = &nr;
    uint8_t *buf;
    size_t len;
    CHECK_OK(wire_pack(&m, &buf, &len));
    CHECK_OK(wire_unpack(buf, len, &out));
    if (out) CHECK_OK(stepagg_merge(all, out->node_step_report->agg));
    wire_destroy(&out);
    free(buf);
    stepagg_msg_free(&am);
  }
  CHECK_EQ_INT(WORLD, stepagg_ranks(all));
  Fsdp__StepAgg a;
  CHECK_OK(stepagg_to_msg(all, 1, &a));
  CHECK_EQ_INT(STEPAGG_NSTD, a.n_std);
  CHECK_EQ_INT(1, a.n_extra_names);
  uint32_t ranks[WORLD];
  uint64_t v[WORLD];
  for (uint32_t r = 0; r < WORLD; r++) ranks[r] = r;
  for (int i = 0; i < NFIG; i++) {
    for (uint32_t r = 0; r < WORLD; r++) v[r] = value(r, i);
    expect_fig(&a, (size_t)i, v, ranks, WORLD);
  }
  CHECK_EQ_INT(5, a.max_rank[0]);   /* ranks 5 and 30 tie: the lower */
  CHECK_EQ_INT(2, a.min_rank[0]);   /* ranks 2 and 11 tie: the lower */
  /* sent_inter_bytes: no rank sent it */
  for (int i = NFIG; i < NFIG + COLL_NKIND; i++) CHECK_EQ_INT(0, a.count[i]);
  /* step_us: 10..13 ms; eval_us: none */
  for (uint32_t r = 0; r < WORLD; r++) v[r] = (uint64_t)(10 + r % 4) * 1000;
  expect_fig(&a, STEPAGG_NSTD - 2, v, ranks, WORLD);
  CHECK_EQ_INT(0, a.count[STEPAGG_NSTD - 1]);
  /* the extra figure, from ranks 0, 3, 6, ... only */
  CHECK(!strcmp(a.extra_names[0], "ckpt_write_us"));
  size_t n = 0;
  for (uint32_t r = 0; r < WORLD; r += 3) ranks[n] = r, v[n++] = 100 + (r * 37u) % 50u;
  expect_fig(&a, STEPAGG_NSTD, v, ranks, n);
  stepagg_msg_free(&a);

  /* every rank the same: the median is exact, the extremes are rank 0 */
  stepagg_reset(all);
  for (uint32_t r = 0; r < 9; r++) {
    Fsdp__RankStats s;
    uint64_t vv[NFIG];
    Fsdp__Figure ex, *exp;
    stats(0, &s, vv, &ex, &exp);
    s.rank = r;
    CHECK_OK(stepagg_add_rank(all, &s, 5.0, 0));
  }
  CHECK_OK(stepagg_to_msg(all, 1, &a));
  for (int i = 0; i < NFIG; i++) {
    CHECK_EQ_INT(value(0, i), a.median[i]);
    CHECK_EQ_INT(0, a.min_rank[i]);
    CHECK_EQ_INT(0, a.max_rank[i]);
  }
  stepagg_msg_free(&a);
  /* buckets: every value lands in a bucket no wider than the median's tolerance */
  for (uint64_t x = 1; x < (1ull << 62); x = x * 3 + 1) {
    uint32_t b = stepagg_bucket(x);
    CHECK(b < STEPAGG_NBUCKET && stepagg_bucket(x + x / 100) <= b + 1);
  }
  CHECK_EQ_INT(0, stepagg_bucket(0));
  for (int k = 0; k < 3; k++) stepagg_destroy(&node[k]);
  stepagg_destroy(&all);
  CHECK(all == NULL);
  return check_done();
}
