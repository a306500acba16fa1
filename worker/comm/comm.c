/* comm — the dispatcher behind comm.h: argument checks, the communication thread of threaded
 * backends (gloo, gloo staged), the polling of streamed ones (NCCL), failure propagation, byte
 * counters, and the world = 1 local backend. See comm.h and docs/comm.md.
 *
 * Events: threaded backends honour `after` by waiting for its CPU mark on the comm thread and
 * complete `done`'s CPU mark when the op ends; streamed backends order their stream by the events'
 * native halves at submit, and the CPU mark of `done` is completed right after the submit.
 *
 * Threaded backends: the caller appends a request to a FIFO queue; one thread per comm pops it,
 * runs it (blocking inside gloo) and marks it done under the comm's mutex. The first failure
 * fails the comm: queued and later requests complete at once with that error. gloo bounds every
 * collective by timeout_s itself; on top of that, comm_wait keeps a watchdog (a collective that is
 * still running 2·timeout_s + 5 s after it started) so that a wait can never hang even if a
 * transport ignored its deadline.
 */
#define _GNU_SOURCE   /* pthread_timedjoin_np */
#include "comm.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "monotime.h"

#define MSG_LEN 768

struct comm_req {
  comm_t *c;
  comm_op op;
  comm_req *next;          /* queue link (threaded) */
  int done;                /* threaded: set by the comm thread under c->mu */
  int abandoned;           /* threaded: the waiter gave up; the comm thread frees it */
  int demanded;            /* threaded: comm_wait has been called (strict devices, device.h) */
  fsdp_status st;
  void *token;             /* streamed: the backend's handle */
  double t_submit;
  char msg[MSG_LEN];
};

struct comm {
  const comm_backend *be;
  void *impl;
  int rank, world;
  double timeout_s;
  _Atomic uint64_t sent[COLL_NKIND];

  /* failure: set once; every later call fails fast with this status and message */
  _Atomic int failed;
  fsdp_status fail_st;
  char fail_msg[MSG_LEN];

  /* threaded backends with world > 1 */
  int threaded;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  comm_req *head, *tail;
  comm_req *cur;           /* the request being run */
  double cur_start;
  int stop;
  int hung;                /* the watchdog fired: the thread may be stuck in the backend */

  trace_t *trace;          /* spans of the collectives run (comm_set_trace); NULL: none */
  trace_lane trace_lane;   /* the lane they are recorded on */
  int next_unit;           /* the unit of the next collective issued (caller's thread) */
};

const char *comm_op_name(comm_op_kind k) {
  switch (k) {
    case COMM_OP_ALLGATHER: return "all-gather";
    case COMM_OP_REDUCESCATTER: return "reduce-scatter";
    case COMM_OP_ALLREDUCE: return "all-reduce";
    case COMM_OP_BARRIER: return "barrier";
  }
  return "?";
}

int comm_op_trace_kind(comm_op_kind k) {
  switch (k) {
    case COMM_OP_ALLGATHER: return TRACE_ALLGATHER;
    case COMM_OP_REDUCESCATTER: return TRACE_REDUCESCATTER;
    case COMM_OP_ALLREDUCE: return TRACE_ALLREDUCE;
    case COMM_OP_BARRIER: return -1;
  }
  return -1;
}

size_t comm_dtype_size(comm_dtype dt) { return dt == COMM_BF16 ? 2 : 4; }

static const char *dtype_name(comm_dtype dt) { return dt == COMM_BF16 ? "bf16" : "f32"; }

/* Logical bytes one rank sends (plan.h's ring accounting). */
static void count_bytes(comm_t *c, const comm_op *op) {
  uint64_t n = (uint64_t)c->world;
  uint64_t esz = comm_dtype_size(op->dt);
  switch (op->kind) {
    case COMM_OP_ALLGATHER:      /* S = n·count·esz; S·(n−1)/n */
      atomic_fetch_add(&c->sent[COLL_ALLGATHER], (uint64_t)op->count * esz * (n - 1));
      break;
    case COMM_OP_REDUCESCATTER:
      atomic_fetch_add(&c->sent[COLL_REDUCESCATTER], (uint64_t)op->count * esz * (n - 1));
      break;
    case COMM_OP_ALLREDUCE:      /* S = count·esz; 2·S·(n−1)/n */
      atomic_fetch_add(&c->sent[COLL_ALLREDUCE], 2 * (uint64_t)op->count * esz * (n - 1) / n);
      break;
    case COMM_OP_BARRIER:
      break;
  }
}

