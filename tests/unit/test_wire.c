/* test_wire — every message type round-trips; malformed frames are rejected, never trusted. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "check.h"
#include "arch.h"
#include "wire.h"

/* The messages' parts, in static storage for simplicity; fixtures_init gives them their values. */
static char text[] = "[job]\nname = t\n";
static uint64_t stats7[7] = {1, 2, 3, 4, 5, 6, 7}, stats4[4] = {10, 20, 30, 40}, stats3[3] = {5, 6, 7};
static Fsdp__RankStats rs = FSDP__RANK_STATS__INIT;
static Fsdp__RankStats *rsp[1];
static Fsdp__StepSummary sum = FSDP__STEP_SUMMARY__INIT;
static Fsdp__JobInfo ji = FSDP__JOB_INFO__INIT;
static Fsdp__JobInfo *jip[1];
static Fsdp__DeviceSlot slot = FSDP__DEVICE_SLOT__INIT;
static Fsdp__DeviceSlot *slotp[1];
static Fsdp__NodeInfo node = FSDP__NODE_INFO__INIT;
static Fsdp__NodeInfo *nodep[1];
static Fsdp__PlanTensor pt[2] = {FSDP__PLAN_TENSOR__INIT, FSDP__PLAN_TENSOR__INIT};
static Fsdp__PlanTensor *ptp[2];
static int64_t shape0[2] = {4, 8}, shape1[1] = {8};
static Fsdp__PlanUnit pu = FSDP__PLAN_UNIT__INIT;
static Fsdp__PlanUnit *pup[1];
static Fsdp__Plan plan = FSDP__PLAN__INIT;
static Fsdp__PlanModel pmodel = FSDP__PLAN_MODEL__INIT;
static char *argv[] = {"fsdp-worker", "--rank", "0"}, *env[] = {"OMP_NUM_THREADS=1"};
static uint64_t amin[1] = {3}, amax[1] = {9}, asum[1] = {12};
static uint32_t amin_rank[1] = {1}, amax_rank[1] = {0}, ahlen[1] = {2}, ahb[2] = {56, 112}, ahc[2] = {1, 1}, acount[1] = {2};
static uint32_t ckpt_steps[1] = {6};
static Fsdp__StepAgg agg = FSDP__STEP_AGG__INIT;
static Fsdp__StepReport first = FSDP__STEP_REPORT__INIT;
static uint32_t tkind[2] = {1, 0}, tlane[2] = {2, 0}, tstep[2] = {3, 3};
static int32_t tunit[2] = {1, -1};
static uint64_t tstart[2] = {100, 90}, tdur[2] = {5, 50};
static Fsdp__TraceSpans ts = FSDP__TRACE_SPANS__INIT;
static Fsdp__TraceSpans *tsp[1];
static char *unit_names[2] = {"root", "h.0"};

