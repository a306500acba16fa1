#!/usr/bin/env bash
# gen_data_bpe — `fsdpctl gen-data --tokenizer`: a GPT-2-style tokenizer.json trained here with
# Hugging Face `tokenizers` (the cached test environment) encodes text files, a .jsonl file and
# --doc-sep documents; the tokens equal the library's, each document preceded by <|endoftext|>
# with --eos; 1 and 2 threads write the same bytes; --val splits the tail. A tokenizer whose
# vocabulary exceeds 65536 (an end-of-text id of 70000) writes llm.c's uint32 format (magic
# 20240801, version 7), which two standalone ranks train on; three shards train as one glob, and a
# bad shard in it fails before the first step, named. Bad input gets one line (argument
# errors add the usage after it).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" gen-data-bpe
FAIL_LOGS=()
PY=$(bash "$SRC/scripts/test-env.sh" --check) || fail "the Python test environment is missing (scripts/test-env.sh)"

# Text: licenses and Python sources (over 512 KB, so more than one chunk per thread), a .jsonl.
ls /usr/share/common-licenses/* | head -12 > "$S/files"
cat $(ls /usr/lib/python3*/[a-m]*.py | head -40) > "$S/code.txt"
echo "$S/code.txt" >> "$S/files"
"$PY" - "$S" <<'PY'
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
S = sys.argv[1]
files = open(f"{S}/files").read().split()
text = [open(f, encoding="utf-8").read() for f in files]
with open(f"{S}/docs.jsonl", "w") as f:
    for i in range(300):
        f.write(json.dumps({"text": f"Document {i}: caf\u00e9 \U0001F600 " + text[i % len(text)][:200], "id": i}) + "\n")
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.train_from_iterator(text, trainers.BpeTrainer(vocab_size=1200, special_tokens=["<|endoftext|>"], show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
t.save(f"{S}/tok.json")
# the same model with 70000 vocabulary entries no text reaches and <|endoftext|> at id 70000
d = json.loads(t.to_str())
v = d["model"]["vocab"]
for k in range(len(v), 70000):
    v[f"<unused{k}>"] = k
old = v.pop("<|endoftext|>")
v["<|endoftext|>"] = 70000
d["added_tokens"][0]["id"] = 70000
import os
os.makedirs(f"{S}/wide", exist_ok=True)
json.dump(d, open(f"{S}/wide/tokenizer.json", "w"))
PY
mapfile -t FILES < "$S/files"

for th in 1 2; do
  "$CTL" gen-data --tokenizer "$S/tok.json" --text "${FILES[@]}" "$S/docs.jsonl" --eos --threads $th \
    -o "$S/t$th.bin" > "$S/out$th" || fail "gen-data --threads $th failed"
done
cat "$S/out1"
cmp -s "$S/t1.bin" "$S/t2.bin" || fail "1 and 2 threads wrote different files"
"$CTL" gen-data --tokenizer "$S/tok.json" --text "$S/code.txt" --doc-sep '\n\n' -o "$S/sep.bin" \
  --val "$S/sepv.bin" --val-fraction 0.1 --json > "$S/sep.json"
"$CTL" gen-data --tokenizer "$S/wide" --text "${FILES[@]:0:3}" --eos -o "$S/wide.bin" > "$S/wide.out"
cat "$S/wide.out"
grep -q "vocab 70001, uint32" "$S/wide.out" || fail "the wide tokenizer did not write uint32: $(cat "$S/wide.out")"

"$PY" - "$S" <<'PY' || fail "gen-data's tokens differ from tokenizers'"
import json, struct, sys
from tokenizers import Tokenizer
S = sys.argv[1]
def tokens(path):
    b = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", b[:12])
    w = {20240520: (1, "H", 2), 20240801: (7, "I", 4)}[magic]
    assert version == w[0] and len(b) == 1024 + w[2] * n, (path, magic, version, n, len(b))
    return list(struct.unpack(f"<{n}{w[1]}", b[1024:]))
files = open(f"{S}/files").read().split()
t = Tokenizer.from_file(f"{S}/tok.json")
eos = t.token_to_id("<|endoftext|>")
docs = [open(f, encoding="utf-8").read() for f in files]
docs += [json.loads(l)["text"] for l in open(f"{S}/docs.jsonl")]
want = []
for e in t.encode_batch(docs, add_special_tokens=False):
    want += [eos] + e.ids
got = tokens(f"{S}/t1.bin")
assert got == want, f"--eos: {len(got)} tokens, tokenizers {len(want)}; first difference at " \
    f"{next(i for i in range(min(len(got), len(want))) if got[i] != want[i])}"
sep = [d for d in open(f"{S}/code.txt", encoding="utf-8").read().split("\n\n") if d]
want = [x for e in t.encode_batch(sep, add_special_tokens=False) for x in e.ids]
j = json.load(open(f"{S}/sep.json"))
nval = int(0.1 * len(want))
assert tokens(f"{S}/sep.bin") == want[:len(want) - nval] and tokens(f"{S}/sepv.bin") == want[len(want) - nval:]
assert j["tokens"] == len(want) - nval and j["val_tokens"] == nval and j["documents"] == len(sep), j
w = Tokenizer.from_file(f"{S}/wide/tokenizer.json")
want = []
for e in w.encode_batch(docs[:3], add_special_tokens=False):
    want += [70000] + e.ids
assert tokens(f"{S}/wide.bin") == want, "uint32 tokens differ"
print(f"gen-data equals tokenizers: {len(got)} tokens with --eos, {len(sep)} --doc-sep documents, uint32 file")
PY

# The uint32 file trains: two steps on 2 standalone ranks, vocabulary 70001.
source "$(dirname "$0")/lib/job.sh"
tiny_job "$S/job.ini" job.steps=2 model.vocab_size=70001 model.seq_len=32 data.train=wide.bin data.batch_size=2
FSDP_WORKER="$BUILD/fsdp-worker" FSDP_OUT="$S/run" timeout 180 "$SRC/scripts/launch-standalone.sh" 2 "$S/job.ini" \
  > /dev/null || fail "training on the uint32 tokens failed: $(cat "$S"/run/rank-*.log 2>/dev/null | tail -n 5)"
python3 - "$S/run/rank-0.jsonl" <<'PY' || fail "rank 0's output: $(tail -n 3 "$S/run/rank-0.jsonl")"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["step"] for l in lines] == [1, 2], lines
assert all(math.isfinite(l["loss"]) and 0 < l["loss"] < 15 for l in lines), lines
print(f"trained on uint32 tokens: loss {lines[0]['loss']:.4f}, {lines[1]['loss']:.4f}")
PY

# Shards: three gen-data files read as one stream through a glob, shuffled, on 2 ranks, with the
# validation loss before the first step ([eval] at_start); a bad shard in the glob fails the job
# before its first step, naming the file.
for k in 0 1 2; do
  "$CTL" gen-data --tokenizer "$S/tok.json" --text "${FILES[$k]}" --eos -o "$S/shard_$k.bin" > /dev/null
done
tiny_job "$S/glob.ini" job.steps=2 model.vocab_size=1200 model.seq_len=32 'data.train=shard_*.bin' data.shuffle=true \
  data.val=t1.bin data.batch_size=2 eval.at_start=true eval.batches=1
FSDP_WORKER="$BUILD/fsdp-worker" FSDP_OUT="$S/globrun" timeout 180 "$SRC/scripts/launch-standalone.sh" 2 "$S/glob.ini" \
  > /dev/null || fail "training on a 3-file glob failed: $(cat "$S"/globrun/rank-*.log 2>/dev/null | tail -n 5)"
python3 - "$S/globrun/rank-0.jsonl" <<'PY' || fail "the glob job's output: $(cat "$S/globrun/rank-0.jsonl")"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["step"] for l in lines] == [0, 1, 2], lines   # [eval] at_start: step 0, the loss before any update
assert 0 < lines[0]["val_loss"] < 2 * math.log(1200) and "loss" not in lines[0], lines[0]
print(f"3-file glob: val_loss at step 0 {lines[0]['val_loss']:.4f}, loss {lines[1]['loss']:.4f}, {lines[2]['loss']:.4f}")
PY
head -c 2048 /dev/urandom > "$S/shard_3.bin"
if FSDP_WORKER="$BUILD/fsdp-worker" FSDP_OUT="$S/badrun" timeout 180 "$SRC/scripts/launch-standalone.sh" 2 \
   "$S/glob.ini" > /dev/null 2>&1; then fail "a bad shard in the glob was accepted"; fi
