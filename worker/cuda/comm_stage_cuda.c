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
 * stream on done's CPU mark until comm.c completes it (device_cuda.c). The pinned buffer grows to the largest collective and is counted under
 * MEM_COMM with mem_account(). bf16 is gloo's: all-gather moves bytes, sums round to bf16.
 */
#ifndef FSDP_HAVE_CUDA
#define FSDP_HAVE_CUDA 1   /* this file is compiled only in the CUDA build (libfsdpcuda) */
#endif
#include "comm.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

typedef struct stage_impl {
  comm_gloo *g;            /* NULL with world = 1 */
  int device, rank, world;
  cudaStream_t stream;
  char *pin;               /* cudaMallocHost */
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

static fsdp_status ensure_pinned(stage_impl *s, size_t bytes) {
  if (bytes <= s->pin_bytes) return FSDP_OK;
  if (s->pin) {
    cudaFreeHost(s->pin);
    mem_account(MEM_COMM, -(int64_t)s->pin_bytes);
    s->pin = NULL;
    s->pin_bytes = 0;
  }
  CUDA_TRY(cudaMallocHost((void **)&s->pin, bytes), "cudaMallocHost of the staging buffer");
  s->pin_bytes = bytes;
  mem_account(MEM_COMM, (int64_t)bytes);
  return FSDP_OK;
}

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
  const size_t n = (size_t)s->world;
  if (op->kind == COMM_OP_BARRIER) return s->g ? comm_gloo_run(s->g, op) : FSDP_OK;
  if (bytes == 0) return FSDP_OK;

  if (!s->g) {   /* world = 1: the result is the input */
    if (op->kind != COMM_OP_ALLREDUCE && op->recv != op->send) {
      CUDA_TRY(cudaMemcpyAsync(op->recv, op->send, bytes, cudaMemcpyDeviceToDevice, s->stream), "device copy");
      CUDA_TRY(cudaStreamSynchronize(s->stream), "device copy");
    }
    return FSDP_OK;
  }

  comm_op h = *op;
  switch (op->kind) {
    case COMM_OP_ALLGATHER:   /* in place on the host: our block at rank·bytes */
      TRY(ensure_pinned(s, n * bytes));
      TRY(d2h(s, s->pin + (size_t)s->rank * bytes, op->send, bytes));
      h.send = s->pin + (size_t)s->rank * bytes;
      h.recv = s->pin;
      TRY(comm_gloo_run(s->g, &h));
      return h2d(s, op->recv, s->pin, n * bytes);
    case COMM_OP_REDUCESCATTER:   /* input n·bytes, then the result block */
      TRY(ensure_pinned(s, (n + 1) * bytes));
      TRY(d2h(s, s->pin, op->send, n * bytes));
      h.send = s->pin;
      h.recv = s->pin + n * bytes;
      TRY(comm_gloo_run(s->g, &h));
      return h2d(s, op->recv, s->pin + n * bytes, bytes);
    case COMM_OP_ALLREDUCE:
      TRY(ensure_pinned(s, bytes));
      TRY(d2h(s, s->pin, op->recv, bytes));
      h.send = s->pin;
      h.recv = s->pin;
      TRY(comm_gloo_run(s->g, &h));
      return h2d(s, op->recv, s->pin, bytes);
    case COMM_OP_BARRIER:
      break;
  }
  return FSDP_OK;
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
                                 const char *prefix, double timeout_s, int device, comm_t **out) {
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
  if (world > 1) {
    fsdp_status st = comm_gloo_new(rank, world, store_dir, kv, prefix, timeout_s, &s->g);
    if (st != FSDP_OK) {
      cudaStreamDestroy(s->stream);
      free(s);
      return st;
    }
  }
  return comm_wrap(&staged_backend, s, rank, world, timeout_s, out);
}
