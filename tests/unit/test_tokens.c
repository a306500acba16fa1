/* test_tokens — llm.c token files, the DESIGN.md §6 batch order, and the Markov stream. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "tokens.h"

static char dir[64];

static const char *path_in(const char *name) {
  static char buf[4][256];
  static int k;
  char *p = buf[k++ & 3];
  snprintf(p, 256, "%s/%s", dir, name);
  return p;
}

/* Write a raw file: a header of 256 int32 with the three given words, then `nbytes` of payload. */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count,
                      const void *payload, size_t nbytes, size_t header_bytes) {
  int32_t hdr[256] = {0};
  hdr[0] = magic;
  hdr[1] = version;
  hdr[2] = count;
  FILE *f = fopen(path, "wb");
  fwrite(hdr, 1, header_bytes, f);
  if (nbytes) fwrite(payload, 1, nbytes, f);
  fclose(f);
}

static int has(const char *needle) {
  const char *msg = fsdp_last_error();
  if (strstr(msg, needle)) return 1;
  fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", msg, needle);
  return 0;
}

static void test_roundtrip(int vocab, int width) {
  const int64_t n = 5000;
  uint32_t *tok = malloc(sizeof *tok * n);
  for (int64_t i = 0; i < n; i++) tok[i] = (uint32_t)((i * 7919 + 13) % vocab);
  const char *p = path_in(width == 2 ? "rt16.bin" : "rt32.bin");
  CHECK_OK(tok_write(p, tok, n, vocab));
  struct stat st;
  CHECK(stat(p, &st) == 0);
  CHECK_EQ_INT(1024 + n * width, st.st_size);
  CHECK(access(path_in(width == 2 ? "rt16.bin.tmp" : "rt32.bin.tmp"), F_OK) != 0);
  /* The header, read back independently. */
  int32_t hdr[256];
  FILE *f = fopen(p, "rb");
  CHECK(fread(hdr, 4, 256, f) == 256);
  fclose(f);
  CHECK_EQ_INT(width == 2 ? 20240520 : 20240801, hdr[0]);
  CHECK_EQ_INT(width == 2 ? 1 : 7, hdr[1]);
  CHECK_EQ_INT(n, hdr[2]);
  for (int i = 3; i < 256; i++) CHECK_EQ_INT(0, hdr[i]);

  tok_file *tf = NULL;
  CHECK_OK(tok_open(p, &tf));
  if (!tf) { free(tok); return; }
  CHECK_EQ_INT(n, tok_count(tf));
  CHECK_EQ_INT(width, tok_width(tf));
  int B = 3, T = 16, inp[48], tgt[48];
  CHECK_OK(tok_batch(tf, 0, 0, 1, B, T, vocab, inp, tgt));
  int bad = 0;
  for (int i = 0; i < B * T; i++) bad += inp[i] != (int)tok[i] || tgt[i] != (int)tok[i + 1];
  CHECK_EQ_INT(0, bad);
  tok_close(&tf);
  CHECK(tf == NULL);
  tok_close(&tf); /* NULL-safe */
  free(tok);
}

