#!/usr/bin/env bash
# top — fsdpctl top against a running 2-rank CPU job: in an 80x24 tmux pane (new-session -x 80
# -y 24, capture-pane polled until the job's row appears) the header has the job columns, the job's
# row says running with its step, loss, tokens/s and ETA, both ranks have a memory bar and a time
# split, the node is listed, no line passes 80 columns; q quits with status 0. Under a queue of 60
# newer jobs the running one is still the first row and the header counts every job. Off a terminal the
# same frame comes as plain lines (--once, -n N), and on a terminal whose TERM has no terminfo entry
# (after one line that says so; Ctrl-C ends it with 130). With the daemon stopped (SIGSTOP) the frame says it
# does not answer within 15 s and q still quits, and `top -n 2` then exits 1 with one line on stderr.
# Skipped with a message without tmux.
# Usage: bash top.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" top
command -v tmux >/dev/null || { echo "top: tmux is not installed (scripts/install-deps.sh --test installs it)"; exit 1; }
TMUX_SOCK="$S/tmux.sock"
tm() { tmux -S "$TMUX_SOCK" -f /dev/null "$@"; }
at_exit 'tm kill-server 2>/dev/null || true'

start_daemon
wait_for 20 "$CTL" nodes || fail "the daemon did not answer within 20 s"
sed -e 's/^steps = .*/steps = 100000/' -e 's/^name = .*/name = watched/' "$SRC/tests/integration/jobs/ctl_small.ini" >"$S/job.ini"
id=$("$CTL" submit "$S/job.ini" | tail -1)
wait_for 120 at_step "$id" 3 || fail "job $id did not reach step 3 within 120 s: $("$CTL" status "$id")"

# check_frame FILE: the checks every frame passes, tty or not.
check_frame() {
  python3 - "$1" "$id" <<'PY' || fail "frame $1 is wrong (above): $(cat "$1")"
import re, sys
lines = open(sys.argv[1]).read().split("\n")
job = sys.argv[2]
assert all(len(l) <= 80 for l in lines), [l for l in lines if len(l) > 80]
head = [l for l in lines if "JOB" in l]
assert head and re.search(r"JOB\s+NAME\s+STATE\s+STEP\s+LOSS\s+TOK/S\s+ETA\s+TRAIN/S", head[0]), head
# plain text: every token is trained, TRAIN/S is TOK/S
row = [l for l in lines if re.match(r"^>?\s*%s\s+watched\s+running\s+\d+/100000\s+\d+\.\d{4}\s+([\d.]+k?)\s+\S+\s+\1$" % job, l)]
assert row, "no row for job %s" % job
for rank in (0, 1):
    assert any(re.match(r"^\s+%d \[[PGOgAWC.]+\]\s+[\d.]+ [KMG]?i?B(\s+\d+%%){4}$" % rank, l) for l in lines), "rank %d" % rank
assert any(re.search(r"^\s+1 \S+\s+up\s+2 cpu, 2 busy", l) for l in lines), "no node line"
PY
}

# Off a terminal: plain lines, one frame (--once) or N (-n).
"$CTL" top --once >"$S/once.txt" || fail "top --once failed"
check_frame "$S/once.txt"
"$CTL" top -n 2 --interval 0.1 >"$S/two.txt" || fail "top -n 2 failed"
[ "$(grep -c '^fsdpctl top ' "$S/two.txt")" = 2 ] || fail "top -n 2 printed: $(cat "$S/two.txt")"

# On a terminal: an 80x24 tmux pane.
tm new-session -d -x 80 -y 24 -s top "env FSDP_CTL='$FSDP_CTL' '$CTL' top --interval 0.3; echo \$? >'$S/top.rc'"
shows_job() { tm capture-pane -p -t top >"$S/pane.txt" && grep -Eq "^>? *$id +watched +running" "$S/pane.txt"; }
wait_for 30 shows_job || fail "top did not show job $id within 30 s: $(cat "$S/pane.txt")"
# the ranks come in the same frame; should the capture have caught a redraw halfway, take another
shows_ranks() { tm capture-pane -p -t top >"$S/pane.txt" && grep -Eq '^ +1 \[' "$S/pane.txt"; }
wait_for 10 shows_ranks || fail "top did not show the ranks of job $id: $(cat "$S/pane.txt")"
check_frame "$S/pane.txt"
[ "$(wc -l <"$S/pane.txt")" -le 24 ] || fail "the pane has more than 24 lines"
grep -q "^q quit" "$S/pane.txt" || fail "no key help on the last line: $(cat "$S/pane.txt")"
[ -n "${FSDP_TOP_KEEP:-}" ] && cp "$S/pane.txt" "$FSDP_TOP_KEEP"
tm send-keys -t top q
wait_for 15 test -s "$S/top.rc" || fail "top did not exit within 15 s of q"
[ "$(cat "$S/top.rc")" = 0 ] || fail "top exited with status $(cat "$S/top.rc") after q"

