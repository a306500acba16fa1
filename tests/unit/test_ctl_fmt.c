/* test_ctl_fmt — fsdpctl's output formats: units, the progress line, tables, and the JSON of
 * `status --json` (keys, the metrics.jsonl rank shape, null for unknown values).
 * fsdpctl is an executable, not a library, so its module is compiled into this test. */
#include "ctl_fmt.h"
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"

static void test_units(void) {
  char b[64];
  CHECK(!strcmp(ctl_fmt_bytes(0, b, sizeof b), "0 B"));
  CHECK(!strcmp(ctl_fmt_bytes(1023, b, sizeof b), "1023 B"));
  CHECK(!strcmp(ctl_fmt_bytes(1024, b, sizeof b), "1.00 KiB"));
  CHECK(!strcmp(ctl_fmt_bytes(1536, b, sizeof b), "1.50 KiB"));
  CHECK(!strcmp(ctl_fmt_bytes(12u << 20, b, sizeof b), "12.0 MiB"));
  CHECK(!strcmp(ctl_fmt_bytes(3ull << 30 | 1ull << 28, b, sizeof b), "3.25 GiB"));
  CHECK(!strcmp(ctl_fmt_bytes(1023ull * 1024, b, sizeof b), "0.999 MiB") ||
        !strcmp(ctl_fmt_bytes(1023ull * 1024, b, sizeof b), "1.00 MiB"));   /* never "1023 KiB" wider than 3 digits */
  CHECK(strstr(ctl_fmt_bytes(1023ull * 1024, b, sizeof b), "MiB") != NULL);
  CHECK(!strcmp(ctl_fmt_si(950, b, sizeof b), "950"));
  CHECK(!strcmp(ctl_fmt_si(5.25, b, sizeof b), "5.2") || !strcmp(ctl_fmt_si(5.25, b, sizeof b), "5.3"));
  CHECK(!strcmp(ctl_fmt_si(1234, b, sizeof b), "1.23k"));
  CHECK(!strcmp(ctl_fmt_si(34.5e6, b, sizeof b), "34.5M"));
  CHECK(!strcmp(ctl_fmt_si(999.7, b, sizeof b), "1.00k"));
  CHECK(!strcmp(ctl_fmt_si(-1, b, sizeof b), "-"));
  CHECK(!strcmp(ctl_fmt_si(NAN, b, sizeof b), "-"));
  CHECK(!strcmp(ctl_fmt_duration(0.42, b, sizeof b), "0.4s"));
  CHECK(!strcmp(ctl_fmt_duration(45, b, sizeof b), "45s"));
  CHECK(!strcmp(ctl_fmt_duration(72, b, sizeof b), "1m12s"));
  CHECK(!strcmp(ctl_fmt_duration(2 * 3600 + 3 * 60 + 10, b, sizeof b), "2h03m"));
  CHECK(!strcmp(ctl_fmt_duration(3 * 86400 + 4 * 3600, b, sizeof b), "3d04h"));
  CHECK(!strcmp(ctl_fmt_duration(-1, b, sizeof b), "-"));
  CHECK(!strcmp(ctl_fmt_duration(INFINITY, b, sizeof b), "-"));
}

static void test_states_and_errors(void) {
  CHECK(!strcmp(ctl_fmt_state(FSDP__JOB_STATE__QUEUED), "queued"));
  CHECK(!strcmp(ctl_fmt_state(FSDP__JOB_STATE__CANCELLED), "cancelled"));
  CHECK(!strcmp(ctl_fmt_state((Fsdp__JobState)99), "unknown"));
  CHECK(ctl_fmt_state_is_final(FSDP__JOB_STATE__SUCCEEDED));
  CHECK(ctl_fmt_state_is_final(FSDP__JOB_STATE__FAILED));
  CHECK(!ctl_fmt_state_is_final(FSDP__JOB_STATE__RUNNING));
  CHECK(!ctl_fmt_state_is_final(FSDP__JOB_STATE__STARTING));
}

static void test_progress(void) {
  /* ETA from the daemon's clock: 100 steps in 50 s leave 100 more in 50 s; after a resume from
   * step 900 the 900 resumed steps took no time in this run (the old formula said 5.6 s). */
  CHECK_NEAR(50.0, ctl_fmt_eta(100, 200, 0, 50.0), 1e-9, 0);
  CHECK_NEAR(50.0, ctl_fmt_eta(1000, 1100, 900, 50.0), 1e-9, 0);
  CHECK(ctl_fmt_eta(900, 1100, 900, 5.0) < 0);   /* no step since the resume: no rate yet */
  CHECK(ctl_fmt_eta(10, 100, 0, 0) < 0);
  char b[256];
  ctl_fmt_progress(b, sizeof b, 40, 200, 3.2141, 0, 1234, 72, 10);
  CHECK(!strcmp(b, "[##........] step 40/200  loss 3.214  1.23k tok/s  ETA 1m12s"));
  ctl_fmt_progress(b, sizeof b, 0, 200, 0, 0, 0, -1, 10);
  CHECK(!strcmp(b, "[..........] step 0/200  ETA -"));
  ctl_fmt_progress(b, sizeof b, 200, 200, 2.5, 2.75, 10, NAN, 4);
  CHECK(!strcmp(b, "[####] step 200/200  loss 2.500  val 2.750  10 tok/s"));
  /* A tiny buffer truncates, never overflows. */
  char small[12];
  memset(small, 'x', sizeof small);
  ctl_fmt_progress(small, sizeof small, 1, 2, 1, 0, 1, 1, 10);
  CHECK(strlen(small) == sizeof small - 1);
}

