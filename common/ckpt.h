/* ckpt — the checkpoint format: one file per rank plus a manifest written last (docs/checkpoints.md).
 *
 * A checkpoint of step S is the directory DIR/step-SSSSSSSS/ holding rank-R.bin for every rank R
 * of the world that wrote it, then manifest.json. A rank file is a fixed little-endian header
 * (magic, version, step, rank, world, sharding, model config, the plan's shard_total and every
 * unit's padded size, the optimizer step count, and the offset, length and CRC32C of each section;
 * the header carries its own CRC32C) followed by three sections of shard_total fp32 values each:
 * the parameter shard, AdamW m and AdamW v. The manifest is written by rank 0 only after every rank
 * has fsync'ed its file (the caller's barrier), through a temporary file, fsync, rename and a
 * directory fsync: a step directory without manifest.json is not a checkpoint and is ignored.
 *
 * Loading maps through the plans, so a checkpoint loads into any world size and sharding mode of
 * the same model: each unit's unpadded flat buffer is the same whatever the layout; the writer's
 * plan is rebuilt from the manifest (plan_build), and a rank reads (pread) only the ranges of the
 * old rank files that intersect its new shard. A section read whole has its CRC checked there;
 * partial reads are covered by ckpt_verify(), which the ranks split between them (runtime_restore).
 *
 * Files are opened through fsutil: DIR is followed only through links no other user can have
 * planted, a step directory and the files in it never through a link; rank files and the manifest
 * are written as fsutil_atomic temporaries (O_EXCL | O_NOFOLLOW, then renameat).
 *
 * Functions here are pure file I/O over caller-owned buffers; any thread, no shared state.
 */
#ifndef FSDP_CKPT_H
#define FSDP_CKPT_H

#include <stddef.h>
#include <pthread.h>
#include <stdint.h>

#include "err.h"
#include "jobspec.h"
#include "plan.h"

#define CKPT_MAGIC "FSDPCKPT"  /* 8 bytes, no NUL on disk */
#define CKPT_VERSION 1
#define CKPT_MANIFEST "manifest.json"

typedef enum { CKPT_SEC_PARAM = 0, CKPT_SEC_M, CKPT_SEC_V, CKPT_NSEC } ckpt_section;
const char *ckpt_section_name(ckpt_section s);   /* "param", "adamw_m", "adamw_v" */

/* CRC32C (Castagnoli, reflected, init and final xor 0xFFFFFFFF) continuing from CRC (0 to start):
 * ckpt_crc32c(0, "123456789", 9) == 0xE3069283, and crc(a‖b) == ckpt_crc32c(ckpt_crc32c(0, a), b).
 * ISA-L's crc32_iscsi() underneath. */
uint32_t ckpt_crc32c(uint32_t crc, const void *buf, size_t len);

/* Whether a checkpoint follows step STEP of SPEC: [checkpoint] every = K > 0 with a dir, and STEP is
 * a multiple of K or the last step. The one rule: the coordinator sets step_cmd.checkpoint from it,
 * and standalone workers follow it. */
int ckpt_due(const jobspec_t *spec, int step);

/* DIR/step-SSSSSSSS into OUT. */
void ckpt_step_dir(const char *dir, int step, char *out, size_t cap);
/* Under fsutil_reads_own_tree (fsdpctl's export and sample) a root caller reads only root's own
 * checkpoints: step STEP's directory and every directory above it, DIR included, root's and writable
 * by no one else (fsutil_check_own_tree). FSDP_OK for anyone else. */
fsdp_status ckpt_check_own_tree(const char *dir, int step);

/* The frozen base a LoRA checkpoint's adapters were trained over ([model] init and [job] seed):
 * its weights' files, or "random" and the seed, and their content hash (ckpt_base_of). */
#define CKPT_HASH_MAX 64
typedef struct ckpt_base {
  char init[JOBSPEC_PATH_MAX];   /* "random" or the .safetensors file or index the base was read from */
  uint64_t seed;                 /* what a "random" base is drawn from */
  char hash[CKPT_HASH_MAX];      /* "crc32c:XXXXXXXX:BYTES" (see ckpt_base_of), or "random:SEED" */
} ckpt_base;

