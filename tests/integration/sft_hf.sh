#!/usr/bin/env bash
# Training on conversations against transformers (lib/sft_hf.py): a masked token file of short
# conversations (prompt untrained, answer trained), one optimizer step on 2 ranks with grad_accum = 2,
# [data] pack = true and false, for a tiny GPT-2 and a tiny Llama taken by `[model] from`. fsdpd's
# loss equals transformers' on the same rows with labels = -100, per-document attention (a 4-D mask)
# and position_ids restarting in each document, averaged over the trained tokens of the whole step
# (num_items_in_batch), to 1e-5 relative; so do the weights after the step (exported; AdamW with eps 1,
# so that the update shows the gradient's scale, clipped at half the norm, so that the clipping needs
# the right average's norm), and metrics count the step's trained tokens. Controls that must fail:
# documents that see each other, positions that run on (GPT-2: rope is relative, so a Llama inside
# its documents cannot tell), the mean of per-micro-batch means (the loss, and the weights after a
# step on it). Every part runs; the ones that fail are listed at the end.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/fsdp-it-sft.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
TPY=$(bash "$src/scripts/test-env.sh" --check)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
CTL=$build/fsdpctl
failed=()
part_fail() { echo "FAIL: $*"; failed+=("$*"); }

"$TPY" "$src/tests/integration/lib/sft_hf.py" build "$tmp" > "$tmp/build.log" 2>&1 ||
  { tail -20 "$tmp/build.log"; exit 1; }
ref() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[sys.argv[2]]; print(eval(sys.argv[3], {"r": r}))' \
  "$tmp/refs.json" "$1" "$2"; }
field() { python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][0][sys.argv[2]])' "$1" "$2"; }
rel_ok() { python3 -c 'import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)' "$1" "$2" "$3"; }

for m in gpt2 llama; do
  for pack in pack nopack; do
    tag=$m-$pack
    cat > "$tmp/$tag.ini" <<JOB
[job]
name = sft-$tag
steps = 1
[model]
from = $m
$([ $m = gpt2 ] && echo "dropout = none")   # GPT2Config's default dropout, which fsdpd does not apply
seq_len = 32
[data]
train = train.bin
shuffle = false
pack = $([ $pack = pack ] && echo true || echo false)
batch_size = 1
grad_accum = 2
[optim]
lr = 0.05
eps = 1
beta1 = 0.9
beta2 = 0.95
weight_decay = 0
grad_clip = $(ref "$tag" 'r["grad_clip"]')
warmup_steps = 0
schedule = constant
[fsdp]
world_size = 2
timeout_s = 60
[checkpoint]
dir = ckpt-$tag
every = 1
JOB
    FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$tag timeout 120 "$src/scripts/launch-standalone.sh" 2 \
      "$tmp/$tag.ini" > /dev/null 2>&1 ||
      { part_fail "$tag: the step failed: $(tail -1 "$tmp/out-$tag/rank-0.log")"; continue; }
    got=$(field "$tmp/out-$tag/rank-0.jsonl" loss) want=$(ref "$tag" 'r["loss"]')
    echo "$tag: loss fsdpd $got, transformers $want"
    rel_ok "$got" "$want" 1e-5 || part_fail "$tag: loss $got, transformers' $want (1e-5 relative)"
    n=$(field "$tmp/out-$tag/rank-0.jsonl" trained_tokens) wn=$(ref "$tag" 'r["trained"]')
    [ "$n" = "$wn" ] || part_fail "$tag: trained_tokens $n, transformers' labels train $wn"
    [ "$(field "$tmp/out-$tag/rank-0.jsonl" tokens)" = 128 ] || part_fail "$tag: tokens is not 2 x 1 x 2 x 32"
    for c in $(ref "$tag" '" ".join(k.replace(" ", "_") for k in r["controls"])'); do
      off=$(ref "$tag" "r['controls']['${c//_/ }']")
      echo "$tag: transformers with ${c//_/ }: $off"
      ! rel_ok "$got" "$off" 1e-4 || part_fail "$tag: the control '${c//_/ }' ($off) is not told from fsdpd's ($got)"
    done
    "$CTL" export "$tmp/ckpt-$tag" -o "$tmp/exp-$tag" > /dev/null || { part_fail "$tag: fsdpctl export failed"; continue; }
    "$TPY" "$src/tests/integration/lib/sft_hf.py" verify "$tmp" "$m" "$pack" || part_fail "$tag: the weights after the step"
  done
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "sft_hf: ${#failed[@]} part(s) failed:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "sft_hf: OK"
