/* agent — see agent.h. */
#include "agent.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "asuser.h"
#include "curve.h"
#include "log.h"
#include "loop.h"
#include "relay.h"
#include "wire.h"
#include "zmon.h"

extern char **environ;

#define REGISTER_RETRY_MS 1000
#define EXIT_FLUSH_MS 2000      /* how long a dead worker's pipes may stay open before we report anyway */
#define MAX_GPUS 64
#define WORKER_RELAY_FD 3          /* the worker's descriptor of its relay's socket (relay_socket_fd) */
#define AUTH_LOG_EVERY_S 60.0   /* a failing CURVE handshake (retried every 100 ms by libzmq): one line a minute */

typedef struct worker {
  struct worker *next;
  agent_t *a;
  uint64_t job_id;
  uint32_t rank;
  uv_process_t proc;
  uv_pipe_t pipe[2];         /* stdout, stderr */
  uv_timer_t flush;
  int handles;               /* open uv handles; freed at 0 */
  int pipes_open;
  int exited;
  int64_t exit_status;
  int term_signal;
  int reported;
  char buf[2][16384];
} worker_t;

typedef struct gpu_info {
  int index;
  char name[128];
  uint64_t mem;
} gpu_info;

struct agent {
  uv_loop_t *uv;
  void *sock;
  loop_zsock *zs;
  char join[512];
  /* tcp://: a monitor of the socket's CURVE handshakes, to say why registration cannot succeed. */
  zmon *mon;
  char client_pub[CURVE_KEY_LEN + 1];
  char server_key_path[PATH_MAX], client_key_path[PATH_MAX];
  double auth_logged_at;
  int reopen;             /* the key was rejected: libzmq does not reconnect such a socket */
  void *zctx;
  char name[256];
  char worker_path[PATH_MAX];
  char self_path[PATH_MAX];   /* this fsdpd, for `fsdpd --exec-as` (asuser.h) */
  int cpu_slots;
  mode_t worker_umask;
  uint64_t cpu_slot_mem;
  uint64_t host_mem;          /* MemAvailable at start: what offload = optimizer may pin (AgentRegister) */
  gpu_info gpus[MAX_GPUS];
  int ngpus;
  int ncpu;
  unsigned node_id;
  double heartbeat_s;
  uv_timer_t reg_timer, hb_timer, kill_timer;
  int handles;
  int destroyed;
  worker_t *workers;
  int nworkers;
  void (*shutdown_done)(void *);
  void *shutdown_arg;
  int shutting_down;
  relay *relay;              /* the workers' endpoint and the step aggregation (relay.h) */
};

/* ---------------------------------------------------------------- devices */

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_get_fn)(int *, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_mem_fn)(size_t *, int);

static int gpu_selected(const char *list, int idx) {
  if (!strcmp(list, "all")) return 1;
  const char *p = list;
  while (*p) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) return 0;
    if (v == idx) return 1;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return 0;
  }
  return 0;
}

fsdp_status agent_check_gpus(const char *list) {
  if (!strcmp(list, "all") || !strcmp(list, "none")) return FSDP_OK;
  /* indices separated by single commas: no empty entry, no leading or trailing comma */
  int digits = 0, ok = *list != '\0';
  for (const char *p = list; *p && ok; p++) {
    if (*p >= '0' && *p <= '9') digits++;
    else if (*p == ',' && digits) digits = 0;
    else ok = 0;
  }
  if (!ok || !digits)
    return fsdp_set_error(FSDP_ERR_INVALID, "--gpus '%s': expected all, none or a list of device indices like 0,1", list);
  return FSDP_OK;
}

