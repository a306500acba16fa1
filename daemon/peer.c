/* peer — see peer.h. */
#include "peer.h"

#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "curve.h"

static fsdp_status fill(const struct passwd *pw, uid_t self_uid, peer_t *out) {
  if (strlen(pw->pw_name) >= sizeof out->name)
    return fsdp_set_error(FSDP_ERR_DENIED, "user name %.64s... is longer than %d characters", pw->pw_name, PEER_NAME_MAX - 1);
  out->uid = pw->pw_uid;
  out->gid = pw->pw_gid;
  snprintf(out->name, sizeof out->name, "%s", pw->pw_name);
  out->admin = pw->pw_uid == 0 || pw->pw_uid == self_uid;
  return FSDP_OK;
}

fsdp_status peer_from_uid(uid_t uid, uid_t self_uid, peer_t *out) {
  struct passwd pw, *res = NULL;
  char buf[4096];
  int e = getpwuid_r(uid, &pw, buf, sizeof buf, &res);
  if (!res)
    return fsdp_set_error(FSDP_ERR_DENIED, "uid %u has no user on this host (%s); fsdpd serves the users in its passwd "
                          "database", (unsigned)uid, e ? strerror(e) : "no passwd entry");
  return fill(res, self_uid, out);
}

static fsdp_status from_name(const char *name, uid_t self_uid, peer_t *out) {
  struct passwd pw, *res = NULL;
  char buf[4096];
  int e = curve_user_name_ok(name) ? getpwnam_r(name, &pw, buf, sizeof buf, &res) : 0;
  if (!res)
    return fsdp_set_error(FSDP_ERR_DENIED, "this client's key acts as user '%.64s', who does not exist on the daemon's "
                          "host (%s); fix its user= in keys/authorized", name, e ? strerror(e) : "no passwd entry");
  return fill(res, self_uid, out);
}

fsdp_status peer_resolve(const char *zap_id, uid_t self_uid, peer_t *out) {
  memset(out, 0, sizeof *out);
  size_t nu = strlen(PEER_ZAP_UID), nn = strlen(PEER_ZAP_USER);
  if (zap_id && !strncmp(zap_id, PEER_ZAP_UID, nu)) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(zap_id + nu, &end, 10);
    if (end != zap_id + nu && !*end && !errno && v <= (uid_t)-2) return peer_from_uid((uid_t)v, self_uid, out);
  } else if (zap_id && !strncmp(zap_id, PEER_ZAP_USER, nn)) {
    return from_name(zap_id + nn, self_uid, out);
  } else if (zap_id && !strcmp(zap_id, PEER_ZAP_SELF)) {
    return peer_from_uid(self_uid, self_uid, out);
  }
  return fsdp_set_error(FSDP_ERR_DENIED, "fsdpd cannot tell who sent this request (connection id '%.32s'); it answers "
                        "only identified clients", zap_id ? zap_id : "");
}

int peer_may(const peer_t *p, uid_t owner_uid) { return p->admin || p->uid == owner_uid; }

void peer_refusal(char *buf, size_t n, uint64_t job_id, const char *owner, const char *verb) {
  snprintf(buf, n, "job %llu belongs to %s; only its owner or an admin may %s it", (unsigned long long)job_id, owner, verb);
}

fsdp_status peer_can_run(const peer_t *p, uid_t self_uid) {
  if (self_uid == 0 || p->uid == self_uid) return FSDP_OK;
  peer_t self;
  const char *me = peer_from_uid(self_uid, self_uid, &self) == FSDP_OK ? self.name : "its own user";
  return fsdp_set_error(FSDP_ERR_DENIED, "fsdpd runs as %s and can run jobs only as %s, not as %s (run fsdpd as root to "
                        "take every user's jobs)", me, me, p->name);
}
