/* jinja_parse — tokens to the syntax tree, with jinja2's grammar and operator precedence
 * (condexpr < or < and < not < compare < + - < ~ < * / // % < ** < unary < postfix, filters and
 * tests), and the refusal at load of every construct the evaluator does not render: one line
 * naming it and its template line. Called by jinja_load() only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_priv.h"

typedef struct parser {
  jinja_tmpl *t;
  const jtok *k;
  size_t n, i;
  fsdp_status rc;
  /* macro names defined anywhere and names called: checked once the whole tree is read */
  const char **called;
  int *called_line;
  int ncalled, capcalled;
  const char **macros;
  int nmacros, capmacros;
  int depth;   /* expression nesting, bounded so that no input overflows the stack */
} parser;

static const jtok *cur(parser *P) { return &P->k[P->i < P->n ? P->i : P->n - 1]; }
static const jtok *peek(parser *P, size_t d) { return &P->k[P->i + d < P->n ? P->i + d : P->n - 1]; }
static void next(parser *P) {
  if (P->i < P->n - 1) P->i++;
}

static void *fail(parser *P, int line, const char *fmt, const char *arg) {
  if (P->rc == FSDP_OK) {
    char what[200];
    snprintf(what, sizeof what, fmt, arg ? arg : "");
    P->rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: template line %d: %s", P->t->name, line, what);
  }
  return NULL;
}
static void *nomem(parser *P) {
  if (P->rc == FSDP_OK) P->rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory parsing a template");
  return NULL;
}

static int is_op(const jtok *t, const char *op) { return t->kind == JT_OP && !strcmp(t->s, op); }
static int is_name(const jtok *t, const char *nm) { return t->kind == JT_NAME && !strcmp(t->s, nm); }

static int expect_op(parser *P, const char *op) {
  if (P->rc) return 0;
  if (!is_op(cur(P), op)) {
    char m[64];
    snprintf(m, sizeof m, "expected '%s'", op);
    fail(P, cur(P)->line, "%s", m);
    return 0;
  }
  next(P);
  return 1;
}

static jnode *mk(parser *P, jnode_kind k, int line) {
  jnode *n = ja_alloc(&P->t->arena, sizeof *n);
  if (!n) return nomem(P);
  n->kind = k;
  n->line = line;
  return n;
}

static void push(parser *P, jnodes *l, jnode *x) {
  if (!x) return;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 4;
    jnode **v = ja_alloc(&P->t->arena, (size_t)cap * sizeof *v);
    if (!v) {
      nomem(P);
      return;
    }
    if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = x;
}

static void push_name(parser *P, const char ***v, int **lines, int *n, int *cap, const char *s, int line) {
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 8;
    const char **nv = ja_alloc(&P->t->arena, (size_t)c * sizeof *nv);
    int *nl = lines ? ja_alloc(&P->t->arena, (size_t)c * sizeof *nl) : NULL;
    if (!nv || (lines && !nl)) {
      nomem(P);
      return;
    }
    if (*n) memcpy(nv, *v, (size_t)*n * sizeof *nv);
    if (lines && *n) memcpy(nl, *lines, (size_t)*n * sizeof *nl);
    *v = nv;
    if (lines) *lines = nl;
    *cap = c;
  }
  if (lines) (*lines)[*n] = line;
  (*v)[(*n)++] = s;
}

static jnode *expr(parser *P);
static jnode *unary(parser *P, int with_filter);

/* (args, name=value, ...) into N's args and kw lists; the '(' is current. */
static void call_args(parser *P, jnode *n) {
  next(P);
  int nkw = 0, cap = 0;
  while (!P->rc && !is_op(cur(P), ")")) {
    if (n->args.n + n->kwv.n) expect_op(P, ",");
    if (is_op(cur(P), ")")) break;
    if (is_op(cur(P), "*") || is_op(cur(P), "**")) {
      fail(P, cur(P)->line, "*args and **kwargs in a call are not supported", NULL);
      return;
    }
    if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), "=")) {
      const char *k = cur(P)->s;
      next(P);
      next(P);
      push_name(P, &n->kwn, NULL, &nkw, &cap, k, 0);
      push(P, &n->kwv, expr(P));
    } else {
      if (n->kwv.n) {
        fail(P, cur(P)->line, "a positional argument after a keyword argument", NULL);
        return;
      }
      push(P, &n->args, expr(P));
    }
  }
  expect_op(P, ")");
}