static void fixtures_init(void) {
  /* one standard figure over 2 ranks, its histogram in two buckets */
  fsdp__step_agg__init(&agg);
  agg.ranks = 2, agg.n_std = 1;
  agg.n_min = agg.n_max = agg.n_sum = agg.n_min_rank = agg.n_max_rank = agg.n_hist_len = agg.n_count = 1;
  agg.min = amin, agg.max = amax, agg.sum = asum, agg.min_rank = amin_rank, agg.max_rank = amax_rank;
  agg.hist_len = ahlen, agg.count = acount;
  agg.n_hist_bucket = agg.n_hist_count = 2, agg.hist_bucket = ahb, agg.hist_count = ahc;
  fsdp__step_report__init(&first);
  first.step = 5, first.loss = 2.5;
  /* two spans of one rank: allgather of unit 1 on the comm lane, the step on the host */
  fsdp__trace_spans__init(&ts);
  ts.rank = 1, ts.pull_id = 7, ts.first_kept = 1, ts.last_kept = 3;
  ts.n_kind = ts.n_lane = ts.n_unit = ts.n_step = ts.n_start_us = ts.n_dur_us = 2;
  ts.kind = tkind, ts.lane = tlane, ts.unit = tunit, ts.step = tstep, ts.start_us = tstart, ts.dur_us = tdur;
  tsp[0] = &ts;
  fsdp__rank_stats__init(&rs);
  rs.rank = 1;
  rs.n_peak_bytes = rs.n_cur_bytes = 7;
  rs.peak_bytes = rs.cur_bytes = stats7;
  rs.n_phase_us = 4, rs.phase_us = stats4;
  rs.n_sent_bytes = 3, rs.sent_bytes = stats3;
  rsp[0] = &rs;
  fsdp__step_summary__init(&sum);
  sum.step = 3, sum.loss = 2.5, sum.n_ranks = 1, sum.ranks = rsp;
  fsdp__job_info__init(&ji);
  ji.id = 7, ji.name = "tiny", ji.state = FSDP__JOB_STATE__RUNNING, ji.step = 3, ji.steps = 10, ji.last = &sum;
  jip[0] = &ji;
  fsdp__device_slot__init(&slot);
  slot.kind = FSDP__DEVICE_KIND__DEVICE_KIND_CUDA, slot.name = "H200", slot.mem_bytes = 1ull << 37;
  slotp[0] = &slot;
  fsdp__node_info__init(&node);
  node.name = "n0", node.n_slots = 1, node.slots = slotp;
  nodep[0] = &node;
  for (int i = 0; i < 2; i++) fsdp__plan_tensor__init(&pt[i]);
  pt[0].name = "h.0.w", pt[0].n_shape = 2, pt[0].shape = shape0, pt[0].numel = 32, pt[0].offset = 0;
  pt[1].name = "h.0.b", pt[1].n_shape = 1, pt[1].shape = shape1, pt[1].numel = 8, pt[1].offset = 32;
  ptp[0] = &pt[0], ptp[1] = &pt[1];
  fsdp__plan_unit__init(&pu);
  pu.name = "h.0", pu.n_tensors = 2, pu.tensors = ptp, pu.numel = 40, pu.padded = 128, pu.shard_numel = 64;
  pup[0] = &pu;
  fsdp__plan__init(&plan);
  plan.world = 2, plan.shard_world = 2, plan.n_units = 1, plan.units = pup, plan.shard_total = 64;
  fsdp__plan_model__init(&pmodel);   /* a tied Llama with llama3 rope scaling */
  pmodel.arch = 1, pmodel.tie_embeddings = 1, pmodel.norm_eps = 1e-5, pmodel.rope_theta = 500000;
  pmodel.rope_scaling = 1, pmodel.rope_factor = 32, pmodel.rope_low_freq_factor = 1, pmodel.rope_high_freq_factor = 4;
  pmodel.rope_original_max_pos = 8192;
  plan.model = &pmodel;
}

