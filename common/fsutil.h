/* fsutil — the few file-system helpers that the daemon, fsdpctl and the checkpoint code share:
 * creating a directory with its parents and removing a directory tree.
 *
 * Stateless; any thread may call them. Errors are recorded with fsdp_set_error.
 */
#ifndef FSDP_FSUTIL_H
#define FSDP_FSUTIL_H

#include <sys/types.h>

#include "err.h"

/* Create PATH and any missing parents (parents mode 0755, PATH itself MODE). An existing
 * directory is fine; its mode is left as it is. */
fsdp_status fsutil_mkdir_p(const char *path, mode_t mode);
/* Remove DIR and everything under it, without following symbolic links. Errors are ignored: what
 * can be removed is. */
void fsutil_remove_tree(const char *dir);

#endif
