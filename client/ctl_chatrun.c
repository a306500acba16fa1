/* ctl_chatrun — see ctl_chatrun.h. Worker threads take blocks of lines in turn and keep each line's
 * tokens and mask (or what is wrong with it) for the caller's thread to append. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl_chatrun.h"

#define LINES_PER_TAKE 64

typedef struct line {
  const char *p;
  size_t n;
  int file;
  size_t lineno;
} line;

typedef struct result {
  uint32_t *ids;
  uint8_t *mask;
  size_t n;
  char *err;          /* what is wrong with the line, or NULL */
} result;

typedef struct run {
  const chat_ctx *proto;
  const line *lines;
  result *res;
  size_t nlines;
  atomic_size_t next;
  atomic_int oom;
} run;

static void *worker(void *arg) {
  run *r = arg;
  chat_ctx c = *r->proto;
  chat_doc doc = {0};
  if (bpe_state_new(c.tok, &c.st) != FSDP_OK) {
    atomic_store(&r->oom, 1);
    return NULL;
  }
  for (;;) {
    size_t at = atomic_fetch_add(&r->next, LINES_PER_TAKE);
    if (at >= r->nlines || atomic_load(&r->oom)) break;
    size_t end = at + LINES_PER_TAKE < r->nlines ? at + LINES_PER_TAKE : r->nlines;
    for (size_t i = at; i < end; i++) {
      char why[512];
      result *o = &r->res[i];
      if (chat_line(&c, r->lines[i].p, r->lines[i].n, &doc, why, sizeof why)) {
        if (!(o->err = strdup(why))) atomic_store(&r->oom, 1);
        continue;
      }
      o->n = doc.ids.n;
      o->ids = malloc((o->n + 1) * sizeof *o->ids);
      o->mask = malloc(o->n + 1);
      if (!o->ids || !o->mask) {
        atomic_store(&r->oom, 1);
        continue;
      }
      memcpy(o->ids, doc.ids.v, o->n * sizeof *o->ids);
      memcpy(o->mask, doc.mask, o->n);
    }
  }
  free(doc.ids.v);
  free(doc.mask);
  bpe_state_destroy(&c.st);
  return NULL;
}

char *chat_slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *s = malloc(cap + 1);
  for (size_t k; s && (k = fread(s + len, 1, cap - len, f)) > 0;) {
    len += k;
    if (len == cap) {
      char *t = realloc(s, (cap *= 2) + 1);
      if (!t) free(s);
      s = t;
    }
  }
  int err = ferror(f);
  fclose(f);
  if (!s || err) {
    free(s);
    return NULL;
  }
  s[len] = 0;
  *n = len;
  return s;
}

/* The non-blank lines of every file, in order; the files' texts in BUFS. */
static int list_lines(const chat_input *a, char **bufs, line **out, size_t *nout) {
  size_t cap = 0, n = 0;
  line *v = NULL;
  for (int f = 0; f < a->nfiles; f++) {
    size_t len;
    if (!(bufs[f] = chat_slurp(a->files[f], &len))) {
      fprintf(stderr, "fsdpctl gen-data: cannot read %s: %s\n", a->files[f], strerror(errno));
      free(v);
      return -1;
    }
    const char *p = bufs[f];
    size_t no = 0;
    for (size_t at = 0; at < len; no++) {
      const char *e = memchr(p + at, '\n', len - at);
      size_t ln = e ? (size_t)(e - p) - at : len - at;
      const char *l = p + at;
      at += ln + 1;
      while (ln && (l[ln - 1] == '\r' || l[ln - 1] == ' ' || l[ln - 1] == '\t')) ln--;
      if (!ln) continue;
      if (n == cap) {
        cap = cap ? 2 * cap : 4096;
        line *nv = realloc(v, cap * sizeof *nv);
        if (!nv) {
          free(v);
          fprintf(stderr, "fsdpctl gen-data: out of memory listing the lines of %s\n", a->files[f]);
          return -1;
        }
        v = nv;
      }
      v[n++] = (line){l, ln, f, no + 1};
    }
  }
  *out = v;
  *nout = n;
  return 0;
}

