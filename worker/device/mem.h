/* mem — the tracked allocator: every byte a worker allocates, by category (docs/design.md §5).
 *
 * mem_alloc() returns zeroed host memory, 64-byte aligned (page-aligned from 1 MiB: the shards
 * that checkpoints write with O_DIRECT), and counts it under its category;
 * mem_free() uncounts and frees it. Memory that is not host memory from here (a CUDA buffer,
 * a pinned staging buffer) is counted with mem_account(). Current and peak bytes are kept per
 * category and for the total (the peak of the sum, which is at most the sum of the peaks).
 * The counters are process-global and atomic: any thread may allocate, free or read them.
 */
#ifndef FSDP_MEM_H
#define FSDP_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

void *mem_alloc(mem_category cat, size_t bytes);   /* NULL (and an error recorded) on failure */
void mem_free(void *p);                            /* NULL-safe */
/* Count DELTA bytes (positive or negative) under CAT for memory allocated elsewhere. */
void mem_account(mem_category cat, int64_t delta);

typedef struct mem_stats {
  uint64_t cur[MEM_NCAT];
  uint64_t peak[MEM_NCAT];
  uint64_t cur_total, peak_total;
} mem_stats;

void mem_get_stats(mem_stats *out);
/* Start a new peak window: every peak becomes the current value. */
void mem_reset_peaks(void);

#endif
