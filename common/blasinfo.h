/* blasinfo — which BLAS kernels a process runs, said once at start (docs/performance.md, "BLAS
 * kernels"): the library's configuration and kernel type, and a warning when the environment
 * (OPENBLAS_CORETYPE) forces kernels older than the CPU's, which halves a GEMM's rate (AVX2 kernels
 * on an AVX-512 CPU) or worse. fsdpd and fsdp-worker call blasinfo_log with OpenBLAS's own answers
 * (openblas_get_config, openblas_get_corename); this module does not link OpenBLAS, so that the
 * decision is testable with any CPU and core. Pure functions except blasinfo_cpu_isa (reads the
 * CPU) and blasinfo_log (logs once per process; any thread). */
#ifndef FSDP_BLASINFO_H
#define FSDP_BLASINFO_H

#include <stddef.h>

/* The widest vector instruction set of a CPU or of an OpenBLAS kernel type, in order. */
typedef enum { BLAS_ISA_UNKNOWN = -1, BLAS_ISA_SSE = 0, BLAS_ISA_AVX, BLAS_ISA_AVX2, BLAS_ISA_AVX512 } blas_isa;

/* The instruction set OpenBLAS's kernel type CORE ("Haswell", "SkylakeX", ...) is written for;
 * BLAS_ISA_UNKNOWN for a name this table does not know (then nothing is compared). */
blas_isa blasinfo_core_isa(const char *core);
/* This CPU's widest set (__builtin_cpu_supports); BLAS_ISA_UNKNOWN off x86-64. */
blas_isa blasinfo_cpu_isa(void);
/* "SSE", "AVX", "AVX2", "AVX-512", "unknown". */
const char *blasinfo_isa_name(blas_isa isa);
/* The OpenBLAS kernel type to ask for on a CPU with ISA ("SkylakeX" for AVX-512, ...); NULL when unknown. */
const char *blasinfo_isa_core(blas_isa isa);

/* The start-up report of a process whose BLAS says CONFIG and CORE (either may be NULL), whose
 * environment has OPENBLAS_CORETYPE = ENV (NULL: unset), on a CPU with CPU: the info line into
 * INFO, and, when CORE's kernels are older than the CPU's, the warning into WARN (else WARN = "").
 * Returns 1 when there is a warning. */
int blasinfo_describe(const char *config, const char *core, const char *env, blas_isa cpu, char *info, size_t ninfo,
                      char *warn, size_t nwarn);
/* blasinfo_describe for this process and CPU, logged (info, then the warning if any); only the first
 * call per process logs. */
void blasinfo_log(const char *config, const char *core);
/* Never log it in this process (a command whose standard error is its user's one line: fsdpctl
 * sample's worker). Call before any GEMM. */
void blasinfo_quiet(void);

#endif
