/* ctl_jobs — the fsdpctl commands that talk to fsdpd: submit, status, jobs, logs, cancel, nodes,
 * and run (a private daemon for one job). docs/cli.md describes each for users.
 *
 * Exit statuses: 0 success; 1 failure (a one-line "fsdpctl: ..." on stderr); 2 usage error;
 * 130 cancelled or interrupted. A followed job maps to 0 succeeded, 1 failed, 130 cancelled.
 * Single-threaded; SIGINT/SIGTERM only set a flag that the waits notice (zmq_poll returns EINTR).
 */
#define _GNU_SOURCE   /* nftw, strsignal, dprintf */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ctl.h"
#include "ctl_conn.h"
#include "ctl_fmt.h"
#include "jobspec.h"
#include "log.h"
#include "wire.h"

#define EXIT_USAGE 2
#define EXIT_CANCELLED 130
#define POLL_MS 500                 /* status polling while following (display only) */
#define LOG_CHUNK (256u << 10)      /* bytes per logs_req */
#define DAEMON_READY_MS 10000       /* a private daemon must answer nodes_req within this */
#define DAEMON_EXIT_MS 15000        /* ... and exit within this after shutdown_req */
#define CANCEL_WAIT_MS 20000        /* after Ctrl-C in run: how long the job may take to stop */

/* ---------------------------------------------------------------- small helpers */

static volatile sig_atomic_t g_interrupts;

static void on_signal(int sig) {
  (void)sig;
  g_interrupts++;
}

static void catch_interrupts(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;   /* no SA_RESTART: blocking waits return EINTR and see the flag */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* One line: a multi-line message from elsewhere is folded. */
  for (char *p = msg; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
  fflush(stdout);
  fprintf(stderr, "fsdpctl: %s\n", msg);
  return 1;
}

static int usage_error(const char *cmd, const char *usage, const char *what) {
  fflush(stdout);
  if (what) fprintf(stderr, "fsdpctl %s: %s\n", cmd, what);
  fprintf(stderr, "usage: fsdpctl %s\n", usage);
  return EXIT_USAGE;
}

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Wait MS milliseconds for nothing in particular (display polling); a signal ends it early. */
static void pause_ms(int ms) { zmq_poll(NULL, 0, ms); }

static int parse_job_id(const char *cmd, const char *usage, const char *s, uint64_t *id) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || v == 0 || s[0] == '-') {
    char what[256];
    snprintf(what, sizeof what, "'%s' is not a job id (a positive integer, as printed by submit)", s);
    return usage_error(cmd, usage, what);
  }
  *id = v;
  return 0;
}

/* Options every daemon command shares. */
typedef struct common_opts {
  const char *ctl;
  int json;
} common_opts;

enum {
  OPT_CTL = 1000, OPT_JSON, OPT_HELP, OPT_FOLLOW, OPT_RANK, OPT_EVENTS, OPT_LIMIT, OPT_STATE_DIR, OPT_KEEP,
  OPT_LOG_LEVEL
};

/* ---------------------------------------------------------------- talking to the daemon */

typedef struct client {
  char endpoint[1024];
  ctl_conn *conn;
  const char *daemon_log;   /* run: the private daemon's log, named when the daemon is lost */
  int lost;                 /* run: the private daemon went away during a call */
} client;

static int client_open(client *cl, const char *flag) {
  memset(cl, 0, sizeof *cl);
  fsdp_status rc = ctl_endpoint_resolve(flag, cl->endpoint, sizeof cl->endpoint);
  if (rc != FSDP_OK) return fail("%s", ctl_fmt_user_error(fsdp_last_error()));
  rc = ctl_conn_open(cl->endpoint, &cl->conn);
  if (rc != FSDP_OK) {
    char msg[1400];
    ctl_describe_failure(cl->endpoint, rc, msg, sizeof msg);
    return fail("%s", msg);
  }
  return 0;
}

static void client_close(client *cl) { ctl_conn_destroy(&cl->conn); }

/* One request; on success *reply has body EXPECT. Prints the one-line reason and returns the
 * exit status otherwise (1, or 130 when interrupted). JOB_ID (or 0) names the job in "no job N". */
static int client_call(client *cl, Fsdp__Msg *req, Fsdp__Msg__BodyCase expect, uint64_t job_id, int timeout_ms,
                       Fsdp__Msg **reply) {
  *reply = NULL;
  Fsdp__Msg *m = NULL;
  fsdp_status rc = ctl_conn_call(cl->conn, req, timeout_ms, &m);
  if (rc == FSDP_ERR_CANCELLED) return EXIT_CANCELLED;   /* a Ctrl-C: the caller says what it does about it */
  if (rc != FSDP_OK) {
    char msg[1400];
    if (rc == FSDP_ERR_COMM && cl->daemon_log) {
      cl->lost = 1;
      snprintf(msg, sizeof msg, "lost the private fsdpd: %s (log: %s)", ctl_fmt_user_error(fsdp_last_error()),
               cl->daemon_log);
    } else {
      ctl_describe_failure(cl->endpoint, rc, msg, sizeof msg);
    }
    fail("%s", msg);
    return 1;
  }
  if (m->body_case == FSDP__MSG__BODY_ERROR) {
    if (m->error->code == FSDP_ERR_NOTFOUND && job_id)
      fail("no job %llu", (unsigned long long)job_id);
    else
      fail("%s", m->error->message && m->error->message[0] ? ctl_fmt_user_error(m->error->message)
                                                            : fsdp_strerror((fsdp_status)m->error->code));
    wire_free(&m);
    return 1;
  }
  if (m->body_case != expect) {
    fail("fsdpd at %s answered %s to a %s (is it the same version as fsdpctl?)", cl->endpoint,
         wire_body_name(m->body_case), wire_body_name(req->body_case));
    wire_free(&m);
    return 1;
  }
  *reply = m;
  return 0;
}

