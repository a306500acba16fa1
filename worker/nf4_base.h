/* nf4_base — a QLoRA job's frozen base ([lora] base_dtype = nf4; plan.h's plan_lora nf4 fields,
 * docs/memory.md "QLoRA"). The root (embeddings, head) stays bf16 in its shard, as a bf16 base's. A
 * block is a byte image of plan_lora.nf4_block bytes: its tensors in the unit's order, a 1-D tensor
 * as bf16 (2·numel bytes), a 2-D tensor as its NF4 record (nf4.h: nf4_bytes(numel), the tensor
 * quantized whole, flattened in its Hugging Face layout as bitsandbytes' quantize_4bit takes it);
 * padded with zeros to nf4_padded and sharded as bytes: rank g of a shard group holds
 * [g·nf4_shard, (g + 1)·nf4_shard) of every block, L shards one after the other.
 *
 * nf4_base_load quantizes at load. Each rank reads, one block at a time, the block's tensors up to
 * the last one its byte range touches (from spec->init or the seed's values, as a bf16 base is read)
 * and quantizes only the tensors its range touches: every tensor is quantized whole, so the bytes are
 * those of any world size, and a rank's quantization work is about 1/N of the base's (plus one tensor
 * each side), its host memory one block in fp32 and one image. Any thread; it only reads the inputs
 * and writes the caller's host buffers.
 *
 * nf4_base_dequant dequantizes a gathered image into the block's bf16 working unit on the device's
 * stream (the kernel table's nf4_dequant per 2-D tensor, copies for the 1-D ones): the runtime's
 * thread, as every stream operation.
 */
#ifndef FSDP_NF4_BASE_H
#define FSDP_NF4_BASE_H

#include <stdint.h>

#include "device.h"
#include "err.h"
#include "jobspec.h"
#include "plan.h"

/* Byte offset of tensor T of block unit U in its image (the image's size for T = U->ntensors). */
int64_t nf4_base_offset(const plan_unit *u, int t);

/* RANK's part of P's base: ROOT (units[0].shard_numel bf16 values) and BLOCKS (L·nf4_shard bytes). */
fsdp_status nf4_base_load(const jobspec_t *spec, const plan_t *p, int rank, uint16_t *root, uint8_t *blocks);

/* OUT (U->padded bf16 values on the device; its padding left as it is) = image IMG of block U dequantized. */
void nf4_base_dequant(device_t *d, const plan_unit *u, const uint8_t *img, uint16_t *out);

#endif
