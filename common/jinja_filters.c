/* jinja_filters — jinja2's filters and tests as templates use them, with jinja2's defaults
 * (case-insensitive sort, dictsort, unique, min and max; default's boolean flag; indent's first
 * and blank) and transformers' tojson (json.dumps with ensure_ascii=False). Any thread; values in
 * the render's arena. */
#define _GNU_SOURCE   /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_priv.h"

static const char *const filters[] = {
    "tojson", "length", "count", "trim", "string", "default", "d", "join", "items", "upper", "lower", "title",
    "capitalize", "safe", "dictsort", "list", "replace", "selectattr", "rejectattr", "select", "reject", "indent",
    "map", "int", "float", "unique", "sort", "min", "max", "first", "last", "abs", "reverse", "e", "escape", NULL};
static const char *const tests[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer", "float",
    "boolean", "true", "false", "odd", "even", "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "<", "le",
    "<=", "gt", ">", "ge", ">=", "in", "sameas", "callable", "lower", "upper", NULL};

static int in_table(const char *const *t, const char *s) {
  for (; *t; t++)
    if (!strcmp(*t, s)) return 1;
  return 0;
}
int jf_is_filter(const char *name) { return in_table(filters, name); }
int jf_is_test(const char *name) { return in_table(tests, name); }

static jv kwarg(int pos, const char *name, jv dflt, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  if (pos >= 0 && pos < nargs) return args[pos];
  for (int k = 0; k < nkw; k++)
    if (!strcmp(kwn[k], name)) return kwv[k];
  return dflt;
}
#define ARG(pos, name, dflt) kwarg((pos), (name), (dflt), args, nargs, kwn, kwv, nkw)

static jv mkstr(jctx *x, jbuf *b) {
  char *s = b->failed ? NULL : ja_strndup(x->a, b->p ? b->p : "", b->n);
  size_t n = b->n;
  free(b->p);
  return s ? jv_str(s, n) : jx_fail(x, "out of memory");
}

/* ---- tests ---- */
int jf_test(jctx *x, const char *name, jv v, jv *args, int nargs) {
  jv a = nargs ? args[0] : jv_undef(NULL);
  int num = v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT;
  if (!strcmp(name, "defined")) return v.t != JV_UNDEF;
  if (!strcmp(name, "undefined")) return v.t == JV_UNDEF;
  if (!strcmp(name, "none")) return v.t == JV_NONE;
  if (!strcmp(name, "string")) return v.t == JV_STR;
  if (!strcmp(name, "mapping")) return v.t == JV_DICT && !v.u.d->ns;
  if (!strcmp(name, "iterable") || !strcmp(name, "sequence"))
    return v.t == JV_STR || v.t == JV_LIST || (v.t == JV_DICT && !v.u.d->ns) || v.t == JV_UNDEF;
  if (!strcmp(name, "number")) return num;
  if (!strcmp(name, "integer")) return v.t == JV_INT;
  if (!strcmp(name, "float")) return v.t == JV_FLOAT;
  if (!strcmp(name, "boolean")) return v.t == JV_BOOL;
  if (!strcmp(name, "true")) return v.t == JV_BOOL && v.u.i;
  if (!strcmp(name, "false")) return v.t == JV_BOOL && !v.u.i;
  if (!strcmp(name, "callable")) return v.t == JV_MACRO || v.t == JV_FUNC;
  if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
    if (v.t != JV_STR) v = jv_to_string(x->a, v);
    jv c = jf_case(x, v, name[0] == 'l' ? 'l' : 'u');
    return !x->rc && jv_eq(c, v);
  }
  if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
    int64_t d = name[0] == 'd' ? (a.t == JV_INT ? a.u.i : 0) : 2;
    if ((v.t != JV_INT && v.t != JV_BOOL) || d == 0) {
      jx_fail(x, "the test '%s' needs integers", name);
      return -1;
    }
    int64_t m = v.u.i % d;
    return name[0] == 'o' ? m != 0 : m == 0;
  }
  if (!strcmp(name, "in")) {
    if (a.t == JV_STR && v.t == JV_STR) return a.u.s.n >= v.u.s.n && memmem(a.u.s.p, a.u.s.n, v.u.s.p, v.u.s.n) != NULL;
    if (a.t == JV_LIST) {
      for (size_t i = 0; i < a.u.l->n; i++)
        if (jv_eq(a.u.l->v[i], v)) return 1;
      return 0;
    }
    if (a.t == JV_DICT) return jd_find(a.u.d, v) >= 0;
    jx_fail(x, "the test 'in' needs a container, not %s", jv_typename(a));
    return -1;
  }
  if (!strcmp(name, "sameas")) {
    if (v.t != a.t) return 0;
    if (v.t == JV_NONE || v.t == JV_UNDEF) return v.t == JV_NONE;
    if (v.t == JV_BOOL) return v.u.i == a.u.i;
    if (v.t == JV_LIST) return v.u.l == a.u.l;
    if (v.t == JV_DICT) return v.u.d == a.u.d;
    return 0;
  }
  if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return jv_eq(v, a);
  if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_eq(v, a);
  int ok, c = jv_cmp(v, a, &ok);
  if (!ok) {
    jx_fail(x, "'%s' not supported between instances of '%s' and '%s'", name, jv_typename(v), jv_typename(a));
    return -1;
  }
  if (!strcmp(name, "lt") || !strcmp(name, "<")) return c < 0;
  if (!strcmp(name, "le") || !strcmp(name, "<=")) return c <= 0;
  if (!strcmp(name, "gt") || !strcmp(name, ">")) return c > 0;
  return c >= 0;
}

