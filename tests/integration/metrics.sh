#!/usr/bin/env bash
# metrics — fsdpd --metrics: bad values are refused with one line and status 2, a port in use with
# one clear line; during a 2-rank CPU job and after it, /metrics is valid Prometheus text
# (promtool check metrics), its loss and step equal metrics.jsonl's line of that step, the
# counters grow between scrapes, and the finished job stays visible with state succeeded.
# Usage: bash metrics.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" metrics

# Bad values: one line on stderr, status 2, nothing started.
for bad in "" "abc" ":0" "127.0.0.1:70000" "[::1]" "host:"; do
  rc=0; "$BUILD/fsdpd" --foreground --state-dir "$S/bad" --metrics "$bad" >"$S/bad.out" 2>&1 || rc=$?
  [ "$rc" = 2 ] || fail "--metrics '$bad': exit status $rc, expected 2: $(cat "$S/bad.out")"
  [ "$(wc -l <"$S/bad.out")" = 1 ] && grep -q -- "--metrics" "$S/bad.out" || fail "--metrics '$bad': not one line naming --metrics: $(cat "$S/bad.out")"
done

# A port already in use: held by a listener of our own, so the refusal is certain.
python3 - "$S/held.port" <<'PY' &
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
s.accept()   # holds the port until the test's cleanup kills it
PY
HOLDER=$!
at_exit 'kill $HOLDER 2>/dev/null || true'
wait_for 10 test -s "$S/held.port" || fail "the port holder did not start"
held=$(cat "$S/held.port")
rc=0; "$BUILD/fsdpd" --foreground --state-dir "$S/held" --metrics "127.0.0.1:$held" >"$S/held.out" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "fsdpd started on a port in use"
[ "$(wc -l <"$S/held.out")" = 1 ] && grep -q "already in use" "$S/held.out" || fail "port in use: $(cat "$S/held.out")"

# scrape FILE: GET /metrics into FILE (curl if installed, else python3's urllib).
scrape() {
  if command -v curl >/dev/null; then curl -sf --max-time 5 "http://127.0.0.1:$PORT/metrics" -o "$1"
  else python3 -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1], timeout=5).read())' "http://127.0.0.1:$PORT/metrics" "$1"; fi
}
# value FILE SERIES: the value of the exact series (name and labels as rendered), or nothing.
value() { awk -v s="$2" '$1 == s { print $2 }' "$1"; }
check_valid() {
  if [ -n "$PROMTOOL" ]; then "$PROMTOOL" check metrics <"$1" >"$S/promtool.out" 2>&1 || fail "promtool rejects $1: $(cat "$S/promtool.out")"; fi
}
PROMTOOL=$(command -v promtool || true)
[ -n "$PROMTOOL" ] || { echo "metrics: promtool is not installed (scripts/install-deps.sh --test installs prometheus)"; exit 1; }

start_daemon_metrics metricsnode
scrape "$S/idle.txt" || fail "no answer on http://127.0.0.1:$PORT/metrics"
node_free() { scrape "$S/idle.txt" && [ "$(value "$S/idle.txt" 'fsdp_node_devices{node="metricsnode",kind="cpu",state="free"}')" = 2 ]; }
wait_for 10 node_free || fail "fsdp_node_devices: $(grep fsdp_node "$S/idle.txt")"
[ "$(value "$S/idle.txt" 'fsdp_node_up{node="metricsnode"}')" = 1 ] || fail "fsdp_node_up: $(grep fsdp_node_up "$S/idle.txt")"
check_valid "$S/idle.txt"

