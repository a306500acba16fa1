/* model_qwen3 — Qwen3's forward and backward: the Llama family's (model_llama.h), which reads the
 * choices Qwen3 makes (llama.h's slots) from the plan's model_config. */
#include "model_llama.h"

const model_ops qwen3_model = LLAMA_FAMILY_MODEL_OPS;
