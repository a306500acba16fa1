/* jinja_eval — the syntax tree evaluated against the variables, as jinja2 does: scopes (a for
 * loop's body gets a fresh scope per iteration that reads through to the enclosing one; if blocks
 * share their scope; a macro's scope reads through to the template's top level), loop.*, loop
 * filters and else, break/continue, namespace attributes, macros with defaults and keyword
 * arguments, block set, filter blocks and {% generation %} spans. One render at a time per jctx;
 * the template is only read. */
#define _GNU_SOURCE   /* memmem */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_priv.h"

struct jframe {
  jframe *parent;
  const char **k;
  jv *v;
  int n, cap;
};

jv jx_fail(jctx *x, const char *fmt, ...) {
  if (x->rc == FSDP_OK) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    x->rc = fsdp_set_error(FSDP_ERR_INVALID, "%s: template line %d: %s", x->t->name, x->line, msg);
  }
  return jv_undef(NULL);
}

static jframe *frame_new(jctx *x, jframe *parent) {
  jframe *f = ja_alloc(x->a, sizeof *f);
  if (f) f->parent = parent;
  else jx_fail(x, "out of memory");
  return f;
}

static void frame_set(jctx *x, jframe *f, const char *k, jv v) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->k[i], k)) {
      f->v[i] = v;
      return;
    }
  if (f->n == f->cap) {
    int cap = f->cap ? 2 * f->cap : 8;
    const char **nk = ja_alloc(x->a, (size_t)cap * sizeof *nk);
    jv *nv = ja_alloc(x->a, (size_t)cap * sizeof *nv);
    if (!nk || !nv) {
      jx_fail(x, "out of memory");
      return;
    }
    if (f->n) memcpy(nk, f->k, (size_t)f->n * sizeof *nk), memcpy(nv, f->v, (size_t)f->n * sizeof *nv);
    f->k = nk;
    f->v = nv;
    f->cap = cap;
  }
  f->k[f->n] = k;
  f->v[f->n++] = v;
}

static int frame_get(const jframe *f, const char *k, jv *out) {
  for (; f; f = f->parent)
    for (int i = f->n - 1; i >= 0; i--)
      if (!strcmp(f->k[i], k)) {
        *out = f->v[i];
        return 1;
      }
  return 0;
}

static int exec_body(jctx *x, jframe *f, const jnodes *b);

static const char *undef_name(jv v) { return v.uname ? v.uname : "value"; }

static int is_num(jv v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
static double num(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)v.u.i; }

static jv str_concat(jctx *x, jv a, jv b) {
  char *s = ja_alloc(x->a, a.u.s.n + b.u.s.n + 1);
  if (!s) return jx_fail(x, "out of memory");
  memcpy(s, a.u.s.p, a.u.s.n);
  memcpy(s + a.u.s.n, b.u.s.p, b.u.s.n);
  return jv_str(s, a.u.s.n + b.u.s.n);
}

static jv repeat(jctx *x, jv s, int64_t k) {
  if (k < 0) k = 0;
  if (s.t == JV_STR) {
    if (k && s.u.s.n > (size_t)(64u << 20) / (size_t)k) return jx_fail(x, "a string repeated beyond 64 MiB");
    char *p = ja_alloc(x->a, s.u.s.n * (size_t)k + 1);
    if (!p) return jx_fail(x, "out of memory");
    for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
    jv r = jv_str(p, s.u.s.n * (size_t)k);
    r.markup = s.markup;
    return r;
  }
  if (k && s.u.l->n > (size_t)(1u << 20) / (size_t)k) return jx_fail(x, "a list repeated beyond 2^20 items");
  jv l = jv_list(x->a, s.u.l->kind);
  for (int64_t i = 0; i < k; i++)
    for (size_t j = 0; j < s.u.l->n; j++) jl_push(x->a, l.u.l, s.u.l->v[j]);
  return l;
}

