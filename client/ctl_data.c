/* ctl_data — `fsdpctl gen-data`: write a synthetic llm.c token file from the Markov chain behind
 * `train = synthetic:markov:SEED`, and print its entropy rate (the loss floor). No daemon. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "tokens.h"

static void gen_data_usage(FILE *f) {
  fprintf(f,
          "usage: fsdpctl gen-data --markov SEED [--vocab V] --tokens N -o FILE [--json]\n"
          "\n"
          "Write N tokens of the first-order Markov chain SEED over a vocabulary of V tokens\n"
          "(default 50257) as an llm.c token file (uint16 when V <= 65536, else uint32), and print\n"
          "the chain's entropy rate in nats/token: the lowest mean loss a model can reach on it.\n"
          "The tokens are those `train = synthetic:markov:SEED` streams for the same V.\n");
}

static int parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "fsdpctl gen-data: %s '%s': expected an integer in [%lld, %lld]\n", opt, s,
            (long long)lo, (long long)hi);
    return 0;
  }
  *out = v;
  return 1;
}

int ctl_gen_data(int argc, char **argv) {
  static const struct option opts[] = {
    {"markov", required_argument, NULL, 'm'}, {"vocab", required_argument, NULL, 'v'},
    {"tokens", required_argument, NULL, 'n'}, {"output", required_argument, NULL, 'o'},
    {"json", no_argument, NULL, 'j'},         {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};
  uint64_t seed = 0;
  int have_seed = 0, json = 0;
  int64_t vocab = 50257, ntok = -1;
  const char *out = NULL;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
    switch (c) {
      case 'm': {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(optarg, &end, 10);
        if (errno || end == optarg || *end || optarg[0] == '-') {
          fprintf(stderr, "fsdpctl gen-data: --markov '%s': expected a non-negative integer seed\n",
                  optarg);
          return 2;
        }
        seed = v;
        have_seed = 1;
        break;
      }
      case 'v':
        if (!parse_i64("--vocab", optarg, 1, INT32_MAX, &vocab)) return 2;
        break;
      case 'n':
        if (!parse_i64("--tokens", optarg, 1, INT32_MAX, &ntok)) return 2;
        break;
      case 'o': out = optarg; break;
      case 'j': json = 1; break;
      case 'h': gen_data_usage(stdout); return 0;
      default: gen_data_usage(stderr); return 2;
    }
  }
  if (optind < argc || !have_seed || ntok < 0 || !out) {
    fprintf(stderr, "fsdpctl gen-data: %s\n",
            optind < argc ? "unexpected argument"
                          : "--markov SEED, --tokens N and -o FILE are required");
    gen_data_usage(stderr);
    return 2;
  }

  tok_markov *m = NULL;
  uint32_t *tok = NULL;
  fsdp_status rc;
  TRY_GOTO(tok_markov_new(seed, (int)vocab, &m), rc, fail);
  tok = malloc(sizeof *tok * (size_t)ntok);
  if (!tok) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory for %lld tokens (%lld bytes)",
                        (long long)ntok, (long long)ntok * 4);
    goto fail;
  }
  TRY_GOTO(tok_markov_generate(m, ntok, tok), rc, fail);
  TRY_GOTO(tok_write(out, tok, ntok, (int)vocab), rc, fail);
  double h = tok_markov_entropy(m);
  if (json) {
    json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:f}", "path", out, "tokens", (json_int_t)ntok,
                          "vocab", (json_int_t)vocab, "seed", (json_int_t)seed, "entropy_nats", h);
    if (o) json_dumpf(o, stdout, JSON_COMPACT | JSON_REAL_PRECISION(9));
    printf("\n");
    json_decref(o);
  } else
    printf("wrote %lld tokens to %s; entropy rate %.6f nats/token\n", (long long)ntok, out, h);
  free(tok);
  tok_markov_destroy(&m);
  return 0;
fail:
  fprintf(stderr, "fsdpctl gen-data: %s\n", fsdp_user_message(fsdp_last_error()));
  free(tok);
  tok_markov_destroy(&m);
  return 1;
}
