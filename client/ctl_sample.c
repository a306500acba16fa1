/* ctl_sample — `fsdpctl sample MODEL --prompt TEXT [...]`: what a trained model writes. The forward
 * pass is worker code, so fsdpctl runs the fsdp-worker beside it in its sample mode (worker/sample.h)
 * and passes its output and exit status through; the CLI never links worker code. With --chat the
 * prompt is a conversation rendered here (ctl_samplechat.h), given to the worker as ids with the
 * ids that end the turn. */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "ctl.h"
#include "ctl_samplechat.h"
#include "envknob.h"

static void sample_usage(FILE *f) {
  fprintf(f,
          "usage: fsdpctl sample MODEL --prompt TEXT [--tokens N] [--temperature X] [--top-k K] [--seed S]\n"
          "                      [--tokenizer FILE|DIR] [--logits] [--adapter DIR]\n"
          "       fsdpctl sample MODEL --chat QUESTION [--system TEXT] [--template FILE.jinja] [--print-prompt]\n"
          "                      [--tokens N] [--temperature X] [--top-k K] [--seed S] [--tokenizer FILE|DIR]\n"
          "\n"
          "Continue TEXT with a trained model and print the continuation. MODEL is a checkpoint directory\n"
          "(its newest complete step, or one step-* directory), a Hugging Face model folder (config.json of\n"
          "transformers 4 or 5, model.safetensors or its index and shards; what fsdpctl export -o DIR writes)\n"
          "or a .safetensors file with config.json beside it. --tokens N new tokens (default 64);\n"
          "--temperature 0 is greedy (default 1); --top-k K samples among the K most likely (default 0:\n"
          "all); the same --seed (default 0) gives the same text. The model's tokenizer.json (in its folder\n"
          "or beside the .safetensors file), or --tokenizer's (a tokenizer.json or a folder holding one)\n"
          "encodes TEXT and decodes the continuation. Without one, byte-level models (vocabulary 256) take\n"
          "the prompt's bytes and print text; others print token ids, or text with --tokenizer llm.c's\n"
          "GPT-2 tokenizer file. --logits prints the logits of every prompt position instead, as one JSON\n"
          "array of arrays.\n"
          "A LoRA job's checkpoint samples from its base with the adapters merged; --adapter DIR merges a PEFT\n"
          "LoRA folder (adapter_config.json, adapter_model.safetensors; what fsdpctl export writes of a LoRA\n"
          "checkpoint) into MODEL first.\n"
          "--chat asks a chat model QUESTION (after --system TEXT when given): the conversation is rendered\n"
          "with the model folder's chat template (or --template) and its generation prompt, encoded as\n"
          "transformers' apply_chat_template encodes it, and the answer ends at the template's end of turn\n"
          "(eos_token, generation_config.json's eos_token_id, and the special token the template writes\n"
          "after an assistant message), which is not printed. --print-prompt prints the rendered prompt,\n"
          "its ids and the end-of-turn ids as one JSON object instead of sampling.\n");
}

/* The fsdp-worker next to this executable, or $FSDP_WORKER. */
static int find_worker(char *buf, size_t n) {
  const char *env = envknob_get(ENV_WORKER);
  if (env) {
    snprintf(buf, n, "%s", env);
  } else {
    char self[PATH_MAX];
    ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
    if (l <= 0) {
      fprintf(stderr, "fsdpctl sample: cannot read /proc/self/exe: %s\n", strerror(errno));
      return -1;
    }
    self[l] = '\0';
    snprintf(buf, n, "%s/fsdp-worker", dirname(self));
  }
  if (access(buf, X_OK) != 0) {
    fprintf(stderr, "fsdpctl sample: cannot run %s: %s (it runs the fsdp-worker next to fsdpctl, or $FSDP_WORKER)\n",
            buf, strerror(errno));
    return -1;
  }
  return 0;
}

