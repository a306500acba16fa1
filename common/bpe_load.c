/* bpe_load — a tokenizer.json (through jansson) into a bpe_tokenizer (see bpe.h). Every
 * component is checked against what bpe_*.c implements; the first that is not is refused in one
 * line naming it and what is supported.
 */
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "bpe_priv.h"
#include "fsutil.h"

#define BPE_MAX_FILE ((size_t)1 << 30)   /* a tokenizer.json is megabytes */

#define BAD(...) fsdp_set_error(FSDP_ERR_UNSUPPORTED, __VA_ARGS__)

static int jbool(const json_t *o, const char *k, int dflt) {
  const json_t *v = json_object_get(o, k);
  return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *jstr(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

static const char *jtype(const json_t *o) {
  const char *t = jstr(o, "type");
  return t ? t : "(no type)";
}

/* A {"String": s} or {"Regex": r} pattern. */
static fsdp_status load_pattern(const char *name, const char *where, const json_t *o, bpe_pattern *p) {
  const char *lit = jstr(o, "String"), *re = jstr(o, "Regex");
  char w[256];
  snprintf(w, sizeof w, "%s: %s", name, where);
  if (!lit && !re) return fsdp_set_error(FSDP_ERR_FORMAT, "%s has no String or Regex pattern", w);
  return bpe_pattern_compile(p, lit, lit ? NULL : re, w);
}

static fsdp_status dup_str(const char *s, char **out, size_t *n) {
  *n = strlen(s);
  if (!(*out = strdup(s))) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  return FSDP_OK;
}

/* Children of a Sequence: KIDS (an array) through LOAD into *OUT[*N]. */
#define LOAD_KIDS(type, load, name, arr, out, n)                                     \
  do {                                                                               \
    size_t i_;                                                                       \
    json_t *k_;                                                                      \
    *(out) = calloc(json_array_size(arr) + 1, sizeof **(out));                       \
    if (!*(out)) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");            \
    json_array_foreach(arr, i_, k_) {                                                \
      (*(n))++;   /* before loading: a child that fails is freed with its parent */  \
      TRY(load(name, k_, &(*(out))[i_]));                                            \
    }                                                                                \
  } while (0)

static fsdp_status load_norm(const char *name, const json_t *o, bpe_norm **out) {
  const char *t = jtype(o);
  bpe_norm *nm = *out = calloc(1, sizeof *nm);
  if (!nm) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  int uopt = UTF8PROC_STABLE;
  if (!strcmp(t, "NFC")) nm->uoptions = uopt | UTF8PROC_COMPOSE;
  else if (!strcmp(t, "NFD")) nm->uoptions = uopt | UTF8PROC_DECOMPOSE;
  else if (!strcmp(t, "NFKC")) nm->uoptions = uopt | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  else if (!strcmp(t, "NFKD")) nm->uoptions = uopt | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  if (nm->uoptions) return nm->kind = BPE_NORM_UNICODE, FSDP_OK;
  if (!strcmp(t, "Prepend") && jstr(o, "prepend")) {
    nm->kind = BPE_NORM_PREPEND;
    return dup_str(jstr(o, "prepend"), &nm->text, &nm->text_n);
  }
  if (!strcmp(t, "Replace") && jstr(o, "content")) {
    nm->kind = BPE_NORM_REPLACE;
    TRY(dup_str(jstr(o, "content"), &nm->text, &nm->text_n));
    return load_pattern(name, "normalizer Replace", json_object_get(o, "pattern"), &nm->pat);
  }
  const json_t *kids = json_object_get(o, "normalizers");
  if (!strcmp(t, "Sequence") && json_is_array(kids)) {
    nm->kind = BPE_NORM_SEQ;
    LOAD_KIDS(bpe_norm, load_norm, name, kids, &nm->kids, &nm->nkids);
    return FSDP_OK;
  }
  return BAD("%s: normalizer %s is not supported (fsdpd implements NFC, NFD, NFKC, NFKD, Prepend, Replace, "
             "Sequence)", name, t);
}

static fsdp_status load_scheme(const char *name, const json_t *o, bpe_prepend_scheme *s) {
  const char *p = jstr(o, "prepend_scheme");
  if (!p) *s = jbool(o, "add_prefix_space", 1) ? BPE_PREPEND_ALWAYS : BPE_PREPEND_NEVER;
  else if (!strcmp(p, "always")) *s = BPE_PREPEND_ALWAYS;
  else if (!strcmp(p, "first")) *s = BPE_PREPEND_FIRST;
  else if (!strcmp(p, "never")) *s = BPE_PREPEND_NEVER;
  else return fsdp_set_error(FSDP_ERR_FORMAT, "%s: Metaspace prepend_scheme \"%s\" is not always, first or never", name, p);
  return FSDP_OK;
}

/* The single character of Metaspace's replacement or Strip's content. */
static fsdp_status one_char(const char *name, const char *what, const char *s, int32_t *cp) {
  size_t k = 0;
  if (!s || !*s || (*cp = bpe_utf8_next(s, strlen(s), &k), s[k]) || bpe_utf8_invalid_at(s, strlen(s)) != strlen(s))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: %s must be one character", name, what);
  return FSDP_OK;
}

static fsdp_status load_split(const char *name, const json_t *o, bpe_pre *p) {
  static const char *const beh[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
  const char *b = jstr(o, "behavior");
  p->kind = BPE_PRE_SPLIT;
  p->invert = jbool(o, "invert", 0);
  for (int k = 0; b && k < 5; k++)
    if (!strcmp(b, beh[k])) p->behavior = (bpe_split_behavior)k, b = NULL;
  if (b || !jstr(o, "behavior"))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: Split behavior \"%s\" is not one of Removed, Isolated, "
                          "MergedWithPrevious, MergedWithNext, Contiguous", name, b ? b : "");
  return load_pattern(name, "pre_tokenizer Split", json_object_get(o, "pattern"), &p->pat);
}

static fsdp_status load_pre(const char *name, const json_t *o, bpe_pre **out) {
  const char *t = jtype(o);
  bpe_pre *p = *out = calloc(1, sizeof *p);
  if (!p) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  if (!strcmp(t, "ByteLevel")) {
    p->kind = BPE_PRE_BYTELEVEL;
    p->add_prefix_space = jbool(o, "add_prefix_space", 1);
    p->use_regex = jbool(o, "use_regex", 1);
    return p->use_regex ? bpe_pattern_compile(&p->pat, NULL, BPE_GPT2_REGEX, "pre_tokenizer ByteLevel") : FSDP_OK;
  }
  if (!strcmp(t, "Split")) return load_split(name, o, p);
  if (!strcmp(t, "Metaspace")) {
    int32_t cp;
    p->kind = BPE_PRE_METASPACE;
    p->split = jbool(o, "split", 1);
    TRY(one_char(name, "Metaspace replacement", jstr(o, "replacement"), &cp));
    p->rep_n = bpe_utf8_put(cp, p->rep);
    return load_scheme(name, o, &p->prepend);
  }
  const json_t *kids = json_object_get(o, "pretokenizers");
  if (!strcmp(t, "Sequence") && json_is_array(kids)) {
    p->kind = BPE_PRE_SEQ;
    LOAD_KIDS(bpe_pre, load_pre, name, kids, &p->kids, &p->nkids);
    return FSDP_OK;
  }
  return BAD("%s: pre_tokenizer %s is not supported (fsdpd implements ByteLevel, Split, Metaspace, Sequence)",
             name, t);
}

static fsdp_status load_dec(const char *name, const json_t *o, bpe_dec **out) {
  const char *t = jtype(o);
  bpe_dec *d = *out = calloc(1, sizeof *d);
  if (!d) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  if (!strcmp(t, "ByteLevel")) return d->kind = BPE_DEC_BYTELEVEL, FSDP_OK;
  if (!strcmp(t, "ByteFallback")) return d->kind = BPE_DEC_BYTEFALLBACK, FSDP_OK;
  if (!strcmp(t, "Fuse")) return d->kind = BPE_DEC_FUSE, FSDP_OK;
  if (!strcmp(t, "Strip")) {
    d->kind = BPE_DEC_STRIP;
    d->strip_start = (int)json_integer_value(json_object_get(o, "start"));
    d->strip_stop = (int)json_integer_value(json_object_get(o, "stop"));
    return one_char(name, "Strip content", jstr(o, "content"), &d->strip_char);
  }
  if (!strcmp(t, "Replace") && jstr(o, "content")) {
    d->kind = BPE_DEC_REPLACE;
    TRY(dup_str(jstr(o, "content"), &d->text, &d->text_n));
    return load_pattern(name, "decoder Replace", json_object_get(o, "pattern"), &d->pat);
  }
  if (!strcmp(t, "Metaspace")) {
    d->kind = BPE_DEC_METASPACE;
    TRY(one_char(name, "Metaspace replacement", jstr(o, "replacement"), &d->rep_cp));
    return load_scheme(name, o, &d->prepend);
  }
  const json_t *kids = json_object_get(o, "decoders");
  if (!strcmp(t, "Sequence") && json_is_array(kids)) {
    d->kind = BPE_DEC_SEQ;
    LOAD_KIDS(bpe_dec, load_dec, name, kids, &d->kids, &d->nkids);
    return FSDP_OK;
  }
  return BAD("%s: decoder %s is not supported (fsdpd implements ByteLevel, ByteFallback, Fuse, Strip, Replace, "
             "Metaspace, Sequence)", name, t);
}

/* TemplateProcessing's single-sequence template: the special tokens' ids before and after $A. */
static fsdp_status load_template(const char *name, const json_t *o, bpe_post *post) {
  const json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens"), *item;
  size_t i, seen_a = 0;
  if (post->before || post->after)
    return BAD("%s: more than one TemplateProcessing post_processor is not supported", name);
  post->before = calloc(64, sizeof *post->before);
  post->after = calloc(64, sizeof *post->after);
  if (!post->before || !post->after) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  json_array_foreach(single, i, item) {
    const json_t *sp = json_object_get(item, "SpecialToken"), *seq = json_object_get(item, "Sequence"), *id;
    if (seq) {
      if (strcmp(jstr(seq, "id") ? jstr(seq, "id") : "", "A") || seen_a++)
        return BAD("%s: a TemplateProcessing single template other than one $A is not supported", name);
      continue;
    }
    const json_t *ids = json_object_get(json_object_get(specials, jstr(sp, "id") ? jstr(sp, "id") : ""), "ids");
    size_t k;
    if (!json_is_array(ids))
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: TemplateProcessing names special token \"%s\" without its ids",
                            name, jstr(sp, "id") ? jstr(sp, "id") : "");
    json_array_foreach(ids, k, id) {
      uint32_t **v = seen_a ? &post->after : &post->before;
      size_t *n = seen_a ? &post->nafter : &post->nbefore;
      if (*n == 64) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: TemplateProcessing adds over 64 tokens", name);
      (*v)[(*n)++] = (uint32_t)json_integer_value(id);
    }
  }
  if (!seen_a) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: TemplateProcessing's single template has no $A", name);
  return FSDP_OK;
}

static fsdp_status load_post(const char *name, const json_t *o, bpe_post *post) {
  const char *t = jtype(o);
  if (!strcmp(t, "ByteLevel")) return FSDP_OK;   /* offsets only: the ids are unchanged */
  if (!strcmp(t, "TemplateProcessing")) return load_template(name, o, post);
  const json_t *kids = json_object_get(o, "processors"), *k;
  size_t i;
  if (!strcmp(t, "Sequence") && json_is_array(kids)) {
    json_array_foreach(kids, i, k) TRY(load_post(name, k, post));
    return FSDP_OK;
  }
  return BAD("%s: post_processor %s is not supported (fsdpd implements ByteLevel, TemplateProcessing, Sequence)",
             name, t);
}

/* ---- the BPE model ---- */

static fsdp_status load_vocab(const char *name, const json_t *vocab, bpe_model *m) {
  const char *k;
  const json_t *v;
  json_int_t max = -1;
  if (!json_is_object(vocab)) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: the BPE model has no vocab", name);
  json_object_foreach((json_t *)vocab, k, v) {
    json_int_t id = json_integer_value(v);
    if (!json_is_integer(v) || id < 0 || id >= (json_int_t)1 << 31)
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: vocab entry \"%s\" has no valid id", name, k);
    TRY(bpe_smap_put(&m->vocab, k, strlen(k), id));
    if (id > max) max = id;
  }
  m->ntok = (size_t)(max + 1);
  if (!(m->tok = calloc(m->ntok + 1, sizeof *m->tok))) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  json_object_foreach((json_t *)vocab, k, v) {
    size_t id = (size_t)json_integer_value(v);
    free(m->tok[id]);
    if (!(m->tok[id] = strdup(k))) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  }
  return FSDP_OK;
}

/* Merge I: "a b" or ["a", "b"], its parts' ids and the id of their concatenation (b without the
 * continuing-subword prefix). */
static fsdp_status load_merge(const char *name, bpe_model *m, size_t i, const json_t *e, bpe_str *buf) {
  const char *a, *b, *s = json_string_value(e);
  size_t an, bn;
  if (s) {
    const char *sp = strchr(s, ' ');
    if (!sp || strchr(sp + 1, ' '))
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: merge %zu \"%s\" is not two tokens separated by a space", name, i, s);
    a = s, an = (size_t)(sp - s), b = sp + 1, bn = strlen(b);
  } else if (json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
    a = json_string_value(json_array_get(e, 0)), an = strlen(a);
    b = json_string_value(json_array_get(e, 1)), bn = strlen(b);
  } else {
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", name, i);
  }
  int64_t ia = bpe_smap_get(&m->vocab, a, an), ib = bpe_smap_get(&m->vocab, b, bn);
  if (ia < 0 || ib < 0)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: merge %zu names a token that is not in the vocab", name, i);
  size_t skip = m->prefix ? strlen(m->prefix) : 0;
  if (skip > bn) skip = bn;
  buf->n = 0;
  TRY(bpe_str_put(buf, a, an));
  TRY(bpe_str_put(buf, b + skip, bn - skip));
  int64_t id = bpe_smap_get(&m->vocab, buf->p, buf->n);
  if (id < 0)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: merge %zu makes \"%s\", which is not in the vocab", name, i, buf->p);
  return bpe_model_add_merge(m, (uint32_t)ia, (uint32_t)ib, (uint32_t)i, (uint32_t)id);
}

