# Shared by the daemon_*.sh integration tests; sourced, not run (ctest runs only *.sh one level up).
#   source lib/daemon.sh BUILD_DIR SOURCE_DIR NAME
# Sets BUILD, SRC, a fresh state directory S (removed on exit, with every process started under it),
# FSDP_CTL pointing into it, and the helpers below. DPID is the daemon's pid once started.
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd)
[ -x "$BUILD/fsdp-worker" ] && [ -x "$BUILD/fsdpctl" ] || { echo "fsdp-worker or fsdpctl not built"; exit 1; }
S=$(mktemp -d "/tmp/fsdpd-$3-XXXXXX")
DPID=""
cleanup() {
  set +e
  [ -n "$DPID" ] && kill -TERM "$DPID" 2>/dev/null && { timeout 15 tail --pid="$DPID" -f /dev/null || kill -KILL "$DPID"; } 2>/dev/null
  [ -n "$DPID" ] && wait "$DPID" 2>/dev/null || true
  for p in $(pgrep -f -- "$S/" || true); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$S"
}
trap cleanup EXIT
export FSDP_CTL="ipc://$S/ctl.sock"
fail() { echo "FAIL: $*"; echo "--- daemon log"; tail -40 "$S/fsdpd.log" || true; exit 1; }
# wait_for SECONDS CMD...: poll a condition (every 0.1 s) until it holds or the deadline passes
wait_for() { local t=$1; shift; local end=$((SECONDS + t)); until "$@" >/dev/null 2>&1; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done; }
jget() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {"d": d}))' "$1"; }
state_of() { "$BUILD/fsdpctl" status "$1" --json | jget 'd["state"]'; }
is_state() { [ "$(state_of "$1")" = "$2" ]; }
finished() { case "$(state_of "$1")" in succeeded|failed|cancelled) return 0;; esac; return 1; }
at_step() { [ "$("$BUILD/fsdpctl" status "$1" --json | jget 'd["state"] == "running" and d["step"] >= '"$2")" = True ]; }
worker_pid() { sed -n "s/.*job $1 rank $2: started .*(pid \([0-9]*\),.*/\1/p" "$S/fsdpd.log" | tail -1; }
start_daemon() { "$BUILD/fsdpd" --foreground --state-dir "$S" --cpu-workers 2 --gpus none >>"$S/fsdpd.log" 2>&1 & DPID=$!; }