static int get_status(client *cl, uint64_t id, Fsdp__Msg **reply) {
  Fsdp__Msg req = WIRE_MSG_INIT;
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  req.body_case = FSDP__MSG__BODY_STATUS_REQ;
  req.status_req = &q;
  return client_call(cl, &req, FSDP__MSG__BODY_STATUS_RESP, id, 0, reply);
}

static int send_cancel(client *cl, uint64_t id) {
  Fsdp__Msg req = WIRE_MSG_INIT, *reply = NULL;
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  req.body_case = FSDP__MSG__BODY_CANCEL_REQ;
  req.cancel_req = &q;
  int rc = client_call(cl, &req, FSDP__MSG__BODY_ACK, id, 0, &reply);
  wire_free(&reply);
  return rc;
}

/* ---------------------------------------------------------------- following a job */

typedef enum { FOLLOW_DETACH, FOLLOW_CANCEL } follow_mode;

typedef struct follow_result {
  Fsdp__JobState state;
  double first_loss;    /* loss at the first step seen, NaN if none */
  double last_loss;
  unsigned step, steps;
  double tokens_per_s;
  double elapsed_s;     /* started_at → finished_at */
  char reason[1024];
  char job_dir[1024];
  char name[64];
} follow_result;

typedef struct progress {
  int tty;
  double t0_ms;           /* first observation while running, for the ETA */
  unsigned step0;
  int last_decile;        /* non-tty: printed up to this tenth */
  double last_print_ms;
  unsigned last_printed_step;
  Fsdp__JobState last_state;
  int drew;               /* tty: a line is on screen without its newline */
} progress;

static void progress_show(progress *p, const Fsdp__JobInfo *j, int final) {
  double now = mono_ms();
  if (j->state == FSDP__JOB_STATE__RUNNING && p->t0_ms == 0) {
    p->t0_ms = now;
    p->step0 = j->step;
  }
  double eta = -1;
  if (p->t0_ms > 0 && j->step > p->step0 && now > p->t0_ms) {
    double rate = (double)(j->step - p->step0) / ((now - p->t0_ms) / 1e3);   /* steps/s seen here */
    eta = (double)(j->steps - j->step) / rate;
  } else if (j->step > 0 && j->started_at > 0) {
    double el = wall_now() - j->started_at;   /* the daemon's clock: only until we have our own rate */
    if (el > 0) eta = el * (double)(j->steps - j->step) / (double)j->step;
  }
  if (j->state != FSDP__JOB_STATE__RUNNING) eta = NAN;   /* not started, or ended: no ETA */
  char line[512];
  ctl_fmt_progress(line, sizeof line, j->step, j->steps, j->step ? j->loss : 0, j->tokens_per_s, eta, p->tty ? 30 : 20);
  if (j->state != FSDP__JOB_STATE__RUNNING) {
    size_t l = strlen(line);
    snprintf(line + l, sizeof line - l, "  (%s)", ctl_fmt_state(j->state));
  }
  if (p->tty) {
    printf("\r%s\033[K", line);
    if (final) printf("\n");
    p->drew = !final;
    fflush(stdout);
    return;
  }
  /* Not a terminal: a line per tenth of the run, per 5 s of progress, and per state change. */
  int decile = j->steps ? (int)(10ull * j->step / j->steps) : 0;
  int print = final || j->state != p->last_state || decile > p->last_decile ||
              (now - p->last_print_ms >= 5000 && j->step != p->last_printed_step);
  if (print) {
    printf("%s\n", line);
    fflush(stdout);
    p->last_decile = decile;
    p->last_print_ms = now;
    p->last_printed_step = j->step;
    p->last_state = j->state;
  }
}

static void progress_break(progress *p) {
  if (p->tty && p->drew) {
    printf("\n");
    fflush(stdout);
    p->drew = 0;
  }
}

/* Poll job ID until it ends. Returns 0 with *res filled when the job reached a final state, else
 * the exit status (the reason printed). DETACH: a Ctrl-C stops following (130). CANCEL: a Ctrl-C
 * cancels the job and keeps following until it stops (a second Ctrl-C, or CANCEL_WAIT_MS, gives up). */
