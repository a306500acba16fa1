/* wire — see wire.h. */
#include "wire.h"

#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <zmq.h>

#include "plan.h"   /* PLAN_MAX_TENSORS: the receiver's table size */

#define NAME_MAX_LEN 256
#define MAX_RANKS 65536
#define MAX_LIST 100000
#define MAX_EXTRA 64          /* extra per-rank figures (RankStats.extra) */
#define FIGURE_NAME_MAX 64

static const struct { Fsdp__Msg__BodyCase c; const char *name; } body_names[] = {
  {FSDP__MSG__BODY_SUBMIT_REQ, "submit_req"},       {FSDP__MSG__BODY_SUBMIT_RESP, "submit_resp"},
  {FSDP__MSG__BODY_STATUS_REQ, "status_req"},       {FSDP__MSG__BODY_STATUS_RESP, "status_resp"},
  {FSDP__MSG__BODY_LIST_REQ, "list_req"},           {FSDP__MSG__BODY_LIST_RESP, "list_resp"},
  {FSDP__MSG__BODY_CANCEL_REQ, "cancel_req"},       {FSDP__MSG__BODY_STOP_REQ, "stop_req"},
  {FSDP__MSG__BODY_LOGS_REQ, "logs_req"},
  {FSDP__MSG__BODY_LOGS_RESP, "logs_resp"},         {FSDP__MSG__BODY_NODES_REQ, "nodes_req"},
  {FSDP__MSG__BODY_NODES_RESP, "nodes_resp"},       {FSDP__MSG__BODY_SHUTDOWN_REQ, "shutdown_req"},
  {FSDP__MSG__BODY_ACK, "ack"},                     {FSDP__MSG__BODY_ERROR, "error"},
  {FSDP__MSG__BODY_AGENT_REGISTER, "agent_register"}, {FSDP__MSG__BODY_AGENT_WELCOME, "agent_welcome"},
  {FSDP__MSG__BODY_HEARTBEAT, "heartbeat"},         {FSDP__MSG__BODY_SPAWN_REQ, "spawn_req"},
  {FSDP__MSG__BODY_KILL_REQ, "kill_req"},           {FSDP__MSG__BODY_WORKER_EXIT, "worker_exit"},
  {FSDP__MSG__BODY_LOG_CHUNK, "log_chunk"},         {FSDP__MSG__BODY_AGENT_BYE, "agent_bye"},
  {FSDP__MSG__BODY_WORKER_HELLO, "worker_hello"},   {FSDP__MSG__BODY_WORKER_SETUP, "worker_setup"},
  {FSDP__MSG__BODY_STEP_CMD, "step_cmd"},           {FSDP__MSG__BODY_STEP_REPORT, "step_report"},
  {FSDP__MSG__BODY_WORKER_ERROR, "worker_error"},   {FSDP__MSG__BODY_WORKER_READY, "worker_ready"},
  {FSDP__MSG__BODY_STOP_CMD, "stop_cmd"},           {FSDP__MSG__BODY_KV_SET, "kv_set"},
  {FSDP__MSG__BODY_KV_GET, "kv_get"},               {FSDP__MSG__BODY_KV_RESP, "kv_resp"},
  {FSDP__MSG__BODY_TRACE_REQ, "trace_req"},         {FSDP__MSG__BODY_TRACE_RESP, "trace_resp"},
  {FSDP__MSG__BODY_TRACE_SPANS, "trace_spans"},
  {FSDP__MSG__BODY_NODE_STEP_CMD, "node_step_cmd"}, {FSDP__MSG__BODY_NODE_STEP_REPORT, "node_step_report"},
};

const char *wire_body_name(Fsdp__Msg__BodyCase c) {
  for (size_t i = 0; i < sizeof body_names / sizeof body_names[0]; i++)
    if (body_names[i].c == c) return body_names[i].name;
  return "unknown";
}

fsdp_status wire_env_push(wire_env *env, const void *data, size_t len) {
  if (env->n >= WIRE_MAX_ENV || len > WIRE_MAX_ENV_FRAME)
    return fsdp_set_error(FSDP_ERR_RANGE, "envelope full (%d frames, %zu bytes): at most %d frames of %d bytes",
                          env->n, len, WIRE_MAX_ENV, WIRE_MAX_ENV_FRAME);
  if (len) memcpy(env->data[env->n], data, len);
  env->len[env->n++] = len;
  return FSDP_OK;
}

/* ---- validation: every field a receiver will use, before it uses it ---- */

#define BAD(...) return fsdp_set_error(FSDP_ERR_INVALID, __VA_ARGS__)

