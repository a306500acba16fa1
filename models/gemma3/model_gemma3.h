/* model_gemma3 — Gemma 3's text model (gemma3.h: slots, settings, the layer rule) over the kernel
 * table, one FSDP unit at a time, with model_llama.h's contract and call order:
 *
 *   embed_forward                 x0 = √C·embed_tokens[inp]   (√C rounded to the weight's dtype)
 *   block_forward  l = 0 .. L-1   out_l = layer_l(out_{l-1})
 *   head_forward_backward         final norm, the tied head (embed_tokens), xent; droot +=, dres
 *   block_backward l = L-1 .. 0   dunit_l +=, dres = dL/d out_{l-1}
 *   embed_backward                d embed_tokens += √C·dres at the tokens
 *
 * Every RMSNorm is the kernel table's with the weight offset 1 (scale 1 + w in fp32). The attention
 * kernels scale their scores by HD^-1/2; Gemma's are query_pre_attn_scalar^-1/2, so the rotated q is
 * multiplied by √(HD/qpas) before them and dq by the same after their backward: one pass over B·T·QD
 * elements each way (act_axpby on q's columns), skipped where qpas = HD, instead of a scale argument
 * threaded through the CPU, tensor-core and cuDNN attention and all their callers. Sliding layers
 * (gemma3_is_global) attend in the window and rotate with the local base; global ones attend fully
 * and rotate with rope_theta. Packed rows (model_set_docs) restrict both, as Llama's. [lora]: the
 * adapters around q, k, v, o, gate, up and down by their slots (G3_*), as model_llama's.
 *
 * Buffers: exactly gemma3_act's terms (gemma3.h), in one model_arena; with activation checkpointing a
 * layer keeps its output and the backward recomputes the rest in one working set. One device, its
 * thread.
 */
#ifndef FSDP_MODEL_GEMMA3_H
#define FSDP_MODEL_GEMMA3_H

#include "model.h"

extern const model_ops gemma3_model;

#endif
