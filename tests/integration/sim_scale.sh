#!/usr/bin/env bash
# sim_scale — 512 simulated ranks (64 nodes of 8, fsdp-sim: the real relay per node, a real socket
# per rank) against a real coordinator:
#  - a 120-step job (checkpoints every 50) succeeds, and every line of its metrics.jsonl holds
#    exactly the figures its ranks sent: min, max and the ranks holding them, sums, the median within
#    its tolerance, the slowest rank, loss and tokens/s, on the checkpoint steps every rank's save
#    figures and the job's (fsdp-sim --check recomputes them from scratch); the nodes report 16
#    steps per message (64 nodes: a wide job); the lines stay small: the aggregate, not 512 ranks,
#    whose own figures go to ranks.jsonl every 100 steps;
#  - `fsdpctl status` shows min / median / max with the extremes' ranks, `--rank R` rank R's own;
#  - rank 300 killed at step 100 of another job fails it within timeout_s + 5 s, naming the rank
#    and its node;
#  - a node that goes silent at step 30 of a third job (no heartbeat, no report) fails it within
#    timeout_s + 5 s, naming the node and its 8 ranks.
source "$(dirname "$0")/lib/common.sh" "$1" "$2" sim_scale
SIM="$BUILD/bench/fsdp-sim"
[ -x "$SIM" ] || fail "fsdp-sim not built in $BUILD/bench"
export FSDP_CTL="ipc://$S/ctl.sock"
FAIL_LOGS=("$S/fsdpd.log" "$S/sim1.log" "$S/sim2.log" "$S/sim3.log")
"$BUILD/fsdpd" --foreground --state-dir "$S" --cpu-workers 0 --gpus none --heartbeat 1 >>"$S/fsdpd.log" 2>&1 & DPID=$!
at_exit 'stop_pid "$DPID"'

