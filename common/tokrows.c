/* tokrows — the rows of masked token streams: documents from the start bitmap, packed or one per
 * row, and each row's inputs, targets and document starts (see tokens.h: tok_set_rows,
 * tok_batch_docs). */
#include <stdlib.h>

#include "tokens_priv.h"

int tok_masked(const tok_file *f) { return f->masked; }
int64_t tok_rows(const tok_file *f) { return f->nrows; }
int64_t tok_docs(const tok_file *f) { return f->ndocs; }

/* Appends the documents of one file (first token BASE of the stream) to F->doc: token 0 and every
 * token whose start bit is set begins one. */
static fsdp_status file_docs(tok_file *f, const tok_file *part, int64_t base, int64_t *cap) {
  for (int64_t i = 0; i < part->n; i++) {
    if (i > 0 && !((part->doc_bits[i / 8] >> (i % 8)) & 1)) {
      if (!part->doc_bits[i / 8] && i % 8 == 0 && i + 8 <= part->n) i += 7;   /* a byte without starts */
      continue;
    }
    if (f->ndocs + 1 >= *cap) {
      int64_t c = 2 * *cap;
      int64_t *d = realloc(f->doc, (size_t)c * sizeof *d);
      if (!d) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory indexing the documents of %s", f->name);
      f->doc = d, *cap = c;
    }
    f->doc[f->ndocs++] = base + i;
  }
  return FSDP_OK;
}

/* The file and position that stream token I is, for messages. */
static void where(const tok_file *f, int64_t i, const char **name, long long *pos) {
  int k = f->nparts ? tok_part_of(f, i) : 0;
  *name = f->nparts ? f->parts[k]->name : f->name;
  *pos = (long long)(i - (f->nparts ? f->starts[k] : 0));
}

fsdp_status tok_set_rows(tok_file *f, int pack, int T) {
  if (!f->masked)
    return fsdp_set_error(FSDP_ERR_INVALID,
                          "token stream %s has no document boundaries (a plain token file is read as one "
                          "continuous stream): pack = false needs a masked file made by gen-data --chat", f->name);
  if (T < 1) return fsdp_set_error(FSDP_ERR_RANGE, "tok_set_rows: T = %d; must be at least 1", T);
  free(f->doc), free(f->row);
  f->doc = f->row = NULL, f->ndocs = f->nrows = 0;
  int64_t cap = 1024;
  fsdp_status rc = (f->doc = malloc((size_t)cap * sizeof *f->doc)) ? FSDP_OK
                   : fsdp_set_error(FSDP_ERR_NOMEM, "out of memory indexing the documents of %s", f->name);
  for (int k = 0; k < (f->nparts ? f->nparts : 1) && rc == FSDP_OK; k++)
    rc = f->nparts ? file_docs(f, f->parts[k], f->starts[k], &cap) : file_docs(f, f, 0, &cap);
  if (rc == FSDP_OK && !(f->row = malloc(((size_t)f->ndocs + 1) * sizeof *f->row)))
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory for the rows of %s", f->name);
  if (rc != FSDP_OK) return rc;
  f->doc[f->ndocs] = f->n;   /* cap > ndocs: room for the sentinel */
  int64_t used = T;          /* tokens in the row being filled: none open yet */
  for (int64_t d = 0; d < f->ndocs; d++) {
    int64_t len = f->doc[d + 1] - f->doc[d];
    if (len > T) {
      const char *name;
      long long pos;
      where(f, f->doc[d], &name, &pos);
      return fsdp_set_error(FSDP_ERR_RANGE,
                            "token file %s: the document at token %lld is %lld tokens, longer than seq_len = %d; a "
                            "document is never split across rows: make the file with gen-data --chat --seq-len %d "
                            "(which truncates or drops such documents) or raise seq_len",
                            name, pos, (long long)len, T, T);
    }
    if (!pack || used + len > T) f->row[f->nrows++] = d, used = 0;
    used += len;
  }
  f->row[f->nrows] = f->ndocs;
  f->rows_T = T, f->pack = pack != 0;
  return FSDP_OK;
}

