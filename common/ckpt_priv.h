/* ckpt_priv — what ckpt.c (rank files, finding and pruning) and ckpt_manifest.c (the manifest)
 * share. Not for other modules: they use ckpt.h. */
#ifndef FSDP_CKPT_PRIV_H
#define FSDP_CKPT_PRIV_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
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

/* One rank file open for reading: its sections' places, lengths and CRC32Cs from its header. */
typedef struct rank_file {
  int fd;
  char path[PATH_MAX + 32];
  uint64_t sec_off[CKPT_NSEC], sec_len[CKPT_NSEC];
  uint32_t sec_crc[CKPT_NSEC];
  int64_t opt_step;
} rank_file;
/* Open rank Q's file and validate its header against the manifest CI and the writer's plan OLD. */
fsdp_status ckpt_open_rank(const char *dir, const ckpt_info *ci, const plan_t *old, int q, rank_file *f);
void ckpt_close_rank(rank_file *f);
/* Read section S of F whole into BUF (or stream it when BUF is NULL) and check its CRC32C. */
fsdp_status ckpt_read_section(rank_file *f, int s, void *buf);

#endif
