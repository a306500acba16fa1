/* hfdir — a Hugging Face model folder written from fsdpd's whole model (`fsdpctl export CKPT -o DIR`):
 * config.json, the weights as model.safetensors or, above the shard size, as
 * model-0000K-of-0000N.safetensors with model.safetensors.index.json (split as transformers splits:
 * tensors in order, a new file when the next one would pass the size, a tensor larger than it alone in
 * its own), and the source folder's tokenizer files, so that AutoModelForCausalLM and AutoTokenizer load
 * the folder as it is.
 *
 * Every file is written as NAME.tmp in the folder (created new: O_EXCL, O_NOFOLLOW), synced and renamed;
 * the folder is created, or an existing empty directory (not a link) is used. Single-threaded tool code.
 */
#ifndef FSDP_HFDIR_H
#define FSDP_HFDIR_H

#include <stdint.h>

#include "err.h"
#include "plan.h"

typedef struct hfdir_opts {
  dtype_kind dtype;        /* of the weights */
  uint64_t max_shard;      /* bytes per weights file (transformers' max_shard_size) */
  const char *source;      /* the folder the model came from ([model] from): its config and tokenizer; NULL none */
} hfdir_opts;

/* Transformers 5's save_pretrained default max_shard_size, "50GB". */
#define HFDIR_MAX_SHARD_DEFAULT 50000000000ull

/* Write the folder DIR from the full unit buffers UNITS of P (a world-1 plan). *NFILES: weights files. */
fsdp_status hfdir_write(const char *dir, const plan_t *p, float *const *units, const hfdir_opts *o, int *nfiles);

/* The dtype of the weights in the folder SRC by its config.json ("bfloat16": bf16, else fp32). */
dtype_kind hfdir_source_dtype(const char *src);

/* Write TEXT (LEN bytes) as DIR/NAME through DIR/NAME.tmp (O_EXCL, O_NOFOLLOW), fsynced, renamed. */
fsdp_status hfdir_write_file(const char *dir, const char *name, const char *text, size_t len);

#endif
