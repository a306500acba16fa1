#!/usr/bin/env bash
# The cost of span recording (worker/trace.h) in instructions, which do not depend on the machine's
# load: one standalone CPU rank (sharding full, world 1, the synchronous device, one OpenMP and one
# BLAS thread) of tests/integration/jobs/ctl_small.ini under valgrind --tool=callgrind, for A and B
# steps, with FSDP_TRACE=0 and 1. Instructions per step = (total(B) − total(A)) / (B − A), which
# cancels start-up; the row "on/off" is the ratio of the two per-step counts.
#   bench/trace_instructions.sh [BUILD_DIR] [A] [B]
# Slow (valgrind: ~1 minute per run on two cores); needs valgrind (scripts/install-deps.sh --bench).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
. "$here/bench/lib.sh"
bench_conditions_begin "$build"
a=${2:-2}
b=${3:-6}
tmp=$(mktemp -d /tmp/fsdp-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
sed 's/^world_size = .*/world_size = 1/' "$here/tests/integration/jobs/ctl_small.ini" >"$tmp/job.ini"
total() {   # total TRACE STEPS: instructions of the whole run, the worker's re-executions included
  local d=$tmp/run-$1-$2
  mkdir -p "$d/rdv"
  FSDP_TRACE=$1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive \
    valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$d/cg.%p" \
    "$build/fsdp-worker" --standalone --rank 0 --world 1 --rendezvous "$d/rdv" --steps "$2" "$tmp/job.ini" \
    >"$d/out" 2>"$d/err" || { echo "trace_instructions: the run failed: $(tail -1 "$d/err")" >&2; exit 1; }
  cat "$d"/cg.* | awk '/^summary:/ { s += $2 } END { print s }'
}
printf '%-6s %16s %16s %16s\n' trace "steps $a" "steps $b" "per step"
declare -A per
for tr in 0 1; do
  ta=$(total "$tr" "$a")
  tb=$(total "$tr" "$b")
  per[$tr]=$(( (tb - ta) / (b - a) ))
  printf '%-6s %16d %16d %16d\n' "$tr" "$ta" "$tb" "${per[$tr]}"
done
awk -v on="${per[1]}" -v off="${per[0]}" 'BEGIN { printf "on/off %.5f (%+d instructions per step)\n", on / off, on - off }'
bench_conditions_end