static void test_table(void) {
  const char *h[] = {">id", "name", ">loss"};
  ctl_table *t = ctl_table_new(3, h);
  const char *r1[] = {"7", "tiny", "3.2"};
  const char *r2[] = {"12", "a-longer-name", "10.25"};
  ctl_table_add(t, r1);
  ctl_table_add(t, r2);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ctl_table_print(t, f, "  ");
  fclose(f);
  ctl_table_destroy(&t);
  CHECK(t == NULL);
  const char *want =
      "  id  name            loss\n"
      "   7  tiny             3.2\n"
      "  12  a-longer-name  10.25\n";
  CHECK(!strcmp(buf, want));
  if (strcmp(buf, want)) fprintf(stderr, "got:\n%s", buf);
  free(buf);
}

/* A JobInfo as the daemon sends it: 2 ranks, the last step's stats. */
static void test_job_json(void) {
  Fsdp__RankStats r[2];
  Fsdp__RankStats *rp[2];
  uint64_t peak[2][7], cur[2][7], ph[2][4], sent[2][3];
  for (int i = 0; i < 2; i++) {
    fsdp__rank_stats__init(&r[i]);
    r[i].rank = (uint32_t)i;
    for (int c = 0; c < 7; c++) peak[i][c] = 1000u * (uint64_t)(c + 1) + (uint64_t)i, cur[i][c] = 10u * (uint64_t)c;
    for (int p = 0; p < 4; p++) ph[i][p] = 1500u * (uint64_t)(p + 1);
    for (int k = 0; k < 3; k++) sent[i][k] = 4096u << k;
    r[i].n_peak_bytes = 7, r[i].peak_bytes = peak[i];
    r[i].n_cur_bytes = 7, r[i].cur_bytes = cur[i];
    r[i].n_phase_us = 4, r[i].phase_us = ph[i];
    r[i].n_sent_bytes = 3, r[i].sent_bytes = sent[i];
    rp[i] = &r[i];
  }
  Fsdp__StepSummary last = FSDP__STEP_SUMMARY__INIT;
  last.step = 40, last.loss = 3.25, last.lr = 3e-4, last.grad_norm = 1.5, last.tokens = 4096, last.step_ms = 512;
  last.tokens_per_s = 8000, last.n_ranks = 2, last.ranks = rp;
  Fsdp__JobInfo j = FSDP__JOB_INFO__INIT;
  j.id = 42, j.name = "tiny", j.state = FSDP__JOB_STATE__FAILED, j.step = 40, j.steps = 200, j.loss = 3.25;
  j.tokens_per_s = 8000, j.reason = "rank 1 was killed by signal 9 (SIGKILL)", j.world = 2;
  j.device = FSDP__DEVICE_KIND__DEVICE_KIND_CPU, j.submitted_at = 1.7e9, j.started_at = 1.7e9 + 2;
  j.last = &last, j.job_dir = "/var/lib/fsdpd/jobs/42";

  json_t *o = ctl_fmt_job_json(&j);
  CHECK_EQ_INT(42, json_integer_value(json_object_get(o, "id")));
  CHECK(!strcmp(json_string_value(json_object_get(o, "name")), "tiny"));
  CHECK(!strcmp(json_string_value(json_object_get(o, "state")), "failed"));
  CHECK_EQ_INT(40, json_integer_value(json_object_get(o, "step")));
  CHECK_EQ_INT(200, json_integer_value(json_object_get(o, "steps")));
  CHECK_NEAR(3.25, json_real_value(json_object_get(o, "loss")), 0, 0);
  CHECK_NEAR(8000, json_real_value(json_object_get(o, "tokens_per_s")), 0, 0);
  CHECK(!strcmp(json_string_value(json_object_get(o, "reason")), "rank 1 was killed by signal 9 (SIGKILL)"));
  CHECK(!strcmp(json_string_value(json_object_get(o, "device")), "cpu"));
  CHECK(json_is_null(json_object_get(o, "finished_at")));
  json_t *ranks = json_object_get(json_object_get(o, "last"), "ranks");
  CHECK_EQ_INT(2, json_array_size(ranks));
  json_t *r1 = json_array_get(ranks, 1);
  CHECK_EQ_INT(1, json_integer_value(json_object_get(r1, "rank")));
  /* Keys by category name, in plan.h's order: param_shard is index 0, comm index 6. */
  CHECK_EQ_INT(1001, json_integer_value(json_object_get(json_object_get(r1, "peak_bytes"), plan_mem_category_name(MEM_PARAM_SHARD))));
  CHECK_EQ_INT(7001, json_integer_value(json_object_get(json_object_get(r1, "peak_bytes"), plan_mem_category_name(MEM_COMM))));
  CHECK_EQ_INT(7, json_object_size(json_object_get(r1, "peak_bytes")));
  CHECK_NEAR(1.5, json_real_value(json_object_get(json_object_get(r1, "phase_ms"), "allgather")), 1e-12, 0);
  CHECK_NEAR(6.0, json_real_value(json_object_get(json_object_get(r1, "phase_ms"), "optimizer")), 1e-12, 0);
  CHECK_EQ_INT(16384, json_integer_value(json_object_get(json_object_get(r1, "sent_bytes"), "allreduce")));
  CHECK_EQ_INT(4096, json_integer_value(json_object_get(json_object_get(r1, "sent_bytes"), "allgather")));
  json_decref(o);

  /* No reason when there is none; a NaN loss is null, not invalid JSON. */
  j.reason = "";
  j.state = FSDP__JOB_STATE__QUEUED;
  j.loss = NAN;
  j.last = NULL;
  o = ctl_fmt_job_json(&j);
  CHECK(json_object_get(o, "reason") == NULL);
  CHECK(json_is_null(json_object_get(o, "loss")));
  CHECK(json_is_null(json_object_get(o, "last")));
  json_decref(o);
  j.step = 0, j.loss = 0;   /* before the first step there is no loss: null, not 0 */
  o = ctl_fmt_job_json(&j);
  CHECK(json_is_null(json_object_get(o, "loss")));
  char *text = json_dumps(o, 0);
  CHECK(text && strstr(text, "NaN") == NULL);
  free(text);
  json_decref(o);

  /* The human form names every category and phase. */
  j.last = &last;
  j.loss = 3.25;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ctl_fmt_job_human(&j, 1.7e9 + 100, f);
  fclose(f);
  CHECK(strstr(buf, "job 42 (tiny): queued") != NULL);
  for (int c = 0; c < MEM_NCAT; c++) CHECK(strstr(buf, plan_mem_category_name((mem_category)c)) != NULL);
  CHECK(strstr(buf, "reducescatter") != NULL);
  CHECK(strstr(buf, "allreduce") != NULL);
  CHECK(strstr(buf, "1.50 ms  10%") != NULL);   /* allgather 1.5 of 15 ms */
  free(buf);
}

