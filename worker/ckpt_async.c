/* ckpt_async — see ckpt_async.h. One writer thread per ckpt_async, woken by a condition variable;
 * the state (idle, writing, written) changes under the mutex. The write's sources (the snapshot, or
 * the live shards until ckpt_async_detach) change under a second mutex, which the writer holds for
 * each chunk's read and write (ckpt_writer_guard) and never across a test hook, so that the main
 * thread's short status calls never wait for a chunk's I/O and a detach waits for one chunk at most. */
#define _GNU_SOURCE   /* SCHED_IDLE */
#include "ckpt_async.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_priv.h"
#include "log.h"
#include "monotime.h"
#include "trace.h"

typedef enum { CA_IDLE = 0, CA_WRITING, CA_WRITTEN } ca_state;

struct ckpt_async {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;     /* state or quit changed */
  ca_state state;
  int quit;
  const char *priority;  /* the writer's scheduling class, set once by the writer before new returns */

  device_t *dev;         /* the snapshot's allocator */
  size_t bytes;
  float *buf[CKPT_NSEC];

  /* under src_mu: where the pending write reads (buf, or the live shards), and its writer */
  pthread_mutex_t src_mu;
  const float *src[CKPT_NSEC];
  int live;              /* src are the live shards (ckpt_async_start_live, until detach or the write's end) */
  ckpt_writer *w;        /* the writer thread's write in progress, or NULL */

  /* the pending write: set by start, read by the writer, collected by wait */
  char dir[4096];
  const plan_t *p;
  plan_t *own;
  int rank, writes;
  ckpt_save_stats stats;
  double t0;             /* the write's start (now_s) */
  int hurry;             /* the main thread waits: the writer hands the write over at its next chunk */
  ckpt_writer *handed;   /* the write handed over (the main thread finishes it), or NULL */
  fsdp_status rc;
  char err[1024];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The writer runs below the training threads, so that on a node whose cores all train it writes in
 * the time they leave (a save otherwise takes a core from the step it overlaps). SCHED_IDLE needs
 * no privilege on Linux (lowering one's own class is always allowed) but a seccomp profile or
 * another kernel may refuse it: then the thread's nice value goes to 19, its CFS weight 1/70th of a
 * training thread's. Linux's nice is per thread (setpriority on the thread id). */
static const char *writer_lower_priority(void) {
  struct sched_param sp = {.sched_priority = 0};
  int err = pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
  if (err == 0) return "idle";
  if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) == 0) {
    log_info("checkpoint writer: SCHED_IDLE refused (%s), running at nice 19 instead", strerror(err));
    return "nice 19";
  }
  log_warn("checkpoint writer: SCHED_IDLE refused (%s) and nice 19 too (%s): asynchronous saves compete with "
           "training at its priority", strerror(err), strerror(errno));
  return "normal";
}

/* The write ended (RC, W freed): its figures, and the state for ckpt_async_wait. Under the mutex. */
static void write_ended(ckpt_async *a, fsdp_status rc) {
  a->rc = rc;
  snprintf(a->err, sizeof a->err, "%s", rc == FSDP_OK ? "" : fsdp_last_error());
  a->stats.write_s = now_s() - a->t0;
  a->stats.t1_us = monotime_us();
  a->stats.bytes = a->writes ? ckpt_rank_file_bytes(a->p) : 0;
  a->state = CA_WRITTEN;
  pthread_cond_broadcast(&a->cv);
}

/* The write in progress, for ckpt_async_detach; NULL: no source is read any more (the write handed
 * over, or its sections all written), and the live shards are free. */
static void set_writer(ckpt_async *a, ckpt_writer *w) {
  pthread_mutex_lock(&a->src_mu);
  a->w = w;
  if (!w) a->live = 0;
  pthread_mutex_unlock(&a->src_mu);
}

/* W's remaining chunks and its commit; RC: the status so far. W is freed. */
static fsdp_status write_rest(ckpt_writer **w, fsdp_status rc) {
  for (int more = 1; rc == FSDP_OK && more;) rc = ckpt_writer_next(*w, &more);
  if (rc == FSDP_OK) rc = ckpt_writer_commit(*w);
  ckpt_writer_free(w);
  return rc;
}

/* One write, chunk by chunk; between chunks, when the main thread waits for the write (hurry), the
 * writer hands it over (a->handed) instead of finishing it at its own priority. Called and
 * returning with the mutex held. */
