/* ctl_data — `fsdpctl gen-data`: llm.c token files, no daemon. Either tokens of text files, by a
 * tokenizer.json (ctl_tokdata.c) or byte-level (vocabulary 256, token = byte), with an optional
 * validation tail split off, or the
 * synthetic Markov chain behind `train = synthetic:markov:SEED` with its entropy rate (the loss
 * floor). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl.h"
#include "ctl_chat.h"
#include "ctl_tokdata.h"
#include "fsutil.h"
#include "tokens.h"

#define TEXT_VOCAB 256   /* byte-level: token = byte */

static void gen_data_usage(FILE *f) {
  fprintf(f,
          "usage: fsdpctl gen-data --tokenizer FILE|DIR --text FILE... -o OUT.bin [--val OUT_VAL.bin\n"
          "                        --val-fraction F] [--eos] [--doc-sep STR] [--threads N] [--json]\n"
          "       fsdpctl gen-data --text FILE... -o OUT.bin [--val OUT_VAL.bin --val-fraction F] [--json]\n"
          "       fsdpctl gen-data --markov SEED [--vocab V] --tokens N -o FILE [--json]\n"
          "       fsdpctl gen-data --chat FILE.jsonl... --model DIR -o OUT.bin ...  (gen-data --chat --help)\n"
          "\n"
          "--tokenizer: encode the FILEs with a Hugging Face tokenizer.json (or a model folder's) into an\n"
          "llm.c token file (uint16 when the vocabulary fits, else uint32); train with [model] vocab_size\n"
          "at least the tokenizer's. Each FILE is a document (FILE.jsonl: each line's \"text\"), or cut\n"
          "at every --doc-sep STR (C escapes such as \\n are understood); --eos puts the end-of-text\n"
          "token before each document. Every core is used (--threads N); the file is the same for any N.\n"
          "\n"
          "--text without --tokenizer: the bytes of the FILEs, concatenated in the order given, as tokens\n"
          "of a byte-level vocabulary (256, token = byte); train with [model] vocab_size = 256.\n"
          "With --val, the last floor(F x total) tokens (0 < F < 1) go to OUT_VAL.bin instead.\n"
          "\n"
          "--markov: write N tokens of the first-order Markov chain SEED over a vocabulary of V tokens\n"
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

/* S with the C escapes \n \t \r \\ decoded (malloc'd), or NULL when empty. */
static char *unescape(const char *s) {
  char *o = malloc(strlen(s) + 1), *w = o;
  if (!o) return NULL;
  for (; *s; s++) {
    if (*s != '\\' || !s[1]) {
      *w++ = *s;
      continue;
    }
    s++;
    *w++ = *s == 'n' ? '\n' : *s == 't' ? '\t' : *s == 'r' ? '\r' : *s;
  }
  *w = 0;
  if (w == o) {
    free(o);
    return NULL;
  }
  return o;
}

/* Append the bytes of PATH to *buf (one token per byte), growing it; a one-line error otherwise. */
static int read_text(const char *path, uint32_t **buf, int64_t *n, int64_t *cap) {
  int fd;
  FILE *fp = NULL;
  fsdp_status rc = fsutil_open_read(AT_FDCWD, path, &fd);   /* no one else's link; as root, root's files only */
  if (rc == FSDP_ERR_NOTFOUND || rc == FSDP_ERR_IO) {
    fprintf(stderr, "fsdpctl gen-data: cannot read text file %s: %s\n", path, strerror(errno));
    return 0;
  }
  if (rc != FSDP_OK) {
    fprintf(stderr, "fsdpctl gen-data: text file %s\n", fsdp_last_error());
    return 0;
  }
  if (!(fp = fdopen(fd, "rb"))) {
    fprintf(stderr, "fsdpctl gen-data: cannot read text file %s: %s\n", path, strerror(errno));
    close(fd);
    return 0;
  }
  int64_t before = *n;
  unsigned char chunk[1 << 16];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, fp)) > 0) {
    if (*n + (int64_t)got > INT32_MAX) {
      fprintf(stderr, "fsdpctl gen-data: the text files hold more than %d bytes, the most one llm.c "
              "token file holds (int32 count); split the text\n", INT32_MAX);
      fclose(fp);
      return 0;
    }
    if (*n + (int64_t)got > *cap) {
      int64_t nc = *cap ? *cap : 1 << 20;
      while (nc < *n + (int64_t)got) nc *= 2;
      uint32_t *nb = realloc(*buf, sizeof **buf * (size_t)nc);
      if (!nb) {
        fprintf(stderr, "fsdpctl gen-data: out of memory reading %s (%lld tokens so far)\n", path,
                (long long)*n);
        fclose(fp);
        return 0;
      }
      *buf = nb;
      *cap = nc;
    }
    for (size_t i = 0; i < got; i++) (*buf)[*n + (int64_t)i] = chunk[i];
    *n += (int64_t)got;
  }
  int err = ferror(fp) ? errno : 0;
  fclose(fp);
  if (err) {
    fprintf(stderr, "fsdpctl gen-data: cannot read text file %s: %s\n", path, strerror(err));
    return 0;
  }
  if (*n == before) {
    fprintf(stderr, "fsdpctl gen-data: text file %s is empty; every --text file needs at least one byte\n",
            path);
    return 0;
  }
  return 1;
}