static jv binop(jctx *x, int op, jv a, jv b) {
  if (op == '~') {
    jv sa = jv_to_string(x->a, a), sb = jv_to_string(x->a, b);
    return str_concat(x, sa, sb);
  }
  if (a.t == JV_UNDEF) return jx_fail(x, "'%s' is undefined", undef_name(a));
  if (b.t == JV_UNDEF) return jx_fail(x, "'%s' is undefined", undef_name(b));
  if (is_num(a) && is_num(b)) {
    int ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
    int64_t i = a.u.i, j = b.u.i;
    double p = num(a), q = num(b);
    switch (op) {
    case '+': return ints ? jv_int(i + j) : jv_float(p + q);
    case '-': return ints ? jv_int(i - j) : jv_float(p - q);
    case '*': return ints ? jv_int(i * j) : jv_float(p * q);
    case '/':
      if (q == 0) return jx_fail(x, "division by zero");
      return jv_float(p / q);
    case 'F':
    case '%':
      if (q == 0) return jx_fail(x, "integer division or modulo by zero");
      if (ints) {
        int64_t d = i / j, m = i % j;
        if (m && ((m < 0) != (j < 0))) d--, m += j;
        return op == 'F' ? jv_int(d) : jv_int(m);
      } else {
        double m = fmod(p, q);
        if (m && ((m < 0) != (q < 0))) m += q;
        return op == 'F' ? jv_float(floor(p / q)) : jv_float(m);
      }
    case 'P':
      if (ints && j >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < j && k < 64; k++) r *= i;
        return jv_int(r);
      }
      return jv_float(pow(p, q));
    }
  }
  if (op == '+' && a.t == JV_STR && b.t == JV_STR) {
    if (a.markup != b.markup) {   /* Markup + str escapes the str, and the sum is Markup */
      a = jv_escape(x->a, a);
      b = jv_escape(x->a, b);
    }
    jv r = str_concat(x, a, b);
    r.markup = a.markup;
    return r;
  }
  if (op == '+' && a.t == JV_LIST && b.t == JV_LIST && JL_SEQ(a.u.l) && a.u.l->kind == b.u.l->kind) {
    jv l = jv_list(x->a, a.u.l->kind);
    for (size_t k = 0; k < a.u.l->n; k++) jl_push(x->a, l.u.l, a.u.l->v[k]);
    for (size_t k = 0; k < b.u.l->n; k++) jl_push(x->a, l.u.l, b.u.l->v[k]);
    return l;
  }
  if (op == '*' && (a.t == JV_STR || (a.t == JV_LIST && JL_SEQ(a.u.l))) && (b.t == JV_INT || b.t == JV_BOOL)) return repeat(x, a, b.u.i);
  if (op == '*' && (b.t == JV_STR || (b.t == JV_LIST && JL_SEQ(b.u.l))) && (a.t == JV_INT || a.t == JV_BOOL)) return repeat(x, b, a.u.i);
  if (op == '%' && a.t == JV_STR) return jx_fail(x, "string formatting with '%%' is not supported");
  static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
  const char *sym = names[strchr("+-*/F%P", op) - "+-*/F%P"];
  return jx_fail(x, "unsupported operand type(s) for %s: '%s' and '%s'", sym, jv_typename(a), jv_typename(b));
}

static int contains(jctx *x, jv hay, jv needle) {
  switch (hay.t) {
  case JV_STR:
    if (needle.t != JV_STR) {
      jx_fail(x, "'in <string>' requires string as left operand, not %s", jv_typename(needle));
      return 0;
    }
    return !needle.u.s.n || memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
  case JV_LIST: {
    jv items = jx_iterable(x, hay);
    for (size_t i = 0; i < items.u.l->n; i++)
      if (jv_eq(items.u.l->v[i], needle)) return 1;
    return 0;
  }
  case JV_DICT: return jd_find(hay.u.d, needle) >= 0;
  case JV_UNDEF: return 0;
  default: jx_fail(x, "argument of type '%s' is not iterable", jv_typename(hay)); return 0;
  }
}

