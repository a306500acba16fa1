/* ctl_chatconv — one JSONL line of gen-data --chat to tokens and a loss mask (see ctl_chatconv.h).
 *
 * The trained bytes: a template with {% generation %} blocks marks them itself (transformers'
 * return_assistant_tokens_mask). Any other template is rendered once per assistant turn: the
 * messages before it with add_generation_prompt (A), and the messages up to it (B); the turn is
 * the bytes B adds to A (its content and end-of-turn marker, no role header), cut where B stops
 * agreeing with the whole conversation's rendering (a template that closes the last message with an
 * end-of-text token). A must be a prefix of the whole, else the line is refused (the template
 * rewrites earlier turns). A token is trained when its bytes meet a trained span: the tokens of
 * byte-level tokenizers spell the rendered text byte for byte, which is checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_chatconv.h"

static int fail(char *why, size_t n, const char *fmt, const char *arg) {
  snprintf(why, n, fmt, arg ? arg : "");
  return -1;
}

/* transformers' _alias_reasoning_fields, applied before it renders: a message's reasoning under any
 * of its names (reasoning_content, thinking, reasoning) is also under "thinking" (first) and
 * "reasoning_content" (last). Returns a new reference. */
static json_t *alias_reasoning(json_t *msg) {
  static const char *const names[] = {"reasoning_content", "thinking", "reasoning"};
  json_t *r = NULL;
  for (int k = 0; k < 3 && !r; k++) {
    json_t *v = json_object_get(msg, names[k]);
    if (v && !json_is_null(v)) r = v;
  }
  if (!r) return json_incref(msg);
  json_t *o = json_object();
  json_object_set(o, "thinking", r);
  const char *key;
  json_t *v;
  json_object_foreach(msg, key, v) json_object_set(o, key, v);
  json_object_set(o, "reasoning_content", r);
  return o;
}

/* The conversation of a line as a messages array (new reference), or NULL with WHY. */
static json_t *messages_of(json_t *o, char *why, size_t wn, int *plain) {
  *plain = 0;
  json_t *m = json_object_get(o, "messages");
  if (m) {
    if (!json_is_array(m) || !json_array_size(m)) return fail(why, wn, "\"messages\" must be a non-empty array", NULL), NULL;
    size_t i;
    json_t *x;
    json_array_foreach(m, i, x) {
      const char *role = json_string_value(json_object_get(x, "role"));
      static const char *const roles[] = {"system", "user", "assistant", "tool"};
      int ok = 0;
      for (int k = 0; role && k < 4; k++) ok |= !strcmp(role, roles[k]);
      if (!json_is_object(x) || !ok)
        return fail(why, wn, "every message needs a \"role\" of system, user, assistant or tool", NULL), NULL;
      if (!json_is_string(json_object_get(x, "content")))
        return fail(why, wn, "message \"content\" must be a string (in a %s message)", role), NULL;
    }
    json_t *out = json_array();
    json_array_foreach(m, i, x) json_array_append_new(out, alias_reasoning(x));
    return out;
  }
  json_t *p = json_object_get(o, "prompt"), *c = json_object_get(o, "completion");
  if (p || c) {
    if (!json_is_string(p) || !json_is_string(c))
      return fail(why, wn, "\"prompt\" and \"completion\" must both be strings", NULL), NULL;
    return json_pack("[{s:s,s:O},{s:s,s:O}]", "role", "user", "content", p, "role", "assistant", "content", c);
  }
  if (json_is_string(json_object_get(o, "text"))) {
    *plain = 1;
    return NULL;
  }
  return fail(why, wn, "expected a JSON object with \"messages\", \"prompt\" and \"completion\", or \"text\"", NULL), NULL;
}

static int render(chat_ctx *c, json_t *msgs, json_t *tools, int agp, char **out, size_t *n, jinja_span **sp, size_t *ns,
                  char *why, size_t wn) {
  json_t *v = json_deep_copy(c->special);
  json_object_set(v, "messages", msgs);
  json_object_set_new(v, "add_generation_prompt", json_boolean(agp));
  json_object_set(v, "tools", tools ? tools : json_null());
  json_object_set_new(v, "documents", json_null());
  fsdp_status rc = jinja_render(c->tmpl, v, out, n, sp, ns);
  json_decref(v);
  if (rc != FSDP_OK) return fail(why, wn, "%s", fsdp_last_error());
  return 0;
}

typedef struct spans {
  jinja_span *v;
  size_t n;
} spans;

