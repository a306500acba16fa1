/* ckpt — see ckpt.h: writing rank files (their format: ckpt_rankfile.c), finding and pruning
 * checkpoints, verifying and loading a full job's shards through the plans. */
#define _GNU_SOURCE   /* O_PATH */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "arch.h"
#include "ckpt_priv.h"
#include "ckpt_rankfile.h"
#include "fsutil.h"

int ckpt_due(const jobspec_t *spec, int step) {
  return spec->ckpt_every > 0 && spec->ckpt_dir[0] && step > 0 && (step % spec->ckpt_every == 0 || step == spec->steps);
}

fsdp_status ckpt_check_own_tree(const char *dir, int step) {
  int dfd, sfd;
  char shown[PATH_MAX];
  TRY(ckpt_open_step_dir(dir, step, 0, &dfd, &sfd));
  ckpt_step_dir(dir, step, shown, sizeof shown);
  fsdp_status rc = fsutil_check_own_tree(sfd, shown);
  close(sfd);
  close(dfd);
  return rc;
}

/* ---- writing ---- */

/* A no-op in the programs: the test builds link tests/hooks/ckpt_pause.c, whose definition of it
 * holds the writer at a named point (ckpt_priv.h). */
__attribute__((weak)) void ckpt_test_pause(const char *point, int step, int rank) { (void)point, (void)step, (void)rank; }

/* Write N bytes of BUF at OFF of FD (retrying short writes and EINTR). */
static fsdp_status pwrite_full(int fd, const void *buf, size_t n, off_t off, const char *shown) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", shown, strerror(errno));
    p += w, n -= (size_t)w, off += w;
  }
  return FSDP_OK;
}

/* O_DIRECT on FD on or off; 0 on success. */
static int set_direct(int fd, int on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? fl | O_DIRECT : fl & ~O_DIRECT);
}

struct ckpt_writer {
  fsutil_atomic a;            /* the rank file's temporary */
  int sfd;                    /* the step directory */
  uint8_t *h;                 /* the header, its CRCs filled in as the sections end */
  size_t hb;
  const uint8_t *sec[CKPT_NSEC];
  uint64_t len, off;          /* each section's bytes; where the first starts */
  int s;                      /* the section being written (CKPT_NSEC: all written) */
  uint64_t done;              /* its bytes written */
  uint32_t crc;               /* their CRC32C */
  int direct, on;             /* O_DIRECT wanted (0 once the file system refused it); the fd's flag now */
  int step, rank;
  pthread_mutex_t *guard;     /* held while a chunk reads its section (ckpt_writer_guard), or NULL */
};

fsdp_status ckpt_writer_begin(const char *dir, const plan_t *p, int rank, int step, int64_t opt_step,
                              const float *param, const float *m, const float *v, ckpt_writer **out) {
  *out = NULL;
  char sdir[PATH_MAX], name[32];
  ckpt_step_dir(dir, step, sdir, sizeof sdir);
  snprintf(name, sizeof name, "rank-%d.bin", rank);
  ckpt_test_pause("begin", step, rank);
  ckpt_writer *w = calloc(1, sizeof *w);
  size_t hb = ckpt_rankfile_header_bytes(p->nunits);
  uint8_t *h = calloc(1, hb);
  if (!w || !h) {
    free(w), free(h);
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a checkpoint writer");
  }
  *w = (ckpt_writer){.a = FSUTIL_ATOMIC_INIT, .sfd = -1, .h = h, .hb = hb, .sec = {(const uint8_t *)param,
                     (const uint8_t *)m, (const uint8_t *)v}, .len = (uint64_t)p->shard_total * sizeof(float),
                     .off = ckpt_rankfile_page_up(hb), .direct = 1, .step = step, .rank = rank};
  ckpt_rankfile_header(h, hb, p, rank, step, opt_step, w->off);
  fsdp_status rc = ckpt_open_step_dir(dir, step, 1, NULL, &w->sfd);
  if (rc == FSDP_OK) rc = fsutil_atomic_begin(w->sfd, sdir, name, 0644, &w->a);
  if (rc != FSDP_OK) {
    ckpt_writer_free(&w);
    return rc;
  }
  *out = w;
  return FSDP_OK;
}

/* The next chunk of the current section, from SRC: its CRC32C taken just before it is written (one pass over
 * memory, the chunk still in cache). A chunk whose address and size are page multiples bypasses the
 * page cache (O_DIRECT); the others, and all of them once the file system refuses one (EINVAL),
 * go through it. */
