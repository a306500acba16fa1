/* model_mistral — Mistral's forward and backward: the Llama family's (model_llama.h), which reads the
 * sliding window from the plan's model_config (p->model.sliding_window). */
#include "model_llama.h"

const model_ops mistral_model = LLAMA_FAMILY_MODEL_OPS;
