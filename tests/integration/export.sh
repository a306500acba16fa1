#!/usr/bin/env bash
# fsdpctl export: a 2-rank checkpoint becomes one .safetensors file, byte-identical to the model the
# ranks themselves consolidate at the end (fsdp-worker --save), with a Hugging Face config.json
# beside it that matches the job and the file's tensors (and loads with GPT2LMHeadModel when
# transformers is installed); bad input gets a one-line error.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d /tmp/fsdp-it-export.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/job.ini" <<JOB
[job]
name = export
steps = 6
[model]
n_layer = 2
n_head = 2
n_embd = 32
vocab_size = 64
seq_len = 16
[data]
train = synthetic:markov:4
batch_size = 2
[fsdp]
world_size = 2
timeout_s = 30
[checkpoint]
dir = ckpt
every = 3
JOB
FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/run timeout 120 "$src/scripts/launch-standalone.sh" 2 "$tmp/job.ini" \
  --save "$tmp/final.safetensors" > /dev/null
"$build/fsdpctl" export "$tmp/ckpt" -o "$tmp/exported.safetensors"
cmp "$tmp/final.safetensors" "$tmp/exported.safetensors"
test ! -e "$tmp/config.json.tmp"
# config.json beside it: a GPT2Config for the job's model, and every tensor of the file has the
# shape that config implies (read with an independent parser: struct + json).
python3 - "$tmp/config.json" "$tmp/exported.safetensors" <<'PY'
import json, struct, sys
cfg = json.load(open(sys.argv[1]))
want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 2,
        "n_embd": 32, "vocab_size": 64, "n_positions": 16, "n_ctx": 16,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
        "bos_token_id": None, "eos_token_id": None, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0,
        "torch_dtype": "float32"}
assert cfg == want, f"config.json: {cfg}"
b = open(sys.argv[2], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n])
hdr.pop("__metadata__", None)
C, V, T, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
shapes = {"wte.weight": [V, C], "wpe.weight": [T, C], "ln_f.weight": [C], "ln_f.bias": [C]}
for i in range(L):
    for k, s in {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C],
                 "attn.c_attn.bias": [3 * C], "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C],
                 "ln_2.weight": [C], "ln_2.bias": [C], "mlp.c_fc.weight": [C, 4 * C],
                 "mlp.c_fc.bias": [4 * C], "mlp.c_proj.weight": [4 * C, C], "mlp.c_proj.bias": [C]}.items():
        shapes[f"h.{i}.{k}"] = s
got = {k: v["shape"] for k, v in hdr.items()}
assert got == shapes, (set(got) ^ set(shapes), [k for k in shapes if got.get(k) != shapes[k]])
print(f"config.json matches the job and the {len(got)} tensors")
PY
# With transformers installed: GPT2LMHeadModel.from_pretrained(DIR) loads it, every parameter equal.
TPY=$(bash "$src/scripts/test-env.sh" --check)
{
  mkdir "$tmp/hf"
  "$build/fsdpctl" export "$tmp/ckpt" -o "$tmp/hf/model.safetensors" > /dev/null
  "$TPY" - "$tmp/hf" <<'PY'
import sys, torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel
d = sys.argv[1]
model = GPT2LMHeadModel.from_pretrained(d)
sd = load_file(f"{d}/model.safetensors")
params = dict(model.transformer.named_parameters())
assert set(sd) == set(params), set(sd) ^ set(params)
assert all(torch.equal(sd[k], params[k].detach()) for k in sd)
assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "head not tied"
print("transformers: GPT2LMHeadModel.from_pretrained loads the export, every parameter equal")
PY
}
"$build/fsdpctl" export "$tmp/ckpt" --step 3 -o "$tmp/step3.safetensors"
! cmp -s "$tmp/final.safetensors" "$tmp/step3.safetensors"
# The step directory itself (what `ls` shows) is accepted too, and is the same checkpoint.
"$build/fsdpctl" export "$tmp/ckpt/$(printf 'step-%08d' 3)/" -o "$tmp/step3b.safetensors"
cmp "$tmp/step3.safetensors" "$tmp/step3b.safetensors"
set +e
msg=$("$build/fsdpctl" export "$tmp/ckpt/$(printf 'step-%08d' 3)" --step 6 -o "$tmp/x.safetensors" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && case "$msg" in *"step 3, but --step says 6"*) true;; *) false;; esac || { echo "step dir with another --step: rc $rc: $msg"; exit 1; }
# A job initialized from the export: same parameter count, loads without complaint.
sed -e "s|^\[model\]|[model]\ninit = $tmp/exported.safetensors|" -e 's/^steps = 6/steps = 1/' \
    -e '/^\[checkpoint\]/,$d' "$tmp/job.ini" > "$tmp/job2.ini"
FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/run2 timeout 60 "$src/scripts/launch-standalone.sh" 2 "$tmp/job2.ini" > /dev/null
# Bad input: one line on stderr, exit 1 (2 for usage).
set +e
msg=$("$build/fsdpctl" export "$tmp/nowhere" -o "$tmp/x.safetensors" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] || { echo "bad dir: rc $rc: $msg"; exit 1; }
! grep -Eq '[a-z_]+\.(c|h):[0-9]+:' <<<"$msg" || { echo "a source location in: $msg"; exit 1; }
echo "$msg"
set +e
"$build/fsdpctl" export "$tmp/ckpt" > /dev/null 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "missing -o: rc $rc"; exit 1; }
echo "export: ok"
