/* gpu_check — the harness shared by the device checks (gpu_check.c: main, comparison, comms;
 * check_ops.c: GPT-2's operators; check_llama.c: Llama's; check_util.c: AdamW, utilities, GEMM
 * throughput; check_docmask.c: documents and the sliding window).
 *
 * Tolerances (docs/gpu.md): a bf16 path (bf16 inputs or outputs) passes when the norm-wise
 * relative error ‖cuda − cpu‖₂/‖cpu‖₂ is under 2e-2 (TOL_BF16) AND no element is off by more than
 * 16·tol·(|cpu| + rms(cpu)) (a wrong row or an unwritten tile fails that even where the norm would
 * hide it); an fp32 path under 1e-5 (TOL_F32) by the same rule; casts bit for bit (tol 0). The CPU
 * twin always runs on the SAME bf16-rounded inputs, widened to fp32, so the difference is only the
 * GPU's own rounding (bf16 outputs, bf16 intermediates such as dlogits, summation order). Outputs
 * that are accumulated into (parameter gradients) start from nonzero values on both sides and are
 * compared by their increments. Assigned outputs start as NaN on the GPU: an element a kernel
 * forgets to write fails (NaN never passes).
 */
#ifndef FSDP_GPU_CHECK_H
#define FSDP_GPU_CHECK_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "ops_cuda.h"

#define TOL_BF16 2e-2
#define TOL_F32 1e-5

extern int g_pass, g_fail;
extern ops_cuda_ctx g_ctx;
extern cudaEvent_t g_ev0, g_ev1;

void cu_fatal(cudaError_t e, const char *call, int line);
#define CU(call)                                            \
  do {                                                      \
    cudaError_t e_ = (call);                                \
    if (e_ != cudaSuccess) cu_fatal(e_, #call, __LINE__);   \
  } while (0)

void *xmalloc(size_t bytes); /* malloc or exit */
/* Buffers of the current check, freed by free_all(). */
void *hbuf(size_t bytes);
void *dbuf(size_t bytes);
void free_all(void);

void rng_seed(uint64_t seed);
uint64_t rng_next(void);
float rng_uniform(float lo, float hi);
float *h_uniform(size_t n, float lo, float hi);          /* fp32 values */
float *h_bf16_uniform(size_t n, float lo, float hi);     /* fp32 values that are exact bf16 values */
float *h_nan(size_t n);
float *h_copy(const float *src, size_t n);               /* a copy of src */
void *d_upload(const void *h, size_t bytes);
void *d_bf16(const float *h, size_t n);                  /* upload as bf16 (h holds bf16 values) */
void *d_nan_f32(size_t n);
void *d_nan_bf16(size_t n);

typedef enum { OUT_F32 = 0, OUT_BF16, OUT_I32 } out_kind;

typedef struct out_t {
  const char *name;
  const float *ref;     /* host: the CPU twin's result */
  const void *dev;      /* device: the CUDA op's result */
  size_t n;
  out_kind kind;
  double tol;           /* TOL_BF16, TOL_F32, or 0: bit for bit */
  const float *prefill; /* accumulated outputs: their common start, compared by increments */
  float *got;           /* host copy of dev (filled by RUN_AND_COMPARE) */
} out_t;

void fetch_outputs(out_t *o, int n);
void compare(const char *op, const char *shape, const out_t *o, double ms);
void report_failure(const char *op, const char *shape, fsdp_status st, cudaError_t se);
void verdict(const char *name, int ok, const char *detail);
/* Whether the check of OP runs: GPU_CHECK_ONLY unset, or one of its comma-separated prefixes
 * starts OP (a planted-fault run of gpu_emu runs only the checks of the faulty kernel). */
int check_selected(const char *op);

/* Runs CALL (an fsdp_status expression that enqueues work on g_ctx.stream) once, fetches the
 * outputs; when TIMED, runs it once more between two events (accumulated outputs then hold a
 * second accumulation; the results were fetched already). Then compares every output. */
#define RUN_AND_COMPARE(op, shape, timed, outs, CALL)                                       \
  do {                                                                                      \
    int n_ = (int)(sizeof(outs) / sizeof((outs)[0]));                                       \
    if (!check_selected(op)) break;                                                         \
    fsdp_clear_error();                                                                     \
    fsdp_status st_ = (CALL);                                                               \
    cudaError_t se_ = cudaStreamSynchronize(g_ctx.stream);                                  \
    if (st_ != FSDP_OK || se_ != cudaSuccess) {                                             \
      report_failure((op), (shape), st_, se_);                                              \
      break;                                                                                \
    }                                                                                       \
    fetch_outputs((outs), n_);                                                              \
    float ms_ = -1.0f;                                                                      \
    if (timed) {                                                                            \
      CU(cudaEventRecord(g_ev0, g_ctx.stream));                                             \
      st_ = (CALL);                                                                         \
      CU(cudaEventRecord(g_ev1, g_ctx.stream));                                             \
      se_ = cudaEventSynchronize(g_ev1);                                                    \
      if (st_ != FSDP_OK || se_ != cudaSuccess) {                                           \
        report_failure((op), (shape), st_, se_);                                            \
        break;                                                                              \
      }                                                                                     \
      CU(cudaEventElapsedTime(&ms_, g_ev0, g_ev1));                                         \
    }                                                                                       \
    g_last_ms = ms_;                                                                        \
    for (int i_ = 0; i_ < n_; i_++) compare((op), (shape), &(outs)[i_], i_ == 0 ? ms_ : -1.0); \
  } while (0)

/* A shape of the operator checks: batch, time, channels, heads, vocabulary. */
typedef struct shape {
  const char *name;
  int B, T, C, NH, V;
  int timed;   /* time the CUDA op (the large shapes) */
} shape;

/* check_ops.c: the tiny shapes, and the GPT-2 ones when LARGE */
void check_model_ops(int large);
/* Fused attention, both implementations, with NKV kv heads (NKV = NH: multi-head). check_ops.c */
void check_attention(const shape *s, int NKV);
/* check_llama.c: Llama's operators (linear, RMSNorm, rotary, SwiGLU, the encoder without
 * positions, grouped-query attention) at tiny shapes, and Llama-3.2-1B's when LARGE */
void check_llama_ops(int large);
/* check_docmask.c: packed rows (documents) and the sliding window: masked attention, rope and
 * GPT-2's encoder against their CPU twins, and planted faults (the mask dropped) failing */
void check_docmask_ops(void);
/* check_util.c */
void check_util_ops(void);
/* check_lora.c: a LoRA step's adapter products (ops_cuda_gemm) and their AdamW */
void check_lora_ops(void);
void measure_gemm_rate(void);

/* The roofline (harness.c): the last timed RUN_AND_COMPARE's time (ms, -1 when untimed), and each
 * timed kernel's bytes moved and FLOPs per call (from its shapes) recorded by roofline_add; after
 * the rates of this run are measured (copy bandwidth, bf16 GEMM: measure_copy_rate,
 * measure_gemm_rate), roofline_print gives each kernel's GB/s and TFLOP/s and their fractions of
 * those rates, and which of the two bounds it. */
extern double g_last_ms, g_copy_gbs, g_gemm_tflops;
void roofline_add(const char *op, const char *shape, double bytes, double flops);
void roofline_print(void);
void measure_copy_rate(void);

#endif