static fsdp_status write_chunk_from(ckpt_writer *w, const uint8_t *src) {
  off_t at = (off_t)(w->off + (uint64_t)w->s * ckpt_rankfile_page_up(w->len) + w->done);
  size_t n = w->len - w->done > CKPT_CHUNK ? CKPT_CHUNK : (size_t)(w->len - w->done);
  w->crc = ckpt_crc32c(w->crc, src, n);
  int want = w->direct && (uintptr_t)src % CKPT_PAGE == 0 && n % CKPT_PAGE == 0;
  if (want != w->on && set_direct(w->a.fd, want) == 0) w->on = want;
  ssize_t got = w->on ? pwrite(w->a.fd, src, n, at) : -2;
  if (got == -1 && errno == EINVAL) {   /* the file system takes no direct I/O: the page cache from now on */
    w->direct = 0;
    if (set_direct(w->a.fd, 0) == 0) w->on = 0;
  }
  if (got < 0) TRY(pwrite_full(w->a.fd, src, n, at, w->a.shown));
  else if ((size_t)got < n) TRY(pwrite_full(w->a.fd, src + got, n - (size_t)got, at + got, w->a.shown));
  w->done += n;
  return FSDP_OK;
}

static fsdp_status write_chunk(ckpt_writer *w) {
  if (w->guard) pthread_mutex_lock(w->guard);
  fsdp_status rc = write_chunk_from(w, w->sec[w->s] + w->done);
  if (w->guard) pthread_mutex_unlock(w->guard);
  return rc;
}

fsdp_status ckpt_writer_next(ckpt_writer *w, int *more) {
  if (w->s < CKPT_NSEC && w->done < w->len) TRY(write_chunk(w));
  if (w->s < CKPT_NSEC && w->done >= w->len) {
    ckpt_rankfile_set_crc(w->h, w->s, w->crc);
    if (w->s == 0) ckpt_test_pause("mid", w->step, w->rank);
    w->s++, w->done = 0, w->crc = 0;
  }
  *more = w->s < CKPT_NSEC;
  return FSDP_OK;
}

void ckpt_writer_guard(ckpt_writer *w, pthread_mutex_t *mu) { w->guard = mu; }

void ckpt_writer_sources(ckpt_writer *w, const float *const src[CKPT_NSEC]) {
  for (int s = 0; s < CKPT_NSEC; s++) w->sec[s] = (const uint8_t *)src[s];
}

uint64_t ckpt_writer_move_rest(ckpt_writer *w, float *const dst[CKPT_NSEC]) {
  uint64_t moved = 0;
  for (int s = 0; s < CKPT_NSEC; s++) {
    uint64_t from = s < w->s ? w->len : s == w->s ? w->done : 0;
    if (from < w->len) memcpy((uint8_t *)dst[s] + from, w->sec[s] + from, (size_t)(w->len - from));
    moved += w->len - from;
    w->sec[s] = (const uint8_t *)dst[s];
  }
  return moved;
}

/* The header, which holds the CRCs, is written last at offset 0; then the one fsync, in the commit. */
fsdp_status ckpt_writer_commit(ckpt_writer *w) {
  if (w->s < CKPT_NSEC) return fsdp_set_error(FSDP_ERR_INTERNAL, "checkpoint rank file committed before its sections");
  if (w->on && set_direct(w->a.fd, 0) == 0) w->on = 0;
  ckpt_rankfile_seal(w->h, w->hb);
  TRY(pwrite_full(w->a.fd, w->h, w->hb, 0, w->a.shown));
  return fsutil_atomic_commit(&w->a);
}

void ckpt_writer_free(ckpt_writer **pw) {
  ckpt_writer *w = *pw;
  if (!w) return;
  fsutil_atomic_abort(&w->a);
  if (w->sfd >= 0) close(w->sfd);
  free(w->h);
  free(w);
  *pw = NULL;
}

fsdp_status ckpt_write_rank(const char *dir, const plan_t *p, int rank, int step, int64_t opt_step,
                            const float *param, const float *m, const float *v) {
  ckpt_writer *w;
  TRY(ckpt_writer_begin(dir, p, rank, step, opt_step, param, m, v, &w));
  fsdp_status rc = FSDP_OK;
  for (int more = 1; rc == FSDP_OK && more;) rc = ckpt_writer_next(w, &more);
  if (rc == FSDP_OK) rc = ckpt_writer_commit(w);
  ckpt_writer_free(&w);
  return rc;
}

/* ---- finding and pruning ---- */

/* "step-%08d" exactly, or -1. */
static int parse_step_name(const char *name) {
  if (strncmp(name, "step-", 5) != 0 || strlen(name) != 13) return -1;
  int s = 0;
  for (int i = 5; i < 13; i++) {
    if (name[i] < '0' || name[i] > '9') return -1;
    s = s * 10 + (name[i] - '0');
  }
  return s;
}