static fsdp_status opt_str(const json_t *o, const char *k, char **out) {
  const char *s = jstr(o, k);
  if (s && !(*out = strdup(s))) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  return FSDP_OK;
}

static fsdp_status load_model(const char *name, const json_t *o, bpe_model *m) {
  memset(m->byte_id, 0xff, sizeof m->byte_id);
  m->unk_id = -1;
  if (!json_is_object(o)) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: no model", name);
  const char *t = jtype(o);
  const json_t *d = json_object_get(o, "dropout"), *merges = json_object_get(o, "merges"), *e;
  if (strcmp(t, "BPE") && !(json_object_get(o, "merges") && !jstr(o, "type")))
    return BAD("%s: model %s is not supported (fsdpd implements BPE)", name, t);
  if (d && !json_is_null(d) && json_number_value(d) != 0)
    return BAD("%s: BPE dropout is not supported (set it to null)", name);
  TRY(load_vocab(name, json_object_get(o, "vocab"), m));
  TRY(opt_str(o, "continuing_subword_prefix", &m->prefix));
  TRY(opt_str(o, "end_of_word_suffix", &m->suffix));
  const char *unk = jstr(o, "unk_token");
  if (unk) m->unk_id = bpe_smap_get(&m->vocab, unk, strlen(unk));
  m->fuse_unk = jbool(o, "fuse_unk", 0);
  m->byte_fallback = jbool(o, "byte_fallback", 0);
  m->ignore_merges = jbool(o, "ignore_merges", 0);
  for (int b = 0; b < 256; b++) {
    char tok[8];
    snprintf(tok, sizeof tok, "<0x%02X>", b);
    m->byte_id[b] = bpe_smap_get(&m->vocab, tok, strlen(tok));
  }
  if (!json_is_array(merges)) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: the BPE model has no merges", name);
  bpe_str buf = {0};
  fsdp_status rc = FSDP_OK;
  size_t i;
  json_array_foreach(merges, i, e) {
    if ((rc = load_merge(name, m, i, e, &buf)) != FSDP_OK) break;
  }
  free(buf.p);
  return rc;
}

