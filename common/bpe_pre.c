/* bpe_pre — patterns, normalizers and pre-tokenizers of a tokenizer.json (see bpe.h).
 *
 * Regex patterns are compiled by Oniguruma, the library `tokenizers` runs them on, with the same
 * syntax (ONIG_SYNTAX_DEFAULT), options (none) and encoding (UTF-8), so \s, \w, \p{L}, (?i) and
 * the rest mean what they mean there; matches are found as the onig crate's find_iter finds them
 * (bpe_matches_next). Unicode normalization is libutf8proc's, restricted to the characters of the
 * Unicode version `tokenizers` normalizes with (bpe_unicode9.c).
 */
#define _GNU_SOURCE   /* memmem */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <oniguruma.h>
#include <utf8proc.h>

#include "bpe_priv.h"

/* ---- UTF-8 validity (bpe.h; reading and writing code points: bpe_text.h) ---- */

size_t bpe_utf8_invalid_at(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if ((unsigned char)s[i] < 0x80) {
      i++;
      continue;
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
    if (k < 0) return i;
    i += (size_t)k;
  }
  return n;
}

/* ---- the byte-level alphabet: printable bytes stand for themselves, the 68 others for 256.. ---- */

int32_t bpe_byte_char(unsigned char b) {
  if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae) return b;
  if (b <= 0x20) return 256 + b;
  if (b >= 0x7f && b <= 0xa0) return 256 + 33 + (b - 0x7f);
  return 256 + 67;   /* 0xad */
}

int bpe_char_byte(int32_t cp) {
  if (cp < 0) return -1;
  if (cp < 256) return bpe_byte_char((unsigned char)cp) == cp ? cp : -1;
  cp -= 256;
  if (cp <= 0x20) return cp;
  if (cp < 33 + 34) return cp - 33 + 0x7f;
  return cp == 67 ? 0xad : -1;
}

static char bl_utf8[256][2];
static unsigned char bl_len[256];
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;
static void bl_init(void) {
  for (int b = 0; b < 256; b++) {
    char tmp[4];
    bl_len[b] = (unsigned char)bpe_utf8_put(bpe_byte_char((unsigned char)b), tmp);
    memcpy(bl_utf8[b], tmp, bl_len[b]);
  }
}

/* ---- pieces ---- */

fsdp_status bpe_pieces_add(bpe_pieces *l, const char *p, size_t n, int64_t id, int first) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    bpe_piece *v = realloc(l->v, cap * sizeof *v);
    if (!v) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory (%zu pieces)", cap);
    l->v = v, l->cap = cap;
  }
  l->v[l->n++] = (bpe_piece){l->text.n, n, id, first};
  return bpe_str_put(&l->text, p, n);
}

void bpe_pieces_clear(bpe_pieces *l) { l->n = 0, l->text.n = 0; }
void bpe_pieces_free(bpe_pieces *l) {
  free(l->v), free(l->text.p);
  memset(l, 0, sizeof *l);
}

/* ---- patterns ---- */

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;
static void onig_setup(void) {
  OnigEncoding enc[] = {ONIG_ENCODING_UTF8};
  onig_initialize(enc, 1);
}

