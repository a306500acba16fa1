/* test_jinja — common/jinja: templates rendered exactly as jinja2 renders them with transformers'
 * settings (the expected texts below are jinja2 3.1.6's, through transformers' own compile: whitespace
 * control, loops and scopes, macros, expressions, methods, filters, generators, Markup, generation
 * spans), render errors as one line with the template line, and broken or unsupported templates
 * refused at load in one line naming the construct and its line. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jinja.h"

#define M                                                                                                   \
  "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": " \
  "\"Hi \303\251\360\237\230\200\"}, {\"role\": \"assistant\", \"content\": \" Hello! \"}], \"bos_token\": " \
  "\"<s>\", \"eos_token\": \"</s>\"}"

/* Render SRC with the variables VARS (JSON); NULL and the error in fsdp_last_error() on failure. */
static char *render(const char *src, const char *vars, jinja_span **spans, size_t *nspans) {
  jinja_tmpl *t;
  if (jinja_load(src, strlen(src), "t.jinja", &t) != FSDP_OK) return NULL;
  json_t *v = json_loads(vars, 0, NULL);
  char *out = NULL;
  size_t n;
  if (jinja_render(t, v, &out, &n, spans, nspans) != FSDP_OK) out = NULL;
  else CHECK_EQ_INT(strlen(out), n);
  json_decref(v);
  jinja_destroy(&t);
  return out;
}

static const struct {
  const char *src, *vars, *want;
} cases[] = {
    {"{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n",
     M, "  system\n  user\n  assistant\n"},
    {"  {%- if true %} x {% endif -%}  \n y",
     "{}", " x y"},
    {"a\n    {%+ if true %}b{% endif %}\n",
     "{}", "a\n    b"},
    {"a {# c #}\n  {# d -#}   b {{- ' c ' -}} d\n\n",
     "{}", "a b c d\n"},
    {"{% if true +%}\nkept{% endif %}",
     "{}", "\nkept"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ loop.first }}{{ loop.last }}{{ m.content|trim }};{% endfor %}",
     M, "1/2TrueFalseHi \303\251\360\237\230\200;2/2FalseTrueHello!;"},
    {"{% for x in [] %}a{% else %}empty{% endfor %}",
     "{}", "empty"},
    {"{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "{}", "02"},
    {"{% for k, v in {'a': 1, 'b': [1, 2]}.items() %}{{ k }}={{ v }},{% endfor %}",
     "{}", "a=1,b=[1, 2],"},
    {"{% for a in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.revindex }} {% endfor %}",
     "{}", "-2-3 1-3-2 2--1 "},
    {"{% set x = 1 %}{% for i in range(2) %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}",
     "{}", "12121"},
    {"{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
     "{}", "3"},
    {"{% set x = 1 %}{% if true %}{% set x = 3 %}{% endif %}{{ x }}",
     "{}", "3"},
    {"{% macro m(a, b='B') %}[{{ a }}{{ b }}{{ y }}]{% endmacro %}{% set y = 7 %}{{ m(1) }}{{ m(2, b='c') }}{{ m(b=3, a=4) }}",
     "{}", "[1B7][2c7][437]"},
    {"{% set block %}x{{ 1 + 1 }}y{% endset %}{{ block|upper }}",
     "{}", "X2Y"},
    {"{% filter upper %}abc{{ 'd' }}{% endfilter %}",
     "{}", "ABCD"},
    {"{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 3 / 2 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }}",
     "{}", "7 3 2 1024 1.5 a1None ababab"},
    {"{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e16 }} {{ 123456789.125 }} {{ -0.0 }}",
     "{}", "1.0 0.30000000000000004 1e-05 1e+16 123456789.125 -0.0"},
    {"{{ [1, 'a', none, true, 1.5] }} {{ {'k': 'it\\'s'} }} {{ (1,) }} {{ ('a', \"b\") }}",
     "{}", "[1, 'a', None, True, 1.5] {'k': \"it's\"} (1,) ('a', 'b')"},
    {"{{ 'x' if false }}|{{ 'y' if 1 > 2 else 'z' }}|{{ 1 < 2 < 3 }}|{{ 3 in [1, 3] }}|{{ 'b' not in 'abc' }}",
     "{}", "|z|True|True|False"},
    {"{{ messages[0]['content'] }}|{{ messages[-1].content[1:4] }}|{{ messages[1].content[::-1] }}|{{ 'hello'[1] }}",
     M, "Be brief.|Hel|\360\237\230\200\303\251 iH|e"},
    {"{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ 3 is number }}{{ 3 is odd }}{{ [] is iterable }}{{ x is not defined }}",
     "{}", "FalseTrueTrueTrueTrueTrueTrueTrue"},
    {"{{ not 0 and 'yes' or 'no' }} {{ '' or 'dflt' }} {{ 0 and 1 }}",
     "{}", "yes dflt 0"},
    {"{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}",
     "{}", "a b|a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']"},
    {"{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Hello World'.lower() }}{{ 'hello world'.title() }}|{{ 'a-b'.replace('-', '+') }}",
     "{}", "TrueTrue|hello worldHello World|a+b"},
    {"{{ '{} and {name}'.format(1, name='b') }}|{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('z', 'd') }}{{ {'a': 1}.get('z') }}|{{ {'a': 1, 'b': 2}.keys()|list }}",
     "{}", "1 and b|1dNone|['a', 'b']"},
    {"{{ messages|length }} {{ messages|map(attribute='role')|join(', ') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}",
     M, "3 system, user, assistant 1"},
    {"{{ messages|rejectattr('role', 'in', ['system'])|map(attribute='content')|map('trim')|list }}",
     M, "['Hi \303\251\360\237\230\200', 'Hello!']"},
    {"{{ messages[0]|tojson }}|{{ {'a': [1, 2.5, none, true], 'b': 'q\"\\n\303\251'}|tojson }}|{{ {'b': 1, 'a': {'c': []}}|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}",
     M, "{\"role\": \"system\", \"content\": \"Be brief.\"}|{\"a\": [1, 2.5, null, true], \"b\": \"q\\\"\\n\303\251\"}|{\n  \"b\": 1,\n  \"a\": {\n    \"c\": []\n  }\n}|{\"a\": 2, \"b\": 1}"},
    {"{{ '\303\251\360\237\230\200'|tojson(ensure_ascii=true) }}",
     "{}", "\"\\u00e9\\ud83d\\ude00\""},
    {"{{ x|default('d') }} {{ ''|default('e', true) }} {{ none|default('n') }} {{ x|d('dd') }}",
     "{}", "d e None dd"},
    {"{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }} {{ ['b', 'A', 'c']|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['a', 'A', 'b']|unique|list }}",
     "{}", "[('A', 2), ('a', 3), ('b', 1)] ['A', 'b', 'c'] [3, 2, 1] ['a', 'b']"},
    {"{{ [1, 2, 3]|first }}{{ [1, 2, 3]|last }}{{ 'abc'|first }} {{ [1, 5, 2]|max }}{{ [4, 2]|min }} {{ -3|abs }} {{ '42'|int + 1 }} {{ 'x'|int }} {{ '2.5'|float }}",
     "{}", "13a 52 3 43 0 2.5"},
    {"{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'hello WORLD'|capitalize }}|{{ 'hello-world foo'|title }}|{{ [1,2]|reverse|list }}",
     "{}", "a\n  b\n\n  c|  a\n  b|Hello world|Hello-World Foo|[2, 1]"},
    {"{{ 'a<b>'|safe + '<i>' }}|{{ '<x>'|e }}|{{ messages|items|list|length if false else {'a': 1}|items|list }}",
     M, "a<b>&lt;i&gt;|&lt;x&gt;|[('a', 1)]"},
    {"{{ messages|selectattr('role', 'equalto', 'nobody') and 'generator is true' }}|{% if [] %}x{% else %}empty list false{% endif %}",
     M, "generator is true|empty list false"},
    {"{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
     M, "Be brief.Hi \303\251\360\237\230\200 Hello! </s>"},
    {"{{ strftime_now is defined }}{{ raise_exception is defined }}{{ 'x'|length }}{{ 'h\303\251'|length }}{{ 'h\303\251'|upper }}",
     "{}", "TrueTrue12H\303\211"},
};

