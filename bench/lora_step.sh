#!/usr/bin/env bash
# A LoRA step against a full fine-tune's step of the same model on the CPU (one rank, synthetic data): ROUNDS
# rounds of (full, LoRA), the order swapped every round so that both see the same machine, each run's median
# step time over its steps after the first; prints both medians over the rounds and the ratio LoRA / full.
# The LoRA job trains rank-R adapters on attention and MLP (GPT-2: c_attn, c_proj, c_fc; Llama: all seven
# projections) over the frozen base: no weight gradient, no reduce-scatter, no AdamW over the base.
#   bench/lora_step.sh BUILD [ROUNDS] [THREADS] [ARCH]
set -euo pipefail
build=$(cd "${1:?BUILD}" && pwd)
rounds=${2:-5}
threads=${3:-1}
arch=${4:-gpt2}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/lora-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m}'; }
case $arch in
  gpt2) model="arch = gpt2"; targets="c_attn, c_proj, c_fc";;
  *) model=$'arch = llama\nn_kv_head = 4\nffn_dim = 1024'; targets="q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";;
esac
job() {   # job FILE [lora lines]
  cat > "$1" <<JOB
[job]
steps = 8
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
$2
JOB
}
job "$tmp/full.ini" ""
job "$tmp/lora.ini" $'[lora]\nrank = 8\nalpha = 16\ntargets = '"$targets"
run() {   # run JOB: the median step_ms of steps 2..
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out \
    "$here/scripts/launch-standalone.sh" 1 "$1" > /dev/null
  python3 -c 'import json,sys; s=sorted([json.loads(l)["step_ms"] for l in open(sys.argv[1]) if l.startswith("{")][1:])
print(s[len(s) // 2])' "$tmp/out/rank-0.jsonl"
  rm -rf "$tmp/out"
}
: > "$tmp/full.ms"
: > "$tmp/lora.ms"
for ((r = 0; r < rounds; r++)); do
  order="full lora"
  if ((r % 2)); then order="lora full"; fi
  for x in $order; do run "$tmp/$x.ini" >> "$tmp/$x.ms"; done
done
mf=$(median < "$tmp/full.ms")
ml=$(median < "$tmp/lora.ms")
printf '%-6s full fine-tune %8.2f ms/step   LoRA %8.2f ms/step   LoRA/full %.3f   (%d rounds, %d thread(s))\n' \
  "$arch" "$mf" "$ml" "$(awk -v x="$mf" -v y="$ml" 'BEGIN {print y / x}')" "$rounds" "$threads"
