/* tokens — training data: llm.c token files, the batch order of docs/design.md §6, and the synthetic
 * Markov-chain stream behind `train = synthetic:markov:SEED`.
 *
 * A token file is a 256 × int32 header (magic 20240520, version 1, token count; then uint16 tokens,
 * or magic 20240801, version 7 for uint32 tokens) followed by the tokens, exactly as llm.c's
 * dev/data scripts write them. tok_open() maps a file read-only and validates the header against
 * the file's size; tok_open_markov() builds the same object in memory from a Markov chain. The
 * opener chooses the batch order with tok_set_shuffle() before sharing it; from then on the tok_file
 * is immutable: any number of threads may call tok_count() and tok_batch() on it concurrently. The
 * opener owns it and frees it with tok_destroy().
 *
 * Batch order (docs/design.md §6): with B sequences of T tokens per rank, N ranks and G micro-steps,
 * micro-batch b = step·G + k reads, for rank r, the B·T+1 tokens starting at ((b mod nb)·N + r)·B·T
 * where nb = (ntokens − 1) / (N·B·T); inputs are the first B·T, targets the same shifted by one.
 * So rank r's rows are rows r·B..(r+1)·B−1 of the single-rank batch of N·B rows, and the order
 * depends only on N·B (and b), not on how the rows are split among ranks. This is `shuffle = false`
 * and the order a tok_file has when opened.
 *
 * Shuffled order (`shuffle = true`, tok_set_shuffle(f, 1, seed)): the stream is cut into
 * nw = ⌊ntokens / (T+1)⌋ windows, window w being tokens w·(T+1) .. w·(T+1)+T (the trailing
 * ntokens mod (T+1) tokens are never read). The windows are consumed as one endless sequence of
 * epochs: position p of that sequence is window π_e(p mod nw) with e = ⌊p / nw⌋, where π_e is
 * tok_shuffle_index(seed, e, nw, ·), a permutation of 0..nw−1. Micro-batch b takes positions
 * b·N·B .. (b+1)·N·B − 1 and rank r rows r·B .. (r+1)·B − 1 of those; a row's inputs are its
 * window's first T tokens and its targets the last T. So every window is read once per epoch, the
 * rows depend only on N·B and b, and a resumed job continues the permutation (b is all it needs).
 * The permutation is computed per position (a Feistel network on Philox, cycle-walked into
 * 0..nw−1; docs/data.md gives the exact definition), so no table of nw entries is ever built.
 *
 * Masked files (tokmask.h, gen-data --chat) are read in rows of whole documents instead
 * (tok_set_rows, tok_batch_docs; docs/data.md): pack = true puts documents back to back in rows of T
 * tokens, a document that does not fit starting the next row; pack = false one document per row;
 * the rest of a row is padding (token 0, no target). A row's inputs are its tokens; token t's target
 * is token t+1 when that token is trained (its mask bit) and in the same document, else −1 (no
 * loss). Rows are taken in the order above, with rows for windows: micro-batch b, rank r reads rows
 * ((b mod nb)·N + r)·B .. +B−1 with nb = ⌊nrows / (N·B)⌋ (shuffle = false), or positions
 * b·N·B + r·B + i of the permuted epochs of the nrows rows (shuffle = true). The packing is fixed
 * by the file order; shuffling permutes the rows.
 *
 * The Markov chain: token i has at most TOK_MARKOV_SUCC successors, always including i itself and
 * (i+1) mod V (so the chain is irreducible and aperiodic), the others drawn from the seed, with
 * random probabilities drawn from the seed. Its entropy rate Σ_i π_i H(P_i) (π stationary, computed
 * by power iteration in double) is the lowest mean cross-entropy any model can reach on the stream.
 * The stream is counter-based: token k depends only on (seed, vocab, k and the tokens before it),
 * so a longer stream extends a shorter one. A tok_markov is immutable after tok_markov_new().
 */
#ifndef FSDP_TOKENS_H
#define FSDP_TOKENS_H

#include <stdint.h>

#include "err.h"

#define TOK_HEADER_INTS 256
#define TOK_MAGIC_U16 20240520
#define TOK_VERSION_U16 1
#define TOK_MAGIC_U32 20240801
#define TOK_VERSION_U32 7
#define TOK_MARKOV_SUCC 4      /* successors per token in the synthetic chain */
/* The versions with a loss mask and document starts (common/tokmask.h, gen-data --chat). */
#define TOK_VERSION_U16_MASKED 2
#define TOK_VERSION_U32_MASKED 8

