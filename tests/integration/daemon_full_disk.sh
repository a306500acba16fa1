#!/usr/bin/env bash
# daemon_full_disk — a full disk under the state directory (part of the fault suite): the state
# directory is a small tmpfs, which a long job's metrics fill. The step that cannot be recorded
# fails the job with that reason, `fsdpctl submit --follow` returns (exit 1), status says failed,
# metrics.jsonl holds only whole lines, and it holds exactly the steps the database recorded (a
# step is recorded in both or neither). First, a job whose every step was recorded but whose final
# state was not (the database as a full disk at the end of a job leaves it: running, all steps in)
# is succeeded after a restart, not "failed: daemon restarted". Needs mount(8) to work (root, or a
# user namespace); where it does not, the test says so and is skipped.
# Usage: bash daemon_full_disk.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" fulldisk
M="$S/m"
mkdir -p "$M"
if ! mount -t tmpfs -o size=2m,mode=0700 tmpfs "$M" 2>/dev/null; then
  echo "daemon_full_disk: skipped: this machine does not let the test mount a tmpfs (needs root)"
  exit 0
fi
# The daemon first (the tmpfs is its state directory), then the mount, before S is removed.
at_exit 'stop_pid "$DPID"; DPID=""; for p in $(pgrep -f -- "$S/" || true); do kill -KILL "$p"; done; umount -l "$M"'
export FSDP_CTL="ipc://$M/ctl.sock"
sed -e 's/^steps = .*/steps = 100000/' "$SRC/examples/tiny.ini" > "$S/long.ini"
sed -e 's/^steps = .*/steps = 20/' -e 's/^warmup_steps = .*/warmup_steps = 2/' "$SRC/examples/tiny.ini" > "$S/twenty.ini"
start_on_tmpfs() {
  "$BUILD/fsdpd" --foreground --state-dir "$M" --cpu-workers 2 --gpus none >>"$S/fsdpd.log" 2>&1 & DPID=$!
  wait_for 10 "$BUILD/fsdpctl" nodes || fail "fsdpd did not answer within 10 s"
}
start_on_tmpfs

# ---- a job with all its steps recorded, its final state not: succeeded after the restart
"$BUILD/fsdpctl" submit "$S/twenty.ini" --follow >"$S/twenty.out" 2>&1 || fail "the 20-step job failed: $(tail -3 "$S/twenty.out")"
id0=$(head -1 "$S/twenty.out")
stop_daemon
python3 - "$M/jobs.db" "$id0" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
with db:   # back to what a refused final state leaves: running, every step recorded
    db.execute("UPDATE jobs SET state = 3, finished_at = 0 WHERE id = ?", (int(sys.argv[2]),))
    db.execute("DELETE FROM job_transitions WHERE job_id = ? AND state = 4", (int(sys.argv[2]),))
PY
start_on_tmpfs
is_state "$id0" succeeded || fail "job $id0 (20 of 20 steps recorded) is $(state_of "$id0") after the restart: $(reason_of "$id0")"
grep -q "succeeded: all 20 steps were recorded before the daemon stopped" "$M/jobs/$id0/job.log" ||
  fail "job $id0's job.log does not say why it succeeded: $(tail -2 "$M/jobs/$id0/job.log")"
rm -rf "$M/jobs/$id0"   # its files leave the long job the same room

# ---- the long job fills the disk
set +e
timeout 120 "$BUILD/fsdpctl" submit "$S/long.ini" --follow >"$S/follow.out" 2>"$S/follow.err"; rc=$?
set -e
[ "$rc" = 1 ] || fail "submit --follow exited $rc (124: it never returned), expected 1: $(tail -3 "$S/follow.out") $(cat "$S/follow.err")"
id=$(head -1 "$S/follow.out")
grep -q "^fsdpctl: job $id failed: cannot record step [0-9]*: " "$S/follow.err" || fail "reason: $(cat "$S/follow.err")"
echo "$(df -h "$M" | tail -1): $(cat "$S/follow.err")"
is_state "$id" failed || fail "status says $(state_of "$id"), expected failed"
python3 - "$M/jobs/$id/metrics.jsonl" <<'PY' || fail "metrics.jsonl is not whole lines"
import json, sys
data = open(sys.argv[1]).read()
assert data == "" or data.endswith("\n"), "ends in a partial line"
steps = [json.loads(l)["step"] for l in data.splitlines()]
assert steps == list(range(1, len(steps) + 1)), "steps not 1..N"
print(f"metrics.jsonl: {len(steps)} whole lines")
PY
failed_at=$(sed -n "s/^fsdpctl: job $id failed: cannot record step \([0-9]*\): .*/\1/p" "$S/follow.err")
lines=$(wc -l < "$M/jobs/$id/metrics.jsonl")
dbstep=$("$BUILD/fsdpctl" status "$id" --json | jget 'd["step"]')
[ "$lines" = "$dbstep" ] && [ "$dbstep" = $((failed_at - 1)) ] ||
  fail "metrics.jsonl holds $lines steps, the database $dbstep; step $failed_at could not be recorded (expected $((failed_at - 1)) in both)"
stop_daemon
echo "daemon_full_disk: ok"
