/* jinja_methods — what templates call: the str and dict methods of Python that the sandbox lets a
 * template use (strip, split, startswith, format, get, items, ...), the global functions
 * (raise_exception, strftime_now, range, namespace, dict), and the string helpers the filters share
 * (Python's strip and case mappings, on code points). Any thread; values in the render's arena. */
#define _GNU_SOURCE   /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "jinja_priv.h"

static const char *const methods[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower",
                                      "title", "capitalize", "replace", "find", "count", "format", "join", "splitlines",
                                      "get", "items", "keys", "values", "append", "pop", "extend", "insert", "update",
                                      NULL};
static const char *const functions[] = {"raise_exception", "strftime_now", "range", "namespace", "dict", NULL};

static int in_table(const char *const *t, const char *s) {
  for (; *t; t++)
    if (!strcmp(*t, s)) return 1;
  return 0;
}
int jf_is_method(const char *name) { return in_table(methods, name); }
int jf_is_function(const char *name) { return in_table(functions, name); }

static jv mkstr(jctx *x, jbuf *b) {
  char *s = b->failed ? NULL : ja_strndup(x->a, b->p ? b->p : "", b->n);
  size_t n = b->n;
  free(b->p);
  return s ? jv_str(s, n) : jx_fail(x, "out of memory");
}

/* Python's str.strip([chars]) on code points; left/right choose lstrip/rstrip. */
jv jf_strip(jctx *x, jv s, jv chars, int left, int right) {
  if (s.t != JV_STR) s = jv_to_string(x->a, s);
  if (chars.t != JV_NONE && chars.t != JV_UNDEF && chars.t != JV_STR)
    return jx_fail(x, "strip arg must be None or str, not %s", jv_typename(chars));
  const char *p = s.u.s.p;
  size_t a = 0, e = s.u.s.n;
  int usechars = chars.t == JV_STR;
  while (left && a < e) {
    int l;
    uint32_t c = ju_get(p + a, e - a, &l);
    int strip = usechars ? memmem(chars.u.s.p, chars.u.s.n, p + a, (size_t)l) != NULL : ju_isspace(c);
    if (!strip) break;
    a += (size_t)l;
  }
  while (right && e > a) {
    size_t k = e - 1;
    while (k > a && ((unsigned char)p[k] & 0xc0) == 0x80) k--;
    int l;
    uint32_t c = ju_get(p + k, e - k, &l);
    int strip = usechars ? memmem(chars.u.s.p, chars.u.s.n, p + k, e - k) != NULL : ju_isspace(c);
    if (!strip) break;
    e = k;
  }
  jv r = jv_str(p + a, e - a);
  r.markup = s.markup;   /* Markup's str methods return Markup */
  return r;
}