static jv compare(jctx *x, jframe *f, const jnode *n) {
  jv a = jx_eval(x, f, n->args.v[0]);
  for (int i = 0; n->cmpops[i] && !x->rc; i++) {
    jv b = jx_eval(x, f, n->args.v[i + 1]);
    char op = n->cmpops[i];
    int r;
    if (op == '=' || op == '!') r = jv_eq(a, b) == (op == '=');
    else if (op == 'i' || op == 'n') r = contains(x, b, a) == (op == 'i');
    else {
      int ok;
      int c = jv_cmp(a, b, &ok);
      if (!ok) {
        static const char *const s[] = {"<", ">", "<=", ">="};
        return jx_fail(x, "'%s' not supported between instances of '%s' and '%s'", s[strchr("<>lg", op) - "<>lg"],
                       jv_typename(a), jv_typename(b));
      }
      r = op == '<' ? c < 0 : op == '>' ? c > 0 : op == 'l' ? c <= 0 : c >= 0;
    }
    if (!r) return jv_bool(0);
    a = b;
  }
  return jv_bool(1);
}

/* Python's slice(a, b, c).indices(len). */
static void slice_indices(int64_t len, const jv *a, const jv *b, int64_t step, int64_t *start, int64_t *stop) {
  int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? len - 1 : len;
  *start = step < 0 ? hi : lo;
  *stop = step < 0 ? lo : hi;
  if (a->t == JV_INT || a->t == JV_BOOL) {
    *start = a->u.i < 0 ? a->u.i + len : a->u.i;
    if (*start < lo) *start = lo;
    if (*start > hi) *start = hi;
  }
  if (b->t == JV_INT || b->t == JV_BOOL) {
    *stop = b->u.i < 0 ? b->u.i + len : b->u.i;
    if (*stop < lo) *stop = lo;
    if (*stop > hi) *stop = hi;
  }
}

static jv slice(jctx *x, jframe *f, const jnode *n) {
  jv obj = jx_eval(x, f, n->a);
  jv a = n->b ? jx_eval(x, f, n->b) : jv_none(), b = n->c ? jx_eval(x, f, n->c) : jv_none();
  jv c = n->args.n ? jx_eval(x, f, n->args.v[0]) : jv_none();
  if (x->rc) return jv_undef(NULL);
  if (obj.t == JV_UNDEF) return jx_fail(x, "'%s' is undefined", undef_name(obj));
  int64_t step = c.t == JV_INT ? c.u.i : 1;
  if (step == 0) return jx_fail(x, "slice step cannot be zero");
  for (int k = 0; k < 3; k++) {
    jv v = k == 0 ? a : k == 1 ? b : c;
    if (v.t != JV_NONE && v.t != JV_INT && v.t != JV_BOOL) return jx_fail(x, "slice indices must be integers or None");
  }
  int64_t start, stop;
  if (obj.t == JV_LIST && JL_SEQ(obj.u.l)) {
    slice_indices((int64_t)obj.u.l->n, &a, &b, step, &start, &stop);
    jv l = jv_list(x->a, obj.u.l->kind);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) jl_push(x->a, l.u.l, obj.u.l->v[i]);
    return l;
  }
  if (obj.t == JV_STR) {
    const char *s = obj.u.s.p;
    size_t n0 = obj.u.s.n, len = ju_len(s, n0);
    slice_indices((int64_t)len, &a, &b, step, &start, &stop);
    if (step == 1) {
      if (stop <= start) return jv_str("", 0);
      size_t o = ju_off(s, n0, (size_t)start), e = ju_off(s, n0, (size_t)stop);
      return jv_str(s + o, e - o);
    }
    jbuf out = {0};
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      size_t o = ju_off(s, n0, (size_t)i), e = ju_off(s, n0, (size_t)i + 1);
      jb_put(&out, s + o, e - o);
    }
    char *p = ja_strndup(x->a, out.p ? out.p : "", out.n);
    size_t pn = out.n;
    free(out.p);
    return p ? jv_str(p, pn) : jx_fail(x, "out of memory");
  }
  return jx_fail(x, "'%s' object is not subscriptable", jv_typename(obj));
}