/* Tokens equal to their position make the batch order directly visible. */
static void test_batch_order(void) {
  const int64_t n = 1000;
  const int vocab = 70000;
  uint32_t *tok = malloc(sizeof *tok * n);
  for (int64_t i = 0; i < n; i++) tok[i] = (uint32_t)i;
  const char *p = path_in("order.bin");
  CHECK_OK(tok_write(p, tok, n, vocab));
  tok_file *tf = NULL;
  CHECK_OK(tok_open(p, &tf));
  if (!tf) { free(tok); return; }
  const int T = 8, rows = 4;  /* N·B = 4 rows per micro-batch */
  int ref_inp[4 * 8], ref_tgt[4 * 8], inp[4 * 8], tgt[4 * 8];
  const int64_t nb = (n - 1) / (rows * T);
  int bad_formula = 0, bad_split = 0;
  for (int world = 1; world <= 4; world *= 2) {
    int B = rows / world;
    for (int64_t b = 0; b < 2 * nb + 3; b++) {
      CHECK_OK(tok_batch(tf, b, 0, 1, rows, T, vocab, ref_inp, ref_tgt));
      for (int r = 0; r < world; r++) {
        if (tok_batch(tf, b, r, world, B, T, vocab, inp, tgt) != FSDP_OK) {
          bad_formula++;
          continue;
        }
        int64_t nbw = (n - 1) / ((int64_t)world * B * T);
        int64_t start = ((b % nbw) * world + r) * B * T;
        for (int i = 0; i < B * T; i++) {
          bad_formula += inp[i] != start + i || tgt[i] != start + i + 1;
          bad_split += inp[i] != ref_inp[r * B * T + i] || tgt[i] != ref_tgt[r * B * T + i];
        }
      }
    }
  }
  CHECK_EQ_INT(0, bad_formula);
  CHECK_EQ_INT(0, bad_split);
  /* Wrap-around: micro-batch nb reads what micro-batch 0 read. */
  CHECK_OK(tok_batch(tf, nb, 1, 2, 2, T, vocab, inp, tgt));
  CHECK_EQ_INT(16, inp[0]);

  /* Too short for one batch: 1000 tokens, world 2 × B 50 × T 10 = 1000 needs 1001. */
  int *big = malloc(sizeof *big * 1000), *big2 = malloc(sizeof *big2 * 1000);
  CHECK(tok_batch(tf, 0, 0, 2, 50, 10, vocab, big, big2) == FSDP_ERR_RANGE);
  CHECK(has("needs at least 1001"));
  /* Exactly enough: 999 + 1. */
  CHECK_OK(tok_batch(tf, 0, 0, 1, 1, 999, vocab, big, big2));
  CHECK_EQ_INT(999, big2[998]);
  /* A token >= vocab names its position: tokens are their positions, so vocab 20 fails at 20. */
  CHECK(tok_batch(tf, 0, 0, 1, 2, 16, 20, inp, tgt) == FSDP_ERR_RANGE);
  CHECK(has("position 20"));
  /* Bad arguments. */
  CHECK(tok_batch(tf, 0, 2, 2, 1, 8, vocab, inp, tgt) == FSDP_ERR_RANGE);
  CHECK(tok_batch(tf, -1, 0, 1, 1, 8, vocab, inp, tgt) == FSDP_ERR_RANGE);
  CHECK(tok_batch(tf, 0, 0, 1, 0, 8, vocab, inp, tgt) == FSDP_ERR_RANGE);
  free(big);
  free(big2);
  tok_close(&tf);
  free(tok);
}

