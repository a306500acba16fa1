/* test_metrics — the metrics.jsonl line built from a step's summary, and its inverse for status:
 * required fields, the aggregate by group and key, per-rank maps by category name on detail steps,
 * and a round trip of the per-rank and aggregated figures.
 */
#include "metrics.h"
#include "stepagg.h"

#include <jansson.h>
#include <stdlib.h>

#include <string.h>

#include "check.h"

static Fsdp__StepReport *report(int rank, double step_ms, uint64_t base) {
  Fsdp__StepReport *r = calloc(1, sizeof *r);
  Fsdp__RankStats *s = calloc(1, sizeof *s);
  fsdp__step_report__init(r);
  fsdp__rank_stats__init(s);
  r->step = 7;
  r->loss = 3.25;
  r->lr = 6e-4;
  r->grad_norm = 0.75;
  r->tokens = 4096;
  r->step_ms = step_ms;
  r->stats = s;
  s->rank = (uint32_t)rank;
  s->n_peak_bytes = s->n_cur_bytes = 7;
  s->peak_bytes = calloc(7, sizeof(uint64_t));
  s->cur_bytes = calloc(7, sizeof(uint64_t));
  for (int i = 0; i < 7; i++) s->peak_bytes[i] = base + (uint64_t)i * 1000, s->cur_bytes[i] = base / 2 + (uint64_t)i;
  s->n_phase_us = 4;
  s->phase_us = calloc(4, sizeof(uint64_t));
  for (int i = 0; i < 4; i++) s->phase_us[i] = (uint64_t)(1500 * (i + 1) + rank);
  s->n_sent_bytes = 3;
  s->sent_bytes = calloc(3, sizeof(uint64_t));
  for (int i = 0; i < 3; i++) s->sent_bytes[i] = (uint64_t)(1 << (10 + i));
  return r;
}

static void report_free(Fsdp__StepReport *r) {
  free(r->stats->peak_bytes);
  free(r->stats->cur_bytes);
  free(r->stats->phase_us);
  free(r->stats->sent_bytes);
  free(r->stats);
  free(r);
}

