#!/usr/bin/env bash
# Llama and Hugging Face: a tiny LlamaForCausalLM-named .safetensors file (random, written here with
# struct + json) initializes a 2-rank job, whose first loss equals an independent pure-Python
# forward of that file (Hugging Face's conventions: [out, in] weights, rotate-half rotary, repeated
# kv heads); the job trains, checkpoints, resumes at world 3, and fsdpctl export writes exactly the
# Hugging Face names and shapes with a LlamaConfig; every exported tensor is read back and compared
# (with the worker's own --save, byte for byte, and an lr-1e-9 step-1 export with the input file);
# fsdpctl sample gives the same tokens from the checkpoint and from the export.
# With torch and transformers installed, LlamaForCausalLM loads the export and gives the same loss.
# Bad input: a GPT-2 file, a missing tensor and a wrong shape give one-line errors.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/fsdp-it-llama.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
L=2 C=32 H=4 KV=2 F=48 V=64 T=16 THETA=500000

# The model file (names with "model.", as LlamaForCausalLM saves them) and llm.c tokens.
python3 - "$tmp" $L $C $H $KV $F $V $T <<'PY'
import json, random, struct, sys
d, L, C, H, KV, F, V, T = sys.argv[1], *map(int, sys.argv[2:])
hs = C // H
rnd = random.Random(5)
shapes = [("model.embed_tokens.weight", [V, C])]
for i in range(L):
    p = f"model.layers.{i}."
    shapes += [(p + "input_layernorm.weight", [C]), (p + "self_attn.q_proj.weight", [C, C]),
               (p + "self_attn.k_proj.weight", [KV * hs, C]), (p + "self_attn.v_proj.weight", [KV * hs, C]),
               (p + "self_attn.o_proj.weight", [C, C]), (p + "post_attention_layernorm.weight", [C]),
               (p + "mlp.gate_proj.weight", [F, C]), (p + "mlp.up_proj.weight", [F, C]),
               (p + "mlp.down_proj.weight", [C, F])]
shapes += [("model.norm.weight", [C]), ("lm_head.weight", [V, C])]
def write(path, tensors):
    hdr, data = {}, b""
    for name, shape, vals in tensors:
        raw = struct.pack(f"<{len(vals)}f", *vals)
        hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
tensors = []
for name, shape in shapes:
    n = shape[0] * (shape[1] if len(shape) > 1 else 1)
    vals = [1 + 0.1 * rnd.gauss(0, 1) for _ in range(n)] if len(shape) == 1 else [0.1 * rnd.gauss(0, 1) for _ in range(n)]
    tensors.append((name, shape, vals))
write(f"{d}/llama.safetensors", tensors)
write(f"{d}/nohead.safetensors", [t for t in tensors if t[0] != "lm_head.weight"])
write(f"{d}/transposed.safetensors", [(n, s[::-1] if "k_proj" in n else s, v) for n, s, v in tensors])
write(f"{d}/gpt2.safetensors", [("wte.weight", [V, C], tensors[0][2]), ("h.0.ln_1.weight", [C], [1.0] * C)])
toks = [rnd.randrange(V) for _ in range(4096)]
open(f"{d}/train.bin", "wb").write(struct.pack("<256i", 20240520, 1, len(toks), *[0] * 253) +
                                   struct.pack(f"<{len(toks)}H", *toks))
PY

job() {   # job NAME INIT STEPS LR [extra lines]
  cat > "$tmp/$1.ini" <<JOB
[job]
name = $1
steps = $3
[model]
arch = llama
n_layer = $L
n_head = $H
n_kv_head = $KV
n_embd = $C
ffn_dim = $F
vocab_size = $V
seq_len = $T
rope_theta = $THETA
init = $2
[data]
train = train.bin
shuffle = false
batch_size = 2
grad_accum = 1
[optim]
lr = $4
min_lr = 0
warmup_steps = 0
schedule = constant
[fsdp]
world_size = 2
timeout_s = 30
${5:-}
JOB
}
run() {   # run N NAME OUT [worker flags]
  local n=$1 name=$2 out=$3; shift 3
  FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$out timeout 120 "$src/scripts/launch-standalone.sh" "$n" "$tmp/$name.ini" "$@" > /dev/null
}
loss_of() { python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1]) if l.startswith("{")][int(sys.argv[2]) - 1])' "$1" "$2"; }

