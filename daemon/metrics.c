/* metrics — see metrics.h. */
#include "metrics.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#include <string.h>

#include "plan.h"
#include "stepagg.h"
#include "stepstats.h"


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

/* SUM->agg from the "agg" object O (NULL: none). */
static fsdp_status parse_agg(json_t *o, Fsdp__StepSummary *sum) {
  if (!json_is_object(o)) return FSDP_OK;
  json_t *extra = json_object_get(o, "extra");
  size_t nx = json_is_object(extra) ? json_object_size(extra) : 0, nf = STEPAGG_NSTD + nx;
  Fsdp__StepAgg *a = calloc(1, sizeof *a);
  if (!a) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  fsdp__step_agg__init(a);
  sum->agg = a;
  a->extra_names = calloc(nx + 1, sizeof *a->extra_names);
  a->min = calloc(nf, sizeof *a->min), a->max = calloc(nf, sizeof *a->max), a->sum = calloc(nf, sizeof *a->sum);
  a->median = calloc(nf, sizeof *a->median), a->count = calloc(nf, sizeof *a->count);
  a->min_rank = calloc(nf, sizeof *a->min_rank), a->max_rank = calloc(nf, sizeof *a->max_rank);
  a->hist_len = calloc(nf, sizeof *a->hist_len);
  if (!a->extra_names || !a->min || !a->max || !a->sum || !a->median || !a->count || !a->min_rank || !a->max_rank || !a->hist_len)
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  a->ranks = (uint32_t)json_integer_value(json_object_get(o, "ranks"));
  a->n_std = STEPAGG_NSTD;
  const char *k;
  json_t *v;
  json_object_foreach(extra, k, v) {
    a->extra_names[a->n_extra_names] = strdup(k);
    if (!a->extra_names[a->n_extra_names++]) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  }
  a->n_min = a->n_max = a->n_sum = a->n_median = a->n_count = a->n_min_rank = a->n_max_rank = a->n_hist_len = nf;
  for (size_t i = 0; i < nf; i++) {
    const char *group, *key;
    stepstats_figure_name(a, i, &group, &key);
    json_t *f = json_object_get(o, group);
    if (key) f = json_object_get(f, key);
    if (!json_is_object(f)) continue;
    a->min[i] = (uint64_t)json_integer_value(json_object_get(f, "min"));
    a->max[i] = (uint64_t)json_integer_value(json_object_get(f, "max"));
    a->median[i] = (uint64_t)json_integer_value(json_object_get(f, "median"));
    a->sum[i] = (uint64_t)json_integer_value(json_object_get(f, "sum"));
    a->min_rank[i] = (uint32_t)json_integer_value(json_object_get(f, "min_rank"));
    a->max_rank[i] = (uint32_t)json_integer_value(json_object_get(f, "max_rank"));
    json_t *cnt = json_object_get(f, "count");
    a->count[i] = cnt ? (uint32_t)json_integer_value(cnt) : a->ranks;
  }
  return FSDP_OK;
}

