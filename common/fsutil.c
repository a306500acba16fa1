/* fsutil — see fsutil.h. */
#define _GNU_SOURCE   /* O_PATH */
#include "fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_LINKS 16   /* links followed in one fsutil_dir_open, as the kernel's 40, but smaller */

/* ---- directories ---- */

static int trusted_uid(uid_t u) { return u == 0 || u == geteuid(); }

/* Others than root and the caller can change the directory ST: create, rename or delete in it. */
static int others_can_change(const struct stat *st) {
  return !trusted_uid(st->st_uid) || ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX));
}

static const char *user_name(uid_t u, char *buf, size_t n) {
  struct passwd pw, *res = NULL;
  char tmp[1024];
  if (getpwuid_r(u, &pw, tmp, sizeof tmp, &res) == 0 && res) snprintf(buf, n, "%s (uid %u)", pw.pw_name, (unsigned)u);
  else snprintf(buf, n, "uid %u", (unsigned)u);
  return buf;
}

/* A link that the reader did not make (nor root): refused, its target never looked at. */
static fsdp_status untrusted_link(const char *shown, const struct stat *lst) {
  char who[160], me[160];
  return fsdp_set_error(FSDP_ERR_INVALID, "%s is a symbolic link owned by %s, who is not the reader (%s) or root; "
                        "refusing to follow it: name the real path", shown, user_name(lst->st_uid, who, sizeof who),
                        user_name(geteuid(), me, sizeof me));
}

typedef struct walk_st {
  mode_t create;
  fsutil_links links;
  int nlinks;
} walk_st;

static fsdp_status walk(walk_st *w, int at, const char *path, int final, int *out);

/* Follow the link NAME (status LST) found in directory DIR, if no one else can have put it there. */
static fsdp_status walk_link(walk_st *w, int dir, const char *name, const struct stat *lst, const char *shown,
                             int final, int *out) {
  char who[160];
  if (w->links == FSUTIL_NO_LINKS)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s is a symbolic link (owned by %s); refusing to follow it: nothing here "
                          "is opened through a link", shown, user_name(lst->st_uid, who, sizeof who));
  struct stat dst;
  if (fstat(dir, &dst) != 0) return fsdp_set_error(FSDP_ERR_IO, "cannot stat the directory of %s: %s", shown, strerror(errno));
  if (w->links == FSUTIL_READER_LINKS && !trusted_uid(lst->st_uid)) return untrusted_link(shown, lst);
  if (!trusted_uid(lst->st_uid) || (w->links == FSUTIL_TRUSTED_LINKS && others_can_change(&dst)))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s is a symbolic link owned by %s in a directory that others can write "
                          "(owner uid %u, mode %04o); refusing to follow it: name the real path", shown,
                          user_name(lst->st_uid, who, sizeof who), (unsigned)dst.st_uid, (unsigned)(dst.st_mode & 07777));
  if (++w->nlinks > MAX_LINKS) return fsdp_set_error(FSDP_ERR_INVALID, "%s: too many levels of symbolic links", shown);
  char target[PATH_MAX];
  ssize_t n = readlinkat(dir, name, target, sizeof target - 1);
  if (n < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot read the link %s: %s", shown, strerror(errno));
  target[n] = '\0';
  return walk(w, dir, target, final, out);
}

