/* docmask — which keys a query row attends to, and which position a token has, when a row holds
 * several documents (packed data: model_set_docs) or the model has a sliding window (Mistral):
 * the one formula the CPU reference and the CUDA kernels share.
 *
 * SEG (B·T int32, NULL: one document per row) gives for token t of row b the index in the row of
 * its document's first token. WINDOW W (0: none) is transformers' sliding_window: query t sees key
 * s when t − W < s ≤ t (masking_utils' sliding_window_overlay, kv_idx > q_idx − W). Both restrict a
 * causal row to one contiguous run of keys [lo, t]:
 *   lo = max(seg[b·T + t], t − W + 1, 0)
 * and lo never decreases along a row (documents start later and later, and so does the window), so
 * a tile of query rows [r0, r1) meets keys [lo(r0), r1) only. Positions restart at 0 in each
 * document: token t is at position t − seg[b·T + t] (rope's angle, GPT-2's wpe row).
 * Pure functions: any thread.
 */
#ifndef FSDP_OPS_DOCMASK_H
#define FSDP_OPS_DOCMASK_H

#include <stdint.h>

#include "ops_hd.h"

/* The first key query t of row b sees. */
OPS_HD int attn_key_lo(const int32_t *seg, int window, int b, int T, int t) {
  int lo = seg ? (int)seg[(int64_t)b * T + t] : 0;
  int w = window > 0 ? t - window + 1 : 0;
  return w > lo ? w : lo;
}

/* One past the last query of row b that sees key s (queries s .. end − 1 do): the end of s's
 * document, or of its window, or T. For the kernels that walk keys and need each key's queries. */
OPS_HD int attn_query_end(const int32_t *seg, int window, int b, int T, int s) {
  int end = window > 0 && s + window < T ? s + window : T;
  if (seg)
    for (int t = s + 1; t < end; t++)
      if (seg[(int64_t)b * T + t] != seg[(int64_t)b * T + s]) return t;   /* a new document starts at t */
  return end;
}

/* The position of token t of row b (the row's index BT = b·T + t). */
OPS_HD int doc_pos(const int32_t *seg, int64_t bt, int t) { return seg ? t - (int)seg[bt] : t; }

#endif
