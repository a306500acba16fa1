#!/usr/bin/env bash
# Llama-3.1/3.2's llama3 rope scaling and tied embeddings against transformers: a tiny tied
# LlamaForCausalLM with rope_scaling llama3, saved by save_pretrained (no lm_head.weight), made
# position-sensitive (sharp attention: large q and k weights), gives the same logits in fsdpd
# (tests/fsdp_logits) as in transformers (float64) at T = 64 = 4 x original_max_position_embeddings /
# factor, to 1e-5 of the largest logit; its head size 32 puts 2 rotary frequencies in the high band,
# 4 between and 10 in the low one. The same job with rope_scaling = none (plain rope_theta) misses
# them by far more; rope_scaling = yarn is refused by fsdpctl plan in one line. Then 3 steps on 2 ranks train the one tied tensor; the export holds it once,
# says tie_word_embeddings true and the llama3 scaling, transformers loads it tied, and its logits
# equal fsdpd's on the export; fsdpctl sample reads it as the checkpoint. The same fine-tune of an
# untied copy (lm_head = embed_tokens) starts from the same loss and ends elsewhere.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/fsdp-it-rope.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
TPY=$(bash "$src/scripts/test-env.sh" --check)
L=2 C=64 H=2 KV=1 F=96 V=64 T=64

# The model folder, the tokens (one row for the logits, a token file for training) and transformers'
# logits of that row.
"$TPY" - "$tmp" $L $C $H $KV $F $V $T <<'PY'
import struct, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
d, L, C, H, KV, F, V, T = sys.argv[1], *map(int, sys.argv[2:])
torch.manual_seed(3)
cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                  num_key_value_heads=KV, head_dim=C // H, max_position_embeddings=1024, rms_norm_eps=1e-5,
                  rope_scaling={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 8.0, "original_max_position_embeddings": 128},
                  tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
m = LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    for n, p in m.named_parameters():
        if p.dim() == 2:   # q and k large: sharp, position-sensitive attention
            p.normal_(0, 0.3 if ("q_proj" in n or "k_proj" in n) else 0.15)
        else:
            p.uniform_(0.8, 1.2)
assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
m.save_pretrained(f"{d}/hf")
g = torch.Generator().manual_seed(5)
row = torch.randint(0, V, (T,), generator=g)
open(f"{d}/row.bin", "wb").write(struct.pack(f"<{T}i", *row.tolist()))
with torch.no_grad():
    lg = m.double()(row[None]).logits[0]
open(f"{d}/hf.f64", "wb").write(struct.pack(f"<{T * V}d", *lg.flatten().tolist()))
toks = torch.randint(0, V, (8192,), generator=g).tolist()
open(f"{d}/train.bin", "wb").write(struct.pack("<256i", 20240520, 1, len(toks), *[0] * 253) +
                                   struct.pack(f"<{len(toks)}H", *toks))
PY
python3 -c 'import json,struct,sys; b=open(sys.argv[1],"rb").read(); h=json.loads(b[8:8+struct.unpack("<Q",b[:8])[0]])
assert "lm_head.weight" not in h and "model.embed_tokens.weight" in h, sorted(h)' "$tmp/hf/model.safetensors"

job() {   # job NAME INIT ROPE_SCALING [extra lines]; TIE=false unties
  cat > "$tmp/$1.ini" <<JOB
[job]
name = $1
steps = 3
[model]
arch = llama
n_layer = $L
n_head = $H
n_kv_head = $KV
n_embd = $C
ffn_dim = $F
vocab_size = $V
seq_len = $T
rope_theta = 10000
tie_word_embeddings = ${TIE:-true}
rope_scaling = $3
init = $2
$( [ "$3" = llama3 ] && printf 'rope_factor = 8\nrope_low_freq_factor = 1\nrope_high_freq_factor = 8\nrope_original_max_position_embeddings = 128\n' )
[data]
train = train.bin
shuffle = false
batch_size = 2
[optim]
lr = 1e-3
warmup_steps = 0
schedule = constant
[fsdp]
world_size = 2
timeout_s = 30
${4:-}
JOB
}
compare() {   # compare OURS THEIRS MODE: MODE same (to 1e-5 of the largest logit) or differ (by 100x that)
  python3 - "$@" <<'PY'
import struct, sys
a, b = (struct.unpack(f"<{len(open(p, 'rb').read()) // 8}d", open(p, "rb").read()) for p in sys.argv[1:3])
scale = max(abs(x) for x in b)
diff = max(abs(x - y) for x, y in zip(a, b))
print(f"  {sys.argv[1].rsplit('/', 1)[-1]} vs {sys.argv[2].rsplit('/', 1)[-1]}: max |diff| {diff:.3e}, "
      f"{diff / scale:.2e} of the largest logit {scale:.3f}")
assert len(a) == len(b)
assert (diff <= 1e-5 * scale) if sys.argv[3] == "same" else (diff > 1e-3 * scale), sys.argv[3]
PY
}

# 1. Logits: llama3 scaling equals transformers; the unscaled rope does not.
job scaled "$tmp/hf/model.safetensors" llama3
job plain "$tmp/hf/model.safetensors" none
"$build/tests/fsdp_logits" "$tmp/scaled.ini" "$tmp/row.bin" "$tmp/scaled.f64"
"$build/tests/fsdp_logits" "$tmp/plain.ini" "$tmp/row.bin" "$tmp/plain.f64"
echo "logits at T = $T, llama3 8/1/8/128, tied:"
compare "$tmp/scaled.f64" "$tmp/hf.f64" same
compare "$tmp/plain.f64" "$tmp/hf.f64" differ