static void write_one(ckpt_async *a) {
  pthread_mutex_unlock(&a->mu);
  ckpt_writer *w = NULL;
  fsdp_status rc = FSDP_OK;
  int more = 0;
  const float *src[CKPT_NSEC];
  pthread_mutex_lock(&a->src_mu);
  memcpy(src, a->src, sizeof src);
  pthread_mutex_unlock(&a->src_mu);
  if (a->writes)   /* the optimizer step count of a checkpoint is its step */
    rc = ckpt_writer_begin(a->dir, a->p, a->rank, a->stats.step, a->stats.step, src[CKPT_SEC_PARAM], src[CKPT_SEC_M],
                           src[CKPT_SEC_V], &w);
  pthread_mutex_lock(&a->src_mu);   /* a detach meanwhile copied the shards whole: read the copy */
  if (w) {
    ckpt_writer_guard(w, &a->src_mu);
    ckpt_writer_sources(w, a->src);
  }
  a->w = w;
  pthread_mutex_unlock(&a->src_mu);
  more = rc == FSDP_OK && w;
  while (more) {
    pthread_mutex_lock(&a->mu);
    if (a->hurry) {
      a->handed = w;   /* a->w stays: its sources are still read, by the main thread now */
      pthread_cond_broadcast(&a->cv);
      return;
    }
    pthread_mutex_unlock(&a->mu);
    if ((rc = ckpt_writer_next(w, &more)) != FSDP_OK) break;   /* each chunk under src_mu */
    ckpt_test_pause("chunk", a->stats.step, a->rank);
  }
  set_writer(a, NULL);   /* the rest (the header, the commit) reads no source */
  if (w) rc = write_rest(&w, rc);
  pthread_mutex_lock(&a->mu);
  write_ended(a, rc);
}