static jv getitem(jctx *x, jv obj, jv key, const char *label) {
  if (obj.t == JV_UNDEF) return jx_fail(x, "'%s' is undefined", undef_name(obj));
  if (obj.t == JV_DICT) {
    int i = jd_find(obj.u.d, key);
    return i >= 0 ? obj.u.d->v[i] : jv_undef(label);
  }
  if (obj.t == JV_LIST && !JL_SEQ(obj.u.l)) return jx_fail(x, "'%s' object is not subscriptable", jv_typename(obj));
  if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
    int64_t len = obj.t == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)ju_len(obj.u.s.p, obj.u.s.n);
    int64_t i = key.u.i < 0 ? key.u.i + len : key.u.i;
    if (i < 0 || i >= len) return jv_undef(label);
    if (obj.t == JV_LIST) return obj.u.l->v[i];
    size_t o = ju_off(obj.u.s.p, obj.u.s.n, (size_t)i), e = ju_off(obj.u.s.p, obj.u.s.n, (size_t)i + 1);
    return jv_str(obj.u.s.p + o, e - o);
  }
  return jv_undef(label);
}

/* Arguments and keyword arguments of a call, evaluated into arena arrays. */
static int eval_args(jctx *x, jframe *f, const jnode *n, jv **args, jv **kwv) {
  *args = ja_alloc(x->a, (size_t)(n->args.n + 1) * sizeof **args);
  *kwv = ja_alloc(x->a, (size_t)(n->kwv.n + 1) * sizeof **kwv);
  if (!*args || !*kwv) {
    jx_fail(x, "out of memory");
    return -1;
  }
  for (int i = 0; i < n->args.n; i++) (*args)[i] = jx_eval(x, f, n->args.v[i]);
  for (int i = 0; i < n->kwv.n; i++) (*kwv)[i] = jx_eval(x, f, n->kwv.v[i]);
  return x->rc ? -1 : 0;
}

static jv call(jctx *x, jframe *f, const jnode *n) {
  jv *args, *kwv;
  if (eval_args(x, f, n, &args, &kwv)) return jv_undef(NULL);
  int line = x->line;
  jv fn;
  jv r;
  int found = frame_get(f, n->name, &fn);
  if (found && fn.t == JV_MACRO) r = jx_call_macro(x, fn.u.m, args, n->args.n, n->kwn, kwv, n->kwv.n);
  else if (found && fn.t == JV_FUNC) r = jf_function(x, fn.u.s.p, args, n->args.n, n->kwn, kwv, n->kwv.n);
  else if (!found && jf_is_function(n->name)) r = jf_function(x, n->name, args, n->args.n, n->kwn, kwv, n->kwv.n);
  else r = jx_fail(x, "'%s' is undefined or not callable", n->name);
  x->line = line;
  return r;
}

