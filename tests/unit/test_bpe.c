/* test_bpe — common/bpe on small hand-written tokenizer.json files: the merge order, byte fallback
 * and unk, added tokens (lstrip, rstrip, single_word), the template post-processor, the decoders,
 * invalid input, and the one-line refusal of each component that is not implemented.
 * (tests/integration/tokenizer_hf.sh compares with Hugging Face `tokenizers` on real text.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "check.h"

static bpe_tokenizer *load(const char *json) {
  bpe_tokenizer *t = NULL;
  fsdp_status rc = bpe_load_json(json, strlen(json), "test.json", &t);
  if (rc != FSDP_OK) fprintf(stderr, "load: %s\n", fsdp_last_error());
  return t;
}

/* The ids of TEXT as "1 2 3". */
static const char *ids_of(const bpe_tokenizer *t, const char *text, int add_special) {
  static char buf[1024];
  bpe_state *st;
  bpe_ids ids = {0};
  buf[0] = 0;
  if (bpe_state_new(t, &st) != FSDP_OK) return "(no state)";
  if (bpe_encode(st, text, strlen(text), add_special, &ids) != FSDP_OK) snprintf(buf, sizeof buf, "(error)");
  for (size_t i = 0, n = 0; i < ids.n; i++) n += (size_t)snprintf(buf + n, sizeof buf - n, i ? " %u" : "%u", ids.v[i]);
  free(ids.v);
  bpe_state_destroy(&st);
  return buf;
}

static const char *text_of(const bpe_tokenizer *t, const uint32_t *ids, size_t n, int skip) {
  static char buf[1024];
  char *s;
  size_t len;
  if (bpe_decode(t, ids, n, skip, &s, &len) != FSDP_OK) return "(error)";
  snprintf(buf, sizeof buf, "%s", s);
  free(s);
  return buf;
}

#define CHECK_STR(expected, got)                                                              \
  do {                                                                                        \
    const char *e_ = (expected), *g_ = (got);                                                 \
    if (!strcmp(e_, g_)) check_pass_++;                                                       \
    else {                                                                                    \
      check_fail_++;                                                                          \
      fprintf(stderr, "%s:%d: FAILED: expected \"%s\", got \"%s\"\n", __FILE__, __LINE__, e_, g_); \
    }                                                                                         \
  } while (0)

/* a b c ab bc abc: merges "a b" (rank 0) then "b c" then "ab c" */
static const char *TINY =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, "
    "\"aa\": 6, \"<unk>\": 7, \"<0x41>\": 8, \"<0xC3>\": 9, \"<0xA9>\": 10}, "
    "\"merges\": [\"a b\", [\"b\", \"c\"], \"ab c\", \"a a\"], \"unk_token\": \"<unk>\", \"fuse_unk\": %s, "
    "\"byte_fallback\": %s}, \"added_tokens\": ["
    "{\"id\": 11, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
    "{\"id\": 12, \"content\": \"[M]\", \"special\": false, \"normalized\": false, \"lstrip\": true, \"rstrip\": true}],"
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", "
    "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": "
    "{\"id\": \"<s>\", \"ids\": [11], \"tokens\": [\"<s>\"]}}},"
    "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}}";

static bpe_tokenizer *tiny(const char *fuse, const char *fallback) {
  char json[2048];
  snprintf(json, sizeof json, TINY, fuse, fallback);
  return load(json);
}

static void test_merges(void) {
  bpe_tokenizer *t = tiny("false", "false");
  CHECK(t != NULL);
  if (!t) return;
  CHECK_STR("5", ids_of(t, "abc", 0));        /* a b c -> ab c -> abc */
  CHECK_STR("3 4", ids_of(t, "abbc", 0));     /* rank 0 first: ab b c -> ab bc */
  CHECK_STR("6 0", ids_of(t, "aaa", 0));      /* leftmost of equal ranks */
  CHECK_STR("6 6", ids_of(t, "aaaa", 0));
  CHECK_STR("0 7 7 1", ids_of(t, "axyb", 0)); /* unk per character, not fused */
  CHECK_STR("11 5", ids_of(t, "abc", 1));     /* the template's <s> */
  CHECK_EQ_INT(13, bpe_vocab_size(t));
  CHECK_EQ_INT(11, bpe_token_id(t, "<s>"));
  CHECK_EQ_INT(4, bpe_token_id(t, "bc"));
  CHECK_EQ_INT(-1, bpe_token_id(t, "zz"));
  bpe_destroy(&t);
  CHECK(t == NULL);
}