static void discover_gpus(agent_t *a, const char *list) {
  a->ngpus = 0;
  if (!list || !*list || !strcmp(list, "none")) return;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    log_info("no CUDA driver (libcuda.so.1: %s): this node offers 0 GPUs", dlerror());
    return;
  }
  cu_init_fn cu_init = (cu_init_fn)dlsym(h, "cuInit");
  cu_count_fn cu_count = (cu_count_fn)dlsym(h, "cuDeviceGetCount");
  cu_get_fn cu_get = (cu_get_fn)dlsym(h, "cuDeviceGet");
  cu_name_fn cu_name = (cu_name_fn)dlsym(h, "cuDeviceGetName");
  cu_mem_fn cu_mem = (cu_mem_fn)dlsym(h, "cuDeviceTotalMem_v2");
  int n = 0;
  if (!cu_init || !cu_count || !cu_get || !cu_name || !cu_mem) {
    log_warn("libcuda.so.1 lacks the driver API entry points: this node offers 0 GPUs");
  } else if (cu_init(0) != 0 || cu_count(&n) != 0) {
    log_info("cuInit failed (no usable GPU or driver): this node offers 0 GPUs");
    n = 0;
  }
  for (int i = 0; i < n && a->ngpus < MAX_GPUS; i++) {
    if (!gpu_selected(list, i)) continue;
    int dev;
    size_t mem = 0;
    gpu_info *g = &a->gpus[a->ngpus];
    if (cu_get(&dev, i) != 0 || cu_name(g->name, sizeof g->name, dev) != 0 || cu_mem(&mem, dev) != 0) {
      log_warn("CUDA device %d does not answer; skipped", i);
      continue;
    }
    g->index = i;
    g->mem = mem;
    a->ngpus++;
    log_info("GPU %d: %s, %.1f GiB", i, g->name, (double)mem / (1u << 30));
  }
  /* The handle stays open: libcuda does not support being unloaded after cuInit. */
}

static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  fclose(f);
  return (uint64_t)kb * 1024;
}

/* ---------------------------------------------------------------- sending */

/* ENV: a worker's envelope passed up by the relay, NULL for the agent's own messages. */
static void send_up(void *arg, const wire_env *env, Fsdp__Msg *m) {
  agent_t *a = arg;
  if (!a->sock) return;   /* between a rejected socket and its replacement */
  wire_env own = {0};
  wire_env_push(&own, NULL, 0);
  fsdp_status rc = wire_send(a->sock, env ? env : &own, m, ZMQ_DONTWAIT);
  if (rc != FSDP_OK)
    log_warn("agent: cannot send %s to the coordinator: %s", wire_body_name(m->body_case),
             rc == FSDP_ERR_TIMEOUT ? "queue full" : fsdp_last_error());
}

static void send_msg(agent_t *a, Fsdp__Msg *m) { send_up(a, NULL, m); }
/* A message that carries only this node's id: a heartbeat or the goodbye. */
static void send_node_msg(agent_t *a, Fsdp__Msg__BodyCase body) {
  Fsdp__Heartbeat hb = FSDP__HEARTBEAT__INIT;
  Fsdp__AgentBye bye = FSDP__AGENT_BYE__INIT;
  hb.node_id = bye.node_id = a->node_id;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = body;
  if (body == FSDP__MSG__BODY_AGENT_BYE) m.agent_bye = &bye;
  else m.heartbeat = &hb;
  send_msg(a, &m);
}

static void send_register(agent_t *a) {
  Fsdp__AgentRegister reg = FSDP__AGENT_REGISTER__INIT;
  reg.name = a->name;
  reg.cpu_slots = (uint32_t)a->cpu_slots;
  reg.pid = (uint32_t)getpid();
  reg.host_mem_bytes = a->host_mem;
  Fsdp__DeviceSlot slots[MAX_GPUS + 4096], *ptrs[MAX_GPUS + 4096];
  size_t n = 0;
  for (int i = 0; i < a->cpu_slots && n < 4096; i++, n++) {
    Fsdp__DeviceSlot s = FSDP__DEVICE_SLOT__INIT;
    s.kind = FSDP__DEVICE_KIND__DEVICE_KIND_CPU;
    s.index = (uint32_t)i;
    s.name = "cpu";
    s.mem_bytes = a->cpu_slot_mem;
    slots[n] = s;
    ptrs[n] = &slots[n];
  }
  for (int i = 0; i < a->ngpus; i++, n++) {
    Fsdp__DeviceSlot s = FSDP__DEVICE_SLOT__INIT;
    s.kind = FSDP__DEVICE_KIND__DEVICE_KIND_CUDA;
    s.index = (uint32_t)a->gpus[i].index;
    s.name = a->gpus[i].name;
    s.mem_bytes = a->gpus[i].mem;
    slots[n] = s;
    ptrs[n] = &slots[n];
  }
  reg.n_gpus = n;
  reg.gpus = ptrs;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_AGENT_REGISTER;
  m.agent_register = &reg;
  send_msg(a, &m);
}

/* ---------------------------------------------------------------- workers */

static void worker_unlink(worker_t *w) {
  agent_t *a = w->a;
  for (worker_t **p = &a->workers; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      a->nworkers--;
      break;
    }
}

