/* bpe_tool — the C side of tests/integration/tokenizer_hf.sh, which compares common/bpe with
 * Hugging Face `tokenizers` on the same tokenizer.json and text.
 *   bpe_tool encode TOKENIZER DOCS   DOCS holds documents separated by NUL bytes; prints one line
 *                                    of space-separated ids per document
 *   bpe_tool decode TOKENIZER IDS    IDS holds such lines; writes each line's text followed by a NUL
 * Exit 1 with one line on stderr on any error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 20, len = 0;
  char *b = malloc(cap + 1);
  for (size_t k; b && (k = fread(b + len, 1, cap - len, f)) > 0;) {
    len += k;
    if (len == cap && !(b = realloc(b, (cap *= 2) + 1))) break;
  }
  fclose(f);
  if (b) b[len] = 0;
  *n = len;
  return b;
}

static int encode(const bpe_tokenizer *t, const char *docs, size_t n) {
  bpe_state *st;
  bpe_ids ids = {0};
  if (bpe_state_new(t, &st) != FSDP_OK) return 1;
  for (size_t at = 0; at <= n;) {
    const char *end = memchr(docs + at, 0, n - at);
    size_t len = end ? (size_t)(end - docs) - at : n - at;
    if (!end && !len) break;
    ids.n = 0;
    if (bpe_encode(st, docs + at, len, 0, &ids) != FSDP_OK) {
      fprintf(stderr, "document at byte %zu: %s\n", at, fsdp_last_error());
      return 1;
    }
    for (size_t i = 0; i < ids.n; i++) printf(i ? " %u" : "%u", ids.v[i]);
    putchar('\n');
    at += len + 1;
  }
  free(ids.v);
  bpe_state_destroy(&st);
  return 0;
}

static int decode(const bpe_tokenizer *t, char *lines) {
  bpe_ids ids = {0};
  for (char *line = lines, *nl; *line; line = nl + 1) {
    if (!(nl = strchr(line, '\n'))) break;   /* every line ends with a newline */
    *nl = 0;
    ids.n = 0;
    for (char *p = line, *e; *p; p = e) {
      unsigned long v = strtoul(p, &e, 10);
      if (e == p) break;
      if (ids.n == ids.cap && !(ids.v = realloc(ids.v, (ids.cap = ids.cap * 2 + 64) * sizeof *ids.v))) return 1;
      ids.v[ids.n++] = (uint32_t)v;
    }
    char *text;
    size_t len;
    if (bpe_decode(t, ids.v, ids.n, 0, &text, &len) != FSDP_OK) {
      fprintf(stderr, "%s\n", fsdp_last_error());
      return 1;
    }
    fwrite(text, 1, len + 1, stdout);   /* with its NUL */
    free(text);
  }
  free(ids.v);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4 || (strcmp(argv[1], "encode") && strcmp(argv[1], "decode"))) {
    fprintf(stderr, "usage: bpe_tool encode|decode TOKENIZER FILE\n");
    return 2;
  }
  bpe_tokenizer *t;
  if (bpe_load(argv[2], &t) != FSDP_OK) {
    fprintf(stderr, "%s\n", fsdp_last_error());
    return 1;
  }
  size_t n;
  char *buf = slurp(argv[3], &n);
  if (!buf) {
    fprintf(stderr, "cannot read %s\n", argv[3]);
    return 1;
  }
  int rc = !strcmp(argv[1], "encode") ? encode(t, buf, n) : decode(t, buf);
  free(buf);
  bpe_destroy(&t);
  return rc;
}
