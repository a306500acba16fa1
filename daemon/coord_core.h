/* coord_core — the coordinator's shared state and the small helpers every part of it uses.
 *
 * The coordinator (coordinator.h) is split by responsibility: job.[ch] the job's lifecycle (one
 * state, events in, a transition table) with restart recovery, schedule.[ch] scheduling and
 * placement, steps.[ch] the step pipeline, kv.[ch] the workers' rendezvous store, ctlsrv.[ch] the
 * fsdpctl request handlers, zap.[ch] CURVE client admission, and coordinator.c the cluster service
 * (agents, workers), the timers and the lifetime.
 * This header holds what they share: the node, slot and rank records and `struct coord`, which owns
 * them all (a job_t is opaque here: job.h reads it). Everything runs on the uv loop's thread; nothing here locks.
 */
#ifndef FSDP_DAEMON_COORD_CORE_H
#define FSDP_DAEMON_COORD_CORE_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "coordinator.h"
#include "curve.h"
#include "jobs_db.h"
#include "jobspec.h"
#include "loop.h"
#include "peer.h"
#include "plan.h"
#include "promx.h"
#include "wire.h"

#define LOST_BEATS 3
#define TICK_MS 250
#define START_TIMEOUT_MIN_S 120.0   /* spawn → every rank ready; covers a cold start of a big model */
#define KILL_GRACE_S 3.0            /* SIGTERM → SIGKILL for cancelled jobs */
#define DRAIN_LIMIT_S 30.0          /* a job's devices are freed at the latest this long after it ended */
#define SECONDARY_GRACE_S 1.0       /* see job_t.pending */
#define BAD_LOG_EVERY_S 10.0        /* malformed messages: one log line per this long */
#define LOG_CHUNK_DEFAULT 65536u
#define LOG_CHUNK_MAX (WIRE_MAX_STRING - 4096)

enum { ST_QUEUED = 1, ST_STARTING, ST_RUNNING, ST_SUCCEEDED, ST_FAILED, ST_CANCELLED };

typedef struct slot {
  int kind;                  /* fsdp.DeviceKind */
  uint32_t index;
  char name[128];
  uint64_t mem;
  uint64_t job_id;           /* 0: free */
  uint32_t rank;
} slot_t;

typedef struct node {
  uint32_t id;
  char name[256];
  uint8_t ident[WIRE_MAX_ENV_FRAME];
  size_t ident_len;
  int lost;                  /* no heartbeat for LOST_BEATS intervals, or stopped */
  int stopped;               /* its agent said goodbye (AgentBye): lost too, but on purpose */
  uint32_t pid;              /* its agent's process (AgentRegister.pid) */
  double gone_since;         /* monotonic: when it was lost or stopped; dropped cfg.forget_s later */
  double last_seen;          /* monotonic */
  double last_seen_wall;
  slot_t *slots;
  int nslots;
  uint64_t host_mem;         /* host memory available when its agent started (AgentRegister); 0 unknown */
} node_t;

typedef struct rank_st {
  int node;                  /* index into c->nodes */
  int slot;
  uint8_t ident[WIRE_MAX_ENV_FRAME];   /* its identity at its node's relay (relay.h): the coordinator
                                        * reaches it as [node ident][ident] */
  size_t ident_len;          /* 0 until hello */
  int alive;                 /* spawned, no worker_exit yet */
  int ready, stopped;
  int errored;               /* sent worker_error: its own exit is a consequence, not a cause */
} rank_st;

/* A job: the job module's own (job_priv.h); every other file uses job.h's accessors and events. */
typedef struct job job_t;

typedef struct tracepull tracepull;

typedef struct kv_entry {
  struct kv_entry *next;
  char *key;
  uint8_t *val;
  size_t len;
} kv_entry;

typedef struct kv_wait {
  struct kv_wait *next;
  uint64_t job_id;
  char *key;
  wire_env env;
} kv_wait;

/* A job state the database refused (see job_retry_unrecorded). */
typedef struct unrecorded {
  struct unrecorded *next;
  uint64_t id;
  int state;
  double at;
  char reason[1024];
} unrecorded_t;

