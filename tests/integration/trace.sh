#!/usr/bin/env bash
# trace — fsdpctl trace on a running 2-rank CPU job: the file is trace-event JSON (python3's json),
# with one process per rank and the lanes host, compute stream and comm as threads; on both ranks
# every step asked for has a span for the all-gather, forward, backward and reduce-scatter of every
# unit, the loss, the optimizer and the step (host and stream); spans nest properly on every thread
# (no partial overlap), every stream span lies inside its step, and each unit's forward starts only
# after its all-gather ended (spans are taken when the work runs, not when it is issued). The
# default range is the last 3 steps started. One-line errors: unknown job, bad --steps, A > B, a
# range past the steps started, a stopped rank (after the coordinator's 25 s), a queued job, a
# finished job, workers that record no spans (FSDP_TRACE=0).
# Usage: bash trace.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" trace

# one_line_err WHAT STATUS EXPECT CMD...: CMD exits with STATUS and its first stderr line has EXPECT
# (a usage error adds the usage line after it; any other failure is exactly one line).
one_line_err() {
  local what=$1 want=$2 expect=$3; shift 3
  local rc=0; "$@" >"$S/err.out" 2>"$S/err.txt" || rc=$?
  [ "$rc" = "$want" ] || fail "$what: exit status $rc, expected $want: $(cat "$S/err.txt")"
  head -1 "$S/err.txt" | grep -q -- "$expect" || fail "$what: expected '$expect', got: $(cat "$S/err.txt")"
  [ "$want" = 2 ] || [ "$(wc -l <"$S/err.txt")" = 1 ] || fail "$what: more than one line: $(cat "$S/err.txt")"
}

start_daemon
wait_for 20 "$CTL" nodes || fail "the daemon did not answer within 20 s"
sed -e 's/^steps = .*/steps = 100000/' -e 's/^name = .*/name = traced/' "$SRC/tests/integration/jobs/ctl_small.ini" >"$S/job.ini"
one_line_err "unknown job" 1 "no job 999" "$CTL" trace 999 -o "$S/x.json"
one_line_err "bad --steps" 2 "--steps 'x': give A..B" "$CTL" trace 1 --steps x -o "$S/x.json"
one_line_err "A > B" 2 "--steps '5..3'" "$CTL" trace 1 --steps 5..3 -o "$S/x.json"
one_line_err "no -o" 2 "-o TRACE.json is required" "$CTL" trace 1
id=$("$CTL" submit "$S/job.ini" | tail -1)
queued=$("$CTL" submit "$S/job.ini" | tail -1)   # waits for the slots the first one holds
is_state "$queued" queued || fail "job $queued is $(state_of "$queued"), expected queued"
one_line_err "queued job" 1 "has run no step yet" "$CTL" trace "$queued" -o "$S/x.json"
wait_for 120 at_step "$id" 6 || fail "job $id did not reach step 6 within 120 s: $("$CTL" status "$id")"

"$CTL" trace "$id" --steps 3..5 -o "$S/t.json" >"$S/trace.out" || fail "trace $id failed"
grep -q "steps 3..5 from 2 ranks" "$S/trace.out" || fail "trace said: $(cat "$S/trace.out")"
python3 - "$S/t.json" 3 5 <<'PY' || fail "the trace of steps 3..5 is wrong (above)"
import json, sys, collections
doc = json.load(open(sys.argv[1]))
first, last = int(sys.argv[2]), int(sys.argv[3])
ev = doc["traceEvents"]
units = ["root", "h.0", "h.1"]   # ctl_small: 2 blocks
procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
assert procs == {0: "rank 0", 1: "rank 1"}, procs
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
assert set(threads.values()) == {"host", "compute stream", "comm"}, threads
spans = [e for e in ev if e["ph"] == "X"]
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
lane = {"allgather": "comm", "reducescatter": "comm", "allreduce": "comm", "forward": "compute stream",
        "backward": "compute stream", "loss": "compute stream", "optimizer": "compute stream"}
