/* agent — the node role of fsdpd: reports this node's devices, spawns and reaps workers.
 *
 * The agent connects a DEALER to the coordinator's cluster endpoint (remote with --join, its own
 * process's endpoint in the embedded default: one code path), sends agent_register, and after
 * agent_welcome a heartbeat every heartbeat_s. A heartbeat answered with an error (a coordinator
 * that restarted and no longer knows this node) makes it register again.
 * spawn_req: argv[0] "fsdp-worker" is resolved next to this executable (/proc/self/exe), the
 * "--connect" argument is replaced by this node's relay (relay.h: the workers talk to the
 * coordinator through it, and it folds their step reports into one per node per step; the worker
 * gets the relay's socket as descriptor 3 and is the only process the relay admits as its rank);
 * the environment is the request's (the job id, local ranks and the worker's token) and a short list
 * of the daemon's own (worker_env_passes: paths, locale, the runtime's FSDP_/CUDA_/NCCL_/GLOO_ knobs);
 * OMP_NUM_THREADS and OPENBLAS_NUM_THREADS are set to max(1, ncpu / FSDPD_LOCAL_RANKS) unless the
 * request sets them;
 * the worker's stdout and stderr are piped back as log_chunk, and its end as worker_exit (sent
 * after its output has been forwarded). kill_req signals every worker of a job.
 *
 * GPUs: --gpus all|LIST|none, discovered with dlopen("libcuda.so.1") (never linked); no driver
 * means zero GPUs and one log line. CPU slots carry MemAvailable / cpu_slots as mem_bytes.
 * Everything runs on the uv loop's thread.
 */
#ifndef FSDP_DAEMON_AGENT_H
#define FSDP_DAEMON_AGENT_H

#include <sys/types.h>
#include <uv.h>

#include "err.h"

typedef struct agent_config {
  const char *join;         /* the coordinator's cluster endpoint */
  const char *name;         /* node name; NULL: the host name */
  int cpu_workers;          /* CPU slots */
  const char *gpus;         /* "all", "none" or a comma-separated list of CUDA device indices */
  const char *worker_path;  /* NULL: fsdp-worker next to /proc/self/exe */
  /* CURVE, required when join is tcp:// (common/curve.h): the coordinator's public key file and
   * this node's keypair file. The workers never see them: they speak to this node's relay only. */
  const char *server_key;
  const char *client_key;
  mode_t worker_umask;      /* the umask workers start with (fsdpd's own is 077) */
  const char *run_dir;      /* the relay's socket directory: this daemon's user's alone (mode 0700) */
} agent_config;

typedef struct agent agent_t;

fsdp_status agent_new(uv_loop_t *uv, void *zctx, const agent_config *cfg, agent_t **out);
/* --gpus: all, none, or device indices separated by single commas ("0,1"); else FSDP_ERR_INVALID
 * with a one-line message. fsdpd checks it before anything starts; agent_new again. */
fsdp_status agent_check_gpus(const char *list);
/* Terminate every worker (SIGTERM, SIGKILL after GRACE_S seconds), then call DONE(ARG) once all
 * have been reaped and reported. */
void agent_shutdown(agent_t *a, double grace_s, void (*done)(void *), void *arg);
/* Kills what is left (SIGKILL), closes the socket and handles. NULL-safe. */
void agent_destroy(agent_t **a);

#endif
