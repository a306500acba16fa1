#!/usr/bin/env bash
# Step time of N = 2 CPU ranks (standalone workers, gloo over loopback, sharding full, prefetch 1,
# batch 2 and grad_accum 5 per rank: docs/performance.md's figures) in variants of one job:
#   precision      parameters gathered in fp32 against bf16 (and bf16 reductions), on the
#                  synchronous CPU device and on the asynchronous one (FSDP_CPU_DEVICE=async)
#   checkpointing  activation_checkpointing none against full (the cost of recomputation)
#   bench/variants_step.sh SET [BUILD_DIR] [STEPS] [ROUNDS]
# The configurations run in turn, ROUNDS times, so that all see the same machine conditions. One
# row each: over every step after the first two of every round, the median step time, time the
# compute stream was blocked on all-gathers and reduce-scatters, bytes rank 0 sent per step, the
# peak activations, and the ratio of the median step time to the first row's.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
set_name=${1:?usage: bench/variants_step.sh precision|checkpointing [BUILD_DIR] [STEPS] [ROUNDS]}
build=${2:-$here/build}
. "$here/bench/lib.sh"
bench_conditions_begin "$build"
steps=${3:-12}
rounds=${4:-3}
tmp=$(mktemp -d /tmp/fsdp-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# name param_dtype reduce_dtype device activation_checkpointing
case "$set_name" in
  precision) configs=("fp32-sync fp32 fp32 sync none" "bf16p-sync bf16 fp32 sync none" "bf16pr-sync bf16 bf16 sync none"
                      "fp32-async fp32 fp32 async none" "bf16p-async bf16 fp32 async none") ;;
  checkpointing) configs=("ackpt-none fp32 fp32 sync none" "ackpt-full fp32 fp32 sync full") ;;
  *) echo "bench/variants_step.sh: unknown set '$set_name'; allowed: precision, checkpointing" >&2; exit 2 ;;
esac
for ((round = 0; round < rounds; round++)); do
  for c in "${configs[@]}"; do
    read -r name pd rd dev ac <<<"$c"
    cat > "$tmp/$name.ini" <<JOB
[job]
name = bench
steps = $steps
[model]
n_layer = 4
n_head = 4
n_embd = 256
vocab_size = 4096
seq_len = 128
[data]
train = synthetic:markov:1
batch_size = 2
grad_accum = 5
[optim]
lr = 1e-3
warmup_steps = 2
[fsdp]
world_size = 2
prefetch = 1
param_dtype = $pd
reduce_dtype = $rd
activation_checkpointing = $ac
timeout_s = 120
JOB
    FSDP_CPU_DEVICE=$dev FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$name-$round \
      "$here/scripts/launch-standalone.sh" 2 "$tmp/$name.ini" > /dev/null
  done
done
python3 - "$tmp" "$rounds" "${configs[@]}" <<'PY'
import json, statistics, sys
tmp, rounds, configs = sys.argv[1], int(sys.argv[2]), [c.split() for c in sys.argv[3:]]
med = statistics.median
print(f"{'config':<12} {'params':<7} {'reduce':<7} {'device':<6} {'step_ms':>8} {'ag_wait_ms':>10} {'rs_wait_ms':>10} "
      f"{'ag_bytes':>9} {'rs_bytes':>9} {'act_bytes':>10} {'vs first':>8}")
base = None
for name, pd, rd, dev, ac in configs:
    rows = [r for k in range(rounds)
            for r in [json.loads(l) for l in open(f"{tmp}/out-{name}-{k}/rank-0.jsonl")][2:]]
    step = med([r["step_ms"] for r in rows])
    base = base or step
    print(f"{name:<12} {pd:<7} {rd:<7} {dev:<6} {step:8.1f} {med([r['phase_ms']['allgather'] for r in rows]):10.1f} "
          f"{med([r['phase_ms']['reducescatter'] for r in rows]):10.1f} {rows[0]['sent_bytes']['allgather']:9d} "
          f"{rows[0]['sent_bytes']['reducescatter']:9d} {rows[0]['peak_bytes']['activations']:10d} {step / base:8.3f}")
PY
bench_conditions_end
