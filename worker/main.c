/* fsdp-worker — one rank of one job.
 *
 *   fsdp-worker --connect ENDPOINT --job ID --rank R --token TOKEN [--log-level L]
 *       the daemon's way: everything else (spec, plan, rendezvous, steps) comes from the coordinator
 *   fsdp-worker --standalone --rank R --world N --rendezvous DIR [--steps K] [--save FILE] JOB.ini
 *       without a daemon, like torchrun: N of these with the same fresh DIR form a job; each prints
 *       one JSON line per step on stdout. device = cuda: rank R uses visible GPU R mod (visible GPUs)
 *       (CUDA_VISIBLE_DEVICES as set by the launcher); comm = auto picks NCCL when world ≤ visible
 *       GPUs (rank 0 writes the unique id into DIR), else gloo staged through pinned memory.
 */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "ckpt.h"
#include "comm.h"
#include "comm_boot.h"
#include "comm_hybrid.h"
#include "device.h"
#include "jobspec.h"
#include "log.h"
#include "mem.h"
#include "ops_cpu.h"
#include "plan.h"
#include "planmsg.h"
#include "runtime.h"
#include "sample.h"
#include "stepstats.h"
#include "trace.h"
#include "wlink.h"

/* Two settings that only take effect when the process starts, so the worker re-executes itself
 * once when either is missing (an operator's own setting always wins):
 * - OPENBLAS_CORETYPE: Debian's OpenBLAS 0.3.21 does not recognise recent AVX-512 Xeons and falls
 *   back to SSE3 kernels, 5x slower (ops_cpu.c);
 * - OMP_WAIT_POLICY=passive: libgomp's threads otherwise spin between parallel loops and starve
 *   OpenBLAS's own threads (a 2-thread step measured 20x slower with spinning). */
static void tune_process_env(char **argv) {
  int changed = 0;
  const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : ops_cpu_blas_better_core();
  if (core) changed += setenv("OPENBLAS_CORETYPE", core, 1) == 0;
  if (!getenv("OMP_WAIT_POLICY")) changed += setenv("OMP_WAIT_POLICY", "passive", 1) == 0;
  if (!changed) return;
  execv("/proc/self/exe", argv);   /* returns only on failure: then run as we are */
  log_warn("could not re-execute with tuned OpenBLAS/OpenMP settings: %s", strerror(errno));
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: fsdp-worker --connect ENDPOINT --job ID --rank R --token TOKEN [--log-level L]\n"
          "       fsdp-worker --standalone --rank R --world N --rendezvous DIR [--steps K] [--save FILE.safetensors]\n"
          "                   [--log-level L] JOB.ini\n"
          "       fsdp-worker --sample MODEL --prompt TEXT [--tokens N] [--temperature X] [--top-k K] [--seed S]\n"
          "                   [--tokenizer FILE]     (what fsdpctl sample runs; docs/data.md)\n");
}

