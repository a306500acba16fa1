/* tracepull — see tracepull.h. */
#include "tracepull.h"

#include <stdlib.h>
#include <string.h>

#include "job.h"
#include "log.h"
#include "relay.h"

struct tracepull {
  struct tracepull *next;
  uint32_t id;
  uint64_t job_id;
  wire_env env;              /* the ctl client's, for the reply */
  uint32_t first, last;
  uint32_t world, ngot;
  Fsdp__Msg **got;           /* per rank: its trace_spans, owned */
  double deadline;
};

static void pull_free(tracepull *p) {
  for (uint32_t r = 0; p->got && r < p->world; r++) wire_destroy(&p->got[r]);
  free(p->got);
  free(p);
}

/* Unlink P from the pending pulls and free it. */
static void pull_drop(coord_t *c, tracepull *p) {
  for (tracepull **q = &c->pulls; *q; q = &(*q)->next)
    if (*q == p) {
      *q = p->next;
      break;
    }
  pull_free(p);
}

static void pull_fail(coord_t *c, tracepull *p, fsdp_status code, const char *msg) {
  coord_reply_error(c->ctl, &p->env, code, msg);
  pull_drop(c, p);
}

/* Why job ID has no spans to give, when it is not a running job; NULL when it is. */
static const char *not_running(coord_t *c, uint64_t id, const job_t *j, char *buf, size_t n) {
  if (j && (job_phase_of(j) == JOB_RUNNING || job_phase_of(j) == JOB_STOPPING)) return NULL;
  jobs_db_row row;
  if (!j && jobs_db_get(c->db, id, &row) != FSDP_OK) {
    snprintf(buf, n, "no job %llu", (unsigned long long)id);
    return buf;
  }
  int state = j ? job_state(j) : row.state;
  if (!j) jobs_db_row_clear(&row);
  if (state == ST_QUEUED || state == ST_STARTING)
    snprintf(buf, n, "job %llu is %s: it has run no step yet", (unsigned long long)id, job_state_name(state));
  else
    snprintf(buf, n, "job %llu is %s: spans are kept in its workers' memory only while it runs",
             (unsigned long long)id, job_state_name(j && job_phase_of(j) == JOB_RESTART_WAIT ? ST_FAILED : state));
  return buf;
}

void tracepull_request(coord_t *c, const wire_env *env, const Fsdp__TraceReq *req) {
  char msg[512];
  job_t *j = job_find(c, req->job_id);
  const char *why = not_running(c, req->job_id, j, msg, sizeof msg);
  if (why) {
    coord_reply_error(c->ctl, env, j || strncmp(why, "no job", 6) ? FSDP_ERR_STATE : FSDP_ERR_NOTFOUND, why);
    return;
  }
  if (job_phase_of(j) == JOB_STOPPING) {   /* stop_cmd sent: the workers will exit, not answer */
    snprintf(msg, sizeof msg, "job %llu is finishing (its workers were told to stop): no spans to pull",
             (unsigned long long)job_id(j));
    coord_reply_error(c->ctl, env, FSDP_ERR_STATE, msg);
    return;
  }
  /* the workers run these before they read the pull: the steps their relays handed them, at least
   * RELAY_INFLIGHT beyond the last recorded one, at most the last granted */
  uint32_t next = job_next_step(j), done = job_done_step(j), start = job_start_step(j);
  uint32_t started = next - 1 < done + RELAY_INFLIGHT ? next - 1 : done + RELAY_INFLIGHT;
  uint32_t first = req->first_step, last = req->last_step;
  if (started <= start) {
    snprintf(msg, sizeof msg, "job %llu has not started a step yet", (unsigned long long)job_id(j));
    coord_reply_error(c->ctl, env, FSDP_ERR_STATE, msg);
    return;
  }
  if (first == 0 && last == 0) {
    last = started;
    first = last >= start + TRACEPULL_DEFAULT_STEPS ? last - TRACEPULL_DEFAULT_STEPS + 1 : start + 1;
  } else if (first == 0 || first > last) {
    snprintf(msg, sizeof msg, "steps %u..%u: allowed A..B with 1 <= A <= B", first, last);
    coord_reply_error(c->ctl, env, FSDP_ERR_RANGE, msg);
    return;
  } else if (last > started) {
    snprintf(msg, sizeof msg, "job %llu has started steps up to %u: --steps must end at or before it", (unsigned long long)job_id(j),
             started);
    coord_reply_error(c->ctl, env, FSDP_ERR_RANGE, msg);
    return;
  }
  tracepull *p = calloc(1, sizeof *p);
  if (p) p->got = calloc((size_t)job_world(j), sizeof *p->got);
  if (!p || !p->got) {
    free(p);
    coord_reply_error(c->ctl, env, FSDP_ERR_NOMEM, "out of memory");
    return;
  }
  p->id = ++c->next_pull_id;
  p->job_id = job_id(j);
  p->env = *env;
  p->first = first, p->last = last;
  p->world = (uint32_t)job_world(j);
  p->deadline = loop_now_mono() + TRACEPULL_TIMEOUT_S;
  p->next = c->pulls;
  c->pulls = p;
  Fsdp__TraceReq q = FSDP__TRACE_REQ__INIT;
  q.job_id = job_id(j), q.first_step = first, q.last_step = last, q.pull_id = p->id;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_TRACE_REQ;
  m.trace_req = &q;
  for (int r = 0; r < job_world(j); r++)
    job_send_rank(c, j, r, &m);
}

