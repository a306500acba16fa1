/* test_comm_stream — comm.c's streamed path (the one NCCL takes) with a fake streamed backend, on
 * events that carry a fake native half (as the CUDA device's do): the backend receives `after` and
 * `done` at submit to order its own stream by them; the CPU mark of `done` is complete once the
 * submit returns (a device wait must not block on it until the host's comm_wait); a refused submit
 * still completes `done`, fails the comm and makes every later call fail at once; bytes count only
 * for completed collectives. Also dev_event's native half: made and destroyed through the device's
 * hooks, a failing hook gives no event. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"

/* ---- a device that only makes events with a native half ---- */

static int natives_live, natives_made, refuse_native;

static fsdp_status fake_event_create(device_t *d, void **native) {
  (void)d;
  if (refuse_native) return fsdp_set_error(FSDP_ERR_CUDA, "fake: no more events");
  natives_made++;
  natives_live++;
  *native = malloc(1);
  return FSDP_OK;
}

static void fake_event_destroy(device_t *d, void *native) {
  (void)d;
  natives_live--;
  free(native);
}

static const dev_ops fake_ops = {.name = "fake-native", .event_create = fake_event_create,
                                 .event_destroy = fake_event_destroy};

/* ---- a streamed backend: records what it was given; an op finishes after two polls ---- */

typedef struct fake_be {
  int submits, polls_left, refuse;
  comm_op last;
  int aborted;
} fake_be;

static fsdp_status fb_submit(void *impl, const comm_op *op, void **token) {
  fake_be *b = impl;
  if (b->refuse) return fsdp_set_error(FSDP_ERR_COMM, "fake submit refused");
  b->submits++;
  b->last = *op;
  b->polls_left = 2;
  *token = b;
  return FSDP_OK;
}

static fsdp_status fb_poll(void *impl, void *token, int *done) {
  fake_be *b = impl;
  (void)token;
  *done = --b->polls_left <= 0;
  return FSDP_OK;
}

static void fb_release(void *impl, void *token) { (void)impl, (void)token; }
static void fb_abort(void *impl) { ((fake_be *)impl)->aborted = 1; }

static const comm_backend fake_backend = {.name = "fake-stream", .submit = fb_submit, .poll = fb_poll,
                                          .release = fb_release, .abort = fb_abort};

static void test_native_events(void) {
  device_t dev = {.op = &fake_ops, .kind = DEVICE_CUDA, .act_bytes = 2};
  dev_event *e = dev_event_new(&dev);
  CHECK(e != NULL);
  CHECK(dev_event_native(e) != NULL);
  CHECK_EQ_INT(1, natives_live);
  dev_event_destroy(&e);
  CHECK(e == NULL);
  CHECK_EQ_INT(0, natives_live);
  refuse_native = 1;
  CHECK(dev_event_new(&dev) == NULL);
  CHECK(strstr(fsdp_last_error(), "no more events") != NULL);
  refuse_native = 0;
  /* the CPU's events have none */
  CHECK(dev_event_native(NULL) == NULL);
}

static void test_streamed(void) {
  device_t dev = {.op = &fake_ops, .kind = DEVICE_CUDA, .act_bytes = 2};
  dev_event *after = dev_event_new(&dev), *done = dev_event_new(&dev);
  fake_be *b = calloc(1, sizeof *b);
  comm_t *c = NULL;
  CHECK_OK(comm_wrap(&fake_backend, b, 1, 4, 5.0, &c));
  float send[8] = {0}, recv[32];

  comm_req *r = NULL;
  CHECK_OK(comm_allgather_ev(c, send, recv, 8, COMM_F32, after, done, &r));
  CHECK_EQ_INT(1, b->submits);
  CHECK(b->last.after == after && b->last.done == done);   /* the backend orders its stream by them */
  uint64_t t = dev_event_last(done);
  CHECK_EQ_INT(1, t);
  CHECK(dev_event_is_complete(done, t));                   /* at submit, not at comm_wait */
  uint64_t sent[COLL_NKIND];
  comm_sent_bytes(c, sent);
  CHECK_EQ_INT(0, sent[COLL_ALLGATHER]);                    /* counted on completion */
  CHECK_OK(comm_wait(&r));
  comm_sent_bytes(c, sent);
  CHECK_EQ_INT(8 * 4 * 3, sent[COLL_ALLGATHER]);

  /* a refused submit: done still completes, the comm fails, later calls fail fast */
  b->refuse = 1;
  CHECK_EQ_INT(FSDP_ERR_COMM, comm_reduce_scatter_ev(c, recv, send, 8, COMM_F32, after, done, &r));
  CHECK(r == NULL);
  CHECK(dev_event_is_complete(done, dev_event_last(done)));
  CHECK_EQ_INT(1, b->aborted);
  b->refuse = 0;
  CHECK(comm_allreduce_ev(c, send, 8, COMM_F32, NULL, done, &r) != FSDP_OK);
  CHECK_EQ_INT(1, b->submits);
  CHECK(dev_event_is_complete(done, dev_event_last(done)));
  CHECK(strstr(fsdp_last_error(), "failed earlier") != NULL);

  comm_destroy(&c);
  free(b);
  dev_event_destroy(&after);
  dev_event_destroy(&done);
  CHECK_EQ_INT(0, natives_live);
}

int main(void) {
  test_native_events();
  test_streamed();
  return check_done();
}