static fsdp_status check_str(const char *s, size_t max, const char *what) {
  if (!s) BAD("%s is missing", what);
  size_t n = strnlen(s, max + 1);
  if (n > max) BAD("%s is longer than %zu bytes", what, max);
  return FSDP_OK;
}
#define STR(s, max, what) TRY(check_str((s), (max), (what)))
#define NEED(p, what) do { if (!(p)) BAD("%s is missing", what); } while (0)

static fsdp_status check_state(Fsdp__JobState s) {
  if (s < FSDP__JOB_STATE__QUEUED || s > FSDP__JOB_STATE__CANCELLED) BAD("job state %d is not a known state", (int)s);
  return FSDP_OK;
}

static fsdp_status check_device(Fsdp__DeviceKind k) {
  if (k != FSDP__DEVICE_KIND__DEVICE_KIND_CPU && k != FSDP__DEVICE_KIND__DEVICE_KIND_CUDA)
    BAD("device kind %d is not cpu or cuda", (int)k);
  return FSDP_OK;
}

/* Array lengths of RankStats match plan.h's enums: 7 memory categories, 4 phases, 3 collectives. */
static fsdp_status check_rank_stats(const Fsdp__RankStats *r) {
  if (r->rank >= MAX_RANKS) BAD("rank %u is out of range", r->rank);
  if (r->n_peak_bytes != 0 && r->n_peak_bytes != 7) BAD("peak_bytes has %zu entries, expected 7", r->n_peak_bytes);
  if (r->n_cur_bytes != 0 && r->n_cur_bytes != 7) BAD("cur_bytes has %zu entries, expected 7", r->n_cur_bytes);
  if (r->n_phase_us != 0 && r->n_phase_us != 4) BAD("phase_us has %zu entries, expected 4", r->n_phase_us);
  if (r->n_sent_bytes != 0 && r->n_sent_bytes != 3) BAD("sent_bytes has %zu entries, expected 3", r->n_sent_bytes);
  if (r->n_sent_inter_bytes != 0 && r->n_sent_inter_bytes != 3)
    BAD("sent_inter_bytes has %zu entries, expected 0 or 3", r->n_sent_inter_bytes);
  if (r->n_extra > MAX_EXTRA) BAD("%zu extra figures, at most %d", r->n_extra, MAX_EXTRA);
  for (size_t i = 0; i < r->n_extra; i++) {
    NEED(r->extra[i], "extra figure");
    STR(r->extra[i]->name, FIGURE_NAME_MAX, "figure name");
    if (!r->extra[i]->name[0]) BAD("an extra figure has no name");
  }
  return FSDP_OK;
}

/* A StepAgg's parallel arrays agree: one entry per figure, the histogram pairs add up, every
 * bucket index and rank in range. */
static fsdp_status check_step_agg(const Fsdp__StepAgg *a) {
  if (a->ranks > MAX_RANKS) BAD("aggregate of %u ranks", a->ranks);
  if (a->n_std > 64 || a->n_extra_names > MAX_EXTRA) BAD("aggregate of %u + %zu figures", a->n_std, a->n_extra_names);
  size_t nf = a->n_std + a->n_extra_names;
  for (size_t i = 0; i < a->n_extra_names; i++) STR(a->extra_names[i], FIGURE_NAME_MAX, "figure name");
  if (a->n_min != nf || a->n_min_rank != nf || a->n_max != nf || a->n_max_rank != nf || a->n_sum != nf ||
      a->n_hist_len != nf || a->n_count != nf || (a->n_median != 0 && a->n_median != nf))
    BAD("aggregate arrays disagree with its %zu figures", nf);
  size_t pairs = 0;
  for (size_t i = 0; i < nf; i++) {
    if (a->min_rank[i] >= MAX_RANKS || a->max_rank[i] >= MAX_RANKS) BAD("aggregate rank out of range");
    if (a->count[i] > a->ranks) BAD("figure %zu counts %u of %u ranks", i, a->count[i], a->ranks);
    pairs += a->hist_len[i];
  }
  if (a->n_hist_bucket != pairs || a->n_hist_count != pairs) BAD("aggregate histogram of %zu pairs is inconsistent", pairs);
  for (size_t i = 0; i < pairs; i++)
    if (a->hist_bucket[i] > 4096) BAD("histogram bucket %u out of range", a->hist_bucket[i]);
  return FSDP_OK;
}

static fsdp_status check_ckpt_save(const Fsdp__CkptSave *c) {
  NEED(c, "checkpoint save");
  if (!(c->blocked_s >= 0 && c->blocked_s < 1e9 && c->wait_s >= 0 && c->wait_s <= c->blocked_s && c->write_s >= 0 &&
        c->write_s < 1e9))
    BAD("checkpoint save of step %u: times blocked %g, wait %g, write %g s", c->step, c->blocked_s, c->wait_s, c->write_s);
  if (!(c->inflight_step_ms >= 0 && c->inflight_step_ms < 1e12 && c->before_step_ms >= 0 && c->before_step_ms < 1e12))
    BAD("checkpoint save of step %u: step times %g ms in flight, %g ms before", c->step, c->inflight_step_ms,
        c->before_step_ms);
  return FSDP_OK;
}

