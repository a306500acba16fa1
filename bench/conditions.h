/* conditions — what the C benches print beside their figures (bench/lib.sh for the scripts; the same
 * lines): the load average before and after, the CPU model and the instruction-set flags that matter
 * to the kernels, and the BLAS library and kernel type this process runs (blasinfo.h). Header-only,
 * main's thread. */
#ifndef FSDP_BENCH_CONDITIONS_H
#define FSDP_BENCH_CONDITIONS_H

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blasinfo.h"

static char bench_load_before[64];

static inline void bench_loadavg(char *buf, size_t n) {
  snprintf(buf, n, "?");
  FILE *f = fopen("/proc/loadavg", "r");
  if (!f) return;
  float a, b, c;
  if (fscanf(f, "%f %f %f", &a, &b, &c) == 3) snprintf(buf, n, "%.2f %.2f %.2f", a, b, c);
  fclose(f);
}

static inline void bench_conditions_begin(void) {
  char line[4096], model[256] = "unknown", flags[256] = "";
  FILE *f = fopen("/proc/cpuinfo", "r");
  static const char *const want[] = {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"};
  int have_model = 0, have_flags = 0;
  while (f && fgets(line, sizeof line, f) && !(have_model && have_flags)) {
    char *v = strchr(line, ':');
    if (!v) continue;
    v += 2;
    v[strcspn(v, "\n")] = 0;
    if (!have_model && !strncmp(line, "model name", 10)) snprintf(model, sizeof model, "%s", v), have_model = 1;
    if (!have_flags && !strncmp(line, "flags", 5)) {
      have_flags = 1;
      for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        size_t k = strlen(want[i]);
        for (char *p = strstr(v, want[i]); p; p = strstr(p + 1, want[i]))
          if ((p == v || p[-1] == ' ') && (p[k] == ' ' || !p[k])) {
            strncat(flags, " ", sizeof flags - strlen(flags) - 1);
            strncat(flags, want[i], sizeof flags - strlen(flags) - 1);
            break;
          }
      }
    }
  }
  if (f) fclose(f);
  char info[512], warn[512];
  int w = blasinfo_describe(openblas_get_config(), openblas_get_corename(), getenv("OPENBLAS_CORETYPE"),
                            blasinfo_cpu_isa(), info, sizeof info, warn, sizeof warn);
  bench_loadavg(bench_load_before, sizeof bench_load_before);
  printf("cpu: %s (%ld online); flags:%s\n%s\n", model, sysconf(_SC_NPROCESSORS_ONLN), flags[0] ? flags : " none of sse4_2..amx", info);
  if (w) printf("warning: %s\n", warn);
  printf("load average before: %s\n", bench_load_before);
  fflush(stdout);   /* before a bench forks its ranks */
}

static inline void bench_conditions_end(void) {
  char after[64];
  bench_loadavg(after, sizeof after);
  printf("load average before: %s, after: %s\n", bench_load_before, after);
  fflush(stdout);
}

#endif
