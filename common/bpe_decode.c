/* bpe_decode — ids to text through the tokenizer's decoders (see bpe.h).
 *
 * The tokens' strings go through the decoder chain as a list, each decoder mapping a list to a
 * list, then are joined (with a space when the file has no decoder), as the library does. Byte
 * sequences that are not UTF-8 become U+FFFD: one per maximal invalid subpart after ByteLevel
 * (Rust's from_utf8_lossy), one per byte of a run of <0xXX> tokens after ByteFallback.
 */
#include <stdlib.h>
#include <string.h>

#include "bpe_priv.h"

#define REPLACEMENT "\xef\xbf\xbd"   /* U+FFFD */

/* The length of the valid UTF-8 sequence at S, or the negated length of its maximal invalid
 * subpart (at least 1 byte). */
static long utf8_seq(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) need = 2;
  else if (c >= 0xe0 && c <= 0xef) need = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4) need = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else return -1;
  size_t k = 1;
  for (; k < need && k < n; k++) {
    unsigned char b = s[k];
    if (k == 1 ? (b < lo || b > hi) : (b & 0xc0) != 0x80) break;
  }
  return k == need ? (long)need : -(long)k;
}

static fsdp_status put_lossy(bpe_str *out, const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    long k = utf8_seq((const unsigned char *)s + i, n - i);
    if (k > 0) TRY(bpe_str_put(out, s + i, (size_t)k));
    else TRY(bpe_str_put(out, REPLACEMENT, 3));
    i += (size_t)(k > 0 ? k : -k);
  }
  return FSDP_OK;
}

#define TOK(l, i) ((l)->text.p + (l)->v[i].off)

