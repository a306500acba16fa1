#!/usr/bin/env bash
# daemon_hybrid — sharding = hybrid through the daemon: a coordinator (no CPU slots of its own) and
# two agents with 3 CPU slots each (CURVE keys as in daemon_two_agents.sh).
#  - A 6-rank hybrid job without shard_group takes the ranks per node, 3: groups {0,1,2} and
#    {3,4,5}, one per node, and trains (the workers take G from the coordinator's plan); metrics.jsonl
#    splits each rank's bytes: sent_inter_bytes is the all-reduce across the groups, no gather; so do
#    fsdpctl status --json and the Prometheus counter fsdp_rank_sent_inter_bytes_total.
#  - A 4-rank hybrid job with shard_group = 2 keeps each group on one node (2 + 2), though the
#    first node has 3 free slots.
#  - A 6-rank job with shard_group = 2 cannot: whole groups first put ranks 0,1 and 2,3 on the two
#    nodes, the last group takes the one slot left on each, and the job's
#    log says which group spans nodes; the job still trains.
#  - fsdpctl trace of a running hybrid job puts each rank's gathers and reduce-scatters on the shard
#    group's comm thread and the all-reduce across groups on the replica comm's, named by unit.
#  - kill -9 of one rank of a running hybrid job fails it within 10 s, naming the rank.
#  - A hybrid job without shard_group, queued when the coordinator restarts, runs after it with G = 3.
#  - A 4-rank hybrid job without shard_group is refused at submit: 3 ranks per node do not divide 4.
# Usage: bash daemon_hybrid.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" hy
PIDS=()
at_exit 'for p in "${PIDS[@]}"; do stop_pid "$p"; done'
FAIL_LOGS=("$S/coord/fsdpd.log" "$S/a/fsdpd.log" "$S/b/fsdpd.log")
mkdir -p "$S/coord" "$S/a" "$S/b" "$S/user"
unset FSDP_SERVER_KEY FSDP_CLIENT_KEY
cpu_slots() { [ "$("$BUILD/fsdpctl" nodes --json | jget 'sum(1 for n in d["nodes"] if not n["lost"] for x in n["devices"] if x["kind"] == "cpu")')" = "$1" ]; }
read -r PORT CPORT MPORT < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(3)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
for n in a b user; do "$BUILD/fsdpctl" keygen "$S/$n/client.key" > "$S/$n/client.pub"; done
mkdir -m 700 "$S/coord/keys"
sed "s/$/ admin/" "$S/a/client.pub" "$S/b/client.pub" "$S/user/client.pub" > "$S/coord/keys/authorized"
export FSDP_CTL="tcp://127.0.0.1:$CPORT" FSDP_SERVER_KEY="$S/coord/keys/server.pub" FSDP_CLIENT_KEY="$S/user/client.key"
start_coord() {
  "$BUILD/fsdpd" --foreground --state-dir "$S/coord" --listen "tcp://127.0.0.1:$PORT" --ctl "tcp://127.0.0.1:$CPORT" \
    --cpu-workers 0 --gpus none --heartbeat 0.5 --metrics "127.0.0.1:$MPORT" >>"$S/coord/fsdpd.log" 2>&1 & PIDS[0]=$!
}
start_coord
wait_for 10 test -s "$S/coord/keys/server.pub" || fail "the coordinator did not write keys/server.pub"
for n in a b; do
  env -u FSDP_SERVER_KEY -u FSDP_CLIENT_KEY "$BUILD/fsdpd" --foreground --state-dir "$S/$n" --join "tcp://127.0.0.1:$PORT" \
    --name "node-$n" --cpu-workers 3 --gpus none --server-key "$S/coord/keys/server.pub" --client-key "$S/$n/client.key" \
    >>"$S/$n/fsdpd.log" 2>&1 & PIDS+=($!)
done
wait_for 15 cpu_slots 6 || fail "the two agents did not register 6 CPU slots within 15 s"

