/* test_tokens — llm.c token files, the docs/design.md §6 batch order, and the Markov stream. */
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
#include "tmpdir.h"

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
  tok_destroy(&tf);
  CHECK(tf == NULL);
  tok_destroy(&tf); /* NULL-safe */
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
  tok_destroy(&tf);
  free(tok);
}

/* The shuffle permutation is a bijection of 0..n−1 for every (seed, epoch), and matches the
 * definition in docs/data.md: the golden values come from an independent Python implementation of
 * that text (Philox4x32-10 checked against Random123's vectors, then the Feistel network with
 * cycle walking). */
static void test_shuffle_index(void) {
  const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097};
  int not_bijective = 0, identity = 0;
  char *seen = malloc(4097);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    for (uint64_t seed = 0; seed < 3; seed++)
      for (uint64_t e = 0; e < 3; e++) {
        int64_t n = sizes[i];
        int id = 1;
        memset(seen, 0, (size_t)n);
        for (int64_t k = 0; k < n; k++) {
          int64_t v = tok_shuffle_index(seed, e, n, k);
          if (v < 0 || v >= n || seen[v]) {
            not_bijective++;
            continue;
          }
          seen[v] = 1;
          id &= v == k;
        }
        identity += id && n >= 16;
      }
  free(seen);
  CHECK_EQ_INT(0, not_bijective);
  CHECK_EQ_INT(0, identity);
  CHECK_EQ_INT(0, tok_shuffle_index(5, 0, 1, 0));
  CHECK_EQ_INT(-1, tok_shuffle_index(5, 0, 10, 10));
  CHECK_EQ_INT(-1, tok_shuffle_index(5, 0, 10, -1));
  CHECK_EQ_INT(-1, tok_shuffle_index(5, 0, 0, 0));

  static const struct { uint64_t seed, epoch; int64_t n, k[10], v[10]; int nk; } gold[] = {
    {1337, 0, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {5, 0, 6, 9, 2, 1, 4, 8, 7, 3}, 10},
    {1337, 1, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {4, 2, 5, 1, 6, 9, 3, 0, 7, 8}, 10},
    {7, 3, 1000, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {466, 270, 290, 885, 983, 224, 457, 398, 680, 226}, 10},
    {0xdeadbeefcafeull, (1ull << 33) + 5, 1ll << 40, {0, 1, 12345, (1ll << 40) - 1},
     {399039085445ll, 701112061388ll, 842122976230ll, 567144329568ll}, 4},
  };
  for (size_t g = 0; g < sizeof gold / sizeof gold[0]; g++)
    for (int j = 0; j < gold[g].nk; j++)
      CHECK_EQ_INT(gold[g].v[j], tok_shuffle_index(gold[g].seed, gold[g].epoch, gold[g].n, gold[g].k[j]));
}

/* Read the windows that micro-batch B gives RANK: tokens equal their positions, so a row's first
 * token names its window. Returns the number of malformed rows (not a whole window of T+1). */
static int rows_of(const tok_file *tf, int64_t b, int rank, int world, int B, int T, int vocab,
                   int64_t *win) {
  int *inp = malloc(sizeof *inp * (size_t)(B * T)), *tgt = malloc(sizeof *tgt * (size_t)(B * T));
  int bad = 0;
  if (tok_batch(tf, b, rank, world, B, T, vocab, inp, tgt) != FSDP_OK) {
    fprintf(stderr, "  tok_batch(%lld, %d, %d): %s\n", (long long)b, rank, world, fsdp_last_error());
    bad = B;
  } else {
    for (int i = 0; i < B; i++) {
      const int *x = inp + i * T, *y = tgt + i * T;
      int ok = x[0] % (T + 1) == 0;
      for (int t = 0; t < T; t++) ok &= x[t] == x[0] + t && y[t] == x[0] + t + 1;
      bad += !ok;
      win[i] = x[0] / (T + 1);
    }
  }
  free(inp);
  free(tgt);
  return bad;
}

/* The shuffle tests' file: tokens 0..SH_N-1, vocab SH_VOCAB; windows of SH_T + 1 tokens, SH_ROWS
 * rows per micro-batch over all ranks (N·B = 4; 1000 / 9 = 111 windows, 1 token left). */
#define SH_N 1000
#define SH_VOCAB 70000
#define SH_T 8
#define SH_ROWS 4
#define SH_NW (SH_N / (SH_T + 1))

