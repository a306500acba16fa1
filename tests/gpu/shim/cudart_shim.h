/* cudart_shim — a host-only stand-in for the CUDA runtime calls of the CUDA device and the staged
 * comm, with real streams and device-wide synchronizations that can deadlock (cudart_shim.c). */
#ifndef FSDP_CUDART_SHIM_H
#define FSDP_CUDART_SHIM_H

/* Device-wide synchronizations (cudaMallocHost, cudaFreeHost, cudaFree, cudaDeviceSynchronize)
 * that gave up after FSDP_SHIM_SYNC_S seconds: each one a hang on a GPU. */
int cudart_shim_deadlocks(void);

#endif
