/* sample — text from a trained model: `fsdp-worker --sample MODEL ...`, which `fsdpctl sample`
 * runs (the CLI never links worker code). One process, one rank, the synchronous CPU device.
 *
 * MODEL is a checkpoint directory (its root: the newest complete step; or one step-* directory),
 * a Hugging Face model folder (config.json of transformers 4 or 5, one or many safetensors files), or
 * a .safetensors file (or index) with its config.json beside it.
 * Without a tokenizer.json the prompt is bytes, each byte one token (byte-level models,
 * vocab_size ≥ 256; a byte outside a smaller vocabulary is an error). Each new token comes from the
 * logits of the last position of the window (the last seq_len tokens): temperature 0 is greedy (the
 * lowest id wins ties); otherwise softmax(logits / temperature) restricted to the top_k most likely
 * (0: all), drawn with the counter-based generator keyed by (seed, token index), so the same seed
 * gives the same text.
 * With a tokenizer.json (--tokenizer FILE|DIR, else the tokenizer.json of a model folder or beside
 * an exported .safetensors file, for models whose vocabulary is not bytes) the prompt is encoded by
 * it, with its special tokens, and the continuation decoded by it.
 * Output on stdout: the continuation only, as text when the vocabulary is bytes (vocab_size 256),
 * with a tokenizer.json, or with --tokenizer llm.c's GPT-2 tokenizer file, else as token ids, one
 * line. With --logits: the logits of every prompt position instead, as one JSON array of arrays (for
 * comparisons with other implementations).
 * A LoRA job's checkpoint samples from its base (read again from the files the job read, refused when
 * their content hash changed) with the adapters merged in fp32, as peft's merge_and_unload; --adapter
 * DIR merges a PEFT LoRA folder into any MODEL the same way. */
#ifndef FSDP_SAMPLE_H
#define FSDP_SAMPLE_H

#include <stdint.h>

#include "plan.h"

typedef struct sample_args {
  const char *model;       /* checkpoint dir, step-* dir or .safetensors */
  const char *prompt;      /* bytes */
  const char *tokenizer;   /* llm.c tokenizer file, tokenizer.json or a folder; NULL: the model's */
  int tokens;              /* to generate, ≥ 1 */
  double temperature;      /* ≥ 0 */
  int top_k;               /* ≥ 0 */
  unsigned long long seed;
  int logits;              /* print the logits of every prompt position (JSON) instead of sampling */
  const char *prompt_ids;  /* the prompt as token ids ("1 2 3", what fsdpctl sample --chat encoded) */
  const char *stop_ids;    /* ids that end the continuation (not printed), e.g. a chat turn's end */
  const char *adapter;     /* a PEFT LoRA folder merged into the model first (peft_merge), or NULL */
} sample_args;

/* Returns the process exit status: 0, or 2 with one line on stderr for bad input, 1 otherwise. */
int sample_run(const sample_args *a);

/* Tokens ids[plen..total) continuing ids[0..plen), from the whole model PARAM (host, the layout of
 * P: a world-1 plan of batch 1), on a synchronous CPU device of its own. Used by sample_run and by
 * training's [eval] sample_every (rank 0, on the gathered model). With STOP (NSTOP ids; NULL: none)
 * the generation ends at the first of them: *END (may be NULL) is where the continuation ends, the
 * stop token excluded (TOTAL when none came). */
fsdp_status sample_generate(const plan_t *p, const float *param, int *ids, int plen, int total, double temperature,
                            int top_k, uint64_t seed, const int *stop, int nstop, int *end);
/* The prompt's bytes as token ids into IDS (NULL: only check), *N of them; an error names a byte
 * outside a vocabulary of V. */
fsdp_status sample_prompt_ids(const char *prompt, int V, int *ids, int *n);

#endif
