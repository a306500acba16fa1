#!/usr/bin/env bash
# ctl_run — `fsdpctl run` end to end with a private fsdpd and 2 CPU workers: the job succeeds,
# metrics.jsonl has one line per step with every field (per-rank memory by category, phase times,
# bytes per collective), the loss falls, the daemon is gone afterwards; in a temporary state
# directory the job's metrics and logs are kept (and named) while the daemon's database goes; a
# failing job exits 1 with one line, free of source locations, and keeps its logs; Ctrl-C stops
# the job after saving a checkpoint, stops the daemon and its workers, and exits 130; kill -9 of
# fsdpctl run leaves no temporary state directory behind.
# Usage: bash ctl_run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" ctl-run
T="$S"
RPID=""
at_exit 'stop_pid "$RPID"'   # fsdpctl stops its own daemon (which stops its workers)
FAIL_LOGS=()
for f in run tmprun bad int kill; do FAIL_LOGS+=("$T/$f.out" "$T/$f.err"); done
# No process (fsdpd or fsdp-worker) still runs with DIR on its command line (or as its working
# directory's prefix): only looks, never kills.
none_left() { ! pgrep -f -- "$1" >/dev/null; }
JOB="$SRC/tests/integration/jobs/ctl_small.ini"
unset FSDP_CTL

# ---- success, with a state directory we keep
timeout 120 "$CTL" run "$JOB" --state-dir "$T/state" >"$T/run.out" 2>"$T/run.err" || fail "run exited $?"
[ ! -s "$T/run.err" ] || fail "run wrote to stderr on success: $(cat "$T/run.err")"
grep -Eq "^job 1 \(ctl-small\) succeeded: 40 steps in .*, loss [0-9.]+ -> [0-9.]+" "$T/run.out" || fail "no summary line"
grep -q "step 40/40" "$T/run.out" || fail "no final progress line"
M="$T/state/jobs/1/metrics.jsonl"
[ -f "$M" ] || fail "no $M"
python3 - "$M" <<'EOF' || fail "metrics.jsonl check"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 40, f"{len(lines)} lines, expected one per step (40)"
cats = {"param_shard", "grad_shard", "optim_state", "gathered", "activations", "workspace", "comm"}
for i, d in enumerate(lines):
    assert d["step"] == i + 1, (i, d["step"])
    for k in ("loss", "lr", "grad_norm", "tokens", "step_ms", "tokens_per_s", "ranks"):
        assert k in d, f"step {i+1}: no {k}"
    assert d["tokens"] == 2 * 4 * 32, d["tokens"]          # world 2 x B 4 x T 32
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    for r in d["ranks"]:
        assert set(r["peak_bytes"]) == cats and set(r["cur_bytes"]) == cats
        assert set(r["phase_ms"]) == {"allgather", "compute", "reducescatter", "optimizer"}
        assert set(r["sent_bytes"]) == {"allgather", "reducescatter", "allreduce"}
        assert r["peak_bytes"]["param_shard"] > 0 and r["sent_bytes"]["allgather"] > 0
loss = [d["loss"] for d in lines]
first, last = sum(loss[:5]) / 5, sum(loss[-5:]) / 5
assert last < first - 0.5, f"loss did not fall: first 5 steps {first:.3f}, last 5 {last:.3f}"
EOF
wait_for 10 none_left "$T/state" || fail "processes of the private daemon remain: $(pgrep -af -- "$T/state")"
set +e; "$CTL" nodes --ctl "ipc://$T/state/ctl.sock" 2>/dev/null; rc=$?; set -e
[ "$rc" = 1 ] || fail "the private daemon still answers after run ended"

# ---- success in a temporary state directory: removed afterwards
mkdir "$T/tmp"
TMPDIR="$T/tmp" timeout 120 "$CTL" run "$JOB" >"$T/tmprun.out" 2>"$T/tmprun.err" || fail "run (temporary state) exited $?"
kept=$(sed -n 's/^metrics and logs kept in \(.*\) (metrics.jsonl.*/\1/p' "$T/tmprun.out")
case "$kept" in "$T"/tmp/fsdpctl-run.*/jobs/1) ;; *) fail "run did not say where the metrics are: $(cat "$T/tmprun.out")";; esac
[ "$(wc -l <"$kept/metrics.jsonl")" = 40 ] && [ -s "$kept/job.log" ] || fail "metrics or logs not kept in $kept"
[ ! -e "$kept/../../jobs.db" ] || fail "the private daemon's jobs.db was kept"

