#!/usr/bin/env bash
# ckpt_async — asynchronous checkpoint saves under failure (docs/checkpoints.md, "Asynchronous
# saves"). A 6-step job saves every 2 steps with [checkpoint] async = true; the writer of step 4's
# save is paused at a named point (FSDP_TEST_CKPT_PAUSE = POINT:4, tests/hooks/ckpt_pause.c, which only
# the workers built for tests carry: tests/fsdp-worker-hooks; begin = before any
# file, mid = after the first section of the rank file, manifest = rank 0 about to write the
# manifest) and, once the pause is reached, a rank or the daemon is killed with SIGKILL. Each case
# must leave step 2 as the newest complete checkpoint (step 4 without a manifest), and a new run
# with resume = auto must continue from step 2 and finish with complete checkpoints of steps 4 and 6.
# The plan's host line carries the snapshot; fsdpctl stop during a write waits for it, then saves.
# Then a full disk (a tmpfs with room for one checkpoint of ~360 kB and a half): the job fails with one line naming the
# disk's error, step 2 stays complete and no step-4 directory is left behind. First, the figures of
# each save (blocked, write time, bytes, MB/s) in fsdpctl status, /metrics, fsdpctl trace (a lane of
# their own), metrics.jsonl and job.log.
# Usage: bash ckpt_async.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" ckasync
CTL="$BUILD/fsdpctl"
HOOKED="$BUILD/tests/fsdp-worker-hooks"   # fsdp-worker with the pause hook
[ -x "$HOOKED" ] || fail "$HOOKED is not built"
job() {   # job CKDIR > file: 6 steps, saves every 2 (keep 2), asynchronous
  sed -e "s/^schedule = .*/schedule = constant/" -e "s/^steps = .*/steps = 6/" "$SRC/tests/integration/jobs/ctl_small.ini"
  printf '[checkpoint]\ndir = %s\nevery = 2\nkeep = 2\nasync = true\nresume = auto\n' "$1"
}
# newest CKDIR: the newest complete step, and the steps whose directory has no manifest
newest() {
  python3 - "$1" <<'PY'
import os, sys
ck = sys.argv[1]
d = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
done = [int(x[5:]) for x in d if os.path.isfile(f"{ck}/{x}/manifest.json")]
part = [int(x[5:]) for x in d if not os.path.isfile(f"{ck}/{x}/manifest.json")]
print(max(done) if done else 0, *part)
PY
}
pids_gone() { for p in "$@"; do kill -0 "$p" 2>/dev/null && return 1; done; return 0; }

# ---- the plan: the snapshot (12 bytes per shard element) on the host line, none with async = false
job "$S/ck-plan" >"$S/plan.ini"
"$CTL" plan "$S/plan.ini" >"$S/plan.out" || fail "fsdpctl plan failed: $(cat "$S/plan.out")"
grep -q "^  host .*checkpoint snapshot (\[checkpoint\] async): 12·S (host memory)" "$S/plan.out" ||
  fail "fsdpctl plan has no host line for the snapshot: $(grep -i host "$S/plan.out")"
"$CTL" plan --json "$S/plan.ini" | python3 -c 'import json, sys; d = json.load(sys.stdin)
assert d["snapshot_bytes"] == 12 * d["shard_total"] == d["host_bytes"], d' || fail "fsdpctl plan --json: snapshot_bytes"
sed -i 's/^async = true$/async = false/' "$S/plan.ini"
"$CTL" plan --json "$S/plan.ini" | python3 -c 'import json, sys; d = json.load(sys.stdin)
assert d["snapshot_bytes"] == 0 == d["host_bytes"], d' || fail "fsdpctl plan --json: a snapshot with async = false"

# ---- reports: a running job's status, /metrics and trace, then metrics.jsonl and job.log
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_daemon --metrics "127.0.0.1:$PORT"
wait_for 10 "$CTL" nodes || fail "fsdpd did not answer within 10 s"
sed -e "s/^steps = .*/steps = 400/" "$SRC/tests/integration/jobs/ctl_small.ini" >"$S/rep.ini"
printf '[checkpoint]\ndir = %s\nevery = 4\nkeep = 2\n' "$S/ck-rep" >>"$S/rep.ini"   # async: the default
id=$("$CTL" submit "$S/rep.ini" | tail -1)
has_ckpt() { [ "$("$CTL" status "$id" --json | jget 'd["state"] == "running" and d.get("checkpoint", {}).get("step", 0) >= 8')" = True ]; }
wait_for 60 has_ckpt || fail "status never showed a complete checkpoint: $("$CTL" status "$id" --json)"
"$CTL" status "$id" --json >"$S/status.json"
"$CTL" status "$id" >"$S/status.out"
grep -q "^  checkpoint  step [0-9]*: training blocked [0-9.]* s (rank [0-9]*); [0-9.]* MB written by [0-9]* ranks in [0-9.]* s (rank" "$S/status.out" ||
  fail "fsdpctl status has no checkpoint line: $(cat "$S/status.out")"
