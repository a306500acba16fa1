/* rmsnorm — RMSNorm's per-element formulas (Llama, Gemma), shared by the CPU reference and the CUDA
 * kernels; the row reductions (mean of squares, the backward's mean) stay in each backend.
 *
 * Forward: rstd = 1/sqrt(mean(x²) + eps), norm_i = x_i·rstd, out_i = norm_i·s_i with the scale
 * s_i = woff + w_i: woff 0 for Llama's norms, 1 for Gemma's (Gemma3RMSNorm: (1 + w) in fp32, w
 * initialized to 0). Backward, with g_i = s_i·dout_i and the mean over the C channels:
 * dx_i = rstd·(g_i − norm_i·mean(g·norm)); dw_i += dout_i·norm_i (ds/dw = 1 for either offset).
 */
#ifndef FSDP_OPS_RMSNORM_H
#define FSDP_OPS_RMSNORM_H

#include <math.h>

#include "ops_hd.h"

/* msq is the row's mean of squares. */
OPS_HD float rmsnorm_rstd(float msq, float eps) { return 1.0f / sqrtf(msq + eps); }

/* g = w·dout, norm = x·rstd; gn_mean = mean(g·norm) over the row. */
OPS_HD float rmsnorm_dinp(float g, float norm, float gn_mean, float rstd) { return rstd * (g - norm * gn_mean); }

#endif
