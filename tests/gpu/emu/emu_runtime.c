/* emu_runtime — the CUDA runtime calls that worker/cuda/device_cuda.c and comm_stage_cuda.c make beyond
 * the kernels' (emu.cpp has those), for fsdp-worker-emu: the whole worker with its CUDA device over the
 * emulated kernels (tests/gpu/emu/lora_job.sh). One process is one device of "unlimited" memory; every
 * stream operation runs at once on the calling thread, in submission order, so a stream never has
 * work pending: events are complete when recorded, a stream wait and a synchronize have nothing to
 * wait for, and a host function runs inside cudaLaunchHostFunc (one that waits for the staged comm's
 * thread blocks the caller until that thread completes the collective, as it would block the stream).
 * That is one legal order of what a GPU may run; what it cannot show is a race between streams. */
#include <cuda_runtime_api.h>
#include <stdlib.h>

cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  *free_bytes = *total = (size_t)1 << 40;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return (*p = malloc(n ? n : 1)) ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
  (void)flags;
  return cudaMallocHost(p, n);
}
cudaError_t cudaFreeHost(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  (void)flags;
  return cudaStreamCreate(s);
}
/* a distinct non-null handle per event, since callers may tell "no event" by NULL */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  (void)flags;
  return (*e = (cudaEvent_t)malloc(1)) ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  (void)s, (void)e, (void)flags;
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
  (void)s;
  fn(arg);
  return cudaSuccess;
}
