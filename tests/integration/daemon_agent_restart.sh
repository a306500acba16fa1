#!/usr/bin/env bash
# daemon_agent_restart — agents coming and going over tcp:// with CURVE (docs/operations.md, "A
# cluster"). 1. An agent whose --server-key is not the coordinator's: within a few seconds the agent
# logs that its handshake failed because the server key does not match, and the coordinator logs
# the refused handshake with the agent's address; the node never appears. 2. An agent killed with
# -9 and restarted at once (before the coordinator could find it lost) keeps one row: `fsdpctl
# nodes` and fsdp_node_up{node=...} show it once, up. 3. An agent stopped with SIGTERM says goodbye:
# its node shows as stopped (not lost, fsdp_node_up 0), and is dropped after --forget-lost. 4. An
# agent killed with -9 and not restarted is lost, then dropped after --forget-lost.
# Usage: bash daemon_agent_restart.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" agrst
PIDS=()
at_exit 'for p in "${PIDS[@]}"; do stop_pid "$p"; done'
FAIL_LOGS=("$S/coord/fsdpd.log" "$S/a/fsdpd.log" "$S/b/fsdpd.log" "$S/c/fsdpd.log")
mkdir -p "$S/coord" "$S/a" "$S/b" "$S/c" "$S/bogus"
unset FSDP_SERVER_KEY FSDP_CLIENT_KEY
read -r PORT MPORT < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
for n in a b c bogus; do "$BUILD/fsdpctl" keygen "$S/$n/client.key" > "$S/$n/client.pub" || fail "fsdpctl keygen $n"; done
mkdir -m 700 "$S/coord/keys"
sed "s/$/ admin/" "$S/a/client.pub" "$S/b/client.pub" "$S/c/client.pub" > "$S/coord/keys/authorized"   # every agent's key is listed, as an admin
export FSDP_CTL="ipc://$S/coord/ctl.sock"
# heartbeats every 2 s: a node is lost 6 s after its last one, well after a restarted agent registers
"$BUILD/fsdpd" --foreground --state-dir "$S/coord" --listen "tcp://127.0.0.1:$PORT" --cpu-workers 0 --gpus none \
  --heartbeat 2 --forget-lost 5 --metrics "127.0.0.1:$MPORT" >>"$S/coord/fsdpd.log" 2>&1 & PIDS[0]=$!
wait_for 10 test -s "$S/coord/keys/server.pub" || fail "the coordinator did not write keys/server.pub"
wait_for 10 "$CTL" nodes || fail "the coordinator did not answer within 10 s"
# start_agent NAME [SERVER_PUB]: agent NAME with its own key; its pid in APID
start_agent() {
  "$BUILD/fsdpd" --foreground --state-dir "$S/$1" --join "tcp://127.0.0.1:$PORT" --name "node-$1" --cpu-workers 1 \
    --gpus none --server-key "${2:-$S/coord/keys/server.pub}" --client-key "$S/$1/client.key" >>"$S/$1/fsdpd.log" 2>&1 &
  APID=$!; PIDS+=("$APID")
}
# rows NAME: the node's rows in `fsdpctl nodes --json`, as "state state ..." (ok, lost, stopped)
rows() { "$CTL" nodes --json | jget '" ".join("stopped" if n.get("stopped") else "lost" if n["lost"] else "ok" for n in d["nodes"] if n["name"] == "'"$1"'")'; }
has_rows() { [ "$(rows "$1")" = "$2" ]; }
# node_up NAME: the fsdp_node_up samples of NAME, one line
node_up() {
  python3 -c 'import sys, urllib.request
t = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
print(" ".join(l.split()[-1] for l in t.splitlines() if l.startswith("fsdp_node_up{node=\"%s\"}" % sys.argv[2])))' \
    "http://127.0.0.1:$MPORT/metrics" "$1"
}

# ---- 1. a wrong server key: both sides say so within a few seconds; the node never appears
start_agent c "$S/bogus/client.pub"
wait_for 5 grep -q "agent: the CURVE handshake with the coordinator at tcp://127.0.0.1:$PORT failed: the server key does not match" "$S/c/fsdpd.log" ||
  fail "the agent with a wrong --server-key did not say so within 5 s"
wait_for 5 grep -q "a CURVE handshake from 127.0.0.1:[0-9]* on tcp://127.0.0.1:$PORT was refused: its HELLO was not sealed for this daemon's key" "$S/coord/fsdpd.log" ||
  fail "the coordinator did not log the refused handshake within 5 s"
[ "$(grep -c "server key does not match" "$S/c/fsdpd.log")" = 1 ] || fail "the agent repeated the line: $(grep -c "server key does not match" "$S/c/fsdpd.log") lines"
has_rows node-c "" || fail "node-c appears with a wrong server key: $(rows node-c)"
stop_pid "$APID"
echo "1. wrong server key: $(grep -o "agent: the CURVE handshake.*" "$S/c/fsdpd.log") / $(grep -o "a CURVE handshake from.*" "$S/coord/fsdpd.log" | head -1)"

# ---- 2. kill -9 and an immediate restart: one row
start_agent a
wait_for 15 has_rows node-a ok || fail "node-a did not register within 15 s: $(rows node-a)"
kill -KILL "$APID"; wait "$APID" 2>/dev/null || true
start_agent a
wait_for 15 grep -q "(node-a) is back, from a new agent process" "$S/coord/fsdpd.log" ||
  fail "the restarted agent did not register again within 15 s: $(rows node-a)"
has_rows node-a ok || fail "after kill -9 and a restart node-a has rows '$(rows node-a)', expected one, ok"
[ "$(node_up node-a)" = 1 ] || fail "fsdp_node_up{node=\"node-a\"}: '$(node_up node-a)', expected one sample, 1"
echo "2. restarted after kill -9: nodes says '$(rows node-a)', fsdp_node_up '$(node_up node-a)'"

# ---- 3. SIGTERM: goodbye, stopped (not lost), dropped after --forget-lost
stop_pid "$APID"
wait_for 5 has_rows node-a stopped || fail "node-a after its agent's SIGTERM: '$(rows node-a)', expected stopped"
grep -q "(node-a) stopped: its agent shut down" "$S/coord/fsdpd.log" || fail "the coordinator did not log the goodbye"
"$CTL" nodes | grep -q "node-a.*stopped" || fail "fsdpctl nodes does not show node-a stopped: $("$CTL" nodes)"
[ "$(node_up node-a)" = 0 ] || fail "fsdp_node_up{node=\"node-a\"} of a stopped node: '$(node_up node-a)', expected 0"
wait_for 15 has_rows node-a "" || fail "the stopped node-a was not dropped within 15 s (--forget-lost 5): $(rows node-a)"
echo "3. SIGTERM: stopped, then dropped"

# ---- 4. kill -9 without a restart: lost, then dropped after --forget-lost
start_agent b
wait_for 15 has_rows node-b ok || fail "node-b did not register within 15 s"
kill -KILL "$APID"; wait "$APID" 2>/dev/null || true
wait_for 15 has_rows node-b lost || fail "node-b was not found lost within 15 s: $(rows node-b)"
wait_for 15 has_rows node-b "" || fail "the lost node-b was not dropped within 15 s (--forget-lost 5): $(rows node-b)"
grep -q "(node-b) dropped from the node list: lost" "$S/coord/fsdpd.log" || fail "the coordinator did not log dropping node-b"
echo "4. kill -9: lost, then dropped"
echo "daemon_agent_restart: ok"
