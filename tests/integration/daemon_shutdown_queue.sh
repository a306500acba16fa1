#!/usr/bin/env bash
# daemon_shutdown_queue — a shutdown keeps the queue (docs/operations.md §1). Round 1: one running
# job with a checkpoint directory and three queued behind it; `fsdpctl shutdown`; the database holds all four
# queued, the running one stopped at a step that saved a checkpoint; after a restart all four
# succeed, the first from that checkpoint, and its metrics.jsonl has every step once. Round 2:
# SIGTERM with a running job that has no checkpoint: it is queued again, starts over after the
# restart and succeeds with every step once in metrics.jsonl.
# Usage: bash daemon_shutdown_queue.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" shutq

# [checkpoint] dir without every: the only checkpoint is the one the shutdown's stop saves
sed -e 's/^steps = .*/steps = 300/' -e "s|^; dir = .*|dir = $S/ckpt|" \
  "$SRC/examples/tiny.ini" > "$S/ckpt.ini"
sed -e 's/^steps = .*/steps = 200/' "$SRC/examples/tiny.ini" > "$S/plain.ini"
sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' "$SRC/examples/tiny.ini" > "$S/short.ini"
# db_states ID...: the states jobs.db records for the jobs, one line, read while no daemon runs
db_states() {
  python3 - "$S/jobs.db" "$@" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
names = {1: "queued", 2: "starting", 3: "running", 4: "succeeded", 5: "failed", 6: "cancelled"}
print(" ".join(names.get(db.execute("SELECT state FROM jobs WHERE id = ?", (int(i),)).fetchone()[0], "?") for i in sys.argv[2:]))
PY
}
# metrics_once ID STEPS: metrics.jsonl holds steps 1..STEPS, each once, in order
metrics_once() {
  python3 - "$S/jobs/$1/metrics.jsonl" "$2" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps == list(range(1, int(sys.argv[2]) + 1)), f"steps {steps}"
PY
}
all_succeeded() { for id in "$@"; do is_state "$id" succeeded || return 1; done; }

# ---- round 1: fsdpctl shutdown with 1 running (a checkpoint dir) and 3 queued
start_daemon
wait_for 10 "$CTL" nodes || fail "fsdpd did not answer within 10 s"
a=$("$CTL" submit "$S/ckpt.ini" | tail -1)
q=""
for k in 1 2 3; do q="$q $("$CTL" submit "$S/short.ini" | tail -1)"; done
wait_for 90 at_step "$a" 7 || fail "job $a did not reach step 7 within 90 s"
for id in $q; do is_state "$id" queued || fail "job $id is $(state_of "$id") behind the running job; expected queued"; done
"$CTL" shutdown >"$S/shutdown.out" 2>&1 || fail "fsdpctl shutdown failed: $(cat "$S/shutdown.out")"
rc=0; wait "$DPID" || rc=$?; DPID=""
[ "$rc" -eq 0 ] || fail "fsdpd exited with status $rc after fsdpctl shutdown"
got=$(db_states "$a" $q)
[ "$got" = "queued queued queued queued" ] || fail "after the shutdown jobs.db says: $got (jobs $a$q); expected all queued"
stopped=$(sed -n 's/.*queued: the daemon shut down after step \([0-9]*\), which saved a checkpoint.*/\1/p' "$S/jobs/$a/job.log")
[ -n "$stopped" ] && [ "$stopped" -ge 7 ] && [ "$stopped" -lt 300 ] ||
  fail "job $a was not stopped at a checkpoint by the shutdown: $(tail -3 "$S/jobs/$a/job.log")"

start_daemon
wait_for 10 "$CTL" nodes || fail "the restarted fsdpd did not answer within 10 s"
wait_for 150 all_succeeded "$a" $q || fail "not all of jobs $a$q succeeded after the restart: $("$CTL" jobs)"
grep -q "resuming from the checkpoint of step $stopped\$" "$S/jobs/$a/job.log" ||
  fail "job $a did not resume from the checkpoint of step $stopped: $(tail -5 "$S/jobs/$a/job.log")"
metrics_once "$a" 300 || fail "job $a's metrics.jsonl does not hold steps 1..300 once each"
echo "round 1: job $a stopped after step $stopped, resumed from it; jobs$q kept queued; all succeeded"

# ---- round 2: SIGTERM with a running job without checkpoints and one queued
e=$("$CTL" submit "$S/plain.ini" | tail -1)
f=$("$CTL" submit "$S/short.ini" | tail -1)
wait_for 60 at_step "$e" 3 || fail "job $e did not reach step 3 within 60 s"
stop_daemon
got=$(db_states "$e" "$f")
[ "$got" = "queued queued" ] || fail "after SIGTERM jobs.db says: $got (jobs $e $f); expected both queued"
grep -q "queued: the daemon shut down; the job has no checkpoint to resume from and starts over" "$S/jobs/$e/job.log" ||
  fail "job $e's job.log does not say it starts over: $(tail -3 "$S/jobs/$e/job.log")"
start_daemon
wait_for 10 "$CTL" nodes || fail "the restarted fsdpd did not answer within 10 s"
wait_for 120 all_succeeded "$e" "$f" || fail "jobs $e $f did not both succeed after the restart: $("$CTL" jobs)"
metrics_once "$e" 200 || fail "job $e's metrics.jsonl does not hold steps 1..200 once each after starting over"
stop_daemon
echo "daemon_shutdown_queue: ok"