static void test_fallback_and_added(void) {
  bpe_tokenizer *t = tiny("true", "true");
  CHECK(t != NULL);
  if (!t) return;
  CHECK_STR("0 7 1", ids_of(t, "axyb", 0));   /* fused: one unk for "xy" */
  CHECK_STR("8 9 10", ids_of(t, "A\xc3\xa9", 0));   /* "A" and "é" by their bytes */
  CHECK_STR("0 12 1", ids_of(t, "a  [M] b", 0));   /* lstrip and rstrip take the spaces */
  CHECK_STR("11 5 11", ids_of(t, "<s>abc<s>", 0));
  uint32_t ids[] = {8, 9, 10, 11, 0}, bad[] = {9, 0}, out[] = {99};
  CHECK_STR("A\xc3\xa9<s>a", text_of(t, ids, 5, 0));
  CHECK_STR("A\xc3\xa9" "a", text_of(t, ids, 5, 1));   /* special tokens skipped */
  CHECK_STR("\xef\xbf\xbd" "a", text_of(t, bad, 2, 0));   /* a lone 0xC3: U+FFFD */
  CHECK_STR("(error)", text_of(t, out, 1, 0));
  CHECK_STR("(error)", ids_of(t, "a\xff", 0));   /* not UTF-8 */
  bpe_destroy(&t);
}

/* ByteLevel pre-tokenizer and decoder: the GPT-2 regex, the byte alphabet, lossy decoding. */
static void test_bytelevel(void) {
  const char *json =
      "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true}, "
      "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {"
      "\"\xc4\xa0\": 0, \"h\": 1, \"i\": 2, \"\xc4\xa0h\": 3, \"\xc4\xa0hi\": 4, \"!\": 5, \"\xc3\x83\": 6, "
      "\"\xc2\xa9\": 7, \"\xc4\x8a\": 8}, \"merges\": [\"\xc4\xa0 h\", \"\xc4\xa0h i\"]}}";
  bpe_tokenizer *t = load(json);
  CHECK(t != NULL);
  if (!t) return;
  CHECK_STR("4 5 4", ids_of(t, "hi! hi", 0));   /* prefix space, then " hi" "!" " hi" */
  CHECK_STR("4 8 8", ids_of(t, "hi\n\n", 0));      /* \n is Ċ */
  CHECK_STR("0 6 7", ids_of(t, "\xc3\xa9", 0));    /* é: bytes C3 A9 as Ã © */
  uint32_t ids[] = {4, 5, 6, 7}, half[] = {6, 5};
  CHECK_STR(" hi!\xc3\xa9", text_of(t, ids, 4, 0));
  CHECK_STR("\xef\xbf\xbd!", text_of(t, half, 2, 0));
  bpe_destroy(&t);
}

/* Metaspace, Split behaviors, Replace/Prepend normalizers and the Metaspace and Strip decoders. */
static void test_pipelines(void) {
  const char *meta =
      "{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"first\"}, "
      "\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"first\"}, "
      "\"model\": {\"type\": \"BPE\", \"vocab\": {\"\xe2\x96\x81\": 0, \"a\": 1, \"b\": 2, \"\xe2\x96\x81" "a\": 3}, "
      "\"merges\": [\"\xe2\x96\x81 a\"]}}";
  bpe_tokenizer *t = load(meta);
  CHECK(t != NULL);
  if (!t) return;
  CHECK_STR("3 2 3 0 3", ids_of(t, "ab a  a", 0));
  uint32_t ids[] = {3, 2, 3, 0, 3};
  CHECK_STR("ab a  a", text_of(t, ids, 5, 0));
  bpe_destroy(&t);

  const char *split =
      "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\": "
      "{\"Regex\": \"\\\\d+\"}, \"content\": \"#\"}, {\"type\": \"Prepend\", \"prepend\": \"-\"}]}, "
      "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"MergedWithNext\", "
      "\"invert\": false}, \"decoder\": {\"type\": \"Strip\", \"content\": \"-\", \"start\": 1, \"stop\": 0}, "
      "\"model\": {\"type\": \"BPE\", \"vocab\": {\"-\": 0, \"#\": 1, \"x\": 2, \"-#\": 3, \"-x\": 4}, "
      "\"merges\": [\"- #\", \"- x\"]}}";
  t = load(split);
  CHECK(t != NULL);
  if (!t) return;
  CHECK_STR("4 3 4", ids_of(t, "x-123-x", 0));   /* "-x-#-x" cut before each "-": -x -# -x */
  uint32_t d[] = {4, 3};
  CHECK_STR("x#", text_of(t, d, 2, 0));   /* Strip takes one leading "-" of each token */
  bpe_destroy(&t);
}