fsdp_status bpe_pattern_compile(bpe_pattern *p, const char *lit, const char *regex, const char *where) {
  memset(p, 0, sizeof *p);
  if (lit && *lit) {
    p->lit_n = strlen(lit);
    if (!(p->lit = strdup(lit))) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
    return FSDP_OK;
  }
  if (lit) regex = "";   /* the library escapes a String pattern into a regex: the empty one matches everywhere */
  pthread_once(&onig_once, onig_setup);
  OnigErrorInfo info;
  const OnigUChar *re = (const OnigUChar *)regex;
  int r = onig_new(&p->re, re, re + strlen(regex), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  if (r != ONIG_NORMAL) {
    OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(msg, r, &info);
    p->re = NULL;
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: regex /%s/ does not compile: %s", where, regex, (char *)msg);
  }
  return FSDP_OK;
}

void bpe_pattern_free(bpe_pattern *p) {
  free(p->lit);
  if (p->re) onig_free(p->re);
  memset(p, 0, sizeof *p);
}

/* The leftmost match of P in S[0..N) at or after START: 1 with [*MS, *ME), 0 when none. */
static int pattern_search(const bpe_pattern *p, bpe_state *st, const char *s, size_t n, size_t start,
                          size_t *ms, size_t *me, fsdp_status *rc) {
  if (p->lit) {
    if (start >= n) return 0;
    const char *f = memmem(s + start, n - start, p->lit, p->lit_n);
    if (!f) return 0;
    *ms = (size_t)(f - s), *me = *ms + p->lit_n;
    return 1;
  }
  const OnigUChar *u = (const OnigUChar *)s;
  int r = onig_search(p->re, u, u + n, u + start, u + n, st->region, ONIG_OPTION_NONE);
  if (r == ONIG_MISMATCH) return 0;
  if (r < 0) {
    OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(msg, r);
    *rc = fsdp_set_error(FSDP_ERR_RANGE, "the tokenizer's regex failed on a piece of %zu bytes: %s", n, (char *)msg);
    return 0;
  }
  *ms = (size_t)st->region->beg[0], *me = (size_t)st->region->end[0];
  return 1;
}

void bpe_matches_init(bpe_matches *m, const bpe_pattern *p, bpe_state *st, const char *s, size_t n) {
  *m = (bpe_matches){p, st, s, n, 0, 0, 0};
}

int bpe_matches_next(bpe_matches *m, size_t *ms, size_t *me, fsdp_status *rc) {
  *rc = FSDP_OK;
  while (m->from <= m->n) {
    if (!pattern_search(m->p, m->st, m->s, m->n, m->from, ms, me, rc)) return 0;
    if (*ms == *me && m->matched && m->last_end == *me) {   /* empty, right after the last match */
      size_t k = 1;
      if (m->from < m->n) bpe_utf8_next(m->s + m->from, m->n - m->from, &k);
      m->from += k;
      continue;
    }
    m->from = m->last_end = *me, m->matched = 1;
    return 1;
  }
  return 0;
}

/* ---- normalizers ---- */

static fsdp_status norm_span(const bpe_norm *nm, const char *s, size_t n, bpe_str *out) {
  if (!n) return FSDP_OK;
  utf8proc_uint8_t *d = NULL;
  utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &d, nm->uoptions);
  if (k < 0) return fsdp_set_error(FSDP_ERR_INVALID, "unicode normalization failed: %s", utf8proc_errmsg(k));
  fsdp_status rc = bpe_str_put(out, d, (size_t)k);
  free(d);
  return rc;
}

/* The library normalizes with Unicode 9.0's tables: a character assigned since is, to it, an
 * unassigned starter that stays as it is and that nothing reorders or composes across, so the
 * text is normalized in the spans between such characters and they are copied. */
static fsdp_status norm_unicode(const bpe_norm *nm, const char *s, size_t n, bpe_str *out) {
  size_t i = 0, a = 0, k;
  while (i < n && (unsigned char)s[i] < 0x80) i++;
  if (i == n) return bpe_str_put(out, s, n);   /* ASCII is in every normal form */
  for (; i < n; i += k) {
    k = 1;
    if ((unsigned char)s[i] < 0x80 || !bpe_unicode9_unassigned(bpe_utf8_next(s + i, n - i, &k))) continue;
    TRY(norm_span(nm, s + a, i - a, out));
    TRY(bpe_str_put(out, s + i, k));
    a = i + k;
  }
  return norm_span(nm, s + a, n - a, out);
}

static fsdp_status norm_replace(const bpe_norm *nm, bpe_state *st, const char *s, size_t n, bpe_str *out) {
  size_t at = 0, ms, me;
  fsdp_status rc;
  bpe_matches m;
  bpe_matches_init(&m, &nm->pat, st, s, n);
  while (bpe_matches_next(&m, &ms, &me, &rc)) {
    TRY(bpe_str_put(out, s + at, ms - at));
    TRY(bpe_str_put(out, nm->text, nm->text_n));
    at = me;
  }
  TRY(rc);
  return bpe_str_put(out, s + at, n - at);
}

fsdp_status bpe_norm_apply(const bpe_norm *nm, bpe_state *st, const char *s, size_t n, bpe_str *out) {
  switch (nm->kind) {
  case BPE_NORM_UNICODE: return norm_unicode(nm, s, n, out);
  case BPE_NORM_PREPEND:
    if (n) TRY(bpe_str_put(out, nm->text, nm->text_n));
    return bpe_str_put(out, s, n);
  case BPE_NORM_REPLACE: return norm_replace(nm, st, s, n, out);
  case BPE_NORM_SEQ: break;
  }
  bpe_str a = {0}, b = {0};
  fsdp_status rc;
  TRY_GOTO(bpe_str_put(&a, s, n), rc, out);
  for (size_t k = 0; k < nm->nkids; k++) {
    b.n = 0;
    TRY_GOTO(bpe_str_put(&b, "", 0), rc, out);
    TRY_GOTO(bpe_norm_apply(nm->kids[k], st, a.p, a.n, &b), rc, out);
    bpe_str t = a;
    a = b, b = t;
  }
  rc = bpe_str_put(out, a.p, a.n);
out:
  free(a.p), free(b.p);
  return rc;
}

