#!/usr/bin/env bash
# daemon_stalls — failure reasons for ranks that stall instead of dying (part of the fault suite):
#  1. SIGSTOP of rank 1: rank 0's collective times out after [fsdp] timeout_s and the job fails
#     naming rank 1, the rank that did not arrive, not rank 0, the one that gave up waiting;
#  2. SIGSTOP of both ranks: nobody reports anything, and the job still fails within the step
#     deadline that follows timeout_s (2 x timeout_s), naming the ranks whose report is missing
#     (both, or the one stopped first when the other had just sent its report).
# Usage: bash daemon_stalls.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" stalls

sed -e 's/^steps = .*/steps = 100000/' -e 's/^timeout_s = .*/timeout_s = 3/' "$SRC/examples/tiny.ini" > "$S/long.ini"
start_daemon
wait_for 10 "$BUILD/fsdpctl" nodes || fail "fsdpd did not answer within 10 s"

# 1. rank 1 stopped
id=$("$BUILD/fsdpctl" submit "$S/long.ini" | tail -1)
wait_for 60 at_step "$id" 2 || fail "job $id did not reach step 2 within 60 s"
signal_rank STOP "$id" 1
wait_for 30 finished "$id" || fail "job $id did not fail within 30 s of SIGSTOP of rank 1"
reason=$(reason_of "$id")
echo "rank 1 stopped: $reason"
case "$reason" in "rank 1 "*) ;; *) fail "the reason names the wrong rank: '$reason' (rank 1 was stopped)";; esac
! grep -Eq '[a-z_]+\.(c|cc|h):[0-9]+:' <<<"$reason" || fail "a source location in the reason: '$reason'"

# 2. both ranks stopped: the step deadline (2 x timeout_s = 6 s) ends the job
id2=$("$BUILD/fsdpctl" submit "$S/long.ini" | tail -1)
wait_for 60 at_step "$id2" 2 || fail "job $id2 did not reach step 2 within 60 s"
signal_rank STOP "$id2" 0; signal_rank STOP "$id2" 1
t0=$SECONDS
wait_for 20 finished "$id2" || fail "job $id2 did not fail within 20 s with both ranks stopped (timeout_s = 3)"
reason=$(reason_of "$id2")
echo "both stopped, failed after $((SECONDS - t0)) s: $reason"
case "$reason" in "ranks 0, 1 sent no report for step"*|"rank "[01]" sent no report for step"*) ;;
  *) fail "reason '$reason' does not name the stopped ranks";; esac
echo "daemon_stalls: ok"