job() {   # NAME WORLD SHARD_GROUP (empty: unset) > the job file's path
  local extra=""
  [ -n "$3" ] && extra="shard_group = $3\n"
  sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' -e "s/^world_size = .*/world_size = $2/" \
    -e 's/^batch_size = .*/batch_size = 2/' -e "s/^sharding = .*/sharding = hybrid\n$extra/" -e "s/^name = .*/name = $1/" \
    "$SRC/examples/tiny.ini" > "$S/$1.ini"
  echo "$S/$1.ini"
}
run_ok() {   # INI > the job id, once it succeeded
  local id
  id=$("$BUILD/fsdpctl" submit "$1" | tail -1)
  wait_for 120 finished "$id" || fail "job $id ($1) did not finish within 120 s"
  [ "$(state_of "$id")" = succeeded ] || fail "job $id ($1): $("$BUILD/fsdpctl" status "$id")"
  echo "$id"
}
log_of() { cat "$S/coord/jobs/$1/job.log"; }

id=$(run_ok "$(job per_node 6 "")")
log_of "$id" | grep -q "ranks on node-a×3, node-b×3\|ranks on node-b×3, node-a×3" || fail "6 ranks not placed 3 + 3: $(log_of "$id")"
! log_of "$id" | grep -q "span nodes" || fail "G = 3 on 3 + 3 should split no group: $(log_of "$id")"
python3 - "$S/coord/jobs/$id/metrics.jsonl" <<'PY' || fail "metrics.jsonl of job $id"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [d["step"] for d in lines] == [1, 2, 3], lines
assert all(len(d["ranks"]) == 6 for d in lines)
assert all(d["tokens"] == 6 * 2 * 64 for d in lines)
# the part that crossed groups: the cross-group all-reduce (and the step's scalars), never a gather
for d in lines:
    for r in d["ranks"]:
        x = r["sent_inter_bytes"]
        assert x["allgather"] == 0 and x["reducescatter"] == 0, r
        assert 0 < x["allreduce"] == r["sent_bytes"]["allreduce"], r
PY

# Prometheus: the inter-group counter of a hybrid job (the all-reduce grows, the gathers stay 0)
python3 - "http://127.0.0.1:$MPORT/metrics" "$id" <<'PY' || fail "no fsdp_rank_sent_inter_bytes_total for job $id"
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
def v(coll, rank):
    key = 'fsdp_rank_sent_inter_bytes_total{job="%s",rank="%d",collective="%s"}' % (sys.argv[2], rank, coll)
    return [float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(key + " ")]
for r in range(6):
    assert v("allreduce", r) and v("allreduce", r)[0] > 0, (r, v("allreduce", r))
    assert v("allgather", r) == [0.0], (r, v("allgather", r))
PY
# fsdpctl status --json carries the same split for the last step
"$BUILD/fsdpctl" status "$id" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
ranks = d["last"]["ranks"]
assert len(ranks) == 6, ranks
for r in ranks:
    x = r["sent_inter_bytes"]
    assert x["allreduce"] > 0 and x["allgather"] == 0, r
' || fail "fsdpctl status --json of job $id has no sent_inter_bytes: $("$BUILD/fsdpctl" status "$id" --json)"

id=$(run_ok "$(job whole 4 2)")
log_of "$id" | grep -q "ranks on node-a×2, node-b×2\|ranks on node-b×2, node-a×2" || fail "groups of 2 not kept whole: $(log_of "$id")"
! log_of "$id" | grep -q "span nodes" || fail "no group should span nodes: $(log_of "$id")"

id=$(run_ok "$(job split 6 2)")
log_of "$id" | grep -q "placement: 1 of 3 shard groups (2) span nodes" || fail "the split group is not reported: $(log_of "$id")"