# 1. Train 4 steps from the file with checkpoints at 2 and 4, then resume at world 3 for 2 more.
job train "$tmp/llama.safetensors" 4 1e-3 "$(printf '[checkpoint]\ndir = ckpt\nevery = 2')"
run 2 train "$tmp/run1" --save "$tmp/final4.safetensors"
sed -i 's/^steps = 4/steps = 6/' "$tmp/train.ini"
run 3 train "$tmp/run2" --save "$tmp/final6.safetensors"
grep -q "resumed from checkpoint step 4" "$tmp/run2/rank-0.log" || { echo "no resume at world 3"; cat "$tmp/run2/rank-0.log"; exit 1; }
[ "$(grep -c '"step"' "$tmp/run2/rank-0.jsonl")" -eq 2 ] || { echo "the resumed run did not run steps 5..6"; exit 1; }

# 2. The first loss against an independent forward of the file (pure Python, float64).
python3 - "$tmp" $L $C $H $KV $F $V $T $THETA "$(loss_of "$tmp/run1/rank-0.jsonl" 1)" <<'PY'
import json, math, struct, sys
d, L, C, H, KV, F, V, T = sys.argv[1], *map(int, sys.argv[2:9])
theta, got = float(sys.argv[9]), float(sys.argv[10])
b = open(f"{d}/llama.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n])
def W(name):
    e = hdr[name]; lo, hi = e["data_offsets"]
    v = struct.unpack(f"<{(hi - lo) // 4}f", b[8 + n + lo:8 + n + hi])
    return [v[r * e["shape"][1]:(r + 1) * e["shape"][1]] for r in range(e["shape"][0])] if len(e["shape"]) == 2 else v
def lin(x, w): return [[sum(a * c for a, c in zip(row, wr)) for wr in w] for row in x]
def rms(x, g): return [[v / math.sqrt(sum(t * t for t in row) / len(row) + 1e-5) * gg for v, gg in zip(row, g)] for row in x]
def rope(v, t):
    h = len(v) // 2; out = list(v)
    for i in range(h):
        a = t * theta ** (-2 * i / len(v)); c, s = math.cos(a), math.sin(a)
        out[i], out[i + h] = v[i] * c - v[i + h] * s, v[i + h] * c + v[i] * s
    return out
tb = open(f"{d}/train.bin", "rb").read()
toks = struct.unpack(f"<{(len(tb) - 1024) // 2}H", tb[1024:])
hs, rows, total = C // H, 4, 0.0   # N·B = 4 rows of step 1 (shuffle = false)
for r in range(rows):
    inp, tgt = toks[r * T:r * T + T], toks[r * T + 1:r * T + T + 1]
    emb = W("model.embed_tokens.weight"); x = [list(emb[t]) for t in inp]
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms(x, W(p + "input_layernorm.weight"))
        q, k, v = lin(h, W(p + "self_attn.q_proj.weight")), lin(h, W(p + "self_attn.k_proj.weight")), lin(h, W(p + "self_attn.v_proj.weight"))
        y = [[0.0] * C for _ in range(T)]
        for hd in range(H):
            kv = hd // (H // KV)
            qs = [rope(q[t][hd * hs:(hd + 1) * hs], t) for t in range(T)]
            ks = [rope(k[t][kv * hs:(kv + 1) * hs], t) for t in range(T)]
            for t in range(T):
                s = [sum(a * c for a, c in zip(qs[t], ks[j])) / math.sqrt(hs) for j in range(t + 1)]
                m = max(s); e = [math.exp(z - m) for z in s]; z = sum(e)
                for c in range(hs): y[t][hd * hs + c] = sum(e[j] / z * v[j][kv * hs + c] for j in range(t + 1))
        x = [[a + c for a, c in zip(xr, orow)] for xr, orow in zip(x, lin(y, W(p + "self_attn.o_proj.weight")))]
        h = rms(x, W(p + "post_attention_layernorm.weight"))
        g, u = lin(h, W(p + "mlp.gate_proj.weight")), lin(h, W(p + "mlp.up_proj.weight"))
        a = [[gg / (1 + math.exp(-gg)) * uu for gg, uu in zip(gr, ur)] for gr, ur in zip(g, u)]
        x = [[s + c for s, c in zip(xr, dr)] for xr, dr in zip(x, lin(a, W(p + "mlp.down_proj.weight")))]
    lg = lin(rms(x, W("model.norm.weight")), W("lm_head.weight"))
    for t in range(T):
        m = max(lg[t]); total += m + math.log(sum(math.exp(z - m) for z in lg[t])) - lg[t][tgt[t]]
want = total / (rows * T)
print(f"step-1 loss {got:.7f}, pure-Python Hugging Face forward {want:.7f}")
assert abs(got - want) <= 1e-5 * abs(want), (got, want)
PY

# 3. Export: names, shapes, LlamaConfig; every tensor equal to what the ranks consolidated.
"$build/fsdpctl" export "$tmp/ckpt" --step 4 -o "$tmp/exp4.safetensors" > /dev/null
cmp "$tmp/final4.safetensors" "$tmp/exp4.safetensors"
mkdir "$tmp/hf"
"$build/fsdpctl" export "$tmp/ckpt" -o "$tmp/hf/model.safetensors" > /dev/null
cmp "$tmp/final6.safetensors" "$tmp/hf/model.safetensors"
python3 - "$tmp" "$tmp/hf" $L $C $H $KV $F $V $T $THETA <<'PY'
import json, struct, sys
d, hf, L, C, H, KV, F, V, T, theta = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:10]), float(sys.argv[10])
def read(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; hdr = json.loads(b[8:8 + n]); hdr.pop("__metadata__", None)
    return {k: (e["shape"], e["dtype"], b[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]]) for k, e in hdr.items()}