/* Every window exactly once per epoch of REF (3 epochs), in tok_shuffle_index's order. */
static void check_epochs(const int64_t *ref) {
  int not_once = 0, not_perm = 0, same_as_prev = 1, sorted = 1;
  char seen[SH_NW];
  for (int64_t e = 0; e < 3; e++) {
    memset(seen, 0, sizeof seen);
    int same = 1;
    for (int64_t k = 0; k < SH_NW; k++) {
      int64_t w = ref[e * SH_NW + k];
      not_once += w < 0 || w >= SH_NW || seen[w]++;
      not_perm += w != tok_shuffle_index(1337, (uint64_t)e, SH_NW, k);
      if (e > 0) same &= w == ref[(e - 1) * SH_NW + k];
      if (e == 0 && k > 0) sorted &= w > ref[k - 1];
    }
    if (e > 0) same_as_prev &= same;
  }
  CHECK_EQ_INT(0, not_once);
  CHECK_EQ_INT(0, not_perm);
  CHECK(!same_as_prev);   /* each epoch draws its own permutation */
  CHECK(!sorted);         /* and it is not the file order */
}

/* N·B fixed: N = 1, 2, 4 ranks see exactly the single-rank rows REF of NMB micro-batches. */
static void check_split(tok_file *tf, const int64_t *ref, int64_t nmb) {
  int bad_split = 0;
  int64_t win[4];
  for (int world = 1; world <= 4; world *= 2) {
    int B = SH_ROWS / world;
    for (int64_t b = 0; b < nmb; b++)
      for (int r = 0; r < world; r++) {
        bad_split += rows_of(tf, b, r, world, B, SH_T, SH_VOCAB, win);
        for (int i = 0; i < B; i++) bad_split += win[i] != ref[b * SH_ROWS + r * B + i];
      }
  }
  CHECK_EQ_INT(0, bad_split);
}

/* Resuming mid-epoch: a freshly opened file continues at micro-batch 40 (position 160, in the
 * second epoch) exactly where the uninterrupted run is; and N·B·G fixed (2 ranks × B 2 × G 1
 * before, 1 rank × B 2 × G 2 after) gives each step the same windows. */
static void check_resume(const char *p, const int64_t *ref, int64_t nmb) {
  tok_file *again = NULL;
  CHECK_OK(tok_open(p, &again));
  if (!again) return;
  int bad_resume = 0;
  int64_t win[4];
  tok_set_shuffle(again, 1, 1337);
  for (int64_t b = 40; b < nmb; b++) {
    bad_resume += rows_of(again, b, 0, 1, SH_ROWS, SH_T, SH_VOCAB, win);
    for (int i = 0; i < SH_ROWS; i++) bad_resume += win[i] != ref[b * SH_ROWS + i];
  }
  for (int64_t step = 41; step <= nmb; step++)
    for (int k = 0; k < 2; k++) {
      bad_resume += rows_of(again, (step - 1) * 2 + k, 0, 1, 2, SH_T, SH_VOCAB, win);
      for (int i = 0; i < 2; i++) bad_resume += win[i] != ref[(step - 1) * 4 + k * 2 + i];
    }
  tok_destroy(&again);
  CHECK_EQ_INT(0, bad_resume);
}

/* Another seed, another order. */
static void check_other_seed(tok_file *tf, const int64_t *ref) {
  tok_set_shuffle(tf, 1, 1338);
  int differs = 0, bad = 0;
  int64_t win[4];
  for (int64_t b = 0; b < 8; b++) {
    bad += rows_of(tf, b, 0, 1, SH_ROWS, SH_T, SH_VOCAB, win);
    for (int i = 0; i < SH_ROWS; i++) differs += win[i] != ref[b * SH_ROWS + i];
  }
  CHECK(differs > 0);
  CHECK_EQ_INT(0, bad);
}

/* shuffle = false is the order of docs/design.md §6 exactly, whether it was never set (SEQ) or set
 * and cleared (TF): compare every micro-batch of 2 wrap-arounds against the untouched file. */
static void check_unshuffled(tok_file *tf, tok_file *seq) {
  tok_set_shuffle(tf, 0, 1337);
  int a_inp[2 * SH_T], a_tgt[2 * SH_T], b_inp[2 * SH_T], b_tgt[2 * SH_T];
  int bad_seq = 0;
  const int64_t nb = (SH_N - 1) / (SH_ROWS * SH_T);
  for (int64_t b = 0; b < 2 * nb + 1; b++)
    for (int r = 0; r < 2; r++) {
      CHECK_OK(tok_batch(tf, b, r, 2, 2, SH_T, SH_VOCAB, a_inp, a_tgt));
      CHECK_OK(tok_batch(seq, b, r, 2, 2, SH_T, SH_VOCAB, b_inp, b_tgt));
      int64_t start = ((b % nb) * 2 + r) * 2 * SH_T;
      for (int i = 0; i < 2 * SH_T; i++)
        bad_seq += a_inp[i] != b_inp[i] || a_tgt[i] != b_tgt[i] || a_inp[i] != start + i ||
                   a_tgt[i] != start + i + 1;
    }
  CHECK_EQ_INT(0, bad_seq);
}

