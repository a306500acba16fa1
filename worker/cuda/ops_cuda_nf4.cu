/* ops_cuda_nf4 — NF4 dequantization on the device (worker/ops/nf4.h is the format and its CPU
 * reference, ops_cuda.h the entry point): each thread takes one byte of codes, two elements, and
 * writes them in bf16 from its block's decoded scale. The scale's multiply and add use explicit
 * round-to-nearest intrinsics, which nvcc never contracts into an FMA, so the bits are the CPU's.
 * The record's fp32 group scales and offset sit at any byte address (a block's image packs the
 * records back to back): they are read byte by byte. */
#include <string.h>

#include "ops_cuda_common.cuh"

#include "nf4.h"

/* The fp32 at byte address P (little-endian, any alignment). */
__device__ __forceinline__ float ld_f32_bytes(const uint8_t *p) {
  uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

__global__ void nf4_dequant_kernel(ops_bf16 *__restrict__ out, const uint8_t *__restrict__ rec,
                                   const float *__restrict__ maps, int64_t n) {
  const int64_t nb = n / NF4_BLOCK, ng = (nb + NF4_ABSMAX_BLOCK - 1) / NF4_ABSMAX_BLOCK;
  const uint8_t *codes = rec, *absmax_q = rec + n / 2, *absmax2 = absmax_q + nb;
  float offset = ld_f32_bytes(absmax2 + 4 * ng);
  if (OPS_FAULT("nf4_offset")) offset = 0.0f;   /* planted: the scales without their offset */
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; 2 * i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t b = 2 * i / NF4_BLOCK;
    float scale = __fadd_rn(__fmul_rn(maps[16 + absmax_q[b]], ld_f32_bytes(absmax2 + 4 * (b / NF4_ABSMAX_BLOCK))), offset);
    uint8_t c = codes[i];
    out[2 * i] = bf_from_bits(f32_to_bf16(__fmul_rn(maps[c >> 4], scale)));
    out[2 * i + 1] = bf_from_bits(f32_to_bf16(__fmul_rn(maps[c & 15], scale)));
  }
}

fsdp_status ops_cuda_nf4_dequantize(ops_bf16 *out, const uint8_t *rec, const float *maps, int64_t n,
                                    const ops_cuda_ctx *ctx) {
  if (n % NF4_BLOCK)
    return fsdp_set_error(FSDP_ERR_INVALID, "ops_cuda_nf4_dequantize: %lld elements; allowed: a multiple of %d",
                          (long long)n, NF4_BLOCK);
  if (n > 0) {
    nf4_dequant_kernel<<<ops_blocks(n / 2, OPS_THREADS), OPS_THREADS, 0, ctx->stream>>>(out, rec, maps, n);
    LAUNCH_CHECK("nf4_dequantize");
  }
  return FSDP_OK;
}