# A terminal whose type has no terminfo entry here (ssh from kitty, alacritty...): plain frames on
# it, after one line that says why, instead of ncurses' "Error opening terminal" and exit 1.
rm -f "$S/top.rc"
tm new-session -d -x 80 -y 24 -s oddterm "env TERM=no-such-term-here FSDP_CTL='$FSDP_CTL' '$CTL' top --interval 0.3 2>'$S/odd.err'; echo \$? >'$S/top.rc'"
shows_plain() { tm capture-pane -p -t oddterm >"$S/pane.txt" && grep -Eq "^>? *$id +watched +running" "$S/pane.txt"; }
wait_for 30 shows_plain || fail "top with an unknown TERM did not show job $id in plain lines: $(cat "$S/pane.txt") $(cat "$S/odd.err" 2>/dev/null)"
[ "$(wc -l <"$S/odd.err")" = 1 ] && grep -q "^fsdpctl: top: TERM=no-such-term-here" "$S/odd.err" ||
  fail "top with an unknown TERM: expected one line on stderr naming it, got: $(cat "$S/odd.err")"
tm send-keys -t oddterm C-c
wait_for 15 test -s "$S/top.rc" || fail "top (plain, unknown TERM) did not exit within 15 s of Ctrl-C"
[ "$(cat "$S/top.rc")" = 130 ] || fail "top (plain, unknown TERM) exited with $(cat "$S/top.rc") after Ctrl-C, expected 130"

# A queue longer than top's list (50) of newer jobs behind the running one: the running job is still
# listed, first, and the header counts every job (before: "0 running" and only the newest rows).
sed -e 's/^name = .*/name = waiting/' "$S/job.ini" >"$S/queued.ini"
queued=()
for i in $(seq 60); do queued+=("$("$CTL" submit "$S/queued.ini" | tail -1)"); done
"$CTL" top --once >"$S/queue.txt" || fail "top --once under a queue failed"
grep -Eq "^fsdpctl top +[0-9:]+ +1 running +0 starting +60 queued " "$S/queue.txt" || fail "top's header under a queue of 60: $(head -1 "$S/queue.txt")"
first=$(grep -A1 -E "JOB +NAME" "$S/queue.txt" | tail -1)
grep -Eq "^>? *$id +watched +running" <<<"$first" || fail "the running job is not the first row under a queue of 60: $(cat "$S/queue.txt")"
for q in "${queued[@]}"; do "$CTL" cancel "$q" >/dev/null; done

rc=0; "$CTL" top --interval 0 >/dev/null 2>"$S/err.txt" || rc=$?
[ "$rc" = 2 ] && head -1 "$S/err.txt" | grep -q -- "--interval takes seconds" || fail "bad --interval: $rc $(cat "$S/err.txt")"
"$CTL" cancel "$id" >/dev/null
wait_for 60 finished "$id" || fail "job $id did not end within 60 s of cancel"

# The daemon wedges (SIGSTOP: its connection stays up, no request is answered): within seconds the
# frame says so, and q still quits (each of top's calls has a short deadline, and a poll stops at
# its first failed call instead of waiting out one deadline per job and the nodes).
rm -f "$S/top.rc"
tm new-session -d -x 80 -y 24 -s wedged "env FSDP_CTL='$FSDP_CTL' '$CTL' top --interval 0.2; echo \$? >'$S/top.rc'"
shows_node() { tm capture-pane -p -t wedged >"$S/pane.txt" && grep -Eq '^ +1 +\S+ +up ' "$S/pane.txt"; }
wait_for 30 shows_node || fail "top did not show the node within 30 s: $(cat "$S/pane.txt")"
kill -STOP "$DPID"
at_exit 'kill -CONT "$DPID" 2>/dev/null || true'
says_wedged() { tm capture-pane -p -t wedged >"$S/pane.txt" && grep -q '^! fsdpd at ' "$S/pane.txt"; }
wedged_ok=1
wait_for 15 says_wedged || wedged_ok=0
tm send-keys -t wedged q
wait_for 15 test -s "$S/top.rc" || wedged_ok=0
# -n N while it is wedged: every frame says so, and the exit status is 1 with one line on stderr
rc=0; "$CTL" top -n 2 --interval 0.1 >"$S/gone.txt" 2>"$S/gone.err" || rc=$?
kill -CONT "$DPID"
[ "$rc" = 1 ] && [ "$(wc -l <"$S/gone.err")" = 1 ] && [ "$(grep -c '^! .*fsdpd at ' "$S/gone.txt")" = 2 ] ||
  fail "top -n 2 with the daemon stopped: status $rc, stderr: $(cat "$S/gone.err"), frames: $(cat "$S/gone.txt")"
[ "$wedged_ok" = 1 ] || fail "with the daemon stopped, top did not say so and quit on q within 15 s each: $(cat "$S/pane.txt")"
[ "$(cat "$S/top.rc")" = 0 ] || fail "top exited with status $(cat "$S/top.rc") after q (daemon stopped)"
stop_daemon
echo "top: ok"