/* Split's five behaviors on "a--b-c" cut at "-", seen through merges that join across a cut only
 * when the behavior keeps the pieces together: a=0 b=1 c=2 -=3 --=4 a-=5 b-=6 -b=7 -c=8. */
static void test_split_behaviors(void) {
  static const struct { const char *behavior, *invert, *want; } cases[] = {
      {"Removed", "false", "0 1 2"},               /* a b c */
      {"Isolated", "false", "0 3 3 1 3 2"},        /* a - - b - c */
      {"MergedWithPrevious", "false", "5 3 6 2"},  /* a- - b- c */
      {"MergedWithNext", "false", "0 3 7 8"},      /* a - -b -c */
      {"Contiguous", "false", "0 4 1 3 2"},        /* a -- b - c */
      {"Removed", "true", "3 3 3"},                /* the letters are the matches now */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\", "
             "\"invert\": %s}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"-\": 3, "
             "\"--\": 4, \"a-\": 5, \"b-\": 6, \"-b\": 7, \"-c\": 8}, \"merges\": [\"- -\", \"a -\", \"b -\", "
             "\"- b\", \"- c\"]}}", cases[i].behavior, cases[i].invert);
    bpe_tokenizer *t = load(json);
    CHECK(t != NULL);
    if (!t) continue;
    const char *got = ids_of(t, "a--b-c", 0);
    CHECK(!strcmp(cases[i].want, got));
    if (strcmp(cases[i].want, got)) fprintf(stderr, "  %s invert %s: want %s, got %s\n", cases[i].behavior,
                                            cases[i].invert, cases[i].want, got);
    bpe_destroy(&t);
  }
}

/* What is not implemented is refused in one line naming it. */
static void test_refusals(void) {
  static const struct { const char *json, *want; } cases[] = {
      {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model WordPiece is not supported"},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"dropout\": 0.1}}", "BPE dropout is not supported"},
      {"{\"normalizer\": {\"type\": \"Lowercase\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
       "normalizer Lowercase is not supported"},
      {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}, \"model\": "
       "{\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "pre_tokenizer Digits is not supported"},
      {"{\"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
       "decoder WordPiece is not supported"},
      {"{\"post_processor\": {\"type\": \"RobertaProcessing\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, "
       "\"merges\": []}}", "post_processor RobertaProcessing is not supported"},
      {"{\"truncation\": {\"max_length\": 5}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
       "truncation is not supported"},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", "not in the vocab"},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, "
       "\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "does not compile"},
      {"{\"model\": ", "not JSON"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    bpe_tokenizer *t = NULL;
    fsdp_status rc = bpe_load_json(cases[i].json, strlen(cases[i].json), "x.json", &t);
    const char *msg = fsdp_last_error();
    CHECK(rc != FSDP_OK && t == NULL);
    CHECK(strstr(msg, cases[i].want) != NULL && strchr(msg, '\n') == NULL && strstr(msg, "x.json") == msg);
    if (!strstr(msg, cases[i].want)) fprintf(stderr, "  case %zu: got \"%s\"\n", i, msg);
  }
}

int main(void) {
  test_merges();
  test_fallback_and_added();
  test_bytelevel();
  test_pipelines();
  test_split_behaviors();
  test_refusals();
  return check_done();
}
