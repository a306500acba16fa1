/* test_jobspec — the job file: defaults, every key, comments, paths, and each class of bad input. */
#include "jobspec.h"

#include "arch.h"
#include "ckpt.h"
#include "plan.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char tmpdir[512];

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
}

/* The source tree, from this file's path (CMake compiles it by absolute path). */
static void source_path(char *out, size_t n, const char *rel) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", __FILE__);
  char *s = strstr(dir, "tests/unit/");
  if (s) *s = '\0';
  if (dir[0] == '/') snprintf(out, n, "%s%s", dir, rel);
  else snprintf(out, n, "./%s%s", dir, rel);   /* compiled by relative path: from the source root */
}

/* Parse TEXT and expect failure: a one-line message that names "bad.ini:LINE:" and says what is
 * allowed (or what to do). */
static void expect_error(const char *text, int line, const char *needle) {
  jobspec_t s;
  fsdp_status rc = jobspec_parse(text, "bad.ini", tmpdir, &s);
  CHECK(rc != FSDP_OK);
  const char *msg = fsdp_last_error();
  char prefix[32];
  snprintf(prefix, sizeof prefix, "bad.ini:%d: ", line);
  int ok = !strncmp(msg, prefix, strlen(prefix)) && !strchr(msg, '\n') && strstr(msg, needle);
  if (!ok) fprintf(stderr, "  for %s: got '%s', want prefix '%s' and '%s'\n", text, msg, prefix, needle);
  CHECK(ok);
}

/* The two lines that make a job file valid (its train data), and expect_error for them then KEYS. */
static const char *const TRAIN = "[data]\ntrain = synthetic:markov:1\n";

static void expect_error_train(const char *keys, int line, const char *needle) {
  char text[512];
  snprintf(text, sizeof text, "%s%s", TRAIN, keys);
  expect_error(text, line, needle);
}

static void test_defaults(void) {
  jobspec_t d;
  jobspec_defaults(&d);
  CHECK_EQ_INT(12, d.model.n_layer);
  CHECK_EQ_INT(12, d.model.n_head);
  CHECK_EQ_INT(768, d.model.n_embd);
  CHECK_EQ_INT(50257, d.model.vocab_size);
  CHECK_EQ_INT(1024, d.model.seq_len);
  CHECK_EQ_INT(1337, d.seed);
  CHECK_EQ_INT(1, d.world_size);
  CHECK_EQ_INT(DEVICE_CPU, d.device);
  CHECK_EQ_INT(SHARD_FULL, d.sharding);
  CHECK_EQ_INT(1, d.prefetch);
  CHECK_EQ_INT(DTYPE_FP32, d.param_dtype);
  CHECK_EQ_INT(DTYPE_FP32, d.reduce_dtype);
  CHECK_EQ_INT(COMM_AUTO, d.comm);
  CHECK_NEAR(60, d.timeout_s, 0, 0);
  CHECK_EQ_INT(0, d.ckpt_every);
  CHECK_EQ_INT(2, d.ckpt_keep);
  CHECK_EQ_INT(RESUME_AUTO, d.resume);
  CHECK_NEAR(6e-4, d.lr, 0, 0);
  CHECK_NEAR(6e-5, d.min_lr, 0, 0);
  CHECK_EQ_INT(2000, d.warmup_steps);
  CHECK_EQ_INT(1, d.shuffle);
  CHECK(!jobspec_has_val(&d));
  CHECK_EQ_INT(0, d.eval_every);
  CHECK_EQ_INT(20, d.eval_batches);
  CHECK_EQ_INT(0, d.sample_every);
  CHECK(d.sample_prompt[0] == '\0');
  CHECK(!strcmp(d.init, "random"));
  CHECK_EQ_INT(ARCH_GPT2, d.model.arch);
  CHECK(!strcmp(jobspec_arch_name(ARCH_LLAMA), "llama"));
  CHECK_NEAR(1e-5, d.model.norm_eps, 0, 0);
  CHECK_NEAR(10000, d.model.rope_theta, 0, 0);
  CHECK(!strcmp(jobspec_shard_mode_name(SHARD_GRAD_OP), "grad_op"));
  CHECK(!strcmp(jobspec_device_kind_name(DEVICE_CUDA), "cuda"));
  CHECK(!strcmp(jobspec_dtype_kind_name(DTYPE_BF16), "bf16"));
  CHECK(!strcmp(jobspec_comm_kind_name(COMM_NCCL), "nccl"));
  CHECK(!strcmp(jobspec_lr_schedule_name(SCHED_COSINE), "cosine"));
  CHECK_EQ_INT(2, jobspec_dtype_bytes(DTYPE_BF16));
  CHECK_EQ_INT(4, jobspec_dtype_bytes(DTYPE_FP32));
}

/* --defaults output is itself a job file that parses back to the defaults (given a train). */
static void test_defaults_roundtrip(void) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  jobspec_write_defaults(f);
  fputs("\n[data]\ntrain = synthetic:markov:7\n", f);
  fclose(f);
  CHECK(strstr(buf, "\n[fsdp]\n") != NULL);
  CHECK(strstr(buf, "lr = 0.0006\n") != NULL);
  jobspec_t s, d;
  CHECK_OK(jobspec_parse(buf, "<string>", tmpdir, &s));
  jobspec_defaults(&d);
  CHECK_EQ_INT(1, s.synthetic);
  CHECK_EQ_INT(7, s.markov_seed);
  /* everything but the data source equals the defaults */
  s.synthetic = d.synthetic;
  s.markov_seed = d.markov_seed;
  CHECK(!memcmp(&s, &d, sizeof s));
  free(buf);
}

