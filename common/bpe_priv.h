/* bpe_priv — the types shared by the bpe_*.c files (bpe.h is the interface; growable bytes and
 * UTF-8, below them all, are bpe_text.h's): the tokenizer's parts as loaded from tokenizer.json
 * (bpe_load.c), the BPE model and its maps (bpe_model.c), patterns, normalizers and pre-tokenizers
 * (bpe_pre.c), the encoding pipeline (bpe_encode.c) and decoders (bpe_decode.c). Everything in a
 * bpe_tokenizer is immutable after load; per-thread scratch lives in bpe_state.
 */
#ifndef FSDP_BPE_PRIV_H
#define FSDP_BPE_PRIV_H

#include <oniguruma.h>
#include <stddef.h>
#include <stdint.h>

#include "bpe.h"
#include "bpe_text.h"

/* ---- piece lists (over bpe_text.h's growable bytes) ---- */

/* A piece of text being encoded: bytes off..off+len of its list's text, or an added token (id ≥ 0).
 * FIRST: the piece starts at the beginning of the input (Metaspace's prepend_scheme "first"). */
typedef struct bpe_piece {
  size_t off, len;
  int64_t id;
  int first;
} bpe_piece;
typedef struct bpe_pieces {
  bpe_piece *v;
  size_t n, cap;
  bpe_str text;
} bpe_pieces;
fsdp_status bpe_pieces_add(bpe_pieces *l, const char *p, size_t n, int64_t id, int first);
void bpe_pieces_clear(bpe_pieces *l);
void bpe_pieces_free(bpe_pieces *l);

/* ---- hash maps ---- */
/* String → int64, open addressing; keys live in the map's pool. */
typedef struct bpe_smap {
  uint64_t *hash;   /* 0 = empty slot */
  size_t *koff;     /* key offset in pool */
  uint32_t *klen;
  int64_t *val;
  size_t cap, n;
  bpe_str pool;
} bpe_smap;
fsdp_status bpe_smap_put(bpe_smap *m, const char *k, size_t n, int64_t v);
/* -1 when absent */
int64_t bpe_smap_get(const bpe_smap *m, const char *k, size_t n);
void bpe_smap_free(bpe_smap *m);
uint64_t bpe_hash(const void *p, size_t n);

/* ---- patterns: a literal string or an Oniguruma regex ---- */
typedef struct bpe_pattern {
  char *lit;         /* non-empty literal (String pattern), or NULL */
  size_t lit_n;
  regex_t *re;       /* Regex pattern (or the empty String's), Oniguruma's default syntax, UTF-8 */
} bpe_pattern;
fsdp_status bpe_pattern_compile(bpe_pattern *p, const char *lit, const char *regex, const char *where);
void bpe_pattern_free(bpe_pattern *p);

/* The matches of a pattern in S[0..N), in order, as `tokenizers` finds them (the onig crate's
 * find_iter): each search starts where the last match ended, in the whole of S (look-behind sees
 * the text before), and an empty match right at the end of the previous match is not taken: the
 * search goes on one character further. */
typedef struct bpe_matches {
  const bpe_pattern *p;
  bpe_state *st;
  const char *s;
  size_t n;
  size_t from;       /* where the next search starts */
  size_t last_end;   /* the end of the last match, when MATCHED */
  int matched;
} bpe_matches;
void bpe_matches_init(bpe_matches *m, const bpe_pattern *p, bpe_state *st, const char *s, size_t n);
/* The next match: 1 with [*MS, *ME), 0 at the end or on an error (*RC). */
int bpe_matches_next(bpe_matches *m, size_t *ms, size_t *me, fsdp_status *rc);

/* ---- normalizers ---- */
/* Whether `tokenizers`' Unicode 9.0 normalization tables lack CP, which libutf8proc's
 * normalization would change (bpe_unicode9.c, generated). */
int bpe_unicode9_unassigned(int32_t cp);
typedef enum { BPE_NORM_UNICODE, BPE_NORM_PREPEND, BPE_NORM_REPLACE, BPE_NORM_SEQ } bpe_norm_kind;
typedef struct bpe_norm {
  bpe_norm_kind kind;
  int uoptions;               /* UNICODE: utf8proc options (NFC, NFD, NFKC, NFKD) */
  char *text;                 /* PREPEND: the prefix; REPLACE: the content */
  size_t text_n;
  bpe_pattern pat;            /* REPLACE */
  struct bpe_norm **kids;     /* SEQ */
  size_t nkids;
} bpe_norm;
fsdp_status bpe_norm_apply(const bpe_norm *nm, bpe_state *st, const char *s, size_t n, bpe_str *out);
void bpe_norm_free(bpe_norm *nm);

/* ---- pre-tokenizers ---- */
typedef enum { BPE_PRE_BYTELEVEL, BPE_PRE_SPLIT, BPE_PRE_METASPACE, BPE_PRE_SEQ } bpe_pre_kind;
typedef enum { BPE_SPLIT_REMOVED, BPE_SPLIT_ISOLATED, BPE_SPLIT_PREV, BPE_SPLIT_NEXT,
               BPE_SPLIT_CONTIGUOUS } bpe_split_behavior;