/* Build a valid Msg of every body case (over the fixtures above). */
static Fsdp__Msg make_msg(Fsdp__Msg__BodyCase c) {
  static union {
    Fsdp__SubmitReq submit_req; Fsdp__SubmitResp submit_resp; Fsdp__JobQuery q; Fsdp__ListReq list_req;
    Fsdp__ListResp list_resp; Fsdp__LogsReq logs_req; Fsdp__LogsResp logs_resp; Fsdp__NodesReq nodes_req;
    Fsdp__NodesResp nodes_resp; Fsdp__ShutdownReq shutdown_req; Fsdp__Ack ack; Fsdp__Error error;
    Fsdp__AgentRegister reg; Fsdp__AgentWelcome welcome; Fsdp__Heartbeat hb; Fsdp__AgentBye bye; Fsdp__SpawnReq spawn;
    Fsdp__KillReq kill; Fsdp__WorkerExit wexit; Fsdp__LogChunk chunk; Fsdp__WorkerHello hello;
    Fsdp__WorkerSetup setup; Fsdp__StepCmd step; Fsdp__StepReport report; Fsdp__WorkerError werr;
    Fsdp__WorkerReady ready; Fsdp__StopCmd stop; Fsdp__KvSet kvs; Fsdp__KvGet kvg; Fsdp__KvResp kvr;
    Fsdp__TraceReq treq; Fsdp__TraceResp tresp; Fsdp__NodeStepCmd grant; Fsdp__NodeStepReport nrep;
  } b;
  fixtures_init();
  Fsdp__Msg m = FSDP__MSG__INIT;
  m.body_case = c;
  memset(&b, 0, sizeof b);
  switch (c) {
  case FSDP__MSG__BODY_SUBMIT_REQ: fsdp__submit_req__init(&b.submit_req); b.submit_req.spec_text = text; m.submit_req = &b.submit_req; break;
  case FSDP__MSG__BODY_SUBMIT_RESP: fsdp__submit_resp__init(&b.submit_resp); b.submit_resp.job_id = 42; m.submit_resp = &b.submit_resp; break;
  case FSDP__MSG__BODY_STATUS_REQ: fsdp__job_query__init(&b.q); b.q.job_id = 42; m.status_req = &b.q; break;
  case FSDP__MSG__BODY_CANCEL_REQ: fsdp__job_query__init(&b.q); b.q.job_id = 42; m.cancel_req = &b.q; break;
  case FSDP__MSG__BODY_STOP_REQ: fsdp__job_query__init(&b.q); b.q.job_id = 42; m.stop_req = &b.q; break;
  case FSDP__MSG__BODY_STATUS_RESP: m.status_resp = &ji; break;
  case FSDP__MSG__BODY_LIST_REQ: fsdp__list_req__init(&b.list_req); m.list_req = &b.list_req; break;
  case FSDP__MSG__BODY_LIST_RESP: fsdp__list_resp__init(&b.list_resp); b.list_resp.n_jobs = 1; b.list_resp.jobs = jip; m.list_resp = &b.list_resp; break;
  case FSDP__MSG__BODY_LOGS_REQ: fsdp__logs_req__init(&b.logs_req); b.logs_req.job_id = 1; b.logs_req.rank = 1; m.logs_req = &b.logs_req; break;
  case FSDP__MSG__BODY_LOGS_RESP: fsdp__logs_resp__init(&b.logs_resp); b.logs_resp.data.data = (uint8_t *)text; b.logs_resp.data.len = 5; m.logs_resp = &b.logs_resp; break;
  case FSDP__MSG__BODY_NODES_REQ: fsdp__nodes_req__init(&b.nodes_req); m.nodes_req = &b.nodes_req; break;
  case FSDP__MSG__BODY_NODES_RESP: fsdp__nodes_resp__init(&b.nodes_resp); b.nodes_resp.n_nodes = 1; b.nodes_resp.nodes = nodep; m.nodes_resp = &b.nodes_resp; break;
  case FSDP__MSG__BODY_SHUTDOWN_REQ: fsdp__shutdown_req__init(&b.shutdown_req); m.shutdown_req = &b.shutdown_req; break;
  case FSDP__MSG__BODY_ACK: fsdp__ack__init(&b.ack); m.ack = &b.ack; break;
  case FSDP__MSG__BODY_ERROR: fsdp__error__init(&b.error); b.error.code = FSDP_ERR_NOTFOUND; b.error.message = "no job 42"; m.error = &b.error; break;
  case FSDP__MSG__BODY_AGENT_REGISTER: fsdp__agent_register__init(&b.reg); b.reg.name = "n0"; b.reg.cpu_slots = 2; b.reg.host_mem_bytes = 123ull << 30; b.reg.n_gpus = 1; b.reg.gpus = slotp; m.agent_register = &b.reg; break;
  case FSDP__MSG__BODY_AGENT_WELCOME: fsdp__agent_welcome__init(&b.welcome); b.welcome.node_id = 1; b.welcome.heartbeat_s = 1; m.agent_welcome = &b.welcome; break;
  case FSDP__MSG__BODY_HEARTBEAT: fsdp__heartbeat__init(&b.hb); b.hb.node_id = 1; m.heartbeat = &b.hb; break;
  case FSDP__MSG__BODY_AGENT_BYE: fsdp__agent_bye__init(&b.bye); b.bye.node_id = 1; m.agent_bye = &b.bye; break;
  case FSDP__MSG__BODY_SPAWN_REQ: fsdp__spawn_req__init(&b.spawn); b.spawn.n_argv = 3; b.spawn.argv = argv; b.spawn.n_env = 1; b.spawn.env = env; m.spawn_req = &b.spawn; break;
  case FSDP__MSG__BODY_KILL_REQ: fsdp__kill_req__init(&b.kill); b.kill.job_id = 1; b.kill.signal = 9; m.kill_req = &b.kill; break;
  case FSDP__MSG__BODY_WORKER_EXIT: fsdp__worker_exit__init(&b.wexit); b.wexit.rank = 1; b.wexit.term_signal = 9; m.worker_exit = &b.wexit; break;
  case FSDP__MSG__BODY_LOG_CHUNK: fsdp__log_chunk__init(&b.chunk); b.chunk.data.data = (uint8_t *)text; b.chunk.data.len = 3; m.log_chunk = &b.chunk; break;
  case FSDP__MSG__BODY_WORKER_HELLO: fsdp__worker_hello__init(&b.hello); b.hello.rank = 1; b.hello.token = "abc"; m.worker_hello = &b.hello; break;
  case FSDP__MSG__BODY_WORKER_SETUP: fsdp__worker_setup__init(&b.setup); b.setup.rank = 1; b.setup.world = 2; b.setup.resolved = text; b.setup.plan = &plan; m.worker_setup = &b.setup; break;
  case FSDP__MSG__BODY_STEP_CMD: fsdp__step_cmd__init(&b.step); b.step.step = 5; m.step_cmd = &b.step; break;
  case FSDP__MSG__BODY_STEP_REPORT: fsdp__step_report__init(&b.report); b.report.step = 5; b.report.loss = 1.25; b.report.stats = &rs; m.step_report = &b.report; break;
  case FSDP__MSG__BODY_WORKER_ERROR: fsdp__worker_error__init(&b.werr); b.werr.code = FSDP_ERR_TIMEOUT; b.werr.message = "peer silent"; m.worker_error = &b.werr; break;
  case FSDP__MSG__BODY_WORKER_READY: fsdp__worker_ready__init(&b.ready); b.ready.rank = 1; m.worker_ready = &b.ready; break;
  case FSDP__MSG__BODY_STOP_CMD: fsdp__stop_cmd__init(&b.stop); m.stop_cmd = &b.stop; break;
  case FSDP__MSG__BODY_KV_SET: fsdp__kv_set__init(&b.kvs); b.kvs.key = "job-1/rank0"; b.kvs.value.data = (uint8_t *)text; b.kvs.value.len = 4; m.kv_set = &b.kvs; break;
  case FSDP__MSG__BODY_KV_GET: fsdp__kv_get__init(&b.kvg); b.kvg.key = "job-1/rank0"; m.kv_get = &b.kvg; break;
  case FSDP__MSG__BODY_TRACE_REQ: fsdp__trace_req__init(&b.treq); b.treq.job_id = 3; b.treq.first_step = 2; b.treq.last_step = 3; m.trace_req = &b.treq; break;
  case FSDP__MSG__BODY_TRACE_SPANS: m.trace_spans = &ts; break;
  case FSDP__MSG__BODY_TRACE_RESP: fsdp__trace_resp__init(&b.tresp); b.tresp.job_id = 3; b.tresp.n_unit_names = 2; b.tresp.unit_names = unit_names; b.tresp.n_ranks = 1; b.tresp.ranks = tsp; m.trace_resp = &b.tresp; break;
  case FSDP__MSG__BODY_NODE_STEP_CMD: fsdp__node_step_cmd__init(&b.grant); b.grant.job_id = 3; b.grant.first_step = 5; b.grant.count = 2; b.grant.expect = 8; b.grant.n_checkpoint_steps = 1; b.grant.checkpoint_steps = ckpt_steps; m.node_step_cmd = &b.grant; break;
  case FSDP__MSG__BODY_NODE_STEP_REPORT: fsdp__node_step_report__init(&b.nrep); b.nrep.job_id = 3; b.nrep.first = &first; b.nrep.agg = &agg; b.nrep.step_ms = 12.5; b.nrep.n_detail = 1; b.nrep.detail = rsp; m.node_step_report = &b.nrep; break;
  case FSDP__MSG__BODY_KV_RESP: fsdp__kv_resp__init(&b.kvr); b.kvr.found = 1; b.kvr.value.data = (uint8_t *)text; b.kvr.value.len = 4; m.kv_resp = &b.kvr; break;
  default: break;
  }
  return m;
}

