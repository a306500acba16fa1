#!/usr/bin/env bash
# trust_users — jobs run as the user who submitted them (docs/operations.md, "Trust model"). As
# root it creates two unprivileged users of its own (unique names, removed on exit) and plays:
#   - a job naming a file its submitter cannot read is refused at submit with one line, by the
#     daemon itself (the client holds an extra group the submitter's account lacks, so the client's
#     own check passes), without the file's size or first bytes in the message; the file is unchanged;
#     the same from a job file whose name holds newlines and an escape sequence: one line back, one
#     escaped line in the daemon's log, no forged entry;
#   - a job whose token file the submitter reads through a supplementary group runs, and writes its
#     checkpoint files owned by the submitter, with the submitter's umask;
#   - `dir = ../../../../root/x` cannot make the job write where its submitter cannot;
#   - a second user cannot cancel, stop, read the logs of or trace the first's job, which keeps running;
#     root (an admin) can; `jobs --json` and `status --json` show the owner;
#   - an ordinary user cannot register an agent on the (world-connectable) cluster socket;
#   - over tcp:// the key names the user (KEY user=NAME in keys/authorized), whoever runs fsdpctl;
#     keys fail closed: a bare key, User=, "user = x", a note before user=, #user= and a key in the
#     tail of a comment line longer than 512 bytes are refused (not admins), each bad line logged;
#   - a daemon run by an ordinary user runs that user's jobs as before and refuses root's with one line.
# Without root (or without useradd and setpriv) it exits 77: skipped.
# Usage: bash trust_users.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "trust_users: skipped: needs root to create its users"; exit 77; }
for t in useradd userdel groupadd groupdel setpriv; do
  command -v "$t" >/dev/null || { echo "trust_users: skipped: no $t (scripts/install-deps.sh test)"; exit 77; }
done
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" trust
chmod 0755 "$S"

tag=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
A="fsdpa$tag" B="fsdpb$tag" G="fsdpg$tag" H="fsdph$tag"   # users alice and bob; groups G (alice's), H (nobody's)
BPID=""
drop_users() {
  stop_pid "$DPID"; DPID=""
  stop_pid "$BPID"; BPID=""
  for p in $(pgrep -f -- "$S/" || true); do kill -KILL "$p" 2>/dev/null || true; done
  userdel -f "$A" 2>/dev/null; userdel -f "$B" 2>/dev/null; groupdel "$G" 2>/dev/null; groupdel "$H" 2>/dev/null
  rm -rf "/root/fsdpt-$tag" "/tmp/fsdpt-$tag.json"
  true
}
at_exit drop_users
groupadd "$G"; groupadd "$H"
useradd -M -U -s /usr/sbin/nologin -G "$G" "$A"
useradd -M -U -s /usr/sbin/nologin "$B"
# as USER [--groups=G] CMD...: run CMD as USER with the groups of its account (or G in addition).
as() { local u=$1; shift; local extra=(--init-groups); [[ "${1:-}" == --groups=* ]] && { extra=("--groups=$(id -G "$u" | tr ' ' ,),${1#--groups=}"); shift; }
       setpriv --reuid="$u" --regid="$(id -g "$u")" "${extra[@]}" env FSDP_CTL="$FSDP_CTL" "$@"; }

# Token files: one only group H may read (root:H 0640), one group G may read.
"$CTL" gen-data --markov 3 --vocab 256 --tokens 20000 -o "$S/tok.bin" >/dev/null || fail "gen-data failed"
install -m 0640 -g "$H" "$S/tok.bin" "$S/secret.bin"
install -m 0640 -g "$G" "$S/tok.bin" "$S/group.bin"
mkdir -m 0755 "$S/a" && chown "$A" "$S/a"
job() {   # job NAME TRAIN STEPS [CKPT_DIR]: a small job file owned by alice in S/a
  local every=0; [ -n "${4:-}" ] && every=5
  sed -e "s/^name = .*/name = $1/" -e "s|^train = .*|train = $2|" -e "s/^steps = .*/steps = $3/" \
      -e 's/^warmup_steps = .*/warmup_steps = 1/' -e "s|^; dir = .*|dir = ${4:-}|" -e "s/^every = 0.*/every = $every/" \
      "$SRC/examples/tiny.ini" > "$S/a/$1.ini"
  chown "$A" "$S/a/$1.ini"
}
start_daemon
wait_for 10 "$CTL" nodes || fail "fsdpd did not answer within 10 s"