/* Step STEP's entry in the checkpoint directory DFD is a directory (not a link) holding a manifest
 * (a regular file). */
static int is_complete(int dfd, int step) {
  char name[32];
  snprintf(name, sizeof name, "step-%08d", step);
  int sfd = openat(dfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sfd < 0) return 0;
  struct stat st;
  int ok = fstatat(sfd, CKPT_MANIFEST, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
  close(sfd);
  return ok;
}

static int cmp_desc(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x < y) - (x > y);
}

/* Open the checkpoint directory DIR into *DFD (-1 when it does not exist) and list every step-*
 * entry of it, newest first (malloc'd, *n entries). */
static fsdp_status list_steps(const char *dir, int *dfd, int **steps, int *n) {
  *steps = NULL;
  *n = 0;
  fsdp_status rc = fsutil_dir_open(AT_FDCWD, dir, 0, FSUTIL_TRUSTED_LINKS, dfd);
  if (rc == FSDP_ERR_NOTFOUND) {
    fsdp_clear_error();
    return FSDP_OK;
  }
  if (rc != FSDP_OK) return rc;
  int lfd = dup(*dfd);
  DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
  if (!d) {
    if (lfd >= 0) close(lfd);
    return fsdp_set_error(FSDP_ERR_IO, "cannot read the checkpoint directory %s: %s", dir, strerror(errno));
  }
  int cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int s = parse_step_name(e->d_name);
    if (s < 0) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      int *ns = realloc(*steps, (size_t)cap * sizeof(int));
      if (!ns) {
        rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot list %s", dir);
        break;
      }
      *steps = ns;
    }
    (*steps)[(*n)++] = s;
  }
  closedir(d);
  if (rc != FSDP_OK) {
    free(*steps);
    *steps = NULL;
    *n = 0;
    return rc;
  }
  if (*n) qsort(*steps, (size_t)*n, sizeof(int), cmp_desc);
  return FSDP_OK;
}

fsdp_status ckpt_latest(const char *dir, int *step) {
  int *steps, n, dfd = -1;
  TRY(list_steps(dir, &dfd, &steps, &n));
  fsdp_status rc = fsdp_set_error(FSDP_ERR_NOTFOUND, "no complete checkpoint (a step-* directory with %s) in %s",
                                  CKPT_MANIFEST, dir);
  for (int i = 0; i < n; i++)
    if (is_complete(dfd, steps[i])) {
      *step = steps[i];
      rc = FSDP_OK;
      break;
    }
  free(steps);
  if (dfd >= 0) close(dfd);
  return rc;
}

/* Delete step STEP's entry of the checkpoint directory DFD: a link as a link (what it points to is
 * never touched), a directory with its manifest first, so that a half-deleted checkpoint never looks
 * complete. */
static fsdp_status remove_step_dir(int dfd, const char *dir, int step) {
  char name[32], shown[PATH_MAX];
  snprintf(name, sizeof name, "step-%08d", step);
  ckpt_step_dir(dir, step, shown, sizeof shown);
  int sfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sfd >= 0) {
    int r = unlinkat(sfd, CKPT_MANIFEST, 0);
    int e = errno;
    close(sfd);
    if (r != 0 && e != ENOENT)
      return fsdp_set_error(FSDP_ERR_IO, "cannot delete %s/%s: %s", shown, CKPT_MANIFEST, strerror(e));
  }
  return fsutil_remove_at(dfd, name, shown);
}

fsdp_status ckpt_discard(const char *dir, int step) {
  int dfd;
  TRY(fsutil_dir_open(AT_FDCWD, dir, 0, FSUTIL_TRUSTED_LINKS, &dfd));
  fsdp_status rc = remove_step_dir(dfd, dir, step);
  if (rc == FSDP_OK) rc = fsutil_fsync_dir(dfd, dir);
  close(dfd);
  return rc;
}

fsdp_status ckpt_withdraw(const char *dir, int step) {
  int dfd, sfd;
  char shown[PATH_MAX];
  ckpt_step_dir(dir, step, shown, sizeof shown);
  TRY(ckpt_open_step_dir(dir, step, 0, &dfd, &sfd));
  fsdp_status rc = FSDP_OK;
  if (unlinkat(sfd, CKPT_MANIFEST, 0) != 0 && errno != ENOENT)
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot delete %s/%s: %s", shown, CKPT_MANIFEST, strerror(errno));
  if (rc == FSDP_OK) rc = fsutil_fsync_dir(sfd, shown);
  close(sfd);
  close(dfd);
  return rc;
}