static fsdp_status load_added(const char *name, bpe_tokenizer *t, const json_t *arr) {
  size_t i;
  const json_t *a;
  t->added = calloc(json_array_size(arr) + 1, sizeof *t->added);
  if (!t->added) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  json_array_foreach(arr, i, a) {
    bpe_added *d = &t->added[t->nadded];
    const char *c = jstr(a, "content");
    json_int_t id = json_integer_value(json_object_get(a, "id"));
    if (!c || !*c || !json_is_integer(json_object_get(a, "id")) || id < 0 || id > UINT32_MAX - 1)
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: added_tokens[%zu] needs a content and an id", name, i);
    TRY(dup_str(c, &d->content, &d->len));
    d->id = (uint32_t)id;
    d->special = jbool(a, "special", 0);
    d->normalized = jbool(a, "normalized", !d->special);
    d->lstrip = jbool(a, "lstrip", 0), d->rstrip = jbool(a, "rstrip", 0);
    d->single_word = jbool(a, "single_word", 0);
    TRY(bpe_smap_put(&t->added_ids, (const char *)&d->id, sizeof d->id, (int64_t)t->nadded));
    t->nadded++;
    if ((int64_t)id >= t->vocab_size) t->vocab_size = id + 1;
  }
  return FSDP_OK;
}

