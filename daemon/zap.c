/* zap — see zap.h. */
#include "zap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "log.h"
#include "peer.h"

/* The uid at the end of an ipc:// peer address "...:UID:GID:PID"; -1 when it has none. */
static long zap_peer_uid(const char *addr, int len) {
  char buf[256];
  snprintf(buf, sizeof buf, "%.*s", len < 255 ? len : 255, addr);
  char *f[3] = {0};
  for (int i = 0; i < 3; i++) {
    char *colon = strrchr(buf, ':');
    if (!colon || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1)) return -1;
    f[i] = colon + 1;
    *colon = '\0';
  }
  char *end;
  errno = 0;
  unsigned long uid = strtoul(f[2], &end, 10);
  return errno || uid > (unsigned long)(uid_t)-2 ? -1 : (long)uid;
}

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
    long uid = zap_peer_uid(fr[3], len[3]);
    if (uid >= 0) {
      snprintf(user_id, sizeof user_id, "%s%ld", PEER_ZAP_UID, uid);
      status = "200", text = "OK";
    } else {
      text = "no peer credentials";
    }
  } else if (len[5] == 5 && !memcmp(fr[5], "CURVE", 5) && nf >= 7 && len[6] == 32) {
    zmq_z85_encode(z85, (const uint8_t *)fr[6], 32);
    int listed = !strcmp(z85, c->server_pub);
    char user[CURVE_USER_MAX + 1] = "";
    if (!listed && curve_authorized(c->authorized_path, z85, &listed, user) != FSDP_OK)
      log_error("ZAP: %s", fsdp_last_error());
    if (listed) {
      status = "200", text = "OK";
      if (*user) snprintf(user_id, sizeof user_id, "%s%s", PEER_ZAP_USER, user);
      else snprintf(user_id, sizeof user_id, "%s", PEER_ZAP_SELF);
    }
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

/* Start the ZAP handler, and with CURVE load (or create) the server keys: before any socket binds,
 * so that no connection is ever admitted without the check. */
fsdp_status zap_setup(coord_t *c, int curve) {
  char dir[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/keys", c->state_dir);
  if (curve) {
    int created = 0;
    TRY(curve_server_keys(dir, c->server_pub, c->server_sec, &created));
    snprintf(c->authorized_path, sizeof c->authorized_path, "%s/authorized", dir);
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
