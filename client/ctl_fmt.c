/* ctl_fmt — see ctl_fmt.h. */
#include "ctl_fmt.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "oneline.h"
#include "plan.h"
#include "stepstats.h"


/* ---------------------------------------------------------------- units */

/* Three significant digits: 1.23, 12.3, 123. */
static int sig3(double v, char *buf, size_t n, const char *unit) {
  if (v < 9.995) return snprintf(buf, n, "%.2f%s", v, unit);
  if (v < 99.95) return snprintf(buf, n, "%.1f%s", v, unit);
  return snprintf(buf, n, "%.0f%s", v, unit);
}

char *ctl_fmt_bytes(uint64_t bytes, char *buf, size_t n) {
  static const char *units[] = {" KiB", " MiB", " GiB", " TiB", " PiB", " EiB"};
  if (bytes < 1024) {
    snprintf(buf, n, "%llu B", (unsigned long long)bytes);
    return buf;
  }
  double v = (double)bytes / 1024.0;
  int u = 0;
  while (v >= 999.5 && u < 5) {   /* 999.5 KiB would print as "1000 KiB": show "0.98 MiB" instead */
    v /= 1024.0;
    u++;
  }
  sig3(v, buf, n, units[u]);
  return buf;
}

char *ctl_fmt_si(double x, char *buf, size_t n) {
  static const char *units[] = {"", "k", "M", "G", "T", "P"};
  if (!(x >= 0) || isinf(x)) {
    snprintf(buf, n, "-");
    return buf;
  }
  int u = 0;
  while (x >= 999.5 && u < 5) {
    x /= 1000.0;
    u++;
  }
  if (u == 0 && x >= 9.95)
    snprintf(buf, n, "%.0f", x);
  else if (u == 0)
    snprintf(buf, n, "%.1f", x);
  else
    sig3(x, buf, n, units[u]);
  return buf;
}

