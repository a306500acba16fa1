/* loop — see loop.h. */
#include "loop.h"

#include <stdlib.h>
#include <time.h>
#include <zmq.h>

#include "log.h"

struct loop_zsock {
  uv_poll_t poll;
  uv_prepare_t prepare;
  uv_idle_t idle;
  void *zsock;
  loop_zsock_cb cb;
  void *arg;
  int closing;
  int open_handles;
  int draining;
};

static int zsock_readable(loop_zsock *z) {
  int ev = 0;
  size_t len = sizeof ev;
  if (zmq_getsockopt(z->zsock, ZMQ_EVENTS, &ev, &len) != 0) return 0;
  return (ev & ZMQ_POLLIN) != 0;
}

static void on_idle(uv_idle_t *h);

void loop_zsock_drain(loop_zsock *z) {
  if (!z || z->closing || z->draining) return;
  z->draining = 1;   /* the callback may send, which may call back into a drain: no recursion */
  int n = 0;
  while (!z->closing && n < LOOP_DRAIN_BUDGET && zsock_readable(z)) {
    z->cb(z->zsock, z->arg);
    n++;
  }
  z->draining = 0;
  if (z->closing) return;
  /* Budget spent with messages left: keep the loop from blocking until they are read. */
  if (n >= LOOP_DRAIN_BUDGET && zsock_readable(z)) uv_idle_start(&z->idle, on_idle);
}

static void on_idle(uv_idle_t *h) {
  loop_zsock *z = h->data;
  uv_idle_stop(h);
  loop_zsock_drain(z);
}

static void on_poll(uv_poll_t *h, int status, int events) {
  (void)events;
  loop_zsock *z = h->data;
  if (status < 0) log_warn("uv_poll on a ZeroMQ socket: %s", uv_strerror(status));
  loop_zsock_drain(z);
}

static void on_prepare(uv_prepare_t *h) { loop_zsock_drain(h->data); }

static void on_close(uv_handle_t *h) {
  loop_zsock *z = h->data;
  if (--z->open_handles == 0) free(z);
}

fsdp_status loop_zsock_new(uv_loop_t *uv, void *zsock, loop_zsock_cb cb, void *arg, loop_zsock **out) {
  *out = NULL;
  int fd;
  size_t len = sizeof fd;
  if (zmq_getsockopt(zsock, ZMQ_FD, &fd, &len) != 0)
    return fsdp_set_error(FSDP_ERR_COMM, "zmq_getsockopt(ZMQ_FD): %s", zmq_strerror(zmq_errno()));
  loop_zsock *z = calloc(1, sizeof *z);
  if (!z) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a loop socket");
  z->zsock = zsock;
  z->cb = cb;
  z->arg = arg;
  int rc = uv_poll_init(uv, &z->poll, fd);
  if (rc != 0) {
    free(z);
    return fsdp_set_error(FSDP_ERR_IO, "uv_poll_init on ZMQ_FD %d: %s", fd, uv_strerror(rc));
  }
  uv_prepare_init(uv, &z->prepare);
  uv_idle_init(uv, &z->idle);
  z->poll.data = z->prepare.data = z->idle.data = z;
  z->open_handles = 3;
  uv_poll_start(&z->poll, UV_READABLE, on_poll);
  uv_prepare_start(&z->prepare, on_prepare);
  *out = z;
  return FSDP_OK;
}

void loop_zsock_destroy(loop_zsock **p) {
  if (!p || !*p) return;
  loop_zsock *z = *p;
  *p = NULL;
  z->closing = 1;
  uv_close((uv_handle_t *)&z->poll, on_close);
  uv_close((uv_handle_t *)&z->prepare, on_close);
  uv_close((uv_handle_t *)&z->idle, on_close);
}

double loop_now_wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t loop_ms_to_boundary(uint64_t period_ms) {
  if (period_ms == 0) return 1;
  uint64_t now = (uint64_t)(loop_now_wall() * 1000.0);
  uint64_t left = period_ms - now % period_ms;
  /* A timer set from the loop's cached time fires up to a few ms early by the wall clock: a
   * boundary that close is the one just served, so the next one is meant. */
  if (left < period_ms / 4) left += period_ms;
  return left;
}

double loop_now_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
