#!/usr/bin/env bash
# trust_export — a root fsdpd and a root fsdpctl never read or write for a user what that user could
# not (docs/operations.md, "Trust model"; docs/cli.md, "Run as root"). As root it creates one
# unprivileged user of its own (removed on exit), gives root a secret file and a private (0700)
# folder of config and tokenizer files, and plays:
#   1. jobs of the user's whose model folder links to root's file (`from` with model.safetensors or
#      model.safetensors.index.json linked to it; an `init` index whose shard is such a link): each
#      submit is refused by the daemon with one line naming the path, none carrying the file's size
#      or content;
#   2. the user's checkpoint whose manifest `source` the user pointed at root's private folder, and a
#      --tokenizer folder of the user's whose tokenizer_config.json links to root's file: root's
#      export of either is refused with one line and leaves no folder; the user's own export of the
#      checkpoint copies nothing of root's either;
#   3. an export of root's that fails (an unusable tokenizer) leaves no partial folder;
#   4. root's gen-data on a text file that is the user's link to root's file: refused, no output;
#   5. a ~10 s loop swapping the user's directory that root exports into for a link to root's
#      private folder, root exporting into it all the while: every export succeeds or is refused in
#      one line, and root's folder is unchanged.
# After each: root's files are unchanged (sha256 and listing) and no message or output holds their
# content. Needs root, useradd, setpriv and python3; skipped (77) otherwise.
# Usage: bash trust_export.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "trust_export: skipped: needs root to create its user"; exit 77; }
for t in useradd userdel setpriv python3; do
  command -v "$t" >/dev/null || { echo "trust_export: skipped: no $t (scripts/install-deps.sh test)"; exit 77; }
done
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" trustx
FAIL_LOGS=("$S/fsdpd.log" "$S/out.txt")
chmod 0711 "$S"   # the user may pass through, not list or write

tag=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
U="fsdpx$tag"
drop_user() {
  stop_pid "$DPID"; DPID=""
  for p in $(pgrep -u "$U" 2>/dev/null || true); do kill -KILL "$p" 2>/dev/null || true; done
  userdel -f "$U" 2>/dev/null
  true
}
at_exit drop_user
useradd -M -U -s /usr/sbin/nologin "$U"
as_u() { setpriv --reuid="$U" --regid="$(id -g "$U")" --init-groups env FSDP_CTL="$FSDP_CTL" "$@"; }

