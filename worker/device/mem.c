/* mem — see mem.h. Each block carries a 64-byte header holding its category and size, so that
 * mem_free() needs only the pointer and the payload stays 64-byte aligned. */
#include "mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define HDR 64

static _Atomic uint64_t cur[MEM_NCAT], peak[MEM_NCAT], cur_total, peak_total;

static void raise_peak(_Atomic uint64_t *pk, uint64_t v) {
  uint64_t old = atomic_load(pk);
  while (v > old && !atomic_compare_exchange_weak(pk, &old, v)) {
  }
}

void mem_account(mem_category cat, int64_t delta) {
  uint64_t c = atomic_fetch_add(&cur[cat], (uint64_t)delta) + (uint64_t)delta;
  uint64_t t = atomic_fetch_add(&cur_total, (uint64_t)delta) + (uint64_t)delta;
  if (delta > 0) {
    raise_peak(&peak[cat], c);
    raise_peak(&peak_total, t);
  }
}

void *mem_alloc(mem_category cat, size_t bytes) {
  void *raw = NULL;
  if (posix_memalign(&raw, 64, HDR + bytes) != 0) {
    fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes for %s", bytes, plan_mem_category_name(cat));
    return NULL;
  }
  memset(raw, 0, HDR + bytes);
  ((uint64_t *)raw)[0] = (uint64_t)cat;
  ((uint64_t *)raw)[1] = (uint64_t)bytes;
  mem_account(cat, (int64_t)bytes);
  return (char *)raw + HDR;
}

void mem_free(void *p) {
  if (!p) return;
  void *raw = (char *)p - HDR;
  mem_account((mem_category)((uint64_t *)raw)[0], -(int64_t)((uint64_t *)raw)[1]);
  free(raw);
}

void mem_get_stats(mem_stats *out) {
  for (int i = 0; i < MEM_NCAT; i++) {
    out->cur[i] = atomic_load(&cur[i]);
    out->peak[i] = atomic_load(&peak[i]);
  }
  out->cur_total = atomic_load(&cur_total);
  out->peak_total = atomic_load(&peak_total);
}

void mem_reset_peaks(void) {
  for (int i = 0; i < MEM_NCAT; i++) atomic_store(&peak[i], atomic_load(&cur[i]));
  atomic_store(&peak_total, atomic_load(&cur_total));
}
