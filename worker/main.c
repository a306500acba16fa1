/* fsdp-worker — one rank of one job.
 *
 *   fsdp-worker --connect ENDPOINT --job ID --rank R [--log-level L]
 *       the daemon's way: everything else (spec, plan, rendezvous, steps) comes from the coordinator;
 *       the job's token comes in the environment (FSDPD_WORKER_TOKEN), never on the command line
 *   fsdp-worker --standalone --rank R --world N --rendezvous DIR [--steps K] [--save FILE] JOB.ini
 *       without a daemon, like torchrun: N of these with the same fresh DIR form a job; each prints
 *       one JSON line per step on stdout. device = cuda: rank R uses visible GPU R mod (visible GPUs)
 *       (CUDA_VISIBLE_DEVICES as set by the launcher); comm = auto picks NCCL when world ≤ visible
 *       GPUs (rank 0 writes the unique id into DIR), else gloo staged through pinned memory.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "blasinfo.h"
#include "gemm_bf16.h"
#include "ckpt.h"
#include "comm.h"
#include "comm_boot.h"
#include "comm_hybrid.h"
#include "device.h"
#include "envknob.h"
#include "fsutil.h"
#include "flagtab.h"
#include "jobresolve.h"
#include "jobspec.h"
#include "log.h"
#include "logcfg.h"
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

/* One JSON line per step (standalone mode): the fields of metrics.jsonl for this rank. */
static void print_report(int rank, const rt_report *r) {
  json_t *o = json_object(), *peak = json_object(), *phase = json_object(), *sent = json_object();
  json_object_set_new(o, "step", json_integer(r->step));
  json_object_set_new(o, "rank", json_integer(rank));
  json_object_set_new(o, "loss", isfinite(r->loss) ? json_real(r->loss) : json_null());   /* null: no trained token */
  json_object_set_new(o, "lr", json_real(r->lr));
  json_object_set_new(o, "grad_norm", json_real(r->grad_norm));
  json_object_set_new(o, "tokens", json_integer((json_int_t)r->tokens));
  json_object_set_new(o, "step_ms", json_real(r->step_ms));
  json_object_set_new(o, "tokens_per_s", json_real(r->step_ms > 0 ? r->tokens / (r->step_ms / 1000.0) : 0));
  json_object_set_new(o, "trained_tokens", json_integer((json_int_t)r->trained));
  json_object_set_new(o, "trained_tokens_per_s", json_real(r->step_ms > 0 ? r->trained / (r->step_ms / 1000.0) : 0));
  for (int c = 0; c < MEM_NCAT; c++) json_object_set_new(peak, plan_mem_category_name((mem_category)c), json_integer((json_int_t)r->peak[c]));
  json_object_set_new(peak, "total", json_integer((json_int_t)r->peak_total));
  for (int i = 0; i < RT_NPHASE; i++) json_object_set_new(phase, stepstats_phase_names[i], json_real(r->phase_us[i] / 1000.0));
  for (int i = 0; i < COLL_NKIND; i++) json_object_set_new(sent, plan_coll_kind_name((coll_kind)i), json_integer((json_int_t)r->sent[i]));
  if (r->has_val) {
    json_object_set_new(o, "val_loss", isfinite(r->val_loss) ? json_real(r->val_loss) : json_null());
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

/* [eval] at_start: the validation loss before any update, when the job starts from step 0 (not
 * when it resumes). Collective. *HAVE says whether it was computed. */
static fsdp_status eval_at_start(runtime_t *rt, const jobspec_t *spec, int start, rt_report *r) {
  r->has_start_val = 0;
  if (!spec->eval_at_start || start != 0) return FSDP_OK;
  TRY(runtime_eval(rt, spec->eval_batches, &r->start_val_loss, &r->start_eval_ms));
  r->has_start_val = 1;
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
    rc = sample_generate(w, whole, ids, plen, plen + SAMPLE_TOKENS, 1.0, 0, spec->seed ^ (uint64_t)r->step, NULL, 0, NULL);
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

/* The worker's environment knobs that have a fixed set of values (FSDP_CPU_DEVICE, FSDP_CPU_BF16;
 * FSDP_TRACE is checked by trace_from_env, which worker_open calls first), checked before the
 * rendezvous: a bad value stops the worker in one line before it publishes an address or connects
 * to a peer (the ranks of a job share one environment, so each refuses by itself). */
static fsdp_status check_env_knobs(void) {
  dev_cpu_mode mode;
  TRY(dev_cpu_mode_from_env(&mode));
  const char *bf16 = envknob_get(ENV_CPU_BF16);
  if (!gemm_bf16_env_valid(bf16))
    return fsdp_set_error(FSDP_ERR_INVALID, "FSDP_CPU_BF16=%s is not a CPU compute choice; allowed: auto, on, off, emulate",
                          bf16);
  return FSDP_OK;
}

/* The CPU device in the mode FSDP_CPU_DEVICE names (device.h; tests run the async ones); the knobs
 * are valid (check_env_knobs). */
static fsdp_status open_cpu_device(const jobspec_t *spec, device_t **dev) {
  dev_cpu_mode mode;
  TRY(dev_cpu_mode_from_env(&mode));
  TRY(dev_new_cpu(mode, dev));
  if (mode != DEV_CPU_SYNC) log_info("CPU device: %s", (*dev)->op->name);
  if (spec->param_dtype == DTYPE_BF16) {   /* param_dtype = bf16: compute as the GPU does, where the CPU gains */
    const char *env = envknob_get(ENV_CPU_BF16);
    gemm_bf16_rates r = gemm_bf16_cpu_has() ? gemm_bf16_rates_of_cpu() : (gemm_bf16_rates){0, 0};
    char why[160] = "";
    if (r.fp32 > 0)
      snprintf(why, sizeof why, "; this CPU's vdpbf16ps does %.1f G multiply-adds/s, fp32 FMA %.1f (%.2fx, bf16 from %.2fx)",
               r.bf16 / 1e9, r.fp32 / 1e9, r.bf16 / r.fp32, GEMM_BF16_MIN_RATIO);
    if (dev_cpu_set_compute(*dev, DTYPE_BF16) == DTYPE_BF16)
      log_info("CPU compute: GEMMs in %s with fp32 accumulation (FSDP_CPU_BF16=%s%s)", gemm_kind_name(gemm_bf16_kind()),
               env, why);
    else
      log_info("CPU compute: fp32 (FSDP_CPU_BF16=%s%s; param_dtype = bf16 computes in bf16 where the CPU has "
               "AVX512-BF16 at a rate that beats fp32 FMA in a GEMM)", env, why);
  }
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
static fsdp_status cuda_failure(fsdp_status rc) { return fsdp_set_error(rc, "device = cuda: %s", fsdp_last_error()); }

static fsdp_status nccl_id(void *ctx, uint8_t id[COMM_BOOT_ID_BYTES]) {
  (void)ctx;
  return comm_nccl_get_unique_id(id);
}

/* device = cuda: the CUDA device on GPU (an index among the visible ones), then NCCL (its id from
 * rank 0 through the store) or gloo staged through pinned memory. */
static fsdp_status open_cuda(const jobspec_t *spec, const plan_t *plan, int rank, int world, int gpu, int use_nccl,
                             const rendezvous *rv, comm_t **comm, device_t **dev) {
  fsdp_status rc = dev_new_cuda(gpu, spec->timeout_s, dev);
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
    return open_cpu_device(spec, dev);
  }
#ifdef FSDP_HAVE_CUDA
  int ngpu = 0;
  fsdp_status rc = dev_cuda_count(&ngpu);
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

/* The checkpoint after step STEP when SAVE (docs/checkpoints.md): synchronous, or handed to A's
 * writer thread ([checkpoint] async). A save in flight is settled (its manifest written) at the first
 * step boundary at which every rank's write has ended, when the next save starts, and before the
 * report of the LAST step, so that a finished or stopped job's last checkpoint is complete. The
 * LAST step's own save is synchronous even then: no step follows for its write to overlap, so a
 * snapshot would be a copy for nothing, and the writer, below every other process of the node,
 * would write it only in the time they leave while the job waits for it. The figures of the saves
 * that became complete go into R. */
static fsdp_status ckpt_after_step(runtime_t *rt, const jobspec_t *spec, ckpt_async *a, int step, int save, int last,
                                   rt_report *r) {
  ckpt_save_stats done[2] = {{0}, {0}};
  r->nckpt = 0;
  if (!spec->ckpt_async || !a) {   /* no writer without [checkpoint] every: a stop's save is synchronous */
    if (save) TRY(runtime_checkpoint(rt, spec->ckpt_dir, step, &done[0]));
  } else if (last) {
    TRY(runtime_checkpoint_settle(rt, a, 1, &done[0]));
    if (save) TRY(runtime_checkpoint(rt, spec->ckpt_dir, step, &done[1]));
  } else {
    if (save) TRY(runtime_checkpoint_async(rt, a, spec->ckpt_dir, step, &done[0]));
    else TRY(runtime_checkpoint_settle(rt, a, 0, &done[0]));
  }
  for (int i = 0; i < 2; i++)
    if (done[i].step) r->ckpt[r->nckpt++] = done[i];
  return FSDP_OK;
}

/* What a rank holds while it trains: its job, plan, communicators, device, runtime, trace and
 * asynchronous checkpointer; opened by worker_open and worker_ckpt_start, closed by worker_close. */
typedef struct {
  jobspec_t spec;
  plan_t *plan;
  comm_t *comm, *gcomm, *rcomm;
  device_t *dev;
  runtime_t *rt;
  int gpu;
  trace_t *tr;
  ckpt_async *ca;
} worker_rt;

/* The device, communicators, runtime and trace of rank RANK of WORLD (W's spec and plan are set). */
static fsdp_status worker_open(worker_rt *w, int rank, int world, int device_index, const char *comm_name,
                               const rendezvous *rv) {
  TRY(check_env_knobs());
  TRY(trace_from_env(&w->tr));   /* spans for `fsdpctl trace` (FSDP_TRACE=0: none); standalone too, to measure it */
  TRY(open_device_and_comm(&w->spec, w->plan, rank, world, device_index, comm_name, rv, &w->comm, &w->dev, &w->gpu));
  TRY(runtime_new(&w->spec, w->plan, rank, w->comm, w->dev, &w->rt));
  TRY(open_hybrid(&w->spec, w->plan, rank, rv, w->gpu, w->comm, w->rt, &w->gcomm, &w->rcomm));
  runtime_set_trace(w->rt, w->tr);
  return FSDP_OK;
}

/* The step to start after (*START: the coordinator's, or 0) from the checkpoint, and the
 * asynchronous checkpointer when the job saves asynchronously. */
static fsdp_status worker_ckpt_start(worker_rt *w, int *start) {
  TRY(ckpt_begin(w->rt, &w->spec, start));
  if (w->spec.ckpt_async && w->spec.ckpt_every > 0) {
    TRY(ckpt_async_new(&w->ca));
    TRY(runtime_checkpoint_prepare(w->rt, w->ca));
  }
  return FSDP_OK;
}

static void worker_close(worker_rt *w) {
  ckpt_async_destroy(&w->ca);   /* before the device: the snapshot is its host memory */
  runtime_destroy(&w->rt);
  dev_destroy(&w->dev);
  comm_destroy(&w->rcomm);
  comm_destroy(&w->gcomm);
  comm_destroy(&w->comm);
  trace_destroy(&w->tr);
  plan_destroy(&w->plan);
}

static int run_standalone(int rank, int world, const char *rdv, int steps_override, const char *save,
                          const char *save_adapter, const char *job) {
  worker_rt w = {.gpu = -1};
  jobspec_t *spec = &w.spec;
  fsdp_status rc;
  TRY_GOTO(jobspec_load(job, spec), rc, out);
  if (world != spec->world_size)
    log_info("--world %d overrides the job's world_size %d", world, spec->world_size);
  if (steps_override > 0) spec->steps = steps_override;
  /* no coordinator: the same resolver, with comm = auto left to each rank's visible GPUs */
  jobresolve_place pl = {.world = world, .comm_per_rank = 1};
  TRY_GOTO(jobresolve_place_job(spec, &pl, &w.plan), rc, out);
  rendezvous rv = {.dir = rdv, .prefix = NULL};
  TRY_GOTO(worker_open(&w, rank, world, -1, NULL, &rv), rc, out);
  int start = 0;
  TRY_GOTO(worker_ckpt_start(&w, &start), rc, out);
  if (start >= spec->steps && start > 0 && rank == 0)
    log_info("the checkpoint of step %d is at or past steps = %d: nothing to train", start, spec->steps);
  rt_report r0 = {0};
  TRY_GOTO(eval_at_start(w.rt, spec, start, &r0), rc, out);
  if (r0.has_start_val) {   /* standalone: step 0's line, the validation loss only */
    printf("{\"step\": 0, \"rank\": %d, \"val_loss\": %.9g, \"eval_ms\": %.9g}\n", rank, r0.start_val_loss,
           r0.start_eval_ms);
    fflush(stdout);
  }
  for (int s = start + 1; s <= spec->steps; s++) {
    rt_report r;
    TRY_GOTO(runtime_step(w.rt, s, &r), rc, out);
    r.has_start_val = 0;
    TRY_GOTO(eval_if_due(w.rt, spec, &r), rc, out);
    TRY_GOTO(sample_if_due(w.rt, spec, rank, &r), rc, out);
    TRY_GOTO(ckpt_after_step(w.rt, spec, w.ca, s, ckpt_due(spec, s), s == spec->steps, &r), rc, out);
    print_report(rank, &r);
  }
  if (save) TRY_GOTO(runtime_save(w.rt, save), rc, out);
  if (save_adapter) TRY_GOTO(runtime_save_adapters(w.rt, save_adapter), rc, out);
out:
  if (rc != FSDP_OK) log_error("%s", fsdp_last_error());
  worker_close(&w);
  return rc == FSDP_OK ? 0 : 1;
}

/* The job as the coordinator resolved it (SU: every key explicit, jobresolve.h) into W's spec and
 * plan, checked against what this worker can run. Nothing is re-derived here: the resolved text is
 * read without this build's defaults, and the plan built from it must be the coordinator's (the same
 * version of the planner: planmsg_check). */
static fsdp_status connected_spec(const Fsdp__WorkerSetup *su, int rank, worker_rt *w) {
  jobspec_t *spec = &w->spec;
  TRY(jobspec_canonical_read(su->resolved, su->spec_path, spec));
  if (spec->world_size != (int)su->world)
    return fsdp_set_error(FSDP_ERR_FORMAT, "the resolved job has world_size = %d, its setup world %u", spec->world_size,
                          su->world);
  if (spec->comm == COMM_AUTO)
    return fsdp_set_error(FSDP_ERR_FORMAT, "the resolved job leaves comm = auto: the coordinator chooses the backend");
  TRY(plan_build(spec, spec->world_size, &w->plan));
  TRY(planmsg_check(su->plan, w->plan));
  if (spec->device == DEVICE_CPU && spec->comm != COMM_GLOO)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "comm backend '%s' is not available to device = cpu workers (gloo is)",
                          jobspec_comm_kind_name(spec->comm));
  if (spec->device == DEVICE_CUDA && su->device_index < 0)
    return fsdp_set_error(FSDP_ERR_STATE, "device = cuda: the coordinator assigned no GPU to rank %d", rank);
  return FSDP_OK;
}

/* The steps the coordinator grants, each reported, until it says stop (step 0). */
static fsdp_status connected_steps(wlink *l, worker_rt *w, int rank, const rt_report *r0) {
  for (int first = 1;; first = 0) {
    int step, checkpoint, last;
    TRY(wlink_next(l, &step, &checkpoint, &last));
    if (step == 0) {   /* a save still in flight is written before the acknowledgement */
      ckpt_save_stats done;
      return runtime_checkpoint_settle(w->rt, w->ca, 1, &done);
    }
    rt_report r;
    TRY(runtime_step(w->rt, step, &r));
    /* the first step's report carries the loss before it: the daemon writes it as step 0 */
    r.has_start_val = first && r0->has_start_val;
    r.start_val_loss = r0->start_val_loss, r.start_eval_ms = r0->start_eval_ms;
    TRY(eval_if_due(w->rt, &w->spec, &r));
    TRY(sample_if_due(w->rt, &w->spec, rank, &r));
    /* The coordinator asks for checkpoints (ckpt_due: every K-th step and the last). A synchronous
     * one is written before the report, so a reported step at a checkpoint boundary is durable; an
     * asynchronous one is complete only once settled, and the last step's before its report. */
    TRY(ckpt_after_step(w->rt, &w->spec, w->ca, step, checkpoint, last, &r));
    TRY(wlink_report(l, rank, &r));
  }
}

static int run_connected(const char *endpoint, uint64_t job_id, int rank, const char *token) {
  wlink *l = NULL;
  worker_rt w = {.gpu = -1};
  fsdp_status rc;
  /* Die with the agent that spawned us: an orphaned rank would hold its peers in a collective. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  TRY_GOTO(wlink_open(endpoint, job_id, rank, token, 60, &l), rc, out);
  const Fsdp__WorkerSetup *su = wlink_setup(l);
  TRY_GOTO(connected_spec(su, rank, &w), rc, out);
  comm_kv kv = wlink_kv(l);
  rendezvous rv = {.kv = &kv, .prefix = su->kv_prefix};
  TRY_GOTO(worker_open(&w, rank, w.spec.world_size, su->device_index, jobresolve_comm_name(&w.spec), &rv), rc, out);
  wlink_set_trace(l, w.tr);
  int start = (int)su->start_step;
  TRY_GOTO(worker_ckpt_start(&w, &start), rc, out);
  if (rank == 0) log_info("ready: the shards allocated and loaded, training from step %d", start + 1);
  TRY_GOTO(wlink_ready(l, start), rc, out);
  rt_report r0 = {0};
  TRY_GOTO(eval_at_start(w.rt, &w.spec, start, &r0), rc, out);
  TRY_GOTO(connected_steps(l, &w, rank, &r0), rc, out);
  rc = wlink_ack(l);
out:
  if (rc != FSDP_OK) {
    log_error("%s", fsdp_last_error());
    wlink_error(l, rank, rc, fsdp_last_error());
  }
  worker_close(&w);
  wlink_close(&l);
  return rc == FSDP_OK ? 0 : 1;
}

/* What the command line asks for. */
typedef struct worker_args {
  const char *connect, *rdv, *save, *save_adapter, *job, *log_level;
  long rank, world, steps, job_id;
  int standalone, help, blas_info;
  sample_args sa;
} worker_args;

/* fsdp-worker's flags: one row each (flagtab.h), the shape of fsdpd's table and the job file's. The
 * ranks and ids default to -1 (unset: main's initializer), outside their ranges. */
#define W(field) offsetof(worker_args, field)
static const flagdef flags[] = {
  {"connect", FLAG_STR, W(connect), NULL, 0, 0, "the daemon's way: the endpoint to reach the coordinator at (its node's relay)"},
  {"job", FLAG_LONG, W(job_id), NULL, 0, 1125899906842624.0, "the daemon's way: the job's id"},
  {"rank", FLAG_LONG, W(rank), NULL, 0, 65535, "this worker's rank R"},
  {"standalone", FLAG_BOOL, W(standalone), NULL, 0, 1, "run without a daemon, like torchrun (then a JOB.ini argument)"},
  {"world", FLAG_LONG, W(world), NULL, 1, 65536, "standalone: the world size N"},
  {"rendezvous", FLAG_STR, W(rdv), NULL, 0, 0, "standalone: the fresh directory DIR where the N ranks meet"},
  {"steps", FLAG_LONG, W(steps), NULL, 1, 1073741824, "standalone: train K steps instead of the job's"},
  {"save", FLAG_STR, W(save), NULL, 0, 0, "standalone: write the trained model to FILE.safetensors"},
  {"save-adapter", FLAG_STR, W(save_adapter), NULL, 0, 0,
   "standalone, a [lora] job: write the trained adapters as a PEFT folder DIR (adapter_config.json, adapter_model.safetensors)"},
  {"sample", FLAG_STR, W(sa.model), NULL, 0, 0, "sample from MODEL (what fsdpctl sample runs; docs/data.md)"},
  {"prompt", FLAG_STR, W(sa.prompt), NULL, 0, 0, "--sample: the prompt TEXT"},
  {"tokens", FLAG_INT, W(sa.tokens), "64", 1, 1048576, "--sample: tokens to generate"},
  {"temperature", FLAG_DBL, W(sa.temperature), "1", 0, 100, "--sample: the sampling temperature (0: greedy)"},
  {"top-k", FLAG_INT, W(sa.top_k), "0", 0, 16777216, "--sample: sample among the K likeliest tokens (0: all)"},
  {"seed", FLAG_U64, W(sa.seed), "0", 0, 4611686018427387904.0, "--sample: the sampler's seed"},
  {"tokenizer", FLAG_STR, W(sa.tokenizer), NULL, 0, 0, "--sample: the tokenizer FILE (default the model's)"},
  {"logits", FLAG_BOOL, W(sa.logits), NULL, 0, 1, "--sample: print every prompt position's logits (JSON) instead"},
  {"prompt-ids", FLAG_STR, W(sa.prompt_ids), NULL, 0, 0, "--sample: the prompt as token ids (instead of --prompt)"},
  {"stop-ids", FLAG_STR, W(sa.stop_ids), NULL, 0, 0, "--sample: token ids that end the continuation (not printed)"},
  {"adapter", FLAG_STR, W(sa.adapter), NULL, 0, 0, "--sample: a PEFT LoRA folder merged into the model first"},
  {"log-level", FLAG_STR, W(log_level), NULL, 0, 0, "debug, info, warn or error"},
  {"blas-info", FLAG_BOOL, W(blas_info), NULL, 0, 1, "print the BLAS library and kernel type a worker runs here, and the warning if they are older than the CPU's"},
  {"help", FLAG_BOOL, W(help), NULL, 0, 1, "print this help"},
};
#define NFLAGS (sizeof flags / sizeof flags[0])

static void usage(FILE *f) {
  fprintf(f,
          "usage: fsdp-worker --connect ENDPOINT --job ID --rank R [--log-level L]   (the token: $FSDPD_WORKER_TOKEN)\n"
          "       fsdp-worker --standalone --rank R --world N --rendezvous DIR [--steps K] [--save FILE.safetensors]\n"
          "                   [--save-adapter DIR]\n"
          "                   [--log-level L] JOB.ini\n"
          "       fsdp-worker --sample MODEL --prompt TEXT [--tokens N] [--temperature X] [--top-k K] [--seed S]\n"
          "                   [--tokenizer FILE] [--logits]     (what fsdpctl sample runs; docs/data.md)\n\nflags:\n");
  flagtab_usage(f, flags, NFLAGS);
}

/* The flags and the job file argument into A. Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, worker_args *a) {
  int first = 0;
  if (flagtab_parse("fsdp-worker", flags, NFLAGS, a, argc, argv, &first) != 0) return 2;
  if (a->help) {
    usage(stdout);
    return 0;
  }
  log_level lvl;
  if (a->log_level && log_parse_level(a->log_level, &lvl) != FSDP_OK) {
    fprintf(stderr, "fsdp-worker: %s\n", fsdp_last_error());
    return 2;
  }
  if (a->log_level) log_set_level(lvl);
  if (first < argc) a->job = argv[first++];
  if (first < argc) {
    fprintf(stderr, "fsdp-worker: unexpected argument %s\n", argv[first]);
    return 2;
  }
  return -1;
}

/* --blas-info: what blasinfo_log would log at start, on stdout (bench/lib.sh prints it with every bench). */
static int print_blas_info(void) {
  char info[512], warn[512];
  int w = blasinfo_describe(openblas_get_config(), openblas_get_corename(), getenv("OPENBLAS_CORETYPE"),
                            blasinfo_cpu_isa(), info, sizeof info, warn, sizeof warn);
  printf("%s\n", info);
  if (w) printf("warning: %s\n", warn);
  return 0;
}

int main(int argc, char **argv) {
  tune_process_env(argv);
  worker_args a = {.rank = -1, .world = -1, .job_id = -1};
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0) return rc;
  log_set_prefix("worker", (int)a.rank);
  if (a.blas_info) return print_blas_info();
  if (a.sa.model) {
    blasinfo_quiet();   /* fsdpctl sample's stderr is its user's: one line on failure, nothing else */
    if (!a.sa.prompt == !a.sa.prompt_ids) {
      fprintf(stderr, "fsdp-worker: --sample needs --prompt TEXT or --prompt-ids \"ID ...\"\n");
      return 2;
    }
    fsutil_reads_own_tree(1);   /* fsdpctl sample's: run as root, root's own files only (docs/cli.md) */
    return sample_run(&a.sa);
  }
  if (a.standalone) {
    if (a.rank < 0 || a.world < 1 || !a.rdv || !a.job || a.rank >= a.world) {
      fprintf(stderr, "fsdp-worker: --standalone needs --rank R (0..N-1), --world N, --rendezvous DIR and a job file\n");
      usage(stderr);
      return 2;
    }
    blasinfo_log(openblas_get_config(), openblas_get_corename());
    return run_standalone((int)a.rank, (int)a.world, a.rdv, (int)a.steps, a.save, a.save_adapter, a.job);
  }
  if (!a.connect || a.job_id < 0 || a.rank < 0) {
    fprintf(stderr, "fsdp-worker: needs --connect ENDPOINT --job ID --rank R (or --standalone)\n");
    usage(stderr);
    return 2;
  }
  blasinfo_log(openblas_get_config(), openblas_get_corename());
  const char *token = getenv(WIRE_WORKER_TOKEN_ENV);
  return run_connected(a.connect, (uint64_t)a.job_id, (int)a.rank, token ? token : "");
}