/* --print-prompt: {"prompt": TEXT, "prompt_ids": [...], "stop_ids": [...]} on one line. */
static void print_chat_prompt(const sample_chat_prompt_t *cp) {
  json_t *o = json_object(), *ids = json_array(), *stop = json_array();
  for (const char *s = cp->prompt_ids; *s;) json_array_append_new(ids, json_integer(strtol(s, (char **)&s, 10)));
  for (const char *s = cp->stop_ids; *s;) json_array_append_new(stop, json_integer(strtol(s, (char **)&s, 10)));
  json_object_set_new(o, "prompt", json_stringn(cp->text, cp->text_n));
  json_object_set_new(o, "prompt_ids", ids);
  json_object_set_new(o, "stop_ids", stop);
  char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
  if (s) puts(s);
  free(s);
  json_decref(o);
}

int ctl_sample(int argc, char **argv) {
  static const struct option opts[] = {
    {"prompt", required_argument, NULL, 'p'}, {"tokens", required_argument, NULL, 'n'},
    {"temperature", required_argument, NULL, 't'}, {"top-k", required_argument, NULL, 'k'},
    {"seed", required_argument, NULL, 's'}, {"tokenizer", required_argument, NULL, 'z'},
    {"logits", no_argument, NULL, 'l'}, {"help", no_argument, NULL, 'h'}, {"chat", required_argument, NULL, 'c'},
    {"system", required_argument, NULL, 'y'}, {"template", required_argument, NULL, 'J'},
    {"print-prompt", no_argument, NULL, 'P'}, {"adapter", required_argument, NULL, 'a'}, {NULL, 0, NULL, 0}};
  sample_chat_args ca = {0};
  int print_prompt = 0;
  /* flags pass through to the worker, which checks their values */
  const char *wargv[32];
  int wn = 0;
  char worker[PATH_MAX];
  int c, have_prompt = 0;
  optind = 1;
  wargv[wn++] = "fsdp-worker";
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (c == 'h') {
      sample_usage(stdout);
      return 0;
    }
    if (c == '?') {
      sample_usage(stderr);
      return 2;
    }
    if (c == 'l') {
      wargv[wn++] = "--logits";
      continue;
    }
    if (c == 'c' || c == 'y' || c == 'J' || c == 'P') {
      *(c == 'c' ? &ca.question : c == 'y' ? &ca.system : &ca.template_path) = optarg;
      print_prompt |= c == 'P';
      continue;
    }
    if (c == 'z') ca.tokenizer = optarg;
    have_prompt |= c == 'p';
    wargv[wn++] = c == 'p' ? "--prompt" : c == 'n' ? "--tokens" : c == 't' ? "--temperature" : c == 'k' ? "--top-k"
                  : c == 's' ? "--seed" : c == 'a' ? "--adapter" : "--tokenizer";
    wargv[wn++] = optarg;
  }
  if (optind != argc - 1) {
    fprintf(stderr, "fsdpctl sample: needs one MODEL (a checkpoint directory or a .safetensors file)\n");
    sample_usage(stderr);
    return 2;
  }
  if (!have_prompt == !ca.question) {
    fprintf(stderr, "fsdpctl sample: needs --prompt TEXT or --chat QUESTION (one of them)\n");
    return 2;
  }
  if (!ca.question && (ca.system || ca.template_path || print_prompt)) {
    fprintf(stderr, "fsdpctl sample: --system, --template and --print-prompt go with --chat QUESTION\n");
    return 2;
  }
  sample_chat_prompt_t cp = {0};
  if (ca.question) {
    ca.model = argv[optind];
    int r = sample_chat_prompt(&ca, &cp);
    if (r || print_prompt) {
      if (!r) print_chat_prompt(&cp);
      sample_chat_prompt_free(&cp);
      return r;
    }
    wargv[wn++] = "--prompt-ids";
    wargv[wn++] = cp.prompt_ids;
    if (cp.nstop) wargv[wn++] = "--stop-ids", wargv[wn++] = cp.stop_ids;
  }
  if (find_worker(worker, sizeof worker) != 0) return 1;
  wargv[wn++] = "--sample";
  wargv[wn++] = argv[optind];
  wargv[wn] = NULL;
  fflush(NULL);
  execv(worker, (char *const *)wargv);
  fprintf(stderr, "fsdpctl sample: cannot run %s: %s\n", worker, strerror(errno));
  return 1;
}
