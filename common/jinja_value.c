/* jinja_value — the evaluator's values as Python sees them: truth, equality and order, str() and
 * repr(), json.dumps (transformers' tojson), JSON in; the render's arena and growing buffer; UTF-8
 * helpers (Python counts and slices code points). Any thread; nothing shared. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_priv.h"

struct ja_block {
  ja_block *next;
  size_t used, cap;
  max_align_t data[];
};

void *ja_alloc(ja_arena *a, size_t n) {
  n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  if (!n) n = sizeof(max_align_t);
  ja_block *b = a->head;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > 60000 ? n : 60000;
    if (a->limit && a->total + cap > a->limit) {
      a->failed = 2;
      return NULL;
    }
    b = malloc(sizeof *b + cap);
    if (!b) {
      a->failed = 1;
      return NULL;
    }
    b->cap = cap;
    b->used = 0;
    a->total += cap;
    b->next = a->head;
    a->head = b;
  }
  void *p = (char *)b->data + b->used;
  b->used += n;
  memset(p, 0, n);
  return p;
}

char *ja_strndup(ja_arena *a, const char *s, size_t n) {
  char *d = ja_alloc(a, n + 1);
  if (d) {
    if (n) memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

void ja_free(ja_arena *a) {
  for (ja_block *b = a->head, *nx; b; b = nx) {
    nx = b->next;
    free(b);
  }
  a->head = NULL;
}

void jb_put(jbuf *b, const char *s, size_t n) {
  if (b->failed || !n) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }
void jb_putc(jbuf *b, char c) { jb_put(b, &c, 1); }
void jb_printf(jbuf *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k >= 0 && (size_t)k < sizeof tmp) jb_put(b, tmp, (size_t)k);
}

/* ---- UTF-8 ---- */
uint32_t ju_get(const char *s, size_t n, int *len) {
  const unsigned char *u = (const unsigned char *)s;
  int k = u[0] < 0x80 ? 1 : (u[0] >> 5) == 6 ? 2 : (u[0] >> 4) == 14 ? 3 : (u[0] >> 3) == 30 ? 4 : 0;
  if (!k || (size_t)k > n) {
    *len = 1;
    return u[0];
  }
  uint32_t c = k == 1 ? u[0] : k == 2 ? (u[0] & 0x1fu) : k == 3 ? (u[0] & 0x0fu) : (u[0] & 0x07u);
  for (int i = 1; i < k; i++) {
    if ((u[i] & 0xc0) != 0x80) {
      *len = 1;
      return u[0];
    }
    c = (c << 6) | (u[i] & 0x3fu);
  }
  *len = k;
  return c;
}

void ju_put(jbuf *b, uint32_t c) {
  char o[4];
  size_t n;
  if (c < 0x80) o[0] = (char)c, n = 1;
  else if (c < 0x800) o[0] = (char)(0xc0 | (c >> 6)), o[1] = (char)(0x80 | (c & 0x3f)), n = 2;
  else if (c < 0x10000)
    o[0] = (char)(0xe0 | (c >> 12)), o[1] = (char)(0x80 | ((c >> 6) & 0x3f)), o[2] = (char)(0x80 | (c & 0x3f)), n = 3;
  else
    o[0] = (char)(0xf0 | (c >> 18)), o[1] = (char)(0x80 | ((c >> 12) & 0x3f)), o[2] = (char)(0x80 | ((c >> 6) & 0x3f)),
    o[3] = (char)(0x80 | (c & 0x3f)), n = 4;
  jb_put(b, o, n);
}

size_t ju_len(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; k++) {
    int l;
    ju_get(s + i, n - i, &l);
    i += (size_t)l;
  }
  return k;
}

size_t ju_off(const char *s, size_t n, size_t idx) {
  size_t i = 0;
  for (size_t k = 0; k < idx && i < n; k++) {
    int l;
    ju_get(s + i, n - i, &l);
    i += (size_t)l;
  }
  return i;
}

/* str.isspace(): Unicode White_Space plus the separators Python adds (0x1c-0x1f). */
int ju_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* ---- constructors ---- */
jv jv_cstr(const char *s) { return jv_str(s, strlen(s)); }

