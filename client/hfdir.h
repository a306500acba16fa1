/* hfdir — a Hugging Face model folder written from fsdpd's whole model (`fsdpctl export CKPT -o DIR`):
 * config.json, the weights as model.safetensors or, above the shard size, as
 * model-0000K-of-0000N.safetensors with model.safetensors.index.json (split as transformers splits:
 * tensors in order, a new file when the next one would pass the size, a tensor larger than it alone in
 * its own), and the source folder's tokenizer files, so that AutoModelForCausalLM and AutoTokenizer load
 * the folder as it is.
 *
 * The folder is an fsutil_out: opened once (created, or an existing empty directory that is no link) and
 * every file written at its descriptor as NAME.tmp (created new: O_EXCL, O_NOFOLLOW), synced and renamed,
 * so that nothing swapped in along its path afterwards redirects a write; a failure removes everything
 * written. The source folder's config and tokenizer files are read as fsutil_open_read allows (no other
 * user's link; run as root, root's own files only). Single-threaded tool code.
 */
#ifndef FSDP_HFDIR_H
#define FSDP_HFDIR_H

#include <stdint.h>

#include "err.h"
#include "fsutil.h"
#include "plan.h"

typedef struct hfdir_opts {
  dtype_kind dtype;        /* of the weights */
  uint64_t max_shard;      /* bytes per weights file (transformers' max_shard_size) */
  const char *source;      /* the folder the model came from ([model] from): its config and tokenizer; NULL none */
} hfdir_opts;

/* Transformers 5's save_pretrained default max_shard_size, "50GB". */
#define HFDIR_MAX_SHARD_DEFAULT 50000000000ull

/* Write the folder DIR from the full unit buffers UNITS of P (a world-1 plan). *NFILES: weights files.
 * On failure nothing of it is left (fsutil_out_discard). */
fsdp_status hfdir_write(const char *dir, const plan_t *p, float *const *units, const hfdir_opts *o, int *nfiles);
/* The same into the open output folder OUT, which the caller discards or closes (so that more files can
 * join it and go with it on a later failure). */
fsdp_status hfdir_write_to(fsutil_out *out, const plan_t *p, float *const *units, const hfdir_opts *o, int *nfiles);

/* The dtype of the weights in the folder SRC by its config.json ("bfloat16": bf16, else fp32). */
dtype_kind hfdir_source_dtype(const char *src);

#endif
