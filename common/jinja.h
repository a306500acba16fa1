/* jinja — the Jinja subset that published chat templates use, rendered exactly as transformers'
 * apply_chat_template renders them (jinja2's ImmutableSandboxedEnvironment with trim_blocks,
 * lstrip_blocks, the loopcontrols extension and transformers' {% generation %} tag and tojson).
 *
 * jinja_load() lexes and parses a template once; a construct outside the subset (an unknown tag,
 * filter, test, method or function; include, import, extends, call blocks, recursive loops) is
 * refused there with one line naming it and its template line — never rendered differently.
 * jinja_render() evaluates it against a JSON object of variables (messages, bos_token, eos_token,
 * add_generation_prompt, tools, ...; transformers' own names) and returns the text, and, when asked,
 * the byte ranges that {% generation %} blocks produced (transformers' assistant mask). An error
 * while rendering (raise_exception, an undefined value used as an object, a type error) is one
 * line with the template line; so is a render past the limits below. The functions `raise_exception`, `strftime_now`, `range`,
 * `namespace` and `dict` are built in.
 *
 * A loaded jinja_tmpl is immutable: any number of threads may render it at once. Each render owns
 * its memory (an arena freed before it returns); the caller frees *out with free(). The template
 * is freed with jinja_destroy().
 */
#ifndef FSDP_JINJA_H
#define FSDP_JINJA_H

#include <jansson.h>
#include <stddef.h>

#include "err.h"

typedef struct jinja_tmpl jinja_tmpl;

/* What one render may use: a template that would run longer or grow larger (a loop that does
 * not end, a string doubled in a loop) fails with a line saying so. A chat template on a real
 * conversation stays orders of magnitude below. */
#define JINJA_MAX_STEPS 10000000          /* statements executed */
#define JINJA_MAX_OUTPUT (256 << 20)      /* bytes of output */
#define JINJA_MAX_MEMORY ((size_t)1 << 29) /* bytes of values */

/* One {% generation %} block's output: bytes [start, end) of the rendered text. */
typedef struct jinja_span {
  size_t start, end;
} jinja_span;

/* Parse SRC (LEN bytes, UTF-8). NAME is what messages call the template (a file name). */
fsdp_status jinja_load(const char *src, size_t len, const char *name, jinja_tmpl **out);
/* Render with VARS (a JSON object; NULL for none). *OUT is NUL-terminated, *OUTLEN its length.
 * SPANS (may be NULL) receives a malloc'd array of the generation blocks' ranges, *NSPANS their
 * count, in the order they closed. */
fsdp_status jinja_render(const jinja_tmpl *t, const json_t *vars, char **out, size_t *outlen,
                         jinja_span **spans, size_t *nspans);
/* Whether the template has {% generation %} blocks (then render's spans are the assistant mask). */
int jinja_has_generation(const jinja_tmpl *t);
void jinja_destroy(jinja_tmpl **t);

#endif