static jv eval_in(jctx *x, jframe *f, const jnode *n) {
  switch (n->kind) {
  case JN_LIT: return n->lit;
  case JN_NAME: {
    jv v;
    if (frame_get(f, n->name, &v)) return v;
    if (jf_is_function(n->name)) {
      jv fn = {.t = JV_FUNC, .u.s = {n->name, strlen(n->name)}};
      return fn;
    }
    return jv_undef(n->name);
  }
  case JN_ATTR: {
    jv o = jx_eval(x, f, n->a);
    if (x->rc) return o;
    if (o.t == JV_UNDEF) return jx_fail(x, "'%s' is undefined", undef_name(o));
    return getitem(x, o, jv_cstr(n->name), n->name);
  }
  case JN_ITEM: {
    jv o = jx_eval(x, f, n->a), k = jx_eval(x, f, n->b);
    return x->rc ? jv_undef(NULL) : getitem(x, o, k, k.t == JV_STR ? k.u.s.p : "item");
  }
  case JN_SLICE: return slice(x, f, n);
  case JN_CALL: return call(x, f, n);
  case JN_METHOD: {
    jv o = jx_eval(x, f, n->a), *args, *kwv;
    if (x->rc || eval_args(x, f, n, &args, &kwv)) return jv_undef(NULL);
    x->line = n->line;
    if (o.t == JV_UNDEF) return jx_fail(x, "'%s' is undefined", undef_name(o));
    return jf_method(x, n->name, o, args, n->args.n, n->kwn, kwv, n->kwv.n);
  }
  case JN_FILTER: {
    jv v = n->a ? jx_eval(x, f, n->a) : x->blockval, *args, *kwv;
    if (x->rc || eval_args(x, f, n, &args, &kwv)) return jv_undef(NULL);
    x->line = n->line;
    return jf_filter(x, n->name, v, args, n->args.n, n->kwn, kwv, n->kwv.n);
  }
  case JN_TEST: {
    jv v = jx_eval(x, f, n->a), *args, *kwv;
    if (x->rc || eval_args(x, f, n, &args, &kwv)) return jv_undef(NULL);
    x->line = n->line;
    int r = jf_test(x, n->name, v, args, n->args.n);
    return r < 0 ? jv_undef(NULL) : jv_bool(r != n->op);
  }
  case JN_NEG:
  case JN_POS: {
    jv v = jx_eval(x, f, n->a);
    if (x->rc) return v;
    if (!is_num(v)) return jx_fail(x, "bad operand type for unary %c: '%s'", n->kind == JN_NEG ? '-' : '+', jv_typename(v));
    if (n->kind == JN_POS) return v.t == JV_BOOL ? jv_int(v.u.i) : v;
    return v.t == JV_FLOAT ? jv_float(-v.u.f) : jv_int(-v.u.i);
  }
  case JN_NOT: return jv_bool(!jv_truthy(jx_eval(x, f, n->a)));
  case JN_AND: {
    jv a = jx_eval(x, f, n->a);
    return jv_truthy(a) ? jx_eval(x, f, n->b) : a;
  }
  case JN_OR: {
    jv a = jx_eval(x, f, n->a);
    return jv_truthy(a) || x->rc ? a : jx_eval(x, f, n->b);
  }
  case JN_BIN: {
    jv a = jx_eval(x, f, n->a), b = jx_eval(x, f, n->b);
    x->line = n->line;
    return x->rc ? jv_undef(NULL) : binop(x, n->op, a, b);
  }
  case JN_CMP: return compare(x, f, n);
  case JN_COND:
    if (jv_truthy(jx_eval(x, f, n->b))) return jx_eval(x, f, n->a);
    return n->c ? jx_eval(x, f, n->c) : jv_undef(NULL);
  case JN_LIST:
  case JN_TUPLE: {
    jv l = jv_list(x->a, n->kind == JN_TUPLE);
    if (l.t != JV_LIST) return jx_fail(x, "out of memory");
    for (int i = 0; i < n->args.n; i++) jl_push(x->a, l.u.l, jx_eval(x, f, n->args.v[i]));
    return l;
  }
  case JN_DICT: {
    jv d = jv_dict(x->a);
    if (d.t != JV_DICT) return jx_fail(x, "out of memory");
    for (int i = 0; i < n->args.n; i++) jd_set(x->a, d.u.d, jx_eval(x, f, n->args.v[i]), jx_eval(x, f, n->kwv.v[i]));
    return d;
  }
  default: return jx_fail(x, "internal: not an expression");
  }
}

jv jx_eval(jctx *x, jframe *f, const jnode *n) {
  if (x->rc) return jv_undef(NULL);
  x->line = n->line;
  jv v = eval_in(x, f, n);
  if (x->a->failed == 2) return jx_fail(x, "the template needed more than %zu MiB for its values", JINJA_MAX_MEMORY >> 20);
  if (x->a->failed) return jx_fail(x, "out of memory");
  return v;
}

/* ---- statements ---- */
enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static void output(jctx *x, jv v) {
  if (v.t == JV_LIST && v.u.l->kind == JL_GEN) {
    jx_fail(x, "printing a generator (a map, select or reverse result without |list) is not supported");
    return;
  }
  jv_str_to(x->out, v);
  if (x->out->failed) jx_fail(x, "out of memory");
}