static jnode *primary(parser *P) {
  const jtok *t = cur(P);
  int line = t->line;
  jnode *n = NULL;
  if (t->kind == JT_NAME) {
    static const char *const lits[] = {"true", "True", "false", "False", "none", "None"};
    for (int i = 0; i < 6; i++)
      if (!strcmp(t->s, lits[i])) {
        n = mk(P, JN_LIT, line);
        if (n) n->lit = i < 2 ? jv_bool(1) : i < 4 ? jv_bool(0) : jv_none();
        next(P);
        return n;
      }
    n = mk(P, JN_NAME, line);
    if (n) n->name = t->s;
    next(P);
    return n;
  }
  if (t->kind == JT_STRING) {
    jbuf b = {0};
    while (cur(P)->kind == JT_STRING) {   /* adjacent literals concatenate */
      jb_put(&b, cur(P)->s, cur(P)->n);
      next(P);
    }
    n = mk(P, JN_LIT, line);
    char *s = n ? ja_strndup(&P->t->arena, b.p ? b.p : "", b.n) : NULL;
    if (n && s) n->lit = jv_str(s, b.n);
    free(b.p);
    return s ? n : nomem(P);
  }
  if (t->kind == JT_INT || t->kind == JT_FLOAT) {
    n = mk(P, JN_LIT, line);
    if (n) n->lit = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
    next(P);
    return n;
  }
  if (is_op(t, "(")) {
    next(P);
    if (is_op(cur(P), ")")) {
      next(P);
      return mk(P, JN_TUPLE, line);
    }
    jnode *e = expr(P);
    if (!is_op(cur(P), ",")) {
      expect_op(P, ")");
      return e;
    }
    n = mk(P, JN_TUPLE, line);
    if (n) push(P, &n->args, e);
    while (!P->rc && is_op(cur(P), ",")) {
      next(P);
      if (is_op(cur(P), ")")) break;
      push(P, &n->args, expr(P));
    }
    expect_op(P, ")");
    return n;
  }
  if (is_op(t, "[")) {
    next(P);
    n = mk(P, JN_LIST, line);
    while (!P->rc && !is_op(cur(P), "]")) {
      if (n->args.n) expect_op(P, ",");
      if (is_op(cur(P), "]")) break;
      push(P, &n->args, expr(P));
    }
    expect_op(P, "]");
    return n;
  }
  if (is_op(t, "{")) {
    next(P);
    n = mk(P, JN_DICT, line);
    while (!P->rc && !is_op(cur(P), "}")) {
      if (n->args.n) expect_op(P, ",");
      if (is_op(cur(P), "}")) break;
      push(P, &n->args, expr(P));
      expect_op(P, ":");
      push(P, &n->kwv, expr(P));
    }
    expect_op(P, "}");
    return n;
  }
  return fail(P, line, "expected an expression, got '%s'", t->kind == JT_EOF ? "end of template" :
              t->kind == JT_BLOCK_END ? "%}" : t->kind == JT_VAR_END ? "}}" : t->s);
}

/* x[...]: an index or a slice a:b:c. */
static jnode *subscript(parser *P, jnode *obj, int line) {
  next(P);
  jnode *parts[3] = {0};
  int np = 0, slice = 0;
  for (;;) {
    if (is_op(cur(P), ":")) {
      slice = 1;
      if (np >= 2) return fail(P, line, "a slice has at most three parts", NULL);
      np++;
      next(P);
      continue;
    }
    if (is_op(cur(P), "]")) break;
    if (parts[np]) return fail(P, line, "expected ']'", NULL);
    parts[np] = expr(P);
    if (P->rc) return NULL;
  }
  next(P);
  jnode *n = mk(P, slice ? JN_SLICE : JN_ITEM, line);
  if (!n) return NULL;
  n->a = obj;
  if (slice) {
    n->b = parts[0];
    n->c = parts[1];
    push(P, &n->args, parts[2]);
  } else {
    if (!parts[0]) return fail(P, line, "an empty subscript", NULL);
    n->b = parts[0];
  }
  return n;
}