/* The assistant turns' bytes by rendering each prefix (templates without {% generation %}). */
static int prefix_spans(chat_ctx *c, json_t *msgs, json_t *tools, const char *full, size_t fulln, spans *out, char *why,
                        size_t wn) {
  size_t nm = json_array_size(msgs);
  out->v = calloc(nm + 1, sizeof *out->v);
  out->n = 0;
  if (!out->v) return fail(why, wn, "out of memory", NULL);
  for (size_t i = 0; i < nm; i++) {
    if (strcmp(json_string_value(json_object_get(json_array_get(msgs, i), "role")), "assistant")) continue;
    json_t *before = json_array(), *u2 = json_array();   /* msgs[0..i-1] and msgs[0..i] */
    for (size_t k = 0; k <= i; k++) {
      if (k < i) json_array_append(before, json_array_get(msgs, k));
      json_array_append(u2, json_array_get(msgs, k));
    }
    char *a = NULL, *b = NULL;
    size_t an = 0, bn = 0;
    int rc = render(c, before, tools, 1, &a, &an, NULL, NULL, why, wn);
    if (!rc) rc = render(c, u2, tools, 0, &b, &bn, NULL, NULL, why, wn);
    size_t common = 0;
    while (!rc && common < bn && common < fulln && b[common] == full[common]) common++;
    if (!rc && !(an <= common && !memcmp(a, full, an)))
      rc = fail(why, wn, "the template does not render this conversation's beginning as the beginning of the whole "
                "(it rewrites earlier turns), so the assistant turns cannot be placed; use a template with "
                "{%% generation %%} blocks", NULL);
    if (!rc) out->v[out->n++] = (jinja_span){an, common};
    free(a), free(b);
    json_decref(before), json_decref(u2);
    if (rc) return rc;
  }
  return 0;
}

static int grow_mask(chat_doc *d, size_t n) {
  if (n <= d->cap_mask) return 0;
  uint8_t *m = realloc(d->mask, n);
  if (!m) return -1;
  d->mask = m;
  d->cap_mask = n;
  return 0;
}

/* Encode TEXT into DOC and mark the tokens that meet a span of S (all tokens when S is NULL). */
static int encode_masked(chat_ctx *c, const char *text, size_t n, const spans *s, chat_doc *doc, char *why, size_t wn) {
  if (bpe_encode(c->st, text, n, 0, &doc->ids) != FSDP_OK) return fail(why, wn, "%s", fsdp_last_error());
  if (grow_mask(doc, doc->ids.n + 1)) return fail(why, wn, "out of memory", NULL);
  if (!s) {
    memset(doc->mask, 1, doc->ids.n);
    return 0;
  }
  size_t at = 0, k = 0;
  char buf[1024];
  for (size_t i = 0; i < doc->ids.n; i++) {
    long len = bpe_token_bytes(c->tok, doc->ids.v[i], buf, sizeof buf);
    if (len < 0) return fail(why, wn, "the tokenizer is not byte-level, so its tokens cannot be mapped to the "
                             "template's bytes for the loss mask (gen-data --chat needs a ByteLevel tokenizer)", NULL);
    if (at + (size_t)len > n || memcmp(text + at, buf, (size_t)len))
      return fail(why, wn, "the tokens do not spell the rendered text byte for byte (the tokenizer's normalizer "
                  "changed it), so the loss mask cannot be placed", NULL);
    size_t e = at + (size_t)len;
    while (k < s->n && s->v[k].end <= at) k++;
    int trained = 0;
    for (size_t j = k; j < s->n && s->v[j].start < e && !trained; j++) trained = s->v[j].end > at && s->v[j].start < s->v[j].end;
    doc->mask[i] = (uint8_t)trained;
    at = e;
  }
  if (at != n) return fail(why, wn, "the tokens do not cover the rendered text, so the loss mask cannot be placed", NULL);
  return 0;
}

int chat_line(chat_ctx *c, const char *line, size_t len, chat_doc *doc, char *why, size_t wn) {
  doc->ids.n = 0;
  json_error_t je;
  json_t *o = json_loadb(line, len, 0, &je);
  if (!json_is_object(o)) {
    json_decref(o);
    return fail(why, wn, o ? "expected a JSON object" : "not JSON: %s", o ? NULL : je.text);
  }
  int plain, rc = 0;
  json_t *msgs = messages_of(o, why, wn, &plain);
  if (plain) {   /* {"text"}: no template, every token trained */
    json_t *t = json_object_get(o, "text");
    rc = encode_masked(c, json_string_value(t), json_string_length(t), NULL, doc, why, wn);
    json_decref(o);
    return rc;
  }
  json_t *tools = json_object_get(o, "tools");   /* a line's own tool list, as TRL's "tools" column */
  tools = json_is_null(tools) ? NULL : json_incref(tools);
  json_decref(o);
  if (!msgs) {
    json_decref(tools);
    return -1;
  }
  if (tools && !json_is_array(tools)) {
    json_decref(tools);
    json_decref(msgs);
    return fail(why, wn, "\"tools\" must be an array of tool schemas", NULL);
  }
  char *full = NULL;
  size_t fulln = 0;
  spans s = {0};
  rc = render(c, msgs, tools, 0, &full, &fulln, c->has_generation ? &s.v : NULL, c->has_generation ? &s.n : NULL, why, wn);
  if (!rc && !c->has_generation && c->train_on != CHAT_TRAIN_ALL)
    rc = prefix_spans(c, msgs, tools, full, fulln, &s, why, wn);
  if (!rc && c->train_on != CHAT_TRAIN_ALL && !s.n) rc = fail(why, wn, "the conversation has no assistant turn to train on", NULL);
  if (!rc && c->train_on == CHAT_TRAIN_LAST && s.n > 1) {
    s.v[0] = s.v[s.n - 1];
    s.n = 1;
  }
  if (!rc) rc = encode_masked(c, full, fulln, c->train_on == CHAT_TRAIN_ALL ? NULL : &s, doc, why, wn);
  free(full);
  free(s.v);
  json_decref(msgs);
  json_decref(tools);
  return rc;
}
