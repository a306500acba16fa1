/* ctl_conn — see ctl_conn.h. */
#include "ctl_conn.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <zmq.h>

#include "ctl_fmt.h"
#include "curve.h"
#include "envknob.h"
#include "wire.h"

struct ctl_conn {
  void *ctx;
  void *sock;
  int watch_fd;
  void *mon;              /* tcp://: PAIR receiving the socket's handshake events */
  int mon_seq;
  int tcp_up, secured;    /* tcp://: a TCP connection was made; a CURVE handshake succeeded */
  char endpoint[1024];
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

fsdp_status ctl_default_state_dir(char *buf, size_t n) {
  const char *x = getenv("XDG_STATE_HOME");
  int w = x && x[0] ? snprintf(buf, n, "%s/fsdpd", x) : snprintf(buf, n, "/var/lib/fsdpd");
  if (w < 0 || (size_t)w >= n) return fsdp_set_error(FSDP_ERR_RANGE, "state directory path is longer than %zu bytes", n - 1);
  return FSDP_OK;
}

fsdp_status ctl_endpoint_resolve(const char *flag, char *buf, size_t n) {
  const char *env = envknob_get(ENV_CTL);
  const char *ep = flag && flag[0] ? flag : env;
  int w;
  if (ep) {
    w = snprintf(buf, n, "%s", ep);
  } else {
    char dir[900];
    TRY(ctl_default_state_dir(dir, sizeof dir));
    w = snprintf(buf, n, "ipc://%s/ctl.sock", dir);
  }
  if (w < 0 || (size_t)w >= n) return fsdp_set_error(FSDP_ERR_RANGE, "ctl endpoint is longer than %zu bytes", n - 1);
  if (strncmp(buf, "ipc://", 6) && strncmp(buf, "tcp://", 6))
    return fsdp_set_error(FSDP_ERR_INVALID, "ctl endpoint '%s' is not ipc://PATH or tcp://HOST:PORT", buf);
  return FSDP_OK;
}

static void close_socket(ctl_conn *c) {
  if (c->sock && c->mon) zmq_socket_monitor(c->sock, NULL, 0);
  if (c->mon) {
    int linger = 0;
    zmq_setsockopt(c->mon, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(c->mon);
  }
  c->mon = NULL;
  if (c->sock) zmq_close(c->sock);
  c->sock = NULL;
}

/* tcp://: watch the CURVE handshake, so that a rejected key is reported as such at once instead of
 * as an unreachable daemon after the connect timeout. */
static fsdp_status open_monitor(ctl_conn *c) {
  char ep[96];
  snprintf(ep, sizeof ep, "inproc://fsdpctl-monitor-%p-%d", (void *)c, c->mon_seq++);
  c->tcp_up = c->secured = 0;
  if (zmq_socket_monitor(c->sock, ep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED |
                                          ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                          ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0)
    return fsdp_set_error(FSDP_ERR_COMM, "zmq_socket_monitor: %s", zmq_strerror(zmq_errno()));
  c->mon = zmq_socket(c->ctx, ZMQ_PAIR);
  if (!c->mon || zmq_connect(c->mon, ep) != 0)
    return fsdp_set_error(FSDP_ERR_COMM, "cannot watch the CURVE handshake: %s", zmq_strerror(zmq_errno()));
  return FSDP_OK;
}

/* What the handshake events so far say: -4 the daemon rejected this client's key, -5 the daemon
 * dropped the connection before the handshake completed (a CURVE server drops a client whose
 * HELLO it cannot decrypt: the server key is not that daemon's), 0 nothing conclusive. */
static int monitor_verdict(ctl_conn *c) {
  int verdict = 0;
  zmq_msg_t f;
  zmq_msg_init(&f);
  while (zmq_msg_recv(&f, c->mon, ZMQ_DONTWAIT) >= 0) {
    uint16_t ev = 0;
    if (zmq_msg_size(&f) >= 2) memcpy(&ev, zmq_msg_data(&f), 2);
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) verdict = -4;
    else if (ev == ZMQ_EVENT_CONNECTED) c->tcp_up = 1;
    else if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) c->secured = 1;
    else if ((ev == ZMQ_EVENT_DISCONNECTED || ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
              ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) && c->tcp_up && !c->secured && !verdict)
      verdict = -5;
    while (zmq_msg_more(&f) && zmq_msg_recv(&f, c->mon, ZMQ_DONTWAIT) >= 0) {
    }
  }
  zmq_msg_close(&f);
  return verdict;
}

static fsdp_status open_socket(ctl_conn *c) {
  close_socket(c);
  c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
  if (!c->sock) return fsdp_set_error(FSDP_ERR_COMM, "zmq_socket(DEALER): %s", zmq_strerror(zmq_errno()));
  TRY(wire_socket_setup(c->sock));
  /* Queue nothing for a peer that has not connected: "is the connection up" becomes POLLOUT. */
  int one = 1;
  if (zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one) != 0)
    return fsdp_set_error(FSDP_ERR_COMM, "zmq_setsockopt(ZMQ_IMMEDIATE): %s", zmq_strerror(zmq_errno()));
  TRY(curve_client_apply(c->sock, c->endpoint, envknob_get(ENV_SERVER_KEY), envknob_get(ENV_CLIENT_KEY), "--ctl"));
  if (curve_is_tcp(c->endpoint)) TRY(open_monitor(c));
  if (zmq_connect(c->sock, c->endpoint) != 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "cannot connect to ctl endpoint %s: %s (expected ipc://PATH or tcp://HOST:PORT)",
                          c->endpoint, zmq_strerror(zmq_errno()));
  return FSDP_OK;
}

