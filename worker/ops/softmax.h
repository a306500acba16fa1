/* softmax — the per-element formulas of the attention softmax and of the fused softmax +
 * cross-entropy, shared by the CPU reference and the CUDA kernels. Rows are max-subtracted by the
 * caller (the row reductions stay in each backend), so exp never overflows. Both backends take
 * e^x from ops_expf (ops/exp.h).
 */
#ifndef FSDP_OPS_SOFTMAX_H
#define FSDP_OPS_SOFTMAX_H

#include <math.h>

#include "exp.h"
#include "ops_hd.h"

/* Attention's score scale, 1/sqrt(head size). */
OPS_HD float attn_scale(int head_size) { return 1.0f / sqrtf((float)head_size); }

/* Backward of p = softmax(z) along a row: dz_j = p_j·(dp_j − Σ_k p_k·dp_k); pdp_sum is that sum. */
OPS_HD float softmax_dinp(float p, float dp, float pdp_sum) { return p * (dp - pdp_sum); }

/* The target of a token that is not trained (masked data: a prompt token, the next document,
 * padding; transformers' label −100 after its shift): the classifier gives its row loss 0 and
 * gradient 0 on every backend. */
#define XENT_NO_TARGET (-1)

/* Cross-entropy of one row from its max and Σ exp(z − max) (the log-sum-exp, in double). */
OPS_HD double xent_loss(float z_target, float zmax, double expsum) {
  return log(expsum) + (double)zmax - (double)z_target;
}

/* dlogit_j = dscale·(p_j − [j == target]) */
OPS_HD float xent_dlogit(float p, int is_target, float dscale) {
  return dscale * (p - (float)(is_target != 0)); /* no ?:, so the loop vectorizes (ops/exp.h) */
}

#endif