/* One step of a node (MORE: one of a batch's later steps, which carry no batch of their own). */
static fsdp_status check_node_step_report(const Fsdp__NodeStepReport *n, int more) {
  NEED(n, "node_step_report");
  NEED(n->first, "node_step_report first");
  NEED(n->agg, "node_step_report agg");
  STR(n->first->sample, WIRE_MAX_STRING, "sample text");
  if (n->first->n_ckpt > 2) BAD("node_step_report carries %zu checkpoint saves, at most 2", n->first->n_ckpt);
  for (size_t i = 0; i < n->first->n_ckpt; i++) TRY(check_ckpt_save(n->first->ckpt[i]));
  TRY(check_step_agg(n->agg));
  if (n->agg->ranks == 0 || n->n_detail > n->agg->ranks) BAD("node_step_report of %u ranks with %zu details", n->agg->ranks, n->n_detail);
  if (n->n_more > (more ? 0 : 1024)) BAD("node_step_report batches %zu more steps", n->n_more);
  for (size_t i = 0; i < n->n_detail; i++) {
    NEED(n->detail[i], "detail entry");
    TRY(check_rank_stats(n->detail[i]));
  }
  return FSDP_OK;
}

static fsdp_status check_summary(const Fsdp__StepSummary *s) {
  if (s->n_ranks > MAX_RANKS) BAD("step summary has %zu ranks", s->n_ranks);
  if (s->agg) TRY(check_step_agg(s->agg));
  for (size_t i = 0; i < s->n_ranks; i++) {
    NEED(s->ranks[i], "ranks entry");
    TRY(check_rank_stats(s->ranks[i]));
  }
  return FSDP_OK;
}

static fsdp_status check_job_info(const Fsdp__JobInfo *j) {
  STR(j->name, NAME_MAX_LEN, "job name");
  STR(j->reason, WIRE_MAX_STRING, "job reason");
  STR(j->job_dir, 4096, "job directory");
  STR(j->owner, NAME_MAX_LEN, "job owner");
  TRY(check_state(j->state));
  TRY(check_device(j->device));
  if (j->step > j->steps) BAD("job step %u is past its %u steps", j->step, j->steps);
  if (j->last) TRY(check_summary(j->last));
  if (j->ckpt) TRY(check_ckpt_save(j->ckpt));
  return FSDP_OK;
}

static fsdp_status check_slot(const Fsdp__DeviceSlot *d) {
  TRY(check_device(d->kind));
  STR(d->name, NAME_MAX_LEN, "device name");
  return FSDP_OK;
}

static fsdp_status check_plan(const Fsdp__Plan *p) {
  if (p->world == 0 || p->world > MAX_RANKS) BAD("plan world %u is out of range 1..%d", p->world, MAX_RANKS);
  if (p->sharding > 3) BAD("plan sharding %u is not full, grad_op, none or hybrid", p->sharding);
  /* full and grad_op: the world; none: 1; hybrid (3): a divisor of the world below it */
  int sw_ok = p->sharding == 3 ? p->shard_world >= 1 && p->shard_world < p->world && p->world % p->shard_world == 0
                               : p->shard_world == 1 || p->shard_world == p->world;
  if (!sw_ok) BAD("plan shard_world %u does not fit world %u and sharding %u", p->shard_world, p->world, p->sharding);
  if (p->n_units == 0 || p->n_units > MAX_LIST) BAD("plan has %zu units", p->n_units);
  int64_t base = 0;
  for (size_t u = 0; u < p->n_units; u++) {
    const Fsdp__PlanUnit *pu = p->units[u];
    NEED(pu, "plan unit");
    STR(pu->name, 16, "unit name");
    if (pu->n_tensors == 0 || pu->n_tensors > PLAN_MAX_TENSORS)
      BAD("unit %zu has %zu tensors (1..%d allowed)", u, pu->n_tensors, PLAN_MAX_TENSORS);
    if (pu->numel <= 0 || pu->padded < pu->numel || pu->shard_numel <= 0 ||
        pu->shard_numel * (int64_t)p->shard_world != pu->padded || pu->shard_base != base)
      BAD("unit %zu sizes are inconsistent", u);
    base += pu->shard_numel;
    int64_t end = 0;
    for (size_t t = 0; t < pu->n_tensors; t++) {
      const Fsdp__PlanTensor *pt = pu->tensors[t];
      NEED(pt, "plan tensor");
      STR(pt->name, 63, "tensor name");
      if (pt->n_shape < 1 || pt->n_shape > 2) BAD("tensor %s has %zu dimensions (1 or 2 allowed)", pt->name, pt->n_shape);
      int64_t n = 1;
      for (size_t d = 0; d < pt->n_shape; d++) {
        if (pt->shape[d] <= 0 || pt->shape[d] > (1ll << 40)) BAD("tensor %s has a bad shape", pt->name);
        n *= pt->shape[d];
      }
      if (n != pt->numel || pt->offset != end) BAD("tensor %s offset or size is inconsistent", pt->name);
      end += pt->numel;
    }
    if (end != pu->numel) BAD("unit %zu tensors do not add up to its size", u);
  }
  if (base != p->shard_total) BAD("plan shard_total %lld does not match its units", (long long)p->shard_total);
  const Fsdp__PlanModel *m = p->model;
  NEED(m, "plan model");
  if (m->arch >= (uint32_t)ARCH_N || m->rope_scaling > ROPE_SCALING_LINEAR) BAD("plan model arch %u / rope_scaling %u is out of range", m->arch, m->rope_scaling);
  if (!isfinite(m->norm_eps) || !isfinite(m->rope_theta) || !isfinite(m->rope_factor) ||
      !isfinite(m->rope_low_freq_factor) || !isfinite(m->rope_high_freq_factor))
    BAD("plan model has a number that is not finite");
  return FSDP_OK;
}

