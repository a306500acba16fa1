#!/usr/bin/env bash
# trust_workers — a worker is its job owner's process or nothing (docs/operations.md, "Trust model").
# As root it creates two unprivileged users of its own, alice and bob (unique names, removed on
# exit), and plays what bob would try against alice's jobs:
#   - before fsdpd starts, bob binds 3,000 abstract unix names of the form older fsdpd used for its
#     workers' endpoint (@fsdpd-relay-PID-N, for the next 3,000 pids): fsdpd starts all the same;
#   - for each of alice's jobs, bob's fsdp_forge watches /proc for her rank 0 worker and sends its
#     hello first, as fast as it can, to every endpoint it can name (the worker's --connect, every
#     fsdpd socket /proc/net/unix lists), with her job's token: from the worker's command line where
#     it is there, else the real one, which the test (root) reads from the worker's environment and
#     hands bob — a stolen token. Ten jobs on the embedded node, ten on a node joined over tcp://
#     (CURVE): bob never takes a rank over, every job succeeds, with the losses of an unattacked run
#     of the same job, and alice's data file is unchanged;
#   - 20,000 garbage messages to the workers' socket, the cluster socket and the ctl socket add less
#     than 10 kB to the daemon's log each, and the daemon still serves.
# Without root (or without useradd and setpriv) it exits 77: skipped.
# Usage: bash trust_workers.sh BUILD_DIR SOURCE_DIR
set -Eeuo pipefail
# a command that fails without a word of its own still says where
trap 'echo "trust_workers: line $LINENO: a command failed (status $?)"' ERR
[ "$(id -u)" -eq 0 ] || { echo "trust_workers: skipped: needs root to create its users"; exit 77; }
for t in useradd userdel setpriv python3; do
  command -v "$t" >/dev/null || { echo "trust_workers: skipped: no $t (scripts/install-deps.sh --test)"; exit 77; }
done
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" trustw
chmod 0755 "$S"
FORGE="$BUILD/tests/fsdp_forge"
[ -x "$FORGE" ] || fail "$FORGE is not built"

tag=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
A="fsdpwa$tag" B="fsdpwb$tag"
SQPID="" NPID=""
drop_users() {
  stop_pid "$DPID"; DPID=""
  stop_pid "$NPID"; NPID=""
  stop_pid "$SQPID"; SQPID=""
  pkill -KILL -u "$B" 2>/dev/null || true
  userdel -f "$A" 2>/dev/null; userdel -f "$B" 2>/dev/null
  true
}
at_exit drop_users
useradd -M -U -s /usr/sbin/nologin "$A"
useradd -M -U -s /usr/sbin/nologin "$B"
as() { local u=$1; shift; setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups "$@"; }
mkdir -m 0755 "$S/a" "$S/b" && chown "$A" "$S/a" && chown "$B" "$S/b"

"$CTL" gen-data --markov 3 --vocab 256 --tokens 20000 -o "$S/a/tok.bin" >/dev/null || fail "gen-data failed"
chown "$A" "$S/a/tok.bin" && chmod 0600 "$S/a/tok.bin"
sum0=$(sha256sum < "$S/a/tok.bin")
sed -e 's/^name = .*/name = w/' -e "s|^train = .*|train = $S/a/tok.bin|" -e 's/^steps = .*/steps = 40/' \
    -e 's/^warmup_steps = .*/warmup_steps = 1/' "$SRC/examples/tiny.ini" > "$S/a/w.ini"
chown "$A" "$S/a/w.ini"
submit() { (cd "$S/a" && as "$A" env FSDP_CTL="$FSDP_CTL" "$CTL" submit w.ini | tail -1); }
losses() { python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"loss\"" in l))' "$1/jobs/$2/metrics.jsonl"; }

# ---- 3,000 squatted names of the old form, for the pids fsdpd and its agent will have
ulimit -n 8192
as "$B" /usr/bin/python3 -c '
import socket, sys, time
first = int(open("/proc/sys/kernel/ns_last_pid").read()) + 1
held = []
for pid in range(first, first + 3000):
    s = socket.socket(socket.AF_UNIX)
    try: s.bind("\0fsdpd-relay-%d-0" % pid); held.append(s)
    except OSError: s.close()
open(sys.argv[1], "w").write("%d\n" % len(held))
time.sleep(600)' "$S/b/squatted" & SQPID=$!
wait_for 30 test -s "$S/b/squatted" || fail "bob's squatter did not start"
[ "$(cat "$S/b/squatted")" -ge 2000 ] || fail "bob squatted only $(cat "$S/b/squatted") names"
start_daemon
wait_for 10 "$CTL" nodes || fail "fsdpd did not start with 3,000 names squatted: $(tail -3 "$S/fsdpd.log")"
stop_pid "$SQPID"; SQPID=""

# ---- the unattacked run: the losses every attacked run must equal
id0=$(submit)
wait_for 60 finished "$id0" || fail "job $id0 did not end within 60 s"
is_state "$id0" succeeded || fail "job $id0: $("$CTL" status "$id0")"
ref=$(losses "$S" "$id0")
[ -n "$ref" ] || fail "job $id0 recorded no losses"

