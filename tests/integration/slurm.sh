#!/usr/bin/env bash
# slurm — fsdpd under a real Slurm, started by this test: its own munged (own key and socket),
# slurmctld and slurmd on loopback with a generated slurm.conf (free ports, every state, spool, pid
# and log file under the test's directory), one node of 2 CPUs named after this host. Then:
#   1. scripts/slurm/fsdpd.sbatch with a 2-rank job: the allocation's fsdpd (--slurm, node 0:
#      coordinator and agent, keys made by the recipe in the state directory, cluster endpoint on
#      TCP) runs the job to success; metrics.jsonl has every step with both ranks; the cluster then
#      stops cleanly (every fsdpd logs "stopped", no worker is left) and the Slurm job completes
#      with exit code 0.
#   2. NCCL's variables given to sbatch reach the workers. The allocation ends while a job runs
#      (the SIGTERM Slurm sends the batch script before the time limit, here by `scancel --batch
#      --signal=TERM`): fsdpd queues the job again ("the daemon shut down"), reaps its workers and
#      exits 0; nothing is left running.
#   3. Slurm variables that contradict the flags: one-line errors, exit 2; the recipe refuses --ctl
#      in FSDPD_FLAGS.
#   4. Without a job file the cluster stays up until `fsdpctl shutdown`; then the Slurm job completes.
# Skips (exit 77) with the reason when Slurm cannot start here: not root, no slurmctld/slurmd/munged
# (scripts/install-deps.sh installs them), or the daemons do not come up.
# Usage: bash slurm.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" slurm
skip() { echo "SKIP: $*"; exit 77; }

# 3 first: it needs no Slurm, only the variables an allocation sets.
bad() {   # EXPECTED-TEXT FSDPD-ARGS... with the variables already in the environment
  local want=$1; shift
  local st=0
  timeout 20 "$BUILD/fsdpd" --slurm --foreground --state-dir "$S/bad" --gpus none "$@" >"$S/bad.out" 2>&1 || st=$?
  [ "$st" = 2 ] || fail "fsdpd --slurm $*: status $st, expected 2: $(cat "$S/bad.out")"
  [ "$(wc -l <"$S/bad.out")" = 1 ] || fail "fsdpd --slurm $*: expected one line, got: $(cat "$S/bad.out")"
  grep -qF -- "$want" "$S/bad.out" || fail "fsdpd --slurm $*: expected '$want', got: $(cat "$S/bad.out")"
}
(
  unset SLURM_JOB_ID
  bad "SLURM_JOB_ID is not set"
  export SLURM_JOB_ID=7 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST='localhost,n[2]' SLURM_NODEID=0
  bad "--join tcp://localhost:1 contradicts SLURM_NODEID=0" --join tcp://localhost:1
  bad "--listen ipc://$S/c.sock contradicts SLURM_JOB_NUM_NODES=2" --listen "ipc://$S/c.sock"
  SLURM_NODEID=1 bad "SLURM_NODEID=1 makes this node an agent, which needs --join tcp://localhost:PORT"
  SLURM_NODEID=1 bad "--join tcp://no-such-host.invalid:1 contradicts SLURM_JOB_NODELIST=localhost,n[2]" \
    --join tcp://no-such-host.invalid:1
  SLURM_NODEID=1 SLURM_GPUS_ON_NODE=0 bad "--gpus 0,1 contradicts SLURM_GPUS_ON_NODE=0" --join tcp://127.0.0.1:1 --gpus 0,1
  SLURM_GPUS_ON_NODE=2 CUDA_VISIBLE_DEVICES=3 bad "CUDA_VISIBLE_DEVICES=3 (1 GPUs) contradicts SLURM_GPUS_ON_NODE=2" \
    --listen tcp://127.0.0.1:1
) || exit 1
# The recipe refuses --ctl in FSDPD_FLAGS before it starts anything: fsdpd would bind it instead of
# ipc://STATE/ctl.sock, through which the recipe itself asks the coordinator.
st=0
SLURM_JOB_ID=7 FSDP_BIN="$BUILD" FSDP_STATE_DIR="$S/ctlflag" FSDPD_FLAGS="--cpu-workers 2 --ctl tcp://*:7071" \
  bash "$SRC/scripts/slurm/fsdpd.sbatch" >"$S/ctlflag.out" 2>&1 || st=$?
