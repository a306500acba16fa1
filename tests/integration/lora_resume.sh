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
# Refusals at resume, one line: the base changed (one weight + 1e-3), another [lora] rank, a full job
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

job() {   # job FILE MODEL STEPS WORLD BATCH CKDIR ASYNC [rank [adapters]]
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
JOB
}
run() {   # run NAME WORLD: the job NAME.ini, its adapters saved to out-NAME/adapter
  FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$1 timeout 120 "$src/scripts/launch-standalone.sh" "$2" "$1.ini" \
    --save-adapter "$tmp/out-$1/adapter" > /dev/null 2>&1
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

# Refusals at resume: one line in the failing rank's log and the job fails
refused() {   # refused WHAT NAME WORLD PATTERN
  if run "$2" "$3"; then part_fail "$1: the resume was accepted"; return; fi
  local line
  line=$(grep -h "ERROR" out-$2/rank-0.log | grep -- "$4" | head -1 || true)
  [ -n "$line" ] || { part_fail "$1: no line says '$4': $(tail -2 out-$2/rank-0.log)"; return; }
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
