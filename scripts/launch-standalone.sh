#!/usr/bin/env bash
# Launch N standalone fsdp-workers on this machine (no daemon), like torchrun:
#   scripts/launch-standalone.sh N JOB.ini [fsdp-worker flags...]
# Each rank's JSON lines go to OUT/rank-R.jsonl and its log to OUT/rank-R.log (OUT = $FSDP_OUT or a
# fresh temporary directory, printed at the end). Exits non-zero if any rank failed; a rank that
# fails makes the others fail within the job's timeout_s, so this never hangs on a dead peer.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 N JOB.ini [fsdp-worker flags...]" >&2
  exit 2
fi
n=$1 job=$2
shift 2
case "$n" in ''|*[!0-9]*) echo "$0: N must be a positive integer, got '$n'" >&2; exit 2;; esac
[ "$n" -ge 1 ] || { echo "$0: N must be at least 1" >&2; exit 2; }
[ -r "$job" ] || { echo "$0: cannot read job file $job" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
worker=${FSDP_WORKER:-$here/build/fsdp-worker}
[ -x "$worker" ] || { echo "$0: $worker not found: build first (make test or cmake --build build)" >&2; exit 2; }
out=${FSDP_OUT:-$(mktemp -d /tmp/fsdp-standalone.XXXXXX)}
mkdir -p "$out"
rdv=$(mktemp -d "$out/rendezvous.XXXXXX")
# One OpenMP/BLAS thread per rank unless told otherwise: N busy-waiting thread pools on the same
# cores slow everything down.
threads=$(( $(nproc) / n )); [ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$threads}

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
for ((r = 0; r < n; r++)); do
  "$worker" --standalone --rank "$r" --world "$n" --rendezvous "$rdv" "$@" "$job" \
    > "$out/rank-$r.jsonl" 2> "$out/rank-$r.log" &
  pids+=($!)
done
status=0
for ((r = 0; r < n; r++)); do
  if ! wait "${pids[$r]}"; then
    echo "$0: rank $r failed: $(tail -n 1 "$out/rank-$r.log")" >&2
    status=1
  fi
done
pids=()
rm -rf "$rdv"
echo "$out"
exit $status