/* ---- sorting: stable, with jinja2's case folding of strings ---- */
typedef struct sortkey {
  jv key, item;
} sortkey;

static jv fold(jctx *x, jv v, int case_sensitive) {
  return !case_sensitive && v.t == JV_STR ? jf_case(x, v, 'l') : v;
}

static int key_lt(jctx *x, jv a, jv b) {
  int ok, c = jv_cmp(a, b, &ok);
  if (!ok) jx_fail(x, "'<' not supported between instances of '%s' and '%s'", jv_typename(a), jv_typename(b));
  return c < 0;
}

static void merge_sort(jctx *x, sortkey *v, sortkey *tmp, size_t n) {
  if (n < 2 || x->rc) return;
  size_t h = n / 2;
  merge_sort(x, v, tmp, h);
  merge_sort(x, v + h, tmp, n - h);
  size_t i = 0, j = h, k = 0;
  while (i < h && j < n) tmp[k++] = key_lt(x, v[j].key, v[i].key) ? v[j++] : v[i++];
  while (i < h) tmp[k++] = v[i++];
  while (j < n) tmp[k++] = v[j++];
  memcpy(v, tmp, n * sizeof *v);
}

/* An item's attribute for sort/map/selectattr: "a.b" walks dicts, "0" indexes a list. */
static jv attr_of(jctx *x, jv item, jv attr) {
  if (attr.t == JV_INT) {
    if (item.t == JV_LIST && attr.u.i >= 0 && (size_t)attr.u.i < item.u.l->n) return item.u.l->v[attr.u.i];
    return jv_undef(NULL);
  }
  if (attr.t != JV_STR) return jx_fail(x, "an attribute name must be a string");
  const char *p = attr.u.s.p, *e = p + attr.u.s.n;
  while (p <= e) {
    const char *dot = memchr(p, '.', (size_t)(e - p));
    size_t n = dot ? (size_t)(dot - p) : (size_t)(e - p);
    if (item.t == JV_DICT) {
      int i = jd_find(item.u.d, jv_str(p, n));
      item = i >= 0 ? item.u.d->v[i] : jv_undef(NULL);
    } else if (item.t == JV_LIST && n && p[0] >= '0' && p[0] <= '9') {
      size_t ix = (size_t)atoi(p);
      item = ix < item.u.l->n ? item.u.l->v[ix] : jv_undef(NULL);
    } else item = jv_undef(NULL);
    if (!dot) break;
    p = dot + 1;
  }
  return item;
}

