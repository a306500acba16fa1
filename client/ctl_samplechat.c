/* ctl_samplechat — `fsdpctl sample MODEL --chat QUESTION [--system TEXT]`: the conversation rendered
 * with the model's chat template and add_generation_prompt, encoded as transformers'
 * apply_chat_template(..., add_generation_prompt=True) encodes it (no special tokens added: the
 * template writes them), and the ids that end the assistant's turn. ctl_sample passes both to the
 * worker as --prompt-ids and --stop-ids. Runs on fsdpctl's thread only.
 *
 * The stop ids are, together: tokenizer_config.json's eos_token, generation_config.json's
 * eos_token_id (a number or a list), and the template's own end of turn — the special token that
 * the template writes right after an assistant message's content (<|im_end|>, <|eot_id|>,
 * <end_of_turn>, ...), found by rendering a one-turn conversation with a probe as the answer.
 */
#include "ctl_samplechat.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctl_chat.h"

#define PROBE "fsdpd-end-of-turn-probe"

static int is_dir(const char *p) {
  struct stat st;
  return p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The folder the template comes from: MODEL when it is one, else --tokenizer's, else the folder of
 * MODEL's .safetensors file. */
static void chat_dir(const sample_chat_args *a, char *buf, size_t n) {
  const char *slash;
  if (is_dir(a->model)) snprintf(buf, n, "%s", a->model);
  else if (is_dir(a->tokenizer)) snprintf(buf, n, "%s", a->tokenizer);
  else if ((slash = strrchr(a->model, '/'))) snprintf(buf, n, "%.*s", (int)(slash - a->model), a->model);
  else snprintf(buf, n, ".");
}

static fsdp_status render(const jinja_tmpl *t, const json_t *special, json_t *msgs, int agp, char **out, size_t *n) {
  json_t *v = json_deep_copy(special);
  json_object_set(v, "messages", msgs);
  json_object_set_new(v, "add_generation_prompt", json_boolean(agp));
  json_object_set_new(v, "tools", json_null());
  json_object_set_new(v, "documents", json_null());
  fsdp_status rc = jinja_render(t, v, out, n, NULL, NULL);
  json_decref(v);
  return rc;
}

static void add_stop(json_t *stops, json_int_t id) {
  size_t i;
  json_t *x;
  json_array_foreach(stops, i, x) if (json_integer_value(x) == id) return;
  json_array_append_new(stops, json_integer(id));
}

/* The special token the template writes right after an assistant message's content, or -1. */
static int64_t turn_end(const jinja_tmpl *t, const json_t *special, const bpe_tokenizer *tok) {
  json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "Hi", "role", "assistant", "content", PROBE);
  char *text = NULL, *dec = NULL;
  size_t n = 0, dn = 0;
  int64_t id = -1;
  bpe_state *st = NULL;
  bpe_ids ids = {0};
  const char *at = NULL;
  if (render(t, special, msgs, 0, &text, &n) == FSDP_OK)
    for (const char *q = text; (q = strstr(q, PROBE)); q++) at = q + strlen(PROBE);
  if (at && *at && bpe_state_new(tok, &st) == FSDP_OK && bpe_encode(st, at, strlen(at), 0, &ids) == FSDP_OK && ids.n &&
      bpe_decode(tok, ids.v, 1, 1, &dec, &dn) == FSDP_OK && dn == 0)   /* special: skipped when decoding */
    id = ids.v[0];
  bpe_state_destroy(&st);
  free(ids.v), free(text), free(dec);
  json_decref(msgs);
  return id;
}

/* Every stop id (see the header comment) into STOPS. */
static void stop_ids(const char *dir, const jinja_tmpl *t, const json_t *special, const bpe_tokenizer *tok, json_t *stops) {
  const char *eos = json_string_value(json_object_get(special, "eos_token"));
  int64_t id = eos ? bpe_token_id(tok, eos) : -1;
  if (id >= 0) add_stop(stops, id);
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  json_t *g = json_load_file(path, 0, NULL), *e = json_object_get(g, "eos_token_id"), *x;
  size_t i;
  if (json_is_integer(e)) add_stop(stops, json_integer_value(e));
  json_array_foreach(e, i, x) if (json_is_integer(x)) add_stop(stops, json_integer_value(x));
  json_decref(g);
  if ((id = turn_end(t, special, tok)) >= 0) add_stop(stops, id);
}

static char *ids_text(const uint32_t *v, size_t n) {
  char *s = malloc(n * 11 + 1), *p = s;
  if (!s) return NULL;
  *p = 0;
  for (size_t i = 0; i < n; i++) p += sprintf(p, i ? " %u" : "%u", v[i]);
  return s;
}

int sample_chat_prompt(const sample_chat_args *a, sample_chat_prompt_t *out) {
  memset(out, 0, sizeof *out);
  char dir[PATH_MAX], name[PATH_MAX + 64];
  chat_dir(a, dir, sizeof dir);
  chat_args ca = {.model = dir, .template_path = a->template_path};
  json_t *special = json_object(), *msgs = json_array(), *stops = json_array();
  bpe_tokenizer *tok = NULL;
  jinja_tmpl *t = NULL;
  bpe_state *st = NULL;
  bpe_ids ids = {0};
  int rc = 2;
  if (bpe_load(a->tokenizer ? a->tokenizer : dir, &tok) != FSDP_OK) {
    fprintf(stderr, "fsdpctl sample: --chat needs the model's tokenizer.json: %s\n", fsdp_last_error());
    goto out;
  }
  char *src = chat_template_text(&ca, "sample", special, name, sizeof name);
  if (!src) goto out;
  fsdp_status ls = jinja_load(src, strlen(src), name, &t);
  free(src);
  if (ls != FSDP_OK) {
    fprintf(stderr, "fsdpctl sample: %s\n", fsdp_last_error());
    goto out;
  }
  if (a->system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", a->system));
  json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", a->question));
  if (json_array_size(msgs) != 1u + !!a->system) {
    fprintf(stderr, "fsdpctl sample: --chat and --system take UTF-8 text\n");
    goto out;
  }
  if (render(t, special, msgs, 1, &out->text, &out->text_n) != FSDP_OK ||
      bpe_state_new(tok, &st) != FSDP_OK || bpe_encode(st, out->text, out->text_n, 0, &ids) != FSDP_OK) {
    fprintf(stderr, "fsdpctl sample: %s\n", fsdp_last_error());
    goto out;
  }
  stop_ids(dir, t, special, tok, stops);
  out->prompt_ids = ids_text(ids.v, ids.n);
  out->nstop = json_array_size(stops);
  uint32_t sv[64];
  size_t i;
  json_t *x;
  json_array_foreach(stops, i, x) if (i < 64) sv[i] = (uint32_t)json_integer_value(x);
  if (out->nstop > 64) out->nstop = 64;
  out->stop_ids = ids_text(sv, out->nstop);
  rc = out->prompt_ids && out->stop_ids ? 0 : 1;
  if (rc) fprintf(stderr, "fsdpctl sample: out of memory\n");
out:
  bpe_state_destroy(&st);
  free(ids.v);
  jinja_destroy(&t);
  bpe_destroy(&tok);
  json_decref(special), json_decref(msgs), json_decref(stops);
  return rc;
}

void sample_chat_prompt_free(sample_chat_prompt_t *p) {
  free(p->text), free(p->prompt_ids), free(p->stop_ids);
  memset(p, 0, sizeof *p);
}