static const Fsdp__Msg__BodyCase all_cases[] = {
  FSDP__MSG__BODY_SUBMIT_REQ, FSDP__MSG__BODY_SUBMIT_RESP, FSDP__MSG__BODY_STATUS_REQ, FSDP__MSG__BODY_STATUS_RESP,
  FSDP__MSG__BODY_LIST_REQ, FSDP__MSG__BODY_LIST_RESP, FSDP__MSG__BODY_CANCEL_REQ, FSDP__MSG__BODY_STOP_REQ, FSDP__MSG__BODY_LOGS_REQ,
  FSDP__MSG__BODY_LOGS_RESP, FSDP__MSG__BODY_NODES_REQ, FSDP__MSG__BODY_NODES_RESP, FSDP__MSG__BODY_SHUTDOWN_REQ,
  FSDP__MSG__BODY_ACK, FSDP__MSG__BODY_ERROR, FSDP__MSG__BODY_AGENT_REGISTER, FSDP__MSG__BODY_AGENT_WELCOME,
  FSDP__MSG__BODY_HEARTBEAT, FSDP__MSG__BODY_AGENT_BYE, FSDP__MSG__BODY_SPAWN_REQ, FSDP__MSG__BODY_KILL_REQ, FSDP__MSG__BODY_WORKER_EXIT,
  FSDP__MSG__BODY_LOG_CHUNK, FSDP__MSG__BODY_WORKER_HELLO, FSDP__MSG__BODY_WORKER_SETUP, FSDP__MSG__BODY_STEP_CMD,
  FSDP__MSG__BODY_STEP_REPORT, FSDP__MSG__BODY_WORKER_ERROR, FSDP__MSG__BODY_WORKER_READY, FSDP__MSG__BODY_STOP_CMD,
  FSDP__MSG__BODY_KV_SET, FSDP__MSG__BODY_KV_GET, FSDP__MSG__BODY_KV_RESP,
  FSDP__MSG__BODY_TRACE_REQ, FSDP__MSG__BODY_TRACE_RESP, FSDP__MSG__BODY_TRACE_SPANS,
  FSDP__MSG__BODY_NODE_STEP_CMD, FSDP__MSG__BODY_NODE_STEP_REPORT,
};
#define NCASES (int)(sizeof all_cases / sizeof all_cases[0])