static void test_nodes_json(void) {
  Fsdp__DeviceSlot s[2];
  Fsdp__DeviceSlot *sp[2] = {&s[0], &s[1]};
  for (int i = 0; i < 2; i++) {
    fsdp__device_slot__init(&s[i]);
    s[i].kind = FSDP__DEVICE_KIND__DEVICE_KIND_CPU;
    s[i].index = (uint32_t)i;
    s[i].name = "cpu";
  }
  s[1].job_id = 3, s[1].rank = 1;
  Fsdp__NodeInfo n = FSDP__NODE_INFO__INIT;
  Fsdp__NodeInfo *np = &n;
  n.id = 1, n.name = "host", n.n_slots = 2, n.slots = sp, n.host_mem_bytes = 31ull << 30;
  Fsdp__NodesResp r = FSDP__NODES_RESP__INIT;
  r.n_nodes = 1, r.nodes = &np;
  json_t *o = ctl_fmt_nodes_json(&r);
  CHECK(json_integer_value(json_object_get(json_array_get(json_object_get(o, "nodes"), 0), "host_mem_bytes")) ==
        (json_int_t)(31ll << 30));
  json_t *devs = json_object_get(json_array_get(json_object_get(o, "nodes"), 0), "devices");
  CHECK_EQ_INT(2, json_array_size(devs));
  CHECK(json_is_null(json_object_get(json_array_get(devs, 0), "job_id")));
  CHECK_EQ_INT(3, json_integer_value(json_object_get(json_array_get(devs, 1), "job_id")));
  CHECK_EQ_INT(1, json_integer_value(json_object_get(json_array_get(devs, 1), "rank")));
  json_decref(o);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ctl_fmt_nodes_table(&r, 0, f);
  fclose(f);
  CHECK(strstr(buf, "job 3 rank 1") != NULL);
  CHECK(strstr(buf, "free") != NULL);
  CHECK(strstr(buf, "cpu:1") != NULL);
  free(buf);
}

int main(void) {
  test_units();
  test_states_and_errors();
  test_progress();
  test_table();
  test_job_json();
  test_nodes_json();
  return check_done();
}
