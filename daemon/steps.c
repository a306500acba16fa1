/* steps — see steps.h. */
#define _GNU_SOURCE
#include "steps.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckptpace.h"
#include "fsutil.h"
#include "job.h"
#include "log.h"
#include "metrics.h"
#include "stepagg.h"

/* Steps granted beyond the last one recorded, and how few may be left before the next grant. A small
 * job (few nodes) is granted 4 ahead, 2 at a time: the relays keep their ranks two steps ahead of what
 * the node reported while the coordinator records a step (a database commit) off their path; a stop
 * takes effect within 4 steps. A large one is granted up to 32 ahead, 16 at a time: one
 * node_step_cmd per node per 16 steps, and a stop within 32 steps. */
#define STEP_WINDOW 32       /* the most: the size of the window's ring */
#define STEP_WIDE_NODES 16   /* jobs on this many nodes or more get the wide window */
/* A wide job's nodes report their steps 16 at a time (NodeStepCmd.report_every): the coordinator
 * reads one message per node per 16 steps; a batch ends where the next grant is due, so that the
 * ranks never wait for it. A small job's nodes report every step. */
#define STEP_WIDE_REPORT_EVERY (STEP_WINDOW / 2)

/* One step in flight: the node reports received so far, their figures merged. A report is freed
 * once merged unless the step needs it later: the one with the lowest rank (its global figures),
 * those carrying ranks' full figures. Freed at once, the coordinator's allocations of one report
 * are reused by the next (one of the larger costs per node at thousands of ranks). */
typedef struct jstep {
  uint32_t step;             /* 0: unused */
  int nnodes;                /* node reports in */
  stepagg *agg;
  uint8_t *got;              /* by job node: its report is in */
  Fsdp__Msg **msgs;          /* by job node: its node_step_report where kept (above), until the step is recorded */
  int first;                 /* the job node whose report holds the lowest rank (-1: none yet) */
  double step_ms, eval_ms;
  uint32_t step_ms_rank;
} jstep;

struct steps_win {
  int njnodes;
  int *jnode;                /* the c->nodes index of the job's k-th node */
  uint32_t *nranks;          /* how many of the job's ranks it runs */
  int *node_k;               /* c->nodes index → k, or -1; nmap entries */
  int nmap;
  uint32_t detail_every;
  uint32_t window, regrant;  /* see STEP_WINDOW */
  uint32_t report_every;     /* see STEP_WIDE_REPORT_EVERY */
  ckptpace pace;             /* the steps' slowdown while a save's write is in flight */
  jstep s[STEP_WINDOW];
};

/* J's window, whole or as far as win_new got (job_steps_view.win_free). */
static void win_free(job_t *j) {
  struct steps_win *w = job_steps(j)->win;
  if (!w) return;
  for (int i = 0; i < STEP_WINDOW; i++) {
    for (int k = 0; w->s[i].msgs && k < w->njnodes; k++) wire_destroy(&w->s[i].msgs[k]);
    free(w->s[i].msgs), free(w->s[i].got);
    stepagg_destroy(&w->s[i].agg);
  }
  free(w->jnode), free(w->nranks), free(w->node_k);
  free(w);
  job_steps(j)->win = NULL;
}

/* The job's nodes, from its placement. */
static fsdp_status win_new(coord_t *c, job_t *j) {
  struct steps_win *w = calloc(1, sizeof *w);
  if (!w) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  job_steps(j)->win = w;
  job_steps(j)->win_free = win_free;
  w->nmap = c->nnodes;
  w->node_k = malloc((size_t)(c->nnodes ? c->nnodes : 1) * sizeof *w->node_k);
  w->jnode = calloc((size_t)(c->nnodes ? c->nnodes : 1), sizeof *w->jnode);
  w->nranks = calloc((size_t)(c->nnodes ? c->nnodes : 1), sizeof *w->nranks);
  if (!w->node_k || !w->jnode || !w->nranks) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  for (int i = 0; i < c->nnodes; i++) w->node_k[i] = -1;
  for (int r = 0; r < job_world(j); r++) {
    int n = job_rank(j, r)->node;
    if (n < 0 || n >= w->nmap) return fsdp_set_error(FSDP_ERR_INTERNAL, "rank %d has no node", r);
    if (w->node_k[n] < 0) w->node_k[n] = w->njnodes, w->jnode[w->njnodes++] = n;
    w->nranks[w->node_k[n]]++;
  }
  w->detail_every = steps_detail_every(job_world(j));
  w->window = w->njnodes >= STEP_WIDE_NODES ? STEP_WINDOW : 4;
  w->regrant = w->njnodes >= STEP_WIDE_NODES ? w->window / 2 : w->window - 1;
  w->report_every = w->njnodes >= STEP_WIDE_NODES ? STEP_WIDE_REPORT_EVERY : 1;
  for (int i = 0; i < STEP_WINDOW; i++) {
    w->s[i].first = -1;
    w->s[i].msgs = calloc((size_t)w->njnodes, sizeof *w->s[i].msgs);
    w->s[i].got = calloc((size_t)w->njnodes, 1);
    if (!w->s[i].msgs || !w->s[i].got) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
    TRY(stepagg_new(&w->s[i].agg));
  }
  return FSDP_OK;
}