python3 -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1], timeout=5).read())' \
  "http://127.0.0.1:$PORT/metrics" "$S/metrics.txt" || fail "no answer on /metrics"
for m in fsdp_checkpoint_blocked_seconds fsdp_checkpoint_write_seconds fsdp_checkpoint_bytes; do
  grep -q "^$m{.*} [0-9]" "$S/metrics.txt" || fail "/metrics has no $m: $(grep checkpoint "$S/metrics.txt")"
done
"$CTL" trace "$id" --steps 4..8 -o "$S/trace.json" >/dev/null || fail "fsdpctl trace failed"
python3 - "$S/trace.json" <<'PY' || fail "trace: no checkpoint spans on their own lane"
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
writes = [e for e in ev if e.get("ph") == "X" and e["name"].startswith("checkpoint write")]
snaps = [e for e in ev if e.get("ph") == "X" and e["name"].startswith("checkpoint snapshot")]
assert writes and snaps, (len(writes), len(snaps))
assert all(lanes[(e["pid"], e["tid"])] == "checkpoint writer" for e in writes), {lanes[(e["pid"], e["tid"])] for e in writes}
print(f"trace: {len(writes)} checkpoint writes on the checkpoint writer lane, {len(snaps)} snapshots")
PY
"$CTL" cancel "$id" >/dev/null
wait_for 30 finished "$id" || fail "job $id did not end after cancel"
python3 - "$S/jobs/$id/metrics.jsonl" "$S/status.json" "$S/status.out" <<'PY' || fail "metrics.jsonl: checkpoint figures"
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
saves = [(d["step"], c) for d in lines for c in d.get("checkpoint", [])]
assert len(saves) >= 2, saves
for step, c in saves:
    assert c["step"] % 4 == 0 and c["step"] <= step, (step, c)
    assert c["bytes"] > 100000 and c["write_s"] > 0 and 0 <= c["wait_s"] <= c["blocked_s"], c
    assert abs(c["mb_per_s"] - c["bytes"] / c["write_s"] / 1e6) < 1e-6 * c["mb_per_s"], c
st = json.load(open(sys.argv[2]))["checkpoint"]
assert st["step"] in [c["step"] for _, c in saves], st
# fsdpctl status --json: the same save's figures as its metrics line, the pace fields included
same = next(c for _, c in saves if c["step"] == st["step"])
for k in ("blocked_s", "wait_s", "write_s", "bytes", "ranks", "blocked_rank", "write_rank", "inflight_steps",
          "inflight_step_ms", "before_step_ms", "step_slowdown"):
    ok = st[k] == same[k] if not isinstance(same[k], float) else abs(st[k] - same[k]) <= 1e-9 * abs(same[k])
    assert k in st and ok, (k, st, same)   # metrics.jsonl's reals carry 10 digits
# the plain status: a pace line where its save overlapped steps, with that save's figures
out = open(sys.argv[3]).read()
shown = next(c for _, c in saves if c["step"] == int(re.search(r"^  checkpoint  step (\d+):", out, re.M).group(1)))
pace = re.search(r"^ {14}while written: (\d+) step\(s\) of (\d+) ms against (\d+) ms before \(([\d.]+)x\)$", out, re.M)
if shown["inflight_steps"]:
    assert pace, out
    assert int(pace.group(1)) == shown["inflight_steps"] and pace.group(4) == f"{shown['step_slowdown']:.2f}", (pace.groups(), shown)
else:
    assert not pace, out
# the steps' pace while a write was in flight, recomputed from the lines: the steps after the save up
# to the one whose report completed it, against the latest 4 before it that no write overlapped
# (step 1, the warm-up, left out)
ms = {d["step"]: d["step_ms"] for d in lines}
over = {s for step, c in saves for s in range(c["step"] + 1, step + 1)}
near = lambda a, b: abs(a - b) <= 1e-9 * abs(b)
overlapped = 0
for step, c in saves:
    fl = list(range(c["step"] + 1, step + 1))
    assert c["inflight_steps"] == len(fl), (step, c)
    if not fl:
        assert c["inflight_step_ms"] is None and c["step_slowdown"] is None, c
        continue
    overlapped += 1
    assert near(c["inflight_step_ms"], sum(ms[s] for s in fl) / len(fl)), (step, c)
    base = [ms[s] for s in range(2, c["step"] + 1) if s not in over][-4:]
    assert near(c["before_step_ms"], sum(base) / len(base)), (step, c, base)
    assert near(c["step_slowdown"], c["inflight_step_ms"] / c["before_step_ms"]), c
