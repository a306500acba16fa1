/* ctl_client — see ctl_client.h. */
#define _GNU_SOURCE
#include "ctl_client.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <zmq.h>

#include "oneline.h"
#include "tokmask.h"
#include "wire.h"

volatile sig_atomic_t ctl_interrupts;

static void on_signal(int sig) {
  (void)sig;
  ctl_interrupts++;
}

void ctl_catch_interrupts(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;   /* no SA_RESTART: blocking waits return EINTR and see the flag */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

/* FMT's message on stderr as one line: control characters in a path or a message from elsewhere
 * are escaped. */
static void say(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
static void say(const char *fmt, va_list ap) {
  char msg[2048];
  vsnprintf(msg, sizeof msg, fmt, ap);
  char line[4 * sizeof msg];
  oneline_escape_str(line, sizeof line, msg);
  fflush(stdout);
  fprintf(stderr, "fsdpctl: %s\n", line);
}

int ctl_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  say(fmt, ap);
  va_end(ap);
  return 1;
}

void ctl_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  say(fmt, ap);
  va_end(ap);
}

int ctl_usage_error(const char *cmd, const char *usage, const char *what) {
  fflush(stdout);
  if (what) fprintf(stderr, "fsdpctl %s: %s\n", cmd, what);
  fprintf(stderr, "usage: fsdpctl %s\n", usage);
  return EXIT_USAGE;
}

double ctl_wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double ctl_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Wait MS milliseconds for nothing in particular (display polling); a signal ends it early. */
void ctl_pause_ms(int ms) { zmq_poll(NULL, 0, ms); }

int ctl_parse_job_id(const char *cmd, const char *usage, const char *s, uint64_t *id) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || v == 0 || s[0] == '-') {
    char what[256];
    snprintf(what, sizeof what, "'%s' is not a job id (a positive integer, as printed by submit)", s);
    return ctl_usage_error(cmd, usage, what);
  }
  *id = v;
  return 0;
}



int ctl_client_open(ctl_client *cl, const char *flag) {
  memset(cl, 0, sizeof *cl);
  fsdp_status rc = ctl_endpoint_resolve(flag, cl->endpoint, sizeof cl->endpoint);
  if (rc != FSDP_OK) return ctl_fail("%s", fsdp_last_error());
  rc = ctl_conn_open(cl->endpoint, &cl->conn);
  if (rc != FSDP_OK) {
    char msg[1400];
    ctl_describe_failure(cl->endpoint, rc, msg, sizeof msg);
    return ctl_fail("%s", msg);
  }
  return 0;
}

void ctl_client_close(ctl_client *cl) { ctl_conn_destroy(&cl->conn); }

/* One request; on success *reply has body EXPECT. Prints the one-line reason and returns the
 * exit status otherwise (1, or 130 when interrupted). JOB_ID (or 0) names the job in "no job N". */
int ctl_client_call(ctl_client *cl, Fsdp__Msg *req, Fsdp__Msg__BodyCase expect, uint64_t job_id, int timeout_ms,
                       Fsdp__Msg **reply) {
  *reply = NULL;
  Fsdp__Msg *m = NULL;
  fsdp_status rc = ctl_conn_call(cl->conn, req, timeout_ms, &m);
  if (rc == FSDP_ERR_CANCELLED) return EXIT_CANCELLED;   /* a Ctrl-C: the caller says what it does about it */
  if (rc != FSDP_OK) {
    char msg[1400];
    if (rc == FSDP_ERR_COMM && cl->daemon_log) {
      cl->lost = 1;
      snprintf(msg, sizeof msg, "lost the private fsdpd: %s (log: %s)", fsdp_last_error(),
               cl->daemon_log);
    } else {
      ctl_describe_failure(cl->endpoint, rc, msg, sizeof msg);
    }
    ctl_fail("%s", msg);
    return 1;
  }
  if (m->body_case == FSDP__MSG__BODY_ERROR) {
    if (m->error->code == FSDP_ERR_NOTFOUND && job_id)
      ctl_fail("no job %llu", (unsigned long long)job_id);
    else
      ctl_fail("%s", m->error->message && m->error->message[0] ? m->error->message
                                                            : fsdp_strerror((fsdp_status)m->error->code));
    wire_destroy(&m);
    return 1;
  }
  if (m->body_case != expect) {
    ctl_fail("fsdpd at %s answered %s to a %s (is it the same version as fsdpctl?)", cl->endpoint,
         wire_body_name(m->body_case), wire_body_name(req->body_case));
    wire_destroy(&m);
    return 1;
  }
  *reply = m;
  return 0;
}

