#!/usr/bin/env bash
# plan_cli — `fsdpctl plan` on good and bad job files: exit codes, one-line errors that name
# file:line, --json that parses, --device-memory verdicts, --defaults that loads back, a Llama's
# table, hybrid sharding with --shard-group (both traffic classes; bad groups refused in one line).
# Usage: plan_cli.sh BUILD_DIR SOURCE_DIR
set -u
BUILD=$(cd "${1:?build dir}" && pwd)
SRC=$(cd "${2:?source dir}" && pwd)
CTL="$BUILD/fsdpctl"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
pass=0

ok() { pass=$((pass + 1)); }
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# run EXPECTED_RC ARGS...: runs fsdpctl, keeps stdout/stderr in $TMP/out, $TMP/err
run() {
  local want=$1; shift
  "$CTL" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "fsdpctl $* exited $rc, want $want; stderr: $(head -c 400 "$TMP/err")"
    return 1
  fi
  ok
}

# bad NAME LINE NEEDLE TEXT: a job file that must fail with exit 2 and one stderr line
# "fsdpctl: .../NAME:LINE: ...NEEDLE..."
bad() {
  local name=$1 line=$2 needle=$3 text=$4
  printf '%b' "$text" >"$TMP/$name"
  run 1 plan "$TMP/$name" || return   # a malformed job file: status 1, as for submit and run (docs/cli.md)
  local n
  n=$(wc -l <"$TMP/err")
  [ "$n" -eq 1 ] || { fail "$name: $n stderr lines, want 1: $(cat "$TMP/err")"; return; }
  grep -q "^fsdpctl: $TMP/$name:$line: " "$TMP/err" || { fail "$name: no '$TMP/$name:$line:' in: $(cat "$TMP/err")"; return; }
  grep -qF -- "$needle" "$TMP/err" || { fail "$name: no '$needle' in: $(cat "$TMP/err")"; return; }
  [ -s "$TMP/out" ] && { fail "$name: wrote to stdout on error"; return; }
  ok
}

# usage_err TEXT_NEEDLE ARGS...: exit 2 with one stderr line
usage_err() {
  local needle=$1; shift
  run 2 "$@" || return
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || { fail "fsdpctl $*: want one stderr line, got: $(cat "$TMP/err")"; return; }
  grep -qF -- "$needle" "$TMP/err" || { fail "fsdpctl $*: no '$needle' in: $(cat "$TMP/err")"; return; }
  ok
}

[ -x "$CTL" ] || { echo "FAIL: $CTL not built" >&2; exit 1; }

# --- good files ---
run 0 plan --help && grep -q -- "--device-memory" "$TMP/out" && ok || fail "--help text"
run 0 plan "$SRC/examples/tiny.ini" && grep -q "170,560" "$TMP/out" && ok || fail "tiny.ini table: no 170,560"
# a Llama: Hugging Face's names, the arch and its keys in the table and in --json
run 0 plan "$SRC/examples/llama-tiny.ini" && grep -q "model.layers.0.self_attn.k_proj.weight  *\[32, 64\]" "$TMP/out" &&
  grep -q "^Model     llama .* KV=2  HD=[0-9]*  F=176" "$TMP/out" && ok || fail "llama-tiny.ini table"
run 0 plan "$SRC/examples/llama-tiny.ini" --json && python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
m = p["model"]
assert m["arch"] == "llama" and m["n_kv_head"] == 2 and m["ffn_dim"] == 176, m
names = [t["name"] for u in p["units"] for t in u["tensors"]]
assert names[:3] == ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"], names[:3]
assert names[-1] == "model.layers.1.mlp.down_proj.weight" and len(names) == 3 + 2 * 9, names
assert p["n_params"] == sum(t["numel"] for u in p["units"] for t in u["tensors"])
' "$TMP/out" && ok || fail "llama-tiny.ini --json"
# relative paths resolve against the job file, not the cwd
(cd / && "$CTL" plan "$SRC/examples/gpt2-small.ini" >/dev/null 2>&1) && ok || fail "gpt2-small.ini from /"

run 0 plan "$SRC/examples/gpt2-small.ini" --json
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["n_params"] == 124439808, d["n_params"]
assert d["world"] == 8 and d["shard_world"] == 8
assert len(d["units"]) == 13
u = d["units"][1]
assert u["tensors"][2]["name"] == "h.0.attn.c_attn.weight" and u["tensors"][2]["shape"] == [768, 2304]
for unit in d["units"]:
    cover = sorted((s["offset"], s["length"]) for s in unit["shards"])
    pos = 0
    for off, n in cover:
        assert off == pos, (unit["name"], off, pos)
        pos += n
    assert pos == unit["padded"] >= unit["numel"]