static void test_every_key(void) {
  char tok[PATH_MAX + 32], init[PATH_MAX + 32];
  snprintf(tok, sizeof tok, "%s/data/tokens.bin", tmpdir);
  snprintf(init, sizeof init, "%s/init.safetensors", tmpdir);
  write_file(tok, "x");
  write_file(init, "x");
  const char *text =
      "# a comment\n"
      "; another\n"
      "[job]\n"
      "name = run-1.b\n"
      "steps = 123        # inline hash comment\n"
      "seed = 18446744073709551615 ; inline semicolon comment\n"
      "max_restarts = 3\n"
      "restart_wait_s = 7.5\n"
      "\n"
      "[model]\n"
      "  arch = gpt2\n"               /* indented keys are keys, not continuations */
      "  n_layer = 4\n"
      "n_head = 8\n"
      "n_embd = 256\n"
      "vocab_size = 512\n"
      "seq_len = 128\n"
      "init = init.safetensors\n"
      "[data]\n"
      "train = data/../data/tokens.bin\n"
      "batch_size = 3\n"
      "grad_accum = 7\n"
      "shuffle = false\n"
      "val = data/tokens.bin\n"
      "[optim]\n"
      "lr = 1e-3\n"
      "min_lr = 0\n"
      "warmup_steps = 0\n"
      "schedule = constant\n"
      "weight_decay = 0\n"
      "beta1 = 0\n"
      "beta2 = 0.999\n"
      "eps = 1e-6\n"
      "grad_clip = 0\n"
      "[fsdp]\n"
      "world_size = 64\n"
      "device = cuda\n"
      "sharding = grad_op\n"
      "prefetch = 4\n"
      "param_dtype = bf16\n"
      "reduce_dtype = bf16\n"
      "comm = nccl\n"
      "timeout_s = 2.5\n"
      "[checkpoint]\n"
      "dir = ./ck/../ckpt\n"
      "every = 50\n"
      "keep = 5\n"
      "resume = auto\n"
      "[eval]\n"
      "every = 25\n"
      "batches = 4\n"
      "sample_every = 100\n"
      "sample_prompt = To be, or not to be:  that\n";
  jobspec_t s;
  CHECK_OK(jobspec_parse(text, "job.ini", tmpdir, &s));
  CHECK(!strcmp(s.name, "run-1.b"));
  CHECK_EQ_INT(123, s.steps);
  CHECK(s.seed == UINT64_MAX);
  CHECK_EQ_INT(3, s.max_restarts);
  CHECK_EQ_INT(4, s.model.n_layer);
  CHECK_EQ_INT(8, s.model.n_head);
  CHECK_EQ_INT(256, s.model.n_embd);
  CHECK_EQ_INT(512, s.model.vocab_size);
  CHECK_EQ_INT(128, s.model.seq_len);
  CHECK(!strcmp(s.init, init));
  CHECK(!strcmp(s.train, tok));
  CHECK_EQ_INT(0, s.synthetic);
  CHECK_EQ_INT(3, s.batch_size);
  CHECK_EQ_INT(7, s.grad_accum);
  CHECK_EQ_INT(0, s.shuffle);
  CHECK(!strcmp(s.val, tok));
  CHECK_EQ_INT(0, s.val_synthetic);
  CHECK(jobspec_has_val(&s));
  CHECK_EQ_INT(25, s.eval_every);
  CHECK_EQ_INT(4, s.eval_batches);
  CHECK_EQ_INT(100, s.sample_every);
  CHECK(!strcmp(s.sample_prompt, "To be, or not to be:  that"));
  CHECK_NEAR(1e-3, s.lr, 0, 0);
  CHECK_NEAR(0, s.min_lr, 0, 0);
  CHECK_EQ_INT(0, s.warmup_steps);
  CHECK_EQ_INT(SCHED_CONSTANT, s.schedule);
  CHECK_NEAR(0.999, s.beta2, 0, 0);
  CHECK_NEAR(1e-6, s.eps, 0, 0);
  CHECK_NEAR(0, s.grad_clip, 0, 0);
  CHECK_EQ_INT(64, s.world_size);
  CHECK_EQ_INT(DEVICE_CUDA, s.device);
  CHECK_EQ_INT(SHARD_GRAD_OP, s.sharding);
  CHECK_EQ_INT(4, s.prefetch);
  CHECK_EQ_INT(DTYPE_BF16, s.param_dtype);
  CHECK_EQ_INT(DTYPE_BF16, s.reduce_dtype);
  CHECK_EQ_INT(COMM_NCCL, s.comm);
  CHECK_NEAR(2.5, s.timeout_s, 0, 0);
  char ck[PATH_MAX + 8];
  snprintf(ck, sizeof ck, "%s/ckpt", tmpdir);
  CHECK(!strcmp(s.ckpt_dir, ck));
  CHECK_EQ_INT(50, s.ckpt_every);
  CHECK_EQ_INT(5, s.ckpt_keep);
  CHECK_EQ_INT(RESUME_AUTO, s.resume);
  CHECK(s.restart_wait_s == 7.5);
  CHECK(!strcmp(s.path, "job.ini"));
}

/* jobspec_load: relative paths are relative to the file, wherever the caller's cwd is; the name
 * defaults to the file's name. */