/* Every body case defined in the .proto appears in all_cases (the descriptor lists the oneof fields). */
static void test_cases_complete(void) {
  int oneof_fields = 0;
  for (unsigned i = 0; i < fsdp__msg__descriptor.n_fields; i++)
    if (fsdp__msg__descriptor.fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) oneof_fields++;
  CHECK_EQ_INT(oneof_fields, NCASES);
}

static void test_roundtrip_all(void) {
  for (int i = 0; i < NCASES; i++) {
    Fsdp__Msg m = make_msg(all_cases[i]);
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_OK(wire_pack(&m, &buf, &len));
    Fsdp__Msg *out = NULL;
    fsdp_status rc = wire_unpack(buf, len, &out);
    if (rc != FSDP_OK) fprintf(stderr, "case %s: %s\n", wire_body_name(all_cases[i]), fsdp_last_error());
    CHECK_EQ_INT(FSDP_OK, rc);
    if (out) {
      CHECK_EQ_INT(all_cases[i], out->body_case);
      /* Re-packing the unpacked message gives the same bytes. */
      size_t n2 = fsdp__msg__get_packed_size(out);
      uint8_t *buf2 = malloc(n2);
      fsdp__msg__pack(out, buf2);
      CHECK(n2 == len && memcmp(buf, buf2, len) == 0);
      free(buf2);
    }
    wire_destroy(&out);
    CHECK(out == NULL);
    free(buf);
  }
  /* Spot-check field values survive. */
  Fsdp__Msg m = make_msg(FSDP__MSG__BODY_STEP_REPORT);
  uint8_t *buf;
  size_t len;
  CHECK_OK(wire_pack(&m, &buf, &len));
  Fsdp__Msg *out;
  CHECK_OK(wire_unpack(buf, len, &out));
  CHECK_EQ_INT(5, out->step_report->step);
  CHECK_NEAR(1.25, out->step_report->loss, 0, 0);
  CHECK_EQ_INT(7, out->step_report->stats->n_peak_bytes);
  CHECK_EQ_INT(6, out->step_report->stats->peak_bytes[5]);
  wire_destroy(&out);
  free(buf);
}

/* An aggregate whose parallel arrays disagree, or which names more ranks than it holds, is refused. */
static void test_rejects_aggregate(void) {
  Fsdp__Msg m = make_msg(FSDP__MSG__BODY_NODE_STEP_REPORT);
  m.version = FSDP__VERSION__PROTO_VERSION;
  CHECK_OK(wire_validate(&m));
  m.node_step_report->agg->n_hist_count = 1;   /* 2 buckets, 1 count */
  CHECK(wire_validate(&m) == FSDP_ERR_INVALID);
  m = make_msg(FSDP__MSG__BODY_NODE_STEP_REPORT);
  m.version = FSDP__VERSION__PROTO_VERSION;
  m.node_step_report->agg->count[0] = 3;   /* 3 of 2 ranks */
  CHECK(wire_validate(&m) == FSDP_ERR_INVALID);
  m.node_step_report->agg->count[0] = 2;
  m.node_step_report->agg->n_sum = 0;
  CHECK(wire_validate(&m) == FSDP_ERR_INVALID);
  m = make_msg(FSDP__MSG__BODY_NODE_STEP_CMD);
  m.version = FSDP__VERSION__PROTO_VERSION;
  m.node_step_cmd->count = 0;
  CHECK(wire_validate(&m) == FSDP_ERR_INVALID);
}

