#!/usr/bin/env bash
# Validation loss and samples through the daemon: [eval] every = 3 and at_start = true on a 2-rank
# job of 8 steps put val_loss (and eval_ms, apart from step_ms) into metrics.jsonl at steps 0 (a line
# of its own, before step 1: the base model's loss), 3 and 6 and nowhere else;
# fsdpctl status shows the latest one (from SQLite) in --json and in the human form; sample_every = 4
# logs a sample continuing sample_prompt to the job log at steps 4 and 8. (That the value is the
# forward-only loss of those windows: test_runtime.) every = 1 with the default 20 batches succeeds.
source "$(dirname "$0")/lib/daemon.sh" "$@" eval
start_daemon
wait_for 20 "$CTL" nodes || fail "the daemon did not answer within 20 s"
cat >"$S/job.ini" <<JOB
[job]
name = eval
steps = 8
seed = 4
[model]
n_layer = 2
n_head = 2
n_embd = 32
vocab_size = 128
seq_len = 16
[data]
train = synthetic:markov:5
val = synthetic:markov:6
batch_size = 2
[eval]
every = 3
at_start = true
batches = 2
sample_every = 4
sample_prompt = Once upon
[fsdp]
world_size = 2
timeout_s = 60
JOB
id=$("$CTL" submit "$S/job.ini" | tail -1)
wait_for 120 finished "$id" || fail "job $id did not finish within 120 s"
is_state "$id" succeeded || fail "job $id: $("$CTL" status "$id")"
python3 - "$S/jobs/$id/metrics.jsonl" <<'PY' || fail "metrics.jsonl: val_loss at the wrong steps"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["step"] for l in lines] == list(range(0, 9)), [l["step"] for l in lines]
assert set(lines[0]) == {"step", "val_loss", "eval_ms"}, lines[0]
have = [l["step"] for l in lines if "val_loss" in l]
assert have == [0, 3, 6], have
for l in lines:
    if "val_loss" in l:
        assert 0 < l["val_loss"] < 2 * math.log(128) and l["eval_ms"] > 0, l
print("val_loss at steps", have, [round(l["val_loss"], 4) for l in lines if "val_loss" in l])
PY
v6=$(python3 -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1])][6]['val_loss'])" "$S/jobs/$id/metrics.jsonl")
"$CTL" status "$id" --json | jget 'd["val_step"] == 6 and abs(d["val_loss"] - '"$v6"') < 1e-9' | grep -qx True ||
  fail "status --json does not carry step 6's val_loss $v6: $("$CTL" status "$id" --json)"
grep -q "val loss    .* (step 6)" <<<"$("$CTL" status "$id")" || fail "status lacks the val loss line: $("$CTL" status "$id")"
"$CTL" plot "$S/jobs/$id/metrics.jsonl" -o "$S/eval.png" > /dev/null && [ -s "$S/eval.png" ] ||
  fail "fsdpctl plot refuses a metrics.jsonl with a step-0 line"
for st in 4 8; do
  grep -q "sample at step $st: Once upon" "$S/jobs/$id/job.log" || fail "job.log has no sample of step $st: $(cat "$S/jobs/$id/job.log")"
done
[ "$(grep -c "sample at step" "$S/jobs/$id/job.log")" -eq 2 ] || fail "samples at other steps: $(cat "$S/jobs/$id/job.log")"

# a validation file of another vocabulary fails the job at its start, saying so
python3 - "$S/val200.bin" <<'PY'
import struct, sys
toks = [t % 200 for t in range(4000)]
h = [20240520, 1, len(toks)] + [0] * 253
open(sys.argv[1], "wb").write(struct.pack("<256i", *h) + struct.pack("<%dH" % len(toks), *toks))
PY
sed -e "s|^val = .*|val = $S/val200.bin|" -e 's/^steps = 8/steps = 4/' "$S/job.ini" >"$S/badval.ini"
bid=$("$CTL" submit "$S/badval.ini" | tail -1)
wait_for 60 finished "$bid" || fail "job $bid did not finish within 60 s"
is_state "$bid" failed || fail "job $bid with a 200-token validation file: $("$CTL" status "$bid")"
case "$(reason_of "$bid")" in
  *"[data] val $S/val200.bin"*"is >= vocab_size 128"*) ;;
  *) fail "job $bid's reason does not name the validation file's vocabulary: $(reason_of "$bid")";;
esac

# every = 1 with the default batches = 20: more collectives in one evaluation than in a training
# step, which once failed every small job at its first evaluation ("more than 24 collectives")
sed -e 's/^steps = 8/steps = 2/' -e 's/^every = 3/every = 1/' -e '/^batches = 2/d' -e '/^at_start/d' \
    -e '/^sample_/d' "$S/job.ini" >"$S/every1.ini"
eid=$("$CTL" submit "$S/every1.ini" | tail -1)
wait_for 60 finished "$eid" || fail "job $eid did not finish within 60 s"
is_state "$eid" succeeded || fail "job $eid with [eval] every = 1, batches = 20: $(reason_of "$eid")"
[ "$(grep -c val_loss "$S/jobs/$eid/metrics.jsonl")" -eq 2 ] || fail "job $eid: val_loss not at both steps: $(cat "$S/jobs/$eid/metrics.jsonl")"
stop_daemon
echo "eval: ok"
