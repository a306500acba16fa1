/* ctl_trace — `fsdpctl trace ID [--steps A..B] -o trace.json`: a running job's spans as Chrome
 * trace-event JSON, which https://ui.perfetto.dev and chrome://tracing open.
 *
 * The daemon pulls the spans from every rank (daemon/tracepull.h) and answers one trace_resp; this
 * file turns it into trace events with jansson: one process per rank ("rank R"), one thread per
 * lane of worker/trace.h that it recorded on ("host", "compute stream", "comm", and with hybrid
 * sharding "comm (shard group)" and "comm (replica group)"), one complete event ("ph": "X") per span,
 * named by its kind and unit ("allgather h.3", "forward root", "step 12", "optimizer"), with the
 * step and unit in its args. Timestamps are µs from the earliest span of the file; they are each
 * worker's monotonic clock, shared by the ranks of one node. Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "ctl_client.h"
#include "fsutil.h"
#include "wire.h"

#define TRACE_USAGE "trace ID [--steps A..B] -o TRACE.json [--ctl ENDPOINT]"

/* worker/trace.h's kinds and lanes, in its order (the wire carries their numbers). */
static const char *const kind_names[] = {"step", "allgather", "forward", "loss", "backward", "reducescatter",
                                         "allreduce", "optimizer", "eval", "checkpoint snapshot", "checkpoint write"};
static const char *const lane_names[] = {"host", "compute stream", "comm", "comm (shard group)",
                                         "comm (replica group)", "checkpoint writer"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == 11 && sizeof lane_names / sizeof lane_names[0] == 6,
               "worker/trace.h has 11 kinds and 6 lanes (proto/wire.c refuses others)");

/* "A..B" or "A" (A..A), 1 <= A <= B; 0 on success. */
static int parse_steps(const char *s, uint32_t *a, uint32_t *b) {
  char *end;
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  unsigned long x = strtoul(s, &end, 10), y = x;
  if (errno) return -1;
  if (!strncmp(end, "..", 2)) {
    const char *t = end + 2;
    if (*t < '0' || *t > '9') return -1;
    y = strtoul(t, &end, 10);
    if (errno) return -1;
  }
  if (*end || x < 1 || x > y || y > UINT32_MAX) return -1;
  *a = (uint32_t)x;
  *b = (uint32_t)y;
  return 0;
}

/* Append the metadata events that name and order a process or thread (WHAT: "process" or "thread"). */
static void meta(json_t *ev, const char *what, int pid, int tid, const char *name, int sort) {
  char key[32], sort_key[32];
  snprintf(key, sizeof key, "%s_name", what);
  snprintf(sort_key, sizeof sort_key, "%s_sort_index", what);
  json_array_append_new(ev, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "ph", "M", "name", key, "pid", pid, "tid", tid,
                                      "args", "name", name));
  json_array_append_new(ev, json_pack("{s:s, s:s, s:i, s:i, s:{s:i}}", "ph", "M", "name", sort_key, "pid", pid, "tid",
                                      tid, "args", "sort_index", sort));
}

/* The trace-event document of R; *NSPANS gets the number of spans in it. */
static json_t *build(const Fsdp__TraceResp *r, size_t *nspans) {
  json_t *ev = json_array();
  uint64_t base = UINT64_MAX;
  for (size_t k = 0; k < r->n_ranks; k++)
    for (size_t i = 0; i < r->ranks[k]->n_start_us; i++)
      if (r->ranks[k]->start_us[i] < base) base = r->ranks[k]->start_us[i];
  *nspans = 0;
  for (size_t k = 0; k < r->n_ranks; k++) {
    const Fsdp__TraceSpans *t = r->ranks[k];
    char name[64];
    snprintf(name, sizeof name, "rank %u", t->rank);
    meta(ev, "process", (int)t->rank, 0, name, (int)t->rank);
    int used[sizeof lane_names / sizeof lane_names[0]] = {0};   /* threads for the lanes it recorded on */
    for (size_t i = 0; i < t->n_lane; i++) used[t->lane[i]] = 1;
    for (int l = 0; l < (int)(sizeof used / sizeof used[0]); l++)
      if (used[l]) meta(ev, "thread", (int)t->rank, l, lane_names[l], l);
    for (size_t i = 0; i < t->n_kind; i++) {
      const char *kind = kind_names[t->kind[i]];
      int u = t->unit[i];
      if (!strcmp(kind, "step")) snprintf(name, sizeof name, "step %u", t->step[i]);
      else if (u >= 0 && (size_t)u < r->n_unit_names) snprintf(name, sizeof name, "%s %s", kind, r->unit_names[u]);
      else snprintf(name, sizeof name, "%s", kind);
      json_t *args = json_pack("{s:i}", "step", (json_int_t)t->step[i]);
      if (u >= 0) json_object_set_new(args, "unit", json_integer(u));
      json_array_append_new(ev, json_pack("{s:s, s:s, s:s, s:i, s:i, s:I, s:I, s:o}", "name", name, "cat", kind, "ph", "X",
                                          "pid", (int)t->rank, "tid", (int)t->lane[i],
                                          "ts", (json_int_t)(t->start_us[i] - base), "dur", (json_int_t)t->dur_us[i],
                                          "args", args));
      (*nspans)++;
    }
  }
  char steps[64];
  snprintf(steps, sizeof steps, "%u..%u", r->first_step, r->last_step);
  return json_pack("{s:o, s:s, s:{s:I, s:s, s:s}}", "traceEvents", ev, "displayTimeUnit", "ms", "otherData", "job_id",
                   (json_int_t)r->job_id, "steps", steps, "clock", "each worker's CLOCK_MONOTONIC, µs from the first span");
}