/* Record the comm's first failure (caller holds c->mu for threaded comms). */
static void set_failed(comm_t *c, fsdp_status st, const char *msg) {
  if (atomic_load(&c->failed)) return;
  c->fail_st = st;
  snprintf(c->fail_msg, sizeof c->fail_msg, "%s", msg);
  atomic_store(&c->failed, 1);
}

/* The message of a failed op: which collective, how big, the timeout, and the backend's text. */
static void describe_failure(const comm_t *c, const comm_op *op, fsdp_status st, double t0,
                             const char *why, char *out, size_t len) {
  snprintf(out, len,
           "%s %s of %zu %s elements per rank failed (%s) on rank %d of %d after %.2f s; "
           "timeout_s = %.3g: %s",
           c->be->name, comm_op_name(op->kind), op->count, dtype_name(op->dt), fsdp_strerror(st),
           c->rank, c->world, monotime_s() - t0, c->timeout_s, why);
}

/* ---- world = 1: every collective is a local copy ---- */

static fsdp_status local_run(void *impl, const comm_op *op) {
  (void)impl;
  size_t bytes = op->count * comm_dtype_size(op->dt);
  if ((op->kind == COMM_OP_ALLGATHER || op->kind == COMM_OP_REDUCESCATTER) && op->recv != op->send && bytes)
    memmove(op->recv, op->send, bytes);
  return FSDP_OK;
}

static const comm_backend local_backend = {.name = "local", .run = local_run};

/* ---- device events around an op (device.h) ---- */

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double seconds) {
  struct timespec ts = monotime_after(seconds);
  pthread_cond_timedwait(cv, mu, &ts);
}

/* The compute that produced the op's input (or last read its output buffer) is done. */
static fsdp_status wait_after(comm_t *c, const comm_op *op) {
  if (!op->after) return FSDP_OK;
  if (dev_event_host_wait(op->after, op->after_ticket, c->timeout_s) != FSDP_OK)
    return fsdp_set_error(FSDP_ERR_TIMEOUT, "the compute it waits for did not reach its event within timeout_s");
  return FSDP_OK;
}

/* Run R's op on the backend (after its `after` event), recording its span (comm_set_trace). */
static fsdp_status run_traced(comm_t *c, comm_req *r) {
  fsdp_status st = wait_after(c, &r->op);
  if (st != FSDP_OK) return st;
  const comm_op *op = &r->op;
  int kind = comm_op_trace_kind(op->kind);
  uint64_t t0 = op->trace ? monotime_us() : 0;
  st = c->be->run(c->impl, op);
  if (op->trace && st == FSDP_OK && kind >= 0)
    trace_add(op->trace, op->lane, (trace_kind)kind, op->unit, op->step, t0, monotime_us());
  return st;
}

static void complete_done(const comm_op *op) {
  if (op->done) dev_event_complete(op->done, op->done_ticket);
}

/* Strict devices: a request runs only once it, or a later one, is waited for (caller holds the
 * comm's mutex). */
static int demanded(const comm_req *r) {
  for (const comm_req *q = r; q; q = q->next)
    if (q->demanded || !q->op.done || dev_event_demanded(q->op.done, q->op.done_ticket)) return 1;
  return 0;
}

/* ---- the comm thread ---- */

