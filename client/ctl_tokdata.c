/* ctl_tokdata — gen-data with a tokenizer (see ctl_tokdata.h). Threads: the caller's thread reads
 * the files and draws the progress bar; worker threads encode chunks, each with its own bpe_state. */
#define _GNU_SOURCE   /* memmem */
#include "ctl_tokdata.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bpe.h"
#include "fsutil.h"
#include "tokens.h"

#define CHUNK_BYTES (256u << 10)         /* documents per work item: about this much text */
#define PROGRESS_MIN_BYTES (16u << 20)  /* smaller inputs get no progress bar */

typedef struct doc {
  const char *p;
  size_t n;
  int file;       /* index into the file list, for messages */
  size_t where;   /* byte offset in the file, or line number for .jsonl */
} doc;

typedef struct job {
  const tokdata_args *a;
  const bpe_tokenizer *tok;
  doc *docs;
  size_t ndocs;
  size_t *chunk_start;   /* chunk k: docs chunk_start[k] .. chunk_start[k+1]-1 */
  size_t nchunks;
  bpe_ids *chunk_ids;
  atomic_size_t next, bytes_done;
  atomic_int failed;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int running;           /* worker threads not yet finished */
  size_t err_chunk;      /* the lowest failed chunk: its message is the one printed */
  char err[512];
} job;

typedef struct input {
  void **maps;
  size_t *lens;
  char **texts;          /* .jsonl documents, decoded */
  size_t ntexts, cap_texts;
} input;

static int grow(void **p, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return 1;
  size_t c = *cap ? *cap * 2 : 1024;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * size);
  if (!q) return 0;
  *p = q, *cap = c;
  return 1;
}

static int add_doc(doc **docs, size_t *n, size_t *cap, doc d) {
  if (!grow((void **)docs, cap, *n + 1, sizeof **docs)) return 0;
  (*docs)[(*n)++] = d;
  return 1;
}

/* One .jsonl file's documents: the "text" of each line's object. */
static int jsonl_docs(const char *path, int fi, const char *p, size_t n, input *in, doc **docs, size_t *nd, size_t *cap) {
  size_t line = 0;
  for (size_t at = 0; at < n; line++) {
    const char *e = memchr(p + at, '\n', n - at);
    size_t len = e ? (size_t)(e - p) - at : n - at;
    json_error_t je;
    json_t *o = len ? json_loadb(p + at, len, 0, &je) : NULL;
    const char *t = json_string_value(json_object_get(o, "text"));
    if (len && !t) {
      fprintf(stderr, "fsdpctl gen-data: %s line %zu: expected a JSON object with a \"text\" string\n", path, line + 1);
      json_decref(o);
      return 0;
    }
    if (t) {
      size_t tl = json_string_length(json_object_get(o, "text"));
      char *copy = malloc(tl + 1);
      if (!copy || !grow((void **)&in->texts, &in->cap_texts, in->ntexts + 1, sizeof *in->texts) ||
          !add_doc(docs, nd, cap, (doc){copy, tl, fi, line + 1})) {
        free(copy);
        json_decref(o);
        fprintf(stderr, "fsdpctl gen-data: out of memory reading %s\n", path);
        return 0;
      }
      memcpy(copy, t, tl + 1);
      in->texts[in->ntexts++] = copy;
    }
    json_decref(o);
    at += len + 1;
  }
  return 1;
}