static int parse_int(const char *flag, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < lo || v > hi) {
    fprintf(stderr, "fsdp-worker: %s '%s' must be an integer in %ld..%ld\n", flag, s, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

/* One JSON line per step (standalone mode): the fields of metrics.jsonl for this rank. */
static void print_report(int rank, const rt_report *r) {
  json_t *o = json_object(), *peak = json_object(), *phase = json_object(), *sent = json_object();
  json_object_set_new(o, "step", json_integer(r->step));
  json_object_set_new(o, "rank", json_integer(rank));
  json_object_set_new(o, "loss", json_real(r->loss));
  json_object_set_new(o, "lr", json_real(r->lr));
  json_object_set_new(o, "grad_norm", json_real(r->grad_norm));
  json_object_set_new(o, "tokens", json_integer((json_int_t)r->tokens));
  json_object_set_new(o, "step_ms", json_real(r->step_ms));
  json_object_set_new(o, "tokens_per_s", json_real(r->step_ms > 0 ? r->tokens / (r->step_ms / 1000.0) : 0));
  for (int c = 0; c < MEM_NCAT; c++) json_object_set_new(peak, plan_mem_category_name((mem_category)c), json_integer((json_int_t)r->peak[c]));
  json_object_set_new(peak, "total", json_integer((json_int_t)r->peak_total));
  for (int i = 0; i < RT_NPHASE; i++) json_object_set_new(phase, stepstats_phase_names[i], json_real(r->phase_us[i] / 1000.0));
  for (int i = 0; i < COLL_NKIND; i++) json_object_set_new(sent, plan_coll_kind_name((coll_kind)i), json_integer((json_int_t)r->sent[i]));
  if (r->has_val) {
    json_object_set_new(o, "val_loss", json_real(r->val_loss));
    json_object_set_new(o, "eval_ms", json_real(r->eval_ms));
  }
  if (r->sample[0]) json_object_set_new(o, "sample", json_string(r->sample));
  json_object_set_new(o, "peak_bytes", peak);
  json_object_set_new(o, "phase_ms", phase);
  json_object_set_new(o, "sent_bytes", sent);
  if (r->sent_inter[COLL_ALLGATHER] || r->sent_inter[COLL_REDUCESCATTER] || r->sent_inter[COLL_ALLREDUCE]) {
    json_t *inter = json_object();   /* hybrid: the part that crossed shard groups, as in metrics.jsonl */
    for (int i = 0; i < COLL_NKIND; i++)
      json_object_set_new(inter, plan_coll_kind_name((coll_kind)i), json_integer((json_int_t)r->sent_inter[i]));
    json_object_set_new(o, "sent_inter_bytes", inter);
  }
  char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
  printf("%s\n", s);
  fflush(stdout);
  free(s);
  json_decref(o);
}

/* [checkpoint] at the start of a run (docs/checkpoints.md): resume = auto restores the newest
 * complete checkpoint in dir (*START = its step; unchanged when there is none). resume = never with
 * checkpoints on refuses a dir that already holds checkpoints: pruning would delete the new run's
 * checkpoints before the old ones, and a later resume = auto would mix the two runs. */
static fsdp_status ckpt_begin(runtime_t *rt, const jobspec_t *spec, int *start) {
  if (!spec->ckpt_dir[0]) return FSDP_OK;
  if (spec->resume == RESUME_AUTO) {
    int s = 0;
    TRY(runtime_restore(rt, spec->ckpt_dir, &s));
    if (s > 0) *start = s;
    return FSDP_OK;
  }
  int s = 0;
  if (spec->ckpt_every > 0 && ckpt_latest(spec->ckpt_dir, &s) == FSDP_OK)
    return fsdp_set_error(FSDP_ERR_STATE, "[checkpoint] dir %s already holds checkpoints (the newest: step %d) and "
                          "resume = never: use an empty dir, delete them, or resume = auto", spec->ckpt_dir, s);
  return FSDP_OK;
}

/* [eval] every = K: the validation loss at steps K, 2K, ... into the step's report. */
static fsdp_status eval_if_due(runtime_t *rt, const jobspec_t *spec, rt_report *r) {
  if (spec->eval_every <= 0 || r->step % spec->eval_every != 0) return FSDP_OK;
  TRY(runtime_eval(rt, spec->eval_batches, &r->val_loss, &r->eval_ms));
  r->has_val = 1;
  return FSDP_OK;
}

/* [eval] sample_every = K: at steps K, 2K, ... rank 0 continues sample_prompt with SAMPLE_TOKENS
 * tokens (temperature 1, seeded by the job's seed and the step) from the gathered model, for the
 * job log. Collective: every rank takes part in the gathers. */
#define SAMPLE_TOKENS 64
static fsdp_status sample_if_due(runtime_t *rt, const jobspec_t *spec, int rank, rt_report *r) {
  r->sample[0] = '\0';
  if (spec->sample_every <= 0 || r->step % spec->sample_every != 0) return FSDP_OK;
  plan_t *w = NULL;
  float *whole = NULL;
  int *ids = NULL, plen = 0;
  TRY(runtime_whole_plan(rt, 1, &w));
  fsdp_status rc = sample_prompt_ids(spec->sample_prompt, w->model.vocab_size, NULL, &plen);
  if (rc == FSDP_OK && rank == 0) {
    whole = calloc((size_t)w->shard_total, sizeof(float));
    ids = calloc((size_t)plen + SAMPLE_TOKENS, sizeof(int));
    if (!whole || !ids) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the model for a sample");
  }
  fsdp_status grc = runtime_gather_whole(rt, w, whole);   /* every rank, whatever happened above */
  if (rc == FSDP_OK) rc = grc;
  if (rc == FSDP_OK && rank == 0) {
    sample_prompt_ids(spec->sample_prompt, w->model.vocab_size, ids, &plen);
    rc = sample_generate(w, whole, ids, plen, plen + SAMPLE_TOKENS, 1.0, 0, spec->seed ^ (uint64_t)r->step);
    size_t k = 0;   /* printable bytes as they are, the rest as \xNN (byte-level models) or token ids */
    for (int i = 0; rc == FSDP_OK && i < plen + SAMPLE_TOKENS && k + 12 < sizeof r->sample; i++) {
      int t = ids[i];
      if (w->model.vocab_size <= 256 && t >= 32 && t < 127) r->sample[k++] = (char)t;
      else if (w->model.vocab_size <= 256) k += (size_t)snprintf(r->sample + k, sizeof r->sample - k, "\\x%02x", t);
      else k += (size_t)snprintf(r->sample + k, sizeof r->sample - k, "%s%d", i ? " " : "", t);
    }
    r->sample[k] = '\0';
  }
  free(whole);
  free(ids);
  plan_destroy(&w);
  return rc;
}

/* The CPU device in the mode FSDP_CPU_DEVICE names (device.h; tests run the async ones). */
static fsdp_status open_cpu_device(device_t **dev) {
  dev_cpu_mode mode;
  TRY(dev_cpu_mode_from_env(&mode));
  TRY(device_new_cpu(mode, dev));
  if (mode != DEV_CPU_SYNC) log_info("CPU device: %s", (*dev)->op->name);
  return FSDP_OK;
}

/* Where a job's ranks meet: a directory (--standalone) or the coordinator's KV under PREFIX. */
typedef struct rendezvous {
  const char *dir;
  const comm_kv *kv;
  const char *prefix;
} rendezvous;

#ifdef FSDP_HAVE_CUDA
/* Prefix a failure's message with "device = cuda: " (one line for the log and the coordinator). */
static fsdp_status cuda_failure(fsdp_status rc) {
  char why[768];
  const char *m = fsdp_last_error(), *colon = strstr(m, ": ");
  snprintf(why, sizeof why, "%s", colon && colon - m < 40 ? colon + 2 : m);   /* drop "file.c:123: " */
  return fsdp_set_error(rc, "device = cuda: %s", why);
}

static fsdp_status nccl_id(void *ctx, uint8_t id[COMM_BOOT_ID_BYTES]) {
  (void)ctx;
  return comm_nccl_get_unique_id(id);
}

/* device = cuda: the CUDA device on GPU (an index among the visible ones), then NCCL (its id from
 * rank 0 through the store) or gloo staged through pinned memory. */
static fsdp_status open_cuda(const jobspec_t *spec, const plan_t *plan, int rank, int world, int gpu, int use_nccl,
                             const rendezvous *rv, comm_t **comm, device_t **dev) {
  fsdp_status rc = device_new_cuda(gpu, dev);
  if (rc != FSDP_OK) return cuda_failure(rc);
  if (use_nccl) {
    comm_kv dir_kv = rv->dir ? comm_dir_kv(rv->dir) : (comm_kv){0};
    const comm_kv *kv = rv->dir ? &dir_kv : rv->kv;
    char key[256];
    snprintf(key, sizeof key, "%snccl-id", rv->prefix ? rv->prefix : "");
    uint8_t id[COMM_BOOT_ID_BYTES];
    TRY(comm_boot_exchange_id(kv, key, rank, spec->timeout_s, nccl_id, NULL, id));
    TRY(comm_new_nccl(rank, world, id, gpu, spec->timeout_s, comm));
  } else {
    (*dev)->host_marks = 1;   /* the staging comm thread waits for the compute stream's CPU marks */
    /* with hybrid sharding the world's comm carries only the step's scalars (the group and replica
     * comms the units: open_hybrid), so it takes the least buffer */
    size_t stage = plan->sharding == SHARD_HYBRID ? 0 : (size_t)plan_stage_bytes(plan);
    TRY(comm_new_gloo_staged(rank, world, rv->dir, rv->kv, rv->prefix ? rv->prefix : "fsdp", spec->timeout_s, gpu,
                             stage, comm));
  }
  log_info("rank %d of %d: GPU %d, comm %s", rank, world, gpu, comm_backend_name(*comm));
  return FSDP_OK;
}
#endif

/* The job's device and communicator. device = cpu: gloo and the CPU device, as always. device =
 * cuda: GPU = DEVICE_INDEX when the coordinator assigned one (connected), else rank mod the visible
 * GPUs (standalone: CUDA_VISIBLE_DEVICES as the launcher set it); comm = COMM ("nccl", "gloo") or,
 * when NULL (standalone, comm = auto), nccl when every rank has a GPU of its own (world ≤ visible
 * GPUs), else gloo staged. */
static fsdp_status open_device_and_comm(const jobspec_t *spec, const plan_t *plan, int rank, int world,
                                        int device_index, const char *comm_name, const rendezvous *rv, comm_t **comm,
                                        device_t **dev, int *gpu_out) {
  *gpu_out = -1;
  if (spec->device == DEVICE_CPU) {
    TRY(comm_new_gloo(rank, world, rv->dir, rv->kv, rv->prefix ? rv->prefix : "fsdp", spec->timeout_s, comm));
    return open_cpu_device(dev);
  }
#ifdef FSDP_HAVE_CUDA
  int ngpu = 0;
  fsdp_status rc = device_cuda_count(&ngpu);
  if (rc != FSDP_OK) return cuda_failure(rc);
  int gpu = device_index >= 0 ? device_index : rank % ngpu;
  *gpu_out = gpu;
  int use_nccl = comm_name ? strcmp(comm_name, "nccl") == 0 : spec->comm == COMM_NCCL || (spec->comm == COMM_AUTO && world <= ngpu);
  if (comm_name && !use_nccl && strcmp(comm_name, "gloo") != 0)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "device = cuda: comm backend '%s' is not available (nccl and gloo are)",
                          comm_name);
  return open_cuda(spec, plan, rank, world, gpu, use_nccl, rv, comm, dev);
#else
  (void)plan, (void)device_index, (void)comm_name, (void)gpu_out;
  return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "device = cuda: this fsdp-worker was built without CUDA (configure with "
                        "-DFSDP_CUDA=ON where nvcc, cuBLAS and NCCL are installed); use device = cpu");
#endif
}