static void *comm_thread_main(void *arg) {
  comm_t *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->head && !c->stop) pthread_cond_wait(&c->cv_work, &c->mu);
    if (!c->head) break;   /* stop requested and the queue is drained */
    comm_req *r = c->head;
    if (!demanded(r) && !c->stop && !atomic_load(&c->failed)) {
      /* strict device: not before something waits for it (see device.h); demand on an event
       * does not signal this comm, so look again shortly */
      timed_wait(&c->cv_work, &c->mu, 0.001);
      continue;
    }
    c->head = r->next;
    if (!c->head) c->tail = NULL;
    double t0 = monotime_s();
    c->cur = r;
    c->cur_start = t0;
    int failed = atomic_load(&c->failed);
    pthread_mutex_unlock(&c->mu);

    fsdp_status st;
    char msg[MSG_LEN];
    msg[0] = '\0';
    if (failed) {
      st = c->fail_st;
      snprintf(msg, sizeof msg, "%s %s not run: the comm failed earlier: %.600s", c->be->name,
               comm_op_name(r->op.kind), c->fail_msg);
    } else {
      fsdp_clear_error();
      st = run_traced(c, r);
      if (st != FSDP_OK) describe_failure(c, &r->op, st, t0, fsdp_last_error(), msg, sizeof msg);
    }
    complete_done(&r->op);

    pthread_mutex_lock(&c->mu);
    if (st == FSDP_OK) count_bytes(c, &r->op);
    else if (!failed) set_failed(c, st, msg);
    c->cur = NULL;
    if (r->abandoned) {
      free(r);
    } else {
      r->st = st;
      memcpy(r->msg, msg, sizeof msg);
      r->done = 1;
    }
    pthread_cond_broadcast(&c->cv_done);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

fsdp_status comm_wrap(const comm_backend *be, void *impl, int rank, int world, double timeout_s,
                      comm_t **out) {
  *out = NULL;
  comm_t *c = calloc(1, sizeof *c);
  if (!c) {
    if (be->destroy) be->destroy(impl);
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a comm");
  }
  c->be = be;
  c->impl = impl;
  c->rank = rank;
  c->world = world;
  c->timeout_s = timeout_s;
  c->next_unit = TRACE_NO_UNIT;
  c->threaded = be->run != NULL && world > 1;
  if (c->threaded) {
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv_work, &ca);
    pthread_cond_init(&c->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    int e = pthread_create(&c->thread, NULL, comm_thread_main, c);
    if (e != 0) {
      pthread_mutex_destroy(&c->mu);
      pthread_cond_destroy(&c->cv_work);
      pthread_cond_destroy(&c->cv_done);
      if (be->destroy) be->destroy(impl);
      free(c);
      return fsdp_set_error(FSDP_ERR_INTERNAL, "cannot start the communication thread: %s", strerror(e));
    }
  }
  *out = c;
  return FSDP_OK;
}

static fsdp_status check_timeout(double timeout_s) {
  if (!(timeout_s > 0) || timeout_s > 86400)
    return fsdp_set_error(FSDP_ERR_RANGE, "comm timeout_s %g is out of range; allowed: (0, 86400] seconds",
                          timeout_s);
  return FSDP_OK;
}

fsdp_status comm_new_gloo(int rank, int world, const char *store_dir, const comm_kv *kv,
                          const char *prefix, double timeout_s, comm_t **out) {
  if (!out) return fsdp_set_error(FSDP_ERR_INVALID, "comm_new_gloo: out is NULL");
  *out = NULL;
  if (world < 1 || rank < 0 || rank >= world)
    return fsdp_set_error(FSDP_ERR_RANGE, "comm_new_gloo: rank %d, world %d; allowed: world >= 1, 0 <= rank < world",
                          rank, world);
  TRY(check_timeout(timeout_s));
  if (world == 1) return comm_wrap(&local_backend, NULL, rank, world, timeout_s, out);
  static const comm_backend gloo_backend = {
      .name = "gloo", .run = comm_gloo_run, .abort = comm_gloo_abort, .destroy = comm_gloo_destroy};
  comm_gloo *g = NULL;
  TRY(comm_gloo_new(rank, world, store_dir, kv, prefix, timeout_s, &g));
  return comm_wrap(&gloo_backend, g, rank, world, timeout_s, out);
}

/* ---- issuing ---- */

static fsdp_status fail_fast(const comm_t *c, comm_op_kind k) {
  return fsdp_set_error(c->fail_st, "%s %s refused: the comm failed earlier: %.600s", c->be->name, comm_op_name(k),
                        c->fail_msg);
}

