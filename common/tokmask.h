/* tokmask — token files that carry a loss mask and document starts (gen-data --chat): the llm.c
 * header with version TOK_VERSION_U16_MASKED (magic 20240520, uint16 tokens) or
 * TOK_VERSION_U32_MASKED (magic 20240801, uint32 tokens), header[2] the token count N, then the N
 * tokens, then two bitmaps of ⌈N/8⌉ bytes each: the mask (bit i, least significant first in byte
 * i/8, is 1 when token i is trained: it is a loss target) and the document starts (bit i is 1 when
 * token i begins a document, a conversation). docs/data.md describes the format; tok_open()
 * (common/tokens.h) reads them in rows of whole documents (tok_set_rows).
 * Plain functions: any thread; the caller owns what it passes and what it is given.
 */
#ifndef FSDP_TOKMASK_H
#define FSDP_TOKMASK_H

#include <stdint.h>

#include "err.h"

/* Write N tokens with their MASK and STARTS (one byte per token, 0 or 1) to PATH (PATH.tmp,
 * fsynced, renamed; never through a link). uint16 when VOCAB ≤ 65536; every token < VOCAB. */
fsdp_status tokmask_write(const char *path, const uint32_t *tokens, const uint8_t *mask, const uint8_t *starts,
                          int64_t n, int vocab);
/* FSDP_OK unless the token files PATHS names (one path or glob per line, as jobspec stores [data]
 * train and val) mix masked and plain files, or PACK is 0 ([data] pack = false) and they are plain
 * (no documents to put one per row); else FSDP_ERR_INVALID with one line naming KEY and the file,
 * for fsdpctl plan, submit and run to refuse before a job starts (the workers refuse the same).
 * Files that cannot be read are left to the job file check and the workers. */
fsdp_status tokmask_check_files(const char *key, const char *paths, int pack);
/* Read such a file: malloc'd arrays (one byte per token for MASK and STARTS), *N tokens. */
fsdp_status tokmask_read(const char *path, uint32_t **tokens, uint8_t **mask, uint8_t **starts, int64_t *n);

#endif
