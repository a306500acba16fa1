#!/usr/bin/env bash
# daemon_e2e — the embedded fsdpd comes up, answers nodes over ctl, runs a 2-rank CPU job with
# the real fsdp-worker to success (metrics.jsonl: one line per step with every required field;
# status carries the last step's per-rank figures), and after a restart still lists the job.
# Usage: bash daemon_e2e.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" e2e

sed -e 's/^steps = .*/steps = 5/' -e 's/^warmup_steps = .*/warmup_steps = 2/' "$SRC/examples/tiny.ini" > "$S/tiny.ini"
start_daemon
wait_for 10 "$BUILD/fsdpctl" nodes || fail "fsdpd did not answer nodes within 10 s"
slots=$("$BUILD/fsdpctl" nodes --json | jget 'sum(len(n["devices"]) for n in d["nodes"])')
[ "$slots" = 2 ] || fail "expected 2 CPU slots, got $slots"

id=$("$BUILD/fsdpctl" submit "$S/tiny.ini" | tail -1)
wait_for 60 finished "$id" || fail "job $id did not finish within 60 s"
is_state "$id" succeeded || fail "job $id: $("$BUILD/fsdpctl" status "$id")"
M="$S/jobs/$id/metrics.jsonl"
[ "$(wc -l < "$M")" = 5 ] || fail "metrics.jsonl has $(wc -l < "$M") lines, expected 5"
python3 - "$M" <<'PY' || fail "metrics.jsonl fields"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
for i, d in enumerate(lines, 1):
    assert d["step"] == i, (d["step"], i)
    for k in ("loss", "lr", "grad_norm", "tokens", "step_ms", "tokens_per_s"):
        assert isinstance(d[k], (int, float)), k
    assert d["tokens"] == 2 * 8 * 64, d["tokens"]            # B·T·G·world
    assert d["step_ms"] > 0 and d["tokens_per_s"] > 0
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    for r in d["ranks"]:
        assert set(r["phase_ms"]) == {"allgather", "compute", "reducescatter", "optimizer"}
        assert set(r["sent_bytes"]) == {"allgather", "reducescatter", "allreduce"}
        assert r["peak_bytes"]["param_shard"] > 0 and len(r["peak_bytes"]) == 7
assert abs(lines[0]["loss"] - 5.545) < 0.3, lines[0]["loss"]   # ln(256) at init
PY
last_ranks=$("$BUILD/fsdpctl" status "$id" --json | jget 'len(d["last"]["ranks"])')
[ "$last_ranks" = 2 ] || fail "status last.ranks has $last_ranks entries, expected 2"

stop_daemon
start_daemon
wait_for 10 "$BUILD/fsdpctl" nodes || fail "restarted fsdpd did not answer"
is_state "$id" succeeded || fail "after restart job $id is $(state_of "$id")"
grep -q "succeeded" <<<"$("$BUILD/fsdpctl" jobs)" || fail "fsdpctl jobs does not list the finished job"
stop_daemon
echo "daemon_e2e: ok"