/* What the manifest of one checkpoint says. */
typedef struct ckpt_info {
  int step;                 /* optimizer steps done */
  int world;                /* ranks that wrote it: rank-0.bin .. rank-(world-1).bin */
  shard_mode sharding;
  model_config model;
  uint64_t tokens;          /* tokens consumed by steps 1..step */
  int batch_size, grad_accum;
  int64_t rows_per_step;    /* N·B·G of the run that wrote it: the data order continues when equal */
  char source[JOBSPEC_PATH_MAX];   /* the Hugging Face folder the model came from ([model] from), or "" */
  /* A LoRA job's checkpoint (lora.rank ≥ 1): its files hold the adapters and their AdamW state in
   * plan_lora_segment's layout for `world` writers (one whole file, or one shard per rank of a
   * shard group), not the frozen base, which BASE identifies. */
  struct {
    int rank;
    double alpha;
    char targets[JOBSPEC_TEXT_MAX];   /* the adapted modules' paths, comma-separated, in the plan's order */
    int nf4;                          /* [lora] base_dtype = nf4 (QLoRA): the base merged into is its NF4 dequantization */
    int64_t numel;
  } lora;
  ckpt_base base;
} ckpt_info;

/* Write RANK's file of step STEP under DIR (creating DIR and the step directory), fsync'ed.
 * PARAM, M and V are the rank's shards (p->shard_total floats each). */
fsdp_status ckpt_write_rank(const char *dir, const plan_t *p, int rank, int step, int64_t opt_step,
                            const float *param, const float *m, const float *v);
/* The same in steps, for a writer that may change hands between chunks (ckpt_async: the training
 * thread finishes what its background writer began): begin creates the temporary file, each next
 * writes one chunk of at most CKPT_CHUNK bytes (*MORE: 0 once every section is written), commit
 * writes the header, fsyncs and renames; free releases W (the temporary removed if uncommitted).
 * One thread at a time; PARAM, M and V must stay unchanged until commit or free (or until
 * ckpt_writer_move_rest moves what is left). */
#define CKPT_CHUNK (16u << 20)
typedef struct ckpt_writer ckpt_writer;
fsdp_status ckpt_writer_begin(const char *dir, const plan_t *p, int rank, int step, int64_t opt_step,
                              const float *param, const float *m, const float *v, ckpt_writer **w);
fsdp_status ckpt_writer_next(ckpt_writer *w, int *more);
/* Chunks read their section holding MU from now on (and write, so that a holder of MU knows no read
 * is in progress); the test hooks run outside it. */
void ckpt_writer_guard(ckpt_writer *w, pthread_mutex_t *mu);
/* Where W reads its sections from now on, without a copy: the same bytes elsewhere, or before its
 * first chunk. */
void ckpt_writer_sources(ckpt_writer *w, const float *const src[CKPT_NSEC]);
/* The sections' bytes not yet written, copied to DST (buffers of a section's length, at the same
 * offsets), from which W reads from now on: a write that began from memory about to change goes on
 * from a copy of what it has left. The bytes copied. */
uint64_t ckpt_writer_move_rest(ckpt_writer *w, float *const dst[CKPT_NSEC]);
fsdp_status ckpt_writer_commit(ckpt_writer *w);
void ckpt_writer_free(ckpt_writer **w);
/* The size of a rank file of plan P. */
uint64_t ckpt_rank_file_bytes(const plan_t *p);
/* Rank 0, once every rank's ckpt_write_rank returned: write the manifest (temp + fsync + rename +
 * directory fsync), making the checkpoint exist. */
fsdp_status ckpt_write_manifest(const char *dir, const plan_t *p, int step, uint64_t tokens);
/* The same with the rows per step (N·B·G) of the run that trained it, where P is not that run's plan:
 * a hybrid job saves one group's shards as the checkpoint of a full-sharding job of G ranks, a LoRA
 * job its adapters as the checkpoint of plan_lora_segment's writers, with BASE (else NULL). */
fsdp_status ckpt_write_manifest_rows(const char *dir, const plan_t *p, int step, uint64_t tokens, int64_t rows_per_step,
                                     const ckpt_base *base);
/* Delete all but the KEEP newest complete checkpoints, and step directories without a manifest
 * older than the newest complete one (left by a crash). A step-* entry that is a link is removed as
 * a link: what it points to is never touched. */
fsdp_status ckpt_prune(const char *dir, int keep);
/* Remove step STEP's directory, which holds no complete checkpoint (a save that failed): every file
 * in it, never through a link. */