static void agent_check_shutdown(agent_t *a);

static void on_worker_handle_close(uv_handle_t *h) {
  worker_t *w = h->data;
  if (--w->handles == 0) free(w);
}

static void worker_close(worker_t *w) {
  for (int i = 0; i < 2; i++)
    if (!uv_is_closing((uv_handle_t *)&w->pipe[i])) uv_close((uv_handle_t *)&w->pipe[i], on_worker_handle_close);
  if (!uv_is_closing((uv_handle_t *)&w->flush)) uv_close((uv_handle_t *)&w->flush, on_worker_handle_close);
  if (!uv_is_closing((uv_handle_t *)&w->proc)) uv_close((uv_handle_t *)&w->proc, on_worker_handle_close);
}

static void worker_report(worker_t *w) {
  if (w->reported) return;
  w->reported = 1;
  agent_t *a = w->a;
  Fsdp__WorkerExit ex = FSDP__WORKER_EXIT__INIT;
  ex.job_id = w->job_id;
  ex.rank = w->rank;
  ex.exit_status = (int32_t)w->exit_status;
  ex.term_signal = w->term_signal;
  ex.node_id = a->node_id;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_EXIT;
  m.worker_exit = &ex;
  send_msg(a, &m);
  relay_rank_gone(a->relay, w->job_id, w->rank, w->proc.pid);
  log_info("job %llu rank %u exited (status %lld, signal %d)", (unsigned long long)w->job_id, w->rank,
           (long long)w->exit_status, w->term_signal);
  worker_unlink(w);
  worker_close(w);
  agent_check_shutdown(a);
}

static void send_log(agent_t *a, uint64_t job, uint32_t rank, const void *data, size_t len) {
  Fsdp__LogChunk lc = FSDP__LOG_CHUNK__INIT;
  lc.job_id = job;
  lc.rank = rank;
  lc.data.data = (uint8_t *)data;
  lc.data.len = len;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_LOG_CHUNK;
  m.log_chunk = &lc;
  send_msg(a, &m);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  worker_t *w = h->data;
  int i = (uv_pipe_t *)h == &w->pipe[0] ? 0 : 1;
  buf->base = w->buf[i];
  buf->len = sizeof w->buf[i];
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  worker_t *w = s->data;
  if (n > 0) {
    send_log(w->a, w->job_id, w->rank, buf->base, (size_t)n);
    return;
  }
  if (n < 0) {   /* EOF or error: this pipe is done */
    uv_read_stop(s);
    if (--w->pipes_open == 0 && w->exited) worker_report(w);
  }
}

static void on_flush_timeout(uv_timer_t *t) { worker_report(t->data); }

static void on_worker_exit_cb(uv_process_t *p, int64_t status, int sig) {
  worker_t *w = p->data;
  w->exited = 1;
  w->exit_status = status;
  w->term_signal = sig;
  if (w->pipes_open == 0) worker_report(w);
  else uv_timer_start(&w->flush, on_flush_timeout, EXIT_FLUSH_MS, 0);
}

static const char *env_value(char **env, size_t n, const char *name) {
  size_t len = strlen(name);
  for (size_t i = 0; i < n; i++)
    if (!strncmp(env[i], name, len) && env[i][len] == '=') return env[i] + len + 1;
  return NULL;
}

static int env_has(char **env, size_t n, const char *entry) {
  const char *eq = strchr(entry, '=');
  size_t len = eq ? (size_t)(eq - entry) : strlen(entry);
  for (size_t i = 0; i < n; i++)
    if (!strncmp(env[i], entry, len) && env[i][len] == '=') return 1;
  return 0;
}

/* Whether the daemon's own variable ENTRY ("NAME=VALUE") passes to its workers: what finding the
 * libraries and the devices needs, the locale and time zone, and the runtime's own knobs (FSDP_*,
 * CUDA_*, NCCL_*, GLOO_*, the Slurm allocation's SLURM_*, the sanitizers'); never the rest of a root
 * daemon's environment. HOME, USER
 * and LOGNAME are the owner's where the worker starts as another user (asuser_exec_main sets them). */
