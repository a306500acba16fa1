/* model_phi3 — Phi-3's forward and backward: Llama's (model_llama.h). Its fused qkv_proj and
 * gate_up_proj are Llama's adjacent q|k|v and gate|up slots (phi3_arch.c), which model_llama runs as
 * one linear each already; its longrope is the model's rope_freqs (ops/rope.h). */
#include "model.h"

extern const model_ops llama_model;
#define L (&llama_model)

static void *acts_new(const plan_t *p, device_t *d) { return L->acts_new(p, d); }
static void acts_destroy(void *a) { L->acts_destroy(a); }
static void embed_forward(void *a, const plan_t *p, const void *root, const int *inp) { L->embed_forward(a, p, root, inp); }
static void block_forward(void *a, const plan_t *p, int layer, const void *unit) { L->block_forward(a, p, layer, unit); }
static void head_forward_backward(void *a, const plan_t *p, const void *root, float *droot, const int *targets,
                                  float dscale, float *loss_acc) {
  L->head_forward_backward(a, p, root, droot, targets, dscale, loss_acc);
}
static void head_forward(void *a, const plan_t *p, const void *root, const int *targets, float *loss_acc) {
  L->head_forward(a, p, root, targets, loss_acc);
}
static void block_backward(void *a, const plan_t *p, int layer, const void *unit, float *dunit) {
  L->block_backward(a, p, layer, unit, dunit);
}
static void embed_backward(void *a, const plan_t *p, float *droot, const int *inp) { L->embed_backward(a, p, droot, inp); }
static const void *final_hidden(const void *a) { return L->final_hidden(a); }
static float init_value(const plan_t *p, int u, int t, uint64_t seed, int64_t k) { return L->init_value(p, u, t, seed, k); }

const model_ops phi3_model = {
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
