/* test_peer — who a request comes from and what that user may do (daemon/peer.h), and acting with
 * another user's rights (daemon/asuser.h): ZAP user ids resolved to local users (uid, name,
 * primary gid, admin), unknown users and malformed ids refused with one line, the owner-or-admin
 * rule and its refusal text, the rule that a daemon of an ordinary user runs only that user's jobs,
 * and asuser_call: as root, a child with another user's rights cannot read a root-only file and
 * can read its own, its output comes back, and the caller's rights are untouched. */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "asuser.h"
#include "check.h"
#include "peer.h"

/* A user of this host that is not root, or NULL (then the tests that need one are left out). */
static const struct passwd *other_user(void) {
  static const char *const names[] = {"nobody", "daemon", "bin"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const struct passwd *pw = getpwnam(names[i]);
    if (pw && pw->pw_uid != 0) return pw;
  }
  return NULL;
}

static void test_resolve(void) {
  peer_t p;
  CHECK_OK(peer_resolve("uid:0", 0, &p));
  CHECK_EQ_INT(0, p.uid);
  CHECK(!strcmp(p.name, "root"));
  CHECK_EQ_INT(1, p.admin);
  CHECK_OK(peer_resolve("user:root", 1000, &p));   /* root is an admin of any daemon */
  CHECK_EQ_INT(0, p.uid);
  CHECK_EQ_INT(1, p.admin);
  CHECK_OK(peer_resolve("self", geteuid(), &p));
  CHECK_EQ_INT(geteuid(), p.uid);
  CHECK_EQ_INT(1, p.admin);
  const struct passwd *o = other_user();
  if (o) {
    char id[64];
    snprintf(id, sizeof id, "uid:%u", (unsigned)o->pw_uid);
    CHECK_OK(peer_resolve(id, 0, &p));
    CHECK_EQ_INT(o->pw_uid, p.uid);
    CHECK_EQ_INT(o->pw_gid, p.gid);
    CHECK(!strcmp(p.name, o->pw_name));
    CHECK_EQ_INT(0, p.admin);
    CHECK_OK(peer_resolve(id, o->pw_uid, &p));   /* the daemon's own user is an admin */
    CHECK_EQ_INT(1, p.admin);
    snprintf(id, sizeof id, "user:%s", o->pw_name);
    CHECK_OK(peer_resolve(id, 0, &p));
    CHECK_EQ_INT(o->pw_uid, p.uid);
  }
  /* nobody this host knows, or no id at all: refused with one line */
  const char *bad[] = {"", "uid:", "uid:12x", "uid:-1", "uid:4000000000", "user:", "user:no-such-user-xq",
                       "user:a/b", "alice", "self ", NULL};
  for (int i = 0; i < 10; i++) {
    fsdp_status rc = peer_resolve(bad[i], 0, &p);
    CHECK(rc == FSDP_ERR_DENIED);
    if (rc != FSDP_ERR_DENIED) fprintf(stderr, "  id '%s' was resolved to uid %u\n", bad[i], (unsigned)p.uid);
    CHECK(strchr(fsdp_last_error(), '\n') == NULL);
  }
  CHECK(peer_resolve(NULL, 0, &p) == FSDP_ERR_DENIED);
  CHECK(peer_resolve("uid:3999999999", 0, &p) == FSDP_ERR_DENIED);   /* no such user */
}

static void test_rules(void) {
  peer_t alice = {.uid = 1001, .gid = 1001, .name = "alice"}, root = {.uid = 0, .name = "root", .admin = 1};
  CHECK_EQ_INT(1, peer_may(&alice, 1001));
  CHECK_EQ_INT(0, peer_may(&alice, 1002));
  CHECK_EQ_INT(1, peer_may(&root, 1001));
  char msg[256];
  peer_refusal(msg, sizeof msg, 3, "alice", "cancel");
  CHECK(!strcmp(msg, "job 3 belongs to alice; only its owner or an admin may cancel it"));
  /* root's daemon runs anyone's job; an ordinary user's daemon only that user's */
  CHECK_OK(peer_can_run(&alice, 0));
  CHECK_OK(peer_can_run(&alice, 1001));
  CHECK(peer_can_run(&alice, 1002) == FSDP_ERR_DENIED);
  CHECK(strstr(fsdp_last_error(), "not as alice") != NULL);
  CHECK(peer_can_run(&root, 1002) == FSDP_ERR_DENIED);
}

typedef struct probe {
  const char *path;
  int can_read;
  uid_t uid, euid;
} probe;

static fsdp_status look(void *arg) {
  probe *p = arg;
  int fd = open(p->path, O_RDONLY | O_CLOEXEC);
  p->can_read = fd >= 0;
  if (fd >= 0) close(fd);
  p->uid = getuid();
  p->euid = geteuid();
  if (!strcmp(p->path, "/nonexistent-fail")) return fsdp_set_error(FSDP_ERR_NOTFOUND, "asked to fail");
  return FSDP_OK;
}

static void test_asuser(void) {
  /* the daemon's own user: FN runs here */
  peer_t self;
  CHECK_OK(peer_from_uid(geteuid(), geteuid(), &self));
  probe pr = {.path = "/"};
  CHECK_OK(asuser_call(&self, look, &pr, &pr, sizeof pr));
  CHECK_EQ_INT(geteuid(), pr.euid);
  const struct passwd *o = other_user();
  if (geteuid() != 0 || !o) {
    printf("asuser: not root (or no other user): the child-process cases are left out\n");
    return;
  }
  char dir[] = "/tmp/test-peer-XXXXXX", secret[300], open_file[300];
  CHECK(mkdtemp(dir) != NULL);
  chmod(dir, 0755);
  snprintf(secret, sizeof secret, "%s/secret", dir);
  snprintf(open_file, sizeof open_file, "%s/open", dir);
  int fd = open(secret, O_WRONLY | O_CREAT | O_EXCL, 0600);
  CHECK(fd >= 0 && write(fd, "FSDP", 4) == 4);
  close(fd);
  fd = open(open_file, O_WRONLY | O_CREAT | O_EXCL, 0644);
  close(fd);
  peer_t who;
  CHECK_OK(peer_from_uid(o->pw_uid, 0, &who));
  probe a = {.path = secret, .can_read = -1};
  CHECK_OK(asuser_call(&who, look, &a, &a, sizeof a));
  CHECK_EQ_INT(0, a.can_read);
  CHECK_EQ_INT(o->pw_uid, a.uid);
  CHECK_EQ_INT(o->pw_uid, a.euid);
  probe b = {.path = open_file, .can_read = -1};
  CHECK_OK(asuser_call(&who, look, &b, &b, sizeof b));
  CHECK_EQ_INT(1, b.can_read);
  /* an error in the child comes back with its message; this process kept its rights */
  probe c = {.path = "/nonexistent-fail"};
  CHECK(asuser_call(&who, look, &c, &c, sizeof c) == FSDP_ERR_NOTFOUND);
  CHECK(strstr(fsdp_last_error(), "asked to fail") != NULL);
  CHECK_EQ_INT(0, geteuid());
  fd = open(secret, O_RDONLY);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  unlink(secret);
  unlink(open_file);
  rmdir(dir);
}

int main(void) {
  test_resolve();
  test_rules();
  test_asuser();
  return check_done();
}
