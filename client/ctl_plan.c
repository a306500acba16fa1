/* ctl_plan — `fsdpctl plan`: the shard plan and memory prediction of a job file, with no daemon. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl.h"
#include "ctl_client.h"
#include "ctl_fmt.h"
#include "ctl_planout.h"
#include "jobresolve.h"
#include "jobspec.h"
#include "peft.h"
#include "plan.h"
#include "planfit.h"
#include "st_model.h"
#include "tokmask.h"

#define PLAN_EXIT_USAGE 2
#define PLAN_EXIT_NOFIT 3

static void plan_usage(FILE *f) {
  fprintf(f,
          "usage: fsdpctl plan JOB.ini [--world N] [--shard-group G] [--device-memory BYTES [--fit]] [--json]\n"
          "       fsdpctl plan --defaults\n"
          "\n"
          "Print the FSDP plan of a job: its units and tensors (Hugging Face GPT-2 or Llama names, shapes,\n"
          "offsets), every rank's shard, the parameter count, FLOPs per token, the bytes each rank sends\n"
          "per step in every sharding mode, and the predicted peak memory per rank by category. Needs no\n"
          "daemon.\n"
          "\n"
          "  --world N              plan for N ranks instead of the job's [fsdp] world_size (1..4096)\n"
          "  --shard-group G        sharding = hybrid: G ranks per shard group instead of the job's [fsdp]\n"
          "                         shard_group (which the daemon otherwise takes from its placement: the\n"
          "                         ranks per node); G divides the world size and is below it\n"
          "  --device-memory BYTES  say whether the per-rank total fits in BYTES and, if not, the smallest\n"
          "                         world size that does; BYTES is an integer with an optional suffix:\n"
          "                         K M G T, KiB MiB GiB TiB (powers of 1024), KB MB GB TB (powers of 1000)\n"
          "  --fit                  with --device-memory: the largest per-rank batch_size that fits, and what\n"
          "                         one change (checkpointing, sharding, bf16, offload, more ranks) would fit\n"
          "  --json                 the same data as JSON on stdout (for programs; --fit adds \"fit\")\n"
          "  --defaults             print every job-file key with its default, as a commented job file\n"
          "  -h, --help             this text\n"
          "\n"
          "The model files a job starts from ([model] from or init) are opened and checked against the plan.\n"
          "\n"
          "Exit status: 0 ok (and fits); 3 it does not fit in --device-memory; 1 a job file or model files that\n"
          "cannot run; 2 bad usage or a plan that cannot be built.\n");
}

/* The plan as JSON, with "fit" added when FIT: the plan's own writer into memory, then merged. */
static int write_json(const plan_t *plan, uint64_t device_bytes, const plan_fit *fit) {
  if (!fit) {
    if (ctl_plan_write_json(plan, stdout, device_bytes) == FSDP_OK) return 0;
    fprintf(stderr, "fsdpctl: %s\n", fsdp_last_error());
    return 1;
  }
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  int ok = m && ctl_plan_write_json(plan, m, device_bytes) == FSDP_OK;
  if (m) fclose(m);
  json_t *o = ok ? json_loadb(buf, len, 0, NULL) : NULL;
  free(buf);
  if (!o || json_object_set_new(o, "fit", plan_fit_json(fit)) != 0 || json_dumpf(o, stdout, JSON_INDENT(2)) != 0) {
    json_decref(o);
    fprintf(stderr, "fsdpctl: plan: cannot write the JSON plan\n");
    return 1;
  }
  putchar('\n');
  json_decref(o);
  return 0;
}

/* The command line of `fsdpctl plan`. */
typedef struct {
  const char *job, *world_arg, *mem_arg, *group_arg;
  int json, fit, world, group;
  uint64_t device_bytes;
} plan_args;

/* An integer option in 1..4096 into *OUT (0 when ARG is NULL); 0 ok, else the usage exit status. */
static int parse_count(const char *opt, const char *arg, int *out) {
  *out = 0;
  if (!arg) return 0;
  char *end;
  errno = 0;
  long v = strtol(arg, &end, 10);
  if (errno || !*arg || *end || v < 1 || v > 4096) {
    fprintf(stderr, "fsdpctl: plan: %s '%s' is not allowed; allowed: an integer in 1..4096\n", opt, arg);
    return PLAN_EXIT_USAGE;
  }
  *out = (int)v;
  return 0;
}

