/* tokens — llm.c token files, the batch order, and the synthetic Markov stream (see tokens.h). */
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "rng.h"
#include "tokens_priv.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokens.c reads and writes little-endian files with memcpy: a little-endian host is required"
#endif



/* ---- token files ---- */

static fsdp_status tok_new_named(const char *name, tok_file **out) {
  tok_file *f = calloc(1, sizeof *f);
  if (!f || !(f->name = strdup(name))) {
    free(f);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory opening token stream %s", name);
  }
  *out = f;
  return FSDP_OK;
}

static fsdp_status tok_open_one(const char *path, tok_file **out) {
  *out = NULL;
  fsdp_status rc = FSDP_OK;
  tok_file *f = NULL;
  int fd;
  if ((rc = fsutil_open_read(AT_FDCWD, path, &fd)) != FSDP_OK) {   /* no one else's link followed */
    char why[1024];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_set_error(rc, "token file: %s", why);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot stat token file %s: %s", path, strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = fsdp_set_error(FSDP_ERR_INVALID, "token file %s is not a regular file", path);
    goto out;
  }
  if ((int64_t)st.st_size < TOK_HEADER_BYTES) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT,
                        "token file %s is %lld bytes, shorter than the %lld-byte llm.c header "
                        "(256 int32: magic, version, token count)",
                        path, (long long)st.st_size, (long long)TOK_HEADER_BYTES);
    goto out;
  }
  TRY_GOTO(tok_new_named(path, &f), rc, out);
  f->map_len = (size_t)st.st_size;
  f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot map token file %s: %s", path, strerror(errno));
    goto out;
  }
  int32_t hdr[3];
  memcpy(hdr, f->map, sizeof hdr);
  f->masked = (hdr[0] == TOK_MAGIC_U16 && hdr[1] == TOK_VERSION_U16_MASKED) ||
              (hdr[0] == TOK_MAGIC_U32 && hdr[1] == TOK_VERSION_U32_MASKED);
  if (f->masked) hdr[1] = hdr[0] == TOK_MAGIC_U16 ? TOK_VERSION_U16 : TOK_VERSION_U32;   /* the same tokens */
  if (hdr[0] == TOK_MAGIC_U16) {
    f->width = 2;
    if (hdr[1] != TOK_VERSION_U16) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT,
                          "token file %s: magic %d (uint16 tokens) with version %d; only version %d "
                          "is known",
                          path, hdr[0], hdr[1], TOK_VERSION_U16);
      goto out;
    }
  } else if (hdr[0] == TOK_MAGIC_U32) {
    f->width = 4;
    if (hdr[1] != TOK_VERSION_U32) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT,
                          "token file %s: magic %d (uint32 tokens) with version %d; only version %d "
                          "is known",
                          path, hdr[0], hdr[1], TOK_VERSION_U32);
      goto out;
    }
  } else {
    rc = fsdp_set_error(FSDP_ERR_FORMAT,
                        "%s is not an llm.c token file: magic %d; expected %d (version %d, uint16 "
                        "tokens) or %d (version %d, uint32 tokens)",
                        path, hdr[0], TOK_MAGIC_U16, TOK_VERSION_U16, TOK_MAGIC_U32,
                        TOK_VERSION_U32);
    goto out;
  }
  if (hdr[2] < 0) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "token file %s: negative token count %d in the header",
                        path, hdr[2]);
    goto out;
  }
  f->n = hdr[2];
  int64_t bitmap = f->masked ? (f->n + 7) / 8 : 0;   /* the mask, then the document starts */
  int64_t want = TOK_HEADER_BYTES + f->n * f->width + 2 * bitmap;
  if (want != (int64_t)st.st_size) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT,
                        "token file %s: the header says %lld tokens of %d bytes (%lld bytes with "
                        "the header%s) but the file is %lld bytes%s",
                        path, (long long)f->n, f->width, (long long)want,
                        f->masked ? " and the two bitmaps of a masked file" : "", (long long)st.st_size,
                        want > (int64_t)st.st_size ? ": truncated?" : "");
    goto out;
  }
  f->tokens = (const uint8_t *)f->map + TOK_HEADER_BYTES;
  if (f->masked) {
    f->mask_bits = f->tokens + f->n * f->width;
    f->doc_bits = f->mask_bits + bitmap;
  }
  *out = f;
  f = NULL;
out:
  close(fd);
  tok_destroy(&f);
  return rc;
}