/* Normalized added tokens are searched for in normalized text: their normalized spelling. */
static fsdp_status normalize_added(bpe_tokenizer *t) {
  if (!t->norm) return FSDP_OK;
  bpe_state *st;
  bpe_str s = {0};
  fsdp_status rc = bpe_state_new(t, &st);
  for (size_t i = 0; i < t->nadded && rc == FSDP_OK; i++) {
    bpe_added *a = &t->added[i];
    if (!a->normalized) continue;
    s.n = 0;
    if ((rc = bpe_str_put(&s, "", 0)) || (rc = bpe_norm_apply(t->norm, st, a->content, a->len, &s))) break;
    if (s.n && (s.n != a->len || memcmp(s.p, a->content, s.n))) {
      if (!(a->norm = strdup(s.p))) rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
      a->norm_len = s.n;
    }
  }
  free(s.p);
  bpe_state_destroy(&st);
  return rc;
}

static fsdp_status load_parts(bpe_tokenizer *t, const json_t *root) {
  const char *name = t->name;
  const json_t *v;
  if ((v = json_object_get(root, "truncation")) && !json_is_null(v))
    return BAD("%s: truncation is not supported (set it to null)", name);
  if ((v = json_object_get(root, "padding")) && !json_is_null(v))
    return BAD("%s: padding is not supported (set it to null)", name);
  TRY(load_model(name, json_object_get(root, "model"), &t->model));
  t->vocab_size = (int64_t)t->model.ntok;
  if ((v = json_object_get(root, "normalizer")) && !json_is_null(v)) TRY(load_norm(name, v, &t->norm));
  if ((v = json_object_get(root, "pre_tokenizer")) && !json_is_null(v)) TRY(load_pre(name, v, &t->pre));
  if ((v = json_object_get(root, "post_processor")) && !json_is_null(v)) TRY(load_post(name, v, &t->post));
  if ((v = json_object_get(root, "decoder")) && !json_is_null(v)) TRY(load_dec(name, v, &t->dec));
  if ((v = json_object_get(root, "added_tokens")) && json_is_array(v)) TRY(load_added(name, t, v));
  TRY(normalize_added(t));
  for (size_t k = 0; k < t->nadded; k++) {
    const bpe_added *a = &t->added[k];
    t->starts[a->normalized][(unsigned char)(a->norm ? a->norm[0] : a->content[0])] = 1;
  }
  for (size_t k = 0; k < t->post.nbefore + t->post.nafter; k++) {
    uint32_t id = k < t->post.nbefore ? t->post.before[k] : t->post.after[k - t->post.nbefore];
    if ((int64_t)id >= t->vocab_size)
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s: TemplateProcessing adds id %u, outside the vocabulary", name, id);
  }
  return FSDP_OK;
}