static int follow_job(client *cl, uint64_t id, follow_mode mode, follow_result *res) {
  memset(res, 0, sizeof *res);
  res->first_loss = NAN;
  res->last_loss = NAN;
  progress p = {0};
  p.tty = isatty(STDOUT_FILENO);
  p.last_decile = -1;
  p.last_state = FSDP__JOB_STATE__JOB_STATE_UNSPECIFIED;
  int cancel_sent = 0;
  double cancel_deadline = 0;
  for (;;) {
    if (g_interrupts) {
      progress_break(&p);
      if (mode == FOLLOW_DETACH) {
        fail("stopped following job %llu; it keeps running (`fsdpctl cancel %llu` stops it)", (unsigned long long)id,
             (unsigned long long)id);
        return EXIT_CANCELLED;
      }
      if (!cancel_sent) {
        g_interrupts = 0;
        fprintf(stderr, "fsdpctl: cancelling job %llu (Ctrl-C again to stop waiting)\n", (unsigned long long)id);
        send_cancel(cl, id);   /* if it fails (the job just ended), following shows how it ended */
        cancel_sent = 1;
        cancel_deadline = mono_ms() + CANCEL_WAIT_MS;
      } else {
        fail("gave up waiting for job %llu to stop", (unsigned long long)id);
        return EXIT_CANCELLED;
      }
    }
    if (cancel_sent && mono_ms() > cancel_deadline) {
      progress_break(&p);
      fail("job %llu did not stop within %d s of being cancelled", (unsigned long long)id, CANCEL_WAIT_MS / 1000);
      return EXIT_CANCELLED;
    }
    Fsdp__Msg *m = NULL;
    int rc = get_status(cl, id, &m);
    if (rc == EXIT_CANCELLED && g_interrupts) continue;   /* the Ctrl-C interrupted the call: handle it above */
    if (rc != 0) {
      progress_break(&p);
      return rc;
    }
    const Fsdp__JobInfo *j = m->status_resp;
    if (j->step > 0 && isnan(res->first_loss)) res->first_loss = j->loss;
    int final = ctl_fmt_state_is_final(j->state);
    progress_show(&p, j, final);
    if (final) {
      res->state = j->state;
      res->step = j->step;
      res->steps = j->steps;
      res->last_loss = j->step ? j->loss : NAN;
      res->tokens_per_s = j->tokens_per_s;
      res->elapsed_s = j->started_at > 0 && j->finished_at > j->started_at ? j->finished_at - j->started_at : -1;
      snprintf(res->reason, sizeof res->reason, "%s", j->reason ? j->reason : "");
      snprintf(res->job_dir, sizeof res->job_dir, "%s", j->job_dir ? j->job_dir : "");
      snprintf(res->name, sizeof res->name, "%s", j->name ? j->name : "");
      wire_free(&m);
      return 0;
    }
    wire_free(&m);
    pause_ms(POLL_MS);
  }
}

/* The exit status of a followed job, with its one line on stderr when it did not succeed. */
static int job_exit_status(uint64_t id, const follow_result *r, const char *extra) {
  switch (r->state) {
  case FSDP__JOB_STATE__SUCCEEDED: return 0;
  case FSDP__JOB_STATE__CANCELLED:
    fail("job %llu was cancelled%s%s%s", (unsigned long long)id, r->reason[0] ? ": " : "", r->reason, extra ? extra : "");
    return EXIT_CANCELLED;
  default:
    fail("job %llu failed: %s%s", (unsigned long long)id, r->reason[0] ? r->reason : "no reason given", extra ? extra : "");
    return 1;
  }
}

/* ---------------------------------------------------------------- submit */

/* Load and check the job file locally, then read its text, absolute path and directory. */
static int load_job_file(const char *path, jobspec_t *spec, char **text, char *abs, size_t absn, char *dir, size_t dirn) {
  *text = NULL;
  fsdp_status rc = jobspec_load(path, spec);
  if (rc != FSDP_OK) return fail("%s", ctl_fmt_user_error(fsdp_last_error()));
  char rp[PATH_MAX];
  if (!realpath(path, rp)) return fail("%s: %s", path, strerror(errno));
  FILE *f = fopen(rp, "rb");
  if (!f) return fail("cannot open %s: %s", rp, strerror(errno));
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) {
      fclose(f);
      return fail("out of memory reading %s", rp);
    }
    size_t got = fread(buf + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0) break;
    if (len + 1 == cap) {
      if (cap > WIRE_MAX_STRING) {
        free(buf);
        fclose(f);
        return fail("%s is larger than %u bytes; a job file is a short INI text", rp, WIRE_MAX_STRING);
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) free(buf);
      buf = nb;
      cap *= 2;
    }
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    free(buf);
    return fail("cannot read %s", rp);
  }
  buf[len] = '\0';
  snprintf(abs, absn, "%s", rp);
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", rp);
  snprintf(dir, dirn, "%s", dirname(tmp));
  *text = buf;
  return 0;
}