/* Appends the files PATTERN names (a glob, in name order, or one path) to PARTS; a glob that
 * matches nothing is an error naming it. */
static fsdp_status open_pattern(const char *pattern, tok_file ***parts, int *n, int *cap) {
  glob_t g;
  int literal = !strpbrk(pattern, "*?[");
  int grc = literal ? 0 : glob(pattern, GLOB_ERR, NULL, &g);
  if (!literal && grc == GLOB_NOMATCH)
    return fsdp_set_error(FSDP_ERR_NOTFOUND, "token files %s: the pattern matches no file", pattern);
  if (grc != 0) return fsdp_set_error(FSDP_ERR_IO, "token files %s: cannot list the directory", pattern);
  size_t count = literal ? 1 : g.gl_pathc;
  fsdp_status rc = FSDP_OK;
  for (size_t i = 0; i < count && rc == FSDP_OK; i++) {
    if (*n == *cap) {
      int c = *cap ? *cap * 2 : 16;
      tok_file **p = realloc(*parts, (size_t)c * sizeof *p);
      if (!p) {
        rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory opening %s", pattern);
        break;
      }
      *parts = p, *cap = c;
    }
    if ((rc = tok_open_one(literal ? pattern : g.gl_pathv[i], &(*parts)[*n])) == FSDP_OK) (*n)++;
  }
  if (!literal) globfree(&g);
  return rc;
}

fsdp_status tok_open(const char *path, tok_file **out) {
  *out = NULL;
  if (!strpbrk(path, "*?[\n")) return tok_open_one(path, out);
  /* several files read as one stream: patterns separated by newlines, each a path or a glob */
  tok_file **parts = NULL, *f = NULL;
  int n = 0, cap = 0;
  fsdp_status rc = FSDP_OK;
  char *list = strdup(path), *save = NULL;
  if (!list) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory opening %s", path);
  for (char *pat = strtok_r(list, "\n", &save); pat && rc == FSDP_OK; pat = strtok_r(NULL, "\n", &save))
    rc = open_pattern(pat, &parts, &n, &cap);
  if (rc == FSDP_OK) rc = tok_new_named(path, &f);
  for (char *c = f ? f->name : NULL; c && *c; c++)
    if (*c == '\n') *c = ' ';   /* messages name the stream on one line */
  if (rc == FSDP_OK && !(f->starts = malloc(((size_t)n + 1) * sizeof *f->starts)))
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory opening %s", path);
  if (rc == FSDP_OK) {
    f->parts = parts, f->nparts = n, parts = NULL;
    f->masked = n > 0 && f->parts[0]->masked;
    for (int k = 0; k < n && rc == FSDP_OK; k++)
      if (f->parts[k]->masked != f->masked)   /* a stream has one kind of rows */
        rc = fsdp_set_error(FSDP_ERR_INVALID,
                            "token files %s: %s %s a loss mask and %s %s: one stream is all masked files "
                            "(gen-data --chat) or all plain ones", f->name, f->parts[0]->name,
                            f->masked ? "carries" : "has no", f->parts[k]->name, f->masked ? "has none" : "carries one");
    for (int k = 0; k < n; k++) {
      f->starts[k] = f->n;
      f->n += f->parts[k]->n;
      if (f->parts[k]->width > f->width) f->width = f->parts[k]->width;
    }
    f->starts[n] = f->n;
    if (rc == FSDP_OK) *out = f, f = NULL;
  }
  for (int k = 0; parts && k < n; k++) tok_destroy(&parts[k]);
  free(parts);
  free(list);
  tok_destroy(&f);
  return rc;
}

int64_t tok_count(const tok_file *f) { return f->n; }
int tok_width(const tok_file *f) { return f->width; }

void tok_set_shuffle(tok_file *f, int shuffle, uint64_t seed) {
  f->shuffle = shuffle != 0;
  f->shuffle_seed = seed;
}

/* ---- the shuffle permutation ----
 *
 * A balanced Feistel network on 2h bits (h the smallest ≥ 1 with 4^h ≥ n) is a bijection of
 * 0..4^h−1 for any round function; cycle walking (apply it again while the result is ≥ n) turns
 * it into a bijection of 0..n−1, and since 4^h < 4n the expected number of applications is below
 * 4. Round i's function of the right half R is the first word of Philox4x32-10 with key = seed and
 * counter (R, i, epoch low word, TOK_SHUFFLE_TAG ^ epoch high word): the tag keeps these counters
 * apart from the initializer's (rng.h puts 0 in the last word). Six rounds rather than the minimal
 * four: the cost is negligible next to a training step, and short domains mix better. */