/* sharding = hybrid: the group and replica comms beside the world's (comm_hybrid.h), handed to the
 * runtime; other modes need none. */
static fsdp_status open_hybrid(const jobspec_t *spec, const plan_t *plan, int rank, const rendezvous *rv, int gpu,
                               comm_t *comm, runtime_t *rt, comm_t **group, comm_t **replica) {
  if (plan->sharding != SHARD_HYBRID) return FSDP_OK;
  comm_hybrid_args a = {.rank = rank, .world = plan->world, .group = plan->shard_world, .store_dir = rv->dir,
                        .kv = rv->kv, .prefix = rv->prefix, .timeout_s = spec->timeout_s, .device = gpu,
                        .stage_bytes = (size_t)plan_stage_bytes(plan)};
  TRY(comm_hybrid_open(comm, &a, group, replica));
  return runtime_set_groups(rt, *group, *replica);
}

static int run_standalone(int rank, int world, const char *rdv, int steps_override, const char *save, const char *job) {
  jobspec_t spec;
  plan_t *plan = NULL;
  comm_t *comm = NULL, *gcomm = NULL, *rcomm = NULL;
  device_t *dev = NULL;
  runtime_t *rt = NULL;
  int gpu = -1;
  trace_t *tr = NULL;
  fsdp_status rc;
  TRY_GOTO(jobspec_load(job, &spec), rc, out);
  if (world != spec.world_size)
    log_info("--world %d overrides the job's world_size %d", world, spec.world_size);
  spec.world_size = world;
  if (steps_override > 0) spec.steps = steps_override;
  TRY_GOTO(plan_build(&spec, world, &plan), rc, out);
  rendezvous rv = {.dir = rdv, .prefix = NULL};
  TRY_GOTO(open_device_and_comm(&spec, plan, rank, world, -1, NULL, &rv, &comm, &dev, &gpu), rc, out);
  TRY_GOTO(runtime_new(&spec, plan, rank, comm, dev, &rt), rc, out);
  TRY_GOTO(open_hybrid(&spec, plan, rank, &rv, gpu, comm, rt, &gcomm, &rcomm), rc, out);
  TRY_GOTO(trace_from_env(&tr), rc, out);   /* recorded as when connected, so that its cost is measurable */
  runtime_set_trace(rt, tr);
  int start = 0;
  TRY_GOTO(ckpt_begin(rt, &spec, &start), rc, out);
  if (start >= spec.steps && start > 0 && rank == 0)
    log_info("the checkpoint of step %d is at or past steps = %d: nothing to train", start, spec.steps);
  for (int s = start + 1; s <= spec.steps; s++) {
    rt_report r;
    TRY_GOTO(runtime_step(rt, s, &r), rc, out);
    TRY_GOTO(eval_if_due(rt, &spec, &r), rc, out);
    TRY_GOTO(sample_if_due(rt, &spec, rank, &r), rc, out);
    if (ckpt_due(&spec, s)) TRY_GOTO(runtime_checkpoint(rt, spec.ckpt_dir, s), rc, out);
    print_report(rank, &r);
  }
  if (save) TRY_GOTO(runtime_save(rt, save), rc, out);
out:
  if (rc != FSDP_OK) log_error("%s", fsdp_last_error());
  runtime_destroy(&rt);
  device_destroy(&dev);
  comm_destroy(&rcomm);
  comm_destroy(&gcomm);
  comm_destroy(&comm);
  trace_destroy(&tr);
  plan_destroy(&plan);
  return rc == FSDP_OK ? 0 : 1;
}