char *ctl_fmt_duration(double s, char *buf, size_t n) {
  if (!(s >= 0) || isinf(s)) {
    snprintf(buf, n, "-");
    return buf;
  }
  if (s < 9.95) {
    snprintf(buf, n, "%.1fs", s);
    return buf;
  }
  long long t = llround(s);
  if (t < 60)
    snprintf(buf, n, "%llds", t);
  else if (t < 3600)
    snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
  else if (t < 86400)
    snprintf(buf, n, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
  else
    snprintf(buf, n, "%lldd%02lldh", t / 86400, (t % 86400) / 3600);
  return buf;
}

const char *ctl_fmt_state(Fsdp__JobState s) {
  switch (s) {
  case FSDP__JOB_STATE__QUEUED: return "queued";
  case FSDP__JOB_STATE__STARTING: return "starting";
  case FSDP__JOB_STATE__RUNNING: return "running";
  case FSDP__JOB_STATE__SUCCEEDED: return "succeeded";
  case FSDP__JOB_STATE__FAILED: return "failed";
  case FSDP__JOB_STATE__CANCELLED: return "cancelled";
  default: return "unknown";
  }
}

int ctl_fmt_state_is_final(Fsdp__JobState s) {
  return s == FSDP__JOB_STATE__SUCCEEDED || s == FSDP__JOB_STATE__FAILED || s == FSDP__JOB_STATE__CANCELLED;
}

const char *ctl_fmt_device(Fsdp__DeviceKind d) {
  return d == FSDP__DEVICE_KIND__DEVICE_KIND_CUDA ? "cuda" : "cpu";
}

char *ctl_fmt_progress(char *buf, size_t n, unsigned step, unsigned steps, double loss, double val_loss,
                       double tokens_per_s, double eta_s, int bar_width) {
  char bar[128];
  if (bar_width < 1) bar_width = 1;
  if (bar_width > (int)sizeof bar - 3) bar_width = (int)sizeof bar - 3;
  int filled = steps ? (int)((unsigned long long)(step > steps ? steps : step) * (unsigned)bar_width / steps) : 0;
  bar[0] = '[';
  for (int i = 0; i < bar_width; i++) bar[1 + i] = i < filled ? '#' : '.';
  bar[1 + bar_width] = ']';
  bar[2 + bar_width] = '\0';
  size_t len = 0;
  int w = snprintf(buf, n, "%s step %u/%u", bar, step, steps);
  if (w > 0) len = (size_t)w < n ? (size_t)w : n;
  if (loss > 0 && isfinite(loss) && len < n) {
    w = snprintf(buf + len, n - len, "  loss %.3f", loss);
    if (w > 0) len += (size_t)w < n - len ? (size_t)w : n - len;
  }
  if (val_loss > 0 && isfinite(val_loss) && len < n) {
    w = snprintf(buf + len, n - len, "  val %.3f", val_loss);
    if (w > 0) len += (size_t)w < n - len ? (size_t)w : n - len;
  }
  if (tokens_per_s > 0 && isfinite(tokens_per_s) && len < n) {
    char si[32];
    w = snprintf(buf + len, n - len, "  %s tok/s", ctl_fmt_si(tokens_per_s, si, sizeof si));
    if (w > 0) len += (size_t)w < n - len ? (size_t)w : n - len;
  }
  if (len < n && !isnan(eta_s)) {
    char d[32];
    snprintf(buf + len, n - len, "  ETA %s", ctl_fmt_duration(eta_s, d, sizeof d));
  }
  return buf;
}

/* ---------------------------------------------------------------- tables */

#define TABLE_MAX_COLS 16

struct ctl_table {
  int ncols;
  char *head[TABLE_MAX_COLS];
  int right[TABLE_MAX_COLS];
  char **cells;   /* nrows × ncols */
  size_t nrows, cap;
};

ctl_table *ctl_table_new(int ncols, const char *const *headers) {
  if (ncols < 1 || ncols > TABLE_MAX_COLS) return NULL;
  ctl_table *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->ncols = ncols;
  for (int c = 0; c < ncols; c++) {
    const char *h = headers[c] ? headers[c] : "";
    t->right[c] = h[0] == '>';
    t->head[c] = strdup(h + t->right[c]);
  }
  return t;
}

void ctl_table_add(ctl_table *t, const char *const *cells) {
  if (!t) return;
  if (t->nrows == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 8;
    char **nc = realloc(t->cells, cap * (size_t)t->ncols * sizeof *nc);
    if (!nc) return;
    t->cells = nc;
    t->cap = cap;
  }
  for (int c = 0; c < t->ncols; c++) t->cells[t->nrows * (size_t)t->ncols + (size_t)c] = strdup(cells[c] ? cells[c] : "");
  t->nrows++;
}

void ctl_table_print(const ctl_table *t, FILE *f, const char *indent) {
  if (!t) return;
  size_t w[TABLE_MAX_COLS];
  for (int c = 0; c < t->ncols; c++) {
    w[c] = t->head[c] ? strlen(t->head[c]) : 0;
    for (size_t r = 0; r < t->nrows; r++) {
      const char *s = t->cells[r * (size_t)t->ncols + (size_t)c];
      size_t l = s ? strlen(s) : 0;
      if (l > w[c]) w[c] = l;
    }
  }
  for (size_t r = 0; r <= t->nrows; r++) {
    fputs(indent ? indent : "", f);
    for (int c = 0; c < t->ncols; c++) {
      const char *s = r == 0 ? t->head[c] : t->cells[(r - 1) * (size_t)t->ncols + (size_t)c];
      if (!s) s = "";
      int last = c == t->ncols - 1;
      if (t->right[c])
        fprintf(f, "%*s", (int)w[c], s);
      else if (last)
        fputs(s, f);   /* no trailing blanks */
      else
        fprintf(f, "%-*s", (int)w[c], s);
      if (!last) fputs("  ", f);
    }
    fputc('\n', f);
  }
}

void ctl_table_destroy(ctl_table **tp) {
  if (!tp || !*tp) return;
  ctl_table *t = *tp;
  for (int c = 0; c < t->ncols; c++) free(t->head[c]);
  for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++) free(t->cells[i]);
  free(t->cells);
  free(t);
  *tp = NULL;
}

/* ---------------------------------------------------------------- JSON */

static json_t *jreal(double x) { return isfinite(x) ? json_real(x) : json_null(); }
static json_t *jtime(double t) { return t > 0 && isfinite(t) ? json_real(t) : json_null(); }
static json_t *ju64(uint64_t x) { return json_integer((json_int_t)x); }

