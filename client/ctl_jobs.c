/* ctl_jobs — the fsdpctl commands that talk to a running fsdpd: submit, status, jobs, logs, cancel,
 * stop, nodes and shutdown (docs/cli.md describes each for users). `run`, which starts a private
 * daemon, is ctl_run.c; how they talk to the daemon is ctl_client.h.
 *
 * Exit statuses: 0 success; 1 failure (a one-line "fsdpctl: ..." on stderr); 2 usage error;
 * 130 cancelled or interrupted. A followed job maps to 0 succeeded, 1 failed, 130 cancelled.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "ctl_client.h"
#include "ctl_fmt.h"
#include "ctl_follow.h"
#include "jobspec.h"
#include "wire.h"

#define LOG_CHUNK (256u << 10)      /* bytes per logs_req */

int ctl_submit(int argc, char **argv) {
  static const char *usage = "submit JOB.ini [--follow] [--ctl ENDPOINT]";
  static const struct option opts[] = {
    {"ctl", required_argument, 0, OPT_CTL}, {"follow", no_argument, 0, OPT_FOLLOW},
    {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  const char *ctl = NULL;
  int follow = 0, o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "f", opts, NULL)) != -1) {
    switch (o) {
    case OPT_CTL: ctl = optarg; break;
    case 'f':
    case OPT_FOLLOW: follow = 1; break;
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nSubmit a job to fsdpd and print its id (alone on the last line).\n"
             "  --follow       show progress until the job ends; exit 0 succeeded, 1 failed, 130 cancelled\n"
             "  --ctl ENDPOINT the daemon (default: $FSDP_CTL, else ipc://$XDG_STATE_HOME/fsdpd/ctl.sock)\n", usage);
      return 0;
    default: return ctl_usage_error(argv[0], usage, "unknown option");
    }
  }
  if (optind < argc - 1) return ctl_usage_error(argv[0], usage, "one job file only");
  const char *path = optind < argc ? argv[optind] : NULL;
  if (!path) return ctl_usage_error(argv[0], usage, "which job file?");

  jobspec_t spec;
  char *text = NULL, abs[PATH_MAX], dir[PATH_MAX];
  int rc = ctl_load_job_file(path, &spec, &text, abs, sizeof abs, dir, sizeof dir);
  if (rc) return rc;
  ctl_client cl;
  rc = ctl_client_open(&cl, ctl);
  if (rc) {
    free(text);
    return rc;
  }
  if (follow) ctl_catch_interrupts();
  uint64_t id = 0;
  rc = ctl_client_submit(&cl, text, abs, dir, &id);
  free(text);
  if (rc) goto out;
  printf("%llu\n", (unsigned long long)id);
  fflush(stdout);
  if (follow) {
    ctl_follow_result r;
    rc = ctl_follow_job(&cl, id, CTL_FOLLOW_DETACH, &r);
    if (rc == 0) rc = ctl_follow_exit_status(id, &r, NULL);
  }
out:
  ctl_client_close(&cl);
  return rc;
}


/* Parse the shared options plus none of their own; POS collects positionals (up to NPOS). */
static int parse_simple(int argc, char **argv, const char *usage, const char *help, ctl_common_opts *co, const char **pos,
                        int npos, int *got) {
  static const struct option opts[] = {
    {"ctl", required_argument, 0, OPT_CTL}, {"json", no_argument, 0, OPT_JSON},
    {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  memset(co, 0, sizeof *co);
  *got = 0;
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case OPT_CTL: co->ctl = optarg; break;
    case OPT_JSON: co->json = 1; break;
    case OPT_HELP: printf("usage: fsdpctl %s\n\n%s", usage, help); return -1;
    default: return ctl_usage_error(argv[0], usage, "unknown option");
    }
  }
  for (int i = optind; i < argc; i++) {
    if (*got >= npos) return ctl_usage_error(argv[0], usage, "too many arguments");
    pos[(*got)++] = argv[i];
  }
  return 0;
}

static const char ctl_common_help[] =
    "  --json         print JSON instead of a table\n"
    "  --ctl ENDPOINT the daemon (default: $FSDP_CTL, else ipc://$XDG_STATE_HOME/fsdpd/ctl.sock)\n";