static void test_rendering(void) {
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *got = render(cases[i].src, cases[i].vars, NULL, NULL);
    if (!got || strcmp(got, cases[i].want)) {
      fprintf(stderr, "case %zu: %s\n  expected: [%s]\n  got:      [%s]\n", i, cases[i].src, cases[i].want,
              got ? got : fsdp_last_error());
      CHECK(0);
    } else CHECK(1);
    free(got);
  }
}

/* The {% generation %} blocks' bytes: transformers' assistant mask. */
static void test_spans(void) {
  jinja_span *sp = NULL;
  size_t n = 0;
  const char *src = "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}"
                    "{{ m.content }}{{ eos_token }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}";
  char *out = render(src, M, &sp, &n);
  CHECK(out != NULL);
  CHECK_EQ_INT(1, n);
  if (out && n == 1) {
    const char *want = " Hello! </s>";
    CHECK_EQ_INT(strlen(out) - strlen(want), sp[0].start);
    CHECK_EQ_INT(strlen(out), sp[0].end);
    CHECK(!strcmp(out + sp[0].start, want));
  }
  free(out);
  free(sp);
}

/* Render errors: one line, the template line, raise_exception's own message. */
static void test_render_errors(void) {
  static const struct {
    const char *src, *vars, *want;
  } errs[] = {
      {"line1\n{{ raise_exception('no system role') }}", "{}", "t.jinja: template line 2: the template refused: no system role"},
      {"{{ x.y }}", "{}", "'x' is undefined"},
      {"{{ 1 + 'a' }}", "{}", "unsupported operand type(s) for +: 'int' and 'str'"},
      {"{% set m = messages|map(attribute='role') %}{{ m }}", M, "printing a generator"},
      {"{{ [1].append(2) }}", "{}", "access to attribute 'append' of 'list' object is unsafe"},
      {"{% for x in 3 %}{% endfor %}", "{}", "'int' object is not iterable"},
      {"{{ 1 / 0 }}", "{}", "division by zero"},
      {"{{ x|tojson }}", "{}", "Object of type Undefined is not JSON serializable"},
      {"{{ messages|map(attribute='role')|tojson }}", M, "Object of type generator is not JSON serializable"},
      {"{% macro m(a) %}{{ m(a) }}{% endmacro %}{{ m(1) }}", "{}", "macro calls nested more than 100 deep"},
      {"{{ range(1000000)|length }}", "{}", "more than 100000 items"},
      {"{% set x = 1 %}{% set x.a = 2 %}", "{}", "cannot assign attribute on non-namespace object 'x'"},
  };
  for (size_t i = 0; i < sizeof errs / sizeof *errs; i++) {
    char *got = render(errs[i].src, errs[i].vars, NULL, NULL);
    const char *msg = fsdp_last_error();
    if (got || !strstr(msg, errs[i].want) || strchr(msg, '\n')) {
      fprintf(stderr, "error case %zu: %s\n  expected an error with: %s\n  got: %s\n", i, errs[i].src, errs[i].want,
              got ? got : msg);
      CHECK(0);
    } else CHECK(1);
    free(got);
  }
}

