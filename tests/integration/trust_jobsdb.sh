#!/usr/bin/env bash
# trust_jobsdb — a root fsdpd never gives a job id or a job folder twice (docs/operations.md, "The
# job database"). As root it creates two unprivileged users, alice and carol (removed on exit), runs
# alice's job, stops the daemon, and plays:
#   - jobs.db removed while jobs/ is kept: fsdpd exits 1 with one line naming the file and the
#     remedy, and starts nothing (before, ids restarted at 1 and carol's job 1 appended to alice's
#     job.log, which carol could then read, and truncated her metrics.jsonl);
#   - jobs.db with a damaged page: the same, one line;
#   - the database back, but a newer folder of alice's (jobs/N+1, whose row a crash lost) beside it:
#     carol's next job gets an id above it, and alice's files in every folder are unchanged (sha256).
# Without root (or without useradd and setpriv) it exits 77: skipped.
# Usage: bash trust_jobsdb.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "trust_jobsdb: skipped: needs root to create its users"; exit 77; }
for t in useradd userdel setpriv; do
  command -v "$t" >/dev/null || { echo "trust_jobsdb: skipped: no $t (scripts/install-deps.sh test)"; exit 77; }
done
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" trustdb
chmod 0755 "$S"
tag=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
A="fsdpa$tag" C="fsdpc$tag"
drop_users() {
  [ -z "$DPID" ] || kill -KILL "$DPID" 2>/dev/null || true
  userdel -f "$A" 2>/dev/null; userdel -f "$C" 2>/dev/null
  true
}
at_exit drop_users
useradd -M -U -s /usr/sbin/nologin "$A"
useradd -M -U -s /usr/sbin/nologin "$C"
as() { local u=$1; shift; setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups env FSDP_CTL="$FSDP_CTL" "$@"; }
mkdir -m 0755 "$S/u"
for u in "$A" "$C"; do
  sed -e "s/^name = .*/name = $u/" -e 's/^steps = .*/steps = 3/' -e 's/^warmup_steps = .*/warmup_steps = 1/' \
    "$SRC/examples/tiny.ini" > "$S/u/$u.ini"
  chown "$u" "$S/u/$u.ini"
done
state() { "$CTL" status "$1" --json | jget 'd["state"]'; }
done_ok() { [ "$(state "$1")" = succeeded ]; }
# refused WHAT TEXT: fsdpd on S exits 1 with one line holding TEXT, and changes no job folder.
refused() {
  local before; before=$(cd "$S" && find jobs -type f -exec sha256sum {} + | sort)
  set +e; timeout 20 "$BUILD/fsdpd" --foreground --state-dir "$S" --cpu-workers 1 --gpus none >"$S/run.out" 2>&1; local rc=$?; set -e
  [ "$rc" = 1 ] || fail "$1: fsdpd exited $rc, expected 1 (0 or 124: it started): $(head -3 "$S/run.out")"
  [ "$(wc -l <"$S/run.out")" = 1 ] || fail "$1: fsdpd said more than one line: $(cat "$S/run.out")"
  grep -qF -- "$2" "$S/run.out" || fail "$1: fsdpd said: $(cat "$S/run.out"); expected: $2"
  [ "$(cd "$S" && find jobs -type f -exec sha256sum {} + | sort)" = "$before" ] || fail "$1: a job folder changed"
}

start_daemon
wait_for 10 "$CTL" nodes || fail "fsdpd did not answer within 10 s"
id1=$(as "$A" "$CTL" submit "$S/u/$A.ini" | tail -1)
wait_for 60 done_ok "$id1" || fail "alice's job $id1: $("$CTL" status "$id1")"
stop_daemon
[ -s "$S/jobs/$id1/job.log" ] && [ -s "$S/jobs/$id1/metrics.jsonl" ] || fail "alice's job $id1 left no job.log or metrics.jsonl"
cp "$S/jobs.db" "$S/jobs.db.good"   # a clean stop folded the write-ahead log into it

# ---- the database removed, jobs/ kept
rm -f "$S/jobs.db" "$S/jobs.db-wal" "$S/jobs.db-shm"
refused "a removed jobs.db" "the job database $S/jobs.db is missing, but $S/jobs holds 1 job folders (the newest $id1)"
grep -qF "restore the database from a backup, or move $S/jobs aside" "$S/run.out" || fail "no remedy: $(cat "$S/run.out")"
[ ! -e "$S/jobs.db" ] || fail "the refused start created a new jobs.db"

# ---- a damaged page (the jobs table's): refused at open, one line
cp "$S/jobs.db.good" "$S/jobs.db"
python3 - "$S/jobs.db" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(4096)                       # page 2: after the schema's page
    f.write(bytes((i * 131 + 7) % 256 for i in range(4096)))
PY
refused "a damaged jobs.db" "job database $S/jobs.db is damaged"
grep -qF "restore it from a backup" "$S/run.out" || fail "no remedy: $(cat "$S/run.out")"

# ---- a folder newer than every row (its row lost in a crash): never reused
cp "$S/jobs.db.good" "$S/jobs.db"
lost=$((id1 + 1))
mkdir -m 0755 "$S/jobs/$lost" && echo "alice's lost job" > "$S/jobs/$lost/job.log" && echo '{"step":1}' > "$S/jobs/$lost/metrics.jsonl"
sums() { (cd "$S/jobs" && sha256sum "$id1"/job.log "$id1"/metrics.jsonl "$lost"/job.log "$lost"/metrics.jsonl); }
sums > "$S/sums.before"
start_daemon
wait_for 10 "$CTL" nodes || fail "fsdpd did not start on its good database: $(tail -3 "$S/fsdpd.log")"
id2=$(as "$C" "$CTL" submit "$S/u/$C.ini" | tail -1)
[ "$id2" -gt "$lost" ] || fail "carol's job got id $id2; jobs/$lost exists"
wait_for 60 done_ok "$id2" || fail "carol's job $id2: $("$CTL" status "$id2")"
sums | cmp -s - "$S/sums.before" || fail "alice's job files changed"
set +e; out=$(as "$C" "$CTL" logs "$id1" 2>&1); rc=$?; set -e
[ $rc -eq 1 ] && ! grep -q "queued: $A" <<<"$out" || fail "carol read alice's job log: exit $rc: $out"
stop_daemon
echo "trust_jobsdb: ok"
