/* test_ckpt — the checkpoint format (common/ckpt.h) and resume through the runtime.
 *
 * Format: CRC32C is the standard one (check value of "123456789"); a checkpoint written by 2 ranks
 * (sharding full) loads into 1, 2, 3 and 4 ranks and into grad_op and none, and the reassembled
 * parameters, AdamW m and v are bit-identical to what was written (resharding copies, never
 * computes); every corruption (truncated file, a flipped byte in each section or in the header,
 * wrong magic, missing manifest) is an error naming the file (and the section); a different model
 * is refused; keep prunes to the newest complete checkpoints.
 * Resume (forked ranks, gloo over loopback, as test_runtime): 6 steps straight vs 3 steps +
 * checkpoint + restore + 3 steps in fresh processes: losses 4..6 and final weights bit-identical for
 * the same world (the same arithmetic on the same bits); restored into N=1 B=4 and N=4 B=1 (N·B·G
 * unchanged): within test_runtime's equivalence tolerances (only fp32 summation order differs).
 * Both parts run for GPT-2 and again for a Llama with grouped-query attention.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "equiv.h"
#include "ranks.h"
#include "testfiles.h"
#include "ckpt.h"
#include "comm.h"
#include "jobspec.h"
#include "plan.h"
#include "runtime.h"

static const char *JOB =
    "[job]\nname = ckpt\nsteps = 6\nseed = 7\n"
    "[model]\nn_layer = 3\nn_head = 2\nn_embd = 32\nvocab_size = 96\nseq_len = 16\n"
    "[data]\ntrain = synthetic:markov:11\nbatch_size = 2\ngrad_accum = 1\n"
    "[optim]\nlr = 1e-3\nmin_lr = 1e-4\nwarmup_steps = 2\nschedule = cosine\nweight_decay = 0.1\ngrad_clip = 1.0\n"
    "[fsdp]\nworld_size = 2\nprefetch = 1\ntimeout_s = 20\n";

/* Set for the second pass: the same tests with a Llama (GQA) instead of JOB's GPT-2. */
static int g_llama;
static const model_config LLAMA = {.arch = ARCH_LLAMA, .n_layer = 3, .n_head = 4, .n_kv_head = 2, .n_embd = 32,
                                   .ffn_dim = 40, .vocab_size = 96, .seq_len = 16, .norm_eps = 1e-5,
                                   .rope_theta = 500000};

