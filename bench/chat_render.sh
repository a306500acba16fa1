#!/usr/bin/env bash
# Conversations to trained tokens (docs/performance.md): `fsdpctl gen-data --chat` (render with the
# chat template, tokenize, mask; C, --threads N) against the same in Python with Hugging Face's
# libraries (bench/chat_render_hf.py: transformers' apply_chat_template, tokenizers' encode, the same
# masking, on N processes), on the same file, template, tokenizer and cores, in alternating rounds
# (fsdpd, python, fsdpd, python, ...), and every conversation's ids and mask compared.
#   bench/chat_render.sh [BUILD_DIR] [MB] [ROUNDS] [THREADS]    env: TEMPLATE (Qwen-Qwen2.5-7B-Instruct.jinja)
# The file: MB (100) MB of JSONL made by a seeded generator (chat_render_hf.py gen): 1 to 12
# exchanges, a system prompt in 60 % (fixed ones and generated), 5 % prompt/completion lines,
# lists, code blocks and paragraphs, 30 % of the words in other scripts than Latin-only English
# (accents, Cyrillic, Greek, CJK, Hangul, Arabic, emoji). The template is a published one from the
# test environment (scripts/test-env.sh --templates), the tokenizer a byte-level BPE of 8000 tokens
# that tokenizers trains on the file's first conversations. Both sides are timed as whole processes
# (reading the file, Python's imports and worker start-up, writing the output): wall and CPU
# (user + system, every thread and child). ROUNDS (2) rounds and a closing fsdpd run, so that every
# Python run lies between two of fsdpd's; the medians and their ratios.
# Python: the test environment (scripts/test-env.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
mb=${2:-100} rounds=${3:-2} threads=${4:-$(nproc)}
. "$here/bench/lib.sh"
PY=$(bash "$here/scripts/test-env.sh" --check)
TDIR=$(bash "$here/scripts/test-env.sh" --templates)
export CHAT_TEMPLATE="$TDIR/${TEMPLATE:-Qwen-Qwen2.5-7B-Instruct.jinja}"
[ -f "$CHAT_TEMPLATE" ] || { echo "chat_render: no template $CHAT_TEMPLATE" >&2; exit 2; }
tmp=$(mktemp -d /tmp/fsdp-bench-chat.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
bench_conditions_begin "$build"
"$PY" "$here/bench/chat_render_hf.py" gen "$tmp/chats.jsonl" "$tmp/model" "$mb" 1
echo "template: $(basename "$CHAT_TEMPLATE"); $threads threads (fsdpd) and $threads processes (python)"
timed() {   # timed NAME CMD...: one run, its wall and CPU seconds appended to results
  /usr/bin/time -f "%e %U %S" -o "$tmp/time" "${@:2}" >"$tmp/$1.out" 2>&1 ||
    { echo "chat_render: $1 failed: $(tail -3 "$tmp/$1.out")" >&2; exit 1; }
  echo "$1 $(cat "$tmp/time")" >>"$tmp/results"
}
for r in $(seq 1 "$rounds"); do
  timed fsdpd "$build/fsdpctl" gen-data --chat "$tmp/chats.jsonl" --model "$tmp/model" -o "$tmp/fsdpd.bin" \
    --threads "$threads" --json
  timed python "$PY" "$here/bench/chat_render_hf.py" run "$tmp/chats.jsonl" "$tmp/model" "$tmp/ref" "$threads"
  echo "round $r: $(tail -2 "$tmp/results" | tr '\n' ' ')"
done
timed fsdpd "$build/fsdpctl" gen-data --chat "$tmp/chats.jsonl" --model "$tmp/model" -o "$tmp/fsdpd.bin" \
  --threads "$threads" --json   # a closing run: every Python run between two of fsdpd's
echo "closing: $(tail -1 "$tmp/results")"
"$PY" "$here/bench/chat_render_hf.py" compare "$tmp/ref" "$tmp/fsdpd.bin"
python3 - "$tmp/results" "$(stat -c %s "$tmp/chats.jsonl")" <<'PY'
import statistics as st, sys
runs, size = {}, int(sys.argv[2])
for line in open(sys.argv[1]):
    name, wall, user, sys_ = line.split()
    runs.setdefault(name, []).append((float(wall), float(user) + float(sys_)))
med = {k: (st.median(w for w, _ in v), st.median(c for _, c in v)) for k, v in runs.items()}
print(f"{'side':7} {'wall s':>8} {'cpu s':>8} {'MB/s':>7} {'cpu MB/s':>9}  runs (wall/cpu s)")
for k, (w, c) in med.items():
    print(f"{k:7} {w:8.1f} {c:8.1f} {size / 1e6 / w:7.2f} {size / 1e6 / c:9.2f}  "
          + ", ".join(f"{a:.1f}/{b:.1f}" for a, b in runs[k]))
print(f"ratio python / fsdpd: wall {med['python'][0] / med['fsdpd'][0]:.1f}x, cpu {med['python'][1] / med['fsdpd'][1]:.1f}x "
      f"(medians of {len(runs['fsdpd'])} fsdpd and {len(runs['python'])} python runs, alternating)")
PY
bench_conditions_end