static void test_load_relative(void) {
  char sub[PATH_MAX], job[PATH_MAX + 16], tok[PATH_MAX + 16];
  snprintf(sub, sizeof sub, "%s/jobs", tmpdir);
  mkdir(sub, 0700);
  snprintf(job, sizeof job, "%s/my_run.ini", sub);
  snprintf(tok, sizeof tok, "%s/tok.bin", sub);
  write_file(tok, "x");
  write_file(job, "[data]\ntrain = tok.bin\n[checkpoint]\ndir = ../ck\n");
  char cwd[PATH_MAX];
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  CHECK(chdir("/") == 0);
  jobspec_t s;
  CHECK_OK(jobspec_load(job, &s));
  CHECK(chdir(cwd) == 0);
  CHECK(!strcmp(s.train, tok));
  char ck[PATH_MAX + 8];
  snprintf(ck, sizeof ck, "%s/ck", tmpdir);
  CHECK(!strcmp(s.ckpt_dir, ck));
  CHECK(!strcmp(s.name, "my_run"));
  CHECK(!strcmp(s.path, job));
  CHECK(s.train[0] == '/');
  /* a glob and a list: resolved against the job's folder, one per line, every match readable */
  char a[PATH_MAX + 16], b[PATH_MAX + 16], want[3 * PATH_MAX];
  snprintf(a, sizeof a, "%s/shard_1.bin", sub);
  snprintf(b, sizeof b, "%s/shard_2.bin", sub);
  write_file(a, "x");
  write_file(b, "x");
  write_file(job, "[data]\ntrain = shard_*.bin tok.bin\nval = tok.bin\n");
  CHECK_OK(jobspec_load(job, &s));
  snprintf(want, sizeof want, "%s/shard_*.bin\n%s", sub, tok);
  CHECK(!strcmp(s.train, want));
  write_file(job, "[data]\ntrain = none_*.bin\n");
  CHECK(jobspec_load(job, &s) != FSDP_OK && strstr(fsdp_last_error(), "none_*.bin matches no file"));
}

