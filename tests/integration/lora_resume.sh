#!/usr/bin/env bash
# LoRA checkpoints and resume (docs/checkpoints.md "LoRA jobs"), on tiny GPT-2 and Llama folders with
# adapters on attention and MLP (lib/lora_io.py): a straight 10-step 2-rank run against 5 steps
# (checkpointed, asynchronously for GPT-2, synchronously for Llama; GPT-2's adapters replicated, Llama's
# sharded: [lora] adapters) resumed for 5:
#  - on 2 ranks: the losses of steps 6..10 and the final adapters bit for bit the straight run's;
#  - on 1 rank with batch 4 (N·B unchanged): the step-5 adapters it loads bit for bit the saved ones,
#    and steps 6..10 equal the straight run's to fp32 rounding (1e-6 relative: the adapters' gradient
#    is summed in another order);
#  - GPT-2's replicated checkpoint resumed on 2 ranks with the adapters sharded: steps 6..10 equal the
#    straight run's to 1e-6 relative;
#  - the checkpoint holds the adapters and their AdamW state only: one file (replicated: 3 × 4 bytes ×
#    numel and the header) or one per rank (sharded: 3 × 4 bytes × L·Sa each), and its manifest the
#    [lora] settings and the base's path and hash.
# QLoRA ([lora] base_dtype = nf4, a Llama of widths 64): 5 steps on 2 ranks, adapters sharded, resumed on
# 2 ranks bit for bit the straight run; on 1 rank the loaded adapters bit for bit the saved ones and steps
# 6..10 to 1e-6; the sharded checkpoint resumed replicated and a replicated one resumed sharded to 1e-6;
# the dequantized base the workers hold (--save) bit for bit the same on 1, 2 and 3 ranks.
# Refusals at resume, one line and before any step: the base changed (one weight + 1e-3), another
# [lora] rank, alpha or targets, a QLoRA checkpoint over an unquantized base and the reverse, a full job
# on a LoRA checkpoint. Every part runs; the failures are listed at the end.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/fsdp-it-lorares.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
TPY=$(bash "$src/scripts/test-env.sh" --check)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
failed=()
part_fail() { echo "FAIL: $*"; failed+=("$*"); }
cd "$tmp"
"$TPY" "$src/tests/integration/lib/lora_io.py" build "$tmp" > build.log 2>&1 || { tail -20 build.log; exit 1; }

job() {   # job FILE MODEL STEPS WORLD BATCH CKDIR ASYNC [rank [adapters [base_dtype]]]
  local targets="c_attn, c_proj, c_fc"
  case $2 in llama*) targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";; esac
  cat > "$1" <<JOB
[job]
steps = $3
seed = 5
[model]
from = $2
seq_len = 32
[data]
train = train.bin
shuffle = false
batch_size = $5
grad_accum = 1
[optim]
lr = 1e-3
warmup_steps = 0
schedule = constant
weight_decay = 0.1
beta2 = 0.95
grad_clip = 1.0
[fsdp]
world_size = $4
timeout_s = 60
[checkpoint]
dir = $6
every = 5
async = $7
[lora]
rank = ${8:-4}
alpha = 8
targets = $targets
init_from = init_${2%_copy}
adapters = ${9:-auto}
base_dtype = ${10:-auto}
JOB
}
run() {   # run NAME WORLD [FLAGS...]: the job NAME.ini, its adapters saved to out-NAME/adapter
  FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$1 timeout 120 "$src/scripts/launch-standalone.sh" "$2" "$1.ini" \
    --save-adapter "$tmp/out-$1/adapter" "${@:3}" > /dev/null 2>&1
}
losses() { python3 -c 'import json,sys; print(" ".join(repr(d["loss"]) for d in map(json.loads, open(sys.argv[1])) if "loss" in d))' "$1"; }

for m in gpt2 llama; do
  async=$([ $m = gpt2 ] && echo true || echo false)
  layout=$([ $m = gpt2 ] && echo replicated || echo sharded)
  job $m-straight.ini $m 10 2 2 ck-$m-straight $async 4 $layout
  job $m-half.ini $m 5 2 2 ck-$m $async 4 $layout
  run $m-straight 2 || { part_fail "$m: the straight run failed: $(tail -1 out-$m-straight/rank-0.log)"; continue; }
  run $m-half 2 || { part_fail "$m: the first 5 steps failed: $(tail -1 out-$m-half/rank-0.log)"; continue; }
  "$build/fsdpctl" plan $m-half.ini --json > plan-$m.json
  python3 - ck-$m/step-00000005 "$tmp/$m/model.safetensors" plan-$m.json $layout <<'PY' || part_fail "$m: the checkpoint's files or manifest"