static fsdp_status issue(comm_t *c, const comm_op *op, comm_req **req) {
  if (req) *req = NULL;
  if (atomic_load(&c->failed)) {
    if (op->done) dev_event_complete(op->done, dev_event_mark(op->done));
    return fail_fast(c, op->kind);
  }
  comm_req *r = calloc(1, sizeof *r);
  if (!r) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a comm request");
  r->c = c;
  r->op = *op;
  if (op->after) r->op.after_ticket = dev_event_last(op->after);
  if (op->done) r->op.done_ticket = dev_event_mark(op->done);
  r->t_submit = monotime_s();
  r->op.trace = c->trace;
  r->op.lane = c->trace_lane;
  r->op.unit = c->next_unit;
  r->op.step = trace_step(c->trace);
  c->next_unit = TRACE_NO_UNIT;

  if (c->threaded) {
    pthread_mutex_lock(&c->mu);
    if (c->tail) c->tail->next = r;
    else c->head = r;
    c->tail = r;
    pthread_cond_signal(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
  } else if (c->be->run) {   /* world = 1: run inline, after the compute it must follow */
    fsdp_clear_error();
    r->st = run_traced(c, r);
    complete_done(&r->op);
    if (r->st != FSDP_OK) {
      describe_failure(c, op, r->st, r->t_submit, fsdp_last_error(), r->msg, sizeof r->msg);
      set_failed(c, r->st, r->msg);
    } else {
      count_bytes(c, op);
    }
    r->done = 1;
  } else {                    /* streamed */
    fsdp_status st = c->be->submit(c->impl, &r->op, &r->token);
    if (st != FSDP_OK) {
      char msg[MSG_LEN];
      describe_failure(c, op, st, r->t_submit, fsdp_last_error(), msg, sizeof msg);
      set_failed(c, st, msg);
      complete_done(&r->op);
      free(r);
      if (c->be->abort) c->be->abort(c->impl);
      return fsdp_set_error(st, "%s", msg);
    }
    /* A streamed backend ordered its device stream by the native events at submit (after: a
     * stream wait; done: a record after the collective, device.h), so the CPU mark of DONE has
     * nothing left to wait for: complete it now, or a device wait would block on it until the
     * host's comm_wait. */
    complete_done(&r->op);
  }
  if (req) {
    *req = r;
    return FSDP_OK;
  }
  return comm_wait(&r);
}

static fsdp_status check_common(const comm_t *c, const char *what, size_t count, comm_dtype dt) {
  if (!c) return fsdp_set_error(FSDP_ERR_INVALID, "%s: comm is NULL", what);
  if (dt != COMM_F32 && dt != COMM_BF16)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: dtype %d; allowed: COMM_F32, COMM_BF16", what, (int)dt);
  if (count > ((size_t)1 << 40) / (size_t)c->world)
    return fsdp_set_error(FSDP_ERR_RANGE, "%s: count %zu per rank is too large (world %d); allowed: world·count <= 2^40",
                          what, count, c->world);
  return FSDP_OK;
}

static int overlaps(const void *a, size_t alen, const void *b, size_t blen) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return alen && blen && x < y + blen && y < x + alen;
}

fsdp_status comm_allgather(comm_t *c, const void *send, void *recv, size_t count, comm_dtype dt,
                           comm_req **req) {
  return comm_allgather_ev(c, send, recv, count, dt, NULL, NULL, req);
}

fsdp_status comm_allgather_ev(comm_t *c, const void *send, void *recv, size_t count, comm_dtype dt,
                              dev_event *after, dev_event *done, comm_req **req) {
  if (req) *req = NULL;
  TRY(check_common(c, "comm_allgather", count, dt));
  size_t bytes = count * comm_dtype_size(dt);
  if (count && (!send || !recv)) return fsdp_set_error(FSDP_ERR_INVALID, "comm_allgather: NULL buffer with count %zu", count);
  /* In place is allowed: send may be exactly rank r's block of recv; any other overlap is not. */
  if (send != (const char *)recv + (size_t)c->rank * bytes && overlaps(send, bytes, recv, bytes * (size_t)c->world))
    return fsdp_set_error(FSDP_ERR_INVALID, "comm_allgather: send overlaps recv; allowed: disjoint, or send == recv + rank·count");
  comm_op op = {.kind = COMM_OP_ALLGATHER, .send = send, .recv = recv, .count = count, .dt = dt, .after = after,
                .done = done};
  return issue(c, &op, req);
}

