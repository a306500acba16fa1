/* bpe_encode — text to ids: added tokens, normalizer, pre-tokenizer, model, post-processor
 * (the pipeline of bpe.h), and the per-thread bpe_state.
 *
 * Added tokens are found leftmost-longest as the library's Aho-Corasick automaton does, searching
 * on after each match's end; a single_word token only counts between non-word characters, lstrip
 * and rstrip take the white space beside it.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "bpe_priv.h"

fsdp_status bpe_state_new(const bpe_tokenizer *t, bpe_state **out) {
  *out = NULL;
  bpe_state *s = calloc(1, sizeof *s);
  if (!s) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  s->t = t;
  s->region = onig_region_new();
  if (!s->region) {
    bpe_state_destroy(&s);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory (regex match data)");
  }
  *out = s;
  return FSDP_OK;
}

void bpe_state_destroy(bpe_state **p) {
  bpe_state *s = *p;
  if (!s) return;
  if (s->region) onig_region_free(s->region, 1);
  bpe_pieces_free(&s->pa), bpe_pieces_free(&s->pb), bpe_pieces_free(&s->pc);
  free(s->na.p), free(s->nb.p), free(s->wbuf.p), free(s->sym), free(s->heap), free(s->cache_ids.v);
  bpe_smap_free(&s->cache);
  free(s);
  *p = NULL;
}

const bpe_added *bpe_added_by_id(const bpe_tokenizer *t, uint32_t id) {
  int64_t k = bpe_smap_get(&t->added_ids, (const char *)&id, sizeof id);
  return k < 0 ? NULL : &t->added[k];
}

int64_t bpe_vocab_size(const bpe_tokenizer *t) { return t->vocab_size; }
int64_t bpe_eos_id(const bpe_tokenizer *t) { return t->eos; }

int64_t bpe_token_id(const bpe_tokenizer *t, const char *token) {
  size_t n = strlen(token);
  for (size_t k = 0; k < t->nadded; k++)
    if (t->added[k].len == n && !memcmp(t->added[k].content, token, n)) return t->added[k].id;
  return bpe_smap_get(&t->model.vocab, token, n);
}

/* ---- added tokens ---- */

static int is_word_char(int32_t cp) {
  utf8proc_category_t c = utf8proc_category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_ME) || c == UTF8PROC_CATEGORY_ND ||
         c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC || cp == 0x200c || cp == 0x200d;
}

/* Unicode's White_Space property (Rust's \s and char::is_whitespace). */
static int is_space(int32_t cp) {
  return (cp >= 9 && cp <= 13) || cp == ' ' || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

/* The code point that ends S[0..N) (N > 0). */
static int32_t last_char(const char *s, size_t n, size_t *len) {
  size_t i = n - 1;
  while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
  *len = n - i;
  size_t k;
  return bpe_utf8_next(s + i, n - i, &k);
}

/* The longest added token (of the normalized ones when NORMALIZED) spelled at S[0..N), or NULL. */
static const bpe_added *added_at(const bpe_tokenizer *t, int normalized, const char *s, size_t n) {
  const bpe_added *best = NULL;
  size_t best_len = 0;
  for (size_t k = 0; k < t->nadded; k++) {
    const bpe_added *a = &t->added[k];
    if (a->normalized != normalized) continue;
    const char *c = a->norm ? a->norm : a->content;
    size_t cl = a->norm ? a->norm_len : a->len;
    if (cl > best_len && cl <= n && c[0] == s[0] && !memcmp(c, s, cl)) best = a, best_len = cl;
  }
  return best;
}

/* S split at the added tokens into OUT; FIRST: S starts the input. */
static fsdp_status split_added(const bpe_tokenizer *t, int normalized, const char *s, size_t n, int first,
                               bpe_pieces *out) {
  size_t done = 0;   /* bytes of S already in OUT */
  int any = 0;
  for (size_t i = 0; i < t->nadded; i++) any |= t->added[i].normalized == normalized;
  for (size_t i = 0; any && i < n;) {
    const bpe_added *a = t->starts[normalized][(unsigned char)s[i]] ? added_at(t, normalized, s + i, n - i) : NULL;
    if (!a) {
      i++;
      continue;
    }
    size_t start = i, stop = i + (a->norm ? a->norm_len : a->len), cl;
    i = stop;
    if (a->single_word && ((start > 0 && is_word_char(last_char(s, start, &cl))) ||
                           (stop < n && is_word_char(bpe_utf8_next(s + stop, n - stop, &cl)))))
      continue;
    if (a->lstrip)
      while (start > done && is_space(last_char(s, start, &cl))) start -= cl;
    if (a->rstrip)
      while (stop < n && is_space(bpe_utf8_next(s + stop, n - stop, &cl))) stop += cl;
    if (start > done) TRY(bpe_pieces_add(out, s + done, start - done, -1, first && done == 0));
    TRY(bpe_pieces_add(out, s + start, stop - start, a->id, first && start == 0));
    done = stop;
    if (i < stop) i = stop;
  }
  if (done < n) TRY(bpe_pieces_add(out, s + done, n - done, -1, first && done == 0));
  return FSDP_OK;
}

/* ---- the pipeline ---- */

static fsdp_status encode_pieces(bpe_state *st, const bpe_pieces *l, bpe_ids *out) {
  for (size_t i = 0; i < l->n; i++) {
    const bpe_piece *p = &l->v[i];
    if (p->id >= 0) TRY(bpe_ids_push(out, (uint32_t)p->id));
    else TRY(bpe_model_tokenize(&st->t->model, st, l->text.p + p->off, p->len, out));
  }
  return FSDP_OK;
}

fsdp_status bpe_encode(bpe_state *st, const char *text, size_t len, int add_special, bpe_ids *out) {
  const bpe_tokenizer *t = st->t;
  size_t bad = bpe_utf8_invalid_at(text, len);
  if (bad < len) return fsdp_set_error(FSDP_ERR_INVALID, "the text is not UTF-8 (byte %zu)", bad);
  if (add_special)
    for (size_t k = 0; k < t->post.nbefore; k++) TRY(bpe_ids_push(out, t->post.before[k]));
  bpe_pieces_clear(&st->pa), bpe_pieces_clear(&st->pb), bpe_pieces_clear(&st->pc);
  TRY(split_added(t, 0, text, len, 1, &st->pb));
  for (size_t i = 0; i < st->pb.n; i++) {
    const bpe_piece *p = &st->pb.v[i];
    const char *s = st->pb.text.p + p->off;
    if (p->id >= 0) {
      TRY(bpe_pieces_add(&st->pc, s, p->len, p->id, p->first));
      continue;
    }
    if (t->norm) {
      st->nb.n = 0;
      TRY(bpe_str_put(&st->nb, "", 0));
      TRY(bpe_norm_apply(t->norm, st, s, p->len, &st->nb));
      s = st->nb.p;
      TRY(split_added(t, 1, s, st->nb.n, p->first, &st->pc));
    } else {
      TRY(split_added(t, 1, s, p->len, p->first, &st->pc));
    }
  }
  if (t->pre) {
    TRY(bpe_pre_apply(t->pre, st, &st->pc, &st->pa));
    TRY(encode_pieces(st, &st->pa, out));
  } else {
    TRY(encode_pieces(st, &st->pc, out));
  }
  if (add_special)
    for (size_t k = 0; k < t->post.nafter; k++) TRY(bpe_ids_push(out, t->post.after[k]));
  return FSDP_OK;
}
