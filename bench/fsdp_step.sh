#!/usr/bin/env bash
# Step time of sharded training on this machine: N = 1 and N = 2 CPU ranks (standalone workers,
# gloo over loopback), prefetch 0 (every all-gather waited for before its compute) against
# prefetch 1 (the next unit's gather overlaps the current unit's compute).
#   bench/fsdp_step.sh [BUILD_DIR] [STEPS]
# Prints one row per configuration: median step time over the steps after the first two, the
# time blocked on all-gathers and reduce-scatters (exposed communication), and tokens/s.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
steps=${2:-12}
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
printf '%-4s %-9s %12s %14s %14s %12s\n' N prefetch step_ms allgather_ms reducescat_ms tokens/s
for n in 1 2; do
  for pf in 0 1; do
    sed -e "s/^world_size = .*/world_size = $n/" -e "s/^timeout_s/prefetch = $pf\ntimeout_s/" \
        -e "s/^batch_size = .*/batch_size = $((4 / n))/" "$tmp/job.ini" > "$tmp/job-$n-$pf.ini"
    out=$(FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$n-$pf "$here/scripts/launch-standalone.sh" "$n" "$tmp/job-$n-$pf.ini")
    python3 - "$out" "$n" "$pf" <<'PY'
import json, statistics, sys
out, n, pf = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in open(f"{out}/rank-0.jsonl")][2:]
med = lambda xs: statistics.median(xs)
print(f"{n:<4} {pf:<9} {med([r['step_ms'] for r in rows]):12.1f} "
      f"{med([r['phase_ms']['allgather'] for r in rows]):14.1f} {med([r['phase_ms']['reducescatter'] for r in rows]):14.1f} "
      f"{med([r['tokens'] / r['step_ms'] * 1000 for r in rows]):12.0f}")
PY
  done
done
