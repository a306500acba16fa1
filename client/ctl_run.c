/* ctl_run — `fsdpctl run JOB.ini`: one job on this machine with a private fsdpd, like torchrun
 * for fsdpd (docs/cli.md, "run"). It checks the job file, starts the daemon sized to the job
 * (ctl_daemon.h), submits, follows with the progress bar (ctl_follow.h), stops the daemon and
 * prints a summary from metrics.jsonl. Single-threaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"
#include "ctl_client.h"
#include "ctl_daemon.h"
#include "ctl_fmt.h"
#include "ctl_follow.h"
#include "fsutil.h"
#include "jobspec.h"
#include "log.h"
#include "logcfg.h"
#include "wire.h"

/* First and last loss and the number of step lines (with a loss) of metrics.jsonl. */
static int read_metrics(const char *path, int *lines, double *first, double *last) {
  *lines = 0;
  *first = *last = NAN;
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    json_error_t e;
    json_t *j = json_loads(line, 0, &e);
    if (!j) continue;
    json_t *loss = json_object_get(j, "loss");
    if (json_is_number(loss)) {   /* [eval] at_start's step 0 has none: neither counted nor first */
      if (*lines == 0) *first = json_number_value(loss);
      *last = json_number_value(loss);
      (*lines)++;
    }
    json_decref(j);
  }
  free(line);
  fclose(f);
  return 0;
}

static const char *const run_usage = "run JOB.ini [--state-dir DIR] [--keep] [--log-level LEVEL]";

/* The options of `fsdpctl run`: the job file, --state-dir, --log-level, --keep. Returns -1 to go on,
 * else the exit status (--help and usage errors end here). */
static int parse_args(int argc, char **argv, const char **path, const char **state_arg, const char **level_arg,
                      int *keep) {
  static const struct option opts[] = {
    {"state-dir", required_argument, 0, OPT_STATE_DIR}, {"keep", no_argument, 0, OPT_KEEP},
    {"log-level", required_argument, 0, OPT_LOG_LEVEL}, {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  *state_arg = *level_arg = NULL;
  *keep = 0;
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case OPT_STATE_DIR: *state_arg = optarg; break;
    case OPT_KEEP: *keep = 1; break;
    case OPT_LOG_LEVEL: {
      log_level lv;
      if (log_parse_level(optarg, &lv) != FSDP_OK)
        return ctl_usage_error(argv[0], run_usage, "--log-level takes debug, info, warn or error");
      *level_arg = optarg;
      break;
    }
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nRun one job on this machine with a private fsdpd: start the daemon (world_size CPU\n"
             "slots for device = cpu, every GPU for device = cuda), submit, follow with a progress bar,\n"
             "stop the daemon. Exit status: 0 succeeded, 1 failed, 130 cancelled or interrupted (Ctrl-C\n"
             "cancels the job).\n"
             "  --state-dir DIR   the daemon's state directory (kept); default: a temporary one, removed\n"
             "  --keep            keep the temporary state directory and print where it is\n"
             "  --log-level LEVEL the daemon's log level (debug, info, warn, error)\n", run_usage);
      return 0;
    default: return ctl_usage_error(argv[0], run_usage, "unknown option");
    }
  }
  if (optind != argc - 1) return ctl_usage_error(argv[0], run_usage, "which job file?");
  *path = argv[optind];
  return -1;
}

/* The state directory into STATE (PATH_MAX): STATE_ARG made and resolved, or a fresh temporary one
 * (*TEMP = 1). An ipc socket path must fit in sun_path (108 bytes). 0 ok, else the exit status. */
static int prepare_state(const char *state_arg, char *state, int *temp) {
  *temp = !state_arg;
  if (state_arg) {
    if (fsutil_mkdir_p(state_arg, 0700) != FSDP_OK)
      return ctl_fail("state directory: %s", fsdp_last_error());   /* names the path */
    if (!realpath(state_arg, state)) return ctl_fail("%s: %s", state_arg, strerror(errno));
  } else {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0] || strlen(tmp) > 60) tmp = "/tmp";
    snprintf(state, PATH_MAX, "%s/fsdpctl-run.XXXXXX", tmp);
    if (!mkdtemp(state)) return ctl_fail("cannot create a temporary state directory in %s: %s", tmp, strerror(errno));
  }
  if (strlen(state) + strlen("/cluster.sock") >= 100) {
    int rc = ctl_fail("state directory %s is too long for its ipc sockets (at most ~85 characters); pick a shorter "
                      "--state-dir", state);
    if (*temp) fsutil_remove_tree(state);
    return rc;
  }
  return 0;
}

