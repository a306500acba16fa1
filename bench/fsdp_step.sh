#!/usr/bin/env bash
# Step time of sharded training on this machine: N = 1 and N = 2 CPU ranks (standalone workers,
# gloo over loopback), prefetch 0 (every all-gather waited for before its compute) against
# prefetch 1 (the next unit's gather overlaps the current unit's compute).
#   bench/fsdp_step.sh [BUILD_DIR] [STEPS] [ROUNDS]
# The four configurations run in turn, ROUNDS times, so that all of them see the same machine
# conditions. Prints one row per configuration: over every step after the first two of every
# round, the median step time, the median time blocked on all-gathers and on reduce-scatters
# (communication that compute did not hide), their share of the step, and tokens/s.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
. "$here/bench/lib.sh"
bench_conditions_begin "$build"
steps=${2:-12}
rounds=${3:-3}
tmp=$(mktemp -d /tmp/fsdp-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/job.ini" <<JOB
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
batch_size = 4
[optim]
lr = 1e-3
warmup_steps = 2
[fsdp]
world_size = 1
timeout_s = 120
JOB
for ((round = 0; round < rounds; round++)); do
  for n in 1 2; do
    for pf in 0 1; do
      sed -e "s/^world_size = .*/world_size = $n/" -e "s/^timeout_s/prefetch = $pf\ntimeout_s/" \
          -e "s/^batch_size = .*/batch_size = $((4 / n))/" "$tmp/job.ini" > "$tmp/job-$n-$pf.ini"
      FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$n-$pf-$round \
        "$here/scripts/launch-standalone.sh" "$n" "$tmp/job-$n-$pf.ini" > /dev/null
    done
  done
done
python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
print(f"{'N':<3} {'prefetch':<9} {'step_ms':>9} {'allgather_ms':>13} {'reducescat_ms':>14} {'exposed':>8} {'tokens/s':>9}")
for n in (1, 2):
    for pf in (0, 1):
        rows = [r for k in range(rounds)
                for r in [json.loads(l) for l in open(f"{tmp}/out-{n}-{pf}-{k}/rank-0.jsonl")][2:]]
        med = statistics.median
        step = med([r["step_ms"] for r in rows])
        ag = med([r["phase_ms"]["allgather"] for r in rows])
        rs = med([r["phase_ms"]["reducescatter"] for r in rows])
        tps = med([r["tokens"] / r["step_ms"] * 1000 for r in rows])
        print(f"{n:<3} {pf:<9} {step:9.1f} {ag:13.1f} {rs:14.1f} {100 * (ag + rs) / step:7.1f}% {tps:9.0f}")
PY
bench_conditions_end