#define TOK_SHUFFLE_ROUNDS 6
#define TOK_SHUFFLE_TAG 0x53485546u   /* "SHUF" */

static uint64_t feistel(uint64_t v, int h, const uint32_t key[2], uint64_t epoch) {
  const uint64_t mask = (1ull << h) - 1;
  uint64_t l = v >> h, r = v & mask;
  for (uint32_t i = 0; i < TOK_SHUFFLE_ROUNDS; i++) {
    const uint32_t ctr[4] = {(uint32_t)r, i, (uint32_t)epoch, TOK_SHUFFLE_TAG ^ (uint32_t)(epoch >> 32)};
    uint32_t w[4];
    rng_philox4x32_10(ctr, key, w);
    uint64_t nl = r;
    r = (l ^ w[0]) & mask;
    l = nl;
  }
  return (l << h) | r;
}

int64_t tok_shuffle_index(uint64_t seed, uint64_t epoch, int64_t n, int64_t k) {
  if (n < 1 || n > ((int64_t)1 << 62) || k < 0 || k >= n) return -1;
  int h = 1;
  while (((uint64_t)1 << (2 * h)) < (uint64_t)n) h++;
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint64_t v = (uint64_t)k;
  do v = feistel(v, h, key, epoch);
  while (v >= (uint64_t)n);
  return (int64_t)v;
}

fsdp_status tok_range_error(const tok_file *f, int64_t i, uint32_t t, int vocab) {
  int k = f->nparts ? tok_part_of(f, i) : 0;   /* name the file that holds it */
  return fsdp_set_error(FSDP_ERR_RANGE,
                        "token stream %s: token %u at position %lld is >= vocab_size %d "
                        "(was the file made with another tokenizer?)",
                        f->nparts ? f->parts[k]->name : f->name, t, (long long)(i - (f->nparts ? f->starts[k] : 0)),
                        vocab);
}

/* Tokens start..start+len into inp[0..len) and, shifted by one, targets[0..len); each < vocab. */
static fsdp_status read_row(const tok_file *f, int64_t start, int64_t len, int vocab, int *inp,
                            int *targets) {
  for (int64_t i = 0; i <= len; i++) {
    uint32_t t = tok_at(f, start + i);
    if (t >= (uint32_t)vocab) return tok_range_error(f, start + i, t, vocab);
    if (i < len) inp[i] = (int)t;
    if (i > 0) targets[i - 1] = (int)t;
  }
  return FSDP_OK;
}

/* The shuffled order of tokens.h: rank's B rows of micro-batch MICROBATCH. */
static fsdp_status shuffled_batch(const tok_file *f, int64_t microbatch, int rank, int world, int B,
                                  int T, int vocab, int *inp, int *targets) {
  int64_t nw = f->n / ((int64_t)T + 1), rows = (int64_t)world * B;
  if (nw < rows)
    return fsdp_set_error(FSDP_ERR_RANGE,
                          "token stream %s holds %lld tokens, %lld windows of T+1 = %d; one "
                          "shuffled batch of world %d x B %d needs %lld windows, at least %lld "
                          "tokens: use a longer file or a smaller batch",
                          f->name, (long long)f->n, (long long)nw, T + 1, world, B, (long long)rows,
                          (long long)(rows * ((int64_t)T + 1)));
  if (microbatch > (INT64_MAX - rows) / rows)
    return fsdp_set_error(FSDP_ERR_RANGE, "tok_batch: micro-batch %lld x %lld rows overflows",
                          (long long)microbatch, (long long)rows);
  int64_t first = microbatch * rows + (int64_t)rank * B;
  for (int i = 0; i < B; i++) {
    int64_t p = first + i;
    int64_t w = tok_shuffle_index(f->shuffle_seed, (uint64_t)(p / nw), nw, p % nw);
    TRY(read_row(f, w * ((int64_t)T + 1), T, vocab, inp + (int64_t)i * T, targets + (int64_t)i * T));
  }
  return FSDP_OK;
}