jv jv_list(ja_arena *a, int kind) {
  jlist *l = ja_alloc(a, sizeof *l);
  if (!l) return jv_undef(NULL);
  l->kind = kind;
  jv v = {.t = JV_LIST, .u.l = l};
  return v;
}

jv jv_dict(ja_arena *a) {
  jdict *d = ja_alloc(a, sizeof *d);
  if (!d) return jv_undef(NULL);
  jv v = {.t = JV_DICT, .u.d = d};
  return v;
}

void jl_push(ja_arena *a, jlist *l, jv x) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 8;
    jv *v = ja_alloc(a, cap * sizeof *v);
    if (!v) return;
    if (l->n) memcpy(v, l->v, l->n * sizeof *v);
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = x;
}

int jd_find(const jdict *d, jv k) {
  for (size_t i = 0; i < d->n; i++)
    if (jv_eq(d->k[i], k)) return (int)i;
  return -1;
}

void jd_set(ja_arena *a, jdict *d, jv k, jv v) {
  int i = jd_find(d, k);
  if (i >= 0) {
    d->v[i] = v;
    return;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? 2 * d->cap : 8;
    jv *nk = ja_alloc(a, cap * sizeof *nk), *nv = ja_alloc(a, cap * sizeof *nv);
    if (!nk || !nv) return;
    if (d->n) memcpy(nk, d->k, d->n * sizeof *nk), memcpy(nv, d->v, d->n * sizeof *nv);
    d->k = nk;
    d->v = nv;
    d->cap = cap;
  }
  d->k[d->n] = k;
  d->v[d->n++] = v;
}

jv jv_from_json(ja_arena *a, const json_t *j) {
  switch (json_typeof(j)) {
  case JSON_OBJECT: {
    jv d = jv_dict(a);
    const char *k;
    json_t *v;
    if (d.t != JV_DICT) return d;
    json_object_foreach((json_t *)j, k, v) jd_set(a, d.u.d, jv_cstr(k), jv_from_json(a, v));
    return d;
  }
  case JSON_ARRAY: {
    jv l = jv_list(a, 0);
    if (l.t != JV_LIST) return l;
    for (size_t i = 0; i < json_array_size(j); i++) jl_push(a, l.u.l, jv_from_json(a, json_array_get(j, i)));
    return l;
  }
  case JSON_STRING: {
    char *s = ja_strndup(a, json_string_value(j), json_string_length(j));
    return s ? jv_str(s, json_string_length(j)) : jv_undef(NULL);
  }
  case JSON_INTEGER: return jv_int(json_integer_value(j));
  case JSON_REAL: return jv_float(json_real_value(j));
  case JSON_TRUE: return jv_bool(1);
  case JSON_FALSE: return jv_bool(0);
  default: return jv_none();
  }
}

/* ---- truth, equality, order ---- */
int jv_truthy(jv v) {
  switch (v.t) {
  case JV_UNDEF:
  case JV_NONE: return 0;
  case JV_BOOL:
  case JV_INT: return v.u.i != 0;
  case JV_FLOAT: return v.u.f != 0;
  case JV_STR: return v.u.s.n > 0;
  case JV_LIST: return v.u.l->kind == JL_GEN || v.u.l->n > 0;
  case JV_DICT: return v.u.d->ns || v.u.d->n > 0;
  default: return 1;
  }
}

static int is_num(jv v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
static double num(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)v.u.i; }