static int gen_text(char **files, int nfiles, const char *out, const char *val, double frac, int json) {
  uint32_t *tok = NULL;
  int64_t n = 0, cap = 0;
  for (int i = 0; i < nfiles; i++)
    if (!read_text(files[i], &tok, &n, &cap)) {
      free(tok);
      return 1;
    }
  int64_t nval = val ? (int64_t)floor(frac * (double)n) : 0, ntrain = n - nval;
  /* F < 1 keeps at least one training token; only the tail can come out empty. */
  if (val && nval < 1) {
    if (n < 2)
      fprintf(stderr, "fsdpctl gen-data: the text is 1 token long; a validation split needs at least 2\n");
    else
      fprintf(stderr, "fsdpctl gen-data: --val-fraction %g of %lld tokens leaves the validation tail empty; "
              "use a fraction of at least %.3g (1/%lld)\n", frac, (long long)n, 1.0 / (double)n, (long long)n);
    free(tok);
    return 1;
  }
  fsdp_status rc = tokdata_write(out, tok, ntrain, val, tok + ntrain, nval, TEXT_VOCAB);
  free(tok);
  if (rc != FSDP_OK) {
    fprintf(stderr, "fsdpctl gen-data: %s\n", fsdp_last_error());
    return 1;
  }
  if (json) {
    json_t *o = json_pack("{s:s, s:I, s:i, s:i}", "path", out, "tokens", (json_int_t)ntrain, "vocab",
                          TEXT_VOCAB, "files", nfiles);
    if (o && val) {
      json_object_set_new(o, "val_path", json_string(val));
      json_object_set_new(o, "val_tokens", json_integer((json_int_t)nval));
    }
    if (o) json_dumpf(o, stdout, JSON_COMPACT);
    printf("\n");
    json_decref(o);
  } else if (val) {
    printf("wrote %lld tokens to %s and %lld validation tokens to %s (byte-level, vocab %d)\n",
           (long long)ntrain, out, (long long)nval, val, TEXT_VOCAB);
  } else {
    printf("wrote %lld tokens to %s (byte-level, vocab %d)\n", (long long)ntrain, out, TEXT_VOCAB);
  }
  return 0;
}

static int gen_markov(uint64_t seed, int64_t vocab, int64_t ntok, const char *out, int json) {
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
  TRY_GOTO(tokdata_write(out, tok, ntok, NULL, NULL, 0, (int)vocab), rc, fail);
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
  fprintf(stderr, "fsdpctl gen-data: %s\n", fsdp_last_error());
  free(tok);
  tok_markov_destroy(&m);
  return 1;
}

