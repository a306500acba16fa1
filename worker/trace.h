/* trace — a worker's span recorder: when each all-gather, forward, backward, reduce-scatter and
 * optimizer step actually ran, on which lane (host thread, compute stream, comm thread), kept in a
 * bounded ring that the coordinator pulls on demand (`fsdpctl trace`, docs/observability.md).
 *
 * A span is one fixed-size record (trace_span): what (kind, unit), where (lane), when (start and
 * end in µs of CLOCK_MONOTONIC, monotime.h, the clock every thread of the process shares) and the step. The
 * ring holds TRACE_RING records; a new span overwrites the oldest, so a worker keeps the last
 * ⌊TRACE_RING / spans per step⌋ steps (trace_retained says which, whole steps only).
 *
 * Writers: spans are recorded where the work runs, not where the host submits it: the compute
 * stream's spans by the device (dev_ops.trace: a pseudo-op on the CPU device's stream thread,
 * timing events resolved after the step on CUDA), the collectives' by the comm thread (comm.c)
 * or, with NCCL, from timing events on its stream resolved at comm_wait (comm_nccl.c), the step's
 * by the host. trace_add may be called from any thread: a slot is claimed with one
 * atomic increment, taken with one compare-and-swap and published with a release store of its
 * sequence number — no lock, no allocation; a writer that finds its slot still held by one a whole
 * ring behind it drops its record. trace_begin/trace_end keep a small stack of open spans per lane; each lane has one
 * writer thread at a time (the lane's own), which is what makes that stack lock-free too.
 *
 * Reader: trace_collect copies spans out; it is called between steps (the worker answers a pull
 * while it waits for its next command), when the stream is idle and every collective is done, so
 * every span of a finished step is published. A record being overwritten meanwhile is skipped by
 * its sequence number, never returned torn.
 *
 * FSDP_TRACE=0 in a worker's environment turns recording off (trace_from_env gives NULL, and every
 * recorder is NULL-safe), for measuring the cost (bench/trace_overhead.sh).
 */
#ifndef FSDP_TRACE_H
#define FSDP_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Spans kept per worker (32 bytes each with the ring's sequence number: 2 MiB). A GPT-2 of L blocks
 * (sharding full) records G·(5L + 5) + 4 spans a step at grad_accum G: GPT-2 small, 69 at G = 1, so
 * the ring keeps its last ~950 steps (docs/observability.md). */
#define TRACE_RING 65536
#define TRACE_DEPTH 8   /* nesting of open spans per lane (step ⊃ phase needs 2) */

typedef enum {
  TRACE_STEP = 0, TRACE_ALLGATHER, TRACE_FORWARD, TRACE_LOSS, TRACE_BACKWARD, TRACE_REDUCESCATTER,
  TRACE_ALLREDUCE, TRACE_OPTIMIZER, TRACE_EVAL, TRACE_CKPT_SNAPSHOT, TRACE_CKPT_WRITE, TRACE_NKIND
} trace_kind;
/* The wire carries them as numbers (proto/fsdp.proto TraceSpans); fsdpctl names them (client/ctl_trace.c:
 * "allgather h.3", "optimizer", "checkpoint snapshot"; the lanes "host", "compute stream", "comm",
 * "comm (shard group)", "comm (replica group)", "checkpoint writer"). A checkpoint's snapshot (the
 * time training stops for it) is on the host lane, its file's write on the checkpoint writer's. */

/* The comm lanes: the runtime's world comm (every collective outside hybrid sharding; the step's
 * scalars), and with sharding = hybrid the shard group's comm (all-gathers, reduce-scatters) and
 * the replica comm (the all-reduce across groups), each with its own comm thread. */
typedef enum {
  TRACE_HOST = 0, TRACE_STREAM, TRACE_COMM, TRACE_COMM_GROUP, TRACE_COMM_REPLICA, TRACE_CKPT, TRACE_NLANE
} trace_lane;

#define TRACE_NO_UNIT (-1)   /* a span of no unit: the step, the optimizer, the scalars' all-reduce */

typedef struct trace_span {
  uint64_t t0_us, t1_us;   /* CLOCK_MONOTONIC */
  int32_t step;
  int16_t unit;            /* plan unit, or TRACE_NO_UNIT */
  uint8_t kind, lane;
} trace_span;

typedef struct trace trace_t;

fsdp_status trace_new(trace_t **out);
/* A new trace, or *OUT = NULL when FSDP_TRACE is "0" (recording off). A value other than 0 or 1
 * is an error that names both. */
fsdp_status trace_from_env(trace_t **out);
void trace_destroy(trace_t **t);   /* NULL-safe; *t becomes NULL */

/* Record one finished span (any thread). NULL-safe. */
void trace_add(trace_t *t, trace_lane lane, trace_kind kind, int unit, int step, uint64_t t0_us, uint64_t t1_us);
/* Open a span on LANE at T_US, and close the innermost open one at T_US as KIND/UNIT/STEP (the
 * lane's writer thread only). An end without a begin, or a begin beyond TRACE_DEPTH, records
 * nothing. NULL-safe. */
void trace_begin(trace_t *t, trace_lane lane, uint64_t t_us);
void trace_end(trace_t *t, trace_lane lane, trace_kind kind, int unit, int step, uint64_t t_us);

/* The step the host is running (set by the runtime at the start of a step); the comm thread's
 * spans carry the step their collective was issued in. */
void trace_set_step(trace_t *t, int step);
int trace_step(const trace_t *t);

/* The whole steps the ring holds: [*first, *last] (both 0 when it holds none). */
void trace_retained(const trace_t *t, int *first, int *last);
/* The spans of steps [a, b] in recording order into *OUT (malloc'd; the caller frees), *N of them. */
fsdp_status trace_collect(const trace_t *t, int a, int b, trace_span **out, size_t *n);

#endif