int ctl_client_status(ctl_client *cl, uint64_t id, Fsdp__Msg **reply) {
  Fsdp__Msg req = WIRE_MSG_INIT;
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  req.body_case = FSDP__MSG__BODY_STATUS_REQ;
  req.status_req = &q;
  return ctl_client_call(cl, &req, FSDP__MSG__BODY_STATUS_RESP, id, 0, reply);
}

int ctl_client_stop(ctl_client *cl, uint64_t id) {
  Fsdp__Msg req = WIRE_MSG_INIT, *reply = NULL;
  Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
  q.job_id = id;
  req.body_case = FSDP__MSG__BODY_STOP_REQ;
  req.stop_req = &q;
  int rc = ctl_client_call(cl, &req, FSDP__MSG__BODY_ACK, id, 0, &reply);
  wire_destroy(&reply);
  return rc;
}


/* Load and check the job file locally, then read its text, absolute path and directory. */
int ctl_load_job_file(const char *path, jobspec_t *spec, char **text, char *abs, size_t absn, char *dir, size_t dirn) {
  *text = NULL;
  fsdp_status rc = jobspec_load(path, spec);
  if (rc == FSDP_OK) rc = tokmask_check_files("train", spec->train, spec->pack);
  if (rc == FSDP_OK) rc = tokmask_check_files("val", spec->val, spec->pack);
  if (rc != FSDP_OK) return ctl_fail("%s", fsdp_last_error());
  char warn[320];
  if (jobspec_lr_warning(spec, warn, sizeof warn)) ctl_warn("%s: %s", path, warn);
  char rp[PATH_MAX];
  if (!realpath(path, rp)) return ctl_fail("%s: %s", path, strerror(errno));
  FILE *f = fopen(rp, "rb");
  if (!f) return ctl_fail("cannot open %s: %s", rp, strerror(errno));
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) {
      fclose(f);
      return ctl_fail("out of memory reading %s", rp);
    }
    size_t got = fread(buf + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0) break;
    if (len + 1 == cap) {
      if (cap > WIRE_MAX_STRING) {
        free(buf);
        fclose(f);
        return ctl_fail("%s is larger than %u bytes; a job file is a short INI text", rp, WIRE_MAX_STRING);
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
    return ctl_fail("cannot read %s", rp);
  }
  buf[len] = '\0';
  snprintf(abs, absn, "%s", rp);
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", rp);
  snprintf(dir, dirn, "%s", dirname(tmp));
  *text = buf;
  return 0;
}

int ctl_client_submit(ctl_client *cl, char *text, char *abs, char *dir, uint64_t *id) {
  Fsdp__Msg req = WIRE_MSG_INIT, *reply = NULL;
  Fsdp__SubmitReq s = FSDP__SUBMIT_REQ__INIT;
  s.spec_text = text;
  s.spec_path = abs;
  s.base_dir = dir;
  mode_t mask = umask(022);   /* reading the umask sets it: set it back at once */
  umask(mask);
  s.umask_set = 1;
  s.umask = (uint32_t)mask & 0777;
  req.body_case = FSDP__MSG__BODY_SUBMIT_REQ;
  req.submit_req = &s;
  int rc = ctl_client_call(cl, &req, FSDP__MSG__BODY_SUBMIT_RESP, 0, 0, &reply);
  if (rc) return rc;
  *id = reply->submit_resp->job_id;
  wire_destroy(&reply);
  if (*id == 0) return ctl_fail("fsdpd at %s returned job id 0", cl->endpoint);
  return 0;
}

int ctl_client_request(const char *flag, Fsdp__Msg *req, Fsdp__Msg__BodyCase expect, uint64_t job_id,
                       void (*print)(const Fsdp__Msg *reply, void *arg), void *arg) {
  ctl_client cl;
  int rc = ctl_client_open(&cl, flag);
  if (rc) return rc;
  Fsdp__Msg *m = NULL;
  rc = ctl_client_call(&cl, req, expect, job_id, 0, &m);
  if (rc == 0 && print) print(m, arg);
  wire_destroy(&m);
  ctl_client_close(&cl);
  return rc;
}