/* The special token documents end with: NAME (tokenizer_config.json's eos_token) or a known one. */
static int64_t find_eos(const bpe_tokenizer *t, const char *name) {
  static const char *const known[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>"};
  for (size_t k = 0; k < t->nadded; k++)
    if (name && t->added[k].special && !strcmp(t->added[k].content, name)) return t->added[k].id;
  for (size_t j = 0; j < sizeof known / sizeof *known; j++)
    for (size_t k = 0; k < t->nadded; k++)
      if (t->added[k].special && !strcmp(t->added[k].content, known[j])) return t->added[k].id;
  return -1;
}

fsdp_status bpe_load_json(const char *json, size_t len, const char *name, bpe_tokenizer **out) {
  *out = NULL;
  json_error_t je;
  json_t *root = json_loadb(json, len, 0, &je);
  if (!root) return fsdp_set_error(FSDP_ERR_FORMAT, "%s: not JSON (line %d: %s)", name, je.line, je.text);
  bpe_tokenizer *t = calloc(1, sizeof *t);
  fsdp_status rc = t && (t->name = strdup(name)) ? FSDP_OK : fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  if (rc == FSDP_OK) rc = load_parts(t, root);
  json_decref(root);
  if (rc != FSDP_OK) {
    bpe_destroy(&t);
    return rc;
  }
  t->eos = find_eos(t, NULL);
  *out = t;
  return FSDP_OK;
}

fsdp_status bpe_load(const char *path, bpe_tokenizer **out) {
  *out = NULL;
  struct stat sb;
  char file[4096], dir[4096], *buf = NULL;
  size_t len = 0;
  if (stat(path, &sb)) return fsdp_set_error(FSDP_ERR_NOTFOUND, "tokenizer %s: %m", path);
  int isdir = S_ISDIR(sb.st_mode);
  snprintf(file, sizeof file, isdir ? "%s/tokenizer.json" : "%s", path);
  snprintf(dir, sizeof dir, "%s", isdir ? path : file);
  if (!isdir) {
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
  }
  TRY(fsutil_read_all(AT_FDCWD, file, BPE_MAX_FILE, &buf, &len));   /* no one else's link followed */
  fsdp_status rc = bpe_load_json(buf, len, file, out);
  free(buf);
  if (rc != FSDP_OK) return rc;
  /* the model folder's tokenizer_config.json names the end-of-text token */
  char cfg[4200];
  snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
  json_t *c = NULL;
  if (fsutil_read_all(AT_FDCWD, cfg, BPE_MAX_FILE, &buf, &len) == FSDP_OK) c = json_loadb(buf, len, 0, NULL);
  free(buf);
  const json_t *eos = json_object_get(c, "eos_token");
  const char *e = json_is_string(eos) ? json_string_value(eos) : jstr(eos, "content");
  (*out)->eos = find_eos(*out, e);
  json_decref(c);
  return FSDP_OK;
}

void bpe_destroy(bpe_tokenizer **p) {
  bpe_tokenizer *t = *p;
  if (!t) return;
  bpe_model_free(&t->model);
  bpe_norm_free(t->norm);
  bpe_pre_free(t->pre);
  bpe_dec_free(t->dec);
  free(t->post.before), free(t->post.after);
  for (size_t i = 0; i < t->nadded; i++) free(t->added[i].content), free(t->added[i].norm);
  free(t->added);
  bpe_smap_free(&t->added_ids);
  free(t->name);
  free(t);
  *p = NULL;
}
