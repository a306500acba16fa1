#!/usr/bin/env bash
# daemon_cancel_queue — a second job queues while the first holds every device; cancelling the
# first mid-run ends it (state cancelled, its workers gone) and the queued job then runs to success.
# Usage: bash daemon_cancel_queue.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" cq

sed -e 's/^steps = .*/steps = 2000/' "$SRC/examples/tiny.ini" > "$S/long.ini"
sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' "$SRC/examples/tiny.ini" > "$S/short.ini"
start_daemon
wait_for 10 "$BUILD/fsdpctl" nodes || fail "fsdpd did not answer within 10 s"

a=$("$BUILD/fsdpctl" submit "$S/long.ini" | tail -1)
b=$("$BUILD/fsdpctl" submit "$S/short.ini" | tail -1)
wait_for 60 at_step "$a" 2 || fail "job $a did not reach step 2 within 60 s"
is_state "$b" queued || fail "job $b is $(state_of "$b") while job $a holds every device; expected queued"
pids="$(worker_pid "$a" 0) $(worker_pid "$a" 1)"
"$BUILD/fsdpctl" cancel "$a" >/dev/null || fail "cancel $a failed"
wait_for 10 is_state "$a" cancelled || fail "job $a is $(state_of "$a") 10 s after cancel"
for p in $pids; do wait_for 10 bash -c "! kill -0 $p" || fail "worker pid $p of cancelled job $a still alive"; done
n=$(wc -l < "$S/jobs/$a/metrics.jsonl")
[ "$n" -ge 2 ] && [ "$n" -lt 2000 ] || fail "cancelled job has $n metrics lines"
wait_for 60 finished "$b" || fail "queued job $b did not finish within 60 s of the cancel"
is_state "$b" succeeded || fail "job $b: $("$BUILD/fsdpctl" status "$b")"
stop_daemon
echo "daemon_cancel_queue: ok"
