/* wlink — see wlink.h. */
#include "monotime.h"
#include "wlink.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "curve.h"
#include "envknob.h"
#include "log.h"

_Static_assert(TRACE_NKIND == 11 && TRACE_NLANE == 6, "proto/wire.c's check_trace_spans knows 11 kinds and 6 lanes");
_Static_assert(TRACE_RING == 65536, "daemon/tracepull.h's TRACEPULL_RING_SPANS (its messages) says 65536");

struct wlink {
  void *ctx, *sock;
  const trace_t *trace;        /* answers trace pulls; NULL: no spans */
  Fsdp__Msg *setup;            /* the received worker_setup, owned */
  wire_env env;                /* [empty delimiter] */
};

/* Receive one message within timeout_s (< 0: no limit). */
static fsdp_status recv_msg(wlink *l, double timeout_s, Fsdp__Msg **out) {
  double deadline = monotime_s() + timeout_s;
  for (;;) {
    int ms = -1;
    if (timeout_s >= 0) {
      double left = deadline - monotime_s();
      if (left <= 0) return fsdp_set_error(FSDP_ERR_TIMEOUT, "the coordinator did not answer within %.0f s", timeout_s);
      ms = (int)(left * 1000) + 1;
    }
    zmq_pollitem_t it = {l->sock, 0, ZMQ_POLLIN, 0};
    int n = zmq_poll(&it, 1, ms);
    if (n < 0) return fsdp_set_error(FSDP_ERR_COMM, "zmq_poll: %s", zmq_strerror(zmq_errno()));
    if (n == 0) continue;
    wire_env env;
    fsdp_status rc = wire_recv(l->sock, &env, out, ZMQ_DONTWAIT);
    if (rc == FSDP_ERR_TIMEOUT) continue;
    if (rc == FSDP_ERR_FORMAT || rc == FSDP_ERR_INVALID) {
      log_warn("dropped an invalid message from the coordinator: %s", fsdp_last_error());
      continue;
    }
    return rc;
  }
}

static fsdp_status send_msg(wlink *l, Fsdp__Msg *m) { return wire_send(l->sock, &l->env, m, 0); }

/* An error reply from the coordinator becomes this side's error. */
static fsdp_status expect(Fsdp__Msg *m, Fsdp__Msg__BodyCase want, const char *what) {
  if (m->body_case == want) return FSDP_OK;
  if (m->body_case == FSDP__MSG__BODY_ERROR)
    return fsdp_set_error(m->error->code ? (fsdp_status)m->error->code : FSDP_ERR_COMM, "%s: coordinator says: %s",
                          what, m->error->message);
  if (m->body_case == FSDP__MSG__BODY_STOP_CMD) return fsdp_set_error(FSDP_ERR_CANCELLED, "%s: the job was stopped", what);
  return fsdp_set_error(FSDP_ERR_COMM, "%s: unexpected %s from the coordinator", what, wire_body_name(m->body_case));
}

