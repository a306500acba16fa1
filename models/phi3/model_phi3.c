/* model_phi3 — Phi-3's forward and backward: the Llama family's (model_llama.h). Its fused qkv_proj
 * and gate_up_proj are Llama's adjacent q|k|v and gate|up slots (phi3_arch.c), which model_llama runs
 * as one linear each already; its longrope is the model's rope_freqs (ops/rope.h). */
#include "model_llama.h"

const model_ops phi3_model = LLAMA_FAMILY_MODEL_OPS;