[ "$st" = 2 ] && [ "$(wc -l <"$S/ctlflag.out")" = 1 ] && grep -q "FSDPD_FLAGS: --ctl is not supported" "$S/ctlflag.out" ||
  fail "the recipe with --ctl in FSDPD_FLAGS: status $st, expected 2 and one line: $(cat "$S/ctlflag.out")"
[ ! -e "$S/ctlflag" ] || fail "the recipe made its state directory before refusing --ctl"

# 0. fsdpd --slurm on two "nodes" of one allocation, without Slurm (Debian's slurmd runs one node
# per host): the variables srun would set, the flags and keys the recipe gives, one shared state
# directory. Node 1's agent joins node 0 (its --join host 127.0.0.1 checked against the node
# list's first host, localhost, by address); a 4-rank job runs on both; SIGTERM stops both.
FAKE="$S/fake"
(   # as the recipe does: umask 077, since fsdpd refuses key files that others can write
umask 077
mkdir -p "$FAKE/keys"
chmod 700 "$FAKE" "$FAKE/keys"
"$CTL" keygen "$FAKE/keys/server.key" >"$FAKE/keys/server.pub"
echo "$("$CTL" keygen "$FAKE/keys/nodes.key") admin slurm nodes" >>"$FAKE/keys/authorized"
)
read -r FAKE_PORT < <(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fake_node() {   # NODEID NAME FLAGS...: run in the background, it becomes that fsdpd (exec)
  local id=$1 name=$2; shift 2
  exec env SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST="localhost,$HOST2" SLURM_NODEID="$id" SLURM_LOCALID=0 \
    SLURMD_NODENAME="$name" SLURM_GPUS_ON_NODE=0 "$BUILD/fsdpd" --slurm --foreground --state-dir "$FAKE" --cpu-workers 2 "$@" \
    >>"$FAKE/fsdpd-$name.log" 2>&1
}
HOST2=node-b
FAKE_PIDS=()
at_exit 'for p in "${FAKE_PIDS[@]}"; do stop_pid "$p"; done'
FAIL_LOGS=("$FAKE/fsdpd-localhost.log" "$FAKE/fsdpd-$HOST2.log")
fake_node 0 localhost --listen "tcp://127.0.0.1:$FAKE_PORT" & FAKE_PIDS+=($!)
fake_node 1 "$HOST2" --join "tcp://127.0.0.1:$FAKE_PORT" --server-key "$FAKE/keys/server.pub" \
  --client-key "$FAKE/keys/nodes.key" & FAKE_PIDS+=($!)
two_nodes() { [ "$(FSDP_CTL="ipc://$FAKE/ctl.sock" "$CTL" nodes --json | jget 'sorted(n["name"] for n in d["nodes"] if not n["lost"])')" = "['localhost', '$HOST2']" ]; }
wait_for 30 two_nodes || fail "the two --slurm nodes did not register"
grep -q "Slurm job 4242: node 1 of 2 ($HOST2), coordinator on localhost; GPUs none" "$FAKE/fsdpd-$HOST2.log" ||
  fail "node 1 did not run as an agent of Slurm job 4242 without GPUs"
sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' -e 's/^world_size = .*/world_size = 4/' \
  "$SRC/examples/tiny.ini" >"$S/four.ini"
fid=$(FSDP_CTL="ipc://$FAKE/ctl.sock" "$CTL" submit "$S/four.ini" | tail -1)
fake_done() { case "$(FSDP_CTL="ipc://$FAKE/ctl.sock" "$CTL" status "$fid" --json | jget 'd["state"]')" in succeeded|failed|cancelled) return 0;; esac; return 1; }
wait_for 120 fake_done || fail "the 4-rank job on two --slurm nodes did not finish within 120 s"
[ "$(FSDP_CTL="ipc://$FAKE/ctl.sock" "$CTL" status "$fid" --json | jget 'd["state"]')" = succeeded ] ||
  fail "the 4-rank job on two --slurm nodes: $(FSDP_CTL="ipc://$FAKE/ctl.sock" "$CTL" status "$fid")"
grep -q "ranks on localhost×2, $HOST2×2\|ranks on $HOST2×2, localhost×2" "$FAKE/jobs/$fid/job.log" ||
  fail "the ranks did not span both nodes: $(cat "$FAKE/jobs/$fid/job.log")"
for i in 1 0; do
  kill -TERM "${FAKE_PIDS[i]}"
  st=0; wait "${FAKE_PIDS[i]}" || st=$?
  [ "$st" = 0 ] || fail "--slurm node $i exited with status $st after SIGTERM"
done
FAKE_PIDS=()
echo "slurm: two --slurm nodes ran a 4-rank job"

# ---- a Slurm of our own
[ "$(id -u)" = 0 ] || skip "slurmd and munged need root here (run as root, as CI does)"
for b in munged mungekey slurmctld slurmd sbatch squeue scontrol scancel srun; do
  command -v "$b" >/dev/null || skip "$b is not installed (scripts/install-deps.sh installs slurm-wlm and munge)"
done
HOST=$(hostname -s)
SL="$S/slurm"
mkdir -p "$SL/ctld" "$SL/spool" "$SL/munge" "$S/state"
chmod 700 "$SL/munge"
chmod 755 "$S/state"   # above the recipe's state directory: writable by its owner only, whatever the umask
read -r CTLD_PORT SLURMD_PORT FSDP_PORT < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(3)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
mungekey --create --keyfile="$SL/munge/munge.key" >/dev/null 2>&1 || skip "mungekey could not make a key"
cat >"$SL/slurm.conf" <<EOF
ClusterName=fsdptest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SL/munge/socket
CredType=cred/munge
StateSaveLocation=$SL/ctld
SlurmdSpoolDir=$SL/spool
SlurmctldPidFile=$SL/slurmctld.pid
SlurmdPidFile=$SL/slurmd.pid
SlurmctldLogFile=$SL/slurmctld.log
SlurmdLogFile=$SL/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=30
MinJobAge=600
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=fsdp Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$SL/slurm.conf"
unset SLURM_JOB_ID SLURM_JOBID SLURM_NODEID
PIDS=()
FAIL_LOGS=("$SL/slurmctld.log" "$SL/slurmd.log" "$SL/munged.log")
# Teardown, even on failure: cancel what is left (so no slurmstepd outlives the test), then the
# daemons (common.sh kills anything left with $S/ on its command line).
teardown() {
  if [ ${#PIDS[@]} -ge 3 ]; then
    scancel --full --signal=KILL --partition=fsdp 2>/dev/null || true
    scancel --partition=fsdp 2>/dev/null || true
    wait_for 30 bash -c '[ -z "$(squeue -h -p fsdp 2>/dev/null)" ]' || true
  fi
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[i]}"; done
}
at_exit teardown
munged --foreground --force --socket="$SL/munge/socket" --key-file="$SL/munge/munge.key" --log-file="$SL/munged.log" \
  --pid-file="$SL/munge/munged.pid" --seed-file="$SL/munge/seed" >>"$SL/munged.out" 2>&1 & PIDS+=($!)
wait_for 20 test -S "$SL/munge/socket" || skip "munged did not start: $(tail -3 "$SL/munged.out" "$SL/munged.log" 2>/dev/null)"
slurmctld -D -i -f "$SL/slurm.conf" >>"$SL/slurmctld.out" 2>&1 & PIDS+=($!)
slurmd -D -f "$SL/slurm.conf" >>"$SL/slurmd.out" 2>&1 & PIDS+=($!)
node_idle() { [ "$(sinfo -h -n "$HOST" -o %T 2>/dev/null)" = idle ]; }
if ! wait_for 60 node_idle; then
  skip "Slurm did not come up on $HOST within 60 s: $(sinfo 2>&1 | tail -2); $(tail -3 "$SL/slurmctld.log" "$SL/slurmd.log" 2>/dev/null)"
fi
echo "slurm: slurmctld :$CTLD_PORT, slurmd :$SLURMD_PORT, node $HOST idle"

# job_field ID FIELD: a field of `scontrol show job` (JobState, ExitCode, ...).
job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
job_over() { case "$(job_field "$1" JobState)" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) return 0;; esac; return 1; }
submit_recipe() {   # STATE-DIR OUTPUT JOB.ini: prints the Slurm job id
  FSDP_BIN="$BUILD" FSDP_STATE_DIR="$1" FSDP_PORT="$FSDP_PORT" FSDPD_FLAGS="--cpu-workers 2 --gpus none" \
    FSDP_START_TIMEOUT=60 sbatch --parsable --nodes=1 --cpus-per-task=2 --exclusive --time=10 --output="$2" \
    "$SRC/scripts/slurm/fsdpd.sbatch" "$3"
}
# Nothing of that cluster runs any more: neither fsdpd nor a worker whose pid its log names.
none_left() {   # LOG
  local pids
  pids=$(sed -n 's/.*fsdpd fsdpd coordinator (pid \([0-9]*\)).*/\1/p; s/.*rank [0-9]*: started .*(pid \([0-9]*\),.*/\1/p' "$1")
  [ -n "$pids" ] || fail "no fsdpd or worker pid in $1"
  for p in $pids; do ! kill -0 "$p" 2>/dev/null || fail "pid $p ($(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null)) still runs"; done
}

# ---- 1. the recipe runs a 2-rank job on the allocation
sed -e 's/^steps = .*/steps = 6/' -e 's/^warmup_steps = .*/warmup_steps = 1/' -e 's/^name = .*/name = slurm2/' \
  "$SRC/examples/tiny.ini" >"$S/two.ini"
ST1="$S/state/run"
FAIL_LOGS+=("$S/run.out" "$ST1/fsdpd-$HOST.log")
jid=$(submit_recipe "$ST1" "$S/run.out" "$S/two.ini")
[[ "$jid" =~ ^[0-9]+$ ]] || fail "sbatch printed '$jid', expected a job id"
wait_for 150 job_over "$jid" || fail "Slurm job $jid still $(job_field "$jid" JobState) after 150 s"
[ "$(job_field "$jid" JobState)" = COMPLETED ] && [ "$(job_field "$jid" ExitCode)" = 0:0 ] ||
  fail "Slurm job $jid: $(job_field "$jid" JobState), exit code $(job_field "$jid" ExitCode)"
log="$ST1/fsdpd-$HOST.log"
grep -q "Slurm job $jid: node 0 of 1 ($HOST), coordinator on $HOST" "$log" || fail "fsdpd did not run as node 0 of Slurm job $jid"
grep -q "cluster endpoint tcp://\*:$FSDP_PORT" "$log" || fail "the coordinator did not listen on tcp://*:$FSDP_PORT"
for f in server.key server.pub nodes.key authorized; do [ -s "$ST1/keys/$f" ] || fail "the recipe made no keys/$f"; done
[ "$(stat -c %a "$ST1/keys/nodes.key")" = 600 ] || fail "keys/nodes.key has mode $(stat -c %a "$ST1/keys/nodes.key")"
grep -q "all 1 node(s) registered" "$S/run.out" || fail "the recipe did not wait for the node"
grep -q "job 1 (slurm2) queued" "$log" && grep -q "job 1 succeeded" "$log" || fail "job 1 did not succeed on the allocation"
python3 - "$ST1/jobs/1/metrics.jsonl" <<'PY' || fail "metrics.jsonl of the job run through Slurm"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [d["step"] for d in lines] == [1, 2, 3, 4, 5, 6], [d["step"] for d in lines]
assert all([r["rank"] for r in d["ranks"]] == [0, 1] for d in lines)
assert all(d["tokens"] == 2 * 8 * 64 for d in lines)
assert all(math.isfinite(d["loss"]) and 0 < d["loss"] < 10 for d in lines)
assert lines[-1]["loss"] < lines[0]["loss"], (lines[0]["loss"], lines[-1]["loss"])
PY
grep -q "shutdown requested over ctl" "$log" && grep -q "fsdpd stopped" "$log" || fail "fsdpd was not shut down after the job"
none_left "$log"

# ---- 2. the allocation ends while a job runs
sed -e 's/^steps = .*/steps = 100000/' -e 's/^name = .*/name = endless/' "$SRC/examples/tiny.ini" >"$S/long.ini"
ST2="$S/state/end"
FAIL_LOGS+=("$S/end.out" "$ST2/fsdpd-$HOST.log")
# NCCL's variables, exported at submit time, must reach every worker (docs/operations.md §9).
jid2=$(NCCL_SOCKET_IFNAME=lo NCCL_IB_HCA=mlx5_0:1 submit_recipe "$ST2" "$S/end.out" "$S/long.ini")
log2="$ST2/fsdpd-$HOST.log"
running() { grep -q "job 1 running" "$log2" 2>/dev/null; }
wait_for 120 running || fail "the endless job did not start under Slurm job $jid2 ($(job_field "$jid2" JobState))"
for r in 0 1; do
  wpid=$(sed -n "s/.*job 1 rank $r: started .*(pid \([0-9]*\),.*/\1/p" "$log2")
  [ -n "$wpid" ] || fail "no pid for rank $r in $log2"
  wenv=$(tr '\0' '\n' <"/proc/$wpid/environ") || fail "cannot read rank $r's environment"
  grep -qx "NCCL_SOCKET_IFNAME=lo" <<<"$wenv" && grep -qx "NCCL_IB_HCA=mlx5_0:1" <<<"$wenv" ||
    fail "rank $r (pid $wpid) does not see the NCCL variables given to sbatch"
  grep -qx "SLURM_JOB_ID=$jid2" <<<"$wenv" || fail "rank $r (pid $wpid) does not run in Slurm job $jid2"
done
scancel --batch --signal=TERM "$jid2"
wait_for 60 job_over "$jid2" || fail "Slurm job $jid2 did not end within 60 s of its SIGTERM"
grep -q "SIGTERM: stopping the cluster" "$S/end.out" || fail "the recipe did not forward the SIGTERM"
grep -q "job 1 queued: the daemon shut down" "$log2" || fail "the running job was not queued again by the shutdown"
grep -q "all workers reaped; exiting" "$log2" && grep -q "fsdpd stopped" "$log2" || fail "fsdpd did not stop cleanly"
! grep -q "second SIGTERM\|Killed" "$log2" || fail "fsdpd was killed rather than stopped"
none_left "$log2"

# ---- 4. no job file: the cluster runs until `fsdpctl shutdown`, then the recipe ends (with more
# nodes it also stops the other nodes' agents, which would wait for the coordinator to the time limit)
ST3="$S/state/idle"
FAIL_LOGS+=("$S/idle.out" "$ST3/fsdpd-$HOST.log")
jid3=$(submit_recipe "$ST3" "$S/idle.out" "")
up() { grep -q "all 1 node(s) registered" "$S/idle.out" 2>/dev/null; }
wait_for 120 up || fail "the cluster of Slurm job $jid3 did not come up ($(job_field "$jid3" JobState))"
FSDP_CTL="ipc://$ST3/ctl.sock" "$CTL" shutdown >/dev/null || fail "fsdpctl shutdown failed"
wait_for 60 job_over "$jid3" || fail "Slurm job $jid3 did not end within 60 s of fsdpctl shutdown"
[ "$(job_field "$jid3" JobState)" = COMPLETED ] && [ "$(job_field "$jid3" ExitCode)" = 0:0 ] ||
  fail "Slurm job $jid3 after fsdpctl shutdown: $(job_field "$jid3" JobState), exit code $(job_field "$jid3" ExitCode)"
none_left "$ST3/fsdpd-$HOST.log"
echo "slurm: ok (jobs $jid, $jid2 and $jid3)"
