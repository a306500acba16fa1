#!/usr/bin/env bash
# daemon_kill_worker — kill -9 of one worker fails its job within 10 s with a reason naming the
# rank and the signal; the job's other worker is killed, its devices are freed, and the daemon
# keeps serving (a following job runs to success).
# Usage: bash daemon_kill_worker.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" kill
all_free() { [ "$("$BUILD/fsdpctl" nodes --json | jget 'all(x["job_id"] is None for n in d["nodes"] for x in n["devices"])')" = True ]; }

sed -e 's/^steps = .*/steps = 2000/' "$SRC/examples/tiny.ini" > "$S/long.ini"
sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' "$SRC/examples/tiny.ini" > "$S/short.ini"
start_daemon
wait_for 10 "$BUILD/fsdpctl" nodes || fail "fsdpd did not answer within 10 s"

id=$("$BUILD/fsdpctl" submit "$S/long.ini" | tail -1)
wait_for 60 at_step "$id" 1 || fail "job $id did not reach step 1 within 60 s"
pid1=$(worker_pid "$id" 1); pid0=$(worker_pid "$id" 0)
[ -n "$pid1" ] && [ -n "$pid0" ] || fail "no worker pids in the daemon log"
t0=$SECONDS
kill -KILL "$pid1"
wait_for 10 finished "$id" || fail "job $id did not fail within 10 s of kill -9 of rank 1"
reason=$("$BUILD/fsdpctl" status "$id" --json | jget 'd.get("reason", "")')
is_state "$id" failed || fail "job $id is $(state_of "$id"), expected failed"
case "$reason" in *"rank 1"*SIGKILL*) ;; *) fail "reason '$reason' does not name rank 1 and SIGKILL";; esac
echo "failed after $((SECONDS - t0)) s: $reason"
wait_for 10 all_free || fail "devices still held 10 s after the failure"
wait_for 10 bash -c "! kill -0 $pid0" || fail "rank 0 (pid $pid0) still alive"

id2=$("$BUILD/fsdpctl" submit "$S/short.ini" | tail -1)
wait_for 60 finished "$id2" || fail "job $id2 did not finish"
is_state "$id2" succeeded || fail "job $id2 after the failure: $("$BUILD/fsdpctl" status "$id2")"
stop_daemon
echo "daemon_kill_worker: ok"
