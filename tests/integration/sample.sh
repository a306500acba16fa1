#!/usr/bin/env bash
# fsdpctl sample: 2 ranks train a byte-level GPT-2 on one repeated sentence (text → gen-data --text →
# training with a checkpoint); a greedy sample from the checkpoint completes the sentence, from the
# checkpoint root, its step directory and an exported .safetensors alike; a fixed seed gives the same
# text twice and another seed may not; bad input gets one line and exit status 2.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d /tmp/fsdp-it-sample.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
CTL=$build/fsdpctl
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 -c "open('$tmp/text.txt', 'w').write('the quick brown fox jumps over the lazy dog. ' * 400)"
"$CTL" gen-data --text "$tmp/text.txt" -o "$tmp/tok.bin" >/dev/null
cat > "$tmp/job.ini" <<JOB
[job]
name = fox
steps = 150
seed = 3
[model]
n_layer = 2
n_head = 2
n_embd = 64
vocab_size = 256
seq_len = 48
[data]
train = $tmp/tok.bin
batch_size = 4
[optim]
lr = 3e-3
warmup_steps = 10
[fsdp]
world_size = 2
timeout_s = 60
[checkpoint]
dir = $tmp/ck
every = 150
JOB
FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/run timeout 300 "$src/scripts/launch-standalone.sh" 2 "$tmp/job.ini" >/dev/null
loss=$(tail -1 "$tmp/run/rank-0.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
python3 -c "assert $loss < 0.3, $loss" || fail "the sentence was not learned: final loss $loss"

# greedy: the model completes the sentence, from every kind of MODEL
want=" brown fox jumps over the lazy dog."
for model in "$tmp/ck" "$tmp/ck/step-00000150" "$tmp/ck/step-00000150/"; do
  got=$("$CTL" sample "$model" --prompt "the quick" --tokens ${#want} --temperature 0)
  [ "$got" = "$want" ] || fail "greedy sample from $model: '$got', want '$want'"
done
mkdir -p "$tmp/hf"
"$CTL" export "$tmp/ck" -o "$tmp/hf/model.safetensors" >/dev/null
got=$("$CTL" sample "$tmp/hf/model.safetensors" --prompt "the quick" --tokens ${#want} --temperature 0)
[ "$got" = "$want" ] || fail "greedy sample from the export: '$got', want '$want'"

# a fixed seed gives the same text; the sampled text is made of the sentence's bytes
a=$("$CTL" sample "$tmp/ck" --prompt "the lazy" --tokens 60 --temperature 1.5 --top-k 8 --seed 11)
b=$("$CTL" sample "$tmp/ck" --prompt "the lazy" --tokens 60 --temperature 1.5 --top-k 8 --seed 11)
[ "$a" = "$b" ] || fail "seed 11 gave two texts: '$a' / '$b'"
[ "${#a}" -eq 60 ] || fail "60 tokens of a byte-level model are 60 bytes, got ${#a}: '$a'"

# bad input: one line on stderr, exit status 2
bad() {
  local want=$1; shift
  set +e
  "$CTL" sample "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "fsdpctl sample $*: exit $rc, want 2 ($(cat "$tmp/err"))"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "fsdpctl sample $*: not one line: $(cat "$tmp/err")"
  grep -qF -- "$want" "$tmp/err" || fail "fsdpctl sample $*: no '$want' in: $(cat "$tmp/err")"
  ! grep -q '\.c:[0-9]' "$tmp/err" || fail "fsdpctl sample $*: a source location in: $(cat "$tmp/err")"
}
bad "neither a checkpoint directory nor a .safetensors file" "$tmp/job.ini" --prompt x
bad "holds no complete checkpoint" "$tmp" --prompt x
bad "needs --prompt" "$tmp/ck"
bad "--temperature" "$tmp/ck" --prompt x --temperature -1
# a corrupt checkpoint (one bit flipped in a rank file) and a truncated one are refused, as export
# refuses them, with fsdpctl's one line, never sampled from
for kind in flip cut; do
  rm -rf "$tmp/ck-$kind"
  cp -r "$tmp/ck" "$tmp/ck-$kind"
  f="$tmp/ck-$kind/step-00000150/rank-1.bin"
  size=$(stat -c %s "$f")
  if [ $kind = flip ]; then
    python3 -c "import sys; f = open(sys.argv[1], 'r+b'); f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 4]))" "$f" $((size * 2 / 3))
    bad "CRC32C" "$tmp/ck-$kind" --prompt "the quick"
  else
    truncate -s $((size / 2)) "$f"
    bad "rank-1.bin" "$tmp/ck-$kind" --prompt "the quick"
  fi
  grep -q '^fsdpctl: ' "$tmp/err" || fail "sample from a ${kind} checkpoint: not fsdpctl's line: $(cat "$tmp/err")"
  [ ! -s "$tmp/out" ] || fail "sample from a ${kind} checkpoint printed text: $(cat "$tmp/out")"
done
# a LlamaConfig that asks for what fsdpd's Llama does not compute is refused, not run as another model
# (the config is read before the weights, so any .safetensors stands in for them)
mkdir -p "$tmp/lc"
cp "$tmp/hf/model.safetensors" "$tmp/lc/model.safetensors"
llama_cfg() {
  python3 - "$tmp/lc/config.json" "$1" <<'PY'
import json, sys
c = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64, "vocab_size": 256,
     "max_position_embeddings": 48, "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-5,
     "rope_theta": 10000.0, "hidden_act": "silu", "rope_scaling": None}
c.update(json.loads(sys.argv[2]))
json.dump(c, open(sys.argv[1], "w"))
PY
}
llama_cfg '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}'
bad "rope_scaling rope_type 'yarn' is not computed by fsdpd; allowed: default, llama3" "$tmp/lc/model.safetensors" --prompt x
llama_cfg '{"rope_scaling": {"rope_type": "llama3", "factor": 32.0}}'
bad "has no low_freq_factor" "$tmp/lc/model.safetensors" --prompt x
llama_cfg '{"head_dim": 33}'
bad "head_dim = 33 is odd; rotary embeddings rotate pairs of channels" "$tmp/lc/model.safetensors" --prompt x
llama_cfg '{"hidden_act": "gelu"}'
bad "hidden_act = gelu is not computed by fsdpd; allowed: silu" "$tmp/lc/model.safetensors" --prompt x
# head_dim ≠ hidden / heads and attention_bias are computed (docs/models.md, "The Llama family"): the
# file is then read, and this GPT-2 one is refused for what it is
llama_cfg '{"head_dim": 64, "attention_bias": true}'
bad "holds a GPT-2 model" "$tmp/lc/model.safetensors" --prompt x
# the checks pass a config as fsdpctl export writes it (head_dim, rope_scaling null): the file is then
# read, and this GPT-2 one is refused for what it is
llama_cfg '{"head_dim": 32, "rope_scaling": null}'
bad "holds a GPT-2 model" "$tmp/lc/model.safetensors" --prompt x
# a model with a smaller vocabulary refuses a prompt byte it does not have
sed -e 's/^vocab_size = 256/vocab_size = 64/' -e "s|^train = .*|train = synthetic:markov:3|" \
    -e "s|^dir = .*|dir = $tmp/ck64|" -e 's/^steps = 150/steps = 2/' -e 's/^every = 150/every = 2/' \
    "$tmp/job.ini" >"$tmp/job64.ini"
FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/run64 timeout 300 "$src/scripts/launch-standalone.sh" 2 "$tmp/job64.ini" >/dev/null
bad "outside the model's vocabulary of 64 tokens" "$tmp/ck64" --prompt "xyz"
echo "sample: ok"
