#!/usr/bin/env bash
# daemon_cancel_queue — a second job queues while the first holds every device; cancelling the
# first mid-run ends it (state cancelled, its workers gone) and the queued job then runs to success.
# Usage: bash daemon_cancel_queue.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd)
[ -x "$BUILD/fsdp-worker" ] && [ -x "$BUILD/fsdpctl" ] || { echo "fsdp-worker or fsdpctl not built"; exit 1; }
S=$(mktemp -d /tmp/fsdpd-cq-XXXXXX)
DPID=""
cleanup() {
  set +e
  [ -n "$DPID" ] && kill -TERM "$DPID" 2>/dev/null && { timeout 15 tail --pid="$DPID" -f /dev/null || kill -KILL "$DPID"; } 2>/dev/null
  [ -n "$DPID" ] && wait "$DPID" 2>/dev/null || true
  for p in $(pgrep -f -- "$S/" || true); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$S"
}
trap cleanup EXIT
export FSDP_CTL="ipc://$S/ctl.sock"
fail() { echo "FAIL: $*"; echo "--- daemon log"; tail -40 "$S/fsdpd.log" || true; exit 1; }
wait_for() { local t=$1; shift; local end=$((SECONDS + t)); until "$@" >/dev/null 2>&1; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done; }
jget() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {"d": d}))' "$1"; }
state_of() { "$BUILD/fsdpctl" status "$1" --json | jget 'd["state"]'; }
is_state() { [ "$(state_of "$1")" = "$2" ]; }
finished() { case "$(state_of "$1")" in succeeded|failed|cancelled) return 0;; esac; return 1; }
at_step() { [ "$("$BUILD/fsdpctl" status "$1" --json | jget 'd["state"] == "running" and d["step"] >= '"$2")" = True ]; }
worker_pid() { sed -n "s/.*job $1 rank $2: started .*(pid \([0-9]*\),.*/\1/p" "$S/fsdpd.log" | tail -1; }

sed -e 's/^steps = .*/steps = 2000/' "$SRC/examples/tiny.ini" > "$S/long.ini"
sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' "$SRC/examples/tiny.ini" > "$S/short.ini"
"$BUILD/fsdpd" --foreground --state-dir "$S" --cpu-workers 2 --gpus none >>"$S/fsdpd.log" 2>&1 & DPID=$!
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
kill -TERM "$DPID"; rc=0; wait "$DPID" || rc=$?; DPID=""
[ "$rc" -eq 0 ] || fail "fsdpd exited with status $rc"
echo "daemon_cancel_queue: ok"