fsdp_status comm_reduce_scatter(comm_t *c, const void *send, void *recv, size_t count,
                                comm_dtype dt, comm_req **req) {
  return comm_reduce_scatter_ev(c, send, recv, count, dt, NULL, NULL, req);
}

fsdp_status comm_reduce_scatter_ev(comm_t *c, const void *send, void *recv, size_t count, comm_dtype dt,
                                   dev_event *after, dev_event *done, comm_req **req) {
  if (req) *req = NULL;
  TRY(check_common(c, "comm_reduce_scatter", count, dt));
  size_t bytes = count * comm_dtype_size(dt);
  if (count && (!send || !recv)) return fsdp_set_error(FSDP_ERR_INVALID, "comm_reduce_scatter: NULL buffer with count %zu", count);
  if (overlaps(send, bytes * (size_t)c->world, recv, bytes))
    return fsdp_set_error(FSDP_ERR_INVALID, "comm_reduce_scatter: send and recv overlap; allowed: disjoint buffers");
  comm_op op = {.kind = COMM_OP_REDUCESCATTER, .send = send, .recv = recv, .count = count, .dt = dt, .after = after,
                .done = done};
  return issue(c, &op, req);
}

fsdp_status comm_allreduce(comm_t *c, void *buf, size_t count, comm_dtype dt, comm_req **req) {
  return comm_allreduce_ev(c, buf, count, dt, NULL, NULL, req);
}

fsdp_status comm_allreduce_ev(comm_t *c, void *buf, size_t count, comm_dtype dt, dev_event *after, dev_event *done,
                              comm_req **req) {
  if (req) *req = NULL;
  TRY(check_common(c, "comm_allreduce", count, dt));
  if (count && !buf) return fsdp_set_error(FSDP_ERR_INVALID, "comm_allreduce: NULL buffer with count %zu", count);
  comm_op op = {.kind = COMM_OP_ALLREDUCE, .send = buf, .recv = buf, .count = count, .dt = dt, .after = after,
                .done = done};
  return issue(c, &op, req);
}

fsdp_status comm_barrier(comm_t *c) {
  if (!c) return fsdp_set_error(FSDP_ERR_INVALID, "comm_barrier: comm is NULL");
  comm_op op = {.kind = COMM_OP_BARRIER, .dt = COMM_F32};
  return issue(c, &op, NULL);
}

/* ---- completion ---- */

static fsdp_status wait_threaded(comm_t *c, comm_req *r) {
  double watchdog = 2 * c->timeout_s + 5;
  pthread_mutex_lock(&c->mu);
  r->demanded = 1;
  pthread_cond_broadcast(&c->cv_work);
  while (!r->done) {
    double t = monotime_s();
    if (c->cur && t - c->cur_start > watchdog) {
      /* The backend ignored its own deadline: give up on this request and fail the comm. */
      char msg[MSG_LEN];
      snprintf(msg, sizeof msg,
               "%s %s did not complete: the %s running on rank %d of %d has been blocked for %.1f s, "
               "beyond 2·timeout_s + 5 s (timeout_s = %.3g)",
               c->be->name, comm_op_name(r->op.kind), comm_op_name(c->cur->op.kind), c->rank, c->world,
               t - c->cur_start, c->timeout_s);
      set_failed(c, FSDP_ERR_TIMEOUT, msg);
      c->hung = 1;
      r->abandoned = 1;
      /* the stuck thread may never reach them: release whatever compute waits for */
      complete_done(&c->cur->op);
      for (comm_req *q = c->head; q; q = q->next) complete_done(&q->op);
      pthread_mutex_unlock(&c->mu);
      return fsdp_set_error(FSDP_ERR_TIMEOUT, "%s", msg);
    }
    double slice = c->cur ? c->cur_start + watchdog - t + 0.01 : watchdog;
    if (slice < 0.01) slice = 0.01;
    if (slice > 1.0) slice = 1.0;
    struct timespec ts = monotime_after(slice);
    pthread_cond_timedwait(&c->cv_done, &c->mu, &ts);
  }
  pthread_mutex_unlock(&c->mu);
  fsdp_status st = r->st;
  if (st != FSDP_OK) fsdp_set_error(st, "%s", r->msg);
  free(r);
  return st;
}