/* Grant steps next_step..LAST to every node of J: one node_step_cmd per node. */
static void send_grant(coord_t *c, job_t *j, uint32_t last) {
  struct steps_win *w = job_steps(j)->win;
  uint32_t ckpt[STEP_WINDOW + 1];
  size_t nck = 0;
  for (uint32_t s = job_steps(j)->next_step; s <= last; s++)   /* every K-th step and the last, and the one a stop ends with */
    if (ckpt_due(job_spec(j), (int)s) || (job_stop_at(j) && s == job_stop_at(j))) ckpt[nck++] = s;
  Fsdp__NodeStepCmd g = FSDP__NODE_STEP_CMD__INIT;
  g.job_id = job_id(j);
  g.first_step = job_steps(j)->next_step;
  g.count = last - job_steps(j)->next_step + 1;
  g.checkpoint_steps = ckpt;
  g.n_checkpoint_steps = nck;
  g.detail_every = w->detail_every;
  g.report_every = w->report_every;
  g.last_step = job_stop_at(j) ? job_stop_at(j) : job_last_step(j);   /* its worker waits for its save (StepCmd.last) */
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_NODE_STEP_CMD;
  m.node_step_cmd = &g;
  int detail_node = job_steps(j)->detail_rank ? job_rank(j, job_steps(j)->detail_rank - 1)->node : -1;
  for (int k = 0; k < w->njnodes; k++) {
    const node_t *n = &c->nodes[w->jnode[k]];
    g.expect = w->nranks[k];
    g.detail_rank = w->jnode[k] == detail_node ? job_steps(j)->detail_rank : 0;
    coord_send(c, n->ident, n->ident_len, &m);
  }
  job_steps(j)->next_step = last + 1;
}

static void send_stop(coord_t *c, job_t *j) {
  JOB_ASSERT(job_phase_of(j) == JOB_STOPPING);
  Fsdp__StopCmd s = FSDP__STOP_CMD__INIT;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_STOP_CMD;
  m.stop_cmd = &s;
  for (int r = 0; r < job_world(j); r++) job_send_rank(c, j, r, &m);
}

/* Keep steps granted ahead: when the window's regrant or fewer are left (or FORCE), grant up to its
 * width beyond the last recorded step. */
static void fill_window(coord_t *c, job_t *j, int force) {
  JOB_ASSERT(job_phase_of(j) == JOB_RUNNING && job_steps(j)->win);
  const struct steps_win *w = job_steps(j)->win;
  uint32_t last = job_steps(j)->done_step + w->window < job_last_step(j) ? job_steps(j)->done_step + w->window : job_last_step(j);
  if (job_steps(j)->next_step <= last && (force || job_steps(j)->next_step - 1 <= job_steps(j)->done_step + w->regrant)) send_grant(c, j, last);
}

/* Every step up to STEP is recorded: the job's next grant, or after the last step, every rank's stop. */
static void steps_recorded(coord_t *c, job_t *j, uint32_t step) {
  job_ev_args a = {.rank = -1, .node = -1, .step = step};
  job_phase p = job_event(c, j, JE_STEP_RECORDED, &a);
  if (p == JOB_STOPPING) send_stop(c, j);
  else if (p == JOB_RUNNING) fill_window(c, j, 0);
}

/* metrics.jsonl back to END bytes (the end before a line whose step could not be recorded). */
static void metrics_cut(job_t *j, off_t end) {
  if (job_steps(j)->metrics && end >= 0 && ftruncate(fileno(job_steps(j)->metrics), end) != 0)
    log_warn("job %llu: cannot cut back metrics.jsonl: %s", (unsigned long long)job_id(j), strerror(errno));
}

/* Append LINE and a newline to FILE (fd FD, in J's directory) as one write; a short write (a full
 * disk) is cut back, so that the file only ever holds whole lines. */