int jv_eq(jv a, jv b) {
  if (is_num(a) && is_num(b)) {
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) return a.u.i == b.u.i;
    return num(a) == num(b);
  }
  if (a.t != b.t) return 0;
  switch (a.t) {
  case JV_UNDEF:
  case JV_NONE: return 1;
  case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
  case JV_LIST:
    if (!JL_SEQ(a.u.l) || !JL_SEQ(b.u.l)) return a.u.l == b.u.l;
    if (a.u.l->n != b.u.l->n || a.u.l->kind != b.u.l->kind) return 0;
    for (size_t i = 0; i < a.u.l->n; i++)
      if (!jv_eq(a.u.l->v[i], b.u.l->v[i])) return 0;
    return 1;
  case JV_DICT:
    if (a.u.d->ns || b.u.d->ns) return a.u.d == b.u.d;
    if (a.u.d->n != b.u.d->n) return 0;
    for (size_t i = 0; i < a.u.d->n; i++) {
      int k = jd_find(b.u.d, a.u.d->k[i]);
      if (k < 0 || !jv_eq(a.u.d->v[i], b.u.d->v[k])) return 0;
    }
    return 1;
  default: return a.u.m == b.u.m;
  }
}

int jv_cmp(jv a, jv b, int *ok) {
  *ok = 1;
  if (is_num(a) && is_num(b)) {
    double x = num(a), y = num(b);
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (a.u.i > b.u.i) - (a.u.i < b.u.i);
    return (x > y) - (x < y);
  }
  if (a.t == JV_STR && b.t == JV_STR) {   /* UTF-8 byte order is code point order */
    size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
    int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
    if (c) return c < 0 ? -1 : 1;
    return (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
  }
  if (a.t == JV_LIST && b.t == JV_LIST && JL_SEQ(a.u.l) && a.u.l->kind == b.u.l->kind) {
    for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
      if (jv_eq(a.u.l->v[i], b.u.l->v[i])) continue;
      return jv_cmp(a.u.l->v[i], b.u.l->v[i], ok);
    }
    return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
  }
  *ok = 0;
  return 0;
}

const char *jv_typename(jv v) {
  static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "macro", "function"};
  static const char *const kinds[] = {"list", "tuple", "generator", "dict_items", "dict_keys", "dict_values"};
  if (v.t == JV_LIST) return kinds[v.u.l->kind];
  if (v.t == JV_DICT && v.u.d->ns) return "Namespace";
  return names[v.t];
}

/* ---- str, repr ---- */
/* float.__repr__: the shortest digits that read back, fixed notation for exponents -4..15. */
void jv_float_repr(jbuf *b, double f) {
  if (isnan(f)) {
    jb_puts(b, "nan");
    return;
  }
  if (isinf(f)) {
    jb_puts(b, f < 0 ? "-inf" : "inf");
    return;
  }
  char e[40];
  for (int p = 0; p < 17; p++) {
    snprintf(e, sizeof e, "%.*e", p, f);
    if (strtod(e, NULL) == f) break;
  }
  /* e: [-]d[.ddd]e[+-]XX */
  char digits[24];
  int nd = 0, neg = e[0] == '-';
  const char *q = e + neg;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[nd++] = *q;
  int exp = atoi(q + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  if (neg) jb_putc(b, '-');
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      jb_puts(b, "0.");
      for (int i = 0; i < -exp - 1; i++) jb_putc(b, '0');
      jb_put(b, digits, (size_t)nd);
    } else {
      for (int i = 0; i <= exp; i++) jb_putc(b, i < nd ? digits[i] : '0');
      jb_putc(b, '.');
      if (nd > exp + 1) jb_put(b, digits + exp + 1, (size_t)(nd - exp - 1));
      else jb_putc(b, '0');
    }
  } else {
    jb_putc(b, digits[0]);
    if (nd > 1) {
      jb_putc(b, '.');
      jb_put(b, digits + 1, (size_t)(nd - 1));
    }
    jb_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  }
}

static void repr_str(jbuf *b, const char *s, size_t n) {
  int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
  char q = sq && !dq ? '"' : '\'';
  jb_putc(b, q);
  for (size_t i = 0; i < n;) {
    int l;
    uint32_t c = ju_get(s + i, n - i, &l);
    if (c == (uint32_t)q || c == '\\') jb_putc(b, '\\'), jb_putc(b, (char)c);
    else if (c == '\n') jb_puts(b, "\\n");
    else if (c == '\r') jb_puts(b, "\\r");
    else if (c == '\t') jb_puts(b, "\\t");
    else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) || c == 0xad) jb_printf(b, "\\x%02x", c);
    else if (c == 0x2028 || c == 0x2029 || (c >= 0x200b && c <= 0x200f) || c == 0xfeff) jb_printf(b, "\\u%04x", c);
    else jb_put(b, s + i, (size_t)l);
    i += (size_t)l;
  }
  jb_putc(b, q);
}

