/* test_unit — the FSDP unit's verbs (worker/unit.h) and the reducer beside them (worker/reduce.h)
 * on one rank (world 1: every collective is a copy, so what a verb moves can be checked exactly):
 *
 * - gather puts the unit's shard into a pool slot and wait gives it back; full sharding has
 *   1 + prefetch block slots: one more gather without a release is refused ("gather pool
 *   exhausted"), a release hands its slot to the next gather; the root has its own buffer;
 *   grad_op has one slot per block; none gathers nothing and wait gives the shard itself;
 * - with param_dtype bf16 on the CPU, wait gives the parameters widened to fp32;
 * - the reducer hands the two block buffers out in turn, zeroed; reduce puts the gradient into the
 *   shard, and in a later micro-step adds it to what the shard holds (fp32, and bf16 with values
 *   exact in bf16); none's buffer is the shard itself;
 * - reqs refuses a collective beyond its capacity, and monotime's deadlines lie ahead on its clock.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "device.h"
#include "jobspec.h"
#include "monotime.h"
#include "plan.h"
#include "reduce.h"
#include "reqs.h"
#include "safetensors.h"
#include "unit.h"

static const char *JOB =
    "[job]\nname = unit\nsteps = 1\n"
    "[model]\nn_layer = 3\nn_head = 2\nn_embd = 32\nvocab_size = 96\nseq_len = 16\n"
    "[data]\ntrain = synthetic:markov:3\nbatch_size = 1\n"
    "[fsdp]\nworld_size = 1\nprefetch = 1\n";

/* One rank's units over a shard filled with small integers (exact in bf16). */
typedef struct fixture {
  jobspec_t spec;
  plan_t *p;
  comm_t *comm;
  device_t *d;
  float *shard, *grad;
  uint16_t *shard16;
  reqs q;
  reducer *red;
  unit_pool *pool;
  fsdp_unit *unit;
} fixture;

static void fx_up(fixture *f, shard_mode sh, dtype_kind pdt, dtype_kind rdt) {
  memset(f, 0, sizeof *f);
  if (jobspec_parse(JOB, "unit.ini", "/tmp", &f->spec) != FSDP_OK) exit(2);
  f->spec.sharding = sh;
  f->spec.param_dtype = pdt;
  f->spec.reduce_dtype = rdt;
  if (plan_build(&f->spec, 1, &f->p) != FSDP_OK || comm_new_gloo(0, 1, NULL, NULL, "t", 20, &f->comm) != FSDP_OK ||
      dev_new_cpu(DEV_CPU_SYNC, &f->d) != FSDP_OK) {
    fprintf(stderr, "setup: %s\n", fsdp_last_error());
    exit(2);
  }
  int64_t S = f->p->shard_total;
  f->shard = f->d->op->alloc(f->d, MEM_PARAM_SHARD, (size_t)S * 4);
  f->shard16 = f->d->op->alloc(f->d, MEM_PARAM_SHARD, (size_t)S * 2);
  f->grad = f->d->op->alloc(f->d, MEM_GRAD_SHARD, (size_t)S * 4);
  for (int64_t i = 0; i < S; i++) {
    f->shard[i] = (float)(i % 97) - 48;
    f->shard16[i] = st_f32_to_bf16(f->shard[i]);
  }
  const void *src = pdt == DTYPE_BF16 ? (const void *)f->shard16 : (const void *)f->shard;
  if (reqs_init(&f->q, 64) != FSDP_OK || reduce_new(f->p, 0, f->d, f->grad, f->comm, &f->q, &f->red) != FSDP_OK ||
      unit_pool_new(f->p, f->d, f->comm, src, NULL, f->red, &f->q, &f->pool, &f->unit) != FSDP_OK) {
    fprintf(stderr, "units: %s\n", fsdp_last_error());
    exit(2);
  }
}

static void fx_down(fixture *f) {
  reqs_wait(&f->q);
  f->d->op->sync(f->d);
  unit_pool_destroy(&f->pool);
  reduce_destroy(&f->red);
  reqs_fini(&f->q);
  f->d->op->free(f->d, f->shard);
  f->d->op->free(f->d, f->shard16);
  f->d->op->free(f->d, f->grad);
  dev_destroy(&f->d);
  comm_destroy(&f->comm);
  plan_destroy(&f->p);
}

/* Unit u's parameters as wait gave them (fp32 on the CPU) equal its part of the fp32 shard. */
static int holds_shard(const fixture *f, int u, const void *w) {
  const plan_unit *pu = &f->p->units[u];
  f->d->op->sync(f->d);
  return w && memcmp(w, f->shard + pu->shard_base, (size_t)pu->numel * sizeof(float)) == 0;
}

static void test_full_pool(void) {
  fixture f;
  fx_up(&f, SHARD_FULL, DTYPE_FP32, DTYPE_FP32);
  fsdp_unit *u = f.unit;
  CHECK_OK(unit_gather(&u[0]));
  CHECK_OK(unit_gather(&u[1]));
  CHECK_OK(unit_gather(&u[2]));
  CHECK(u[1].gathered && u[2].gathered && u[1].gathered != u[2].gathered && u[0].gathered != u[1].gathered);
  fsdp_status rc = unit_gather(&u[3]);   /* 1 + prefetch = 2 block slots, both taken */
  CHECK_EQ_INT(FSDP_ERR_INTERNAL, rc);
  CHECK(strstr(fsdp_last_error(), "gather pool exhausted") != NULL);
  CHECK(holds_shard(&f, 0, unit_wait(&u[0])));
  CHECK(holds_shard(&f, 1, unit_wait(&u[1])));
  void *slot1 = u[1].gathered;
  unit_release(&u[1]);
  CHECK(u[1].gathered == NULL);
  CHECK_OK(unit_gather(&u[3]));
  CHECK(u[3].gathered == slot1);   /* the released slot */
  CHECK(holds_shard(&f, 3, unit_wait(&u[3])));
  CHECK(holds_shard(&f, 2, unit_wait(&u[2])));
  fx_down(&f);
}