/* Too short, a token past the vocabulary, a micro-batch past any file: each refused with its reason. */
static void check_shuffled_errors(tok_file *tf) {
  /* 111 windows; world 4 × B 28 = 112 rows. The message says how many are needed. */
  tok_set_shuffle(tf, 1, 1337);
  int *big = malloc(sizeof(int) * 37 * 8), *big2 = malloc(sizeof(int) * 37 * 8);
  CHECK(tok_batch(tf, 0, 0, 4, 28, SH_T, SH_VOCAB, big, big2) == FSDP_ERR_RANGE);
  CHECK(has("needs 112 windows, at least 1008 tokens"));
  CHECK_OK(tok_batch(tf, 0, 0, 3, 37, SH_T, SH_VOCAB, big, big2));   /* exactly 111 rows */
  free(big);
  free(big2);
  /* A token >= vocab names its position in shuffled order too. */
  int inp[32], tgt[32];
  int64_t w0 = tok_shuffle_index(1337, 0, SH_NW, 0);
  CHECK(tok_batch(tf, 0, 0, 1, 1, SH_T, (int)(w0 * (SH_T + 1) + 3), inp, tgt) == FSDP_ERR_RANGE);
  char want[64];
  snprintf(want, sizeof want, "position %lld", (long long)(w0 * (SH_T + 1) + 3));
  CHECK(has(want));
  CHECK(tok_batch(tf, INT64_MAX / 2, 0, 1, 4, SH_T, SH_VOCAB, inp, tgt) == FSDP_ERR_RANGE);
}

/* The Markov stream shuffles the same way. */
static void check_markov_shuffle(void) {
  tok_file *mk = NULL;
  CHECK_OK(tok_open_markov(9, 64, 5000, &mk));
  if (!mk) return;
  tok_set_shuffle(mk, 1, 3);
  uint32_t *all = malloc(sizeof *all * 5000);
  int inp[3 * 16], tgt[3 * 16];
  tok_markov *m = NULL;
  CHECK_OK(tok_markov_new(9, 64, &m));
  if (m) CHECK_OK(tok_markov_generate(m, 5000, all));
  CHECK_OK(tok_batch(mk, 7, 1, 2, 3, 16, 64, inp, tgt));
  int badm = 0;
  for (int i = 0; i < 3; i++) {
    int64_t pos = 7 * 6 + 3 + i, w = tok_shuffle_index(3, (uint64_t)(pos / (5000 / 17)), 5000 / 17, pos % (5000 / 17));
    for (int t = 0; t < 16; t++)
      badm += inp[i * 16 + t] != (int)all[w * 17 + t] || tgt[i * 16 + t] != (int)all[w * 17 + t + 1];
  }
  CHECK_EQ_INT(0, badm);
  tok_markov_destroy(&m);
  free(all);
  tok_destroy(&mk);
}

