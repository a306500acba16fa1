/* statedir — see statedir.h. */
#define _GNU_SOURCE   /* O_PATH */
#include "statedir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"

/* The names fsdpd creates in its state directory: none may be a link. */
static const char *const own_names[] = {"fsdpd.log", "fsdpd.lock", "fsdpd.lock.tmp", "jobs", "jobs.db", "jobs.db-wal",
                                        "jobs.db-shm", "jobs.db-journal", "keys", "ctl.sock", "cluster.sock", "run"};
/* The files under keys/ that decide who may connect: private to the daemon's user, as STATE is. */
static const char *const key_names[] = {"server.key", "server.pub", "authorized"};

/* NAME in DIRFD (shown as DIR/NAME) is not a link; when PRIVATE and present, no other user owns
 * or can write it. */
static fsdp_status check_entry(int dirfd, const char *dir, const char *name, int private_) {
  char shown[PATH_MAX + NAME_MAX + 2];
  snprintf(shown, sizeof shown, "%s/%s", dir, name);
  struct stat st;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return FSDP_OK;
    return fsdp_set_error(FSDP_ERR_IO, "cannot stat %s: %s", shown, strerror(errno));
  }
  if (S_ISLNK(st.st_mode))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s is a symbolic link (owned by uid %u); fsdpd never writes through "
                          "one in its state directory: remove it", shown, (unsigned)st.st_uid);
  if (!private_) return FSDP_OK;
  int fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot open %s: %s", shown, strerror(errno));
  fsdp_status rc = fsutil_check_private(fd, shown);
  close(fd);
  return rc;
}

