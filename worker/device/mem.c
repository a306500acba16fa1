/* mem — see mem.h. Each block carries a 64-byte header just before its payload, holding its
 * category, size and the payload's offset from the allocation, so that mem_free() needs only the
 * pointer. A block of PAGE_FROM bytes or more starts on a page (its header at the end of a page of
 * its own): a rank's shards are written to checkpoints from where they lie, and O_DIRECT takes
 * page-aligned memory only; a smaller block stays 64-byte aligned, its header before it. */
#include "mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define HDR 64
#define PAGE 4096
#define PAGE_FROM ((size_t)1 << 20)

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
  size_t off = bytes >= PAGE_FROM ? PAGE : HDR;
  if (bytes > SIZE_MAX - off || posix_memalign(&raw, off, off + bytes) != 0) {
    fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes for %s", bytes, plan_mem_category_name(cat));
    return NULL;
  }
  memset(raw, 0, off + bytes);
  uint64_t *h = (uint64_t *)((char *)raw + off - HDR);
  h[0] = (uint64_t)cat, h[1] = (uint64_t)bytes, h[2] = (uint64_t)off;
  mem_account(cat, (int64_t)bytes);
  return (char *)raw + off;
}

void mem_free(void *p) {
  if (!p) return;
  const uint64_t *h = (const uint64_t *)((char *)p - HDR);
  mem_account((mem_category)h[0], -(int64_t)h[1]);
  free((char *)p - h[2]);
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
