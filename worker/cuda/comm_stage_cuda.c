/* comm_stage_cuda — gloo for CUDA workers (CUDA build only): the collectives take device
 * pointers and are staged through pinned host memory around the gloo adapter, so that several
 * workers can share one GPU in tests (NCCL wants one rank per GPU).
 *
 * A threaded backend for comm.c: run() executes on the comm thread, one collective at a time.
 * Each collective copies its input device→host on the comm's own stream, waits for the copy,
 * runs the gloo collective on the pinned buffer, and copies the result host→device. The stream is
 * a blocking one, so its copies wait for work already queued on the legacy default stream; work
 * on the caller's other streams is ordered by the op's events: comm.c waits for `after`'s CPU mark
 * before run() (the CUDA device completes it when its stream reaches the record, host_marks), and
 * run() records `done`'s native event after the copy back; the CUDA device's wait blocks its
 * stream on done's CPU mark until comm.c completes it (device_cuda.c).
 *
 * The pinned buffer is allocated once, at creation (stage_bytes, from the plan: plan_stage_bytes),
 * and freed at destroy: never while collectives run. cudaMallocHost and cudaFreeHost synchronize
 * the device, and the compute stream may then be parked in a host function that waits for the very
 * collective the comm thread is running: a deadlock. A collective larger than the buffer is staged
 * in pieces (each piece a gloo collective of its own over the same elements). Counted under
 * MEM_COMM with mem_account(). bf16 is gloo's: all-gather moves bytes, sums round to bf16.
 */
#ifndef FSDP_HAVE_CUDA
#define FSDP_HAVE_CUDA 1   /* this file is compiled only in the CUDA build (libfsdpcuda) */
#endif
#include "comm.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

/* The least pinned bytes per block of a piece: (world + 1) of them at least, so that a piece is
 * never so small that gloo's per-call cost dominates. */
#define STAGE_MIN_PIECE ((size_t)64 << 10)

typedef struct stage_impl {
  comm_gloo *g;            /* NULL with world = 1 */
  int device, rank, world;
  cudaStream_t stream;
  char *pin;               /* cudaMallocHost, at creation (world > 1) */
  size_t pin_bytes;
} stage_impl;

static fsdp_status cuda_err(cudaError_t e, const char *what) {
  return fsdp_set_error(FSDP_ERR_CUDA, "gloo-staged %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define CUDA_TRY(call, what)                         \
  do {                                               \
    cudaError_t e_ = (call);                         \
    if (e_ != cudaSuccess) return cuda_err(e_, what); \
  } while (0)

static fsdp_status d2h(stage_impl *s, void *dst, const void *src, size_t bytes) {
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s->stream), "device-to-host copy");
  CUDA_TRY(cudaStreamSynchronize(s->stream), "device-to-host copy");
  return FSDP_OK;
}

static fsdp_status h2d(stage_impl *s, void *dst, const void *src, size_t bytes) {
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s->stream), "host-to-device copy");
  CUDA_TRY(cudaStreamSynchronize(s->stream), "host-to-device copy");
  return FSDP_OK;
}

/* The largest piece, in bytes per block, when a collective needs PARTS blocks of it in the buffer:
 * a multiple of 16 bytes (whole elements of every dtype). */
static size_t piece_bytes(const stage_impl *s, size_t parts) { return s->pin_bytes / parts / 16 * 16; }

/* Bytes [off, off + m) of each of the world's blocks (BLOCK bytes apart from BASE) to or from the
 * pinned buffer, where they lie m bytes apart; one synchronization. */
static fsdp_status blocks_copy(stage_impl *s, char *dev, size_t block, size_t off, size_t m, int to_host) {
  for (int r = 0; r < s->world; r++) {
    char *d = dev + (size_t)r * block + off, *h = s->pin + (size_t)r * m;
    CUDA_TRY(cudaMemcpyAsync(to_host ? (void *)h : (void *)d, to_host ? (const void *)d : (const void *)h, m,
                             to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s->stream),
             to_host ? "device-to-host copy" : "host-to-device copy");
  }
  CUDA_TRY(cudaStreamSynchronize(s->stream), to_host ? "device-to-host copy" : "host-to-device copy");
  return FSDP_OK;
}

/* OP (BYTES per block) in pieces that fit the buffer. Elementwise collectives, so piece [off, off+m)
 * of every block is a collective of its own: an all-gather gathers each rank's piece, a
 * reduce-scatter sums piece off of every block into piece off of the result. */
static fsdp_status stage_pieces(stage_impl *s, const comm_op *op, size_t bytes) {
  const size_t n = (size_t)s->world, es = comm_dtype_size(op->dt);
  const size_t k = piece_bytes(s, op->kind == COMM_OP_ALLGATHER ? n : op->kind == COMM_OP_REDUCESCATTER ? n + 1 : 1);
  for (size_t off = 0; off < bytes; off += k) {
    const size_t m = bytes - off < k ? bytes - off : k;
    comm_op h = *op;
    h.count = m / es;
    switch (op->kind) {
      case COMM_OP_ALLGATHER:   /* in place on the host: our piece at rank·m */
        TRY(d2h(s, s->pin + (size_t)s->rank * m, (const char *)op->send + off, m));
        h.send = s->pin + (size_t)s->rank * m;
        h.recv = s->pin;
        TRY(comm_gloo_run(s->g, &h));
        TRY(blocks_copy(s, op->recv, bytes, off, m, 0));
        break;
      case COMM_OP_REDUCESCATTER:   /* the world's pieces, then the result's */
        TRY(blocks_copy(s, (char *)(uintptr_t)op->send, bytes, off, m, 1));
        h.send = s->pin;
        h.recv = s->pin + n * m;
        TRY(comm_gloo_run(s->g, &h));
        TRY(h2d(s, (char *)op->recv + off, s->pin + n * m, m));
        break;
      case COMM_OP_ALLREDUCE:
        TRY(d2h(s, s->pin, (char *)op->recv + off, m));
        h.send = h.recv = s->pin;
        TRY(comm_gloo_run(s->g, &h));
        TRY(h2d(s, (char *)op->recv + off, s->pin, m));
        break;
      case COMM_OP_BARRIER:
        return FSDP_OK;
    }
  }
  return FSDP_OK;
}