/* Open component NAME of directory DIR (FINAL: O_RDONLY, else O_PATH), creating it when asked. */
static fsdp_status walk_step(walk_st *w, int dir, const char *name, int final, const char *shown, int *out) {
  int oflags = (final ? O_RDONLY : O_PATH) | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  int fd = openat(dir, name, oflags);
  if (fd < 0 && errno == ENOENT && w->create) {
    if (mkdirat(dir, name, final ? w->create : 0755) != 0 && errno != EEXIST)
      return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", shown, strerror(errno));
    fd = openat(dir, name, oflags);
  }
  if (fd >= 0) {
    *out = fd;
    return FSDP_OK;
  }
  int e = errno;
  struct stat st;
  if ((e == ELOOP || e == ENOTDIR) && fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
    return walk_link(w, dir, name, &st, shown, final, out);
  if (e == ENOTDIR) return fsdp_set_error(FSDP_ERR_INVALID, "%s is not a directory", shown);
  if (e == ENOENT) return fsdp_set_error(FSDP_ERR_NOTFOUND, "%s does not exist", shown);
  return fsdp_set_error(FSDP_ERR_IO, "cannot open %s: %s", shown, strerror(e));
}

static fsdp_status walk(walk_st *w, int at, const char *path, int final, int *out) {
  char buf[PATH_MAX], shown[PATH_MAX];
  if (!*path) return fsdp_set_error(FSDP_ERR_INVALID, "an empty path names no directory");
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return fsdp_set_error(FSDP_ERR_RANGE, "path %.64s... is too long", path);
  int cur = openat(at, *path == '/' ? "/" : ".", (final ? O_RDONLY : O_PATH) | O_DIRECTORY | O_CLOEXEC);
  if (cur < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot open the directory that %s starts from: %s", path, strerror(errno));
  char *save = NULL, *comp = strtok_r(buf, "/", &save);
  while (comp) {
    char *next = strtok_r(NULL, "/", &save);
    snprintf(shown, sizeof shown, "%.*s", (int)(comp - buf + (ptrdiff_t)strlen(comp)), path);
    int fd = -1;
    fsdp_status rc = walk_step(w, cur, comp, final && !next, shown, &fd);
    close(cur);
    if (rc != FSDP_OK) return rc;
    cur = fd;
    comp = next;
  }
  *out = cur;
  return FSDP_OK;
}

fsdp_status fsutil_dir_open(int at, const char *path, mode_t create, fsutil_links links, int *out) {
  walk_st w = {.create = create, .links = links};
  *out = -1;
  return walk(&w, at, path, 1, out);
}

fsdp_status fsutil_mkdir_p(const char *path, mode_t mode) {
  int fd;
  TRY(fsutil_dir_open(AT_FDCWD, path, mode, FSUTIL_TRUSTED_LINKS, &fd));
  close(fd);
  return FSDP_OK;
}

fsdp_status fsutil_parent_open(const char *path, fsutil_links links, int *dirfd, const char **name) {
  char dir[PATH_MAX];
  size_t len = strlen(path);
  while (len > 1 && path[len - 1] == '/') len--;
  size_t base = len;
  while (base > 0 && path[base - 1] != '/') base--;
  size_t blen = len - base;
  if (blen == 0 || blen > NAME_MAX || (blen == 1 && path[base] == '.') || (blen == 2 && !strncmp(path + base, "..", 2)))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s does not name a file in a directory", path);
  if (base >= sizeof dir) return fsdp_set_error(FSDP_ERR_RANGE, "path %.64s... is too long", path);
  if (base == 0) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", (int)base, path);
  TRY(fsutil_dir_open(AT_FDCWD, dir, 0, links, dirfd));
  *name = path + base;   /* may keep trailing slashes: callers pass file paths */
  return FSDP_OK;
}

fsdp_status fsutil_fsync_dir(int dirfd, const char *shown) {
  if (fsync(dirfd) != 0) return fsdp_set_error(FSDP_ERR_IO, "cannot fsync %s: %s", shown, strerror(errno));
  return FSDP_OK;
}

/* ---- writing ---- */

fsdp_status fsutil_write_full(int fd, const void *buf, size_t n, const char *shown) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", shown, strerror(w < 0 ? errno : EIO));
    p += w, n -= (size_t)w;
  }
  return FSDP_OK;
}

