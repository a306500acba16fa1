/* bpe — Hugging Face tokenizer.json tokenizers in C: the BPE model with its normalizers,
 * pre-tokenizers, post-processor and decoders, encoding text to token ids and ids back to text
 * with the ids and text that the `tokenizers` library gives for the same file.
 *
 * Implemented components (anything else in a tokenizer.json is refused at load, in one line that
 * names it, never skipped):
 *   model          BPE (vocab, merges as "a b" or ["a","b"], unk_token, fuse_unk, byte_fallback,
 *                  ignore_merges, continuing_subword_prefix, end_of_word_suffix; no dropout)
 *   normalizer     NFC, NFD, NFKC, NFKD (libutf8proc, on the library's Unicode 9.0 characters),
 *                  Prepend, Replace, Sequence
 *   pre_tokenizer  ByteLevel, Split (String or Regex pattern, compiled by Oniguruma as in the
 *                  library; every split behavior, invert), Metaspace, Sequence
 *   post_processor ByteLevel, TemplateProcessing (single sequences), Sequence
 *   decoder        ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence
 *   added_tokens   content, special, normalized, lstrip, rstrip, single_word
 * The pipeline is the library's: the input is split on the added tokens (those not normalized on
 * the raw text, the normalized ones after the normalizer), each remaining piece is normalized,
 * pre-tokenized into words, and each word becomes ids by the BPE merges (lowest rank first, the
 * leftmost among equal ranks).
 *
 * Ownership and threads: a bpe_tokenizer is immutable after bpe_load() and shared by any number of
 * threads; each encoding thread owns a bpe_state (regex match data, scratch buffers and a cache of
 * encoded words). bpe_decode() needs no state. Text is UTF-8; invalid UTF-8 is refused with its
 * byte offset.
 */
#ifndef FSDP_BPE_H
#define FSDP_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct bpe_tokenizer bpe_tokenizer;
typedef struct bpe_state bpe_state;

/* A growable array of token ids; bpe_encode appends to it. Free v with free(). */
typedef struct bpe_ids {
  uint32_t *v;
  size_t n, cap;
} bpe_ids;

/* Append ID to IDS, growing it. */
fsdp_status bpe_ids_push(bpe_ids *ids, uint32_t id);

/* PATH is a tokenizer.json or a folder that holds one (a model folder). Errors name the file and,
 * for what is not implemented, the component ("pre_tokenizer Whitespace is not supported"). */
fsdp_status bpe_load(const char *path, bpe_tokenizer **out);
/* The same from the JSON text itself (NAME is used in messages). */
fsdp_status bpe_load_json(const char *json, size_t len, const char *name, bpe_tokenizer **out);
void bpe_destroy(bpe_tokenizer **t);

/* One more than the largest id of the model or an added token. */
int64_t bpe_vocab_size(const bpe_tokenizer *t);
/* The id of the token spelled TOKEN (model vocabulary or added token), or -1. */
int64_t bpe_token_id(const bpe_tokenizer *t, const char *token);
/* The end-of-text token documents are separated by: the special added token the model folder's
 * tokenizer_config.json names as eos_token, else the first special token among <|endoftext|>,
 * <|end_of_text|>, </s>, <|im_end|>; -1 when none. */
int64_t bpe_eos_id(const bpe_tokenizer *t);

fsdp_status bpe_state_new(const bpe_tokenizer *t, bpe_state **out);
void bpe_state_destroy(bpe_state **s);

/* Encode LEN bytes of TEXT, appending the ids to OUT. ADD_SPECIAL applies the post-processor
 * (a BOS token, for example), as `add_special_tokens=True` does. */
fsdp_status bpe_encode(bpe_state *s, const char *text, size_t len, int add_special, bpe_ids *out);

/* Decode N ids to *TEXT (malloc'd, NUL-terminated, *LEN bytes without the NUL). SKIP_SPECIAL
 * leaves special added tokens out. Invalid byte sequences become U+FFFD as in the library.
 * An id ≥ bpe_vocab_size() is an error. */
fsdp_status bpe_decode(const bpe_tokenizer *t, const uint32_t *ids, size_t n, int skip_special,
                       char **text, size_t *len);

/* The bytes token ID spells in the text it was encoded from, for byte-level tokenizers (a ByteLevel
 * decoder: GPT-2, Llama 3, Qwen 2): an added token's content, a model token's bytes. Writes up to
 * CAP bytes to BUF and returns their count, or -1 when the tokenizer is not byte-level (its tokens
 * do not map to bytes one to one), ID is unknown or CAP is too small. Where the text was not
 * changed by a normalizer, the tokens' bytes concatenated are the text: gen-data --chat places its
 * loss mask by them. */
long bpe_token_bytes(const bpe_tokenizer *t, uint32_t id, char *buf, size_t cap);

/* The first invalid UTF-8 byte's offset in S, or N when S is valid UTF-8. */
size_t bpe_utf8_invalid_at(const char *s, size_t n);

#endif
