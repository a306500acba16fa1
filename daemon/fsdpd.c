/* fsdpd — the fsdpd daemon: coordinator and local agent (the embedded default), or with --join an
 * agent only; with --slurm the allocation says which (slurm.h). Flags come from one declarative
 * table; an unknown flag is an error. SIGTERM or SIGINT (or a ctl shutdown request): stop
 * accepting work, keep the queue (running jobs stop at a checkpoint and are queued again), flush
 * the state, exit 0. docs/daemon.md describes
 * the internals. */
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>
#include <zmq.h>

#include "agent.h"
#include "coordinator.h"
#include "asuser.h"
#include "blasinfo.h"
#include "envknob.h"
#include "flagtab.h"
#include "curve.h"
#include "fsutil.h"
#include "log.h"
#include "logcfg.h"
#include "metricsrv.h"
#include "slurm.h"
#include "statedir.h"

extern char **environ;

typedef struct config {
  char *state_dir;
  char *ctl;
  char *listen;
  char *join;
  long cpu_workers;
  char *gpus;
  int foreground;
  char *log_level;
  double heartbeat;
  double forget_lost;
  char *name;
  char *worker;
  char *server_key;
  char *client_key;
  char *metrics;
  int slurm;
  int help;
} config;

/* fsdpd's flags: one row each (flagtab.h), in the job file key table's shape. */
static const flagdef opts[] = {
  {"state-dir", FLAG_STR, offsetof(config, state_dir), NULL, 0, 0,
   "state directory (jobs.db, jobs/ID/, sockets); default $XDG_STATE_HOME/fsdpd or /var/lib/fsdpd"},
  {"ctl", FLAG_STR, offsetof(config, ctl), NULL, 0, 0, "fsdpctl endpoint; default ipc://STATE/ctl.sock"},
  {"listen", FLAG_STR, offsetof(config, listen), NULL, 0, 0,
   "endpoint for agents and workers: ipc://PATH, or tcp://HOST:PORT for a cluster; default ipc://STATE/cluster.sock"},
  {"join", FLAG_STR, offsetof(config, join), "", 0, 0, "run as an agent only, joining the coordinator at ENDPOINT"},
  {"cpu-workers", FLAG_LONG, offsetof(config, cpu_workers), "1", 0, 4096, "CPU worker slots on this node"},
  {"gpus", FLAG_STR, offsetof(config, gpus), NULL, 0, 0,
   "CUDA devices on this node: all, none, or a list like 0,1; default all (with --slurm: the allocation's)"},
  {"foreground", FLAG_BOOL, offsetof(config, foreground), "0", 0, 1, "stay in the foreground and log to stderr"},
  {"log-level", FLAG_STR, offsetof(config, log_level), "info", 0, 0, "debug, info, warn or error"},
  {"heartbeat", FLAG_DBL, offsetof(config, heartbeat), "1", 0.05, 3600,
   "seconds between agent heartbeats; a node is lost after 3 missed"},
  {"forget-lost", FLAG_DBL, offsetof(config, forget_lost), "600", 1, 1e7,
   "seconds after which a lost or stopped node is dropped from the node list"},
  {"name", FLAG_STR, offsetof(config, name), "", 0, 0, "this node's name; default the host name"},
  {"worker", FLAG_STR, offsetof(config, worker), "", 0, 0, "fsdp-worker binary; default the one next to fsdpd"},
  {"server-key", FLAG_STR, offsetof(config, server_key), NULL, 0, 0,
   "with --join tcp://: the coordinator's public key file (its STATE/keys/server.pub); default $FSDP_SERVER_KEY"},
  {"client-key", FLAG_STR, offsetof(config, client_key), NULL, 0, 0,
   "with --join tcp://: this node's keypair file (fsdpctl keygen FILE; mode 0600); default $FSDP_CLIENT_KEY"},
  {"metrics", FLAG_STR, offsetof(config, metrics), NULL, 0, 0,
   "serve Prometheus metrics at http://HOST:PORT/metrics (HOST:PORT, :PORT or PORT; HOST defaults to 127.0.0.1); default off"},
  {"slurm", FLAG_BOOL, offsetof(config, slurm), "0", 0, 1,
   "run as one node of a Slurm allocation: SLURM_NODEID 0 is the coordinator, the others agents joining it; "
   "GPUs and --name from the allocation; a flag that contradicts it is an error (scripts/slurm/fsdpd.sbatch)"},
  {"help", FLAG_BOOL, offsetof(config, help), "0", 0, 1, "print this help"},
};
#define NOPTS (sizeof opts / sizeof opts[0])

