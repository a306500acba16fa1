# Shared by the tests that run one embedded fsdpd; sourced, not run.
#   source lib/daemon.sh BUILD_DIR SOURCE_DIR NAME
# lib/common.sh plus: FSDP_CTL pointing into S, start_daemon (2 CPU slots, state in S, log in
# S/fsdpd.log; its pid in DPID, stopped on exit), stop_daemon, worker_pid and signal_rank.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
DPID=""
at_exit 'stop_pid "$DPID"'
export FSDP_CTL="ipc://$S/ctl.sock"
worker_pid() { sed -n "s/.*job $1 rank $2: started .*(pid \([0-9]*\),.*/\1/p" "$S/fsdpd.log" | tail -1; }
# signal_rank SIG JOB RANK: send SIG to rank RANK's worker of JOB (its pid from the daemon log).
signal_rank() {
  local pid; pid=$(worker_pid "$2" "$3")
  [ -n "$pid" ] || fail "no pid for job $2 rank $3 in the daemon log"
  kill -"$1" "$pid"
}
# start_daemon [FLAGS...]: extra fsdpd flags (such as --metrics) follow the defaults.
start_daemon() { "$BUILD/fsdpd" --foreground --state-dir "$S" --cpu-workers 2 --gpus none "$@" >>"$S/fsdpd.log" 2>&1 & DPID=$!; }
# SIGTERM; the daemon must exit 0.
stop_daemon() {
  kill -TERM "$DPID"; local rc=0; wait "$DPID" || rc=$?; DPID=""
  [ "$rc" -eq 0 ] || fail "fsdpd exited with status $rc after SIGTERM"
}
# start_daemon_metrics NODE: start_daemon --name NODE with --metrics on a free loopback port, in
# PORT. The kernel picks the port; should another process take it before fsdpd binds, fsdpd says
# so and a fresh one is tried (5 tries).
start_daemon_metrics() {
  PORT=""
  local try p
  for try in 1 2 3 4 5; do
    p=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    start_daemon --name "$1" --metrics "127.0.0.1:$p"
    if wait_for 10 "$CTL" nodes; then PORT=$p; return 0; fi
    grep -q "already in use" "$S/fsdpd.log" || fail "fsdpd did not answer nodes within 10 s"
    wait "$DPID" || true; DPID=""
  done
  fail "no free port in 5 tries"
}
