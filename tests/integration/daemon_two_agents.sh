#!/usr/bin/env bash
# daemon_two_agents — a coordinator on tcp://127.0.0.1:PORT (no CPU slots of its own) and two
# agents that --join it, each with its own state directory and two CPU slots; a 4-rank job spans
# both nodes (ranks packed by node: 2 + 2) and succeeds, with one metrics line per step and four
# ranks in each. The coordinator restarts and the agents register again. Then agent b is killed
# during a 4-rank job with a restart left: the attempt fails naming the lost node, the restart
# cannot fit and waits aside while a 2-rank job runs, then fails after [job] restart_wait_s.
# Everything on tcp:// uses CURVE: the coordinator makes its keypair in STATE/keys/ (reused after
# the restart), the agents and the fsdpctl user have keys from `fsdpctl keygen` listed in
# STATE/keys/authorized, and every fsdpctl call goes over a tcp:// ctl endpoint. An agent with an
# unlisted key is rejected (logged by the coordinator, never a node); an agent or fsdpctl without
# keys fails at once with a clear error; a keypair file readable by others is refused.
# Usage: bash daemon_two_agents.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" 2a
PIDS=()
at_exit 'for p in "${PIDS[@]}"; do stop_pid "$p"; done'
FAIL_LOGS=("$S/coord/fsdpd.log" "$S/a/fsdpd.log" "$S/b/fsdpd.log" "$S/c/fsdpd.log")
mkdir -p "$S/coord" "$S/a" "$S/b" "$S/c" "$S/user"
unset FSDP_SERVER_KEY FSDP_CLIENT_KEY
cpu_slots() { [ "$("$BUILD/fsdpctl" nodes --json | jget 'sum(1 for n in d["nodes"] if not n["lost"] for x in n["devices"] if x["kind"] == "cpu")')" = "$1" ]; }
cpu_slots_free() { [ "$("$BUILD/fsdpctl" nodes --json | jget 'sum(1 for n in d["nodes"] if not n["lost"] for x in n["devices"] if x["kind"] == "cpu" and x["job_id"] is None)')" = "$1" ]; }
node_lost() { [ "$("$BUILD/fsdpctl" nodes --json | jget '[n["lost"] for n in d["nodes"] if n["name"] == "'"$1"'"]')" = "[True]" ]; }

read -r PORT CPORT < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
# Client keys: agents a and b and the fsdpctl user are authorized; agent c is not.
for n in a b c user; do
  "$BUILD/fsdpctl" keygen "$S/$n/client.key" > "$S/$n/client.pub" || fail "fsdpctl keygen $n"
  [ "$(stat -c %a "$S/$n/client.key")" = 600 ] || fail "keygen wrote $S/$n/client.key mode $(stat -c %a "$S/$n/client.key")"
  grep -Eq '^.{40}$' "$S/$n/client.pub" || fail "keygen printed '$(cat "$S/$n/client.pub")', expected one 40-character key"
done
! "$BUILD/fsdpctl" keygen "$S/a/client.key" >/dev/null 2>"$S/keygen.err" || fail "keygen overwrote an existing key file"
grep -q "already exists" "$S/keygen.err" || fail "keygen over an existing file: $(cat "$S/keygen.err")"
mkdir -m 700 "$S/coord/keys"
{ echo "# fsdpd clients"; sed "s/$/ admin/" "$S/a/client.pub" "$S/b/client.pub" "$S/user/client.pub"; } > "$S/coord/keys/authorized"
export FSDP_CTL="tcp://127.0.0.1:$CPORT" FSDP_SERVER_KEY="$S/coord/keys/server.pub" FSDP_CLIENT_KEY="$S/user/client.key"

start_coord() {
  "$BUILD/fsdpd" --foreground --state-dir "$S/coord" --listen "tcp://127.0.0.1:$PORT" --ctl "tcp://127.0.0.1:$CPORT" \
    --cpu-workers 0 --gpus none --heartbeat 0.5 >>"$S/coord/fsdpd.log" 2>&1 & PIDS[0]=$!
}
start_agent() {   # NAME: agent NAME with its own key
  env -u FSDP_SERVER_KEY -u FSDP_CLIENT_KEY "$BUILD/fsdpd" --foreground --state-dir "$S/$1" --join "tcp://127.0.0.1:$PORT" \
    --name "node-$1" --cpu-workers 2 --gpus none --server-key "$S/coord/keys/server.pub" --client-key "$S/$1/client.key" \
    >>"$S/$1/fsdpd.log" 2>&1 & PIDS+=($!)
}
start_coord
wait_for 10 test -s "$S/coord/keys/server.pub" || fail "the coordinator did not write keys/server.pub"
[ "$(stat -c %a "$S/coord/keys/server.key")" = 600 ] || fail "server.key has mode $(stat -c %a "$S/coord/keys/server.key")"
server_pub=$(cat "$S/coord/keys/server.pub")
for n in a b; do start_agent "$n"; done
wait_for 15 cpu_slots 4 || fail "the two agents did not register 4 CPU slots within 15 s"

