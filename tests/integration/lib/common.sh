# Shared by the integration tests; sourced, not run (ctest runs only *.sh one level up).
#   source lib/common.sh BUILD_DIR SOURCE_DIR NAME
# Sets BUILD, SRC, CTL (fsdpctl) and a fresh directory S (/tmp/fsdpd-NAME-XXXXXX). On exit the
# hooks registered with at_exit run (last registered first), then every process still running
# with "$S/" on its command line is killed and S is removed. fail() prints its message and the
# tail of each file in FAIL_LOGS (default: $S/fsdpd.log), then exits 1.
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd)
CTL="$BUILD/fsdpctl"
for b in fsdpctl fsdpd fsdp-worker; do [ -x "$BUILD/$b" ] || { echo "$b not built in $BUILD"; exit 1; }; done
S=$(mktemp -d "/tmp/fsdpd-$3-XXXXXX")
FAIL_LOGS=("$S/fsdpd.log")
EXIT_HOOKS=()
at_exit() { EXIT_HOOKS=("$1" "${EXIT_HOOKS[@]}"); }
cleanup() {
  set +e
  for h in "${EXIT_HOOKS[@]}"; do eval "$h"; done
  for p in $(pgrep -f -- "$S/" || true); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$S"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "${FAIL_LOGS[@]}"; do [ -s "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done
  exit 1
}
# stop_pid PID: SIGTERM, then SIGKILL if it has not exited within 15 s; reaps it if it is ours.
stop_pid() {
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2>/dev/null && { timeout 15 tail --pid="$1" -f /dev/null || kill -KILL "$1"; } 2>/dev/null
  wait "$1" 2>/dev/null || true
}
# wait_for SECONDS CMD...: poll a condition (every 0.1 s) until it holds or the deadline passes.
wait_for() { local t=$1; shift; local end=$((SECONDS + t)); until "$@" >/dev/null 2>&1; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done; }
jget() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {"d": d}))' "$1"; }
state_of() { "$CTL" status "$1" --json | jget 'd["state"]'; }
is_state() { [ "$(state_of "$1")" = "$2" ]; }
finished() { case "$(state_of "$1")" in succeeded|failed|cancelled) return 0;; esac; return 1; }
at_step() { [ "$("$CTL" status "$1" --json | jget 'd["state"] == "running" and d["step"] >= '"$2")" = True ]; }
reason_of() { "$CTL" status "$1" --json | jget 'd.get("reason", "")'; }
# Free CPU slots on nodes that are not lost, at least N.
free_slots() { [ "$("$CTL" nodes --json | jget 'sum(1 for n in d["nodes"] if not n["lost"] for s in n["devices"] if s["kind"] == "cpu" and s["job_id"] is None)')" -ge "$1" ]; }