static int worker_env_passes(const char *entry) {
  static const char *const names[] = {"PATH", "LD_LIBRARY_PATH", "HOME", "USER", "LOGNAME", "TZ", "LANG", "TMPDIR",
                                      "VIRTUAL_ENV", "CONDA_PREFIX", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"};
  static const char *const prefixes[] = {"LC_", "FSDP_", "CUDA_", "NCCL_", "GLOO_", "SLURM_", "ASAN_", "UBSAN_", "LSAN_"};
  const char *eq = strchr(entry, '=');
  if (!eq) return 0;
  size_t len = (size_t)(eq - entry);
  if (!strncmp(entry, "FSDPD_", 6)) return 0;   /* the job's own come from the request */
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strlen(names[i]) == len && !strncmp(entry, names[i], len)) return 1;
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
    if (!strncmp(entry, prefixes[i], strlen(prefixes[i]))) return 1;
  return 0;
}

static void spawn_failed(agent_t *a, const Fsdp__SpawnReq *r, const char *why) {
  char msg[1024];
  int len = snprintf(msg, sizeof msg, "fsdpd agent: cannot start rank %u: %s\n", r->rank, why);
  log_error("job %llu: cannot start rank %u: %s", (unsigned long long)r->job_id, r->rank, why);
  send_log(a, r->job_id, r->rank, msg, (size_t)len);
  Fsdp__WorkerExit ex = FSDP__WORKER_EXIT__INIT;
  ex.job_id = r->job_id;
  ex.rank = r->rank;
  ex.exit_status = 127;
  ex.node_id = a->node_id;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_WORKER_EXIT;
  m.worker_exit = &ex;
  send_msg(a, &m);
}

