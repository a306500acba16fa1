#!/usr/bin/env bash
# trust_files — links that another user plants for a root fsdpd, fsdpd's workers or fsdpctl
# (docs/operations.md, "Files and links"). Each is refused with one line or not followed, and the
# root-only file or directory it points to is unchanged (sha256 of every file before and after):
#  1. a checkpoint directory that the other user can write, with links planted as an older
#     step-00000001 and as step-00000004/rank-0.bin.tmp and manifest.json.tmp: the job succeeds,
#     pruning removes the step link as a link; a link planted as the step directory that a
#     checkpoint is about to use fails the job with one line;
#  2. fsdpctl export of the checkpoint in the other user's step directory: refused (run as root it
#     reads only root's files); of root's copy into a directory the other user can write, with links planted as
#     config.json.tmp, model.safetensors and model.safetensors.tmp (and fsdpctl plot's image and
#     its temporary); an output path through their link;
#  3. the state directory: owned by the other user, world-writable, under a world-writable
#     directory, with a planted fsdpd.log or jobs link, with keys/authorized writable by others or
#     owned by the other user: fsdpd exits 1 with one line (path, whose, mode) and writes nothing;
#     under umask 000 a good one gets sockets that only root can use.
# Needs root: it creates (and removes) its own unprivileged user; skipped (77) otherwise.
# Usage: bash trust_files.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
if [ "$(id -u)" != 0 ]; then echo "trust_files: skipped: needs root to create a second user"; exit 77; fi
source "$(dirname "$0")/lib/common.sh" "$1" "$2" trust
FAIL_LOGS=("$S/run.out")
U="fsdpt$$"
useradd -M -N -r -s /usr/sbin/nologin "$U" || fail "useradd $U failed"
at_exit "userdel '$U' 2>/dev/null"
as_u() { runuser -u "$U" -- "$@"; }
chmod 711 "$S"   # the other user may pass through, not list or write