static jnode *postfix(parser *P, jnode *n) {
  while (n && !P->rc) {
    const jtok *t = cur(P);
    if (is_op(t, ".")) {
      next(P);
      const jtok *a = cur(P);
      if (a->kind == JT_INT) {
        jnode *it = mk(P, JN_ITEM, t->line), *ix = mk(P, JN_LIT, t->line);
        if (!it || !ix) return NULL;
        ix->lit = jv_int(a->i);
        it->a = n;
        it->b = ix;
        next(P);
        n = it;
        continue;
      }
      if (a->kind != JT_NAME) return fail(P, t->line, "expected an attribute name after '.'", NULL);
      next(P);
      if (is_op(cur(P), "(")) {
        if (!jf_is_method(a->s)) return fail(P, t->line, "the method .%s() is not supported", a->s);
        jnode *m = mk(P, JN_METHOD, t->line);
        if (!m) return NULL;
        m->a = n;
        m->name = a->s;
        call_args(P, m);
        n = m;
      } else {
        jnode *at = mk(P, JN_ATTR, t->line);
        if (!at) return NULL;
        at->a = n;
        at->name = a->s;
        n = at;
      }
    } else if (is_op(t, "[")) {
      n = subscript(P, n, t->line);
    } else if (is_op(t, "(")) {
      if (n->kind != JN_NAME) return fail(P, t->line, "only named functions and macros can be called", NULL);
      jnode *c = mk(P, JN_CALL, t->line);
      if (!c) return NULL;
      c->name = n->name;
      call_args(P, c);
      if (!jf_is_function(c->name))
        push_name(P, &P->called, &P->called_line, &P->ncalled, &P->capcalled, c->name, t->line);
      n = c;
    } else break;
  }
  return n;
}

static jnode *filter_expr(parser *P, jnode *n) {
  while (n && !P->rc) {
    const jtok *t = cur(P);
    if (is_op(t, "|")) {
      next(P);
      const jtok *f = cur(P);
      if (f->kind != JT_NAME) return fail(P, t->line, "expected a filter name after '|'", NULL);
      if (!jf_is_filter(f->s)) return fail(P, t->line, "the filter '%s' is not supported", f->s);
      jnode *x = mk(P, JN_FILTER, t->line);
      if (!x) return NULL;
      x->a = n;
      x->name = f->s;
      next(P);
      if (is_op(cur(P), "(")) call_args(P, x);
      n = x;
    } else if (is_name(t, "is")) {
      next(P);
      int neg = 0;
      if (is_name(cur(P), "not")) {
        neg = 1;
        next(P);
      }
      const jtok *f = cur(P);
      const char *tn = f->kind == JT_NAME ? f->s : f->kind == JT_OP ? f->s : NULL;
      if (!tn) return fail(P, t->line, "expected a test name after 'is'", NULL);
      if (!jf_is_test(tn)) return fail(P, t->line, "the test '%s' is not supported", tn);
      jnode *x = mk(P, JN_TEST, t->line);
      if (!x) return NULL;
      x->a = n;
      x->name = tn;
      x->op = neg;
      next(P);
      const jtok *c = cur(P);
      if (is_op(c, "(")) call_args(P, x);
      else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT || c->kind == JT_FLOAT ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) return fail(P, c->line, "tests cannot be chained with 'is'", NULL);
        push(P, &x->args, postfix(P, primary(P)));
      }
      n = x;
    } else break;
  }
  return n;
}

static jnode *unary(parser *P, int with_filter) {
  const jtok *t = cur(P);
  if (P->depth > 200) return fail(P, t->line, "expressions nested more than 200 deep", NULL);
  jnode *n;
  if (is_op(t, "-") || is_op(t, "+")) {
    next(P);
    n = mk(P, is_op(t, "-") ? JN_NEG : JN_POS, t->line);
    P->depth++;
    if (n) n->a = unary(P, 0);
    P->depth--;
  } else n = primary(P);
  n = postfix(P, n);
  return with_filter ? filter_expr(P, n) : n;
}

