#!/usr/bin/env bash
# ctl_errors — fsdpctl's failures are one clear line on stderr, a non-zero status, and quick:
# no daemon at the endpoint (missing socket, stale socket file, TCP port nobody listens on, the
# default endpoint under $XDG_STATE_HOME); a malformed job file (named with file:line, checked
# before any daemon is contacted; Llama's n_kv_head, head size and ffn_dim rules); bad arguments (status 2); device = cuda on a machine without
# the CUDA driver. Needs only fsdpctl: no daemon is started.
# Usage: bash ctl_errors.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" ctl-errors
T="$S"
FAIL_LOGS=()
unset FSDP_CTL

# run_cmd NAME CMD...: runs CMD with a hard limit, keeps stdout, stderr, status and wall time.
run_cmd() {
  local name=$1; shift
  local t0=$(date +%s%N)
  set +e
  timeout 20 "$@" >"$T/$name.out" 2>"$T/$name.err"
  echo $? >"$T/$name.rc"
  set -e
  echo $(( ($(date +%s%N) - t0) / 1000000 )) >"$T/$name.ms"
}
rc_of() { cat "$T/$1.rc"; }
ms_of() { cat "$T/$1.ms"; }
err_lines() { wc -l <"$T/$1.err"; }
# expect_err NAME STATUS MAX_MS REGEX: status, time bound, exactly one stderr line matching REGEX.
expect_err() {
  local name=$1 want=$2 max_ms=$3 re=$4
  [ "$(rc_of "$name")" = "$want" ] || fail "$name: exit status $(rc_of "$name"), expected $want; stderr: $(cat "$T/$name.err")"
  [ "$(ms_of "$name")" -le "$max_ms" ] || fail "$name: took $(ms_of "$name") ms, expected at most $max_ms"
  [ "$(err_lines "$name")" = 1 ] || fail "$name: $(err_lines "$name") stderr lines, expected 1: $(cat "$T/$name.err")"
  grep -Eq -- "$re" "$T/$name.err" || fail "$name: stderr '$(cat "$T/$name.err")' does not match /$re/"
}

# ---- no daemon
run_cmd missing env FSDP_CTL="ipc://$T/none.sock" "$CTL" status 1
expect_err missing 1 2000 "^fsdpctl: cannot reach fsdpd at ipc://$T/none.sock: is it running\? \(start it with \`fsdpd\` or use \`fsdpctl run\`\)$"

run_cmd default env XDG_STATE_HOME="$T/xdg" "$CTL" jobs
expect_err default 1 2000 "^fsdpctl: cannot reach fsdpd at ipc://$T/xdg/fsdpd/ctl.sock: is it running"

# --ctl wins over FSDP_CTL
run_cmd flag env FSDP_CTL="ipc://$T/a.sock" "$CTL" nodes --ctl "ipc://$T/b.sock"
expect_err flag 1 2000 "cannot reach fsdpd at ipc://$T/b.sock"

# A socket file left by a daemon that died: the connection is refused; bounded by the connect timeout.
python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.close()' "$T/stale.sock"
[ -S "$T/stale.sock" ] || fail "could not create a stale socket file"
run_cmd stale "$CTL" status 3 --ctl "ipc://$T/stale.sock"
expect_err stale 1 6000 "cannot reach fsdpd at ipc://$T/stale.sock"

# A TCP port nobody listens on (bind one, note it, close it).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
run_cmd tcp "$CTL" cancel 3 --ctl "tcp://127.0.0.1:$port"
expect_err tcp 1 6000 "cannot reach fsdpd at tcp://127.0.0.1:$port"
for cmd in "logs 1" "status 1 --json" "jobs --json" "nodes --json"; do
  run_cmd each env FSDP_CTL="ipc://$T/none.sock" "$CTL" $cmd
  expect_err each 1 2000 "^fsdpctl: cannot reach fsdpd"
  [ ! -s "$T/each.out" ] || fail "'$cmd' printed to stdout: $(cat "$T/each.out")"
done