struct coord {
  uv_loop_t *uv;
  coord_config cfg;
  char state_dir[PATH_MAX];
  int jobs_fd;               /* STATE/jobs, opened without following a link; job directories are made in it */
  char self_name[PEER_NAME_MAX];   /* the user fsdpd runs as */
  char ctl_ep[PATH_MAX + 16], listen_ep[PATH_MAX + 16];
  void *ctl, *cluster;
  loop_zsock *ctl_zs, *cluster_zs;
  int ctl_bound;
  jobs_db *db;
  node_t *nodes;
  int nnodes;
  uint32_t next_node_id;
  job_t *jobs;               /* active jobs (queued, starting, running, draining), by id */
  kv_entry *kv;
  kv_wait *kv_waits;
  unrecorded_t *unrecorded;   /* states not yet in jobs.db (a full disk) */
  uv_timer_t tick;
  uv_timer_t bind_timer;     /* embedded: serve ctl after 3 s even if no agent registered */
  int bind_timer_used;
  int handles;
  void *zctx;
  int shutting_down;
  void (*shutdown_done)(void *);
  void *shutdown_arg;
  double shutdown_deadline;
  uint64_t bad_msgs, bad_unlogged;   /* malformed messages: all, and those since the last log line */
  double bad_logged_at;
  double refused_logged_at;          /* cluster peers refused by who they are (coordinator.c) */
  /* CURVE (tcp:// endpoints): the server keypair from STATE/keys/ and the ZAP handler that admits
   * clients listed in STATE/keys/authorized (plus this daemon's own key: the embedded agent). */
  int curve;
  char server_pub[CURVE_KEY_LEN + 1], server_sec[CURVE_KEY_LEN + 1];
  char authorized_path[PATH_MAX + 32];
  void *zap;
  loop_zsock *zap_zs;
  struct zap_watch *watches[2];   /* the tcp:// sockets' handshake monitors (zap_watch) */
  char last_rejected[CURVE_KEY_LEN + 1];
  double last_rejected_at;
  promx_job *px_done;        /* finished jobs' figures, still served for PROMX_KEEP_S (promx.h) */
  struct tracepull *pulls;   /* `fsdpctl trace` pulls waiting for their ranks (tracepull.h) */
  uint32_t next_pull_id;
  int *node_hash;            /* open addressing over node idents (coord_find_node); rebuilt when stale */
  int node_hash_cap, node_hash_stale;
  double last_tick;          /* monotonic: the last on_tick, to tell a busy loop from silent nodes */
};

/* Append one timestamped line to DIR/job.log, the coordinator's record of a job. */
void coord_job_log(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Send M to the cluster peer (an agent) with routing identity IDENT; a failure is logged. */
void coord_send(coord_t *c, const uint8_t *ident, size_t len, Fsdp__Msg *m);
/* Answer a request received on SOCK with envelope ENV: a message, an error, an ack. */
void coord_reply(void *sock, const wire_env *env, Fsdp__Msg *m);
void coord_reply_error(void *sock, const wire_env *env, fsdp_status code, const char *msg);
void coord_reply_ack(void *sock, const wire_env *env);

/* Count a malformed message received on WHERE ("ctl", "cluster") and log it, at most one line
 * per BAD_LOG_EVERY_S with the count of those not logged: garbage at line rate must not fill the
 * disk with the log. */
void coord_note_bad(coord_t *c, const char *where, const char *why);


/* As root, make the ipc:// socket file of EP connectable by every local user (0666): who may do what
 * is decided per connection (zap.h, peer.h), not by the file's mode. Nothing otherwise. */
void coord_open_socket_file(const char *ep);


/* The ranks per node of a job of WORLD ranks of KIND packed as schedule_try packs them: the most
 * devices of KIND on one live node, at most WORLD (0 with none). Hybrid's default shard_group, taken
 * at submit (job_from_spec) and again when the job starts (schedule_regroup). */
int coord_ranks_per_node(const coord_t *c, int kind, int world);
/* "GPUs" or "CPU slots". */
const char *coord_kind_name(int kind);

/* The registered node with identity IDENT; NULL when there is none. */
node_t *coord_find_node(coord_t *c, const uint8_t *ident, size_t len);

#endif