import json, os, sys
d, layout = sys.argv[1], sys.argv[4]
plan = json.load(open(sys.argv[3]))["lora"]
assert plan["adapters"] == layout, plan
writers = 1 if layout == "replicated" else 2
files = [f"rank-{q}.bin" for q in range(writers)]
assert sorted(os.listdir(d)) == ["manifest.json"] + files, os.listdir(d)
m = json.load(open(f"{d}/manifest.json"))
numel, held = m["lora"]["numel"], plan["adapter_elements_held"]
assert held == (numel if writers == 1 else held) and (writers == 1 or 2 * held >= numel), (numel, held)
for f in files:   # three sections of 4·held bytes, each from a page; the header below the first page
    size = os.path.getsize(f"{d}/{f}")
    assert 3 * 4 * held <= size <= 3 * 4 * held + 4 * 4096, (f, size, held)
assert m["world"] == writers and m["lora"]["rank"] == 4 and m["lora"]["alpha"] == 8, m
assert m["base"]["init"] == sys.argv[2] and m["base"]["hash"].startswith("crc32c:"), m["base"]
print(f"checkpoint ({layout}): {writers} file(s) of {held} of the {numel} adapter elements and their AdamW state; "
      f"base {m['base']['hash']}")
PY
  for w in 2 1; do
    cp -r ck-$m ck-$m-w$w
    job $m-w$w.ini $m 10 $w $((4 / w)) ck-$m-w$w $async 4 $([ $w = 2 ] && echo $layout || echo auto)
    run $m-w$w $w || { part_fail "$m: the resume on $w rank(s) failed: $(tail -1 out-$m-w$w/rank-0.log)"; continue; }
    want=$(losses out-$m-straight/rank-0.jsonl | cut -d' ' -f6-) got=$(losses out-$m-w$w/rank-0.jsonl)
    if [ $w = 2 ]; then
      ok=1
      [ "$got" = "$want" ] || { ok=0; part_fail "$m: resumed on 2 ranks, steps 6..10 lost $got, the straight run $want"; }
      cmp -s out-$m-straight/adapter/adapter_model.safetensors out-$m-w2/adapter/adapter_model.safetensors ||
        { ok=0; part_fail "$m: resumed on 2 ranks, the adapters are not bit for bit the straight run's"; }
      [ $ok = 0 ] || echo "$m: resumed on 2 ranks, steps 6..10 and the adapters bit for bit the straight run's ($got)"
    else
      python3 - "$got" "$want" <<'PY' || part_fail "$m: resumed on 1 rank, steps 6..10 lost $got, the straight run $want"
import sys
g, w = [list(map(float, a.split())) for a in sys.argv[1:3]]
assert len(g) == len(w) == 5 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(g, w)), (g, w)
print(f"resumed on 1 rank, batch 4: steps 6..10 {g} (2 ranks: {w})")
PY
      # the state it resumes from: with steps = 5 nothing is trained, and the adapters saved are the loaded ones
      cp -r ck-$m ck-$m-load1
      job $m-load1.ini $m 5 1 4 ck-$m-load1 $async
      run $m-load1 1 || part_fail "$m: loading on 1 rank failed: $(tail -1 out-$m-load1/rank-0.log)"
      cmp -s out-$m-half/adapter/adapter_model.safetensors out-$m-load1/adapter/adapter_model.safetensors ||
        part_fail "$m: the step-5 adapters loaded on 1 rank are not bit for bit those 2 ranks saved"
    fi
  done
done

# the replicated checkpoint into sharded adapters on 2 ranks
cp -r ck-gpt2 ck-gpt2-sh
job gpt2-sh.ini gpt2 10 2 2 ck-gpt2-sh true 4 sharded
if run gpt2-sh 2; then
  python3 - "$(losses out-gpt2-sh/rank-0.jsonl)" "$(losses out-gpt2-straight/rank-0.jsonl | cut -d' ' -f6-)" <<'PY' ||
import sys
g, w = [list(map(float, a.split())) for a in sys.argv[1:3]]
assert len(g) == len(w) == 5 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(g, w)), (g, w)
print(f"gpt2: the replicated checkpoint resumed with sharded adapters: steps 6..10 {g} (replicated: {w})")
PY
    part_fail "gpt2: resumed with sharded adapters, steps 6..10 are not the straight run's"
else
  part_fail "gpt2: the resume with sharded adapters failed: $(tail -1 out-gpt2-sh/rank-0.log)"
fi

# QLoRA ([lora] base_dtype = nf4) on the wide Llama (every width a multiple of 64, as NF4's blocks need),
# its GEMMs in fp32 (FSDP_CPU_BF16=off: the 1-rank tolerance is fp32's, not AVX512-BF16's)
"$TPY" "$src/tests/integration/lib/lora_io.py" build "$tmp" wide > build-wide.log 2>&1 ||
  { tail -20 build-wide.log; exit 1; }
