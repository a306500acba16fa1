#!/usr/bin/env bash
# resolved_job — workers run the job as the coordinator resolved it, not as their own build would
# default it. fsdp-worker-skewed is fsdp-worker with another default for [optim] lr (0.0123 instead
# of 6e-4: tests/CMakeLists.txt). A job file that leaves lr out:
#  - standalone, the skewed worker resolves the file itself and trains at its own default, 0.0123
#    (so the two builds do differ);
#  - through an fsdpd whose workers are the skewed binary, every step trains at the coordinator's
#    resolved 6e-4 (metrics.jsonl's lr), though the workers' build defaults to 0.0123.
# Usage: bash resolved_job.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" resolved
SKEWED="$BUILD/tests/fsdp-worker-skewed"
[ -x "$SKEWED" ] || fail "$SKEWED is not built"

# constant schedule, no warmup: each step's lr is the job's lr
sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 0/' -e 's/^schedule = .*/schedule = constant/' \
    -e '/^lr = /d' -e '/^min_lr = /d' "$SRC/examples/tiny.ini" > "$S/nolr.ini"
! grep -q '^lr\|^min_lr' "$S/nolr.ini" || fail "the job file still sets lr"
lr_ok() {   # METRICS_FILE WANT: every line's lr is WANT (to float32's precision: the reports carry floats)
  python3 - "$1" "$2" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
want = float(sys.argv[2])
assert lines, "no step reported"
for d in lines:
    if "lr" in d:
        assert abs(d["lr"] - want) <= 1e-6 * want, (d["step"], d["lr"], want)
PY
}

mkdir "$S/rdv"
"$SKEWED" --standalone --rank 0 --world 1 --rendezvous "$S/rdv" --steps 1 "$S/nolr.ini" > "$S/standalone.jsonl" \
  2> "$S/standalone.log" || fail "the skewed worker did not run standalone: $(tail -3 "$S/standalone.log")"
lr_ok "$S/standalone.jsonl" 0.0123 || fail "standalone, the skewed worker's lr is not its own default 0.0123: $(cat "$S/standalone.jsonl")"

start_daemon --worker "$SKEWED"
wait_for 10 "$CTL" nodes || fail "fsdpd did not answer nodes within 10 s"
id=$("$CTL" submit "$S/nolr.ini" | tail -1)
wait_for 60 finished "$id" || fail "job $id did not finish within 60 s"
is_state "$id" succeeded || fail "job $id: $("$CTL" status "$id")"
grep -q "fsdp-worker-skewed" "$S/fsdpd.log" || fail "the daemon did not start the skewed worker"
M="$S/jobs/$id/metrics.jsonl"
[ "$(wc -l < "$M")" = 3 ] || fail "metrics.jsonl has $(wc -l < "$M") lines, expected 3"
lr_ok "$M" 6e-4 || fail "the workers did not train at the coordinator's lr 6e-4: $(cut -c1-200 "$M")"
echo "ok: standalone lr 0.0123 (the worker's default), through the daemon 6e-4 (the coordinator's)"
