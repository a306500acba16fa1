/* wire — one fsdp.Msg over a ZMQ socket: [envelope frames…][packed protobuf-c body].
 *
 * wire_send() stamps the protocol version, packs and sends; wire_recv() receives every frame of
 * one message, keeps the leading frames as the envelope (ROUTER identities and delimiters), and
 * unpacks the last as the body. wire_unpack() rejects a body that is empty, larger than
 * WIRE_MAX_BODY, not a Msg, of another protocol version, or whose fields fail wire_validate();
 * an invalid message never reaches the caller. The caller owns a received Msg (wire_destroy).
 * Sockets are not thread-safe: use each from one thread only, as ZeroMQ requires.
 */
#ifndef FSDP_WIRE_H
#define FSDP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "fsdp.pb-c.h"

#define WIRE_MAX_BODY (64u << 20)   /* bytes; the largest legal message (a plan, a logs chunk) is far less */
#define WIRE_MAX_ENV 4              /* envelope frames */
#define WIRE_MAX_ENV_FRAME 256      /* bytes per envelope frame */
#define WIRE_MAX_STRING (1u << 20)  /* spec text, log chunks; names are far shorter */

/* The environment variable that carries a worker's token from the coordinator's spawn request to
 * the worker (readable by its owner and root only, unlike a command line). */
#define WIRE_WORKER_TOKEN_ENV "FSDPD_WORKER_TOKEN"

#define WIRE_MAX_USER_ID 128        /* bytes of a ZAP user id, with its NUL */

typedef struct wire_env {
  int n;
  size_t len[WIRE_MAX_ENV];
  uint8_t data[WIRE_MAX_ENV][WIRE_MAX_ENV_FRAME];
  /* wire_recv: the "User-Id" the ZAP handler gave the sending connection (daemon/zap.h), "" when
   * the socket has no ZAP handler or the id does not fit. Not sent by wire_send. */
  char user_id[WIRE_MAX_USER_ID];
  /* wire_recv: the sending process's uid and pid on a unix-socket (ipc://) connection, which libzmq
   * read with SO_PEERCRED when it accepted the connection (its "Peer-Address" ends ":UID:GID:PID");
   * -1 on any other transport. Not sent by wire_send. */
  long peer_uid, peer_pid;
} wire_env;

/* Envelope helpers: append one frame; the empty frame is the ROUTER/DEALER delimiter. */
fsdp_status wire_env_push(wire_env *env, const void *data, size_t len);

/* The credentials at the end of a libzmq ipc:// peer address "...:UID:GID:PID" (SO_PEERCRED);
 * 0 and *UID, *PID set when ADDR (LEN bytes) ends so, -1 otherwise. */
int wire_peer_cred(const char *addr, size_t len, long *uid, long *pid);

/* Pack M (its version is set to PROTO_VERSION) into a malloc'd buffer. */
fsdp_status wire_pack(Fsdp__Msg *m, uint8_t **buf, size_t *len);
/* Unpack and validate; on success *out is owned by the caller. */
fsdp_status wire_unpack(const uint8_t *buf, size_t len, Fsdp__Msg **out);
fsdp_status wire_validate(const Fsdp__Msg *m);
void wire_destroy(Fsdp__Msg **m);

/* Send ENV (may be NULL) then M. FLAGS: 0 or ZMQ_DONTWAIT (FSDP_ERR_TIMEOUT when it would block). */
fsdp_status wire_send(void *sock, const wire_env *env, Fsdp__Msg *m, int flags);
/* Receive one message. FLAGS: 0 or ZMQ_DONTWAIT (FSDP_ERR_TIMEOUT when none is waiting, also
 * when the socket's ZMQ_RCVTIMEO passes). A malformed message is consumed whole and reported as
 * FSDP_ERR_FORMAT or FSDP_ERR_INVALID, with env still filled so that a ROUTER can answer. */
fsdp_status wire_recv(void *sock, wire_env *env, Fsdp__Msg **out, int flags);
/* Limits a socket to messages of at most WIRE_MAX_BODY (+ envelope) bytes and sets linger 0. */
fsdp_status wire_socket_setup(void *sock);

/* "submit_req", "step_report", ...; "unknown" for anything else. */
const char *wire_body_name(Fsdp__Msg__BodyCase c);

/* Convenience: a Msg with the given body case, for building replies on the stack. */
#define WIRE_MSG_INIT FSDP__MSG__INIT

#endif