/* The items a for loop or a filter iterates: a list's items, a dict's keys, a string's characters. */
jv jx_iterable(jctx *x, jv v) {
  if (v.t == JV_LIST && v.u.l->kind != JL_GEN) return v;
  jv l = jv_list(x->a, 0);
  if (l.t != JV_LIST) return jx_fail(x, "out of memory");
  if (v.t == JV_LIST) {   /* a generator is read once */
    for (size_t i = v.u.l->pos; i < v.u.l->n; i++) jl_push(x->a, l.u.l, v.u.l->v[i]);
    v.u.l->pos = v.u.l->n;
    return l;
  }
  if (v.t == JV_DICT && !v.u.d->ns)
    for (size_t i = 0; i < v.u.d->n; i++) jl_push(x->a, l.u.l, v.u.d->k[i]);
  else if (v.t == JV_STR)
    for (size_t i = 0; i < v.u.s.n;) {
      int len;
      ju_get(v.u.s.p + i, v.u.s.n - i, &len);
      jl_push(x->a, l.u.l, jv_str(v.u.s.p + i, (size_t)len));
      i += (size_t)len;
    }
  else if (v.t != JV_UNDEF) return jx_fail(x, "'%s' object is not iterable", jv_typename(v));
  return l;
}

static int bind_targets(jctx *x, jframe *f, const jnode *n, jv item) {
  if (n->ntargets == 1) {
    frame_set(x, f, n->targets[0], item);
    return 0;
  }
  jv parts = item.t == JV_LIST ? item : jx_iterable(x, item);
  if (x->rc) return -1;
  if ((int)parts.u.l->n != n->ntargets) {
    jx_fail(x, "cannot unpack %zu values into %d loop variables", parts.u.l->n, n->ntargets);
    return -1;
  }
  for (int i = 0; i < n->ntargets; i++) frame_set(x, f, n->targets[i], parts.u.l->v[i]);
  return 0;
}

static void loop_object(jctx *x, jframe *f, jlist *items, size_t i) {
  jv d = jv_dict(x->a);
  if (d.t != JV_DICT) return;
  size_t n = items->n;
  jdict *o = d.u.d;
  jd_set(x->a, o, jv_cstr("index"), jv_int((int64_t)i + 1));
  jd_set(x->a, o, jv_cstr("index0"), jv_int((int64_t)i));
  jd_set(x->a, o, jv_cstr("revindex"), jv_int((int64_t)(n - i)));
  jd_set(x->a, o, jv_cstr("revindex0"), jv_int((int64_t)(n - i - 1)));
  jd_set(x->a, o, jv_cstr("first"), jv_bool(i == 0));
  jd_set(x->a, o, jv_cstr("last"), jv_bool(i + 1 == n));
  jd_set(x->a, o, jv_cstr("length"), jv_int((int64_t)n));
  jd_set(x->a, o, jv_cstr("depth"), jv_int(1));
  jd_set(x->a, o, jv_cstr("depth0"), jv_int(0));
  jd_set(x->a, o, jv_cstr("previtem"), i ? items->v[i - 1] : jv_undef("previtem"));
  jd_set(x->a, o, jv_cstr("nextitem"), i + 1 < n ? items->v[i + 1] : jv_undef("nextitem"));
  frame_set(x, f, "loop", d);
}

static void exec_for(jctx *x, jframe *f, const jnode *n) {
  jv it = jx_eval(x, f, n->a);
  if (x->rc) return;
  jv all = jx_iterable(x, it);
  if (x->rc) return;
  jlist *items = all.u.l;
  if (n->b) {   /* {% for x in xs if cond %}: loop.* counts the items that pass */
    jv kept = jv_list(x->a, 0);
    for (size_t i = 0; i < all.u.l->n && !x->rc; i++) {
      jframe *g = frame_new(x, f);
      if (!g || bind_targets(x, g, n, all.u.l->v[i])) return;
      if (jv_truthy(jx_eval(x, g, n->b))) jl_push(x->a, kept.u.l, all.u.l->v[i]);
    }
    items = kept.u.l;
  }
  if (!items->n) {
    exec_body(x, f, &n->orelse);
    return;
  }
  for (size_t i = 0; i < items->n && !x->rc; i++) {
    jframe *g = frame_new(x, f);
    if (!g || bind_targets(x, g, n, items->v[i])) return;
    loop_object(x, g, items, i);
    if (exec_body(x, g, &n->body) == FLOW_BREAK) break;
  }
}

