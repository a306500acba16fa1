#!/usr/bin/env bash
# daemon_state_dir — one daemon per state directory (part of the fault suite):
#  1. a second fsdpd on a state directory that a running one holds exits at once, with one line
#     naming the running daemon's pid, and the first keeps serving (its sockets untouched); with
#     fsdpd.lock deleted, the same (the lock is on the directory itself; the pid is then unknown);
#  2. a detached fsdpd whose default state directory's parents do not exist yet
#     ($XDG_STATE_HOME/fsdpd) creates them and its fsdpd.log, and `fsdpctl shutdown` stops it.
# Usage: bash daemon_state_dir.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" statedir
XPID=""
at_exit '[ -z "$XPID" ] || kill -KILL "$XPID"'

start_daemon
wait_for 10 "$BUILD/fsdpctl" nodes || fail "fsdpd did not answer within 10 s"
set +e
timeout 10 "$BUILD/fsdpd" --foreground --state-dir "$S" --cpu-workers 1 --gpus none >"$S/second.out" 2>&1; rc=$?
set -e
[ "$rc" = 1 ] || fail "a second fsdpd on the same state directory exited $rc (124: it kept running), expected 1: $(cat "$S/second.out")"
[ "$(wc -l <"$S/second.out")" = 1 ] || fail "the second fsdpd said more than one line: $(cat "$S/second.out")"
grep -q "another fsdpd (pid $DPID) is using the state directory $S" "$S/second.out" || fail "refusal: $(cat "$S/second.out")"
[ -S "$S/ctl.sock" ] && [ -S "$S/cluster.sock" ] || fail "the first daemon's sockets are gone"
"$BUILD/fsdpctl" nodes >/dev/null || fail "the first daemon stopped answering"
[ "$(cat "$S/fsdpd.lock")" = "$DPID" ] || fail "the lock file holds '$(cat "$S/fsdpd.lock")', expected pid $DPID"
rm "$S/fsdpd.lock"
set +e
timeout 10 "$BUILD/fsdpd" --foreground --state-dir "$S" --cpu-workers 1 --gpus none >"$S/second.out" 2>&1; rc=$?
set -e
[ "$rc" = 1 ] || fail "with fsdpd.lock deleted, a second fsdpd exited $rc (124: it kept running), expected 1: $(cat "$S/second.out")"
[ "$(cat "$S/second.out")" = "fsdpd: another fsdpd (pid unknown) is using the state directory $S; stop it first (fsdpctl shutdown) or give this one another --state-dir" ] \
  || fail "refusal with fsdpd.lock deleted: $(cat "$S/second.out")"
"$BUILD/fsdpctl" nodes >/dev/null || fail "the first daemon stopped answering after the second one's attempt"
stop_daemon

X="$S/xdg/not/yet"
XDG_STATE_HOME="$X" "$BUILD/fsdpd" --cpu-workers 1 --gpus none || fail "the detached fsdpd did not start"
wait_for 10 test -s "$X/fsdpd/fsdpd.lock" || fail "no $X/fsdpd/fsdpd.lock"
XPID=$(cat "$X/fsdpd/fsdpd.lock")
wait_for 10 test -s "$X/fsdpd/fsdpd.log" || fail "the detached fsdpd wrote no $X/fsdpd/fsdpd.log"
export FSDP_CTL="ipc://$X/fsdpd/ctl.sock"
wait_for 10 "$BUILD/fsdpctl" nodes || fail "the detached fsdpd did not answer: $(cat "$X/fsdpd/fsdpd.log")"
out=$("$BUILD/fsdpctl" shutdown) || fail "fsdpctl shutdown failed: $out"
[ "$out" = "fsdpd at $FSDP_CTL has shut down" ] || fail "fsdpctl shutdown said '$out'"
wait_for 10 bash -c "! kill -0 $XPID" || fail "fsdpd (pid $XPID) still runs after fsdpctl shutdown"
XPID=""
echo "daemon_state_dir: ok"
