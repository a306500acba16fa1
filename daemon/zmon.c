/* zmon — see zmon.h. */
#include "zmon.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "loop.h"

struct zmon {
  void *sock;                /* watched, borrowed */
  void *pair;                /* the monitor's inproc end, owned */
  loop_zsock *zs;
  zmon_cb cb;
  void *arg;
};

/* One event is two frames: [u16 event, u32 value] and the endpoint. */
static void on_event(void *pair, void *arg) {
  zmon *m = arg;
  zmq_msg_t f;
  zmq_msg_init(&f);
  if (zmq_msg_recv(&f, pair, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&f);
    return;
  }
  uint16_t ev = 0;
  uint32_t value = 0;
  if (zmq_msg_size(&f) >= 6) {
    memcpy(&ev, zmq_msg_data(&f), 2);
    memcpy(&value, (const char *)zmq_msg_data(&f) + 2, 4);
  }
  char ep[256] = "";
  while (zmq_msg_more(&f)) {
    zmq_msg_close(&f);
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, pair, ZMQ_DONTWAIT) < 0) break;
    size_t n = zmq_msg_size(&f) < sizeof ep - 1 ? zmq_msg_size(&f) : sizeof ep - 1;
    memcpy(ep, zmq_msg_data(&f), n);
    ep[n] = '\0';
  }
  zmq_msg_close(&f);
  m->cb(m->arg, ev, value, ep);
}

fsdp_status zmon_new(uv_loop_t *uv, void *zctx, void *sock, int events, zmon_cb cb, void *arg, zmon **out) {
  *out = NULL;
  /* A new name for every monitor: a previous monitor's endpoint is released asynchronously, and
   * binding the same name again at once fails with "Address already in use". */
  static unsigned seq;
  zmon *m = calloc(1, sizeof *m);
  if (!m) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a socket monitor");
  m->sock = sock;
  m->cb = cb;
  m->arg = arg;
  char ep[64];
  snprintf(ep, sizeof ep, "inproc://fsdpd-monitor-%p-%u", (void *)m, seq++);
  fsdp_status rc;
  if (zmq_socket_monitor(sock, ep, events) != 0) {
    rc = fsdp_set_error(FSDP_ERR_COMM, "zmq_socket_monitor: %s", zmq_strerror(zmq_errno()));
    free(m);
    return rc;
  }
  m->pair = zmq_socket(zctx, ZMQ_PAIR);
  if (!m->pair || zmq_connect(m->pair, ep) != 0) {
    rc = fsdp_set_error(FSDP_ERR_COMM, "cannot watch the socket's handshakes: %s", zmq_strerror(zmq_errno()));
    zmon_destroy(&m);
    return rc;
  }
  if ((rc = loop_zsock_new(uv, m->pair, on_event, m, &m->zs)) != FSDP_OK) {
    zmon_destroy(&m);
    return rc;
  }
  *out = m;
  return FSDP_OK;
}

void zmon_destroy(zmon **p) {
  if (!p || !*p) return;
  zmon *m = *p;
  *p = NULL;
  loop_zsock_destroy(&m->zs);
  zmq_socket_monitor(m->sock, NULL, 0);
  if (m->pair) {
    int linger = 0;
    zmq_setsockopt(m->pair, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(m->pair);
  }
  free(m);
}