/* The options into *A. Returns -1 to go on, else the exit status (--help and --defaults end here). */
static int parse_args(int argc, char **argv, plan_args *a) {
  memset(a, 0, sizeof *a);
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    const char **valued = !strcmp(o, "--world")           ? &a->world_arg
                          : !strcmp(o, "--device-memory") ? &a->mem_arg
                          : !strcmp(o, "--shard-group")   ? &a->group_arg
                                                          : NULL;
    if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
      plan_usage(stdout);
      return 0;
    } else if (!strcmp(o, "--defaults")) {
      jobspec_write_defaults(stdout);
      return 0;
    } else if (!strcmp(o, "--json")) {
      a->json = 1;
    } else if (!strcmp(o, "--fit")) {
      a->fit = 1;
    } else if (valued) {
      if (i + 1 >= argc) {
        fprintf(stderr, "fsdpctl: plan: %s needs a value (see fsdpctl plan --help)\n", o);
        return PLAN_EXIT_USAGE;
      }
      *valued = argv[++i];
    } else if (!strncmp(o, "--shard-group=", 14)) {
      a->group_arg = o + 14;
    } else if (!strncmp(o, "--world=", 8)) {
      a->world_arg = o + 8;
    } else if (!strncmp(o, "--device-memory=", 16)) {
      a->mem_arg = o + 16;
    } else if (o[0] == '-' && o[1]) {
      fprintf(stderr, "fsdpctl: plan: unknown option '%s' (see fsdpctl plan --help)\n", o);
      return PLAN_EXIT_USAGE;
    } else if (a->job) {
      fprintf(stderr, "fsdpctl: plan: one job file only, got '%s' and '%s'\n", a->job, o);
      return PLAN_EXIT_USAGE;
    } else {
      a->job = o;
    }
  }
  if (!a->job) {
    fprintf(stderr, "fsdpctl: plan: no job file; usage: fsdpctl plan JOB.ini [--world N] "
                    "[--device-memory BYTES] [--json]\n");
    return PLAN_EXIT_USAGE;
  }
  int rc = parse_count("--world", a->world_arg, &a->world);
  if (!rc) rc = parse_count("--shard-group", a->group_arg, &a->group);
  if (rc) return rc;
  if (a->mem_arg && !(a->device_bytes = ctl_parse_bytes(a->mem_arg))) {
    fprintf(stderr, "fsdpctl: plan: --device-memory '%s' is not allowed; allowed: a positive integer with an "
                    "optional suffix K M G T, KiB MiB GiB TiB, KB MB GB TB (e.g. 80GiB)\n", a->mem_arg);
    return PLAN_EXIT_USAGE;
  }
  if (a->fit && !a->device_bytes) {
    fprintf(stderr, "fsdpctl: plan: --fit needs --device-memory BYTES (the memory of one GPU, e.g. 80GiB)\n");
    return PLAN_EXIT_USAGE;
  }
  return -1;
}

/* The job file into *SPEC, checked against the options (HOST: this machine's memory, 0 unknown).
 * Returns -1 to go on, else the exit status. */
static int load_spec(const plan_args *a, uint64_t host, jobspec_t *spec) {
  struct stat st;
  errno = 0;
  if (stat(a->job, &st) != 0 || !S_ISREG(st.st_mode) || access(a->job, R_OK) != 0) {
    fprintf(stderr, "fsdpctl: %s: cannot read the job file: %s\n", a->job,
            errno ? strerror(errno) : "not a regular file");
    return 1;   /* a bad job file is a failure (1), as for submit and run, not a usage error */
  }
  if (jobspec_load(a->job, spec) != FSDP_OK || tokmask_check_files("train", spec->train, spec->pack) != FSDP_OK ||
      tokmask_check_files("val", spec->val, spec->pack) != FSDP_OK) {   /* the message names the file as the user did */
    fprintf(stderr, "fsdpctl: %s\n", fsdp_last_error());
    return 1;
  }
  /* A plan is a prediction: a CUDA job is planned on a machine (a login node) whose build cannot
   * run it; said, not refused. */
  if (jobspec_check_build(spec) != FSDP_OK) fprintf(stderr, "fsdpctl: note: %s\n", fsdp_last_error());
  char warn[320];
  if (jobspec_lr_warning(spec, warn, sizeof warn)) ctl_warn("%s: %s", a->job, warn);
  /* on the CPU the device is the host: a device memory beyond the host's is a typo, not a plan */
  if (a->device_bytes && spec->device == DEVICE_CPU && host && a->device_bytes > host) {
    fprintf(stderr, "fsdpctl: plan: --device-memory %s is more than this machine's %.1f GiB; with device = cpu "
                    "the workers' memory is the host's: give at most that\n", a->mem_arg, (double)host / (1 << 30));
    return PLAN_EXIT_USAGE;
  }
  if (a->group && spec->sharding != SHARD_HYBRID) {
    fprintf(stderr, "fsdpctl: plan: --shard-group applies to sharding = hybrid; %s has sharding = %s\n", a->job,
            jobspec_shard_mode_name(spec->sharding));
    return PLAN_EXIT_USAGE;
  }
  if (a->group) spec->shard_group = a->group;
  if (spec->sharding == SHARD_HYBRID && !spec->shard_group) {
    fprintf(stderr, "fsdpctl: %s: sharding = hybrid leaves shard_group to the daemon's placement (the ranks per node); "
                    "give it here with --shard-group G\n", a->job);
    return PLAN_EXIT_USAGE;
  }
  return -1;
}

/* The model files (from or init) against the plan: every mismatch the workers' load would meet.
 * *NFILES: how many files hold the weights (0: random init). */
