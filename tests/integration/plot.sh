#!/usr/bin/env bash
# plot — fsdpctl plot on a real short 2-rank job with [eval]: by job id (through the daemon) and by
# metrics.jsonl path, a PNG (magic bytes, at least 10 kB, the default 1000x900 and a --size one);
# one-line errors for an unknown job, a job with no steps yet, an empty metrics.jsonl and a
# missing gnuplot. Fails when gnuplot is missing (scripts/install-deps.sh installs it).
# Usage: bash plot.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" plot
command -v gnuplot >/dev/null || { echo "plot: gnuplot is not installed (scripts/install-deps.sh installs gnuplot-nox)"; exit 1; }

# png_ok FILE W H: a PNG of W x H pixels (IHDR), of a non-trivial size.
png_ok() {
  python3 - "$@" <<'PY' || fail "$1 is not a $2x$3 PNG of some size"
import struct, sys, os
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n", b[:8]
assert b[12:16] == b"IHDR"
w, h = struct.unpack(">II", b[16:24])
assert (w, h) == (int(sys.argv[2]), int(sys.argv[3])), (w, h)
assert os.path.getsize(sys.argv[1]) > 10000, os.path.getsize(sys.argv[1])
PY
}
# one_line_err WHAT EXPECT CMD...: CMD fails with one stderr line containing EXPECT.
one_line_err() {
  local what=$1 expect=$2; shift 2
  local rc=0; "$@" >"$S/err.out" 2>"$S/err.txt" || rc=$?
  [ "$rc" != 0 ] || fail "$what: exit status 0"
  [ "$(wc -l <"$S/err.txt")" = 1 ] && grep -q -- "$expect" "$S/err.txt" || fail "$what: expected one line with '$expect', got: $(cat "$S/err.txt")"
}

start_daemon
wait_for 20 "$CTL" nodes || fail "the daemon did not answer within 20 s"
# The demo job, shorter, with a validation set evaluated every 5 steps.
sed -e 's/^steps = .*/steps = 30/' -e 's/^warmup_steps = .*/warmup_steps = 5/' -e 's/^name = .*/name = plotted/' \
    -e 's/^train = .*/&\nval = synthetic:markov:2/' "$SRC/examples/tiny.ini" >"$S/job.ini"
printf '[eval]\nevery = 5\nbatches = 2\n' >>"$S/job.ini"
one_line_err "unknown job" "no job 999" "$CTL" plot 999 -o "$S/x.png"
id=$("$CTL" submit "$S/job.ini" | tail -1)
wait_for 120 finished "$id" || fail "job $id did not finish within 120 s"
is_state "$id" succeeded || fail "job $id: $("$CTL" status "$id")"

"$CTL" plot "$id" -o "$S/by-id.png" >"$S/plot.out" || fail "plot $id failed"
grep -q "30 steps" "$S/plot.out" || fail "plot $id said: $(cat "$S/plot.out")"
png_ok "$S/by-id.png" 1000 900
"$CTL" plot "$S/jobs/$id/metrics.jsonl" --size 640x480 -o "$S/by-path.png" >/dev/null || fail "plot by path failed"
png_ok "$S/by-path.png" 640 480
[ -n "${FSDP_PLOT_KEEP:-}" ] && cp "$S/by-id.png" "$FSDP_PLOT_KEEP"

: >"$S/empty.jsonl"
one_line_err "empty metrics.jsonl" "no steps yet" "$CTL" plot "$S/empty.jsonl" -o "$S/x.png"
one_line_err "no gnuplot" "gnuplot is not installed" env PATH=/nonexistent "$CTL" plot "$S/jobs/$id/metrics.jsonl" -o "$S/x.png"
rc=0; "$CTL" plot "$id" --size 10x10 -o "$S/x.png" 2>"$S/err.txt" || rc=$?   # a usage error: its line, then the usage
[ "$rc" = 2 ] && head -1 "$S/err.txt" | grep -q -- "--size takes WxH" || fail "bad --size: status $rc, $(cat "$S/err.txt")"
# A job that has not started: queued behind a job that holds both slots.
sed -e 's/^steps = .*/steps = 100000/' "$S/job.ini" >"$S/long.ini"
long=$("$CTL" submit "$S/long.ini" | tail -1)
queued=$("$CTL" submit "$S/job.ini" | tail -1)
is_state "$queued" queued || fail "job $queued is $(state_of "$queued"), expected queued"
one_line_err "queued job" "no steps yet" "$CTL" plot "$queued" -o "$S/x.png"
"$CTL" cancel "$queued" >/dev/null
"$CTL" cancel "$long" >/dev/null
wait_for 60 finished "$long" || fail "job $long did not end after cancel"
stop_daemon
echo "plot: ok"