# 2. Train the tied, scaled model on 2 ranks; export; transformers loads it tied, with the scaling.
job train "$tmp/hf/model.safetensors" llama3 "$(printf '[checkpoint]\ndir = ckpt\nevery = 3')"
FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/run timeout 120 "$src/scripts/launch-standalone.sh" 2 "$tmp/train.ini" > /dev/null
mkdir "$tmp/exp"
"$build/fsdpctl" export "$tmp/ckpt" -o "$tmp/exp/model.safetensors" > /dev/null
job exported "$tmp/exp/model.safetensors" llama3
"$build/tests/fsdp_logits" "$tmp/exported.ini" "$tmp/row.bin" "$tmp/exported.f64"
"$TPY" - "$tmp" <<'PY'
import json, struct, sys, torch
from safetensors import safe_open
from transformers import LlamaForCausalLM
d = sys.argv[1]
names = list(safe_open(f"{d}/exp/model.safetensors", "pt").keys())
assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names, names
cfg = json.load(open(f"{d}/exp/config.json"))
assert cfg["tie_word_embeddings"] is True, cfg
rs = cfg["rope_scaling"]
assert rs["rope_type"] == "llama3" and (rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
       rs["original_max_position_embeddings"]) == (8, 1, 8, 128), rs
m = LlamaForCausalLM.from_pretrained(f"{d}/exp", dtype=torch.float64).eval()
assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr(), "the export loads untied"
src = LlamaForCausalLM.from_pretrained(f"{d}/hf", dtype=torch.float64)
assert not torch.equal(src.model.embed_tokens.weight, m.model.embed_tokens.weight), "the tied tensor did not train"
row = torch.tensor(struct.unpack("<64i", open(f"{d}/row.bin", "rb").read()))
with torch.no_grad():
    lg = m(row[None]).logits[0]
open(f"{d}/exported-hf.f64", "wb").write(struct.pack(f"<{lg.numel()}d", *lg.flatten().tolist()))
print(f"export: {len(names)} tensors, embed_tokens once; config tied with llama3 scaling; loads tied")
PY
echo "logits of the export:"
compare "$tmp/exported.f64" "$tmp/exported-hf.f64" same
# fsdpctl sample reads the export's config (tied, llama3): the same greedy tokens as from the checkpoint
a=$("$build/fsdpctl" sample "$tmp/ckpt" --prompt 01 --tokens 8 --temperature 0)
b=$("$build/fsdpctl" sample "$tmp/exp/model.safetensors" --prompt 01 --tokens 8 --temperature 0)
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "sample: checkpoint '$a', export '$b'"; exit 1; }
echo "sample (greedy) from the checkpoint and from the export: $a"
# The same fine-tune untied, from a copy of embed_tokens as lm_head (the same forward at step 1):
# two tensors get the two uses' gradients apart, and the model it trains is another one.
"$TPY" -c 'import sys; from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1]); t["lm_head.weight"] = t["model.embed_tokens.weight"].clone(); save_file(t, sys.argv[2])' \
  "$tmp/hf/model.safetensors" "$tmp/untied.safetensors"
TIE=false job untied "$tmp/untied.safetensors" llama3 "$(printf '[checkpoint]\ndir = ckpt-untied\nevery = 3')"
FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/run-untied timeout 120 "$src/scripts/launch-standalone.sh" 2 "$tmp/untied.ini" > /dev/null
loss1() { python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1]) if l.startswith("{")][0])' "$1"; }
[ "$(loss1 "$tmp/run/rank-0.jsonl")" = "$(loss1 "$tmp/run-untied/rank-0.jsonl")" ] ||
  { echo "step-1 losses of the tied and untied copies differ"; exit 1; }
mkdir "$tmp/exp-untied"
"$build/fsdpctl" export "$tmp/ckpt-untied" -o "$tmp/exp-untied/model.safetensors" > /dev/null
TIE=false job untied-exported "$tmp/exp-untied/model.safetensors" llama3
"$build/tests/fsdp_logits" "$tmp/untied-exported.ini" "$tmp/row.bin" "$tmp/untied-exported.f64"
echo "the untied fine-tune (same step-1 loss) against the tied one's export:"
compare "$tmp/untied-exported.f64" "$tmp/exported-hf.f64" differ

# 3. A rope type fsdpd does not compute is refused by `fsdpctl plan`, in one line, exit status 1.
job yarn "$tmp/hf/model.safetensors" yarn
set +e
"$build/fsdpctl" plan "$tmp/yarn.ini" > /dev/null 2> "$tmp/yarn.err"
rc=$?
set -e
[ "$rc" -eq 1 ] && [ "$(wc -l < "$tmp/yarn.err")" -eq 1 ] &&
  grep -q "rope_scaling = 'yarn' is not allowed; allowed: none | llama3" "$tmp/yarn.err" ||
  { echo "plan of rope_scaling = yarn: rc $rc: $(cat "$tmp/yarn.err")"; exit 1; }
echo "refused: $(cat "$tmp/yarn.err")"
echo "llama_rope: ok"