/* A node's batch of steps (NodeStepReport.more) round-trips; a batch inside a batch is refused. */
static void test_node_report_batch(void) {
  Fsdp__Msg m = make_msg(FSDP__MSG__BODY_NODE_STEP_REPORT);
  Fsdp__NodeStepReport later = *m.node_step_report, *lp = &later;
  later.step_ms = 13.5;
  m.node_step_report->more = &lp, m.node_step_report->n_more = 1;
  uint8_t *buf;
  size_t len;
  CHECK_OK(wire_pack(&m, &buf, &len));
  Fsdp__Msg *out = NULL;
  CHECK_OK(wire_unpack(buf, len, &out));
  CHECK_EQ_INT(1, out->node_step_report->n_more);
  CHECK_NEAR(13.5, out->node_step_report->more[0]->step_ms, 0, 0);
  CHECK_EQ_INT(0, out->node_step_report->more[0]->n_more);
  wire_destroy(&out);
  free(buf);
  later.more = &lp, later.n_more = 1;   /* the later step carries a batch of its own */
  m.version = FSDP__VERSION__PROTO_VERSION;
  CHECK(wire_validate(&m) == FSDP_ERR_INVALID);
  later.n_more = 0;
  later.agg = NULL;   /* a later step is validated as the first is */
  CHECK(wire_validate(&m) == FSDP_ERR_INVALID);
}

static void test_rejects(void) {
  Fsdp__Msg m = make_msg(FSDP__MSG__BODY_WORKER_SETUP);
  uint8_t *buf;
  size_t len;
  CHECK_OK(wire_pack(&m, &buf, &len));
  Fsdp__Msg *out = NULL;
  /* Every truncation is rejected (or, if it happens to be a valid prefix, still validated). */
  int rejected = 0;
  for (size_t cut = 0; cut < len; cut++) {
    fsdp_status rc = wire_unpack(buf, cut, &out);
    if (rc != FSDP_OK) rejected++;
    wire_destroy(&out);
  }
  CHECK_EQ_INT((int)len, rejected);
  free(buf);

  /* Wrong version. */
  Fsdp__Msg v = make_msg(FSDP__MSG__BODY_ACK);
  size_t n = fsdp__msg__get_packed_size(&v);
  v.version = 99;
  n = fsdp__msg__get_packed_size(&v);
  uint8_t *vb = malloc(n);
  fsdp__msg__pack(&v, vb);
  CHECK_EQ_INT(FSDP_ERR_FORMAT, wire_unpack(vb, n, &out));
  CHECK(strstr(fsdp_last_error(), "version") != NULL);
  free(vb);

  /* No body. */
  Fsdp__Msg e = FSDP__MSG__INIT;
  e.version = FSDP__VERSION__PROTO_VERSION;
  n = fsdp__msg__get_packed_size(&e);
  uint8_t eb[16];
  fsdp__msg__pack(&e, eb);
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_unpack(eb, n, &out));

  /* Oversized and empty. */
  CHECK_EQ_INT(FSDP_ERR_FORMAT, wire_unpack(eb, (size_t)WIRE_MAX_BODY + 1, &out));
  CHECK_EQ_INT(FSDP_ERR_FORMAT, wire_unpack(eb, 0, &out));

  /* A field this version does not define (number 99, varint), appended to a valid message. */
  {
    Fsdp__Msg a = make_msg(FSDP__MSG__BODY_ACK);
    uint8_t *ab;
    size_t an;
    CHECK_OK(wire_pack(&a, &ab, &an));
    uint8_t *ext = malloc(an + 3);
    memcpy(ext, ab, an);
    ext[an] = 0x98, ext[an + 1] = 0x06, ext[an + 2] = 0x01;   /* tag (99 << 3 | 0), value 1 */
    CHECK_EQ_INT(FSDP_ERR_FORMAT, wire_unpack(ext, an + 3, &out));
    CHECK(strstr(fsdp_last_error(), "does not define") != NULL);
    free(ext);
    free(ab);
  }

  /* Field validation: rank >= world, a bad enum, stats of the wrong length. */
  Fsdp__Msg s = make_msg(FSDP__MSG__BODY_WORKER_SETUP);
  s.version = FSDP__VERSION__PROTO_VERSION;
  s.worker_setup->rank = 2;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&s));
  Fsdp__Msg j = make_msg(FSDP__MSG__BODY_STATUS_RESP);
  j.version = FSDP__VERSION__PROTO_VERSION;
  j.status_resp->state = 77;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&j));
  Fsdp__Msg r = make_msg(FSDP__MSG__BODY_STEP_REPORT);
  r.version = FSDP__VERSION__PROTO_VERSION;
  r.step_report->stats->n_phase_us = 2;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&r));
  Fsdp__Msg k = make_msg(FSDP__MSG__BODY_SPAWN_REQ);
  k.version = FSDP__VERSION__PROTO_VERSION;
  static char *badenv[] = {"NOEQUALS"};
  k.spawn_req->env = badenv;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&k));
  Fsdp__Msg p = make_msg(FSDP__MSG__BODY_WORKER_SETUP);
  p.version = FSDP__VERSION__PROTO_VERSION;
  p.worker_setup->plan->units[0]->tensors[1]->offset = 33; /* a gap in the flat buffer */
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&p));
  /* hybrid (3): shard_world a divisor of the world below it; 0 is refused, not divided by */
  static const uint32_t sws[] = {0, 2, 3};
  for (int i = 0; i < 3; i++) {
    Fsdp__Msg h = make_msg(FSDP__MSG__BODY_WORKER_SETUP);
    h.version = FSDP__VERSION__PROTO_VERSION;
    h.worker_setup->plan->sharding = 3;
    h.worker_setup->plan->shard_world = sws[i];
    CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&h));
  }
  /* the plan's model: present, its enums in range, its numbers finite */
  for (int i = 0; i < 4; i++) {
    Fsdp__Msg pm = make_msg(FSDP__MSG__BODY_WORKER_SETUP);
    pm.version = FSDP__VERSION__PROTO_VERSION;
    CHECK_OK(wire_validate(&pm));
    if (i == 0) pm.worker_setup->plan->model = NULL;
    if (i == 1) pm.worker_setup->plan->model->rope_scaling = ROPE_SCALING_LINEAR + 1;
    if (i == 2) pm.worker_setup->plan->model->rope_factor = NAN;
    if (i == 3) pm.worker_setup->plan->model->arch = (uint32_t)arch_count();   /* one past models.def's last */
    CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&pm));
  }
  Fsdp__Msg x = make_msg(FSDP__MSG__BODY_STEP_REPORT);
  x.version = FSDP__VERSION__PROTO_VERSION;
  uint64_t inter[2] = {0, 5};
  x.step_report->stats->n_sent_inter_bytes = 2, x.step_report->stats->sent_inter_bytes = inter;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&x));
}