static int submit_text(client *cl, char *text, char *abs, char *dir, uint64_t *id) {
  Fsdp__Msg req = WIRE_MSG_INIT, *reply = NULL;
  Fsdp__SubmitReq s = FSDP__SUBMIT_REQ__INIT;
  s.spec_text = text;
  s.spec_path = abs;
  s.base_dir = dir;
  req.body_case = FSDP__MSG__BODY_SUBMIT_REQ;
  req.submit_req = &s;
  int rc = client_call(cl, &req, FSDP__MSG__BODY_SUBMIT_RESP, 0, 0, &reply);
  if (rc) return rc;
  *id = reply->submit_resp->job_id;
  wire_free(&reply);
  if (*id == 0) return fail("fsdpd at %s returned job id 0", cl->endpoint);
  return 0;
}

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
    default: return usage_error(argv[0], usage, "unknown option");
    }
  }
  if (optind < argc - 1) return usage_error(argv[0], usage, "one job file only");
  const char *path = optind < argc ? argv[optind] : NULL;
  if (!path) return usage_error(argv[0], usage, "which job file?");

  jobspec_t spec;
  char *text = NULL, abs[PATH_MAX], dir[PATH_MAX];
  int rc = load_job_file(path, &spec, &text, abs, sizeof abs, dir, sizeof dir);
  if (rc) return rc;
  client cl;
  rc = client_open(&cl, ctl);
  if (rc) {
    free(text);
    return rc;
  }
  if (follow) catch_interrupts();
  uint64_t id = 0;
  rc = submit_text(&cl, text, abs, dir, &id);
  free(text);
  if (rc) goto out;
  printf("%llu\n", (unsigned long long)id);
  fflush(stdout);
  if (follow) {
    follow_result r;
    rc = follow_job(&cl, id, FOLLOW_DETACH, &r);
    if (rc == 0) rc = job_exit_status(id, &r, NULL);
  }
out:
  client_close(&cl);
  return rc;
}

/* ---------------------------------------------------------------- status, jobs, nodes, cancel, logs */

/* Parse the shared options plus none of their own; POS collects positionals (up to NPOS). */
static int parse_simple(int argc, char **argv, const char *usage, const char *help, common_opts *co, const char **pos,
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
    default: return usage_error(argv[0], usage, "unknown option");
    }
  }
  for (int i = optind; i < argc; i++) {
    if (*got >= npos) return usage_error(argv[0], usage, "too many arguments");
    pos[(*got)++] = argv[i];
  }
  return 0;
}

static const char common_help[] =
    "  --json         print JSON instead of a table\n"
    "  --ctl ENDPOINT the daemon (default: $FSDP_CTL, else ipc://$XDG_STATE_HOME/fsdpd/ctl.sock)\n";

int ctl_status(int argc, char **argv) {
  static const char *usage = "status ID [--json] [--ctl ENDPOINT]";
  char help[1024];
  snprintf(help, sizeof help, "A job's state, progress, loss, throughput, per-rank peak memory by category,\n"
                              "time per phase and bytes sent per collective (last step).\n%s", common_help);
  common_opts co;
  const char *pos[1];
  int n, rc = parse_simple(argc, argv, usage, help, &co, pos, 1, &n);
  if (rc) return rc < 0 ? 0 : rc;
  if (n != 1) return usage_error(argv[0], usage, "which job?");
  uint64_t id;
  if ((rc = parse_job_id(argv[0], usage, pos[0], &id))) return rc;
  client cl;
  if ((rc = client_open(&cl, co.ctl))) return rc;
  Fsdp__Msg *m = NULL;
  rc = get_status(&cl, id, &m);
  if (rc == 0) {
    if (co.json)
      ctl_fmt_print_json(ctl_fmt_job_json(m->status_resp), stdout);
    else
      ctl_fmt_job_human(m->status_resp, wall_now(), stdout);
  }
  wire_free(&m);
  client_close(&cl);
  return rc;
}

int ctl_jobs(int argc, char **argv) {
  static const char *usage = "jobs [--limit N] [--json] [--ctl ENDPOINT]";
  static const struct option opts[] = {
    {"ctl", required_argument, 0, OPT_CTL}, {"json", no_argument, 0, OPT_JSON},
    {"limit", required_argument, 0, OPT_LIMIT}, {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  common_opts co = {0};
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
        return usage_error(argv[0], usage, "--limit takes a number of jobs, 0..100000 (0: the daemon's default)");
      break;
    }
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nThe jobs fsdpd knows (newest first): id, name, state, step, loss, tokens/s, age.\n"
             "  --limit N      at most N jobs (0: the daemon's default)\n%s", usage, common_help);
      return 0;
    default: return usage_error(argv[0], usage, "unknown option");
    }
  }
  if (optind < argc) return usage_error(argv[0], usage, "jobs takes no arguments");
  client cl;
  int rc = client_open(&cl, co.ctl);
  if (rc) return rc;
  Fsdp__Msg req = WIRE_MSG_INIT, *m = NULL;
  Fsdp__ListReq lr = FSDP__LIST_REQ__INIT;
  lr.limit = (uint32_t)limit;
  req.body_case = FSDP__MSG__BODY_LIST_REQ;
  req.list_req = &lr;
  rc = client_call(&cl, &req, FSDP__MSG__BODY_LIST_RESP, 0, 0, &m);
  if (rc == 0) {
    const Fsdp__ListResp *l = m->list_resp;
    if (co.json) {
      json_t *arr = json_array();
      for (size_t i = 0; i < l->n_jobs; i++) json_array_append_new(arr, ctl_fmt_job_json(l->jobs[i]));
      json_t *o2 = json_object();
      json_object_set_new(o2, "jobs", arr);
      ctl_fmt_print_json(o2, stdout);
    } else if (l->n_jobs == 0) {
      printf("no jobs\n");
    } else {
      ctl_fmt_jobs_table(l->jobs, l->n_jobs, wall_now(), stdout);
    }
  }
  wire_free(&m);
  client_close(&cl);
  return rc;
}