# Refused: an agent without keys (a clear error, at once), a keypair file readable by others, an
# agent whose key is not authorized (the coordinator logs the rejection; it never becomes a node).
set +e
timeout 10 env -u FSDP_SERVER_KEY -u FSDP_CLIENT_KEY "$BUILD/fsdpd" --foreground --state-dir "$S/c" \
  --join "tcp://127.0.0.1:$PORT" --name node-plain --cpu-workers 1 --gpus none >"$S/plain.out" 2>&1
st=$?
cp "$S/c/client.key" "$S/c/open.key"; chmod 644 "$S/c/open.key"
timeout 10 "$BUILD/fsdpd" --foreground --state-dir "$S/c" --join "tcp://127.0.0.1:$PORT" --name node-open --cpu-workers 1 \
  --gpus none --server-key "$S/coord/keys/server.pub" --client-key "$S/c/open.key" >"$S/open.out" 2>&1
st2=$?
set -e
[ $st = 2 ] && grep -q "needs CURVE keys" "$S/plain.out" || fail "an agent without keys: status $st, '$(cat "$S/plain.out")'"
[ $st2 = 2 ] && grep -q "readable by its owner only" "$S/open.out" || fail "a world-readable key: status $st2, '$(cat "$S/open.out")'"
start_agent c
rejected() { grep -qF "key $(cat "$S/c/client.pub") " <<<"$(grep "rejected a CURVE connection" "$S/coord/fsdpd.log")"; }
wait_for 15 rejected || fail "the coordinator did not log the rejection of node-c's key"
wait_for 10 grep -q "rejected this node's CURVE key" "$S/c/fsdpd.log" || fail "agent c did not say that its key was rejected"
has_node_c() { "$BUILD/fsdpctl" nodes --json | jget '[n["name"] for n in d["nodes"]]' | grep -q node-c; }
for i in 1 2 3 4 5 6 7 8 9 10; do
  ! has_node_c || fail "node-c (key not authorized) registered"
  sleep 0.2
done
# The authorized file is read at every handshake: listing node-c's key lets the waiting agent in.
echo "$(cat "$S/c/client.pub") admin" >> "$S/coord/keys/authorized"
wait_for 15 has_node_c || fail "node-c did not register after its key was authorized"
! grep -E "ERROR" "$S/c/fsdpd.log" | grep -v "rejected this node's CURVE key" | grep -q . || \
  fail "agent c logged an error besides its key's rejection: $(grep ERROR "$S/c/fsdpd.log" | grep -v "rejected this node" | head -3)"
kill -TERM "${PIDS[3]}"; wait "${PIDS[3]}" 2>/dev/null || true
wait_for 10 node_lost node-c || fail "node-c was not marked lost after its agent stopped"
# The global flags instead of the environment.
env -u FSDP_CTL -u FSDP_SERVER_KEY -u FSDP_CLIENT_KEY "$BUILD/fsdpctl" --ctl "tcp://127.0.0.1:$CPORT" \
  --server-key "$S/coord/keys/server.pub" --client-key "$S/user/client.key" nodes >/dev/null || fail "fsdpctl with --server-key/--client-key"