int ctl_trace(int argc, char **argv) {
  static const struct option opts[] = {
    {"output", required_argument, 0, 'o'}, {"steps", required_argument, 0, 's'},
    {"ctl", required_argument, 0, OPT_CTL}, {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  const char *out = NULL, *ctl = NULL;
  uint32_t first = 0, last = 0;
  int o;
  opterr = 0;
  optind = 1;
  while ((o = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
    switch (o) {
    case 'o': out = optarg; break;
    case 's':
      if (parse_steps(optarg, &first, &last) != 0) {
        char what[256];
        snprintf(what, sizeof what, "--steps '%s': give A..B (1 <= A <= B) or one step A", optarg);
        return ctl_usage_error(argv[0], TRACE_USAGE, what);
      }
      break;
    case OPT_CTL: ctl = optarg; break;
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nThe spans of a running job's steps as Chrome trace-event JSON: open the file in\n"
             "https://ui.perfetto.dev (Open trace file) or chrome://tracing. One process per rank, one thread\n"
             "per lane (host, compute stream, comm threads); a span for every all-gather, forward, backward and\n"
             "reduce-scatter of every unit, the loss, the optimizer and the step. The workers keep their\n"
             "latest spans in a bounded ring (docs/observability.md says how many steps).\n"
             "  -o, --output TRACE.json  the file to write\n"
             "  --steps A..B             the steps (or one step A); default: the last %d steps started\n"
             "  --ctl ENDPOINT           the daemon (default $FSDP_CTL, or the state directory's)\n",
             TRACE_USAGE, 3);
      return 0;
    default: return ctl_usage_error(argv[0], TRACE_USAGE, "unknown option");
    }
  }
  if (optind + 1 != argc) return ctl_usage_error(argv[0], TRACE_USAGE, "give one job id");
  if (!out || !*out) return ctl_usage_error(argv[0], TRACE_USAGE, "-o TRACE.json is required");
  uint64_t id;
  int rc = ctl_parse_job_id(argv[0], TRACE_USAGE, argv[optind], &id);
  if (rc) return rc;
  Fsdp__TraceReq q = FSDP__TRACE_REQ__INIT;
  q.job_id = id, q.first_step = first, q.last_step = last;
  Fsdp__Msg req = WIRE_MSG_INIT;
  req.body_case = FSDP__MSG__BODY_TRACE_REQ;
  req.trace_req = &q;
  ctl_client cl;
  Fsdp__Msg *reply = NULL;
  if ((rc = ctl_client_open(&cl, ctl)) != 0) return rc;
  rc = ctl_client_call(&cl, &req, FSDP__MSG__BODY_TRACE_RESP, id, CTL_CALL_TIMEOUT_MS, &reply);
  ctl_client_close(&cl);
  if (rc) return rc;
  size_t n = 0;
  json_t *doc = build(reply->trace_resp, &n);
  size_t nranks = reply->trace_resp->n_ranks;
  uint32_t a = reply->trace_resp->first_step, b = reply->trace_resp->last_step;
  wire_destroy(&reply);
  if (!doc) return ctl_fail("trace: out of memory building the trace");
  /* OUT.tmp created O_EXCL | O_NOFOLLOW and renamed over OUT: never written through a link */
  fsutil_atomic at = FSUTIL_ATOMIC_INIT;
  fsdp_status wrc = fsutil_atomic_open(out, 0644, &at);
  FILE *f = wrc == FSDP_OK ? fsutil_atomic_stream(&at) : NULL;
  if (wrc == FSDP_OK && (!f || json_dumpf(doc, f, JSON_COMPACT) != 0))
    wrc = fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", out, strerror(errno));
  if (wrc == FSDP_OK) wrc = fsutil_atomic_commit(&at);
  fsutil_atomic_abort(&at);
  json_decref(doc);
  if (wrc != FSDP_OK) return ctl_fail("trace: %s", fsdp_last_error());
  printf("%s: %zu spans of steps %u..%u from %zu ranks\n", out, n, a, b, nranks);
  return 0;
}