/* Parallel arrays of one length; kinds and lanes of worker/trace.h (9 and 5: wlink.c asserts it),
 * units -1..MAX_RANKS. */
#define TRACE_MAX_SPANS (1u << 20)
static fsdp_status check_trace_spans(const Fsdp__TraceSpans *t) {
  size_t n = t->n_kind;
  if (t->rank >= MAX_RANKS) BAD("trace rank %u is out of range", t->rank);
  if (n > TRACE_MAX_SPANS) BAD("trace of %zu spans (at most %u)", n, TRACE_MAX_SPANS);
  if (t->n_lane != n || t->n_unit != n || t->n_step != n || t->n_start_us != n || t->n_dur_us != n)
    BAD("trace span arrays differ in length");
  if (t->first_kept > t->last_kept) BAD("trace keeps steps %u..%u", t->first_kept, t->last_kept);
  for (size_t i = 0; i < n; i++)
    if (t->kind[i] >= 11 || t->lane[i] >= 6 || t->unit[i] < -1 || t->unit[i] >= MAX_RANKS)
      BAD("trace span %zu: kind %u, lane %u or unit %d is out of range", i, t->kind[i], t->lane[i], t->unit[i]);
  return FSDP_OK;
}

/* Fields this protocol version does not define are refused, at any depth: a peer of another version
 * is told so by the version check, and nothing unknown is carried (or re-sent) silently. */
static int has_unknown_fields(const ProtobufCMessage *m, int depth) {
  if (m->n_unknown_fields) return 1;
  if (depth > 8) return 0;   /* our messages nest four deep at most */
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    const char *base = (const char *)m;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      uint32_t which = *(const uint32_t *)(base + f->quantifier_offset);
      if (which != f->id) continue;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
      for (size_t k = 0; k < n; k++)
        if (v[k] && has_unknown_fields(v[k], depth + 1)) return 1;
    } else {
      const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)(base + f->offset);
      if (sub && has_unknown_fields(sub, depth + 1)) return 1;
    }
  }
  return 0;
}

/* The control protocol's bodies (fsdpctl <-> fsdpd, and the ack and error every peer sends);
 * *KNOWN is 0 for any other body, which check_peer_body validates. */
