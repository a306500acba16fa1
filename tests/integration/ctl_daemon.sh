#!/usr/bin/env bash
# ctl_daemon — every fsdpctl command against a real fsdpd (2 CPU slots) and real workers:
# nodes (table and --json), submit (the id alone on the last stdout line), status --json (the
# required keys and the last step's per-rank figures), submit --follow (exit status of the job),
# jobs, logs (whole and --follow), cancel of a running job, a failing job (exit 1, one line with
# the reason; status --json carries it), unknown job ids, and a clear message once fsdpd is gone.
# Usage: bash ctl_daemon.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" ctl-daemon

JOB="$SRC/tests/integration/jobs/ctl_small.ini"
sed -e 's/^steps = .*/steps = 100000/' -e 's/^name = .*/name = ctl-long/' "$JOB" >"$S/long.ini"
# A job whose workers fail at start: its training file is not a token file.
head -c 4096 /dev/urandom >"$S/garbage.bin"
sed -e 's|^train = .*|train = garbage.bin|' -e 's/^name = .*/name = ctl-bad-data/' "$JOB" >"$S/baddata.ini"

start_daemon
wait_for 10 free_slots 2 || fail "fsdpd did not offer 2 CPU slots within 10 s"

# ---- nodes
out=$("$CTL" nodes) || fail "nodes failed"
grep -q "cpu:0" <<<"$out" && grep -q "cpu:1" <<<"$out" || fail "nodes table lacks cpu:0/cpu:1: $out"

# ---- submit: the id alone on the last line; status --json carries the required keys
out=$("$CTL" submit "$JOB") || fail "submit failed"
id=$(echo "$out" | tail -1)
[[ "$id" =~ ^[0-9]+$ ]] || fail "submit's last stdout line is '$id', expected a job id"
wait_for 60 finished "$id" || fail "job $id did not finish within 60 s"
"$CTL" status "$id" --json >"$S/status.json" || fail "status --json failed"
python3 - "$S/status.json" "$id" <<'EOF' || fail "status --json: $(cat "$S/status.json")"
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("id", "name", "state", "step", "steps", "loss", "tokens_per_s"):
    assert k in d, f"missing key {k}"
assert d["id"] == int(sys.argv[2]), d["id"]
assert d["name"] == "ctl-small", d["name"]
assert d["state"] == "succeeded", d["state"]
assert d["step"] == d["steps"] == 40, (d["step"], d["steps"])
assert isinstance(d["loss"], float) and 0 < d["loss"] < 10, d["loss"]
assert d["tokens_per_s"] > 0
assert "reason" not in d or d["reason"] == ""
ranks = d["last"]["ranks"]
assert [r["rank"] for r in ranks] == [0, 1], ranks
cats = {"param_shard", "grad_shard", "optim_state", "gathered", "activations", "workspace", "comm"}
for r in ranks:
    assert set(r["peak_bytes"]) == cats, r["peak_bytes"].keys()
    assert r["peak_bytes"]["param_shard"] > 0
    assert set(r["phase_ms"]) == {"allgather", "compute", "reducescatter", "optimizer"}
    assert r["phase_ms"]["compute"] > 0
    assert set(r["sent_bytes"]) == {"allgather", "reducescatter", "allreduce"}
    assert r["sent_bytes"]["allgather"] > 0 and r["sent_bytes"]["reducescatter"] > 0
EOF
# The human form has the header and the three per-rank tables.
out=$("$CTL" status "$id") || fail "status failed"
for w in "job $id (ctl-small): succeeded" "step        40/40" "peak memory per rank" "optim_state" "time per phase" "reducescatter" "bytes sent per collective"; do
  grep -qF -- "$w" <<<"$out" || fail "status output lacks '$w': $out"
done

# ---- submit --follow: progress lines, exit 0, the id first
"$CTL" submit "$JOB" --follow >"$S/follow.out" 2>"$S/follow.err" || fail "submit --follow exited $?: $(cat "$S/follow.err")"
fid=$(head -1 "$S/follow.out")
[[ "$fid" =~ ^[0-9]+$ ]] || fail "submit --follow: first line '$fid'"
grep -q "step 40/40" "$S/follow.out" || fail "submit --follow: no final progress line: $(cat "$S/follow.out")"
[ "$(grep -c 'step ' "$S/follow.out")" -le 20 ] || fail "submit --follow to a file printed too many progress lines"
is_state "$fid" succeeded || fail "followed job $fid is $(state_of "$fid")"

