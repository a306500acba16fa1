#!/usr/bin/env bash
# ckpt_resume — checkpoints, resume and restarts through the daemon (docs/checkpoints.md):
#  1. `fsdpctl run` with [checkpoint] every = 2, keep = 2, 7 steps: metrics for 7 steps, checkpoints
#     of steps 6 and 7 only (4 and 2 pruned), each with a manifest and one file per rank;
#  2. the same job with steps = 11 and resume = auto, on 1 rank with batch 8 (N·B·G unchanged): the
#     first reported step is 8, and steps 8..11 match a straight 11-step run (fp32 summation order);
#     (standalone fsdp-workers, too: 4 steps, then resumed to 6, report steps 5 and 6 only);
#  3. max_restarts > 0 without checkpoints is refused at submit with a clear message;
#  4. kill -9 of a worker with max_restarts = 1: the job is queued again, restarts from the newest
#     checkpoint and succeeds; metrics.jsonl keeps exactly one line per step.
# Usage: bash ckpt_resume.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" ckpt
CTL="$BUILD/fsdpctl"
JOB="$SRC/tests/integration/jobs/ctl_small.ini"
run() { env -u FSDP_CTL timeout 90 "$CTL" run "$@" >>"$S/run.out" 2>&1 || fail "fsdpctl run $* exited $?: $(tail -5 "$S/run.out")"; }
job() {   # job STEPS WORLD BATCH EXTRA-INI-TEXT > file (schedule = constant: a cosine one
          # depends on steps, which the resumed run changes)
  sed -e "s/^schedule = .*/schedule = constant/" -e "s/^steps = .*/steps = $1/" -e "s/^world_size = .*/world_size = $2/" -e "s/^batch_size = .*/batch_size = $3/" "$JOB"
  printf '%b' "$4"
}

# ---- 1. every = 2, keep = 2
job 7 2 4 "[checkpoint]\ndir = $S/ck\nevery = 2\nkeep = 2\n" >"$S/a.ini"
run "$S/a.ini" --state-dir "$S/r1"
python3 - "$S/r1/jobs/1/metrics.jsonl" "$S/ck" <<'EOF' || fail "first run: metrics or checkpoints"
import json, os, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps == list(range(1, 8)), steps
ck = sys.argv[2]
dirs = sorted(os.listdir(ck))
assert dirs == ["step-00000006", "step-00000007"], dirs
for d in dirs:
    assert sorted(os.listdir(f"{ck}/{d}")) == ["manifest.json", "rank-0.bin", "rank-1.bin"], os.listdir(f"{ck}/{d}")
m = json.load(open(f"{ck}/step-00000007/manifest.json"))
assert (m["step"], m["world"], m["sharding"], m["rows_per_step"]) == (7, 2, "full", 8), m
assert m["tokens"] == 7 * 2 * 4 * 32, m["tokens"]
assert m["model"]["n_layer"] == 2 and m["files"] == ["rank-0.bin", "rank-1.bin"], m
EOF

# ---- 2. resume into 1 rank × batch 8, vs a straight run
job 11 1 8 "[checkpoint]\ndir = $S/ck\nevery = 2\nkeep = 2\nresume = auto\n" >"$S/b.ini"
run "$S/b.ini" --state-dir "$S/r2"
job 11 2 4 "" >"$S/straight.ini"
run "$S/straight.ini" --state-dir "$S/r3"
python3 - "$S/r2/jobs/1/metrics.jsonl" "$S/r3/jobs/1/metrics.jsonl" "$S/ck" <<'EOF' || fail "resume: metrics"
import json, os, sys
res = [json.loads(l) for l in open(sys.argv[1])]
ref = {d["step"]: d for d in map(json.loads, open(sys.argv[2]))}
assert [d["step"] for d in res] == [8, 9, 10, 11], [d["step"] for d in res]
for d in res:
    a, b = d["loss"], ref[d["step"]]["loss"]
    assert abs(a - b) <= 1e-5 * abs(b), f"step {d['step']}: loss {a} resumed vs {b} straight"