typedef struct tok_file tok_file;

/* Open an llm.c token file: validates magic, version and the token count against the file size. */
fsdp_status tok_open(const char *path, tok_file **out);
/* An in-memory stream of NTOKENS tokens of the Markov chain (SEED, VOCAB). */
fsdp_status tok_open_markov(uint64_t seed, int vocab, int64_t ntokens, tok_file **out);
/* The batch order: SHUFFLE 0 is the sequential order (the default), 1 the shuffled windows keyed
 * by SEED (the job's seed). Call before the tok_file is shared between threads. */
void tok_set_shuffle(tok_file *f, int shuffle, uint64_t seed);
int64_t tok_count(const tok_file *f);
/* Token width in bytes: 2 (uint16 file) or 4 (uint32 file or Markov stream). */
int tok_width(const tok_file *f);
/* Micro-batch MICROBATCH of RANK among WORLD ranks: fills inp[B·T] and targets[B·T] (the order
 * above). Errors: the stream is too short for one batch (WORLD·B·T+1 tokens sequential, WORLD·B
 * windows of T+1 tokens shuffled; the message says how many are needed), or a token ≥ VOCAB
 * (names its position). */
fsdp_status tok_batch(const tok_file *f, int64_t microbatch, int rank, int world, int B, int T,
                      int vocab, int *inp, int *targets);
void tok_destroy(tok_file **f);

/* 1 when F's tokens carry a loss mask and document starts (every file of the stream). */
int tok_masked(const tok_file *f);
/* The rows of a masked stream for sequences of T tokens: PACK 1 packs whole documents, 0 puts one
 * per row (above). Errors: F is not masked (a plain stream has no documents), or a document is
 * longer than T (names it: gen-data --chat truncates or drops those at its --seq-len). Call before
 * the tok_file is shared, with the T that tok_batch_docs will be given. */
fsdp_status tok_set_rows(tok_file *f, int pack, int T);
/* The rows of a masked stream (in a plain one: the batch of tok_batch, every target trained and
 * each row one document): as tok_batch, and SEG[B·T] (NULL: not wanted) gets for each token the
 * index in its row of its document's first token (padding continues the row's last document),
 * *TRAINED (NULL: not wanted) the number of targets ≥ 0. Also an error: T is not tok_set_rows's. */
fsdp_status tok_batch_docs(const tok_file *f, int64_t microbatch, int rank, int world, int B, int T, int vocab,
                           int *inp, int *targets, int32_t *seg, int64_t *trained);
/* Rows of a masked stream after tok_set_rows (0 for a plain one), and its documents. */
int64_t tok_rows(const tok_file *f);
int64_t tok_docs(const tok_file *f);

/* Position K (0 ≤ K < N) of the shuffle permutation of 0..N−1 for (SEED, EPOCH): a bijection of
 * 0..N−1 for every (SEED, EPOCH), N ≤ 2^62. Pure; O(1) memory; any thread. Returns −1 when K or N
 * is out of range. */
int64_t tok_shuffle_index(uint64_t seed, uint64_t epoch, int64_t n, int64_t k);

/* Write N tokens as an llm.c token file: uint16 when vocab ≤ 65536, else uint32. Every token must
 * be < VOCAB. Written to PATH.tmp, fsynced, then renamed to PATH. */
fsdp_status tok_write(const char *path, const uint32_t *tokens, int64_t n, int vocab);
/* The same as NAME in the directory DIRFD (borrowed; DIR_SHOWN names it), so that nothing swapped in
 * along the directory's path redirects the write. */
fsdp_status tok_write_at(int dirfd, const char *dir_shown, const char *name, const uint32_t *tokens, int64_t n, int vocab);

typedef struct tok_markov tok_markov;

fsdp_status tok_markov_new(uint64_t seed, int vocab, tok_markov **out);
/* Entropy rate in nats per token: Σ_i π_i H(P_i), π the stationary distribution. */
double tok_markov_entropy(const tok_markov *m);
/* The first N tokens of the stream: out[0] drawn from π, out[k] from P(out[k-1]). */
fsdp_status tok_markov_generate(const tok_markov *m, int64_t n, uint32_t *out);
void tok_markov_destroy(tok_markov **m);

#endif