# ---- jobs: both jobs, table and JSON
out=$("$CTL" jobs) || fail "jobs failed"
echo "$out" | grep -Eq "^ *$id +ctl-small +succeeded +40/40" || fail "jobs table lacks job $id: $out"
"$CTL" jobs --json | jget "sorted(j['id'] for j in d['jobs'])" | grep -q "$id, $fid" || fail "jobs --json lacks $id and $fid"

# ---- logs: a finished job's log prints and ends; --follow ends too (the job is done)
timeout 10 "$CTL" logs "$id" >/dev/null || fail "logs $id failed or hung"
timeout 10 "$CTL" logs "$id" --rank 1 --follow >/dev/null || fail "logs --follow of a finished job failed or hung"
set +e; timeout 10 "$CTL" logs "$id" --rank 7 2>"$S/rank.err"; rc=$?; set -e
[ "$rc" = 1 ] && [ "$(wc -l <"$S/rank.err")" = 1 ] || fail "logs --rank 7 of a 2-rank job: status $rc, $(cat "$S/rank.err")"

# ---- cancel a running job; logs --follow of it ends when it does
lid=$("$CTL" submit "$S/long.ini" | tail -1)
wait_for 60 at_step "$lid" 2 || fail "job $lid did not reach step 2 within 60 s"
"$CTL" nodes --json | jget "[s['job_id'] for n in d['nodes'] for s in n['devices']]" | grep -q "$lid" ||
  fail "nodes does not show job $lid holding a device"
timeout 30 "$CTL" logs "$lid" --follow >/dev/null & LPID=$!
out=$("$CTL" cancel "$lid") || fail "cancel $lid failed"
[ "$out" = "cancelled job $lid" ] || fail "cancel printed '$out'"
wait_for 15 is_state "$lid" cancelled || fail "job $lid is $(state_of "$lid") 15 s after cancel"
wait "$LPID" || fail "logs --follow of job $lid did not end cleanly when it was cancelled (status $?)"
wait_for 15 free_slots 2 || fail "the cancelled job's slots were not freed"

# ---- a failing job: submit --follow exits 1 with one line naming the reason; status carries it
set +e; timeout 60 "$CTL" submit "$S/baddata.ini" --follow >"$S/bad.out" 2>"$S/bad.err"; rc=$?; set -e
[ "$rc" = 1 ] || fail "a failing job: submit --follow exited $rc, expected 1; $(cat "$S/bad.err")"
[ "$(wc -l <"$S/bad.err")" = 1 ] && grep -Eq "^fsdpctl: job [0-9]+ failed: .+" "$S/bad.err" || fail "failing job stderr: $(cat "$S/bad.err")"
bid=$(head -1 "$S/bad.out")
"$CTL" status "$bid" --json | jget 'd["state"] == "failed" and len(d["reason"]) > 0' | grep -q True ||
  fail "status of failed job $bid: $("$CTL" status "$bid" --json)"

# ---- unknown job ids
for cmd in "status 4242" "status 4242 --json" "cancel 4242" "logs 4242"; do
  set +e; "$CTL" $cmd >"$S/nojob.out" 2>"$S/nojob.err"; rc=$?; set -e
  [ "$rc" = 1 ] || fail "'$cmd' exited $rc, expected 1"
  [ "$(cat "$S/nojob.err")" = "fsdpctl: no job 4242" ] || fail "'$cmd' stderr: $(cat "$S/nojob.err")"
  [ ! -s "$S/nojob.out" ] || fail "'$cmd' printed to stdout"
done

# ---- once fsdpd is gone: the clear message, quickly
stop_daemon
set +e; t0=$SECONDS; timeout 20 "$CTL" status "$id" 2>"$S/gone.err"; rc=$?; set -e
[ "$rc" = 1 ] && [ $((SECONDS - t0)) -le 6 ] || fail "status with fsdpd gone: status $rc after $((SECONDS - t0)) s"
grep -q "^fsdpctl: cannot reach fsdpd at ipc://$S/ctl.sock: is it running?" "$S/gone.err" || fail "with fsdpd gone: $(cat "$S/gone.err")"
echo "ctl_daemon: ok"