# ---- root's secrets: a file and a private folder of config and tokenizer files
SECRET="TOPSECRET$tag"
printf '%s %s\n' "$SECRET" "$(head -c 3000 /dev/urandom | base64 -w0)" >"$S/victim"
chmod 600 "$S/victim"
mkdir -m 700 "$S/vdir"
printf '{"%s": 1, "model_type": "gpt2"}\n' "$SECRET" >"$S/vdir/config.json"
printf '{"model": {"type": "BPE", "vocab": {"%s": 0}, "merges": []}}\n' "$SECRET" >"$S/vdir/tokenizer.json"
printf '{"eos_token": "%s"}\n' "$SECRET" >"$S/vdir/tokenizer_config.json"
size=$(stat -c %s "$S/victim")
sums() { (cd "$S" && sha256sum victim vdir/* && ls -A vdir); }
sums >"$S/sums.before"
unchanged() { sums | cmp -s - "$S/sums.before" || fail "$1: root's secret file or folder changed: $(ls -A "$S/vdir")"; }
# clean WHAT TEXT: TEXT holds nothing of root's file: not its content (not even its first word, as
# a JSON parser's "near 'TOPSECRET'" quotes it), not its size
clean() { ! grep -qe TOPSECRET -e "$size" -e "$((size - 8))" <<<"$2" || fail "$1 leaks root's file: $2"; }
# no_secret WHAT DIR: no file under DIR holds root's secret
no_secret() { [ ! -e "$2" ] || ! grep -rqF TOPSECRET "$2" || fail "$1: $2 holds root's secret"; }
# refused_once WHAT RC TEXT: exit status 1 and one line
refused_once() {
  [ "$2" = 1 ] || fail "$1: exit $2, expected 1: $3"
  [ "$(printf '%s\n' "$3" | wc -l)" = 1 ] || fail "$1: expected one line, got: $3"
}

# ---- root's own model: a checkpoint and its Hugging Face folder
"$CTL" gen-data --markov 1 --vocab 64 --tokens 20000 -o "$S/tok.bin" >/dev/null || fail "gen-data failed"
job() {   # job NAME STEPS CKPT_DIR MODEL_LINES...: a small 2-rank job file on stdout
  local name=$1 steps=$2 ck=$3; shift 3
  printf '[job]\nname = %s\nsteps = %s\nseed = 1\n[model]\n' "$name" "$steps"
  printf '%s\n' "$@"
  printf '[data]\ntrain = %s\nbatch_size = 2\n[optim]\nwarmup_steps = 0\n' "$S/tok.bin"
  printf '[fsdp]\nworld_size = 2\ndevice = cpu\ntimeout_s = 60\n'
  [ -z "$ck" ] || printf '[checkpoint]\ndir = %s\nevery = %s\n' "$ck" "$steps"
}
MODEL=("arch = gpt2" "n_layer = 1" "n_head = 2" "n_embd = 16" "vocab_size = 64" "seq_len = 16")
job root 2 "$S/rck" "${MODEL[@]}" >"$S/root.ini"
env -u FSDP_CTL timeout 120 "$CTL" run "$S/root.ini" --state-dir "$S/r1" >"$S/out.txt" 2>&1 || fail "root's job failed"
"$CTL" export "$S/rck" -o "$S/hf" >"$S/out.txt" 2>&1 || fail "root's export failed"

mkdir -m 755 "$S/u" && chown "$U:$U" "$S/u"
start_daemon
wait_for 10 "$CTL" nodes || fail "fsdpd did not answer within 10 s"

# ---- 1. the daemon checks a job's weights as its owner: links to root's file are refused, quietly
as_u mkdir "$S/u/m1" "$S/u/m2" "$S/u/m3"
for m in m1 m2 m3; do as_u cp "$S/hf/config.json" "$S/u/$m/"; done
as_u ln -s "$S/victim" "$S/u/m1/model.safetensors"
as_u ln -s "$S/victim" "$S/u/m2/model.safetensors.index.json"
python3 - "$S/hf/model.safetensors" >"$S/idx.json" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    names = [k for k in json.loads(f.read(n)) if k != "__metadata__"]
print(json.dumps({"metadata": {}, "weight_map": {k: "part.safetensors" for k in names}}))
PY
as_u cp "$S/idx.json" "$S/u/m3/model.safetensors.index.json"
as_u ln -s "$S/victim" "$S/u/m3/part.safetensors"
submit_refused() {   # submit_refused WHAT JOBFILE PATH: the daemon refuses it in one line naming PATH
  local out rc=0
  out=$(cd "$S/u" && as_u "$CTL" submit "$2" 2>&1) || rc=$?
  refused_once "$1" "$rc" "$out"
  grep -qF "$3" <<<"$out" || fail "$1: the refusal does not name $3: $out"
  clean "$1" "$out"
  unchanged "$1"
}
n0=$(grep -c "submit refused" "$S/fsdpd.log" || true)
job m1 2 "" "from = $S/u/m1" | as_u tee "$S/u/m1.ini" >/dev/null
submit_refused "from = DIR, model.safetensors linked to root's file" m1.ini "$S/u/m1/model.safetensors"
job m2 2 "" "from = $S/u/m2" | as_u tee "$S/u/m2.ini" >/dev/null
submit_refused "from = DIR, the index linked to root's file" m2.ini "$S/u/m2/model.safetensors.index.json"
job m3 2 "" "${MODEL[@]}" "init = $S/u/m3/model.safetensors.index.json" | as_u tee "$S/u/m3.ini" >/dev/null
submit_refused "init = an index whose shard links to root's file" m3.ini "$S/u/m3/part.safetensors"
[ "$(grep -c "submit refused" "$S/fsdpd.log")" -ge $((n0 + 3)) ] || fail "the daemon did not refuse the three jobs itself"
! grep -qe TOPSECRET -e "bytes after the length" "$S/fsdpd.log" || fail "the daemon's log leaks root's file"

# ---- 2. the user's checkpoint, its manifest's source pointed at root's private folder
as_u cp -r "$S/hf" "$S/u/hf"
job uck 2 "$S/u/ck" "from = $S/u/hf" | as_u tee "$S/u/uck.ini" >/dev/null
id=$(cd "$S/u" && as_u "$CTL" submit uck.ini | tail -1)
wait_for 90 finished "$id" || fail "the user's job $id did not end within 90 s"
is_state "$id" succeeded || fail "the user's job $id: $("$CTL" status "$id")"
man="$S/u/ck/step-00000002/manifest.json"
grep -qF "\"source\"" "$man" || fail "the user's checkpoint names no source folder: $(cat "$man")"
python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); m["source"]=sys.argv[2]; print(json.dumps(m))' "$man" "$S/vdir" \
  >"$S/man.json"
as_u cp "$S/man.json" "$man"
rc=0; out=$("$CTL" export "$S/u/ck" -o "$S/rout1" 2>&1) || rc=$?
refused_once "root's export of the user's checkpoint" "$rc" "$out"
grep -q "is owned by $U .*as root, fsdpctl reads only what root alone owns" <<<"$out" || fail "root's export of the user's checkpoint: $out"
[ ! -e "$S/rout1" ] || fail "root's refused export left $S/rout1"
clean "root's export of the user's checkpoint" "$out"
rc=0; out=$(as_u "$CTL" export "$S/u/ck" -o "$S/u/out1" 2>&1) || rc=$?
clean "the user's export of their checkpoint" "$out"
no_secret "the user's export of their checkpoint" "$S/u/out1"
[ "$rc" = 0 ] || [ ! -e "$S/u/out1" ] || fail "the user's failed export left $S/u/out1"
unchanged "a checkpoint's source"

# ... and a --tokenizer folder of the user's, its tokenizer_config.json a link to root's file
as_u mkdir "$S/u/tok"
printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}\n' | as_u tee "$S/u/tok/tokenizer.json" >/dev/null
as_u ln -s "$S/victim" "$S/u/tok/tokenizer_config.json"
rc=0; out=$("$CTL" export "$S/rck" -o "$S/rout2" --tokenizer "$S/u/tok" 2>&1) || rc=$?
refused_once "root's export with the user's tokenizer folder" "$rc" "$out"
[ ! -e "$S/rout2" ] || fail "root's refused export with the user's tokenizer left $S/rout2"
clean "root's export with the user's tokenizer folder" "$out"
unchanged "an export's tokenizer"

# ---- 3. an export that fails leaves nothing of itself
mkdir "$S/badtok" && echo '{}' >"$S/badtok/tokenizer.json"
rc=0; out=$("$CTL" export "$S/rck" -o "$S/rout3" --tokenizer "$S/badtok" 2>&1) || rc=$?
refused_once "an export with an unusable tokenizer" "$rc" "$out"
[ ! -e "$S/rout3" ] || fail "a failed export left $S/rout3: $(ls -A "$S/rout3")"
mkdir "$S/rout4"   # an existing empty folder stays, empty
rc=0; out=$("$CTL" export "$S/rck" -o "$S/rout4" --tokenizer "$S/badtok" 2>&1) || rc=$?
[ "$rc" = 1 ] && [ -d "$S/rout4" ] && [ -z "$(ls -A "$S/rout4")" ] || fail "a failed export into an empty folder left: $(ls -A "$S/rout4")"

# ---- 4. root's gen-data reads no link of the user's
as_u ln -s "$S/victim" "$S/u/text.txt"
rc=0; out=$("$CTL" gen-data --text "$S/u/text.txt" -o "$S/rtok.bin" 2>&1) || rc=$?
refused_once "root's gen-data on the user's link" "$rc" "$out"
[ ! -e "$S/rtok.bin" ] || fail "root's gen-data on the user's link wrote $S/rtok.bin"
clean "root's gen-data on the user's link" "$out"
unchanged "gen-data's text"

# ---- 5. a directory swapped for a link to root's folder while root exports into it
as_u mkdir "$S/u/p" "$S/u/p/d"
cat >"$S/swap.py" <<'PY'
import os, sys, time
d, target, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
real, end, n = d + ".real", time.monotonic() + float(secs), 0
while time.monotonic() < end:
    try:
        os.rename(d, real)
        os.symlink(target, d)
        n += 1
        os.unlink(d)
        os.rename(real, d)
    except OSError:
        pass
if os.path.islink(d):
    os.unlink(d)
if os.path.isdir(real) and not os.path.exists(d):
    os.rename(real, d)
print(n)
PY
as_u python3 "$S/swap.py" "$S/u/p/d" "$S/vdir" 10 >"$S/swaps.txt" 2>&1 & SWAP=$!
at_exit 'stop_pid "$SWAP"'
ok=0 no=0 i=0
end=$((SECONDS + 10))
while [ $SECONDS -lt $end ]; do
  i=$((i + 1)); rc=0
  out=$("$CTL" export "$S/rck" -o "$S/u/p/d/out-$i" 2>&1) || rc=$?
  if [ "$rc" = 0 ]; then ok=$((ok + 1)); else refused_once "export $i during the swaps" "$rc" "$out"; no=$((no + 1)); fi
done
wait "$SWAP" || fail "the swapping loop failed: $(cat "$S/swaps.txt")"
SWAP=""
swaps=$(tail -1 "$S/swaps.txt")
[ "$swaps" -gt 0 ] && [ "$i" -gt 0 ] || fail "the race did not run: $swaps swaps, $i exports"
unchanged "the directory swap loop ($swaps swaps, $ok exports written, $no refused)"
echo "trust_export: ok ($swaps swaps during $i root exports: $ok written, $no refused)"