static int get_nodes(client *cl, Fsdp__Msg **m, int timeout_ms) {
  Fsdp__Msg req = WIRE_MSG_INIT;
  Fsdp__NodesReq nr = FSDP__NODES_REQ__INIT;
  req.body_case = FSDP__MSG__BODY_NODES_REQ;
  req.nodes_req = &nr;
  return client_call(cl, &req, FSDP__MSG__BODY_NODES_RESP, 0, timeout_ms, m);
}

int ctl_nodes(int argc, char **argv) {
  static const char *usage = "nodes [--json] [--ctl ENDPOINT]";
  char help[1024];
  snprintf(help, sizeof help, "The nodes of the cluster, their devices (CPU slots and GPUs) and which job holds each.\n%s",
           common_help);
  common_opts co;
  const char *pos[1];
  int n, rc = parse_simple(argc, argv, usage, help, &co, pos, 0, &n);
  if (rc) return rc < 0 ? 0 : rc;
  client cl;
  if ((rc = client_open(&cl, co.ctl))) return rc;
  Fsdp__Msg *m = NULL;
  rc = get_nodes(&cl, &m, 0);
  if (rc == 0) {
    if (co.json)
      ctl_fmt_print_json(ctl_fmt_nodes_json(m->nodes_resp), stdout);
    else if (m->nodes_resp->n_nodes == 0)
      printf("no nodes (an agent registers within a few seconds of starting)\n");
    else
      ctl_fmt_nodes_table(m->nodes_resp, wall_now(), stdout);
  }
  wire_free(&m);
  client_close(&cl);
  return rc;
}

int ctl_cancel(int argc, char **argv) {
  static const char *usage = "cancel ID [--ctl ENDPOINT]";
  common_opts co;
  const char *pos[1];
  int n, rc = parse_simple(argc, argv, usage,
                           "Cancel a queued or running job: its workers are killed and its devices freed.\n"
                           "  --ctl ENDPOINT the daemon (default: $FSDP_CTL, else ipc://$XDG_STATE_HOME/fsdpd/ctl.sock)\n",
                           &co, pos, 1, &n);
  if (rc) return rc < 0 ? 0 : rc;
  if (n != 1) return usage_error(argv[0], usage, "which job?");
  uint64_t id;
  if ((rc = parse_job_id(argv[0], usage, pos[0], &id))) return rc;
  client cl;
  if ((rc = client_open(&cl, co.ctl))) return rc;
  rc = send_cancel(&cl, id);
  if (rc == 0) printf("cancelled job %llu\n", (unsigned long long)id);
  client_close(&cl);
  return rc;
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
        return usage_error(argv[0], usage, "--rank takes a rank number, 0..world_size-1");
      break;
    }
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nPrint a worker's log (stdout and stderr of rank R, default 0).\n"
             "  --rank R       the worker of rank R\n"
             "  --events       the daemon's record of the job instead (queueing, placement, state changes)\n"
             "  --follow       keep printing as the log grows, until the job ends\n"
             "  --ctl ENDPOINT the daemon (default: $FSDP_CTL, else ipc://$XDG_STATE_HOME/fsdpd/ctl.sock)\n", usage);
      return 0;
    default: return usage_error(argv[0], usage, "unknown option");
    }
  }
  if (optind != argc - 1) return usage_error(argv[0], usage, "which job?");
  uint64_t id;
  int rc;
  if ((rc = parse_job_id(argv[0], usage, argv[optind], &id))) return rc;
  client cl;
  if ((rc = client_open(&cl, ctl))) return rc;
  if (follow) catch_interrupts();
  uint64_t offset = 0;
  for (;;) {
    if (g_interrupts) {
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
    rc = client_call(&cl, &req, FSDP__MSG__BODY_LOGS_RESP, id, 0, &m);
    if (rc) {
      if (rc == EXIT_CANCELLED && g_interrupts) continue;
      break;
    }
    const Fsdp__LogsResp *r = m->logs_resp;
    size_t len = r->data.len;
    int done = r->job_done;
    if (len) {
      if (fwrite(r->data.data, 1, len, stdout) != len) {
        wire_free(&m);
        rc = 1;
        break;
      }
      fflush(stdout);
    }
    if (r->next_offset < offset + len) {
      wire_free(&m);
      rc = fail("fsdpd returned log offset %llu after %llu", (unsigned long long)r->next_offset,
                (unsigned long long)(offset + len));
      break;
    }
    offset = r->next_offset;
    wire_free(&m);
    if (len) continue;   /* more may be waiting */
    if (!follow || done) break;
    pause_ms(POLL_MS);
  }
  client_close(&cl);
  return rc;
}

/* ---------------------------------------------------------------- run: a private daemon */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void remove_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static int mkdir_p(const char *path, mode_t mode) {
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -1;
  return 0;
}

/* Where fsdpd is: next to this executable. */
static int find_fsdpd(char *buf, size_t n) {
  char self[PATH_MAX];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  if (l <= 0) return fail("cannot read /proc/self/exe: %s", strerror(errno));
  self[l] = '\0';
  snprintf(buf, n, "%s/fsdpd", dirname(self));
  if (access(buf, X_OK) != 0)
    return fail("cannot run %s: %s (fsdpctl run starts the fsdpd that sits next to fsdpctl; build or install both)", buf,
                strerror(errno));
  return 0;
}