static fsdp_status check_ctl_body(const Fsdp__Msg *m, int *known) {
  *known = 1;
  switch (m->body_case) {
  case FSDP__MSG__BODY_SUBMIT_REQ:
    NEED(m->submit_req, "submit_req");
    STR(m->submit_req->spec_text, WIRE_MAX_STRING, "job spec");
    STR(m->submit_req->spec_path, 4096, "job spec path");
    STR(m->submit_req->base_dir, 4096, "job base directory");
    if (m->submit_req->umask_set && m->submit_req->umask > 0777) BAD("umask %o is out of range", m->submit_req->umask);
    return FSDP_OK;
  case FSDP__MSG__BODY_SUBMIT_RESP: NEED(m->submit_resp, "submit_resp"); return FSDP_OK;
  case FSDP__MSG__BODY_STATUS_REQ: NEED(m->status_req, "status_req"); return FSDP_OK;
  case FSDP__MSG__BODY_CANCEL_REQ: NEED(m->cancel_req, "cancel_req"); return FSDP_OK;
  case FSDP__MSG__BODY_STOP_REQ: NEED(m->stop_req, "stop_req"); return FSDP_OK;
  case FSDP__MSG__BODY_STATUS_RESP: NEED(m->status_resp, "status_resp"); return check_job_info(m->status_resp);
  case FSDP__MSG__BODY_LIST_REQ: NEED(m->list_req, "list_req"); return FSDP_OK;
  case FSDP__MSG__BODY_LIST_RESP:
    NEED(m->list_resp, "list_resp");
    if (m->list_resp->n_jobs > MAX_LIST) BAD("job list has %zu entries", m->list_resp->n_jobs);
    if (m->list_resp->n_state_jobs > 7) BAD("job counts for %zu states", m->list_resp->n_state_jobs);
    for (size_t i = 0; i < m->list_resp->n_jobs; i++) {
      NEED(m->list_resp->jobs[i], "job entry");
      TRY(check_job_info(m->list_resp->jobs[i]));
    }
    return FSDP_OK;
  case FSDP__MSG__BODY_LOGS_REQ:
    NEED(m->logs_req, "logs_req");
    if (m->logs_req->rank < -1 || m->logs_req->rank >= MAX_RANKS) BAD("log rank %d is out of range", m->logs_req->rank);
    return FSDP_OK;
  case FSDP__MSG__BODY_LOGS_RESP:
    NEED(m->logs_resp, "logs_resp");
    if (m->logs_resp->data.len > WIRE_MAX_STRING) BAD("log chunk of %zu bytes", m->logs_resp->data.len);
    return FSDP_OK;
  case FSDP__MSG__BODY_NODES_REQ: NEED(m->nodes_req, "nodes_req"); return FSDP_OK;
  case FSDP__MSG__BODY_NODES_RESP:
    NEED(m->nodes_resp, "nodes_resp");
    if (m->nodes_resp->n_nodes > MAX_LIST) BAD("node list has %zu entries", m->nodes_resp->n_nodes);
    for (size_t i = 0; i < m->nodes_resp->n_nodes; i++) {
      const Fsdp__NodeInfo *n = m->nodes_resp->nodes[i];
      NEED(n, "node entry");
      STR(n->name, NAME_MAX_LEN, "node name");
      if (n->n_slots > MAX_RANKS) BAD("node has %zu slots", n->n_slots);
      for (size_t s = 0; s < n->n_slots; s++) {
        NEED(n->slots[s], "slot");
        TRY(check_slot(n->slots[s]));
      }
    }
    return FSDP_OK;
  case FSDP__MSG__BODY_SHUTDOWN_REQ: NEED(m->shutdown_req, "shutdown_req"); return FSDP_OK;
  case FSDP__MSG__BODY_ACK: NEED(m->ack, "ack"); return FSDP_OK;
  case FSDP__MSG__BODY_ERROR:
    NEED(m->error, "error");
    STR(m->error->message, WIRE_MAX_STRING, "error message");
    if (m->error->code >= FSDP_STATUS_COUNT) BAD("error code %u is not a known status", m->error->code);
    return FSDP_OK;
  default: *known = 0; return FSDP_OK;
  }
}

