/* zap — admission and identity for every connection to the coordinator's sockets (ZAP, RFC 27).
 *
 * zap_setup binds a REP socket on inproc://zeromq.zap.01 in the daemon's ZeroMQ context, served by
 * the uv loop, before any socket binds (zap_bind_socket gives every ROUTER a ZAP domain, so each
 * handshake comes here); with CURVE it first loads (or creates) the server keypair in STATE/keys/.
 * A tcp:// (CURVE) handshake is admitted for the daemon's own public key (the embedded agent and its
 * workers) and the keys listed in STATE/keys/authorized (read on every request); the rest are
 * refused, each refused key logged once a minute. An ipc:// (NULL) handshake is admitted with the
 * peer's uid, which libzmq took from SO_PEERCRED when it accepted the connection. The reply's user
 * id names the peer (peer.h: "uid:N", "user:NAME", "self"); ZeroMQ attaches it to every message of
 * that connection as "User-Id" (wire_env.user_id). Loop thread only.
 */
#ifndef FSDP_DAEMON_ZAP_H
#define FSDP_DAEMON_ZAP_H

#include "coord_core.h"

/* CURVE: 1 when an endpoint is tcp:// (load the server keys too). */
fsdp_status zap_setup(coord_t *c, int curve);

/* Watch the CURVE handshakes of SOCK, bound at the tcp:// endpoint EP (zmon.h), and log those
 * that fail before ZAP is asked (most often a client whose server key is not this daemon's: it
 * cannot seal a HELLO this daemon can open), with the client's address: at once, then at most one
 * line a minute with the count since (and one a minute for those whose address was gone before
 * it could be read). Freed by zap_unwatch_all, before the sockets close. */
fsdp_status zap_watch(coord_t *c, void *sock, const char *ep);
/* A socket of TYPE bound at EP with the ZAP domain (a CURVE server for a tcp:// endpoint, its
 * handshakes watched): HWM 0, ROUTER_MANDATORY. */
fsdp_status zap_bind_socket(coord_t *c, int type, const char *ep, void **out);
void zap_unwatch_all(coord_t *c);

#endif