static int run_connected(const char *endpoint, uint64_t job_id, int rank, const char *token) {
  wlink *l = NULL;
  jobspec_t spec;
  plan_t *plan = NULL;
  comm_t *comm = NULL, *gcomm = NULL, *rcomm = NULL;
  device_t *dev = NULL;
  runtime_t *rt = NULL;
  int gpu = -1;
  trace_t *tr = NULL;
  fsdp_status rc;
  /* Die with the agent that spawned us: an orphaned rank would hold its peers in a collective. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  TRY_GOTO(wlink_open(endpoint, job_id, rank, token, 60, &l), rc, out);
  const Fsdp__WorkerSetup *su = wlink_setup(l);
  TRY_GOTO(jobspec_parse(su->spec_text, su->spec_path, su->base_dir, &spec), rc, out);
  /* hybrid with shard_group = 0: the coordinator chose G from its placement; its plan carries it */
  if (spec.sharding == SHARD_HYBRID && spec.shard_group == 0 && su->plan) spec.shard_group = (int)su->plan->shard_world;
  TRY_GOTO(plan_build(&spec, (int)su->world, &plan), rc, out);
  TRY_GOTO(planmsg_check(su->plan, plan), rc, out);
  if (spec.device == DEVICE_CPU && strcmp(su->comm, "gloo") != 0) {
    rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "comm backend '%s' is not available to device = cpu workers (gloo is)",
                        su->comm);
    goto out;
  }
  if (spec.device == DEVICE_CUDA && su->device_index < 0) {
    rc = fsdp_set_error(FSDP_ERR_STATE, "device = cuda: the coordinator assigned no GPU to rank %d", rank);
    goto out;
  }
  comm_kv kv = wlink_kv(l);
  rendezvous rv = {.kv = &kv, .prefix = su->kv_prefix};
  TRY_GOTO(open_device_and_comm(&spec, plan, rank, (int)su->world, su->device_index, su->comm, &rv, &comm, &dev, &gpu),
           rc, out);
  TRY_GOTO(runtime_new(&spec, plan, rank, comm, dev, &rt), rc, out);
  TRY_GOTO(open_hybrid(&spec, plan, rank, &rv, gpu, comm, rt, &gcomm, &rcomm), rc, out);
  TRY_GOTO(trace_from_env(&tr), rc, out);   /* spans for `fsdpctl trace` (FSDP_TRACE=0: none) */
  runtime_set_trace(rt, tr);
  wlink_set_trace(l, tr);
  int start = (int)su->start_step;
  TRY_GOTO(ckpt_begin(rt, &spec, &start), rc, out);
  TRY_GOTO(wlink_ready(l, start), rc, out);
  for (;;) {
    int step, checkpoint;
    TRY_GOTO(wlink_next(l, &step, &checkpoint), rc, out);
    if (step == 0) break;
    rt_report r;
    TRY_GOTO(runtime_step(rt, step, &r), rc, out);
    TRY_GOTO(eval_if_due(rt, &spec, &r), rc, out);
    TRY_GOTO(sample_if_due(rt, &spec, rank, &r), rc, out);
    /* The coordinator asks for checkpoints (ckpt_due: every K-th step and the last); one is
     * written before the report, so a reported step at a checkpoint boundary is durable. */
    if (checkpoint) TRY_GOTO(runtime_checkpoint(rt, spec.ckpt_dir, step), rc, out);
    TRY_GOTO(wlink_report(l, rank, &r), rc, out);
  }
  rc = wlink_ack(l);
