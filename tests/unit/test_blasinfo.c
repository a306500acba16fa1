/* test_blasinfo — the BLAS start-up report (common/blasinfo.h): the warning appears exactly when the
 * kernels OpenBLAS runs are older than the CPU's, worded as forced by OPENBLAS_CORETYPE when that is
 * set; unknown kernel types and CPUs are reported, never warned about. The CPU is a parameter, so
 * the table holds on any machine. */
#include <stdio.h>
#include <string.h>

#include "blasinfo.h"
#include "check.h"

static const char *CFG = "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64";

/* One case: expect a warning (WANT), and in it (when WANT) the text NEEDLE. */
static void one(const char *core, const char *env, blas_isa cpu, int want, const char *needle) {
  char info[512], warn[512];
  int got = blasinfo_describe(CFG, core, env, cpu, info, sizeof info, warn, sizeof warn);
  if (got != want || (want && !strstr(warn, needle)) || (!want && warn[0]) || !strstr(info, core ? core : "unknown"))
    printf("FAIL core %s env %s cpu %s: expected warning %d (with '%s'), got %d: '%s' / '%s'\n", core ? core : "(null)",
           env ? env : "(unset)", blasinfo_isa_name(cpu), want, needle ? needle : "", got, info, warn);
  CHECK_EQ_INT(want, got);
}

int main(void) {
  CHECK_EQ_INT(BLAS_ISA_AVX2, blasinfo_core_isa("Haswell"));
  CHECK_EQ_INT(BLAS_ISA_AVX512, blasinfo_core_isa("skylakex"));   /* OpenBLAS reads the variable case-blind */
  CHECK_EQ_INT(BLAS_ISA_SSE, blasinfo_core_isa("Prescott"));
  CHECK_EQ_INT(BLAS_ISA_UNKNOWN, blasinfo_core_isa("NoSuchCore"));
  CHECK_EQ_INT(BLAS_ISA_UNKNOWN, blasinfo_core_isa(NULL));
  for (int i = BLAS_ISA_SSE; i <= BLAS_ISA_AVX512; i++)   /* the advised core has the CPU's set */
    CHECK_EQ_INT(i, blasinfo_core_isa(blasinfo_isa_core((blas_isa)i)));

  /* forced older: warned, naming the variable and the fix */
  one("Haswell", "Haswell", BLAS_ISA_AVX512, 1, "OPENBLAS_CORETYPE=Haswell in the environment");
  one("Haswell", "Haswell", BLAS_ISA_AVX512, 1, "set OPENBLAS_CORETYPE=SkylakeX");
  one("Prescott", "Prescott", BLAS_ISA_AVX2, 1, "set OPENBLAS_CORETYPE=Haswell");
  one("Sandybridge", "sandybridge", BLAS_ISA_AVX512, 1, "forces OpenBLAS's AVX kernels");
  /* chosen older by the library itself: warned, as the library's choice */
  one("Prescott", NULL, BLAS_ISA_AVX512, 1, "OpenBLAS chose its 'Prescott' kernels");
  /* not otherwise: forced to the CPU's own or a newer-named equal set, unset and right, unknowns */
  one("SkylakeX", "SkylakeX", BLAS_ISA_AVX512, 0, NULL);
  one("Cooperlake", NULL, BLAS_ISA_AVX512, 0, NULL);
  one("Haswell", "Haswell", BLAS_ISA_AVX2, 0, NULL);
  one("Zen", NULL, BLAS_ISA_AVX2, 0, NULL);
  one("Haswell", NULL, BLAS_ISA_AVX2, 0, NULL);
  one("NoSuchCore", "NoSuchCore", BLAS_ISA_AVX512, 0, NULL);
  one("Haswell", "Haswell", BLAS_ISA_UNKNOWN, 0, NULL);
  one(NULL, NULL, BLAS_ISA_AVX512, 0, NULL);
  return check_done();
}