# ---- a file the submitter cannot read: refused by the daemon, with one line, the file unchanged
sum0=$(sha256sum < "$S/secret.bin")
job secret "$S/secret.bin" 5
set +e; out=$(cd "$S/a" && as "$A" --groups="$H" "$CTL" submit secret.ini 2>&1); rc=$?; set -e
[ $rc -eq 1 ] || fail "submit of a job naming an unreadable file: exit $rc, expected 1: $out"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "expected one line, got: $out"
grep -q "^fsdpctl: .*cannot read $S/secret.bin: Permission denied" <<<"$out" || fail "unexpected refusal: $out"
magic=$(od -An -N4 -td4 "$S/secret.bin" | tr -d ' ')
! grep -Eq "magic|$magic|$(stat -c %s "$S/secret.bin")" <<<"$out" || fail "the refusal leaks the file's header or size: $out"
[ "$(sha256sum < "$S/secret.bin")" = "$sum0" ] || fail "secret.bin changed"
grep -q "submit refused" "$S/fsdpd.log" || fail "the daemon did not log the refusal (was it refused by the client only?)"

# ---- a job file whose name holds newlines and escapes, refused by the daemon: one line in its log,
# one line back, no forged entry (before: the name's lines appeared as lines of root's log)
forged="2026-01-01T00:00:00.000Z INFO  fsdpd job 1 (root) succeeded"
nl=$'x\n'"$forged"$'\n\e[2Jy.ini'
cp "$S/a/secret.ini" "$S/a/$nl" && chown "$A" "$S/a/$nl"
lines0=$(wc -l < "$S/fsdpd.log")
set +e; out=$(cd "$S/a" && as "$A" --groups="$H" "$CTL" submit "$nl" 2>&1); rc=$?; set -e
[ $rc -eq 1 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "a newline path's refusal: exit $rc, not one line: $out"
grep -qF 'x\n2026-01-01T00:00:00.000Z INFO  fsdpd job 1 (root) succeeded\n\x1b[2Jy.ini' <<<"$out" || fail "the path is not escaped: $out"
wait_for 10 grep -q "submit refused: .*x\\\\n2026-01-01" "$S/fsdpd.log" || fail "the daemon did not log the refusal, escaped"
! grep -q "^$forged" "$S/fsdpd.log" || fail "a forged line in the daemon's log: $(tail -n +"$lines0" "$S/fsdpd.log")"
! tail -n +"$lines0" "$S/fsdpd.log" | grep -q $'\e' || fail "an escape character reached the daemon's log"

# ---- a file readable through a supplementary group: the job runs, checkpoints owned by alice, umask 027
job grp "$S/group.bin" 10 ck
id1=$(cd "$S/a" && as "$A" sh -c "umask 027; exec \"$CTL\" submit grp.ini" | tail -1)
wait_for 60 finished "$id1" || fail "job $id1 did not end within 60 s"
is_state "$id1" succeeded || fail "job $id1: $("$CTL" status "$id1")"
files=$(find "$S/a/ck" -type f)
[ -n "$files" ] || fail "job $id1 wrote no checkpoint files"
for f in $files; do
  [ "$(stat -c %U "$f")" = "$A" ] || fail "$f is owned by $(stat -c %U "$f"), expected $A"
  [ $((0$(stat -c %a "$f") & 07)) -eq 0 ] || fail "$f has mode $(stat -c %a "$f"): the submitter's umask 027 was not applied"
done
[ "$("$CTL" status "$id1" --json | jget 'd["owner"]')" = "$A" ] || fail "status --json does not name $A as the owner"

# ---- dir = ../../../../root/x: the job cannot write where alice cannot
job esc synthetic:markov:1 10 "../../../../root/fsdpt-$tag"
id2=$(cd "$S/a" && as "$A" "$CTL" submit esc.ini | tail -1)
wait_for 60 finished "$id2" || fail "job $id2 did not end within 60 s"
is_state "$id2" failed || fail "job $id2 writing into /root: $("$CTL" status "$id2")"
[ ! -e "/root/fsdpt-$tag" ] || fail "/root/fsdpt-$tag exists: alice's job wrote into /root"
reason=$(reason_of "$id2")
grep -q "Permission denied" <<<"$reason" || fail "job $id2's reason does not say why: $reason"

# ---- bob may not cancel, stop or read the logs of alice's job; it keeps running; root may cancel it
job long synthetic:markov:1 100000
id3=$(cd "$S/a" && as "$A" "$CTL" submit long.ini | tail -1)
wait_for 60 at_step "$id3" 2 || fail "job $id3 did not reach step 2"
for verb in cancel stop logs trace; do
  args=("$verb" "$id3"); [ "$verb" = trace ] && args+=(-o /tmp/fsdpt-$tag.json)
  set +e; out=$(cd / && as "$B" "$CTL" "${args[@]}" 2>&1); rc=$?; set -e
  [ $rc -eq 1 ] || fail "bob's $verb of alice's job: exit $rc: $out"
  case $verb in logs) what="read the logs of";; *) what=$verb;; esac
  [ "$out" = "fsdpctl: job $id3 belongs to $A; only its owner or an admin may $what it" ] || fail "bob's $verb: $out"
