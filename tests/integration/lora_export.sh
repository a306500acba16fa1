#!/usr/bin/env bash
# A LoRA checkpoint's export and samples against peft (docs/models.md "LoRA"), on tiny GPT-2 and Llama
# folders with adapters on attention and MLP (lib/lora_io.py), after 10 steps on 2 ranks:
#  - fsdpctl export CKPT -o DIR writes a PEFT folder: PeftModel.from_pretrained(base, DIR)'s logits of a
#    prompt are the reference;
#  - fsdpctl sample CKPT --logits (base + the checkpoint's adapters), fsdpctl sample BASE --adapter DIR,
#    fsdpctl sample of the --merge export and transformers' from_pretrained of it equal the reference to
#    1e-5 of its largest logit (fp32 rounding over reductions of 32..128 terms); the base alone does not
#    (the control: the adapters change the logits by far more);
#  - --merge --dtype bf16 writes BF16 weights, the base's dtype (fp32) otherwise.
# Refusals, one line: --merge of a full checkpoint, a LoRA checkpoint to one .safetensors file,
# --adapter of another base's adapter, --merge of a LoRA job's over init = random (no base files); the
# PEFT export of that job names no base (base_model_name_or_path null), GPT-2's its folder.
# Every part runs; the failures are listed at the end.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/fsdp-it-loraexp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
TPY=$(bash "$src/scripts/test-env.sh" --check)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
CTL=$build/fsdpctl
export FSDP_WORKER=$build/fsdp-worker
failed=()
part_fail() { echo "FAIL: $*"; failed+=("$*"); }
cd "$tmp"
IO=$src/tests/integration/lib/lora_io.py
"$TPY" "$IO" build "$tmp" > build.log 2>&1 || { tail -20 build.log; exit 1; }
prompt="To be, or not to be"

for m in gpt2 llama; do
  targets="c_attn, c_proj, c_fc"
  [ $m = llama ] && targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
  cat > $m.ini <<JOB
[job]
steps = 10
seed = 5
[model]
from = $m
seq_len = 32
[data]
train = train.bin
batch_size = 2
[optim]
lr = 1e-2
warmup_steps = 0
[fsdp]
world_size = 2
timeout_s = 60
[checkpoint]
dir = ck-$m
every = 10
[lora]
rank = 4
alpha = 8
targets = $targets
init_from = init_$m
JOB
  FSDP_OUT=$tmp/out-$m timeout 120 "$src/scripts/launch-standalone.sh" 2 $m.ini > /dev/null 2>&1 ||
    { part_fail "$m: the LoRA job failed: $(tail -1 out-$m/rank-0.log)"; continue; }
  "$CTL" export ck-$m -o peft-$m > export.log 2>&1 || { part_fail "$m: export: $(cat export.log)"; continue; }
  cat export.log
  "$CTL" export ck-$m -o merged-$m --merge > export.log 2>&1 || part_fail "$m: export --merge: $(cat export.log)"
  cat export.log
  grep -q "step 10 of a LoRA job's checkpoint, its adapters (rank 4, alpha 8 on .*) merged into the base " export.log ||
    part_fail "$m: export --merge does not say it merged the LoRA job's checkpoint: $(cat export.log)"
  "$CTL" export ck-$m -o merged16-$m --merge --dtype bf16 > export.log 2>&1 ||
    part_fail "$m: export --merge --dtype bf16: $(cat export.log)"
  python3 - merged-$m/model.safetensors F32 merged16-$m/model.safetensors BF16 <<'PY' || part_fail "$m: the merged dtypes"
import json, struct, sys
for path, want in zip(sys.argv[1::2], sys.argv[2::2]):
    with open(path, "rb") as f:
        h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    got = {v["dtype"] for k, v in h.items() if k != "__metadata__"}
    assert got == {want}, (path, got, want)