static void test_errors(void) {
  const char *T = TRAIN;
  char buf[512];
  expect_error("[job]\nsteps = 10\n[mdoel]\nn_layer = 2\n", 3, "unknown section [mdoel]");
  expect_error("[job]\nsteps = 10\n[empty]\n", 3, "unknown section [empty]");   /* even with no key */
  expect_error("[job]\n\nstepz = 10\n", 3, "unknown key 'stepz' in [job]; allowed: name, steps");
  expect_error("[job]\nsteps = 1O\n", 2, "not an integer; allowed: an integer in 1..");
  expect_error("[optim]\nlr = fast\n", 2, "not a number; allowed: a number > 0");
  expect_error("[optim]\nlr = 0\n", 2, "out of range; allowed: a number > 0");
  expect_error("[job]\nseed = -1\n", 2, "not an integer");
  expect_error("[fsdp]\nworld_size = 0\n", 2, "world_size = 0 is out of range; allowed: an integer in 1..4096");
  expect_error("[fsdp]\nprefetch = 5\n", 2, "allowed: an integer in 0..4");
  expect_error("[fsdp]\nsharding = half\n", 2, "allowed: full | grad_op | none | hybrid");
  expect_error("[model]\narch = mamba\n", 2, "arch = 'mamba' is not allowed; allowed: gpt2 | llama | qwen2 | qwen3 | phi3 | mistral");
  /* Llama's own rules, and its keys refused for GPT-2 */
  expect_error_train("[model]\narch = llama\nn_head = 4\nn_embd = 64\nn_kv_head = 3\nffn_dim = 176\n", 7,
                     "n_kv_head = 3 does not divide n_head = 4; allowed: a divisor of n_head");
  expect_error_train("[model]\narch = llama\nn_head = 4\nn_embd = 60\nffn_dim = 176\n", 6,
                     "head size n_embd / n_head = 15 is odd");
  expect_error_train("[model]\narch = llama\nn_head = 4\nn_embd = 64\n", 4, "arch = llama needs ffn_dim");
  expect_error_train("[model]\narch = llama\nffn_dim = 0\n", 5, "arch = llama needs ffn_dim");
  expect_error_train("[model]\narch = llama\nffn_dim = 175\n", 5, "[model] ffn_dim = 175 is odd; allowed: an even");
  expect_error_train("[model]\nn_kv_head = 4\n", 4, "[model] n_kv_head applies to arch = llama only");
  expect_error_train("[model]\nrope_theta = 500000\n", 4, "[model] rope_theta applies to arch = llama only");
  /* hybrid: G divides the world and is below it; shard_group belongs to hybrid only (blamed on it) */
  expect_error("[fsdp]\nworld_size = 6\nsharding = hybrid\nshard_group = 4\n", 4, "shard_group = 4 does not divide world_size = 6");
  expect_error("[fsdp]\nworld_size = 4\nsharding = hybrid\nshard_group = 4\n", 4, "is full sharding (one group)");
  expect_error("[fsdp]\nshard_group = 2\n", 2, "applies to sharding = hybrid only; allowed with sharding = full: shard_group = 0");
  expect_error("[model]\ninit = weights.pt\n", 2, "allowed: random | PATH.safetensors");
  expect_error("[model]\ninit = missing.safetensors\n", 2, "cannot read");
  expect_error("[job]\nname = has space\n", 2, "allowed:");
  expect_error_train("[model]\nn_head = 12\nn_embd = 100\n", 5, "n_embd = 100 is not divisible by n_head = 12");
  expect_error("[data]\ntrain = no/such/file.bin\n", 2, "cannot read");
  expect_error("[data]\ntrain = synthetic:uniform:3\n", 2, "synthetic:markov:SEED");
  expect_error("[job]\nsteps = 10\n", 2, "train is required");
  expect_error("[job]\nsteps = 10\n[data]\nbatch_size = 2\n", 3, "train is required");
  expect_error_train("[fsdp]\nparam_dtype = bf17\n", 4,
                     "fp32");   /* mixed precision runs on the CPU too; only the names are checked */
  expect_error_train("[fsdp]\noffload = optimizer\n", 4,
                     "offload = optimizer moves optimizer state off the GPU, so it needs device = cuda");
  expect_error_train("[fsdp]\nactivation_checkpointing = some\n", 4, "allowed: none | full");
  expect_error_train("[fsdp]\ncomm = nccl\n", 4, "comm = nccl needs device = cuda");
  expect_error_train("[optim]\nlr = 1e-4\nmin_lr = 1e-3\n", 5, "allowed: 0 <= min_lr <= lr");
  expect_error_train("[optim]\nlr = 1e-9\n", 4, "min_lr = 6e-05 (the default) is above lr = 1e-09");
  {   /* schedule = constant never reads min_lr: lr below the default floor is a job */
    jobspec_t c;
    CHECK_OK(jobspec_parse("[optim]\nlr = 1e-9\nschedule = constant\n[data]\ntrain = synthetic:markov:1\n", "j.ini",
                           "/", &c));
  }
  expect_error_train("[checkpoint]\nevery = 10\n", 4, "needs a dir");
  expect_error("[data]\nshuffle = yes\n", 2, "shuffle = 'yes' is not allowed; allowed: false | true");
  expect_error("[data]\nval = no/such/file.bin\n", 2, "[data] val = no/such/file.bin: cannot read");
  expect_error("[data]\nval = synthetic:markov:x\n", 2, "[data] val = 'synthetic:markov:x' is not allowed");
  expect_error("[data]\nval =\n", 2, "[data] val is empty; allowed: PATH");
  expect_error("[eval]\nbatches = 0\n", 2, "batches = 0 is out of range; allowed: an integer in 1..1000000");
  expect_error("[eval]\nevery = -1\n", 2, "allowed: an integer in 0..");
  expect_error("[eval]\nbatchez = 3\n", 2, "unknown key 'batchez' in [eval]; allowed: every, batches, at_start, sample_every, sample_prompt");
  expect_error_train("[eval]\nevery = 10\n", 4, "[eval] every = 10 needs validation tokens; set [data] val");
  expect_error_train("[eval]\nsample_every = 10\n", 4, "sample_every = 10 needs a prompt");
  expect_error_train("[data]\npack = false\n", 4, "[data] pack = false: the synthetic stream is one continuous stream");
  expect_error_train("[model]\nvocab_size = 100\n[eval]\nsample_prompt = ab{c\n", 6,
                     "byte 123 at offset 2 is outside the vocabulary (vocab_size = 100)");
  snprintf(buf, sizeof buf, "%s[eval]\nsample_prompt = caf\xc3\xa9\n", T);
  jobspec_t okv;
  CHECK_OK(jobspec_parse(buf, "ok.ini", tmpdir, &okv));   /* UTF-8 bytes are tokens of a 50257 vocabulary */
  snprintf(buf, sizeof buf, "%s[data]\nval = synthetic:markov:9\n[eval]\nevery = 5\n", T);
  CHECK_OK(jobspec_parse(buf, "ok.ini", tmpdir, &okv));
  CHECK_EQ_INT(1, okv.val_synthetic);
  CHECK_EQ_INT(9, okv.val_markov_seed);
  CHECK_EQ_INT(1, okv.synthetic);
  CHECK_EQ_INT(1, okv.markov_seed);
  /* restarts resume from a checkpoint: without one, the spec itself is refused (plan and submit alike) */
  snprintf(buf, sizeof buf, "[job]\nsteps = 5\nmax_restarts = 2\n[data]\ntrain = synthetic:markov:1\n");
  expect_error(buf, 3, "needs [checkpoint] every > 0");
  snprintf(buf, sizeof buf, "[job]\nmax_restarts = 1\n[data]\ntrain = synthetic:markov:1\n"
                            "[checkpoint]\ndir = ck\nevery = 5\nresume = never\n");
  expect_error(buf, 2, "resume = auto");
  expect_error("[job]\nsteps = 1\nsteps = 2\n", 3, "set twice (first at line 2)");
  expect_error("steps = 1\n", 1, "outside any section");
  expect_error("[job\nsteps = 1\n", 1, "syntax error");
  expect_error("[job]\nsteps\n", 2, "syntax error");
  /* the first error wins, even when a later line is also bad */
  expect_error("[job]\nsteps = x\n[bogus]\n", 2, "steps = 'x'");
  expect_error("[job]\nsteps = 2\n[bogus]\nsteps = x\n", 3, "unknown section [bogus]");

  /* lines longer than inih's buffer: an error, except in a comment */
  char longl[600];
  snprintf(longl, sizeof longl, "[data]\ntrain = %0300d.bin\n", 7);
  expect_error(longl, 2, "longer than");
  snprintf(longl, sizeof longl, "# %0300d\n[data]\ntrain = synthetic:markov:2\n", 7);
  jobspec_t ok;
  CHECK_OK(jobspec_parse(longl, "long.ini", tmpdir, &ok));
  CHECK_EQ_INT(2, ok.markov_seed);

  /* a missing job file */
  jobspec_t s;
  char missing[PATH_MAX + 16];
  snprintf(missing, sizeof missing, "%s/none.ini", tmpdir);
  CHECK_EQ_INT(FSDP_ERR_NOTFOUND, jobspec_load(missing, &s));
  CHECK(strstr(fsdp_last_error(), "none.ini") != NULL && !strchr(fsdp_last_error(), '\n'));
  /* a failed parse leaves the output untouched */
  jobspec_defaults(&s);
  s.steps = 4242;
  CHECK(jobspec_parse("[job]\nsteps = 0\n", "bad.ini", tmpdir, &s) != FSDP_OK);
  CHECK_EQ_INT(4242, s.steps);
}