# ---- a failing job: exit 1, one line naming the job, the reason and the kept logs
head -c 4096 /dev/urandom >"$T/garbage.bin"
sed -e "s|^train = .*|train = $T/garbage.bin|" "$JOB" >"$T/bad.ini"
mkdir "$T/tmp2"
set +e; TMPDIR="$T/tmp2" timeout 120 "$CTL" run "$T/bad.ini" >"$T/bad.out" 2>"$T/bad.err"; rc=$?; set -e
[ "$rc" = 1 ] || fail "a failing job: run exited $rc, expected 1"
[ "$(wc -l <"$T/bad.err")" = 1 ] || fail "a failing job: $(wc -l <"$T/bad.err") stderr lines, expected 1"
grep -Eq "^fsdpctl: job 1 failed: .+ \(logs: $T/tmp2/fsdpctl-run\.[A-Za-z0-9]+/jobs/1\)$" "$T/bad.err" || fail "failing job stderr: $(cat "$T/bad.err")"
! grep -Eq "[a-z_]+\.(c|cc|cu|h):[0-9]+:" "$T/bad.err" || fail "a source location in a user-facing message: $(cat "$T/bad.err")"
wait_for 10 none_left "$T/tmp2" || fail "processes of the failed run remain"

# ---- Ctrl-C: the job saves a checkpoint and stops, the daemon and workers stop, exit 130; the
# job's metrics and logs stay
printf '\n[checkpoint]\ndir = %s\nevery = 100000\n' "$T/ck" | cat <(sed -e 's/^steps = .*/steps = 100000/' "$JOB") - >"$T/long.ini"
mkdir "$T/tmp3"
TMPDIR="$T/tmp3" "$CTL" run "$T/long.ini" >"$T/int.out" 2>"$T/int.err" & RPID=$!
progressing() { local m; m=$(ls "$T"/tmp3/fsdpctl-run.*/jobs/1/metrics.jsonl 2>/dev/null) && [ "$(wc -l <"$m")" -ge 3 ]; }
wait_for 60 progressing || fail "the long job did not reach step 3 within 60 s"
kill -INT "$RPID"
set +e; timeout 30 tail --pid="$RPID" -f /dev/null; wait "$RPID"; rc=$?; set -e
RPID=""
[ "$rc" = 130 ] || fail "run after Ctrl-C exited $rc, expected 130"
grep -q "stopping job 1" "$T/int.err" || fail "no stop notice: $(cat "$T/int.err")"
grep -q "fsdpctl: job 1 was cancelled: stopped by the user after step [0-9]*; its checkpoint is in $T/ck" "$T/int.err" || fail "no stopped line: $(cat "$T/int.err")"
step=$(sed -n 's/.*stopped by the user after step \([0-9]*\);.*/\1/p' "$T/int.err")
[ -f "$(printf "%s/step-%08d/manifest.json" "$T/ck" "$step")" ] || fail "no complete checkpoint of step $step in $T/ck: $(ls "$T/ck" 2>&1)"
m=$(ls "$T"/tmp3/fsdpctl-run.*/jobs/1/metrics.jsonl)
[ "$(wc -l <"$m")" = "$step" ] || fail "metrics.jsonl has $(wc -l <"$m") lines, the job stopped after step $step"
wait_for 10 none_left "$T/tmp3" || fail "processes remain after Ctrl-C: $(pgrep -af -- "$T/tmp3")"

# ---- kill -9 of fsdpctl run: the daemon and workers stop and the temporary state directory goes
mkdir "$T/tmp4"
TMPDIR="$T/tmp4" "$CTL" run "$T/long.ini" >"$T/kill.out" 2>"$T/kill.err" & RPID=$!
progressing4() { local m; m=$(ls "$T"/tmp4/fsdpctl-run.*/jobs/1/metrics.jsonl 2>/dev/null) && [ "$(wc -l <"$m")" -ge 1 ]; }
wait_for 60 progressing4 || fail "the job under kill -9 did not reach step 1 within 60 s"
kill -KILL "$RPID"; wait "$RPID" 2>/dev/null || true; RPID=""
wait_for 30 none_left "$T/tmp4" || fail "processes remain after kill -9 of fsdpctl run: $(pgrep -af -- "$T/tmp4")"
wait_for 30 bash -c "[ -z \"\$(ls -A '$T/tmp4')\" ]" || fail "kill -9 of fsdpctl run left $(ls -A "$T/tmp4")"
echo "ctl_run: ok"