static void usage(FILE *f) {
  fprintf(f, "usage: fsdpd [FLAGS]\n\nOne binary, two roles: without --join, the coordinator and this node's agent;\n"
             "with --join ENDPOINT, an agent only.\n\nflags:\n");
  flagtab_usage(f, opts, NOPTS);
}

/* The flags into CFG (flagtab_parse: every value checked); fsdpd takes no other argument. */
static int parse_args(int argc, char **argv, config *cfg) {
  int first = 0;
  if (flagtab_parse("fsdpd", opts, NOPTS, cfg, argc, argv, &first) != 0) return -1;
  if (first < argc) {
    fprintf(stderr, "fsdpd: unexpected argument '%s' (fsdpd takes only --flags; see --help)\n", argv[first]);
    return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------- run */

typedef struct daemon_st {
  uv_loop_t *uv;
  void *zctx;
  coord_t *coord;
  agent_t *agent;
  uv_signal_t sig[2];
  int stopping;
} daemon_st;

static void close_all(daemon_st *d) {
  coord_destroy(&d->coord);
  agent_destroy(&d->agent);
  for (int i = 0; i < 2; i++)
    if (!uv_is_closing((uv_handle_t *)&d->sig[i])) uv_close((uv_handle_t *)&d->sig[i], NULL);
}

static void on_agent_done(void *arg) {
  daemon_st *d = arg;
  log_info("all workers reaped; exiting");
  close_all(d);
}

static void on_coord_done(void *arg) {
  daemon_st *d = arg;
  if (d->agent) agent_shutdown(d->agent, 2.0, on_agent_done, d);
  else close_all(d);
}

static void begin_shutdown(daemon_st *d) {
  if (d->stopping++) return;
  log_info("shutting down: keeping the queue, stopping running jobs at a checkpoint, reaping workers");
  /* long enough for a running job's next step and its checkpoint; within `fsdpctl shutdown`'s 30 s */
  if (d->coord) coord_shutdown(d->coord, 20.0, on_coord_done, d);
  else on_coord_done(d);
}

static void on_signal(uv_signal_t *h, int sig) {
  daemon_st *d = h->data;
  if (d->stopping) {
    log_warn("second %s: exiting now", sig == SIGINT ? "SIGINT" : "SIGTERM");
    close_all(d);
    return;
  }
  log_info("received %s", sig == SIGINT ? "SIGINT" : "SIGTERM");
  begin_shutdown(d);
}

static void on_shutdown_req(void *arg) { begin_shutdown(arg); }

/* Detach; LOGFD (fsdpd.log, opened before: a refusal is said on the terminal) becomes stderr. */
static int daemonize(int logfd) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid > 0) _exit(0);
  setsid();
  pid = fork();
  if (pid < 0) return -1;
  if (pid > 0) _exit(0);
  int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, 0);
    dup2(null, 1);
    close(null);
  }
  dup2(logfd, 2);
  close(logfd);
  return 0;
}

/* The paths the daemon serves and keeps (PATH_MAX - 64, PATH_MAX, PATH_MAX): its state directory,
 * its ctl endpoint and its cluster endpoint, from the flags or their defaults. 0, or 2 (printed). */
