/* jinja_priv — what the parts of common/jinja share: the arena, the growing buffer, tokens, the
 * syntax tree and the values of the evaluator. Not for use outside common/jinja_*.c.
 *
 * Ownership: a template's tokens and tree live in its arena (jinja_tmpl.arena); a render's values
 * live in the render's arena, and may point at the template's strings (literals), which outlive
 * any render. Values are small structs passed by value; lists and dicts are shared by pointer.
 */
#ifndef FSDP_JINJA_PRIV_H
#define FSDP_JINJA_PRIV_H

#include <stdint.h>

#include "jinja.h"

/* ---- arena and buffer (jinja_value.c) ---- */
typedef struct ja_block ja_block;
typedef struct ja_arena {
  ja_block *head;
  size_t total, limit;   /* bytes held; at most LIMIT when it is not 0 */
  int failed;   /* 1: an allocation failed, 2: it would pass the limit; the caller reports it */
} ja_arena;
void *ja_alloc(ja_arena *a, size_t n);   /* zeroed; NULL (and a->failed) when out of memory */
char *ja_strndup(ja_arena *a, const char *s, size_t n);
void ja_free(ja_arena *a);

typedef struct jbuf {
  char *p;
  size_t n, cap;
  int failed;
} jbuf;
void jb_put(jbuf *b, const char *s, size_t n);
void jb_puts(jbuf *b, const char *s);
void jb_putc(jbuf *b, char c);
void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- tokens (jinja_lex.c) ---- */
typedef enum {
  JT_EOF, JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
  JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP
} jtok_kind;
typedef struct jtok {
  jtok_kind kind;
  int line;
  const char *s;   /* text, name, string value or operator (NUL-terminated, in the arena) */
  size_t n;        /* its length in bytes */
  int64_t i;
  double f;
} jtok;
/* Tokens of SRC into *TOKS (arena-allocated, ending with JT_EOF). */
fsdp_status jlex(ja_arena *a, const char *name, const char *src, size_t len, jtok **toks, size_t *ntoks);

/* ---- values (jinja_value.c) ---- */
/* JV_FUNC: a built-in function (u.s.p its name), a value so that `strftime_now is defined` holds. */
typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_MACRO, JV_FUNC } jv_type;
typedef struct jlist jlist;
typedef struct jdict jdict;
struct jnode;
typedef struct jv {
  jv_type t;
  int markup;            /* JV_STR: a markupsafe.Markup (|safe, |e): what is added to it is escaped */
  union {
    int64_t i;           /* JV_BOOL, JV_INT */
    double f;
    struct { const char *p; size_t n; } s;
    jlist *l;
    jdict *d;
    const struct jnode *m;
  } u;
  const char *uname;     /* JV_UNDEF: the name that was undefined, for messages (may be NULL) */
} jv;
/* A list's kind: what Python would hold. Generators (map, select, ... and reversed iterators) are
 * always true, have no len(), no index and no JSON, and are read once (pos: what is consumed);
 * dict views (.items(), .keys(), .values()) iterate again but print and dump as Python does. */
enum { JL_LIST, JL_TUPLE, JL_GEN, JL_ITEMS, JL_KEYS, JL_VALUES };
struct jlist { jv *v; size_t n, cap, pos; int kind; };
#define JL_SEQ(l) ((l)->kind == JL_LIST || (l)->kind == JL_TUPLE)   /* indexable, comparable */
struct jdict { jv *k, *v; size_t n, cap; int ns; };

static inline jv jv_undef(const char *name) { jv v = {.t = JV_UNDEF, .uname = name}; return v; }
static inline jv jv_none(void) { jv v = {.t = JV_NONE}; return v; }
static inline jv jv_bool(int b) { jv v = {.t = JV_BOOL, .u.i = b != 0}; return v; }
static inline jv jv_int(int64_t i) { jv v = {.t = JV_INT, .u.i = i}; return v; }
static inline jv jv_float(double f) { jv v = {.t = JV_FLOAT, .u.f = f}; return v; }
static inline jv jv_str(const char *p, size_t n) { jv v = {.t = JV_STR, .u.s = {p, n}}; return v; }
jv jv_cstr(const char *s);
jv jv_list(ja_arena *a, int kind);
jv jv_dict(ja_arena *a);
void jl_push(ja_arena *a, jlist *l, jv x);
void jd_set(ja_arena *a, jdict *d, jv k, jv v);
int jd_find(const jdict *d, jv k);   /* index or -1 */
jv jv_from_json(ja_arena *a, const json_t *j);
int jv_truthy(jv v);
int jv_eq(jv a, jv b);
/* <0, 0, >0; *ok = 0 when Python could not order them (a TypeError). */
int jv_cmp(jv a, jv b, int *ok);
const char *jv_typename(jv v);
/* str(v) and repr(v) as Python writes them, appended to B. */
void jv_str_to(jbuf *b, jv v);
void jv_repr_to(jbuf *b, jv v);
void jv_float_repr(jbuf *b, double f);
jv jv_to_string(ja_arena *a, jv v);   /* str(v) as a value */
/* markupsafe.escape(v): a Markup, V itself when it is one already. */
jv jv_escape(ja_arena *a, jv v);
/* json.dumps(v, indent=INDENT (<0: None), separators, FLAGS: JSON_SORT sort_keys, JSON_ASCII
 * ensure_ascii); 0 or -1 (*what names a value JSON cannot hold). */