static fsdp_status wait_streamed(comm_t *c, comm_req *r) {
  /* From the start of the wait, not the issue: the caller may have computed for a long time
   * in between, and the collective may have been queued behind others on the stream. */
  double deadline = monotime_s() + c->timeout_s;
  fsdp_status st = FSDP_OK;
  char msg[MSG_LEN];
  for (int spin = 0;; spin++) {
    if (atomic_load(&c->failed)) {
      /* An earlier request failed and aborted the communicator: this one cannot complete. */
      c->be->release(c->impl, r->token);
      st = c->fail_st;
      snprintf(msg, sizeof msg, "%s %s abandoned: the comm failed earlier: %.600s", c->be->name,
               comm_op_name(r->op.kind), c->fail_msg);
      free(r);
      return fsdp_set_error(st, "%s", msg);
    }
    int done = 0;
    fsdp_clear_error();
    st = c->be->poll(c->impl, r->token, &done);
    if (st != FSDP_OK) {
      describe_failure(c, &r->op, st, r->t_submit, fsdp_last_error(), msg, sizeof msg);
      break;
    }
    if (done) {
      count_bytes(c, &r->op);
      free(r);
      return FSDP_OK;
    }
    if (monotime_s() > deadline) {
      st = FSDP_ERR_TIMEOUT;
      describe_failure(c, &r->op, st, r->t_submit, "did not complete before the deadline; communicator aborted",
                       msg, sizeof msg);
      break;
    }
    if (spin > 64) {
      struct timespec ts = {0, 20000};   /* 20 µs between polls once it is clearly not instant */
      nanosleep(&ts, NULL);
    }
  }
  set_failed(c, st, msg);
  if (c->be->abort) c->be->abort(c->impl);
  c->be->release(c->impl, r->token);
  free(r);
  return fsdp_set_error(st, "%s", msg);
}

fsdp_status comm_wait(comm_req **req) {
  if (!req || !*req) return FSDP_OK;
  comm_req *r = *req;
  *req = NULL;
  comm_t *c = r->c;
  if (c->threaded) return wait_threaded(c, r);
  if (c->be->run) {   /* inline: already complete */
    fsdp_status st = r->st;
    if (st != FSDP_OK) fsdp_set_error(st, "%s", r->msg);
    free(r);
    return st;
  }
  return wait_streamed(c, r);
}

/* ---- accessors and teardown ---- */

void comm_sent_bytes(const comm_t *c, uint64_t out[COLL_NKIND]) {
  for (int k = 0; k < COLL_NKIND; k++) out[k] = c ? atomic_load(&((comm_t *)c)->sent[k]) : 0;
}

void *comm_backend_impl(const comm_t *c, const comm_backend *be) { return c && c->be == be ? c->impl : NULL; }

int comm_rank(const comm_t *c) { return c ? c->rank : -1; }
int comm_world(const comm_t *c) { return c ? c->world : 0; }
const char *comm_backend_name(const comm_t *c) { return c ? c->be->name : "none"; }

void comm_set_trace(comm_t *c, trace_t *t, trace_lane lane) {
  c->trace = t;
  c->trace_lane = lane;
}
void comm_trace_unit(comm_t *c, int unit) { c->next_unit = unit; }

void comm_destroy(comm_t **pc) {
  if (!pc || !*pc) return;
  comm_t *c = *pc;
  *pc = NULL;
  int leak = 0;
  if (c->threaded) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    int hung = c->hung;
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    /* A stuck backend is told to fail its pending work so that the thread can be joined. */
    if (hung && c->be->abort) c->be->abort(c->impl);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(2 * c->timeout_s + 10);
    int e = pthread_timedjoin_np(c->thread, NULL, &ts);
    if (e != 0) {
      log_error("comm: the %s communication thread of rank %d did not stop (%s); leaking it", c->be->name,
                c->rank, strerror(e));
      pthread_detach(c->thread);
      leak = 1;
    }
  }
  if (leak) return;   /* the thread may still use impl and c */
  if (c->be->destroy) c->be->destroy(c->impl);
  if (c->threaded) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_done);
  }
  free(c);
}