static int resolve_paths(const config *cfg, char *state, char *ctl, char *listen) {
  if (cfg->state_dir && *cfg->state_dir) snprintf(state, PATH_MAX - 64, "%s", cfg->state_dir);
  else if (getenv("XDG_STATE_HOME") && *getenv("XDG_STATE_HOME")) snprintf(state, PATH_MAX - 64, "%s/fsdpd", getenv("XDG_STATE_HOME"));
  else snprintf(state, PATH_MAX - 64, "/var/lib/fsdpd");
  snprintf(ctl, PATH_MAX, "%s", cfg->ctl && *cfg->ctl ? cfg->ctl : "");
  if (!*ctl) snprintf(ctl, PATH_MAX, "ipc://%s/ctl.sock", state);
  snprintf(listen, PATH_MAX, "%s", cfg->listen && *cfg->listen ? cfg->listen : "");
  if (!*listen) snprintf(listen, PATH_MAX, "ipc://%s/cluster.sock", state);
  if (!strncmp(ctl, "ipc://", 6) && strlen(ctl) - 6 >= 107) {
    fprintf(stderr, "fsdpd: ipc socket path %s is longer than the 107 bytes Unix sockets allow; use a shorter --state-dir\n", ctl + 6);
    return 2;
  }
  return 0;
}

/* --slurm: the allocation's facts, cross-checked with the flags, into CFG's gpus and name; then the
 * GPUs named. Before anything starts or detaches, so that the user sees it. 0, or 2 (printed). */
static int resolve_node(config *cfg, slurm_env *senv, slurm_role *srole) {
  if (cfg->slurm) {
    slurm_flags sf = {.join = cfg->join, .listen = cfg->listen, .gpus = cfg->gpus, .name = cfg->name};
    if (slurm_env_read(environ, senv) != FSDP_OK || slurm_resolve(senv, &sf, slurm_same_host, srole) != FSDP_OK) {
      fprintf(stderr, "fsdpd: %s\n", fsdp_last_error());
      return 2;
    }
    cfg->gpus = srole->gpus;
    cfg->name = srole->name;
  }
  if (cfg->gpus && agent_check_gpus(cfg->gpus) != FSDP_OK) {
    fprintf(stderr, "fsdpd: %s\n", fsdp_last_error());
    return 2;
  }
  return 0;
}

/* --metrics: parsed and bound before detaching, so that a bad value or a port in use is said on the
 * terminal; libmicrohttpd's thread starts after the fork (threads do not survive one).
 * 0 (*MSRV NULL when not asked for), or the exit status (printed). */
static int bind_metrics(const config *cfg, int is_agent_only, metricsrv_t **msrv) {
  *msrv = NULL;
  if (!cfg->metrics) return 0;   /* given, even empty (an error below) */
  char mhost[256];
  int mport;
  if (is_agent_only) {
    fprintf(stderr, "fsdpd: --metrics is served by the coordinator; an agent (--join) has no metrics of its own\n");
    return 2;
  }
  if (metricsrv_parse(cfg->metrics, mhost, sizeof mhost, &mport) != FSDP_OK) {
    fprintf(stderr, "fsdpd: %s\n", fsdp_last_error());
    return 2;
  }
  fsdp_status mrc = metricsrv_bind(mhost, mport, msrv);
  if (mrc != FSDP_OK) {
    fprintf(stderr, "fsdpd: %s\n", fsdp_last_error());
    return mrc == FSDP_ERR_INVALID ? 2 : 1;   /* a name that does not resolve is a bad value */
  }
  return 0;
}

/* The CURVE keys of a tcp:// join (the flags, else the environment), applied to a probe socket
 * before detaching, so that a missing or bad key is said on the terminal. 0, or 2 (printed). */
static int check_join_keys(const config *cfg, const char *server_key, const char *client_key) {
  void *probe_ctx = zmq_ctx_new();
  void *probe = probe_ctx ? zmq_socket(probe_ctx, ZMQ_DEALER) : NULL;
  char what[PATH_MAX];
  snprintf(what, sizeof what, "--join %s", cfg->join);
  fsdp_status krc = probe ? curve_client_apply(probe, cfg->join, server_key, client_key, what)
                          : fsdp_set_error(FSDP_ERR_COMM, "zmq_socket: %s", zmq_strerror(zmq_errno()));
  if (probe) zmq_close(probe);
  if (probe_ctx) zmq_ctx_term(probe_ctx);
  if (krc != FSDP_OK) {
    fprintf(stderr, "fsdpd: %s\n", fsdp_last_error());
    return 2;
  }
  return 0;
}

