/* bpe_model — the BPE model: string and merge maps, and a word's ids by the merges (see bpe.h).
 *
 * A word is split into characters (each its vocabulary id, else its bytes' <0xXX> ids with byte
 * fallback, else the unk token, fused when fuse_unk), then the pair of adjacent symbols with the
 * lowest merge rank is merged, the leftmost among equal ranks, until no pair has a merge. Candidate
 * merges wait in a binary heap keyed by (rank, position); an entry whose pair has changed since it
 * was pushed is dropped when popped. Words shorter than BPE_CACHE_WORD bytes are cached per state.
 */
#include <stdlib.h>
#include <string.h>

#include "bpe_priv.h"

#define BPE_CACHE_WORD 256       /* longest word cached, bytes */
#define BPE_CACHE_MAX (1 << 17)  /* cached words before the cache starts over */

struct bpe_sym {
  uint32_t id;
  int32_t prev, next;
  uint32_t len;   /* bytes; 0 once merged into its left neighbour */
};

uint64_t bpe_hash(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  h ^= h >> 29;
  return h | 1;   /* 0 marks an empty slot */
}

static fsdp_status smap_grow(bpe_smap *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  uint64_t *hash = calloc(cap, sizeof *hash);
  size_t *koff = malloc(cap * sizeof *koff);
  uint32_t *klen = malloc(cap * sizeof *klen);
  int64_t *val = malloc(cap * sizeof *val);
  if (!hash || !koff || !klen || !val) {
    free(hash), free(koff), free(klen), free(val);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory (a map of %zu entries)", cap);
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->hash[i]) continue;
    size_t j = m->hash[i] & (cap - 1);
    while (hash[j]) j = (j + 1) & (cap - 1);
    hash[j] = m->hash[i], koff[j] = m->koff[i], klen[j] = m->klen[i], val[j] = m->val[i];
  }
  free(m->hash), free(m->koff), free(m->klen), free(m->val);
  m->hash = hash, m->koff = koff, m->klen = klen, m->val = val, m->cap = cap;
  return FSDP_OK;
}

static size_t smap_slot(const bpe_smap *m, const char *k, size_t n, uint64_t h) {
  size_t j = h & (m->cap - 1);
  while (m->hash[j] && !(m->hash[j] == h && m->klen[j] == n && !memcmp(m->pool.p + m->koff[j], k, n)))
    j = (j + 1) & (m->cap - 1);
  return j;
}

fsdp_status bpe_smap_put(bpe_smap *m, const char *k, size_t n, int64_t v) {
  if (2 * (m->n + 1) > m->cap) TRY(smap_grow(m));
  uint64_t h = bpe_hash(k, n);
  size_t j = smap_slot(m, k, n, h);
  if (!m->hash[j]) {
    size_t off = m->pool.n;
    TRY(bpe_str_put(&m->pool, k, n));
    m->hash[j] = h, m->koff[j] = off, m->klen[j] = (uint32_t)n;
    m->n++;
  }
  m->val[j] = v;
  return FSDP_OK;
}

int64_t bpe_smap_get(const bpe_smap *m, const char *k, size_t n) {
  if (!m->cap) return -1;
  size_t j = smap_slot(m, k, n, bpe_hash(k, n));
  return m->hash[j] ? m->val[j] : -1;
}

static void smap_clear(bpe_smap *m) {
  if (m->cap) memset(m->hash, 0, m->cap * sizeof *m->hash);
  m->n = 0;
  m->pool.n = 0;
}

void bpe_smap_free(bpe_smap *m) {
  free(m->hash), free(m->koff), free(m->klen), free(m->val), free(m->pool.p);
  memset(m, 0, sizeof *m);
}

/* ---- merges: (left, right) → rank and new id ---- */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

/* The merge of (A, B): 1 with its rank and new id, 0 when there is none. */
static int merge_get(const bpe_model *m, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *id) {
  if (!m->mcap) return 0;
  uint64_t key = (uint64_t)a << 32 | b;
  for (size_t j = mix64(key) & (m->mcap - 1);; j = (j + 1) & (m->mcap - 1)) {
    if (m->mval[j] == UINT64_MAX) return 0;
    if (m->mkey[j] == key) {
      *rank = (uint32_t)(m->mval[j] >> 32), *id = (uint32_t)m->mval[j];
      return 1;
    }
  }
}

