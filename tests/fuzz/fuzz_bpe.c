/* fuzz_bpe — libFuzzer target for common/bpe, whose inputs come from outside: a tokenizer.json
 * downloaded with a model, and any text. An input that starts with '{' is a tokenizer.json: it must
 * load or be refused, never crash, and a loaded one encodes and decodes a fixed text. Any other
 * input is text for two fixed tokenizers (a GPT-2-style ByteLevel one with a Split regex, and a
 * Llama-2-style one with byte fallback): encoding must succeed for UTF-8 and be refused otherwise,
 * and for the byte-level tokenizer decode(encode(x)) must give x back exactly. */
#define _GNU_SOURCE   /* memmem */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_priv.h"

/* The byte-level tokenizer: Llama 3's split, ByteLevel without its regex, the 256 byte characters
 * and a few merges, ignore_merges, an added token. Built with jansson (the byte alphabet). */
static char *bytelevel_json(void) {
  json_t *vocab = json_object();
  for (int b = 0; b < 256; b++) {
    char c[8] = {0};
    bpe_utf8_put(bpe_byte_char((unsigned char)b), c);
    json_object_set_new(vocab, c, json_integer(b));
  }
  json_object_set_new(vocab, "\xc4\xa0t", json_integer(256));
  json_object_set_new(vocab, "\xc4\xa0th", json_integer(257));
  json_object_set_new(vocab, "\xc4\xa0the", json_integer(258));
  json_t *root = json_pack(
      "{s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}, s:{s:s}, s:[{s:i, s:s, s:b}], "
      "s:{s:s, s:b, s:o, s:[s, s, s]}}",
      "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0,
      "decoder", "type", "ByteLevel", "added_tokens", "id", 300, "content", "<|x|>", "special", 1,
      "model", "type", "BPE", "ignore_merges", 1, "vocab", vocab, "merges", "\xc4\xa0 t", "\xc4\xa0t h",
      "\xc4\xa0th e");
  char *s = root ? json_dumps(root, 0) : NULL;
  json_decref(root);
  return s;
}

/* A Llama-2-style tokenizer: NFC + Prepend + Replace, byte fallback for a few bytes, fused unk. */
static const char LLAMA2[] =
    "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Prepend\", "
    "\"prepend\": \"\xe2\x96\x81\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": "
    "\"\xe2\x96\x81\"}]}, \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
    "{\"String\": \"\xe2\x96\x81\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
    "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}, \"model\": {\"type\": \"BPE\", "
    "\"byte_fallback\": true, \"fuse_unk\": true, \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, "
    "\"<0x41>\": 1, \"<0xC3>\": 2, \"<0xA9>\": 3, \"a\": 4, \"\xe2\x96\x81\": 5, \"\xe2\x96\x81" "a\": 6}, "
    "\"merges\": [\"\xe2\x96\x81 a\"]}}";

static void roundtrip(const bpe_tokenizer *t, const char *text, size_t n, int exact) {
  bpe_state *st = NULL;
  bpe_ids ids = {0};
  if (bpe_state_new(t, &st) != FSDP_OK) abort();
  fsdp_status rc = bpe_encode(st, text, n, 1, &ids);
  if ((rc == FSDP_OK) != (bpe_utf8_invalid_at(text, n) == n)) abort();   /* UTF-8 is exactly what encodes */
  char *out = NULL;
  size_t len = 0;
  if (rc == FSDP_OK && bpe_decode(t, ids.v, ids.n, 0, &out, &len) == FSDP_OK) {
    if (exact && (len != n || memcmp(out, text, n))) abort();
    free(out);
  }
  free(ids.v);
  bpe_state_destroy(&st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bpe_tokenizer *fixed[2];
  if (!fixed[0]) {
    char *bl = bytelevel_json();
    if (!bl || bpe_load_json(bl, strlen(bl), "bytelevel.json", &fixed[0]) != FSDP_OK ||
        bpe_load_json(LLAMA2, strlen(LLAMA2), "llama2.json", &fixed[1]) != FSDP_OK)
      abort();
    free(bl);
  }
  if (size > 1 << 16) return 0;
  if (size && data[0] == '{') {
    bpe_tokenizer *t = NULL;
    if (bpe_load_json((const char *)data, size, "fuzz.json", &t) == FSDP_OK) {
      static const char sample[] = "Hello, wor\xc3\xa9ld! 123  \n\t<s> <0x41>";
      roundtrip(t, sample, sizeof sample - 1, 0);
      bpe_destroy(&t);
    } else if (t) {
      abort();   /* a refused file leaves no tokenizer behind */
    }
    return 0;
  }
  /* the byte-level tokenizer gives any UTF-8 text back exactly, unless it spells the added token */
  int spells = memmem(data, size, "<|x|>", 5) != NULL;
  roundtrip(fixed[0], (const char *)data, size, !spells);
  roundtrip(fixed[1], (const char *)data, size, 0);
  return 0;
}