static void handle_spawn(agent_t *a, const Fsdp__SpawnReq *r) {
  if (a->shutting_down) {
    spawn_failed(a, r, "the agent is shutting down");
    return;
  }
  /* The job's owner (an older coordinator names none: the agent's own user, as it always was). As
   * root the worker starts through `fsdpd --exec-as` with the owner's uid, groups and gid; as
   * anyone else only the agent's own user's jobs can run. */
  int switch_user = *r->user && geteuid() == 0 && r->uid != 0;
  if (*r->user && geteuid() != 0 && r->uid != geteuid()) {
    char why[256];
    snprintf(why, sizeof why, "this agent runs as uid %u and cannot start workers as %s (uid %u); run it as root to run "
             "every user's jobs", (unsigned)geteuid(), r->user, r->uid);
    spawn_failed(a, r, why);
    return;
  }
  /* argv: resolve the worker binary and point --connect at this node's relay, which the worker
   * reaches through descriptor WORKER_RELAY_FD (relay.h). */
  char **argv = calloc(r->n_argv + 1, sizeof *argv), **run = calloc(r->n_argv + 8, sizeof *run);
  size_t nenv_in = 0;
  while (environ[nenv_in]) nenv_in++;
  char **env = calloc(nenv_in + r->n_env + 3, sizeof *env);
  char omp[64], blas[64], relay_ep[64];
  worker_t *w = calloc(1, sizeof *w);
  if (!argv || !run || !env || !w) {
    free(argv), free(run), free(env), free(w);
    spawn_failed(a, r, "out of memory");
    return;
  }
  snprintf(relay_ep, sizeof relay_ep, "ipc:///proc/self/fd/%d", WORKER_RELAY_FD);
  for (size_t i = 0; i < r->n_argv; i++) argv[i] = r->argv[i];
  if (!strcmp(argv[0], "fsdp-worker")) argv[0] = a->worker_path;
  for (size_t i = 0; i + 1 < r->n_argv; i++)
    if (!strcmp(argv[i], "--connect")) argv[i + 1] = relay_ep;
  /* The request's variables (the job's: FSDPD_JOB_ID, FSDPD_LOCAL_RANKS, FSDPD_WORKER_TOKEN), then
   * only what docs/operations.md "The workers' environment" lists of this daemon's own. */
  size_t ne = 0;
  for (size_t i = 0; i < r->n_env; i++)
    if (!env_has(env, ne, r->env[i])) env[ne++] = r->env[i];
  for (size_t i = 0; i < nenv_in; i++)
    if (worker_env_passes(environ[i]) && !env_has(env, ne, environ[i])) env[ne++] = environ[i];
  const char *lr = env_value(r->env, r->n_env, "FSDPD_LOCAL_RANKS");
  int local = lr ? atoi(lr) : 1;
  int threads = a->ncpu / (local > 0 ? local : 1);
  if (threads < 1) threads = 1;
  snprintf(omp, sizeof omp, "OMP_NUM_THREADS=%d", threads);
  snprintf(blas, sizeof blas, "OPENBLAS_NUM_THREADS=%d", threads);
  if (!env_value(r->env, r->n_env, "OMP_NUM_THREADS")) env[ne++] = omp;
  if (!env_value(r->env, r->n_env, "OPENBLAS_NUM_THREADS")) env[ne++] = blas;
  env[ne] = NULL;

  w->a = a;
  w->job_id = r->job_id;
  w->rank = r->rank;
  uv_pipe_init(a->uv, &w->pipe[0], 0);
  uv_pipe_init(a->uv, &w->pipe[1], 0);
  uv_timer_init(a->uv, &w->flush);
  w->pipe[0].data = w->pipe[1].data = w->flush.data = w->proc.data = w;
  w->handles = 3;

  uv_stdio_container_t stdio[WORKER_RELAY_FD + 1];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&w->pipe[0];
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&w->pipe[1];
  stdio[WORKER_RELAY_FD].flags = UV_INHERIT_FD;
  stdio[WORKER_RELAY_FD].data.fd = relay_socket_fd(a->relay);
  char nums[3][24];
  if (switch_user) asuser_exec_argv(a->self_path, r->user, r->uid, r->gid, r->umask, argv, r->n_argv, nums, run);
  else memcpy(run, argv, (r->n_argv + 1) * sizeof *argv);
  uv_process_options_t opt = {0};
  opt.exit_cb = on_worker_exit_cb;
  opt.file = run[0];
  opt.args = run;
  opt.env = env;
  opt.cwd = r->cwd && *r->cwd ? r->cwd : NULL;
  opt.stdio_count = WORKER_RELAY_FD + 1;
  opt.stdio = stdio;
  /* The child inherits the umask at fork, inside uv_spawn (the loop thread only): the submitter's for
   * another user's job, else the one fsdpd was started with. */
  mode_t own_umask = umask(*r->user ? (mode_t)r->umask : a->worker_umask);
  int rc = uv_spawn(a->uv, &w->proc, &opt);
  umask(own_umask);
  if (rc != 0) {
    char why[PATH_MAX + 64];
    snprintf(why, sizeof why, "%s: %s", argv[0], uv_strerror(rc));
    spawn_failed(a, r, why);
    /* uv_spawn initialized the process handle even on failure; close it with the rest. */
    w->handles = 4;
    w->reported = 1;
    worker_close(w);
  } else {
    w->handles = 4;
    w->pipes_open = 2;
    uv_read_start((uv_stream_t *)&w->pipe[0], on_alloc, on_read);
    uv_read_start((uv_stream_t *)&w->pipe[1], on_alloc, on_read);
    w->next = a->workers;
    a->workers = w;
    a->nworkers++;
    /* Only this process may speak as the rank: it runs as the owner (or, as anyone but root, as
     * this daemon's user, the only one it can start workers as) and keeps its pid through exec-as. */
    relay_expect(a->relay, r->job_id, r->rank, switch_user ? (long)r->uid : (long)geteuid(), w->proc.pid);
    log_info("job %llu rank %u: started %s (pid %d, %d threads)", (unsigned long long)r->job_id, r->rank,
             argv[0], w->proc.pid, threads);
  }
  free(argv);
  free(run);
  free(env);
}

static void kill_job(agent_t *a, uint64_t job, int sig) {
  for (worker_t *w = a->workers; w; w = w->next)
    if ((job == 0 || w->job_id == job) && !w->exited) {
      int rc = uv_process_kill(&w->proc, sig);
      if (rc != 0 && rc != UV_ESRCH)
        log_warn("cannot signal job %llu rank %u: %s", (unsigned long long)w->job_id, w->rank, uv_strerror(rc));
    }
}

/* ---------------------------------------------------------------- coordinator messages */

static void reopen_if_rejected(agent_t *a);
static void on_register_timer(uv_timer_t *t);

/* The coordinator's heartbeat period, at least 10 ms. Beats fall on its wall-clock multiples
 * (loop_ms_to_boundary), the same instants on every node. */
static uint64_t heartbeat_ms(const agent_t *a) {
  uint64_t ms = (uint64_t)(a->heartbeat_s * 1000);
  return ms < 10 ? 10 : ms;
}