static void print_status(const Fsdp__Msg *m, void *arg) {
  const ctl_common_opts *co = arg;
  if (co->json) ctl_fmt_print_json(ctl_fmt_job_json(m->status_resp), stdout);
  else ctl_fmt_job_human(m->status_resp, ctl_wall_now(), stdout);
}

static void print_jobs(const Fsdp__Msg *m, void *arg) {
  const ctl_common_opts *co = arg;
  const Fsdp__ListResp *l = m->list_resp;
  if (co->json) {
    json_t *arr = json_array();
    for (size_t i = 0; i < l->n_jobs; i++) json_array_append_new(arr, ctl_fmt_job_json(l->jobs[i]));
    json_t *o = json_object();
    json_object_set_new(o, "jobs", arr);
    ctl_fmt_print_json(o, stdout);
  } else if (l->n_jobs == 0) {
    printf("no jobs\n");
  } else {
    ctl_fmt_jobs_table(l->jobs, l->n_jobs, ctl_wall_now(), stdout);
  }
}

static void print_nodes(const Fsdp__Msg *m, void *arg) {
  const ctl_common_opts *co = arg;
  if (co->json) ctl_fmt_print_json(ctl_fmt_nodes_json(m->nodes_resp), stdout);
  else if (m->nodes_resp->n_nodes == 0) printf("no nodes (an agent registers within a few seconds of starting)\n");
  else ctl_fmt_nodes_table(m->nodes_resp, ctl_wall_now(), stdout);
}

/* A command that takes one job id and sends one JobQuery request (status, cancel, stop). */
static int job_query_command(int argc, char **argv, const char *usage, const char *help, Fsdp__Msg__BodyCase which,
                             Fsdp__Msg__BodyCase expect, void (*print)(const Fsdp__Msg *, void *)) {
  ctl_common_opts co;
  const char *pos[1];
  int n, rc = parse_simple(argc, argv, usage, help, &co, pos, 1, &n);
  if (rc) return rc < 0 ? 0 : rc;
  if (n != 1) return ctl_usage_error(argv[0], usage, "which job?");
  uint64_t id;
  if ((rc = ctl_parse_job_id(argv[0], usage, pos[0], &id))) return rc;
  Fsdp__Msg req = WIRE_MSG_INIT;
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  req.body_case = which;
  if (which == FSDP__MSG__BODY_STATUS_REQ) req.status_req = &q;
  else if (which == FSDP__MSG__BODY_STOP_REQ) req.stop_req = &q;
  else req.cancel_req = &q;
  rc = ctl_client_request(co.ctl, &req, expect, id, print, &co);
  if (rc == 0 && expect == FSDP__MSG__BODY_ACK)
    printf("%s job %llu\n", which == FSDP__MSG__BODY_STOP_REQ ? "stopping" : "cancelled", (unsigned long long)id);
  return rc;
}

/* status ID --rank R: the daemon adds R's figures to every step from its next grant on (at most a
 * few steps away); ask again until they come, for at most this long. */
#define RANK_WAIT_S 10.0

static int status_rank(const char *ctl, uint64_t id, int32_t rank, const ctl_common_opts *co) {
  ctl_client cl;
  int rc = ctl_client_open(&cl, ctl);
  if (rc) return rc;
  Fsdp__Msg req = WIRE_MSG_INIT, *m = NULL;
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  q.rank = rank + 1;
  req.body_case = FSDP__MSG__BODY_STATUS_REQ;
  req.status_req = &q;
  double until = ctl_wall_now() + RANK_WAIT_S;
  for (;;) {
    wire_destroy(&m);
    if ((rc = ctl_client_call(&cl, &req, FSDP__MSG__BODY_STATUS_RESP, id, 0, &m))) break;
    const Fsdp__JobInfo *ji = m->status_resp;
    int have = ji->last && ji->last->n_ranks == 1;
    if (have || ji->state != FSDP__JOB_STATE__RUNNING || ctl_wall_now() > until) break;
    struct timespec ts = {0, 200 * 1000 * 1000};   /* a step or two of a small job */
    nanosleep(&ts, NULL);
  }
  if (rc == 0) print_status(m, (void *)co);
  if (rc == 0 && !(m->status_resp->last && m->status_resp->last->n_ranks == 1))
    rc = ctl_fail("job %llu: no figures of rank %d yet (the job has not run a step since; try again)", (unsigned long long)id, rank);
  wire_destroy(&m);
  ctl_client_close(&cl);
  return rc;
}

