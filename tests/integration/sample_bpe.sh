#!/usr/bin/env bash
# A model with a tokenizer.json, end to end: a GPT-2-style tokenizer trained here with Hugging Face
# `tokenizers` (a model folder: tokenizer.json, tokenizer_config.json) encodes the licenses with
# gen-data --eos; 2 standalone ranks train a small GPT-2 on them; fsdpctl export --tokenizer DIR
# puts the tokenizer beside the model; fsdpctl sample encodes the prompt and decodes the greedy
# continuation with it — from the export (found there) and from the checkpoint (--tokenizer) alike
# — and the text equals transformers' generate() on the export with AutoTokenizer. A tokenizer
# larger than the model's vocabulary is refused in one line.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" sample-bpe
FAIL_LOGS=()
PY=$(bash "$SRC/scripts/test-env.sh" --check) || fail "the Python test environment is missing (scripts/test-env.sh)"
V=512

mkdir -p "$S/tokdir" "$S/hf"
"$PY" - "$S" $V <<'PY'
import glob, json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors
S, V = sys.argv[1], int(sys.argv[2])
text = [open(f, encoding="utf-8").read() for f in sorted(glob.glob("/usr/share/common-licenses/*"))[:10]]
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.post_processor = processors.ByteLevel(trim_offsets=False)
t.train_from_iterator(text, trainers.BpeTrainer(vocab_size=V, special_tokens=["<|endoftext|>"], show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
t.save(f"{S}/tokdir/tokenizer.json")
json.dump({"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "tokenizer_class": "GPT2Tokenizer"},
          open(f"{S}/tokdir/tokenizer_config.json", "w"))
with open(f"{S}/files", "w") as f:
    f.write("\n".join(sorted(glob.glob("/usr/share/common-licenses/*"))[:10]))
PY
mapfile -t FILES < "$S/files"
"$CTL" gen-data --tokenizer "$S/tokdir" --text "${FILES[@]}" --eos -o "$S/train.bin" > "$S/gen.out" ||
  fail "gen-data: $(cat "$S/gen.out")"
cat "$S/gen.out"

cat > "$S/job.ini" <<JOB
[job]
steps = 200
seed = 1
[model]
n_layer = 2
n_head = 2
n_embd = 64
vocab_size = $V
seq_len = 64
[data]
train = train.bin
batch_size = 4
[optim]
lr = 3e-3
warmup_steps = 5
[fsdp]
world_size = 2
timeout_s = 60
[checkpoint]
dir = $S/ck
every = 200
JOB
FSDP_WORKER="$BUILD/fsdp-worker" FSDP_OUT="$S/run" timeout 300 "$SRC/scripts/launch-standalone.sh" 2 "$S/job.ini" \
  > /dev/null || fail "training failed: $(cat "$S"/run/rank-*.log 2>/dev/null | tail -n 5)"
"$CTL" export "$S/ck" -o "$S/hf/model.safetensors" --tokenizer "$S/tokdir" > "$S/export.out" ||
  fail "export: $(cat "$S/export.out")"
grep -q "with tokenizer.json, tokenizer_config.json" "$S/export.out" || fail "export did not copy the tokenizer: $(cat "$S/export.out")"

PROMPT="The license"
N=24
a=$("$CTL" sample "$S/hf/model.safetensors" --prompt "$PROMPT" --tokens $N --temperature 0) || fail "sample from the export"
b=$("$CTL" sample "$S/ck" --tokenizer "$S/tokdir" --prompt "$PROMPT" --tokens $N --temperature 0) || fail "sample from the checkpoint"
echo "sample: $PROMPT|$a"
[ "$a" = "$b" ] || fail "the export and the checkpoint continue differently: '$a' / '$b'"
"$PY" - "$S/hf" "$PROMPT" $N "$a" <<'PY' || fail "transformers continues differently"
import sys, torch
from transformers import AutoTokenizer, GPT2LMHeadModel
d, prompt, n, ours = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
tok = AutoTokenizer.from_pretrained(d)
model = GPT2LMHeadModel.from_pretrained(d).eval()
ids = tok(prompt, return_tensors="pt").input_ids
assert ids.shape[1] < len(prompt), f"the prompt was not encoded by the tokenizer: {ids}"
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=False)
print(f"transformers: {prompt}|{text}")
assert text == ours, f"fsdpctl sample {ours!r}, transformers {text!r}"
PY

# byte-level models are untouched (sample.sh); a tokenizer larger than the vocabulary is refused
"$PY" - "$S" <<'PY'
import json, sys
d = json.load(open(f"{sys.argv[1]}/tokdir/tokenizer.json"))
d["added_tokens"][0]["id"] = 4000
json.dump(d, open(f"{sys.argv[1]}/big.json", "w"))
PY
if "$CTL" sample "$S/ck" --tokenizer "$S/big.json" --prompt x > "$S/o" 2> "$S/err"; then fail "a tokenizer of 4001 tokens was accepted"; fi
[ "$(wc -l < "$S/err")" = 1 ] && grep -q "has 4001 tokens, the model's vocabulary $V" "$S/err" || fail "refusal: $(cat "$S/err")"
echo "sample_bpe: OK"