for rank in (0, 1):
    mine = [e for e in spans if e["pid"] == rank]
    assert {e["args"]["step"] for e in mine} == set(range(first, last + 1)), sorted({e["args"]["step"] for e in mine})
    for step in range(first, last + 1):
        names = collections.Counter(e["name"] for e in mine if e["args"]["step"] == step)
        for u in units:
            for k in ("allgather", "forward", "backward", "reducescatter"):
                assert names[k + " " + u] >= 1, (rank, step, k, u, names)
        assert names["optimizer"] == 1 and names["loss root"] == 1, (rank, step, names)
        assert names["step %d" % step] == 2, (rank, step, names)   # the host's and the stream's
        for u in units[1:]:   # sharding full: blocks are gathered for the forward and again for the backward
            assert names["allgather " + u] == 2, (rank, step, u, names)
        # each unit's forward starts after its (first) all-gather ended
        for u in units:
            ag = min((e for e in mine if e["args"]["step"] == step and e["name"] == "allgather " + u), key=lambda e: e["ts"])
            fw = [e for e in mine if e["args"]["step"] == step and e["name"] == "forward " + u][0]
            assert fw["ts"] >= ag["ts"] + ag["dur"], (rank, step, u, ag, fw)
    for e in mine:
        kind = e["cat"]
        if kind in lane: assert threads[(rank, e["tid"])] == lane[kind], e
    # proper nesting on every thread: a span starts after its parent's start and ends before its end
    by_thread = collections.defaultdict(list)
    for e in mine: by_thread[e["tid"]].append(e)
    for tid, es in by_thread.items():
        es.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in es:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
                stack.pop()
            if stack:
                p = stack[-1]
                assert e["ts"] + e["dur"] <= p["ts"] + p["dur"], ("partial overlap", threads[(rank, tid)], p, e)
                assert p["args"]["step"] == e["args"]["step"], ("nested across steps", p, e)
            stack.append(e)
        if threads[(rank, tid)] == "compute stream":   # every stream span inside its step
            steps = {e["args"]["step"]: e for e in es if e["cat"] == "step"}
            for e in es:
                s = steps[e["args"]["step"]]
                assert s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"], ("outside its step", s, e)
print("trace ok: %d spans" % len(spans))
PY

# default: the last 3 steps started
"$CTL" trace "$id" -o "$S/default.json" >/dev/null || fail "trace $id (default steps) failed"
python3 - "$S/default.json" <<'PY' || fail "the default range is not 3 steps"
import json, sys
d = json.load(open(sys.argv[1]))
a, b = map(int, d["otherData"]["steps"].split(".."))
assert b - a == 2 and a >= 1, (a, b)
assert {e["args"]["step"] for e in d["traceEvents"] if e["ph"] == "X"} == set(range(a, b + 1))
PY
one_line_err "past the steps started" 1 "has started steps up to" "$CTL" trace "$id" --steps 1..99999 -o "$S/x.json"
# A rank that cannot answer (stopped): the pull ends after the coordinator's 25 s, naming it,
# before fsdpctl's own 30 s; the job carries on once the rank does.
signal_rank STOP "$id" 1
one_line_err "a stopped rank" 1 "did not answer within 25 s" "$CTL" trace "$id" -o "$S/x.json"
grep -q "rank(s).* 1 of job $id" "$S/err.txt" || fail "the stopped rank is not named: $(cat "$S/err.txt")"
signal_rank CONT "$id" 1
step=$("$CTL" status "$id" --json | jget 'd["step"]')
wait_for 120 at_step "$id" $((step + 2)) || fail "job $id did not go on after the stopped rank resumed"
"$CTL" cancel "$queued" >/dev/null
"$CTL" cancel "$id" >/dev/null
wait_for 60 finished "$id" || fail "job $id did not end after cancel"
one_line_err "finished job" 1 "only while it runs" "$CTL" trace "$id" -o "$S/x.json"
[ -n "${FSDP_TRACE_KEEP:-}" ] && cp "$S/t.json" "$FSDP_TRACE_KEEP"
stop_daemon

# Workers without recording (FSDP_TRACE=0, inherited from the daemon): the pull says so.
FSDP_TRACE=0 start_daemon
wait_for 20 "$CTL" nodes || fail "the daemon did not answer within 20 s (second start)"
quiet=$("$CTL" submit "$S/job.ini" | tail -1)
wait_for 120 at_step "$quiet" 2 || fail "job $quiet did not reach step 2 within 120 s: $("$CTL" status "$quiet")"
one_line_err "FSDP_TRACE=0" 1 "rank 0 holds no spans (FSDP_TRACE=0" "$CTL" trace "$quiet" -o "$S/x.json"
"$CTL" cancel "$quiet" >/dev/null
stop_daemon
echo "trace: ok"
