/* model_mistral — Mistral's forward and backward are Llama's (models/llama/llama_family.h): the
 * sliding window is read from p->model.sliding_window by llama_acts_new. */
#define FSDP_LLAMA_FAMILY_MODEL
#include "llama_family.h"

static void *acts_new(const plan_t *p, device_t *d) { return llama_model.acts_new(p, d); }
static void acts_destroy(void *a) { llama_model.acts_destroy(a); }
static void embed_forward(void *a, const plan_t *p, const void *root, const int *inp) {
  llama_model.embed_forward(a, p, root, inp);
}
static void block_forward(void *a, const plan_t *p, int layer, const void *unit) {
  llama_model.block_forward(a, p, layer, unit);
}
static void head_forward_backward(void *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                  float dscale, float *loss_acc) {
  llama_model.head_forward_backward(a, p, root, droot, targets, dscale, loss_acc);
}
static void head_forward(void *a, const plan_t *p, const void *root, const int *targets, float *loss_acc) {
  llama_model.head_forward(a, p, root, targets, loss_acc);
}
static void block_backward(void *a, const plan_t *p, int layer, const void *unit, float *dunit) {
  llama_model.block_backward(a, p, layer, unit, dunit);
}
static void embed_backward(void *a, const plan_t *p, float *droot, const int *inp) {
  llama_model.embed_backward(a, p, droot, inp);
}
static const void *final_hidden(const void *a) { return llama_model.final_hidden(a); }
static float init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k) {
  return llama_model.init_value(p, u, t, seed, k);
}

const model_ops mistral_model = {
  .acts_new = acts_new,
  .acts_destroy = acts_destroy,
  .embed_forward = embed_forward,
  .block_forward = block_forward,
  .head_forward_backward = head_forward_backward,
  .head_forward = head_forward,
  .block_backward = block_backward,
  .embed_backward = embed_backward,
  .final_hidden = final_hidden,
  .init_value = init_value,
};
