#!/usr/bin/env bash
# common/bpe against Hugging Face `tokenizers` at the Unicode edges, where a regex engine or a
# normalization table other than the library's gives other ids. Tokenizers are trained here (byte-
# level alphabet, merges learnt on the text under test, so that a piece cut elsewhere gets other ids)
# and saved as tokenizer.json; build/bpe_tool's ids must equal the library's:
#   ws180e   GPT-2's ByteLevel pre-tokenizer on U+180E MONGOLIAN VOWEL SEPARATOR, white space to
#            PCRE2 but a format character (not \s) to Oniguruma since Unicode 6.3;
#   word     Split(\w+|[^\w\s]+) (the library's Whitespace regex) on combining marks, which
#            Oniguruma's \w takes in (Cafe\u0301 हिन्दी नमस्ते: 5 ids, not 24);
#   nfkc     NFKC, NFKD, NFC and NFD of characters assigned after Unicode 9.0, the version of the
#            library's normalization tables (U+1E030 stays, it does not become U+0430);
#   random   a differential run over all 17 planes: random strings of code points of every plane
#            (letters, marks, digits, white space, format characters, unassigned, private use)
#            through the four pipelines above and Llama 3's Split regex with (?i).
# Left out of `random`: code points Unicode assigned after 14.0. The Oniguruma the build links
# (Debian 12: 6.9.8) has Unicode 14.0 property tables, the one inside tokenizers 0.23 is newer;
# such characters are found by the library's own regex (\P{Cn}) where Python's tables (14.0) say
# unassigned, counted and printed.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" tokenizer_unicode
PY=$(bash "$SRC/scripts/test-env.sh" --check) || fail "the Python test environment is missing (scripts/test-env.sh)"
TOOL="$BUILD/bpe_tool"
[ -x "$TOOL" ] || fail "bpe_tool not built in $BUILD"

"$PY" - "$S" "$TOOL" <<'PY' || fail "common/bpe differs from tokenizers at the Unicode edges (above)"
import random, subprocess, sys, unicodedata
from tokenizers import Tokenizer, Regex, models, normalizers, pre_tokenizers, decoders, trainers

S, TOOL = sys.argv[1], sys.argv[2]
rnd = random.Random(31)
WORD = r"\w+|[^\w\s]+"
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

def make(kind, corpus, norm=None):
    t = Tokenizer(models.BPE())
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if kind == "gpt2":
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(WORD if kind == "word" else LLAMA3),
                                                                        behavior="isolated"), bl])
    if norm:
        t.normalizer = getattr(normalizers, norm)()
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=2000, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t

def c_encode(t, name, docs):
    name = name.replace("/", "_")
    t.save(f"{S}/{name}.json")
    with open(f"{S}/{name}.docs", "wb") as f:
        f.write(b"\0".join(d.encode() for d in docs))
    r = subprocess.run([TOOL, "encode", f"{S}/{name}.json", f"{S}/{name}.docs"], capture_output=True)
    if r.returncode:
        sys.exit(f"{name}: bpe_tool failed: {r.stderr.decode().strip()}")
    return [list(map(int, l.split())) for l in r.stdout.decode().split("\n")[:-1]]

def compare(t, name, docs):
    want = [e.ids for e in t.encode_batch(docs, add_special_tokens=False)]
    got = c_encode(t, name, docs)
    bad = [i for i in range(len(docs)) if got[i] != want[i]]
    for i in bad[:3]:
        print(f"  {name}: {docs[i]!r} ({' '.join(f'U+{ord(c):04X}' for c in docs[i][:12])}...): "
              f"ours {len(got[i])} ids {got[i][:10]}, tokenizers {len(want[i])} ids {want[i][:10]}")
    return want, bad

failed = False
def case(name, kind, docs, expect, norm=None, corpus=None):
    """The named case: ids equal, and the library's own count for docs[0] is EXPECT (when given)."""
    global failed
    t = make(kind, (corpus or docs) * 4, norm)
    want, bad = compare(t, name, docs)
    n0 = len(want[0])
    ok = not bad and (expect is None or n0 == expect)
    print(f"{name}: {len(docs)} texts, {sum(map(len, want))} ids; {docs[0]!r}: {n0} ids from tokenizers"
          f"{f' (expected {expect})' if expect is not None else ''}; {len(bad)} differ -> {'ok' if ok else 'FAIL'}")
    failed |= not ok