# kill -9 of one rank of a running hybrid job (rank 3: group 1, and the replica partner of rank 1)
# fails the job within 10 s with a reason naming the rank, as for full sharding.
sed -e 's/^steps = 3$/steps = 5000/' "$(job long 4 2)" > "$S/long4.ini"
id=$("$BUILD/fsdpctl" submit "$S/long4.ini" | tail -1)
wait_for 90 at_step "$id" 3 || fail "job $id did not reach step 3"
# its trace: each rank's gathers and reduce-scatters on its shard group's comm thread, the
# all-reduce across groups on the replica comm's, named by unit; the step's scalars on the world's
"$BUILD/fsdpctl" trace "$id" --steps 2..2 -o "$S/hybrid_trace.json" >/dev/null || fail "fsdpctl trace $id failed"
python3 - "$S/hybrid_trace.json" <<'PY' || fail "the trace of hybrid job $id is wrong (above)"
import json, sys, collections
ev = json.load(open(sys.argv[1]))["traceEvents"]
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
spans = [e for e in ev if e["ph"] == "X"]
units = ["root", "h.0", "h.1"]   # examples/tiny.ini: 2 blocks
for rank in range(4):
    on = collections.defaultdict(collections.Counter)
    for e in spans:
        if e["pid"] == rank: on[threads[(rank, e["tid"])]][e["name"]] += 1
    for u in units:
        assert on["comm (shard group)"]["allgather " + u] >= 1, (rank, u, dict(on))
        assert on["comm (shard group)"]["reducescatter " + u] == 1, (rank, u, dict(on))
        assert on["comm (replica group)"]["allreduce " + u] == 1, (rank, u, dict(on))
    assert on["comm"]["allreduce"] == 1 and sum(on["comm"].values()) == 1, (rank, dict(on["comm"]))
PY
pid3=$(cat "$S/a/fsdpd.log" "$S/b/fsdpd.log" | sed -n "s/.*job $id rank 3: started .*(pid \([0-9]*\),.*/\1/p" | tail -1)
[ -n "$pid3" ] || fail "no pid of job $id rank 3 in the agents' logs"
t0=$SECONDS
kill -KILL "$pid3"
wait_for 10 finished "$id" || fail "job $id did not fail within 10 s of kill -9 of rank 3"
[ "$(state_of "$id")" = failed ] || fail "job $id is $(state_of "$id"), expected failed"
reason=$(reason_of "$id")
case "$reason" in *"rank 3"*SIGKILL*) echo "hybrid job failed after $((SECONDS - t0)) s: $reason";;
  *) fail "reason '$reason' does not name rank 3 and SIGKILL";; esac

# A queued hybrid job without shard_group survives a coordinator crash: the queue is reloaded
# before the agents are back, and the job takes G = 3 from the cluster when it starts.
sed -e 's/^steps = 3$/steps = 5000/' "$(job busy 6 3)" > "$S/busy6.ini"
busy=$("$BUILD/fsdpctl" submit "$S/busy6.ini" | tail -1)
wait_for 90 at_step "$busy" 1 || fail "job $busy did not reach step 1"
queued=$("$BUILD/fsdpctl" submit "$(job after_restart 6 "")" | tail -1)
[ "$(state_of "$queued")" = queued ] || fail "job $queued should wait behind job $busy: $(state_of "$queued")"
kill -KILL "${PIDS[0]}"; wait "${PIDS[0]}" 2>/dev/null || true   # a crash: the queue is kept (SIGTERM cancels it)
start_coord
wait_for 15 cpu_slots 6 || fail "the agents did not register again after the coordinator's restart"
wait_for 120 finished "$queued" || fail "job $queued did not finish within 120 s of the restart"
[ "$(state_of "$queued")" = succeeded ] || fail "job $queued after the restart: $("$BUILD/fsdpctl" status "$queued")"
log_of "$queued" | grep -q "shard_group = 3: the ranks per node of the cluster it starts on" ||
  fail "job $queued did not take G from the cluster at its start: $(log_of "$queued")"

set +e
"$BUILD/fsdpctl" submit "$(job nodiv 4 "")" >"$S/nodiv.out" 2>&1; st=$?
set -e
[ $st != 0 ] && grep -q "ranks per node of the cluster (3 CPU slots on the largest node here).*shard_group = 3 does not divide world_size = 4" \
  "$S/nodiv.out" || fail "a hybrid job whose default group does not divide it: status $st, '$(cat "$S/nodiv.out")'"
[ "$(wc -l < "$S/nodiv.out")" = 1 ] || fail "the refusal is not one line: $(cat "$S/nodiv.out")"
echo "daemon_hybrid: ok"