/* Every rank answered: check that each holds the whole range, then reply. */
static void pull_complete(coord_t *c, tracepull *p, const job_t *j) {
  char msg[512];
  for (uint32_t r = 0; r < p->world; r++) {
    const Fsdp__TraceSpans *t = p->got[r]->trace_spans;
    if (t->last_kept == 0) {
      snprintf(msg, sizeof msg, "rank %u holds no spans (FSDP_TRACE=0 in its environment; or one step records more spans "
               "than a worker keeps, %d; or it could not answer: see its log)", r, TRACEPULL_RING_SPANS);
      pull_fail(c, p, FSDP_ERR_STATE, msg);
      return;
    }
    if (p->first < t->first_kept || p->last > t->last_kept) {
      snprintf(msg, sizeof msg, "steps %u..%u are not all held any more: rank %u keeps the spans of steps %u..%u "
               "(a worker keeps a bounded ring of its latest spans)", p->first, p->last, r, t->first_kept, t->last_kept);
      pull_fail(c, p, FSDP_ERR_RANGE, msg);
      return;
    }
  }
  const plan_t *plan = job_plan(j);
  Fsdp__TraceSpans **ranks = calloc(p->world, sizeof *ranks);
  char **names = calloc((size_t)plan->nunits, sizeof *names);
  if (!ranks || !names) {
    free(ranks), free(names);
    pull_fail(c, p, FSDP_ERR_NOMEM, "out of memory");
    return;
  }
  for (uint32_t r = 0; r < p->world; r++) ranks[r] = p->got[r]->trace_spans;
  for (int u = 0; u < plan->nunits; u++) names[u] = (char *)plan->units[u].name;
  Fsdp__TraceResp tr = FSDP__TRACE_RESP__INIT;
  tr.job_id = p->job_id, tr.first_step = p->first, tr.last_step = p->last;
  tr.n_unit_names = (size_t)plan->nunits, tr.unit_names = names;
  tr.n_ranks = p->world, tr.ranks = ranks;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_TRACE_RESP;
  m.trace_resp = &tr;
  size_t bytes = fsdp__msg__get_packed_size(&m);
  if (bytes > WIRE_MAX_BODY) {
    snprintf(msg, sizeof msg, "the spans of steps %u..%u take %zu MiB, more than one reply may (%u MiB): ask for fewer "
             "steps with --steps", p->first, p->last, bytes >> 20, WIRE_MAX_BODY >> 20);
    coord_reply_error(c->ctl, &p->env, FSDP_ERR_RANGE, msg);
  } else {
    coord_reply(c->ctl, &p->env, &m);
  }
  free(ranks);
  free(names);
  pull_drop(c, p);
}

void tracepull_on_spans(coord_t *c, job_t *j, int r, Fsdp__Msg **mp) {
  const Fsdp__TraceSpans *t = (*mp)->trace_spans;
  tracepull *p = c->pulls;
  while (p && !(p->id == t->pull_id && p->job_id == job_id(j))) p = p->next;
  if (!p) {   /* a pull that already timed out or failed */
    log_debug("job %llu rank %d: spans for pull %u, which is no longer pending; dropped", (unsigned long long)job_id(j), r,
              t->pull_id);
    return;
  }
  if (t->rank != (uint32_t)r || (uint32_t)r >= p->world || p->got[r]) {
    log_warn("job %llu rank %d: trace_spans for rank %u or a second answer; ignored", (unsigned long long)job_id(j), r, t->rank);
    return;
  }
  p->got[r] = *mp;
  *mp = NULL;
  if (++p->ngot == p->world) pull_complete(c, p, j);
}

void tracepull_check(coord_t *c, double now) {
  char msg[1400];
  for (tracepull *p = c->pulls, *next; p; p = next) {
    next = p->next;
    const job_t *j = job_find(c, p->job_id);
    if (!j || job_ended(j) || job_phase_of(j) == JOB_RESTART_WAIT) {
      snprintf(msg, sizeof msg, "job %llu ended before all its ranks answered the trace pull%s%s",
               (unsigned long long)p->job_id, j && job_reason(j)[0] ? ": " : "", j ? job_reason(j) : "");
      pull_fail(c, p, FSDP_ERR_STATE, msg);
    } else if (now > p->deadline) {
      size_t k = (size_t)snprintf(msg, sizeof msg, "rank(s)");
      for (uint32_t r = 0; r < p->world && k < sizeof msg - 16; r++)
        if (!p->got[r]) k += (size_t)snprintf(msg + k, sizeof msg - k, " %u", r);
      snprintf(msg + k, sizeof msg - k, " of job %llu did not answer within %.0f s (workers answer between steps: "
               "are its steps longer than that?)", (unsigned long long)p->job_id, TRACEPULL_TIMEOUT_S);
      pull_fail(c, p, FSDP_ERR_TIMEOUT, msg);
    }
  }
}

void tracepull_destroy_all(coord_t *c) {
  while (c->pulls) pull_drop(c, c->pulls);
}