void bpe_norm_free(bpe_norm *nm) {
  if (!nm) return;
  for (size_t k = 0; k < nm->nkids; k++) bpe_norm_free(nm->kids[k]);
  free(nm->kids), free(nm->text);
  bpe_pattern_free(&nm->pat);
  free(nm);
}

/* ---- pre-tokenizers ---- */

/* Byte-level characters of S into a new piece of OUT. */
static fsdp_status bytelevel_piece(const char *s, size_t n, int first, bpe_pieces *out) {
  pthread_once(&bl_once, bl_init);
  TRY(bpe_pieces_add(out, "", 0, -1, first));
  bpe_piece *pc = &out->v[out->n - 1];
  for (size_t i = 0; i < n; i++) TRY(bpe_str_put(&out->text, bl_utf8[(unsigned char)s[i]], bl_len[(unsigned char)s[i]]));
  pc->len = out->text.n - pc->off;
  return FSDP_OK;
}

/* A segment of a piece: [a, b), whether the pattern matched it. */
typedef struct seg {
  size_t a, b;
  int match;
} seg;

typedef struct segs {
  seg *v;
  size_t n, cap;
} segs;

static fsdp_status segs_add(segs *l, size_t a, size_t b, int match) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    seg *v = realloc(l->v, cap * sizeof *v);
    if (!v) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory (%zu segments)", cap);
    l->v = v, l->cap = cap;
  }
  l->v[l->n++] = (seg){a, b, match};
  return FSDP_OK;
}

/* S cut at the matches of PAT: the whole of S in order, each segment marked match or not. */
static fsdp_status find_segments(const bpe_pattern *pat, bpe_state *st, const char *s, size_t n, int invert, segs *l) {
  size_t prev = 0, ms, me;
  fsdp_status rc;
  bpe_matches m;
  bpe_matches_init(&m, pat, st, s, n);
  l->n = 0;
  while (bpe_matches_next(&m, &ms, &me, &rc)) {
    if (prev != ms) TRY(segs_add(l, prev, ms, invert));
    TRY(segs_add(l, ms, me, !invert));
    prev = me;
  }
  TRY(rc);
  if (prev != n) TRY(segs_add(l, prev, n, invert));
  return FSDP_OK;
}

/* The library's split behaviors on segments, in place: what remains is kept unless marked removed
 * (the match flag then means "remove"). */
static void apply_behavior(segs *l, bpe_split_behavior b) {
  size_t w = 0;
  int prev = 0;
  switch (b) {
  case BPE_SPLIT_REMOVED: return;
  case BPE_SPLIT_ISOLATED:
    for (size_t i = 0; i < l->n; i++) l->v[i].match = 0;
    return;
  case BPE_SPLIT_CONTIGUOUS:
  case BPE_SPLIT_PREV:
    for (size_t i = 0; i < l->n; i++) {
      seg s = l->v[i];
      int join = b == BPE_SPLIT_CONTIGUOUS ? s.match == prev : (s.match && !prev);
      if (join && w) l->v[w - 1].b = s.b;
      else l->v[w++] = (seg){s.a, s.b, 0};
      prev = s.match;
    }
    l->n = w;
    return;
  case BPE_SPLIT_NEXT:
    w = l->n;
    for (size_t i = l->n; i-- > 0;) {
      seg s = l->v[i];
      if (s.match && !prev && w < l->n) l->v[w].a = s.a;
      else l->v[--w] = (seg){s.a, s.b, 0};
      prev = s.match;
    }
    memmove(l->v, l->v + w, (l->n - w) * sizeof *l->v);
    l->n -= w;
    return;
  }
}