int ctl_status(int argc, char **argv) {
  static const char *usage = "status ID [--rank R] [--json] [--ctl ENDPOINT]";
  static const struct option opts[] = {
    {"ctl", required_argument, 0, OPT_CTL}, {"json", no_argument, 0, OPT_JSON}, {"rank", required_argument, 0, OPT_RANK},
    {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  ctl_common_opts co;
  memset(&co, 0, sizeof co);
  long rank = -1;
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    char *end;
    switch (o) {
    case OPT_CTL: co.ctl = optarg; break;
    case OPT_JSON: co.json = 1; break;
    case OPT_RANK:
      rank = strtol(optarg, &end, 10);
      if (end == optarg || *end || rank < 0 || rank > 65535) return ctl_usage_error(argv[0], usage, "--rank: a rank 0..65535");
      break;
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nA job's state, progress, loss and throughput; the last step's peak memory by\n"
             "category, time per phase and bytes sent per collective, per rank up to %d ranks, else as\n"
             "min / median / max over the ranks with the rank holding each extreme.\n"
             "  --rank R       rank R's own figures of its latest step\n%s", usage, CTL_FMT_RANKS_MAX, ctl_common_help);
      return 0;
    default: return ctl_usage_error(argv[0], usage, "unknown option");
    }
  }
  if (optind != argc - 1) return ctl_usage_error(argv[0], usage, optind < argc ? "one job only" : "which job?");
  uint64_t id;
  int rc = ctl_parse_job_id(argv[0], usage, argv[optind], &id);
  if (rc) return rc;
  if (rank >= 0) return status_rank(co.ctl, id, (int32_t)rank, &co);
  Fsdp__Msg req = WIRE_MSG_INIT;
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  req.body_case = FSDP__MSG__BODY_STATUS_REQ;
  req.status_req = &q;
  return ctl_client_request(co.ctl, &req, FSDP__MSG__BODY_STATUS_RESP, id, print_status, &co);
}

int ctl_jobs(int argc, char **argv) {
  static const char *usage = "jobs [--limit N] [--json] [--ctl ENDPOINT]";
  static const struct option opts[] = {
    {"ctl", required_argument, 0, OPT_CTL}, {"json", no_argument, 0, OPT_JSON},
    {"limit", required_argument, 0, OPT_LIMIT}, {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  ctl_common_opts co = {0};
  long limit = 0;
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case OPT_CTL: co.ctl = optarg; break;
    case OPT_JSON: co.json = 1; break;
    case OPT_LIMIT: {
      char *end;
      limit = strtol(optarg, &end, 10);
      if (*end || end == optarg || limit < 0 || limit > 100000)
        return ctl_usage_error(argv[0], usage, "--limit takes a number of jobs, 0..100000 (0: the daemon's default)");
      break;
    }
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nThe jobs fsdpd knows (newest first): id, name, state, step, loss, tokens/s, age.\n"
             "  --limit N      at most N jobs (0: the daemon's default)\n%s", usage, ctl_common_help);
      return 0;
    default: return ctl_usage_error(argv[0], usage, "unknown option");
    }
  }
  if (optind < argc) return ctl_usage_error(argv[0], usage, "jobs takes no arguments");
  Fsdp__Msg req = WIRE_MSG_INIT;
  Fsdp__ListReq lr = FSDP__LIST_REQ__INIT;
  lr.limit = (uint32_t)limit;
  req.body_case = FSDP__MSG__BODY_LIST_REQ;
  req.list_req = &lr;
  return ctl_client_request(co.ctl, &req, FSDP__MSG__BODY_LIST_RESP, 0, print_jobs, &co);
}

