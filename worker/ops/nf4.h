/* nf4 — NormalFloat4 with double-quantized block scales, the storage format of a QLoRA base
 * (bitsandbytes' quantize_4bit(..., blocksize=64, compress_statistics=True, quant_type="nf4")):
 *
 *   a tensor of n elements (n a multiple of NF4_BLOCK) is cut into blocks of 64; block b's scale is
 *   absmax[b] = max |x| over it, and each element is the index of the nearest of the 16 NF4 code values
 *   (nf4_code, the quantiles of N(0, 1) scaled to [-1, 1]) to x·(1/absmax[b]), two indices a byte,
 *   the first element in the high nibble;
 *   the scales are quantized again (double quantization): offset = their mean, and absmax[b] − offset
 *   is stored as one byte, the index into the 8-bit dynamic map (nf4_dynamic) of its value scaled
 *   by the largest magnitude of its group of NF4_ABSMAX_BLOCK scales, which is kept in fp32 (absmax2).
 *
 * A tensor's quantized form is therefore n/2 bytes of codes, n/64 bytes of scale codes, n/16384
 * (rounded up) fp32 group scales and one fp32 offset: 4.127 bits per element. Dequantization is
 * code[q]·(dyn[qa]·absmax2 + offset), in fp32, rounded to the compute dtype.
 *
 * The per-element formulas (nf4_index, nf4_value) are OPS_HD, for the CPU loops and the CUDA kernel
 * alike; the loops here are the CPU reference. Pure functions of their arguments; any thread. */
#ifndef FSDP_NF4_H
#define FSDP_NF4_H

#include <stdint.h>

#include "ops_hd.h"

#define NF4_BLOCK 64           /* elements per block scale */
#define NF4_ABSMAX_BLOCK 256   /* block scales per fp32 group scale (the second quantization) */

/* The quantized form of one tensor of n elements; the caller owns the arrays. */
typedef struct nf4_tensor {
  int64_t n;
  uint8_t *codes;      /* n / 2: element 2i in the high nibble of byte i, 2i + 1 in the low one */
  uint8_t *absmax_q;   /* n / NF4_BLOCK: the block scales' codes into the dynamic map */
  float *absmax2;      /* nf4_groups(n): each group's largest |absmax − offset| */
  float offset;        /* the mean of the block scales */
} nf4_tensor;

static inline int64_t nf4_blocks(int64_t n) { return n / NF4_BLOCK; }
static inline int64_t nf4_groups(int64_t n) { return (nf4_blocks(n) + NF4_ABSMAX_BLOCK - 1) / NF4_ABSMAX_BLOCK; }
/* Bytes of a tensor's quantized form (codes, scale codes, group scales, offset). */
static inline int64_t nf4_bytes(int64_t n) { return n / 2 + nf4_blocks(n) + 4 * nf4_groups(n) + 4; }

extern const float nf4_code[16];
/* Entry I of the 8-bit dynamic map (0..255, ascending; the scale codes' values). */
float nf4_dynamic(int i);

/* The NF4 code value of nibble Q times SCALE, in fp32. */
OPS_HD float nf4_value(const float *code, int q, float scale) { return code[q] * scale; }

/* Quantize X (n elements, n a multiple of NF4_BLOCK) into T's arrays (T->n set to n). Returns 0; −1
 * when n is not a positive multiple of NF4_BLOCK, −2 when there is no memory for the n/64 scales. */
int nf4_quantize(const float *x, int64_t n, nf4_tensor *t);
/* T's block scales, decoded: absmax[b] = dyn[absmax_q[b]]·absmax2[b / 256] + offset (n/64 floats). */
void nf4_absmax(const nf4_tensor *t, float *absmax);
/* T dequantized into OUT (n fp32 values; nf4_dequantize_bf16: n bf16 values, rounded to nearest even). */
void nf4_dequantize(const nf4_tensor *t, float *out);
void nf4_dequantize_bf16(const nf4_tensor *t, uint16_t *out);

/* A tensor's record: its quantized form as nf4_bytes(n) bytes at any byte address (a QLoRA block's
 * byte image, worker/nf4_base.h): the codes (n/2), the scale codes (n/64), the group scales (fp32,
 * little-endian, unaligned) and the offset (fp32). nf4_record_write: X (n elements, n a positive
 * multiple of NF4_BLOCK) quantized into REC; the return values are nf4_quantize's. */
int nf4_record_write(const float *x, int64_t n, uint8_t *rec);
/* REC's n elements dequantized into OUT in bf16: nf4_dequantize_bf16's bits. */
void nf4_record_dequantize_bf16(const uint8_t *rec, int64_t n, uint16_t *out);

#endif
