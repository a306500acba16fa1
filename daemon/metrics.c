/* metrics — see metrics.h. */
#include "metrics.h"

#include <jansson.h>
#include <stdlib.h>

#include "plan.h"
#include "stepstats.h"


void metrics_summarize(Fsdp__StepReport *const *reports, size_t n, Fsdp__StepSummary *sum) {
  const Fsdp__StepReport *r0 = reports[0];
  sum->step = r0->step;
  sum->loss = r0->loss;
  sum->lr = r0->lr;
  sum->grad_norm = r0->grad_norm;
  sum->tokens = r0->tokens;
  double ms = 0;
  for (size_t i = 0; i < n; i++)
    if (reports[i]->step_ms > ms) ms = reports[i]->step_ms;
  sum->step_ms = ms;
  sum->tokens_per_s = ms > 0 ? (double)r0->tokens * 1000.0 / ms : 0.0;
  /* every rank computes the same validation loss (an all-reduce); the slowest rank's time */
  sum->has_val = r0->has_val;
  sum->val_loss = r0->val_loss;
  sum->eval_ms = 0;
  for (size_t i = 0; i < n; i++)
    if (reports[i]->has_val && reports[i]->eval_ms > sum->eval_ms) sum->eval_ms = reports[i]->eval_ms;
}