/* Broken or unsupported templates: refused at load, one line naming the construct and its line. */
static void test_refusals(void) {
  static const struct {
    const char *src, *want;
  } bad[] = {
      {"ok\n{% include 'x.jinja' %}", "template line 2: the {% include %} tag is not supported"},
      {"{% extends 'base' %}", "template line 1: the {% extends %} tag is not supported"},
      {"{% call m() %}x{% endcall %}", "the {% call %} tag is not supported"},
      {"{{ x|wordwrap }}", "template line 1: the filter 'wordwrap' is not supported"},
      {"{{ x is divisible }}", "the test 'divisible' is not supported"},
      {"\n\n{{ 'a'.zfill(3) }}", "template line 3: the method .zfill() is not supported"},
      {"{{ cycler('a') }}", "the function 'cycler' is not supported"},
      {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
      {"{% if x %}never closed", "a block that is never closed (expected {% elif %})"},
      {"{{ 'unterminated }}", "a string that never ends"},
      {"{{ x + }}", "expected an expression, got '}}'"},
      {"{% for x in %}{% endfor %}", "expected an expression"},
      {"{{ x\n", "a {{ expression that never ends"},
      {"{# comment", "a {# comment that never ends"},
      {"{{ f(*args) }}", "*args and **kwargs in a call are not supported"},
      {"{% set a, b = 1, 2 %}", "assigning to several names in one 'set' is not supported"},
      {"{{ x @ y }}", "unexpected character '@' in a tag"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    jinja_tmpl *t = NULL;
    fsdp_status rc = jinja_load(bad[i].src, strlen(bad[i].src), "t.jinja", &t);
    const char *msg = fsdp_last_error();
    if (rc == FSDP_OK || t || !strstr(msg, bad[i].want) || strchr(msg, '\n')) {
      fprintf(stderr, "refusal %zu: %s\n  expected: %s\n  got: %s\n", i, bad[i].src, bad[i].want,
              rc == FSDP_OK ? "loaded" : msg);
      CHECK(0);
    } else CHECK(1);
    jinja_destroy(&t);
  }
  /* nesting deep enough to overflow a recursive parser is refused, not crashed on */
  size_t depth = 100000;
  char *deep = malloc(2 * depth + 16);
  memcpy(deep, "{{ ", 3);
  memset(deep + 3, '(', depth);
  deep[3 + depth] = '1';
  memset(deep + 4 + depth, ')', depth);
  strcpy(deep + 4 + 2 * depth, " }}");
  jinja_tmpl *t = NULL;
  CHECK(jinja_load(deep, strlen(deep), "t.jinja", &t) != FSDP_OK);
  CHECK(strstr(fsdp_last_error(), "nested more than 200 deep") != NULL);
  free(deep);
}

/* A loaded template renders many times with different variables; nothing carries over. */
static void test_reuse(void) {
  jinja_tmpl *t;
  const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}";
  CHECK_OK(jinja_load(src, strlen(src), "t.jinja", &t));
  for (int k = 0; k < 3; k++) {
    json_t *v = json_pack("{s:[{s:s}, {s:s}]}", "messages", "role", "user", "role", "assistant");
    char *out;
    size_t n;
    CHECK_OK(jinja_render(t, v, &out, &n, NULL, NULL));
    CHECK(!strcmp(out, "2"));
    free(out);
    json_decref(v);
  }
  jinja_destroy(&t);
  CHECK(t == NULL);
}

int main(void) {
  test_rendering();
  test_spans();
  test_render_errors();
  test_refusals();
  test_reuse();
  return check_done();
}