static fsdp_status check_keys(const statedir *sd) {
  char keys[PATH_MAX + 8];
  snprintf(keys, sizeof keys, "%s/keys", sd->path);
  TRY(check_entry(sd->fd, sd->path, "keys", 1));
  int kfd = openat(sd->fd, "keys", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (kfd < 0) {
    if (errno == ENOENT) return FSDP_OK;
    return fsdp_set_error(FSDP_ERR_IO, "cannot open %s: %s", keys, strerror(errno));
  }
  fsdp_status rc = FSDP_OK;
  for (size_t i = 0; rc == FSDP_OK && i < sizeof key_names / sizeof *key_names; i++)
    rc = check_entry(kfd, keys, key_names[i], 1);
  close(kfd);
  return rc;
}

fsdp_status statedir_open(const char *path, statedir *sd) {
  sd->fd = sd->lock_fd = -1;
  if (snprintf(sd->path, sizeof sd->path, "%s", path) >= (int)sizeof sd->path)
    return fsdp_set_error(FSDP_ERR_RANGE, "state directory %.64s... is too long", path);
  TRY(fsutil_dir_open(AT_FDCWD, path, 0700, FSUTIL_TRUSTED_LINKS, &sd->fd));
  fsdp_status rc;
  TRY_GOTO(fsutil_check_private(sd->fd, path), rc, fail);
  TRY_GOTO(fsutil_check_parents(sd->fd, path), rc, fail);
  for (size_t i = 0; i < sizeof own_names / sizeof *own_names; i++)
    TRY_GOTO(check_entry(sd->fd, path, own_names[i], 0), rc, fail);
  TRY_GOTO(check_keys(sd), rc, fail);
  return FSDP_OK;
fail:
  statedir_close(sd);
  return rc;
}

fsdp_status statedir_lock(statedir *sd, int *note) {
  int r = flock(sd->fd, LOCK_EX | LOCK_NB);
  if (r != 0 && errno != EWOULDBLOCK) {   /* no lock on a directory here: the file's */
    sd->lock_fd = openat(sd->fd, "fsdpd.lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (sd->lock_fd < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot open %s/fsdpd.lock: %s", sd->path, strerror(errno));
    r = flock(sd->lock_fd, LOCK_EX | LOCK_NB);
    if (r != 0 && errno != EWOULDBLOCK) return fsdp_set_error(FSDP_ERR_IO, "cannot lock %s: %s", sd->path, strerror(errno));
    if (note) *note = 1;
  }
  if (r == 0) return FSDP_OK;
  char pid[32] = "unknown";
  int fd = openat(sd->fd, "fsdpd.lock", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, pid, sizeof pid - 1);
    pid[n > 0 ? n : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    if (!*pid) snprintf(pid, sizeof pid, "unknown");
    close(fd);
  }
  return fsdp_set_error(FSDP_ERR_STATE, "another fsdpd (pid %s) is using the state directory %s; stop it first "
                        "(fsdpctl shutdown) or give this one another --state-dir", pid, sd->path);
}

fsdp_status statedir_write_pid(const statedir *sd) {
  char buf[32];
  int n = snprintf(buf, sizeof buf, "%d\n", (int)getpid());
  if (sd->lock_fd >= 0) {   /* the locked file itself: replacing it would drop the lock */
    if (ftruncate(sd->lock_fd, 0) != 0 || pwrite(sd->lock_fd, buf, (size_t)n, 0) != n)
      return fsdp_set_error(FSDP_ERR_IO, "cannot write %s/fsdpd.lock: %s", sd->path, strerror(errno));
    return FSDP_OK;
  }
  fsutil_atomic a = FSUTIL_ATOMIC_INIT;
  fsdp_status rc;
  TRY_GOTO(fsutil_atomic_begin(sd->fd, sd->path, "fsdpd.lock", 0600, &a), rc, out);
  TRY_GOTO(fsutil_write_full(a.fd, buf, (size_t)n, a.shown), rc, out);
  rc = fsutil_atomic_commit(&a);
out:
  fsutil_atomic_abort(&a);
  return rc;
}

fsdp_status statedir_open_log(const statedir *sd, int *fd) {
  char shown[PATH_MAX + 16];
  snprintf(shown, sizeof shown, "%s/fsdpd.log", sd->path);
  return fsutil_open_append(sd->fd, "fsdpd.log", shown, 0600, fd);
}

void statedir_close(statedir *sd) {
  if (sd->fd >= 0) close(sd->fd);
  if (sd->lock_fd >= 0) close(sd->lock_fd);
  sd->fd = sd->lock_fd = -1;
}

fsdp_status statedir_run_dir(const statedir *sd, char *out, size_t n) {
  if (mkdirat(sd->fd, "run", 0700) != 0 && errno != EEXIST)
    return fsdp_set_error(FSDP_ERR_IO, "cannot create %s/run: %s", sd->path, strerror(errno));
  TRY(check_entry(sd->fd, sd->path, "run", 1));
  int fd = openat(sd->fd, "run", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    return fsdp_set_error(FSDP_ERR_IO, "cannot open %s/run: %s", sd->path, strerror(errno));
  /* ours (check_entry): nobody else may even enter it */
  int rc = (st.st_mode & 077) ? fchmod(fd, 0700) : 0;
  close(fd);
  if (rc != 0) return fsdp_set_error(FSDP_ERR_IO, "cannot make %s/run private: %s", sd->path, strerror(errno));
  snprintf(out, n, "%s/run", sd->path);
  return FSDP_OK;
}


/* NAME as a job id: decimal digits, no leading zero, > 0; else 0. */
static uint64_t job_id_of(const char *name) {
  if (name[0] < '1' || name[0] > '9' || strspn(name, "0123456789") != strlen(name) || strlen(name) > 19) return 0;
  return strtoull(name, NULL, 10);
}

fsdp_status statedir_job_folders(int jobs_fd, const char *shown, uint64_t *last, size_t *count) {
  *last = 0;
  *count = 0;
  int fd = openat(jobs_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return fsdp_set_error(FSDP_ERR_IO, "cannot list %s: %s", shown, strerror(errno));
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    uint64_t id = job_id_of(e->d_name);
    if (!id) continue;
    (*count)++;
    if (id > *last) *last = id;
  }
  closedir(d);
  return FSDP_OK;
}

fsdp_status statedir_jobs_db_prepare(const char *db_path, int jobs_fd, const char *jobs_shown, uint64_t *last) {
  size_t folders;
  TRY(statedir_job_folders(jobs_fd, jobs_shown, last, &folders));
  int fd = open(db_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  int lost = fd < 0 ? errno == ENOENT : fstat(fd, &st) == 0 && st.st_size == 0;   /* SQLite takes an empty file for a new database */
  if (fd < 0 && errno != ENOENT) return fsdp_set_error(FSDP_ERR_IO, "cannot open %s: %s", db_path, strerror(errno));
  if (lost && folders) {
    if (fd >= 0) close(fd);
    return fsdp_set_error(FSDP_ERR_STATE, "the job database %s is %s, but %s holds %zu job folders (the newest %" PRIu64
                          "): fsdpd does not start without the history they belong to, or it would give their ids "
                          "and folders again; restore the database from a backup, or move %s aside to start with an "
                          "empty history", db_path, fd < 0 ? "missing" : "empty", jobs_shown, folders, *last, jobs_shown);
  }
  if (fd < 0) fd = open(db_path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", db_path, strerror(errno));
  /* Private whatever the umask: the state directory may be passable (0711), and the database holds
   * every user's job files. SQLite gives its -wal and -shm files the database's mode. */
  fsdp_status rc = FSDP_OK;
  if (fchmod(fd, 0600) != 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot make %s private: %s", db_path, strerror(errno));
  close(fd);
  return rc;
}