fsdp_status ckpt_prune(const char *dir, int keep) {
  int *steps, n, dfd = -1;
  TRY(list_steps(dir, &dfd, &steps, &n));
  fsdp_status rc = FSDP_OK;
  int kept = 0, newest = -1;
  for (int i = 0; i < n; i++) {
    int complete = is_complete(dfd, steps[i]);
    if (complete && newest < 0) newest = steps[i];
    int drop = complete ? kept >= keep : newest >= 0;   /* incomplete: only if older than a complete one */
    if (complete && !drop) kept++;
    if (!drop) continue;
    fsdp_status r = remove_step_dir(dfd, dir, steps[i]);
    if (r != FSDP_OK && rc == FSDP_OK) rc = r;
  }
  free(steps);
  if (dfd >= 0) close(dfd);
  return rc;
}

/* ---- reading rank files ---- */

/* The same architecture and, by its descriptor, the same settings beyond the shape. */
static int model_eq(const model_config *a, const model_config *b) {
  return ckpt_shape_eq(a, b) && a->arch == b->arch && arch_same_model(a, b);
}

/* The architecture's settings beyond the shape, for the message ("" when it has none). */
static void model_desc(const model_config *m, char *buf, size_t n) {
  arch_describe(m, buf, n);
}

/* The writer's plan: the manifest's model, world and sharding, everything else from SPEC. */
static fsdp_status old_plan(const ckpt_info *ci, const jobspec_t *spec, plan_t **out) {
  jobspec_t s = *spec;
  s.model = ci->model;
  s.sharding = ci->sharding;
  s.world_size = ci->world;
  if (ci->batch_size > 0) s.batch_size = ci->batch_size;
  if (ci->grad_accum > 0) s.grad_accum = ci->grad_accum;
  return plan_build(&s, ci->world, out);
}

/* A LoRA checkpoint's writer: the segment of the [lora] its manifest names. */
static fsdp_status lora_old_plan(const ckpt_info *ci, plan_t **out) {
  plan_t *job = NULL;
  TRY(ckpt_lora_plan(ci, 1, &job));
  fsdp_status rc = plan_lora_segment(job, ci->world, out);
  plan_destroy(&job);
  return rc;
}

fsdp_status ckpt_verify(const char *dir, const ckpt_info *ci, int first, int stride) {
  if (stride < 1) stride = 1;
  jobspec_t spec;
  jobspec_defaults(&spec);
  plan_t *old = NULL;
  if (ci->lora.rank) TRY(lora_old_plan(ci, &old));
  else TRY(old_plan(ci, &spec, &old));
  fsdp_status rc = FSDP_OK;
  for (int q = first; q < ci->world && rc == FSDP_OK; q += stride) {
    rank_file f = {.fd = -1};
    rc = ckpt_rankfile_open(dir, ci, old, q, &f);
    for (int s = 0; s < CKPT_NSEC && rc == FSDP_OK; s++) rc = ckpt_rankfile_read_section(&f, s, NULL);
    ckpt_rankfile_close(&f);
  }
  plan_destroy(&old);
  return rc;
}

int ckpt_same_layout(const ckpt_info *ci, const plan_t *p) {
  return ci->world == p->world && ci->sharding == p->sharding && model_eq(&ci->model, &p->model);
}

/* Every tensor of P and OLD has the same name, shape and place: the model is the same. */
static fsdp_status same_model(const char *dir, const ckpt_info *ci, const plan_t *old, const plan_t *p) {
  int bad = !model_eq(&ci->model, &p->model) || old->nunits != p->nunits;
  for (int u = 0; !bad && u < p->nunits; u++) {
    const plan_unit *a = &old->units[u], *b = &p->units[u];
    bad = a->numel != b->numel || a->ntensors != b->ntensors;
    for (int t = 0; !bad && t < a->ntensors; t++)
      bad = strcmp(a->t[t].name, b->t[t].name) || a->t[t].ndim != b->t[t].ndim || a->t[t].shape[0] != b->t[t].shape[0] ||
            a->t[t].shape[1] != b->t[t].shape[1] || a->t[t].offset != b->t[t].offset;
  }
  if (!bad) return FSDP_OK;
  const model_config *x = &ci->model, *y = &p->model;
  /* Llama's eps, theta, tie and rope too: a checkpoint that differs only there would otherwise read as equal */
  char xl[256], yl[256];
  model_desc(x, xl, sizeof xl);
  model_desc(y, yl, sizeof yl);
  return fsdp_set_error(FSDP_ERR_INVALID, "the checkpoint in %s (step %d) is of a different model: %s, n_layer %d, n_head %d, "
                        "n_embd %d, vocab_size %d, seq_len %d, n_kv_head %d, ffn_dim %d%s; this job has %s, %d, %d, %d, "
                        "%d, %d, %d, %d%s. The model must match "
                        "to resume (world size, batch size, grad_accum, steps and the LR schedule may change); "
                        "point [checkpoint] dir at an empty directory (resume = never refuses one that holds checkpoints)", dir, ci->step,
                        jobspec_arch_name(x->arch), x->n_layer, x->n_head, x->n_embd, x->vocab_size, x->seq_len,
                        x->n_kv_head, x->ffn_dim, xl, jobspec_arch_name(y->arch), y->n_layer, y->n_head, y->n_embd,
                        y->vocab_size, y->seq_len, y->n_kv_head, y->ffn_dim, yl);
}

