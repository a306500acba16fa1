/* layernorm — LayerNorm's per-element formulas (eps 1e-5), shared by the CPU reference and the
 * CUDA kernels; the row reductions (mean, variance, the two backward means) stay in each backend.
 *
 * Forward: norm_i = (x_i − mean)·rstd, rstd = 1/sqrt(var + eps) with the biased variance;
 * out_i = norm_i·w_i + b_i. Backward, with g_i = w_i·dout_i and means over the C channels:
 * dx_i = rstd·(g_i − mean(g) − norm_i·mean(g·norm)); dw_i += dout_i·norm_i; db_i += dout_i.
 */
#ifndef FSDP_OPS_LAYERNORM_H
#define FSDP_OPS_LAYERNORM_H

#include <math.h>

#include "ops_hd.h"

#define LAYERNORM_EPS 1e-5f

/* var is the biased (divide by C) variance of the row. */
OPS_HD float layernorm_rstd(float var) { return 1.0f / sqrtf(var + LAYERNORM_EPS); }

OPS_HD float layernorm_norm(float x, float mean, float rstd) { return (x - mean) * rstd; }

/* g = w·dout; g_mean = mean(g); gn_mean = mean(g·norm) over the row. */
OPS_HD float layernorm_dinp(float g, float norm, float g_mean, float gn_mean, float rstd) {
  return rstd * (g - g_mean - norm * gn_mean);
}

#endif