json_t *ctl_fmt_rank_json(const Fsdp__RankStats *r) {
  json_t *o = json_object();
  json_object_set_new(o, "rank", json_integer(r->rank));
  if (r->n_peak_bytes == MEM_NCAT) {
    json_t *m = json_object();
    for (int c = 0; c < MEM_NCAT; c++) json_object_set_new(m, plan_mem_category_name((mem_category)c), ju64(r->peak_bytes[c]));
    json_object_set_new(o, "peak_bytes", m);
  }
  if (r->n_cur_bytes == MEM_NCAT) {
    json_t *m = json_object();
    for (int c = 0; c < MEM_NCAT; c++) json_object_set_new(m, plan_mem_category_name((mem_category)c), ju64(r->cur_bytes[c]));
    json_object_set_new(o, "cur_bytes", m);
  }
  if (r->n_phase_us == STEPSTATS_NPHASE) {
    json_t *m = json_object();
    for (int p = 0; p < STEPSTATS_NPHASE; p++) json_object_set_new(m, stepstats_phase_names[p], json_real((double)r->phase_us[p] / 1000.0));
    json_object_set_new(o, "phase_ms", m);
  }
  if (r->n_sent_bytes == COLL_NKIND) {
    json_t *m = json_object();
    for (int k = 0; k < COLL_NKIND; k++) json_object_set_new(m, plan_coll_kind_name((coll_kind)k), ju64(r->sent_bytes[k]));
    json_object_set_new(o, "sent_bytes", m);
  }
  if (r->n_sent_inter_bytes == COLL_NKIND) {   /* hybrid: the part that crossed shard groups */
    json_t *m = json_object();
    for (int k = 0; k < COLL_NKIND; k++) json_object_set_new(m, plan_coll_kind_name((coll_kind)k), ju64(r->sent_inter_bytes[k]));
    json_object_set_new(o, "sent_inter_bytes", m);
  }
  return o;
}

/* {ranks, GROUP: {KEY: {min, min_rank, median, max, max_rank, sum}}, ...}: what metrics.jsonl's agg holds. */
static json_t *agg_json(const Fsdp__StepAgg *a) {
  json_t *o = json_object();
  json_object_set_new(o, "ranks", json_integer(a->ranks));
  for (size_t i = 0; i < a->n_std + a->n_extra_names && i < a->n_min; i++) {
    if (!a->count[i]) continue;
    const char *group, *key;
    stepstats_figure_name(a, i, &group, &key);
    json_t *f = json_object();
    json_object_set_new(f, "min", ju64(a->min[i]));
    json_object_set_new(f, "min_rank", json_integer(a->min_rank[i]));
    json_object_set_new(f, "median", ju64(i < a->n_median ? a->median[i] : 0));
    json_object_set_new(f, "max", ju64(a->max[i]));
    json_object_set_new(f, "max_rank", json_integer(a->max_rank[i]));
    json_object_set_new(f, "sum", ju64(a->sum[i]));
    json_t *g = json_object_get(o, group);
    if (!key) json_object_set_new(o, group, f);
    else {
      if (!g) json_object_set_new(o, group, g = json_object());
      json_object_set_new(g, key, f);
    }
  }
  return o;
}

/* The latest complete save as metrics.jsonl's checkpoint lines give it (docs/observability.md): the
 * longest times over the ranks and who holds them, every rank's bytes, and the steps' pace while
 * its write was in flight (null where no step overlapped it). */
static json_t *ckpt_json(const Fsdp__CkptSave *c) {
  int paced = c->inflight_steps && c->inflight_step_ms > 0 && c->before_step_ms > 0;
  return json_pack("{s:i, s:f, s:f, s:f, s:I, s:f, s:i, s:i, s:i, s:i, s:o, s:o, s:o}", "step", (int)c->step, "blocked_s",
                   c->blocked_s, "wait_s", c->wait_s, "write_s", c->write_s, "bytes", (json_int_t)c->bytes, "mb_per_s",
                   c->write_s > 0 ? (double)c->bytes / c->write_s / 1e6 : 0.0, "ranks", (int)c->ranks, "blocked_rank",
                   (int)c->blocked_rank, "write_rank", (int)c->write_rank, "inflight_steps", (int)c->inflight_steps,
                   "inflight_step_ms", paced ? json_real(c->inflight_step_ms) : json_null(), "before_step_ms",
                   paced ? json_real(c->before_step_ms) : json_null(), "step_slowdown",
                   paced ? json_real(c->inflight_step_ms / c->before_step_ms) : json_null());
}

