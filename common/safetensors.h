/* safetensors — read and write Hugging Face .safetensors files (F32 and BF16), and move whole
 * models between them and the FSDP shard layout of a plan.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"NAME": {"dtype": "F32", "shape": [768, 2304], "data_offsets": [BEGIN, END]}, ...,
 *    "__metadata__": {"format": "pt"}}
 * (parsed with jansson), then the data buffer: every tensor's bytes, row-major little-endian, at
 * [BEGIN, END) of the buffer, tensors contiguous with no holes and no overlap.
 *
 * Reading: st_open() maps the file read-only and validates every entry up front (dtype F32 or
 * BF16, shape, offsets in bounds, contiguous, sizes matching, total size equal to the file size),
 * so the readers never meet a malformed entry. Names are Hugging Face's, with or without the
 * model's prefix: a lookup of "wte.weight" finds "transformer.wte.weight" (GPT-2) and
 * "model.layers.0.input_layernorm.weight" finds "layers.0.input_layernorm.weight" (Llama), and the
 * other way round (an exact match wins). Readers convert BF16 to F32. An st_file is immutable once opened:
 * any number of threads may read from it concurrently; the opener frees it with st_destroy().
 *
 * Writing: an st_writer collects tensors (it references the caller's data, which must stay valid
 * and unchanged until st_writer_finish()), then writes the header with keys in sorted order, the
 * data in the order added, the header padded with spaces to a multiple of 8 bytes; to PATH.tmp
 * (created O_EXCL | O_NOFOLLOW: never through a link), fsynced, then renamed over PATH. F32 round-trips bit-exactly; F32 → BF16 rounds to nearest even.
 *
 * Plan-aware helpers: st_load_shard() fills one rank's concatenated shard of a plan straight from
 * the file, reading only the ranges that intersect the rank's shard; st_save_units() writes full
 * (gathered) unit buffers as one consolidated model with Hugging Face names. Tied lm_head: GPT-2's
 * output projection is wte, so no "lm_head.weight" is written, and one found in a file is ignored;
 * Llama's lm_head is its own tensor, read and written. A file of the other architecture (told by
 * wte.weight / model.embed_tokens.weight) is refused with a message that says so.
 */
#ifndef FSDP_SAFETENSORS_H
#define FSDP_SAFETENSORS_H

#include <stdint.h>

#include "err.h"
#include "plan.h"

#define ST_MAX_DIM 8                  /* dimensions a tensor may have (0 = a scalar) */
#define ST_MAX_HEADER 100000000ull    /* the header-size cap of the reference implementation */

typedef enum { ST_F32 = 0, ST_BF16 } st_dtype;
const char *st_dtype_name(st_dtype d);   /* "F32", "BF16" */

typedef struct st_file st_file;

fsdp_status st_open(const char *path, st_file **out);
void st_destroy(st_file **f);

/* Tensors in the order of their data in the file; i in [0, st_count). */
int st_count(const st_file *f);
const char *st_name(const st_file *f, int i);          /* as stored, prefix included */
st_dtype st_tensor_dtype(const st_file *f, int i);
int st_ndim(const st_file *f, int i);
const int64_t *st_shape(const st_file *f, int i);      /* st_ndim entries */
int64_t st_numel(const st_file *f, int i);
/* Index of NAME (with or without "transformer." or "model."), or -1. */
int st_find(const st_file *f, const char *name);

/* Read a whole tensor as F32; its shape must be exactly SHAPE[NDIM] (the error says expected and
 * found). */
fsdp_status st_read(const st_file *f, const char *name, const int64_t *shape, int ndim, float *dst);
/* Elements [first, first + count) of a tensor, flattened row-major, as F32. */
fsdp_status st_read_range(const st_file *f, const char *name, int64_t first, int64_t count,
                          float *dst);

typedef struct st_writer st_writer;

fsdp_status st_writer_new(const char *path, st_writer **out);
/* A writer of the file NAME in the directory DIRFD (borrowed; it must stay open until finish), so that
 * nothing swapped in along the directory's path redirects the write; DIR_SHOWN names it in messages. */
fsdp_status st_writer_new_at(int dirfd, const char *dir_shown, const char *name, st_writer **out);
/* Add a tensor: DTYPE "F32" or "BF16"; DATA (F32, numel = Π shape) is referenced, not copied. */
fsdp_status st_writer_add(st_writer *w, const char *name, const char *dtype, const int64_t *shape,
                          int ndim, const float *data);
