/* zap — see zap.h. */
#include "zap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#include "log.h"
#include "peer.h"
#include "zmon.h"

#define ZAP_LOG_EVERY_S 60.0
#define ZAP_WATCH_FDS 32

/* A tcp:// socket's handshakes. libzmq's monitor names the socket's own endpoint in every event,
 * never the peer's, and a failure's value is its reason, not the connection: the peer's address is
 * read when the connection is accepted (value: its descriptor) and found again by the descriptor
 * of the disconnection that follows the failure. */
struct zap_watch {
  char ep[PATH_MAX + 16];
  zmon *mon;
  struct { int fd; char addr[64]; } acc[ZAP_WATCH_FDS];
  int next;                  /* the acc[] slot to fill next (a ring) */
  int failed;                /* the last failure's event, until its disconnection: 0 none */
  uint32_t code;
  /* [1]: failures whose address was read, [0]: those whose connection was closed before (the
   * client retries, so a later line names it): each logged at most once per ZAP_LOG_EVERY_S */
  double logged_at[2];
  unsigned unlogged[2];
};

/* Receive one frame into BUF (NUL-terminated when it fits); -1 when none, else its length. */
static int zap_frame(void *sock, char *buf, size_t cap, int *more) {
  zmq_msg_t f;
  zmq_msg_init(&f);
  if (zmq_msg_recv(&f, sock, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&f);
    return -1;
  }
  size_t len = zmq_msg_size(&f);
  memcpy(buf, zmq_msg_data(&f), len < cap ? len : cap);
  if (len < cap) buf[len] = '\0';
  *more = zmq_msg_more(&f);
  zmq_msg_close(&f);
  return (int)len;
}

static void zap_send(void *sock, const char *data, size_t len, int more) {
  if (zmq_send(sock, data, len, more ? ZMQ_SNDMORE : 0) < 0)
    log_warn("ZAP reply: %s", zmq_strerror(zmq_errno()));
}

static void on_zap(void *sock, void *arg) {
  coord_t *c = arg;
  /* Request: version, request id, domain, address, routing id, mechanism, credentials... */
  char fr[7][256];
  int len[7] = {0}, nf = 0, more = 1;
  while (more) {
    char scratch[256];
    char *dst = nf < 7 ? fr[nf] : scratch;
    int l = zap_frame(sock, dst, 256, &more);
    if (l < 0) {
      if (nf == 0) return;   /* nothing to read: ends this drain */
      break;
    }
    if (nf < 7) len[nf] = l;
    nf++;
  }
  if (nf < 6 || len[0] != 3 || memcmp(fr[0], "1.0", 3) || len[1] > 255) {
    log_warn("ZAP: malformed request (%d frames); refused", nf);
    /* REP: every request must be answered before the next can be read. */
    zap_send(sock, "1.0", 3, 1);
    zap_send(sock, nf >= 2 ? fr[1] : "", nf >= 2 && len[1] <= 255 ? (size_t)len[1] : 0, 1);
    zap_send(sock, "500", 3, 1);
    zap_send(sock, "malformed", 9, 1);
    zap_send(sock, "", 0, 1);
    zap_send(sock, "", 0, 0);
    return;
  }
  const char *status = "400", *text = "not authorized";
  char z85[CURVE_KEY_LEN + 1] = "", user_id[PEER_NAME_MAX + 8] = "";
  if (len[5] == 4 && !memcmp(fr[5], "NULL", 4)) {
    /* Only ipc:// sockets use NULL (tcp:// is always CURVE); libzmq appends the peer's SO_PEERCRED
     * to its address as ":UID:GID:PID", read once when the connection was accepted. */
    long uid, pid;
    if (wire_peer_cred(fr[3], (size_t)len[3], &uid, &pid) == 0) {
      snprintf(user_id, sizeof user_id, "%s%ld", PEER_ZAP_UID, uid);
      status = "200", text = "OK";
    } else {
      text = "no peer credentials";
    }
  } else if (len[5] == 5 && !memcmp(fr[5], "CURVE", 5) && nf >= 7 && len[6] == 32) {
    zmq_z85_encode(z85, (const uint8_t *)fr[6], 32);
    curve_grant grant = !strcmp(z85, c->server_pub) ? CURVE_AS_ADMIN : CURVE_NOT_LISTED;
    char user[CURVE_USER_MAX + 1] = "";
    if (grant == CURVE_NOT_LISTED && curve_authorized(c->authorized_path, z85, &grant, user) != FSDP_OK)
      log_error("ZAP: %s", fsdp_last_error());
    if (grant == CURVE_AS_USER) snprintf(user_id, sizeof user_id, "%s%s", PEER_ZAP_USER, user);
    else if (grant == CURVE_AS_ADMIN) snprintf(user_id, sizeof user_id, "%s", PEER_ZAP_SELF);
    if (grant != CURVE_NOT_LISTED) status = "200", text = "OK";
  } else {
    text = "only CURVE is accepted";
  }
  if (*status != '2') {
    double now = loop_now_mono();
    /* A rejected client reconnects every few hundred ms: log each key once a minute. */
    if (strcmp(z85, c->last_rejected) || now - c->last_rejected_at > 60.0) {
      char addr[64];
      snprintf(addr, sizeof addr, "%.*s", len[3] < 63 ? len[3] : 63, fr[3]);
      if (*z85)
        log_warn("rejected a %.*s connection from %s: key %s is not in %s (add it there to admit that client)",
                 len[5] < 16 ? len[5] : 16, fr[5], addr, z85, c->authorized_path);
      else
        log_warn("rejected a %.*s connection from %s: %s", len[5] < 16 ? len[5] : 16, fr[5], addr, text);
      snprintf(c->last_rejected, sizeof c->last_rejected, "%s", z85);
      c->last_rejected_at = now;
    }
  } else {
    log_debug("admitted %.*s client %s as %s", len[5] < 16 ? len[5] : 16, fr[5], z85, user_id);
  }
  zap_send(sock, "1.0", 3, 1);
  zap_send(sock, fr[1], (size_t)len[1], 1);
  zap_send(sock, status, 3, 1);
  zap_send(sock, text, strlen(text), 1);
  zap_send(sock, user_id, *status == '2' ? strlen(user_id) : 0, 1);
  zap_send(sock, "", 0, 0);
}