/* The job's summary line from metrics.jsonl (one line per step) and where its files are. */
static void print_summary(uint64_t id, const ctl_follow_result *r, const char *state, int kept) {
  char mpath[PATH_MAX + 32];
  snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", r->job_dir);
  int lines;
  double first, last;
  char el[32], tps[32];
  if (r->job_dir[0] && read_metrics(mpath, &lines, &first, &last) == 0 && lines > 0)
    printf("job %llu (%s) %s: %d step%s in %s, loss %.4f -> %.4f, %s tok/s\n", (unsigned long long)id, r->name,
           ctl_fmt_state(r->state), lines, lines == 1 ? "" : "s", ctl_fmt_duration(r->elapsed_s, el, sizeof el), first,
           last, ctl_fmt_si(r->tokens_per_s, tps, sizeof tps));
  else
    printf("job %llu (%s) %s after %u of %u steps\n", (unsigned long long)id, r->name, ctl_fmt_state(r->state), r->step,
           r->steps);
  if (kept) printf("state kept in %s; metrics: %s\n", state, mpath);
  else if (r->job_dir[0]) printf("metrics and logs kept in %s (metrics.jsonl, job.log, worker-R.log)\n", r->job_dir);
  fflush(stdout);
}

/* A temporary state directory at the end: after a job ran, its directory (metrics.jsonl, job.log,
 * worker logs) stays and the daemon's database goes; otherwise all of it goes. */
static void clean_state(const char *state, int ran) {
  if (!ran) {
    fsutil_remove_tree(state);
    return;
  }
  static const char *const daemon_files[] = {"jobs.db", "jobs.db-wal", "jobs.db-shm", "fsdpd.lock", "fsdpd.log"};
  for (size_t i = 0; i < sizeof daemon_files / sizeof daemon_files[0]; i++) {
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/%s", state, daemon_files[i]);
    unlink(p);
  }
}

int ctl_run(int argc, char **argv) {
  const char *path = NULL, *state_arg = NULL, *level_arg = NULL;
  int keep = 0;
  int rc = parse_args(argc, argv, &path, &state_arg, &level_arg, &keep);
  if (rc >= 0) return rc;

  jobspec_t spec;
  char *text = NULL, abs[PATH_MAX], dir[PATH_MAX];
  if ((rc = ctl_load_job_file(path, &spec, &text, abs, sizeof abs, dir, sizeof dir))) return rc;
  if (spec.device == DEVICE_CUDA) {
    /* The daemon finds GPUs through the driver; without it there is nothing to start. */
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
      free(text);
      return ctl_fail("job asks for device = cuda with world_size %d but this machine has no CUDA devices", spec.world_size);
    }
    dlclose(h);
  }
  char fsdpd[PATH_MAX], state[PATH_MAX];
  int temp;
  if ((rc = ctl_daemon_find(fsdpd, sizeof fsdpd)) || (rc = prepare_state(state_arg, state, &temp))) {
    free(text);
    return rc;
  }
  char endpoint[1024];
  snprintf(endpoint, sizeof endpoint, "ipc://%.900s/ctl.sock", state);

  ctl_catch_interrupts();
  ctl_daemon d = {.janitor_fd = -1};
  ctl_client cl = {0};
  uint64_t id = 0;
  ctl_follow_result r;
  int started = 0, cite_log = 1, ran = 0;
  if ((rc = ctl_daemon_start(&d, fsdpd, state, &spec, level_arg))) goto out;
  started = 1;
  if (temp && !keep && (rc = ctl_daemon_janitor(&d, state))) goto out;
  if ((rc = ctl_daemon_ready(&d, &cl, endpoint, &spec, &cite_log))) goto out;
  cite_log = 0;   /* from here on, only a lost daemon (cl.lost) makes the logs worth keeping */
  if ((rc = ctl_client_submit(&cl, text, abs, dir, &id))) goto out;
  printf("job %llu (%s): %d x %s, %d steps\n", (unsigned long long)id, spec.name, spec.world_size,
         jobspec_device_kind_name(spec.device), spec.steps);
  fflush(stdout);
  if ((rc = ctl_follow_job(&cl, id, CTL_FOLLOW_CANCEL, &r))) goto out;
  int job_rc = r.state == FSDP__JOB_STATE__SUCCEEDED ? 0 : r.state == FSDP__JOB_STATE__CANCELLED ? EXIT_CANCELLED : 1;
  if (job_rc == 1 && temp) keep = 1;   /* the logs explain the failure: do not delete them */
  print_summary(id, &r, state, keep || !temp);
  ran = r.job_dir[0] != 0;
  rc = 0;
  if (job_rc != 0) {
    char extra[PATH_MAX + 32] = "";
    if (keep || !temp) snprintf(extra, sizeof extra, " (logs: %s)", r.job_dir[0] ? r.job_dir : state);
    rc = ctl_follow_exit_status(id, &r, extra);
  }

out:
  free(text);
  if (started) {
    ctl_daemon_stop(&d, &cl);
    if (rc == 0 && d.reaped && !(WIFEXITED(d.status) && WEXITSTATUS(d.status) == 0)) {
      char how[128];
      ctl_daemon_describe_exit(&d, how, sizeof how);
      fprintf(stderr, "fsdpctl: warning: fsdpd %s at shutdown (log: %s)\n", how, d.log);
      keep = 1;
    }
  }
  ctl_client_close(&cl);
  if (rc == 1 && temp && started && (cite_log || cl.lost)) keep = 1;   /* a message above names its log */
  if (temp && !keep) clean_state(state, ran);
  if (started) ctl_daemon_janitor_release(&d);
  return rc;
}