/* Append N tokens of DOC (with the end-of-text token EOS first when EOS >= 0) as one document. */
static int append_doc(out_buf *o, const chat_doc *d, size_t n, int64_t eos) {
  size_t need = o->n + n + 1;
  if (need > o->cap) {
    size_t cap = o->cap ? o->cap : 1 << 16;
    while (cap < need) cap *= 2;
    uint32_t *i = realloc(o->ids, cap * sizeof *i);
    if (i) o->ids = i;
    uint8_t *m = realloc(o->mask, cap), *s = m ? realloc(o->starts, cap) : NULL;
    if (m) o->mask = m;
    if (s) o->starts = s;
    if (!i || !m || !s) return -1;
    o->cap = cap;
  }
  if (o->ndocs == o->capdocs) {
    size_t cap = o->capdocs ? 2 * o->capdocs : 1024;
    size_t *p = realloc(o->doc_at, cap * sizeof *p);
    if (!p) return -1;
    o->doc_at = p;
    o->capdocs = cap;
  }
  o->doc_at[o->ndocs++] = o->n;
  size_t first = o->n;
  if (eos >= 0) o->ids[o->n] = (uint32_t)eos, o->mask[o->n] = 0, o->starts[o->n++] = 0;
  memcpy(o->ids + o->n, d->ids.v, n * sizeof *o->ids);
  memcpy(o->mask + o->n, d->mask, n);
  memset(o->starts + o->n, 0, n);
  o->n += n;
  o->starts[first] = 1;
  return 0;
}

/* The lines' results in order: messages, counts, --seq-len, appended to O. */
static int assemble(const chat_input *a, const line *lines, result *res, size_t n, out_buf *o, counts *k, int64_t eos) {
  for (size_t i = 0; i < n; i++) {
    k->lines++;
    if (res[i].err) {
      k->malformed++;
      fprintf(stderr, "fsdpctl gen-data: %s:%zu: %s%s\n", a->files[lines[i].file], lines[i].lineno, res[i].err,
              a->strict ? "" : " (line skipped)");
      if (a->strict) return -1;
      continue;
    }
    size_t nt = res[i].n, room = a->seq_len ? (size_t)a->seq_len - (eos >= 0) : nt;
    if (a->seq_len && nt > room) {
      if (a->drop_overlong) {
        k->dropped++;
        continue;
      }
      k->truncated++;
      nt = room;
    }
    chat_doc d = {.ids = {.v = res[i].ids, .n = res[i].n}, .mask = res[i].mask};
    if (append_doc(o, &d, nt, eos)) {
      fprintf(stderr, "fsdpctl gen-data: out of memory\n");
      return -1;
    }
    k->convs++;
  }
  return 0;
}

int chat_run(const chat_input *a, const chat_ctx *proto, out_buf *o, counts *k, int64_t eos) {
  char **bufs = calloc((size_t)a->nfiles, sizeof *bufs);
  line *lines = NULL;
  size_t n = 0;
  int rc = -1;
  result *res = NULL;
  if (!bufs || list_lines(a, bufs, &lines, &n)) goto done;
  if (!(res = calloc(n + 1, sizeof *res))) {
    fprintf(stderr, "fsdpctl gen-data: out of memory\n");
    goto done;
  }
  run r = {.proto = proto, .lines = lines, .res = res, .nlines = n};
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = a->threads > 0 ? a->threads : cores > 0 ? (int)cores : 1;
  size_t takes = (n + LINES_PER_TAKE - 1) / LINES_PER_TAKE;
  if ((size_t)threads > takes) threads = takes ? (int)takes : 1;
  pthread_t *tid = calloc((size_t)threads, sizeof *tid);
  int started = 0;
  for (; tid && started < threads; started++)
    if (pthread_create(&tid[started], NULL, worker, &r)) break;
  if (!started) worker(&r);   /* no thread could start: this one does the work */
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  free(tid);
  if (atomic_load(&r.oom)) fprintf(stderr, "fsdpctl gen-data: out of memory encoding the conversations\n");
  else rc = assemble(a, lines, res, n, o, k, eos);
done:
  for (size_t i = 0; res && i < n; i++) free(res[i].ids), free(res[i].mask), free(res[i].err);
  free(res);
  free(lines);
  for (int f = 0; bufs && f < a->nfiles; f++) free(bufs[f]);
  free(bufs);
  return rc;
}
