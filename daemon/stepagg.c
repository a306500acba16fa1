/* stepagg — see stepagg.h. */
#include "stepagg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(STEPAGG_NSTD == 2 * MEM_NCAT + STEPSTATS_NPHASE + 2 * COLL_NKIND + 2, "stepstats.h's figures match plan.h's enums");

typedef struct fig {
  uint64_t min, max, sum;
  uint32_t min_rank, max_rank, count;
  uint32_t *hist;     /* STEPAGG_NBUCKET counts, allocated at first use */
  uint32_t lo, hi;    /* the buckets used: [lo, hi] (lo > hi: none) */
} fig;

struct stepagg {
  uint32_t ranks;
  int nextra;
  char extra[STEPAGG_MAX_FIGS - STEPAGG_NSTD][64];
  fig f[STEPAGG_MAX_FIGS];
};

uint32_t stepagg_bucket(uint64_t v) {
  if (v == 0) return 0;
  uint32_t b = (uint32_t)(log((double)v) / log(STEPAGG_GAMMA)) + 1;
  return b < STEPAGG_NBUCKET ? b : STEPAGG_NBUCKET - 1;
}

fsdp_status stepagg_new(stepagg **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a step aggregate");
  stepagg_reset(*out);
  return FSDP_OK;
}

void stepagg_destroy(stepagg **p) {
  if (!p || !*p) return;
  for (int i = 0; i < STEPAGG_MAX_FIGS; i++) free((*p)->f[i].hist);
  free(*p);
  *p = NULL;
}

void stepagg_reset(stepagg *a) {
  for (int i = 0; i < STEPAGG_MAX_FIGS; i++) {
    fig *f = &a->f[i];
    if (f->hist && f->lo <= f->hi) memset(f->hist + f->lo, 0, (f->hi - f->lo + 1) * sizeof *f->hist);
    uint32_t *h = f->hist;
    memset(f, 0, sizeof *f);
    f->hist = h;
    f->lo = STEPAGG_NBUCKET;
  }
  a->ranks = 0;
  a->nextra = 0;
}

uint32_t stepagg_ranks(const stepagg *a) { return a->ranks; }

/* Figure index of the extra figure NAME, added when new; -1 when the table is full. */
static int extra_index(stepagg *a, const char *name) {
  for (int i = 0; i < a->nextra; i++)
    if (!strcmp(a->extra[i], name)) return STEPAGG_NSTD + i;
  if (STEPAGG_NSTD + a->nextra >= STEPAGG_MAX_FIGS) return -1;
  snprintf(a->extra[a->nextra], sizeof a->extra[0], "%s", name);
  return STEPAGG_NSTD + a->nextra++;
}

static fsdp_status hist_add(fig *f, uint32_t b, uint32_t n) {
  if (!f->hist) {
    f->hist = calloc(STEPAGG_NBUCKET, sizeof *f->hist);
    if (!f->hist) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a step aggregate");
  }
  if (b >= STEPAGG_NBUCKET) b = STEPAGG_NBUCKET - 1;
  f->hist[b] += n;
  if (f->lo > f->hi) f->lo = f->hi = b;
  else if (b < f->lo) f->lo = b;
  else if (b > f->hi) f->hi = b;
  return FSDP_OK;
}

/* Merge (count, sum, min@min_rank, max@max_rank) into F; ties go to the lower rank. */
static void fold(fig *f, uint32_t count, uint64_t sum, uint64_t min, uint32_t min_rank, uint64_t max, uint32_t max_rank) {
  if (!count) return;
  if (!f->count || min < f->min || (min == f->min && min_rank < f->min_rank)) f->min = min, f->min_rank = min_rank;
  if (!f->count || max > f->max || (max == f->max && max_rank < f->max_rank)) f->max = max, f->max_rank = max_rank;
  f->count += count;
  f->sum += sum;
}

static fsdp_status add_value(fig *f, uint64_t v, uint32_t rank) {
  fold(f, 1, v, v, rank, v, rank);
  return hist_add(f, stepagg_bucket(v), 1);
}

static fsdp_status add_array(stepagg *a, int base, const uint64_t *v, size_t n, size_t want, uint32_t rank) {
  for (size_t i = 0; n == want && i < n; i++) TRY(add_value(&a->f[base + (int)i], v[i], rank));
  return FSDP_OK;
}

fsdp_status stepagg_add_rank(stepagg *a, const Fsdp__RankStats *s, double step_ms, double eval_ms) {
  uint32_t r = s->rank;
  TRY(add_array(a, 0, s->peak_bytes, s->n_peak_bytes, MEM_NCAT, r));
  TRY(add_array(a, MEM_NCAT, s->cur_bytes, s->n_cur_bytes, MEM_NCAT, r));
  TRY(add_array(a, 2 * MEM_NCAT, s->phase_us, s->n_phase_us, STEPSTATS_NPHASE, r));
  TRY(add_array(a, 2 * MEM_NCAT + STEPSTATS_NPHASE, s->sent_bytes, s->n_sent_bytes, COLL_NKIND, r));
  TRY(add_array(a, 2 * MEM_NCAT + STEPSTATS_NPHASE + COLL_NKIND, s->sent_inter_bytes, s->n_sent_inter_bytes, COLL_NKIND, r));
  TRY(add_value(&a->f[STEPAGG_NSTD - 2], (uint64_t)llround(step_ms * 1e3), r));
  if (eval_ms > 0) TRY(add_value(&a->f[STEPAGG_NSTD - 1], (uint64_t)llround(eval_ms * 1e3), r));
  for (size_t i = 0; i < s->n_extra; i++) TRY(stepagg_add_value(a, s->extra[i]->name, s->extra[i]->value, r));
  a->ranks++;
  return FSDP_OK;
}