static int pidfd_open_(pid_t pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, pid, 0);
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

typedef struct daemon_proc {
  pid_t pid;
  int pidfd;        /* readable once the daemon exits; -1 where the kernel lacks pidfd_open */
  int reaped;
  int status;
  char log[PATH_MAX];
} daemon_proc;

/* 1 if the daemon has exited (status reaped), 0 if not after waiting up to MS. */
static int daemon_wait(daemon_proc *d, int ms) {
  if (d->reaped) return 1;
  double deadline = mono_ms() + ms;
  for (;;) {
    pid_t r = waitpid(d->pid, &d->status, WNOHANG);
    if (r == d->pid || (r < 0 && errno == ECHILD)) {
      d->reaped = 1;
      return 1;
    }
    double left = deadline - mono_ms();
    if (left <= 0) return 0;
    if (d->pidfd >= 0) {
      struct pollfd pfd = {d->pidfd, POLLIN, 0};
      poll(&pfd, 1, (int)left + 1);
    } else {
      poll(NULL, 0, left < 20 ? (int)left + 1 : 20);
    }
  }
}

static void daemon_describe_exit(const daemon_proc *d, char *buf, size_t n) {
  if (WIFEXITED(d->status))
    snprintf(buf, n, "exited with status %d", WEXITSTATUS(d->status));
  else if (WIFSIGNALED(d->status))
    snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(d->status), strsignal(WTERMSIG(d->status)));
  else
    snprintf(buf, n, "stopped");
}

/* The last non-empty line of the daemon's log, for a one-line failure message. */
static void last_log_line(const char *path, char *buf, size_t n) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    size_t l = strlen(line);
    while (l && (line[l - 1] == '\n' || line[l - 1] == '\r')) line[--l] = '\0';
    if (l) snprintf(buf, n, "%s", line);
  }
  fclose(f);
}

static int daemon_start(daemon_proc *d, const char *fsdpd, const char *state_dir, const jobspec_t *spec,
                        const char *level) {
  memset(d, 0, sizeof *d);
  d->pidfd = -1;
  snprintf(d->log, sizeof d->log, "%s/fsdpd.log", state_dir);
  char nworkers[16];
  snprintf(nworkers, sizeof nworkers, "%d", spec->world_size);
  const char *argv[16];
  int a = 0;
  argv[a++] = fsdpd;
  argv[a++] = "--state-dir";
  argv[a++] = state_dir;
  if (spec->device == DEVICE_CUDA) {
    argv[a++] = "--gpus";
    argv[a++] = "all";
  } else {
    argv[a++] = "--cpu-workers";
    argv[a++] = nworkers;
    argv[a++] = "--gpus";   /* a CPU job: do not probe (or hold) the machine's GPUs */
    argv[a++] = "none";
  }
  argv[a++] = "--foreground";
  if (level) {
    argv[a++] = "--log-level";
    argv[a++] = level;
  }
  argv[a] = NULL;
  int logfd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (logfd < 0) return fail("cannot create %s: %s", d->log, strerror(errno));
  fflush(NULL);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(logfd);
    return fail("fork: %s", strerror(errno));
  }
  if (pid == 0) {
    /* Its own process group: a Ctrl-C at the terminal reaches fsdpctl only, which then cancels
     * the job and shuts the daemon down in order. It dies with us if we die. */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(logfd, 1);
    dup2(logfd, 2);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execv(fsdpd, (char *const *)argv);
    dprintf(2, "fsdpctl: cannot execute %s: %s\n", fsdpd, strerror(errno));
    _exit(127);
  }
  close(logfd);
  d->pid = pid;
  d->pidfd = pidfd_open_(pid);
  return 0;
}

/* Ask the daemon to shut down and reap it; SIGKILL if it does not exit in time. */
static void daemon_stop(daemon_proc *d, client *cl) {
  if (d->pid <= 0 || d->reaped) goto out;
  if (cl && cl->conn) {
    Fsdp__Msg req = WIRE_MSG_INIT, *m = NULL;
    Fsdp__ShutdownReq sr = FSDP__SHUTDOWN_REQ__INIT;
    req.body_case = FSDP__MSG__BODY_SHUTDOWN_REQ;
    req.shutdown_req = &sr;
    if (ctl_conn_call(cl->conn, &req, 5000, &m) != FSDP_OK) kill(d->pid, SIGTERM);
    wire_free(&m);
  } else {
    kill(d->pid, SIGTERM);
  }
  if (!daemon_wait(d, DAEMON_EXIT_MS)) {
    fprintf(stderr, "fsdpctl: fsdpd (pid %d) did not exit within %d s of shutdown; killing it\n", (int)d->pid,
            DAEMON_EXIT_MS / 1000);
    kill(d->pid, SIGKILL);
    daemon_wait(d, DAEMON_EXIT_MS);
  }
out:
  if (d->pidfd >= 0) close(d->pidfd);
  d->pidfd = -1;
}

