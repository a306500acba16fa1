/* fsutil — the file-system calls that the daemon, the workers and fsdpctl share, written so that a
 * process running as root is never turned on someone else's files through a link planted in a
 * directory that another user can write (docs/operations.md, "Files and links").
 *
 * The pattern: open a directory once (fsutil_dir_open: one component at a time, O_NOFOLLOW), then
 * create, replace and remove names relative to that descriptor (openat, renameat, unlinkat), so that
 * nothing swapped in along the path afterwards can redirect a write:
 *   - a file is replaced through an fsutil_atomic: NAME.tmp is created with O_EXCL | O_NOFOLLOW (a
 *     stale one, file or link, is unlinked first, never followed), written, fsync'ed, renamed over
 *     NAME (a link at NAME is replaced, not followed), and the directory is fsync'ed;
 *   - an append-only log is opened with O_NOFOLLOW and must be a regular file with one link;
 *   - a tree is removed through descriptors opened O_NOFOLLOW: a link is removed as a link.
 *
 * Links along a path. FSUTIL_TRUSTED_LINKS (the paths users name: checkpoint and export
 * directories, the state directory) follows a link only when no other user can have planted or
 * swapped it: the link belongs to root or to the caller's effective user, and so does the directory
 * holding it, which no one else may write (no group or world write bit, unless sticky, as /tmp).
 * Other links are refused with one line naming them. FSUTIL_NO_LINKS (below a directory the caller
 * owns, such as the daemon's state directory) follows none. FSUTIL_READER_LINKS (reading what a user
 * names: models, tokenizers, data) follows a link only when it belongs to the reader (the effective
 * user) or root, wherever it is: a link another user planted never turns a read onto the reader's
 * files (fs.protected_symlinks' rule, without its exception for links in directories that are not
 * sticky and world-writable).
 *
 * Reading as root for someone else. With fsutil_reads_own_tree(1) (fsdpctl sets it), a root caller
 * reads only files that are root's alone: the file belongs to root and no one else may write it, and
 * so does every directory above it (sticky ones, as /tmp, pass), so that nothing another user could
 * read is copied out and nothing they could swap is read. Another user's tree is refused with one line
 * naming the file and its owner.
 *
 * Stateless: any thread may call these; an fsutil_atomic belongs to one thread at a time. Errors are
 * recorded with fsdp_set_error and name the path.
 */
#ifndef FSDP_FSUTIL_H
#define FSDP_FSUTIL_H

#include <limits.h>
#include <stdio.h>
#include <sys/types.h>

#include "err.h"

typedef enum { FSUTIL_TRUSTED_LINKS = 0, FSUTIL_NO_LINKS = 1, FSUTIL_READER_LINKS = 2 } fsutil_links;

/* ---- directories ---- */

/* Open the directory PATH, relative to AT (AT_FDCWD or a directory descriptor; an absolute PATH
 * ignores it), one component at a time with O_NOFOLLOW, following links only as LINKS allows.
 * CREATE 0: every component must exist; otherwise missing ones are created, parents 0755 and the
 * last CREATE (an existing directory keeps its mode). *OUT: O_RDONLY | O_DIRECTORY | O_CLOEXEC,
 * good for the *at calls, fsync, fstat and flock; the caller closes it. */
fsdp_status fsutil_dir_open(int at, const char *path, mode_t create, fsutil_links links, int *out);
/* fsutil_dir_open(AT_FDCWD, PATH, MODE, FSUTIL_TRUSTED_LINKS) and close: mkdir -p. */
fsdp_status fsutil_mkdir_p(const char *path, mode_t mode);
/* Open the directory holding PATH (as fsutil_dir_open, not created) and point *NAME into PATH at
 * its last component: a name, never "", "." or ".." (trailing slashes, which do not count, stay in
 * *NAME: callers pass file paths, or cut them). */
fsdp_status fsutil_parent_open(const char *path, fsutil_links links, int *dirfd, const char **name);
/* fsync the directory DIRFD (SHOWN names it in the error). */
fsdp_status fsutil_fsync_dir(int dirfd, const char *shown);

/* ---- writing ---- */

/* Write exactly N bytes to FD (retrying short writes and EINTR); SHOWN names the file in the error. */
fsdp_status fsutil_write_full(int fd, const void *buf, size_t n, const char *shown);

/* Replacing NAME in a directory atomically: readers see the old file or the whole new one. */
typedef struct fsutil_atomic {
  int dirfd;                 /* the directory; closed by commit/abort when own_dir */
  int own_dir;
  int fd;                    /* NAME.tmp, open for writing; -1 once closed */
  FILE *fp;                  /* fsutil_atomic_stream's stream over fd, or NULL */
  char name[NAME_MAX + 1], tmp[NAME_MAX + 1];
  char shown[PATH_MAX];      /* the final path, for messages */
} fsutil_atomic;

#define FSUTIL_ATOMIC_INIT {.dirfd = -1, .fd = -1}

/* Create DIRFD/NAME.tmp (O_CREAT | O_EXCL | O_NOFOLLOW, MODE less the umask), unlinking a stale
 * NAME.tmp first. DIRFD is borrowed; DIR_SHOWN is its path for messages. On failure nothing is
 * left to release. */
fsdp_status fsutil_atomic_begin(int dirfd, const char *dir_shown, const char *name, mode_t mode, fsutil_atomic *a);
/* The same for PATH, whose directory must exist and is opened with FSUTIL_TRUSTED_LINKS (and
 * owned by A until commit or abort). */