static fsdp_status append_line(const job_t *j, int fd, const char *file, const char *line) {
  size_t len = strlen(line);
  char *buf = malloc(len + 1);
  if (!buf) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  memcpy(buf, line, len);
  buf[len] = '\n';
  off_t end = lseek(fd, 0, SEEK_END);
  ssize_t n = write(fd, buf, len + 1);
  int e = errno;
  free(buf);
  if (n == (ssize_t)(len + 1)) return FSDP_OK;
  if (n >= 0) e = ENOSPC;   /* a short write: the device is full */
  if (end >= 0 && ftruncate(fd, end) != 0)
    log_warn("job %llu: cannot cut back %s: %s", (unsigned long long)job_id(j), file, strerror(errno));
  return fsdp_set_error(FSDP_ERR_IO, "cannot write %s/%s: %s", job_dir_of(j), file, strerror(e));
}

static fsdp_status metrics_append(const job_t *j, const char *line) {
  if (!job_steps_of(j)->metrics) return FSDP_OK;   /* could not be opened: said at the start */
  return append_line(j, fileno(job_steps_of(j)->metrics), "metrics.jsonl", line);
}

/* Every rank's figures of a detail step of a job beyond STEPS_DETAIL_ALL_MAX ranks: one line of
 * ranks.jsonl ({"step", "ranks"}), so that metrics.jsonl and the step rows stay the aggregate's size. */