static void on_heartbeat_timer(uv_timer_t *t) {
  agent_t *a = t->data;
  if (a->reopen) {   /* rejected after having joined (a coordinator restarted with other keys) */
    uv_timer_stop(&a->hb_timer);
    uv_timer_start(&a->reg_timer, on_register_timer, REGISTER_RETRY_MS, REGISTER_RETRY_MS);
    reopen_if_rejected(a);
    return;
  }
  send_node_msg(a, FSDP__MSG__BODY_HEARTBEAT);
  uv_timer_start(&a->hb_timer, on_heartbeat_timer, loop_ms_to_boundary(heartbeat_ms(a)), 0);
}

static void on_register_timer(uv_timer_t *t) {
  agent_t *a = t->data;
  if (a->reopen) reopen_if_rejected(a);
  else if (a->node_id == 0) send_register(a);
}

static void on_message(void *sock, void *arg) {
  agent_t *a = arg;
  Fsdp__Msg *m = NULL;
  wire_env env;
  fsdp_status rc = wire_recv(sock, &env, &m, ZMQ_DONTWAIT);
  if (rc == FSDP_ERR_TIMEOUT) return;
  if (rc != FSDP_OK) {
    log_warn("agent: dropped a malformed message from the coordinator: %s", fsdp_last_error());
    return;
  }
  if (relay_from_coord(a->relay, &env, &m)) {   /* a worker's message, or steps for this node's ranks */
    wire_destroy(&m);
    return;
  }
  switch (m->body_case) {
  case FSDP__MSG__BODY_AGENT_WELCOME: {
    int first = a->node_id == 0;
    a->node_id = m->agent_welcome->node_id;
    a->heartbeat_s = m->agent_welcome->heartbeat_s;
    uv_timer_stop(&a->reg_timer);
    uv_timer_start(&a->hb_timer, on_heartbeat_timer, loop_ms_to_boundary(heartbeat_ms(a)), 0);
    log_info("agent: joined %s as node %u (%d CPU slots, %d GPUs)%s", a->join, a->node_id, a->cpu_slots,
             a->ngpus, first ? "" : " again");
    break;
  }
  case FSDP__MSG__BODY_SPAWN_REQ: handle_spawn(a, m->spawn_req); break;
  case FSDP__MSG__BODY_KILL_REQ:
    kill_job(a, m->kill_req->job_id, m->kill_req->signal ? m->kill_req->signal : SIGKILL);
    break;
  case FSDP__MSG__BODY_ERROR:
    /* The coordinator does not know us (it restarted, or declared us lost): register again. The
     * heartbeats queued while it was away all get this answer; one re-registration is enough. */
    if (a->node_id == 0) break;
    log_warn("agent: coordinator says: %s; registering again", m->error->message);
    a->node_id = 0;
    uv_timer_stop(&a->hb_timer);
    send_register(a);
    uv_timer_start(&a->reg_timer, on_register_timer, REGISTER_RETRY_MS, REGISTER_RETRY_MS);
    break;
  default:
    log_warn("agent: unexpected %s from the coordinator; ignored", wire_body_name(m->body_case));
  }
  wire_destroy(&m);
}

/* ---------------------------------------------------------------- lifetime */

static void resolve_worker_path(agent_t *a, const char *given) {
  if (given && *given) {
    snprintf(a->worker_path, sizeof a->worker_path, "%s", given);
    return;
  }
  char self[PATH_MAX - 32];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    snprintf(a->worker_path, sizeof a->worker_path, "fsdp-worker");
    return;
  }
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (slash) *slash = '\0';
  snprintf(a->worker_path, sizeof a->worker_path, "%s/fsdp-worker", self);
}

/* The CURVE handshake with the coordinator, seen by the socket's monitor. A failure is logged at
 * once and then at most once per AUTH_LOG_EVERY_S while it goes on (the agent keeps retrying). */
