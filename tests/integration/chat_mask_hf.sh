#!/usr/bin/env bash
# gen-data --chat against transformers (tests/integration/chat/mask.py): the tokens and the loss
# mask of masked token files equal apply_chat_template's ids and return_assistant_tokens_mask on a
# template with {% generation %} blocks, and an independent construction (each prefix rendered, the
# assistant turns' characters mapped to tokens by the fast tokenizer's offsets) on published
# templates; the line kinds, malformed lines (named, counted, fatal with --strict) and --seq-len;
# then a masked file given to a job is planned, and plan refuses pack = false on plain text and a
# stream that mixes the two kinds in one line.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" chat_mask_hf
PY=$(bash "$SRC/scripts/test-env.sh" --check) || fail "the Python test environment is missing (scripts/test-env.sh)"
TEMPLATES=$(bash "$SRC/scripts/test-env.sh" --templates) || fail "the chat templates are not fetched (scripts/test-env.sh)"
"$PY" "$SRC/tests/integration/chat/mask.py" "$CTL" "$TEMPLATES" "$S" 2>&1 | grep -v "does not contain .{% generation %}. keyword" \
  || fail "gen-data --chat differs from transformers (above)"

# a masked file is taken by a job (plan passes it); plan refuses, in one line, pack = false on a plain
# file and a stream that mixes masked and plain files
sed "s|^train = .*|train = $S/out.bin|" "$SRC/examples/tiny.ini" >"$S/masked.ini"
"$CTL" plan "$S/masked.ini" >/dev/null 2>"$S/plan.err" || fail "fsdpctl plan refused a masked token file: $(cat "$S/plan.err")"
"$CTL" gen-data --markov 1 --tokens 5000 -o "$S/plain.bin" >/dev/null
refused() {   # refused INI WANT
  set +e
  msg=$("$CTL" plan "$1" 2>&1)
  rc=$?
  set -e
  [ "$rc" -ne 0 ] && grep -qF "$2" <<<"$msg" && [ "$(grep -c . <<<"$msg")" -eq 1 ] ||
    fail "fsdpctl plan $1: want one line with '$2', got (exit $rc): $msg"
}
sed "s|^train = .*|train = $S/plain.bin\npack = false|" "$SRC/examples/tiny.ini" >"$S/plain_nopack.ini"
refused "$S/plain_nopack.ini" "[data] pack = false: train $S/plain.bin is a plain token file"
sed "s|^train = .*|train = $S/plain.bin\nval = $S/ou?.bin $S/plain.bin|" "$SRC/examples/tiny.ini" >"$S/mixed_val.ini"
refused "$S/mixed_val.ini" "[data] val: $S/out.bin carries a loss mask and $S/plain.bin has none"
echo "PASS"
