#!/usr/bin/env bash
# The cost of span recording (worker/trace.h, `fsdpctl trace`): the step time of N = 2 CPU ranks
# (standalone workers, gloo over loopback, sharding full, prefetch 1) with FSDP_TRACE=1 (the
# default) against FSDP_TRACE=0 (no ring, no span ops), on the synchronous CPU device and the
# asynchronous one (where every span boundary is a task on the stream thread), for two models:
# "tiny" (2 blocks of 32 channels: ~1 ms steps, the worst case — the most spans per unit of work)
# and "small" (4 blocks of 256 channels, bench/variants_step.sh's job).
#   bench/trace_overhead.sh [BUILD_DIR] [STEPS] [ROUNDS]
# The configurations run in turn, ROUNDS times, so that all see the same machine conditions. One
# row each, over every step after the first two of every round: the median and the minimum step
# time (on a loaded machine the minimum is the nearer to the undisturbed cost), the spans a step
# records on rank 0 (from the model's units), and the ratios on/off of both for the same model and
# device. bench_trace gives the cost of one span, which bounds the difference from above without
# the noise of whole steps.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
. "$here/bench/lib.sh"
bench_conditions_begin "$build"
steps=${2:-30}
rounds=${3:-3}
tmp=$(mktemp -d /tmp/fsdp-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# name model device FSDP_TRACE
configs=()
for model in tiny small; do
  for dev in sync async; do configs+=("$model-$dev-off $model $dev 0" "$model-$dev-on $model $dev 1"); done
done
job() {   # job MODEL: the job file's text
  local L C V T B
  case "$1" in
    tiny) L=2 C=32 V=64 T=32 B=4 ;;
    small) L=4 C=256 V=4096 T=128 B=2 ;;
  esac
  printf '[job]\nname = bench\nsteps = %d\n[model]\nn_layer = %d\nn_head = 2\nn_embd = %d\nvocab_size = %d\nseq_len = %d\n' \
    "$steps" "$L" "$C" "$V" "$T"
  printf '[data]\ntrain = synthetic:markov:1\nbatch_size = %d\n[optim]\nlr = 1e-3\nwarmup_steps = 2\n' "$B"
  printf '[fsdp]\nworld_size = 2\nprefetch = 1\ntimeout_s = 120\n'
}
for ((round = 0; round < rounds; round++)); do
  for c in "${configs[@]}"; do
    read -r name model dev tr <<<"$c"
    job "$model" >"$tmp/$name.ini"
    FSDP_TRACE=$tr FSDP_CPU_DEVICE=$dev FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$name-$round \
      "$here/scripts/launch-standalone.sh" 2 "$tmp/$name.ini" > /dev/null
  done
done
python3 - "$tmp" "$rounds" "${configs[@]}" <<'PY'
import json, statistics, sys
tmp, rounds, configs = sys.argv[1], int(sys.argv[2]), [c.split() for c in sys.argv[3:]]
layers = {"tiny": 2, "small": 4}
print(f"{'config':<16} {'model':<6} {'device':<6} {'trace':>5} {'median_ms':>9} {'min_ms':>8} {'spans/step':>10} "
      f"{'on/off med':>10} {'on/off min':>10}")
off = {}
for name, model, dev, tr in configs:
    rows = [r for k in range(rounds) for r in [json.loads(l) for l in open(f"{tmp}/out-{name}-{k}/rank-0.jsonl")][2:]]
    step = statistics.median([r["step_ms"] for r in rows])
    low = min(r["step_ms"] for r in rows)
    L = layers[model]
    # per step, sharding full, grad_accum 1: 2L+1 gathers, L+1 forwards, backwards and reduce-scatters,
    # the loss, the optimizer, the scalars' all-reduce and the step on the host and the stream
    spans = (2 * L + 1) + 3 * (L + 1) + 5 if tr == "1" else 0
    if tr == "0": off[(model, dev)] = (step, low)
    ratio = (f"{step / off[(model, dev)][0]:10.3f} {low / off[(model, dev)][1]:10.3f}" if tr == "1" else "")
    print(f"{name:<16} {model:<6} {dev:<6} {tr:>5} {step:9.2f} {low:8.2f} {spans:10d} {ratio}")
PY
bench_conditions_end