assert sorted(os.listdir(sys.argv[3])) == ["step-00000010", "step-00000011"], os.listdir(sys.argv[3])
print("resumed steps 8..11 on 1 rank:", " ".join(f"{d['loss']:.6f}" for d in res))
EOF
grep -q "resuming from the checkpoint of step 7" "$S/r2/jobs/1/job.log" || fail "job.log does not say it resumed from step 7"

# ---- standalone workers honour [checkpoint] too: 4 steps (checkpoints 2 and 4), then 6 with resume
job 4 2 4 "[checkpoint]\ndir = $S/cks\nevery = 2\n" >"$S/s1.ini"
job 6 2 4 "[checkpoint]\ndir = $S/cks\nevery = 2\n" >"$S/s2.ini"
for k in 1 2; do
  FSDP_WORKER="$BUILD/fsdp-worker" FSDP_OUT="$S/s$k" timeout 60 "$SRC/scripts/launch-standalone.sh" 2 "$S/s$k.ini" \
    >/dev/null 2>&1 || fail "standalone run $k: $(tail -3 "$S/s$k/rank-0.log")"
done
[ "$(python3 -c 'import json,sys; print([json.loads(l)["step"] for l in open(sys.argv[1])])' "$S/s2/rank-0.jsonl")" = "[5, 6]" ] ||
  fail "standalone resume did not continue at step 5: $(cat "$S/s2/rank-0.jsonl" | head -c 300)"
[ -f "$S/cks/step-00000006/manifest.json" ] || fail "standalone: no checkpoint of the last step"

# ---- 3 and 4: a daemon, a refused submit, and a restart after kill -9
start_daemon
wait_for 10 "$CTL" nodes || fail "fsdpd did not answer within 10 s"
job 50 2 4 "[job]\nmax_restarts = 1\n" >"$S/norestart.ini"
set +e; out=$("$CTL" submit "$S/norestart.ini" 2>&1); rc=$?; set -e
[ "$rc" -ne 0 ] || fail "max_restarts without checkpoints was accepted"
case "$out" in *max_restarts*every*) ;; *) fail "refusal does not explain itself: $out";; esac

job 300 2 4 "[job]\nmax_restarts = 1\n[checkpoint]\ndir = $S/ck4\nevery = 20\nkeep = 2\n" >"$S/restart.ini"
id=$("$CTL" submit "$S/restart.ini" | tail -1)
wait_for 60 at_step "$id" 25 || fail "job $id did not reach step 25 within 60 s"
signal_rank KILL "$id" 1
wait_for 90 finished "$id" || fail "job $id did not finish within 90 s of the kill"
is_state "$id" succeeded || fail "job $id: $("$CTL" status "$id")"
J="$S/jobs/$id"
grep -q "restart 1 of 1 from the newest checkpoint after: rank 1 was killed by signal 9" "$J/job.log" ||
  fail "job.log has no restart event: $(cat "$J/job.log")"
[ "$(grep -c "job $id rank 1: started" "$S/fsdpd.log")" -ge 2 ] || fail "rank 1 was not started again"
from=$(sed -n 's/.*resuming from the checkpoint of step \([0-9]*\).*/\1/p' "$J/job.log" | tail -1)
[ -n "$from" ] || fail "job.log does not say which checkpoint it resumed from"
grep -q "metrics.jsonl: dropped [0-9]* line(s) after step $from" "$J/job.log" ||
  fail "job.log does not say which metrics lines the restart replaced: $(cat "$J/job.log")"
python3 - "$J/metrics.jsonl" "$from" <<'EOF' || fail "restart: metrics"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
ck = int(sys.argv[2])
assert ck % 20 == 0 and ck >= 20, ck
# the steps the failed attempt reported after the checkpoint were dropped and trained again:
# one line per step, 1..300
missing = sorted(set(range(1, 301)) - set(steps))
twice = sorted(s for s in set(steps) if steps.count(s) > 1)
assert steps == list(range(1, 301)), f"metrics.jsonl steps are not exactly 1..300: missing {missing[:10]}, twice {twice[:10]}, resumed from {ck} ({len(steps)} lines)"
print(f"restarted from checkpoint {ck}; metrics.jsonl has one line for each of the 300 steps")
EOF
stop_daemon
echo "ckpt_resume: ok"
