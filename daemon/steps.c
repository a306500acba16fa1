/* steps — see steps.h. */
#define _GNU_SOURCE
#include "steps.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
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
  s.checkpoint = ckpt_due(&j->spec, (int)step);   /* every K-th step and the last (docs/checkpoints.md) */
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
  if (metrics_line(reps, (size_t)j->world, &line) == FSDP_OK) {
    if (j->metrics) {
      fputs(line, j->metrics);
      fputc('\n', j->metrics);
      fflush(j->metrics);
    }
  } else {
    log_error("job %llu: %s", (unsigned long long)j->id, fsdp_last_error());
  }
  jobs_db_step st = {.step = (int)step, .loss = sum.loss, .lr = sum.lr, .grad_norm = sum.grad_norm,
                     .tokens = sum.tokens, .step_ms = sum.step_ms, .tokens_per_s = sum.tokens_per_s};
  if (jobs_db_add_step(c->db, j->id, &st, line ? line : "{}") != FSDP_OK)
    log_error("job %llu: cannot record step %u: %s", (unsigned long long)j->id, step, fsdp_last_error());
  free(line);
  free(reps);
  for (int r = 0; r < j->world; r++) wire_free(&j->reports[b][r]);
  j->nreports[b] = 0;
  j->done_step = step;
  j->deadline = loop_now_mono() + j->step_timeout;
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
  while (!j->done && j->done_step < j->steps && j->nreports[(j->done_step + 1) % 2] == j->world) {
    step_complete(c, j, j->done_step + 1);
    fill_window(c, j);
  }
}

/* A job that resumes from the checkpoint of step S (a restart) keeps in metrics.jsonl only the
 * lines of steps ≤ S: the failed attempt's later steps are about to be trained again, and the file
 * must keep one line per step. The file is rewritten beside itself and renamed over. */
static void metrics_truncate(job_t *j, uint32_t last_step) {
  char path[PATH_MAX + 128], tmp[PATH_MAX + 160];
  snprintf(path, sizeof path, "%s/metrics.jsonl", j->job_dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (j->metrics) fflush(j->metrics);
  FILE *in = fopen(path, "r");
  if (!in) return;
  FILE *out = fopen(tmp, "w");
  if (!out) {
    log_warn("job %llu: cannot rewrite %s: %s", (unsigned long long)j->id, path, strerror(errno));
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
  if (fclose(out) != 0 || rename(tmp, path) != 0) {
    log_warn("job %llu: cannot rewrite %s: %s", (unsigned long long)j->id, path, strerror(errno));
    unlink(tmp);
    return;
  }
  if (j->metrics) fclose(j->metrics);
  j->metrics = fopen(path, "a");
  if (dropped) job_log(j, "metrics.jsonl: dropped %d line(s) after step %u, which the restart trains again", dropped, last_step);
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
  if (j->start_step > 0) {
    job_log(j, "resuming from the checkpoint of step %u%s", j->start_step,
            j->start_step >= j->steps ? ": at or past the last step, nothing to train" : "");
    metrics_truncate(j, j->start_step);
  }
  if (j->start_step > j->steps) j->start_step = j->steps;
  j->done_step = j->start_step;
  j->next_step = j->start_step + 1;
  j->deadline = loop_now_mono() + j->step_timeout;
  fill_window(c, j);
}
