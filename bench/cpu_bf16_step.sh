#!/usr/bin/env bash
# bf16 compute on the CPU (docs/performance.md, "bf16 on the CPU"): the training step of the N = 2
# bench (GPT-2 L4 C256 NH4 V4096 T128, B = 2 per rank, AdamW, prefetch 1, one thread per rank) in
# fsdpd with param_dtype = fp32 and = bf16, and in PyTorch FSDP2 (bench/torch_fsdp_step.py) with
# MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) and in fp32. fsdpd-bf16 is param_dtype =
# bf16 as a user gets it (FSDP_CPU_BF16=auto: the AVX512-BF16 kernel only where it measures fast enough
# against fp32 FMA, gemm_bf16.h), fsdpd-bf16k the same with the kernel forced (FSDP_CPU_BF16=on).
#   bench/cpu_bf16_step.sh [BUILD_DIR] [STEPS] [ROUNDS] [PYTHON]
# The five run in turn, ROUNDS times, the order rotated every round, so that all see the same machine
# conditions. Per run: the median step time over the steps after the first two (rank 0). Prints per
# configuration the median over rounds, and per round the two ratios the issue sets targets for
# (fsdpd fp32 / fsdpd bf16 and FSDP2 bf16 / fsdpd bf16), with their median.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
steps=${2:-12}
rounds=${3:-5}
py=${4:-$HOME/.cache/fsdpd/testenv/bin/python}
. "$here/bench/lib.sh"
bench_conditions_begin "$build"
tmp=$(mktemp -d /tmp/fsdp-bf16.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for pd in fp32 bf16; do
  cat > "$tmp/job-$pd.ini" <<JOB
[job]
name = bench-bf16
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
grad_accum = 1
[optim]
lr = 1e-3
warmup_steps = 2
[fsdp]
world_size = 2
prefetch = 1
param_dtype = $pd
timeout_s = 300
JOB
done
# The median step time after the first two; stops when the job's tokens per step are not the
# 2 ranks x 2 sequences x 128 of torch_fsdp_step.py's step (grad_accum defaults to 5 in a job).
median_of() {
  python3 -c 'import json,statistics,sys
r = [json.loads(l) for l in open(sys.argv[1])]
bad = [x["tokens"] for x in r if x["tokens"] != 2 * 2 * 128]
if bad: sys.exit(f"cpu_bf16_step: fsdpd ran {bad[0]} tokens per step, FSDP2 runs 512: not the same step")
print(statistics.median(x["step_ms"] for x in r[2:]))' "$1"
}
run_one() {   # run_one CONFIG ROUND: appends "ROUND CONFIG STEP_MS" to $tmp/results
  local c=$1 r=$2 ms
  case $c in
    fsdpd-fp32|fsdpd-bf16|fsdpd-bf16k)
      local pd=${c#fsdpd-} knob=auto
      [ "$pd" != bf16k ] || pd=bf16 knob=on
      FSDP_CPU_BF16=$knob FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$c-$r \
        "$here/scripts/launch-standalone.sh" 2 "$tmp/job-$pd.ini" > /dev/null
      ms=$(median_of "$tmp/out-$c-$r/rank-0.jsonl")
      [ "$r" -gt 0 ] || grep -h 'CPU compute' "$tmp/out-$c-$r/rank-0.log" | sed "s/^.*CPU compute/  $c: CPU compute/" || true ;;
    torch-bf16|torch-fp32)
      ms=$("$py" "$here/bench/torch_fsdp_step.py" --world 2 --dtype "${c#torch-}" --steps "$steps" --threads 1 2>/dev/null |
           python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step_ms"])') ;;
  esac
  echo "$r $c $ms" >> "$tmp/results"
}
configs=(fsdpd-fp32 fsdpd-bf16 fsdpd-bf16k torch-bf16 torch-fp32)
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < ${#configs[@]}; i++)); do
    run_one "${configs[(i + r) % ${#configs[@]}]}" "$r"
  done
done
python3 - "$tmp/results" <<'PY'
import collections, statistics, sys
ms = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, c, v = line.split()
    ms[c][int(r)] = float(v)
med = statistics.median
print(f"{'config':<12} {'step_ms (median of rounds)':>27}   per round")
for c in ("fsdpd-fp32", "fsdpd-bf16", "fsdpd-bf16k", "torch-bf16", "torch-fp32"):
    print(f"{c:<12} {med(ms[c].values()):27.1f}   " + " ".join(f"{ms[c][r]:.1f}" for r in sorted(ms[c])))
rounds = sorted(ms["fsdpd-bf16"])
a = [ms["fsdpd-fp32"][r] / ms["fsdpd-bf16"][r] for r in rounds]
b = [ms["torch-bf16"][r] / ms["fsdpd-bf16"][r] for r in rounds]
print(f"fsdpd fp32 / fsdpd bf16: median {med(a):.2f}x (rounds {' '.join(f'{x:.2f}' for x in a)}; target >= 1.5)")
print(f"FSDP2 bf16 / fsdpd bf16: median {med(b):.2f}x (rounds {' '.join(f'{x:.2f}' for x in b)}; target >= 1.3)")
k = [ms["fsdpd-fp32"][r] / ms["fsdpd-bf16k"][r] for r in rounds]
t = [ms["torch-fp32"][r] / ms["torch-bf16"][r] for r in rounds]
print(f"fsdpd fp32 / fsdpd bf16 kernel forced: median {med(k):.2f}x (rounds {' '.join(f'{x:.2f}' for x in k)})")
print(f"FSDP2 fp32 / FSDP2 bf16: median {med(t):.2f}x (rounds {' '.join(f'{x:.2f}' for x in t)})")
PY
bench_conditions_end