static int is_cased_letter(uint32_t c) {
  utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

/* Case mappings: 'u' upper, 'l' lower, 'c' capitalize, 'T' Python's str.title, 't' jinja's title
 * filter (a word starts after '-', whitespace, '(', '{', '[' or '<'). */
jv jf_case(jctx *x, jv s, int mode) {
  if (s.t != JV_STR) s = jv_to_string(x->a, s);
  int markup = s.markup;
  jbuf b = {0};
  int start = 1;
  for (size_t i = 0; i < s.u.s.n;) {
    int l;
    uint32_t c = ju_get(s.u.s.p + i, s.u.s.n - i, &l);
    uint32_t o;
    if (mode == 'u') o = (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
    else if (mode == 'l') o = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
    else if (mode == 'c') o = (uint32_t)(i == 0 ? utf8proc_totitle((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
    else if (mode == 'T') {
      o = (uint32_t)(start ? utf8proc_totitle((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
      start = !is_cased_letter(c);
    } else {
      int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || ju_isspace(c);
      o = sep ? c : (uint32_t)(start ? utf8proc_toupper((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
      start = sep;
    }
    if (c == 0xdf && mode == 'u') jb_puts(&b, "SS");   /* the one special case templates meet: ß */
    else ju_put(&b, o);
    i += (size_t)l;
  }
  jv r = mkstr(x, &b);
  r.markup = markup;
  return r;
}

static jv str_split(jctx *x, jv s, jv sep, int64_t maxsplit) {
  jv l = jv_list(x->a, 0);
  const char *p = s.u.s.p;
  size_t n = s.u.s.n, i = 0;
  if (sep.t == JV_STR) {
    if (!sep.u.s.n) return jx_fail(x, "empty separator");
    size_t st = 0;
    const char *hit;
    while ((maxsplit < 0 || (int64_t)l.u.l->n < maxsplit) && (hit = memmem(p + st, n - st, sep.u.s.p, sep.u.s.n))) {
      jl_push(x->a, l.u.l, jv_str(p + st, (size_t)(hit - (p + st))));
      st = (size_t)(hit - p) + sep.u.s.n;
    }
    jl_push(x->a, l.u.l, jv_str(p + st, n - st));
    return l;
  }
  for (;;) {   /* runs of whitespace; none at either end */
    while (i < n) {
      int k;
      if (!ju_isspace(ju_get(p + i, n - i, &k))) break;
      i += (size_t)k;
    }
    if (i >= n) break;
    if (maxsplit >= 0 && (int64_t)l.u.l->n >= maxsplit) {
      size_t e = n;
      while (e > i) {
        size_t k = e - 1;
        while (k > i && ((unsigned char)p[k] & 0xc0) == 0x80) k--;
        int len;
        if (!ju_isspace(ju_get(p + k, e - k, &len))) break;
        e = k;
      }
      jl_push(x->a, l.u.l, jv_str(p + i, e - i));
      break;
    }
    size_t st = i;
    while (i < n) {
      int k;
      if (ju_isspace(ju_get(p + i, n - i, &k))) break;
      i += (size_t)k;
    }
    jl_push(x->a, l.u.l, jv_str(p + st, i - st));
  }
  return l;
}

static int affix(jv s, jv a, int end) {
  if (a.t != JV_STR || a.u.s.n > s.u.s.n) return 0;
  return !memcmp(s.u.s.p + (end ? s.u.s.n - a.u.s.n : 0), a.u.s.p, a.u.s.n);
}

static jv str_replace(jctx *x, jv s, jv old, jv new_, int64_t count) {
  if (old.t != JV_STR || new_.t != JV_STR) return jx_fail(x, "replace() arguments must be str");
  jbuf b = {0};
  size_t i = 0;
  int64_t done = 0;
  if (!old.u.s.n) {   /* Python inserts NEW around every character */
    for (; i <= s.u.s.n; done++) {
      if (count >= 0 && done >= count) {
        jb_put(&b, s.u.s.p + i, s.u.s.n - i);
        break;
      }
      jb_put(&b, new_.u.s.p, new_.u.s.n);
      if (i == s.u.s.n) break;
      int l;
      ju_get(s.u.s.p + i, s.u.s.n - i, &l);
      jb_put(&b, s.u.s.p + i, (size_t)l);
      i += (size_t)l;
    }
    return mkstr(x, &b);
  }
  const char *hit;
  while ((count < 0 || done < count) && (hit = memmem(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n))) {
    jb_put(&b, s.u.s.p + i, (size_t)(hit - (s.u.s.p + i)));
    jb_put(&b, new_.u.s.p, new_.u.s.n);
    i = (size_t)(hit - s.u.s.p) + old.u.s.n;
    done++;
  }
  jb_put(&b, s.u.s.p + i, s.u.s.n - i);
  return mkstr(x, &b);
}

/* str.format with {} / {0} / {name} fields and {{ }}; format specs and conversions refused. */
static jv str_format(jctx *x, jv s, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  jbuf b = {0};
  int auto_ix = 0;
  const char *p = s.u.s.p, *e = p + s.u.s.n;
  while (p < e) {
    if ((*p == '{' || *p == '}') && p + 1 < e && p[1] == *p) {
      jb_putc(&b, *p);
      p += 2;
      continue;
    }
    if (*p == '}') {
      free(b.p);
      return jx_fail(x, "single '}' encountered in format string");
    }
    if (*p != '{') {
      jb_putc(&b, *p++);
      continue;
    }
    const char *q = memchr(p, '}', (size_t)(e - p));
    if (!q) {
      free(b.p);
      return jx_fail(x, "single '{' encountered in format string");
    }
    const char *f = p + 1;
    size_t fn = (size_t)(q - f);
    if (memchr(f, ':', fn) || memchr(f, '!', fn) || memchr(f, '.', fn) || memchr(f, '[', fn)) {
      free(b.p);
      return jx_fail(x, "str.format fields with a format spec, conversion, attribute or index are not supported");
    }
    jv v = jv_undef(NULL);
    int found = 0;
    if (!fn || (f[0] >= '0' && f[0] <= '9')) {
      int ix = fn ? atoi(f) : auto_ix++;
      if (ix < nargs) v = args[ix], found = 1;
    } else
      for (int k = 0; k < nkw; k++)
        if (strlen(kwn[k]) == fn && !memcmp(kwn[k], f, fn)) v = kwv[k], found = 1;
    if (!found) {
      free(b.p);
      return jx_fail(x, "str.format: no argument for the field {%.*s}", (int)fn, f);
    }
    jv_str_to(&b, v);
    p = q + 1;
  }
  return mkstr(x, &b);
}

static jv kwarg(int pos, const char *name, jv dflt, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  if (pos >= 0 && pos < nargs) return args[pos];
  for (int k = 0; k < nkw; k++)
    if (!strcmp(kwn[k], name)) return kwv[k];
  return dflt;
}
#define ARG(pos, name, dflt) kwarg((pos), (name), (dflt), args, nargs, kwn, kwv, nkw)

static jv dict_method(jctx *x, const char *name, jv self, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  jdict *d = self.u.d;
  if (!strcmp(name, "get")) {
    if (nargs < 1) return jx_fail(x, "get expected at least 1 argument, got 0");
    int i = jd_find(d, args[0]);
    return i >= 0 ? d->v[i] : ARG(1, "default", jv_none());
  }
  if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
    jv l = jv_list(x->a, name[0] == 'k' ? JL_KEYS : name[0] == 'v' ? JL_VALUES : JL_ITEMS);
    for (size_t i = 0; i < d->n; i++) {
      if (name[0] == 'k') jl_push(x->a, l.u.l, d->k[i]);
      else if (name[0] == 'v') jl_push(x->a, l.u.l, d->v[i]);
      else {
        jv t = jv_list(x->a, 1);
        jl_push(x->a, t.u.l, d->k[i]);
        jl_push(x->a, t.u.l, d->v[i]);
        jl_push(x->a, l.u.l, t);
      }
    }
    return l;
  }
  return jx_fail(x, "'dict' object has no method '%s' that templates may call", name);
}

static jv str_method(jctx *x, const char *name, jv s, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  if (!strcmp(name, "strip")) return jf_strip(x, s, ARG(0, "chars", jv_none()), 1, 1);
  if (!strcmp(name, "lstrip")) return jf_strip(x, s, ARG(0, "chars", jv_none()), 1, 0);
  if (!strcmp(name, "rstrip")) return jf_strip(x, s, ARG(0, "chars", jv_none()), 0, 1);
  if (!strcmp(name, "split")) {
    jv sep = ARG(0, "sep", jv_none()), mx = ARG(1, "maxsplit", jv_int(-1));
    if (sep.t != JV_NONE && sep.t != JV_STR) return jx_fail(x, "must be str or None, not %s", jv_typename(sep));
    return str_split(x, s, sep, mx.t == JV_INT ? mx.u.i : -1);
  }
  if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
    if (nargs < 1) return jx_fail(x, "%s takes at least 1 argument", name);
    int end = name[0] == 'e';
    if (args[0].t == JV_LIST && args[0].u.l->kind == JL_TUPLE) {
      for (size_t i = 0; i < args[0].u.l->n; i++)
        if (affix(s, args[0].u.l->v[i], end)) return jv_bool(1);
      return jv_bool(0);
    }
    if (args[0].t != JV_STR) return jx_fail(x, "%s first arg must be str or a tuple of str, not %s", name, jv_typename(args[0]));
    return jv_bool(affix(s, args[0], end));
  }
  if (!strcmp(name, "upper")) return jf_case(x, s, 'u');
  if (!strcmp(name, "lower")) return jf_case(x, s, 'l');
  if (!strcmp(name, "title")) return jf_case(x, s, 'T');
  if (!strcmp(name, "capitalize")) return jf_case(x, s, 'c');
  if (!strcmp(name, "replace")) {
    if (nargs < 2) return jx_fail(x, "replace expected at least 2 arguments");
    jv c = ARG(2, "count", jv_int(-1));
    return str_replace(x, s, args[0], args[1], c.t == JV_INT ? c.u.i : -1);
  }
  if (!strcmp(name, "find") || !strcmp(name, "count")) {
    if (nargs < 1 || args[0].t != JV_STR) return jx_fail(x, "%s needs a str argument", name);
    jv sub = args[0];
    int64_t cnt = 0;
    const char *hit;
    if (!sub.u.s.n) return jv_int(name[0] == 'f' ? 0 : (int64_t)ju_len(s.u.s.p, s.u.s.n) + 1);
    for (size_t i = 0; (hit = memmem(s.u.s.p + i, s.u.s.n - i, sub.u.s.p, sub.u.s.n)); cnt++) {
      if (name[0] == 'f') return jv_int((int64_t)ju_len(s.u.s.p, (size_t)(hit - s.u.s.p)));
      i = (size_t)(hit - s.u.s.p) + sub.u.s.n;
    }
    return jv_int(name[0] == 'f' ? -1 : cnt);
  }
  if (!strcmp(name, "format")) return str_format(x, s, args, nargs, kwn, kwv, nkw);
  if (!strcmp(name, "join")) {
    if (nargs < 1) return jx_fail(x, "join takes exactly one argument");
    jv items = jx_iterable(x, args[0]);
    if (x->rc) return items;
    jbuf b = {0};
    for (size_t i = 0; i < items.u.l->n; i++) {
      if (items.u.l->v[i].t != JV_STR) {
        free(b.p);
        return jx_fail(x, "sequence item %zu: expected str instance, %s found", i, jv_typename(items.u.l->v[i]));
      }
      if (i) jb_put(&b, s.u.s.p, s.u.s.n);
      jb_put(&b, items.u.l->v[i].u.s.p, items.u.l->v[i].u.s.n);
    }
    return mkstr(x, &b);
  }
  if (!strcmp(name, "splitlines")) {
    jv l = jv_list(x->a, 0);
    size_t st = 0, i = 0;
    while (i < s.u.s.n) {
      char c = s.u.s.p[i];
      if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) {
        jl_push(x->a, l.u.l, jv_str(s.u.s.p + st, i - st));
        i += (c == '\r' && i + 1 < s.u.s.n && s.u.s.p[i + 1] == '\n') ? 2 : 1;
        st = i;
      } else i++;
    }
    if (st < s.u.s.n) jl_push(x->a, l.u.l, jv_str(s.u.s.p + st, s.u.s.n - st));
    return l;
  }
  return jx_fail(x, "'str' object has no method '%s' that templates may call", name);
}

jv jf_method(jctx *x, const char *name, jv self, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  if (self.t == JV_STR) return str_method(x, name, self, args, nargs, kwn, kwv, nkw);
  if (self.t == JV_DICT && !self.u.d->ns) return dict_method(x, name, self, args, nargs, kwn, kwv, nkw);
  if (self.t == JV_LIST || self.t == JV_DICT)   /* jinja2's ImmutableSandboxedEnvironment */
    return jx_fail(x, "access to attribute '%s' of '%s' object is unsafe (templates render in an immutable sandbox)",
                   name, jv_typename(self));
  return jx_fail(x, "'%s' object has no attribute '%s'", jv_typename(self), name);
}

jv jf_function(jctx *x, const char *name, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  if (!strcmp(name, "raise_exception")) {
    jbuf b = {0};
    if (nargs) jv_str_to(&b, args[0]);
    jv msg = mkstr(x, &b);
    return jx_fail(x, "the template refused: %.*s", (int)msg.u.s.n, msg.u.s.p);
  }
  if (!strcmp(name, "strftime_now")) {
    if (nargs < 1 || args[0].t != JV_STR) return jx_fail(x, "strftime_now needs a format string");
    char fmt[128], out[256];
    snprintf(fmt, sizeof fmt, "%.*s", (int)args[0].u.s.n, args[0].u.s.p);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    size_t k = strftime(out, sizeof out, fmt, &tm);
    char *s = ja_strndup(x->a, out, k);
    return s ? jv_str(s, k) : jx_fail(x, "out of memory");
  }
  if (!strcmp(name, "range")) {
    int64_t a = 0, b = 0, st = 1;
    for (int i = 0; i < nargs; i++)
      if (args[i].t != JV_INT && args[i].t != JV_BOOL) return jx_fail(x, "range() takes integers, not %s", jv_typename(args[i]));
    if (nargs == 1) b = args[0].u.i;
    else if (nargs >= 2) a = args[0].u.i, b = args[1].u.i;
    if (nargs >= 3) st = args[2].u.i;
    if (nargs < 1 || nargs > 3) return jx_fail(x, "range expected 1 to 3 arguments, got %d", nargs);
    if (st == 0) return jx_fail(x, "range() arg 3 must not be zero");
    int64_t cnt = st > 0 ? (b > a ? (b - a + st - 1) / st : 0) : (a > b ? (a - b - st - 1) / -st : 0);
    if (cnt > 100000) return jx_fail(x, "range() of more than 100000 items (the sandbox's limit)");
    jv l = jv_list(x->a, 0);
    for (int64_t i = 0; i < cnt; i++) jl_push(x->a, l.u.l, jv_int(a + i * st));
    return l;
  }
  /* namespace(...) and dict(...): keyword arguments (and a dict given positionally) */
  jv d = jv_dict(x->a);
  if (d.t != JV_DICT) return jx_fail(x, "out of memory");
  d.u.d->ns = name[0] == 'n';
  if (nargs > 1) return jx_fail(x, "%s expected at most 1 positional argument", name);
  if (nargs == 1) {
    if (args[0].t != JV_DICT) return jx_fail(x, "%s() takes a dict positionally, not %s", name, jv_typename(args[0]));
    for (size_t i = 0; i < args[0].u.d->n; i++) jd_set(x->a, d.u.d, args[0].u.d->k[i], args[0].u.d->v[i]);
  }
  for (int k = 0; k < nkw; k++) jd_set(x->a, d.u.d, jv_cstr(kwn[k]), kwv[k]);
  return d;
}