static void make_spec(jobspec_t *s, int world, int batch, shard_mode sh) {
  if (jobspec_parse(JOB, "test_ckpt.ini", "/tmp", s) != FSDP_OK) {
    fprintf(stderr, "job text: %s\n", fsdp_last_error());
    exit(2);
  }
  if (g_llama) s->model = LLAMA;
  s->world_size = world;
  s->batch_size = batch;
  s->sharding = sh;
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ---------------------------------------------------------------- format */

/* The reference model: unit u element i of section s, distinct everywhere and exactly representable. */
static float ref_value(int s, int u, int64_t i) { return (float)((s + 1) * 1000000 + u * 20000 + i) * (s == 1 ? -1.0f : 1.0f); }

static void fill_shard(const plan_t *p, int rank, float *sec[CKPT_NSEC]) {
  for (int s = 0; s < CKPT_NSEC; s++)
    for (int u = 0; u < p->nunits; u++) {
      const plan_unit *pu = &p->units[u];
      int64_t off = plan_shard_offset(p, u, rank);
      for (int64_t i = 0; i < pu->shard_numel; i++)
        sec[s][pu->shard_base + i] = off + i < pu->numel ? ref_value(s, u, off + i) : 0.0f;
    }
}

static void write_ckpt(const char *dir, int world, shard_mode sh, int step) {
  jobspec_t spec;
  make_spec(&spec, world, 2, sh);
  plan_t *p = NULL;
  CHECK_OK(plan_build(&spec, world, &p));
  float *sec[CKPT_NSEC];
  for (int s = 0; s < CKPT_NSEC; s++) sec[s] = malloc((size_t)p->shard_total * sizeof(float));
  for (int r = 0; r < world; r++) {
    fill_shard(p, r, sec);
    CHECK_OK(ckpt_write_rank(dir, p, r, step, step, sec[0], sec[1], sec[2]));
  }
  CHECK_OK(ckpt_write_manifest(dir, p, step, (uint64_t)step * 1000));
  for (int s = 0; s < CKPT_NSEC; s++) free(sec[s]);
  plan_destroy(&p);
}

/* Load checkpoint STEP into every rank of WORLD ranks with sharding SH; count elements that differ
 * from the reference (padding must be zero). Returns the first failing status. */
static fsdp_status load_all(const char *dir, int step, int world, shard_mode sh, int verify, int64_t *bad) {
  jobspec_t spec;
  make_spec(&spec, world, 8 / world > 0 ? 8 / world : 1, sh);
  plan_t *p = NULL;
  fsdp_status rc = plan_build(&spec, world, &p);
  if (rc != FSDP_OK) return rc;
  ckpt_info ci;
  rc = ckpt_read_manifest(dir, step, &ci);
  float *sec[CKPT_NSEC];
  for (int s = 0; s < CKPT_NSEC; s++) sec[s] = malloc((size_t)p->shard_total * sizeof(float));
  *bad = 0;
  for (int r = 0; r < world && rc == FSDP_OK; r++) {
    if (verify) rc = ckpt_verify(dir, &ci, r, world);
    int64_t ostep = -1;
    if (rc == FSDP_OK) rc = ckpt_load_shard(dir, &ci, &spec, p, r, sec[0], sec[1], sec[2], &ostep);
    if (rc != FSDP_OK) break;
    if (ostep != step) (*bad)++;
    for (int s = 0; s < CKPT_NSEC; s++)
      for (int u = 0; u < p->nunits; u++) {
        const plan_unit *pu = &p->units[u];
        int64_t off = plan_shard_offset(p, u, r);
        for (int64_t i = 0; i < pu->shard_numel; i++) {
          float want = off + i < pu->numel ? ref_value(s, u, off + i) : 0.0f, got = sec[s][pu->shard_base + i];
          if (memcmp(&want, &got, sizeof got) != 0) (*bad)++;
        }
      }
  }
  for (int s = 0; s < CKPT_NSEC; s++) free(sec[s]);
  plan_destroy(&p);
  return rc;
}

static void test_crc(void) {
  CHECK_EQ_INT(0xE3069283u, ckpt_crc32c(0, "123456789", 9));
  CHECK_EQ_INT(ckpt_crc32c(0, "123456789", 9), ckpt_crc32c(ckpt_crc32c(0, "1234", 4), "56789", 5));
  CHECK_EQ_INT(0, ckpt_crc32c(0, "", 0));
  /* RFC 3720 B.4: 32 bytes of zeros → 0x8A9136AA */
  static const unsigned char zeros[32];
  CHECK_EQ_INT(0x8A9136AAu, ckpt_crc32c(0, zeros, 32));
}

static void test_roundtrip_reshard(void) {
  char dir[] = "/tmp/fsdp-ckpt-XXXXXX";
  if (!mkdtemp(dir)) return;
  write_ckpt(dir, 2, SHARD_FULL, 5);
  int latest = -1;
  CHECK_OK(ckpt_latest(dir, &latest));
  CHECK_EQ_INT(5, latest);
  ckpt_info ci;
  CHECK_OK(ckpt_read_manifest(dir, 5, &ci));
  CHECK_EQ_INT(2, ci.world);
  CHECK_EQ_INT(SHARD_FULL, ci.sharding);
  CHECK_EQ_INT(5000, ci.tokens);
  CHECK_EQ_INT(3, ci.model.n_layer);
  CHECK_EQ_INT(g_llama ? ARCH_LLAMA : ARCH_GPT2, ci.model.arch);
  if (g_llama) {   /* the manifest carries Llama's keys */
    CHECK_EQ_INT(2, ci.model.n_kv_head);
    CHECK_EQ_INT(40, ci.model.ffn_dim);
    CHECK_NEAR(500000, ci.model.rope_theta, 0, 0);
    CHECK_NEAR(1e-5, ci.model.norm_eps, 0, 0);
  }
  CHECK_EQ_INT(2 * 2 * 1, ci.rows_per_step);
  CHECK_OK(ckpt_verify(dir, &ci, 0, 1));
  static const struct { int world; shard_mode sh; } to[] = {
      {1, SHARD_FULL}, {2, SHARD_FULL}, {3, SHARD_FULL}, {4, SHARD_FULL}, {2, SHARD_NONE}, {3, SHARD_GRAD_OP}, {1, SHARD_NONE}};
  for (size_t k = 0; k < sizeof to / sizeof to[0]; k++) {
    int64_t bad = -1;
    CHECK_OK(load_all(dir, 5, to[k].world, to[k].sh, 1, &bad));
    CHECK_EQ_INT(0, bad);
    printf("reshard 2×full → %d×%s: %lld differing elements\n", to[k].world, jobspec_shard_mode_name(to[k].sh), (long long)bad);
  }
  /* and back: written by 3 ranks with none (identical copies), read by 2 full */
  write_ckpt(dir, 3, SHARD_NONE, 6);
  int64_t bad = -1;
  CHECK_OK(load_all(dir, 6, 2, SHARD_FULL, 1, &bad));
  CHECK_EQ_INT(0, bad);
  /* a different model is refused, with a message that says what must match */
  jobspec_t spec;
  make_spec(&spec, 2, 2, SHARD_FULL);
  spec.model.n_layer = 4;
  plan_t *p = NULL;
  CHECK_OK(plan_build(&spec, 2, &p));
  CHECK_OK(ckpt_read_manifest(dir, 5, &ci));
  float *buf = malloc((size_t)p->shard_total * sizeof(float) * 3);
  fsdp_status rc = ckpt_load_shard(dir, &ci, &spec, p, 0, buf, buf + p->shard_total, buf + 2 * p->shard_total, NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, rc);
  CHECK(contains(fsdp_last_error(), "different model"));
  free(buf);
  plan_destroy(&p);
  /* the other architecture, or a Llama of other kv heads, is refused too */
  make_spec(&spec, 2, 2, SHARD_FULL);
  if (g_llama) spec.model.n_kv_head = 4;
  else spec.model = LLAMA;
  CHECK_OK(plan_build(&spec, 2, &p));
  buf = malloc((size_t)p->shard_total * sizeof(float) * 3);
  rc = ckpt_load_shard(dir, &ci, &spec, p, 0, buf, buf + p->shard_total, buf + 2 * p->shard_total, NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, rc);
  CHECK(contains(fsdp_last_error(), g_llama ? "different model: llama, n_layer 3, n_head 4, n_embd 32, vocab_size 96, "
                                              "seq_len 16, n_kv_head 2, ffn_dim 40, norm_eps 1e-05, rope_theta 500000, untied, "
                                              "rope_scaling none; this job has llama"
                                            : "different model: gpt2"));
  free(buf);
  plan_destroy(&p);
  /* a Llama that differs only in rope_theta, in the tie or in the rope scaling: refused, both models
   * printed with the difference */
  for (int v = 0; g_llama && v < 3; v++) {
    static const char *const mine[3] = {"rope_theta 10000, untied, rope_scaling none. The model must match",
                                        "rope_theta 500000, tied, rope_scaling none. The model must match",
                                        "rope_theta 500000, untied, rope_scaling llama3 (factor 8, low_freq_factor 1, "
                                        "high_freq_factor 4, original_max_position_embeddings 8). The model must match"};
    make_spec(&spec, 2, 2, SHARD_FULL);
    if (v == 0) spec.model.rope_theta = 10000;
    if (v == 1) spec.model.tie_embeddings = 1;
    if (v == 2)
      spec.model.rope_scaling = ROPE_SCALING_LLAMA3, spec.model.rope_factor = 8, spec.model.rope_low_freq_factor = 1,
      spec.model.rope_high_freq_factor = 4, spec.model.rope_original_max_pos = 8;
    CHECK_OK(plan_build(&spec, 2, &p));
    buf = malloc((size_t)p->shard_total * sizeof(float) * 3);
    rc = ckpt_load_shard(dir, &ci, &spec, p, 0, buf, buf + p->shard_total, buf + 2 * p->shard_total, NULL);
    CHECK_EQ_INT(FSDP_ERR_INVALID, rc);
    CHECK(contains(fsdp_last_error(), "norm_eps 1e-05, rope_theta 500000, untied, rope_scaling none; this job has llama"));
    CHECK(contains(fsdp_last_error(), mine[v]));
    free(buf);
    plan_destroy(&p);
  }
  rm_rf(dir);
}

static void section_offset(const char *path, int s, uint64_t *off) {
  int fd = open(path, O_RDONLY);
  *off = 0;
  if (pread(fd, off, 8, 80 + 24 * s) != 8) *off = 0;   /* documented layout: {offset, length, crc} at 80 + 24·s */
  close(fd);
}

static void flip_byte(const char *path, uint64_t off) {
  int fd = open(path, O_RDWR);
  unsigned char b = 0;
  if (pread(fd, &b, 1, (off_t)off) != 1) fprintf(stderr, "pread %s\n", path);
  b ^= 0x10;
  if (pwrite(fd, &b, 1, (off_t)off) != 1) fprintf(stderr, "pwrite %s\n", path);
  close(fd);
}

static void test_corruption(void) {
  char dir[] = "/tmp/fsdp-ckpt-XXXXXX";
  if (!mkdtemp(dir)) return;
  char file[700];
  snprintf(file, sizeof file, "%s/step-00000003/rank-1.bin", dir);
  int64_t bad;
  /* a flipped byte in each section: the same-layout load (whole sections) and the resharding
   * path's verification both name the file and the section */
  for (int s = 0; s < CKPT_NSEC; s++) {
    write_ckpt(dir, 2, SHARD_FULL, 3);
    uint64_t off;
    section_offset(file, s, &off);
    CHECK(off > 0);
    flip_byte(file, off + 4 * 37 + 1);
    fsdp_status rc = load_all(dir, 3, 2, SHARD_FULL, 0, &bad);
    CHECK_EQ_INT(FSDP_ERR_FORMAT, rc);
    CHECK(contains(fsdp_last_error(), "rank-1.bin") && contains(fsdp_last_error(), ckpt_section_name((ckpt_section)s)) &&
          contains(fsdp_last_error(), "CRC32C"));
    printf("flipped %s: %s\n", ckpt_section_name((ckpt_section)s), fsdp_last_error());
    rc = load_all(dir, 3, 3, SHARD_FULL, 1, &bad);
    CHECK_EQ_INT(FSDP_ERR_FORMAT, rc);
    CHECK(contains(fsdp_last_error(), "rank-1.bin") && contains(fsdp_last_error(), ckpt_section_name((ckpt_section)s)));
    rm_rf(dir);
    mkdir(dir, 0700);
  }
  /* a flipped header byte (the step field) */
  write_ckpt(dir, 2, SHARD_FULL, 3);
  flip_byte(file, 16);
  CHECK_EQ_INT(FSDP_ERR_FORMAT, load_all(dir, 3, 4, SHARD_FULL, 0, &bad));
  CHECK(contains(fsdp_last_error(), "rank-1.bin") && contains(fsdp_last_error(), "header CRC32C"));
  /* wrong magic */
  write_ckpt(dir, 2, SHARD_FULL, 3);
  flip_byte(file, 0);
  CHECK_EQ_INT(FSDP_ERR_FORMAT, load_all(dir, 3, 2, SHARD_FULL, 0, &bad));
  CHECK(contains(fsdp_last_error(), "rank-1.bin") && contains(fsdp_last_error(), "magic"));
  /* truncated */
  write_ckpt(dir, 2, SHARD_FULL, 3);
  struct stat sb;
  stat(file, &sb);
  CHECK(truncate(file, sb.st_size - 100) == 0);
  CHECK_EQ_INT(FSDP_ERR_FORMAT, load_all(dir, 3, 1, SHARD_FULL, 0, &bad));
  CHECK(contains(fsdp_last_error(), "rank-1.bin") && contains(fsdp_last_error(), "truncated"));
  /* missing manifest: step 3 does not exist; the older complete one is the newest */
  write_ckpt(dir, 2, SHARD_FULL, 2);
  write_ckpt(dir, 2, SHARD_FULL, 3);
  char man[700];
  snprintf(man, sizeof man, "%s/step-00000003/manifest.json", dir);
  CHECK(unlink(man) == 0);
  int latest = -1;
  CHECK_OK(ckpt_latest(dir, &latest));
  CHECK_EQ_INT(2, latest);
  ckpt_info ci;
  CHECK_EQ_INT(FSDP_ERR_NOTFOUND, ckpt_read_manifest(dir, 3, &ci));
  CHECK(contains(fsdp_last_error(), "manifest.json"));
  rm_rf(dir);
  CHECK_EQ_INT(FSDP_ERR_NOTFOUND, ckpt_latest(dir, &latest));
}

static void test_prune(void) {
  char dir[] = "/tmp/fsdp-ckpt-XXXXXX";
  if (!mkdtemp(dir)) return;
  write_ckpt(dir, 1, SHARD_FULL, 1);
  /* an incomplete directory older than the newest complete one (a crashed attempt), and a newer one */
  char path[700];
  snprintf(path, sizeof path, "%s/step-00000002", dir);
  mkdir(path, 0755);
  for (int s = 3; s <= 5; s++) write_ckpt(dir, 1, SHARD_FULL, s);
  /* links planted as step directories, to a complete checkpoint elsewhere: never read, and pruning
   * removes the older one as a link, leaving what it points to */
  char other[] = "/tmp/fsdp-ckpt-other-XXXXXX", target[700], link0[700], link9[700], kept[760];
  CHECK(mkdtemp(other) != NULL);
  write_ckpt(other, 1, SHARD_FULL, 1);
  ckpt_step_dir(other, 1, target, sizeof target);
  ckpt_step_dir(dir, 0, link0, sizeof link0);
  ckpt_step_dir(dir, 9, link9, sizeof link9);
  CHECK(symlink(target, link0) == 0 && symlink(target, link9) == 0);
  CHECK_OK(ckpt_prune(dir, 2));
  for (int s = 1; s <= 5; s++) {
    char sd[700];
    ckpt_step_dir(dir, s, sd, sizeof sd);
    CHECK_EQ_INT(s >= 4, access(sd, F_OK) == 0);
  }
  struct stat st;
  CHECK(lstat(link0, &st) != 0 && lstat(link9, &st) == 0 && S_ISLNK(st.st_mode));
  snprintf(kept, sizeof kept, "%s/" CKPT_MANIFEST, target);
  CHECK(access(kept, F_OK) == 0);
  snprintf(kept, sizeof kept, "%s/rank-0.bin", target);
  CHECK(access(kept, F_OK) == 0);
  int latest = 0;
  CHECK_OK(ckpt_latest(dir, &latest));
  CHECK_EQ_INT(5, latest);   /* not 9: a link is not a checkpoint */
  ckpt_info ci;
  CHECK_EQ_INT(FSDP_ERR_INVALID, ckpt_read_manifest(dir, 9, &ci));
  CHECK(contains(fsdp_last_error(), "step-00000009 is not a directory of this checkpoint"));
  rm_rf(other);
  /* keep = 1 while a newer save is being written (step 7: a rank file, no manifest yet): the last
   * complete checkpoint (5) stays, and so does the one being written */
  char sd7[700], f7[760];
  ckpt_step_dir(dir, 7, sd7, sizeof sd7);
  mkdir(sd7, 0755);
  snprintf(f7, sizeof f7, "%s/rank-0.bin.tmp", sd7);
  CHECK(write_all(f7, "x", 1) == 0);
  CHECK_OK(ckpt_prune(dir, 1));
  for (int s = 4; s <= 7; s++) {
    char sd[700];
    ckpt_step_dir(dir, s, sd, sizeof sd);
    CHECK_EQ_INT(s == 5 || s == 7, access(sd, F_OK) == 0);
  }
  CHECK_OK(ckpt_latest(dir, &latest));
  CHECK_EQ_INT(5, latest);
  /* a failed save: its step directory removed, the complete one before it untouched */
  CHECK_OK(ckpt_discard(dir, 7));
  CHECK(access(sd7, F_OK) != 0);
  CHECK_OK(ckpt_latest(dir, &latest));
  CHECK_EQ_INT(5, latest);
  /* the due rule */
  jobspec_t spec;
  make_spec(&spec, 1, 2, SHARD_FULL);
  CHECK(!ckpt_due(&spec, 2));
  spec.ckpt_every = 4;
  snprintf(spec.ckpt_dir, sizeof spec.ckpt_dir, "%s", dir);
  CHECK(!ckpt_due(&spec, 2) && ckpt_due(&spec, 4) && !ckpt_due(&spec, 5) && ckpt_due(&spec, 6));
  rm_rf(dir);
}

/* ---------------------------------------------------------------- resume through the runtime */

#define STEPS 6
#define MAXW 4

typedef struct config {
  int world, batch;
  int restore;          /* restore from ckpt (expect step `first - 1`) */
  int first, last;      /* steps run */
  int ckpt_at;          /* checkpoint after this step, 0: none */
  int async;            /* ... saved asynchronously, settled at the step boundaries and at the end */
} config;

typedef struct result {
  double loss[STEPS + 1];
  int restored;
  int ok;
} result;

/* The CPU device of every rank: FSDP_CPU_DEVICE (ctest runs this file as sync and strict). */
static dev_cpu_mode g_mode;

static void child(const config *c, int rank, const char *run_dir, const char *ckdir) {
  jobspec_t spec;
  make_spec(&spec, c->world, c->batch, SHARD_FULL);
  snprintf(spec.ckpt_dir, sizeof spec.ckpt_dir, "%s", ckdir);
  plan_t *plan = NULL;
  comm_t *comm = NULL;
  device_t *dev = NULL;
  runtime_t *rt = NULL;
  result res;
  memset(&res, 0, sizeof res);
  char path[700];
  snprintf(path, sizeof path, "%s/store", run_dir);
  if (plan_build(&spec, c->world, &plan) != FSDP_OK || comm_new_gloo(rank, c->world, path, NULL, "t", spec.timeout_s, &comm) != FSDP_OK ||
      dev_new_cpu(g_mode, &dev) != FSDP_OK || runtime_new(&spec, plan, rank, comm, dev, &rt) != FSDP_OK) {
    fprintf(stderr, "rank %d setup: %s\n", rank, fsdp_last_error());
    _exit(3);
  }
  fsdp_status rrc = c->restore ? runtime_restore(rt, ckdir, &res.restored) : FSDP_OK;
  if (rrc != FSDP_OK) {   /* 4: this rank's own failure; 6: a peer's (secondary, naming it) */
    fprintf(stderr, "rank %d restore: %s\n", rank, fsdp_last_error());
    _exit(rrc == FSDP_ERR_COMM ? 6 : 4);
  }
  ckpt_async *ca = NULL;
  if (c->async && ckpt_async_new(&ca) != FSDP_OK) _exit(3);
  for (int s = c->first; s <= c->last; s++) {
    rt_report r;
    if (runtime_step(rt, s, &r) != FSDP_OK) {
      fprintf(stderr, "rank %d step %d: %s\n", rank, s, fsdp_last_error());
      _exit(5);
    }
    res.loss[s] = r.loss;
    ckpt_save_stats st;
    fsdp_status rc = FSDP_OK;
    if (s == c->ckpt_at)
      rc = c->async ? runtime_checkpoint_async(rt, ca, ckdir, s, &st) : runtime_checkpoint(rt, ckdir, s, &st);
    else if (ca)
      rc = runtime_checkpoint_settle(rt, ca, 0, &st);
    if (rc != FSDP_OK) {
      fprintf(stderr, "rank %d checkpoint: %s\n", rank, fsdp_last_error());
      _exit(6);
    }
  }
  ckpt_save_stats st;
  if (runtime_checkpoint_settle(rt, ca, 1, &st) != FSDP_OK) {
    fprintf(stderr, "rank %d checkpoint: %s\n", rank, fsdp_last_error());
    _exit(6);
  }
  ckpt_async_destroy(&ca);
  res.ok = 1;
  snprintf(path, sizeof path, "%s/result-%d", run_dir, rank);
  if (write_all(path, &res, sizeof res)) _exit(7);
  snprintf(path, sizeof path, "%s/shard-%d", run_dir, rank);
  if (write_all(path, runtime_param_shard(rt), (size_t)plan->shard_total * sizeof(float))) _exit(8);
  runtime_destroy(&rt);
  dev_destroy(&dev);
  comm_destroy(&comm);
  plan_destroy(&plan);
  _exit(0);
}

static int last_status[MAXW];   /* each rank's wait status in the last run() */

/* Run C in forked ranks with checkpoints in CKDIR; res = rank 0's result; *model = the full model. */
typedef struct ck_call {
  const config *c;
  const char *ckdir;
} ck_call;

static int ck_rank(int rank, int world, const char *dir, void *arg) {
  const ck_call *k = arg;
  (void)world;
  child(k->c, rank, dir, k->ckdir);   /* exits */
  return 0;
}

static int run(const config *c, const char *ckdir, result *res, float **model, int64_t *nmodel) {
  ranks_run rr = {.world = c->world, .deadline_s = 120, .release_fd = -1};
  ck_call k = {c, ckdir};
  ranks_go(&rr, ck_rank, &k);
  const char *dir = rr.dir;
  char path[700], why[64];
  int ok = 1;
  for (int r = 0; r < c->world; r++) {
    last_status[r] = rr.status[r];
    if (rr.status[r] == -1 || !WIFEXITED(rr.status[r]) || WEXITSTATUS(rr.status[r]) != 0) {
      fprintf(stderr, "rank %d ended: %s\n", r, ranks_why(&rr, r, why, sizeof why));
      ok = 0;
    }
  }
  jobspec_t spec;
  make_spec(&spec, c->world, c->batch, SHARD_FULL);
  plan_t *plan = NULL;
  if (plan_build(&spec, c->world, &plan) != FSDP_OK) return -1;
  int64_t total = 0;
  for (int u = 0; u < plan->nunits; u++) total += plan->units[u].numel;
  float *full = calloc((size_t)total, sizeof(float)), *shard = malloc((size_t)plan->shard_total * sizeof(float));
  for (int r = 0; r < c->world && ok; r++) {
    snprintf(path, sizeof path, "%s/result-%d", dir, r);
    result rr;
    if (read_all(path, &rr, sizeof rr)) ok = 0;
    if (r == 0) *res = rr;
    snprintf(path, sizeof path, "%s/shard-%d", dir, r);
    if (read_all(path, shard, (size_t)plan->shard_total * sizeof(float)) == 0) place_shard(plan, r, shard, full);
  }
  free(shard);
  *model = full;
  *nmodel = total;
  plan_destroy(&plan);
  ranks_cleanup(&rr);
  return ok ? 0 : -1;
}

static void test_resume(void) {
  char ck[] = "/tmp/fsdp-ckpt-XXXXXX";
  if (!mkdtemp(ck)) return;
  result straight, first, resumed;
  float *ms = NULL, *m1 = NULL, *mr = NULL;
  int64_t n = 0, n1 = 0, nr = 0;
  config cs = {.world = 2, .batch = 2, .first = 1, .last = STEPS};
  CHECK(run(&cs, ck, &straight, &ms, &n) == 0);
  config c1 = {.world = 2, .batch = 2, .first = 1, .last = 3, .ckpt_at = 3};
  CHECK(run(&c1, ck, &first, &m1, &n1) == 0);
  int latest = 0;
  CHECK_OK(ckpt_latest(ck, &latest));
  CHECK_EQ_INT(3, latest);
  for (int s = 1; s <= 3; s++) CHECK(first.loss[s] == straight.loss[s]);

  /* same world: bit-identical */
  config cr = {.world = 2, .batch = 2, .restore = 1, .first = 4, .last = STEPS};
  CHECK(run(&cr, ck, &resumed, &mr, &nr) == 0);
  CHECK_EQ_INT(3, resumed.restored);
  CHECK_EQ_INT(n, nr);
  for (int s = 4; s <= STEPS; s++) CHECK(resumed.loss[s] == straight.loss[s]);
  CHECK(mr && ms && memcmp(mr, ms, (size_t)n * sizeof(float)) == 0);
  printf("resume N=2: losses 4..6 %.7f %.7f %.7f (straight %.7f %.7f %.7f), weights %s\n", resumed.loss[4],
         resumed.loss[5], resumed.loss[6], straight.loss[4], straight.loss[5], straight.loss[6],
         mr && ms && !memcmp(mr, ms, (size_t)n * sizeof(float)) ? "bit-identical" : "DIFFER");
  free(mr);

  /* other world sizes with N·B·G unchanged: equal to fp32 summation order (test_runtime's bounds) */
  static const int worlds[] = {1, 4};
  for (int k = 0; k < 2; k++) {
    config cw = {.world = worlds[k], .batch = 4 / worlds[k], .restore = 1, .first = 4, .last = STEPS};
    mr = NULL;
    CHECK(run(&cw, ck, &resumed, &mr, &nr) == 0);
    CHECK_EQ_INT(3, resumed.restored);
    CHECK_EQ_INT(n, nr);
    double maxl = 0, maxw = 0;
    for (int s = 4; s <= STEPS; s++) {
      CHECK_NEAR(straight.loss[s], resumed.loss[s], 0, 1e-5);   /* resumed on another world: fp32 sums reordered, ~1e-7 */
      double d = fabs(resumed.loss[s] - straight.loss[s]) / fabs(straight.loss[s]);
      if (d > maxl) maxl = d;
    }
    jobspec_t js;
    CHECK_OK(jobspec_parse(JOB, "ckpt.ini", "/tmp", &js));
    int64_t beyond = 0;
    CHECK(mr != NULL);
    if (mr) equiv_weights(&js, STEPS, ms, mr, n, 2e-6, 1e-5, &maxw, &beyond);   /* equiv.h: sums reordered */
    printf("resume N=2 B=2 → N=%d B=%d: max loss rel diff %.2e, max weight abs diff %.2e\n", cw.world, cw.batch, maxl, maxw);
    free(mr);
  }
  /* A corrupt file fails the restore on every rank, whichever rank reads it, and nothing hangs:
   * same layout (rank 1 reads it whole), and resharded into 3 (rank 1 verifies it, 1 and 2 read it).
   * The rank whose range holds the flipped byte (rank 1 in both layouts) fails with its own reason
   * (4); the others with a secondary error (6) naming rank 1, so the coordinator reports rank 1. */
  char file[700];
  snprintf(file, sizeof file, "%s/step-00000003/rank-1.bin", ck);
  uint64_t off;
  section_offset(file, CKPT_SEC_V, &off);
  flip_byte(file, off + 8);
  for (int world = 2; world <= 3; world++) {
    config cw = {.world = world, .batch = 2, .restore = 1, .first = 4, .last = STEPS};
    mr = NULL;
    CHECK(run(&cw, ck, &resumed, &mr, &nr) != 0);
    for (int r = 0; r < world; r++)
      CHECK(WIFEXITED(last_status[r]) && WEXITSTATUS(last_status[r]) == (r == 1 ? 4 : 6));
    free(mr);
  }
  free(ms);
  free(m1);
  rm_rf(ck);
}

/* An asynchronous save (snapshot, writer thread, manifest at a later step boundary) writes the same
 * bytes as a synchronous one, and resuming from it gives the same losses and weights, bit for bit. */
static void test_async_resume(void) {
  char cks[] = "/tmp/fsdp-ckpt-XXXXXX", cka[] = "/tmp/fsdp-ckpt-XXXXXX";
  if (!mkdtemp(cks) || !mkdtemp(cka)) return;
  result rs, ra;
  float *ms = NULL, *ma = NULL;
  int64_t ns = 0, na = 0;
  /* saved after step 2, then step 3 runs while the file is written (settled at the end) */
  config cs = {.world = 2, .batch = 2, .first = 1, .last = 3, .ckpt_at = 2};
  config ca = cs;
  ca.async = 1;
  CHECK(run(&cs, cks, &rs, &ms, &ns) == 0);
  CHECK(run(&ca, cka, &ra, &ma, &na) == 0);
  free(ms), free(ma);
  int latest = 0;
  CHECK_OK(ckpt_latest(cka, &latest));
  CHECK_EQ_INT(2, latest);
  for (int r = 0; r < 2; r++) {
    char fs[700], fa[700];
    snprintf(fs, sizeof fs, "%s/step-00000002/rank-%d.bin", cks, r);
    snprintf(fa, sizeof fa, "%s/step-00000002/rank-%d.bin", cka, r);
    CHECK(files_equal(fs, fa));
  }
  config cr = {.world = 2, .batch = 2, .restore = 1, .first = 3, .last = STEPS};
  ms = ma = NULL;
  CHECK(run(&cr, cks, &rs, &ms, &ns) == 0);
  CHECK(run(&cr, cka, &ra, &ma, &na) == 0);
  CHECK_EQ_INT(2, rs.restored);
  CHECK_EQ_INT(2, ra.restored);
  for (int s = 3; s <= STEPS; s++) CHECK(memcmp(&rs.loss[s], &ra.loss[s], sizeof(double)) == 0);
  CHECK(ms && ma && ns == na && memcmp(ms, ma, (size_t)ns * sizeof(float)) == 0);
  printf("async save: rank files equal to the synchronous ones; resumed losses 3..%d and weights %s\n", STEPS,
         ms && ma && !memcmp(ms, ma, (size_t)ns * sizeof(float)) ? "bit-identical" : "DIFFER");
  free(ms), free(ma);
  rm_rf(cks);
  rm_rf(cka);
}

int main(int argc, char **argv) {
  (void)argc;
  single_threaded_ranks(argv);
  if (dev_cpu_mode_from_env(&g_mode) != FSDP_OK) {
    fprintf(stderr, "%s\n", fsdp_last_error());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  test_crc();
  test_roundtrip_reshard();
  test_corruption();
  test_prune();
  test_resume();
  test_async_resume();
  g_llama = 1;   /* the same with a Llama: format, resharding, resume at other world sizes */
  printf("Llama:\n");
  test_roundtrip_reshard();
  test_resume();
  return check_done();
}