json_t *ctl_fmt_step_json(const Fsdp__StepSummary *s) {
  json_t *o = json_object();
  json_object_set_new(o, "step", json_integer(s->step));
  json_object_set_new(o, "loss", jreal(s->loss));
  json_object_set_new(o, "lr", jreal(s->lr));
  json_object_set_new(o, "grad_norm", jreal(s->grad_norm));
  json_object_set_new(o, "tokens", ju64(s->tokens));
  json_object_set_new(o, "step_ms", jreal(s->step_ms));
  json_object_set_new(o, "tokens_per_s", jreal(s->tokens_per_s));
  json_object_set_new(o, "trained_tokens", ju64(s->trained_tokens));
  json_object_set_new(o, "trained_tokens_per_s", jreal(s->trained_tokens_per_s));
  if (s->has_val) {
    json_object_set_new(o, "val_loss", jreal(s->val_loss));
    json_object_set_new(o, "eval_ms", jreal(s->eval_ms));
  }
  json_object_set_new(o, "step_ms_rank", json_integer(s->step_ms_rank));
  if (s->detail_step) json_object_set_new(o, "detail_step", json_integer(s->detail_step));
  if (s->agg) json_object_set_new(o, "agg", agg_json(s->agg));
  json_t *ranks = json_array();
  for (size_t i = 0; i < s->n_ranks; i++) json_array_append_new(ranks, ctl_fmt_rank_json(s->ranks[i]));
  json_object_set_new(o, "ranks", ranks);
  return o;
}

json_t *ctl_fmt_job_json(const Fsdp__JobInfo *j) {
  json_t *o = json_object();
  json_object_set_new(o, "id", ju64(j->id));
  json_object_set_new(o, "name", json_string(j->name ? j->name : ""));
  json_object_set_new(o, "owner", json_string(j->owner ? j->owner : ""));
  json_object_set_new(o, "owner_uid", json_integer(j->owner_uid));
  json_object_set_new(o, "state", json_string(ctl_fmt_state(j->state)));
  json_object_set_new(o, "step", json_integer(j->step));
  json_object_set_new(o, "steps", json_integer(j->steps));
  json_object_set_new(o, "loss", j->step > 0 ? jreal(j->loss) : json_null());   /* no step, no loss yet */
  json_object_set_new(o, "tokens_per_s", jreal(j->tokens_per_s));
  json_object_set_new(o, "val_loss", j->val_step ? jreal(j->val_loss) : json_null());   /* the latest */
  json_object_set_new(o, "val_step", json_integer(j->val_step));
  if (j->ckpt) json_object_set_new(o, "checkpoint", ckpt_json(j->ckpt));   /* while the daemon holds the job */
  json_object_set_new(o, "world", json_integer(j->world));
  json_object_set_new(o, "device", json_string(ctl_fmt_device(j->device)));
  json_object_set_new(o, "submitted_at", jtime(j->submitted_at));
  json_object_set_new(o, "started_at", jtime(j->started_at));
  json_object_set_new(o, "finished_at", jtime(j->finished_at));
  json_object_set_new(o, "job_dir", json_string(j->job_dir ? j->job_dir : ""));
  if (j->reason && j->reason[0]) json_object_set_new(o, "reason", json_string(j->reason));
  json_object_set_new(o, "last", j->last ? ctl_fmt_step_json(j->last) : json_null());
  return o;
}

json_t *ctl_fmt_nodes_json(const Fsdp__NodesResp *r) {
  json_t *nodes = json_array();
  for (size_t i = 0; i < r->n_nodes; i++) {
    const Fsdp__NodeInfo *ni = r->nodes[i];
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(ni->id));
    json_object_set_new(o, "name", json_string(ni->name ? ni->name : ""));
    json_object_set_new(o, "lost", json_boolean(ni->lost));
    json_object_set_new(o, "stopped", json_boolean(ni->stopped));
    json_object_set_new(o, "last_seen", jtime(ni->last_seen));
    json_object_set_new(o, "host_mem_bytes", ju64(ni->host_mem_bytes));
    json_t *devs = json_array();
    for (size_t s = 0; s < ni->n_slots; s++) {
      const Fsdp__DeviceSlot *d = ni->slots[s];
      json_t *dj = json_object();
      json_object_set_new(dj, "kind", json_string(ctl_fmt_device(d->kind)));
      json_object_set_new(dj, "index", json_integer(d->index));
      json_object_set_new(dj, "name", json_string(d->name ? d->name : ""));
      json_object_set_new(dj, "mem_bytes", ju64(d->mem_bytes));
      json_object_set_new(dj, "job_id", d->job_id ? ju64(d->job_id) : json_null());
      json_object_set_new(dj, "rank", d->job_id ? json_integer(d->rank) : json_null());
      json_array_append_new(devs, dj);
    }
    json_object_set_new(o, "devices", devs);
    json_array_append_new(nodes, o);
  }
  json_t *o = json_object();
  json_object_set_new(o, "nodes", nodes);
  return o;
}

