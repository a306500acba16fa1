/* statedir — fsdpd's state directory, checked and locked before the daemon uses it.
 *
 * statedir_open() creates STATE when missing (mode 0700, parents 0755, never through a link that
 * another user can have planted) and refuses it, with one line saying which path, whose and what
 * mode, as sshd's StrictModes does: when STATE or one of its key files (keys/, keys/server.key,
 * keys/server.pub, keys/authorized) belongs to another user or is group- or world-writable, when a
 * directory above STATE is writable by others without the sticky bit, or when one of the daemon's
 * own names in it (fsdpd.log, jobs, jobs.db, keys, run, the sockets...) is a symbolic link.
 *
 * statedir_lock() is the coordinator's single-instance lock: an exclusive flock on the state
 * directory's own descriptor (no file whose deletion would release it). A file system that cannot
 * lock a directory (NFS emulates flock with byte-range locks, which need a file open for writing)
 * gets the old lock on fsdpd.lock instead, which deleting the file defeats; statedir_lock says so.
 * The descriptors are O_CLOEXEC: kept across fork (daemonizing), never inherited by workers.
 * fsdpd.lock holds the pid of the daemon that holds the lock, for the refusal message.
 *
 * statedir_jobs_db_prepare() checks the job database against the job folders before it is opened.
 *
 * main() and the coordinator's start, before the event loop runs.
 */
#ifndef FSDP_STATEDIR_H
#define FSDP_STATEDIR_H

#include <limits.h>
#include <stdint.h>

#include "err.h"

typedef struct statedir {
  int fd;                   /* the directory, O_RDONLY; -1 when closed */
  int lock_fd;              /* fsdpd.lock when the directory itself cannot be locked, else -1 */
  char path[PATH_MAX];
} statedir;

/* Create (if missing) and check PATH; SD->fd stays open. */
fsdp_status statedir_open(const char *path, statedir *sd);
/* Take the lock; FSDP_ERR_STATE with a one-line message naming the holder's pid when another
 * fsdpd holds it. *NOTE (may be NULL): 1 when the fallback on fsdpd.lock was taken. */
fsdp_status statedir_lock(statedir *sd, int *note);
/* Record this process's pid in fsdpd.lock (after detaching: the pid that holds the lock). */
fsdp_status statedir_write_pid(const statedir *sd);
/* Open STATE/fsdpd.log for appending (never through a link). */
fsdp_status statedir_open_log(const statedir *sd, int *fd);
/* STATE/run, created when missing, private to this daemon's user (mode 0700, never a link): the
 * workers' sockets (relay.h). Its path in OUT. */
fsdp_status statedir_run_dir(const statedir *sd, char *out, size_t n);
/* Close the descriptors, releasing the lock. */
void statedir_close(statedir *sd);

/* The job folders in JOBS_FD (STATE/jobs, shown as SHOWN): *COUNT names that are job ids (decimal,
 * from 1), and *LAST the largest (0: none). */
fsdp_status statedir_job_folders(int jobs_fd, const char *shown, uint64_t *last, size_t *count);
/* Before the coordinator opens its job database DB_PATH: a missing or empty database while JOBS_FD
 * holds job folders is FSDP_ERR_STATE (one line: the history was lost; restore it or move jobs/
 * aside), since ids and folders would be given again; a missing one is created (0600, O_EXCL, no
 * link), an existing one made private. *LAST: the newest folder's id, which no new job may take. */
fsdp_status statedir_jobs_db_prepare(const char *db_path, int jobs_fd, const char *jobs_shown, uint64_t *last);

#endif
