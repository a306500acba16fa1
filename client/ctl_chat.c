/* ctl_chat — gen-data --chat's command line, template and output (see ctl_chat.h). */
#include "ctl_chat.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokmask.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: fsdpctl gen-data --chat FILE.jsonl... (--model DIR | --tokenizer FILE|DIR --template FILE.jinja)\n"
          "                        -o OUT.bin [--train-on assistant|last|all] [--seq-len N [--overlong truncate|drop]]\n"
          "                        [--val OUT_VAL.bin --val-fraction F] [--eos] [--strict] [--threads N] [--json]\n"
          "\n"
          "Each line is {\"messages\": [{\"role\": system|user|assistant|tool, \"content\": ...}, ...]},\n"
          "{\"prompt\": ..., \"completion\": ...} or {\"text\": ...}. Conversations are rendered with the chat\n"
          "template (DIR's tokenizer_config.json chat_template or chat_template.jinja, or --template),\n"
          "encoded with the tokenizer, and written with a loss mask: --train-on assistant (default) trains\n"
          "every assistant turn's content and end-of-turn tokens, last the final one, all every token; a\n"
          "{\"text\"} line is trained whole. A malformed line is named (FILE:LINE) and skipped, or fatal with\n"
          "--strict. A conversation longer than --seq-len tokens is truncated, or dropped with --overlong\n"
          "drop. --val puts the last floor(F x conversations) conversations in OUT_VAL.bin. --eos puts the\n"
          "tokenizer's end-of-text token (not trained) before each conversation. Every core renders and\n"
          "encodes (--threads N); the output is the same for any N. docs/data.md has the format.\n");
}

/* A special token of tokenizer_config.json: a string, or an object with "content". */
static void add_special(json_t *special, json_t *cfg, const char *key) {
  json_t *v = json_object_get(cfg, key);
  if (json_is_object(v)) v = json_object_get(v, "content");
  if (json_is_string(v)) json_object_set(special, key, v);
}

char *chat_template_text(const chat_args *a, const char *cmd, json_t *special, char *name, size_t namelen) {
  char path[PATH_MAX];
  size_t n;
  json_t *cfg = NULL;
  const char *dir = a->model ? a->model : a->tokenizer;
  struct stat st;
  if (dir && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cfg = json_load_file(path, 0, NULL);
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (int k = 0; cfg && k < 4; k++) add_special(special, cfg, keys[k]);
  }
  char *text = NULL;
  if (a->template_path) {
    snprintf(name, namelen, "%s", a->template_path);
    if (!(text = chat_slurp(a->template_path, &n)))
      fprintf(stderr, "fsdpctl %s: cannot read the template %s: %s\n", cmd, a->template_path, strerror(errno));
    json_decref(cfg);
    return text;
  }
  json_t *ct = json_object_get(cfg, "chat_template");
  if (json_is_array(ct)) {
    size_t i;
    json_t *e, *pick = NULL;
    json_array_foreach(ct, i, e) if (!strcmp(json_string_value(json_object_get(e, "name")) ?: "", "default")) pick = e;
    ct = pick ? json_object_get(pick, "template") : NULL;
  }
  if (json_is_string(ct)) {
    snprintf(name, namelen, "%s/tokenizer_config.json chat_template", a->model);
    text = strdup(json_string_value(ct));
  } else {
    snprintf(path, sizeof path, "%s/chat_template.jinja", a->model);
    snprintf(name, namelen, "%s", path);
    if (!(text = chat_slurp(path, &n)))
      fprintf(stderr, "fsdpctl %s: %s has no chat template: neither tokenizer_config.json's chat_template "
              "nor chat_template.jinja; give --template FILE.jinja\n", cmd, a->model);
  }
  json_decref(cfg);
  return text;
}