int ctl_nodes(int argc, char **argv) {
  static const char *usage = "nodes [--json] [--ctl ENDPOINT]";
  char help[1024];
  snprintf(help, sizeof help, "The nodes of the cluster, their devices (CPU slots and GPUs) and which job holds each.\n%s",
           ctl_common_help);
  ctl_common_opts co;
  const char *pos[1];
  int n, rc = parse_simple(argc, argv, usage, help, &co, pos, 0, &n);
  if (rc) return rc < 0 ? 0 : rc;
  Fsdp__Msg req = WIRE_MSG_INIT;
  Fsdp__NodesReq nr = FSDP__NODES_REQ__INIT;
  req.body_case = FSDP__MSG__BODY_NODES_REQ;
  req.nodes_req = &nr;
  return ctl_client_request(co.ctl, &req, FSDP__MSG__BODY_NODES_RESP, 0, print_nodes, &co);
}

#define CTL_HELP "  --ctl ENDPOINT the daemon (default: $FSDP_CTL, else ipc://$XDG_STATE_HOME/fsdpd/ctl.sock)\n"

int ctl_cancel(int argc, char **argv) {
  return job_query_command(argc, argv, "cancel ID [--ctl ENDPOINT]",
                           "Cancel a queued or running job: its workers are killed and its devices freed.\n" CTL_HELP,
                           FSDP__MSG__BODY_CANCEL_REQ, FSDP__MSG__BODY_ACK, NULL);
}

int ctl_stop(int argc, char **argv) {
  return job_query_command(argc, argv, "stop ID [--ctl ENDPOINT]",
                           "Stop a job: a running job that makes checkpoints saves one first (at most two more steps),\n"
                           "then it ends cancelled; any other job is cancelled at once.\n" CTL_HELP,
                           FSDP__MSG__BODY_STOP_REQ, FSDP__MSG__BODY_ACK, NULL);
}

int ctl_shutdown(int argc, char **argv) {
  static const char *usage = "shutdown [--ctl ENDPOINT]";
  ctl_common_opts co;
  const char *pos[1];
  int n, rc = parse_simple(argc, argv, usage,
                           "Stop fsdpd as SIGTERM does: it accepts no more jobs, cancels the running ones, reaps their\n"
                           "workers and exits; for an ipc:// endpoint, wait (at most 30 s) until it has.\n" CTL_HELP,
                           &co, pos, 0, &n);
  if (rc) return rc < 0 ? 0 : rc;
  ctl_client cl;
  if ((rc = ctl_client_open(&cl, co.ctl))) return rc;
  Fsdp__Msg req = WIRE_MSG_INIT, *m = NULL;
  Fsdp__ShutdownReq sr = FSDP__SHUTDOWN_REQ__INIT;
  req.body_case = FSDP__MSG__BODY_SHUTDOWN_REQ;
  req.shutdown_req = &sr;
  char ep[sizeof cl.endpoint];
  snprintf(ep, sizeof ep, "%s", cl.endpoint);
  int ipc = !strncmp(ep, "ipc://", 6);
  /* An ipc daemon that is gone has shut down, even if its ack was lost on the way out: for ipc the
   * socket file's removal (the daemon's last act) is the answer that counts. */
  fsdp_status crc = ctl_conn_call(cl.conn, &req, ipc ? 5000 : 0, &m);
  if (crc == FSDP_OK && m->body_case == FSDP__MSG__BODY_ACK) rc = 0;
  else if ((crc == FSDP_ERR_TIMEOUT || crc == FSDP_ERR_COMM) && ipc) rc = 0;   /* the wait below decides */
  else if (crc == FSDP_OK) rc = ctl_fail("fsdpd at %s answered %s to a shutdown request: %s", ep, wire_body_name(m->body_case),
                                         m->body_case == FSDP__MSG__BODY_ERROR ? m->error->message : "");
  else if (crc == FSDP_ERR_CANCELLED) rc = EXIT_CANCELLED;
  else {
    char msg[1400];
    ctl_describe_failure(ep, crc, msg, sizeof msg);
    rc = ctl_fail("%s", msg);
  }
  wire_destroy(&m);
  ctl_client_close(&cl);
  if (rc) return rc;
  /* The daemon removes its ipc socket last thing before it exits: wait for that. */
  if (!strncmp(ep, "ipc://", 6)) {
    double deadline = ctl_mono_ms() + 30000;
    while (access(ep + 6, F_OK) == 0) {
      if (ctl_mono_ms() > deadline) return ctl_fail("fsdpd at %s acknowledged the shutdown but is still up after 30 s", ep);
      ctl_pause_ms(50);
    }
    printf("fsdpd at %s has shut down\n", ep);
  } else {
    printf("fsdpd at %s is shutting down\n", ep);
  }
  return 0;
}