# A job long enough to be scraped twice while it runs.
sed -e 's/^steps = .*/steps = 200/' -e 's/^warmup_steps = .*/warmup_steps = 2/' "$SRC/examples/tiny.ini" > "$S/tiny.ini"
id=$("$CTL" submit "$S/tiny.ini" | tail -1)
M="$S/jobs/$id/metrics.jsonl"
step_of() { value "$1" 'fsdp_job_step{job="'"$id"'",name="tiny"}'; }
scraped_step_at_least() { scrape "$S/cur.txt" && [ "$(step_of "$S/cur.txt")" ] && [ "$(step_of "$S/cur.txt")" -ge "$1" ]; }
wait_for 60 scraped_step_at_least 3 || fail "fsdp_job_step did not reach 3 within 60 s"
cp "$S/cur.txt" "$S/during1.txt"
s1=$(step_of "$S/during1.txt")
wait_for 60 scraped_step_at_least $((s1 + 2)) || fail "fsdp_job_step did not move past $s1"
cp "$S/cur.txt" "$S/during2.txt"
check_valid "$S/during1.txt"
check_valid "$S/during2.txt"
[ "$(value "$S/during2.txt" 'fsdp_job_state{job="'"$id"'",name="tiny",state="running"}')" = 1 ] || fail "job not running in the scrape during it"

# agree FILE: the scraped loss is metrics.jsonl's loss at the scraped step.
agree() {
  python3 - "$1" "$M" "$id" <<'PY' || fail "$1 disagrees with metrics.jsonl"
import json, sys
vals = {}
for l in open(sys.argv[1]):
    if not l.startswith("#") and l.strip():
        k, v = l.rsplit(" ", 1); vals[k] = float(v)
lab = '{job="%s",name="tiny"}' % sys.argv[3]
step, loss = int(vals["fsdp_job_step" + lab]), vals["fsdp_job_loss" + lab]
line = [json.loads(l) for l in open(sys.argv[2])][step - 1]
assert line["step"] == step, (line["step"], step)
assert abs(line["loss"] - loss) <= 1e-9 * abs(line["loss"]), ("loss", line["loss"], loss)
PY
}
agree "$S/during1.txt"
agree "$S/during2.txt"
# Every counter series present in both scrapes grows or stays; compute time, tokens and gathered bytes grow.
python3 - "$S/during1.txt" "$S/during2.txt" <<'PY' || fail "counters did not grow between the scrapes"
import sys
def load(p):
    types, vals = {}, {}
    for l in open(p):
        if l.startswith("# TYPE"): _, _, n, t = l.split(); types[n] = t
        elif l.strip() and not l.startswith("#"): k, v = l.rsplit(" ", 1); vals[k] = float(v)
    return types, vals
t, a = load(sys.argv[1]); _, b = load(sys.argv[2])
counters = [k for k in a if t.get(k.split("{")[0]) == "counter" and k in b]
for k in counters: assert b[k] >= a[k], (k, a[k], b[k])
for k in counters:
    # compute time, tokens and gathered bytes grow every step (a wait phase may be 0 when overlapped)
    if k.startswith("fsdp_job_tokens_total") or 'phase="compute"' in k or 'collective="allgather"' in k:
        assert b[k] > a[k], ("did not grow", k, a[k], b[k])
assert any(k.startswith("fsdp_rank_sent_bytes_total") for k in counters)
PY

wait_for 120 finished "$id" || fail "job $id did not finish within 120 s"
is_state "$id" succeeded || fail "job $id: $("$CTL" status "$id")"
# After the end: the final figures, state succeeded, while the job's record is freed and beyond.
done_scraped() { scrape "$S/after.txt" && [ "$(value "$S/after.txt" 'fsdp_job_state{job="'"$id"'",name="tiny",state="succeeded"}')" = 1 ]; }
wait_for 10 done_scraped || fail "the finished job is not shown as succeeded: $(grep fsdp_job_state "$S/after.txt")"
check_valid "$S/after.txt"
[ "$(step_of "$S/after.txt")" = 200 ] || fail "fsdp_job_step after the end: $(step_of "$S/after.txt"), expected 200"
agree "$S/after.txt"
# Once the drain frees the job (its workers reaped), the figures are still served.
no_busy() { scrape "$S/late.txt" && [ "$(value "$S/late.txt" 'fsdp_node_devices{node="metricsnode",kind="cpu",state="busy"}')" = 0 ]; }
wait_for 40 no_busy || fail "devices still busy after the job"
wait_for 40 free_slots 2 || fail "slots not freed"
scrape "$S/late.txt"
[ "$(step_of "$S/late.txt")" = 200 ] || fail "the finished job's figures are gone after its drain"
check_valid "$S/late.txt"
stop_daemon
echo "metrics: ok"