static int parse_args(int argc, char **argv, chat_args *a) {
  static const struct option opts[] = {
      {"chat", required_argument, NULL, 'c'},     {"model", required_argument, NULL, 'M'},
      {"tokenizer", required_argument, NULL, 'T'}, {"template", required_argument, NULL, 'J'},
      {"output", required_argument, NULL, 'o'},   {"val", required_argument, NULL, 'V'},
      {"val-fraction", required_argument, NULL, 'f'}, {"train-on", required_argument, NULL, 'r'},
      {"seq-len", required_argument, NULL, 's'},  {"overlong", required_argument, NULL, 'L'},
      {"strict", no_argument, NULL, 'S'},         {"eos", no_argument, NULL, 'E'},
      {"json", no_argument, NULL, 'j'},           {"help", no_argument, NULL, 'h'},
      {"threads", required_argument, NULL, 'P'},
      {NULL, 0, NULL, 0}};
  a->frac = -1;
  optind = 1;
  int ch;
  while ((ch = getopt_long(argc, argv, "-o:h", opts, NULL)) != -1) {
    char *end;
    switch (ch) {
    case 'c': a->in.files[a->in.nfiles++] = optarg; break;
    case 1:
      if (!a->in.nfiles) return fprintf(stderr, "fsdpctl gen-data: unexpected argument '%s' (conversation files follow --chat)\n", optarg), 2;
      a->in.files[a->in.nfiles++] = optarg;
      break;
    case 'M': a->model = optarg; break;
    case 'T': a->tokenizer = optarg; break;
    case 'J': a->template_path = optarg; break;
    case 'o': a->out = optarg; break;
    case 'V': a->val = optarg; break;
    case 'f':
      errno = 0;
      a->frac = strtod(optarg, &end);
      if (errno || end == optarg || *end || !(a->frac > 0 && a->frac < 1))
        return fprintf(stderr, "fsdpctl gen-data: --val-fraction '%s': expected a number > 0 and < 1\n", optarg), 2;
      break;
    case 'r':
      if (!strcmp(optarg, "assistant")) a->train_on = CHAT_TRAIN_ASSISTANT;
      else if (!strcmp(optarg, "last")) a->train_on = CHAT_TRAIN_LAST;
      else if (!strcmp(optarg, "all")) a->train_on = CHAT_TRAIN_ALL;
      else return fprintf(stderr, "fsdpctl gen-data: --train-on '%s': expected assistant, last or all\n", optarg), 2;
      break;
    case 's':
      errno = 0;
      a->in.seq_len = strtoll(optarg, &end, 10);
      if (errno || end == optarg || *end || a->in.seq_len < 2 || a->in.seq_len > INT32_MAX)
        return fprintf(stderr, "fsdpctl gen-data: --seq-len '%s': expected an integer from 2 to %d\n", optarg, INT32_MAX), 2;
      break;
    case 'L':
      if (strcmp(optarg, "truncate") && strcmp(optarg, "drop"))
        return fprintf(stderr, "fsdpctl gen-data: --overlong '%s': expected truncate or drop\n", optarg), 2;
      a->in.drop_overlong = optarg[0] == 'd';
      break;
    case 'S': a->in.strict = 1; break;
    case 'P':
      errno = 0;
      a->in.threads = (int)strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || a->in.threads < 1 || a->in.threads > 1024)
        return fprintf(stderr, "fsdpctl gen-data: --threads '%s': expected an integer from 1 to 1024\n", optarg), 2;
      break;
    case 'E': a->eos = 1; break;
    case 'j': a->json = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  const char *why = NULL;
  if (!a->in.nfiles) why = "--chat needs at least one FILE.jsonl";
  else if (!a->model && !(a->tokenizer && a->template_path))
    why = "--chat needs --model DIR, or --tokenizer FILE|DIR with --template FILE.jinja";
  else if (!a->out) why = "--chat needs -o OUT.bin";
  else if ((!a->val) != (a->frac < 0)) why = "--val OUT_VAL.bin and --val-fraction F go together";
  else if (a->val && !strcmp(a->val, a->out)) why = "--val and -o name the same file; give two paths";
  if (why) {
    fprintf(stderr, "fsdpctl gen-data: %s\n", why);
    usage(stderr);
    return 2;
  }
  return -1;
}

static int write_outputs(const chat_args *a, const out_buf *o, int vocab) {
  size_t split = o->n, nval_docs = 0;
  if (a->val) {
    nval_docs = (size_t)floor(a->frac * (double)o->ndocs);
    if (!nval_docs) {
      fprintf(stderr, "fsdpctl gen-data: --val-fraction %g of %zu conversations leaves the validation set empty\n", a->frac, o->ndocs);
      return -1;
    }
    split = o->doc_at[o->ndocs - nval_docs];
  }
  if (o->n > INT32_MAX) {
    fprintf(stderr, "fsdpctl gen-data: %zu tokens; a token file holds at most %d: split the conversations\n", o->n, INT32_MAX);
    return -1;
  }
  fsdp_status rc = tokmask_write(a->out, o->ids, o->mask, o->starts, (int64_t)split, vocab);
  if (rc == FSDP_OK && a->val)
    rc = tokmask_write(a->val, o->ids + split, o->mask + split, o->starts + split, (int64_t)(o->n - split), vocab);
  if (rc != FSDP_OK) {
    fprintf(stderr, "fsdpctl gen-data: %s\n", fsdp_last_error());
    return -1;
  }
  return 0;
}

static void report(const chat_args *a, const out_buf *o, const counts *k, int vocab) {
  size_t trained = 0;
  for (size_t i = 0; i < o->n; i++) trained += o->mask[i];
  if (a->json) {
    json_t *j = json_pack("{s:s, s:I, s:I, s:i, s:I, s:I, s:I, s:I, s:I}", "path", a->out, "tokens", (json_int_t)o->n,
                          "trained_tokens", (json_int_t)trained, "vocab", vocab, "lines", (json_int_t)k->lines,
                          "conversations", (json_int_t)k->convs, "malformed", (json_int_t)k->malformed, "truncated",
                          (json_int_t)k->truncated, "dropped", (json_int_t)k->dropped);
    if (j && a->val) json_object_set_new(j, "val_path", json_string(a->val));
    if (j) json_dumpf(j, stdout, JSON_COMPACT);
    printf("\n");
    json_decref(j);
    return;
  }
  printf("wrote %zu conversations, %zu tokens (%zu trained) to %s%s%s (vocab %d); %zu lines read, %zu malformed "
         "(skipped), %zu truncated, %zu dropped as longer than --seq-len\n",
         k->convs, o->n, trained, a->out, a->val ? " and the validation set to " : "", a->val ? a->val : "", vocab,
         k->lines, k->malformed, k->truncated, k->dropped);
}

int ctl_chat(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout), 0;
  chat_args a = {.in.files = calloc((size_t)argc + 1, sizeof(char *))};
  if (!a.in.files) return fprintf(stderr, "fsdpctl gen-data: out of memory\n"), 1;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0) {
    free(a.in.files);
    return rc;
  }
  rc = 1;
  bpe_tokenizer *tok = NULL;
  jinja_tmpl *tmpl = NULL;
  chat_ctx c = {.special = json_object(), .train_on = a.train_on};
  out_buf o = {0};
  counts k = {0};
  char name[PATH_MAX + 64];
  if (bpe_load(a.tokenizer ? a.tokenizer : a.model, &tok) != FSDP_OK) {
    fprintf(stderr, "fsdpctl gen-data: %s\n", fsdp_last_error());
    goto done;
  }
  int bytelevel = 0;   /* the mask needs tokens that spell bytes: refuse another tokenizer once, here */
  char probe[1024];
  for (uint32_t id = 0; id < 4096 && id < (uint32_t)bpe_vocab_size(tok) && !bytelevel; id++)
    bytelevel = bpe_token_bytes(tok, id, probe, sizeof probe) >= 0;
  if (!bytelevel) {
    fprintf(stderr, "fsdpctl gen-data: --chat needs a byte-level tokenizer (a ByteLevel decoder: GPT-2, Llama 3, "
            "Qwen 2, SmolLM) to place the loss mask; %s is not one\n", a.tokenizer ? a.tokenizer : a.model);
    goto done;
  }
  char *text = chat_template_text(&a, "gen-data", c.special, name, sizeof name);
  if (!text) goto done;
  fsdp_status ls = jinja_load(text, strlen(text), name, &tmpl);
  free(text);
  if (ls != FSDP_OK) {
    fprintf(stderr, "fsdpctl gen-data: %s\n", fsdp_last_error());
    goto done;
  }
  c.has_generation = jinja_has_generation(tmpl);
  int64_t eos = a.eos ? bpe_eos_id(tok) : -1;
  if (a.eos && eos < 0) {
    fprintf(stderr, "fsdpctl gen-data: --eos: the tokenizer has no end-of-text token\n");
    goto done;
  }
  c.tmpl = tmpl, c.tok = tok;
  if (chat_run(&a.in, &c, &o, &k, eos)) goto done;
  if (!k.convs) {
    fprintf(stderr, "fsdpctl gen-data: no conversation in %d file%s (%zu lines, %zu malformed)\n", a.in.nfiles,
            a.in.nfiles > 1 ? "s" : "", k.lines, k.malformed);
    goto done;
  }
  int vocab = (int)bpe_vocab_size(tok);
  if (write_outputs(&a, &o, vocab)) goto done;
  report(&a, &o, &k, vocab);
  rc = 0;
done:
  free(o.ids), free(o.mask), free(o.starts), free(o.doc_at);
  json_decref(c.special);
  jinja_destroy(&tmpl);
  bpe_destroy(&tok);
  free(a.in.files);
  return rc;
}