/* The byte of a <0xXX> token, or -1. */
static int fallback_byte(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; k++) {
    char c = s[k];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

static fsdp_status flush_bytes(bpe_str *bytes, bpe_pieces *out) {
  if (!bytes->n) return FSDP_OK;
  if (bpe_utf8_invalid_at(bytes->p, bytes->n) == bytes->n) TRY(bpe_pieces_add(out, bytes->p, bytes->n, -1, 0));
  else
    for (size_t k = 0; k < bytes->n; k++) TRY(bpe_pieces_add(out, REPLACEMENT, 3, -1, 0));
  bytes->n = 0;
  return FSDP_OK;
}

static fsdp_status dec_bytefallback(const bpe_pieces *in, bpe_pieces *out) {
  bpe_str bytes = {0};
  fsdp_status rc = FSDP_OK;
  for (size_t i = 0; i < in->n && rc == FSDP_OK; i++) {
    int b = fallback_byte(TOK(in, i), in->v[i].len);
    char c = (char)b;
    if (b >= 0) rc = bpe_str_put(&bytes, &c, 1);
    else if ((rc = flush_bytes(&bytes, out)) == FSDP_OK) rc = bpe_pieces_add(out, TOK(in, i), in->v[i].len, -1, 0);
  }
  if (rc == FSDP_OK) rc = flush_bytes(&bytes, out);
  free(bytes.p);
  return rc;
}

static fsdp_status dec_bytelevel(const bpe_pieces *in, bpe_pieces *out) {
  bpe_str bytes = {0};
  fsdp_status rc = bpe_str_put(&bytes, "", 0);
  for (size_t i = 0; i < in->n && rc == FSDP_OK; i++) {
    const char *s = TOK(in, i);
    size_t n = in->v[i].len, mark = bytes.n;
    for (size_t j = 0, k; j < n && rc == FSDP_OK; j += k) {
      int b = bpe_char_byte(bpe_utf8_next(s + j, n - j, &k));
      char c = (char)b;
      if (b < 0) {   /* not a byte-level token: its own bytes */
        bytes.n = mark;
        rc = bpe_str_put(&bytes, s, n);
        break;
      }
      rc = bpe_str_put(&bytes, &c, 1);
    }
  }
  bpe_str text = {0};
  if (rc == FSDP_OK) rc = bpe_str_put(&text, "", 0);
  if (rc == FSDP_OK) rc = put_lossy(&text, bytes.p, bytes.n);
  if (rc == FSDP_OK) rc = bpe_pieces_add(out, text.p, text.n, -1, 0);
  free(bytes.p), free(text.p);
  return rc;
}

/* Each token with its characters mapped: FIRST_DROPS drops the replacement character in the first
 * token (Metaspace), else it becomes a space; STRIP cuts up to start/stop strip characters. */
static fsdp_status dec_chars(const bpe_dec *d, bpe_state *st, const bpe_pieces *in, bpe_pieces *out) {
  bpe_str t = {0};
  fsdp_status rc = FSDP_OK;
  for (size_t i = 0; i < in->n && rc == FSDP_OK; i++) {
    const char *s = TOK(in, i);
    size_t n = in->v[i].len, a = 0, b = n, k;
    t.n = 0;
    rc = bpe_str_put(&t, "", 0);
    if (d->kind == BPE_DEC_STRIP) {
      for (int c = 0; c < d->strip_start && a < n && bpe_utf8_next(s + a, n - a, &k) == d->strip_char; c++) a += k;
      for (int c = 0; c < d->strip_stop && b > a; c++) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)s[j] & 0xc0) == 0x80) j--;
        if (bpe_utf8_next(s + j, b - j, &k) != d->strip_char) break;
        b = j;
      }
      rc = bpe_str_put(&t, s + a, b - a);
    } else if (d->kind == BPE_DEC_METASPACE) {
      for (size_t j = 0; j < n && rc == FSDP_OK; j += k) {
        int32_t cp = bpe_utf8_next(s + j, n - j, &k);
        if (cp != d->rep_cp) rc = bpe_str_put(&t, s + j, k);
        else if (i > 0 || d->prepend == BPE_PREPEND_NEVER) rc = bpe_str_put(&t, " ", 1);
      }
    } else {   /* REPLACE */
      size_t at = 0, ms, me;
      bpe_matches m;
      bpe_matches_init(&m, &d->pat, st, s, n);
      while (rc == FSDP_OK && bpe_matches_next(&m, &ms, &me, &rc)) {
        if ((rc = bpe_str_put(&t, s + at, ms - at)) == FSDP_OK) rc = bpe_str_put(&t, d->text, d->text_n);
        at = me;
      }
      if (rc == FSDP_OK) rc = bpe_str_put(&t, s + at, n - at);
    }
    if (rc == FSDP_OK) rc = bpe_pieces_add(out, t.p, t.n, -1, 0);
  }
  free(t.p);
  return rc;
}

static fsdp_status dec_apply(const bpe_dec *d, bpe_state *st, const bpe_pieces *in, bpe_pieces *out) {
  switch (d->kind) {
  case BPE_DEC_BYTELEVEL: return dec_bytelevel(in, out);
  case BPE_DEC_BYTEFALLBACK: return dec_bytefallback(in, out);
  case BPE_DEC_FUSE: {
    TRY(bpe_pieces_add(out, "", 0, -1, 0));
    TRY(bpe_str_put(&out->text, in->text.p, in->text.n));   /* the pieces are contiguous, in order */
    out->v[out->n - 1].len = in->text.n;
    return FSDP_OK;
  }
  case BPE_DEC_STRIP:
  case BPE_DEC_REPLACE:
  case BPE_DEC_METASPACE: return dec_chars(d, st, in, out);
  case BPE_DEC_SEQ: break;
  }
  bpe_pieces a = {0}, b = {0};
  fsdp_status rc = FSDP_OK;
  for (size_t i = 0; i < in->n && rc == FSDP_OK; i++) rc = bpe_pieces_add(&a, TOK(in, i), in->v[i].len, -1, 0);
  for (size_t k = 0; k < d->nkids && rc == FSDP_OK; k++) {
    bpe_pieces_clear(&b);
    rc = dec_apply(d->kids[k], st, &a, &b);
    bpe_pieces t = a;
    a = b, b = t;
  }
  for (size_t i = 0; i < a.n && rc == FSDP_OK; i++) rc = bpe_pieces_add(out, TOK(&a, i), a.v[i].len, -1, 0);
  bpe_pieces_free(&a), bpe_pieces_free(&b);
  return rc;
}

