/* ckpt_priv — what ckpt.c (rank files, finding and pruning) and ckpt_manifest.c (the manifest)
 * share. Not for other modules: they use ckpt.h. */
#ifndef FSDP_CKPT_PRIV_H
#define FSDP_CKPT_PRIV_H

#include <stddef.h>

#include "err.h"

/* The checkpoint directory DIR (followed only through links no other user can have planted) and its
 * step directory (never through a link), created when CREATE. *DIRFD may be NULL. */
fsdp_status ckpt_open_step_dir(const char *dir, int step, int create, int *dirfd, int *stepfd);
/* Open file NAME of step STEP's directory for reading, through no link; SHOWN gets its path. */
fsdp_status ckpt_open_in_step(const char *dir, int step, const char *name, int *fd, char *shown, size_t cap);
/* Where a test may hold a checkpoint writer (POINT: begin, mid, manifest). In fsdpd, fsdp-worker and
 * fsdpctl a no-op (ckpt.c's weak definition); the binaries built for tests link
 * tests/hooks/ckpt_pause.c instead, which holds it as FSDP_TEST_CKPT_PAUSE says. */
void ckpt_test_pause(const char *point, int step, int rank);

#endif