int ctl_gen_data(int argc, char **argv) {
  for (int i = 1; i < argc; i++)   /* conversations: their own command line (ctl_chat.c) */
    if (!strcmp(argv[i], "--chat") || !strncmp(argv[i], "--chat=", 7)) return ctl_chat(argc, argv);
  static const struct option opts[] = {
    {"markov", required_argument, NULL, 'm'}, {"vocab", required_argument, NULL, 'v'},
    {"tokens", required_argument, NULL, 'n'}, {"output", required_argument, NULL, 'o'},
    {"json", no_argument, NULL, 'j'},         {"help", no_argument, NULL, 'h'},
    {"text", required_argument, NULL, 't'},   {"val", required_argument, NULL, 'V'},
    {"val-fraction", required_argument, NULL, 'f'}, {"tokenizer", required_argument, NULL, 'T'},
    {"eos", no_argument, NULL, 'E'}, {"threads", required_argument, NULL, 'P'},
    {"doc-sep", required_argument, NULL, 'S'}, {NULL, 0, NULL, 0}};
  fsutil_reads_own_tree(1);   /* run as root: root's own text and tokenizer only (docs/cli.md, "Run as root") */
  tokdata_args ta = {0};
  char *sep = NULL;
  int64_t threads = 0;
  uint64_t seed = 0;
  int have_seed = 0, json = 0, have_vocab = 0, nfiles = 0, stray = 0;
  int64_t vocab = 50257, ntok = -1;
  double frac = -1;
  const char *out = NULL, *val = NULL;
  /* Text files in the order given: --text FILE, and the arguments that follow it. */
  char **files = calloc((size_t)argc + 1, sizeof *files);
  if (!files) {
    fprintf(stderr, "fsdpctl gen-data: out of memory\n");
    return 1;
  }
  optind = 1;
  int c, rc = 2;
  /* "-" first: non-option arguments come back in order as option 1 (GNU getopt). */
  while ((c = getopt_long(argc, argv, "-o:h", opts, NULL)) != -1) {
    switch (c) {
      case 't': files[nfiles++] = optarg; break;
      case 1:
        if (nfiles) files[nfiles++] = optarg;
        else stray = 1;
        break;
      case 'V': val = optarg; break;
      case 'f': {
        char *end;
        errno = 0;
        frac = strtod(optarg, &end);
        if (errno || end == optarg || *end || !(frac > 0 && frac < 1)) {
          fprintf(stderr, "fsdpctl gen-data: --val-fraction '%s': expected a number > 0 and < 1\n", optarg);
          goto done;
        }
        break;
      }
      case 'm': {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(optarg, &end, 10);
        if (errno || end == optarg || *end || optarg[0] == '-') {
          fprintf(stderr, "fsdpctl gen-data: --markov '%s': expected a non-negative integer seed\n",
                  optarg);
          goto done;
        }
        seed = v;
        have_seed = 1;
        break;
      }
      case 'v':
        if (!parse_i64("--vocab", optarg, 1, INT32_MAX, &vocab)) goto done;
        have_vocab = 1;
        break;
      case 'n':
        if (!parse_i64("--tokens", optarg, 1, INT32_MAX, &ntok)) goto done;
        break;
      case 'T': ta.tokenizer = optarg; break;
      case 'E': ta.eos = 1; break;
      case 'P':
        if (!parse_i64("--threads", optarg, 1, 1024, &threads)) goto done;
        break;
      case 'S':
        free(sep);
        if (!(sep = unescape(optarg))) {
          fprintf(stderr, "fsdpctl gen-data: --doc-sep '%s': expected a non-empty string (C escapes: \\n \\t \\r \\\\)\n", optarg);
          goto done;
        }
        break;
      case 'o': out = optarg; break;
      case 'j': json = 1; break;
      case 'h': gen_data_usage(stdout); rc = 0; goto done;
      default: gen_data_usage(stderr); goto done;
    }
  }
  const char *why = NULL;
  if (stray) why = "unexpected argument (text files follow --text)";
  else if (ta.tokenizer && !nfiles) why = "--tokenizer encodes text: give --text FILE...";
  else if (!ta.tokenizer && (ta.eos || threads || sep))
    why = "--eos, --doc-sep and --threads go with --tokenizer";
  else if (nfiles && (have_seed || have_vocab || ntok >= 0))
    why = "--text makes tokens of text; --markov, --vocab and --tokens are for the synthetic chain";
  else if (nfiles && !out) why = "--text FILE... needs -o OUT.bin";
  else if (nfiles && (!val) != (frac < 0)) why = "--val OUT_VAL.bin and --val-fraction F go together";
  else if (nfiles && val && !strcmp(val, out)) why = "--val and -o name the same file; give two paths";
  else if (!nfiles && (val || frac >= 0)) why = "--val and --val-fraction split text; use them with --text";
  else if (!nfiles && (!have_seed || ntok < 0 || !out))
    why = "either --text FILE... -o OUT.bin, or --markov SEED --tokens N -o FILE";
  if (why) {
    fprintf(stderr, "fsdpctl gen-data: %s\n", why);
    gen_data_usage(stderr);
    goto done;
  }
  if (ta.tokenizer) {
    ta.files = files, ta.nfiles = nfiles, ta.out = out, ta.val = val, ta.frac = frac;
    ta.doc_sep = sep, ta.threads = (int)threads, ta.json = json;
    rc = ctl_tokdata(&ta);
  } else if (nfiles) {
    rc = gen_text(files, nfiles, out, val, frac, json);
  } else {
    rc = gen_markov(seed, vocab, ntok, out, json);
  }
done:
  free(files);
  free(sep);
  return rc;
}