/* The cluster's and the workers' bodies (agents, workers, relays <-> the coordinator). */
static fsdp_status check_peer_body(const Fsdp__Msg *m) {
  switch (m->body_case) {
  case FSDP__MSG__BODY_AGENT_REGISTER:
    NEED(m->agent_register, "agent_register");
    STR(m->agent_register->name, NAME_MAX_LEN, "node name");
    if (m->agent_register->cpu_slots > 4096) BAD("agent offers %u CPU slots (at most 4096)", m->agent_register->cpu_slots);
    if (m->agent_register->n_gpus > 1024) BAD("agent offers %zu GPUs (at most 1024)", m->agent_register->n_gpus);
    for (size_t i = 0; i < m->agent_register->n_gpus; i++) {
      NEED(m->agent_register->gpus[i], "gpu entry");
      TRY(check_slot(m->agent_register->gpus[i]));
    }
    return FSDP_OK;
  case FSDP__MSG__BODY_AGENT_WELCOME:
    NEED(m->agent_welcome, "agent_welcome");
    if (!(m->agent_welcome->heartbeat_s > 0 && m->agent_welcome->heartbeat_s <= 3600)) BAD("heartbeat interval out of range");
    return FSDP_OK;
  case FSDP__MSG__BODY_HEARTBEAT: NEED(m->heartbeat, "heartbeat"); return FSDP_OK;
  case FSDP__MSG__BODY_AGENT_BYE: NEED(m->agent_bye, "agent_bye"); return FSDP_OK;
  case FSDP__MSG__BODY_SPAWN_REQ: {
    const Fsdp__SpawnReq *s = m->spawn_req;
    NEED(s, "spawn_req");
    if (s->n_argv == 0 || s->n_argv > 256 || s->n_env > 256) BAD("spawn request has %zu arguments and %zu variables", s->n_argv, s->n_env);
    for (size_t i = 0; i < s->n_argv; i++) STR(s->argv[i], 4096, "argument");
    for (size_t i = 0; i < s->n_env; i++) {
      STR(s->env[i], 4096, "environment entry");
      if (!strchr(s->env[i], '=')) BAD("environment entry '%s' is not NAME=VALUE", s->env[i]);
    }
    STR(s->cwd, 4096, "working directory");
    STR(s->user, NAME_MAX_LEN, "user name");
    if (s->umask > 0777) BAD("umask %o is out of range", s->umask);
    if (s->rank >= MAX_RANKS) BAD("rank %u is out of range", s->rank);
    return FSDP_OK;
  }
  case FSDP__MSG__BODY_LOG_CHUNK:
    NEED(m->log_chunk, "log_chunk");
    if (m->log_chunk->data.len > WIRE_MAX_STRING) BAD("log chunk of %zu bytes", m->log_chunk->data.len);
    if (m->log_chunk->rank >= MAX_RANKS) BAD("rank %u is out of range", m->log_chunk->rank);
    return FSDP_OK;
  case FSDP__MSG__BODY_KILL_REQ:
    NEED(m->kill_req, "kill_req");
    if (m->kill_req->signal < 0 || m->kill_req->signal > 64) BAD("signal %d is out of range", m->kill_req->signal);
    return FSDP_OK;
  case FSDP__MSG__BODY_WORKER_EXIT:
    NEED(m->worker_exit, "worker_exit");
    if (m->worker_exit->rank >= MAX_RANKS) BAD("rank %u is out of range", m->worker_exit->rank);
    return FSDP_OK;
  case FSDP__MSG__BODY_WORKER_HELLO:
    NEED(m->worker_hello, "worker_hello");
    if (m->worker_hello->rank >= MAX_RANKS) BAD("rank %u is out of range", m->worker_hello->rank);
    STR(m->worker_hello->token, NAME_MAX_LEN, "worker token");
    return FSDP_OK;
  case FSDP__MSG__BODY_WORKER_SETUP: {
    const Fsdp__WorkerSetup *s = m->worker_setup;
    NEED(s, "worker_setup");
    if (s->world == 0 || s->world > MAX_RANKS || s->rank >= s->world) BAD("rank %u of world %u is out of range", s->rank, s->world);
    STR(s->resolved, WIRE_MAX_STRING, "resolved job");
    STR(s->spec_path, 4096, "job spec path");
    STR(s->kv_prefix, NAME_MAX_LEN, "kv prefix");
    STR(s->job_dir, 4096, "job directory");
    NEED(s->plan, "plan");
    TRY(check_plan(s->plan));
    if (s->plan->world != s->world) BAD("plan world %u differs from setup world %u", s->plan->world, s->world);
    return FSDP_OK;
  }
  case FSDP__MSG__BODY_STEP_CMD: NEED(m->step_cmd, "step_cmd"); return FSDP_OK;
  case FSDP__MSG__BODY_STOP_CMD: NEED(m->stop_cmd, "stop_cmd"); return FSDP_OK;
  case FSDP__MSG__BODY_NODE_STEP_CMD:
    NEED(m->node_step_cmd, "node_step_cmd");
    if (m->node_step_cmd->count == 0 || m->node_step_cmd->count > 1024) BAD("node_step_cmd grants %u steps", m->node_step_cmd->count);
    if (m->node_step_cmd->expect == 0 || m->node_step_cmd->expect > MAX_RANKS) BAD("node_step_cmd expects %u ranks", m->node_step_cmd->expect);
    if (m->node_step_cmd->n_checkpoint_steps > 1024) BAD("node_step_cmd lists %zu checkpoints", m->node_step_cmd->n_checkpoint_steps);
    return FSDP_OK;
  case FSDP__MSG__BODY_NODE_STEP_REPORT:
    TRY(check_node_step_report(m->node_step_report, 0));
    for (size_t i = 0; i < m->node_step_report->n_more; i++) TRY(check_node_step_report(m->node_step_report->more[i], 1));
    return FSDP_OK;
  case FSDP__MSG__BODY_STEP_REPORT:
    NEED(m->step_report, "step_report");
    NEED(m->step_report->stats, "step_report stats");
    if (m->step_report->n_ckpt > 2) BAD("step report carries %zu checkpoint saves, at most 2", m->step_report->n_ckpt);
    for (size_t i = 0; i < m->step_report->n_ckpt; i++) TRY(check_ckpt_save(m->step_report->ckpt[i]));
    return check_rank_stats(m->step_report->stats);
  case FSDP__MSG__BODY_WORKER_ERROR:
    NEED(m->worker_error, "worker_error");
    STR(m->worker_error->message, WIRE_MAX_STRING, "worker error message");
    if (m->worker_error->code >= FSDP_STATUS_COUNT) BAD("error code %u is not a known status", m->worker_error->code);
    return FSDP_OK;
  case FSDP__MSG__BODY_WORKER_READY: NEED(m->worker_ready, "worker_ready"); return FSDP_OK;
  case FSDP__MSG__BODY_KV_SET:
    NEED(m->kv_set, "kv_set");
    STR(m->kv_set->key, NAME_MAX_LEN, "kv key");
    if (m->kv_set->value.len > WIRE_MAX_STRING) BAD("kv value of %zu bytes", m->kv_set->value.len);
    return FSDP_OK;
  case FSDP__MSG__BODY_KV_GET:
    NEED(m->kv_get, "kv_get");
    STR(m->kv_get->key, NAME_MAX_LEN, "kv key");
    return FSDP_OK;
  case FSDP__MSG__BODY_KV_RESP:
    NEED(m->kv_resp, "kv_resp");
    if (m->kv_resp->value.len > WIRE_MAX_STRING) BAD("kv value of %zu bytes", m->kv_resp->value.len);
    return FSDP_OK;
  case FSDP__MSG__BODY_TRACE_REQ: NEED(m->trace_req, "trace_req"); return FSDP_OK;
  case FSDP__MSG__BODY_TRACE_SPANS: NEED(m->trace_spans, "trace_spans"); return check_trace_spans(m->trace_spans);
  case FSDP__MSG__BODY_TRACE_RESP:
    NEED(m->trace_resp, "trace_resp");
    if (m->trace_resp->n_ranks > MAX_RANKS || m->trace_resp->n_unit_names > MAX_LIST) BAD("trace_resp is too large");
    for (size_t i = 0; i < m->trace_resp->n_unit_names; i++) STR(m->trace_resp->unit_names[i], 16, "unit name");
    for (size_t i = 0; i < m->trace_resp->n_ranks; i++) {
      NEED(m->trace_resp->ranks[i], "trace_resp rank");
      TRY(check_trace_spans(m->trace_resp->ranks[i]));
    }
    return FSDP_OK;
  case FSDP__MSG__BODY__NOT_SET:
  default:
    BAD("message has no known body (case %d)", (int)m->body_case);
  }
}