fsdp_status tok_batch(const tok_file *f, int64_t microbatch, int rank, int world, int B, int T,
                      int vocab, int *inp, int *targets) {
  if (world < 1 || rank < 0 || rank >= world)
    return fsdp_set_error(FSDP_ERR_RANGE, "tok_batch: rank %d of world %d; need 0 <= rank < world",
                          rank, world);
  if (B < 1 || T < 1 || vocab < 1)
    return fsdp_set_error(FSDP_ERR_RANGE,
                          "tok_batch: B=%d, T=%d, vocab=%d; each must be at least 1", B, T, vocab);
  if (microbatch < 0)
    return fsdp_set_error(FSDP_ERR_RANGE, "tok_batch: micro-batch %lld; must be >= 0",
                          (long long)microbatch);
  int64_t bt = (int64_t)B * T, span;
  if (__builtin_mul_overflow(bt, (int64_t)world, &span))
    return fsdp_set_error(FSDP_ERR_RANGE, "tok_batch: world %d x B %d x T %d overflows", world, B, T);
  if (f->masked) return tok_batch_docs(f, microbatch, rank, world, B, T, vocab, inp, targets, NULL, NULL);
  if (f->shuffle) return shuffled_batch(f, microbatch, rank, world, B, T, vocab, inp, targets);
  int64_t nb = f->n > 0 ? (f->n - 1) / span : 0;
  if (nb == 0)
    return fsdp_set_error(FSDP_ERR_RANGE,
                          "token stream %s holds %lld tokens; one batch of world %d x B %d x T %d "
                          "needs at least %lld (world*B*T + 1): use a longer file or a smaller "
                          "batch",
                          f->name, (long long)f->n, world, B, T, (long long)(span + 1));
  return read_row(f, ((microbatch % nb) * world + rank) * bt, bt, vocab, inp, targets);
}

void tok_destroy(tok_file **pf) {
  tok_file *f = pf ? *pf : NULL;
  if (!f) return;
  if (f->map) munmap(f->map, f->map_len);
  for (int k = 0; k < f->nparts; k++) tok_destroy(&f->parts[k]);
  free(f->parts);
  free(f->starts);
  free(f->doc);
  free(f->row);
  free(f->mem);
  free(f->name);
  free(f);
  *pf = NULL;
}

static fsdp_status write_tokens(fsutil_atomic *at, const uint32_t *tokens, int64_t n, int vocab);

fsdp_status tok_write(const char *path, const uint32_t *tokens, int64_t n, int vocab) {
  /* PATH.tmp created O_EXCL | O_NOFOLLOW and renamed over PATH: never written through a link */
  fsutil_atomic at = FSUTIL_ATOMIC_INIT;
  TRY(fsutil_atomic_open(path, 0644, &at));
  return write_tokens(&at, tokens, n, vocab);
}

fsdp_status tok_write_at(int dirfd, const char *dir_shown, const char *name, const uint32_t *tokens, int64_t n, int vocab) {
  fsutil_atomic at = FSUTIL_ATOMIC_INIT;
  TRY(fsutil_atomic_begin(dirfd, dir_shown, name, 0644, &at));
  return write_tokens(&at, tokens, n, vocab);
}

/* Check TOKENS, write them to AT's temporary and commit it (AT is always released). */
static fsdp_status write_tokens(fsutil_atomic *at, const uint32_t *tokens, int64_t n, int vocab) {
  fsdp_status rc = FSDP_OK;
  if (vocab < 1)
    rc = fsdp_set_error(FSDP_ERR_RANGE, "tok_write: vocab %d; must be at least 1", vocab);
  else if (n < 0 || n > INT32_MAX)
    rc = fsdp_set_error(FSDP_ERR_RANGE, "tok_write: %lld tokens; an llm.c token file holds 0 to %d (int32 count)",
                        (long long)n, INT32_MAX);
  for (int64_t i = 0; rc == FSDP_OK && i < n; i++)
    if (tokens[i] >= (uint32_t)vocab)
      rc = fsdp_set_error(FSDP_ERR_RANGE, "tok_write: token %u at position %lld is >= vocab %d",
                          tokens[i], (long long)i, vocab);
  if (rc != FSDP_OK) {
    fsutil_atomic_abort(at);
    return rc;
  }
  int wide = vocab > 65536;
  int32_t hdr[TOK_HEADER_INTS] = {0};
  hdr[0] = wide ? TOK_MAGIC_U32 : TOK_MAGIC_U16;
  hdr[1] = wide ? TOK_VERSION_U32 : TOK_VERSION_U16;
  hdr[2] = (int32_t)n;
  FILE *fp = fsutil_atomic_stream(at);
  int ok = fp && fwrite(hdr, sizeof hdr, 1, fp) == 1;
  if (wide) {
    ok = ok && (n == 0 || fwrite(tokens, 4, (size_t)n, fp) == (size_t)n);
  } else {
    uint16_t buf[8192];
    for (int64_t i = 0; ok && i < n; i += 8192) {
      int64_t m = n - i < 8192 ? n - i : 8192;
      for (int64_t j = 0; j < m; j++) buf[j] = (uint16_t)tokens[i + j];
      ok = fwrite(buf, 2, (size_t)m, fp) == (size_t)m;
    }
  }
  if (!ok) {
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot write token file %s: %s", at->shown, strerror(errno));
    fsutil_atomic_abort(at);
    return rc;
  }
  return fsutil_atomic_commit(at);
}