# Root's file and directory that the links point to.
head -c 100000 /dev/urandom >"$S/victim"
chmod 600 "$S/victim"
mkdir -m 700 "$S/vdir"
for f in a b c; do head -c 5000 /dev/urandom >"$S/vdir/$f"; done
sums() { (cd "$S" && sha256sum victim vdir/* && ls -A vdir); }
sums >"$S/sums.before"
unchanged() { sums | cmp -s - "$S/sums.before" || fail "$1: root's victim file or directory changed"; }

# ---- 1. checkpoints
JOB="$SRC/tests/integration/jobs/ctl_small.ini"
job() {   # job STEPS CKPT_DIR
  sed -e "s/^steps = .*/steps = $1/" "$JOB"
  printf '[checkpoint]\ndir = %s\nevery = 2\nkeep = 1\n' "$2"
}
run() { env -u FSDP_CTL timeout 120 "$CTL" run "$@" >"$S/run.out" 2>&1; }
mkdir "$S/ck" && chmod 777 "$S/ck"
as_u ln -s "$S/vdir" "$S/ck/step-00000001"
as_u mkdir "$S/ck/step-00000004"
as_u ln -s "$S/victim" "$S/ck/step-00000004/rank-0.bin.tmp"
as_u ln -s "$S/victim" "$S/ck/step-00000004/manifest.json.tmp"
job 4 "$S/ck" >"$S/ck.ini"
run "$S/ck.ini" --state-dir "$S/r1" || fail "the job with planted checkpoint links failed: $(tail -3 "$S/run.out")"
unchanged "checkpoint temporaries and pruning"
[ "$(ls -A "$S/ck")" = "step-00000004" ] || fail "checkpoint directory holds $(ls -A "$S/ck" | tr '\n' ' '), expected step-00000004 only (step-00000001's link removed, step 2 pruned)"
[ "$(ls -A "$S/ck/step-00000004" | tr '\n' ' ')" = "manifest.json rank-0.bin rank-1.bin " ] \
  || fail "step-00000004 holds $(ls -A "$S/ck/step-00000004" | tr '\n' ' ')"
for f in manifest.json rank-0.bin rank-1.bin; do
  [ -f "$S/ck/step-00000004/$f" ] && [ ! -L "$S/ck/step-00000004/$f" ] || fail "step-00000004/$f is not a regular file"
done

mkdir "$S/ck2" && chmod 777 "$S/ck2"
as_u ln -s "$S/vdir" "$S/ck2/step-00000002"
job 2 "$S/ck2" >"$S/ck2.ini"
if run "$S/ck2.ini" --state-dir "$S/r2"; then fail "a job whose step directory is a planted link succeeded"; fi
grep -q "$S/ck2/step-00000002 is not a directory of this checkpoint (a link or another file); refusing it" "$S/run.out" \
  || fail "the job's failure does not name the link: $(tail -3 "$S/run.out")"
unchanged "a planted step directory"

# ---- 2. fsdpctl export
# The checkpoint above is in the other user's step directory: root's export refuses it in one line
# (run as root, fsdpctl reads only what root alone owns); root's own copy of it is exported.
if "$CTL" export "$S/ck" -o "$S/refused.safetensors" >"$S/run.out" 2>&1; then fail "root exported a checkpoint in $U's directory"; fi
[ "$(wc -l <"$S/run.out")" = 1 ] && grep -q "^fsdpctl export: $S/ck/step-00000004 is owned by $U" "$S/run.out" \
  || fail "export of $U's checkpoint directory: $(cat "$S/run.out")"
[ ! -e "$S/refused.safetensors" ] || fail "the refused export wrote its file"
mkdir -m 755 "$S/ckp" && cp -r "$S/ck/step-00000004" "$S/ckp/"
mkdir "$S/out" && chmod 777 "$S/out"
for f in config.json.tmp model.safetensors model.safetensors.tmp; do as_u ln -s "$S/victim" "$S/out/$f"; done
"$CTL" export "$S/ckp" -o "$S/out/model.safetensors" >"$S/run.out" 2>&1 || fail "export with planted links failed: $(cat "$S/run.out")"
unchanged "export temporaries"
for f in model.safetensors config.json; do
  [ -f "$S/out/$f" ] && [ ! -L "$S/out/$f" ] || fail "export: $f is not a regular file"
done
[ ! -e "$S/out/config.json.tmp" ] && [ ! -e "$S/out/model.safetensors.tmp" ] || fail "export left a temporary"
for f in plot.png plot.png.tmp; do as_u ln -s "$S/victim" "$S/out/$f"; done   # fsdpctl plot's image too
"$CTL" plot "$S/r1/jobs/1/metrics.jsonl" -o "$S/out/plot.png" >"$S/run.out" 2>&1 || fail "plot with planted links failed"
[ -f "$S/out/plot.png" ] && [ ! -L "$S/out/plot.png" ] && [ ! -e "$S/out/plot.png.tmp" ] || fail "plot: plot.png is not a regular file"
unchanged "plot temporaries"
as_u ln -s "$S/vdir" "$S/out/sub"
if "$CTL" export "$S/ckp" -o "$S/out/sub/model.safetensors" >"$S/run.out" 2>&1; then fail "export through a planted link succeeded"; fi
[ "$(wc -l <"$S/run.out")" = 1 ] && grep -q "^fsdpctl export: $S/out/sub is a symbolic link owned by $U" "$S/run.out" \
  || fail "export through a link: $(cat "$S/run.out")"
unchanged "export through a planted directory link"

# ---- 3. the state directory
# refused DIR TEXT: fsdpd exits 1 with one line holding TEXT, and creates nothing in DIR.
refused() {
  local before; before=$(ls -A "$1")
  set +e; timeout 10 "$BUILD/fsdpd" --state-dir "$1" --cpu-workers 1 --gpus none >"$S/run.out" 2>&1; local rc=$?; set -e
  [ "$rc" = 1 ] || fail "fsdpd on $1 exited $rc, expected 1 (0: it started; 124: it kept running)"
  [ "$(wc -l <"$S/run.out")" = 1 ] || fail "fsdpd said more than one line"
  grep -qF -- "fsdpd: refusing the state directory: $2" "$S/run.out" || fail "fsdpd on $1 said: $(cat "$S/run.out"); expected: $2"
  [ "$(ls -A "$1")" = "$before" ] || fail "fsdpd created files in the refused $1"
}
uid=$(id -u "$U")
mkdir -m 700 "$S/st1" && chown "$U" "$S/st1"
refused "$S/st1" "$S/st1 is owned by $U (uid $uid) with mode 0700"
mkdir "$S/st2" && chmod 777 "$S/st2"
refused "$S/st2" "$S/st2 is owned by root (uid 0) with mode 0777"
mkdir "$S/pub" && chmod 777 "$S/pub" && mkdir -m 700 "$S/pub/st"
refused "$S/pub/st" "$S/pub, above $S/pub/st, is owned by root (uid 0) with mode 0777"
mkdir -m 700 "$S/st4" && ln -s "$S/victim" "$S/st4/fsdpd.log" && chown -h "$U" "$S/st4/fsdpd.log"
refused "$S/st4" "$S/st4/fsdpd.log is a symbolic link (owned by uid $uid)"
mkdir -m 700 "$S/st5" && ln -s "$S/vdir" "$S/st5/jobs"
refused "$S/st5" "$S/st5/jobs is a symbolic link (owned by uid 0)"
mkdir -m 700 "$S/st6" "$S/st6/keys" && touch "$S/st6/keys/authorized" && chmod 666 "$S/st6/keys/authorized"
refused "$S/st6" "$S/st6/keys/authorized is owned by root (uid 0) with mode 0666"
mkdir -m 700 "$S/st7" "$S/st7/keys" && touch "$S/st7/keys/authorized" && chown "$U" "$S/st7/keys/authorized"
refused "$S/st7" "$S/st7/keys/authorized is owned by $U (uid $uid) with mode 0644"
unchanged "state directories"

# A good one, started under umask 000: the daemon's own umask keeps its sockets and files private.
(umask 000; exec "$BUILD/fsdpd" --foreground --state-dir "$S/st8" --cpu-workers 1 --gpus none >"$S/run.out" 2>&1) & DPID=$!
at_exit 'stop_pid "$DPID"'
export FSDP_CTL="ipc://$S/st8/ctl.sock"
wait_for 10 "$CTL" nodes || fail "fsdpd on a fresh state directory did not answer"
# As root fsdpd serves every local user (jobs run as their submitter, known by SO_PEERCRED): the
# directory is passable (0711) and the sockets open to all (0666); nothing in it readable or
# writable by others otherwise.
for f in st8 st8/ctl.sock st8/cluster.sock st8/jobs.db st8/jobs st8/fsdpd.log; do
  [ -e "$S/$f" ] || continue
  m=$(stat -c %a "$S/$f")
  allowed=8#000
  case "$f" in st8) allowed=8#011;; st8/*.sock) allowed=8#066;; esac
  [ $((8#$m & 8#077 & ~allowed)) = 0 ] || fail "$f has mode $m under umask 000; expected no group or other bits beyond $(printf %03o $((allowed)))"
done
echo "trust_files: ok"