static void report_bad_line(void *arg, const char *msg) {
  (void)arg;
  log_error("%s", msg);
}

/* Start the ZAP handler, and with CURVE load (or create) the server keys: before any socket binds,
 * so that no connection is ever admitted without the check. */
fsdp_status zap_setup(coord_t *c, int curve) {
  char dir[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/keys", c->state_dir);
  if (curve) {
    int created = 0;
    TRY(curve_server_keys(dir, c->server_pub, c->server_sec, &created));
    snprintf(c->authorized_path, sizeof c->authorized_path, "%s/authorized", dir);
    int bad = 0;
    if (curve_authorized_check(c->authorized_path, &bad, report_bad_line, NULL) != FSDP_OK)
      log_error("%s", fsdp_last_error());
    else if (bad)
      log_warn("%s: %d malformed line(s) admit no key (allowed: KEY user=NAME or KEY admin, then a note)",
               c->authorized_path, bad);
    if (created) log_info("created the CURVE server keypair in %s (public key %s)", dir, c->server_pub);
  }
  c->zap = zmq_socket(c->zctx, ZMQ_REP);
  if (!c->zap) return fsdp_set_error(FSDP_ERR_COMM, "zmq_socket(REP): %s", zmq_strerror(zmq_errno()));
  if (zmq_bind(c->zap, "inproc://zeromq.zap.01") != 0)
    return fsdp_set_error(FSDP_ERR_COMM, "cannot bind the ZAP handler inproc://zeromq.zap.01: %s", zmq_strerror(zmq_errno()));
  TRY(loop_zsock_new(c->uv, c->zap, on_zap, c, &c->zap_zs));
  c->curve = curve;
  if (curve) log_info("tcp:// endpoints use CURVE (server key %s/server.pub); clients admitted from %s", dir, c->authorized_path);
  return FSDP_OK;
}

static const char *watch_addr(struct zap_watch *w, int fd) {
  for (int i = 0; i < ZAP_WATCH_FDS; i++)
    if (w->acc[i].fd == fd && w->acc[i].addr[0]) return w->acc[i].addr;
  return NULL;
}

static void on_watch(void *arg, int ev, uint32_t value, const char *endpoint) {
  struct zap_watch *w = arg;
  (void)endpoint;
  if (ev == ZMQ_EVENT_ACCEPTED) {
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char host[INET6_ADDRSTRLEN] = "";
    int port = 0;
    w->acc[w->next].fd = (int)value;
    w->acc[w->next].addr[0] = '\0';
    if (getpeername((int)value, (struct sockaddr *)&sa, &len) == 0) {
      if (sa.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, host, sizeof host);
        port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
      } else if (sa.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, host, sizeof host);
        port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
      }
      if (*host) snprintf(w->acc[w->next].addr, sizeof w->acc[w->next].addr, "%s:%d", host, port);
    }
    w->next = (w->next + 1) % ZAP_WATCH_FDS;
    return;
  }
  if (ev != ZMQ_EVENT_DISCONNECTED) {   /* a handshake failed: its connection closes next */
    w->failed = ev;
    w->code = value;
    return;
  }
  if (!w->failed) return;
  int failed = w->failed;
  w->failed = 0;
  double now = loop_now_mono();
  const char *addr = watch_addr(w, (int)value);
  int k = addr != NULL;
  if (w->logged_at[k] != 0 && now - w->logged_at[k] < ZAP_LOG_EVERY_S) {
    w->unlogged[k]++;
    return;
  }
  if (!addr) addr = "an address that was closed before it could be read";
  char more[64] = "";
  if (w->unlogged[k]) snprintf(more, sizeof more, " (and %u more since the last line)", w->unlogged[k]);
  if (failed == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && w->code == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
    log_warn("a CURVE handshake from %s on %s was refused: its HELLO was not sealed for this daemon's key (the client's "
             "server key is not STATE/keys/server.pub)%s", addr, w->ep, more);
  else if (failed == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
    log_warn("a CURVE handshake from %s on %s was refused: it broke the ZMTP or CURVE protocol (error 0x%x): is it an "
             "fsdpd client?%s", addr, w->ep, w->code, more);
  else
    log_warn("a CURVE handshake from %s on %s did not complete: %s (a client that went away, or not an fsdpd "
             "client)%s", addr, w->ep, w->code ? strerror((int)w->code) : "the connection closed", more);
  w->logged_at[k] = now;
  w->unlogged[k] = 0;
}

fsdp_status zap_watch(coord_t *c, void *sock, const char *ep) {
  int k = c->watches[0] ? 1 : 0;
  if (c->watches[k]) return fsdp_set_error(FSDP_ERR_INTERNAL, "%s: a third tcp:// socket to watch", ep);
  struct zap_watch *w = calloc(1, sizeof *w);
  if (!w) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a handshake monitor");
  for (int i = 0; i < ZAP_WATCH_FDS; i++) w->acc[i].fd = -1;
  snprintf(w->ep, sizeof w->ep, "%s", ep);
  fsdp_status rc = zmon_new(c->uv, c->zctx, sock, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                            ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, on_watch, w, &w->mon);
  if (rc != FSDP_OK) {
    free(w);
    return rc;
  }
  c->watches[k] = w;
  return FSDP_OK;
}

void zap_unwatch_all(coord_t *c) {
  for (int k = 0; k < 2; k++) {
    if (!c->watches[k]) continue;
    zmon_destroy(&c->watches[k]->mon);
    free(c->watches[k]);
    c->watches[k] = NULL;
  }
}

fsdp_status zap_bind_socket(coord_t *c, int type, const char *ep, void **out) {
  void *s = zmq_socket(c->zctx, type);
  if (!s) return fsdp_set_error(FSDP_ERR_COMM, "zmq_socket: %s", zmq_strerror(zmq_errno()));
  fsdp_status rc = wire_socket_setup(s);
  int hwm = 0, one = 1;
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  if (rc == FSDP_OK && curve_is_tcp(ep)) rc = c->curve ? curve_server_apply(s, c->server_sec)
                                                       : fsdp_set_error(FSDP_ERR_INTERNAL, "%s: CURVE keys not loaded", ep);
  /* Every handshake goes to the ZAP handler (zap.h), which names the peer. */
  if (rc == FSDP_OK && zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, "fsdpd", 5) != 0)
    rc = fsdp_set_error(FSDP_ERR_COMM, "cannot set the ZAP domain: %s", zmq_strerror(zmq_errno()));
  if (rc == FSDP_OK && zmq_bind(s, ep) != 0)
    rc = fsdp_set_error(FSDP_ERR_COMM, "cannot bind %s: %s (is another fsdpd running on it?)", ep, zmq_strerror(zmq_errno()));
  if (rc == FSDP_OK && curve_is_tcp(ep)) rc = zap_watch(c, s, ep);
  if (rc != FSDP_OK) {
    zmq_close(s);
    return rc;
  }
  *out = s;
  return FSDP_OK;
}