fsdp_status ckpt_discard(const char *dir, int step);
/* Withdraw step STEP's checkpoint: delete its manifest (so that it no longer exists) and sync. */
fsdp_status ckpt_withdraw(const char *dir, int step);
/* The newest complete checkpoint in DIR: FSDP_ERR_NOTFOUND when there is none (or no DIR). */
fsdp_status ckpt_latest(const char *dir, int *step);
/* Read and validate DIR/step-S/manifest.json. */
fsdp_status ckpt_read_manifest(const char *dir, int step, ckpt_info *out);
/* Read rank files FIRST, FIRST+STRIDE, ... of the checkpoint whole and check their headers and
 * every section's CRC32C. */
fsdp_status ckpt_verify(const char *dir, const ckpt_info *ci, int first, int stride);
/* Whether loading into plan P reads every rank file whole (same world, sharding and layout). */
int ckpt_same_layout(const ckpt_info *ci, const plan_t *p);
/* Fill RANK's shards of plan P (built from SPEC) from the checkpoint CI in DIR, resharding from the
 * writer's layout. The model (every tensor's shape) must match; FSDP_ERR_INVALID otherwise.
 * Every header read is validated; every section read whole has its CRC32C checked. Padding
 * elements are zeroed. *OPT_STEP (may be NULL) gets the optimizer step count. A LoRA checkpoint and
 * a full job's P, or the reverse, are refused (ckpt_lora_check); of LoRA both, ckpt_lora_load reads. */
fsdp_status ckpt_load_shard(const char *dir, const ckpt_info *ci, const jobspec_t *spec, const plan_t *p, int rank,
                            float *param, float *m, float *v, int64_t *opt_step);

/* ---- LoRA checkpoints (ckpt_lora.c) ---- */

/* SPEC's base and its content hash. Of files: CRC32C over each file of the weights in order (the
 * index whole; of each .safetensors file its size, its header whole and its data whole up to 64 MiB,
 * above that 64 samples of 1 MiB spread evenly over it), and their total size. A changed value,
 * dtype, shape, tensor set or size changes it; reading at most 64 MiB a file keeps it cheap beside
 * loading the base (a fine-tune of a big base changes every sample). It detects a base that changed
 * or was replaced, not a forgery. */
fsdp_status ckpt_base_of(const jobspec_t *spec, ckpt_base *out);
/* Whether the LoRA checkpoint CI can resume or serve a job of plan P over BASE: the same [lora]
 * (rank, alpha, targets, and NF4 or not: base_dtype = nf4 against bf16 or fp32) and base (its hash);
 * one line otherwise. A full checkpoint and a LoRA job, or
 * the reverse, are refused too. BASE may be NULL (only [lora] compared). */
fsdp_status ckpt_lora_check(const char *dir, const ckpt_info *ci, const plan_t *p, const ckpt_base *base);
/* Read the adapters (PARAM), their AdamW m and v (each p->lora.numel floats, whole) from the LoRA
 * checkpoint CI (of one writer or of several, scattered into the whole), every section's CRC32C checked;
 * *OPT_STEP (may be NULL) the optimizer's steps. */
fsdp_status ckpt_lora_load(const char *dir, const ckpt_info *ci, const plan_t *p, float *param, float *m, float *v,
                           int64_t *opt_step);
/* The one-rank plan (sharding none, batch BATCH_SIZE) of CI's model and [lora]: fsdpctl export's and
 * sample's layout. */
fsdp_status ckpt_lora_plan(const ckpt_info *ci, int batch_size, plan_t **out);
/* The whole merged model of the LoRA checkpoint CI: *P = ckpt_lora_plan, *WHOLE (p->shard_total floats,
 * malloc'd) the base read from ci->base.init (refused when its hash is no longer the checkpoint's, or
 * when the base was random; QLoRA's: its NF4 dequantization, the blocks' 2-D tensors quantized and
 * dequantized to bf16 and every other tensor rounded to bf16, as the job computed with it) with the
 * adapters merged (peft_merge) in fp32. */
fsdp_status ckpt_lora_merged(const char *dir, const ckpt_info *ci, int batch_size, plan_t **p, float **whole);
/* The manifest's "lora" and "base" objects into O (p->lora.rank ≥ 1), and read back into CI. */
void ckpt_lora_manifest_write(void *o, const plan_t *p, const ckpt_base *base);
fsdp_status ckpt_lora_manifest_read(const void *o, const char *path, ckpt_info *ci);

#endif
