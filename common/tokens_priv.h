/* tokens_priv — the tok_file shared by the token readers: tokens.c (files, streams, the windows of
 * plain text) and tokrows.c (the rows of masked data). Not for other modules: they use tokens.h.
 * The same threading as tokens.h: built by its opener, immutable once shared.
 */
#ifndef FSDP_TOKENS_PRIV_H
#define FSDP_TOKENS_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokens.h"

#define TOK_HEADER_BYTES ((int64_t)TOK_HEADER_INTS * 4)

struct tok_file {
  const uint8_t *tokens;   /* the first token */
  int width;               /* bytes per token: 2 or 4 */
  int64_t n;               /* tokens */
  void *map;               /* the mmapped file, or NULL */
  size_t map_len;
  uint32_t *mem;           /* the in-memory stream, or NULL */
  char *name;              /* the path, or "synthetic:markov:SEED", for messages */
  int shuffle;             /* 0: sequential order; 1: shuffled windows (tokens.h) */
  uint64_t shuffle_seed;
  struct tok_file **parts; /* a stream of several files: each one's tok_file, in order; else NULL */
  int64_t *starts;         /* parts[k]'s first token is token starts[k] of the stream */
  int nparts;
  /* a masked file (tokmask.h), or a stream of them */
  int masked;
  const uint8_t *mask_bits, *doc_bits;   /* one file's bitmaps (bit i of byte i/8), in the map */
  /* its rows (tok_set_rows): document d is tokens doc[d] .. doc[d+1]−1 (doc[ndocs] = n), row k
   * holds documents row[k] .. row[k+1]−1 (row[nrows] = ndocs) */
  int rows_T, pack;
  int64_t *doc, ndocs, *row, nrows;
};

/* The part of a several-file stream that holds token I (0 ≤ I < n). */
static inline int tok_part_of(const tok_file *f, int64_t i) {
  int lo = 0, hi = f->nparts - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (f->starts[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

static inline uint32_t tok_at(const tok_file *f, int64_t i) {
  if (f->nparts) {
    int k = tok_part_of(f, i);
    return tok_at(f->parts[k], i - f->starts[k]);
  }
  if (f->width == 2) {
    uint16_t v;
    memcpy(&v, f->tokens + 2 * i, 2);
    return v;
  }
  uint32_t v;
  memcpy(&v, f->tokens + 4 * i, 4);
  return v;
}

/* Token I of a masked stream is trained (its mask bit). */
static inline int tok_trained_at(const tok_file *f, int64_t i) {
  if (f->nparts) {
    int k = tok_part_of(f, i);
    return tok_trained_at(f->parts[k], i - f->starts[k]);
  }
  return (f->mask_bits[i / 8] >> (i % 8)) & 1;
}

/* The error for token T ≥ VOCAB at stream position I of F, naming the file that holds it. */
fsdp_status tok_range_error(const tok_file *f, int64_t i, uint32_t t, int vocab);

#endif