/* Render BODY into a buffer of its own (a macro, a block set, a filter block). */
static jv capture(jctx *x, jframe *f, const jnodes *body) {
  jbuf b = {0}, *saved = x->out;
  x->out = &b;
  x->capture++;
  exec_body(x, f, body);
  x->capture--;
  x->out = saved;
  char *s = b.failed ? NULL : ja_strndup(x->a, b.p ? b.p : "", b.n);
  size_t n = b.n;
  free(b.p);
  if (!s) return jx_fail(x, "out of memory");
  return jv_str(s, n);
}

jv jx_call_macro(jctx *x, const jnode *m, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
  if (nargs > m->args.n)
    return jx_fail(x, "macro '%s' takes not more than %d argument(s)", m->name, m->args.n);
  if (x->depth >= 100) return jx_fail(x, "macro calls nested more than 100 deep");
  jframe *g = frame_new(x, x->globals);
  if (!g) return jv_undef(NULL);
  for (int k = 0; k < nkw; k++) {
    int found = 0;
    for (int i = 0; i < m->args.n && !found; i++) found = !strcmp(m->args.v[i]->name, kwn[k]);
    if (!found) return jx_fail(x, "macro '%s' has no parameter named '%s'", m->name, kwn[k]);
  }
  for (int i = 0; i < m->args.n && !x->rc; i++) {
    const jnode *p = m->args.v[i];
    jv v = jv_undef(p->name);
    int given = 0;
    if (i < nargs) v = args[i], given = 1;
    for (int k = 0; k < nkw; k++)
      if (!strcmp(kwn[k], p->name)) {
        if (given) return jx_fail(x, "macro '%s' got multiple values for argument '%s'", m->name, p->name);
        v = kwv[k], given = 1;
      }
    if (!given && p->a) v = jx_eval(x, g, p->a);
    frame_set(x, g, p->name, v);
  }
  x->depth++;
  jv r = capture(x, g, &m->body);
  x->depth--;
  return r;
}

static void exec_set(jctx *x, jframe *f, const jnode *n) {
  jv v = jx_eval(x, f, n->a);
  if (x->rc) return;
  if (!n->name2) {
    frame_set(x, f, n->name, v);
    return;
  }
  jv ns;
  if (!frame_get(f, n->name, &ns) || ns.t != JV_DICT || !ns.u.d->ns) {
    jx_fail(x, "cannot assign attribute on non-namespace object '%s'", n->name);
    return;
  }
  jd_set(x->a, ns.u.d, jv_cstr(n->name2), v);
}

static void exec_generation(jctx *x, jframe *f, const jnode *n) {
  if (x->capture) {
    jx_fail(x, "a {%% generation %%} block inside a macro, block set or filter block is not supported");
    return;
  }
  size_t start = x->out->n;
  jframe *g = frame_new(x, f);   /* transformers runs the block as a call block: a scope of its own */
  if (!g) return;
  exec_body(x, g, &n->body);
  if (x->rc) return;
  if (x->nspans == x->capspans) {
    size_t cap = x->capspans ? 2 * x->capspans : 8;
    jinja_span *s = realloc(x->spans, cap * sizeof *s);
    if (!s) {
      jx_fail(x, "out of memory");
      return;
    }
    x->spans = s;
    x->capspans = cap;
  }
  x->spans[x->nspans++] = (jinja_span){start, x->out->n};
}