void jv_repr_to(jbuf *b, jv v) {
  if (v.t == JV_STR) repr_str(b, v.u.s.p, v.u.s.n);
  else jv_str_to(b, v);
}

void jv_str_to(jbuf *b, jv v) {
  switch (v.t) {
  case JV_UNDEF: return;
  case JV_NONE: jb_puts(b, "None"); return;
  case JV_BOOL: jb_puts(b, v.u.i ? "True" : "False"); return;
  case JV_INT: jb_printf(b, "%lld", (long long)v.u.i); return;
  case JV_FLOAT: jv_float_repr(b, v.u.f); return;
  case JV_STR: jb_put(b, v.u.s.p, v.u.s.n); return;
  case JV_LIST: {
    jlist *l = v.u.l;
    if (l->kind == JL_GEN) {   /* Python writes an address here; output() refuses it */
      jb_puts(b, "<generator object>");
      return;
    }
    int tuple = l->kind == JL_TUPLE, view = !JL_SEQ(l);
    if (view) jb_printf(b, "%s(", jv_typename(v));
    jb_putc(b, tuple ? '(' : '[');
    for (size_t i = 0; i < l->n; i++) {
      if (i) jb_puts(b, ", ");
      jv_repr_to(b, l->v[i]);
    }
    if (tuple && l->n == 1) jb_putc(b, ',');
    jb_putc(b, tuple ? ')' : ']');
    if (view) jb_putc(b, ')');
    return;
  }
  case JV_DICT: {
    jdict *d = v.u.d;
    if (d->ns) jb_puts(b, "<Namespace ");
    jb_putc(b, '{');
    for (size_t i = 0; i < d->n; i++) {
      if (i) jb_puts(b, ", ");
      jv_repr_to(b, d->k[i]);
      jb_puts(b, ": ");
      jv_repr_to(b, d->v[i]);
    }
    jb_putc(b, '}');
    if (d->ns) jb_putc(b, '>');
    return;
  }
  case JV_MACRO: jb_puts(b, "<Macro>"); return;
  case JV_FUNC: jb_printf(b, "<function %s>", v.u.s.p); return;
  }
}

jv jv_to_string(ja_arena *a, jv v) {
  if (v.t == JV_STR) return v;
  jbuf b = {0};
  jv_str_to(&b, v);
  char *s = ja_strndup(a, b.p ? b.p : "", b.n);
  size_t n = b.n;
  free(b.p);
  return s ? jv_str(s, n) : jv_undef(NULL);
}

jv jv_escape(ja_arena *a, jv v) {
  if (v.t == JV_STR && v.markup) return v;
  jv s = jv_to_string(a, v);
  jbuf b = {0};
  for (size_t i = 0; i < s.u.s.n; i++) {
    char c = s.u.s.p[i];
    switch (c) {
    case '&': jb_puts(&b, "&amp;"); break;
    case '<': jb_puts(&b, "&lt;"); break;
    case '>': jb_puts(&b, "&gt;"); break;
    case '"': jb_puts(&b, "&#34;"); break;
    case '\'': jb_puts(&b, "&#39;"); break;
    default: jb_putc(&b, c);
    }
  }
  char *p = ja_strndup(a, b.p ? b.p : "", b.n);
  jv r = p ? jv_str(p, b.n) : jv_undef(NULL);
  r.markup = p != NULL;
  free(b.p);
  return r;
}