assert overlapped >= 1, saves   # a running job's writes overlap its steps
print(f"metrics.jsonl: {len(saves)} saves ({overlapped} overlapping steps), e.g. {saves[0]}")
PY
grep -q "checkpoint of step 4 complete: [0-9.]* MB written by [0-9]* rank(s), the slowest in [0-9.]* s (rank [0-9]*); training blocked up to" "$S/jobs/$id/job.log" ||
  fail "job.log has no checkpoint line: $(grep -i checkpoint "$S/jobs/$id/job.log" | head -3)"
stop_daemon

# ---- a save read from the shards where they live (no snapshot on the CPU device): its writer held
# before its file (begin) while training runs on past the next optimizer update, then released; the
# update detached it (the shards copied first: a detach in mid-file is test_ckpt_async's), so every
# rank file equals a synchronous save's of the same job, byte for byte (without the detach the
# files hold the next step's shards)
pd="$S/pause-live"
mkdir -p "$pd"
live_job() {   # live_job CKDIR ASYNC > file
  sed -e "s/^steps = .*/steps = 4/" "$SRC/tests/integration/jobs/ctl_small.ini"
  printf '[checkpoint]\ndir = %s\nevery = 2\nkeep = 2\nasync = %s\n' "$1" "$2"
}
live_job "$S/ck-sync" false >"$S/sync.ini"
live_job "$S/ck-live" true >"$S/live.ini"
FSDP_TEST_CKPT_PAUSE="begin:2" FSDP_TEST_CKPT_PAUSE_DIR="$pd" start_daemon --worker "$HOOKED"
wait_for 10 "$CTL" nodes || fail "fsdpd did not answer within 10 s"
id=$("$CTL" submit "$S/live.ini" | tail -1)
wait_for 60 test -e "$pd/paused-begin-0" || fail "the live save's writer never began its file"
past3() { grep -q '"step": *3[,}]' "$S/jobs/$id/metrics.jsonl"; }
wait_for 60 past3 || fail "training did not go on past step 3 while step 2's write was held: $(tail -2 "$S/jobs/$id/job.log")"
touch "$pd/release"
wait_for 60 finished "$id" || fail "job $id did not end once its write was released"
[ "$(state_of "$id")" = succeeded ] || fail "job $id: $(tail -3 "$S/jobs/$id/job.log")"
id=$("$CTL" submit "$S/sync.ini" | tail -1)
wait_for 60 finished "$id" || fail "job $id (synchronous saves) did not end"
for st in 2 4; do
  for f in "$S"/ck-sync/step-0000000$st/rank-*.bin; do
    cmp -s "$f" "$S/ck-live/step-0000000$st/${f##*/}" || fail "step $st's ${f##*/}: the live save differs from the synchronous one"
  done
done
echo "live save held past the next update: its rank files equal the synchronous save's"
stop_daemon

# ---- fsdpctl stop while step 4's save is being written (held mid-file): the job cannot end before
# that write does; once released, step 4's checkpoint is completed and the stop step is saved
pd="$S/pause-stop"
mkdir -p "$pd"
sed -e "s/^steps = .*/steps = 100000/" "$SRC/tests/integration/jobs/ctl_small.ini" >"$S/stop.ini"
printf '[checkpoint]\ndir = %s\nevery = 4\nkeep = 3\n' "$S/ck-stop" >>"$S/stop.ini"
FSDP_TEST_CKPT_PAUSE="mid:4" FSDP_TEST_CKPT_PAUSE_DIR="$pd" start_daemon --worker "$HOOKED"
wait_for 10 "$CTL" nodes || fail "fsdpd did not answer within 10 s"
id=$("$CTL" submit "$S/stop.ini" | tail -1)
wait_for 60 test -e "$pd/paused-mid-0" || fail "stop: the writer never paused in step 4's save"
"$CTL" stop "$id" >/dev/null || fail "fsdpctl stop $id failed"
wait_for 10 grep -q "stop requested" "$S/jobs/$id/job.log" || fail "stop: job.log says no stop was requested"
is_state "$id" running || fail "stop: the job ended while step 4's save was still being written: $(state_of "$id")"
touch "$pd/release"
wait_for 60 finished "$id" || fail "stop: the job did not end after the write was released"
why=$(reason_of "$id")
last=$(echo "$why" | sed -n 's/.*stopped by the user after step \([0-9]*\).*/\1/p')
[ -n "$last" ] || fail "stop: reason '$why'"
[ "$(newest "$S/ck-stop")" = "$last" ] || fail "stop: newest complete '$(newest "$S/ck-stop")', expected $last"
[ -f "$S/ck-stop/step-00000004/manifest.json" ] || fail "stop: step 4's save, in flight at the stop, was not completed"
# the last step's save is written by the training thread itself (nothing follows for a write to
# overlap): the job was blocked for the whole write, no snapshot, no step in flight
python3 - "$S/jobs/$id/metrics.jsonl" "$last" <<'PY' || fail "stop: the last step's save was not synchronous"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
c = [c for d in lines if d["step"] == int(sys.argv[2]) for c in d.get("checkpoint", []) if c["step"] == int(sys.argv[2])]
assert len(c) == 1, c
assert c[0]["blocked_s"] == c[0]["write_s"] > 0 and c[0]["wait_s"] == 0 and c[0]["inflight_steps"] == 0, c[0]
PY
stop_daemon
echo "fsdpctl stop during step 4's write: waited for it (step 4 complete), then saved step $last"

