/* ckpt_rankfile — one rank file of a checkpoint: its format (the layout in ckpt_rankfile.c: the header
 * the writer fills and the reader validates, the page-aligned sections) and its reader, beside the
 * step directory every file of a checkpoint lies in. The lowest layer of the checkpoint files: ckpt.c
 * (a full job's shards, the writer), ckpt_lora.c (a LoRA job's adapters) and ckpt_manifest.c call it,
 * and it calls none of them. It also defines ckpt.h's ckpt_crc32c, ckpt_section_name, ckpt_step_dir
 * and ckpt_rank_file_bytes. Not for other modules: they use ckpt.h. Pure file I/O over caller-owned
 * buffers; any thread. */
#ifndef FSDP_CKPT_RANKFILE_H
#define FSDP_CKPT_RANKFILE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "err.h"

/* ---- the step directory ---- */

/* The checkpoint directory DIR (followed only through links no other user can have planted) and its
 * step directory (never through a link), created when CREATE. *DIRFD may be NULL. */
fsdp_status ckpt_open_step_dir(const char *dir, int step, int create, int *dirfd, int *stepfd);
/* Open file NAME of step STEP's directory for reading, through no link; SHOWN gets its path. */
fsdp_status ckpt_open_in_step(const char *dir, int step, const char *name, int *fd, char *shown, size_t cap);

/* ---- the format ---- */

#define CKPT_PAGE 4096   /* every section starts on a page (aligned, O_DIRECT writes) */
/* X rounded up to a page. */
uint64_t ckpt_rankfile_page_up(uint64_t x);
/* The header's bytes for NUNITS units; the first section starts at it rounded up to a page. */
size_t ckpt_rankfile_header_bytes(int nunits);
/* The header (HB bytes) of RANK's file of plan P, its first section at OFF, without the sections'
 * CRC32Cs (ckpt_rankfile_set_crc, as each section ends) or its own (ckpt_rankfile_seal, last). */
void ckpt_rankfile_header(uint8_t *h, size_t hb, const plan_t *p, int rank, int step, int64_t opt_step, uint64_t off);
void ckpt_rankfile_set_crc(uint8_t *h, int s, uint32_t crc);
void ckpt_rankfile_seal(uint8_t *h, size_t hb);
/* The shape a header holds (n_layer, n_head, n_embd, vocab_size, seq_len) is the same in A and B. */
int ckpt_shape_eq(const model_config *a, const model_config *b);

/* ---- reading ---- */

/* One rank file open for reading: its sections' places, lengths and CRC32Cs from its header. */
typedef struct rank_file {
  int fd;
  char path[PATH_MAX + 32];
  uint64_t sec_off[CKPT_NSEC], sec_len[CKPT_NSEC];
  uint32_t sec_crc[CKPT_NSEC];
  int64_t opt_step;
} rank_file;
/* Open rank Q's file and validate its header against the manifest CI and the writer's plan OLD. */
fsdp_status ckpt_rankfile_open(const char *dir, const ckpt_info *ci, const plan_t *old, int q, rank_file *f);
void ckpt_rankfile_close(rank_file *f);
/* Read section S of F whole into BUF (or stream it when BUF is NULL) and check its CRC32C. */
fsdp_status ckpt_rankfile_read_section(rank_file *f, int s, void *buf);
/* Read N bytes at OFF of F (a part of a section: no CRC32C checked; ckpt_verify covers it). */
fsdp_status ckpt_rankfile_pread(const rank_file *f, void *buf, size_t n, uint64_t off);

#endif
