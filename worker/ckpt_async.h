/* ckpt_async — a rank's asynchronous checkpoint write (docs/checkpoints.md, "Asynchronous saves"):
 * a host snapshot of the rank's shards (parameters, AdamW m and v) and a writer thread that writes
 * it as the rank's checkpoint file (ckpt_writer_*: CRC32Cs, the file, its fsync) while training
 * goes on. The collective part (when every rank's file is complete, rank 0 writes the manifest) is
 * the runtime's: runtime_checkpoint_async and runtime_checkpoint_settle (runtime.h).
 *
 * Ownership and threads: the worker's main thread owns a ckpt_async and is the only one to call
 * these functions; the writer thread reads the snapshot and the plan handed to ckpt_async_start
 * and nothing else, until the main thread has collected the write (ckpt_async_wait). The snapshot
 * is allocated once, before the first step (runtime_checkpoint_prepare), as the device's host memory
 * (pinned on CUDA; page-aligned, so that the writer can use O_DIRECT), and reused: a save that would
 * start while a write is in flight waits for it first. Where the shards are host memory (the CPU
 * device, optimizer offload) the writer reads them where they live instead (ckpt_async_start_live)
 * and training goes on at once: the forward and backward passes only read them, and before the
 * optimizer's next update ckpt_async_detach copies what the write has not yet read into the
 * snapshot (nothing, where the write is over by then). The writer thread runs below the training
 * threads (SCHED_IDLE, else nice 19): it writes in the CPU time training leaves. Once training waits
 * for the write (ckpt_async_wait: the next save, the last step, a stop), the writer hands it over at
 * its next chunk (CKPT_CHUNK) and the main thread writes the rest at its own priority: on a node
 * whose cores other work keeps busy, a writer below everything would otherwise leave training
 * waiting for CPU time it does not get (a thread cannot raise itself out of SCHED_IDLE without
 * CAP_SYS_NICE or RLIMIT_NICE). */
#ifndef FSDP_CKPT_ASYNC_H
#define FSDP_CKPT_ASYNC_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "device.h"
#include "plan.h"

typedef struct ckpt_async ckpt_async;

/* What one save cost, for reports. */
typedef struct ckpt_save_stats {
  int step;                /* the checkpoint's step; 0: none */
  double blocked_s;        /* training stopped: waiting for the previous write, the snapshot */
  double wait_s;           /* the part of blocked_s spent waiting for the previous write */
  double write_s;          /* the writer's time for the file: CRC32Cs, writes, fsync, rename */
  uint64_t bytes;          /* this rank's file */
  int handed_over;         /* the write was finished by the thread that waited for it */
  uint64_t detached_bytes; /* of a write begun from the live shards: the bytes it had left when they
                              were about to change, copied then (ckpt_async_detach; in blocked_s) */
  uint64_t t0_us, t1_us;   /* the write's start and end (trace_now_us's clock), for its trace span */
} ckpt_save_stats;

/* A writer thread, idle, and no snapshot yet. */
fsdp_status ckpt_async_new(ckpt_async **out);
/* Wait for a write in flight (its result is dropped), stop the thread, free the snapshot. NULL-safe. */
void ckpt_async_destroy(ckpt_async **a);

/* The snapshot's three buffers (param, m, v: BYTES each, host memory of DEV), allocated at the
 * first call; a later call with another size or device reallocates. Not while a write is in flight. */
fsdp_status ckpt_async_buffers(ckpt_async *a, device_t *dev, size_t bytes, float *buf[CKPT_NSEC]);
/* Hand the snapshot to the writer: write RANK's file of STEP under DIR for the writer's plan P
 * (borrowed: it must outlive the write), or, when RANK is beyond P's world (hybrid's other groups),
 * nothing: the write is then complete at once. *OWN (may be NULL) passes a plan A frees once the
 * write is collected (hybrid's group plan, which P then is). STATS: the figures so far (step,
 * blocked time), completed by the write's. */
void ckpt_async_start(ckpt_async *a, const char *dir, const plan_t *p, plan_t **own, int rank, int step,
                      const ckpt_save_stats *stats);
/* The same, the writer reading the shards where they live (LIVE: param, m, v, host memory; no
 * snapshot taken): the caller must call ckpt_async_detach before anything changes them. */
void ckpt_async_start_live(ckpt_async *a, const char *dir, const plan_t *p, plan_t **own, int rank, int step,
                           const ckpt_save_stats *stats, const float *const live[CKPT_NSEC]);
/* The live shards are about to change (the optimizer's next update): the bytes the write has not
 * yet read are copied to the snapshot, and it goes on from there. Waits for the chunk being written
 * (at most CKPT_CHUNK bytes' I/O); a no-op when no write reads live shards (none started live, it
 * was detached already, or it has read all it needs). The seconds it took, counted in the save's
 * blocked_s. */
double ckpt_async_detach(ckpt_async *a);
/* Whether a write was started and not yet collected. */
int ckpt_async_pending(ckpt_async *a);
/* Whether the pending write has ended (no waiting). */
int ckpt_async_finished(ckpt_async *a);
/* Wait for the pending write to end and collect it: its status (its message recorded on this
 * thread), and its figures in *STATS (may be NULL). FSDP_OK when none is pending. A write still in
 * progress is finished by the calling thread from the writer's next chunk on. */
fsdp_status ckpt_async_wait(ckpt_async *a, ckpt_save_stats *stats);
/* Ask the writer to hand the pending write over at its next chunk, to the next ckpt_async_wait
 * (which asks it too; a test asks ahead, to choose the chunk). */
void ckpt_async_hurry(ckpt_async *a);
/* The writer thread's scheduling class: "idle" (SCHED_IDLE), "nice 19" (the fallback where SCHED_IDLE
 * is refused) or "normal" (both refused; logged). */
const char *ckpt_async_priority(const ckpt_async *a);
/* The plan and directory of the latest write (for its manifest), valid until the next start. */
const plan_t *ckpt_async_plan(const ckpt_async *a);
const char *ckpt_async_dir(const ckpt_async *a);

#endif