static void on_monitor(void *arg, int ev, uint32_t value, const char *endpoint) {
  agent_t *a = arg;
  (void)value, (void)endpoint;
  double now = loop_now_mono();
  if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
    if (a->auth_logged_at > 0) log_info("agent: the CURVE handshake with the coordinator at %s succeeded now", a->join);
    a->auth_logged_at = 0;
    return;
  }
  /* libzmq stops reconnecting a socket after an authentication or protocol failure (reopen); after
   * a connection closed during the handshake it reconnects by itself. */
  if (ev != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) a->reopen = 1;
  if (a->auth_logged_at != 0 && now - a->auth_logged_at <= AUTH_LOG_EVERY_S) return;
  a->auth_logged_at = now;
  if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
    log_error("agent: the coordinator at %s rejected this node's CURVE key %s: add that line to the coordinator's "
              "STATE/keys/authorized (retrying)", a->join, a->client_pub);
  else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    /* The coordinator closes a connection whose HELLO it cannot open: the key it was sealed for is not its own. */
    log_error("agent: the CURVE handshake with the coordinator at %s failed: the server key does not match (--server-key "
              "%s is not that coordinator's STATE/keys/server.pub); retrying", a->join, a->server_key_path);
  else
    log_error("agent: the CURVE handshake with %s failed: is --server-key the coordinator's STATE/keys/server.pub, "
              "and is that endpoint an fsdpd cluster endpoint? (retrying)", a->join);
}

static void close_socket(agent_t *a, int linger) {
  loop_zsock_destroy(&a->zs);
  zmon_destroy(&a->mon);
  if (a->sock) zmq_setsockopt(a->sock, ZMQ_LINGER, &linger, sizeof linger), zmq_close(a->sock);
  a->sock = NULL;
}

