#!/usr/bin/env bash
# What checkpoint saves cost training (docs/performance.md, docs/checkpoints.md): GPT-2 124M
# (L12 C768 V50257), T = 64, B = 1, one micro-step per step, 2 CPU ranks, STEPS steps through `fsdpctl run`, three ways —
# no saves, a save every EVERY steps synchronous (async = false), the same asynchronous — in
# alternating rounds (none, sync, async, none, sync, async, ...), so that a change in the machine's
# load hits every configuration alike. Prints per configuration the median wall time of the job
# and, per save: the wall time it adds against the run without saves, the time training was
# blocked, and the write rate as total bytes over total write time, the saves that overlapped
# training apart from the final one (written after the last step, alone on the machine); and the
# steps' slowdown while an asynchronous write was in flight, as metrics.jsonl's checkpoint lines give
# it (step_slowdown: the steps the write overlapped against the steps before the save, the job's own
# figure). Then per round (one run of each, adjacent in time) the wall time each save adds against
# that round's run without saves, over the whole job and over its training (from rank 0's "ready"
# line, after the start's allocations, to the end), and the asynchronous saves' over the synchronous
# ones', with their median over the rounds; beside it the same from the job's own account of each save (the time it
# blocked training and the excess of the steps its write overlapped), which the load's swings over
# the rest of the run do not enter. ANALYZE=RESULTS re-reads the results file of a kept run (KEEP=DIR
# keeps it and its metrics files) instead of running: "NAME ROUND LOAD WALL METRICS [TRAIN]" lines. Then dd's rate on the same disk.
#   bench/ckpt_save.sh [BUILD_DIR] [CKPT_PARENT]   env: ROUNDS (2), STEPS (12), EVERY (4), and a smaller
#   model for a busy machine: N_LAYER (12), N_EMBD (768, heads of 64), VOCAB (50257); GRAD_ACCUM (1)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/bench/lib.sh"
build=$(cd "${1:-$here/build}" && pwd)
parent=$(cd "${2:-$build}" && pwd)
rounds=${ROUNDS:-2} steps=${STEPS:-12} every=${EVERY:-4}
n_layer=${N_LAYER:-12} n_embd=${N_EMBD:-768} vocab=${VOCAB:-50257} accum=${GRAD_ACCUM:-1}
tmp=$(mktemp -d "$parent/fsdp-ckbench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
bench_conditions_begin "$build"
job() {   # job EVERY ASYNC DIR > ini
  cat <<JOB
[job]
name = ckbench
steps = $steps
[model]
n_layer = $n_layer
n_head = $((n_embd / 64))
n_embd = $n_embd
vocab_size = $vocab
seq_len = 64
[data]
train = synthetic:markov:1
batch_size = 1
grad_accum = $accum
[optim]
lr = 6e-4
warmup_steps = 0
[fsdp]
world_size = 2
device = cpu
timeout_s = 300
JOB
  [ "$1" = 0 ] || printf '[checkpoint]\ndir = %s\nevery = %s\nasync = %s\nkeep = 1\n' "$3" "$1" "$2"
}
run() {   # run NAME EVERY ASYNC ROUND: one fsdpctl run; prints NAME, its wall seconds and its metrics file
  local id="$1-$4" t0 t1 load
  job "$2" "$3" "$tmp/ck-$id" >"$tmp/$id.ini"
  load=$(cut -d' ' -f1 /proc/loadavg)
  t0=$(date +%s.%N)
  env -u FSDP_CTL "$build/fsdpctl" run "$tmp/$id.ini" --state-dir "$tmp/state-$id" >"$tmp/$id.out" 2>&1 ||
    { echo "ckpt_save: $id failed: $(tail -3 "$tmp/$id.out")" >&2; exit 1; }
  t1=$(date +%s.%N)
  local ready   # rank 0's "ready" line: the shards allocated and loaded, the first step next
  ready=$(grep -m1 ' ready: ' "$tmp/state-$id/jobs/1/worker-0.log" | cut -d' ' -f1)
  ready=$(date -d "$ready" +%s.%N)
  echo "$1 $4 $load $(echo "$t1 - $t0" | bc) $tmp/state-$id/jobs/1/metrics.jsonl $(echo "$t1 - $ready" | bc)" >>"$tmp/results"
  [ "$2" = 0 ] || { du -sb "$tmp/ck-$id" | cut -f1 >"$tmp/ckbytes"; rm -rf "$tmp/ck-$id"; }
}
results=${ANALYZE:-$tmp/results} dd_out="" ckbytes=0
if [ -z "${ANALYZE:-}" ]; then
  for r in $(seq 1 "$rounds"); do run none 0 false "$r"; run sync "$every" false "$r"; run async "$every" true "$r"; done
  ckbytes=$(cat "$tmp/ckbytes")
  count=$(( (ckbytes + (64 << 20) - 1) / (64 << 20) ))
  dd_out=$(dd if=/dev/zero of="$tmp/dd.bin" bs=64M count="$count" conv=fsync 2>&1 | tail -1)
  rm -f "$tmp/dd.bin"
  if [ -n "${KEEP:-}" ]; then   # the results and metrics files, for ANALYZE
    mkdir -p "$KEEP"
    while read -r name rnd load wall path train; do
      cp "$path" "$KEEP/$name-$rnd.metrics.jsonl"
      echo "$name $rnd $load $wall $(cd "$KEEP" && pwd)/$name-$rnd.metrics.jsonl $train"
    done <"$tmp/results" >"$KEEP/results"
  fi
fi
python3 - "$results" "$dd_out" "$ckbytes" "$(df -P "$parent" | tail -1 | awk '{print $1 " on " $6}')" "$steps" "$every" "$rounds" "L$n_layer C$n_embd V$vocab" "$accum" <<'PY'
import json, re, statistics as st, sys
res, dd, ckbytes, fs, steps, every, rounds, model, accum = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], *map(int, sys.argv[5:8]), sys.argv[8], int(sys.argv[9])
m = re.match(r"(\d+) bytes .* copied, ([\d.]+) s", dd)
runs, byround = {}, {}
for line in open(res):
    name, rnd, load, wall, path, *train = line.split()   # train: absent in results of older runs
    lines = [json.loads(l) for l in open(path)]
    runs.setdefault(name, []).append((float(wall), float(train[0]) if train else None, lines))
    cks = [c for l in lines for c in l.get("checkpoint", [])]
    accounted = sum(c["blocked_s"] + (c["inflight_steps"] * (c["inflight_step_ms"] - c["before_step_ms"]) / 1e3
                                      if c.get("step_slowdown") is not None else 0.0) for c in cks)
    byround.setdefault(int(rnd), {})[name] = dict(wall=float(wall), train=float(train[0]) if train else None,
                                                  n=len(cks), load=float(load), acc=accounted)
