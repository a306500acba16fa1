/* jinja_tool — renders a chat template for tests/integration/chat_template_hf.sh (not a test itself).
 *   jinja_tool TEMPLATE.jinja VARS.jsonl
 * One output line per input line (a JSON object of template variables): {"out": TEXT, "spans":
 * [[start, end], ...]} with the {% generation %} blocks' byte ranges, or {"error": MESSAGE}. A
 * template that does not load prints {"refused": MESSAGE} once and exits with status 2. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *s = malloc(cap);
  for (size_t k; s && (k = fread(s + len, 1, cap - len, f)) > 0;) {
    len += k;
    if (len == cap) s = realloc(s, cap *= 2);
  }
  fclose(f);
  *n = len;
  return s;
}

static void emit(json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
  puts(s ? s : "{\"error\": \"cannot encode the result\"}");
  free(s);
  json_decref(o);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: jinja_tool TEMPLATE.jinja VARS.jsonl\n");
    return 1;
  }
  size_t n;
  char *src = slurp(argv[1], &n);
  if (!src) {
    fprintf(stderr, "cannot read %s\n", argv[1]);
    return 1;
  }
  jinja_tmpl *t;
  if (jinja_load(src, n, argv[1], &t) != FSDP_OK) {
    emit(json_pack("{s:s}", "refused", fsdp_last_error()));
    free(src);
    return 2;
  }
  free(src);
  FILE *in = fopen(argv[2], "r");
  if (!in) {
    fprintf(stderr, "cannot read %s\n", argv[2]);
    return 1;
  }
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, in) > 0) {
    json_error_t je;
    json_t *vars = json_loads(line, 0, &je);
    if (!vars) {
      emit(json_pack("{s:s}", "error", je.text));
      continue;
    }
    char *out;
    size_t outlen, nspans;
    jinja_span *spans;
    if (jinja_render(t, vars, &out, &outlen, &spans, &nspans) != FSDP_OK) {
      emit(json_pack("{s:s}", "error", fsdp_last_error()));
    } else {
      json_t *sp = json_array();
      for (size_t i = 0; i < nspans; i++) json_array_append_new(sp, json_pack("[I,I]", (json_int_t)spans[i].start, (json_int_t)spans[i].end));
      emit(json_pack("{s:s%,s:o}", "out", out, outlen, "spans", sp));
      free(out);
      free(spans);
    }
    json_decref(vars);
  }
  free(line);
  fclose(in);
  jinja_destroy(&t);
  return 0;
}
