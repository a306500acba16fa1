/* jinja_lex — the template's text split into tokens as jinja2's lexer splits it with
 * transformers' settings: newlines normalized and one trailing newline dropped (splitlines, as
 * jinja2 reads a source), `{%- -%}` stripping, trim_blocks (the newline after a block or comment
 * tag) and lstrip_blocks (the indentation before one, unless `{%+`), and tag ends inside open
 * brackets skipped. Called by jinja_load() only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_priv.h"

typedef struct lexer {
  ja_arena *a;
  const char *name;
  const char *s;
  size_t n, pos;
  int line;
  jtok *v;
  size_t nv, cap;
} lexer;

static fsdp_status lex_fail(const lexer *L, const char *what) {
  return fsdp_set_error(FSDP_ERR_INVALID, "%s: template line %d: %s", L->name, L->line, what);
}

static fsdp_status emit(lexer *L, jtok t) {
  if (L->nv == L->cap) {
    size_t cap = L->cap ? 2 * L->cap : 256;
    jtok *v = ja_alloc(L->a, cap * sizeof *v);
    if (!v) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory lexing a template");
    if (L->nv) memcpy(v, L->v, L->nv * sizeof *v);
    L->v = v;
    L->cap = cap;
  }
  if (t.line == 0) t.line = L->line;
  L->v[L->nv++] = t;
  return FSDP_OK;
}

/* The length of the line break at S (0 if none): what Python's str.splitlines splits on. */
static size_t newline_at(const char *s, size_t n) {
  unsigned char c = (unsigned char)s[0];
  if (c == '\r') return n > 1 && s[1] == '\n' ? 2 : 1;
  if (c == '\n' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e) return 1;
  if (c == 0xc2 && n > 1 && (unsigned char)s[1] == 0x85) return 2;
  if (c == 0xe2 && n > 2 && (unsigned char)s[1] == 0x80 && ((unsigned char)s[2] == 0xa8 || (unsigned char)s[2] == 0xa9))
    return 3;
  return 0;
}

/* "\n".join(src.splitlines()): every line break becomes "\n", one at the very end is dropped. */
static char *normalize(ja_arena *a, const char *src, size_t len, size_t *outlen) {
  char *d = ja_alloc(a, len + 1);
  if (!d) return NULL;
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    size_t k = newline_at(src + i, len - i);
    if (k) {
      d[o++] = '\n';
      i += k;
    } else d[o++] = src[i++];
  }
  if (o && d[o - 1] == '\n') o--;
  d[o] = 0;
  *outlen = o;
  return d;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static fsdp_status emit_text(lexer *L, const char *p, size_t n, int line) {
  if (!n) return FSDP_OK;
  char *s = ja_strndup(L->a, p, n);
  if (!s) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory lexing a template");
  return emit(L, (jtok){.kind = JT_TEXT, .s = s, .n = n, .line = line});
}

static void count_lines(lexer *L, size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    if (L->s[i] == '\n') L->line++;
}

