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
#include "fsutil.h"
#include "job.h"
#include "log.h"
#include "metrics.h"

static void send_to_rank(coord_t *c, job_t *j, int r, Fsdp__Msg *m) {
  rank_st *rk = &j->ranks[r];
  if (rk->ident_len) coord_send(c, rk->ident, rk->ident_len, m);
}

static void send_step(coord_t *c, job_t *j, uint32_t step) {
  Fsdp__StepCmd s = FSDP__STEP_CMD__INIT;
  s.step = step;
  /* every K-th step and the last (docs/checkpoints.md), and the step a stop ends with */
  s.checkpoint = ckpt_due(&j->spec, (int)step) || (j->stop_at && step == j->stop_at);
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_STEP_CMD;
  m.step_cmd = &s;
  for (int r = 0; r < j->world; r++) send_to_rank(c, j, r, &m);
  j->next_step = step + 1;
}

static void send_stop(coord_t *c, job_t *j) {
  Fsdp__StopCmd s = FSDP__STOP_CMD__INIT;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_STOP_CMD;
  m.stop_cmd = &s;
  for (int r = 0; r < j->world; r++) send_to_rank(c, j, r, &m);
  j->next_step = j->steps + 1;
}

/* Keep two steps in flight: step s+1 is sent before the reports of step s arrive. */
static void fill_window(coord_t *c, job_t *j) {
  while (j->next_step <= j->steps && j->next_step <= j->done_step + 2) send_step(c, j, j->next_step);
  if (j->done_step >= j->steps && j->next_step == j->steps + 1) {
    send_stop(c, j);
    j->next_step = j->steps + 2;   /* stop sent */
  }
}

/* metrics.jsonl back to END bytes (the end before a line whose step could not be recorded). */
static void metrics_cut(job_t *j, off_t end) {
  if (j->metrics && end >= 0 && ftruncate(fileno(j->metrics), end) != 0)
    log_warn("job %llu: cannot cut back metrics.jsonl: %s", (unsigned long long)j->id, strerror(errno));
}

/* Append LINE and a newline to metrics.jsonl as one write; a short write (a full disk) is cut back,
 * so that the file only ever holds whole lines. *END: the file's end before (-1: not opened). */
static fsdp_status metrics_append(job_t *j, const char *line, off_t *end_out) {
  *end_out = -1;
  if (!j->metrics) return FSDP_OK;   /* could not be opened: said at the start */
  int fd = fileno(j->metrics);
  size_t len = strlen(line);
  char *buf = malloc(len + 1);
  if (!buf) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  memcpy(buf, line, len);
  buf[len] = '\n';
  off_t end = lseek(fd, 0, SEEK_END);
  ssize_t n = write(fd, buf, len + 1);
  int e = errno;
  free(buf);
  *end_out = end;
  if (n == (ssize_t)(len + 1)) return FSDP_OK;
  if (n >= 0) e = ENOSPC;   /* a short write: the device is full */
  metrics_cut(j, end);
  return fsdp_set_error(FSDP_ERR_IO, "cannot write %s/metrics.jsonl: %s", j->job_dir, strerror(e));
}

/* The sum of the peak FLOP/s of J's devices, 0 when one of them has no known peak (every CPU). */
static double peak_flops(const coord_t *c, const job_t *j) {
  double sum = 0;
  for (int r = 0; r < j->world; r++) {
    const rank_st *rk = &j->ranks[r];
    if (rk->node < 0 || rk->slot < 0) return 0;
    const slot_t *s = &c->nodes[rk->node].slots[rk->slot];
    double p = s->kind == FSDP__DEVICE_KIND__DEVICE_KIND_CPU ? 0 : promx_peak_flops(s->name);
    if (p <= 0) return 0;
    sum += p;
  }
  return sum;
}