src, out, mine = read(f"{d}/llama.safetensors"), read(f"{hf}/model.safetensors"), read(f"{d}/final6.safetensors")
assert {k: v[0] for k, v in out.items()} == {k: v[0] for k, v in src.items()}, set(out) ^ set(src)
assert all(v[1] == "F32" for v in out.values())
assert all(out[k][2] == mine[k][2] for k in out), "export differs from the ranks' own --save"
moved = sum(out[k][2] != src[k][2] for k in out)
assert moved == len(out), f"only {moved} of {len(out)} tensors trained"
cfg = json.load(open(f"{hf}/config.json"))
want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C, "intermediate_size": F,
        "num_attention_heads": H, "num_key_value_heads": KV, "num_hidden_layers": L, "vocab_size": V,
        "max_position_embeddings": T, "rms_norm_eps": 1e-5, "rope_theta": theta, "tie_word_embeddings": False,
        "hidden_act": "silu", "torch_dtype": "float32", "head_dim": C // H, "rope_scaling": None,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
bad = {k: (cfg.get(k, "absent"), v) for k, v in want.items() if k not in cfg or cfg[k] != v}
assert not bad, bad
print(f"export: {len(out)} tensors with the input file's names and shapes, equal to the ranks' --save; LlamaConfig ok")
PY

# fsdpctl sample runs the model through the same interface: the checkpoint and its export agree.
a=$("$build/fsdpctl" sample "$tmp/ckpt" --prompt 01 --tokens 12 --temperature 0)
b=$("$build/fsdpctl" sample "$tmp/hf/model.safetensors" --prompt 01 --tokens 12 --temperature 0)
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "sample: checkpoint '$a', export '$b'"; exit 1; }
echo "sample (greedy) from the checkpoint and from the export: $a"