int ctl_logs(int argc, char **argv) {
  static const char *usage = "logs ID [--rank R | --events] [--follow] [--ctl ENDPOINT]";
  static const struct option opts[] = {
    {"ctl", required_argument, 0, OPT_CTL}, {"follow", no_argument, 0, OPT_FOLLOW},
    {"events", no_argument, 0, OPT_EVENTS},
    {"rank", required_argument, 0, OPT_RANK}, {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  const char *ctl = NULL;
  int follow = 0, o;
  long rank = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "f", opts, NULL)) != -1) {
    switch (o) {
    case OPT_CTL: ctl = optarg; break;
    case 'f':
    case OPT_FOLLOW: follow = 1; break;
    case OPT_EVENTS: rank = -1; break;   /* the daemon's job.log */
    case OPT_RANK: {
      char *end;
      rank = strtol(optarg, &end, 10);
      if (*end || end == optarg || rank < 0 || rank > 65535)
        return ctl_usage_error(argv[0], usage, "--rank takes a rank number, 0..world_size-1");
      break;
    }
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nPrint a worker's log (stdout and stderr of rank R, default 0).\n"
             "  --rank R       the worker of rank R\n"
             "  --events       the daemon's record of the job instead (queueing, placement, state changes)\n"
             "  --follow       keep printing as the log grows, until the job ends\n"
             "  --ctl ENDPOINT the daemon (default: $FSDP_CTL, else ipc://$XDG_STATE_HOME/fsdpd/ctl.sock)\n", usage);
      return 0;
    default: return ctl_usage_error(argv[0], usage, "unknown option");
    }
  }
  if (optind != argc - 1) return ctl_usage_error(argv[0], usage, "which job?");
  uint64_t id;
  int rc;
  if ((rc = ctl_parse_job_id(argv[0], usage, argv[optind], &id))) return rc;
  ctl_client cl;
  if ((rc = ctl_client_open(&cl, ctl))) return rc;
  if (follow) ctl_catch_interrupts();
  uint64_t offset = 0;
  for (;;) {
    if (ctl_interrupts) {
      rc = EXIT_CANCELLED;
      break;
    }
    Fsdp__Msg req = WIRE_MSG_INIT, *m = NULL;
    Fsdp__LogsReq lr = FSDP__LOGS_REQ__INIT;
    lr.job_id = id;
    lr.rank = (int32_t)rank;
    lr.offset = offset;
    lr.max_bytes = LOG_CHUNK;
    req.body_case = FSDP__MSG__BODY_LOGS_REQ;
    req.logs_req = &lr;
    rc = ctl_client_call(&cl, &req, FSDP__MSG__BODY_LOGS_RESP, id, 0, &m);
    if (rc) {
      if (rc == EXIT_CANCELLED && ctl_interrupts) continue;
      break;
    }
    const Fsdp__LogsResp *r = m->logs_resp;
    size_t len = r->data.len;
    int done = r->job_done;
    if (len) {
      if (fwrite(r->data.data, 1, len, stdout) != len) {
        wire_destroy(&m);
        rc = 1;
        break;
      }
      fflush(stdout);
    }
    if (r->next_offset < offset + len) {
      wire_destroy(&m);
      rc = ctl_fail("fsdpd returned log offset %llu after %llu", (unsigned long long)r->next_offset,
                (unsigned long long)(offset + len));
      break;
    }
    offset = r->next_offset;
    wire_destroy(&m);
    if (len) continue;   /* more may be waiting */
    if (!follow || done) break;
    ctl_pause_ms(POLL_MS);
  }
  ctl_client_close(&cl);
  return rc;
}