ckbytes = ckbytes or max(c["bytes"] for v in runs.values() for _, _, ls in v for l in ls for c in l.get("checkpoint", []))
print(f"GPT-2 {'124M' if model == 'L12 C768 V50257' else model}, T=64, B=1, {accum} micro-step(s) per step, 2 CPU ranks, {steps} steps, a save every {every}; {rounds} alternating rounds; "
      f"checkpoints of {ckbytes / 1e9:.2f} GB on {fs}")
print(f"disk (dd bs=64M conv=fsync, {int(m.group(1)) / 1e9:.2f} GB): {int(m.group(1)) / float(m.group(2)) / 1e6:.0f} MB/s"
      if m else "disk: not measured (ANALYZE)")
has_train = all(t is not None for v in runs.values() for _, t, _ in v)
col = lambda name, k: [w if k == 0 else t for w, t, _ in runs[name]]
base = {k: st.median(col("none", k)) for k in ((0, 1) if has_train else (0,))}
none_steps = [l["step_ms"] for _, _, ls in runs["none"] for l in ls if l["step"] > 1]
fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
print(f"no saves: wall {base[0]:.2f} s (runs {fmt(col('none', 0))})" +
      (f", training {base[1]:.2f} s (runs {fmt(col('none', 1))})" if has_train else "") +
      f", step {st.median(none_steps):.0f} ms (median of steps 2..{steps})")
print(f"{'saves':6} {'wall s':>7} {'+s/save':>8} {'train s':>8} {'+s/save':>8} {'blocked s/save':>14} {'overlap MB/s':>12} "
      f"{'final MB/s':>10} {'slowdown in flight':>18}  runs' wall / training s")