/* ---- the Markov chain ---- */

/* splitmix64's finalizer: a bijective mixer, so distinct inputs give distinct, well-spread words. */
static uint64_t tok_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/* Word k of stream S for SEED, counter-based (no state to carry). */
static uint64_t tok_hash(uint64_t seed, uint64_t stream, uint64_t k) {
  return tok_mix(tok_mix(seed ^ tok_mix(stream)) ^ k);
}
/* Uniform in [0, 1) with 53 random bits. */
static double tok_u01(uint64_t seed, uint64_t stream, uint64_t k) {
  return (double)(tok_hash(seed, stream, k) >> 11) * 0x1.0p-53;
}
enum { STREAM_SUCC = 1, STREAM_PROB = 2, STREAM_GEN = 3 };

struct tok_markov {
  uint64_t seed;
  int vocab;
  int nsucc;            /* successors per token: min(TOK_MARKOV_SUCC, vocab) */
  uint32_t *succ;       /* [vocab][nsucc] */
  double *cdf;          /* [vocab][nsucc] cumulative probabilities, the last exactly 1 */
  double *pi;           /* [vocab] stationary distribution */
  double entropy;       /* nats per token */
};

static double markov_p(const tok_markov *m, int i, int j) {
  const double *c = m->cdf + (int64_t)i * m->nsucc;
  return j == 0 ? c[0] : c[j] - c[j - 1];
}

fsdp_status tok_markov_new(uint64_t seed, int vocab, tok_markov **out) {
  *out = NULL;
  if (vocab < 1)
    return fsdp_set_error(FSDP_ERR_RANGE, "Markov chain: vocab %d; must be at least 1", vocab);
  tok_markov *m = calloc(1, sizeof *m);
  if (!m) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory for a Markov chain");
  m->seed = seed;
  m->vocab = vocab;
  m->nsucc = vocab < TOK_MARKOV_SUCC ? vocab : TOK_MARKOV_SUCC;
  int K = m->nsucc;
  int64_t V = vocab;
  m->succ = malloc(sizeof *m->succ * V * K);
  m->cdf = malloc(sizeof *m->cdf * V * K);
  m->pi = malloc(sizeof *m->pi * V);
  double *next = malloc(sizeof *next * V);
  if (!m->succ || !m->cdf || !m->pi || !next) {
    free(next);
    tok_markov_destroy(&m);
    return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory for a Markov chain over %d tokens", vocab);
  }
  for (int64_t i = 0; i < V; i++) {
    uint32_t *s = m->succ + i * K;
    double *c = m->cdf + i * K;
    /* i itself makes the chain aperiodic, (i+1) mod V makes it irreducible (a ring through all). */
    s[0] = (uint32_t)i;
    if (K > 1) s[1] = (uint32_t)((i + 1) % V);
    uint64_t attempt = 0;
    for (int j = 2; j < K; j++) {
      uint32_t cand;
      int dup;
      do {
        cand = (uint32_t)(tok_hash(seed, STREAM_SUCC, (uint64_t)i * 1024 + attempt++) % (uint64_t)V);
        dup = 0;
        for (int q = 0; q < j; q++) dup |= s[q] == cand;
      } while (dup);
      s[j] = cand;
    }
    /* Dirichlet(1, ..., 1) weights (normalized exponentials) with a floor, so that every
     * transition is frequent enough to be learned and the mean row entropy is near
     * ψ(K+1) − ψ(2) (1.08 nats for K = 4). */
    double w[TOK_MARKOV_SUCC], sum = 0;
    for (int j = 0; j < K; j++) {
      w[j] = 0.05 - log(1.0 - tok_u01(seed, STREAM_PROB, (uint64_t)i * TOK_MARKOV_SUCC + j));
      sum += w[j];
    }
    double acc = 0;
    for (int j = 0; j < K; j++) c[j] = (acc += w[j] / sum);
    c[K - 1] = 1.0;
  }
  /* Power iteration π ← πP from uniform. The self-loop makes P aperiodic and the random
   * successors make it mix fast, so this converges in tens to hundreds of iterations. */
  for (int64_t i = 0; i < V; i++) m->pi[i] = 1.0 / (double)V;
  int converged = 0;
  for (int it = 0; it < 100000 && !converged; it++) {
    memset(next, 0, sizeof *next * V);
    for (int64_t i = 0; i < V; i++) {
      const uint32_t *s = m->succ + i * K;
      for (int j = 0; j < K; j++) next[s[j]] += m->pi[i] * markov_p(m, (int)i, j);
    }
    double diff = 0, total = 0;
    for (int64_t i = 0; i < V; i++) total += next[i];
    for (int64_t i = 0; i < V; i++) {
      next[i] /= total;
      diff += fabs(next[i] - m->pi[i]);
    }
    memcpy(m->pi, next, sizeof *next * V);
    converged = diff < 1e-13;
  }
  free(next);
  if (!converged) {
    tok_markov_destroy(&m);
    return fsdp_set_error(FSDP_ERR_INTERNAL,
                          "Markov chain (seed %llu, vocab %d): the stationary distribution did not "
                          "converge in 100000 iterations",
                          (unsigned long long)seed, vocab);
  }
  double h = 0;
  for (int64_t i = 0; i < V; i++) {
    double hi = 0;
    for (int j = 0; j < K; j++) {
      double p = markov_p(m, (int)i, j);
      if (p > 0) hi -= p * log(p);
    }
    h += m->pi[i] * hi;
  }
  m->entropy = h;
  *out = m;
  return FSDP_OK;
}