/* The coordinator (unless IS_AGENT_ONLY) and the node's agent on D's loop. 0, or 1 (logged). */
static int start_roles(daemon_st *d, const config *cfg, int is_agent_only, const char *state, const char *ctl,
                       const char *listen, metricsrv_t *msrv, const char *server_key, const char *client_key,
                       mode_t start_umask, const char *run_dir) {
  if (!is_agent_only) {
    coord_config cc = {.state_dir = state, .ctl = ctl, .listen = listen, .heartbeat_s = cfg->heartbeat,
                       .forget_s = cfg->forget_lost,
                       .worker_log_level = cfg->log_level, .wait_first_node = 1,
                       .on_shutdown_req = on_shutdown_req, .arg = d, .metrics = msrv};
    if (coord_new(d->uv, d->zctx, &cc, &d->coord) != FSDP_OK) {
      log_error("%s", fsdp_last_error());
      return 1;
    }
  }
  /* The embedded agent joins its own cluster endpoint; a wildcard bind address is reached on loopback. */
  char self_join[PATH_MAX + 16];
  if (!strncmp(listen, "tcp://*:", 8)) snprintf(self_join, sizeof self_join, "tcp://127.0.0.1:%s", listen + 8);
  else if (!strncmp(listen, "tcp://0.0.0.0:", 14)) snprintf(self_join, sizeof self_join, "tcp://127.0.0.1:%s", listen + 14);
  else snprintf(self_join, sizeof self_join, "%s", listen);
  /* The embedded agent (and its workers) use the coordinator's own keypair, which its ZAP handler
   * always admits. */
  char own_pub[PATH_MAX], own_key[PATH_MAX];
  if (!is_agent_only) {
    snprintf(own_pub, sizeof own_pub, "%s/keys/server.pub", state);
    snprintf(own_key, sizeof own_key, "%s/keys/server.key", state);
    server_key = own_pub;
    client_key = own_key;
  }
  agent_config ac = {.join = is_agent_only ? cfg->join : self_join, .name = cfg->name, .cpu_workers = (int)cfg->cpu_workers,
                     .gpus = cfg->gpus ? cfg->gpus : "all", .worker_path = cfg->worker, .server_key = server_key, .client_key = client_key,
                     .worker_umask = start_umask, .run_dir = run_dir};
  if (agent_new(d->uv, d->zctx, &ac, &d->agent) != FSDP_OK) {
    log_error("%s", fsdp_last_error());
    coord_destroy(&d->coord);
    uv_run(d->uv, UV_RUN_NOWAIT);
    return 1;
  }
  return 0;
}

