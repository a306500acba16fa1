/* test_tokrows — the rows of masked token files (tokens.h: tok_set_rows, tok_batch_docs): whole
 * documents packed or one per row, targets only where the next token is trained and in the same
 * document, the document starts, the trained count, the same rows at every world size, and the
 * refusals (a document longer than seq_len, pack = false on plain text, a stream that mixes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tmpdir.h"
#include "tokens.h"
#include "tokmask.h"

#define V 1000
/* Eight documents; token k of document d is 100·d + k + 1, trained when (d + k) is odd. */
static const int LEN[] = {3, 5, 4, 2, 6, 1, 8, 2};
#define NDOC ((int)(sizeof LEN / sizeof *LEN))

static int64_t write_docs(const char *path, int first_doc, int ndoc) {
  int64_t n = 0;
  for (int d = first_doc; d < first_doc + ndoc; d++) n += LEN[d];
  uint32_t *t = malloc((size_t)n * 4);
  uint8_t *m = malloc((size_t)n), *s = malloc((size_t)n);
  int64_t i = 0;
  for (int d = first_doc; d < first_doc + ndoc; d++)
    for (int k = 0; k < LEN[d]; k++, i++) {
      t[i] = (uint32_t)(100 * d + k + 1);
      m[i] = (uint8_t)((d + k) % 2);
      s[i] = (uint8_t)(k == 0 && d != first_doc);   /* the file's first token begins a document anyway */
    }
  CHECK_OK(tokmask_write(path, t, m, s, n, V));
  free(t), free(m), free(s);
  return n;
}

/* The expected row holding documents D0..D1−1 (T tokens): inputs, targets, seg; returns trained. */
static int64_t expect_row(int d0, int d1, int T, int *inp, int *tgt, int32_t *seg) {
  int t = 0, first = 0;
  int64_t n = 0;
  for (int d = d0; d < d1; d++) {
    first = t;
    for (int k = 0; k < LEN[d]; k++, t++) {
      inp[t] = 100 * d + k + 1;
      int on = k + 1 < LEN[d] && (d + k + 1) % 2;
      tgt[t] = on ? 100 * d + k + 2 : -1;
      seg[t] = first;
      n += on;
    }
  }
  for (; t < T; t++) inp[t] = 0, tgt[t] = -1, seg[t] = first;
  return n;
}

static void check_row(tok_file *f, int64_t mb, int T, int d0, int d1, const char *what) {
  int inp[16], tgt[16], ei[16], et[16];
  int32_t seg[16], es[16];
  int64_t n = -1, en = expect_row(d0, d1, T, ei, et, es);
  CHECK_OK(tok_batch_docs(f, mb, 0, 1, 1, T, V, inp, tgt, seg, &n));
  int ok = n == en && !memcmp(inp, ei, sizeof(int) * (size_t)T) && !memcmp(tgt, et, sizeof(int) * (size_t)T) &&
           !memcmp(seg, es, sizeof(int32_t) * (size_t)T);
  if (!ok) fprintf(stderr, "  %s: row %lld (documents %d..%d) differs; trained %lld, want %lld\n", what,
                   (long long)mb, d0, d1 - 1, (long long)n, (long long)en);
  CHECK(ok);
}

static void test_pack(const char *path) {
  tok_file *f = NULL;
  CHECK_OK(tok_open(path, &f));
  tok_set_shuffle(f, 0, 0);
  CHECK(tok_masked(f));
  /* pack = true, T = 8: 3+5 | 4+2 (6 more would not fit) | 6+1 | 8 | 2 */
  CHECK_OK(tok_set_rows(f, 1, 8));
  CHECK_EQ_INT(NDOC, tok_docs(f));
  CHECK_EQ_INT(5, tok_rows(f));
  static const int rows[][2] = {{0, 2}, {2, 4}, {4, 6}, {6, 7}, {7, 8}};
  for (int r = 0; r < 5; r++) check_row(f, r, 8, rows[r][0], rows[r][1], "pack = true");
  check_row(f, 5, 8, 0, 2, "pack = true, the second epoch");
  /* pack = false: one document a row */
  CHECK_OK(tok_set_rows(f, 0, 8));
  CHECK_EQ_INT(NDOC, tok_rows(f));
  for (int d = 0; d < NDOC; d++) check_row(f, d, 8, d, d + 1, "pack = false");
  /* the rows were made for T = 8 */
  int buf[64];
  CHECK(tok_batch_docs(f, 0, 0, 1, 1, 7, V, buf, buf + 16, NULL, NULL) == FSDP_ERR_STATE);
  /* a document longer than seq_len: refused, never split */
  CHECK(tok_set_rows(f, 1, 7) == FSDP_ERR_RANGE);
  CHECK(strstr(fsdp_last_error(), "the document at token 21 is 8 tokens, longer than seq_len = 7") != NULL);
  CHECK(strchr(fsdp_last_error(), '\n') == NULL);
  /* too few rows for one batch */
  CHECK_OK(tok_set_rows(f, 1, 8));
  CHECK(tok_batch_docs(f, 0, 0, 3, 2, 8, V, buf, buf + 32, NULL, NULL) == FSDP_ERR_RANGE);
  CHECK(strstr(fsdp_last_error(), "needs 6 rows") != NULL);
  tok_destroy(&f);
}

