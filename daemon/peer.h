/* peer — who sent a request to the coordinator, and what that user may do (docs/operations.md,
 * "Trust model").
 *
 * The ZAP handler (zap.h) names every connection with a ZAP user id, which ZeroMQ attaches to each
 * message (wire_env.user_id): "uid:N" for an ipc:// peer (N from SO_PEERCRED, read by libzmq when
 * the connection was made), "user:NAME" for a CURVE key that keys/authorized maps to NAME, "self"
 * for the daemon's own key or a key that names no user (it acts as the daemon's own user, as
 * before keys had users). peer_resolve turns that id into a local user; the user name, uid and
 * primary gid come from the passwd database of this host.
 *
 * Admins are root and the daemon's own user: they may act on every job and shut the daemon down.
 * Everyone else may act only on the jobs they submitted. Plain functions; any thread (getpw* is
 * called with its reentrant variants).
 */
#ifndef FSDP_DAEMON_PEER_H
#define FSDP_DAEMON_PEER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

#define PEER_NAME_MAX 64
#define PEER_ZAP_UID "uid:"
#define PEER_ZAP_USER "user:"
#define PEER_ZAP_SELF "self"

typedef struct peer_t {
  uid_t uid;
  gid_t gid;                 /* the primary group (passwd) */
  char name[PEER_NAME_MAX];
  int admin;                 /* root or the daemon's own user */
} peer_t;

/* The local user behind ZAP user id ZAP_ID, for a daemon running as SELF_UID. FSDP_ERR_DENIED with
 * one line when the id names nobody this host knows (an unknown uid or user name, an empty id). */
fsdp_status peer_resolve(const char *zap_id, uid_t self_uid, peer_t *out);
/* The user with uid UID, for a job whose owner the database holds (SELF_UID decides admin). */
fsdp_status peer_from_uid(uid_t uid, uid_t self_uid, peer_t *out);

/* 1 when P may act on a job that OWNER_UID submitted: its owner or an admin. */
int peer_may(const peer_t *p, uid_t owner_uid);
/* The refusal line: "job 3 belongs to alice; only its owner or an admin may cancel it". */
void peer_refusal(char *buf, size_t n, uint64_t job_id, const char *owner, const char *verb);
/* Whether a daemon running as SELF_UID can run P's workers: as root it runs anyone's, as an ordinary
 * user only that user's. FSDP_ERR_DENIED with one line otherwise. */
fsdp_status peer_can_run(const peer_t *p, uid_t self_uid);

#endif
