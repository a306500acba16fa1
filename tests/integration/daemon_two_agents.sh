#!/usr/bin/env bash
# daemon_two_agents — a coordinator on tcp://127.0.0.1:PORT (no CPU slots of its own) and two
# agents that --join it, each with its own state directory and two CPU slots; a 4-rank job spans
# both nodes (ranks packed by node: 2 + 2) and succeeds, with one metrics line per step and four
# ranks in each. The coordinator restarts and the agents register again. Then agent b is killed
# during a 4-rank job: the job fails naming a rank, node-b is marked lost, node-a's devices are freed.
# Usage: bash daemon_two_agents.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd)
[ -x "$BUILD/fsdp-worker" ] && [ -x "$BUILD/fsdpctl" ] || { echo "fsdp-worker or fsdpctl not built"; exit 1; }
S=$(mktemp -d /tmp/fsdpd-2a-XXXXXX)
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do { timeout 15 tail --pid="$p" -f /dev/null || kill -KILL "$p"; } 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for p in $(pgrep -f -- "$S/" || true); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$S"
}
trap cleanup EXIT
mkdir -p "$S/coord" "$S/a" "$S/b"
export FSDP_CTL="ipc://$S/coord/ctl.sock"
fail() { echo "FAIL: $*"; for f in "$S"/*/fsdpd.log; do echo "--- $f"; tail -30 "$f"; done; exit 1; }
wait_for() { local t=$1; shift; local end=$((SECONDS + t)); until "$@" >/dev/null 2>&1; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done; }
jget() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {"d": d}))' "$1"; }
state_of() { "$BUILD/fsdpctl" status "$1" --json | jget 'd["state"]'; }
finished() { case "$(state_of "$1")" in succeeded|failed|cancelled) return 0;; esac; return 1; }
cpu_slots() { [ "$("$BUILD/fsdpctl" nodes --json | jget 'sum(1 for n in d["nodes"] if not n["lost"] for x in n["devices"] if x["kind"] == "cpu")')" = "$1" ]; }
cpu_slots_free() { [ "$("$BUILD/fsdpctl" nodes --json | jget 'sum(1 for n in d["nodes"] if not n["lost"] for x in n["devices"] if x["kind"] == "cpu" and x["job_id"] is None)')" = "$1" ]; }
running_step() { [ "$("$BUILD/fsdpctl" status "$1" --json | jget 'd["state"] == "running" and d["step"] >= 1')" = True ]; }
node_lost() { [ "$("$BUILD/fsdpctl" nodes --json | jget '[n["lost"] for n in d["nodes"] if n["name"] == "'"$1"'"]')" = "[True]" ]; }

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_coord() {
  "$BUILD/fsdpd" --foreground --state-dir "$S/coord" --listen "tcp://127.0.0.1:$PORT" --cpu-workers 0 --gpus none \
    --heartbeat 0.2 >>"$S/coord/fsdpd.log" 2>&1 & PIDS[0]=$!
}
start_coord
for n in a b; do
  "$BUILD/fsdpd" --foreground --state-dir "$S/$n" --join "tcp://127.0.0.1:$PORT" --name "node-$n" --cpu-workers 2 \
    --gpus none >>"$S/$n/fsdpd.log" 2>&1 & PIDS+=($!)
done
wait_for 15 cpu_slots 4 || fail "the two agents did not register 4 CPU slots within 15 s"

sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' -e 's/^world_size = .*/world_size = 4/' \
  "$SRC/examples/tiny.ini" > "$S/four.ini"
id=$("$BUILD/fsdpctl" submit "$S/four.ini" | tail -1)
wait_for 90 finished "$id" || fail "job $id did not finish within 90 s"
[ "$(state_of "$id")" = succeeded ] || fail "job $id: $("$BUILD/fsdpctl" status "$id")"
grep -q "ranks on node-a×2, node-b×2\|ranks on node-b×2, node-a×2" "$S/coord/jobs/$id/job.log" || fail "ranks not packed 2+2: $(cat "$S/coord/jobs/$id/job.log")"
python3 - "$S/coord/jobs/$id/metrics.jsonl" <<'PY' || fail "metrics.jsonl"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [d["step"] for d in lines] == [1, 2, 3]
assert all([r["rank"] for r in d["ranks"]] == [0, 1, 2, 3] for d in lines)
assert all(d["tokens"] == 4 * 8 * 64 for d in lines)
PY
grep -q "started" "$S/a/fsdpd.log" && grep -q "started" "$S/b/fsdpd.log" || fail "both agents should have spawned workers"

# Restart the coordinator: the agents notice (their heartbeats are answered with an error),
# register again, and the finished job is still listed.
kill -TERM "${PIDS[0]}"; wait "${PIDS[0]}" || fail "coordinator exited non-zero"
start_coord
wait_for 15 cpu_slots 4 || fail "the agents did not register again with the restarted coordinator"
[ "$(state_of "$id")" = succeeded ] || fail "after the restart job $id is $(state_of "$id")"

# A lost node fails the job running on it: kill -9 agent b (its workers die with it).
sed -e 's/^steps = .*/steps = 5000/' -e 's/^world_size = .*/world_size = 4/' "$SRC/examples/tiny.ini" > "$S/long4.ini"
id2=$("$BUILD/fsdpctl" submit "$S/long4.ini" | tail -1)
wait_for 90 running_step "$id2" || fail "job $id2 did not reach step 1"
kill -KILL "${PIDS[2]}"; wait "${PIDS[2]}" 2>/dev/null || true
wait_for 15 finished "$id2" || fail "job $id2 did not fail within 15 s of losing node-b"
[ "$(state_of "$id2")" = failed ] || fail "job $id2 is $(state_of "$id2")"
reason=$("$BUILD/fsdpctl" status "$id2" --json | jget 'd.get("reason", "")')
case "$reason" in *rank*) echo "job $id2 failed: $reason";; *) fail "reason '$reason' names no rank";; esac
wait_for 10 node_lost node-b || fail "node-b was not marked lost"
wait_for 15 cpu_slots_free 2 || fail "node-a's devices were not freed"
echo "daemon_two_agents: ok"