fsdp_status ctl_conn_open(const char *endpoint, ctl_conn **out) {
  *out = NULL;
  if (strlen(endpoint) >= sizeof((ctl_conn *)0)->endpoint)
    return fsdp_set_error(FSDP_ERR_RANGE, "ctl endpoint is longer than %zu bytes", sizeof((ctl_conn *)0)->endpoint - 1);
  if (!strncmp(endpoint, "ipc://", 6)) {
    /* A missing socket file means no daemon: say so now rather than after a timeout. */
    struct stat st;
    if (stat(endpoint + 6, &st) != 0)
      return fsdp_set_error(FSDP_ERR_COMM, "%s: %s", endpoint + 6, strerror(errno));
    if (!S_ISSOCK(st.st_mode)) return fsdp_set_error(FSDP_ERR_COMM, "%s is not a socket", endpoint + 6);
  }
  if (curve_is_tcp(endpoint)) {
    const char *sk = envknob_get(ENV_SERVER_KEY), *ck = envknob_get(ENV_CLIENT_KEY);
    if (!sk || !*sk || !ck || !*ck)
      return fsdp_set_error(FSDP_ERR_INVALID,
                            "cannot reach fsdpd at %s without CURVE keys: a tcp:// endpoint needs --server-key FILE (the "
                            "daemon's STATE/keys/server.pub) and --client-key FILE (made by `fsdpctl keygen FILE`, its public "
                            "key listed in the daemon's STATE/keys/authorized), or $%s and $%s",
                            endpoint, CURVE_ENV_SERVER_KEY, CURVE_ENV_CLIENT_KEY);
  }
  ctl_conn *c = calloc(1, sizeof *c);
  if (!c) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
  c->watch_fd = -1;
  c->ctx = zmq_ctx_new();
  if (!c->ctx) {
    free(c);
    return fsdp_set_error(FSDP_ERR_COMM, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
  }
  fsdp_status rc = open_socket(c);
  if (rc != FSDP_OK) {
    ctl_conn_destroy(&c);
    return rc;
  }
  *out = c;
  return FSDP_OK;
}

void ctl_conn_destroy(ctl_conn **cp) {
  if (!cp || !*cp) return;
  ctl_conn *c = *cp;
  close_socket(c);
  if (c->ctx) zmq_ctx_term(c->ctx);
  free(c);
  *cp = NULL;
}


void ctl_conn_watch_fd(ctl_conn *c, int fd) { c->watch_fd = fd; }

/* Wait until EVENTS is ready on the socket or DEADLINE (monotonic ms) passes.
 * 1 ready, 0 deadline, -1 interrupted by a signal, -2 other error, -3 the watched fd fired,
 * -4 the daemon rejected this client's CURVE key, -5 it dropped the connection during the handshake. */
static int wait_for(ctl_conn *c, short events, double deadline) {
  for (;;) {
    double left = deadline - now_ms();
    if (left < 0) left = 0;
    zmq_pollitem_t it[3] = {{c->sock, 0, events, 0}};
    int ni = 1, iw = -1, im = -1;
    if (c->watch_fd >= 0) iw = ni, it[ni++] = (zmq_pollitem_t){NULL, c->watch_fd, ZMQ_POLLIN, 0};
    if (c->mon) im = ni, it[ni++] = (zmq_pollitem_t){c->mon, 0, ZMQ_POLLIN, 0};
    int n = zmq_poll(it, ni, (long)(left + 0.999));
    if (n < 0) return zmq_errno() == EINTR ? -1 : -2;
    if (n > 0 && (it[0].revents & events)) return 1;
    if (n > 0 && iw >= 0 && (it[iw].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) return -3;
    if (n > 0 && im >= 0 && (it[im].revents & ZMQ_POLLIN)) {
      int v = monitor_verdict(c);
      if (v) return v;
    }
    if (now_ms() >= deadline) return 0;
  }
}

static fsdp_status handshake_dropped(ctl_conn *c) {
  return fsdp_set_error(FSDP_ERR_INVALID,
                        "fsdpd at %s dropped the connection during the CURVE handshake: the server key %s is not that "
                        "daemon's; copy its current STATE/keys/server.pub",
                        c->endpoint, envknob_get(ENV_SERVER_KEY));
}

static fsdp_status key_rejected(ctl_conn *c) {
  return fsdp_set_error(FSDP_ERR_INVALID,
                        "fsdpd at %s rejected this client's CURVE key (%s): add its public key, then user=NAME or admin, "
                        "as a line of the daemon's STATE/keys/authorized, and check that %s is that daemon's STATE/keys/server.pub",
                        c->endpoint, envknob_get(ENV_CLIENT_KEY), envknob_get(ENV_SERVER_KEY));
}

fsdp_status ctl_conn_call(ctl_conn *c, Fsdp__Msg *req, int timeout_ms, Fsdp__Msg **reply) {
  *reply = NULL;
  if (timeout_ms <= 0) timeout_ms = CTL_CALL_TIMEOUT_MS;
  if (!c->sock) TRY(open_socket(c));
  fsdp_status rc;
  int w = wait_for(c, ZMQ_POLLOUT, now_ms() + CTL_CONNECT_TIMEOUT_MS);
  if (w == -1) return fsdp_set_error(FSDP_ERR_CANCELLED, "interrupted");
  if (w == -3) return fsdp_set_error(FSDP_ERR_COMM, "the fsdpd process at %s exited", c->endpoint);
  if (w == -4 || w == -5) {
    rc = w == -4 ? key_rejected(c) : handshake_dropped(c);
    goto reopen;
  }
  if (w == 0) {
    rc = fsdp_set_error(FSDP_ERR_COMM, "no connection to %s within %d ms", c->endpoint, CTL_CONNECT_TIMEOUT_MS);
    goto reopen;
  }
  if (w < 0) {
    rc = fsdp_set_error(FSDP_ERR_COMM, "zmq_poll: %s", zmq_strerror(zmq_errno()));
    goto reopen;
  }
  wire_env env = {0};
  TRY(wire_env_push(&env, NULL, 0));
  rc = wire_send(c->sock, &env, req, ZMQ_DONTWAIT);
  if (rc == FSDP_ERR_TIMEOUT) rc = fsdp_set_error(FSDP_ERR_COMM, "the connection to %s went away", c->endpoint);
  if (rc != FSDP_OK) goto reopen;

  double deadline = now_ms() + timeout_ms;
  for (;;) {
    w = wait_for(c, ZMQ_POLLIN, deadline);
    if (w == -4 || w == -5) {
      rc = w == -4 ? key_rejected(c) : handshake_dropped(c);
      goto reopen;
    }
    if (w == -3) {
      rc = fsdp_set_error(FSDP_ERR_COMM, "the fsdpd process at %s exited", c->endpoint);
      goto reopen;
    }
    if (w == -1) {
      rc = fsdp_set_error(FSDP_ERR_CANCELLED, "interrupted");
      goto reopen;   /* the reply may still come: never let it answer the next request */
    }
    if (w == 0) {
      rc = fsdp_set_error(FSDP_ERR_TIMEOUT, "fsdpd at %s did not answer within %.0f s", c->endpoint, timeout_ms / 1000.0);
      goto reopen;
    }
    if (w < 0) {
      rc = fsdp_set_error(FSDP_ERR_COMM, "zmq_poll: %s", zmq_strerror(zmq_errno()));
      goto reopen;
    }
    wire_env renv;
    Fsdp__Msg *m = NULL;
    rc = wire_recv(c->sock, &renv, &m, ZMQ_DONTWAIT);
    if (rc == FSDP_ERR_TIMEOUT) continue;   /* woken without a whole message */
    if (rc != FSDP_OK) {
      /* A reply we cannot read: report it; the socket stays usable (the message was consumed). */
      return fsdp_set_error(rc, "unreadable reply from %s: %s", c->endpoint, fsdp_last_error());
    }
    if (renv.n != 1 || renv.len[0] != 0) {
      wire_destroy(&m);
      return fsdp_set_error(FSDP_ERR_FORMAT, "reply from %s has %d envelope frames, expected the empty delimiter only",
                            c->endpoint, renv.n);
    }
    *reply = m;
    return FSDP_OK;
  }

reopen:
  close_socket(c);   /* reopened lazily by the next call */
  return rc;
}

void ctl_describe_failure(const char *ep, fsdp_status rc, char *buf, size_t n) {
  switch (rc) {
  case FSDP_ERR_COMM:
    snprintf(buf, n, "cannot reach fsdpd at %s: is it running? (start it with `fsdpd` or use `fsdpctl run`)", ep);
    break;
  case FSDP_ERR_TIMEOUT:
    snprintf(buf, n, "fsdpd at %s accepted the request but did not answer in time; check its log", ep);
    break;
  case FSDP_ERR_CANCELLED:
    snprintf(buf, n, "interrupted");
    break;
  default:
    snprintf(buf, n, "%s", fsdp_last_error());
  }
}