static int exec_one(jctx *x, jframe *f, const jnode *n) {
  x->line = n->line;
  if (++x->steps > JINJA_MAX_STEPS) {
    jx_fail(x, "the template ran more than %d statements (a loop that does not end?)", JINJA_MAX_STEPS);
    return FLOW_NEXT;
  }
  switch (n->kind) {
  case JN_TEXT: jb_put(x->out, n->lit.u.s.p, n->lit.u.s.n); break;
  case JN_OUT: {
    jv v = jx_eval(x, f, n->a);
    if (!x->rc) output(x, v);
    break;
  }
  case JN_IF:
    for (int i = 0; i < n->args.n; i++) {
      jv c = jx_eval(x, f, n->args.v[i]);
      if (x->rc) return FLOW_NEXT;
      if (jv_truthy(c)) return exec_body(x, f, &n->bodies[i]);
    }
    return exec_body(x, f, &n->orelse);
  case JN_FOR: exec_for(x, f, n); break;
  case JN_SET: exec_set(x, f, n); break;
  case JN_SETBLOCK: {
    jv v = capture(x, f, &n->body);
    if (!x->rc) frame_set(x, f, n->name, v);
    break;
  }
  case JN_MACRO: {
    jv m = {.t = JV_MACRO, .u.m = n};
    frame_set(x, f, n->name, m);
    break;
  }
  case JN_BREAK: return FLOW_BREAK;
  case JN_CONTINUE: return FLOW_CONTINUE;
  case JN_GENERATION: exec_generation(x, f, n); break;
  case JN_FILTERBLOCK: {
    jv saved = x->blockval;
    x->blockval = capture(x, f, &n->body);
    jv v = x->rc ? x->blockval : jx_eval(x, f, n->a);
    x->blockval = saved;
    if (!x->rc) output(x, v);
    break;
  }
  default: jx_fail(x, "internal: not a statement");
  }
  return FLOW_NEXT;
}

/* Statements in order; a break or continue ends the body and is passed up to its loop. */
static int exec_body(jctx *x, jframe *f, const jnodes *b) {
  for (int i = 0; i < b->n && !x->rc; i++) {
    int flow = exec_one(x, f, b->v[i]);
    if (x->out->failed) jx_fail(x, "out of memory");
    if (x->out->n > JINJA_MAX_OUTPUT) jx_fail(x, "the template wrote more than %d MiB", JINJA_MAX_OUTPUT >> 20);
    if (flow != FLOW_NEXT) return flow;
  }
  return FLOW_NEXT;
}

fsdp_status jinja_render(const jinja_tmpl *t, const json_t *vars, char **out, size_t *outlen, jinja_span **spans,
                         size_t *nspans) {
  *out = NULL;
  *outlen = 0;
  if (spans) *spans = NULL;
  if (nspans) *nspans = 0;
  if (vars && !json_is_object(vars)) return fsdp_set_error(FSDP_ERR_INVALID, "a template's variables must be a JSON object");
  ja_arena a = {.limit = JINJA_MAX_MEMORY};
  jbuf b = {0};
  jctx x = {.a = &a, .t = t, .out = &b};
  x.globals = frame_new(&x, NULL);
  const char *k;
  json_t *v;
  if (vars && x.globals)
    json_object_foreach((json_t *)vars, k, v) {
      char *key = ja_strndup(&a, k, strlen(k));
      if (!key) {
        jx_fail(&x, "out of memory");
        break;
      }
      frame_set(&x, x.globals, key, jv_from_json(&a, v));
    }
  if (!x.rc) exec_body(&x, x.globals, &t->body);
  if (!x.rc && (b.failed || a.failed)) jx_fail(&x, "out of memory");
  ja_free(&a);
  if (x.rc) {
    free(b.p);
    free(x.spans);
    return x.rc;
  }
  *out = b.p ? b.p : strdup("");
  if (!*out) {
    free(x.spans);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory rendering a template");
  }
  *outlen = b.n;
  if (spans) *spans = x.spans;
  else free(x.spans);
  if (nspans) *nspans = x.nspans;
  return FSDP_OK;
}