static json_t *u64_map(const uint64_t *v, size_t n, size_t want, const char *(*name)(int), double scale) {
  json_t *o = json_object();
  if (!o) return NULL;
  for (size_t i = 0; i < want; i++) {
    uint64_t x = i < n ? v[i] : 0;
    json_t *val = scale == 1.0 ? json_integer((json_int_t)x) : json_real((double)x * scale);
    if (json_object_set_new(o, name((int)i), val) != 0) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

static const char *mem_name(int i) { return plan_mem_category_name((mem_category)i); }
static const char *coll_name(int i) { return plan_coll_kind_name((coll_kind)i); }
static const char *phase_name(int i) { return stepstats_phase_names[i]; }

static void fill_u64(json_t *obj, uint64_t **out, size_t *n, size_t want, const char *(*name)(int), double scale) {
  *out = calloc(want, sizeof **out);
  *n = *out ? want : 0;
  for (size_t i = 0; *out && i < want; i++) {
    json_t *v = obj ? json_object_get(obj, name((int)i)) : NULL;
    (*out)[i] = json_is_number(v) ? (uint64_t)(json_number_value(v) * scale + (scale == 1.0 ? 0 : 0.5)) : 0;
  }
}

fsdp_status metrics_parse_ranks(const char *line, Fsdp__StepSummary *sum) {
  sum->n_ranks = 0;
  sum->ranks = NULL;
  json_error_t err;
  json_t *o = json_loads(line, 0, &err);
  if (!o) return fsdp_set_error(FSDP_ERR_FORMAT, "metrics line is not JSON: %s", err.text);
  json_t *ranks = json_object_get(o, "ranks");
  size_t n = json_is_array(ranks) ? json_array_size(ranks) : 0;
  fsdp_status rc = FSDP_OK;
  if (n) {
    sum->ranks = calloc(n, sizeof *sum->ranks);
    if (!sum->ranks) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot parse %zu ranks", n);
  }
  for (size_t i = 0; rc == FSDP_OK && i < n; i++) {
    json_t *r = json_array_get(ranks, i);
    Fsdp__RankStats *s = calloc(1, sizeof *s);
    if (!s) {
      rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot parse rank %zu", i);
      break;
    }
    fsdp__rank_stats__init(s);
    sum->ranks[sum->n_ranks++] = s;
    s->rank = (uint32_t)json_integer_value(json_object_get(r, "rank"));
    fill_u64(json_object_get(r, "peak_bytes"), &s->peak_bytes, &s->n_peak_bytes, MEM_NCAT, mem_name, 1.0);
    fill_u64(json_object_get(r, "cur_bytes"), &s->cur_bytes, &s->n_cur_bytes, MEM_NCAT, mem_name, 1.0);
    fill_u64(json_object_get(r, "phase_ms"), &s->phase_us, &s->n_phase_us, STEPSTATS_NPHASE, phase_name, 1e3);
    fill_u64(json_object_get(r, "sent_bytes"), &s->sent_bytes, &s->n_sent_bytes, COLL_NKIND, coll_name, 1.0);
    if (json_object_get(r, "sent_inter_bytes"))
      fill_u64(json_object_get(r, "sent_inter_bytes"), &s->sent_inter_bytes, &s->n_sent_inter_bytes, COLL_NKIND,
               coll_name, 1.0);
  }
  json_decref(o);
  if (rc != FSDP_OK) metrics_free_ranks(sum);
  return rc;
}

void metrics_free_ranks(Fsdp__StepSummary *sum) {
  for (size_t i = 0; i < sum->n_ranks; i++) {
    free(sum->ranks[i]->peak_bytes);
    free(sum->ranks[i]->cur_bytes);
    free(sum->ranks[i]->phase_us);
    free(sum->ranks[i]->sent_bytes);
    free(sum->ranks[i]->sent_inter_bytes);
    free(sum->ranks[i]);
  }
  free(sum->ranks);
  sum->ranks = NULL;
  sum->n_ranks = 0;
}

void metrics_ckpt(Fsdp__StepReport *const *reports, size_t n, size_t i, Fsdp__CkptSave *out) {
  fsdp__ckpt_save__init(out);
  for (size_t r = 0; r < n; r++) {
    if (i >= reports[r]->n_ckpt) continue;
    const Fsdp__CkptSave *c = reports[r]->ckpt[i];
    out->step = c->step;
    if (c->blocked_s > out->blocked_s) out->blocked_s = c->blocked_s;
    if (c->wait_s > out->wait_s) out->wait_s = c->wait_s;
    if (c->write_s > out->write_s) out->write_s = c->write_s;
    out->bytes += c->bytes;
  }
}

/* The "checkpoint" array of a metrics line, or NULL when no save became complete. */
static json_t *ckpt_json(Fsdp__StepReport *const *reports, size_t n) {
  if (!reports[0]->n_ckpt) return NULL;
  json_t *a = json_array();
  for (size_t i = 0; a && i < reports[0]->n_ckpt; i++) {
    Fsdp__CkptSave c;
    metrics_ckpt(reports, n, i, &c);
    json_array_append_new(a, json_pack("{s:I, s:f, s:f, s:f, s:I, s:f}", "step", (json_int_t)c.step, "blocked_s",
                                       c.blocked_s, "wait_s", c.wait_s, "write_s", c.write_s, "bytes", (json_int_t)c.bytes,
                                       "mb_per_s", c.write_s > 0 ? (double)c.bytes / c.write_s / 1e6 : 0.0));
  }
  return a;
}

fsdp_status metrics_line(Fsdp__StepReport *const *reports, size_t n, char **line) {
  *line = NULL;
  Fsdp__StepSummary sum = FSDP__STEP_SUMMARY__INIT;
  metrics_summarize(reports, n, &sum);
  json_t *ranks = json_array();
  json_t *o = json_pack("{s:I, s:f, s:f, s:f, s:I, s:f, s:f}", "step", (json_int_t)sum.step, "loss", sum.loss,
                        "lr", sum.lr, "grad_norm", sum.grad_norm, "tokens", (json_int_t)sum.tokens,
                        "step_ms", sum.step_ms, "tokens_per_s", sum.tokens_per_s);
  fsdp_status rc = FSDP_OK;
  if (!o || !ranks) goto nomem;
  if (sum.has_val && (json_object_set_new(o, "val_loss", json_real(sum.val_loss)) ||
                      json_object_set_new(o, "eval_ms", json_real(sum.eval_ms))))
    goto nomem;
  for (size_t i = 0; i < n; i++) {
    const Fsdp__RankStats *s = reports[i]->stats;
    json_t *r = json_object();
    if (!r || json_array_append_new(ranks, r) != 0) goto nomem;
    if (json_object_set_new(r, "rank", json_integer(s ? s->rank : (json_int_t)i)) != 0) goto nomem;
    if (!s) continue;
    json_t *peak = u64_map(s->peak_bytes, s->n_peak_bytes, MEM_NCAT, mem_name, 1.0);
    json_t *cur = u64_map(s->cur_bytes, s->n_cur_bytes, MEM_NCAT, mem_name, 1.0);
    json_t *phase = u64_map(s->phase_us, s->n_phase_us, STEPSTATS_NPHASE, phase_name, 1e-3);
    json_t *sent = u64_map(s->sent_bytes, s->n_sent_bytes, COLL_NKIND, coll_name, 1.0);
    if (json_object_set_new(r, "peak_bytes", peak) || json_object_set_new(r, "cur_bytes", cur) ||
        json_object_set_new(r, "phase_ms", phase) || json_object_set_new(r, "sent_bytes", sent))
      goto nomem;
    if (s->n_sent_inter_bytes &&   /* hybrid: the part that crossed shard groups */
        json_object_set_new(r, "sent_inter_bytes", u64_map(s->sent_inter_bytes, s->n_sent_inter_bytes, COLL_NKIND,
                                                            coll_name, 1.0)))
      goto nomem;
  }
  json_t *ck = ckpt_json(reports, n);
  if (ck && json_object_set_new(o, "checkpoint", ck) != 0) goto nomem;
  if (json_object_set(o, "ranks", ranks) != 0) goto nomem;
  *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
  if (!*line) goto nomem;
  goto out;
nomem:
  rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot build the metrics line of step %u", sum.step);
out:
  json_decref(ranks);
  json_decref(o);
  return rc;
}