static jnode *binary(parser *P, jnode_kind k, int op, int line, jnode *a, jnode *b) {
  jnode *n = mk(P, k, line);
  if (!n) return NULL;
  n->op = op;
  n->a = a;
  n->b = b;
  return n;
}

static jnode *power(parser *P) {
  jnode *a = unary(P, 1);
  while (a && !P->rc && is_op(cur(P), "**")) {
    int line = cur(P)->line;
    next(P);
    a = binary(P, JN_BIN, 'P', line, a, unary(P, 1));
  }
  return a;
}
static jnode *math2(parser *P) {
  jnode *a = power(P);
  for (;;) {
    const jtok *t = cur(P);
    int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'F' : is_op(t, "%") ? '%' : 0;
    if (!op || !a || P->rc) return a;
    next(P);
    a = binary(P, JN_BIN, op, t->line, a, power(P));
  }
}
static jnode *concat(parser *P) {
  jnode *a = math2(P);
  while (a && !P->rc && is_op(cur(P), "~")) {
    int line = cur(P)->line;
    next(P);
    a = binary(P, JN_BIN, '~', line, a, math2(P));
  }
  return a;
}
static jnode *math1(parser *P) {
  jnode *a = concat(P);
  for (;;) {
    const jtok *t = cur(P);
    int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
    if (!op || !a || P->rc) return a;
    next(P);
    a = binary(P, JN_BIN, op, t->line, a, concat(P));
  }
}
static jnode *compare(parser *P) {
  jnode *a = math1(P);
  jnode *n = NULL;
  char ops[16];
  int nops = 0;
  for (;;) {
    const jtok *t = cur(P);
    char op = is_op(t, "==") ? '=' : is_op(t, "!=") ? '!' : is_op(t, "<") ? '<' : is_op(t, ">") ? '>' :
              is_op(t, "<=") ? 'l' : is_op(t, ">=") ? 'g' : is_name(t, "in") ? 'i' :
              (is_name(t, "not") && is_name(peek(P, 1), "in")) ? 'n' : 0;
    if (!op || !a || P->rc) break;
    if (nops == (int)sizeof ops - 1) return fail(P, t->line, "too many chained comparisons", NULL);
    next(P);
    if (op == 'n') next(P);
    if (!n) {
      n = mk(P, JN_CMP, t->line);
      if (!n) return NULL;
      push(P, &n->args, a);
    }
    ops[nops++] = op;
    push(P, &n->args, math1(P));
  }
  if (!n) return a;
  ops[nops] = 0;
  n->cmpops = ja_strndup(&P->t->arena, ops, (size_t)nops);
  return n->cmpops ? n : nomem(P);
}
static jnode *not_expr(parser *P) {
  if (is_name(cur(P), "not")) {
    jnode *n = mk(P, JN_NOT, cur(P)->line);
    next(P);
    if (++P->depth > 200) return fail(P, cur(P)->line, "expressions nested more than 200 deep", NULL);
    if (n) n->a = not_expr(P);
    P->depth--;
    return n;
  }
  return compare(P);
}
static jnode *and_expr(parser *P) {
  jnode *a = not_expr(P);
  while (a && !P->rc && is_name(cur(P), "and")) {
    int line = cur(P)->line;
    next(P);
    a = binary(P, JN_AND, 0, line, a, not_expr(P));
  }
  return a;
}
static jnode *or_expr(parser *P) {
  jnode *a = and_expr(P);
  while (a && !P->rc && is_name(cur(P), "or")) {
    int line = cur(P)->line;
    next(P);
    a = binary(P, JN_OR, 0, line, a, and_expr(P));
  }
  return a;
}
/* a if cond [else b] */
static jnode *expr(parser *P) {
  if (++P->depth > 200) return fail(P, cur(P)->line, "expressions nested more than 200 deep", NULL);
  jnode *a = or_expr(P);
  while (a && !P->rc && is_name(cur(P), "if")) {
    jnode *n = mk(P, JN_COND, cur(P)->line);
    next(P);
    if (!n) return NULL;
    n->a = a;
    n->b = or_expr(P);
    if (is_name(cur(P), "else")) {
      next(P);
      n->c = expr(P);
    }
    a = n;
  }
  P->depth--;
  return a;
}