# stolen PID FILE: the token in PID's environment, written to FILE once read, and the command line
# beside it in FILE.cmd (the environment is empty while the process is between two execs, and gone
# once it has ended: both are read once, together)
stolen() {
  local t c; c=$(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null)
  t=$(tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n 's/^FSDPD_WORKER_TOKEN=//p')
  [ -n "$t" ] && echo "$c" > "$2.cmd" && echo "$t" > "$2"
}
# attack STATE NODE_LOG TRIES: TRIES jobs of alice's, each raced by bob's forger for rank 0.
attack() {
  local state=$1 log=$2 tries=$3 t id pid
  for t in $(seq 1 "$tries"); do
    rm -f "$S/b/token"
    local next=$(( $("$CTL" jobs --json | jget 'max([j["id"] for j in d["jobs"]] + [0])') + 1 ))
    as "$B" "$FORGE" watch "$next" 0 "$S/b/token" 8 > "$S/b/forge.out" 2>&1 & local fpid=$!
    id=$(submit)
    [ "$id" = "$next" ] || fail "job ids: expected $next, got $id"
    # the stolen token: root reads it from the worker's environment and hands it to bob
    wait_for 30 grep -q "job $id rank 0: started" "$log" || fail "job $id rank 0 did not start"
    pid=$(sed -n "s/.*job $id rank 0: started .*(pid \([0-9]*\),.*/\1/p" "$log" | tail -1)
    umask 077
    wait_for 10 stolen "$pid" "$S/b/token.tmp" || fail "job $id: no FSDPD_WORKER_TOKEN in the worker's environment"
    umask 022
    ! grep -q -- "--token" "$S/b/token.tmp.cmd" || fail "job $id: the token is on the worker's command line"
    chown "$B" "$S/b/token.tmp"; mv "$S/b/token.tmp" "$S/b/token"
    local frc=0; wait "$fpid" || frc=$?
    [ $frc -ne 0 ] || fail "try $t: bob took over alice's job $id: $(cat "$S/b/forge.out")"
    wait_for 60 finished "$id" || fail "job $id did not end within 60 s"
    is_state "$id" succeeded || fail "try $t: alice's job $id: $("$CTL" status "$id")"
    [ "$(losses "$state" "$id")" = "$ref" ] || fail "try $t: job $id's losses $(losses "$state" "$id") differ from the unattacked run's $ref"
  done
}
attack "$S" "$S/fsdpd.log" 10
[ "$(sha256sum < "$S/a/tok.bin")" = "$sum0" ] || fail "alice's data file changed"

# ---- 20,000 garbage messages to each endpoint: under 10 kB of log each, and the daemon serves
relay=$(awk '$NF ~ "^'"$S"'/run/r-" {print $NF; exit}' /proc/net/unix)
[ -n "$relay" ] || fail "no workers' socket under $S/run in /proc/net/unix"
[ "$(stat -c %a "$S/run")" = 700 ] || fail "$S/run has mode $(stat -c %a "$S/run"), expected 700"
for ep in "ipc://$relay" "ipc://$S/cluster.sock" "ipc://$S/ctl.sock"; do
  before=$(stat -c %s "$S/fsdpd.log")
  "$FORGE" garbage "$ep" 20000 || fail "cannot send garbage to $ep"
  wait_for 20 "$CTL" nodes || fail "fsdpd stopped serving after garbage on $ep"
  grown=$(( $(stat -c %s "$S/fsdpd.log") - before ))
  [ "$grown" -lt 10240 ] || fail "20,000 garbage messages to $ep added $grown bytes of log"
done
stop_daemon

# ---- the same on a node joined over tcp:// (CURVE): the coordinator has no CPU slots of its own
read -r PORT < <(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -m 0700 "$S/node" "$S/keys"
"$CTL" keygen "$S/node/client.key" > "$S/node/client.pub"
echo "$(cat "$S/node/client.pub") admin" > "$S/keys/authorized"
start_daemon --listen "tcp://127.0.0.1:$PORT" --cpu-workers 0
wait_for 10 test -s "$S/keys/server.pub" || fail "the coordinator wrote no server key"
env FSDP_SERVER_KEY="$S/keys/server.pub" FSDP_CLIENT_KEY="$S/node/client.key" "$BUILD/fsdpd" --foreground \
  --state-dir "$S/node" --join "tcp://127.0.0.1:$PORT" --name "joined-$tag" --cpu-workers 2 --gpus none \
  >>"$S/node.log" 2>&1 & NPID=$!
FAIL_LOGS+=("$S/node.log")
wait_for 20 free_slots 2 || fail "the joined node did not register"
attack "$S" "$S/node.log" 10
[ "$(stat -c %a "$S/node/run")" = 700 ] || fail "$S/node/run has mode $(stat -c %a "$S/node/run")"
[ "$(sha256sum < "$S/a/tok.bin")" = "$sum0" ] || fail "alice's data file changed"
echo "trust_workers: ok"