typedef enum { BPE_PREPEND_ALWAYS, BPE_PREPEND_FIRST, BPE_PREPEND_NEVER } bpe_prepend_scheme;
typedef struct bpe_pre {
  bpe_pre_kind kind;
  int add_prefix_space, use_regex;      /* BYTELEVEL */
  bpe_pattern pat;                      /* SPLIT; BYTELEVEL's GPT-2 regex when use_regex */
  bpe_split_behavior behavior;          /* SPLIT */
  int invert;                           /* SPLIT */
  char rep[8];                          /* METASPACE: the replacement character's UTF-8 */
  size_t rep_n;
  bpe_prepend_scheme prepend;           /* METASPACE */
  int split;                            /* METASPACE */
  struct bpe_pre **kids;                /* SEQ */
  size_t nkids;
} bpe_pre;
/* Pre-tokenize every text piece of IN into OUT (added-token pieces pass through). */
fsdp_status bpe_pre_apply(const bpe_pre *p, bpe_state *st, const bpe_pieces *in, bpe_pieces *out);
void bpe_pre_free(bpe_pre *p);
/* The byte-level alphabet: byte B's character (a code point below 324), and back. */
int32_t bpe_byte_char(unsigned char b);
/* The byte of byte-level character CP, or -1. */
int bpe_char_byte(int32_t cp);
/* The GPT-2 regex the ByteLevel pre-tokenizer splits with. */
#define BPE_GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* ---- decoders ---- */
typedef enum { BPE_DEC_BYTELEVEL, BPE_DEC_BYTEFALLBACK, BPE_DEC_FUSE, BPE_DEC_STRIP,
               BPE_DEC_REPLACE, BPE_DEC_METASPACE, BPE_DEC_SEQ } bpe_dec_kind;
typedef struct bpe_dec {
  bpe_dec_kind kind;
  int32_t strip_char;          /* STRIP */
  int strip_start, strip_stop; /* STRIP */
  bpe_pattern pat;             /* REPLACE */
  char *text;                  /* REPLACE: content */
  size_t text_n;
  int32_t rep_cp;              /* METASPACE */
  bpe_prepend_scheme prepend;  /* METASPACE */
  struct bpe_dec **kids;       /* SEQ */
  size_t nkids;
} bpe_dec;
void bpe_dec_free(bpe_dec *d);

/* ---- post-processor: the ids TemplateProcessing puts around a single sequence ---- */
typedef struct bpe_post {
  uint32_t *before, *after;
  size_t nbefore, nafter;
} bpe_post;

/* ---- the BPE model ---- */
typedef struct bpe_model {
  bpe_smap vocab;               /* token → id */
  char **tok;                   /* id → token (NUL-terminated), NULL for holes */
  size_t ntok;                  /* entries of tok: the largest id + 1 */
  uint64_t *mkey;               /* merges: key (left << 32 | right), open addressing */
  uint64_t *mval;               /* rank << 32 | new id */
  size_t mcap;
  int64_t unk_id;               /* -1: no unk token */
  int fuse_unk, byte_fallback, ignore_merges;
  char *prefix, *suffix;        /* continuing_subword_prefix, end_of_word_suffix, or NULL */
  int64_t byte_id[256];         /* the ids of <0x00>..<0xFF>, -1 for missing */
} bpe_model;
fsdp_status bpe_model_add_merge(bpe_model *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id);
/* Append WORD's ids to OUT. */
fsdp_status bpe_model_tokenize(const bpe_model *m, bpe_state *st, const char *w, size_t n, bpe_ids *out);
void bpe_model_free(bpe_model *m);

/* ---- added tokens ---- */
typedef struct bpe_added {
  char *content;
  size_t len;
  char *norm;                   /* content after the normalizer, when normalized and different */
  size_t norm_len;
  uint32_t id;
  int special, normalized, lstrip, rstrip, single_word;
} bpe_added;

struct bpe_tokenizer {
  char *name;                   /* the file, for messages */
  bpe_model model;
  bpe_norm *norm;
  bpe_pre *pre;
  bpe_dec *dec;
  bpe_post post;
  bpe_added *added;
  size_t nadded;
  bpe_smap added_ids;           /* id (as 4 bytes) → index into added */
  unsigned char starts[2][256]; /* [normalized][b]: some added token's spelling begins with byte b */
  int64_t vocab_size;
  int64_t eos;
};

/* Per-thread scratch. */
struct bpe_state {
  const bpe_tokenizer *t;
  OnigRegion *region;           /* the regex's match */
  bpe_pieces pa, pb, pc;        /* pipeline stages */
  bpe_str na, nb;               /* normalizer scratch */
  bpe_str wbuf;                 /* a character with the subword prefix or suffix */
  /* BPE word scratch: symbols as a linked list, and a heap of candidate merges */
  struct bpe_sym *sym;
  size_t sym_cap;
  uint64_t *heap;
  size_t heap_cap;
  /* cache of encoded words: word → ids (offset and count in cache_ids) */
  bpe_smap cache;
  bpe_ids cache_ids;
};

/* The added token with id ID, or NULL. */
const bpe_added *bpe_added_by_id(const bpe_tokenizer *t, uint32_t id);

#endif