/* Row Q into inp/targets/seg[0..T) (SEG may be NULL); returns its trained targets in *TRAINED. */
static fsdp_status read_doc_row(const tok_file *f, int64_t q, int T, int vocab, int *inp, int *targets,
                                int32_t *seg, int64_t *trained) {
  int t = 0;
  int64_t n = 0;
  int32_t first = 0;
  for (int64_t d = f->row[q]; d < f->row[q + 1]; d++) {
    int64_t a = f->doc[d], len = f->doc[d + 1] - a;
    first = t;
    for (int64_t i = 0; i < len; i++, t++) {
      uint32_t v = tok_at(f, a + i);
      if (v >= (uint32_t)vocab) return tok_range_error(f, a + i, v, vocab);
      inp[t] = (int)v;
      /* HF's labels = −100 shifted: position t predicts token t+1 when that token is trained */
      int on = i + 1 < len && tok_trained_at(f, a + i + 1);
      targets[t] = on ? (int)tok_at(f, a + i + 1) : -1;
      if (on && (uint32_t)targets[t] >= (uint32_t)vocab) return tok_range_error(f, a + i + 1, (uint32_t)targets[t], vocab);
      n += on;
      if (seg) seg[t] = first;
    }
  }
  for (; t < T; t++) {   /* padding: no target; it sees the last document, which never sees it */
    inp[t] = 0, targets[t] = -1;
    if (seg) seg[t] = first;
  }
  *trained = n;
  return FSDP_OK;
}

/* A plain stream through tok_batch_docs: tok_batch's rows, one document each, every target trained. */
static fsdp_status plain_batch(const tok_file *f, int64_t microbatch, int rank, int world, int B, int T, int vocab,
                               int *inp, int *targets, int32_t *seg, int64_t *trained) {
  TRY(tok_batch(f, microbatch, rank, world, B, T, vocab, inp, targets));
  if (seg) memset(seg, 0, (size_t)B * (size_t)T * sizeof *seg);
  if (trained) *trained = (int64_t)B * T;
  return FSDP_OK;
}

fsdp_status tok_batch_docs(const tok_file *f, int64_t microbatch, int rank, int world, int B, int T, int vocab,
                           int *inp, int *targets, int32_t *seg, int64_t *trained) {
  if (!f->masked) return plain_batch(f, microbatch, rank, world, B, T, vocab, inp, targets, seg, trained);
  if (world < 1 || rank < 0 || rank >= world || B < 1 || T < 1 || vocab < 1 || microbatch < 0)
    return fsdp_set_error(FSDP_ERR_RANGE, "tok_batch_docs: rank %d of world %d, B=%d, T=%d, vocab=%d, micro-batch %lld: "
                          "need 0 <= rank < world, B, T, vocab >= 1, micro-batch >= 0", rank, world, B, T, vocab,
                          (long long)microbatch);
  if (!f->row || f->rows_T != T)
    return fsdp_set_error(FSDP_ERR_STATE, "token stream %s: its rows were made for seq_len %d, asked for %d "
                          "(tok_set_rows)", f->name, f->rows_T, T);
  int64_t rows = (int64_t)world * B;
  if (f->nrows < rows)
    return fsdp_set_error(FSDP_ERR_RANGE,
                          "token stream %s holds %lld documents in %lld rows of seq_len %d (pack = %s); one batch of "
                          "world %d x B %d needs %lld rows: use more data, pack = true or a smaller batch",
                          f->name, (long long)f->ndocs, (long long)f->nrows, T, f->pack ? "true" : "false", world, B,
                          (long long)rows);
  if (microbatch > (INT64_MAX - rows) / rows)
    return fsdp_set_error(FSDP_ERR_RANGE, "tok_batch_docs: micro-batch %lld x %lld rows overflows",
                          (long long)microbatch, (long long)rows);
  int64_t nb = f->nrows / rows, total = 0;
  for (int i = 0; i < B; i++) {
    int64_t q, p = microbatch * rows + (int64_t)rank * B + i;
    if (f->shuffle) q = tok_shuffle_index(f->shuffle_seed, (uint64_t)(p / f->nrows), f->nrows, p % f->nrows);
    else q = ((microbatch % nb) * world + rank) * B + i;
    int64_t n = 0;
    size_t o = (size_t)i * (size_t)T;
    TRY(read_doc_row(f, q, T, vocab, inp + o, targets + o, seg ? seg + o : NULL, &n));
    total += n;
  }
  if (trained) *trained = total;
  return FSDP_OK;
}