double tok_markov_entropy(const tok_markov *m) { return m->entropy; }

fsdp_status tok_markov_generate(const tok_markov *m, int64_t n, uint32_t *out) {
  if (n < 0)
    return fsdp_set_error(FSDP_ERR_RANGE, "Markov stream: %lld tokens; must be >= 0", (long long)n);
  if (n == 0) return FSDP_OK;
  int K = m->nsucc;
  double u = tok_u01(m->seed, STREAM_GEN, 0), acc = 0;
  uint32_t cur = (uint32_t)(m->vocab - 1);
  for (int i = 0; i < m->vocab; i++)
    if (u < (acc += m->pi[i])) {
      cur = (uint32_t)i;
      break;
    }
  out[0] = cur;
  for (int64_t k = 1; k < n; k++) {
    const double *c = m->cdf + (int64_t)cur * K;
    const uint32_t *s = m->succ + (int64_t)cur * K;
    u = tok_u01(m->seed, STREAM_GEN, (uint64_t)k);
    int j = 0;
    while (j < K - 1 && u >= c[j]) j++;
    cur = s[j];
    out[k] = cur;
  }
  return FSDP_OK;
}

void tok_markov_destroy(tok_markov **pm) {
  tok_markov *m = pm ? *pm : NULL;
  if (!m) return;
  free(m->succ);
  free(m->cdf);
  free(m->pi);
  free(m);
  *pm = NULL;
}

fsdp_status tok_open_markov(uint64_t seed, int vocab, int64_t ntokens, tok_file **out) {
  *out = NULL;
  if (ntokens < 1)
    return fsdp_set_error(FSDP_ERR_RANGE, "synthetic:markov:%llu: %lld tokens; must be at least 1",
                          (unsigned long long)seed, (long long)ntokens);
  char name[64];
  snprintf(name, sizeof name, "synthetic:markov:%llu", (unsigned long long)seed);
  tok_markov *m = NULL;
  tok_file *f = NULL;
  fsdp_status rc;
  TRY_GOTO(tok_markov_new(seed, vocab, &m), rc, fail);
  TRY_GOTO(tok_new_named(name, &f), rc, fail);
  f->mem = malloc(sizeof *f->mem * (size_t)ntokens);
  if (!f->mem) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory for %lld tokens of %s", (long long)ntokens,
                        name);
    goto fail;
  }
  TRY_GOTO(tok_markov_generate(m, ntokens, f->mem), rc, fail);
  f->tokens = (const uint8_t *)f->mem;
  f->width = 4;
  f->n = ntokens;
  tok_markov_destroy(&m);
  *out = f;
  return FSDP_OK;
fail:
  tok_markov_destroy(&m);
  tok_destroy(&f);
  return rc;
}