grep -q "shard_3.bin is not an llm.c token file" "$S/badrun/rank-0.log" ||
  fail "the bad shard is not named: $(tail -n 3 "$S/badrun/rank-0.log")"
[ ! -s "$S/badrun/rank-0.jsonl" ] || fail "the job with a bad shard ran steps"

# Bad input: one line naming the problem.
check_bad() {  # check_bad EXPECTED ARGS...
  local want=$1
  shift
  if "$CTL" gen-data "$@" > "$S/o" 2> "$S/err"; then fail "gen-data $* succeeded"; fi
  head -n 1 "$S/err" | grep "^fsdpctl gen-data: " | grep -qF -e "$want" || fail "gen-data $*: want '$want', got: $(cat "$S/err")"
  case "$want" in --*) ;; *) [ "$(wc -l < "$S/err")" = 1 ] || fail "gen-data $*: more than one line: $(cat "$S/err")";; esac
}
printf 'ok\xff\xfe' > "$S/bad.txt"
echo '{"id": 1}' > "$S/bad.jsonl"
check_bad "$S/bad.txt document at byte 0: the text is not UTF-8 (byte 2)" --tokenizer "$S/tok.json" --text "$S/bad.txt" -o "$S/x.bin"
check_bad "$S/bad.jsonl line 1: expected a JSON object with a \"text\" string" --tokenizer "$S/tok.json" --text "$S/bad.jsonl" -o "$S/x.bin"
check_bad "tokenizer $S/nope: No such file" --tokenizer "$S/nope" --text "$S/code.txt" -o "$S/x.bin"
check_bad "--eos, --doc-sep and --threads go with --tokenizer" --text "$S/code.txt" --eos -o "$S/x.bin"
check_bad "--tokenizer encodes text" --tokenizer "$S/tok.json" -o "$S/x.bin"
"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); d['added_tokens']=[]; json.dump(d, open(sys.argv[2],'w'))" \
  "$S/tok.json" "$S/noeos.json"
check_bad "--eos: the tokenizer has no end-of-text token" --tokenizer "$S/noeos.json" --text "$S/code.txt" --eos -o "$S/x.bin"
[ ! -e "$S/x.bin" ] || fail "a failed gen-data left a file"
echo "gen_data_bpe: OK"