# ---- a malformed job file: one line naming file:line, before contacting any daemon
cp "$SRC/tests/integration/jobs/ctl_small.ini" "$T/bad.ini"
line=$(grep -n '^n_embd' "$T/bad.ini" | cut -d: -f1)
sed -i 's/^n_embd = .*/n_embd = lots/' "$T/bad.ini"
run_cmd badsubmit env FSDP_CTL="ipc://$T/none.sock" "$CTL" submit "$T/bad.ini"
expect_err badsubmit 1 2000 "^fsdpctl: ([^ ]*/)?bad.ini:$line: .*n_embd"
[ ! -s "$T/badsubmit.out" ] || fail "submit of a bad file printed to stdout: $(cat "$T/badsubmit.out")"
run_cmd badrun "$CTL" run "$T/bad.ini"
expect_err badrun 1 2000 "^fsdpctl: ([^ ]*/)?bad.ini:$line: "

# Llama's rules: n_kv_head must divide n_head, the head size must be even (rotary), ffn_dim is required
sed 's/^n_kv_head = .*/n_kv_head = 3/' "$SRC/examples/llama-tiny.ini" >"$T/kv.ini"
run_cmd badkv "$CTL" plan "$T/kv.ini"
expect_err badkv 1 2000 "kv.ini:[0-9]+: \[model\] n_kv_head = 3 does not divide n_head = 4; allowed: a divisor of n_head"
sed 's/^n_embd = .*/n_embd = 68/' "$SRC/examples/llama-tiny.ini" >"$T/odd.ini"
run_cmd badodd "$CTL" plan "$T/odd.ini"
expect_err badodd 1 2000 "odd.ini:[0-9]+: \[model\] head size n_embd / n_head = 17 is odd"
grep -v '^ffn_dim' "$SRC/examples/llama-tiny.ini" >"$T/noffn.ini"
run_cmd noffn "$CTL" plan "$T/noffn.ini"
expect_err noffn 1 2000 "noffn.ini:[0-9]+: \[model\] arch = llama needs ffn_dim"

printf '[job]\nsteps = 10\nbogus_key = 1\n' >"$T/unknown.ini"
run_cmd unknown "$CTL" submit "$T/unknown.ini" --ctl "ipc://$T/none.sock"
expect_err unknown 1 2000 "unknown.ini:3: .*bogus_key"

run_cmd nofile "$CTL" submit "$T/does-not-exist.ini"
[ "$(rc_of nofile)" = 1 ] && [ "$(err_lines nofile)" = 1 ] || fail "missing job file: status $(rc_of nofile), stderr $(cat "$T/nofile.err")"
grep -q "does-not-exist.ini" "$T/nofile.err" || fail "missing job file not named: $(cat "$T/nofile.err")"

# ---- usage errors: status 2
run_cmd badid "$CTL" status abc
[ "$(rc_of badid)" = 2 ] && grep -q "'abc' is not a job id" "$T/badid.err" || fail "status abc: $(rc_of badid) $(cat "$T/badid.err")"
run_cmd zeroid "$CTL" cancel 0
[ "$(rc_of zeroid)" = 2 ] || fail "cancel 0: status $(rc_of zeroid)"
run_cmd badopt "$CTL" jobs --frobnicate
[ "$(rc_of badopt)" = 2 ] || fail "jobs --frobnicate: status $(rc_of badopt)"
run_cmd noarg "$CTL" submit
[ "$(rc_of noarg)" = 2 ] || fail "submit without a file: status $(rc_of noarg)"
run_cmd badrank "$CTL" logs 1 --rank -3
[ "$(rc_of badrank)" = 2 ] || fail "logs --rank -3: status $(rc_of badrank)"
for c in run submit status jobs logs cancel nodes; do
  run_cmd help "$CTL" $c --help
  [ "$(rc_of help)" = 0 ] && grep -q "usage: fsdpctl $c" "$T/help.out" || fail "$c --help: status $(rc_of help)"
done

# ---- device = cuda without the CUDA driver: refused before anything starts
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  sed -e 's/^device = .*/device = cuda/' -e 's/^world_size = .*/world_size = 8/' \
    "$SRC/tests/integration/jobs/ctl_small.ini" >"$T/cuda.ini"
  run_cmd cuda "$CTL" run "$T/cuda.ini" --state-dir "$T/cuda-state"
  expect_err cuda 1 3000 "^fsdpctl: job asks for device = cuda with world_size 8 but this machine has no CUDA devices$"
else
  echo "ctl_errors: libcuda.so.1 present; the no-CUDA check is skipped"
fi

echo "ctl_errors: ok"
