/* gated — the gated MLP activation, out = act(gate)·up, and its gradients: SwiGLU (Llama's MLP,
 * act = SiLU, ops/silu.h) and GeGLU (Gemma's, act = tanh GELU, ops/gelu.h). The scalar math that the
 * one gated loop on the CPU (ops_cpu.c gated_forward) and the one CUDA kernel template
 * (ops_cuda_gated.cu) call. Callers pass the activation as a compile-time constant, so that each
 * instantiation folds to the branch-free formula of its own activation.
 */
#ifndef FSDP_OPS_GATED_H
#define FSDP_OPS_GATED_H

#include "gelu.h"
#include "ops_hd.h"
#include "silu.h"

typedef enum { GATE_SILU, GATE_GELU_TANH } gate_act;

OPS_HD float gate_act_f(gate_act a, float g) { return a == GATE_SILU ? silu(g) : gelu_tanh(g); }

/* d act / dg */
OPS_HD float gate_act_grad(gate_act a, float g) { return a == GATE_SILU ? silu_grad(g) : gelu_tanh_grad(g); }

OPS_HD float gated(gate_act a, float gate, float up) { return gate_act_f(a, gate) * up; }

/* The gradients of gated(a, gate, up) given d = d out. */
OPS_HD float gated_dgate(gate_act a, float gate, float up, float d) { return d * up * gate_act_grad(a, gate); }
OPS_HD float gated_dup(gate_act a, float gate, float d) { return d * gate_act_f(a, gate); }

#endif
