/* test_ckptpace — the steps' pace while an asynchronous checkpoint write is in flight (daemon/ckptpace.h):
 * which steps a write overlapped, their mean step time, the baseline before the save (the attempt's
 * first step left out, overlapped steps left out, the latest CKPTPACE_BASE only), a save that waited
 * for the previous one, synchronous saves (no step overlapped), and the metrics.jsonl fields. */
#include "ckptpace.h"
#include "metrics.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static Fsdp__CkptSave save_of(uint32_t step) {
  Fsdp__CkptSave c = FSDP__CKPT_SAVE__INIT;
  c.step = step, c.blocked_s = 0.01, c.write_s = 1.5, c.bytes = 1000000, c.ranks = 2;
  /* what a worker's report never sets: ckptpace must overwrite it */
  c.inflight_steps = 99, c.inflight_step_ms = 99, c.before_step_ms = 99;
  return c;
}

/* One step with no save completed by its report. */
static void plain(ckptpace *p, uint32_t step, double ms, int saves) { ckptpace_step(p, step, ms, saves, NULL, 0); }

/* every 4, asynchronous: 4's write overlaps 5 and 6, 8's overlaps 9, 12 (the last) is settled in its own report */
static void async_every4(void) {
  ckptpace p = {0};
  plain(&p, 1, 1000, 0);   /* warm-up: not in the baseline */
  plain(&p, 2, 100, 0);
  plain(&p, 3, 110, 0);
  plain(&p, 4, 120, 1);
  plain(&p, 5, 200, 0);
  Fsdp__CkptSave c4 = save_of(4);
  ckptpace_step(&p, 6, 220, 0, &c4, 1);
  CHECK_EQ_INT(2, c4.inflight_steps);
  CHECK_NEAR(210, c4.inflight_step_ms, 1e-9, 0);
  CHECK_NEAR(110, c4.before_step_ms, 1e-9, 0);
  plain(&p, 7, 130, 0);
  plain(&p, 8, 140, 1);
  Fsdp__CkptSave c8 = save_of(8);
  ckptpace_step(&p, 9, 300, 0, &c8, 1);
  CHECK_EQ_INT(1, c8.inflight_steps);
  CHECK_NEAR(300, c8.inflight_step_ms, 1e-9, 0);
  CHECK_NEAR((110 + 120 + 130 + 140) / 4.0, c8.before_step_ms, 1e-9, 0);   /* the latest 4 unoverlapped */
  plain(&p, 10, 150, 0);
  plain(&p, 11, 160, 0);
  Fsdp__CkptSave c12 = save_of(12);
  ckptpace_step(&p, 12, 170, 1, &c12, 1);
  CHECK_EQ_INT(0, c12.inflight_steps);
  CHECK(c12.inflight_step_ms == 0 && c12.before_step_ms == 0);
  CHECK_EQ_INT(0, p.flight);
}

/* a save that starts while the previous write is still in flight: its report completes the previous
 * (steps 3..6 overlapped it) and the new one is in flight from there */
static void waited(void) {
  ckptpace p = {0};
  plain(&p, 1, 50, 0);
  plain(&p, 2, 100, 1);
  plain(&p, 3, 150, 0);
  plain(&p, 4, 150, 0);
  plain(&p, 5, 150, 0);
  Fsdp__CkptSave c2 = save_of(2);
  ckptpace_step(&p, 6, 250, 1, &c2, 1);
  CHECK_EQ_INT(4, c2.inflight_steps);
  CHECK_NEAR(175, c2.inflight_step_ms, 1e-9, 0);
  CHECK_NEAR(100, c2.before_step_ms, 1e-9, 0);
  CHECK_EQ_INT(6, p.flight);
  Fsdp__CkptSave c6 = save_of(6);
  ckptpace_step(&p, 7, 400, 0, &c6, 1);
  CHECK_EQ_INT(1, c6.inflight_steps);
  CHECK_NEAR(100, c6.before_step_ms, 1e-9, 0);   /* 3..6 overlapped 2's write: still step 2 alone */
}

/* synchronous saves complete in their own step's report: no step overlapped, every step a baseline */
static void synchronous(void) {
  ckptpace p = {0};
  for (uint32_t s = 1; s <= 8; s++) {
    Fsdp__CkptSave c = save_of(s);
    ckptpace_step(&p, s, 100.0 * s, s % 2 == 0, &c, s % 2 == 0);
    if (s % 2 == 0) CHECK(c.inflight_steps == 0 && c.inflight_step_ms == 0 && c.before_step_ms == 0);
  }
  CHECK_EQ_INT(4, p.nbase);
  CHECK_EQ_INT(0, p.flight);
}

/* the metrics line: the pace and its ratio, null where unknown */
static void line(void) {
  Fsdp__CkptSave a = save_of(4), s = save_of(8);
  a.inflight_steps = 2, a.inflight_step_ms = 210, a.before_step_ms = 100;
  s.inflight_steps = 0, s.inflight_step_ms = 0, s.before_step_ms = 0;
  Fsdp__CkptSave *ptrs[2] = {&a, &s};
  Fsdp__StepSummary sum = FSDP__STEP_SUMMARY__INIT;
  sum.step = 8, sum.step_ms = 120, sum.tokens = 64;
  sum.ckpt = ptrs, sum.n_ckpt = 2;
  char *text = NULL;
  CHECK_OK(metrics_line(&sum, &text));
  json_t *o = json_loads(text, 0, NULL);
  json_t *k = json_object_get(o, "checkpoint");
  CHECK(json_array_size(k) == 2);
  json_t *c0 = json_array_get(k, 0), *c1 = json_array_get(k, 1);
  CHECK_EQ_INT(2, json_integer_value(json_object_get(c0, "inflight_steps")));
  CHECK_NEAR(210, json_real_value(json_object_get(c0, "inflight_step_ms")), 1e-9, 0);
  CHECK_NEAR(100, json_real_value(json_object_get(c0, "before_step_ms")), 1e-9, 0);
  CHECK_NEAR(2.1, json_real_value(json_object_get(c0, "step_slowdown")), 1e-12, 0);
  CHECK_EQ_INT(0, json_integer_value(json_object_get(c1, "inflight_steps")));
  CHECK(json_is_null(json_object_get(c1, "inflight_step_ms")) && json_is_null(json_object_get(c1, "before_step_ms")) &&
        json_is_null(json_object_get(c1, "step_slowdown")));
  json_decref(o);
  free(text);
}

int main(void) {
  async_every4();
  waited();
  synchronous();
  line();
  return check_done();
}