static fsdp_status check_model_files(const jobspec_t *spec, const plan_t *plan, int *nfiles) {
  *nfiles = 0;
  if (spec->lora.init_from[0]) TRY(peft_load(plan, spec->lora.init_from, NULL, "[lora] init_from"));   /* the adapters to continue from */
  if (!strcmp(spec->init, "random")) return FSDP_OK;
  st_model *sm = NULL;
  fsdp_status st = st_model_open(spec->init, &sm);
  if (st == FSDP_OK) st = st_model_check(sm, plan);
  if (sm) *nfiles = st_model_nfiles(sm);
  st_model_destroy(&sm);
  return st;
}

/* What a node's host memory holds (offload, the checkpoint snapshot), when the plan needs any. */
static void print_host(const plan_t *plan, uint64_t host) {
  if (!plan->host_bytes || !host) return;
  int ranks = (int)(host / plan->host_bytes);
  printf("\nHost memory (%s): %.2f GiB per rank; this machine's %.1f GiB holds %d rank%s' share%s\n",
         plan->host_bytes > plan->snapshot_bytes ? (plan->snapshot_bytes ? "offload = optimizer, checkpoint snapshot"
                                                                          : "offload = optimizer")
                                                 : "checkpoint snapshot",
         (double)plan->host_bytes / (1 << 30), (double)host / (1 << 30), ranks, ranks == 1 ? "" : "s",
         ranks < 1 ? " (none: it does not fit here)" : "");
}

/* Whether the plan fits the device and the host memory: 0 or PLAN_EXIT_NOFIT, with the reason on stderr. */
static int fit_status(const plan_args *a, const jobspec_t *spec, const plan_t *plan, uint64_t host) {
  if (a->device_bytes && plan->mem_total > a->device_bytes) {
    int w = plan_min_world(spec, a->device_bytes, 4096);
    if (w)
      fprintf(stderr, "fsdpctl: plan: %llu bytes per rank do not fit in %llu; the smallest world size that fits is %d\n",
              (unsigned long long)plan->mem_total, (unsigned long long)a->device_bytes, w);
    else
      fprintf(stderr, "fsdpctl: plan: %llu bytes per rank do not fit in %llu at any world size up to 4096\n",
              (unsigned long long)plan->mem_total, (unsigned long long)a->device_bytes);
    return PLAN_EXIT_NOFIT;
  }
  if (plan->snapshot_bytes && host && plan->host_bytes > host) {
    fprintf(stderr, "fsdpctl: plan: a rank needs %.2f GiB of host memory (%.2f GiB of it the checkpoint snapshot of "
                    "[checkpoint] async = true), more than this machine's %.1f GiB; set async = false or add ranks\n",
            (double)plan->host_bytes / (1 << 30), (double)plan->snapshot_bytes / (1 << 30), (double)host / (1 << 30));
    return PLAN_EXIT_NOFIT;
  }
  return 0;
}

int ctl_plan(int argc, char **argv) {
  plan_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0) return rc;
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  uint64_t host = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
  jobspec_t spec;
  if ((rc = load_spec(&a, host, &spec)) >= 0) return rc;
  plan_t *plan = NULL;
  jobresolve_place pl = {.world = a.world};   /* the coordinator's resolver, for the world asked for */
  if (jobresolve_place_job(&spec, &pl, &plan) != FSDP_OK) {
    fprintf(stderr, "fsdpctl: %s: %s\n", a.job, fsdp_last_error());
    return PLAN_EXIT_USAGE;
  }
  int nfiles = 0;
  plan_fit pf;
  if (check_model_files(&spec, plan, &nfiles) != FSDP_OK) {
    rc = 1;
  } else if (a.fit && plan_fit_compute(&spec, a.world, a.device_bytes, &pf) != FSDP_OK) {
    rc = PLAN_EXIT_USAGE;
  }
  if (rc >= 0) {
    fprintf(stderr, "fsdpctl: %s: %s\n", a.job, fsdp_last_error());
    plan_destroy(&plan);
    return rc;
  }
  rc = 0;
  if (a.json) {
    rc = write_json(plan, a.device_bytes, a.fit ? &pf : NULL);
  } else {
    printf("Job       %s (%s)\n", spec.name, a.job);
    if (nfiles)
      printf("Weights   %s%s: %d file%s, every tensor present with its shape\n", spec.from[0] ? "from " : "",
             spec.from[0] ? spec.from : spec.init, nfiles, nfiles == 1 ? "" : "s");
    if (spec.no_dropout)
      printf("Dropout   none: trained without dropout ([model] dropout = none)%s%s%s\n",
             spec.dropout_off[0] ? "; config.json's " : "", spec.dropout_off,
             spec.dropout_off[0] ? " is not applied" : "");
    ctl_plan_print(plan, stdout, a.device_bytes);
    if (a.fit) plan_fit_print(&pf, stdout);
    print_host(plan, host);
  }
  if (a.fit) {   /* --fit answers the question; the exit status says whether the job's own batch fits */
    if (!pf.batch_size) rc = PLAN_EXIT_NOFIT;
  } else if (!rc) {
    rc = fit_status(&a, &spec, plan, host);
  }
  plan_destroy(&plan);
  return rc;
}