# ---- the three known cases ----
ws = ["a \u180eb c \u180e\u180e d  \u180e e", "word \u180eword", "\u180e", " \u180e ", "x \u180e\n\u180e y"]
case("ws180e", "gpt2", ws, None)
assert not "\u180e".isspace(), "U+180E is white space to Python here: the case would not test PCRE2's difference"
word = ["Cafe\u0301 हिन्दी नमस्ते", "Zu\u0308rich n\u0303 A\u030a", "ق\u064eل\u064eم", "தமிழ் ไทย ເລກ"]
case("word", "word", word, 5)
# after Unicode 9.0: U+1E030 (15.0) and U+1FBF0 (13.0) have compatibility decompositions, U+1DFA
# (14.0) and U+1E4EC (15.0) combining classes that would reorder or block a composition, U+10781
# (14.0) a <super> mapping; U+00C5 and U+FB01 are Unicode 1.1's, normalized as always. They stand
# apart from letters: U+1E030 is a letter to tokenizers' regexes, unassigned to the Unicode 14.0
# tables of the Oniguruma linked here (the gap `random` leaves out)
nfk = ["\U0001E030 \U0001E030\u0301 a \U0001E030 b", "\U0001FBF0\U0001FBF9 e\u1dfa\u0301 e\U0001E4EC\u0301",
       "\U00010781 \ufb01 A\u030a \u00c5 \u1e9b\u0323"]
for norm in ("NFKC", "NFKD", "NFC", "NFD"):
    case(f"nfkc/{norm}", "gpt2", nfk, None, norm)
t = make("gpt2", nfk, "NFKC")
kept = t.normalizer.normalize_str("\U0001E030") == "\U0001E030"
print(f"NFKC(U+1E030) kept by tokenizers: {kept}")
failed |= not kept

# ---- random strings over all planes ----
re_assigned = pre_tokenizers.Split(Regex(r"\P{Cn}"), behavior="removed")
def newer(c):   # assigned after Unicode 14.0: tokenizers' Oniguruma says assigned, Python's 14.0 says not
    return unicodedata.category(c) == "Cn" and not re_assigned.pre_tokenize_str(c)
skipped = set()
def draw():
    while True:
        r = rnd.random()
        if r < 0.25:
            c = rnd.choice(" \t\n\r\u00a0\u1680\u2000\u2028\u3000\u180e\u200b\u200d\ufeff\u0085'")
        elif r < 0.4:
            c = chr(rnd.randrange(0x20, 0x7f))
        elif r < 0.6:
            c = chr(rnd.randrange(0x300, 0x370) if rnd.random() < 0.5 else rnd.choice((0x93f, 0x94d, 0x1dfa, 0x1e4ec, 0x1abf)))
        else:
            plane = rnd.randrange(17)
            c = chr(rnd.randrange(plane << 16, (plane << 16) + 0x10000))
        if 0xd800 <= ord(c) < 0xe000 or unicodedata.category(c) == "Cs":
            continue
        if newer(c):
            skipped.add(c)
            continue
        return c
docs = ["".join(draw() for _ in range(rnd.randrange(1, 40))) for _ in range(3000)]
planes = {ord(c) >> 16 for d in docs for c in d}
assert planes == set(range(17)), f"planes drawn: {sorted(planes)}"
print(f"random: {len(docs)} strings, {sum(map(len, docs))} code points from all 17 planes; "
      f"{len(skipped)} assigned after Unicode 14.0 left out")
for name, kind, norm in (("gpt2", "gpt2", None), ("word", "word", None), ("llama3", "llama3", None),
                         ("gpt2+NFKC", "gpt2", "NFKC"), ("gpt2+NFD", "gpt2", "NFD")):
    t = make(kind, docs, norm)
    want, bad = compare(t, f"random/{name}", docs)
    print(f"random/{name}: {sum(map(len, want))} ids, {len(bad)} of {len(docs)} strings differ")
    failed |= bool(bad)
sys.exit(1 if failed else 0)
PY
echo "PASS: tokenizer_unicode"