static void test_bad_files(void) {
  tok_file *tf = NULL;
  uint16_t payload[100] = {0};

  CHECK(tok_open(path_in("does-not-exist.bin"), &tf) == FSDP_ERR_NOTFOUND);
  CHECK(tf == NULL);

  write_raw(path_in("short.bin"), 20240520, 1, 0, NULL, 0, 100);
  CHECK(tok_open(path_in("short.bin"), &tf) == FSDP_ERR_FORMAT);
  CHECK(has("shorter than the 1024-byte"));

  write_raw(path_in("magic.bin"), 12345, 1, 100, payload, 200, 1024);
  CHECK(tok_open(path_in("magic.bin"), &tf) == FSDP_ERR_FORMAT);
  CHECK(has("magic 12345"));
  CHECK(has("20240520"));

  write_raw(path_in("version.bin"), 20240520, 7, 100, payload, 200, 1024);
  CHECK(tok_open(path_in("version.bin"), &tf) == FSDP_ERR_FORMAT);
  CHECK(has("version 7"));

  write_raw(path_in("version32.bin"), 20240801, 1, 50, payload, 200, 1024);
  CHECK(tok_open(path_in("version32.bin"), &tf) == FSDP_ERR_FORMAT);
  CHECK(has("version 1"));

  write_raw(path_in("trunc.bin"), 20240520, 1, 100, payload, 150, 1024);
  CHECK(tok_open(path_in("trunc.bin"), &tf) == FSDP_ERR_FORMAT);
  CHECK(has("100 tokens"));
  CHECK(has("truncated"));

  write_raw(path_in("trunc32.bin"), 20240801, 7, 100, payload, 200, 1024);
  CHECK(tok_open(path_in("trunc32.bin"), &tf) == FSDP_ERR_FORMAT);

  write_raw(path_in("long.bin"), 20240520, 1, 10, payload, 200, 1024);
  CHECK(tok_open(path_in("long.bin"), &tf) == FSDP_ERR_FORMAT);

  write_raw(path_in("neg.bin"), 20240520, 1, -5, payload, 0, 1024);
  CHECK(tok_open(path_in("neg.bin"), &tf) == FSDP_ERR_FORMAT);
  CHECK(tf == NULL);

  /* A valid uint32 file written by hand opens. */
  uint32_t t32[3] = {5, 70000, 9};
  write_raw(path_in("ok32.bin"), 20240801, 7, 3, t32, 12, 1024);
  CHECK_OK(tok_open(path_in("ok32.bin"), &tf));
  if (tf) {
    int inp[2], tgt[2];
    CHECK_OK(tok_batch(tf, 0, 0, 1, 1, 2, 70001, inp, tgt));
    CHECK_EQ_INT(70000, inp[1]);
    CHECK_EQ_INT(9, tgt[1]);
    tok_close(&tf);
  }

  uint32_t over[2] = {3, 1000};
  CHECK(tok_write(path_in("over.bin"), over, 2, 1000) == FSDP_ERR_RANGE);
  CHECK(has("position 1"));
  CHECK(access(path_in("over.bin"), F_OK) != 0);
}

/* Plug-in estimate of H(X_{k+1} | X_k) from bigram counts, in nats, plus the largest number of
 * distinct successors seen after any token. */
static double empirical_entropy(const uint32_t *t, int64_t n, int V, int *max_succ) {
  int64_t *cnt = calloc((size_t)V * V, sizeof *cnt), *row = calloc(V, sizeof *row);
  for (int64_t k = 0; k + 1 < n; k++) {
    cnt[(int64_t)t[k] * V + t[k + 1]]++;
    row[t[k]]++;
  }
  double h = 0;
  *max_succ = 0;
  for (int i = 0; i < V; i++) {
    int s = 0;
    for (int j = 0; j < V; j++) {
      int64_t c = cnt[(int64_t)i * V + j];
      if (!c) continue;
      s++;
      h -= (double)c / (double)(n - 1) * log((double)c / (double)row[i]);
    }
    if (s > *max_succ) *max_succ = s;
  }
  free(cnt);
  free(row);
  return h;
}

