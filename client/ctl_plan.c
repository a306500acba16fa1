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
#include "ctl_fmt.h"
#include "ctl_planout.h"
#include "jobspec.h"
#include "plan.h"
#include "planfit.h"
#include "st_model.h"

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

int ctl_plan(int argc, char **argv) {
  const char *job = NULL, *world_arg = NULL, *mem_arg = NULL, *group_arg = NULL;
  int json = 0, fit = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      plan_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--defaults")) {
      jobspec_write_defaults(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!strcmp(a, "--fit")) {
      fit = 1;
    } else if (!strcmp(a, "--world") || !strcmp(a, "--device-memory")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "fsdpctl: plan: %s needs a value (see fsdpctl plan --help)\n", a);
        return PLAN_EXIT_USAGE;
      }
      *(a[2] == 'w' ? &world_arg : &mem_arg) = argv[++i];
    } else if (!strcmp(a, "--shard-group")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "fsdpctl: plan: %s needs a value (see fsdpctl plan --help)\n", a);
        return PLAN_EXIT_USAGE;
      }
      group_arg = argv[++i];
    } else if (!strncmp(a, "--shard-group=", 14)) {
      group_arg = a + 14;
    } else if (!strncmp(a, "--world=", 8)) {
      world_arg = a + 8;
    } else if (!strncmp(a, "--device-memory=", 16)) {
      mem_arg = a + 16;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "fsdpctl: plan: unknown option '%s' (see fsdpctl plan --help)\n", a);
      return PLAN_EXIT_USAGE;
    } else if (job) {
      fprintf(stderr, "fsdpctl: plan: one job file only, got '%s' and '%s'\n", job, a);
      return PLAN_EXIT_USAGE;
    } else {
      job = a;
    }
  }
  if (!job) {
    fprintf(stderr, "fsdpctl: plan: no job file; usage: fsdpctl plan JOB.ini [--world N] "
                    "[--device-memory BYTES] [--json]\n");
    return PLAN_EXIT_USAGE;
  }
  int world = 0;
  if (world_arg) {
    char *end;
    errno = 0;
    long w = strtol(world_arg, &end, 10);
    if (errno || !*world_arg || *end || w < 1 || w > 4096) {
      fprintf(stderr, "fsdpctl: plan: --world '%s' is not allowed; allowed: an integer in 1..4096\n", world_arg);
      return PLAN_EXIT_USAGE;
    }
    world = (int)w;
  }
  int group = 0;
  if (group_arg) {
    char *end;
    errno = 0;
    long g = strtol(group_arg, &end, 10);
    if (errno || !*group_arg || *end || g < 1 || g > 4096) {
      fprintf(stderr, "fsdpctl: plan: --shard-group '%s' is not allowed; allowed: an integer in 1..4096\n", group_arg);
      return PLAN_EXIT_USAGE;
    }
    group = (int)g;
  }
  uint64_t device_bytes = 0;
  if (mem_arg && !(device_bytes = ctl_parse_bytes(mem_arg))) {
    fprintf(stderr, "fsdpctl: plan: --device-memory '%s' is not allowed; allowed: a positive integer with an "
                    "optional suffix K M G T, KiB MiB GiB TiB, KB MB GB TB (e.g. 80GiB)\n", mem_arg);
    return PLAN_EXIT_USAGE;
  }

  if (fit && !device_bytes) {
    fprintf(stderr, "fsdpctl: plan: --fit needs --device-memory BYTES (the memory of one GPU, e.g. 80GiB)\n");
    return PLAN_EXIT_USAGE;
  }

  struct stat st;
  errno = 0;
  if (stat(job, &st) != 0 || !S_ISREG(st.st_mode) || access(job, R_OK) != 0) {
    fprintf(stderr, "fsdpctl: %s: cannot read the job file: %s\n", job,
            errno ? strerror(errno) : "not a regular file");
    return 1;   /* a bad job file is a failure (1), as for submit and run, not a usage error */
  }
  jobspec_t spec;
  if (jobspec_load(job, &spec) != FSDP_OK) {   /* the message names the file as the user did */
    fprintf(stderr, "fsdpctl: %s\n", fsdp_last_error());
    return 1;
  }
  if (jobspec_check_build(&spec) != FSDP_OK) {
    fprintf(stderr, "fsdpctl: %s\n", fsdp_last_error());
    return 1;
  }
  char warn[320];
  if (jobspec_lr_warning(&spec, warn, sizeof warn)) fprintf(stderr, "fsdpctl: %s: %s\n", job, warn);
  /* on the CPU the device is the host: a device memory beyond the host's is a typo, not a plan */
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  uint64_t host = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
  if (device_bytes && spec.device == DEVICE_CPU && host && device_bytes > host) {
    fprintf(stderr, "fsdpctl: plan: --device-memory %s is more than this machine's %.1f GiB; with device = cpu "
                    "the workers' memory is the host's: give at most that\n", mem_arg, (double)host / (1 << 30));
    return PLAN_EXIT_USAGE;
  }
  if (group && spec.sharding != SHARD_HYBRID) {
    fprintf(stderr, "fsdpctl: plan: --shard-group applies to sharding = hybrid; %s has sharding = %s\n", job,
            jobspec_shard_mode_name(spec.sharding));
    return PLAN_EXIT_USAGE;
  }
  if (group) spec.shard_group = group;
  if (spec.sharding == SHARD_HYBRID && !spec.shard_group) {
    fprintf(stderr, "fsdpctl: %s: sharding = hybrid leaves shard_group to the daemon's placement (the ranks per node); "
                    "give it here with --shard-group G\n", job);
    return PLAN_EXIT_USAGE;
  }
  plan_t *plan = NULL;
  if (plan_build(&spec, world, &plan) != FSDP_OK) {
    fprintf(stderr, "fsdpctl: %s: %s\n", job, fsdp_last_error());
    return PLAN_EXIT_USAGE;
  }
  /* The model files (from or init) against the plan: every mismatch the workers' load would meet. */
  int nfiles = 0;
  if (strcmp(spec.init, "random")) {
    st_model *sm = NULL;
    fsdp_status st = st_model_open(spec.init, &sm);
    if (st == FSDP_OK) st = st_model_check(sm, plan);
    if (sm) nfiles = st_model_nfiles(sm);
    st_model_destroy(&sm);
    if (st != FSDP_OK) {
      fprintf(stderr, "fsdpctl: %s: %s\n", job, fsdp_last_error());
      plan_destroy(&plan);
      return 1;
    }
  }
  int rc = 0;
  plan_fit pf;
  if (fit && plan_fit_compute(&spec, world, device_bytes, &pf) != FSDP_OK) {
    fprintf(stderr, "fsdpctl: %s: %s\n", job, fsdp_last_error());
    plan_destroy(&plan);
    return PLAN_EXIT_USAGE;
  }
  if (json) {
    rc = write_json(plan, device_bytes, fit ? &pf : NULL);
  } else {
    printf("Job       %s (%s)\n", spec.name, job);
    if (nfiles)
      printf("Weights   %s%s: %d file%s, every tensor present with its shape\n", spec.from[0] ? "from " : "",
             spec.from[0] ? spec.from : spec.init, nfiles, nfiles == 1 ? "" : "s");
    ctl_plan_print(plan, stdout, device_bytes);
    if (fit) plan_fit_print(&pf, stdout);
  }
  if (!json && plan->host_bytes && host) {   /* offload, snapshot: the node's memory holds every local rank's share */
    int ranks = (int)(host / plan->host_bytes);
    printf("\nHost memory (%s): %.2f GiB per rank; this machine's %.1f GiB holds %d rank%s' share%s\n",
           plan->host_bytes > plan->snapshot_bytes ? (plan->snapshot_bytes ? "offload = optimizer, checkpoint snapshot"
                                                                            : "offload = optimizer")
                                                   : "checkpoint snapshot",
           (double)plan->host_bytes / (1 << 30), (double)host / (1 << 30), ranks, ranks == 1 ? "" : "s",
           ranks < 1 ? " (none: it does not fit here)" : "");
  }
  if (fit) {   /* --fit answers the question; the exit status says whether the job's own batch fits */
    if (!pf.batch_size) rc = PLAN_EXIT_NOFIT;
  } else if (!rc && device_bytes && plan->mem_total > device_bytes) {
    int w = plan_min_world(&spec, device_bytes, 4096);
    if (w)
      fprintf(stderr, "fsdpctl: plan: %llu bytes per rank do not fit in %llu; the smallest world size that fits is %d\n",
              (unsigned long long)plan->mem_total, (unsigned long long)device_bytes, w);
    else
      fprintf(stderr, "fsdpctl: plan: %llu bytes per rank do not fit in %llu at any world size up to 4096\n",
              (unsigned long long)plan->mem_total, (unsigned long long)device_bytes);
    rc = PLAN_EXIT_NOFIT;
  }
  if (!rc && !fit && plan->snapshot_bytes && host && plan->host_bytes > host) {
    fprintf(stderr, "fsdpctl: plan: a rank needs %.2f GiB of host memory (%.2f GiB of it the checkpoint snapshot of "
                    "[checkpoint] async = true), more than this machine's %.1f GiB; set async = false or add ranks\n",
            (double)plan->host_bytes / (1 << 30), (double)plan->snapshot_bytes / (1 << 30), (double)host / (1 << 30));
    rc = PLAN_EXIT_NOFIT;
  }
  plan_destroy(&plan);
  return rc;
}