static void step_complete(coord_t *c, job_t *j, uint32_t step) {
  int b = step % 2;
  Fsdp__StepReport **reps = malloc((size_t)j->world * sizeof *reps);
  if (!reps) {
    job_fail(c, j, "out of memory while recording step %u", step);
    return;
  }
  for (int r = 0; r < j->world; r++) reps[r] = j->reports[b][r]->step_report;
  char *line = NULL;
  Fsdp__StepSummary sum = FSDP__STEP_SUMMARY__INIT;
  metrics_summarize(reps, (size_t)j->world, &sum);
  fsdp_status rc = metrics_line(reps, (size_t)j->world, &line);
  off_t end = -1;
  if (rc == FSDP_OK) rc = metrics_append(j, line, &end);
  jobs_db_step st = {.step = (int)step, .loss = sum.loss, .lr = sum.lr, .grad_norm = sum.grad_norm,
                     .tokens = sum.tokens, .step_ms = sum.step_ms, .tokens_per_s = sum.tokens_per_s};
  /* A step is recorded in both or in neither: the line goes if the database refuses the step. */
  if (rc == FSDP_OK && (rc = jobs_db_add_step(c->db, j->id, &st, line)) != FSDP_OK) metrics_cut(j, end);
  if (rc == FSDP_OK && reps[0]->sample && reps[0]->sample[0]) job_log(j, "sample at step %u: %s", step, reps[0]->sample);
  /* the Prometheus figures (only with --metrics: nothing else reads them) */
  if (rc == FSDP_OK && c->cfg.metrics &&
      promx_on_step(&j->px, j->id, j->spec.name, j->state, reps, (size_t)j->world, &sum,
                    j->plan ? j->plan->flops_per_token : 0, peak_flops(c, j)) != FSDP_OK)
    log_warn("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
  free(line);
  free(reps);
  for (int r = 0; r < j->world; r++) wire_destroy(&j->reports[b][r]);
  j->nreports[b] = 0;
  if (rc != FSDP_OK) {
    /* A step that cannot be recorded (most often: the disk under the state directory is full)
     * ends the job: training on without a record would report progress that is not there. */
    log_error("job %llu: cannot record step %u: %s", (unsigned long long)j->id, step, fsdp_last_error());
    job_fail(c, j, "cannot record step %u: %s", step, fsdp_last_error());
    return;
  }
  j->done_step = step;
  j->deadline = loop_now_mono() + j->step_timeout;
  coord_publish_metrics(c);
  log_debug("job %llu step %u: loss %.4f, %.0f tokens/s", (unsigned long long)j->id, step, sum.loss, sum.tokens_per_s);
}

void steps_on_report(coord_t *c, job_t *j, int r, Fsdp__Msg **mp) {
  Fsdp__StepReport *rep = (*mp)->step_report;
  if (j->state != ST_RUNNING || j->done) return;
  if (rep->step <= j->done_step || rep->step >= j->next_step || rep->step > j->steps) {
    log_warn("job %llu rank %d: report for step %u outside the steps in flight (%u..%u); ignored",
             (unsigned long long)j->id, r, rep->step, j->done_step + 1, j->next_step - 1);
    return;
  }
  if (rep->stats->rank != (uint32_t)r) {
    log_warn("job %llu rank %d: report carries rank %u; ignored", (unsigned long long)j->id, r, rep->stats->rank);
    return;
  }
  int b = rep->step % 2;
  if (j->reports[b][r]) {
    log_warn("job %llu rank %d: second report for step %u; ignored", (unsigned long long)j->id, r, rep->step);
    return;
  }
  j->reports[b][r] = *mp;
  *mp = NULL;
  j->nreports[b]++;
  /* Complete in order: the next step to finish is done_step+1; its successor may already be full. */
  while (!j->done && !j->restart_pending && j->done_step < j->steps && j->nreports[(j->done_step + 1) % 2] == j->world) {
    step_complete(c, j, j->done_step + 1);
    if (j->done || j->restart_pending) break;   /* the step could not be recorded */
    fill_window(c, j);
  }
}

/* A job that resumes from the checkpoint of step S (a restart) keeps in metrics.jsonl only the
 * lines of steps ≤ S: the failed attempt's later steps are about to be trained again, and the file
 * must keep one line per step. The file is rewritten beside itself and renamed over. */
static void metrics_truncate(job_t *j, uint32_t last_step) {
  char path[PATH_MAX + 128];
  snprintf(path, sizeof path, "%s/metrics.jsonl", j->job_dir);
  if (j->metrics) fflush(j->metrics);
  int ifd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  FILE *in = ifd >= 0 ? fdopen(ifd, "r") : NULL;
  if (!in) {
    if (ifd >= 0) close(ifd);
    return;
  }
  fsutil_atomic a = FSUTIL_ATOMIC_INIT;
  FILE *out = fsutil_atomic_open(path, 0644, &a) == FSDP_OK ? fsutil_atomic_stream(&a) : NULL;
  if (!out) {
    log_warn("job %llu: cannot rewrite %s: %s", (unsigned long long)j->id, path, fsdp_last_error());
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
    if (step > (json_int_t)last_step) dropped++;
    else fputs(line, out);
  }
  free(line);
  fclose(in);
  if (fsutil_atomic_commit(&a) != FSDP_OK) {
    log_warn("job %llu: cannot rewrite %s: %s", (unsigned long long)j->id, path, fsdp_last_error());
    return;
  }
  job_open_metrics(j);
  if (dropped || j->attempt > 0)   /* a restart always says, so that its log shows what it replaced */
    job_log(j, "metrics.jsonl: dropped %d line(s) after step %u, which the restart trains again", dropped, last_step);
}

void steps_on_ready(coord_t *c, job_t *j, int r, const Fsdp__WorkerReady *rd) {
  if (j->done || j->state != ST_STARTING || j->ranks[r].ready) return;
  if (rd->rank != (uint32_t)r) {
    log_warn("job %llu: rank %d says it is rank %u; ignored", (unsigned long long)j->id, r, rd->rank);
    return;
  }
  if (j->nready > 0 && rd->start_step != j->start_step) {
    job_fail(c, j, "rank %d starts at step %u but the others at step %u", r, rd->start_step, j->start_step);
    return;
  }
  j->start_step = rd->start_step;
  j->ranks[r].ready = 1;
  if (++j->nready < j->world) return;
  job_set_state(c, j, ST_RUNNING, NULL);
  if (j->start_step > 0)
    job_log(j, "resuming from the checkpoint of step %u%s", j->start_step,
            j->start_step >= j->steps ? ": at or past the last step, nothing to train" : "");
  metrics_truncate(j, j->start_step);   /* also a start over (queued at a shutdown without a checkpoint) */
  if (j->start_step > j->steps) j->start_step = j->steps;
  j->done_step = j->start_step;
  j->next_step = j->start_step + 1;
  j->deadline = loop_now_mono() + j->step_timeout;
  fill_window(c, j);
}

int steps_stop(coord_t *c, job_t *j) {
  (void)c;
  /* a shutdown's stop needs only a dir: the worker saves where the step says so and resumes from dir */
  if (j->state != ST_RUNNING || j->done || j->restart_pending || (j->spec.ckpt_every <= 0 && !j->stop_for_shutdown) ||
      !j->spec.ckpt_dir[0])
    return 0;
  if (j->stop_at) return 1;   /* already stopping */
  if (j->next_step > j->steps) return 0;   /* every step is sent: the last one checkpoints anyway */
  /* The steps in flight were sent without the checkpoint flag: the next one carries it and ends the job. */
  j->stop_at = j->next_step;
  j->steps = j->stop_at;
  job_log(j, "stop requested: stopping after step %u, which saves a checkpoint", j->stop_at);
  log_info("job %llu: stop requested; stopping after step %u with a checkpoint", (unsigned long long)j->id, j->stop_at);
  fill_window(c, j);
  return 1;
}

void steps_on_error(coord_t *c, job_t *j, int r, const Fsdp__WorkerError *e) {
  const char *msg = e->message;   /* validated on receipt; the worker's log has where it came from */
  j->ranks[r].errored = 1;
  if (e->code != FSDP_ERR_COMM && e->code != FSDP_ERR_TIMEOUT) {
    job_fail(c, j, "rank %d failed: %s", r, msg);
    return;
  }
  if (j->pending[0]) return;
  snprintf(j->pending, sizeof j->pending, "%s", msg);
  j->pending_rank = r;
  j->pending_since = loop_now_mono();
  j->pending_until = j->pending_since + SECONDARY_GRACE_S;
}

/* "1", "0, 1", "0, 1, 2, ..." for the ranks of J that SEL picks; returns how many. */
static int rank_list(const job_t *j, int (*sel)(const job_t *, int), char *buf, size_t n) {
  int k = 0;
  size_t len = 0;
  buf[0] = '\0';
  for (int r = 0; r < j->world; r++) {
    if (!sel(j, r)) continue;
    if (k < 8 && len < n) len += (size_t)snprintf(buf + len, n - len, "%s%d", k ? ", " : "", r);
    else if (k == 8 && len < n) len += (size_t)snprintf(buf + len, n - len, ", ...");
    k++;
  }
  return k;
}

/* Ranks that are alive and have said nothing about the current step: no report, no error. */
static int silent(const job_t *j, int r) {
  const rank_st *rk = &j->ranks[r];
  if (!rk->alive || rk->errored) return 0;
  if (j->state == ST_STARTING) return !rk->ready;
  return !(j->reports[(j->done_step + 1) % 2] && j->reports[(j->done_step + 1) % 2][r]);
}

static int not_ready(const job_t *j, int r) { return !j->ranks[r].ready; }

/* A node that runs a live rank of J and has missed a heartbeat: it may be on its way to lost. */
static int suspect_node(const coord_t *c, const job_t *j, double now) {
  for (int r = 0; r < j->world; r++) {
    const rank_st *rk = &j->ranks[r];
    if (rk->alive && rk->node >= 0 && !c->nodes[rk->node].lost && now - c->nodes[rk->node].last_seen > 1.5 * c->cfg.heartbeat_s)
      return 1;
  }
  return 0;
}

void steps_check(coord_t *c, job_t *j, double now) {
  if (j->done || j->restart_pending || !j->ranks) return;
  char who[128];
  if (j->pending[0] && now > j->pending_until) {
    /* A communication error or a collective timeout is only the echo of the rank that caused it.
     * A node that missed a heartbeat may be about to be declared lost (which says so): wait for
     * that, at most as long as declaring it takes. Else blame the ranks that went silent. */
    double lost_by = j->pending_since + (LOST_BEATS + 1) * c->cfg.heartbeat_s;
    if (suspect_node(c, j, now) && now < lost_by) {
      j->pending_until = now;   /* look again at the next tick */
      return;
    }
    int n = rank_list(j, silent, who, sizeof who);
    if (n > 0)
      job_fail(c, j, "rank%s %s stopped responding (rank %d gave up waiting: %s)", n > 1 ? "s" : "", who, j->pending_rank,
               j->pending);
    else
      job_fail(c, j, "rank %d failed: %s", j->pending_rank, j->pending);
    return;
  }
  if (!j->deadline || now <= j->deadline) return;
  if (j->state == ST_STARTING) {
    int n = rank_list(j, not_ready, who, sizeof who);
    job_fail(c, j, "rank%s %s %s not ready within %.0f s of the start", n > 1 ? "s" : "", n ? who : "?", n > 1 ? "were" : "was",
             j->start_timeout);
  } else {
    int n = rank_list(j, silent, who, sizeof who);
    job_fail(c, j, "rank%s %s sent no report for step %u within %.0f s (2 x [fsdp] timeout_s)", n > 1 ? "s" : "",
             n ? who : "?", j->done_step + 1, j->step_timeout);
  }
}
