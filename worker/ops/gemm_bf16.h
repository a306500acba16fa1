/* gemm_bf16 — the CPU's bf16 GEMM: bf16 inputs, fp32 accumulation, fp32 output, the numerical
 * contract of the CUDA path (worker/ops/bf16.h; cuBLAS's bf16 GEMMs with fp32 compute). Inputs stay
 * fp32 in memory and are rounded to bf16 (nearest, ties to even) while they are packed, so a
 * gathered bf16 parameter (already a bf16 value widened to fp32) goes in exactly; each product of
 * two bf16 values is exact in fp32 and the K products are summed in fp32 (AVX512-BF16's vdpbf16ps,
 * which treats bf16 subnormal inputs as zero, as CUDA's bf16 tensor cores may).
 *
 * Which GEMM a thread runs: ops_cpu.c's gemm() asks gemm_bf16_active(), a per-thread setting that
 * the CPU device sets for the tasks of a device that computes in bf16 (device_cpu.c,
 * dev_cpu_set_compute). Default GEMM_FP32: cblas_sgemm everywhere.
 * gemm_bf16_kind() says what bf16 compute is on this machine, by measurement: GEMM_BF16 where the
 * CPU has AVX512-BF16 (cpuid at run time) AND its vdpbf16ps does at least GEMM_BF16_MIN_RATIO of
 * the multiply-adds per second of its fp32 FMA (gemm_bf16_rates_of_cpu, a probe of ~2 ms run
 * once), else GEMM_FP32 (nothing changes). Where vdpbf16ps is slower than fp32 FMA (Sapphire Rapids
 * class Xeons without AMX: half the rate) this kernel cannot beat OpenBLAS's AVX-512 sgemm, nor
 * does PyTorch's bf16 matmul beat its fp32 one there (docs/performance.md, "bf16 on the CPU").
 * The FSDP_CPU_BF16 environment variable, read at each call, overrides the choice: "on" runs the
 * kernel wherever the CPU has the instructions (measured slower or not); "off" answers GEMM_FP32
 * (the fallback, on any CPU); "emulate" answers GEMM_BF16_EMULATED: the same contract on any CPU,
 * the inputs rounded to bf16 and multiplied by cblas_sgemm (fp32 products of bf16 values are exact,
 * so only the order of the fp32 sums differs from the kernel's): the reference the tests hold the
 * kernel to. Thread-safe;
 * the kernel threads itself with OpenMP and keeps a packing workspace per calling thread. */
#ifndef FSDP_GEMM_BF16_H
#define FSDP_GEMM_BF16_H

typedef enum { GEMM_FP32 = 0, GEMM_BF16, GEMM_BF16_EMULATED } gemm_kind;

/* What a bf16 GEMM runs as on this CPU and environment (above). */
gemm_kind gemm_bf16_kind(void);

/* The kernel runs where vdpbf16ps reaches this share of fp32 FMA's multiply-adds per second. At
 * 0.5 (Sapphire Rapids class, measured 0.47-0.51) the kernel's step takes 1.3-1.65x sgemm's CPU
 * time, so at 1 it would take ~0.7-0.8x; the ratio is one of issue rates, so a power of two on a
 * given core, and the threshold sits at the geometric middle of 0.5 and 1, where the probe's noise
 * (a few per cent) cannot flip the choice between runs or ranks. */
#define GEMM_BF16_MIN_RATIO 0.71

/* Multiply-adds per second of one core, zmm, 16 independent accumulators: vdpbf16ps (BF16) and
 * vfmadd231ps (FP32), best of five alternations on the calling thread's CPU time; measured on the
 * first call where the CPU has AVX512-BF16 (else both 0). */
typedef struct gemm_bf16_rates {
  double bf16, fp32;
} gemm_bf16_rates;
gemm_bf16_rates gemm_bf16_rates_of_cpu(void);
/* 1 where the CPU has AVX512-BF16 (and F, BW, VL), whatever it measures. */
int gemm_bf16_cpu_has(void);
/* The choice gemm_bf16_kind makes, from FSDP_CPU_BF16's value ENV, HAS (the instructions) and the
 * measured rates R: exposed for tests. */
gemm_kind gemm_bf16_choose(const char *env, int has, gemm_bf16_rates r);
/* 1 when ENV is one of FSDP_CPU_BF16's values: auto | on | off | emulate. */
int gemm_bf16_env_valid(const char *env);
/* "fp32", "bf16 (AVX512-BF16)", "bf16 (emulated)" */
const char *gemm_kind_name(gemm_kind k);

/* The calling thread's setting: GEMM_BF16 or GEMM_BF16_EMULATED makes gemm() run gemm_bf16. */
void gemm_bf16_set_active(gemm_kind k);
gemm_kind gemm_bf16_active(void);

/* Row-major C = alpha·op(A)·op(B) + beta·C, as cblas_sgemm(CblasRowMajor, ...): op(A) is M×K
 * (A is M×K with lda ≥ K, or K×M with lda ≥ M when ta), op(B) K×N (ldb ≥ N, or ≥ K when tb).
 * beta = 0: C is not read. The AVX512-BF16 kernel when the calling thread's kind is GEMM_BF16, else
 * the emulation. */
void gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc);

/* The bound of |gemm_bf16 − exact product of the fp32 inputs| for one output whose
 * terms have magnitudes summing to ABS_SUM = Σ_k |a_k·b_k|, over K terms (docs/performance.md,
 * "bf16 on the CPU"): each input rounds by at most u = 2^-8 relative (a product by 2u + u²), and
 * n ≈ K fp32 roundings add at most γ_n = n·2^-24 / (1 − n·2^-24) (n counts the K sums, alpha and
 * beta and one addition per chunk of 256 k). */
double gemm_bf16_error_bound(int K, double abs_sum);

#endif