/* ---- json.dumps ---- */
static void json_str(jbuf *b, const char *s, size_t n, int ascii) {
  jb_putc(b, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (ascii && c >= 0x80) {
      int l;
      uint32_t cp = ju_get(s + i, n - i, &l);
      if (cp >= 0x10000) jb_printf(b, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
      else jb_printf(b, "\\u%04x", cp);
      i += (size_t)l - 1;
      continue;
    }
    switch (c) {
    case '"': jb_puts(b, "\\\""); break;
    case '\\': jb_puts(b, "\\\\"); break;
    case '\n': jb_puts(b, "\\n"); break;
    case '\r': jb_puts(b, "\\r"); break;
    case '\t': jb_puts(b, "\\t"); break;
    case '\b': jb_puts(b, "\\b"); break;
    case '\f': jb_puts(b, "\\f"); break;
    default:
      if (c < 0x20) jb_printf(b, "\\u%04x", c);
      else jb_putc(b, (char)c);
    }
  }
  jb_putc(b, '"');
}

static void json_nl(jbuf *b, int indent, int level) {
  jb_putc(b, '\n');
  for (int i = 0; i < indent * level; i++) jb_putc(b, ' ');
}

static int key_order(const void *x, const void *y) {
  const jv *a = *(const jv *const *)x, *b = *(const jv *const *)y;
  int ok;
  return jv_cmp(*a, *b, &ok);
}

int jv_json_to(jbuf *b, jv v, int indent, const char *isep, const char *ksep, int flags, int level, const char **what) {
  int sort = flags & JJ_SORT, ascii = (flags & JJ_ASCII) != 0;
  switch (v.t) {
  case JV_NONE: jb_puts(b, "null"); return 0;
  case JV_BOOL: jb_puts(b, v.u.i ? "true" : "false"); return 0;
  case JV_INT: jb_printf(b, "%lld", (long long)v.u.i); return 0;
  case JV_FLOAT:
    if (isnan(v.u.f)) jb_puts(b, "NaN");
    else if (isinf(v.u.f)) jb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
    else jv_float_repr(b, v.u.f);
    return 0;
  case JV_STR: json_str(b, v.u.s.p, v.u.s.n, ascii); return 0;
  case JV_LIST: {
    jlist *l = v.u.l;
    if (!JL_SEQ(l)) {
      *what = jv_typename(v);
      return -1;
    }
    if (!l->n) {
      jb_puts(b, "[]");
      return 0;
    }
    jb_putc(b, '[');
    for (size_t i = 0; i < l->n; i++) {
      if (i) jb_puts(b, isep);
      if (indent >= 0) json_nl(b, indent, level + 1);
      if (jv_json_to(b, l->v[i], indent, isep, ksep, flags, level + 1, what)) return -1;
    }
    if (indent >= 0) json_nl(b, indent, level);
    jb_putc(b, ']');
    return 0;
  }
  case JV_DICT: {
    jdict *d = v.u.d;
    if (d->ns) {
      *what = "Namespace";
      return -1;
    }
    if (!d->n) {
      jb_puts(b, "{}");
      return 0;
    }
    const jv **order = malloc(d->n * sizeof *order);
    if (!order) return -1;
    for (size_t i = 0; i < d->n; i++) order[i] = &d->k[i];
    if (sort) qsort(order, d->n, sizeof *order, key_order);
    jb_putc(b, '{');
    int rc = 0;
    for (size_t j = 0; j < d->n && !rc; j++) {
      size_t i = (size_t)(order[j] - d->k);
      if (j) jb_puts(b, isep);
      if (indent >= 0) json_nl(b, indent, level + 1);
      jv k = d->k[i];
      if (k.t == JV_STR) json_str(b, k.u.s.p, k.u.s.n, ascii);
      else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
        jbuf t = {0};
        jv_json_to(&t, k, -1, isep, ksep, 0, 0, what);
        json_str(b, t.p ? t.p : "", t.n, ascii);
        free(t.p);
      } else {
        *what = jv_typename(k);
        rc = -1;
        break;
      }
      jb_puts(b, ksep);
      rc = jv_json_to(b, d->v[i], indent, isep, ksep, flags, level + 1, what);
    }
    free(order);
    if (rc) return rc;
    if (indent >= 0) json_nl(b, indent, level);
    jb_putc(b, '}');
    return 0;
  }
  default: *what = jv_typename(v); return -1;
  }
}