fsdp_status fsutil_atomic_begin(int dirfd, const char *dir_shown, const char *name, mode_t mode, fsutil_atomic *a) {
  memset(a, 0, sizeof *a);
  a->fd = -1;
  a->dirfd = dirfd;
  snprintf(a->shown, sizeof a->shown, "%s/%s", dir_shown, name);
  if (!*name || strchr(name, '/') || snprintf(a->name, sizeof a->name, "%s", name) >= (int)sizeof a->name ||
      snprintf(a->tmp, sizeof a->tmp, "%s.tmp", name) >= (int)sizeof a->tmp)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: '%s' is not a file name of up to %d bytes", a->shown, name, NAME_MAX - 4);
  const int oflags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  a->fd = openat(dirfd, a->tmp, oflags, mode);
  if (a->fd < 0 && errno == EEXIST) {   /* a stale temporary (a crash, or planted): removed, never written through */
    if (unlinkat(dirfd, a->tmp, 0) != 0 && errno != ENOENT)
      return fsdp_set_error(FSDP_ERR_IO, "cannot remove the stale %s.tmp: %s", a->shown, strerror(errno));
    a->fd = openat(dirfd, a->tmp, oflags, mode);
  }
  if (a->fd < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot create %s.tmp: %s", a->shown, strerror(errno));
  return FSDP_OK;
}

fsdp_status fsutil_atomic_open(const char *path, mode_t mode, fsutil_atomic *a) {
  int dirfd;
  const char *name;
  memset(a, 0, sizeof *a);
  a->fd = a->dirfd = -1;
  fsdp_status rc = fsutil_parent_open(path, FSUTIL_TRUSTED_LINKS, &dirfd, &name);
  if (rc == FSDP_ERR_NOTFOUND) {   /* "cannot create out/x.bin.tmp: out does not exist" */
    char why[1024];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_set_error(rc, "cannot create %s.tmp: %s", path, why);
  }
  TRY(rc);
  char dir[PATH_MAX];
  size_t dlen = (size_t)(name - path);
  while (dlen > 1 && path[dlen - 1] == '/') dlen--;
  if (dlen == 0) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", (int)dlen, path);
  rc = fsutil_atomic_begin(dirfd, dir, name, mode, a);
  if (rc != FSDP_OK) {
    a->dirfd = -1;
    close(dirfd);
    return rc;
  }
  snprintf(a->shown, sizeof a->shown, "%s", path);
  a->own_dir = 1;
  return FSDP_OK;
}

FILE *fsutil_atomic_stream(fsutil_atomic *a) {
  if (!a->fp && a->fd >= 0) a->fp = fdopen(a->fd, "w");
  return a->fp;
}

static void atomic_release(fsutil_atomic *a, int remove_tmp) {
  int was_open = a->fp || a->fd >= 0;
  if (a->fp) fclose(a->fp);
  else if (a->fd >= 0) close(a->fd);
  if (remove_tmp && was_open) unlinkat(a->dirfd, a->tmp, 0);
  a->fp = NULL;
  a->fd = -1;
  if (a->own_dir && a->dirfd >= 0) close(a->dirfd);
  a->own_dir = 0;
  a->dirfd = -1;
}

fsdp_status fsutil_atomic_commit(fsutil_atomic *a) {
  if (a->fd < 0) return fsdp_set_error(FSDP_ERR_STATE, "%s: nothing to commit", a->shown);
  fsdp_status rc = FSDP_OK;
  if (a->fp && fflush(a->fp) != 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", a->shown, strerror(errno));
  if (rc == FSDP_OK && fsync(a->fd) != 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot fsync %s: %s", a->shown, strerror(errno));
  int closed = a->fp ? fclose(a->fp) : close(a->fd);
  int e = errno;
  a->fp = NULL;
  a->fd = -1;
  if (rc == FSDP_OK && closed != 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", a->shown, strerror(e));
  if (rc == FSDP_OK && renameat(a->dirfd, a->tmp, a->dirfd, a->name) != 0)
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot rename %s.tmp to %s: %s", a->shown, a->name, strerror(errno));
  if (rc != FSDP_OK) unlinkat(a->dirfd, a->tmp, 0);
  else if (fsync(a->dirfd) != 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot fsync the directory of %s: %s", a->shown, strerror(errno));
  atomic_release(a, 0);
  return rc;
}

void fsutil_atomic_abort(fsutil_atomic *a) { atomic_release(a, 1); }

fsdp_status fsutil_open_append(int at, const char *name, const char *shown, mode_t mode, int *fd) {
  /* O_NONBLOCK: a planted FIFO fails (ENXIO) instead of blocking; no effect on a regular file */
  *fd = openat(at, name, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
  if (*fd < 0) {
    if (errno == ELOOP) return fsdp_set_error(FSDP_ERR_INVALID, "%s is a symbolic link; refusing to write through it", shown);
    return fsdp_set_error(FSDP_ERR_IO, "cannot open %s: %s", shown, strerror(errno));
  }
  struct stat st;
  if (fstat(*fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1) return FSDP_OK;
  close(*fd);
  *fd = -1;
  return fsdp_set_error(FSDP_ERR_INVALID, "%s is not a regular file with a single link; refusing to write to it", shown);
}

/* ---- reading ---- */

static int reads_own_tree;

static fsdp_status own_tree_refusal(const char *shown, const struct stat *st) {
  char who[160];
  return fsdp_set_error(FSDP_ERR_DENIED, "%s is owned by %s with mode %04o: as root, fsdpctl reads only what root alone "
                        "owns and can change; run it as the owner (sudo -u OWNER fsdpctl ...)", shown,
                        user_name(st->st_uid, who, sizeof who), (unsigned)(st->st_mode & 07777));
}

void fsutil_reads_own_tree(int on) { reads_own_tree = on; }

fsdp_status fsutil_check_own_tree(int dirfd, const char *shown) {
  if (!reads_own_tree || geteuid() != 0) return FSDP_OK;
  struct stat st;
  if (fstat(dirfd, &st) != 0) return fsdp_set_error(FSDP_ERR_IO, "cannot stat %s: %s", shown, strerror(errno));
  if (others_can_change(&st)) return own_tree_refusal(shown, &st);
  return fsutil_check_parents(dirfd, shown);
}

/* Under fsutil_reads_own_tree, root reads the file FD (in directory DIRFD) only when it is root's alone.
 * A refused directory is named by where it is (its descriptor's path), not by SHOWN, the file. */
static fsdp_status check_read_tree(int fd, int dirfd, const char *shown) {
  if (!reads_own_tree || geteuid() != 0) return FSDP_OK;
  struct stat st;
  if (fstat(fd, &st) != 0) return fsdp_set_error(FSDP_ERR_IO, "cannot stat %s: %s", shown, strerror(errno));
  if (st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH))) return own_tree_refusal(shown, &st);
  char proc[64], dir[PATH_MAX];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", dirfd);
  ssize_t n = readlink(proc, dir, sizeof dir - 1);
  if (n > 0) dir[n] = '\0';
  else snprintf(dir, sizeof dir, "the directory of %s", shown);
  return fsutil_check_own_tree(dirfd, dir);
}

/* PATH's directory part in DIR ("." when none) and its last component in NAME. */
static fsdp_status split_file_path(const char *path, char *dir, size_t n, char name[NAME_MAX + 1]) {
  size_t len = strlen(path), base = len;
  while (base > 0 && path[base - 1] != '/') base--;
  size_t blen = len - base;
  if (blen == 0 || blen > NAME_MAX || (blen == 1 && path[base] == '.') || (blen == 2 && !strncmp(path + base, "..", 2)))
    return fsdp_set_error(FSDP_ERR_INVALID, "%s does not name a file in a directory", path);
  if (base >= n) return fsdp_set_error(FSDP_ERR_RANGE, "path %.64s... is too long", path);
  if (base == 0) snprintf(dir, n, ".");
  else snprintf(dir, n, "%.*s", (int)base, path);
  snprintf(name, NAME_MAX + 1, "%s", path + base);
  return FSDP_OK;
}

static fsdp_status open_read(int at, const char *path, const char *shown, int depth, int *out) {
  char dir[PATH_MAX], name[NAME_MAX + 1];
  int dfd = -1;
  if (depth > MAX_LINKS) return fsdp_set_error(FSDP_ERR_INVALID, "%s: too many levels of symbolic links", shown);
  TRY(split_file_path(path, dir, sizeof dir, name));
  /* O_PATH all the way: a directory the reader may pass through but not list (0711) is fine, as for open(2) */
  walk_st w = {.links = FSUTIL_READER_LINKS};
  fsdp_status rc = walk(&w, at, dir, 0, &dfd);
  if (rc != FSDP_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_set_error(rc, "cannot read %s: %s", shown, why);
  }
  /* O_NONBLOCK: a FIFO put in its place fails the regular-file check instead of blocking the open */
  int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 && errno == ELOOP && fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
    char target[PATH_MAX];
    ssize_t n;
    if (!trusted_uid(st.st_uid)) rc = untrusted_link(shown, &st);
    else if ((n = readlinkat(dfd, name, target, sizeof target - 1)) < 0)
      rc = fsdp_set_error(FSDP_ERR_IO, "cannot read the link %s: %s", shown, strerror(errno));
    else {
      target[n] = '\0';
      rc = open_read(dfd, target, shown, depth + 1, out);
    }
    close(dfd);
    return rc;
  }
  if (fd < 0) {
    int e = errno;
    rc = fsdp_set_error(e == ENOENT ? FSDP_ERR_NOTFOUND : FSDP_ERR_IO, "cannot open %s: %s", shown, strerror(e));
    close(dfd);
    errno = e;   /* for callers that word their own line (fsutil.h) */
    return rc;
  } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    rc = fsdp_set_error(FSDP_ERR_INVALID, "%s is not a regular file", shown);
  } else if (fcntl(fd, F_SETFL, 0) != 0) {
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", shown, strerror(errno));
  } else {
    rc = check_read_tree(fd, dfd, shown);
  }
  close(dfd);
  if (rc != FSDP_OK && fd >= 0) close(fd);
  if (rc == FSDP_OK) *out = fd;
  return rc;
}

fsdp_status fsutil_open_read(int at, const char *path, int *fd) {
  *fd = -1;
  return open_read(at, path, path, 0, fd);
}

fsdp_status fsutil_read_all(int at, const char *path, size_t max, char **buf, size_t *len) {
  int fd;
  *buf = NULL;
  *len = 0;
  TRY(fsutil_open_read(at, path, &fd));
  struct stat st;
  fsdp_status rc = FSDP_OK;
  char *b = NULL;
  size_t off = 0;
  if (fstat(fd, &st) != 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  else if ((unsigned long long)st.st_size > (unsigned long long)max) rc = fsdp_set_error(FSDP_ERR_RANGE, "%s is larger than the %zu bytes allowed", path, max);
  else if (!(b = malloc((size_t)st.st_size + 1))) rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", path);
  while (rc == FSDP_OK && off < (size_t)st.st_size) {
    ssize_t r = read(fd, b + off, (size_t)st.st_size - off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", path, r < 0 ? strerror(errno) : "it shrank");
    else off += (size_t)r;
  }
  close(fd);
  if (rc != FSDP_OK) {
    free(b);
    return rc;
  }
  b[off] = '\0';
  *buf = b;
  *len = off;
  return FSDP_OK;
}

/* ---- an output folder ---- */

static fsdp_status dir_is_empty(int dirfd, const char *shown) {
  int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", shown, strerror(errno));
  }
  struct dirent *e;
  int empty = 1;
  while (empty && (e = readdir(d))) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
  closedir(d);
  if (!empty)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s is not empty; allowed: a new folder, or an empty one (an export never "
                          "mixes its files with others)", shown);
  return FSDP_OK;
}

/* fsutil_parent_open for creating PATH: "cannot create out/x.bin: out does not exist". */
static fsdp_status parent_for_create(const char *path, int *dirfd, const char **name) {
  fsdp_status rc = fsutil_parent_open(path, FSUTIL_TRUSTED_LINKS, dirfd, name);
  if (rc == FSDP_ERR_NOTFOUND) {
    char why[1024];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_set_error(rc, "cannot create %s: %s", path, why);
  }
  return rc;
}

fsdp_status fsutil_out_dir(const char *dir, fsutil_out *o) {
  *o = (fsutil_out)FSUTIL_OUT_INIT;
  const char *name;
  char base[NAME_MAX + 1];
  snprintf(o->shown, sizeof o->shown, "%s", dir);
  int pfd;
  TRY(parent_for_create(dir, &pfd, &name));
  snprintf(base, sizeof base, "%.*s", (int)strcspn(name, "/"), name);
  fsdp_status rc = FSDP_OK;
  int created = mkdirat(pfd, base, 0755) == 0;
  if (!created && errno != EEXIST) rc = fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
  if (rc == FSDP_OK && (o->dirfd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
    rc = errno == ELOOP || errno == ENOTDIR
             ? fsdp_set_error(FSDP_ERR_INVALID, "%s exists and is not a directory (a link is not followed); allowed: a "
                              "new folder, or an empty one", dir)
             : fsdp_set_error(FSDP_ERR_IO, "cannot open %s: %s", dir, strerror(errno));
  if (rc == FSDP_OK && !created) rc = dir_is_empty(o->dirfd, dir);
  if (rc != FSDP_OK) {
    if (o->dirfd >= 0) close(o->dirfd);
    if (created) unlinkat(pfd, base, AT_REMOVEDIR);
    close(pfd);
    *o = (fsutil_out)FSUTIL_OUT_INIT;
    return rc;
  }
  if (created) {
    o->parentfd = pfd;
    snprintf(o->name, sizeof o->name, "%s", base);
  } else {
    close(pfd);
  }
  return FSDP_OK;
}

fsdp_status fsutil_out_parent(const char *path, fsutil_out *o, const char **name) {
  *o = (fsutil_out)FSUTIL_OUT_INIT;
  TRY(parent_for_create(path, &o->dirfd, name));
  size_t dlen = (size_t)(*name - path);
  while (dlen > 1 && path[dlen - 1] == '/') dlen--;
  if (dlen == 0) snprintf(o->shown, sizeof o->shown, ".");
  else snprintf(o->shown, sizeof o->shown, "%.*s", (int)dlen, path);
  return FSDP_OK;
}

fsdp_status fsutil_out_claim(fsutil_out *o, const char *name) {
  if (!*name || strchr(name, '/') || strlen(name) > NAME_MAX - 4)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s: '%s' is not a file name of up to %d bytes", o->shown, name, NAME_MAX - 4);
  for (int i = 0; i < o->nfiles; i++)
    if (!strcmp(o->files[i], name)) return FSDP_OK;
  if (o->nfiles == o->cap) {
    int cap = o->cap ? 2 * o->cap : 16;
    void *f = realloc(o->files, (size_t)cap * sizeof *o->files);
    if (!f) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory writing %s", o->shown);
    o->files = f;
    o->cap = cap;
  }
  snprintf(o->files[o->nfiles++], NAME_MAX + 1, "%s", name);
  return FSDP_OK;
}

fsdp_status fsutil_out_write(fsutil_out *o, const char *name, const void *text, size_t len, mode_t mode) {
  fsutil_atomic a;
  TRY(fsutil_atomic_begin(o->dirfd, o->shown, name, mode, &a));
  fsdp_status rc = fsutil_write_full(a.fd, text, len, a.shown);
  if (rc == FSDP_OK) rc = fsutil_atomic_commit(&a);
  fsutil_atomic_abort(&a);
  return rc == FSDP_OK ? fsutil_out_claim(o, name) : rc;
}

void fsutil_out_discard(fsutil_out *o) {
  for (int i = 0; o->dirfd >= 0 && i < o->nfiles; i++) unlinkat(o->dirfd, o->files[i], 0);
  /* the folder goes only if it is the one created and now empty: AT_REMOVEDIR refuses anything else */
  if (o->parentfd >= 0 && o->dirfd >= 0) {
    struct stat a, b;
    if (fstat(o->dirfd, &a) == 0 && fstatat(o->parentfd, o->name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
        a.st_dev == b.st_dev && a.st_ino == b.st_ino)
      unlinkat(o->parentfd, o->name, AT_REMOVEDIR);
  }
  fsutil_out_close(o);
}

void fsutil_out_close(fsutil_out *o) {
  if (o->dirfd >= 0) close(o->dirfd);
  if (o->parentfd >= 0) close(o->parentfd);
  free(o->files);
  *o = (fsutil_out)FSUTIL_OUT_INIT;
}

/* ---- removing ---- */

fsdp_status fsutil_remove_at(int at, const char *name, const char *shown) {
  int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return FSDP_OK;
    if (errno != ELOOP && errno != ENOTDIR) return fsdp_set_error(FSDP_ERR_IO, "cannot open %s: %s", shown, strerror(errno));
    if (unlinkat(at, name, 0) != 0 && errno != ENOENT)   /* a file or a link: the entry itself */
      return fsdp_set_error(FSDP_ERR_IO, "cannot delete %s: %s", shown, strerror(errno));
    return FSDP_OK;
  }
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", shown, strerror(errno));
  }
  fsdp_status rc = FSDP_OK;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char sub[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/%s", shown, e->d_name);
    fsdp_status r = fsutil_remove_at(dirfd(d), e->d_name, sub);
    if (rc == FSDP_OK) rc = r;
  }
  closedir(d);
  if (unlinkat(at, name, AT_REMOVEDIR) != 0 && errno != ENOENT && rc == FSDP_OK)
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot delete %s: %s", shown, strerror(errno));
  return rc;
}

fsdp_status fsutil_remove_tree(const char *path) {
  int dirfd;
  const char *name;
  TRY(fsutil_parent_open(path, FSUTIL_TRUSTED_LINKS, &dirfd, &name));
  char base[NAME_MAX + 1];
  snprintf(base, sizeof base, "%.*s", (int)strcspn(name, "/"), name);
  fsdp_status rc = fsutil_remove_at(dirfd, base, path);
  close(dirfd);
  return rc;
}

/* ---- trust ---- */

fsdp_status fsutil_check_private(int fd, const char *shown) {
  struct stat st;
  if (fstat(fd, &st) != 0) return fsdp_set_error(FSDP_ERR_IO, "cannot stat %s: %s", shown, strerror(errno));
  if (trusted_uid(st.st_uid) && !(st.st_mode & (S_IWGRP | S_IWOTH))) return FSDP_OK;
  char who[160], me[200] = "root";
  if (geteuid() != 0) snprintf(me, sizeof me, "%s or root", user_name(geteuid(), who, sizeof who));
  return fsdp_set_error(FSDP_ERR_INVALID, "%s is owned by %s with mode %04o: it must belong to %s and be writable by "
                        "its owner only (chown, chmod go-w)", shown, user_name(st.st_uid, who, sizeof who),
                        (unsigned)(st.st_mode & 07777), me);
}

fsdp_status fsutil_check_parents(int fd, const char *shown) {
  char *real = realpath(shown, NULL);   /* names for messages only; the checks go through "..". */
  char name[PATH_MAX];
  snprintf(name, sizeof name, "%s", real ? real : shown);
  free(real);
  struct stat cur, up;
  if (fstat(fd, &cur) != 0) return fsdp_set_error(FSDP_ERR_IO, "cannot stat %s: %s", shown, strerror(errno));
  int dir = openat(fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  fsdp_status rc = FSDP_OK;
  while (rc == FSDP_OK && dir >= 0) {
    int parent = openat(dir, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
    close(dir);
    dir = parent;
    char *slash = strrchr(name, '/');
    if (slash == name) name[1] = '\0';
    else if (slash) *slash = '\0';
    if (parent < 0 || fstat(parent, &up) != 0) {
      rc = fsdp_set_error(FSDP_ERR_IO, "cannot stat the directory above %s: %s", shown, strerror(errno));
      break;
    }
    if (up.st_dev == cur.st_dev && up.st_ino == cur.st_ino) break;   /* "/" is its own parent */
    if (others_can_change(&up)) {
      char who[160];
      rc = fsdp_set_error(FSDP_ERR_INVALID, "%s, above %s, is owned by %s with mode %04o: another user could replace "
                          "what it holds; it must belong to root or %s's owner and not be writable by others (or be "
                          "sticky, as /tmp)", name, shown, user_name(up.st_uid, who, sizeof who),
                          (unsigned)(up.st_mode & 07777), shown);
    }
    cur = up;
  }
  if (dir >= 0) close(dir);
  return rc;
}