job() {   # job NAME STEPS TIMEOUT_S: a 512-rank job file
  cat >"$S/$1.ini" <<EOF
[job]
name = $1
steps = $2
[model]
n_layer = 2
n_head = 2
n_embd = 32
vocab_size = 64
seq_len = 16
[data]
train = synthetic:markov:1
batch_size = 2
[fsdp]
world_size = 512
device = cpu
timeout_s = $3
[checkpoint]
every = 50
dir = ckpt-$1
EOF
  echo "$S/$1.ini"
}
sim_nodes() { [ "$("$CTL" nodes --json | jget "sum(1 for n in d['nodes'] if n['name'].startswith('$1-') and not n['lost'])")" -ge "$2" ]; }
no_sim_nodes() { [ "$("$CTL" nodes --json | jget "sum(1 for n in d['nodes'] if n['name'].startswith('$1-') and not n['lost'])")" = 0 ]; }
# fault_delay SIMLOG FAULT_RE JOB FAILED_RE MAX_S COORDLOG: at most MAX_S from the fault (SIMLOG) to the job's failure (COORDLOG)
fault_delay() {
  python3 - "$@" <<'PY'
import re, sys
from datetime import datetime
sim, fault, job, failed, most = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
def at(path, pat):
    for l in open(path):
        if re.search(pat, l): return datetime.strptime(l.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
    raise SystemExit(f"no line matching {pat!r} in {path}")
dt = (at(sys.argv[6], rf"job {job} failed: {failed}") - at(sim, fault)).total_seconds()
print(f"{fault}: job failed {dt:.2f} s later")
assert 0 <= dt <= most, dt
PY
}
lines() { [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ]; }

"$SIM" --join "ipc://$S/cluster.sock" --name sima --nodes 64 --procs 2 --step-ms 40 --jitter-ms 3 >"$S/sim1.log" 2>&1 & SIM1=$!
at_exit 'stop_pid "$SIM1"'
wait_for 30 sim_nodes sima 64 || fail "64 simulated nodes did not register within 30 s"
t0=$SECONDS
id=$("$CTL" submit "$(job agg 120 30)" | tail -1)
M="$S/jobs/$id/metrics.jsonl"
wait_for 40 lines "$M" 60 || fail "job $id did not record 60 steps within 40 s: $("$CTL" status "$id")"
# while it runs (120 steps of 40 ms: seconds left after step 60 even on a busy machine): one rank's own figures, on demand
"$CTL" status "$id" --rank 300 --json >"$S/rank.json" || fail "fsdpctl status $id --rank 300 failed"
python3 - "$S/rank.json" <<'PY' || fail "status --rank 300: $(cat "$S/rank.json")"
import json, sys
d = json.load(open(sys.argv[1]))["last"]
assert len(d["ranks"]) == 1 and d["ranks"][0]["rank"] == 300, d["ranks"]
assert d["detail_step"] >= 60 and len(d["ranks"][0]["peak_bytes"]) == 7, d
PY
wait_for 40 finished "$id" || fail "job $id did not finish within 80 s"
[ "$(state_of "$id")" = succeeded ] || fail "job $id: $("$CTL" status "$id")"
echo "512 ranks, 120 steps: $((SECONDS - t0)) s from submit to the end"
"$SIM" --check "$M" --world 512 --step-ms 40 --jitter-ms 3 || fail "metrics.jsonl of job $id differs from what the ranks sent"
"$SIM" --check "$M" --world 512 --step-ms 40 --jitter-ms 3 | grep -q "(3 checkpoint steps)" || fail "no checkpoint figures aggregated"
python3 - "$M" "$S/jobs/$id/ranks.jsonl" <<'PY' || fail "metrics.jsonl lines of job $id are not bounded"
import json, sys
ls = open(sys.argv[1]).readlines()
assert len(ls) == 120, len(ls)
assert max(len(l) for l in ls) < 4096, max(len(l) for l in ls)    # the aggregate, whatever the ranks
assert not any('"ranks":[' in l for l in ls)                        # beyond 64 ranks: ranks.jsonl
detail = [json.loads(l) for l in open(sys.argv[2])]
assert [d["step"] for d in detail] == [100], [d["step"] for d in detail]   # every 100 steps
assert [r["rank"] for r in detail[0]["ranks"]] == list(range(512))
PY
"$CTL" status "$id" >"$S/status.txt" || fail "fsdpctl status $id failed"
grep -q "step 120 over 512 ranks: min / median / max" "$S/status.txt" || fail "status shows no aggregate: $(cat "$S/status.txt")"
grep -q "^  peak_bytes.param_shard " "$S/status.txt" || fail "status has no peak_bytes row: $(cat "$S/status.txt")"
stop_pid "$SIM1"

# rank 300 dies at step 100 (its node reports it killed, as an agent reports a reaped worker)
"$SIM" --join "ipc://$S/cluster.sock" --name simb --nodes 64 --procs 2 --step-ms 10 --jitter-ms 3 --kill 300@100 \
  >"$S/sim2.log" 2>&1 & SIM2=$!
at_exit 'stop_pid "$SIM2"'
wait_for 30 sim_nodes simb 64 || fail "the second 64 simulated nodes did not register within 30 s"
wait_for 30 no_sim_nodes sima || fail "the first simulated nodes were not declared lost"
id=$("$CTL" submit "$(job killed 1000 5)" | tail -1)
M="$S/jobs/$id/metrics.jsonl"
wait_for 60 finished "$id" || fail "job $id did not end within 60 s: $("$CTL" status "$id")"
# step 100 is granted once 80 are recorded (32 ahead, 16 at a time), and nodes report 16 steps at a
# time: 80 to 96 are recorded when rank 300 dies
lines "$M" 80 || fail "job $id recorded $(wc -l <"$M") steps, not the ~100 before rank 300 died"
r=$(reason_of "$id")
[ "$(state_of "$id")" = failed ] || fail "job $id: $(state_of "$id")"
case "$r" in "rank 300 was killed by signal 9 (SIGKILL) on node simb-"*) ;; *) fail "reason does not name rank 300 and its node: $r" ;; esac
# from the rank's death to the job's failure: timeout_s 5 + 5 at most
fault_delay "$S/sim2.log" "sim: rank 300 dies at step 100" "$id" "rank 300" 10 "$S/fsdpd.log" || fail "the failure came too late (above)"
stop_pid "$SIM2"

# node simc-5 goes silent at step 30: the others' collectives time out (timeout_s 5), the node is
# lost after 3 missed heartbeats (1 s), and the reason names it with its ranks
"$SIM" --join "ipc://$S/cluster.sock" --name simc --nodes 64 --procs 2 --step-ms 10 --jitter-ms 3 --lose 5@30 --timeout-s 5 \
  >"$S/sim3.log" 2>&1 & SIM3=$!
at_exit 'stop_pid "$SIM3"'
wait_for 30 sim_nodes simc 64 || fail "the third 64 simulated nodes did not register within 30 s"
wait_for 30 no_sim_nodes simb || fail "the second simulated nodes were not declared lost"
id=$("$CTL" submit "$(job lost 1000 5)" | tail -1)
wait_for 60 finished "$id" || fail "job $id did not end within 60 s: $("$CTL" status "$id")"
r=$(reason_of "$id")
[ "$(state_of "$id")" = failed ] || fail "job $id: $(state_of "$id")"
case "$r" in "node simc-5 was lost (no heartbeat for "*" s) with ranks "*", ..., "*" (8 ranks) on it") echo "$r" ;;
  *) fail "reason does not name node simc-5 and its 8 ranks: $r" ;; esac
fault_delay "$S/sim3.log" "sim: node simc-5 is lost at step 30" "$id" "node simc-5" 10 "$S/fsdpd.log" || fail "the failure came too late (above)"
echo "sim_scale ok"
