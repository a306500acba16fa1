/* fuzz_jobspec — libFuzzer target: arbitrary text as a job file. jobspec_parse must accept it or
 * give an error, never crash; an accepted spec must have passed its range checks, and plan_build
 * must then succeed or refuse cleanly (the planner sees only validated specs). */
#include <stdlib.h>
#include <string.h>

#include "jobspec.h"
#include "plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  jobspec_t s;
  if (jobspec_parse(text, "fuzz.ini", "/tmp", &s) == FSDP_OK) {
    if (s.world_size < 1 || s.model.n_embd % s.model.n_head != 0 || s.prefetch < 0 || s.prefetch > 4) abort();
    /* Keep the planner's allocations small: the table of units grows with n_layer. */
    if (s.model.n_layer <= 4096) {
      plan_t *p = NULL;
      if (plan_build(&s, s.world_size > 64 ? 64 : s.world_size, &p) == FSDP_OK) plan_destroy(&p);
    }
  }
  free(text);
  return 0;
}