fsdp_status stepagg_add_value(stepagg *a, const char *name, uint64_t v, uint32_t rank) {
  int k = extra_index(a, name);
  if (k < 0) return fsdp_set_error(FSDP_ERR_RANGE, "more than %d extra figures", STEPAGG_MAX_FIGS - STEPAGG_NSTD);
  return add_value(&a->f[k], v, rank);
}

fsdp_status stepagg_merge(stepagg *a, const Fsdp__StepAgg *m) {
  size_t nf = m->n_std + m->n_extra_names, h = 0;
  for (size_t i = 0; i < nf; i++) {
    int k = i < m->n_std ? (int)i : extra_index(a, m->extra_names[i - m->n_std]);
    if (i < m->n_std && i >= STEPAGG_NSTD) k = -1;   /* a newer sender's standard figure: unknown here */
    if (k >= 0) {
      fold(&a->f[k], m->count[i], m->sum[i], m->min[i], m->min_rank[i], m->max[i], m->max_rank[i]);
      for (uint32_t p = 0; p < m->hist_len[i]; p++) TRY(hist_add(&a->f[k], m->hist_bucket[h + p], m->hist_count[h + p]));
    }
    h += m->hist_len[i];
  }
  a->ranks += m->ranks;
  return FSDP_OK;
}

/* The lower median: its bucket, then the point of that bucket's range (clamped into [min, max]) at
 * the median's position among the bucket's values, as if they were evenly spread in it. */
static uint64_t median(const fig *f) {
  if (!f->count) return 0;
  if (f->min == f->max) return f->min;
  uint64_t want = (f->count - 1) / 2 + 1, seen = 0;   /* the lower median is the want-th smallest */
  uint32_t b = f->lo;
  for (; b <= f->hi; b++) {
    if (seen + f->hist[b] >= want) break;
    seen += f->hist[b];
  }
  double lo = b ? pow(STEPAGG_GAMMA, (double)b - 1) : 0, hi = b ? pow(STEPAGG_GAMMA, (double)b) : 0;
  if (lo < (double)f->min) lo = (double)f->min;
  if (hi > (double)f->max) hi = (double)f->max;
  double v = lo + (hi - lo) * ((double)(want - seen) - 0.5) / (double)f->hist[b];
  return v <= (double)f->min ? f->min : v >= (double)f->max ? f->max : (uint64_t)(v + 0.5);
}

fsdp_status stepagg_to_msg(const stepagg *a, int with_median, Fsdp__StepAgg *m) {
  fsdp__step_agg__init(m);
  size_t nf = (size_t)(STEPAGG_NSTD + a->nextra), pairs = 0;
  for (size_t i = 0; i < nf; i++)
    for (uint32_t b = a->f[i].lo; a->f[i].hist && b <= a->f[i].hi; b++) pairs += a->f[i].hist[b] != 0;
  m->ranks = a->ranks;
  m->n_std = STEPAGG_NSTD;
  m->extra_names = calloc((size_t)a->nextra + 1, sizeof *m->extra_names);
  m->min = calloc(nf, sizeof *m->min), m->max = calloc(nf, sizeof *m->max), m->sum = calloc(nf, sizeof *m->sum);
  m->min_rank = calloc(nf, sizeof *m->min_rank), m->max_rank = calloc(nf, sizeof *m->max_rank);
  m->hist_len = calloc(nf, sizeof *m->hist_len), m->count = calloc(nf, sizeof *m->count);
  m->hist_bucket = calloc(pairs + 1, sizeof *m->hist_bucket), m->hist_count = calloc(pairs + 1, sizeof *m->hist_count);
  m->median = with_median ? calloc(nf, sizeof *m->median) : NULL;
  if (!m->extra_names || !m->min || !m->max || !m->sum || !m->min_rank || !m->max_rank || !m->hist_len || !m->count ||
      !m->hist_bucket || !m->hist_count || (with_median && !m->median)) {
    stepagg_msg_free(m);
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot pack a step aggregate");
  }
  m->n_extra_names = (size_t)a->nextra;
  for (int i = 0; i < a->nextra; i++) m->extra_names[i] = (char *)a->extra[i];
  m->n_min = m->n_max = m->n_sum = m->n_min_rank = m->n_max_rank = m->n_hist_len = m->n_count = nf;
  m->n_median = with_median ? nf : 0;
  size_t h = 0;
  for (size_t i = 0; i < nf; i++) {
    const fig *f = &a->f[i];
    m->min[i] = f->min, m->max[i] = f->max, m->sum[i] = f->sum, m->count[i] = f->count;
    m->min_rank[i] = f->min_rank, m->max_rank[i] = f->max_rank;
    if (with_median) m->median[i] = median(f);
    for (uint32_t b = f->lo; f->hist && b <= f->hi; b++)
      if (f->hist[b]) m->hist_bucket[h] = b, m->hist_count[h++] = f->hist[b], m->hist_len[i]++;
  }
  m->n_hist_bucket = m->n_hist_count = h;
  return FSDP_OK;
}

void stepagg_msg_free(Fsdp__StepAgg *m) {
  free(m->extra_names), free(m->min), free(m->max), free(m->sum), free(m->min_rank), free(m->max_rank);
  free(m->hist_len), free(m->count), free(m->hist_bucket), free(m->hist_count), free(m->median);
  fsdp__step_agg__init(m);
}