static jv sorted(jctx *x, jv items, int reverse, int case_sensitive, jv attr, int by_value) {
  size_t n = items.u.l->n;
  sortkey *v = calloc(n + 1, sizeof *v), *tmp = calloc(n + 1, sizeof *tmp);
  if (!v || !tmp) {
    free(v);
    free(tmp);
    return jx_fail(x, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    jv it = items.u.l->v[i];
    jv k = by_value >= 0 ? it.u.l->v[by_value] : attr.t != JV_NONE ? attr_of(x, it, attr) : it;
    v[i] = (sortkey){fold(x, k, case_sensitive), it};
  }
  if (reverse)   /* Python's reverse=True keeps equal items in their order */
    for (size_t i = 0; i < n / 2; i++) {
      sortkey t = v[i];
      v[i] = v[n - 1 - i];
      v[n - 1 - i] = t;
    }
  merge_sort(x, v, tmp, n);
  jv out = jv_list(x->a, 0);
  for (size_t i = 0; i < n; i++) jl_push(x->a, out.u.l, v[reverse ? n - 1 - i : i].item);
  free(v);
  free(tmp);
  return out;
}

static jv select_items(jctx *x, jv seq, int by_attr, int keep, jv *args, int nargs) {
  jv out = jv_list(x->a, JL_GEN);
  if (!jv_truthy(seq)) return out;   /* jinja2: "if seq:" before it iterates */
  jv items = jx_iterable(x, seq);
  if (x->rc) return items;
  int first = by_attr ? 1 : 0;
  if (by_attr && nargs < 1) return jx_fail(x, "selectattr and rejectattr need an attribute name");
  for (size_t i = 0; i < items.u.l->n && !x->rc; i++) {
    jv it = items.u.l->v[i], v = by_attr ? attr_of(x, it, args[0]) : it;
    int r;
    if (nargs > first) {
      if (args[first].t != JV_STR) return jx_fail(x, "a test name must be a string");
      char tn[32];
      snprintf(tn, sizeof tn, "%.*s", (int)args[first].u.s.n, args[first].u.s.p);
      if (!jf_is_test(tn)) return jx_fail(x, "no test named '%s'", tn);
      r = jf_test(x, tn, v, args + first + 1, nargs - first - 1);
      if (r < 0) return jv_undef(NULL);
    } else r = jv_truthy(v);
    if (r == keep) jl_push(x->a, out.u.l, it);
  }
  return out;
}

static jv do_indent(jctx *x, jv s, jv width, int first, int blank) {
  if (s.t != JV_STR) s = jv_to_string(x->a, s);
  jbuf ind = {0}, b = {0};
  if (width.t == JV_STR) jb_put(&ind, width.u.s.p, width.u.s.n);
  else for (int64_t i = 0; i < (width.t == JV_INT ? width.u.i : 4) && i < 1000; i++) jb_putc(&ind, ' ');
  jbuf src = {0};   /* s + "\n", then splitlines */
  jb_put(&src, s.u.s.p, s.u.s.n);
  jb_putc(&src, '\n');
  jv lines = jf_method(x, "splitlines", jv_str(src.p ? src.p : "", src.n), NULL, 0, NULL, NULL, 0);
  if (first) jb_put(&b, ind.p, ind.n);
  for (size_t i = 0; !x->rc && i < lines.u.l->n; i++) {
    jv l = lines.u.l->v[i];
    if (i) {
      jb_putc(&b, '\n');
      if (blank || l.u.s.n) jb_put(&b, ind.p, ind.n);
    }
    jb_put(&b, l.u.s.p, l.u.s.n);
  }
  jv r = mkstr(x, &b);
  /* the lines point into src: copy out before freeing it */
  free(ind.p);
  jv out = jv_str(ja_strndup(x->a, r.u.s.p, r.u.s.n), r.u.s.n);
  free(src.p);
  return out.u.s.p ? out : jx_fail(x, "out of memory");
}

static jv do_tojson(jctx *x, jv v, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  jv ind = ARG(-1, "indent", jv_none()), sk = ARG(-1, "sort_keys", jv_bool(0)), sep = ARG(-1, "separators", jv_none());
  int indent = ind.t == JV_INT ? (int)(ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i) : -1;
  int flags = (jv_truthy(sk) ? JJ_SORT : 0) | (jv_truthy(ARG(-1, "ensure_ascii", jv_bool(0))) ? JJ_ASCII : 0);
  char isep[16] = ", ", ksep[16] = ": ";
  if (indent >= 0) strcpy(isep, ",");
  if (sep.t == JV_LIST && sep.u.l->n == 2 && sep.u.l->v[0].t == JV_STR && sep.u.l->v[1].t == JV_STR) {
    snprintf(isep, sizeof isep, "%.*s", (int)sep.u.l->v[0].u.s.n, sep.u.l->v[0].u.s.p);
    snprintf(ksep, sizeof ksep, "%.*s", (int)sep.u.l->v[1].u.s.n, sep.u.l->v[1].u.s.p);
  }
  jbuf b = {0};
  const char *what = "value";
  if (jv_json_to(&b, v, indent, isep, ksep, flags, 0, &what)) {
    free(b.p);
    return jx_fail(x, "Object of type %s is not JSON serializable", what);
  }
  return mkstr(x, &b);
}

static jv do_map(jctx *x, jv seq, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  jv out = jv_list(x->a, JL_GEN);
  if (!jv_truthy(seq)) return out;   /* jinja2: "if value:" before it iterates */
  jv items = jx_iterable(x, seq);
  if (x->rc) return items;
  jv attr = ARG(-1, "attribute", jv_undef(NULL)), dflt = ARG(-1, "default", jv_undef(NULL));
  char fname[32] = "";
  if (attr.t == JV_UNDEF) {
    if (nargs < 1 || args[0].t != JV_STR) return jx_fail(x, "map needs a filter name or attribute=");
    snprintf(fname, sizeof fname, "%.*s", (int)args[0].u.s.n, args[0].u.s.p);
    if (!jf_is_filter(fname)) return jx_fail(x, "no filter named '%s'", fname);
  }
  for (size_t i = 0; i < items.u.l->n && !x->rc; i++) {
    jv it = items.u.l->v[i], r;
    if (attr.t != JV_UNDEF) {
      r = attr_of(x, it, attr);
      if (r.t == JV_UNDEF && dflt.t != JV_UNDEF) r = dflt;
    } else r = jf_filter(x, fname, it, args + 1, nargs - 1, kwn, kwv, nkw);
    jl_push(x->a, out.u.l, r);
  }
  return out;
}

static jv do_unique_minmax(jctx *x, const char *name, jv seq, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  jv items = jx_iterable(x, seq);
  if (x->rc) return items;
  int cs = jv_truthy(ARG(0, "case_sensitive", jv_bool(0)));
  jv attr = ARG(1, "attribute", jv_none());
  if (!strcmp(name, "unique")) {
    jv out = jv_list(x->a, JL_GEN), seen = jv_list(x->a, 0);
    for (size_t i = 0; i < items.u.l->n && !x->rc; i++) {
      jv it = items.u.l->v[i], k = fold(x, attr.t != JV_NONE ? attr_of(x, it, attr) : it, cs);
      int dup = 0;
      for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = jv_eq(seen.u.l->v[j], k);
      if (!dup) jl_push(x->a, seen.u.l, k), jl_push(x->a, out.u.l, it);
    }
    return out;
  }
  if (!items.u.l->n) return jv_undef("min/max of an empty sequence");
  size_t best = 0;
  for (size_t i = 1; i < items.u.l->n && !x->rc; i++) {
    jv a = fold(x, attr.t != JV_NONE ? attr_of(x, items.u.l->v[i], attr) : items.u.l->v[i], cs);
    jv b = fold(x, attr.t != JV_NONE ? attr_of(x, items.u.l->v[best], attr) : items.u.l->v[best], cs);
    if (name[1] == 'i' ? key_lt(x, a, b) : key_lt(x, b, a)) best = i;
  }
  return items.u.l->v[best];
}

static jv do_number(jctx *x, jv v, int is_float, jv dflt) {
  if (v.t == JV_INT || v.t == JV_BOOL) return is_float ? jv_float((double)v.u.i) : jv_int(v.u.i);
  if (v.t == JV_FLOAT) return is_float ? v : jv_int((int64_t)v.u.f);
  if (v.t == JV_STR) {
    char buf[64];
    jv t = jf_strip(x, v, jv_none(), 1, 1);
    snprintf(buf, sizeof buf, "%.*s", (int)t.u.s.n, t.u.s.p);
    char *end;
    double f = strtod(buf, &end);
    if (t.u.s.n && t.u.s.n < sizeof buf && !*end) {
      if (is_float) return jv_float(f);
      long long i = strtoll(buf, &end, 10);
      return *end ? jv_int((int64_t)f) : jv_int(i);
    }
  }
  return dflt;
}

jv jf_filter(jctx *x, const char *name, jv v, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  if (!strcmp(name, "tojson")) return do_tojson(x, v, args, nargs, kwn, kwv, nkw);
  if (!strcmp(name, "length") || !strcmp(name, "count")) {
    if (v.t == JV_STR) return jv_int((int64_t)ju_len(v.u.s.p, v.u.s.n));
    if (v.t == JV_LIST && v.u.l->kind != JL_GEN) return jv_int((int64_t)v.u.l->n);
    if (v.t == JV_DICT && !v.u.d->ns) return jv_int((int64_t)v.u.d->n);
    if (v.t == JV_UNDEF) return jv_int(0);
    return jx_fail(x, "object of type '%s' has no len()", jv_typename(v));
  }
  if (!strcmp(name, "trim")) return jf_strip(x, v, ARG(0, "chars", jv_none()), 1, 1);
  if (!strcmp(name, "string")) return jv_to_string(x->a, v);
  if (!strcmp(name, "safe")) {
    jv s = v.t == JV_STR ? v : jv_to_string(x->a, v);
    s.markup = 1;
    return s;
  }
  if (!strcmp(name, "e") || !strcmp(name, "escape")) return jv_escape(x->a, v);
  if (!strcmp(name, "default") || !strcmp(name, "d")) {
    jv dv = ARG(0, "default_value", jv_str("", 0));
    int boolean = jv_truthy(ARG(1, "boolean", jv_bool(0)));
    return v.t == JV_UNDEF || (boolean && !jv_truthy(v)) ? dv : v;
  }
  if (!strcmp(name, "join")) {
    jv items = jx_iterable(x, v), sep = ARG(0, "d", jv_str("", 0)), attr = ARG(1, "attribute", jv_none());
    if (x->rc) return items;
    jbuf b = {0};
    for (size_t i = 0; i < items.u.l->n; i++) {
      if (i) jv_str_to(&b, sep);
      jv_str_to(&b, attr.t != JV_NONE ? attr_of(x, items.u.l->v[i], attr) : items.u.l->v[i]);
    }
    return mkstr(x, &b);
  }
  if (!strcmp(name, "items")) {
    if (v.t == JV_UNDEF) return jv_list(x->a, 0);
    if (v.t != JV_DICT) return jx_fail(x, "can only get item pairs from a mapping, not %s", jv_typename(v));
    jv items = jf_method(x, "items", v, NULL, 0, NULL, NULL, 0);
    if (items.t == JV_LIST) items.u.l->kind = JL_GEN;
    return items;
  }
  if (!strcmp(name, "upper")) return jf_case(x, v, 'u');
  if (!strcmp(name, "lower")) return jf_case(x, v, 'l');
  if (!strcmp(name, "title")) return jf_case(x, v, 't');
  if (!strcmp(name, "capitalize")) return jf_case(x, v, 'c');
  if (!strcmp(name, "dictsort")) {
    if (v.t != JV_DICT) return jx_fail(x, "dictsort needs a mapping, not %s", jv_typename(v));
    jv by = ARG(1, "by", jv_cstr("key"));
    int byv = by.t == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5);
    jv items = jf_method(x, "items", v, NULL, 0, NULL, NULL, 0);
    return sorted(x, items, jv_truthy(ARG(2, "reverse", jv_bool(0))), jv_truthy(ARG(0, "case_sensitive", jv_bool(0))),
                  jv_none(), byv);
  }
  if (!strcmp(name, "list")) {
    jv items = jx_iterable(x, v), out = jv_list(x->a, JL_LIST);
    if (x->rc) return items;
    for (size_t i = 0; i < items.u.l->n; i++) jl_push(x->a, out.u.l, items.u.l->v[i]);
    return out;
  }
  if (!strcmp(name, "replace")) {
    if (nargs < 2) return jx_fail(x, "replace needs the old and the new string");
    jv s = jv_to_string(x->a, v);
    return jf_method(x, "replace", s, args, nargs, kwn, kwv, nkw);
  }
  if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr")) return select_items(x, v, 1, name[0] == 's', args, nargs);
  if (!strcmp(name, "select") || !strcmp(name, "reject")) return select_items(x, v, 0, name[2] == 'l', args, nargs);
  if (!strcmp(name, "indent"))
    return do_indent(x, v, ARG(0, "width", jv_int(4)), jv_truthy(ARG(1, "first", jv_bool(0))),
                     jv_truthy(ARG(2, "blank", jv_bool(0))));
  if (!strcmp(name, "map")) return do_map(x, v, args, nargs, kwn, kwv, nkw);
  if (!strcmp(name, "int")) return do_number(x, v, 0, ARG(0, "default", jv_int(0)));
  if (!strcmp(name, "float")) return do_number(x, v, 1, ARG(0, "default", jv_float(0)));
  if (!strcmp(name, "unique") || !strcmp(name, "min") || !strcmp(name, "max"))
    return do_unique_minmax(x, name, v, args, nargs, kwn, kwv, nkw);
  if (!strcmp(name, "sort")) {
    jv items = jx_iterable(x, v);
    if (x->rc) return items;
    return sorted(x, items, jv_truthy(ARG(0, "reverse", jv_bool(0))), jv_truthy(ARG(1, "case_sensitive", jv_bool(0))),
                  ARG(2, "attribute", jv_none()), -1);
  }
  if (!strcmp(name, "first") && v.t == JV_LIST && v.u.l->kind == JL_GEN) {   /* takes one item */
    jlist *l = v.u.l;
    return l->pos < l->n ? l->v[l->pos++] : jv_undef("first of an empty sequence");
  }
  if (!strcmp(name, "last") && v.t == JV_LIST && v.u.l->kind == JL_GEN)
    return jx_fail(x, "'generator' object is not reversible");
  if (!strcmp(name, "first") || !strcmp(name, "last")) {
    jv items = jx_iterable(x, v);
    if (x->rc) return items;
    if (!items.u.l->n) return jv_undef("first/last of an empty sequence");
    return items.u.l->v[name[0] == 'f' ? 0 : items.u.l->n - 1];
  }
  if (!strcmp(name, "abs")) {
    if (v.t == JV_INT || v.t == JV_BOOL) return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    if (v.t == JV_FLOAT) return jv_float(v.u.f < 0 ? -v.u.f : v.u.f);
    return jx_fail(x, "bad operand type for abs(): '%s'", jv_typename(v));
  }
  if (!strcmp(name, "reverse")) {
    if (v.t == JV_STR) {
      jbuf b = {0};
      size_t e = v.u.s.n;
      while (e > 0) {
        size_t k = e - 1;
        while (k > 0 && ((unsigned char)v.u.s.p[k] & 0xc0) == 0x80) k--;
        jb_put(&b, v.u.s.p + k, e - k);
        e = k;
      }
      return mkstr(x, &b);
    }
    /* reversed() of a sequence is an iterator; a generator is read into a list and reversed */
    int gen = v.t == JV_LIST && v.u.l->kind == JL_GEN;
    jv items = jx_iterable(x, v), out = jv_list(x->a, gen ? JL_LIST : JL_GEN);
    if (x->rc) return items;
    for (size_t i = items.u.l->n; i > 0; i--) jl_push(x->a, out.u.l, items.u.l->v[i - 1]);
    return out;
  }
  return jx_fail(x, "the filter '%s' is not supported", name);
}