fsdp_status metrics_parse_line(const char *line, Fsdp__StepSummary *sum) {
  sum->n_ranks = 0;
  sum->ranks = NULL;
  sum->agg = NULL;
  json_error_t err;
  json_t *o = json_loads(line, 0, &err);
  if (!o) return fsdp_set_error(FSDP_ERR_FORMAT, "metrics line is not JSON: %s", err.text);
  json_t *ranks = json_object_get(o, "ranks");
  size_t n = json_is_array(ranks) ? json_array_size(ranks) : 0;
  fsdp_status rc = parse_agg(json_object_get(o, "agg"), sum);
  sum->step_ms_rank = (uint32_t)json_integer_value(json_object_get(o, "step_ms_rank"));
  /* the trained tokens apart (masked data); 0 on a line from before they were counted */
  sum->trained_tokens = (uint64_t)json_integer_value(json_object_get(o, "trained_tokens"));
  sum->trained_tokens_per_s = json_number_value(json_object_get(o, "trained_tokens_per_s"));
  if (rc == FSDP_OK && n) {
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
  if (rc != FSDP_OK) metrics_free_line(sum);
  return rc;
}

void metrics_free_line(Fsdp__StepSummary *sum) {
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
  Fsdp__StepAgg *a = sum->agg;
  if (a) {
    for (size_t i = 0; i < a->n_extra_names; i++) free(a->extra_names[i]);
    stepagg_msg_free(a);
    free(a);
  }
  sum->agg = NULL;
}

/* {"ranks": N, group: {key: {min, min_rank, median, max, max_rank, sum[, count]}}, ..., "extra": {...}}:
 * the figures no rank reported are left out. */
static json_t *agg_json(const Fsdp__StepAgg *a) {
  json_t *o = json_pack("{s:I}", "ranks", (json_int_t)a->ranks);
  for (size_t i = 0; o && i < a->n_std + a->n_extra_names; i++) {
    if (!a->count[i]) continue;
    const char *group, *key;
    stepstats_figure_name(a, i, &group, &key);
    json_t *f = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "min", (json_int_t)a->min[i], "min_rank", (json_int_t)a->min_rank[i],
                          "median", (json_int_t)(a->n_median ? a->median[i] : 0), "max", (json_int_t)a->max[i],
                          "max_rank", (json_int_t)a->max_rank[i], "sum", (json_int_t)a->sum[i]);
    if (f && a->count[i] != a->ranks && json_object_set_new(f, "count", json_integer(a->count[i]))) json_decref(f), f = NULL;
    json_t *g = json_object_get(o, group);
    if (f && key && !g && json_object_set_new(o, group, g = json_object())) g = NULL;
    if (!f || (key ? !g || json_object_set_new(g, key, f) : json_object_set_new(o, group, f))) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

static json_t *rank_json(const Fsdp__RankStats *s) {
  json_t *r = json_pack("{s:I}", "rank", (json_int_t)s->rank);
  json_t *peak = u64_map(s->peak_bytes, s->n_peak_bytes, MEM_NCAT, mem_name, 1.0);
  json_t *cur = u64_map(s->cur_bytes, s->n_cur_bytes, MEM_NCAT, mem_name, 1.0);
  json_t *phase = u64_map(s->phase_us, s->n_phase_us, STEPSTATS_NPHASE, phase_name, 1e-3);
  json_t *sent = u64_map(s->sent_bytes, s->n_sent_bytes, COLL_NKIND, coll_name, 1.0);
  if (!r || json_object_set_new(r, "peak_bytes", peak) || json_object_set_new(r, "cur_bytes", cur) ||
      json_object_set_new(r, "phase_ms", phase) || json_object_set_new(r, "sent_bytes", sent))
    goto fail;
  if (s->n_sent_inter_bytes &&   /* hybrid: the part that crossed shard groups */
      json_object_set_new(r, "sent_inter_bytes", u64_map(s->sent_inter_bytes, s->n_sent_inter_bytes, COLL_NKIND, coll_name, 1.0)))
    goto fail;
  for (size_t i = 0; i < s->n_extra; i++)
    if (json_object_set_new(r, s->extra[i]->name, json_integer((json_int_t)s->extra[i]->value))) goto fail;
  return r;
fail:
  json_decref(r);
  return NULL;
}

fsdp_status metrics_ranks_line(const Fsdp__StepSummary *sum, char **line) {
  json_t *o = json_pack("{s:I}", "step", (json_int_t)sum->step), *ranks = json_array();
  if (!o || !ranks || json_object_set_new(o, "ranks", ranks)) goto nomem;
  for (size_t i = 0; i < sum->n_ranks; i++)
    if (json_array_append_new(ranks, rank_json(sum->ranks[i]))) goto nomem;
  *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(o);
  if (*line) return FSDP_OK;
  return fsdp_set_error(FSDP_ERR_NOMEM, "cannot build the ranks line of step %u", sum->step);
nomem:
  json_decref(o);
  return fsdp_set_error(FSDP_ERR_NOMEM, "cannot build the ranks line of step %u", sum->step);
}

/* A step time of a save's pace (ckptpace.h), null where there is none. */
static json_t *pace_ms(uint32_t steps, double ms) { return steps && ms > 0 ? json_real(ms) : json_null(); }

/* The "checkpoint" array of a metrics line: the saves that became complete after the step, the
 * job's figures (steps.c: the longest times over the ranks and who holds them, every rank's bytes,
 * the steps' pace while the write was in flight). */
static json_t *ckpt_json(const Fsdp__StepSummary *sum) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < sum->n_ckpt; i++) {
    const Fsdp__CkptSave *c = sum->ckpt[i];
    int slow = c->inflight_steps && c->inflight_step_ms > 0 && c->before_step_ms > 0;
    if (json_array_append_new(a, json_pack("{s:I, s:f, s:f, s:f, s:I, s:f, s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "step",
                                           (json_int_t)c->step, "blocked_s", c->blocked_s, "wait_s", c->wait_s, "write_s",
                                           c->write_s, "bytes", (json_int_t)c->bytes, "mb_per_s",
                                           c->write_s > 0 ? (double)c->bytes / c->write_s / 1e6 : 0.0, "ranks",
                                           (json_int_t)c->ranks, "blocked_rank", (json_int_t)c->blocked_rank, "write_rank",
                                           (json_int_t)c->write_rank, "inflight_steps", (json_int_t)c->inflight_steps,
                                           "inflight_step_ms", pace_ms(c->inflight_steps, c->inflight_step_ms),
                                           "before_step_ms", pace_ms(c->inflight_steps, c->before_step_ms), "step_slowdown",
                                           slow ? json_real(c->inflight_step_ms / c->before_step_ms) : json_null()))) {
      json_decref(a);
      return NULL;
    }
  }
  return a;
}