/* An expression that may be a bare tuple (a, b): the iterable of a for, the value of a set. */
static jnode *tuple_expr(parser *P) {
  jnode *e = expr(P);
  if (!e || !is_op(cur(P), ",")) return e;
  jnode *n = mk(P, JN_TUPLE, e->line);
  if (n) push(P, &n->args, e);
  while (n && !P->rc && is_op(cur(P), ",")) {
    next(P);
    if (cur(P)->kind == JT_BLOCK_END) break;
    push(P, &n->args, expr(P));
  }
  return n;
}

/* ---- statements ---- */
static jnodes body(parser *P, const char *const *ends, const char **found);

static void end_tag(parser *P) {
  if (P->rc) return;
  if (cur(P)->kind != JT_BLOCK_END) {
    fail(P, cur(P)->line, "expected '%%}' here, got '%s'", cur(P)->kind == JT_EOF ? "end of template" : cur(P)->s);
    return;
  }
  next(P);
}
/* At {% NAME ... %} of an end or middle tag: consume "{% NAME" and return. */
static void open_tag(parser *P) {
  next(P);
  next(P);
}

static jnode *stmt_if(parser *P, int line) {
  jnode *n = mk(P, JN_IF, line);
  if (!n) return NULL;
  int cap = 4;
  n->bodies = ja_alloc(&P->t->arena, (size_t)cap * sizeof *n->bodies);
  if (!n->bodies) return nomem(P);
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  for (;;) {
    push(P, &n->args, expr(P));
    end_tag(P);
    const char *found = NULL;
    jnodes b = body(P, ends, &found);
    if (P->rc) return NULL;
    if (n->args.n > cap) return fail(P, line, "internal: if bodies", NULL);
    if (n->args.n == cap) {
      jnodes *nb = ja_alloc(&P->t->arena, (size_t)cap * 2 * sizeof *nb);
      if (!nb) return nomem(P);
      memcpy(nb, n->bodies, (size_t)cap * sizeof *nb);
      n->bodies = nb;
      cap *= 2;
    }
    n->bodies[n->args.n - 1] = b;
    open_tag(P);
    if (!strcmp(found, "elif")) continue;
    if (!strcmp(found, "else")) {
      end_tag(P);
      static const char *const e2[] = {"endif", NULL};
      n->orelse = body(P, e2, &found);
      open_tag(P);
    }
    end_tag(P);
    return n;
  }
}

static jnode *stmt_for(parser *P, int line) {
  jnode *n = mk(P, JN_FOR, line);
  if (!n) return NULL;
  int cap = 0, paren = is_op(cur(P), "(");
  if (paren) next(P);
  for (;;) {
    if (cur(P)->kind != JT_NAME) return fail(P, cur(P)->line, "expected a loop variable name", NULL);
    push_name(P, &n->targets, NULL, &n->ntargets, &cap, cur(P)->s, 0);
    next(P);
    if (!is_op(cur(P), ",")) break;
    next(P);
  }
  if (paren) expect_op(P, ")");
  if (!is_name(cur(P), "in")) return fail(P, cur(P)->line, "expected 'in' in a for loop", NULL);
  next(P);
  n->a = or_expr(P);   /* the iterable takes no "x if c else y": a trailing "if" filters the loop */
  if (n->a && is_op(cur(P), ",")) return fail(P, line, "a bare tuple as a loop's iterable is not supported", NULL);
  if (is_name(cur(P), "if")) {
    next(P);
    n->b = expr(P);
  }
  if (is_name(cur(P), "recursive")) return fail(P, line, "recursive loops are not supported", NULL);
  end_tag(P);
  static const char *const ends[] = {"else", "endfor", NULL};
  const char *found = NULL;
  n->body = body(P, ends, &found);
  if (P->rc) return NULL;
  open_tag(P);
  if (!strcmp(found, "else")) {
    end_tag(P);
    static const char *const e2[] = {"endfor", NULL};
    n->orelse = body(P, e2, &found);
    open_tag(P);
  }
  end_tag(P);
  return n;
}