static void test_shuffle_batches(void) {
  uint32_t *tok = malloc(sizeof *tok * SH_N);
  for (int64_t i = 0; i < SH_N; i++) tok[i] = (uint32_t)i;
  const char *p = path_in("shuffle.bin");
  CHECK_OK(tok_write(p, tok, SH_N, SH_VOCAB));
  free(tok);
  tok_file *tf = NULL, *seq = NULL;
  CHECK_OK(tok_open(p, &tf));
  CHECK_OK(tok_open(p, &seq));
  if (tf && seq) {
    tok_set_shuffle(tf, 1, 1337);
    /* The single-rank reference: 3 epochs and a bit; 111 is not a multiple of 4, so some
     * micro-batches straddle two epochs. */
    const int64_t nmb = (3 * SH_NW) / SH_ROWS + 2;
    int64_t *ref = malloc(sizeof *ref * (size_t)(nmb * SH_ROWS));
    int bad = 0;
    for (int64_t b = 0; b < nmb; b++) bad += rows_of(tf, b, 0, 1, SH_ROWS, SH_T, SH_VOCAB, ref + b * SH_ROWS);
    CHECK_EQ_INT(0, bad);
    check_epochs(ref);
    check_split(tf, ref, nmb);
    check_resume(p, ref, nmb);
    check_other_seed(tf, ref);
    check_unshuffled(tf, seq);
    check_shuffled_errors(tf);
    free(ref);
  }
  check_markov_shuffle();
  tok_destroy(&tf);
  tok_destroy(&seq);
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
    tok_destroy(&tf);
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
    tok_destroy(&tf);
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

/* Several files as one stream (a glob, a list): the tokens of shard_0, shard_1, shard_2 in name
 * order, uint16 and uint32 parts mixed, rows across a file boundary, shuffled windows over all of
 * them, and a bad shard named. */
static void test_several_files(void) {
  const int V = 70000;
  const int64_t len[3] = {700, 37, 1200};
  uint32_t all[1937];
  int64_t n = 0;
  for (int k = 0; k < 3; k++) {
    uint32_t *t = all + n;
    for (int64_t i = 0; i < len[k]; i++) t[i] = (uint32_t)((n + i) * 131 % (k == 1 ? V : 60000));
    char name[32];
    snprintf(name, sizeof name, "shard_%d.bin", k);
    CHECK_OK(tok_write(path_in(name), t, len[k], k == 1 ? V : 60000));   /* shard 1 is uint32 */
    n += len[k];
  }
  tok_file *f = NULL, *g = NULL;
  char pattern[300];
  snprintf(pattern, sizeof pattern, "%s/shard_*.bin", tmp_dir);
  CHECK_OK(tok_open(pattern, &f));
  if (!f) return;
  CHECK_EQ_INT(n, tok_count(f));
  CHECK_EQ_INT(4, tok_width(f));
  /* sequential rows of T = 50 cover the stream in order, including rows across both boundaries */
  int inp[50], tgt[50], ok = 1;
  for (int64_t b = 0; b < (n - 1) / 50; b++) {
    CHECK_OK(tok_batch(f, b, 0, 1, 1, 50, V, inp, tgt));
    for (int i = 0; i < 50; i++) ok &= inp[i] == (int)all[b * 50 + i] && tgt[i] == (int)all[b * 50 + i + 1];
  }
  CHECK(ok);
  /* the same three as a list, in the order given: the same stream */
  char list[1000];
  snprintf(list, sizeof list, "%s\n%s\n%s", path_in("shard_0.bin"), path_in("shard_1.bin"), path_in("shard_2.bin"));
  CHECK_OK(tok_open(list, &g));
  if (g) {
    tok_set_shuffle(f, 1, 9);
    tok_set_shuffle(g, 1, 9);
    int a[4 * 40], at[4 * 40], b2[4 * 40], bt[4 * 40];
    CHECK_OK(tok_batch(f, 3, 1, 2, 4, 40, V, a, at));
    CHECK_OK(tok_batch(g, 3, 1, 2, 4, 40, V, b2, bt));
    CHECK(!memcmp(a, b2, sizeof a) && !memcmp(at, bt, sizeof at));
  }
  tok_destroy(&g);
  /* a token the vocabulary does not hold is named by its file and its position there: row 8 of
   * T = 100 starts at token 800, shard_2's 63rd (800·131 mod 60000 = 44800) */
  tok_set_shuffle(f, 0, 0);
  int row[100], rowt[100];
  CHECK(tok_batch(f, 8, 0, 1, 1, 100, 100, row, rowt) != FSDP_OK &&
        has("shard_2.bin: token 44800 at position 63 is >= vocab_size 100"));
  tok_destroy(&f);
  /* a bad shard fails the open, naming it; a pattern with no match is named too */
  write_raw(path_in("shard_3.bin"), 12345, 1, 0, NULL, 0, 1024);
  CHECK(tok_open(pattern, &f) != FSDP_OK && has("shard_3.bin is not an llm.c token file"));
  snprintf(pattern, sizeof pattern, "%s/none_*.bin", tmp_dir);
  CHECK(tok_open(pattern, &f) != FSDP_OK && has("none_*.bin: the pattern matches no file"));
  CHECK(f == NULL);
}

int main(void) {
  tmpdir_make("test_tokens");
  test_roundtrip(1000, 2);
  test_roundtrip(65536, 2);
  test_roundtrip(70000, 4);
  test_batch_order();
  test_shuffle_index();
  test_shuffle_batches();
  test_bad_files();
  test_markov();
  test_several_files();
  tmpdir_remove();
  return check_done();
}
