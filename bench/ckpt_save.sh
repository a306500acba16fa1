#!/usr/bin/env bash
# What a checkpoint save costs training, side by side in one run (docs/performance.md, docs/checkpoints.md):
# GPT-2 124M (L12 C768 V50257), T = 64, B = 1, 2 CPU ranks, 4 steps, through `fsdpctl run`, with
#   every = 0 (no saves), every = 1 with async = false (synchronous saves), every = 1 with async = true,
# and the disk's own sequential bandwidth: dd conv=fsync of at least one checkpoint's size, on the
# checkpoint directory's filesystem. Prints, per configuration: wall time, training blocked per save
# (median over the saves), write time and MB/s per save (every rank's file together over the slowest
# rank's write), and the saves' MB/s against dd's.
#   bench/ckpt_save.sh [BUILD_DIR] [CKPT_PARENT]     (CKPT_PARENT: where the checkpoints go; default
#                                                      a directory under BUILD_DIR)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
parent=$(cd "${2:-$build}" && pwd)
tmp=$(mktemp -d "$parent/fsdp-ckbench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
job() {   # job EVERY ASYNC > ini
  cat <<JOB
[job]
name = ckbench
steps = 4
[model]
n_layer = 12
n_head = 12
n_embd = 768
vocab_size = 50257
seq_len = 64
[data]
train = synthetic:markov:1
batch_size = 1
[optim]
lr = 6e-4
warmup_steps = 0
[fsdp]
world_size = 2
device = cpu
timeout_s = 300
JOB
  [ "$1" = 0 ] || printf '[checkpoint]\ndir = %s/ck-%s\nevery = %s\nasync = %s\nkeep = 1\n' "$tmp" "$2" "$1" "$2"
}
run() {   # run NAME EVERY ASYNC: one fsdpctl run; prints NAME, its start and end, and its metrics file
  job "$2" "$3" >"$tmp/$1.ini"
  local t0 t1
  t0=$(date +%s.%N)
  env -u FSDP_CTL "$build/fsdpctl" run "$tmp/$1.ini" --state-dir "$tmp/state-$1" >"$tmp/$1.out" 2>&1 ||
    { echo "ckpt_save: $1 failed: $(tail -3 "$tmp/$1.out")" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$1 $t0 $t1 $tmp/state-$1/jobs/1/metrics.jsonl"
}
results=$(run none 0 false; run sync 1 false; run async 1 true)
# the disk: dd of at least one checkpoint (the sync run's rank files together), fsync'ed
ckbytes=$(du -sb "$tmp/ck-false" | cut -f1)
count=$(( (ckbytes + (64 << 20) - 1) / (64 << 20) ))
dd_out=$(dd if=/dev/zero of="$tmp/dd.bin" bs=64M count="$count" conv=fsync 2>&1 | tail -1)
rm -f "$tmp/dd.bin"
python3 - "$dd_out" "$ckbytes" "$(df -P "$tmp" | tail -1 | awk '{print $1 " on " $6}')" <<PY
import json, re, statistics, sys
dd, ckbytes, fs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
m = re.match(r"(\d+) bytes .* copied, ([\d.]+) s", dd)
disk = int(m.group(1)) / float(m.group(2)) / 1e6
rows = """$results""".split("\n")
print(f"GPT-2 124M, T=64, B=1, 2 CPU ranks, 4 steps; checkpoints of {ckbytes / 1e9:.2f} GB on {fs}")
print(f"disk (dd bs=64M conv=fsync, {int(m.group(1)) / 1e9:.2f} GB): {disk:.0f} MB/s")
print(f"{'run':8} {'wall s':>7} {'saves':>5} {'blocked s/save':>14} {'write s/save':>12} {'write MB/s':>10} {'% of dd':>7}")
sync_blocked = None
for r in rows:
    name, t0, t1, path = r.split()
    wall = float(t1) - float(t0)
    saves = [c for l in open(path) for c in json.loads(l).get("checkpoint", [])]
    if not saves:
        print(f"{name:8} {wall:7.2f} {0:5}")
        continue
    b = statistics.median(c["blocked_s"] for c in saves)
    w = statistics.median(c["write_s"] for c in saves)
    mbs = statistics.median(c["bytes"] / c["write_s"] / 1e6 for c in saves)
    if name == "sync": sync_blocked = b
    extra = f"  blocked {100 * b / sync_blocked:.1f} % of sync" if name == "async" and sync_blocked else ""
    print(f"{name:8} {wall:7.2f} {len(saves):5} {b:14.3f} {w:12.3f} {mbs:10.0f} {100 * mbs / disk:6.0f}%{extra}")
PY