fsdp_status bpe_decode(const bpe_tokenizer *t, const uint32_t *ids, size_t n, int skip_special, char **text,
                       size_t *len) {
  *text = NULL, *len = 0;
  bpe_pieces toks = {0}, dec = {0};
  bpe_state *st = NULL;
  fsdp_status rc = FSDP_OK;
  for (size_t i = 0; i < n && rc == FSDP_OK; i++) {
    if ((int64_t)ids[i] >= t->vocab_size) {
      rc = fsdp_set_error(FSDP_ERR_RANGE, "token id %u is outside the tokenizer's vocabulary of %lld", ids[i],
                          (long long)t->vocab_size);
      break;
    }
    const bpe_added *a = bpe_added_by_id(t, ids[i]);
    if (a && skip_special && a->special) continue;
    const char *s = a ? (a->norm ? a->norm : a->content) : ids[i] < t->model.ntok ? t->model.tok[ids[i]] : NULL;
    if (s) rc = bpe_pieces_add(&toks, s, a ? (a->norm ? a->norm_len : a->len) : strlen(s), -1, 0);
  }
  if (rc == FSDP_OK && t->dec) {
    if ((rc = bpe_state_new(t, &st)) == FSDP_OK) rc = dec_apply(t->dec, st, &toks, &dec);
  } else if (rc == FSDP_OK) {
    for (size_t i = 0; i < toks.n && rc == FSDP_OK; i++) {   /* no decoder: joined by spaces */
      if (i) rc = bpe_pieces_add(&dec, " ", 1, -1, 0);
      if (rc == FSDP_OK) rc = bpe_pieces_add(&dec, TOK(&toks, i), toks.v[i].len, -1, 0);
    }
  }
  bpe_str out = {0};
  if (rc == FSDP_OK) rc = bpe_str_put(&out, "", 0);
  for (size_t i = 0; i < dec.n && rc == FSDP_OK; i++) rc = bpe_str_put(&out, TOK(&dec, i), dec.v[i].len);
  if (rc == FSDP_OK) *text = out.p, *len = out.n;
  else free(out.p);
  bpe_pieces_free(&toks), bpe_pieces_free(&dec);
  bpe_state_destroy(&st);
  return rc;
}

void bpe_dec_free(bpe_dec *d) {
  if (!d) return;
  for (size_t k = 0; k < d->nkids; k++) bpe_dec_free(d->kids[k]);
  free(d->kids), free(d->text);
  bpe_pattern_free(&d->pat);
  free(d);
}

/* Whether the decoder is ByteLevel (alone or in a Sequence): tokens then spell bytes. */
static int dec_is_bytelevel(const bpe_dec *d) {
  if (!d) return 0;
  if (d->kind == BPE_DEC_BYTELEVEL) return 1;
  if (d->kind != BPE_DEC_SEQ) return 0;
  for (size_t i = 0; i < d->nkids; i++)
    if (dec_is_bytelevel(d->kids[i])) return 1;
  return 0;
}

long bpe_token_bytes(const bpe_tokenizer *t, uint32_t id, char *buf, size_t cap) {
  if (!dec_is_bytelevel(t->dec) || (int64_t)id >= t->vocab_size) return -1;
  const bpe_added *a = bpe_added_by_id(t, id);
  const char *s = a ? a->content : (id < t->model.ntok ? t->model.tok[id] : NULL);
  if (!s) return -1;
  size_t n = a ? a->len : strlen(s), o = 0;
  if (a) {
    if (n > cap) return -1;
    memcpy(buf, s, n);
    return (long)n;
  }
  for (size_t j = 0, k; j < n; j += k) {
    int b = bpe_char_byte(bpe_utf8_next(s + j, n - j, &k));
    if (b < 0) {   /* not a byte-level token: its own bytes, as the decoder does */
      if (n > cap) return -1;
      memcpy(buf, s, n);
      return (long)n;
    }
    if (o >= cap) return -1;
    buf[o++] = (char)b;
  }
  return (long)o;
}