fsdp_status wire_validate(const Fsdp__Msg *m) {
  if (has_unknown_fields(&m->base, 0))
    return fsdp_set_error(FSDP_ERR_FORMAT, "message has fields protocol version %d does not define", FSDP__VERSION__PROTO_VERSION);
  if (m->version != FSDP__VERSION__PROTO_VERSION)
    return fsdp_set_error(FSDP_ERR_FORMAT, "protocol version %u, expected %d", m->version, FSDP__VERSION__PROTO_VERSION);
  int known;
  fsdp_status rc = check_ctl_body(m, &known);
  return known ? rc : check_peer_body(m);
}

/* ---- packing ---- */

fsdp_status wire_pack(Fsdp__Msg *m, uint8_t **buf, size_t *len) {
  m->version = FSDP__VERSION__PROTO_VERSION;
  size_t n = fsdp__msg__get_packed_size(m);
  if (n == 0 || n > WIRE_MAX_BODY) return fsdp_set_error(FSDP_ERR_RANGE, "message of %zu bytes (1..%u allowed)", n, WIRE_MAX_BODY);
  uint8_t *b = malloc(n);
  if (!b) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes for a message", n);
  size_t w = fsdp__msg__pack(m, b);
  if (w != n) {
    free(b);
    return fsdp_set_error(FSDP_ERR_INTERNAL, "packed %zu bytes, expected %zu", w, n);
  }
  *buf = b;
  *len = n;
  return FSDP_OK;
}

fsdp_status wire_unpack(const uint8_t *buf, size_t len, Fsdp__Msg **out) {
  *out = NULL;
  if (len == 0) return fsdp_set_error(FSDP_ERR_FORMAT, "empty message body");
  if (len > WIRE_MAX_BODY) return fsdp_set_error(FSDP_ERR_FORMAT, "message of %zu bytes exceeds the %u-byte limit", len, WIRE_MAX_BODY);
  Fsdp__Msg *m = fsdp__msg__unpack(NULL, len, buf);
  if (!m) return fsdp_set_error(FSDP_ERR_FORMAT, "message body of %zu bytes is not a valid fsdp.Msg", len);
  fsdp_status rc = wire_validate(m);
  if (rc != FSDP_OK) {
    fsdp__msg__free_unpacked(m, NULL);
    return rc;
  }
  *out = m;
  return FSDP_OK;
}