/* PIECE split at PAT's matches with BEHAVIOR into OUT (byte-level characters when BYTELEVEL). */
static fsdp_status split_piece(const bpe_pattern *pat, bpe_split_behavior behavior, int invert, int bytelevel,
                               bpe_state *st, const char *s, size_t n, int first, bpe_pieces *out) {
  segs l = {0};
  fsdp_status rc;
  TRY_GOTO(find_segments(pat, st, s, n, invert, &l), rc, done);
  apply_behavior(&l, behavior);
  for (size_t i = 0; i < l.n; i++) {
    seg g = l.v[i];
    if (g.match || g.a == g.b) continue;
    int f = first && g.a == 0;
    TRY_GOTO(bytelevel ? bytelevel_piece(s + g.a, g.b - g.a, f, out) : bpe_pieces_add(out, s + g.a, g.b - g.a, -1, f),
             rc, done);
  }
done:
  free(l.v);
  return rc;
}

static fsdp_status pre_bytelevel(const bpe_pre *p, bpe_state *st, const char *s, size_t n, int first, bpe_pieces *out) {
  if (p->add_prefix_space && s[0] != ' ') {
    bpe_str *b = &st->na;
    b->n = 0;
    TRY(bpe_str_put(b, " ", 1));
    TRY(bpe_str_put(b, s, n));
    s = b->p, n = b->n;
  }
  if (p->use_regex) return split_piece(&p->pat, BPE_SPLIT_ISOLATED, 0, 1, st, s, n, first, out);
  return bytelevel_piece(s, n, first, out);
}

static fsdp_status pre_metaspace(const bpe_pre *p, bpe_state *st, const char *s, size_t n, int first, bpe_pieces *out) {
  bpe_str *b = &st->na;
  b->n = 0;
  int starts = n >= p->rep_n && !memcmp(s, p->rep, p->rep_n);
  if (!starts && s[0] == ' ') starts = 1;   /* the space becomes the replacement */
  if (!starts && (p->prepend == BPE_PREPEND_ALWAYS || (p->prepend == BPE_PREPEND_FIRST && first)))
    TRY(bpe_str_put(b, p->rep, p->rep_n));
  for (size_t i = 0; i < n; i++) TRY(s[i] == ' ' ? bpe_str_put(b, p->rep, p->rep_n) : bpe_str_put(b, s + i, 1));
  if (!p->split) return bpe_pieces_add(out, b->p, b->n, -1, first);
  /* a piece begins at each replacement character (MergedWithNext) */
  bpe_pattern lit = {.lit = (char *)p->rep, .lit_n = p->rep_n};
  return split_piece(&lit, BPE_SPLIT_NEXT, 0, 0, st, b->p, b->n, first, out);
}

fsdp_status bpe_pre_apply(const bpe_pre *p, bpe_state *st, const bpe_pieces *in, bpe_pieces *out) {
  if (p->kind == BPE_PRE_SEQ) {
    bpe_pieces a = {0}, b = {0};
    const bpe_pieces *cur = in;
    fsdp_status rc = FSDP_OK;
    for (size_t k = 0; k < p->nkids && rc == FSDP_OK; k++) {
      bpe_pieces *dst = k + 1 == p->nkids ? out : (cur == &a ? &b : &a);
      if (dst != out) bpe_pieces_clear(dst);
      rc = bpe_pre_apply(p->kids[k], st, cur, dst);
      cur = dst;
    }
    if (!p->nkids && rc == FSDP_OK)
      for (size_t i = 0; i < in->n && rc == FSDP_OK; i++)
        rc = bpe_pieces_add(out, in->text.p + in->v[i].off, in->v[i].len, in->v[i].id, in->v[i].first);
    bpe_pieces_free(&a), bpe_pieces_free(&b);
    return rc;
  }
  for (size_t i = 0; i < in->n; i++) {
    const bpe_piece *pc = &in->v[i];
    const char *s = in->text.p + pc->off;
    if (pc->id >= 0) {
      TRY(bpe_pieces_add(out, s, pc->len, pc->id, pc->first));
      continue;
    }
    switch (p->kind) {
    case BPE_PRE_BYTELEVEL: TRY(pre_bytelevel(p, st, s, pc->len, pc->first, out)); break;
    case BPE_PRE_SPLIT: TRY(split_piece(&p->pat, p->behavior, p->invert, 0, st, s, pc->len, pc->first, out)); break;
    case BPE_PRE_METASPACE: TRY(pre_metaspace(p, st, s, pc->len, pc->first, out)); break;
    case BPE_PRE_SEQ: break;
    }
  }
  return FSDP_OK;
}

void bpe_pre_free(bpe_pre *p) {
  if (!p) return;
  for (size_t k = 0; k < p->nkids; k++) bpe_pre_free(p->kids[k]);
  free(p->kids);
  bpe_pattern_free(&p->pat);
  free(p);
}