int main(void) {
  Fsdp__StepReport *reps[2] = {report(0, 120.0, 1u << 20), report(1, 160.0, 2u << 20)};
  stepagg *ag;
  CHECK_OK(stepagg_new(&ag));
  for (int r = 0; r < 2; r++) CHECK_OK(stepagg_add_rank(ag, reps[r]->stats, reps[r]->step_ms, 0));
  Fsdp__StepAgg am;
  CHECK_OK(stepagg_to_msg(ag, 1, &am));
  Fsdp__RankStats *detail[2] = {reps[0]->stats, reps[1]->stats};
  Fsdp__StepSummary in = FSDP__STEP_SUMMARY__INIT;
  in.step = 7, in.loss = 3.25, in.lr = 6e-4, in.grad_norm = 0.75, in.tokens = 4096;
  in.step_ms = 160.0, in.step_ms_rank = 1, in.tokens_per_s = 4096 / 0.160;
  in.trained_tokens = 1000, in.trained_tokens_per_s = 1000 / 0.160;
  in.agg = &am, in.ranks = detail, in.n_ranks = 2;
  char *line = NULL;
  CHECK_OK(metrics_line(&in, &line));
  CHECK(line && !strchr(line, '\n'));
  json_error_t err;
  json_t *o = json_loads(line, 0, &err);
  CHECK(o != NULL);
  CHECK_EQ_INT(7, json_integer_value(json_object_get(o, "step")));
  CHECK_NEAR(3.25, json_number_value(json_object_get(o, "loss")), 0, 1e-12);
  CHECK_NEAR(6e-4, json_number_value(json_object_get(o, "lr")), 0, 1e-9);
  CHECK_NEAR(0.75, json_number_value(json_object_get(o, "grad_norm")), 0, 1e-12);
  CHECK_EQ_INT(4096, json_integer_value(json_object_get(o, "tokens")));
  CHECK_NEAR(160.0, json_number_value(json_object_get(o, "step_ms")), 0, 1e-12);
  CHECK_EQ_INT(1, json_integer_value(json_object_get(o, "step_ms_rank")));
  CHECK_NEAR(4096 / 0.160, json_number_value(json_object_get(o, "tokens_per_s")), 0, 1e-9);
  CHECK_EQ_INT(1000, json_integer_value(json_object_get(o, "trained_tokens")));
  CHECK_NEAR(1000 / 0.160, json_number_value(json_object_get(o, "trained_tokens_per_s")), 0, 1e-9);
  json_t *ga = json_object_get(json_object_get(json_object_get(o, "agg"), "peak_bytes"), "gathered");
  CHECK_EQ_INT((1u << 20) + 3000, json_integer_value(json_object_get(ga, "min")));
  CHECK_EQ_INT(0, json_integer_value(json_object_get(ga, "min_rank")));
  CHECK_EQ_INT((2u << 20) + 3000, json_integer_value(json_object_get(ga, "max")));
  CHECK_EQ_INT(1, json_integer_value(json_object_get(ga, "max_rank")));
  CHECK_EQ_INT(160000, json_integer_value(json_object_get(json_object_get(json_object_get(o, "agg"), "step_us"), "max")));
  CHECK(json_object_get(json_object_get(o, "agg"), "sent_inter_bytes") == NULL);   /* no rank sent it */
  json_t *ranks = json_object_get(o, "ranks");
  CHECK_EQ_INT(2, json_array_size(ranks));
  json_t *r1 = json_array_get(ranks, 1);
  CHECK_EQ_INT(1, json_integer_value(json_object_get(r1, "rank")));
  CHECK_EQ_INT((2u << 20) + 3000, json_integer_value(json_object_get(json_object_get(r1, "peak_bytes"), "gathered")));
  CHECK_EQ_INT((2u << 20) + 6000, json_integer_value(json_object_get(json_object_get(r1, "peak_bytes"), "comm")));
  CHECK_NEAR(3.001, json_number_value(json_object_get(json_object_get(r1, "phase_ms"), "compute")), 0, 1e-12);
  CHECK_NEAR(6.001, json_number_value(json_object_get(json_object_get(r1, "phase_ms"), "optimizer")), 0, 1e-12);
  CHECK_EQ_INT(1 << 11, json_integer_value(json_object_get(json_object_get(r1, "sent_bytes"), "reducescatter")));
  CHECK_EQ_INT(7, json_object_size(json_object_get(r1, "peak_bytes")));
  json_decref(o);

  { /* a step without a trained target (masked data): its loss is null, the line still written */
    Fsdp__StepSummary none = in;
    none.loss = NAN, none.trained_tokens = 0, none.has_val = 1, none.val_loss = NAN;
    char *nl = NULL;
    CHECK_OK(metrics_line(&none, &nl));
    json_t *n = nl ? json_loads(nl, 0, &err) : NULL;
    CHECK(n && json_is_null(json_object_get(n, "loss")) && json_is_null(json_object_get(n, "val_loss")));
    CHECK(n && json_integer_value(json_object_get(n, "trained_tokens")) == 0);
    json_decref(n);
    free(nl);
  }

  /* round trip of the per-rank and aggregated figures (what status shows for the last step) */
  Fsdp__StepSummary sum = FSDP__STEP_SUMMARY__INIT;
  CHECK_OK(metrics_parse_line(line, &sum));
  CHECK_EQ_INT(1000, sum.trained_tokens);
  CHECK_NEAR(1000 / 0.160, sum.trained_tokens_per_s, 0, 1e-9);
  CHECK_EQ_INT(2, sum.n_ranks);
  CHECK_EQ_INT(1, sum.step_ms_rank);
  for (size_t r = 0; r < sum.n_ranks && r < 2; r++) {
    const Fsdp__RankStats *a = sum.ranks[r], *b = reps[r]->stats;
    CHECK_EQ_INT(b->rank, a->rank);
    CHECK_EQ_INT(7, a->n_peak_bytes);
    for (int i = 0; i < 7; i++) CHECK_EQ_INT(b->peak_bytes[i], a->peak_bytes[i]);
    for (int i = 0; i < 7; i++) CHECK_EQ_INT(b->cur_bytes[i], a->cur_bytes[i]);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(b->phase_us[i], a->phase_us[i]);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(b->sent_bytes[i], a->sent_bytes[i]);
  }
  CHECK(sum.agg != NULL);
  for (size_t i = 0; sum.agg && i < STEPAGG_NSTD; i++) {
    CHECK_EQ_INT(am.min[i], sum.agg->min[i]);
    CHECK_EQ_INT(am.min_rank[i], sum.agg->min_rank[i]);
    CHECK_EQ_INT(am.max[i], sum.agg->max[i]);
    CHECK_EQ_INT(am.max_rank[i], sum.agg->max_rank[i]);
    CHECK_EQ_INT(am.median[i], sum.agg->median[i]);
    CHECK_EQ_INT(am.sum[i], sum.agg->sum[i]);
    CHECK_EQ_INT(am.count[i], sum.agg->count[i]);
  }
  metrics_free_line(&sum);
  CHECK_EQ_INT(0, sum.n_ranks);
  CHECK(sum.agg == NULL);
  CHECK(metrics_parse_line("not json", &sum) == FSDP_ERR_FORMAT);
  free(line);
  stepagg_msg_free(&am);
  stepagg_destroy(&ag);
  report_free(reps[0]);
  report_free(reps[1]);
  return check_done();
}