done
[ ! -e "/tmp/fsdpt-$tag.json" ] || fail "bob's refused trace wrote a file"
step=$("$CTL" status "$id3" --json | jget 'd["step"]')
wait_for 30 at_step "$id3" $((step + 2)) || fail "alice's job $id3 stopped running after bob's attempts: $("$CTL" status "$id3")"
[ "$("$CTL" jobs --json | jget "[j['owner'] for j in d['jobs'] if j['id'] == $id3][0]")" = "$A" ] || fail "jobs --json lacks the owner"
as "$A" "$CTL" logs "$id3" >/dev/null || fail "alice cannot read her own job's logs"
"$CTL" cancel "$id3" >/dev/null || fail "root (an admin) cannot cancel alice's job"
wait_for 10 is_state "$id3" cancelled || fail "job $id3 is $(state_of "$id3") after root's cancel"

# ---- the cluster socket is open to every user's workers, but only an admin may run an agent on it
mkdir -m 0700 "$S/bagent" && chown "$B" "$S/bagent"
setpriv --reuid="$B" --regid="$(id -g "$B")" --init-groups "$BUILD/fsdpd" --foreground --state-dir "$S/bagent" \
  --join "ipc://$S/cluster.sock" --name "bob-$tag" --cpu-workers 1 --gpus none >>"$S/bagent.log" 2>&1 & BPID=$!
wait_for 15 grep -q "refused agent_register from $B: only root or the daemon's own user may run an agent" "$S/fsdpd.log" || fail "bob's agent was not refused: $(tail -3 "$S/bagent.log")"
! "$CTL" nodes | grep -q "bob-$tag" || fail "bob's agent registered as a node"
stop_pid "$BPID"; BPID=""
stop_daemon