# fsdpctl over tcp:// without keys, and with a key the daemon does not know.
set +e
env -u FSDP_SERVER_KEY -u FSDP_CLIENT_KEY timeout 10 "$BUILD/fsdpctl" nodes >"$S/nokey.out" 2>&1; st=$?
"$BUILD/fsdpctl" keygen "$S/stranger.key" >/dev/null
FSDP_CLIENT_KEY="$S/stranger.key" timeout 10 "$BUILD/fsdpctl" nodes >"$S/badkey.out" 2>&1; st2=$?
set -e
[ $st = 1 ] && grep -q "without CURVE keys" "$S/nokey.out" || fail "fsdpctl without keys: status $st, '$(cat "$S/nokey.out")'"
[ $st2 = 1 ] && grep -q "rejected this client's CURVE key" "$S/badkey.out" || fail "fsdpctl with an unlisted key: status $st2, '$(cat "$S/badkey.out")'"
# A server key that is not the daemon's (a valid key, someone else's): said as such, not "is it running?".
set +e
FSDP_SERVER_KEY="$S/a/client.pub" timeout 10 "$BUILD/fsdpctl" nodes >"$S/wrongserver.out" 2>&1; st=$?
set -e
[ $st = 1 ] && grep -q "dropped the connection during the CURVE handshake: the server key $S/a/client.pub is not that daemon's" \
  "$S/wrongserver.out" || fail "fsdpctl with a wrong server key: status $st, '$(cat "$S/wrongserver.out")'"

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
[ "$(cat "$S/coord/keys/server.pub")" = "$server_pub" ] || fail "the restarted coordinator made a new keypair"
[ "$(state_of "$id")" = succeeded ] || fail "after the restart job $id is $(state_of "$id")"

# A lost node fails the attempt running on it, named as lost (heartbeat 0.5 s: declaring a node
# lost takes longer than the grace a communication error gets, so the echo of the dead ranks,
# "connection closed", must not win). The attempt restarts (max_restarts), but 4 ranks no longer
# fit the live cluster: the job waits aside without blocking a 2-rank job that fits, and fails
# after [job] restart_wait_s with a reason that says so.
sed -e 's/^steps = .*/steps = 5000/' -e 's/^world_size = .*/world_size = 4/' -e 's/^every = .*/every = 1000/' \
  -e "s|^; dir = .*|dir = $S/ck|" -e 's/^name = .*/name = long4\nmax_restarts = 1\nrestart_wait_s = 5/' \
  "$SRC/examples/tiny.ini" > "$S/long4.ini"
id2=$("$BUILD/fsdpctl" submit "$S/long4.ini" | tail -1)
wait_for 90 at_step "$id2" 1 || fail "job $id2 did not reach step 1"
kill -KILL "${PIDS[2]}"; wait "${PIDS[2]}" 2>/dev/null || true
queued_again() { [ "$(state_of "$id2")" = queued ]; }
wait_for 15 queued_again || fail "job $id2 was not queued again after losing node-b: $("$BUILD/fsdpctl" status "$id2")"
why=$(grep "queued: restart 1 of 1" "$S/coord/jobs/$id2/job.log" || true)
case "$why" in *"node node-b was lost"*"with rank"*[0-3]" on it"*) echo "$why";;
  *) fail "the restart does not name the lost node: '$why' ($(cat "$S/coord/jobs/$id2/job.log"))";; esac
wait_for 10 node_lost node-b || fail "node-b was not marked lost"
sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' "$SRC/examples/tiny.ini" > "$S/two.ini"
id3=$("$BUILD/fsdpctl" submit "$S/two.ini" | tail -1)
wait_for 60 finished "$id3" || fail "a 2-rank job that fits waited behind job $id2, which cannot run: $("$BUILD/fsdpctl" status "$id3")"
[ "$(state_of "$id3")" = succeeded ] || fail "job $id3: $("$BUILD/fsdpctl" status "$id3")"
wait_for 30 finished "$id2" || fail "job $id2 still waits $(( 30 + 5 )) s after restart_wait_s = 5"
[ "$(state_of "$id2")" = failed ] || fail "job $id2 is $(state_of "$id2")"
reason=$("$BUILD/fsdpctl" status "$id2" --json | jget 'd.get("reason", "")')
case "$reason" in *"needs 4 CPU slots but the live cluster has 2"*restart_wait_s*"node node-b was lost"*) echo "job $id2 failed: $reason";;
  *) fail "reason '$reason' does not say why the job cannot run";; esac
wait_for 15 cpu_slots_free 2 || fail "node-a's devices were not freed"
# node-b's agent comes back (a new process, a new socket): one node-b, not lost, no stale entry.
start_agent b
wait_for 15 cpu_slots 4 || fail "node-b did not register again"
names=$("$BUILD/fsdpctl" nodes --json | jget 'sorted((n["name"], n["lost"]) for n in d["nodes"] if n["name"] in ("node-a", "node-b"))')
[ "$names" = "[('node-a', False), ('node-b', False)]" ] || fail "nodes after node-b rejoined: $names"
echo "daemon_two_agents: ok"
