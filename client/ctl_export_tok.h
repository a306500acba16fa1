/* ctl_export_tok — `fsdpctl export --tokenizer FILE|DIR`: the tokenizer files that go with an
 * exported model, copied into its folder so that transformers' AutoTokenizer and `fsdpctl sample`
 * find them. Called by ctl_export.c on the CLI's thread. */
#ifndef FSDP_CTL_EXPORT_TOK_H
#define FSDP_CTL_EXPORT_TOK_H

#include <stddef.h>

#include "err.h"
#include "fsutil.h"

/* Copies SRC (a tokenizer.json, or a folder's tokenizer.json with its tokenizer_config.json and
 * special_tokens_map.json when present) into the output folder OUT, which owns what it writes (a
 * later failure removes them). Each file is read as fsutil_open_read allows (no other user's link;
 * run as root, root's own files only) and written new at OUT's descriptor (never through a link). The
 * tokenizer.json must load (common/bpe): what fsdpd cannot use is refused before it is written. NAMES
 * gets the copied file names, comma-separated. */
fsdp_status export_tokenizer(const char *src, fsutil_out *out, char *names, size_t n);

#endif