/* Maps every file and lists its documents; a one-line error otherwise. */
static int read_inputs(const tokdata_args *a, input *in, doc **docs, size_t *nd) {
  size_t cap = 0;
  in->maps = calloc((size_t)a->nfiles, sizeof *in->maps);
  in->lens = calloc((size_t)a->nfiles, sizeof *in->lens);
  if (!in->maps || !in->lens) return fprintf(stderr, "fsdpctl gen-data: out of memory\n"), 0;
  for (int i = 0; i < a->nfiles; i++) {
    const char *path = a->files[i];
    int fd;
    struct stat st;
    fsdp_status rc = fsutil_open_read(AT_FDCWD, path, &fd);   /* no one else's link; as root, root's files only */
    if (rc == FSDP_ERR_NOTFOUND || rc == FSDP_ERR_IO)
      return fprintf(stderr, "fsdpctl gen-data: text file %s: %s\n", path, strerror(errno)), 0;
    if (rc != FSDP_OK) return fprintf(stderr, "fsdpctl gen-data: text file %s\n", fsdp_last_error()), 0;
    if (fstat(fd, &st) || st.st_size == 0) {
      fprintf(stderr, "fsdpctl gen-data: text file %s: empty; every --text file needs text\n", path);
      close(fd);
      return 0;
    }
    in->lens[i] = (size_t)st.st_size;
    in->maps[i] = mmap(NULL, in->lens[i], PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (in->maps[i] == MAP_FAILED) {
      in->maps[i] = NULL;
      fprintf(stderr, "fsdpctl gen-data: cannot map %s: %s\n", path, strerror(errno));
      return 0;
    }
    const char *p = in->maps[i];
    size_t n = in->lens[i], sl = a->doc_sep ? strlen(a->doc_sep) : 0;
    size_t len = strlen(path);
    if (len > 6 && !strcmp(path + len - 6, ".jsonl")) {
      if (!jsonl_docs(path, i, p, n, in, docs, nd, &cap)) return 0;
      continue;
    }
    for (size_t at = 0; at <= n;) {
      const char *e = sl ? memmem(p + at, n - at, a->doc_sep, sl) : NULL;
      size_t dl = e ? (size_t)(e - p) - at : n - at;
      if (dl && !add_doc(docs, nd, &cap, (doc){p + at, dl, i, at}))
        return fprintf(stderr, "fsdpctl gen-data: out of memory\n"), 0;
      if (!e) break;
      at += dl + sl;
    }
  }
  if (!*nd) return fprintf(stderr, "fsdpctl gen-data: the --text files hold no document\n"), 0;
  return 1;
}

static void free_inputs(const tokdata_args *a, input *in) {
  for (int i = 0; in->maps && i < a->nfiles; i++)
    if (in->maps[i]) munmap(in->maps[i], in->lens[i]);
  for (size_t i = 0; i < in->ntexts; i++) free(in->texts[i]);
  free(in->maps), free(in->lens), free(in->texts);
}

/* ---- the workers ---- */

static void fail_chunk(job *j, size_t k, const doc *d) {
  pthread_mutex_lock(&j->mu);
  if (!atomic_load(&j->failed) || k < j->err_chunk) {
    const char *path = j->a->files[d->file];
    size_t plen = strlen(path);
    int jsonl = plen > 6 && !strcmp(path + plen - 6, ".jsonl");
    snprintf(j->err, sizeof j->err, "%s %s %zu: %s", path, jsonl ? "line" : "document at byte", d->where,
             fsdp_last_error());
    j->err_chunk = k;
  }
  atomic_store(&j->failed, 1);
  pthread_mutex_unlock(&j->mu);
}

static void *worker(void *arg) {
  job *j = arg;
  bpe_state *st = NULL;
  int ok = bpe_state_new(j->tok, &st) == FSDP_OK;
  uint32_t eos = (uint32_t)bpe_eos_id(j->tok);
  for (size_t k; ok && !atomic_load(&j->failed) && (k = atomic_fetch_add(&j->next, 1)) < j->nchunks;) {
    for (size_t i = j->chunk_start[k]; i < j->chunk_start[k + 1]; i++) {
      const doc *d = &j->docs[i];
      fsdp_status rc = j->a->eos ? bpe_ids_push(&j->chunk_ids[k], eos) : FSDP_OK;
      if (rc == FSDP_OK) rc = bpe_encode(st, d->p, d->n, 0, &j->chunk_ids[k]);
      if (rc != FSDP_OK) {
        fail_chunk(j, k, d);
        break;
      }
      atomic_fetch_add(&j->bytes_done, d->n);
    }
  }
  if (!ok) fail_chunk(j, 0, &j->docs[0]);
  bpe_state_destroy(&st);
  pthread_mutex_lock(&j->mu);
  j->running--;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for the workers; on a terminal and a large input, redraws a progress bar meanwhile. */
static void wait_workers(job *j, size_t total, double t0) {
  int bar = total >= PROGRESS_MIN_BYTES && isatty(STDERR_FILENO);
  pthread_mutex_lock(&j->mu);
  while (j->running) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    if (bar) {
      double done = (double)atomic_load(&j->bytes_done), el = now_s() - t0;
      int w = (int)(40 * done / (double)total);
      fprintf(stderr, "\rtokenizing [%-40.*s] %3.0f%% %.1f MB/s ", w, "########################################",
              100 * done / (double)total, el > 0 ? done / el / 1e6 : 0.0);
    }
  }
  pthread_mutex_unlock(&j->mu);
  if (bar) fprintf(stderr, "\n");
}

static int encode_all(job *j, int threads, size_t total, double t0) {
  pthread_t *tid = calloc((size_t)threads, sizeof *tid);
  if (!tid) return fprintf(stderr, "fsdpctl gen-data: out of memory\n"), 0;
  int started = 0;
  j->running = threads;
  for (; started < threads; started++)
    if (pthread_create(&tid[started], NULL, worker, j)) break;
  if (started < threads) {   /* the ones that started finish the work */
    pthread_mutex_lock(&j->mu);
    j->running -= threads - started;
    pthread_mutex_unlock(&j->mu);
    if (!started) {
      free(tid);
      return fprintf(stderr, "fsdpctl gen-data: cannot start a thread\n"), 0;
    }
  }
  wait_workers(j, total, t0);
  for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
  free(tid);
  if (atomic_load(&j->failed)) return fprintf(stderr, "fsdpctl gen-data: %s\n", j->err), 0;
  return 1;
}

/* ---- the command ---- */

static int make_chunks(job *j) {
  j->chunk_start = malloc((j->ndocs + 1) * sizeof *j->chunk_start);
  if (!j->chunk_start) return 0;
  size_t acc = 0;
  for (size_t i = 0; i < j->ndocs; i++) {
    if (i == 0 || acc >= CHUNK_BYTES) j->chunk_start[j->nchunks++] = i, acc = 0;
    acc += j->docs[i].n;
  }
  j->chunk_start[j->nchunks] = j->ndocs;
  j->chunk_ids = calloc(j->nchunks, sizeof *j->chunk_ids);
  return j->chunk_ids != NULL;
}

/* The chunks' ids joined in order, split and written; prints the summary. */
static int write_out(const tokdata_args *a, job *j, size_t total, double secs, int threads) {
  size_t n = 0;
  for (size_t k = 0; k < j->nchunks; k++) n += j->chunk_ids[k].n;
  if (n > INT32_MAX) {
    fprintf(stderr, "fsdpctl gen-data: %zu tokens; an llm.c token file holds at most %d: split the text\n", n, INT32_MAX);
    return 0;
  }
  uint32_t *all = malloc((n ? n : 1) * sizeof *all);
  if (!all) return fprintf(stderr, "fsdpctl gen-data: out of memory for %zu tokens\n", n), 0;
  for (size_t k = 0, at = 0; k < j->nchunks; at += j->chunk_ids[k].n, k++)
    if (j->chunk_ids[k].n) memcpy(all + at, j->chunk_ids[k].v, j->chunk_ids[k].n * sizeof *all);
  int64_t nval = a->val ? (int64_t)floor(a->frac * (double)n) : 0, ntrain = (int64_t)n - nval;
  int vocab = (int)bpe_vocab_size(j->tok);
  fsdp_status rc = FSDP_OK;
  if (a->val && nval < 1)
    rc = fsdp_set_error(FSDP_ERR_RANGE, "--val-fraction %g of %zu tokens leaves the validation tail empty", a->frac, n);
  if (rc == FSDP_OK) rc = tokdata_write(a->out, all, ntrain, a->val, all + ntrain, nval, vocab);
  free(all);
  if (rc != FSDP_OK) return fprintf(stderr, "fsdpctl gen-data: %s\n", fsdp_last_error()), 0;
  if (a->json) {
    json_t *o = json_pack("{s:s, s:I, s:i, s:i, s:I, s:I, s:f, s:i}", "path", a->out, "tokens", (json_int_t)ntrain,
                          "vocab", vocab, "files", a->nfiles, "documents", (json_int_t)j->ndocs, "bytes",
                          (json_int_t)total, "seconds", secs, "threads", threads);
    if (o && a->val) {
      json_object_set_new(o, "val_path", json_string(a->val));
      json_object_set_new(o, "val_tokens", json_integer((json_int_t)nval));
    }
    if (o) json_dumpf(o, stdout, JSON_COMPACT);
    printf("\n");
    json_decref(o);
  } else {
    printf("wrote %lld tokens to %s", (long long)ntrain, a->out);
    if (a->val) printf(" and %lld validation tokens to %s", (long long)nval, a->val);
    printf(" (vocab %d, %s; %zu documents, %.1f MB in %.2f s on %d thread%s)\n", vocab,
           vocab > 65536 ? "uint32" : "uint16", j->ndocs, (double)total / 1e6, secs, threads, threads > 1 ? "s" : "");
  }
  return 1;
}

int ctl_tokdata(const tokdata_args *a) {
  job j = {.a = a, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  input in = {0};
  bpe_tokenizer *tok = NULL;
  int ok = 0;
  if (bpe_load(a->tokenizer, &tok) != FSDP_OK) {
    fprintf(stderr, "fsdpctl gen-data: %s\n", fsdp_last_error());
    return 1;
  }
  j.tok = tok;
  if (a->eos && bpe_eos_id(tok) < 0) {
    fprintf(stderr, "fsdpctl gen-data: --eos: the tokenizer has no end-of-text token (a special <|endoftext|>, "
            "<|end_of_text|>, </s> or <|im_end|>, or tokenizer_config.json's eos_token)\n");
    goto done;
  }
  double t0 = now_s();
  if (!read_inputs(a, &in, &j.docs, &j.ndocs)) goto done;
  if (!make_chunks(&j)) {
    fprintf(stderr, "fsdpctl gen-data: out of memory\n");
    goto done;
  }
  size_t total = 0;
  for (size_t i = 0; i < j.ndocs; i++) total += j.docs[i].n;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = a->threads > 0 ? a->threads : cores > 0 ? (int)cores : 1;
  if ((size_t)threads > j.nchunks) threads = (int)j.nchunks;
  if (!encode_all(&j, threads, total, t0)) goto done;
  ok = write_out(a, &j, total, now_s() - t0, threads);
done:
  for (size_t k = 0; j.chunk_ids && k < j.nchunks; k++) free(j.chunk_ids[k].v);
  free(j.chunk_ids), free(j.chunk_start), free(j.docs);
  free_inputs(a, &in);
  bpe_destroy(&tok);
  return ok ? 0 : 1;
}

fsdp_status tokdata_write(const char *out, const uint32_t *train, int64_t ntrain, const char *val, const uint32_t *vtok,
                          int64_t nval, int vocab) {
  fsutil_out o[2] = {FSUTIL_OUT_INIT, FSUTIL_OUT_INIT};
  const char *paths[2] = {out, val}, *name;
  const uint32_t *toks[2] = {train, vtok};
  int64_t counts[2] = {ntrain, nval};
  fsdp_status rc = FSDP_OK;
  for (int i = 0; rc == FSDP_OK && i < (val ? 2 : 1); i++) {
    if ((rc = fsutil_out_parent(paths[i], &o[i], &name)) != FSDP_OK) break;
    rc = tok_write_at(o[i].dirfd, o[i].shown, name, toks[i], counts[i], vocab);
    if (rc == FSDP_OK) rc = fsutil_out_claim(&o[i], name);
  }
  for (int i = 0; i < 2; i++) {   /* all or nothing: no training file without its validation tail */
    if (rc == FSDP_OK) fsutil_out_close(&o[i]);
    else fsutil_out_discard(&o[i]);
  }
  return rc;
}