/* Python's unicode-escape decoding of a string literal's body. */
static fsdp_status lex_string(lexer *L) {
  char q = L->s[L->pos];
  size_t i = L->pos + 1;
  jbuf b = {0};
  int line = L->line;
  while (i < L->n && L->s[i] != q) {
    char c = L->s[i];
    if (c == '\n') L->line++;
    if (c != '\\' || i + 1 >= L->n) {
      jb_putc(&b, c);
      i++;
      continue;
    }
    char e = L->s[i + 1];
    i += 2;
    const char *simple = strchr("nrtabfv\\'\"", e);
    if (e && simple) {
      static const char out[] = "\n\r\t\a\b\f\v\\'\"";
      jb_putc(&b, out[simple - "nrtabfv\\'\""]);
    } else if (e == '\n') {
      L->line++;
    } else if (e == 'x' || e == 'u' || e == 'U') {
      int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
      uint32_t cp = 0;
      for (int k = 0; k < nd; k++, i++) {
        char h = i < L->n ? L->s[i] : 0;
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) {
          free(b.p);
          return lex_fail(L, "a \\x, \\u or \\U escape in a string needs its hex digits");
        }
        cp = cp * 16 + (uint32_t)d;
      }
      if (cp > 0x10ffff) {
        free(b.p);
        return lex_fail(L, "a \\U escape beyond U+10FFFF");
      }
      ju_put(&b, cp);
    } else if (e >= '0' && e <= '7') {
      uint32_t cp = (uint32_t)(e - '0');
      for (int k = 0; k < 2 && i < L->n && L->s[i] >= '0' && L->s[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(L->s[i++] - '0');
      ju_put(&b, cp);
    } else {
      jb_putc(&b, '\\');   /* Python keeps an unknown escape as written */
      jb_putc(&b, e);
    }
  }
  if (i >= L->n) {
    free(b.p);
    L->line = line;
    return lex_fail(L, "a string that never ends");
  }
  L->pos = i + 1;
  if (b.failed) {
    free(b.p);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory lexing a template");
  }
  char *s = ja_strndup(L->a, b.p ? b.p : "", b.n);
  size_t n = b.n;
  free(b.p);
  if (!s) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory lexing a template");
  return emit(L, (jtok){.kind = JT_STRING, .s = s, .n = n, .line = line});
}

static fsdp_status lex_number(lexer *L) {
  size_t i = L->pos, st = i;
  int isfloat = 0;
  while (i < L->n && ((L->s[i] >= '0' && L->s[i] <= '9') || L->s[i] == '_')) i++;
  if (i + 1 < L->n && L->s[i] == '.' && L->s[i + 1] >= '0' && L->s[i + 1] <= '9' && !(st > 0 && L->s[st - 1] == '.')) {
    isfloat = 1;
    i++;
    while (i < L->n && ((L->s[i] >= '0' && L->s[i] <= '9') || L->s[i] == '_')) i++;
  }
  if (i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
    size_t j = i + 1;
    if (j < L->n && (L->s[j] == '+' || L->s[j] == '-')) j++;
    if (j < L->n && L->s[j] >= '0' && L->s[j] <= '9') {
      isfloat = 1;
      i = j;
      while (i < L->n && L->s[i] >= '0' && L->s[i] <= '9') i++;
    }
  }
  char buf[64];
  size_t o = 0;
  for (size_t k = st; k < i && o < sizeof buf - 1; k++)
    if (L->s[k] != '_') buf[o++] = L->s[k];
  buf[o] = 0;
  L->pos = i;
  jtok t = {.kind = isfloat ? JT_FLOAT : JT_INT};
  if (isfloat) t.f = strtod(buf, NULL);
  else {
    errno = 0;
    t.i = strtoll(buf, NULL, 10);
    if (errno) return lex_fail(L, "an integer literal beyond 64 bits");
  }
  return emit(L, t);
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char ops1[] = "+-/*%~[](){}<>=.:|,;";

/* The tokens of one tag up to its end (}} or %}); returns the whitespace control of the end. */
static fsdp_status lex_tag(lexer *L, int block, int begin_line) {
  const char *end = block ? "%}" : "}}";
  int depth = 0;
  for (;;) {
    while (L->pos < L->n && is_ws(L->s[L->pos])) {
      if (L->s[L->pos] == '\n') L->line++;
      L->pos++;
    }
    if (L->pos >= L->n) {
      L->line = begin_line;
      return lex_fail(L, block ? "a {% tag that never ends" : "a {{ expression that never ends");
    }
    const char *p = L->s + L->pos;
    size_t left = L->n - L->pos;
    if (depth == 0) {
      char sign = (*p == '-' || (block && *p == '+')) ? *p : 0;
      if (left >= 2u + (sign != 0) && !memcmp(p + (sign != 0), end, 2)) {
        L->pos += 2 + (sign != 0);
        TRY(emit(L, (jtok){.kind = block ? JT_BLOCK_END : JT_VAR_END}));
        if (sign == '-') {
          while (L->pos < L->n && is_ws(L->s[L->pos])) {
            if (L->s[L->pos] == '\n') L->line++;
            L->pos++;
          }
        } else if (block && !sign && L->pos < L->n && L->s[L->pos] == '\n') {
          L->pos++;   /* trim_blocks */
          L->line++;
        }
        return FSDP_OK;
      }
    }
    char c = *p;
    if (c == '\'' || c == '"') {
      TRY(lex_string(L));
    } else if (c >= '0' && c <= '9') {
      TRY(lex_number(L));
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
      size_t i = L->pos;
      while (i < L->n && ((L->s[i] >= 'a' && L->s[i] <= 'z') || (L->s[i] >= 'A' && L->s[i] <= 'Z') ||
                          (L->s[i] >= '0' && L->s[i] <= '9') || L->s[i] == '_'))
        i++;
      char *s = ja_strndup(L->a, p, i - L->pos);
      if (!s) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory lexing a template");
      TRY(emit(L, (jtok){.kind = JT_NAME, .s = s, .n = i - L->pos}));
      L->pos = i;
    } else {
      size_t k = 0;
      for (size_t o = 0; o < sizeof ops2 / sizeof *ops2; o++)
        if (left >= 2 && !memcmp(p, ops2[o], 2)) k = 2;
      if (!k && c && strchr(ops1, c)) k = 1;
      if (!k) {
        char what[64];
        snprintf(what, sizeof what, "unexpected character '%c' in a tag", c);
        return lex_fail(L, what);
      }
      if (k == 1 && (c == '(' || c == '[' || c == '{')) depth++;
      if (k == 1 && (c == ')' || c == ']' || c == '}') && depth > 0) depth--;
      char *s = ja_strndup(L->a, p, k);
      if (!s) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory lexing a template");
      TRY(emit(L, (jtok){.kind = JT_OP, .s = s, .n = k}));
      L->pos += k;
    }
  }
}

/* A {# comment #}: skipped, with the same whitespace control as a block tag. */
static fsdp_status lex_comment(lexer *L) {
  const char *e = NULL;
  for (size_t i = L->pos; i + 1 < L->n; i++)
    if (L->s[i] == '#' && L->s[i + 1] == '}') {
      e = L->s + i;
      break;
    }
  if (!e) return lex_fail(L, "a {# comment that never ends");
  size_t at = (size_t)(e - L->s);
  char sign = at > L->pos && (e[-1] == '-' || e[-1] == '+') ? e[-1] : 0;
  count_lines(L, L->pos, at);
  L->pos = at + 2;
  if (sign == '-') {
    while (L->pos < L->n && is_ws(L->s[L->pos])) {
      if (L->s[L->pos] == '\n') L->line++;
      L->pos++;
    }
  } else if (!sign && L->pos < L->n && L->s[L->pos] == '\n') {
    L->pos++;
    L->line++;
  }
  return FSDP_OK;
}

fsdp_status jlex(ja_arena *a, const char *name, const char *src, size_t len, jtok **toks, size_t *ntoks) {
  lexer L = {.a = a, .name = name, .line = 1};
  L.s = normalize(a, src, len, &L.n);
  if (!L.s) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory lexing a template");
  int line_starting = 1;
  while (L.pos < L.n) {
    size_t q = L.pos;
    while (q + 1 < L.n && !(L.s[q] == '{' && (L.s[q + 1] == '{' || L.s[q + 1] == '%' || L.s[q + 1] == '#'))) q++;
    if (q + 1 >= L.n) q = L.n;
    const char *text = L.s + L.pos;
    size_t tn = q - L.pos;
    int text_line = L.line;
    if (q < L.n) {
      char kind = L.s[q + 1];
      /* '-' strips before any tag; '+' keeps the indentation of a block or comment ("{{+" is a plus) */
      char sign = q + 2 < L.n && (L.s[q + 2] == '-' || (L.s[q + 2] == '+' && kind != '{')) ? L.s[q + 2] : 0;
      if (sign == '-') {
        while (tn && is_ws(text[tn - 1])) tn--;
      } else if (sign != '+' && kind != '{') {   /* lstrip_blocks */
        size_t l = tn;
        while (l && text[l - 1] != '\n') l--;
        if (l > 0 || line_starting) {
          size_t k = l;
          while (k < tn && is_ws(text[k])) k++;
          if (k == tn) tn = l;
        }
      }
      TRY(emit_text(&L, text, tn, text_line));
      count_lines(&L, L.pos, q);
      L.pos = q + 2 + (sign != 0);
      size_t before = L.pos;
      if (kind == '#') {
        TRY(lex_comment(&L));
      } else {
        TRY(emit(&L, (jtok){.kind = kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN}));
        TRY(lex_tag(&L, kind == '%', L.line));
      }
      line_starting = L.pos > before && L.s[L.pos - 1] == '\n';
    } else {
      TRY(emit_text(&L, text, tn, text_line));
      count_lines(&L, L.pos, q);
      L.pos = q;
    }
  }
  TRY(emit(&L, (jtok){.kind = JT_EOF}));
  *toks = L.v;
  *ntoks = L.nv;
  return FSDP_OK;
}