/* wire_unpack(BUF) must accept exactly what protobuf-c parses AND wire_validate passes, checked
 * here apart from wire_unpack (a wire_unpack that skipped validation, or refused valid messages,
 * fails). Counts the outcomes into N[3]: accepted, parsed but invalid, unparsable. */
static void check_unpack_agrees(const uint8_t *buf, size_t len, int n[3]) {
  Fsdp__Msg *raw = fsdp__msg__unpack(NULL, len, buf);
  int valid = raw && wire_validate(raw) == FSDP_OK;
  Fsdp__Msg *out = NULL;
  fsdp_status rc = wire_unpack(buf, len, &out);
  CHECK(valid == (rc == FSDP_OK));
  CHECK(valid == (out != NULL));
  n[valid ? 0 : raw ? 1 : 2]++;
  wire_destroy(&out);
  if (raw) fsdp__msg__free_unpacked(raw, NULL);
}

/* Random bytes and mutations of a valid message: never crash, and wire_unpack accepts exactly the
 * valid ones. Deterministic xorshift; the mutations must reach every outcome (so validation is
 * really exercised, not only protobuf-c's parser). */
static void test_random_bytes(void) {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  uint8_t buf[512];
  int nrand[3] = {0}, nmut[3] = {0};
  for (int it = 0; it < 20000; it++) {
    size_t len = 1 + (size_t)(x % sizeof buf);
    for (size_t i = 0; i < len; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      buf[i] = (uint8_t)x;
    }
    check_unpack_agrees(buf, len, nrand);
  }
  Fsdp__Msg m = make_msg(FSDP__MSG__BODY_WORKER_SETUP);
  uint8_t *good;
  size_t len;
  CHECK_OK(wire_pack(&m, &good, &len));
  for (int it = 0; it < 20000; it++) {
    memcpy(buf, good, len);
    for (int f = 0; f < 3; f++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      buf[x % len] ^= (uint8_t)(x >> 32);
    }
    check_unpack_agrees(buf, len, nmut);
  }
  free(good);
  CHECK(nmut[0] > 0 && nmut[1] > 0 && nmut[2] > 0);
  CHECK_EQ_INT(20000, nrand[0] + nrand[1] + nrand[2]);
  printf("random frames: %d accepted, %d parsed but invalid, %d unparsable; mutated WorkerSetup: %d, %d, %d\n",
         nrand[0], nrand[1], nrand[2], nmut[0], nmut[1], nmut[2]);
}