fsdp_status wlink_open(const char *endpoint, uint64_t job_id, int rank, const char *token, double timeout_s,
                       wlink **out) {
  fsdp_status rc = FSDP_OK;
  wlink *l = calloc(1, sizeof *l);
  if (!l) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the coordinator link");
  l->ctx = zmq_ctx_new();
  l->sock = l->ctx ? zmq_socket(l->ctx, ZMQ_DEALER) : NULL;
  if (!l->sock) {
    rc = fsdp_set_error(FSDP_ERR_COMM, "cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
    goto fail;
  }
  TRY_GOTO(wire_socket_setup(l->sock), rc, fail);
  /* tcp:// needs CURVE: the agent that spawned this worker names its key files in the environment. */
  TRY_GOTO(curve_client_apply(l->sock, endpoint, envknob_get(ENV_SERVER_KEY), envknob_get(ENV_CLIENT_KEY),
                              "the worker's --connect endpoint"), rc, fail);
  if (zmq_connect(l->sock, endpoint) != 0) {
    rc = fsdp_set_error(FSDP_ERR_COMM, "cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
    goto fail;
  }
  TRY_GOTO(wire_env_push(&l->env, "", 0), rc, fail);

  Fsdp__WorkerHello hello = FSDP__WORKER_HELLO__INIT;
  hello.job_id = job_id;
  hello.rank = (uint32_t)rank;
  hello.pid = (uint32_t)getpid();
  hello.token = (char *)token;
  Fsdp__Msg m = FSDP__MSG__INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_HELLO;
  m.worker_hello = &hello;
  TRY_GOTO(send_msg(l, &m), rc, fail);
  TRY_GOTO(recv_msg(l, timeout_s, &l->setup), rc, fail);
  TRY_GOTO(expect(l->setup, FSDP__MSG__BODY_WORKER_SETUP, "waiting for the job setup"), rc, fail);
  if (l->setup->worker_setup->job_id != job_id || (int)l->setup->worker_setup->rank != rank) {
    rc = fsdp_set_error(FSDP_ERR_INVALID, "setup for job %llu rank %u, but this is job %llu rank %d",
                        (unsigned long long)l->setup->worker_setup->job_id, l->setup->worker_setup->rank,
                        (unsigned long long)job_id, rank);
    goto fail;
  }
  *out = l;
  return FSDP_OK;
fail:
  wlink_close(&l);
  return rc;
}

const Fsdp__WorkerSetup *wlink_setup(const wlink *l) { return l->setup->worker_setup; }

static fsdp_status kv_set(void *ctx, const char *key, const void *val, size_t len) {
  wlink *l = ctx;
  Fsdp__KvSet s = FSDP__KV_SET__INIT;
  s.key = (char *)key;
  s.value.data = (uint8_t *)val;
  s.value.len = len;
  Fsdp__Msg m = FSDP__MSG__INIT;
  m.body_case = FSDP__MSG__BODY_KV_SET;
  m.kv_set = &s;
  TRY(send_msg(l, &m));
  Fsdp__Msg *r = NULL;
  TRY(recv_msg(l, 60, &r));
  fsdp_status rc = expect(r, FSDP__MSG__BODY_ACK, "rendezvous");
  wire_destroy(&r);
  return rc;
}

static fsdp_status kv_get(void *ctx, const char *key, void **val, size_t *len, double timeout_s) {
  wlink *l = ctx;
  Fsdp__KvGet g = FSDP__KV_GET__INIT;
  g.key = (char *)key;
  Fsdp__Msg m = FSDP__MSG__INIT;
  m.body_case = FSDP__MSG__BODY_KV_GET;
  m.kv_get = &g;
  TRY(send_msg(l, &m));
  Fsdp__Msg *r = NULL;
  fsdp_status rc = recv_msg(l, timeout_s, &r);
  if (rc == FSDP_ERR_TIMEOUT)
    return fsdp_set_error(rc, "rendezvous: key %s did not appear within %.0f s (a peer rank did not start?)", key, timeout_s);
  TRY(rc);
  rc = expect(r, FSDP__MSG__BODY_KV_RESP, "rendezvous");
  if (rc == FSDP_OK && !r->kv_resp->found) rc = fsdp_set_error(FSDP_ERR_NOTFOUND, "rendezvous: no key %s", key);
  if (rc == FSDP_OK) {
    *len = r->kv_resp->value.len;
    *val = malloc(*len ? *len : 1);
    if (!*val) rc = fsdp_set_error(FSDP_ERR_NOMEM, "rendezvous: cannot allocate %zu bytes", *len);
    else memcpy(*val, r->kv_resp->value.data, *len);
  }
  wire_destroy(&r);
  return rc;
}

comm_kv wlink_kv(wlink *l) { return (comm_kv){.ctx = l, .set = kv_set, .get = kv_get}; }

fsdp_status wlink_ready(wlink *l, int start_step) {
  Fsdp__WorkerReady r = FSDP__WORKER_READY__INIT;
  r.rank = wlink_setup(l)->rank;
  r.start_step = (uint32_t)start_step;
  Fsdp__Msg m = FSDP__MSG__INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_READY;
  m.worker_ready = &r;
  return send_msg(l, &m);
}

void wlink_set_trace(wlink *l, const trace_t *t) { l->trace = t; }

/* Answer a trace pull: the spans of steps first..last this rank holds, and which steps it holds.
 * Only a failed send fails (the link is gone); a pull this rank cannot serve (out of memory) is
 * answered with no spans, so that it never ends the job. */
static fsdp_status answer_trace(wlink *l, const Fsdp__TraceReq *q) {
  trace_span *v = NULL;
  size_t n = 0;
  Fsdp__TraceSpans ts = FSDP__TRACE_SPANS__INIT;
  ts.rank = wlink_setup(l)->rank;
  ts.pull_id = q->pull_id;
  if (l->trace && trace_collect(l->trace, (int)q->first_step, (int)q->last_step, &v, &n) == FSDP_OK) {
    int first, last;
    trace_retained(l->trace, &first, &last);
    ts.first_kept = (uint32_t)first, ts.last_kept = (uint32_t)last;
  } else if (l->trace) {
    log_warn("trace pull %u: %s; answered with no spans", q->pull_id, fsdp_last_error());
  }
  uint32_t *kind = calloc(n ? n : 1, sizeof *kind), *lane = calloc(n ? n : 1, sizeof *lane);
  uint32_t *stp = calloc(n ? n : 1, sizeof *stp);
  int32_t *unit = calloc(n ? n : 1, sizeof *unit);
  uint64_t *start = calloc(n ? n : 1, sizeof *start), *dur = calloc(n ? n : 1, sizeof *dur);
  if (!kind || !lane || !stp || !unit || !start || !dur) {
    log_warn("trace pull %u: cannot allocate the answer (%zu spans); answered with no spans", q->pull_id, n);
    n = 0;
    ts.first_kept = ts.last_kept = 0;
  }
  for (size_t i = 0; i < n; i++) {
    kind[i] = v[i].kind, lane[i] = v[i].lane, unit[i] = v[i].unit, stp[i] = (uint32_t)v[i].step;
    start[i] = v[i].t0_us, dur[i] = v[i].t1_us - v[i].t0_us;
  }
  ts.n_kind = ts.n_lane = ts.n_unit = ts.n_step = ts.n_start_us = ts.n_dur_us = n;
  ts.kind = kind, ts.lane = lane, ts.unit = unit, ts.step = stp, ts.start_us = start, ts.dur_us = dur;
  Fsdp__Msg m = FSDP__MSG__INIT;
  m.body_case = FSDP__MSG__BODY_TRACE_SPANS;
  m.trace_spans = &ts;
  fsdp_status rc = send_msg(l, &m);
  free(v), free(kind), free(lane), free(stp), free(unit), free(start), free(dur);
  return rc;
}

fsdp_status wlink_next(wlink *l, int *step, int *checkpoint, int *last) {
  Fsdp__Msg *m = NULL;
  TRY(recv_msg(l, -1, &m));
  while (m->body_case == FSDP__MSG__BODY_TRACE_REQ) {
    fsdp_status rc = answer_trace(l, m->trace_req);
    wire_destroy(&m);
    TRY(rc);
    TRY(recv_msg(l, -1, &m));
  }
  fsdp_status rc = FSDP_OK;
  *checkpoint = *last = 0;
  if (m->body_case == FSDP__MSG__BODY_STEP_CMD) {
    *step = (int)m->step_cmd->step;
    *checkpoint = m->step_cmd->checkpoint;
    *last = m->step_cmd->last;
  } else if (m->body_case == FSDP__MSG__BODY_STOP_CMD) *step = 0;
  else rc = expect(m, FSDP__MSG__BODY_STEP_CMD, "waiting for a step");
  wire_destroy(&m);
  if (rc == FSDP_OK && *step < 0) rc = fsdp_set_error(FSDP_ERR_INVALID, "step %d", *step);
  return rc;
}

fsdp_status wlink_report(wlink *l, int rank, const rt_report *r) {
  uint64_t peak[MEM_NCAT], cur[MEM_NCAT], phase[RT_NPHASE], sent[COLL_NKIND], inter[COLL_NKIND];
  memcpy(peak, r->peak, sizeof peak);
  memcpy(cur, r->cur, sizeof cur);
  memcpy(phase, r->phase_us, sizeof phase);
  memcpy(sent, r->sent, sizeof sent);
  memcpy(inter, r->sent_inter, sizeof inter);
  Fsdp__RankStats st = FSDP__RANK_STATS__INIT;
  st.rank = (uint32_t)rank;
  st.n_peak_bytes = MEM_NCAT, st.peak_bytes = peak;
  st.n_cur_bytes = MEM_NCAT, st.cur_bytes = cur;
  st.n_phase_us = RT_NPHASE, st.phase_us = phase;
  st.n_sent_bytes = COLL_NKIND, st.sent_bytes = sent;
  if (inter[COLL_ALLGATHER] || inter[COLL_REDUCESCATTER] || inter[COLL_ALLREDUCE])   /* hybrid */
    st.n_sent_inter_bytes = COLL_NKIND, st.sent_inter_bytes = inter;
  Fsdp__StepReport rep = FSDP__STEP_REPORT__INIT;
  rep.step = (uint32_t)r->step;
  rep.loss = r->loss;
  rep.lr = r->lr;
  rep.grad_norm = r->grad_norm;
  rep.tokens = r->tokens;
  rep.trained_tokens = r->trained;
  rep.step_ms = r->step_ms;
  rep.has_val = r->has_val;
  rep.val_loss = r->val_loss;
  rep.eval_ms = r->eval_ms;
  rep.sample = (char *)r->sample;
  rep.has_start_val = r->has_start_val;
  rep.start_val_loss = r->start_val_loss;
  rep.start_eval_ms = r->start_eval_ms;
  rep.stats = &st;
  Fsdp__CkptSave cs[2], *csp[2];
  for (int i = 0; i < r->nckpt && i < 2; i++) {
    const ckpt_save_stats *k = &r->ckpt[i];
    fsdp__ckpt_save__init(&cs[i]);
    cs[i].step = (uint32_t)k->step, cs[i].blocked_s = k->blocked_s, cs[i].wait_s = k->wait_s;
    cs[i].write_s = k->write_s, cs[i].bytes = k->bytes;
    csp[i] = &cs[i];
  }
  rep.n_ckpt = (size_t)(r->nckpt < 2 ? r->nckpt : 2);
  rep.ckpt = csp;
  Fsdp__Msg m = FSDP__MSG__INIT;
  m.body_case = FSDP__MSG__BODY_STEP_REPORT;
  m.step_report = &rep;
  return send_msg(l, &m);
}

fsdp_status wlink_ack(wlink *l) {
  Fsdp__Ack a = FSDP__ACK__INIT;
  Fsdp__Msg m = FSDP__MSG__INIT;
  m.body_case = FSDP__MSG__BODY_ACK;
  m.ack = &a;
  return send_msg(l, &m);
}

void wlink_error(wlink *l, int rank, fsdp_status code, const char *message) {
  if (!l) return;
  Fsdp__WorkerError e = FSDP__WORKER_ERROR__INIT;
  e.rank = (uint32_t)rank;
  e.code = (uint32_t)code;
  e.message = (char *)message;
  Fsdp__Msg m = FSDP__MSG__INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_ERROR;
  m.worker_error = &e;
  send_msg(l, &m);
}

void wlink_close(wlink **pl) {
  wlink *l = pl ? *pl : NULL;
  if (!l) return;
  wire_destroy(&l->setup);
  if (l->sock) {
    /* Let the last report or error leave before the socket goes. */
    int linger = 2000;
    zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(l->sock);
  }
  if (l->ctx) zmq_ctx_term(l->ctx);
  free(l);
  *pl = NULL;
}