static void *writer_main(void *arg) {
  ckpt_async *a = arg;
  const char *prio = writer_lower_priority();
  pthread_mutex_lock(&a->mu);
  a->priority = prio;
  pthread_cond_broadcast(&a->cv);
  for (;;) {
    while ((a->state != CA_WRITING || a->handed) && !a->quit) pthread_cond_wait(&a->cv, &a->mu);
    if (a->quit) break;
    write_one(a);
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

fsdp_status ckpt_async_new(ckpt_async **out) {
  *out = NULL;
  ckpt_async *a = calloc(1, sizeof *a);
  if (!a) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the checkpoint writer");
  pthread_mutex_init(&a->mu, NULL);
  pthread_mutex_init(&a->src_mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  if (pthread_create(&a->thread, NULL, writer_main, a) != 0) {
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->src_mu);
    pthread_mutex_destroy(&a->mu);
    free(a);
    return fsdp_set_error(FSDP_ERR_INTERNAL, "cannot start the checkpoint writer thread");
  }
  pthread_mutex_lock(&a->mu);
  while (!a->priority) pthread_cond_wait(&a->cv, &a->mu);
  pthread_mutex_unlock(&a->mu);
  *out = a;
  return FSDP_OK;
}

static void free_buffers(ckpt_async *a) {
  for (int s = 0; s < CKPT_NSEC; s++) {
    if (a->dev) a->dev->op->free_host(a->dev, a->buf[s]);
    a->buf[s] = NULL;
  }
  a->bytes = 0;
}

void ckpt_async_destroy(ckpt_async **pa) {
  ckpt_async *a = *pa;
  if (!a) return;
  if (ckpt_async_pending(a) && ckpt_async_wait(a, NULL) != FSDP_OK)
    log_warn("checkpoint step %d, dropped unfinished: %s", a->stats.step, fsdp_last_error());
  pthread_mutex_lock(&a->mu);
  a->quit = 1;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
  pthread_join(a->thread, NULL);
  free_buffers(a);
  plan_destroy(&a->own);
  pthread_cond_destroy(&a->cv);
  pthread_mutex_destroy(&a->src_mu);
  pthread_mutex_destroy(&a->mu);
  free(a);
  *pa = NULL;
}

fsdp_status ckpt_async_buffers(ckpt_async *a, device_t *dev, size_t bytes, float *buf[CKPT_NSEC]) {
  if (ckpt_async_pending(a)) return fsdp_set_error(FSDP_ERR_INTERNAL, "checkpoint snapshot reused while being written");
  if (a->dev != dev || a->bytes != bytes) {
    free_buffers(a);
    a->dev = dev;
    for (int s = 0; s < CKPT_NSEC; s++)
      if (!(a->buf[s] = dev->op->alloc_host(dev, bytes ? bytes : 1))) {
        free_buffers(a);
        return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes of host memory for the checkpoint snapshot "
                              "(3 × the shard; [checkpoint] async = false saves without it)", 3 * bytes);
      }
    a->bytes = bytes;
  }
  for (int s = 0; s < CKPT_NSEC; s++) buf[s] = a->buf[s];
  return FSDP_OK;
}

static void start(ckpt_async *a, const char *dir, const plan_t *p, plan_t **own, int rank, int step,
                  const ckpt_save_stats *stats, const float *const live[CKPT_NSEC]) {
  pthread_mutex_lock(&a->src_mu);
  for (int s = 0; s < CKPT_NSEC; s++) a->src[s] = live ? live[s] : a->buf[s];
  a->live = live != NULL, a->w = NULL;
  pthread_mutex_unlock(&a->src_mu);
  pthread_mutex_lock(&a->mu);
  snprintf(a->dir, sizeof a->dir, "%s", dir);
  plan_destroy(&a->own);   /* the previous write's */
  a->p = p;
  a->own = own ? *own : NULL;
  if (own) *own = NULL;
  a->rank = rank;
  a->writes = rank < p->world;
  a->stats = *stats;
  a->stats.step = step;
  a->t0 = now_s();
  a->stats.t0_us = monotime_us();
  a->hurry = 0;
  a->state = CA_WRITING;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
}

void ckpt_async_start(ckpt_async *a, const char *dir, const plan_t *p, plan_t **own, int rank, int step,
                      const ckpt_save_stats *stats) {
  start(a, dir, p, own, rank, step, stats, NULL);
}

void ckpt_async_start_live(ckpt_async *a, const char *dir, const plan_t *p, plan_t **own, int rank, int step,
                           const ckpt_save_stats *stats, const float *const live[CKPT_NSEC]) {
  start(a, dir, p, own, rank, step, stats, live);
}

double ckpt_async_detach(ckpt_async *a) {
  double t0 = now_s();
  pthread_mutex_lock(&a->src_mu);   /* waits for the chunk being written */
  if (!a->live) {
    pthread_mutex_unlock(&a->src_mu);
    return 0.0;
  }
  uint64_t moved = 0;
  if (a->w) {
    moved = ckpt_writer_move_rest(a->w, a->buf);
  } else {   /* not begun yet (the write's end clears live): it will read the snapshot, whole */
    for (int s = 0; s < CKPT_NSEC; s++) memcpy(a->buf[s], a->src[s], a->bytes);
    moved = (uint64_t)CKPT_NSEC * a->bytes;
  }
  for (int s = 0; s < CKPT_NSEC; s++) a->src[s] = a->buf[s];
  a->live = 0;
  pthread_mutex_unlock(&a->src_mu);
  double dt = now_s() - t0;
  pthread_mutex_lock(&a->mu);
  a->stats.blocked_s += dt;
  a->stats.detached_bytes = moved;
  pthread_mutex_unlock(&a->mu);
  return dt;
}

int ckpt_async_pending(ckpt_async *a) {
  pthread_mutex_lock(&a->mu);
  int r = a->state != CA_IDLE;
  pthread_mutex_unlock(&a->mu);
  return r;
}

int ckpt_async_finished(ckpt_async *a) {
  pthread_mutex_lock(&a->mu);
  int r = a->state == CA_WRITTEN;
  pthread_mutex_unlock(&a->mu);
  return r;
}

fsdp_status ckpt_async_wait(ckpt_async *a, ckpt_save_stats *stats) {
  pthread_mutex_lock(&a->mu);
  if (a->state == CA_IDLE) {
    pthread_mutex_unlock(&a->mu);
    return FSDP_OK;
  }
  if (a->state == CA_WRITING) {
    a->hurry = 1;   /* training waits: the rest of the write at the main thread's priority, not the writer's */
    while (a->state == CA_WRITING && !a->handed) pthread_cond_wait(&a->cv, &a->mu);
  }
  if (a->handed) {
    ckpt_writer *w = a->handed;
    int step = a->stats.step;
    pthread_mutex_unlock(&a->mu);
    double t = now_s();
    fsdp_status wrc = write_rest(&w, FSDP_OK);
    set_writer(a, NULL);
    log_info("checkpoint step %d: training waited for its write and finished it itself in %.2f s", step, now_s() - t);
    pthread_mutex_lock(&a->mu);
    a->handed = NULL;
    write_ended(a, wrc);
    a->stats.handed_over = 1;
  }
  fsdp_status rc = a->rc;
  if (stats) *stats = a->stats;
  a->state = CA_IDLE;
  pthread_mutex_unlock(&a->mu);
  if (rc != FSDP_OK) return fsdp_set_error(rc, "%s", a->err);
  return FSDP_OK;
}

void ckpt_async_hurry(ckpt_async *a) {
  pthread_mutex_lock(&a->mu);
  if (a->state == CA_WRITING) a->hurry = 1;
  pthread_mutex_unlock(&a->mu);
}

const char *ckpt_async_priority(const ckpt_async *a) { return a->priority; }

const plan_t *ckpt_async_plan(const ckpt_async *a) { return a->p; }
const char *ckpt_async_dir(const ckpt_async *a) { return a->dir; }