int ctl_fmt_print_json(json_t *j, FILE *f) {
  if (!j) return -1;
  int rc = json_dumpf(j, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
  fputc('\n', f);
  json_decref(j);
  return rc;
}

/* ---------------------------------------------------------------- human */

static char *fmt_time(double t, double now, char *buf, size_t n) {
  if (!(t > 0)) {
    snprintf(buf, n, "-");
    return buf;
  }
  time_t tt = (time_t)t;
  struct tm tm;
  localtime_r(&tt, &tm);
  char d[32], ts[40];
  strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
  snprintf(buf, n, "%s (%s ago)", ts, ctl_fmt_duration(now - t, d, sizeof d));
  return buf;
}

static void rank_tables(const Fsdp__StepSummary *s, FILE *f) {
  int have_mem = 0, have_phase = 0, have_sent = 0;
  for (size_t i = 0; i < s->n_ranks; i++) {
    have_mem |= s->ranks[i]->n_peak_bytes == MEM_NCAT;
    have_phase |= s->ranks[i]->n_phase_us == STEPSTATS_NPHASE;
    have_sent |= s->ranks[i]->n_sent_bytes == COLL_NKIND;
  }
  if (have_mem) {
    /* Headers are the category names, right-aligned: ">param_shard" … ">total". */
    char heads[MEM_NCAT + 2][32];
    const char *hp[MEM_NCAT + 2];
    snprintf(heads[0], sizeof heads[0], "rank");
    for (int c = 0; c < MEM_NCAT; c++) snprintf(heads[1 + c], sizeof heads[0], ">%s", plan_mem_category_name((mem_category)c));
    snprintf(heads[MEM_NCAT + 1], sizeof heads[0], ">total");
    for (int c = 0; c < MEM_NCAT + 2; c++) hp[c] = heads[c];
    ctl_table *t = ctl_table_new(MEM_NCAT + 2, hp);
    for (size_t i = 0; i < s->n_ranks; i++) {
      const Fsdp__RankStats *r = s->ranks[i];
      if (r->n_peak_bytes != MEM_NCAT) continue;
      char cells[MEM_NCAT + 2][32];
      const char *cp[MEM_NCAT + 2];
      uint64_t tot = 0;
      snprintf(cells[0], sizeof cells[0], "%u", r->rank);
      for (int c = 0; c < MEM_NCAT; c++) {
        ctl_fmt_bytes(r->peak_bytes[c], cells[1 + c], sizeof cells[0]);
        tot += r->peak_bytes[c];
      }
      ctl_fmt_bytes(tot, cells[MEM_NCAT + 1], sizeof cells[0]);
      for (int c = 0; c < MEM_NCAT + 2; c++) cp[c] = cells[c];
      ctl_table_add(t, cp);
    }
    fprintf(f, "\npeak memory per rank (sum of per-category peaks)\n");
    ctl_table_print(t, f, "  ");
    ctl_table_destroy(&t);
  }
  if (have_phase) {
    const char *hp[] = {"rank", ">allgather", ">compute", ">reducescatter", ">optimizer", ">total"};
    ctl_table *t = ctl_table_new(6, hp);
    for (size_t i = 0; i < s->n_ranks; i++) {
      const Fsdp__RankStats *r = s->ranks[i];
      if (r->n_phase_us != STEPSTATS_NPHASE) continue;
      char cells[6][48];
      const char *cp[6];
      uint64_t tot = 0;
      for (int p = 0; p < STEPSTATS_NPHASE; p++) tot += r->phase_us[p];
      snprintf(cells[0], sizeof cells[0], "%u", r->rank);
      for (int p = 0; p < STEPSTATS_NPHASE; p++)
        snprintf(cells[1 + p], sizeof cells[0], "%.2f ms %3.0f%%", (double)r->phase_us[p] / 1000.0,
                 tot ? 100.0 * (double)r->phase_us[p] / (double)tot : 0.0);
      snprintf(cells[5], sizeof cells[0], "%.2f ms", (double)tot / 1000.0);
      for (int c = 0; c < 6; c++) cp[c] = cells[c];
      ctl_table_add(t, cp);
    }
    fprintf(f, "\ntime per phase, step %u (all-gather and reduce-scatter: time waited)\n", s->step);
    ctl_table_print(t, f, "  ");
    ctl_table_destroy(&t);
  }
  if (have_sent) {
    const char *hp[] = {"rank", ">allgather", ">reducescatter", ">allreduce", ">total"};
    ctl_table *t = ctl_table_new(5, hp);
    for (size_t i = 0; i < s->n_ranks; i++) {
      const Fsdp__RankStats *r = s->ranks[i];
      if (r->n_sent_bytes != COLL_NKIND) continue;
      char cells[5][32];
      const char *cp[5];
      uint64_t tot = 0;
      snprintf(cells[0], sizeof cells[0], "%u", r->rank);
      for (int k = 0; k < COLL_NKIND; k++) {
        ctl_fmt_bytes(r->sent_bytes[k], cells[1 + k], sizeof cells[0]);
        tot += r->sent_bytes[k];
      }
      ctl_fmt_bytes(tot, cells[4], sizeof cells[0]);
      for (int c = 0; c < 5; c++) cp[c] = cells[c];
      ctl_table_add(t, cp);
    }
    fprintf(f, "\nbytes sent per collective, step %u\n", s->step);
    ctl_table_print(t, f, "  ");
    ctl_table_destroy(&t);
  }
}

/* One value of figure group GROUP (KEY: the extra's name) for a person: bytes, milliseconds or a count. */
static void fig_value(const char *group, const char *key, uint64_t v, char *buf, size_t n) {
  size_t kl = key ? strlen(key) : 0;
  if (strstr(group, "bytes") || (kl > 6 && !strcmp(key + kl - 6, "_bytes"))) ctl_fmt_bytes(v, buf, n);
  else if (strstr(group, "_us") || (kl > 3 && !strcmp(key + kl - 3, "_us"))) snprintf(buf, n, "%.2f ms", (double)v / 1000.0);
  else snprintf(buf, n, "%llu", (unsigned long long)v);
}

/* The step's figures over all ranks: min (rank) / median / max (rank), one row per figure. */
static void agg_table(const Fsdp__StepSummary *s, FILE *f) {
  const Fsdp__StepAgg *a = s->agg;
  const char *hp[] = {"figure", ">min", ">rank", ">median", ">max", ">rank"};
  ctl_table *t = ctl_table_new(6, hp);
  for (size_t i = 0; i < a->n_std + a->n_extra_names && i < a->n_min; i++) {
    if (!a->count[i]) continue;
    const char *group, *key;
    stepstats_figure_name(a, i, &group, &key);
    char cells[6][96];
    const char *cp[6];
    snprintf(cells[0], sizeof cells[0], "%s%s%s", group, key ? "." : "", key ? key : "");
    fig_value(group, key, a->min[i], cells[1], sizeof cells[1]);
    snprintf(cells[2], sizeof cells[2], "%u", a->min_rank[i]);
    fig_value(group, key, i < a->n_median ? a->median[i] : 0, cells[3], sizeof cells[3]);
    fig_value(group, key, a->max[i], cells[4], sizeof cells[4]);
    snprintf(cells[5], sizeof cells[5], "%u", a->max_rank[i]);
    for (int c = 0; c < 6; c++) cp[c] = cells[c];
    ctl_table_add(t, cp);
  }
  fprintf(f, "\nstep %u over %u ranks: min / median / max, and the rank holding each extreme (fsdpctl status ID --rank R: one rank)\n",
          s->step, a->ranks);
  ctl_table_print(t, f, "  ");
  ctl_table_destroy(&t);
}

void ctl_fmt_job_human(const Fsdp__JobInfo *j, double now, FILE *f) {
  char a[96], b[96];
  fprintf(f, "job %llu (%s): %s\n", (unsigned long long)j->id, j->name ? j->name : "", ctl_fmt_state(j->state));
  if (j->owner && j->owner[0]) fprintf(f, "  owner       %s\n", j->owner);
  fprintf(f, "  step        %u/%u\n", j->step, j->steps);
  if (j->step > 0 && isfinite(j->loss)) fprintf(f, "  loss        %.4f\n", j->loss);
  if (j->val_step > 0) fprintf(f, "  val loss    %.4f (step %u)\n", j->val_loss, j->val_step);
  if (j->ckpt)   /* over the job's ranks: the longest times (and their ranks), every rank's bytes */
    fprintf(f, "  checkpoint  step %u: training blocked %.3f s (rank %u); %.1f MB written by %u ranks in %.2f s (rank %u; "
            "%.0f MB/s)\n", j->ckpt->step, j->ckpt->blocked_s, j->ckpt->blocked_rank, (double)j->ckpt->bytes / 1e6, j->ckpt->ranks,
            j->ckpt->write_s, j->ckpt->write_rank, j->ckpt->write_s > 0 ? (double)j->ckpt->bytes / j->ckpt->write_s / 1e6 : 0.0);
  if (j->ckpt && j->ckpt->inflight_steps && j->ckpt->inflight_step_ms > 0 && j->ckpt->before_step_ms > 0)
    fprintf(f, "              while written: %u step(s) of %.0f ms against %.0f ms before (%.2fx)\n",
            j->ckpt->inflight_steps, j->ckpt->inflight_step_ms, j->ckpt->before_step_ms,
            j->ckpt->inflight_step_ms / j->ckpt->before_step_ms);
  if (j->tokens_per_s > 0) fprintf(f, "  tokens/s    %s\n", ctl_fmt_si(j->tokens_per_s, a, sizeof a));
  fprintf(f, "  world       %u x %s\n", j->world, ctl_fmt_device(j->device));
  fprintf(f, "  submitted   %s\n", fmt_time(j->submitted_at, now, a, sizeof a));
  if (j->started_at > 0) fprintf(f, "  started     %s\n", fmt_time(j->started_at, now, a, sizeof a));
  if (j->finished_at > 0) fprintf(f, "  finished    %s\n", fmt_time(j->finished_at, now, a, sizeof a));
  if (j->started_at > 0) {
    double end = j->finished_at > 0 ? j->finished_at : now;
    fprintf(f, "  elapsed     %s\n", ctl_fmt_duration(end - j->started_at, a, sizeof a));
  }
  if (j->reason && j->reason[0]) {   /* a worker's text: one line */
    char r[4096];
    oneline_escape_str(r, sizeof r, j->reason);
    fprintf(f, "  reason      %s\n", r);
  }
  if (j->job_dir && j->job_dir[0]) fprintf(f, "  job dir     %s\n", j->job_dir);
  const Fsdp__StepSummary *s = j->last;
  if (s && s->step > 0) {
    fprintf(f, "  last step   %u: loss %.4f  lr %.3g  grad_norm %.3g  %s tokens  %.1f ms  %s tok/s\n", s->step, s->loss,
            s->lr, s->grad_norm, ctl_fmt_si((double)s->tokens, a, sizeof a), s->step_ms,
            ctl_fmt_si(s->tokens_per_s, b, sizeof b));
    if (s->trained_tokens && s->trained_tokens != s->tokens)   /* masked data: the loss's tokens apart */
      fprintf(f, "  trained     %s of the step's tokens  %s tok/s\n", ctl_fmt_si((double)s->trained_tokens, a, sizeof a),
              ctl_fmt_si(s->trained_tokens_per_s, b, sizeof b));
    if (s->step_ms_rank && s->agg) fprintf(f, "  slowest     rank %u\n", s->step_ms_rank);
    if (s->detail_step && s->n_ranks == 1) fprintf(f, "  rank %u's figures are from step %u\n", s->ranks[0]->rank, s->detail_step);
    if (s->n_ranks && s->n_ranks <= CTL_FMT_RANKS_MAX) rank_tables(s, f);
    else if (s->agg) agg_table(s, f);
  }
}

void ctl_fmt_jobs_table(Fsdp__JobInfo *const *jobs, size_t n, double now, FILE *f) {
  const char *hp[] = {">id", "name", "state", ">step", ">loss", ">tok/s", ">age", "owner"};
  ctl_table *t = ctl_table_new(8, hp);
  for (size_t i = 0; i < n; i++) {
    const Fsdp__JobInfo *j = jobs[i];
    char id[24], step[32], loss[32], tps[32], age[32];
    snprintf(id, sizeof id, "%llu", (unsigned long long)j->id);
    snprintf(step, sizeof step, "%u/%u", j->step, j->steps);
    if (j->step > 0 && isfinite(j->loss))
      snprintf(loss, sizeof loss, "%.4f", j->loss);
    else
      snprintf(loss, sizeof loss, "-");
    if (j->tokens_per_s > 0)
      ctl_fmt_si(j->tokens_per_s, tps, sizeof tps);
    else
      snprintf(tps, sizeof tps, "-");
    if (j->submitted_at > 0)
      ctl_fmt_duration(now - j->submitted_at, age, sizeof age);
    else
      snprintf(age, sizeof age, "-");
    const char *cells[] = {id, j->name ? j->name : "", ctl_fmt_state(j->state), step, loss, tps, age, j->owner ? j->owner : ""};
    ctl_table_add(t, cells);
  }
  ctl_table_print(t, f, "");
  ctl_table_destroy(&t);
}

void ctl_fmt_nodes_table(const Fsdp__NodesResp *r, double now, FILE *f) {
  const char *hp[] = {">node", "name", "state", ">seen", "device", "model", ">memory", "job"};
  ctl_table *t = ctl_table_new(8, hp);
  for (size_t i = 0; i < r->n_nodes; i++) {
    const Fsdp__NodeInfo *ni = r->nodes[i];
    char id[16], seen[48], d[32];
    snprintf(id, sizeof id, "%u", ni->id);
    if (ni->last_seen > 0)
      snprintf(seen, sizeof seen, "%s ago", ctl_fmt_duration(now - ni->last_seen, d, sizeof d));
    else
      snprintf(seen, sizeof seen, "-");
    const char *state = ni->stopped ? "stopped" : ni->lost ? "lost" : "ok";
    if (ni->n_slots == 0) {
      const char *cells[] = {id, ni->name, state, seen, "-", "-", "-", "-"};
      ctl_table_add(t, cells);
    }
    for (size_t s = 0; s < ni->n_slots; s++) {
      const Fsdp__DeviceSlot *d = ni->slots[s];
      char dev[32], mem[32], job[48];
      snprintf(dev, sizeof dev, "%s:%u", ctl_fmt_device(d->kind), d->index);
      if (d->mem_bytes)
        ctl_fmt_bytes(d->mem_bytes, mem, sizeof mem);
      else
        snprintf(mem, sizeof mem, "-");
      if (d->job_id)
        snprintf(job, sizeof job, "job %llu rank %u", (unsigned long long)d->job_id, d->rank);
      else
        snprintf(job, sizeof job, "free");
      const char *cells[] = {s == 0 ? id : "", s == 0 ? ni->name : "", s == 0 ? state : "",
                             s == 0 ? seen : "", dev, d->name && d->name[0] ? d->name : "-", mem, job};
      ctl_table_add(t, cells);
    }
  }
  ctl_table_print(t, f, "");
  ctl_table_destroy(&t);
}

double ctl_fmt_eta(unsigned step, unsigned steps, unsigned start_step, double elapsed_s) {
  /* The rate counts only the steps trained since the start (or the resume): a resumed job's
   * earlier steps took no time in this run. */
  if (step <= start_step || step > steps || !(elapsed_s > 0)) return -1;
  return elapsed_s * (double)(steps - step) / (double)(step - start_step);
}

uint64_t ctl_parse_bytes(const char *s) {
  static const struct { const char *sfx; double mul; } units[] = {
    {"", 1},          {"B", 1},
    {"K", 0x1p10},    {"KiB", 0x1p10}, {"M", 0x1p20}, {"MiB", 0x1p20},
    {"G", 0x1p30},    {"GiB", 0x1p30}, {"T", 0x1p40}, {"TiB", 0x1p40},
    {"KB", 1e3},      {"MB", 1e6},     {"GB", 1e9},   {"TB", 1e12},
  };
  if (!s || !*s || *s == '-' || *s == '+') return 0;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !isfinite(v) || v <= 0) return 0;
  int integral = !memchr(s, '.', (size_t)(end - s)) && !memchr(s, 'e', (size_t)(end - s)) &&
                 !memchr(s, 'E', (size_t)(end - s));
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcasecmp(end, units[i].sfx) != 0) continue;   /* the suffixes differ in more than case */
    if (integral && units[i].mul == 1) {   /* exact, even above 2^53 */
      errno = 0;
      unsigned long long x = strtoull(s, NULL, 10);
      return errno ? 0 : (uint64_t)x;
    }
    double b = v * units[i].mul;
    if (b < 1 || b >= 0x1p64) return 0;
    return (uint64_t)b;
  }
  return 0;
}