blocked = {}
for name in ("sync", "async"):
    saves, over, final, slow = [], [0, 0.0], [0, 0.0], []
    for _, _, ls in runs[name]:
        for l in ls:
            for c in l.get("checkpoint", []):
                saves.append(c)
                acc = final if c["step"] == steps else over
                acc[0] += c["bytes"]; acc[1] += c["write_s"]
                if c.get("step_slowdown") is not None: slow.append(c)
    n = len(saves) / len(runs[name])
    med = {k: st.median(col(name, k)) for k in base}
    blocked[name] = st.median(c["blocked_s"] for c in saves)
    rate = lambda a: f"{a[0] / a[1] / 1e6:.0f}" if a[1] > 0 else "-"
    fl = (f"{st.median(c['step_slowdown'] for c in slow):.2f}x ({sum(c['inflight_steps'] for c in slow)})" if slow else "-")
    tr = f"{med[1]:8.2f} {(med[1] - base[1]) / n:8.2f}" if has_train else f"{'-':>8} {'-':>8}"
    print(f"{name:6} {med[0]:7.2f} {(med[0] - base[0]) / n:8.2f} {tr} {blocked[name]:14.3f} {rate(over):>12} {rate(final):>10} "
          f"{fl:>18}  {fmt(col(name, 0))}" + (f" / {fmt(col(name, 1))}" if has_train else ""))
# per round: each configuration against the run without saves of its own round (the runs of a round
# are adjacent, so they share the machine's load best), the wall time each save adds over the whole
# job and over its training (from rank 0's "ready" line: the start, its allocation's page faults
# included, left out), the ratio async / sync of each, and the job's own account of each save
# (accounted s/save): the time it blocked training plus, for the steps its write overlapped, their
# excess over the steps before it (metrics.jsonl's inflight_steps, inflight_step_ms,
# before_step_ms) — the steps no save touched left out, so that the load's swings over the rest of
# the run do not enter it
print(f"{'round':5} {'load 1m none/sync/async':>23} {'wall +s/save sync/async':>23} {'ratio':>6} "
      f"{'training +s/save sync/async':>27} {'ratio':>6} {'accounted s/save sync/async':>27} {'ratio':>6}")
ratios = {"wall": [], "train": [], "acc": []}
def ratio(kind, a, b):
    if b <= 0: return "-"
    ratios[kind].append(a / b)
    return f"{a / b:.2f}"
for r in sorted(byround):
    g = byround[r]
    add = lambda k: {c: (g[c][k] - g["none"][k]) / g[c]["n"] for c in ("sync", "async")}
    w = add("wall")
    t = add("train") if has_train else None
    a = {c: g[c]["acc"] / g[c]["n"] for c in ("sync", "async")}
    loads = "/".join(f"{g[k]['load']:.1f}" for k in ("none", "sync", "async"))
    ts = f"{t['sync']:.2f} / {t['async']:.2f}" if t else "-"
    print(f"{r:5} {loads:>23} {w['sync']:11.2f} / {w['async']:<9.2f} {ratio('wall', w['async'], w['sync']):>6} "
          f"{ts:>27} {ratio('train', t['async'], t['sync']) if t else '-':>6} "
          f"{a['sync']:13.2f} / {a['async']:<11.2f} {ratio('acc', a['async'], a['sync']):>6}")
summ = lambda k: (f"median {st.median(ratios[k]):.2f} (at most 0.5 in {sum(q <= 0.5 for q in ratios[k])} of {len(byround)} rounds)"
                  if ratios[k] else "-")
print(f"async per save: blocked {100 * blocked['async'] / blocked['sync']:.1f} % of a synchronous save's blocked time; "
      f"added, async / sync: wall {summ('wall')}; training {summ('train')}; accounted {summ('acc')}")
print("+s/save: (median - median without saves) / saves; per round: against that round's run without saves (ratio '-': "
      "sync added nothing there); slowdown in flight: the median of the saves' step_slowdown in metrics.jsonl (the steps "
      "their writes overlapped, in all); blocked s/save: the median")
PY
bench_conditions_end