static fsdp_status merges_grow(bpe_model *m, size_t cap) {
  uint64_t *key = malloc(cap * sizeof *key), *val = malloc(cap * sizeof *val);
  if (!key || !val) {
    free(key), free(val);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory (%zu merges)", cap);
  }
  memset(val, 0xff, cap * sizeof *val);
  for (size_t i = 0; i < m->mcap; i++) {
    if (m->mval[i] == UINT64_MAX) continue;
    size_t j = mix64(m->mkey[i]) & (cap - 1);
    while (val[j] != UINT64_MAX) j = (j + 1) & (cap - 1);
    key[j] = m->mkey[i], val[j] = m->mval[i];
  }
  free(m->mkey), free(m->mval);
  m->mkey = key, m->mval = val, m->mcap = cap;
  return FSDP_OK;
}

/* A pair merged twice keeps its last rank, as the library's map does. RANK counts the merges
 * added so far, which sizes the table. */
fsdp_status bpe_model_add_merge(bpe_model *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
  if (2 * ((size_t)rank + 1) > m->mcap) TRY(merges_grow(m, m->mcap ? m->mcap * 2 : 1024));
  uint64_t key = (uint64_t)a << 32 | b;
  size_t j = mix64(key) & (m->mcap - 1);
  while (m->mval[j] != UINT64_MAX) {
    if (m->mkey[j] == key) break;
    j = (j + 1) & (m->mcap - 1);
  }
  m->mkey[j] = key, m->mval[j] = (uint64_t)rank << 32 | id;
  return FSDP_OK;
}

void bpe_model_free(bpe_model *m) {
  bpe_smap_free(&m->vocab);
  for (size_t i = 0; i < m->ntok; i++) free(m->tok[i]);
  free(m->tok), free(m->mkey), free(m->mval), free(m->prefix), free(m->suffix);
  memset(m, 0, sizeof *m);
}

/* ---- a word's symbols ---- */

fsdp_status bpe_ids_push(bpe_ids *o, uint32_t id) {
  if (o->n == o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 256;
    uint32_t *v = realloc(o->v, cap * sizeof *v);
    if (!v) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory (%zu token ids)", cap);
    o->v = v, o->cap = cap;
  }
  o->v[o->n++] = id;
  return FSDP_OK;
}

static fsdp_status sym_push(bpe_state *st, size_t *n, uint32_t id, uint32_t len) {
  if (*n == st->sym_cap) {
    size_t cap = st->sym_cap ? st->sym_cap * 2 : 256;
    struct bpe_sym *s = realloc(st->sym, cap * sizeof *s);
    if (!s) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory (a word of %zu symbols)", cap);
    st->sym = s, st->sym_cap = cap;
  }
  st->sym[*n] = (struct bpe_sym){id, (int32_t)*n - 1, (int32_t)*n + 1, len};
  (*n)++;
  return FSDP_OK;
}

/* The vocabulary id of character C (with the prefix when not first, the suffix when last). */
static int64_t char_id(const bpe_model *m, bpe_state *st, const char *c, size_t cn, int first, int last) {
  if ((first || !m->prefix) && (!last || !m->suffix)) return bpe_smap_get(&m->vocab, c, cn);
  bpe_str *b = &st->wbuf;
  b->n = 0;
  if ((!first && m->prefix && bpe_str_put(b, m->prefix, strlen(m->prefix))) || bpe_str_put(b, c, cn) ||
      (last && m->suffix && bpe_str_put(b, m->suffix, strlen(m->suffix))))
    return -1;
  return bpe_smap_get(&m->vocab, b->p, b->n);
}

/* The word's characters as symbols (bpe_model.c's header), in st->sym[0..*ns). */
static fsdp_status word_symbols(const bpe_model *m, bpe_state *st, const char *w, size_t n, size_t *ns) {
  int64_t unk = -1;
  size_t unk_len = 0;
  *ns = 0;
  for (size_t i = 0; i < n;) {
    size_t cn;
    bpe_utf8_next(w + i, n - i, &cn);
    int64_t id = char_id(m, st, w + i, cn, i == 0, i + cn == n);
    int fell_back = 0;
    if (id < 0 && m->byte_fallback) {
      fell_back = 1;
      for (size_t k = 0; k < cn; k++) fell_back &= m->byte_id[(unsigned char)w[i + k]] >= 0;
    }
    if (id >= 0 || fell_back) {
      if (unk >= 0) TRY(sym_push(st, ns, (uint32_t)unk, (uint32_t)unk_len));
      unk = -1;
      if (id >= 0) TRY(sym_push(st, ns, (uint32_t)id, (uint32_t)cn));
      else
        for (size_t k = 0; k < cn; k++) TRY(sym_push(st, ns, (uint32_t)m->byte_id[(unsigned char)w[i + k]], 1));
    } else if (m->unk_id >= 0) {
      if (unk >= 0 && m->fuse_unk) unk_len += cn;
      else {
        if (unk >= 0) TRY(sym_push(st, ns, (uint32_t)unk, (uint32_t)unk_len));
        unk = m->unk_id, unk_len = cn;
      }
    }   /* no unk token: the character is dropped, as the library does */
    i += cn;
  }
  if (unk >= 0) TRY(sym_push(st, ns, (uint32_t)unk, (uint32_t)unk_len));
  if (*ns) st->sym[*ns - 1].next = -1;
  return FSDP_OK;
}

