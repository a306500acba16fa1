/* st_model — a model's weights in one .safetensors file or in the shards a Hugging Face
 * model.safetensors.index.json lists ({"metadata": {...}, "weight_map": {"NAME": "FILE", ...}}), read into
 * a plan's shards.
 *
 * st_model_open() reads the index (or notes the one file) and opens no shard; files are opened (st_open:
 * mapped, header validated) when a tensor they hold is first needed and stay open until
 * st_model_destroy(). So st_model_load_shard() opens only the files that hold a tensor intersecting the
 * rank's shard, and reads only those byte ranges; every other tensor of the plan is checked to be
 * listed (a tied model whose weights also hold the head: both tensors are read, to check them equal,
 * safetensors.h's st_tied_head). st_model_check() opens every file and checks every tensor of a plan (present, shape; dtypes
 * are checked when a file opens), for `fsdpctl plan` and the daemon's submit, so a mismatch is refused
 * before any worker starts. An index gets one file's architecture checks (safetensors.h's st_check_arch)
 * over the names it lists. A shard file is a plain name in the index's directory ("/" and ".." are
 * refused). One owner, one thread at a time.
 */
#ifndef FSDP_ST_MODEL_H
#define FSDP_ST_MODEL_H

#include "err.h"
#include "plan.h"
#include "safetensors.h"

typedef struct st_model st_model;

/* PATH: a .safetensors file or a .safetensors.index.json. */
fsdp_status st_model_open(const char *path, st_model **out);
void st_model_destroy(st_model **m);

/* The files the model is in, and how many of them have been opened so far. */
int st_model_nfiles(const st_model *m);
int st_model_opened(const st_model *m);

/* Fill RANK's concatenated shard of P (see st_load_shard). */
fsdp_status st_model_load_shard(st_model *m, const plan_t *p, int rank, float *shard);
/* Every tensor of P present with its shape, in files fsdpd reads. */
fsdp_status st_model_check(st_model *m, const plan_t *p);
/* A config that ties M's head (tie_word_embeddings) over the weights WEIGHTS: transformers 5 ties the
 * head it finds there (arch.h's tie_pair) only to an equal embedding, and otherwise loads both. *UNTIE
 * = 1 for the latter when the architecture has an untied form (the model is untied); 0 and FSDP_OK
 * otherwise (an equal head is read as the tied model's copy, st_tied_head), and for weights it cannot
 * read (their own check, st_model_check, refuses them). */
fsdp_status st_model_untie(const char *weights, const model_config *m, int *untie);
/* st_model_open + st_model_check + st_model_destroy of PATH. */
fsdp_status st_model_check_path(const char *path, const plan_t *p);

#endif
