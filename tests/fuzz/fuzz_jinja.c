/* fuzz_jinja — libFuzzer target for common/jinja, whose input comes from outside: a chat template
 * shipped with a downloaded model. Any input must load or be refused, never crash; a loaded one
 * renders (or fails with a message) against a fixed conversation with a system prompt, tool calls,
 * a tool result, non-ASCII text and a tool list, within the render's limits. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

static json_t *vars(void) {
  static json_t *v;
  if (!v)
    v = json_loads(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
        " {\"role\": \"user\", \"content\": \"Gr\\u00fc\\u00dfe \\ud83c\\udf89 \\n tab\\t\"},"
        " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\":"
        " {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}]},"
        " {\"role\": \"tool\", \"content\": \"{\\\"r\\\": 1}\"}, {\"role\": \"assistant\", \"content\": \"ok\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
        " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"documents\": null}",
        0, NULL);
  return v;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
  jinja_tmpl *t = NULL;
  if (jinja_load((const char *)data, size, "fuzz.jinja", &t) != FSDP_OK) return 0;
  char *out = NULL;
  size_t n = 0, nspans = 0;
  jinja_span *spans = NULL;
  if (jinja_render(t, vars(), &out, &n, &spans, &nspans) == FSDP_OK) {
    if (strlen(out) > n) abort();   /* the length covers the text */
    for (size_t i = 0; i < nspans; i++)
      if (spans[i].start > spans[i].end || spans[i].end > n) abort();
  }
  free(out);
  free(spans);
  jinja_destroy(&t);
  return 0;
}