/* tie_word_embeddings and rope_scaling: parsed, defaulted by arch, and every refusal in one line. */
static void test_tie_and_rope(void) {
  static const char *const LLAMA = "[model]\narch = llama\nffn_dim = 176\n";   /* lines 3..5 after TRAIN */
  char text[1024];
  jobspec_t s;
  snprintf(text, sizeof text, "%s%stie_word_embeddings = true\nrope_scaling = llama3\nrope_factor = 32\n"
           "rope_low_freq_factor = 1\nrope_high_freq_factor = 4\nrope_original_max_position_embeddings = 8192\n",
           TRAIN, LLAMA);
  CHECK_OK(jobspec_parse(text, "ok.ini", tmpdir, &s));
  CHECK(s.model.tie_embeddings == 1 && s.model.rope_scaling == ROPE_SCALING_LLAMA3 && s.model.rope_factor == 32 &&
        s.model.rope_low_freq_factor == 1 && s.model.rope_high_freq_factor == 4 && s.model.rope_original_max_pos == 8192);
  snprintf(text, sizeof text, "%s%s", TRAIN, LLAMA);   /* Llama unties by default (LlamaConfig's), unscaled */
  CHECK_OK(jobspec_parse(text, "ok.ini", tmpdir, &s));
  CHECK(s.model.tie_embeddings == 0 && s.model.rope_scaling == ROPE_SCALING_NONE && s.model.rope_factor == 0);
  snprintf(text, sizeof text, "%s[model]\ntie_word_embeddings = true\n", TRAIN);   /* GPT-2 always ties */
  CHECK_OK(jobspec_parse(text, "ok.ini", tmpdir, &s));
  CHECK_EQ_INT(1, s.model.tie_embeddings);
  CHECK(!strcmp(jobspec_rope_scaling_name(ROPE_SCALING_LLAMA3), "llama3"));
  snprintf(text, sizeof text, "%s%srope_scaling = linear\nrope_factor = 8\n", TRAIN, LLAMA);
  CHECK_OK(jobspec_parse(text, "ok.ini", tmpdir, &s));
  CHECK(s.model.rope_scaling == ROPE_SCALING_LINEAR && s.model.rope_factor == 8 && s.model.rope_low_freq_factor == 0);

  expect_error_train("[model]\ntie_word_embeddings = false\n", 4,
                     "[model] tie_word_embeddings = false: GPT-2's output head is always its wte");
  expect_error_train("[model]\ntie_word_embeddings = yes\n", 4, "allowed: false | true");
  expect_error_train("[model]\nrope_scaling = llama3\n", 4, "[model] rope_scaling applies to arch = llama only");
  static const struct { const char *keys; int line; const char *needle; } bad[] = {
    {"rope_scaling = yarn\n", 6, "[model] rope_scaling = 'yarn' is not allowed; allowed: none | llama3 | longrope | linear"},
    {"rope_scaling = linear\n", 6, "[model] rope_scaling = linear needs rope_factor (config.json's factor"},
    {"rope_scaling = linear\nrope_factor = 4\nrope_low_freq_factor = 1\n", 8,
     "[model] rope_low_freq_factor applies to rope_scaling = llama3 only"},
    {"rope_scaling = llama3\nrope_factor = 8\n", 6,
     "needs rope_factor, rope_low_freq_factor, rope_high_freq_factor and rope_original_max_position_embeddings "
     "(Llama-3.1: 8, 1, 4, 8192); missing: rope_low_freq_factor, rope_high_freq_factor, "
     "rope_original_max_position_embeddings"},
    {"rope_factor = 8\n", 6, "[model] rope_factor applies to rope_scaling = llama3 | linear only"},
    {"rope_scaling = none\nrope_original_max_position_embeddings = 8192\n", 7,
     "rope_original_max_position_embeddings applies to rope_scaling = llama3 | longrope only"},
    {"rope_scaling = llama3\nrope_factor = 8\nrope_low_freq_factor = 4\nrope_high_freq_factor = 4\n"
     "rope_original_max_position_embeddings = 8192\n", 9,
     "[model] rope_high_freq_factor = 4 is not above rope_low_freq_factor = 4; allowed: high > low"},
    {"rope_factor = 0.5\n", 6, "[model] rope_factor = 0.5 is out of range; allowed: a number >= 1 and <= 1000000"},
    {"rope_low_freq_factor = 0\n", 6, "rope_low_freq_factor = 0 is out of range; allowed: a number > 0"},
    {"rope_original_max_position_embeddings = 0\n", 6, "is out of range; allowed: an integer in 1..16777216"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char keys[256];
    snprintf(keys, sizeof keys, "%s%s", LLAMA, bad[i].keys);
    expect_error_train(keys, bad[i].line, bad[i].needle);
  }
}

static void test_examples(void) {
  char path[PATH_MAX];
  jobspec_t s;
  source_path(path, sizeof path, "examples/tiny.ini");
  CHECK_OK(jobspec_load(path, &s));
  CHECK_EQ_INT(2, s.world_size);
  CHECK_EQ_INT(DEVICE_CPU, s.device);
  CHECK_EQ_INT(1, s.synthetic);
  CHECK_EQ_INT(1, s.markov_seed);
  CHECK(s.model.n_layer >= 2 && s.model.n_layer <= 4);
  CHECK(s.model.n_embd >= 64 && s.model.n_embd <= 128);
  CHECK_EQ_INT(64, s.model.seq_len);
  CHECK(s.steps >= 100 && s.steps <= 300);
  source_path(path, sizeof path, "examples/gpt2-small.ini");
  CHECK_OK(jobspec_load(path, &s));
  CHECK_EQ_INT(8, s.world_size);
  CHECK_EQ_INT(DEVICE_CUDA, s.device);
  CHECK_EQ_INT(768, s.model.n_embd);
  /* a build without the CUDA backend refuses it in plan and submit; one with it takes it (CI runs
   * both kinds of build: the main one with CUDA, the sanitizer one without) */
  if (jobspec_build_has_cuda()) {
    CHECK_OK(jobspec_check_build(&s));
  } else {
    CHECK(jobspec_check_build(&s) == FSDP_ERR_UNSUPPORTED);
    CHECK(strstr(fsdp_last_error(), "device = cuda, but this build of fsdpd has no CUDA backend") != NULL);
  }
  s.device = DEVICE_CPU;
  CHECK_OK(jobspec_check_build(&s));
  CHECK(s.ckpt_dir[0] == '/' && strstr(s.ckpt_dir, "/examples/checkpoints/gpt2-small"));
  /* the Llama examples: a CPU one that trains in seconds, and Llama-3.2-1B's shape */
  source_path(path, sizeof path, "examples/llama-tiny.ini");
  CHECK_OK(jobspec_load(path, &s));
  CHECK_EQ_INT(ARCH_LLAMA, s.model.arch);
  CHECK_EQ_INT(DEVICE_CPU, s.device);
  CHECK(s.model.n_kv_head < s.model.n_head && s.model.n_head % s.model.n_kv_head == 0);
  source_path(path, sizeof path, "examples/llama-1b.ini");
  CHECK_OK(jobspec_load(path, &s));
  const model_config *m = &s.model;
  CHECK(m->arch == ARCH_LLAMA && m->n_layer == 16 && m->n_head == 32 && m->n_embd == 2048 && m->vocab_size == 128256 &&
        m->seq_len == 2048 && m->n_kv_head == 8 && m->ffn_dim == 8192 && m->norm_eps == 1e-5 &&
        m->rope_theta == 500000 && m->tie_embeddings && m->rope_scaling == ROPE_SCALING_LLAMA3 && m->rope_factor == 32 &&
        m->rope_low_freq_factor == 1 && m->rope_high_freq_factor == 4 && m->rope_original_max_pos == 8192);
  CHECK_EQ_INT(DEVICE_CUDA, s.device);
  /* hybrid without shard_group: the daemon's placement decides; plans need one given */
  source_path(path, sizeof path, "examples/gpt2-xl-hybrid.ini");
  CHECK_OK(jobspec_load(path, &s));
  CHECK_EQ_INT(SHARD_HYBRID, s.sharding);
  CHECK_EQ_INT(0, s.shard_group);
  CHECK_EQ_INT(16, s.world_size);
  CHECK_EQ_INT(1600, s.model.n_embd);
}

/* [model] from = DIR: config.json sets the model (transformers 5 form here), a key in the file must
 * agree, init becomes the folder's weights (the index when there is one), seq_len stays the job's;
 * GPT-2's seq_len below n_positions. */
static void test_from(void) {
  char dir[PATH_MAX], path[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/smol", tmpdir);
  mkdir(dir, 0700);
  snprintf(path, sizeof path, "%s/config.json", dir);
  write_file(path, "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
                   "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300, "
                   "\"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": true, "
                   "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 100000.0}}");
  expect_error_train("[model]\nfrom = smol\n", 4, "[model] from: ");   /* no weights yet */
  CHECK(strstr(fsdp_last_error(), "holds neither model.safetensors.index.json nor model.safetensors") != NULL);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  write_file(path, "x");
  jobspec_t s;
  CHECK_OK(jobspec_parse("[model]\nfrom = smol\nn_kv_head = 2\n[data]\ntrain = synthetic:markov:1\n", "j.ini", tmpdir, &s));
  CHECK(s.model.arch == ARCH_LLAMA && s.model.n_layer == 2 && s.model.n_head == 4 && s.model.n_kv_head == 2);
  CHECK(s.model.n_embd == 64 && s.model.ffn_dim == 128 && s.model.vocab_size == 300 && s.model.norm_eps == 1e-6);
  CHECK(s.model.rope_theta == 100000 && s.model.tie_embeddings == 1 && s.model.n_positions == 8192);
  CHECK_EQ_INT(1024, s.model.seq_len);   /* the job's length: the model's positions, at most 1024 */
  CHECK(!strcmp(s.init, path) && !strcmp(s.from, dir));
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  write_file(path, "{}");
  CHECK_OK(jobspec_parse("[model]\nfrom = smol\nseq_len = 256\n[data]\ntrain = synthetic:markov:1\n", "j.ini", tmpdir, &s));
  CHECK(!strcmp(s.init, path) && s.model.seq_len == 256);
  expect_error_train("[model]\nfrom = smol\nn_embd = 32\n", 5, "[model] n_embd = 32, but ");
  CHECK(strstr(fsdp_last_error(), "config.json has hidden_size = 64") != NULL);
  expect_error_train("[model]\nfrom = smol\nrope_theta = 10000\n", 5, "config.json has rope_theta = 100000");
  expect_error_train("[model]\nfrom = smol\ntie_word_embeddings = false\n", 5, "has tie_word_embeddings = true");
  expect_error_train("[model]\nfrom = smol\narch = gpt2\n", 5, "[model] arch = gpt2, but ");
  expect_error_train("[model]\nfrom = smol\ninit = init.safetensors\n", 4, "from and init both name the weights");
  expect_error_train("[model]\nfrom = smol\nseq_len = 9000\n", 5, "seq_len = 9000 is beyond the model's 8192 positions");
  expect_error_train("[model]\nfrom = nowhere\n", 4, "is not a directory");
  /* an odd width is config.json's key, named in the folder's terms (not a job-file line of ffn_dim) */
  snprintf(path, sizeof path, "%s/config.json", dir);
  write_file(path, "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 127, \"num_hidden_layers\": 2, "
                   "\"num_attention_heads\": 4, \"vocab_size\": 300}");
  expect_error_train("[model]\nfrom = smol\n", 4, "smol/config.json has intermediate_size = 127, an odd SwiGLU width");
  /* GPT-2: wpe keeps n_positions rows; the job trains at seq_len below it */
  CHECK_OK(jobspec_parse("[model]\nseq_len = 32\nn_positions = 64\n[data]\ntrain = synthetic:markov:1\n", "j.ini", tmpdir, &s));
  CHECK(s.model.seq_len == 32 && s.model.n_positions == 64);
  expect_error_train("[model]\nseq_len = 65\nn_positions = 64\n", 4, "seq_len = 65 is beyond the model's 64 positions");
}

/* The learning-rate warning: warmup_steps ≥ steps warns with the final rate; fewer does not. */
static void test_lr_warning(void) {
  jobspec_t s;
  char buf[320];
  jobspec_defaults(&s);
  s.steps = 40, s.warmup_steps = 2000, s.lr = 6e-4;
  CHECK_EQ_INT(1, jobspec_lr_warning(&s, buf, sizeof buf));
  CHECK(strstr(buf, "warmup_steps = 2000 >= steps = 40") && strstr(buf, "ends at 1.2e-05") && !strchr(buf, '\n'));
  s.warmup_steps = 40;   /* the last step's rate is lr·40/41: still below lr */
  CHECK_EQ_INT(1, jobspec_lr_warning(&s, buf, sizeof buf));
  s.warmup_steps = 39;   /* step 40 is the first after warmup: lr */
  CHECK_EQ_INT(0, jobspec_lr_warning(&s, buf, sizeof buf));
  s.warmup_steps = 0;
  CHECK_EQ_INT(0, jobspec_lr_warning(&s, buf, sizeof buf));
}

/* Paths are checked as named, before realpath resolves their links: another user's link to a file (or
 * to a model folder) is refused in one line naming it, the reader's own link is followed. The other
 * user's links need lchown: root only. */
static void test_foreign_links(void) {
  char data[PATH_MAX], link[PATH_MAX], text[3 * PATH_MAX];
  snprintf(data, sizeof data, "%s/data/own.bin", tmpdir);
  write_file(data, "x");
  snprintf(link, sizeof link, "%s/mine.bin", tmpdir);
  CHECK(symlink(data, link) == 0);
  jobspec_t s;
  CHECK_OK(jobspec_parse("[data]\ntrain = mine.bin\n", "ok.ini", tmpdir, &s));
  if (geteuid() != 0) return;
  snprintf(link, sizeof link, "%s/theirs.bin", tmpdir);
  CHECK(symlink(data, link) == 0 && lchown(link, 65534, 65534) == 0);
  expect_error("[data]\ntrain = theirs.bin\n", 2, "theirs.bin is a symbolic link owned by");
  expect_error("[data]\ntrain = synthetic:markov:1\n[model]\ninit = theirs.safetensors\n", 4, "cannot read");
  snprintf(link, sizeof link, "%s/theirs.safetensors", tmpdir);
  CHECK(symlink(data, link) == 0 && lchown(link, 65534, 65534) == 0);
  expect_error("[data]\ntrain = synthetic:markov:1\n[model]\ninit = theirs.safetensors\n", 4, "symbolic link owned by");
  snprintf(link, sizeof link, "%s/their-smol", tmpdir);
  snprintf(text, sizeof text, "%s/smol", tmpdir);
  CHECK(symlink(text, link) == 0 && lchown(link, 65534, 65534) == 0);
  expect_error_train("[model]\nfrom = their-smol\n", 4, "their-smol is a symbolic link owned by");
}

/* An architecture's own settings (models/arch.h's ext_keys), through Gemma 3's: parsed in [model] under
 * its architecture with its defaults, refused under another naming the owner, out of range or twice
 * refused, carried by the resolved form (every one explicit, no other architecture's) and the
 * checkpoint manifest. Skipped while models/models.def does not register gemma3. */
static const char *const GEMMA3 = "[model]\narch = gemma3\nn_layer = 4\nn_head = 2\nn_kv_head = 1\nn_embd = 32\n"
                                  "head_dim = 16\nffn_dim = 64\nvocab_size = 256\nseq_len = 16\n";

static void test_ext_keys(void) {
  const arch_desc *g = arch_by_name("gemma3");
  if (!g) {
    printf("test_ext_keys: gemma3 is not registered in models/models.def; skipped\n");
    return;
  }
  char text[1024];
  jobspec_t s, back;
  snprintf(text, sizeof text, "%squery_pre_attn_scalar = 24\n%s", GEMMA3, TRAIN);
  CHECK_OK(jobspec_parse(text, "g.ini", tmpdir, &s));
  int q = arch_ext_index(g, "query_pre_attn_scalar"), th = arch_ext_index(g, "rope_local_base_freq"),
      pat = arch_ext_index(g, "sliding_window_pattern");
  CHECK(q >= 0 && th >= 0 && pat >= 0);
  if (q < 0 || th < 0 || pat < 0) return;
  CHECK(s.model.arch == g->id && s.model.ext[q] == 24 && s.model.ext[th] == 10000 && s.model.ext[pat] == 6);
  /* every default parses in its own range */
  for (int a = 0; a < arch_count(); a++)
    for (int i = 0; i < arch_ext_count(arch_get((model_arch)a)); i++) {
      double v;
      CHECK(arch_ext_parse(&arch_get((model_arch)a)->ext_keys[i], arch_get((model_arch)a)->ext_keys[i].def, &v));
    }
  /* another architecture's setting, a value out of range, a key set twice */
  expect_error_train("[model]\nn_layer = 2\nquery_pre_attn_scalar = 24\n", 5,
                     "[model] query_pre_attn_scalar applies to arch = gemma3 only");
  expect_error_train("[model]\narch = llama\nffn_dim = 64\nsliding_window_pattern = 2\n", 6,
                     "remove the key or set arch = gemma3");
  snprintf(text, sizeof text, "%s%ssliding_window_pattern = 0\n", TRAIN, GEMMA3);
  expect_error(text, 13, "[model] sliding_window_pattern = '0' is not allowed; allowed: an integer in 1..");
  snprintf(text, sizeof text, "%s%squery_pre_attn_scalar = 0\n", TRAIN, GEMMA3);
  expect_error(text, 13, "[model] query_pre_attn_scalar = '0' is not allowed; allowed: a number > 0");
  snprintf(text, sizeof text, "%s%srope_local_base_freq = 10000\nrope_local_base_freq = 10000\n", TRAIN, GEMMA3);
  expect_error(text, 14, "[model] rope_local_base_freq is set twice (first at line 13)");

  /* the resolved form: the settings close [model]; read back equal; one missing or foreign refused */
  snprintf(text, sizeof text, "%squery_pre_attn_scalar = 24\nrope_local_base_freq = 20000.5\n"
           "sliding_window_pattern = 2\n%s", GEMMA3, TRAIN);
  CHECK_OK(jobspec_parse(text, "g.ini", tmpdir, &s));
  char *t = NULL;
  CHECK_OK(jobspec_canonical_write(&s, &t));
  if (!t) return;
  CHECK(strstr(t, "\nquery_pre_attn_scalar = 24\nrope_local_base_freq = 20000.5\nsliding_window_pattern = 2\n[data]\n"));
  CHECK_OK(jobspec_canonical_read(t, "g.ini", &back));
  CHECK(back.model.ext[q] == 24 && back.model.ext[th] == 20000.5 && back.model.ext[pat] == 2);
  char *cut = strstr(t, "sliding_window_pattern = 2\n");
  if (cut) {
    memmove(cut, cut + strlen("sliding_window_pattern = 2\n"), strlen(cut + strlen("sliding_window_pattern = 2\n")) + 1);
    CHECK(jobspec_canonical_read(t, "g.ini", &back) == FSDP_ERR_FORMAT);
    CHECK(strstr(fsdp_last_error(), "[model] sliding_window_pattern is missing") != NULL);
  }
  free(t);
  jobspec_t gpt;
  CHECK_OK(jobspec_parse(TRAIN, "p.ini", tmpdir, &gpt));
  CHECK_OK(jobspec_canonical_write(&gpt, &t));
  if (t) {
    CHECK(!strstr(t, "query_pre_attn_scalar"));
    char *bad = malloc(strlen(t) + 64), *data = strstr(t, "[data]\n");
    if (bad && data) {
      snprintf(bad, strlen(t) + 64, "%.*squery_pre_attn_scalar = 24\n%s", (int)(data - t), t, data);
      CHECK(jobspec_canonical_read(bad, "p.ini", &back) == FSDP_ERR_FORMAT);
      CHECK(strstr(fsdp_last_error(), "query_pre_attn_scalar is not a setting of arch = gpt2") != NULL);
    }
    free(bad);
    free(t);
  }

  /* the manifest: written with the model, read back equal; a checkpoint of other settings is another model */
  plan_t *p = NULL;
  s.batch_size = 1;
  s.grad_accum = 1;
  CHECK_OK(plan_build(&s, 1, &p));
  if (!p) return;
  char dir[PATH_MAX], sdir[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
  mkdir(dir, 0700);
  ckpt_step_dir(dir, 3, sdir, sizeof sdir);
  mkdir(sdir, 0700);
  CHECK_OK(ckpt_write_manifest(dir, p, 3, 48));
  ckpt_info ci;
  CHECK_OK(ckpt_read_manifest(dir, 3, &ci));
  CHECK(ci.model.arch == g->id && ci.model.ext[q] == 24 && ci.model.ext[th] == 20000.5 && ci.model.ext[pat] == 2);
  CHECK(arch_same_model(&ci.model, &p->model));
  ci.model.ext[pat] = 3;
  CHECK(!arch_same_model(&ci.model, &p->model));
  char desc[256];
  arch_describe(&ci.model, desc, sizeof desc);
  CHECK(strstr(desc, "query_pre_attn_scalar 24, rope_local_base_freq 20000.5, sliding_window_pattern 3") != NULL);
  plan_destroy(&p);
}

int main(void) {
  test_lr_warning();
  snprintf(tmpdir, sizeof tmpdir, "/tmp/test_jobspec.XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  char real[PATH_MAX];
  if (realpath(tmpdir, real) && strlen(real) < sizeof tmpdir) memcpy(tmpdir, real, strlen(real) + 1);
  char data[PATH_MAX + 8];
  snprintf(data, sizeof data, "%s/data", tmpdir);
  mkdir(data, 0700);
  test_defaults();
  test_defaults_roundtrip();
  test_every_key();
  test_load_relative();
  test_errors();
  test_tie_and_rope();
  test_examples();
  test_from();
  test_foreign_links();
  test_ext_keys();
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_done();
}