m = d["memory"]
assert m["total"] == sum(v for k, v in m.items() if k != "total")
' "$TMP/out" && ok || fail "gpt2-small --json content"

run 0 plan "$SRC/examples/gpt2-small.ini" --world 3 --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["world"] == 3' "$TMP/out" && ok || fail "--world 3"

run 0 plan "$SRC/examples/gpt2-small.ini" --device-memory 80GiB && grep -q "fits" "$TMP/out" && ok || fail "80GiB fits"
run 0 plan "$SRC/examples/gpt2-small.ini" --device-memory=85899345920 && ok || fail "plain integer bytes"

# A job that does not fit on one rank but does on more: exit 3 and the smallest world size.
cat >"$TMP/medium.ini" <<'EOF'
[model]
n_layer = 24
n_head = 16
n_embd = 1024
[data]
train = synthetic:markov:1
batch_size = 1
grad_accum = 1
EOF
run 3 plan "$TMP/medium.ini" --device-memory 6GiB
w=$(sed -n 's/.*smallest world size that fits is \([0-9]*\).*/\1/p' "$TMP/err")
if [ -n "$w" ] && [ "$w" -gt 1 ]; then
  ok
  run 0 plan "$TMP/medium.ini" --device-memory 6GiB --world "$w"
  run 3 plan "$TMP/medium.ini" --device-memory 6GiB --world $((w - 1))
else
  fail "no smallest world size in: $(cat "$TMP/err")"
fi
run 3 plan "$TMP/medium.ini" --device-memory 6G --json
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["device_memory"]["fits"] is False and d["device_memory"]["min_world"] > 1
' "$TMP/out" && ok || fail "--json device_memory"

# --defaults is a job file: with a train source it plans as GPT-2 small.
run 0 plan --defaults
{ cat "$TMP/out"; printf '\n[data]\ntrain = synthetic:markov:5\n'; } >"$TMP/defaults.ini"
run 0 plan "$TMP/defaults.ini" --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["n_params"] == 124439808' "$TMP/out" \
  && ok || fail "--defaults round trip"

# --- bad files: one class each ---
T='[data]\ntrain = synthetic:markov:1\n'
bad unknown_key.ini 4 "unknown key 'n_layers'" "${T}[model]\nn_layers = 4\n"
bad unknown_section.ini 3 "unknown section [modle]" "${T}[modle]\nn_layer = 4\n"
bad malformed.ini 5 "not an integer; allowed" "${T}[model]\n# comment\nn_layer = 4x\n"
bad malformed_float.ini 4 "not a number; allowed" "${T}[optim]\nlr = 6e-4e\n"
bad heads.ini 5 "not divisible by n_head" "${T}[model]\nn_head = 12\nn_embd = 100\n"
bad world0.ini 4 "world_size = 0 is out of range; allowed: an integer in 1..4096" "${T}[fsdp]\nworld_size = 0\n"
bad nofile.ini 2 "cannot read" "[data]\ntrain = no/such/tokens.bin\n"
bad notrain.ini 1 "train is required" "[data]\nbatch_size = 2\n"
# --fit: the largest batch, as text and under "fit" in --json; it needs --device-memory
run 0 plan "$SRC/examples/gpt2-small.ini" --device-memory 80GiB --fit && grep -q "largest batch_size that fits" "$TMP/out" &&
  grep -q "activation_checkpointing = full" "$TMP/out" && ok || fail "--fit text: $(cat "$TMP/out" | tail -8)"
run 0 plan "$SRC/examples/gpt2-small.ini" --device-memory 80GiB --fit --json && python3 -c '
import json, sys
f = json.load(open(sys.argv[1]))["fit"]
assert f["batch_size"] >= 1 and f["levers"], f
' "$TMP/out" && ok || fail "--fit --json has no fit.batch_size"
run 3 plan "$SRC/examples/gpt2-small.ini" --device-memory 100MiB --fit && grep -q "nothing fits: batch_size 1 needs" "$TMP/out" &&
  ok || fail "--fit with too little memory: $(tail -4 "$TMP/out")"