static void test_markov(void) {
  tok_markov *m = NULL, *m2 = NULL;
  const int V = 64;
  const int64_t n = 400000;
  CHECK_OK(tok_markov_new(42, V, &m));
  CHECK_OK(tok_markov_new(42, V, &m2));
  if (!m || !m2) return;
  double H = tok_markov_entropy(m);
  printf("markov seed 42 vocab %d: entropy rate %.6f nats/token\n", V, H);
  CHECK(H > 0.3 && H < log(4.0));
  CHECK(tok_markov_entropy(m2) == H);

  uint32_t *a = malloc(sizeof *a * n), *b = malloc(sizeof *b * n);
  CHECK_OK(tok_markov_generate(m, n, a));
  CHECK_OK(tok_markov_generate(m2, 1000, b));
  CHECK(memcmp(a, b, 1000 * sizeof *a) == 0);   /* deterministic, and a prefix of longer streams */
  int inrange = 1;
  for (int64_t k = 0; k < n; k++) inrange &= a[k] < (uint32_t)V;
  CHECK(inrange);

  int max_succ = 0;
  double he = empirical_entropy(a, n, V, &max_succ);
  printf("  empirical conditional entropy over %lld tokens: %.6f (diff %.2e)\n", (long long)n, he,
         he - H);
  CHECK_NEAR(H, he, 0.01, 0.0);
  CHECK(max_succ <= TOK_MARKOV_SUCC);
  CHECK(max_succ >= 3);

  tok_markov *m3 = NULL;
  CHECK_OK(tok_markov_new(43, V, &m3));
  if (m3) {
    CHECK_OK(tok_markov_generate(m3, 1000, b));
    CHECK(memcmp(a, b, 1000 * sizeof *a) != 0);
    CHECK(tok_markov_entropy(m3) != H);
    tok_markov_destroy(&m3);
  }

  /* The in-memory stream is the same tokens, through the same batch order. */
  tok_file *tf = NULL;
  CHECK_OK(tok_open_markov(42, V, 10000, &tf));
  if (tf) {
    CHECK_EQ_INT(10000, tok_count(tf));
    int inp[64], tgt[64];
    CHECK_OK(tok_batch(tf, 3, 1, 2, 2, 16, V, inp, tgt));
    int64_t start = ((3 % (9999 / 64)) * 2 + 1) * 32;
    int bad = 0;
    for (int i = 0; i < 32; i++) bad += inp[i] != (int)a[start + i] || tgt[i] != (int)a[start + i + 1];
    CHECK_EQ_INT(0, bad);
    CHECK(tok_batch(tf, 0, 0, 1, 1, 16, V - 1 > 1 ? 2 : 1, inp, tgt) == FSDP_ERR_RANGE);
    tok_close(&tf);
  }

  /* Tiny vocabularies are still valid chains. */
  tok_markov *t1 = NULL, *t2 = NULL;
  CHECK_OK(tok_markov_new(7, 1, &t1));
  CHECK_OK(tok_markov_new(7, 2, &t2));
  if (t1 && t2) {
    CHECK_NEAR(0.0, tok_markov_entropy(t1), 1e-12, 0);
    CHECK_OK(tok_markov_generate(t1, 100, b));
    int zeros = 1;
    for (int k = 0; k < 100; k++) zeros &= b[k] == 0;
    CHECK(zeros);
    CHECK(tok_markov_entropy(t2) > 0 && tok_markov_entropy(t2) <= log(2.0) + 1e-12);
  }
  tok_markov_destroy(&t1);
  tok_markov_destroy(&t2);
  CHECK(tok_markov_new(1, 0, &t1) == FSDP_ERR_RANGE);

  /* GPT-2's vocabulary: the stationary distribution converges quickly. */
  struct timespec t0, t1s;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  tok_markov *big = NULL;
  CHECK_OK(tok_markov_new(1, 50257, &big));
  clock_gettime(CLOCK_MONOTONIC, &t1s);
  double secs = (double)(t1s.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1s.tv_nsec - t0.tv_nsec);
  if (big) {
    printf("markov vocab 50257: entropy rate %.6f nats/token, built in %.3f s\n",
           tok_markov_entropy(big), secs);
    CHECK(tok_markov_entropy(big) > 0.5 && tok_markov_entropy(big) < log(4.0));
  }
  CHECK(secs < 30.0);   /* generous: a shared, possibly sanitized build */
  tok_markov_destroy(&big);

  tok_markov_destroy(&m);
  tok_markov_destroy(&m2);
  CHECK(m == NULL);
  free(a);
  free(b);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/test_tokens.XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_roundtrip(1000, 2);
  test_roundtrip(65536, 2);
  test_roundtrip(70000, 4);
  test_batch_order();
  test_bad_files();
  test_markov();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return check_done();
}