/* Wait until the private daemon answers and offers enough free devices of the job's kind. */
static int daemon_ready(daemon_proc *d, client *cl, const char *endpoint, const jobspec_t *spec, int *cite_log) {
  *cite_log = 1;
  double deadline = mono_ms() + DAEMON_READY_MS;
  int want = spec->world_size, have = -1;
  int cuda = spec->device == DEVICE_CUDA;
  memset(cl, 0, sizeof *cl);
  snprintf(cl->endpoint, sizeof cl->endpoint, "%.1000s", endpoint);
  for (;;) {
    if (g_interrupts) {
      *cite_log = 0;
      fail("interrupted before the job was submitted");
      return EXIT_CANCELLED;
    }
    if (daemon_wait(d, 0)) {
      char how[128], line[512];
      daemon_describe_exit(d, how, sizeof how);
      last_log_line(d->log, line, sizeof line);
      return fail("fsdpd %s before it was ready%s%s (log: %s)", how, line[0] ? ": " : "", line, d->log);
    }
    if (mono_ms() > deadline) {
      if (have >= 0 && cuda)
        break;
      if (have >= 0)
        return fail("fsdpd offers %d free CPU slots after %d s; the job needs %d (log: %s)", have, DAEMON_READY_MS / 1000,
                    want, d->log);
      return fail("fsdpd did not answer at %s within %d s (log: %s)", endpoint, DAEMON_READY_MS / 1000, d->log);
    }
    if (!cl->conn) {
      fsdp_status rc = ctl_conn_open(endpoint, &cl->conn);
      if (rc == FSDP_ERR_COMM) {   /* socket not bound yet */
        daemon_wait(d, 20);
        continue;
      }
      if (rc != FSDP_OK) return fail("%s", ctl_fmt_user_error(fsdp_last_error()));
      ctl_conn_watch_fd(cl->conn, d->pidfd);
      cl->daemon_log = d->log;
    }
    Fsdp__Msg req = WIRE_MSG_INIT, *m = NULL;
    Fsdp__NodesReq nr = FSDP__NODES_REQ__INIT;
    req.body_case = FSDP__MSG__BODY_NODES_REQ;
    req.nodes_req = &nr;
    fsdp_status rc = ctl_conn_call(cl->conn, &req, 2000, &m);
    if (rc == FSDP_ERR_CANCELLED) continue;
    if (rc != FSDP_OK || m->body_case != FSDP__MSG__BODY_NODES_RESP) {
      wire_free(&m);
      daemon_wait(d, 20);
      continue;
    }
    int nodes = 0, slots = 0;
    for (size_t i = 0; i < m->nodes_resp->n_nodes; i++) {
      const Fsdp__NodeInfo *ni = m->nodes_resp->nodes[i];
      if (ni->lost) continue;
      nodes++;
      for (size_t s = 0; s < ni->n_slots; s++) {
        const Fsdp__DeviceSlot *sl = ni->slots[s];
        if (sl->job_id == 0 && (sl->kind == FSDP__DEVICE_KIND__DEVICE_KIND_CUDA) == cuda) slots++;
      }
    }
    wire_free(&m);
    if (nodes > 0) have = slots;
    if (have >= want) return 0;
    if (cuda && nodes > 0) break;   /* the embedded agent registers every GPU at once */
    daemon_wait(d, 20);
  }
  *cite_log = 0;
  if (have == 0)
    return fail("job asks for device = cuda with world_size %d but this machine has no CUDA devices", want);
  return fail("job asks for device = cuda with world_size %d but this machine has only %d CUDA device%s", want, have,
              have == 1 ? "" : "s");
}

/* First and last loss and the line count of metrics.jsonl. */
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
    if (json_is_number(loss)) {
      if (*lines == 0) *first = json_number_value(loss);
      *last = json_number_value(loss);
    }
    (*lines)++;
    json_decref(j);
  }
  free(line);
  fclose(f);
  return 0;
}

