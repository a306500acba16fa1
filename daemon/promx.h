/* promx — the coordinator's Prometheus exposition: per-job figures and per-rank cumulative
 * counters kept from the step reports, and the rendering of the text format (version 0.0.4) that
 * `fsdpd --metrics` serves (docs/observability.md lists every series).
 *
 * Ownership: an active job owns its promx_job (job_steps_view.px, created at its first completed step).
 * When the job is freed after it ended, promx_retire moves the record to the coordinator's list of
 * finished jobs (coord.px_done), which keeps it PROMX_KEEP_S seconds (at most PROMX_KEEP_JOBS of
 * them), so that a scrape after the end still sees the final figures. Counters only grow: a
 * restarted attempt of the same job keeps adding to them.
 *
 * promx_render renders a read-only view (promx_view) that the coordinator fills in from its jobs and
 * nodes (job_render_metrics); this module never reads the coordinator's structures.
 *
 * Thread: the uv loop's only (the records change with every step); the text goes to the HTTP
 * thread through metricsrv_publish (metricsrv.h).
 */
#ifndef FSDP_DAEMON_PROMX_H
#define FSDP_DAEMON_PROMX_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "fsdp.pb-c.h"
#include "plan.h"
#include "stepstats.h"

#define PROMX_KEEP_S 600.0    /* a finished job's series stay this long after it was freed */
#define PROMX_KEEP_JOBS 32    /* and at most this many finished jobs are kept */
#define PROMX_RANK_SERIES_MAX 64   /* per-rank series for jobs up to this many ranks only */

typedef struct promx_rank {
  uint64_t peak_bytes[MEM_NCAT];          /* the latest step's peaks (gauge) */
  double phase_s[STEPSTATS_NPHASE];       /* summed over every step (counter) */
  uint64_t sent_bytes[COLL_NKIND];        /* summed over every step (counter) */
  uint64_t sent_inter_bytes[COLL_NKIND];  /* the part that crossed shard groups (hybrid), likewise */
} promx_rank;

typedef struct promx_job {
  struct promx_job *next;   /* in coord.px_done */
  uint64_t id;
  char name[64];
  int state;                /* fsdp.JobState, kept current by the coordinator */
  uint32_t step;
  double loss, tokens_per_s;
  int has_val;
  double val_loss;
  double mfu;               /* < 0: no peak FLOP/s known for the job's devices */
  int has_ckpt;             /* the latest complete checkpoint save (metrics_ckpt): */
  double ckpt_blocked_s, ckpt_write_s;
  uint64_t ckpt_bytes;
  uint64_t tokens_total, steps_total;
  double ended_at;          /* monotonic; set by promx_retire */
  int world;
  promx_rank *ranks;
} promx_job;

/* Create *PX if needed (a job's first state change) and record job ID's NAME and STATE. */
fsdp_status promx_set_state(promx_job **px, uint64_t id, const char *name, int state);
/* Add one completed step SUM of job ID (world WORLD) to *PX, creating it on the first step. The
 * per-rank series come from SUM->ranks, kept only for jobs of at most PROMX_RANK_SERIES_MAX ranks,
 * whose every step carries every rank (steps.h): the series per job stay bounded.
 * PEAK_FLOPS is the sum of the ranks' devices' peak FLOP/s (0: unknown, no MFU), FLOPS_PER_TOKEN the plan's. */
fsdp_status promx_on_step(promx_job **px, uint64_t id, const char *name, int state, const Fsdp__StepSummary *sum,
                          size_t world, double flops_per_token, double peak_flops);

/* The peak dense bf16 FLOP/s of a device named NAME (a CUDA device's product name), 0 when it is
 * not in the table (every CPU). */
double promx_peak_flops(const char *name);

void promx_job_free(promx_job **px);   /* NULL-safe; clears *PX */

/* Move *PX (taken, cleared) to the front of the finished list *DONE, stamped NOW; then drop the
 * records older than PROMX_KEEP_S or beyond PROMX_KEEP_JOBS. */
void promx_retire(promx_job **done, promx_job **px, double now);
/* Drop the finished records older than PROMX_KEEP_S at NOW. */
void promx_expire(promx_job **done, double now);

/* A node as the exposition shows it. */
typedef struct promx_node {
  const char *name;
  int up;                   /* its agent sends heartbeats */
  int devices[2][2];        /* device slots by [cuda?][busy?] */
} promx_node;

/* What one rendering shows: the job records (the active jobs' first, then the finished ones'), the
 * nodes, and the count of malformed messages. Borrowed for the call. */
typedef struct promx_view {
  const promx_job *const *jobs;
  size_t njobs;
  const promx_node *nodes;
  size_t nnodes;
  uint64_t bad_msgs;
} promx_view;

/* The whole exposition text of V into a malloc'd NUL-terminated *TEXT of *LEN bytes. */
fsdp_status promx_render(const promx_view *v, char **text, size_t *len);

#endif