/* Over real ZMQ sockets: ROUTER/DEALER with an envelope, garbage frames, too many envelope frames. */
static void test_sockets(void) {
  void *ctx = zmq_ctx_new();
  void *router = zmq_socket(ctx, ZMQ_ROUTER), *dealer = zmq_socket(ctx, ZMQ_DEALER);
  CHECK_OK(wire_socket_setup(router));
  CHECK_OK(wire_socket_setup(dealer));
  int tmo = 5000;
  zmq_setsockopt(router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  CHECK(zmq_bind(router, "inproc://wire") == 0);
  CHECK(zmq_connect(dealer, "inproc://wire") == 0);

  wire_env denv = {0};
  CHECK_OK(wire_env_push(&denv, "", 0));
  Fsdp__Msg m = make_msg(FSDP__MSG__BODY_STATUS_REQ);
  CHECK_OK(wire_send(dealer, &denv, &m, 0));
  wire_env env;
  Fsdp__Msg *got = NULL;
  CHECK_OK(wire_recv(router, &env, &got, 0));
  CHECK_EQ_INT(2, env.n);           /* identity + delimiter */
  CHECK_EQ_INT(0, env.len[1]);
  CHECK(got && got->body_case == FSDP__MSG__BODY_STATUS_REQ && got->status_req->job_id == 42);
  wire_destroy(&got);
  Fsdp__Msg reply = make_msg(FSDP__MSG__BODY_ERROR);
  CHECK_OK(wire_send(router, &env, &reply, 0));
  wire_env renv;
  CHECK_OK(wire_recv(dealer, &renv, &got, 0));
  CHECK_EQ_INT(1, renv.n);
  CHECK(got && got->body_case == FSDP__MSG__BODY_ERROR && strcmp(got->error->message, "no job 42") == 0);
  wire_destroy(&got);

  /* Garbage body: rejected with FORMAT, envelope kept so the ROUTER can answer. */
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, "\xff\xff\xff\x01garbage", 11, 0);
  CHECK_EQ_INT(FSDP_ERR_FORMAT, wire_recv(router, &env, &got, 0));
  CHECK(got == NULL && env.n == 2);
  /* Too many envelope frames: consumed whole, rejected; the next message is still received. */
  for (int i = 0; i < 6; i++) zmq_send(dealer, "x", 1, ZMQ_SNDMORE);
  zmq_send(dealer, "y", 1, 0);
  CHECK_EQ_INT(FSDP_ERR_FORMAT, wire_recv(router, &env, &got, 0));
  m = make_msg(FSDP__MSG__BODY_STATUS_REQ);   /* make_msg's storage was reused by the reply */
  CHECK_OK(wire_send(dealer, &denv, &m, 0));
  CHECK_OK(wire_recv(router, &env, &got, 0));
  wire_destroy(&got);
  /* Nothing waiting: DONTWAIT says so without blocking. */
  CHECK_EQ_INT(FSDP_ERR_TIMEOUT, wire_recv(router, &env, &got, ZMQ_DONTWAIT));

  zmq_close(router);
  zmq_close(dealer);
  zmq_ctx_term(ctx);
}

/* Spans whose arrays differ in length, or whose kind, lane or unit is out of range, are refused,
 * alone and inside a trace_resp. */
static void test_trace_rejects(void) {
  Fsdp__Msg m = make_msg(FSDP__MSG__BODY_TRACE_SPANS);
  m.version = FSDP__VERSION__PROTO_VERSION;
  CHECK_OK(wire_validate(&m));
  Fsdp__TraceSpans *t = m.trace_spans;
  t->n_dur_us = 1;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&m));
  t->n_dur_us = 2;
  t->kind[0] = 10, t->lane[0] = 5;   /* the last kind (checkpoint write) on the last lane (checkpoint writer) */
  CHECK_OK(wire_validate(&m));
  t->kind[0] = 11;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&m));
  t->kind[0] = 1, t->lane[0] = 6;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&m));
  t->lane[0] = 2, t->unit[0] = -2;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&m));
  t->unit[0] = 1, t->first_kept = 4;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&m));
  Fsdp__Msg r = make_msg(FSDP__MSG__BODY_TRACE_RESP);   /* a fresh, valid span set inside */
  r.version = FSDP__VERSION__PROTO_VERSION;
  CHECK_OK(wire_validate(&r));
  r.trace_resp->ranks[0]->kind[1] = 42;
  CHECK_EQ_INT(FSDP_ERR_INVALID, wire_validate(&r));
  r.trace_resp->ranks[0]->kind[1] = 0;
}

int main(void) {
  test_cases_complete();
  test_trace_rejects();
  test_roundtrip_all();
  test_rejects();
  test_rejects_aggregate();
  test_node_report_batch();
  test_random_bytes();
  test_sockets();
  return check_done();
}
