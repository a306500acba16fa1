#!/usr/bin/env bash
# A LoRA step against a full fine-tune's step of the same model on the CPU (one rank, synthetic data): ROUNDS
# rounds of (full, LoRA), the order swapped every round so that both see the same machine, each run's median
# step time over its steps after the first and its CPU time per step (steps 2..8: an 8-step run's CPU time less
# a 1-step run's), the measure that other processes on a shared machine do not inflate; prints the medians over
# the rounds and the ratios LoRA / full.
# The LoRA job trains rank-R adapters on attention and MLP (GPT-2: c_attn, c_proj, c_fc; Llama: all seven
# projections) over the frozen base: no weight gradient, no reduce-scatter, no AdamW over the base.
# The machine's conditions (bench/lib.sh: CPU, BLAS, load average before and after) come first and last.
#   bench/lora_step.sh BUILD [ROUNDS] [THREADS] [ARCH]
set -euo pipefail
build=$(cd "${1:?BUILD}" && pwd)
rounds=${2:-5}
threads=${3:-1}
arch=${4:-gpt2}
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/bench/lib.sh"
tmp=$(mktemp -d /tmp/lora-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m}'; }
case $arch in
  gpt2) model="arch = gpt2"; targets="c_attn, c_proj, c_fc";;
  *) model=$'arch = llama\nn_kv_head = 4\nffn_dim = 1024'; targets="q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";;
esac
job() {   # job FILE STEPS [lora lines]
  cat > "$1" <<JOB
[job]
steps = $2
[model]
$model
n_layer = 4
n_head = 8
n_embd = 384
vocab_size = 4096
seq_len = 128
[data]
train = synthetic:markov:1
batch_size = 4
grad_accum = 1
[optim]
warmup_steps = 0
[fsdp]
world_size = 1
$3
JOB
}
lora=$'[lora]\nrank = 8\nalpha = 16\ntargets = '"$targets"
job "$tmp/full.ini" 8 ""
job "$tmp/lora.ini" 8 "$lora"
job "$tmp/full-1.ini" 1 ""
job "$tmp/lora-1.ini" 1 "$lora"
cpu_s() {   # cpu_s JOB: the worker's user + system seconds for the whole run
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads /usr/bin/time -f "%U %S" -o "$tmp/time" \
    "$build/fsdp-worker" --standalone --rank 0 --world 1 --rendezvous "$(mktemp -d "$tmp/rdv.XXXXXX")" "$1" > /dev/null 2>&1
  awk '{print $1 + $2}' "$tmp/time"
}
run() {   # run X: the median step_ms of steps 2.. of X.ini; then the CPU ms a step of 2..8 takes (the
          # 8-step run's CPU time less the 1-step run's, over 7: independent of other processes' share)
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out \
    "$here/scripts/launch-standalone.sh" 1 "$tmp/$1.ini" > /dev/null
  python3 -c 'import json,sys; s=sorted([json.loads(l)["step_ms"] for l in open(sys.argv[1]) if l.startswith("{")][1:])
print(s[len(s) // 2])' "$tmp/out/rank-0.jsonl" >> "$tmp/$1.ms"
  rm -rf "$tmp/out"
  local c8 c1
  c8=$(cpu_s "$tmp/$1.ini")
  c1=$(cpu_s "$tmp/$1-1.ini")
  awk -v a="$c8" -v b="$c1" 'BEGIN {print (a - b) * 1000 / 7}' >> "$tmp/$1.cpu"
}
bench_conditions_begin "$build"
: > "$tmp/full.ms"
: > "$tmp/lora.ms"
: > "$tmp/full.cpu"
: > "$tmp/lora.cpu"
for ((r = 0; r < rounds; r++)); do
  order="full lora"
  if ((r % 2)); then order="lora full"; fi
  for x in $order; do run "$x"; done
done
mf=$(median < "$tmp/full.ms")
ml=$(median < "$tmp/lora.ms")
cf=$(median < "$tmp/full.cpu")
cl=$(median < "$tmp/lora.cpu")
ratio() { awk -v x="$1" -v y="$2" 'BEGIN {print y / x}'; }
printf '%-6s wall: full fine-tune %8.2f ms/step   LoRA %8.2f ms/step   LoRA/full %.3f   (%d rounds, %d thread(s))\n' \
  "$arch" "$mf" "$ml" "$(ratio "$mf" "$ml")" "$rounds" "$threads"
printf '%-6s CPU:  full fine-tune %8.2f ms/step   LoRA %8.2f ms/step   LoRA/full %.3f\n' "$arch" "$cf" "$cl" \
  "$(ratio "$cf" "$cl")"
bench_conditions_end