export FSDP_CPU_BF16=off
qrun() {   # qrun NAME WORLD STEPS BATCH CKDIR ADAPTERS [FLAGS...]: the QLoRA job NAME.ini, run
  job $1.ini llama_w $3 $2 $4 $5 false 4 $6 nf4
  run $1 $2 "${@:7}" || { part_fail "qlora: $1 on $2 rank(s) failed: $(tail -1 out-$1/rank-0.log)"; return 1; }
}
near() {   # near WHAT GOT WANT: 5 losses each within fp32 rounding (1e-6 relative) of the other's
  if python3 - "$2" "$3" <<'PY'
import sys
g, w = [list(map(float, a.split())) for a in sys.argv[1:3]]
assert len(g) == len(w) == 5 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(g, w)), (g, w)
PY
  then echo "qlora: $1: steps 6..10 within 1e-6 of the straight run's ($2)"
  else part_fail "qlora: $1: steps 6..10 lost $2, the straight run $3"
  fi
}
if qrun q-straight 2 10 2 ck-q-straight sharded && qrun q-half 2 5 2 ck-q sharded --save "$tmp/base-w2.safetensors" &&
   qrun q-halfrep 2 5 2 ck-qrep replicated; then
  python3 - ck-q/step-00000005 ck-qrep/step-00000005 <<'PY' || part_fail "qlora: the checkpoints' manifests"
import json, os, sys
for d, files in zip(sys.argv[1:], (2, 1)):
    m = json.load(open(f"{d}/manifest.json"))
    assert m["lora"].get("base_dtype") == "nf4" and m["world"] == files, m
    assert sorted(os.listdir(d)) == ["manifest.json"] + [f"rank-{q}.bin" for q in range(files)], os.listdir(d)
print("qlora: the sharded checkpoint's 2 files and the replicated one's 1, each manifest naming base_dtype nf4")
PY
  want=$(losses out-q-straight/rank-0.jsonl | cut -d' ' -f6-)
  # on 2 ranks, sharded as written: bit for bit
  cp -r ck-q ck-q-w2
  if qrun q-w2 2 10 2 ck-q-w2 sharded; then
    got=$(losses out-q-w2/rank-0.jsonl) ok=1
    [ "$got" = "$want" ] ||
      { ok=0; part_fail "qlora: resumed on 2 ranks, steps 6..10 lost $got, the straight run $want"; }
    cmp -s out-q-straight/adapter/adapter_model.safetensors out-q-w2/adapter/adapter_model.safetensors ||
      { ok=0; part_fail "qlora: resumed on 2 ranks, the adapters are not bit for bit the straight run's"; }
    [ $ok = 0 ] || echo "qlora: resumed on 2 ranks, steps 6..10 and the adapters bit for bit the straight run's ($got)"
  fi
  # on 1 rank, batch 4 (N·B unchanged): the step-5 adapters it loads bit for bit the saved ones, then fp32
  # rounding (the gradient summed in another order); its base is the 2-rank job's bit for bit
  cp -r ck-q ck-q-w1
  qrun q-w1 1 10 4 ck-q-w1 auto --save "$tmp/base-w1.safetensors" &&
    near "resumed on 1 rank" "$(losses out-q-w1/rank-0.jsonl)" "$want"
  cp -r ck-q ck-q-load1
  if qrun q-load1 1 5 4 ck-q-load1 auto; then
    cmp -s out-q-half/adapter/adapter_model.safetensors out-q-load1/adapter/adapter_model.safetensors ||
      part_fail "qlora: the step-5 adapters loaded on 1 rank are not bit for bit those 2 ranks saved"
  fi
  # the sharded checkpoint into replicated adapters, the replicated one into sharded adapters, on 2 ranks
  cp -r ck-q ck-q-rep
  qrun q-rep 2 10 2 ck-q-rep replicated &&
    near "sharded checkpoint resumed replicated" "$(losses out-q-rep/rank-0.jsonl)" "$want"
  cp -r ck-qrep ck-qrep-sh
  qrun q-rep-sh 2 10 2 ck-qrep-sh sharded &&
    near "replicated checkpoint resumed sharded" "$(losses out-q-rep-sh/rank-0.jsonl)" "$want"
  # the base as the workers hold it (gathered NF4 bytes dequantized, --save) is the same on 1, 2 and 3 ranks:
  # each rank quantizes whole tensors, whatever part of them its byte range holds; 3 ranks cut them elsewhere
  qrun q-w3 3 1 1 ck-q-w3 sharded --save "$tmp/base-w3.safetensors" || true
  "$TPY" - "$tmp/llama_w/model.safetensors" base-w1.safetensors base-w2.safetensors base-w3.safetensors <<'PY' ||
