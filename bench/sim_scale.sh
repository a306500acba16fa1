#!/usr/bin/env bash
# sim_scale.sh — the coordinator at scale, measured against fsdp-sim (docs/performance.md "Scale").
#
#   bench/sim_scale.sh [--build DIR] [--steps S] [--step-ms MS] [--ranks-per-node R]
#                      [--kill RANK@STEP | --lose NODE@STEP] [--timeout-s T] N...
#
# For each N: a coordinator (fsdpd --cpu-workers 0: it runs no rank itself), N/R simulated nodes of
# R ranks in one fsdp-sim process, one job of N ranks and S steps (default 200). Prints one line per
# N: start-up (submit → first step recorded), the coordinator's CPU per step (all its threads, from
# /proc/PID/task/*/schedstat, between the 10th step and the last), its peak and final resident
# memory, the achieved step time beside the simulated one (two saturated cores run slower steps than
# asked for), the bytes written per step to metrics.jsonl and the bytes the coordinator wrote to
# storage per step (/proc/PID/io write_bytes between the 10th step and the last), and of those the
# database's (jobs.db and its WAL: write_bytes less what the metrics files and the log grew by);
# jobs.db + WAL is the files' size at the end (SQLite caps the WAL: not a rate). Then checks every line
# of metrics.jsonl against the figures the simulated ranks sent (fsdp-sim --check).
# --kill R@S: rank R dies at step S; --lose N@S: simulated node N goes silent at step S (fsdp-sim):
# the job must fail; the line then says how long after the fault the coordinator failed it, and why.
# --timeout-s: the job's [fsdp] timeout_s (default 60).
set -u
BUILD=build
STEPS=200
STEP_MS=20
RPN=8
HEARTBEAT=2   # seconds; a node is lost after 3 missed beats
FAULT=()
TIMEOUT_S=60
while [ $# -gt 0 ]; do
  case "$1" in
    --kill|--lose) FAULT=("$1" "$2"); shift 2 ;;
    --timeout-s) TIMEOUT_S=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --step-ms) STEP_MS=$2; shift 2 ;;
    --ranks-per-node) RPN=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--build DIR] [--steps S] [--step-ms MS] [--ranks-per-node R] [--kill R@S | --lose N@S] [--timeout-s T] N..." >&2; exit 2; }
BUILD=$(cd "$BUILD" && pwd)
. "$(dirname "$0")/lib.sh"
bench_conditions_begin "$BUILD"