# 4. Values through the checkpoint: one step at lr 1e-9 moves no weight by more than ~1e-9, so the
#    export equals the input file to 1e-6 tensor by tensor: every name maps to the right place.
job still "$tmp/llama.safetensors" 1 1e-9 "$(printf '[checkpoint]\ndir = ckpt-still\nevery = 1')"
run 2 still "$tmp/run3"
"$build/fsdpctl" export "$tmp/ckpt-still" -o "$tmp/still.safetensors" > /dev/null
python3 - "$tmp/llama.safetensors" "$tmp/still.safetensors" <<'PY'
import json, struct, sys
def read(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; hdr = json.loads(b[8:8 + n]); hdr.pop("__metadata__", None)
    return {k: (e["shape"], struct.unpack(f"<{(e['data_offsets'][1] - e['data_offsets'][0]) // 4}f",
                                          b[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])) for k, e in hdr.items()}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert set(a) == set(b) and all(a[k][0] == b[k][0] for k in a)
worst = max(abs(x - y) for k in a for x, y in zip(a[k][1], b[k][1]))
print(f"step-1 export at lr 1e-9 vs the input file: {len(a)} tensors, max |diff| {worst:.2e}")
assert worst < 1e-6, worst
PY

# 5. With transformers: LlamaForCausalLM loads the export and its loss on step 1's rows equals ours.
TPY=$(bash "$src/scripts/test-env.sh" --check)
{
  mkdir "$tmp/hf0" && cp "$tmp/llama.safetensors" "$tmp/hf0/model.safetensors" && cp "$tmp/hf/config.json" "$tmp/hf0/"
  "$TPY" - "$tmp" "$(loss_of "$tmp/run1/rank-0.jsonl" 1)" $T <<'PY'
import struct, sys, torch
from transformers import LlamaForCausalLM
d, got, T = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
m = LlamaForCausalLM.from_pretrained(f"{d}/hf0", torch_dtype=torch.float64).eval()
tb = open(f"{d}/train.bin", "rb").read()
toks = torch.tensor(struct.unpack(f"<{4 * T + 1}H", tb[1024:1024 + 2 * (4 * T + 1)]))
inp = torch.stack([toks[r * T:r * T + T] for r in range(4)]); tgt = torch.stack([toks[r * T + 1:r * T + T + 1] for r in range(4)])
with torch.no_grad():
    lg = m(inp).logits
loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1)).item()
print(f"transformers LlamaForCausalLM loss {loss:.7f}, ours {got:.7f}")
assert abs(loss - got) <= 1e-5 * abs(loss)
PY
}

# 6. Bad input through `fsdpctl run` (the user's path): exit 1, one line on stderr naming what is
#    wrong, no source location.
bad() {   # bad FILE NEEDLE
  job bad "$tmp/$1" 1 1e-3
  sed -i 's/^world_size = 2/world_size = 1/' "$tmp/bad.ini"
  set +e
  (cd "$tmp" && TMPDIR=$tmp timeout 120 "$build/fsdpctl" run "$tmp/bad.ini" > /dev/null 2> "$tmp/bad.err")
  rc=$?
  set -e
  local msg
  msg=$(cat "$tmp/bad.err")
  [ "$rc" -eq 1 ] && [ "$(wc -l < "$tmp/bad.err")" -eq 1 ] && case "$msg" in *"$2"*) true;; *) false;; esac ||
    { echo "$1: rc $rc: $msg"; exit 1; }
  ! grep -Eq '[a-z_]+\.(c|h):[0-9]+:' <<<"$msg" || { echo "a source location in: $msg"; exit 1; }
  echo "$1: $msg"
}
bad gpt2.safetensors "holds a GPT-2 model (wte.weight, h.0.…); the job is arch = llama"
bad nohead.safetensors "holds no lm_head.weight (a tied model's head is model.embed_tokens.weight); the job has tie_word_embeddings = false: set it true"
bad transposed.safetensors "expected shape [16, 32], found [32, 16] (transposed: Llama stores nn.Linear weights as [out, in])"
echo "llama_hf: ok"