static jnode *stmt_set(parser *P, int line) {
  if (cur(P)->kind != JT_NAME) return fail(P, line, "expected a name after 'set'", NULL);
  const char *target = cur(P)->s, *attr = NULL;
  next(P);
  if (is_op(cur(P), ".")) {
    next(P);
    if (cur(P)->kind != JT_NAME) return fail(P, line, "expected an attribute name in 'set'", NULL);
    attr = cur(P)->s;
    next(P);
  }
  if (is_op(cur(P), ",")) return fail(P, line, "assigning to several names in one 'set' is not supported", NULL);
  if (is_op(cur(P), "=")) {
    next(P);
    jnode *n = mk(P, JN_SET, line);
    if (!n) return NULL;
    n->name = target;
    n->name2 = attr;
    n->a = tuple_expr(P);
    end_tag(P);
    return n;
  }
  if (attr) return fail(P, line, "a block 'set' of a namespace attribute is not supported", NULL);
  if (is_op(cur(P), "|")) return fail(P, line, "a filtered block 'set' is not supported", NULL);
  end_tag(P);
  jnode *n = mk(P, JN_SETBLOCK, line);
  if (!n) return NULL;
  n->name = target;
  static const char *const ends[] = {"endset", NULL};
  const char *found;
  n->body = body(P, ends, &found);
  open_tag(P);
  end_tag(P);
  return n;
}

static jnode *stmt_macro(parser *P, int line) {
  if (cur(P)->kind != JT_NAME) return fail(P, line, "expected the macro's name", NULL);
  jnode *n = mk(P, JN_MACRO, line);
  if (!n) return NULL;
  n->name = cur(P)->s;
  push_name(P, &P->macros, NULL, &P->nmacros, &P->capmacros, n->name, 0);
  next(P);
  expect_op(P, "(");
  while (!P->rc && !is_op(cur(P), ")")) {
    if (n->args.n) expect_op(P, ",");
    if (cur(P)->kind != JT_NAME) return fail(P, line, "expected a macro parameter name", NULL);
    jnode *prm = mk(P, JN_NAME, line);
    if (!prm) return NULL;
    prm->name = cur(P)->s;
    next(P);
    if (is_op(cur(P), "=")) {
      next(P);
      prm->a = expr(P);
    } else if (n->args.n && n->args.v[n->args.n - 1]->a)
      return fail(P, line, "a macro parameter without a default after one with a default", NULL);
    push(P, &n->args, prm);
  }
  expect_op(P, ")");
  end_tag(P);
  static const char *const ends[] = {"endmacro", NULL};
  const char *found;
  n->body = body(P, ends, &found);
  open_tag(P);
  if (cur(P)->kind == JT_NAME) next(P);   /* {% endmacro name %} */
  end_tag(P);
  return n;
}

static jnode *stmt_filter(parser *P, int line) {
  jnode *chain = NULL;
  for (;;) {
    const jtok *f = cur(P);
    if (f->kind != JT_NAME) return fail(P, line, "expected a filter name", NULL);
    if (!jf_is_filter(f->s)) return fail(P, line, "the filter '%s' is not supported", f->s);
    jnode *x = mk(P, JN_FILTER, line);
    if (!x) return NULL;
    x->a = chain;   /* NULL: the block's own text */
    x->name = f->s;
    next(P);
    if (is_op(cur(P), "(")) call_args(P, x);
    chain = x;
    if (!is_op(cur(P), "|")) break;
    next(P);
  }
  end_tag(P);
  jnode *n = mk(P, JN_FILTERBLOCK, line);
  if (!n) return NULL;
  n->a = chain;
  static const char *const ends[] = {"endfilter", NULL};
  const char *found;
  n->body = body(P, ends, &found);
  open_tag(P);
  end_tag(P);
  return n;
}