/* Detach (unless --foreground), with the log in the state directory as stderr. 0, or 1 (printed). */
static int detach(const config *cfg, statedir *sd) {
  if (cfg->foreground) return 0;
  int logfd;
  if (statedir_open_log(sd, &logfd) != FSDP_OK) {
    fprintf(stderr, "fsdpd: %s\n", fsdp_last_error());
    return 1;
  }
  if (daemonize(logfd) != 0) {
    fprintf(stderr, "fsdpd: cannot detach: %s\n", strerror(errno));
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  /* The agent starts another user's workers through this binary (asuser.h). */
  if (argc > 1 && !strcmp(argv[1], ASUSER_EXEC_FLAG)) return asuser_exec_main(argc, argv);
  /* The daemon's own files and sockets are its user's only; workers get the umask it was started
   * with (agent_config.worker_umask). */
  mode_t start_umask = umask(077);
  config cfg = {0};
  if (parse_args(argc, argv, &cfg) != 0) return 2;
  if (cfg.help) {
    usage(stdout);
    return 0;
  }
  log_level lvl;
  if (log_parse_level(cfg.log_level, &lvl) != FSDP_OK) {
    fprintf(stderr, "fsdpd: --log-level: %s\n", fsdp_last_error());
    return 2;
  }
  log_set_level(lvl);
  log_set_prefix("fsdpd", -1);
  slurm_env senv;
  slurm_role srole;
  char state[PATH_MAX - 64], ctl[PATH_MAX], listen[PATH_MAX];
  int rc, is_agent_only = cfg.join && *cfg.join;
  if ((rc = resolve_node(&cfg, &senv, &srole)) || (rc = resolve_paths(&cfg, state, ctl, listen))) return rc;
  /* The state directory, parents included ($XDG_STATE_HOME may not exist yet): the log and the
   * lock live there, and both are needed before the daemon detaches. Refused when another user
   * owns or can write it (statedir.h). */
  statedir sd;
  if (statedir_open(state, &sd) != FSDP_OK) {
    fprintf(stderr, "fsdpd: refusing the state directory: %s\n", fsdp_last_error());
    return 1;
  }
  char run_dir[PATH_MAX];
  if (statedir_run_dir(&sd, run_dir, sizeof run_dir) != FSDP_OK) {
    fprintf(stderr, "fsdpd: %s\n", fsdp_last_error());
    return 1;
  }
  metricsrv_t *msrv = NULL;
  if ((rc = bind_metrics(&cfg, is_agent_only, &msrv))) return rc;
  int lock_on_file = 0;
  if (!is_agent_only && statedir_lock(&sd, &lock_on_file) != FSDP_OK) {
    fprintf(stderr, "fsdpd: %s\n", fsdp_last_error());
    return 1;
  }
  const char *server_key = cfg.server_key && *cfg.server_key ? cfg.server_key : envknob_get(ENV_SERVER_KEY);
  const char *client_key = cfg.client_key && *cfg.client_key ? cfg.client_key : envknob_get(ENV_CLIENT_KEY);
  if (is_agent_only && curve_is_tcp(cfg.join) && (rc = check_join_keys(&cfg, server_key, client_key))) return rc;
  if ((rc = detach(&cfg, &sd))) return rc;
  /* the pid that holds the lock: after detaching */
  if (!is_agent_only && statedir_write_pid(&sd) != FSDP_OK) log_warn("%s", fsdp_last_error());
  if (lock_on_file)
    log_warn("the file system of %s cannot lock a directory: the single-instance lock is on %s/fsdpd.lock, "
             "which must not be deleted while fsdpd runs", state, state);
  if (msrv && metricsrv_start(msrv) != FSDP_OK) {
    log_error("%s", fsdp_last_error());
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  signal(SIGXFSZ, SIG_IGN);   /* a write past a file-size limit fails with EFBIG, handled like a full disk */

  daemon_st d = {0};
  d.uv = uv_default_loop();
  d.zctx = zmq_ctx_new();
  if (!d.zctx) {
    log_error("zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    return 1;
  }
  if (start_roles(&d, &cfg, is_agent_only, state, ctl, listen, msrv, server_key, client_key, start_umask, run_dir)) {
    zmq_ctx_term(d.zctx);
    return 1;
  }
  /* the kernels CPU workers will run (they inherit OPENBLAS_CORETYPE from this environment); after the
   * start, so that a refusal to start stays its one line */
  blasinfo_log(openblas_get_config(), openblas_get_corename());

  int sigs[2] = {SIGTERM, SIGINT};
  for (int i = 0; i < 2; i++) {
    uv_signal_init(d.uv, &d.sig[i]);
    d.sig[i].data = &d;
    uv_signal_start(&d.sig[i], on_signal, sigs[i]);
  }
  log_info("fsdpd %s (pid %d)%s", is_agent_only ? "agent" : "coordinator", (int)getpid(),
           is_agent_only ? "" : " with its local agent");
  if (cfg.slurm) {
    char of[32] = "";
    if (senv.nnodes >= 0) snprintf(of, sizeof of, " of %d", senv.nnodes);
    log_info("Slurm job %s: node %d%s (%s), coordinator on %s; GPUs %s (%s)", senv.job_id, senv.node_id, of,
             *srole.name ? srole.name : "this host", senv.first_host, srole.gpus,
             senv.gpus >= 0 ? senv.gpus_from : "no GPU variable set: --gpus as given");
  }
  uv_run(d.uv, UV_RUN_DEFAULT);
  uv_loop_close(d.uv);
  zmq_ctx_term(d.zctx);
  metricsrv_destroy(&msrv);   /* after the coordinator: nothing publishes any more */
  log_info("stopped");
  return 0;
}
