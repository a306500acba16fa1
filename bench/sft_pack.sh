#!/usr/bin/env bash
# Packed masked training against plain text on the CPU (docs/performance.md): the same GPT-2, the same
# batch, 1 rank; one job reads a plain token file (one continuous stream), the other a masked file of
# conversations of 20-200 tokens (about half of each trained) packed into rows ([data] pack = true:
# per-document attention and positions, targets -1 where untrained, the mean over trained tokens).
# ROUNDS rounds of (plain, packed), the order swapped every round, each a fresh standalone worker of
# STEPS steps whose first 2 are left out; prints each kind's median tokens/s (every position, the
# figure MFU counts) and the ratio packed / plain, with the packed run's trained tokens/s beside it.
#   bench/sft_pack.sh [BUILD_DIR] [ROUNDS] [STEPS] [THREADS]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
rounds=${2:-5} steps=${3:-12} threads=${4:-2}
. "$src/bench/lib.sh"
tmp=$(mktemp -d /tmp/fsdp-bench-sft.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
T=256
python3 - "$tmp" $T <<'PY'
import random, struct, sys
d, T = sys.argv[1], int(sys.argv[2])
rng = random.Random(5)
toks, mask, starts = [], [], []
while len(toks) < 600_000:
    n = rng.randint(20, 200)
    p = rng.randint(5, n - 5)   # the prompt, not trained
    for i in range(n):
        toks.append(rng.randrange(1, 4096)); mask.append(int(i >= p)); starts.append(int(i == 0))
def bits(v):
    out = bytearray((len(v) + 7) // 8)
    for i, b in enumerate(v):
        out[i // 8] |= b << (i % 8)
    return bytes(out)
hdr = lambda version: struct.pack("<256i", 20240520, version, len(toks), *[0] * 253)
with open(f"{d}/plain.bin", "wb") as f:
    f.write(hdr(1) + struct.pack(f"<{len(toks)}H", *toks))
with open(f"{d}/sft.bin", "wb") as f:
    f.write(hdr(2) + struct.pack(f"<{len(toks)}H", *toks) + bits(mask) + bits(starts))
PY
job() {   # job NAME FILE
  cat > "$tmp/$1.ini" <<JOB
[job]
name = $1
steps = $steps
[model]
arch = gpt2
n_layer = 4
n_head = 8
n_embd = 256
vocab_size = 4096
seq_len = $T
[data]
train = $2
shuffle = true
batch_size = 8
grad_accum = 1
[optim]
warmup_steps = 0
[fsdp]
world_size = 1
JOB
}
job plain plain.bin
job packed sft.bin
median() { sort -g | awk '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m}'; }
# one run: its steps after the first 2, median tokens/s and trained tokens/s
run() {
  rm -rf "$tmp/out-$1"
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$1 \
    "$src/scripts/launch-standalone.sh" 1 "$tmp/$1.ini" > /dev/null 2>&1 || { tail -3 "$tmp/out-$1/rank-0.log" >&2; exit 1; }
  python3 - "$tmp/out-$1/rank-0.jsonl" <<'PY'
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][2:]
print(statistics.median(x["tokens_per_s"] for x in r), statistics.median(x["trained_tokens_per_s"] for x in r))
PY
}
bench_conditions_begin "$build"
echo "GPT-2 4 x 256 (vocab 4096), seq_len $T, batch 8, 1 rank, $threads threads; $rounds rounds of $steps steps"
: > "$tmp/plain.tps"
: > "$tmp/packed.tps"
: > "$tmp/packed.trained"
for ((r = 0; r < rounds; r++)); do
  order="plain packed"
  if ((r % 2)); then order="packed plain"; fi
  for k in $order; do
    read -r tps trained < <(run "$k")
    echo "$tps" >> "$tmp/$k.tps"
    [ "$k" = plain ] || echo "$trained" >> "$tmp/packed.trained"
  done
done
mp=$(median < "$tmp/plain.tps") mk=$(median < "$tmp/packed.tps") mt=$(median < "$tmp/packed.trained")
printf '%-28s %12s %14s\n' run "tokens/s" "trained tok/s"
printf '%-28s %12.0f %14.0f\n' "plain text" "$mp" "$mp"
printf '%-28s %12.0f %14.0f\n' "packed conversations" "$mk" "$mt"
printf 'packed / plain (tokens/s): %.3f\n' "$(awk -v a="$mp" -v b="$mk" 'BEGIN {print b / a}')"
bench_conditions_end
