/* test_runtime_ckpt — the runtime's host staging of its shards (worker/runtime_ckpt.c) on a device
 * whose memory is not the host's, in one process (world 1, no collectives to wait for):
 *
 * - transfers: init and restore fill a zeroed host buffer and upload it (nothing is downloaded
 *   only to be overwritten), and runtime_eval reads its loss back once (the Σ loss and Σ tokens are
 *   all-reduced in device memory): counted on a CPU device that stages like CUDA does;
 * - restore through that staging gives back exactly the checkpointed parameters;
 * - a restore whose write-back fails (the parameters' upload refused) fails, and frees every
 *   staging buffer: under AddressSanitizer (FSDP_SANITIZE) its leak check fails this test
 *   otherwise, at exit.
 *
 * The device is the CPU device with host_accessible cleared and its upload and download wrapped
 * (counted; uploads of a given size refused on demand), so the runtime takes CUDA's staging path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "testfiles.h"
#include "comm.h"
#include "device.h"
#include "jobspec.h"
#include "plan.h"
#include "runtime.h"

static const char *JOB =
    "[job]\nname = stage\nsteps = 2\nseed = 5\n"
    "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = 96\nseq_len = 16\n"
    "[data]\ntrain = synthetic:markov:3\nval = synthetic:markov:4\nbatch_size = 2\n"
    "[optim]\nlr = 1e-3\n"
    "[fsdp]\nworld_size = 1\n"
    "[eval]\nbatches = 2\n";

/* ---- the staging CPU device ---- */

static const dev_ops *g_cpu;          /* the CPU device's own table */
static dev_ops g_ops;                 /* its copy with the wrapped transfers */
static size_t g_up, g_down;           /* bytes moved since the last reset */
static size_t g_refuse = 0;           /* uploads of this many bytes fail (0: none) */

static fsdp_status staged_upload(device_t *d, void *dst, const void *src, size_t bytes) {
  if (g_refuse && bytes == g_refuse) return fsdp_set_error(FSDP_ERR_IO, "upload of %zu bytes refused (test)", bytes);
  g_up += bytes;
  return g_cpu->upload(d, dst, src, bytes);
}

static fsdp_status staged_download(device_t *d, void *dst, const void *src, size_t bytes) {
  g_down += bytes;
  return g_cpu->download(d, dst, src, bytes);
}

static device_t *staged_device(void) {
  device_t *d = NULL;
  if (dev_new_cpu(DEV_CPU_SYNC, &d) != FSDP_OK) {
    fprintf(stderr, "device: %s\n", fsdp_last_error());
    exit(2);
  }
  g_cpu = d->op;
  g_ops = *d->op;
  g_ops.upload = staged_upload;
  g_ops.download = staged_download;
  d->op = &g_ops;
  d->host_accessible = 0;
  return d;
}

/* ---- one rank ---- */

typedef struct rank1 {
  jobspec_t spec;
  plan_t *plan;
  comm_t *comm;
  device_t *dev;
  runtime_t *rt;
} rank1;

static void rank_up(rank1 *r) {
  memset(r, 0, sizeof *r);
  if (jobspec_parse(JOB, "stage.ini", "/tmp", &r->spec) != FSDP_OK || plan_build(&r->spec, 1, &r->plan) != FSDP_OK ||
      comm_new_gloo(0, 1, NULL, NULL, "t", 20, &r->comm) != FSDP_OK) {
    fprintf(stderr, "setup: %s\n", fsdp_last_error());
    exit(2);
  }
  r->dev = staged_device();
  g_up = g_down = 0;
  if (runtime_new(&r->spec, r->plan, 0, r->comm, r->dev, &r->rt) != FSDP_OK) {
    fprintf(stderr, "runtime_new: %s\n", fsdp_last_error());
    exit(2);
  }
}

static void rank_down(rank1 *r) {
  runtime_destroy(&r->rt);
  dev_destroy(&r->dev);
  comm_destroy(&r->comm);
  plan_destroy(&r->plan);
}

int main(void) {
  char dir[] = "/tmp/fsdp-stage-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  rank1 a, b;
  rank_up(&a);
  size_t S = (size_t)a.plan->shard_total * sizeof(float);
  /* init: the shard is computed on the host and uploaded; nothing comes down */
  CHECK_EQ_INT(0, g_down);
  CHECK_EQ_INT(S, g_up);
  rt_report rep;
  CHECK_OK(runtime_step(a.rt, 1, &rep));
  ckpt_save_stats saved;
  CHECK_OK(runtime_checkpoint(a.rt, dir, 1, &saved));

  /* eval: the token ids go up, the loss sum and token count come down once, together */
  double val = 0, ms = 0;
  g_up = g_down = 0;
  CHECK_OK(runtime_eval(a.rt, 2, &val, &ms));
  size_t ids = (size_t)2 * a.plan->batch_size * a.plan->model.seq_len * sizeof(int);
  CHECK_EQ_INT(2 * ids, g_up);
  CHECK_EQ_INT(2 * sizeof(float), g_down);
  CHECK(val > 0 && val < 10);
  printf("eval: loss %.4f; %zu bytes up, %zu down\n", val, g_up, g_down);

  /* restore through the staging: exactly the checkpointed shard, and no shard downloaded */
  rank_up(&b);
  int step = 0;
  g_up = g_down = 0;
  CHECK_OK(runtime_restore(b.rt, dir, &step));
  CHECK_EQ_INT(1, step);
  CHECK(g_down < S);   /* the ranks' agreement only */
  CHECK(g_up >= 3 * S);   /* parameters, m and v */
  CHECK(memcmp(runtime_param_shard(a.rt), runtime_param_shard(b.rt), S) == 0);
  printf("restore: %zu bytes up, %zu down; parameters %s\n", g_up, g_down,
         memcmp(runtime_param_shard(a.rt), runtime_param_shard(b.rt), S) ? "DIFFER" : "bit-identical");

  /* a refused write-back fails the restore, and every staging buffer is freed (the leak check) */
  g_refuse = S;
  fsdp_status rc = runtime_restore(b.rt, dir, &step);
  g_refuse = 0;
  CHECK(rc != FSDP_OK);
  printf("refused write-back: %s\n", fsdp_last_error());

  rank_down(&b);
  rank_down(&a);
  rm_rf(dir);
  return check_done();
}