void wire_destroy(Fsdp__Msg **m) {
  if (m && *m) {
    fsdp__msg__free_unpacked(*m, NULL);
    *m = NULL;
  }
}

/* ---- sockets ---- */

static fsdp_status zmq_fail(const char *what) {
  int e = zmq_errno();
  if (e == EAGAIN) return FSDP_ERR_TIMEOUT;
  return fsdp_set_error(FSDP_ERR_COMM, "%s: %s", what, zmq_strerror(e));
}

fsdp_status wire_socket_setup(void *sock) {
  int64_t max = (int64_t)WIRE_MAX_BODY + 4096;
  int linger = 0;
  if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max, sizeof max) != 0) return zmq_fail("zmq_setsockopt(ZMQ_MAXMSGSIZE)");
  if (zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger) != 0) return zmq_fail("zmq_setsockopt(ZMQ_LINGER)");
  return FSDP_OK;
}

fsdp_status wire_send(void *sock, const wire_env *env, Fsdp__Msg *m, int flags) {
  uint8_t *buf;
  size_t len;
  TRY(wire_pack(m, &buf, &len));
  fsdp_status rc = FSDP_OK;
  for (int i = 0; env && i < env->n; i++) {
    if (zmq_send(sock, env->data[i], env->len[i], flags | ZMQ_SNDMORE) < 0) {
      rc = zmq_fail("zmq_send(envelope)");
      goto out;
    }
  }
  if (zmq_send(sock, buf, len, flags) < 0) rc = zmq_fail("zmq_send(body)");
out:
  free(buf);
  return rc;
}

/* The last three ':'-separated fields, each all digits. */
int wire_peer_cred(const char *addr, size_t len, long *uid, long *pid) {
  unsigned long v[3];
  size_t end = len;
  for (int i = 2; i >= 0; i--) {
    size_t k = end;
    while (k > 0 && addr[k - 1] >= '0' && addr[k - 1] <= '9') k--;
    if (k == end || k == 0 || addr[k - 1] != ':' || end - k > 10) return -1;
    v[i] = 0;
    for (size_t d = k; d < end; d++) v[i] = v[i] * 10 + (unsigned long)(addr[d] - '0');
    end = k - 1;
  }
  if (v[0] > (unsigned long)(uid_t)-2 || v[2] == 0 || v[2] > 0x7fffffffUL) return -1;
  *uid = (long)v[0];
  *pid = (long)v[2];
  return 0;
}

fsdp_status wire_recv(void *sock, wire_env *env, Fsdp__Msg **out, int flags) {
  *out = NULL;
  wire_env local;
  if (!env) env = &local;
  env->n = 0;
  env->user_id[0] = '\0';
  env->peer_uid = env->peer_pid = -1;
  zmq_msg_t part;
  zmq_msg_init(&part);
  fsdp_status rc = FSDP_OK;
  int frames = 0, more = 1;
  while (more) {
    /* Only the first frame may block or fail with EAGAIN: the rest of a message arrives with it. */
    if (zmq_msg_recv(&part, sock, frames == 0 ? flags : 0) < 0) {
      fsdp_status e = zmq_fail("zmq_msg_recv");
      if (frames == 0) {
        zmq_msg_close(&part);
        return e;
      }
      rc = e;
      break;
    }
    frames++;
    more = zmq_msg_more(&part);
    if (!more) break;
    size_t n = zmq_msg_size(&part);
    if (env->n < WIRE_MAX_ENV && n <= WIRE_MAX_ENV_FRAME) {
      memcpy(env->data[env->n], zmq_msg_data(&part), n);
      env->len[env->n++] = n;
    } else if (rc == FSDP_OK) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "envelope of more than %d frames or a frame over %d bytes",
                          WIRE_MAX_ENV, WIRE_MAX_ENV_FRAME);
    }
  }
  if (frames > 0) {
    const char *uid = zmq_msg_gets(&part, "User-Id");
    if (uid && strlen(uid) < sizeof env->user_id) snprintf(env->user_id, sizeof env->user_id, "%s", uid);
    const char *addr = zmq_msg_gets(&part, "Peer-Address");
    if (addr) wire_peer_cred(addr, strlen(addr), &env->peer_uid, &env->peer_pid);
  }
  if (rc == FSDP_OK) rc = wire_unpack(zmq_msg_data(&part), zmq_msg_size(&part), out);
  zmq_msg_close(&part);
  return rc;
}
