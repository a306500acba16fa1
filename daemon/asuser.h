/* asuser — doing something with another user's rights, as Slurm's slurmstepd does for a job.
 *
 * A daemon running as root never opens a file for a job with root's rights: the coordinator's own
 * look at a job's paths (the job file's parse and checks at submit, its weights' check included;
 * withdrawing a checkpoint before a restart) runs through asuser_call in a child process that has the job owner's uid, primary gid
 * and supplementary groups, and the agent starts each worker through `fsdpd --exec-as` (the same
 * switch, then exec), so the worker and everything it opens has the owner's rights and umask.
 * When the daemon is not root it can act only as itself: asuser_call runs FN in this process for
 * the daemon's own user and refuses anyone else (peer_can_run says so at submit already).
 *
 * asuser_call blocks the calling thread until the child ends (a job file's checks: milliseconds).
 */
#ifndef FSDP_DAEMON_ASUSER_H
#define FSDP_DAEMON_ASUSER_H

#include <stddef.h>

#include "err.h"
#include "peer.h"

#define ASUSER_EXEC_FLAG "--exec-as"

/* Run FN(ARG) with WHO's rights; what FN leaves in OUT[0..OUTLEN) and its status and error message
 * come back to the caller. FN must not touch the caller's other state (it runs in a child). */
fsdp_status asuser_call(const peer_t *who, fsdp_status (*fn)(void *arg), void *arg, void *out, size_t outlen);

/* The argv of `fsdpd --exec-as USER UID GID UMASK PROGRAM ARGS...` for SELF (this fsdpd executable),
 * in OUT (n_args + 7 entries); NUMS holds the numbers' text (3 × 24 bytes). */
void asuser_exec_argv(const char *self, const char *user, unsigned uid, unsigned gid, unsigned umask_bits,
                      char *const *args, size_t n_args, char nums[3][24], char **out);
/* fsdpd's main for `--exec-as`: as root take USER's groups, GID and UID (USER must have UID on this
 * host), set HOME, USER and LOGNAME; as anyone else only UID = our own is allowed; then the umask,
 * and exec PROGRAM. Returns (with one line on stderr) only when it cannot. */
int asuser_exec_main(int argc, char **argv);

#endif