fsdp_status metrics_line(const Fsdp__StepSummary *sum, char **line) {
  *line = NULL;
  /* loss null: a step without a trained target (masked data) */
  json_t *o = json_pack("{s:I, s:o, s:f, s:f, s:I, s:f, s:f, s:I, s:I, s:f}", "step", (json_int_t)sum->step, "loss",
                        isfinite(sum->loss) ? json_real(sum->loss) : json_null(), "lr", sum->lr, "grad_norm",
                        sum->grad_norm, "tokens", (json_int_t)sum->tokens, "step_ms", sum->step_ms, "tokens_per_s",
                        sum->tokens_per_s, "step_ms_rank", (json_int_t)sum->step_ms_rank, "trained_tokens",
                        (json_int_t)sum->trained_tokens, "trained_tokens_per_s", sum->trained_tokens_per_s);
  if (!o) goto nomem;
  if (sum->has_val && (json_object_set_new(o, "val_loss", isfinite(sum->val_loss) ? json_real(sum->val_loss) : json_null()) ||
                       json_object_set_new(o, "eval_ms", json_real(sum->eval_ms))))
    goto nomem;
  if (sum->agg) {
    json_t *a = agg_json(sum->agg);
    if (!a || json_object_set_new(o, "agg", a)) goto nomem;
  }
  if (sum->n_ckpt) {
    json_t *k = ckpt_json(sum);
    if (!k || json_object_set_new(o, "checkpoint", k)) goto nomem;
  }
  if (sum->n_ranks) {
    json_t *ranks = json_array();
    if (!ranks || json_object_set_new(o, "ranks", ranks)) goto nomem;
    for (size_t i = 0; i < sum->n_ranks; i++)
      if (json_array_append_new(ranks, rank_json(sum->ranks[i]))) goto nomem;
  }
  *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
  json_decref(o);
  if (*line) return FSDP_OK;
  return fsdp_set_error(FSDP_ERR_NOMEM, "cannot build the metrics line of step %u", sum->step);
nomem:
  json_decref(o);
  return fsdp_set_error(FSDP_ERR_NOMEM, "cannot build the metrics line of step %u", sum->step);
}

fsdp_status metrics_start_line(const Fsdp__StepReport *first, char **line) {
  json_t *o = json_pack("{s:i, s:f, s:f}", "step", 0, "val_loss", first->start_val_loss, "eval_ms", first->start_eval_ms);
  *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12)) : NULL;
  json_decref(o);
  return *line ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "out of memory writing metrics.jsonl");
}