fsdp_status fsutil_atomic_open(const char *path, mode_t mode, fsutil_atomic *a);
/* A stdio stream over A->fd, owned by A (never fclose it); NULL with errno set on failure. */
FILE *fsutil_atomic_stream(fsutil_atomic *a);
/* Flush, fsync and close the temporary, rename it over NAME (renameat: a link at NAME is replaced,
 * not followed) and fsync the directory. Always releases A: on failure the temporary is removed and
 * NAME is unchanged. */
fsdp_status fsutil_atomic_commit(fsutil_atomic *a);
/* Close and remove the temporary, release A. Safe after commit, after a failed begin and on
 * FSUTIL_ATOMIC_INIT. */
void fsutil_atomic_abort(fsutil_atomic *a);

/* Open NAME in the directory AT (or PATH relative to AT_FDCWD) for appending (O_APPEND | O_CREAT,
 * MODE), never through a link: NAME must be a regular file with one link (a planted link, hard link,
 * FIFO or device is refused); the directories above it are the caller's to trust. SHOWN names it in
 * messages. *FD is O_CLOEXEC. */
fsdp_status fsutil_open_append(int at, const char *name, const char *shown, mode_t mode, int *fd);

/* ---- reading ---- */

/* Open the regular file PATH (relative to AT) for reading, every link on the way followed only as
 * FSUTIL_READER_LINKS allows, a FIFO or device refused (never blocked on), and under
 * fsutil_reads_own_tree a root caller's file root's alone. A refusal names PATH and what is wrong
 * in general terms (never the size or content of what is behind it). A missing file:
 * FSDP_ERR_NOTFOUND; when the open itself failed (FSDP_ERR_NOTFOUND or FSDP_ERR_IO), errno says why.
 * A refused link, a file that is not regular or another user's file: FSDP_ERR_INVALID or
 * FSDP_ERR_DENIED, the message starting with PATH. *FD: O_RDONLY | O_CLOEXEC. */
fsdp_status fsutil_open_read(int at, const char *path, int *fd);
/* PATH opened as fsutil_open_read and read whole: *BUF (malloc'ed, NUL-terminated), *LEN bytes; a file
 * over MAX bytes is refused. */
fsdp_status fsutil_read_all(int at, const char *path, size_t max, char **buf, size_t *len);
/* Set once, before any thread starts: a root caller's reads take root's files only (above). */
void fsutil_reads_own_tree(int on);
/* Under fsutil_reads_own_tree, a root caller's directory DIRFD (SHOWN) and every directory above it
 * are root's and writable by no one else (sticky ones pass); else FSDP_OK. For trees read through
 * their own descriptors (checkpoints). */
fsdp_status fsutil_check_own_tree(int dirfd, const char *shown);

/* ---- an output folder: everything written at one descriptor, all removed on failure ---- */

typedef struct fsutil_out {
  int dirfd;                 /* the folder: every file is created at it (fsutil_atomic_begin) */
  int parentfd;              /* the folder above, while the folder is ours to remove; else -1 */
  char name[NAME_MAX + 1];   /* the folder's name in parentfd */
  char shown[PATH_MAX];      /* the folder's path, for messages */
  char (*files)[NAME_MAX + 1];
  int nfiles, cap;
} fsutil_out;

#define FSUTIL_OUT_INIT {.dirfd = -1, .parentfd = -1}

/* The folder DIR, opened once: created (0755 less the umask; its parent through trusted links), or an
 * existing empty directory, which must be no link. */
fsdp_status fsutil_out_dir(const char *dir, fsutil_out *o);
/* The existing directory holding the file PATH, opened once (trusted links); *NAME points at PATH's
 * last component. */
fsdp_status fsutil_out_parent(const char *path, fsutil_out *o, const char **name);
/* NAME has been written at O->dirfd (by the caller's own writer): fsutil_out_discard removes it.
 * Claimed only once written, so that a failure never removes a file that was there before. */
fsdp_status fsutil_out_claim(fsutil_out *o, const char *name);
/* Write TEXT (LEN bytes) as NAME in the folder through an fsutil_atomic, then claim it. */
fsdp_status fsutil_out_write(fsutil_out *o, const char *name, const void *text, size_t len, mode_t mode);
/* The command failed: remove every claimed file and, when fsutil_out_dir created the folder, the
 * folder (only if nothing else is in it); release O. */
void fsutil_out_discard(fsutil_out *o);
/* The command succeeded: release O, keeping what it wrote. Safe on FSUTIL_OUT_INIT. */
void fsutil_out_close(fsutil_out *o);

/* ---- removing ---- */

/* Remove NAME from DIRFD and, when it is a directory, everything under it, through descriptors
 * opened with O_NOFOLLOW: a link is removed as a link and what it points to is untouched. A
 * missing NAME is fine. Goes on past failures; returns the first. SHOWN names NAME in errors. */
fsdp_status fsutil_remove_at(int dirfd, const char *name, const char *shown);
/* fsutil_remove_at on PATH (its directory opened with FSUTIL_TRUSTED_LINKS). */
fsdp_status fsutil_remove_tree(const char *path);

/* ---- trust (sshd's StrictModes) ---- */

/* The file or directory FD (SHOWN) belongs to root or the caller's effective user and no one else
 * can write it (no group or world write bit); else FSDP_ERR_INVALID, one line: path, owner, mode. */
fsdp_status fsutil_check_private(int fd, const char *shown);
/* Every directory above the directory FD (SHOWN), up to /, belongs to root or the caller and is not
 * group- or world-writable unless sticky: no one else can move SHOWN away or put another in its
 * place. */
fsdp_status fsutil_check_parents(int fd, const char *shown);

#endif
