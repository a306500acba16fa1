/* optim — AdamW on a rank's flat shard, the learning-rate schedule, and gradient clipping
 * (docs/design.md §6). Each rank updates only its own shard; decay is applied per tensor, so the walk
 * intersects the shard with every tensor of every unit (plan offsets) and leaves padding alone.
 * Pure functions over caller-owned buffers: any thread, one call per shard at a time.
 *
 * AdamW is torch.optim.AdamW (foreach=False, amsgrad=False, maximize=False), step t 1-based:
 *   g = grad_scale·grad
 *   θ ← θ·(1 − lr·wd)                     decoupled decay, only where plan_tensor.decay (2-D tensors)
 *   m ← β1·m + (1 − β1)·g
 *   v ← β2·v + (1 − β2)·g²
 *   θ ← θ − (lr / (1 − β1^t)) · m / (sqrt(v) / sqrt(1 − β2^t) + eps)
 * The per-step constants are computed in double, the elementwise update in float.
 */
#ifndef FSDP_OPTIM_H
#define FSDP_OPTIM_H

#include "jobspec.h"
#include "plan.h"

/* AdamW's own hyperparameters ([optim] beta1, beta2, eps, weight_decay): what the update reads. */
typedef struct optim_config {
  double beta1, beta2, eps, weight_decay;
} optim_config;
/* The job's ([optim] of S). */
optim_config optim_config_of(const jobspec_t *s);

/* Update RANK's shard (p->shard_total floats each: params, grads, m, v). STEP is 1-based; LR comes
 * from optim_lr(); beta1, beta2, eps and weight_decay from OC; GRAD_SCALE multiplies every
 * gradient first (the clip scale). Padding elements are not touched. */
void optim_adamw_shard(const plan_t *p, int rank, float *param_shard, const float *grad_shard, float *m,
                       float *v, int step, double lr, const optim_config *oc, float grad_scale);

/* The learning rate of optimizer step STEP (1-based; the job's schedule, not the optimizer's), nanoGPT's get_lr(it) with it = step − 1,
 * W = warmup_steps, N = steps, lr and min_lr from S:
 *   it < W:                         lr · (it + 1) / (W + 1)
 *   schedule constant, it ≥ W:      lr
 *   schedule cosine,   it > N:      min_lr
 *   schedule cosine,   W ≤ it ≤ N:  min_lr + ½(1 + cos(π·(it − W)/(N − W)))·(lr − min_lr)
 *                                   (when N ≤ W the ratio is taken as 1: min_lr) */
double optim_lr(const jobspec_t *s, int step);

/* torch.nn.utils.clip_grad_norm_: the factor every gradient is multiplied by,
 * min(1, max_norm / (global_norm + 1e-6)); 1 when max_norm ≤ 0 (clipping off). */
double optim_clip_scale(double global_norm, double max_norm);

#endif