/* ---- the heap of candidate merges: rank << 32 | position, smallest first ---- */

static fsdp_status heap_push(bpe_state *st, size_t *n, uint64_t v) {
  if (*n == st->heap_cap) {
    size_t cap = st->heap_cap ? st->heap_cap * 2 : 256;
    uint64_t *h = realloc(st->heap, cap * sizeof *h);
    if (!h) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory (%zu merge candidates)", cap);
    st->heap = h, st->heap_cap = cap;
  }
  uint64_t *h = st->heap;
  size_t i = (*n)++;
  while (i && h[(i - 1) / 2] > v) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
  h[i] = v;
  return FSDP_OK;
}

static uint64_t heap_pop(bpe_state *st, size_t *n) {
  uint64_t *h = st->heap, top = h[0], last = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1] < h[c]) c++;
    if (h[c] >= last) break;
    h[i] = h[c], i = c;
  }
  h[i] = last;
  return top;
}

static fsdp_status push_pair(const bpe_model *m, bpe_state *st, size_t *nh, int32_t pos) {
  struct bpe_sym *s = st->sym;
  uint32_t rank, id;
  if (pos < 0 || s[pos].next < 0) return FSDP_OK;
  if (!merge_get(m, s[pos].id, s[s[pos].next].id, &rank, &id)) return FSDP_OK;
  return heap_push(st, nh, (uint64_t)rank << 32 | (uint32_t)pos);
}

static fsdp_status merge_all(const bpe_model *m, bpe_state *st, size_t ns) {
  size_t nh = 0;
  struct bpe_sym *s = st->sym;
  for (size_t i = 0; i + 1 < ns; i++) TRY(push_pair(m, st, &nh, (int32_t)i));
  while (nh) {
    uint64_t top = heap_pop(st, &nh);
    int32_t pos = (int32_t)(uint32_t)top;
    uint32_t rank, id;
    if (!s[pos].len || s[pos].next < 0) continue;
    int32_t nx = s[pos].next;
    if (!merge_get(m, s[pos].id, s[nx].id, &rank, &id) || rank != (uint32_t)(top >> 32)) continue;
    s[pos].id = id;
    s[pos].len += s[nx].len;
    s[pos].next = s[nx].next;
    s[nx].len = 0;
    if (s[pos].next >= 0) s[s[pos].next].prev = pos;
    TRY(push_pair(m, st, &nh, s[pos].prev));
    TRY(push_pair(m, st, &nh, pos));
  }
  return FSDP_OK;
}

fsdp_status bpe_model_tokenize(const bpe_model *m, bpe_state *st, const char *w, size_t n, bpe_ids *out) {
  if (!n) return FSDP_OK;
  int64_t whole;
  if (m->ignore_merges && (whole = bpe_smap_get(&m->vocab, w, n)) >= 0) return bpe_ids_push(out, (uint32_t)whole);
  int cacheable = n < BPE_CACHE_WORD;
  if (cacheable) {
    int64_t c = bpe_smap_get(&st->cache, w, n);
    if (c >= 0) {
      for (int64_t k = 0; k < (c & 0xffff); k++) TRY(bpe_ids_push(out, st->cache_ids.v[(c >> 16) + k]));
      return FSDP_OK;
    }
  }
  size_t ns, first = out->n;
  TRY(word_symbols(m, st, w, n, &ns));
  TRY(merge_all(m, st, ns));
  for (size_t i = 0; i < ns; i++)
    if (st->sym[i].len) TRY(bpe_ids_push(out, st->sym[i].id));
  if (cacheable && out->n - first < 0xffff) {
    if (st->cache.n >= BPE_CACHE_MAX) smap_clear(&st->cache), st->cache_ids.n = 0;
    int64_t v = (int64_t)st->cache_ids.n << 16 | (int64_t)(out->n - first);
    for (size_t k = first; k < out->n; k++) TRY(bpe_ids_push(&st->cache_ids, out->v[k]));
    TRY(bpe_smap_put(&st->cache, w, n, v));
  }
  return FSDP_OK;
}