import sys
import torch
from safetensors.torch import load_file
orig, *got = [load_file(f) for f in sys.argv[1:]]
assert got[0].keys() == orig.keys(), (sorted(got[0].keys()), sorted(orig.keys()))
for k in orig:
    for w, g in zip((2, 3), got[1:]):
        assert g[k].shape == got[0][k].shape and g[k].view(torch.int32).equal(got[0][k].view(torch.int32)), \
            f"{k}: {w} ranks' base differs from 1 rank's"
quant = [k for k in orig if ".layers." in k and orig[k].dim() == 2]
assert quant and all(not got[0][k].equal(orig[k]) for k in quant), "the blocks' 2-D tensors are not the NF4 base's"
print(f"qlora: the dequantized base bit for bit the same on 1, 2 and 3 ranks ({len(orig)} tensors; the "
      f"{len(quant)} quantized ones differ from the fp32 weights, as NF4 does)")
PY
    part_fail "qlora: the base the workers hold differs between world sizes"
fi

# Refusals at resume: one line in the failing rank's log and the job fails
refused() {   # refused WHAT NAME WORLD PATTERN
  if run "$2" "$3"; then part_fail "$1: the resume was accepted"; return; fi
  local line
  line=$(grep -h "ERROR" out-$2/rank-0.log | grep -- "$4" | head -1 || true)
  [ -n "$line" ] || { part_fail "$1: no line says '$4': $(tail -2 out-$2/rank-0.log)"; return; }
  ! grep -q '"loss"' out-$2/rank-0.jsonl || { part_fail "$1: refused after training a step"; return; }
  echo "refused, $1: $(echo "$line" | sed "s/.*ERROR *//")"
}
cp -r gpt2 gpt2_copy
job copy-half.ini gpt2_copy 5 2 2 ck-copy true
run copy-half 2 || part_fail "the run over a copy of the base failed: $(tail -1 out-copy-half/rank-0.log)"
"$TPY" "$src/tests/integration/lib/lora_io.py" perturb gpt2_copy/model.safetensors 2> /dev/null
job copy-resume.ini gpt2_copy 10 2 2 ck-copy true
refused "the base changed" copy-resume 2 "hashes to"
cp -r ck-gpt2 ck-rank
job rank.ini gpt2 10 2 2 ck-rank true 8
sed -i '/^init_from/d' rank.ini
refused "another [lora] rank" rank 2 "holds adapters of rank 4"
cp -r ck-gpt2 ck-alpha
job alpha.ini gpt2 10 2 2 ck-alpha true
sed -i 's/^alpha = .*/alpha = 16/; /^init_from/d' alpha.ini
refused "another [lora] alpha" alpha 2 "this job's \\[lora\\] is rank 4, alpha 16"
cp -r ck-gpt2 ck-targets
job targets.ini gpt2 10 2 2 ck-targets true
sed -i 's/^targets = .*/targets = c_attn/; /^init_from/d' targets.ini
refused "other [lora] targets" targets 2 "alpha 8 on .*; this job's \\[lora\\] is rank 4, alpha 8 on"
if [ -d ck-q ]; then   # QLoRA's checkpoint into an unquantized base, and the reverse
  cp -r ck-q ck-q-plain
  job q-plain.ini llama_w 10 2 2 ck-q-plain false 4 sharded
  refused "a QLoRA checkpoint, base_dtype auto" q-plain 2 "trained over their base quantized to NF4"
  job w-half.ini llama_w 5 2 2 ck-w false 4 sharded
  if run w-half 2; then
    job w-nf4.ini llama_w 10 2 2 ck-w false 4 sharded nf4
    refused "an unquantized base's checkpoint, base_dtype nf4" w-nf4 2 "trained over an unquantized base"
  else
    part_fail "the wide Llama's unquantized LoRA run failed: $(tail -1 out-w-half/rank-0.log)"
  fi
fi
cp -r ck-gpt2 ck-full
job full.ini gpt2 10 2 2 ck-full true
sed -i '/^\[lora\]/,$d' full.ini
if FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-full timeout 120 "$src/scripts/launch-standalone.sh" 2 full.ini \
  > /dev/null 2>&1; then
  part_fail "a full job on a LoRA checkpoint: accepted"
else
  grep -q "holds LoRA adapters" out-full/rank-0.log || part_fail "a full job on a LoRA checkpoint: $(tail -1 out-full/rank-0.log)"
  echo "refused, a full job: $(grep -h "holds LoRA adapters" out-full/rank-0.log | head -1 | sed 's/.*ERROR *//')"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "${#failed[@]} part(s) failed:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "lora_resume: all parts passed"