fsdp_status ckpt_load_shard(const char *dir, const ckpt_info *ci, const jobspec_t *spec, const plan_t *p, int rank,
                            float *param, float *m, float *v, int64_t *opt_step) {
  plan_t *old = NULL;
  if (!model_eq(&ci->model, &p->model)) return same_model(dir, ci, p, p);   /* refused, with the message */
  TRY(ckpt_lora_check(dir, ci, p, NULL));   /* a LoRA checkpoint and a full job, or the reverse */
  if (p->lora.rank)   /* its file holds the adapters, not P's shards */
    return fsdp_set_error(FSDP_ERR_INTERNAL, "the LoRA checkpoint in %s is read by ckpt_lora_load", dir);
  TRY(old_plan(ci, spec, &old));
  fsdp_status rc = same_model(dir, ci, old, p);
  rank_file *files = calloc((size_t)ci->world, sizeof *files);
  if (!files) rc = fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the checkpoint file table");
  if (rc != FSDP_OK) goto out;
  for (int q = 0; q < ci->world; q++) files[q].fd = -1;
  float *dst[CKPT_NSEC] = {param, m, v};
  int64_t ostep = -1;

  if (ckpt_same_layout(ci, p)) {
    /* Same layout: this rank's own file, every section whole and CRC-checked. */
    TRY_GOTO(ckpt_rankfile_open(dir, ci, old, rank, &files[rank]), rc, out);
    for (int s = 0; s < CKPT_NSEC; s++) TRY_GOTO(ckpt_rankfile_read_section(&files[rank], s, dst[s]), rc, out);
    ostep = files[rank].opt_step;
  } else {
    for (int s = 0; s < CKPT_NSEC; s++) memset(dst[s], 0, (size_t)p->shard_total * sizeof(float));
    for (int u = 0; u < p->nunits; u++) {
      const plan_unit *nu = &p->units[u], *ou = &old->units[u];
      int64_t lo = plan_shard_offset(p, u, rank), hi = lo + nu->shard_numel;
      if (hi > nu->numel) hi = nu->numel;   /* padding stays zero */
      /* Old sharding none: every rank holds everything; spread the reads over the files. */
      int qfirst = 0, qlast = ci->world - 1;
      if (old->shard_world == 1) qfirst = qlast = rank % ci->world;
      for (int q = qfirst; q <= qlast && lo < hi; q++) {
        int64_t olo = plan_shard_offset(old, u, q), ohi = olo + ou->shard_numel;
        int64_t a = lo > olo ? lo : olo, b = hi < ohi ? hi : ohi;
        if (a >= b) continue;
        rank_file *f = &files[q];
        if (f->fd < 0) {
          TRY_GOTO(ckpt_rankfile_open(dir, ci, old, q, f), rc, out);
          if (ostep < 0) ostep = f->opt_step;
          if (f->opt_step != ostep) {
            rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: optimizer step %lld, other ranks' files say %lld", f->path,
                                (long long)f->opt_step, (long long)ostep);
            goto out;
          }
        }
        for (int s = 0; s < CKPT_NSEC; s++) {
          uint64_t off = f->sec_off[s] + (uint64_t)(ou->shard_base + (a - olo)) * sizeof(float);
          TRY_GOTO(ckpt_rankfile_pread(f, dst[s] + nu->shard_base + (a - lo), (size_t)(b - a) * sizeof(float), off), rc,
                   out);
        }
      }
    }
  }
  if (opt_step) *opt_step = ostep;
out:
  if (files)
    for (int q = 0; q < ci->world; q++) ckpt_rankfile_close(&files[q]);
  free(files);
  plan_destroy(&old);
  return rc;
}