int ctl_run(int argc, char **argv) {
  static const char *usage = "run JOB.ini [--state-dir DIR] [--keep] [--log-level LEVEL]";
  static const struct option opts[] = {
    {"state-dir", required_argument, 0, OPT_STATE_DIR}, {"keep", no_argument, 0, OPT_KEEP},
    {"log-level", required_argument, 0, OPT_LOG_LEVEL}, {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  const char *state_arg = NULL, *level_arg = NULL;
  int keep = 0, o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case OPT_STATE_DIR: state_arg = optarg; break;
    case OPT_KEEP: keep = 1; break;
    case OPT_LOG_LEVEL: {
      log_level lv;
      if (log_parse_level(optarg, &lv) != FSDP_OK)
        return usage_error(argv[0], usage, "--log-level takes debug, info, warn or error");
      level_arg = optarg;
      break;
    }
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nRun one job on this machine with a private fsdpd: start the daemon (world_size CPU\n"
             "slots for device = cpu, every GPU for device = cuda), submit, follow with a progress bar,\n"
             "stop the daemon. Exit status: 0 succeeded, 1 failed, 130 cancelled or interrupted (Ctrl-C\n"
             "cancels the job).\n"
             "  --state-dir DIR   the daemon's state directory (kept); default: a temporary one, removed\n"
             "  --keep            keep the temporary state directory and print where it is\n"
             "  --log-level LEVEL the daemon's log level (debug, info, warn, error)\n", usage);
      return 0;
    default: return usage_error(argv[0], usage, "unknown option");
    }
  }
  if (optind != argc - 1) return usage_error(argv[0], usage, "which job file?");
  const char *path = argv[optind];

  jobspec_t spec;
  char *text = NULL, abs[PATH_MAX], dir[PATH_MAX];
  int rc = load_job_file(path, &spec, &text, abs, sizeof abs, dir, sizeof dir);
  if (rc) return rc;
  if (spec.device == DEVICE_CUDA) {
    /* The daemon finds GPUs through the driver; without it there is nothing to start. */
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
      free(text);
      return fail("job asks for device = cuda with world_size %d but this machine has no CUDA devices", spec.world_size);
    }
    dlclose(h);
  }
  char fsdpd[PATH_MAX];
  if ((rc = find_fsdpd(fsdpd, sizeof fsdpd))) {
    free(text);
    return rc;
  }

  /* The state directory: an ipc socket path must fit in sun_path (108 bytes). */
  char state[PATH_MAX];
  int temp = !state_arg;
  if (state_arg) {
    if (mkdir_p(state_arg, 0700) != 0) {
      free(text);
      return fail("cannot create state directory %s: %s", state_arg, strerror(errno));
    }
    if (!realpath(state_arg, state)) {
      free(text);
      return fail("%s: %s", state_arg, strerror(errno));
    }
  } else {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0] || strlen(tmp) > 60) tmp = "/tmp";
    snprintf(state, sizeof state, "%s/fsdpctl-run.XXXXXX", tmp);
    if (!mkdtemp(state)) {
      free(text);
      return fail("cannot create a temporary state directory in %s: %s", tmp, strerror(errno));
    }
  }
  char endpoint[1024];
  snprintf(endpoint, sizeof endpoint, "ipc://%.900s/ctl.sock", state);
  if (strlen(state) + strlen("/cluster.sock") >= 100) {
    free(text);
    if (temp) remove_tree(state);
    return fail("state directory %s is too long for its ipc sockets (at most ~85 characters); pick a shorter --state-dir",
                state);
  }

  catch_interrupts();
  daemon_proc d;
  client cl = {0};
  uint64_t id = 0;
  follow_result r;
  int started = 0, job_rc = 1, cite_log = 1;
  if ((rc = daemon_start(&d, fsdpd, state, &spec, level_arg))) goto out;
  started = 1;
  if ((rc = daemon_ready(&d, &cl, endpoint, &spec, &cite_log))) goto out;
  cite_log = 0;   /* from here on, only a lost daemon (cl.lost) makes the logs worth keeping */
  if ((rc = submit_text(&cl, text, abs, dir, &id))) goto out;
  printf("job %llu (%s): %d x %s, %d steps\n", (unsigned long long)id, spec.name, spec.world_size,
         device_kind_name(spec.device), spec.steps);
  fflush(stdout);
  rc = follow_job(&cl, id, FOLLOW_CANCEL, &r);
  if (rc) goto out;
  job_rc = r.state == FSDP__JOB_STATE__SUCCEEDED ? 0 : r.state == FSDP__JOB_STATE__CANCELLED ? EXIT_CANCELLED : 1;
  if (job_rc == 1 && temp) keep = 1;   /* the logs explain the failure: do not delete them */

  /* The summary, from metrics.jsonl (one line per step). */
  char mpath[PATH_MAX + 32];
  snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", r.job_dir);
  int lines;
  double first, last;
  char el[32], tps[32];
  if (r.job_dir[0] && read_metrics(mpath, &lines, &first, &last) == 0 && lines > 0)
    printf("job %llu (%s) %s: %d step%s in %s, loss %.4f -> %.4f, %s tok/s\n", (unsigned long long)id, r.name,
           ctl_fmt_state(r.state), lines, lines == 1 ? "" : "s", ctl_fmt_duration(r.elapsed_s, el, sizeof el), first,
           last, ctl_fmt_si(r.tokens_per_s, tps, sizeof tps));
  else
    printf("job %llu (%s) %s after %u of %u steps\n", (unsigned long long)id, r.name, ctl_fmt_state(r.state), r.step,
           r.steps);
  if (keep || !temp) printf("state kept in %s; metrics: %s\n", state, mpath);
  fflush(stdout);
  if (job_rc != 0) {
    char extra[PATH_MAX + 32] = "";
    if (keep || !temp) snprintf(extra, sizeof extra, " (logs: %s)", r.job_dir[0] ? r.job_dir : state);
    rc = job_exit_status(id, &r, extra);
  } else {
    rc = 0;
  }

out:
  free(text);
  if (started) {
    daemon_stop(&d, &cl);
    if (rc == 0 && d.reaped && !(WIFEXITED(d.status) && WEXITSTATUS(d.status) == 0)) {
      char how[128];
      daemon_describe_exit(&d, how, sizeof how);
      fprintf(stderr, "fsdpctl: warning: fsdpd %s at shutdown (log: %s)\n", how, d.log);
      keep = 1;
    }
  }
  client_close(&cl);
  if (rc == 1 && temp && started && (cite_log || cl.lost)) keep = 1;   /* a message above names its log */
  if (temp && !keep) remove_tree(state);
  return rc;
}