/* Write the file and free the writer (also on failure, which leaves no file behind). */
fsdp_status st_writer_finish(st_writer **w);
/* Free a writer without writing anything. */
void st_writer_destroy(st_writer **w);

/* Fill rank RANK's concatenated shard (p->shard_total floats) from F: unit u's shard starts at
 * p->units[u].shard_base and covers elements [plan_shard_offset(p, u, rank), + shard_numel) of the
 * unit's flat buffer; padding is 0. Every tensor of the plan must be present with its shape. */
fsdp_status st_load_shard(const st_file *f, const plan_t *p, int rank, float *shard);
/* The same over a model in several files (st_model.h): LOOKUP(CTX, NAME, NEED, &F, &WHERE) sets *WHERE to
 * the listing it searched (for messages) and *F to the opened file holding tensor NAME when NEED (the
 * tensor intersects the shard; always when SHARD is NULL), else NULL; it returns FSDP_ERR_NOTFOUND,
 * with no message, when no file holds NAME. SHARD NULL checks every tensor's presence and shape and
 * fills nothing. */
typedef fsdp_status (*st_lookup_fn)(void *ctx, const char *name, int need, const st_file **f, const char **where);
fsdp_status st_load_shard_with(const plan_t *p, int rank, float *shard, st_lookup_fn lookup, void *ctx);
/* FSDP_OK when tensor NAME of the weights WHERE is one of P's, DUP (st_tied_head's copy of a tied
 * head; NULL for none), or a buffer transformers saves that no model trains (GPT-2's attn.bias masks,
 * rotary_emb.inv_freq); else the refusal naming it: a file holding a tensor the job's model lacks (a
 * bias, a q/k norm) is another model, never trained without it. st_load_shard checks every name of its
 * file. */
fsdp_status st_check_used(const plan_t *p, const char *where, const char *name, const char *dup);
/* The file LOOKUP (as st_load_shard_with's) finds holding tensor NAME, opened, and its index there
 * (*I); *I = -1 when none holds it. */
fsdp_status st_lookup_entry(st_lookup_fn lookup, void *ctx, const char *name, const st_file **f, int *i);
/* Whether tensor IA of FA and IB of FB are equal (*SAME: the same shape and every element the same
 * value, as torch.equal; read in chunks). */
fsdp_status st_equal(const st_file *fa, int ia, const st_file *fb, int ib, int *same);
/* A tied P's head in its weights (LOOKUP as st_load_shard_with's): when they also hold the head the
 * architecture names (arch.h's tie_pair[1]) equal to the embedding, as many published tied
 * checkpoints do and transformers ties into one tensor, *DUP = its name (the copy, read by no one);
 * a different one is refused (another model: an untied head); *DUP = NULL otherwise. */
fsdp_status st_tied_head(const plan_t *p, st_lookup_fn lookup, void *ctx, const char **dup);
/* Whether the weights CTX (a file, an index) hold tensor NAME (with or without the model's prefix). */
typedef int (*st_has_fn)(const void *ctx, const char *name);
/* Weights of another architecture, told by their names, refused before any tensor is missed (a Phi-3
 * file has Llama's embed_tokens, but its fused qkv_proj tells it); then a tied job's head (*DUP as
 * st_tied_head's) and the architecture's own file check (arch.h: a head tied or not, never train a
 * head other than the weights'). WHERE names the weights in messages; HAS tells which names they hold
 * and LOOKUP (as st_load_shard_with's) opens them, both over CTX. st_load_shard runs it on its file,
 * st_model on an index. */
fsdp_status st_check_arch(const plan_t *p, const char *where, st_has_fn has, st_lookup_fn lookup, void *ctx,
                          const char **dup);
/* NAME without GPT2LMHeadModel's "transformer." or LlamaForCausalLM's "model." */
const char *st_bare_name(const char *name);
/* Write every tensor of the full unit buffers UNITS[u] (p->units[u].numel floats at least) to
 * PATH as F32 with its plan name (GPT-2: no prefix; Llama: LlamaForCausalLM's, "model." included). */
fsdp_status st_save_units(const char *path, const plan_t *p, float *const *units);
/* The same as NAME in the directory DIRFD (see st_writer_new_at). */
fsdp_status st_save_units_at(int dirfd, const char *dir_shown, const char *name, const plan_t *p, float *const *units);

/* The conversions used above, exposed for tests and for the CUDA side's host code. */
static inline float st_bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } v = {(uint32_t)h << 16};
  return v.f;
}
static inline uint16_t st_f32_to_bf16(float x) {
  union { float f; uint32_t u; } v = {x};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);  /* quiet NaN */
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);                  /* nearest even */
}

#endif