out:
  if (rc != FSDP_OK) {
    log_error("%s", fsdp_last_error());
    wlink_error(l, rank, rc, fsdp_last_error());
  }
  runtime_destroy(&rt);
  device_destroy(&dev);
  comm_destroy(&rcomm);
  comm_destroy(&gcomm);
  comm_destroy(&comm);
  trace_destroy(&tr);
  plan_destroy(&plan);
  wlink_close(&l);
  return rc == FSDP_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  tune_process_env(argv);
  const char *connect = NULL, *token = "", *rdv = NULL, *save = NULL, *job = NULL;
  long rank = -1, world = -1, steps = 0, job_id = -1;
  int standalone = 0;
  sample_args sa = {.tokens = 64, .temperature = 1.0};
  long top_k = 0, ntok = 64, seed = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                                                  \
  do {                                                                           \
    if (!v) {                                                                    \
      fprintf(stderr, "fsdp-worker: %s needs a value\n", a);                     \
      return 2;                                                                  \
    }                                                                            \
    i++;                                                                         \
  } while (0)
    if (!strcmp(a, "--standalone")) standalone = 1;
    else if (!strcmp(a, "--sample")) { NEEDV(); sa.model = v; }
    else if (!strcmp(a, "--prompt")) { NEEDV(); sa.prompt = v; }
    else if (!strcmp(a, "--tokenizer")) { NEEDV(); sa.tokenizer = v; }
    else if (!strcmp(a, "--tokens")) { NEEDV(); if (parse_int(a, v, 1, 1L << 20, &ntok)) return 2; }
    else if (!strcmp(a, "--top-k")) { NEEDV(); if (parse_int(a, v, 0, 1L << 24, &top_k)) return 2; }
    else if (!strcmp(a, "--seed")) { NEEDV(); if (parse_int(a, v, 0, 1L << 62, &seed)) return 2; }
    else if (!strcmp(a, "--temperature")) {
      NEEDV();
      char *end;
      errno = 0;
      sa.temperature = strtod(v, &end);
      if (errno || *end || !(sa.temperature >= 0) || sa.temperature > 100) {
        fprintf(stderr, "fsdp-worker: --temperature '%s' must be a number in [0, 100] (0: greedy)\n", v);
        return 2;
      }
    }
    else if (!strcmp(a, "--connect")) { NEEDV(); connect = v; }
    else if (!strcmp(a, "--token")) { NEEDV(); token = v; }
    else if (!strcmp(a, "--rendezvous")) { NEEDV(); rdv = v; }
    else if (!strcmp(a, "--save")) { NEEDV(); save = v; }
    else if (!strcmp(a, "--job")) { NEEDV(); if (parse_int(a, v, 0, 1L << 50, &job_id)) return 2; }
    else if (!strcmp(a, "--rank")) { NEEDV(); if (parse_int(a, v, 0, 65535, &rank)) return 2; }
    else if (!strcmp(a, "--world")) { NEEDV(); if (parse_int(a, v, 1, 65536, &world)) return 2; }
    else if (!strcmp(a, "--steps")) { NEEDV(); if (parse_int(a, v, 1, 1L << 30, &steps)) return 2; }
    else if (!strcmp(a, "--log-level")) {
      NEEDV();
      log_level lvl;
      if (log_parse_level(v, &lvl) != FSDP_OK) {
        fprintf(stderr, "fsdp-worker: %s\n", fsdp_last_error());
        return 2;
      }
      log_set_level(lvl);
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (a[0] == '-') {
      fprintf(stderr, "fsdp-worker: unknown flag %s\n", a);
      usage(stderr);
      return 2;
    } else if (!job) job = a;
    else {
      fprintf(stderr, "fsdp-worker: unexpected argument %s\n", a);
      return 2;
    }
#undef NEEDV
  }
  log_set_prefix("worker", (int)rank);
  if (sa.model) {
    if (!sa.prompt) {
      fprintf(stderr, "fsdp-worker: --sample needs --prompt TEXT\n");
      return 2;
    }
    sa.tokens = (int)ntok, sa.top_k = (int)top_k, sa.seed = (unsigned long long)seed;
    return sample_run(&sa);
  }
  if (standalone) {
    if (rank < 0 || world < 1 || !rdv || !job || rank >= world) {
      fprintf(stderr, "fsdp-worker: --standalone needs --rank R (0..N-1), --world N, --rendezvous DIR and a job file\n");
      usage(stderr);
      return 2;
    }
    return run_standalone((int)rank, (int)world, rdv, (int)steps, save, job);
  }
  if (!connect || job_id < 0 || rank < 0) {
    fprintf(stderr, "fsdp-worker: needs --connect ENDPOINT --job ID --rank R (or --standalone)\n");
    usage(stderr);
    return 2;
  }
  return run_connected(connect, (uint64_t)job_id, (int)rank, token);
}