# ---- over tcp:// (CURVE) the key names the user, whoever runs fsdpctl: KEY user=NAME in authorized
read -r CPORT < <(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -m 0700 "$S/keys"
for k in ka kb kn k1 k2 k3 k4 k5 k6; do "$CTL" keygen "$S/$k.key" > "$S/$k.pub"; done
# Keys fail closed: bob's keys on lines that are not exactly KEY user=NAME or KEY admin (a bare key,
# User=, user = x, a note before user=, #user=) and in the tail of a comment longer than 512 bytes
# are each refused, never admitted as an admin; each malformed line is logged with its file:line.
long="#$(printf 'x%.0s' $(seq 510))$(cat "$S/k6.pub") admin"
{ echo "$(cat "$S/ka.pub") user=$A  alice's laptop"; echo "$(cat "$S/kb.pub") user=$B"
  echo "$(cat "$S/kn.pub") user=nosuch$tag"; echo "$(cat "$S/k1.pub")"; echo "$(cat "$S/k2.pub") User=$B"
  echo "$(cat "$S/k3.pub") user = $B"; echo "$(cat "$S/k4.pub") bob's user=$B"; echo "$(cat "$S/k5.pub") #user=$B"
  echo "$long"; } > "$S/keys/authorized"
start_daemon --ctl "tcp://127.0.0.1:$CPORT"
tcp() { local key=$1; shift; env FSDP_CTL="tcp://127.0.0.1:$CPORT" FSDP_SERVER_KEY="$S/keys/server.pub" FSDP_CLIENT_KEY="$S/$key.key" "$CTL" "$@"; }
wait_for 10 tcp ka nodes || fail "fsdpd did not answer over tcp:// within 10 s"
job grp2 "$S/group.bin" 10 ck2
id5=$(tcp ka submit "$S/a/grp2.ini" | tail -1)
tcp_done() { case "$(tcp ka status "$1" --json | jget 'd["state"]')" in succeeded|failed|cancelled) return 0;; esac; return 1; }
wait_for 60 tcp_done "$id5" || fail "job $id5 did not end within 60 s"
[ "$(tcp ka status "$id5" --json | jget 'd["state"] + " " + d["owner"]')" = "succeeded $A" ] || fail "job $id5 of key ka: $(tcp ka status "$id5")"
for f in $(find "$S/a/ck2" -type f); do [ "$(stat -c %U "$f")" = "$A" ] || fail "$f (a job of alice's key) is owned by $(stat -c %U "$f")"; done
set +e; out=$(tcp kb cancel "$id5" 2>&1); rc=$?; set -e
[ $rc -eq 1 ] && [ "$out" = "fsdpctl: job $id5 belongs to $A; only its owner or an admin may cancel it" ] || fail "bob's key cancelling: exit $rc: $out"
set +e; out=$(tcp kn jobs 2>&1); rc=$?; set -e
[ $rc -eq 1 ] && grep -q "acts as user 'nosuch$tag', who does not exist" <<<"$out" || fail "a key of an unknown user: exit $rc: $out"
for k in k1 k2 k3 k4 k5 k6; do
  set +e; out=$(tcp $k shutdown 2>&1); rc=$?; set -e
  [ $rc -eq 1 ] && grep -q "rejected this client's CURVE key" <<<"$out" || fail "key $k of a malformed line: exit $rc: $out"
done
tcp ka nodes >/dev/null || fail "a refused key shut the daemon down"
for l in 4 5 6 7 8; do
  grep -q "$S/keys/authorized:$l " "$S/fsdpd.log" || fail "malformed line $l of authorized is not logged: $(grep authorized "$S/fsdpd.log" | tail -3)"
done
grep -q "authorized:4 names no user: add user=NAME" "$S/fsdpd.log" || fail "a bare key's line does not say to add user=NAME or admin"
stop_daemon

# ---- a daemon of an ordinary user: its own jobs run as before; root's are refused with one line
mkdir -m 0700 "$S/bstate" && chown "$B" "$S/bstate"
setpriv --reuid="$B" --regid="$(id -g "$B")" --init-groups "$BUILD/fsdpd" --foreground --state-dir "$S/bstate" \
  --cpu-workers 2 --gpus none >>"$S/bstate.log" 2>&1 & BPID=$!
FAIL_LOGS+=("$S/bstate.log")
export FSDP_CTL="ipc://$S/bstate/ctl.sock"
wait_for 10 as "$B" "$CTL" nodes || fail "bob's fsdpd did not answer within 10 s"
sed -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' "$SRC/examples/tiny.ini" > "$S/bjob.ini"
chmod 0644 "$S/bjob.ini"
id4=$(as "$B" "$CTL" submit "$S/bjob.ini" | tail -1)
bob_state() { as "$B" "$CTL" status "$1" --json | jget 'd["state"]'; }
bob_done() { [ "$(bob_state "$1")" = succeeded ]; }
wait_for 60 bob_done "$id4" || fail "bob's job $id4 on bob's daemon: $(as "$B" "$CTL" status "$id4")"
[ "$(as "$B" "$CTL" status "$id4" --json | jget 'd["owner"]')" = "$B" ] || fail "bob's job is not bob's"
set +e; out=$("$CTL" submit "$S/bjob.ini" 2>&1); rc=$?; set -e
[ $rc -eq 1 ] && [ "$out" = "fsdpctl: fsdpd runs as $B and can run jobs only as $B, not as root (run fsdpd as root to take every user's jobs)" ] ||
  fail "root's submit to bob's daemon: exit $rc: $out"
echo "trust_users: ok"
