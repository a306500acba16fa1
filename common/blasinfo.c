/* blasinfo — see blasinfo.h. */
#include "blasinfo.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* OpenBLAS 0.3.x's x86-64 kernel types (its DYNAMIC_ARCH list) by the widest set their kernels use.
 * Piledriver..Excavator have FMA3 but no AVX2 kernels. */
static const struct {
  const char *core;
  blas_isa isa;
} core_isa[] = {
    {"Katmai", BLAS_ISA_SSE},       {"Coppermine", BLAS_ISA_SSE}, {"Northwood", BLAS_ISA_SSE},
    {"Prescott", BLAS_ISA_SSE},     {"Banias", BLAS_ISA_SSE},     {"Atom", BLAS_ISA_SSE},
    {"Core2", BLAS_ISA_SSE},        {"Penryn", BLAS_ISA_SSE},     {"Dunnington", BLAS_ISA_SSE},
    {"Nehalem", BLAS_ISA_SSE},      {"Athlon", BLAS_ISA_SSE},     {"Opteron", BLAS_ISA_SSE},
    {"Opteron_SSE3", BLAS_ISA_SSE}, {"Barcelona", BLAS_ISA_SSE},  {"Bobcat", BLAS_ISA_SSE},
    {"Sandybridge", BLAS_ISA_AVX},  {"Bulldozer", BLAS_ISA_AVX},  {"Piledriver", BLAS_ISA_AVX},
    {"Steamroller", BLAS_ISA_AVX},  {"Excavator", BLAS_ISA_AVX},  {"Haswell", BLAS_ISA_AVX2},
    {"Zen", BLAS_ISA_AVX2},         {"SkylakeX", BLAS_ISA_AVX512}, {"Cooperlake", BLAS_ISA_AVX512},
    {"SapphireRapids", BLAS_ISA_AVX512},
};

blas_isa blasinfo_core_isa(const char *core) {
  if (!core) return BLAS_ISA_UNKNOWN;
  for (size_t i = 0; i < sizeof core_isa / sizeof core_isa[0]; i++)
    if (strcasecmp(core, core_isa[i].core) == 0) return core_isa[i].isa;
  return BLAS_ISA_UNKNOWN;
}

blas_isa blasinfo_cpu_isa(void) {
#if defined(__GNUC__) && defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return BLAS_ISA_AVX512;
  if (__builtin_cpu_supports("avx2")) return BLAS_ISA_AVX2;
  if (__builtin_cpu_supports("avx")) return BLAS_ISA_AVX;
  return BLAS_ISA_SSE;
#else
  return BLAS_ISA_UNKNOWN;
#endif
}

const char *blasinfo_isa_name(blas_isa isa) {
  switch (isa) {
  case BLAS_ISA_SSE: return "SSE";
  case BLAS_ISA_AVX: return "AVX";
  case BLAS_ISA_AVX2: return "AVX2";
  case BLAS_ISA_AVX512: return "AVX-512";
  default: return "unknown";
  }
}

const char *blasinfo_isa_core(blas_isa isa) {
  switch (isa) {
  case BLAS_ISA_SSE: return "Prescott";
  case BLAS_ISA_AVX: return "Sandybridge";
  case BLAS_ISA_AVX2: return "Haswell";
  case BLAS_ISA_AVX512: return "SkylakeX";
  default: return NULL;
  }
}

int blasinfo_describe(const char *config, const char *core, const char *env, blas_isa cpu, char *info, size_t ninfo,
                      char *warn, size_t nwarn) {
  blas_isa k = blasinfo_core_isa(core);
  snprintf(info, ninfo, "BLAS: %s; kernels %s (%s), CPU %s; OPENBLAS_CORETYPE %s%s", config ? config : "unknown library",
           core ? core : "unknown", blasinfo_isa_name(k), blasinfo_isa_name(cpu), env ? "= " : "unset", env ? env : "");
  warn[0] = 0;
  if (k == BLAS_ISA_UNKNOWN || cpu == BLAS_ISA_UNKNOWN || k >= cpu) return 0;
  const char *want = blasinfo_isa_core(cpu);
  if (env)
    snprintf(warn, nwarn, "OPENBLAS_CORETYPE=%s in the environment forces OpenBLAS's %s kernels on a CPU with %s: "
             "GEMMs can run at half their rate or less; unset it or set OPENBLAS_CORETYPE=%s",
             env, blasinfo_isa_name(k), blasinfo_isa_name(cpu), want);
  else
    snprintf(warn, nwarn, "OpenBLAS chose its '%s' kernels (%s) on a CPU with %s: GEMMs can run at half their rate or "
             "less; start the process with OPENBLAS_CORETYPE=%s", core, blasinfo_isa_name(k), blasinfo_isa_name(cpu), want);
  return 1;
}

static const char *log_config, *log_core;
static int log_quiet;
static void log_once(void) {
  if (log_quiet) return;
  char info[512], warn[512];
  int w = blasinfo_describe(log_config, log_core, getenv("OPENBLAS_CORETYPE"), blasinfo_cpu_isa(), info, sizeof info,
                            warn, sizeof warn);
  log_info("%s", info);
  if (w) log_warn("%s", warn);
}

static pthread_once_t log_once_ctl = PTHREAD_ONCE_INIT;

void blasinfo_log(const char *config, const char *core) {
  log_config = config, log_core = core;
  pthread_once(&log_once_ctl, log_once);
}

void blasinfo_quiet(void) {
  log_quiet = 1;
  pthread_once(&log_once_ctl, log_once);
}