static fsdp_status ranks_append(const job_t *j, const Fsdp__StepSummary *sum) {
  char path[PATH_MAX + 96], *line = NULL;
  snprintf(path, sizeof path, "%s/ranks.jsonl", job_dir_of(j));
  TRY(metrics_ranks_line(sum, &line));
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  fsdp_status rc = fd >= 0 ? append_line(j, fd, "ranks.jsonl", line)
                           : fsdp_set_error(FSDP_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  if (fd >= 0) close(fd);
  free(line);
  return rc;
}

/* The sum of the peak FLOP/s of J's devices, 0 when one of them has no known peak (every CPU). */
static double peak_flops(const coord_t *c, const job_t *j) {
  double sum = 0;
  for (int r = 0; r < job_world(j); r++) {
    const rank_st *rk = job_rank(j, r);
    if (rk->node < 0 || rk->slot < 0) return 0;
    const slot_t *s = &c->nodes[rk->node].slots[rk->slot];
    double p = s->kind == FSDP__DEVICE_KIND__DEVICE_KIND_CPU ? 0 : promx_peak_flops(s->name);
    if (p <= 0) return 0;
    sum += p;
  }
  return sum;
}

static int by_rank(const void *a, const void *b) {
  uint32_t x = (*(Fsdp__RankStats *const *)a)->rank, y = (*(Fsdp__RankStats *const *)b)->rank;
  return x < y ? -1 : x > y;
}

/* Every rank's full figures on a detail step (all nodes sent theirs), in rank order, into SUM. */
static fsdp_status gather_detail(const job_t *j, const jstep *st, Fsdp__StepSummary *sum) {
  const struct steps_win *w = job_steps_of(j)->win;
  if (st->step % w->detail_every) return FSDP_OK;
  sum->ranks = malloc((size_t)job_world(j) * sizeof *sum->ranks);
  if (!sum->ranks) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  for (int k = 0; k < w->njnodes; k++) {
    const Fsdp__NodeStepReport *nr = st->msgs[k] ? st->msgs[k]->node_step_report : NULL;
    for (size_t i = 0; nr && i < nr->n_detail && sum->n_ranks < (size_t)job_world(j); i++) sum->ranks[sum->n_ranks++] = nr->detail[i];
  }
  qsort(sum->ranks, sum->n_ranks, sizeof *sum->ranks, by_rank);
  return FSDP_OK;
}

/* `fsdpctl status --rank R`: keep the node report that carries rank R's figures of this step. */
static void keep_rank_detail(job_t *j, jstep *st) {
  for (int k = 0; job_steps(j)->detail_rank && k < job_steps(j)->win->njnodes; k++) {
    const Fsdp__NodeStepReport *nr = st->msgs[k] ? st->msgs[k]->node_step_report : NULL;
    for (size_t i = 0; nr && i < nr->n_detail; i++)
      if (nr->detail[i]->rank == job_steps(j)->detail_rank - 1) {
        wire_destroy(&job_steps(j)->rank_detail);
        job_steps(j)->rank_detail = st->msgs[k];
        st->msgs[k] = NULL;
        job_steps(j)->rank_detail_step = st->step;
        return;
      }
  }
}

/* Figure NAME of aggregate A: its index, or -1 when no rank reported it. */
static int agg_extra(const Fsdp__StepAgg *a, const char *name) {
  for (size_t i = 0; i < a->n_extra_names; i++)
    if (!strcmp(a->extra_names[i], name) && a->count[a->n_std + i]) return (int)(a->n_std + i);
  return -1;
}

/* The job's figures of save I of the step's report F, from every rank's (AGG's ckpt_* figures, see
 * relay.h): the longest blocked, wait and write times over the ranks, the ranks holding them and the
 * bytes of every rank's file, into *OUT. Without them (no rank's figures reached the aggregate), F's
 * own (ranks 0). */
static void ckpt_job(const Fsdp__StepAgg *agg, const Fsdp__StepReport *f, size_t i, Fsdp__CkptSave *out) {
  *out = *f->ckpt[i];
  char name[32];
  const char *pre = i ? "ckpt2_" : "ckpt_";
  int b, w, t, n;
  snprintf(name, sizeof name, "%sblocked_us", pre), b = agg_extra(agg, name);
  snprintf(name, sizeof name, "%swait_us", pre), w = agg_extra(agg, name);
  snprintf(name, sizeof name, "%swrite_us", pre), t = agg_extra(agg, name);
  snprintf(name, sizeof name, "%sbytes", pre), n = agg_extra(agg, name);
  if (b < 0 || w < 0 || t < 0 || n < 0) return;
  out->blocked_s = (double)agg->max[b] / 1e6, out->blocked_rank = agg->max_rank[b];
  out->wait_s = (double)agg->max[w] / 1e6;
  out->write_s = (double)agg->max[t] / 1e6, out->write_rank = agg->max_rank[t];
  out->bytes = agg->sum[n], out->ranks = agg->count[n];
}

/* The saves that became complete after the step: the job's figures into SAVES (SUM->ckpt points at
 * them) with the steps' pace while they were written (ckptpace.h), J's latest, and a line of the job
 * log each. */
static void ckpt_record(job_t *j, const Fsdp__StepReport *f, const Fsdp__StepAgg *agg, Fsdp__CkptSave saves[2],
                        Fsdp__CkptSave *ptrs[2], Fsdp__StepSummary *sum) {
  size_t n = f->n_ckpt < 2 ? f->n_ckpt : 2;
  for (size_t i = 0; i < n; i++) ckpt_job(agg, f, i, &saves[i]);
  int saves_now = ckpt_due(job_spec(j), (int)sum->step) || (job_stop_at(j) && sum->step == job_stop_at(j));
  ckptpace_step(&job_steps(j)->win->pace, sum->step, sum->step_ms, saves_now, saves, n);
  for (size_t i = 0; i < n; i++) {
    const Fsdp__CkptSave *k = &saves[i];
    ptrs[i] = &saves[i];
    job_steps(j)->ckpt = *k;
    job_log(j, "checkpoint of step %u complete: %.1f MB written by %u rank(s), the slowest in %.2f s (rank %u); training "
            "blocked up to %.3f s (rank %u)%s", k->step, (double)k->bytes / 1e6, k->ranks, k->write_s, k->write_rank,
            k->blocked_s, k->blocked_rank, k->wait_s >= 0.001 ? " (waiting for the previous save)" : "");
  }
  sum->ckpt = ptrs, sum->n_ckpt = n;
}

/* Every node reported step ST->step: its metrics line, its database row, its Prometheus figures. */
static void step_complete(coord_t *c, job_t *j, jstep *st) {
  JOB_ASSERT(job_phase_of(j) == JOB_RUNNING && st->step == job_steps(j)->done_step + 1);
  uint32_t step = st->step;
  const Fsdp__StepReport *f = st->msgs[st->first]->node_step_report->first;
  Fsdp__StepSummary sum = FSDP__STEP_SUMMARY__INIT;
  Fsdp__StepAgg agg;
  sum.step = step;
  sum.loss = f->loss, sum.lr = f->lr, sum.grad_norm = f->grad_norm, sum.tokens = f->tokens;
  sum.step_ms = st->step_ms, sum.step_ms_rank = st->step_ms_rank;
  sum.tokens_per_s = st->step_ms > 0 ? (double)f->tokens * 1000.0 / st->step_ms : 0.0;
  sum.trained_tokens = f->trained_tokens;
  sum.trained_tokens_per_s = st->step_ms > 0 ? (double)f->trained_tokens * 1000.0 / st->step_ms : 0.0;
  /* every rank computes the same validation loss (an all-reduce); the slowest rank's time */
  sum.has_val = f->has_val, sum.val_loss = f->val_loss, sum.eval_ms = f->has_val ? st->eval_ms : 0;
  Fsdp__CkptSave saves[2], *save_ptrs[2];
  char *line = NULL;
  fsdp_status rc = stepagg_to_msg(st->agg, 1, &agg);
  if (rc == FSDP_OK) {
    sum.agg = &agg;
    ckpt_record(j, f, &agg, saves, save_ptrs, &sum);
    rc = gather_detail(j, st, &sum);
    Fsdp__RankStats **ranks = sum.ranks;
    if (rc == FSDP_OK && sum.n_ranks && job_world(j) > STEPS_DETAIL_ALL_MAX) {   /* kept apart: see ranks_append */
      rc = ranks_append(j, &sum);
      sum.n_ranks = 0;
    }
    if (rc == FSDP_OK && f->has_start_val) {   /* [eval] at_start: step 0's line comes first */
      rc = metrics_start_line(f, &line);
      if (rc == FSDP_OK) rc = metrics_append(j, line);
      free(line);
      line = NULL;
    }
    if (rc == FSDP_OK) rc = metrics_line(&sum, &line);
    off_t end = job_steps(j)->metrics ? lseek(fileno(job_steps(j)->metrics), 0, SEEK_END) : -1;
    if (rc == FSDP_OK) rc = metrics_append(j, line);
    jobs_db_step row = {.step = (int)step, .loss = sum.loss, .lr = sum.lr, .grad_norm = sum.grad_norm,
                        .tokens = sum.tokens, .step_ms = sum.step_ms, .tokens_per_s = sum.tokens_per_s};
    /* A step is recorded in both or in neither: the line goes if the database refuses the step. */
    if (rc == FSDP_OK && (rc = jobs_db_add_step(c->db, job_id(j), &row, line)) != FSDP_OK) metrics_cut(j, end);
    if (rc == FSDP_OK && f->sample && f->sample[0]) job_log(j, "sample at step %u: %s", step, f->sample);
    /* the Prometheus figures (only with --metrics: nothing else reads them) */
    if (rc == FSDP_OK && c->cfg.metrics &&
        promx_on_step(&job_steps(j)->px, job_id(j), job_name(j), job_state(j), &sum, (size_t)job_world(j),
                      job_plan(j) ? job_plan(j)->flops_per_token : 0, peak_flops(c, j)) != FSDP_OK)
      log_warn("job %llu: %s", (unsigned long long)job_id(j), fsdp_last_error());
    free(ranks);
    stepagg_msg_free(&agg);
  }
  free(line);
  keep_rank_detail(j, st);
  for (int k = 0; k < job_steps(j)->win->njnodes; k++) wire_destroy(&st->msgs[k]);
  memset(st->got, 0, (size_t)job_steps(j)->win->njnodes);
  stepagg_reset(st->agg);
  st->step = 0, st->nnodes = 0, st->first = -1, st->step_ms = st->eval_ms = 0, st->step_ms_rank = 0;
  if (rc != FSDP_OK) {
    /* A step that cannot be recorded (most often: the disk under the state directory is full)
     * ends the job: training on without a record would report progress that is not there. */
    char why[1200];
    snprintf(why, sizeof why, "cannot record step %u: %s", step, fsdp_last_error());
    log_error("job %llu: %s", (unsigned long long)job_id(j), why);
    job_event(c, j, JE_FAIL, &(job_ev_args){.rank = -1, .node = -1, .msg = why});
    return;
  }
  log_debug("job %llu step %u: loss %.4f, %.0f tokens/s", (unsigned long long)job_id(j), step, sum.loss, sum.tokens_per_s);
  steps_recorded(c, j, step);
  job_publish_metrics(c);
}

/* Fold node report NR of job node K into its step. */
static fsdp_status take_report(job_t *j, int k, Fsdp__Msg **mp) {
  const Fsdp__NodeStepReport *nr = (*mp)->node_step_report;
  struct steps_win *w = job_steps(j)->win;
  uint32_t step = nr->first->step;
  jstep *st = &w->s[step % STEP_WINDOW];
  if (st->step != step) st->step = step;
  if (st->got[k]) return fsdp_set_error(FSDP_ERR_INVALID, "a second report for step %u", step);
  if (nr->agg->ranks != w->nranks[k])
    return fsdp_set_error(FSDP_ERR_INVALID, "a report of %u ranks for step %u (the node runs %u)", nr->agg->ranks, step, w->nranks[k]);
  TRY(stepagg_merge(st->agg, nr->agg));
  int first = st->first < 0 || nr->first_rank < st->msgs[st->first]->node_step_report->first_rank;
  if (nr->step_ms > st->step_ms || (nr->step_ms == st->step_ms && nr->step_ms_rank < st->step_ms_rank))
    st->step_ms = nr->step_ms, st->step_ms_rank = nr->step_ms_rank;
  if (nr->eval_ms > st->eval_ms) st->eval_ms = nr->eval_ms;
  if (first) {   /* the previous lowest is kept no longer, unless for its ranks' figures */
    if (st->first >= 0 && !st->msgs[st->first]->node_step_report->n_detail) wire_destroy(&st->msgs[st->first]);
    st->first = k;
  }
  if (first || nr->n_detail) {
    st->msgs[k] = *mp;
    *mp = NULL;
  }
  st->got[k] = 1;
  st->nnodes++;
  return FSDP_OK;
}

static void on_node_step(coord_t *c, node_t *n, Fsdp__Msg **mp);

/* A node's batch (NodeStepCmd.report_every): each of its steps on its own, in order, as if it had
 * come alone; a later step becomes a message of its own (the step keeps it until it is recorded). */
void steps_on_node_report(coord_t *c, node_t *n, Fsdp__Msg **mp) {
  Fsdp__NodeStepReport *head = (*mp)->node_step_report;
  size_t nmore = head->n_more;
  Fsdp__NodeStepReport **more = head->more;
  head->more = NULL, head->n_more = 0;
  on_node_step(c, n, mp);
  for (size_t i = 0; i < nmore; i++) {
    Fsdp__Msg *m = malloc(sizeof *m);   /* freed by wire_destroy, as the unpacked message it joins */
    if (!m) {
      log_error("out of memory: node %s's report of step %u is lost", n->name, more[i]->first->step);
      fsdp__node_step_report__free_unpacked(more[i], NULL);
      continue;
    }
    *m = (Fsdp__Msg)WIRE_MSG_INIT;
    m->version = FSDP__VERSION__PROTO_VERSION;
    m->body_case = FSDP__MSG__BODY_NODE_STEP_REPORT;
    m->node_step_report = more[i];
    on_node_step(c, n, &m);
    wire_destroy(&m);
  }
  free(more);
}

static void on_node_step(coord_t *c, node_t *n, Fsdp__Msg **mp) {
  const Fsdp__NodeStepReport *nr = (*mp)->node_step_report;
  job_t *j = job_find(c, nr->job_id);
  if (!j || job_phase_of(j) != JOB_RUNNING || !job_steps(j)->win) return;   /* stopping: every step is recorded */
  struct steps_win *w = job_steps(j)->win;
  int ni = (int)(n - c->nodes), k = ni < w->nmap ? w->node_k[ni] : -1;
  uint32_t step = nr->first->step;
  if (k < 0 || step <= job_steps(j)->done_step || step >= job_steps(j)->next_step || step > job_last_step(j)) {
    log_warn("job %llu: node %s: report for step %u outside the steps in flight (%u..%u) or from a node without its "
             "ranks; ignored", (unsigned long long)job_id(j), n->name, step, job_steps(j)->done_step + 1, job_steps(j)->next_step - 1);
    return;
  }
  if (take_report(j, k, mp) != FSDP_OK) {
    log_warn("job %llu: node %s: %s; ignored", (unsigned long long)job_id(j), n->name, fsdp_last_error());
    return;
  }
  /* Complete in order: the next step to finish is done_step+1; its successors may already be full. */
  for (;;) {
    jstep *st = &w->s[(job_steps(j)->done_step + 1) % STEP_WINDOW];
    if (job_phase_of(j) != JOB_RUNNING || st->step != job_steps(j)->done_step + 1 || st->nnodes < w->njnodes) break;
    step_complete(c, j, st);   /* its grant or stop; the job may have failed (the step could not be recorded) */
  }
}

const Fsdp__RankStats *steps_rank_detail(job_t *j, uint32_t rank, const Fsdp__StepSummary *line, uint32_t *step) {
  const Fsdp__RankStats *best = NULL;
  *step = 0;
  for (size_t i = 0; line && i < line->n_ranks; i++)
    if (line->ranks[i]->rank == rank) best = line->ranks[i], *step = line->step;
  if (!j) return best;
  if (job_phase_of(j) == JOB_RUNNING || job_phase_of(j) == JOB_STOPPING) job_steps(j)->detail_rank = rank + 1;   /* on every step from the next grant on */
  const Fsdp__NodeStepReport *nr = job_steps(j)->rank_detail ? job_steps(j)->rank_detail->node_step_report : NULL;
  for (size_t i = 0; nr && job_steps(j)->rank_detail_step > *step && i < nr->n_detail; i++)
    if (nr->detail[i]->rank == rank) best = nr->detail[i], *step = job_steps(j)->rank_detail_step;
  return best;
}

/* A job that resumes from the checkpoint of step S (a restart) keeps in metrics.jsonl only the
 * lines of steps ≤ S: the failed attempt's later steps are about to be trained again, and the file
 * must keep one line per step. The file is rewritten beside itself and renamed over. */
static void metrics_truncate(job_t *j, uint32_t last_step) {
  char path[PATH_MAX + 128];
  snprintf(path, sizeof path, "%s/metrics.jsonl", job_dir_of(j));
  if (job_steps(j)->metrics) fflush(job_steps(j)->metrics);
  int ifd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  FILE *in = ifd >= 0 ? fdopen(ifd, "r") : NULL;
  if (!in) {
    if (ifd >= 0) close(ifd);
    return;
  }
  fsutil_atomic a = FSUTIL_ATOMIC_INIT;
  FILE *out = fsutil_atomic_open(path, 0644, &a) == FSDP_OK ? fsutil_atomic_stream(&a) : NULL;
  if (!out) {
    log_warn("job %llu: cannot rewrite %s: %s", (unsigned long long)job_id(j), path, fsdp_last_error());
    fsutil_atomic_abort(&a);
    fclose(in);
    return;
  }
  char *line = NULL;
  size_t cap = 0;
  int dropped = 0;
  while (getline(&line, &cap, in) > 0) {
    json_t *o = json_loads(line, 0, NULL);
    json_int_t step = o ? json_integer_value(json_object_get(o, "step")) : 0;
    json_decref(o);
    if (step > (json_int_t)last_step || !last_step) dropped++;   /* from 0: at_start's step 0 again too */
    else fputs(line, out);
  }
  free(line);
  fclose(in);
  if (fsutil_atomic_commit(&a) != FSDP_OK) {
    log_warn("job %llu: cannot rewrite %s: %s", (unsigned long long)job_id(j), path, fsdp_last_error());
    return;
  }
  job_open_metrics(j);
  if (dropped || job_attempt(j) > 0)   /* a restart always says, so that its log shows what it replaced */
    job_log(j, "metrics.jsonl: dropped %d line(s) after step %u, which the restart trains again", dropped, last_step);
}

uint32_t steps_detail_every(int world) {
  if (world <= STEPS_DETAIL_ALL_MAX) return 1;
  return STEPS_DETAIL_EVERY * (uint32_t)((world + STEPS_DETAIL_RANKS - 1) / STEPS_DETAIL_RANKS);
}

void steps_on_ready(coord_t *c, job_t *j, int r, const Fsdp__WorkerReady *rd) {
  if (job_phase_of(j) != JOB_STARTING || job_rank(j, r)->ready) return;
  if (rd->rank != (uint32_t)r) {
    log_warn("job %llu: rank %d says it is rank %u; ignored", (unsigned long long)job_id(j), r, rd->rank);
    return;
  }
  job_ev_args a = {.rank = r, .node = -1, .step = rd->start_step};
  if (job_event(c, j, JE_RANK_READY, &a) != JOB_RUNNING) return;
  if (job_steps(j)->start_step > 0)
    job_log(j, "resuming from the checkpoint of step %u%s", job_steps(j)->start_step,
            job_steps(j)->start_step >= job_last_step(j) ? ": at or past the last step, nothing to train" : "");
  metrics_truncate(j, job_steps(j)->start_step);   /* also a start over (queued at a shutdown without a checkpoint) */
  if (job_steps(j)->start_step > job_last_step(j)) job_steps(j)->start_step = job_last_step(j);
  job_steps(j)->done_step = job_steps(j)->start_step;
  job_steps(j)->next_step = job_steps(j)->start_step + 1;
  if (win_new(c, j) != FSDP_OK) {
    char why[600];
    snprintf(why, sizeof why, "cannot start the steps: %s", fsdp_last_error());
    job_event(c, j, JE_FAIL, &(job_ev_args){.rank = -1, .node = -1, .msg = why});
    return;
  }
  if (job_steps(j)->done_step >= job_last_step(j)) steps_recorded(c, j, job_steps(j)->done_step);   /* nothing to train: the stop */
  else fill_window(c, j, 1);
}

void steps_stop(coord_t *c, job_t *j, job_ev ev) {
  uint32_t before = job_stop_at(j);
  /* The steps in flight were sent without the checkpoint flag: the stop's step carries it, granted now. */
  if (job_event(c, j, ev, NULL) == JOB_RUNNING && job_stop_at(j) && !before && job_steps(j)->win) fill_window(c, j, 1);
}

/* "1", "0, 1", "0, 1, 2, ..." for the ranks of J that SEL picks; returns how many. */
static int rank_list(const job_t *j, int (*sel)(const job_t *, int), char *buf, size_t n) {
  int k = 0;
  size_t len = 0;
  buf[0] = '\0';
  for (int r = 0; r < job_world(j); r++) {
    if (!sel(j, r)) continue;
    if (k < 8 && len < n) len += (size_t)snprintf(buf + len, n - len, "%s%d", k ? ", " : "", r);
    else if (k == 8 && len < n) len += (size_t)snprintf(buf + len, n - len, ", ...");
    k++;
  }
  return k;
}

/* Ranks that are alive and have said nothing about the current step: no error, and their node sent
 * no report of it (a node reports a step once all its ranks did). */
static int silent(const job_t *j, int r) {
  const rank_st *rk = job_rank(j, r);
  if (!rk->alive || rk->errored) return 0;
  if (job_phase_of(j) == JOB_STARTING || !job_steps_of(j)->win) return !rk->ready;
  const jstep *st = &job_steps_of(j)->win->s[(job_steps_of(j)->done_step + 1) % STEP_WINDOW];
  int k = rk->node < job_steps_of(j)->win->nmap ? job_steps_of(j)->win->node_k[rk->node] : -1;
  return st->step != job_steps_of(j)->done_step + 1 || k < 0 || !st->got[k];
}

static int not_ready(const job_t *j, int r) { return !job_rank(j, r)->ready; }

/* "; it runs on node NAME" when SEL picks exactly one rank of J (at scale, where to look), else "". */
static const char *node_of_one(const coord_t *c, const job_t *j, int (*sel)(const job_t *, int), char *buf, size_t n) {
  int one = -1, k = 0;
  for (int r = 0; r < job_world(j); r++)
    if (sel(j, r)) one = r, k++;
  buf[0] = '\0';
  if (k == 1 && job_rank(j, one)->node >= 0) snprintf(buf, n, "; it runs on node %s", c->nodes[job_rank(j, one)->node].name);
  return buf;
}

/* A node that runs a live rank of J and has missed a heartbeat: it may be on its way to lost. */
static int suspect_node(const coord_t *c, const job_t *j, double now) {
  for (int r = 0; r < job_world(j); r++) {
    const rank_st *rk = job_rank(j, r);
    if (rk->alive && rk->node >= 0 && !c->nodes[rk->node].lost && now - c->nodes[rk->node].last_seen > 1.5 * c->cfg.heartbeat_s)
      return 1;
  }
  return 0;
}

void steps_check(coord_t *c, job_t *j, double now) {
  if (!job_live(j) || !job_rank(j, 0)) return;
  char who[128], why[1600];
  job_ev_args a = {.rank = -1, .node = -1, .msg = why};
  int held_rank;
  double held_since, held_until;
  const char *held = job_held_error(j, &held_rank, &held_since, &held_until);
  if (held && now > held_until) {
    /* A communication error or a collective timeout is only the echo of the rank that caused it.
     * A node that missed a heartbeat may be about to be declared lost (which says so): wait for
     * that, at most as long as declaring it takes. Else blame the ranks that went silent. */
    double lost_by = held_since + (LOST_BEATS + 1) * c->cfg.heartbeat_s;
    if (suspect_node(c, j, now) && now < lost_by) {
      job_held_error_defer(j, now);   /* look again at the next tick */
      return;
    }
    int n = rank_list(j, silent, who, sizeof who);
    char where[300];
    if (n > 0)
      snprintf(why, sizeof why, "rank%s %s stopped responding (rank %d gave up waiting: %s)%s", n > 1 ? "s" : "", who,
               held_rank, held, node_of_one(c, j, silent, where, sizeof where));
    else
      snprintf(why, sizeof why, "rank %d failed: %s", held_rank, held);
    job_event(c, j, JE_DEADLINE, &a);
    return;
  }
  if (!job_deadline(j) || now <= job_deadline(j)) return;
  if (job_phase_of(j) == JOB_STARTING) {
    int n = rank_list(j, not_ready, who, sizeof who);
    snprintf(why, sizeof why, "rank%s %s %s not ready within %.0f s of the start", n > 1 ? "s" : "", n ? who : "?",
             n > 1 ? "were" : "was", job_start_timeout(j));
  } else {
    int n = rank_list(j, silent, who, sizeof who);
    char where[300];
    snprintf(why, sizeof why, "rank%s %s sent no report for step %u within %.0f s (2 x [fsdp] timeout_s)%s",
             n > 1 ? "s" : "", n ? who : "?", job_steps(j)->done_step + 1, job_step_timeout(j),
             node_of_one(c, j, silent, where, sizeof where));
  }
  job_event(c, j, JE_DEADLINE, &a);
}
