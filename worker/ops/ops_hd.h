/* ops_hd — the one qualifier for scalar math shared by ops_cpu.c and ops_cuda.cu.
 *
 * Every formula in the headers of worker/ops/ is written once and compiled twice: as a static inline C
 * function for the CPU reference and as a __host__ __device__ function for the CUDA kernels, so
 * the two backends cannot drift apart. Pure functions of their arguments: any thread may call them.
 */
#ifndef FSDP_OPS_HD_H
#define FSDP_OPS_HD_H

#ifdef __CUDACC__
#define OPS_HD __host__ __device__ __forceinline__
#else
#define OPS_HD static inline
#endif

#endif