static jnode *statement_in(parser *P, int line);
static jnode *statement(parser *P) {
  int line = cur(P)->line;
  if (++P->depth > 200) return fail(P, line, "blocks nested more than 200 deep", NULL);
  jnode *n = statement_in(P, line);
  P->depth--;
  return n;
}
static jnode *statement_in(parser *P, int line) {
  next(P);   /* {% */
  const jtok *t = cur(P);
  if (t->kind != JT_NAME) return fail(P, line, "expected a tag name after '{%%'", NULL);
  next(P);
  if (!strcmp(t->s, "if")) return stmt_if(P, line);
  if (!strcmp(t->s, "for")) return stmt_for(P, line);
  if (!strcmp(t->s, "set")) return stmt_set(P, line);
  if (!strcmp(t->s, "macro")) return stmt_macro(P, line);
  if (!strcmp(t->s, "filter")) return stmt_filter(P, line);
  if (!strcmp(t->s, "break") || !strcmp(t->s, "continue")) {
    jnode *n = mk(P, t->s[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
    end_tag(P);
    return n;
  }
  if (!strcmp(t->s, "generation")) {
    jnode *n = mk(P, JN_GENERATION, line);
    P->t->has_generation = 1;
    end_tag(P);
    static const char *const ends[] = {"endgeneration", NULL};
    const char *found;
    if (n) n->body = body(P, ends, &found);
    open_tag(P);
    end_tag(P);
    return n;
  }
  return fail(P, line, "the {%% %s %%} tag is not supported", t->s);
}

/* Statements up to one of ENDS (left current, its name in *found) or the end of the template. */
static jnodes body(parser *P, const char *const *ends, const char **found) {
  jnodes out = {0};
  int line = cur(P)->line;
  while (!P->rc) {
    const jtok *t = cur(P);
    if (t->kind == JT_EOF) {
      if (ends) fail(P, line, "a block that is never closed (expected {%% %s %%})", ends[0]);
      break;
    }
    if (t->kind == JT_TEXT) {
      jnode *n = mk(P, JN_TEXT, t->line);
      if (n) n->lit = jv_str(t->s, t->n);
      push(P, &out, n);
      next(P);
    } else if (t->kind == JT_VAR_BEGIN) {
      jnode *n = mk(P, JN_OUT, t->line);
      next(P);
      if (n) n->a = expr(P);
      push(P, &out, n);
      if (!P->rc && cur(P)->kind != JT_VAR_END)
        fail(P, cur(P)->line, "expected '}}' here, got '%s'", cur(P)->kind == JT_EOF ? "end of template" : cur(P)->s);
      next(P);
    } else if (t->kind == JT_BLOCK_BEGIN) {
      const jtok *nm = peek(P, 1);
      for (int i = 0; ends && ends[i]; i++)
        if (is_name(nm, ends[i])) {
          *found = ends[i];
          return out;
        }
      push(P, &out, statement(P));
    } else {
      fail(P, t->line, "unexpected '%s'", t->s ? t->s : "token");
    }
  }
  return out;
}

fsdp_status jinja_load(const char *src, size_t len, const char *name, jinja_tmpl **out) {
  *out = NULL;
  jinja_tmpl *t = calloc(1, sizeof *t);
  if (!t) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory loading a template");
  t->name = ja_strndup(&t->arena, name ? name : "template", strlen(name ? name : "template"));
  jtok *toks = NULL;
  size_t ntoks = 0;
  fsdp_status rc = t->name ? jlex(&t->arena, t->name, src, len, &toks, &ntoks) : FSDP_ERR_NOMEM;
  if (rc == FSDP_OK) {
    parser P = {.t = t, .k = toks, .n = ntoks};
    t->body = body(&P, NULL, NULL);
    for (int i = 0; !P.rc && i < P.ncalled; i++) {
      int known = 0;
      for (int k = 0; k < P.nmacros && !known; k++) known = !strcmp(P.macros[k], P.called[i]);
      if (!known) fail(&P, P.called_line[i], "the function '%s' is not supported", P.called[i]);
    }
    rc = P.rc;
  }
  if (rc != FSDP_OK) {
    jinja_destroy(&t);
    return rc;
  }
  *out = t;
  return FSDP_OK;
}

int jinja_has_generation(const jinja_tmpl *t) { return t->has_generation; }

void jinja_destroy(jinja_tmpl **t) {
  if (!t || !*t) return;
  ja_free(&(*t)->arena);
  free(*t);
  *t = NULL;
}
