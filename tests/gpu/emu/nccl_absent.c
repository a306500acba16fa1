/* nccl_absent — comm.h's NCCL entry points for fsdp-worker-emu, which has no NCCL (one emulated device
 * per process cannot host a NCCL rank): each refuses in one line, so a job there runs comm = gloo
 * (staged through "pinned" memory, worker/cuda/comm_stage_cuda.c). */
#include "comm.h"
#include "err.h"

static fsdp_status absent(void) {
  return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "the emulated CUDA worker has no NCCL: use [fsdp] comm = gloo");
}
fsdp_status comm_nccl_get_unique_id(uint8_t out[128]) {
  (void)out;
  return absent();
}
fsdp_status comm_new_nccl(int rank, int world, const uint8_t id[128], int device, double timeout_s, comm_t **out) {
  (void)rank, (void)world, (void)id, (void)device, (void)timeout_s, (void)out;
  return absent();
}
fsdp_status comm_nccl_split(comm_t *parent, int color, int key, int world, comm_t **out) {
  (void)parent, (void)color, (void)key, (void)world, (void)out;
  return absent();
}
void *comm_nccl_stream(const comm_t *c) {
  (void)c;
  return NULL;
}
