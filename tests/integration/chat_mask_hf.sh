#!/usr/bin/env bash
# gen-data --chat against transformers (tests/integration/chat/mask.py): the tokens and the loss
# mask of masked token files equal apply_chat_template's ids and return_assistant_tokens_mask on a
# template with {% generation %} blocks, and an independent construction (each prefix rendered, the
# assistant turns' characters mapped to tokens by the fast tokenizer's offsets) on published
# templates; the line kinds, malformed lines (named, counted, fatal with --strict) and --seq-len;
# then a masked file given to a job is refused by fsdpctl plan and run in one line.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" chat_mask_hf
PY=$(bash "$SRC/scripts/test-env.sh" --check) || fail "the Python test environment is missing (scripts/test-env.sh)"
TEMPLATES=$(bash "$SRC/scripts/test-env.sh" --templates) || fail "the chat templates are not fetched (scripts/test-env.sh)"
"$PY" "$SRC/tests/integration/chat/mask.py" "$CTL" "$TEMPLATES" "$S" 2>&1 | grep -v "does not contain .{% generation %}. keyword" \
  || fail "gen-data --chat differs from transformers (above)"

# a masked file is refused before any job starts: plan and run, [data] train and val
sed "s|^train = .*|train = $S/out.bin|" "$SRC/examples/tiny.ini" >"$S/masked.ini"
for cmd in plan run; do
  set +e
  msg=$("$CTL" $cmd "$S/masked.ini" 2>&1)
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || fail "fsdpctl $cmd accepted a masked token file"
  grep -q "\[data\] train: $S/out.bin carries a loss mask" <<<"$msg" || fail "fsdpctl $cmd: unexpected message: $msg"
  [ "$(grep -c . <<<"$msg")" -eq 1 ] || fail "fsdpctl $cmd: more than one line: $msg"
done
"$CTL" gen-data --markov 1 --tokens 5000 -o "$S/plain.bin" >/dev/null
sed "s|^train = .*|train = $S/plain.bin\nval = $S/ou?.bin|" "$SRC/examples/tiny.ini" >"$S/masked_val.ini"
set +e
msg=$("$CTL" plan "$S/masked_val.ini" 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "\[data\] val: $S/out.bin carries a loss mask" <<<"$msg" \
  || fail "fsdpctl plan: a masked validation file (by a glob) was not refused: $msg"
echo "PASS"