run_one() {
  local n=$1 nodes=$(( $1 / RPN ))
  local S
  S=$(mktemp -d /tmp/sim-scale-XXXXXX)
  export FSDP_CTL="ipc://$S/ctl.sock"
  "$BUILD/fsdpd" --foreground --state-dir "$S" --cpu-workers 0 --gpus none --log-level "$( [ ${#FAULT[@]} -gt 0 ] && echo info || echo warn )" --heartbeat "$HEARTBEAT" 2>"$S/fsdpd.log" &
  local D=$!
  "$BUILD/bench/fsdp-sim" --join "ipc://$S/cluster.sock" --nodes "$nodes" --ranks-per-node "$RPN" --step-ms "$STEP_MS" \
    --procs "$(( nodes >= 64 ? 4 : 1 ))" \
    --jitter-ms "$(( STEP_MS / 4 ))" --timeout-s "$TIMEOUT_S" ${FAULT[@]+"${FAULT[@]}"} 2>"$S/sim.log" &
  local P=$!
  cat >"$S/job.ini" <<EOF
[job]
name = scale$n
steps = $STEPS
[model]
n_layer = 2
n_head = 2
n_embd = 32
vocab_size = 64
seq_len = 16
[data]
train = synthetic:markov:1
batch_size = 2
[fsdp]
world_size = $n
device = cpu
timeout_s = $TIMEOUT_S
[checkpoint]
every = 50
dir = ckpt
EOF
  # every simulated node registered (the nodes table lists them: one line each, plus a header and this node)
  local t_end=$((SECONDS + 120))
  while [ "$("$BUILD/fsdpctl" nodes 2>/dev/null | grep -c "sim-")" -lt "$nodes" ] && [ $SECONDS -lt $t_end ]; do sleep 0.2; done
  # The coordinator is left alone while it runs: progress is read from metrics.jsonl, not asked for.
  python3 - "$BUILD" "$S" "$D" "$n" "$nodes" "$STEPS" "$STEP_MS" <<'PY'
import glob, json, os, subprocess, sys, time
build, S, pid, n, nodes, steps, step_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
def cpu_ns():
    t = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try: t += int(open(f).read().split()[0])
        except OSError: pass
    return t
def write_bytes():   # what the coordinator caused to be written to storage
    for l in open(f"/proc/{pid}/io"):
        if l.startswith("write_bytes:"): return int(l.split()[1])
    return 0
def size(path):
    try: return os.path.getsize(path)
    except OSError: return 0
def lines(path):
    try:
        with open(path, "rb") as f: return f.read().count(b"\n")
    except OSError: return 0
i0 = cpu_ns(); time.sleep(3); idle = (cpu_ns() - i0) / 3e6   # ms of CPU per second with no job: heartbeats, ticks
t0 = time.monotonic()
jid = subprocess.run([f"{build}/fsdpctl", "submit", f"{S}/job.ini"], capture_output=True, text=True).stdout.split()[-1]
path = f"{S}/jobs/{jid}/metrics.jsonl"
rpath = f"{S}/jobs/{jid}/ranks.jsonl"   # beyond 64 ranks every rank's figures go there, every 100 steps
grown = lambda: size(path) + size(rpath) + size(f"{S}/fsdpd.log") + size(f"{S}/jobs/{jid}/job.log")
t1 = c1 = s1 = None
deadline = t0 + 900
while time.monotonic() < deadline:
    k = lines(path)
    if t1 is None and k >= 1: t1 = time.monotonic()
    if c1 is None and k >= 10: c1, s1, w1, io1, g1 = cpu_ns(), k, time.monotonic(), write_bytes(), grown()
    if k >= steps: break
    if os.path.exists(f"{S}/jobs/{jid}/job.log") and any(w in open(f"{S}/jobs/{jid}/job.log").read() for w in ("failed", "cancelled")): break
    time.sleep(0.01)
c2, s2, w2, io2, g2 = cpu_ns(), lines(path), time.monotonic(), write_bytes(), grown()
while True:   # the stop and the workers' exits, then the final state
    st = json.loads(subprocess.run([f"{build}/fsdpctl", "status", jid, "--json"], capture_output=True, text=True).stdout or "{}")
    if st.get("state") in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline: break
    time.sleep(0.2)
status = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status") if ":" in l)
hwm, rss = int(status["VmHWM"].split()[0]), int(status["VmRSS"].split()[0])
ls = open(path).readlines()
agg = [len(l) for l in ls if '"ranks":[' not in l]
det = [len(l) for l in ls if '"ranks":[' in l] + ([len(l) for l in open(rpath)] if os.path.exists(rpath) else [])
db = os.path.getsize(f"{S}/jobs.db") + (os.path.getsize(f"{S}/jobs.db-wal") if os.path.exists(f"{S}/jobs.db-wal") else 0)
cpu = (c2 - c1) / 1e6 / max(1, s2 - s1) if c1 is not None else float("nan")
wall = (w2 - w1) / max(1, s2 - s1) if c1 is not None else float("nan")   # seconds per step
steps_only = cpu - idle * wall
nsteps = max(1, s2 - s1) if c1 is not None else 0
io_step = (io2 - io1) / nsteps if nsteps else float("nan")
db_step = max(0, (io2 - io1) - (g2 - g1)) / nsteps if nsteps else float("nan")
print(f"N={n:>5} ({nodes} nodes): {st.get('state', '?')}, start-up {t1 - t0 if t1 else float('nan'):.2f} s, "
      f"coordinator CPU {cpu:.3f} ms/step (steps {s1}..{s2}, achieved {wall * 1e3:.0f} ms each against {step_ms} ms simulated; {steps_only:.3f} ms/step without "
      f"the {idle:.2f} ms/s it spends idle), memory peak {hwm / 1024:.1f} MiB, now {rss / 1024:.1f} MiB; "
      f"metrics.jsonl and ranks.jsonl {sum(agg) + sum(det)} B for {len(ls)} steps: aggregate line {max(agg) if agg else 0} B, "
      f"{len(det)} line(s) of every rank of {max(det) if det else 0} B; written to storage {io_step:.0f} B/step, "
      f"of which the database {db_step:.0f} B/step; jobs.db + WAL at the end {db} B", flush=True)
open(f"{S}/id", "w").write(jid)
PY
  local id state
  id=$(cat "$S/id")
  state=$("$BUILD/fsdpctl" status "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  "$BUILD/bench/fsdp-sim" --check "$S/jobs/$id/metrics.jsonl" --world "$n" --step-ms "$STEP_MS" --jitter-ms "$(( STEP_MS / 4 ))" || echo "CHECK FAILED: state kept in $S"
  local keep=0
  [ ${#FAULT[@]} -eq 0 ] || python3 - "$S/sim.log" "$S/fsdpd.log" "$id" "$TIMEOUT_S" <<'PY' || keep=1
import re, sys
from datetime import datetime
def at(path, pat):
    for l in open(path):
        if re.search(pat, l): return datetime.strptime(l.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ"), l
    return None, None
fault, fl = at(sys.argv[1], r"sim: (rank \d+ dies|node \S+ is lost) at step")
failed, jl = at(sys.argv[2], rf"job {sys.argv[3]} failed: ")
if not fault or not failed: sys.exit(f"fault: no {'fault' if not fault else 'failure'} in the logs")
print(f"fault: {fl.split('sim: ')[1].strip()}; job failed {(failed - fault).total_seconds():.2f} s later "
      f"(timeout_s {sys.argv[4]}): {jl.split('failed: ', 1)[1].strip()}")
PY
  kill "$P" "$D" 2>/dev/null
  wait "$P" "$D" 2>/dev/null
  if [ $keep = 1 ]; then echo "state kept in $S"; elif [ "$state" = succeeded ] || [ ${#FAULT[@]} -gt 0 ]; then rm -rf "$S"; fi
  unset FSDP_CTL
}

for n in "$@"; do run_one "$n"; done
bench_conditions_end