/* World W with batch B/W on each rank reads the rows that one rank with batch B reads, shuffled or not. */
static void test_world_sizes(const char *path, int shuffle) {
  tok_file *f = NULL;
  CHECK_OK(tok_open(path, &f));
  tok_set_shuffle(f, shuffle, 77);
  CHECK_OK(tok_set_rows(f, 0, 8));
  int i1[32], t1[32], i2[32], t2[32];
  int32_t s1[32], s2[32];
  int ok = 1;
  for (int64_t mb = 0; mb < 6; mb++) {
    int64_t n1 = 0, n2 = 0, k = 0;
    CHECK_OK(tok_batch_docs(f, mb, 0, 1, 4, 8, V, i1, t1, s1, &n1));
    for (int r = 0; r < 2; r++) {
      CHECK_OK(tok_batch_docs(f, mb, r, 2, 2, 8, V, i2 + 16 * r, t2 + 16 * r, s2 + 16 * r, &k));
      n2 += k;
    }
    ok &= n1 == n2 && !memcmp(i1, i2, sizeof i1) && !memcmp(t1, t2, sizeof t1) && !memcmp(s1, s2, sizeof s1);
  }
  if (!ok) fprintf(stderr, "  shuffle = %d: world 2 x B 2 reads other rows than world 1 x B 4\n", shuffle);
  CHECK(ok);
  if (shuffle) {   /* one epoch of 8 rows: each document once */
    int seen[NDOC] = {0}, inp[8], tgt[8];
    for (int64_t mb = 0; mb < NDOC; mb++) {
      CHECK_OK(tok_batch_docs(f, mb, 0, 1, 1, 8, V, inp, tgt, NULL, NULL));
      if (inp[0] / 100 < NDOC) seen[inp[0] / 100]++;
    }
    for (int d = 0; d < NDOC; d++) CHECK_EQ_INT(1, seen[d]);
  }
  tok_destroy(&f);
}

static void test_streams(void) {
  /* two masked files as one stream: the same documents and rows as one file */
  const char *a = path_in("docs_a.bin"), *b = path_in("docs_b.bin");
  write_docs(a, 0, 3);
  write_docs(b, 3, NDOC - 3);
  char list[2048];
  snprintf(list, sizeof list, "%s\n%s", a, b);
  tok_file *f = NULL;
  CHECK_OK(tok_open(list, &f));
  CHECK_OK(tok_set_rows(f, 1, 8));
  CHECK_EQ_INT(NDOC, tok_docs(f));
  check_row(f, 1, 8, 2, 4, "two files");
  tok_destroy(&f);
  /* plain text: its rows stay tok_batch's, every target trained; pack = false refused */
  const char *p = path_in("plain.bin");
  uint32_t tok[64];
  for (int i = 0; i < 64; i++) tok[i] = (uint32_t)i;
  CHECK_OK(tok_write(p, tok, 64, V));
  CHECK_OK(tok_open(p, &f));
  CHECK(!tok_masked(f));
  int i1[16], t1[16], i2[16], t2[16];
  int32_t seg[16];
  int64_t n = 0;
  CHECK_OK(tok_batch(f, 1, 0, 1, 2, 8, V, i1, t1));
  CHECK_OK(tok_batch_docs(f, 1, 0, 1, 2, 8, V, i2, t2, seg, &n));
  CHECK(!memcmp(i1, i2, sizeof i1) && !memcmp(t1, t2, sizeof t1));
  CHECK_EQ_INT(16, n);
  CHECK(tok_set_rows(f, 0, 8) == FSDP_ERR_INVALID && strstr(fsdp_last_error(), "has no document boundaries"));
  tok_destroy(&f);
  snprintf(list, sizeof list, "%s\n%s", a, p);
  CHECK(tok_open(list, &f) == FSDP_ERR_INVALID);
  CHECK(f == NULL && strstr(fsdp_last_error(), "all masked files") != NULL);
  /* a masked file cut short (the bitmaps missing) is named */
  FILE *fp = fopen(a, "r+b");
  CHECK(fp && ftruncate(fileno(fp), 1024 + 12 * 2) == 0);
  if (fp) fclose(fp);
  CHECK(tok_open(a, &f) == FSDP_ERR_FORMAT && strstr(fsdp_last_error(), "the two bitmaps of a masked file"));
}

int main(void) {
  tmpdir_make("test_tokrows");
  const char *path = path_in("docs.bin");
  write_docs(path, 0, NDOC);
  test_pack(path);
  test_world_sizes(path, 0);
  test_world_sizes(path, 1);
  test_streams();
  tmpdir_remove();
  return check_done();
}