# case POINT VICTIM (rank0, rank1 or daemon)
kill_case() {
  local point=$1 victim=$2 ck="$S/ck-$1-$2" pd="$S/pause-$1-$2"
  mkdir -p "$pd"
  job "$ck" >"$S/j-$point-$victim.ini"
  FSDP_TEST_CKPT_PAUSE="$point:4" FSDP_TEST_CKPT_PAUSE_DIR="$pd" start_daemon --worker "$HOOKED"
  wait_for 10 "$CTL" nodes || fail "fsdpd did not answer within 10 s"
  local id; id=$("$CTL" submit "$S/j-$point-$victim.ini" | tail -1)
  wait_for 60 test -e "$pd/paused-$point-0" || fail "$point/$victim: the writer never paused at $point (step 4)"
  local w0 w1; w0=$(worker_pid "$id" 0); w1=$(worker_pid "$id" 1)
  case $victim in
    rank0) kill -KILL "$w0" ;;
    rank1) kill -KILL "$w1" ;;
    daemon) kill -KILL "$DPID"; wait "$DPID" 2>/dev/null || true; DPID="" ;;
  esac
  wait_for 30 pids_gone "$w0" "$w1" || fail "$point/$victim: workers still running 30 s after the kill"
  [ -z "$DPID" ] || stop_daemon
  local n; n=$(newest "$ck")
  [ "$n" = "2" ] || [ "$n" = "2 4" ] || fail "$point/$victim: after the kill: newest complete, partial = '$n', expected 2 and at most a partial 4"
  # resume = auto on a fresh daemon (no pause)
  env -u FSDP_CTL timeout 90 "$CTL" run "$S/j-$point-$victim.ini" --state-dir "$S/r-$point-$victim" >"$S/run-$point-$victim.out" 2>&1 ||
    fail "$point/$victim: resumed run failed: $(tail -3 "$S/run-$point-$victim.out")"
  grep -q "resuming from the checkpoint of step 2" "$S/r-$point-$victim/jobs/1/job.log" ||
    fail "$point/$victim: the resumed job did not resume from step 2: $(head -5 "$S/r-$point-$victim/jobs/1/job.log")"
  [ "$(newest "$ck")" = "6" ] || fail "$point/$victim: after the resumed run: '$(newest "$ck")'"
  [ -f "$ck/step-00000004/manifest.json" ] || fail "$point/$victim: step 4 not complete after the resumed run"
  echo "kill -9 $victim at $point of step 4's save: step 2 stayed the newest complete checkpoint; resumed from it"
}

kill_case begin rank1
kill_case mid rank0
kill_case manifest rank0
kill_case begin daemon
kill_case mid daemon
kill_case manifest daemon

# ---- full disk during an asynchronous write
M="$S/m"
mkdir -p "$M"
if ! mount -t tmpfs -o size=560k,mode=0700 tmpfs "$M" 2>/dev/null; then
  echo "ckpt_async: full disk case skipped: this machine does not let the test mount a tmpfs (needs root)"
  echo "ckpt_async: ok"
  exit 0
fi
at_exit 'umount -l "$M"'
job "$M/ck" >"$S/full.ini"
set +e
env -u FSDP_CTL timeout 90 "$CTL" run "$S/full.ini" --state-dir "$S/rf" >"$S/full.out" 2>"$S/full.err"; rc=$?
set -e
[ "$rc" = 1 ] || fail "full disk: fsdpctl run exited $rc, expected 1: $(tail -3 "$S/full.err")"
grep -q "No space left on device" "$S/full.err" || fail "full disk: the error does not say the disk is full: $(cat "$S/full.err")"
[ "$(grep -c . "$S/full.err")" = 1 ] || fail "full disk: more than one line on stderr: $(cat "$S/full.err")"
n=$(newest "$M/ck")
[ "$n" = "2" ] || fail "full disk: newest complete, partial = '$n', expected 2 and no partial directory"
echo "full disk ($(df -h "$M" | tail -1 | awk '{print $2}')): $(cat "$S/full.err"); step 2 complete, nothing newer left"
echo "ckpt_async: ok"
