/* ctl_export_tok — `fsdpctl export --tokenizer FILE|DIR`: the tokenizer files that go with an
 * exported model, copied into its folder so that transformers' AutoTokenizer and `fsdpctl sample`
 * find them. Called by ctl_export.c on the CLI's thread. */
#ifndef FSDP_CTL_EXPORT_TOK_H
#define FSDP_CTL_EXPORT_TOK_H

#include <stddef.h>

#include "err.h"

/* Copies SRC (a tokenizer.json, or a folder's tokenizer.json with its tokenizer_config.json and
 * special_tokens_map.json when present) into the folder OUTDIR. The tokenizer.json must load
 * (common/bpe): what fsdpd cannot use is refused before anything is written. Each file is written
 * to a new temporary file (never through a link) and renamed. NAMES gets the copied file names,
 * comma-separated. */
fsdp_status export_tokenizer(const char *src, const char *outdir, char *names, size_t n);

#endif
