#!/usr/bin/env bash
# common/jinja against transformers' apply_chat_template renderer (jinja2 of the cached test
# environment) on the published chat templates scripts/test-env.sh fetched (llama-cpp-python's
# vendored llama.cpp templates): every conversation of tests/integration/chat/compare.py — with and
# without a system prompt, several turns, empty content, non-ASCII and emoji, tool calls and results —
# byte-identical, the {% generation %} spans identical, the same conversations refused; at least 10
# model families rendered identically; the templates fsdpd refuses at load are listed with the
# construct (printed with the count).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" chat_template_hf
PY=$(bash "$SRC/scripts/test-env.sh" --check) || fail "the Python test environment is missing (scripts/test-env.sh)"
TEMPLATES=$(bash "$SRC/scripts/test-env.sh" --templates) || fail "the chat templates are not fetched (scripts/test-env.sh)"
TOOL="$BUILD/jinja_tool"
[ -x "$TOOL" ] || fail "jinja_tool not built in $BUILD"
"$PY" "$SRC/tests/integration/chat/compare.py" "$TOOL" "$TEMPLATES" 2>&1 | grep -v "does not contain .{% generation %}. keyword" \
  || fail "fsdpd's chat template rendering differs from transformers' (above)"
echo "PASS"