enum { JJ_SORT = 1, JJ_ASCII = 2 };
int jv_json_to(jbuf *b, jv v, int indent, const char *item_sep, const char *key_sep, int flags,
               int level, const char **what);
/* UTF-8 helpers: code points in S, and the byte offset of code point I (clamped). */
size_t ju_len(const char *s, size_t n);
size_t ju_off(const char *s, size_t n, size_t i);
int ju_isspace(uint32_t c);
/* Decode one code point at S (N bytes left); its length in *LEN (invalid bytes count as one). */
uint32_t ju_get(const char *s, size_t n, int *len);
void ju_put(jbuf *b, uint32_t c);

/* ---- syntax tree (jinja_parse.c) ---- */
typedef enum {
  /* expressions */
  JN_LIT, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_METHOD, JN_FILTER, JN_TEST,
  JN_NEG, JN_POS, JN_NOT, JN_AND, JN_OR, JN_BIN, JN_CMP, JN_COND, JN_LIST, JN_TUPLE, JN_DICT,
  /* statements */
  JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_BREAK, JN_CONTINUE,
  JN_GENERATION, JN_FILTERBLOCK
} jnode_kind;

typedef struct jnode jnode;
typedef struct jnodes { jnode **v; int n, cap; } jnodes;
struct jnode {
  jnode_kind kind;
  int line;
  int op;              /* JN_BIN: '+', '-', '*', '/', 'F' (//), '%', 'P' (**), '~'; JN_TEST: negated */
  const char *name;    /* name, attribute, method, filter, test, macro, set target */
  const char *name2;   /* JN_SET: the namespace attribute (target ns.attr) */
  jv lit;              /* JN_LIT; JN_TEXT: the text */
  jnode *a, *b, *c;    /* operands; JN_FOR: a iterable, b filter; JN_COND: a then, b cond, c else */
  jnodes args;         /* call arguments, items, comparison operands, JN_IF conditions */
  jnodes kwv;          /* keyword argument values (names in kwn) */
  const char **kwn;
  jnodes body;         /* statements; JN_MACRO parameters are in args (JN_NAME) with defaults in kwv */
  jnodes orelse;       /* JN_FOR else; JN_IF: one body per condition in bodies */
  jnodes *bodies;      /* JN_IF: bodies[i] for args.v[i]; orelse for else */
  const char **targets;  /* JN_FOR loop variables */
  int ntargets;
  const char *cmpops;  /* JN_CMP: one char per operator: = ! < > l(<=) g(>=) i(in) n(not in) */
};

struct jinja_tmpl {
  ja_arena arena;
  jnodes body;
  const char *name;
  int has_generation;
};

/* ---- evaluation (jinja_eval.c, jinja_filters.c) ---- */
typedef struct jframe jframe;
typedef struct jctx {
  ja_arena *a;
  const jinja_tmpl *t;
  jframe *globals;
  jbuf *out;
  jinja_span *spans;
  size_t nspans, capspans;
  int depth;
  int line;            /* the line being evaluated, for messages */
  fsdp_status rc;      /* the first error; evaluation stops */
  long steps;          /* statements run, at most JINJA_MAX_STEPS */
  int capture;         /* >0 while a macro or block set renders into its own buffer */
  jv blockval;         /* a {% filter %} block's text, the input of its innermost filter */
} jctx;
/* Record an error at the current line; returns an undefined value so callers can return it. */
jv jx_fail(jctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv jx_eval(jctx *x, jframe *f, const struct jnode *n);
/* A list of what V iterates (items, keys, characters); undefined iterates nothing. */
jv jx_iterable(jctx *x, jv v);
jv jx_call_macro(jctx *x, const jnode *m, jv *args, int nargs, const char **kwn, jv *kwv, int nkw);

/* Known names (jinja_filters.c): the parser refuses anything else. */
int jf_is_filter(const char *name);
int jf_is_test(const char *name);
int jf_is_method(const char *name);
int jf_is_function(const char *name);
jv jf_filter(jctx *x, const char *name, jv v, jv *args, int nargs, const char **kwn, jv *kwv, int nkw);
int jf_test(jctx *x, const char *name, jv v, jv *args, int nargs);   /* 0/1, or -1 on error */
jv jf_method(jctx *x, const char *name, jv self, jv *args, int nargs, const char **kwn, jv *kwv, int nkw);
jv jf_function(jctx *x, const char *name, jv *args, int nargs, const char **kwn, jv *kwv, int nkw);
/* Python's str.split / strip / upper ... shared by methods and filters. */
jv jf_strip(jctx *x, jv s, jv chars, int left, int right);
jv jf_case(jctx *x, jv s, int mode);   /* 'u' upper, 'l' lower, 't' title (jinja), 'c' capitalize */

#endif