usage_err "--fit needs --device-memory" plan "$SRC/examples/tiny.ini" --fit
usage_err "more than this machine's" plan "$SRC/examples/tiny.ini" --device-memory 64TiB
bad offload.ini 4 "offload = optimizer moves optimizer state off the GPU" "${T}[fsdp]\noffload = optimizer\n"
bad cpu_bf17.ini 4 "allowed: fp32 | bf16" "${T}[fsdp]\nparam_dtype = bf17\n"
# mixed precision plans on the CPU too: bf16 gathers, fp32 master
printf '%b' "${T}[fsdp]\nparam_dtype = bf16\nreduce_dtype = bf16\n" >"$TMP/cpu_bf16.ini"
run 0 plan "$TMP/cpu_bf16.ini" --json && python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["param_dtype"] == "bf16" and j["reduce_dtype"] == "bf16", j
' "$TMP/out" && ok || fail "cpu_bf16.ini: plan --json does not show the bf16 dtypes"
bad syntax.ini 3 "syntax error" "${T}[model\n"
# hybrid: --shard-group (or the file's shard_group) gives G; both traffic classes in the table and JSON
printf '%b' "${T}[fsdp]\nworld_size = 4\nsharding = hybrid\n" >"$TMP/hybrid.ini"
usage_err "give it here with --shard-group G" plan "$TMP/hybrid.ini"
run 0 plan "$TMP/hybrid.ini" --shard-group 2 && grep -q "^Groups    2 shard groups of 2 consecutive ranks" "$TMP/out" &&
  grep -q "^  intra " "$TMP/out" && grep -q "^  inter " "$TMP/out" && ok || fail "hybrid.ini --shard-group 2: $(cat "$TMP/out" "$TMP/err")"
run 0 plan "$TMP/hybrid.ini" --shard-group=2 --json && python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["sharding"] == "hybrid" and j["shard_world"] == 2 and j["groups"] == 2, j
x, i = j["sent_bytes_inter_group"], j["sent_bytes_intra_group"]
assert x["allgather"] == 0 and x["allreduce"] > 0 and i["allgather"] > 0 and i["allreduce"] == 0, (x, i)
assert all(x[k] + i[k] == j["sent_bytes"][k] for k in ("allgather", "reducescatter", "allreduce")), j
' "$TMP/out" && ok || fail "hybrid.ini --json: intra and inter bytes"
usage_err "does not divide world_size = 4" plan "$TMP/hybrid.ini" --shard-group 3
usage_err "is full sharding" plan "$TMP/hybrid.ini" --shard-group 4
usage_err "applies to sharding = hybrid" plan "$SRC/examples/tiny.ini" --shard-group 2
bad hybrid_nodiv.ini 6 "shard_group = 4 does not divide world_size = 6" "${T}[fsdp]\nworld_size = 6\nsharding = hybrid\nshard_group = 4\n"
# [lora] with offload = optimizer: the adapters' master and AdamW state leave the device for the host
# (16 bytes an element held: master, m, v, gradient staging); the frozen base stays
sed 's/^\[fsdp\]$/[fsdp]\noffload = optimizer/' "$SRC/examples/llama-70b-qlora.ini" >"$TMP/qlora_off.ini"
run 0 plan "$TMP/qlora_off.ini" && grep -q "optim_state .*0: the adapters' AdamW m and v are on the host" "$TMP/out" &&
  grep -q "^  host .*the adapters' fp32 master, AdamW m and v, gradient staging: 16·SA" "$TMP/out" && ok ||
  fail "qlora_off.ini: the plan does not say the adapters' state is on the host: $(cat "$TMP/out" "$TMP/err")"
run 0 plan "$SRC/examples/llama-70b-qlora.ini" --json && cp "$TMP/out" "$TMP/qlora.json" &&
  run 0 plan "$TMP/qlora_off.ini" --json && python3 -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
n = b["lora"]["adapter_elements_held"]
assert a["host_bytes"] == 0 and a["lora"]["adapter_host_bytes"] == 0 and a["lora"]["adamw_bytes"] == 8 * n, a["lora"]
assert b["offload"] == "optimizer" and b["host_bytes"] == b["lora"]["adapter_host_bytes"] == 16 * n, b["lora"]
assert b["lora"]["adamw_bytes"] == 0 and b["memory"]["optim_state"] == 0, b["memory"]
assert b["memory"]["param_shard"] == a["memory"]["param_shard"] - 4 * n, (a["memory"], b["memory"])
assert b["lora"]["base_bytes"] == a["lora"]["base_bytes"], b["lora"]
' "$TMP/qlora.json" "$TMP/out" && ok || fail "qlora_off.ini --json: the adapters' host bytes"
run 1 plan "$TMP/does-not-exist.ini" && grep -q "cannot read the job file" "$TMP/err" && ok || fail "a missing job file: status 1"
usage_err "no job file" plan
usage_err "--device-memory" plan "$SRC/examples/tiny.ini" --device-memory 80XB
usage_err "--device-memory" plan "$SRC/examples/tiny.ini" --device-memory -5
usage_err "--world" plan "$SRC/examples/tiny.ini" --world 0
usage_err "unknown option" plan "$SRC/examples/tiny.ini" --wrold 2

echo "plan_cli: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