/* The DEALER to the coordinator (CURVE for tcp://), its handshake monitor, and its loop watch. */
static fsdp_status open_socket(agent_t *a) {
  a->sock = zmq_socket(a->zctx, ZMQ_DEALER);
  if (!a->sock) return fsdp_set_error(FSDP_ERR_COMM, "zmq_socket(DEALER): %s", zmq_strerror(zmq_errno()));
  TRY(wire_socket_setup(a->sock));
  int hwm = 0;   /* never drop a worker's exit or log lines: queue without limit */
  zmq_setsockopt(a->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(a->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
  if (curve_is_tcp(a->join)) {
    char what[600];
    snprintf(what, sizeof what, "--join %s", a->join);
    TRY(curve_client_apply(a->sock, a->join, a->server_key_path, a->client_key_path, what));
    TRY(zmon_new(a->uv, a->zctx, a->sock, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, on_monitor, a, &a->mon));
  }
  if (zmq_connect(a->sock, a->join) != 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "--join %s: %s (expected tcp://HOST:PORT or ipc://PATH)", a->join,
                          zmq_strerror(zmq_errno()));
  return loop_zsock_new(a->uv, a->sock, on_message, a, &a->zs);
}

/* A socket whose key was rejected is dead for good (libzmq stops reconnecting after an
 * authentication failure): open a new one, so that listing the key later lets this node in. */
static void reopen_if_rejected(agent_t *a) {
  if (!a->reopen || a->shutting_down) return;
  a->reopen = 0;
  close_socket(a, 0);
  if (open_socket(a) != FSDP_OK) {
    log_error("agent: cannot reconnect to %s: %s", a->join, fsdp_last_error());
    close_socket(a, 0);
    a->reopen = 1;   /* try again at the next timer tick */
    return;
  }
  a->node_id = 0;
  send_register(a);
}

fsdp_status agent_new(uv_loop_t *uv, void *zctx, const agent_config *cfg, agent_t **out) {
  *out = NULL;
  TRY(agent_check_gpus(cfg->gpus ? cfg->gpus : "none"));
  if (cfg->cpu_workers < 0 || cfg->cpu_workers > 4096)
    return fsdp_set_error(FSDP_ERR_RANGE, "--cpu-workers %d: allowed 0..4096", cfg->cpu_workers);
  agent_t *a = calloc(1, sizeof *a);
  if (!a) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the agent");
  a->uv = uv;
  snprintf(a->join, sizeof a->join, "%s", cfg->join);
  if (cfg->name && *cfg->name) snprintf(a->name, sizeof a->name, "%s", cfg->name);
  else if (gethostname(a->name, sizeof a->name - 1) != 0) snprintf(a->name, sizeof a->name, "node");
  resolve_worker_path(a, cfg->worker_path);
  ssize_t sn = readlink("/proc/self/exe", a->self_path, sizeof a->self_path - 1);
  a->self_path[sn > 0 ? sn : 0] = '\0';
  a->cpu_slots = cfg->cpu_workers;
  a->worker_umask = cfg->worker_umask;
  a->host_mem = mem_available();
  a->cpu_slot_mem = a->cpu_slots ? a->host_mem / (uint64_t)a->cpu_slots : 0;
  long nc = sysconf(_SC_NPROCESSORS_ONLN);
  a->ncpu = nc > 0 ? (int)nc : 1;
  discover_gpus(a, cfg->gpus);

  fsdp_status rc = FSDP_OK;
  a->zctx = zctx;
  if (curve_is_tcp(a->join)) {
    char what[600];
    snprintf(what, sizeof what, "--join %s", a->join);
    if (!cfg->server_key || !*cfg->server_key || !cfg->client_key || !*cfg->client_key) {
      rc = curve_client_apply(NULL, a->join, NULL, NULL, what);   /* the "needs CURVE keys" error */
      goto fail;
    }
    /* A reconnect after a rejected key reopens them by path: absolute, whatever the cwd. */
    if (!realpath(cfg->server_key, a->server_key_path) || !realpath(cfg->client_key, a->client_key_path)) {
      rc = fsdp_set_error(FSDP_ERR_IO, "cannot resolve the key file paths %s, %s: %s", cfg->server_key, cfg->client_key,
                          strerror(errno));
      goto fail;
    }
    char sec[CURVE_KEY_LEN + 1];
    TRY_GOTO(curve_keypair_load(a->client_key_path, a->client_pub, sec), rc, fail);
    memset(sec, 0, sizeof sec);
  }
  TRY_GOTO(open_socket(a), rc, fail);
  TRY_GOTO(relay_new(uv, zctx, cfg->run_dir, send_up, a, &a->relay), rc, fail);
  uv_timer_init(uv, &a->reg_timer);
  uv_timer_init(uv, &a->hb_timer);
  uv_timer_init(uv, &a->kill_timer);
  a->reg_timer.data = a->hb_timer.data = a->kill_timer.data = a;
  a->handles = 3;
  send_register(a);
  uv_timer_start(&a->reg_timer, on_register_timer, REGISTER_RETRY_MS, REGISTER_RETRY_MS);
  log_info("agent: node %s, %.1f GiB of host memory available, %d CPU slots (%.1f GiB each), %d GPUs, workers from %s",
           a->name, (double)a->host_mem / (1u << 30), a->cpu_slots, (double)a->cpu_slot_mem / (1u << 30), a->ngpus,
           a->worker_path);
  *out = a;
  return FSDP_OK;
fail:
  relay_destroy(&a->relay);
  close_socket(a, 0);
  free(a);
  return rc;
}


static void agent_check_shutdown(agent_t *a) {
  if (a->shutting_down && a->nworkers == 0 && a->shutdown_done) {
    void (*done)(void *) = a->shutdown_done;
    a->shutdown_done = NULL;
    uv_timer_stop(&a->kill_timer);
    uv_timer_stop(&a->hb_timer);
    /* goodbye: the node shows as stopped, not lost (agent_destroy lingers for it) */
    if (a->node_id && a->sock) send_node_msg(a, FSDP__MSG__BODY_AGENT_BYE);
    done(a->shutdown_arg);
  }
}

static void on_kill_timer(uv_timer_t *t) {
  agent_t *a = t->data;
  if (a->nworkers) log_warn("agent: %d workers still alive after the grace period; killing them", a->nworkers);
  kill_job(a, 0, SIGKILL);
}

void agent_shutdown(agent_t *a, double grace_s, void (*done)(void *), void *arg) {
  a->shutting_down = 1;
  a->shutdown_done = done;
  a->shutdown_arg = arg;
  uv_timer_stop(&a->reg_timer);
  kill_job(a, 0, SIGTERM);
  uv_timer_start(&a->kill_timer, on_kill_timer, (uint64_t)(grace_s * 1000), 0);
  agent_check_shutdown(a);
}

static void on_agent_handle_close(uv_handle_t *h) {
  agent_t *a = h->data;
  if (--a->handles == 0) free(a);
}

void agent_destroy(agent_t **p) {
  if (!p || !*p) return;
  agent_t *a = *p;
  *p = NULL;
  kill_job(a, 0, SIGKILL);
  while (a->workers) {
    worker_t *w = a->workers;
    a->workers = w->next;
    w->reported = 1;
    worker_close(w);
  }
  relay_destroy(&a->relay);
  close_socket(a, 500);   /* the last worker_exit and log lines may still be queued: 500 ms linger */
  uv_close((uv_handle_t *)&a->reg_timer, on_agent_handle_close);
  uv_close((uv_handle_t *)&a->hb_timer, on_agent_handle_close);
  uv_close((uv_handle_t *)&a->kill_timer, on_agent_handle_close);
}
