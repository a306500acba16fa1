/* asuser — see asuser.h. */
#define _GNU_SOURCE
#include "asuser.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_GROUPS 1024

/* USER's groups (GID first), as initgroups would set them. */
static fsdp_status groups_of(const char *user, gid_t gid, gid_t *groups, int *n) {
  int cap = MAX_GROUPS;
  if (getgrouplist(user, gid, groups, &cap) < 0)
    return fsdp_set_error(FSDP_ERR_RANGE, "user %s is in more than %d groups", user, MAX_GROUPS);
  *n = cap;
  return FSDP_OK;
}

/* Become UID (GID, GROUPS) for good: a root process that switched cannot switch back. */
static fsdp_status set_ids(uid_t uid, gid_t gid, const gid_t *groups, int n) {
  if (setgroups((size_t)n, groups) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
    return fsdp_set_error(FSDP_ERR_DENIED, "cannot take uid %u gid %u: %s", (unsigned)uid, (unsigned)gid, strerror(errno));
  if (uid != 0 && (setuid(0) == 0 || geteuid() == 0))
    return fsdp_set_error(FSDP_ERR_INTERNAL, "uid %u could take root back after dropping it", (unsigned)uid);
  return FSDP_OK;
}

static int write_all(int fd, const void *p, size_t n) {
  for (const char *c = p; n;) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w, n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, void *p, size_t n) {
  for (char *c = p; n;) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r, n -= (size_t)r;
  }
  return 0;
}

typedef struct reply {
  int32_t rc;
  char msg[1024];
} reply;

fsdp_status asuser_call(const peer_t *who, fsdp_status (*fn)(void *arg), void *arg, void *out, size_t outlen) {
  uid_t self = geteuid();
  if (who->uid == self) return fn(arg);
  if (self != 0) return peer_can_run(who, self);
  gid_t groups[MAX_GROUPS];
  int ngroups = 0, p[2];
  TRY(groups_of(who->name, who->gid, groups, &ngroups));
  if (pipe2(p, O_CLOEXEC) != 0) return fsdp_set_error(FSDP_ERR_IO, "pipe: %s", strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]), close(p[1]);
    return fsdp_set_error(FSDP_ERR_IO, "fork: %s", strerror(errno));
  }
  if (pid == 0) {   /* the child: only this thread exists here; it ends with _exit */
    close(p[0]);
    reply r = {0};
    fsdp_status rc = set_ids(who->uid, who->gid, groups, ngroups);
    if (rc == FSDP_OK) rc = fn(arg);
    r.rc = rc;
    if (rc != FSDP_OK) snprintf(r.msg, sizeof r.msg, "%s", fsdp_last_error());
    int bad = write_all(p[1], &r, sizeof r) || (rc == FSDP_OK && outlen && write_all(p[1], out, outlen));
    _exit(bad ? 1 : 0);
  }
  close(p[1]);
  reply r;
  int got = read_all(p[0], &r, sizeof r) == 0 && (r.rc != FSDP_OK || !outlen || read_all(p[0], out, outlen) == 0);
  close(p[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  if (!got || r.rc < 0 || r.rc >= FSDP_STATUS_COUNT)
    return fsdp_set_error(FSDP_ERR_INTERNAL, "the process acting as %s ended without an answer (status 0x%x)", who->name, st);
  if (r.rc != FSDP_OK) return fsdp_set_error((fsdp_status)r.rc, "%s", r.msg);
  return FSDP_OK;
}

void asuser_exec_argv(const char *self, const char *user, unsigned uid, unsigned gid, unsigned umask_bits,
                      char *const *args, size_t n_args, char nums[3][24], char **out) {
  snprintf(nums[0], 24, "%u", uid);
  snprintf(nums[1], 24, "%u", gid);
  snprintf(nums[2], 24, "%03o", umask_bits & 0777);
  size_t k = 0;
  out[k++] = (char *)self;
  out[k++] = ASUSER_EXEC_FLAG;
  out[k++] = (char *)user;
  out[k++] = nums[0];
  out[k++] = nums[1];
  out[k++] = nums[2];
  for (size_t i = 0; i < n_args; i++) out[k++] = args[i];
  out[k] = NULL;
}

static int parse_num(const char *s, int base, unsigned long max, unsigned long *v) {
  char *end;
  errno = 0;
  *v = strtoul(s, &end, base);
  return *s && !*end && !errno && *v <= max;
}

int asuser_exec_main(int argc, char **argv) {
  unsigned long uid, gid, mask;
  if (argc < 7 || !parse_num(argv[3], 10, (uid_t)-2, &uid) || !parse_num(argv[4], 10, (gid_t)-2, &gid) ||
      !parse_num(argv[5], 8, 0777, &mask)) {
    fprintf(stderr, "fsdpd %s: expected USER UID GID UMASK PROGRAM [ARGS...]\n", ASUSER_EXEC_FLAG);
    return 2;
  }
  const char *user = argv[2];
  if (geteuid() == 0) {
    struct passwd *pw = getpwnam(user);
    if (!pw || pw->pw_uid != (uid_t)uid) {
      fprintf(stderr, "fsdpd agent: user %s is uid %lu on the coordinator but %s on this node; a job runs only where its "
              "owner is the same user\n", user, uid, pw ? "another uid" : "unknown");
      return 126;
    }
    gid_t groups[MAX_GROUPS];
    int n = 0;
    if (groups_of(user, (gid_t)gid, groups, &n) != FSDP_OK || set_ids((uid_t)uid, (gid_t)gid, groups, n) != FSDP_OK) {
      fprintf(stderr, "fsdpd agent: cannot run as %s: %s\n", user, fsdp_last_error());
      return 126;
    }
    setenv("HOME", pw->pw_dir, 1);
    setenv("USER", user, 1);
    setenv("LOGNAME", user, 1);
  } else if (geteuid() != (uid_t)uid) {
    fprintf(stderr, "fsdpd agent: it runs as uid %u and cannot start workers as %s (uid %lu); run it as root to run "
            "every user's jobs\n", (unsigned)geteuid(), user, uid);
    return 126;
  }
  umask((mode_t)mask);
  execv(argv[6], argv + 6);
  fprintf(stderr, "fsdpd agent: cannot start %s: %s\n", argv[6], strerror(errno));
  return 127;
}