static void test_grad_op_and_none(void) {
  fixture f;
  fx_up(&f, SHARD_GRAD_OP, DTYPE_FP32, DTYPE_FP32);
  for (int u = 1; u <= 3; u++) CHECK_OK(unit_gather(&f.unit[u]));   /* a slot per block */
  CHECK(f.unit[1].gathered != f.unit[2].gathered && f.unit[2].gathered != f.unit[3].gathered);
  for (int u = 1; u <= 3; u++) CHECK(holds_shard(&f, u, unit_wait(&f.unit[u])));
  fx_down(&f);

  fx_up(&f, SHARD_NONE, DTYPE_FP32, DTYPE_FP32);
  CHECK_OK(unit_gather(&f.unit[2]));
  CHECK(f.unit[2].gathered == NULL);
  CHECK(unit_wait(&f.unit[2]) == f.shard + f.p->units[2].shard_base);   /* the shard itself */
  unit_release(&f.unit[2]);
  reduce_begin(f.red, 0, 1);
  CHECK_OK(unit_grad(&f.unit[2]));
  CHECK(f.unit[2].grad == f.grad + f.p->units[2].shard_base);
  fx_down(&f);
}

static void test_bf16_params(void) {
  fixture f;
  fx_up(&f, SHARD_FULL, DTYPE_BF16, DTYPE_FP32);
  CHECK_OK(unit_gather(&f.unit[0]));
  CHECK_OK(unit_gather(&f.unit[1]));
  CHECK(holds_shard(&f, 0, unit_wait(&f.unit[0])));   /* widened from bf16: the integers exactly */
  CHECK(holds_shard(&f, 1, unit_wait(&f.unit[1])));
  fx_down(&f);
}

/* Two micro-steps of unit u's gradient g (k + 1 at element i: 1 + i % 5, exact in bf16): the
 * shard ends with the sum. */
static void reduce_twice(dtype_kind rdt) {
  fixture f;
  fx_up(&f, SHARD_FULL, DTYPE_FP32, rdt);
  const plan_unit *pu = &f.p->units[2];
  float *g2[2] = {NULL, NULL}, *g3[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) {
    reduce_begin(f.red, k > 0, k == 1);
    CHECK_OK(unit_grad(&f.unit[3]));
    g3[k] = f.unit[3].grad;
    CHECK_OK(unit_reduce(&f.unit[3]));
    CHECK_OK(unit_grad(&f.unit[2]));
    float *g = g2[k] = f.unit[2].grad;
    f.d->op->sync(f.d);
    int zero = 1;
    for (int64_t i = 0; i < pu->padded; i++) zero &= g[i] == 0.0f;
    CHECK(zero);
    for (int64_t i = 0; i < pu->numel; i++) g[i] = (float)((k + 1) * (1 + i % 5));
    CHECK_OK(unit_reduce(&f.unit[2]));
    CHECK(f.unit[2].grad == NULL);
    CHECK_OK(reduce_finish(f.red));
  }
  /* fp32: the two block buffers in turn (the same order each micro-step); bf16: one fp32 buffer */
  CHECK(g2[0] == g2[1] && g3[0] == g3[1]);
  CHECK(rdt == DTYPE_BF16 ? g2[0] == g3[0] : g2[0] != g3[0]);
  CHECK_OK(reqs_wait(&f.q));
  f.d->op->sync(f.d);
  int bad = 0;
  for (int64_t i = 0; i < pu->numel; i++) bad += f.grad[pu->shard_base + i] != (float)(3 * (1 + i % 5));
  CHECK_EQ_INT(0, bad);
  printf("reduce %s: two micro-steps summed in the shard, %d element(s) off\n", rdt == DTYPE_BF16 ? "bf16" : "fp32", bad);
  fx_down(&f);
}

static void test_reqs_and_clock(void) {
  comm_t *c = NULL;
  CHECK_OK(comm_new_gloo(0, 1, NULL, NULL, "t", 20, &c));
  reqs q;
  CHECK_OK(reqs_init(&q, 1));
  CHECK_OK(reqs_add(&q, NULL));   /* nothing to keep */
  float x[2] = {1, 2};
  comm_req *r = NULL;
  CHECK_OK(comm_allreduce(c, &x[0], 1, COMM_F32, &r));
  CHECK_OK(reqs_add(&q, r));
  r = NULL;
  CHECK_OK(comm_allreduce(c, &x[1], 1, COMM_F32, &r));
  CHECK_EQ_INT(FSDP_ERR_INTERNAL, reqs_add(&q, r));   /* beyond the capacity: waited for, refused */
  CHECK_EQ_INT(1, q.n);
  CHECK_OK(reqs_wait(&q));
  CHECK_EQ_INT(0, q.n);
  reqs_fini(&q);
  comm_destroy(&c);
  double t = monotime_s();
  struct timespec ts = monotime_after(0.5);
  double at = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  CHECK(at > t + 0.4 && at < t + 0.6);
  CHECK(fabs((double)monotime_us() / 1e6 - monotime_s()) < 0.01);   /* one clock, in µs and s */
}

int main(void) {
  test_full_pool();
  test_grad_op_and_none();
  test_bf16_params();
  reduce_twice(DTYPE_FP32);
  reduce_twice(DTYPE_BF16);
  test_reqs_and_clock();
  return check_done();
}