static fsdp_status stage_copy_run(stage_impl *s, const comm_op *op);

/* comm.c has already waited for AFTER's CPU mark (taken at issue: exact) when the CUDA device
 * completes marks (host_marks); without one, wait for the native event's latest record. */
static fsdp_status stage_run(void *impl, const comm_op *op) {
  stage_impl *s = impl;
  CUDA_TRY(cudaSetDevice(s->device), "cudaSetDevice");   /* the comm thread has no current device yet */
  cudaEvent_t after = op->after ? (cudaEvent_t)dev_event_native(op->after) : NULL;
  if (after && op->after_ticket == 0) CUDA_TRY(cudaEventSynchronize(after), "cudaEventSynchronize of after");
  TRY(stage_copy_run(s, op));
  /* The copy back is complete (synchronized); the record makes a stream wait on done see it. */
  cudaEvent_t done = op->done ? (cudaEvent_t)dev_event_native(op->done) : NULL;
  if (done) CUDA_TRY(cudaEventRecord(done, s->stream), "cudaEventRecord of done");
  return FSDP_OK;
}

static fsdp_status stage_copy_run(stage_impl *s, const comm_op *op) {
  const size_t bytes = op->count * comm_dtype_size(op->dt);
  if (op->kind == COMM_OP_BARRIER) return s->g ? comm_gloo_run(s->g, op) : FSDP_OK;
  if (bytes == 0) return FSDP_OK;

  if (!s->g) {   /* world = 1: the result is the input */
    if (op->kind != COMM_OP_ALLREDUCE && op->recv != op->send) {
      CUDA_TRY(cudaMemcpyAsync(op->recv, op->send, bytes, cudaMemcpyDeviceToDevice, s->stream), "device copy");
      CUDA_TRY(cudaStreamSynchronize(s->stream), "device copy");
    }
    return FSDP_OK;
  }
  return stage_pieces(s, op, bytes);
}

static void stage_abort(void *impl) {
  stage_impl *s = impl;
  if (s->g) comm_gloo_abort(s->g);
}

static void stage_destroy(void *impl) {
  stage_impl *s = impl;
  if (!s) return;
  if (s->g) comm_gloo_destroy(s->g);
  cudaSetDevice(s->device);
  if (s->pin) {
    cudaFreeHost(s->pin);
    mem_account(MEM_COMM, -(int64_t)s->pin_bytes);
  }
  if (s->stream) cudaStreamDestroy(s->stream);
  free(s);
}

static const comm_backend staged_backend = {
    .name = "gloo-staged", .run = stage_run, .abort = stage_abort, .destroy = stage_destroy};

fsdp_status comm_new_gloo_staged(int rank, int world, const char *store_dir, const comm_kv *kv,
                                 const char *prefix, double timeout_s, int device, size_t stage_bytes, comm_t **out) {
  if (!out) return fsdp_set_error(FSDP_ERR_INVALID, "comm_new_gloo_staged: out is NULL");
  *out = NULL;
  if (world < 1 || rank < 0 || rank >= world)
    return fsdp_set_error(FSDP_ERR_RANGE,
                          "comm_new_gloo_staged: rank %d, world %d; allowed: world >= 1, 0 <= rank < world", rank, world);
  if (!(timeout_s > 0) || timeout_s > 86400)
    return fsdp_set_error(FSDP_ERR_RANGE, "comm_new_gloo_staged: timeout_s %g; allowed: (0, 86400] seconds", timeout_s);
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess) return cuda_err(e, "cudaGetDeviceCount");
  if (device < 0 || device >= ndev)
    return fsdp_set_error(FSDP_ERR_RANGE, "comm_new_gloo_staged: device %d; this machine has %d CUDA device(s)", device,
                          ndev);
  stage_impl *s = calloc(1, sizeof *s);
  if (!s) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the staged gloo backend");
  s->device = device;
  s->rank = rank;
  s->world = world;
  if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaStreamCreate(&s->stream)) != cudaSuccess) {
    free(s);
    return cuda_err(e, "stream creation");
  }
  fsdp_status st = FSDP_OK;
  if (world > 1) {   /* the one pinned buffer, before any stream has work */
    const size_t least = ((size_t)world + 1) * STAGE_MIN_PIECE;
    size_t bytes = stage_bytes > least ? stage_bytes : least;
    if ((e = cudaMallocHost((void **)&s->pin, bytes)) != cudaSuccess) {
      s->pin = NULL;
      st = cuda_err(e, "cudaMallocHost of the staging buffer");
    } else {
      s->pin_bytes = bytes;
      mem_account(MEM_COMM, (int64_t)bytes);
      st = comm_gloo_new(rank, world, store_dir, kv, prefix, timeout_s, &s->g);
    }
  }
  if (st != FSDP_OK) {
    stage_destroy(s);
    return st;
  }
  return comm_wrap(&staged_backend, s, rank, world, timeout_s, out);
}