PY
  "$CTL" sample ck-$m --prompt "$prompt" --logits > ck-$m.json 2> err || part_fail "$m: sample CKPT: $(cat err)"
  "$CTL" sample $m --adapter peft-$m --prompt "$prompt" --logits > ad-$m.json 2> err ||
    part_fail "$m: sample --adapter: $(cat err)"
  "$CTL" sample merged-$m --prompt "$prompt" --logits > mg-$m.json 2> err || part_fail "$m: sample merged: $(cat err)"
  "$TPY" "$IO" verify $m peft-$m merged-$m "$prompt" ck-$m.json ad-$m.json mg-$m.json > verify.log 2>&1 ||
    part_fail "$m: the logits are not peft's (above)"
  grep -e difference -e control verify.log || tail -5 verify.log
done

# Refusals: one line on stderr, exit status non-zero
refuse() {   # refuse WHAT PATTERN COMMAND...
  local what=$1 pat=$2
  shift 2
  if "$@" > /dev/null 2> err; then part_fail "$what: accepted"; return; fi
  [ "$(wc -l < err)" -eq 1 ] || part_fail "$what: not one line: $(cat err)"
  grep -q -- "$pat" err || part_fail "$what: the line does not say '$pat': $(cat err)"
  echo "refused, $what: $(cat err)"
}
sed -e '/^\[lora\]/,$d' gpt2.ini > full.ini
sed -i 's/^dir = .*/dir = ck-full/; s/^steps = .*/steps = 2/; s/^every = .*/every = 2/' full.ini
FSDP_OUT=$tmp/out-full timeout 120 "$src/scripts/launch-standalone.sh" 2 full.ini > /dev/null 2>&1 ||
  part_fail "the full job failed: $(tail -1 out-full/rank-0.log)"
refuse "--merge of a full checkpoint" "no LoRA adapters to merge" "$CTL" export ck-full -o m-full --merge
refuse "a LoRA checkpoint to one file" "exports as a folder" "$CTL" export ck-gpt2 -o one.safetensors
refuse "--adapter of another base" "--adapter" "$CTL" sample gpt2 --adapter peft-llama --prompt "$prompt" --logits
# a LoRA job over init = random: its adapters export, a merge has no base files to merge into
cat > rnd.ini <<JOB
[job]
steps = 2
seed = 7
[model]
arch = llama
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 16
ffn_dim = 32
vocab_size = 64
seq_len = 16
[data]
train = synthetic:markov:1
batch_size = 2
[fsdp]
world_size = 2
timeout_s = 60
[checkpoint]
dir = ck-rnd
every = 2
[lora]
rank = 2
JOB
FSDP_OUT=$tmp/out-rnd timeout 120 "$src/scripts/launch-standalone.sh" 2 rnd.ini > /dev/null 2>&1 ||
  part_fail "the random-base LoRA job failed: $(tail -1 out-rnd/rank-0.log)"
"$CTL" export ck-rnd -o peft-rnd > export.log 2>&1 || part_fail "export of the random-base adapters: $(cat export.log)"
refuse "--merge over a random base" "trained over a random base (init = random, seed 7), which has no files" \
  "$CTL" export ck-rnd -o m-rnd --merge
[ ! -e m-rnd ] || part_fail "the refused --merge left m-rnd behind"
# base_model_name_or_path: the model folder, which AutoPeftModelForCausalLM loads the base from; null (peft's
# own for a base without a name) for a random base, never a name no from_pretrained can load
"$TPY" - peft-rnd peft-gpt2 "$tmp/gpt2" <<'PY' 2> peft.err ||
import json, sys
from peft import AutoPeftModelForCausalLM, PeftConfig
rnd, folder, src = sys.argv[1:]
assert json.load(open(f"{rnd}/adapter_config.json"))["base_model_name_or_path"] is None
assert PeftConfig.from_pretrained(rnd).base_model_name_or_path is None
assert PeftConfig.from_pretrained(folder).base_model_name_or_path == src, PeftConfig.from_pretrained(folder)
AutoPeftModelForCausalLM.from_pretrained(folder)
print(f"the random base's PEFT export names no base (null); {folder}'s names {src}, which AutoPeftModelForCausalLM loads")
PY
  part_fail "the PEFT exports' base_model_name_or_path: $(tail -3 peft.err)"

if [ ${#failed[@]} -gt 0 ]; then
  echo "${#failed[@]} part(s) failed:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "lora_export: all parts passed"
