#!/usr/bin/env bash
# gen-data --chat against transformers (tests/integration/chat/mask.py): the tokens and the loss
# mask of masked token files equal apply_chat_template's ids and return_assistant_tokens_mask on a
# template with {% generation %} blocks, and an independent construction (each prefix rendered, the
# assistant turns' characters mapped to tokens by the fast tokenizer's offsets) on published
# templates; the line kinds, malformed lines (named, counted, fatal with --strict) and --seq-len.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" chat_mask_hf
PY=$(bash "$SRC/scripts/test-env.sh" --check) || fail "the Python test environment is missing (scripts/test-env.sh)"
TEMPLATES=$(bash "$SRC/scripts/test-env.sh" --templates) || fail "the chat templates are not fetched (scripts/test-env.sh)"
"$PY" "$SRC/tests/integration/chat/mask.py" "$CTL" "$TEMPLATES" "$S" 2>&1 | grep -v "does not contain .{% generation %}. keyword" \
  || fail "gen-data --chat differs from transformers (above)"
echo "PASS"
