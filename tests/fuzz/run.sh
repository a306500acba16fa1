#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers that take untrusted input: the wire protocol (bytes on a
# socket), job files (text from users), and tokenizer.json files with the text they encode
# (common/bpe), and chat templates as a downloaded model ships them (common/jinja). Builds each libFuzzer target with clang, ASan and
# UBSan against the sources it needs, and runs it for SECONDS (default 20) from a seed corpus.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]     (BUILD_DIR: a configured build, for the generated protobuf code)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR [SECONDS]}" && pwd)
secs=${2:-20}
command -v clang >/dev/null || { echo "clang not found: scripts/install-deps.sh installs it" >&2; exit 1; }
out=$(mktemp -d /tmp/fsdp-fuzz.XXXXXX)
trap 'rm -rf "$out"' EXIT
cflags=(-std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
        -I"$here/common" -I"$here/models" -I"$here/proto" -I"$build/common/proto")
for d in "$here"/models/*/; do cflags+=(-I"$d"); done   # every architecture's folder
libs=($(pkg-config --cflags --libs libprotobuf-c libzmq inih jansson) -lm)
common=("$here/common/err.c" "$here/common/log.c" "$here/common/oneline.c" "$here/common/fsutil.c")

clang "${cflags[@]}" -o "$out/fuzz_wire" "$here/tests/fuzz/fuzz_wire.c" "$here/proto/wire.c" \
  "$build/common/proto/fsdp.pb-c.c" "${common[@]}" "${libs[@]}"
clang "${cflags[@]}" -o "$out/fuzz_jobspec" "$here/tests/fuzz/fuzz_jobspec.c" "$here/common/jobspec.c" \
  "$here/common/jobspec_keys.c" "$here/common/plan.c" "$here/common/plan_lora.c" "$here/common/hfconfig.c" "$here/common/jobspec_rules.c" "$here/common/st_model.c" "$here/common/safetensors.c" "$here/models/arch.c" "$here"/models/*/*_arch.c \
  "${common[@]}" "${libs[@]}"
clang "${cflags[@]}" -o "$out/fuzz_bpe" "$here/tests/fuzz/fuzz_bpe.c" "$here"/common/bpe_*.c "${common[@]}" \
  "${libs[@]}" $(pkg-config --cflags --libs oniguruma libutf8proc) -lpthread
clang "${cflags[@]}" -o "$out/fuzz_jinja" "$here/tests/fuzz/fuzz_jinja.c" "$here"/common/jinja_*.c "${common[@]}" \
  "${libs[@]}" $(pkg-config --cflags --libs libutf8proc)

# Seeds: the example job files, and a few valid messages written by the wire test's encoder.
mkdir -p "$out/corpus_jobspec" "$out/corpus_wire" "$out/corpus_bpe" "$out/corpus_jinja"
printf 'Hello, world! caf\xc3\xa9 \xf0\x9f\x98\x80  12345\n\n\tx <|x|>' > "$out/corpus_bpe/text"
printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}, "pre_tokenizer": {"type": "Metaspace", "replacement": "_"}, "decoder": {"type": "Metaspace", "replacement": "_"}}' \
  > "$out/corpus_bpe/tok.json"
# Chat templates: a hand-written one using most of the subset, and the published ones where the
# test environment fetched them (scripts/test-env.sh).
cat > "$out/corpus_jinja/chatml.jinja" <<'JINJA'
{%- set ns = namespace(sys='') -%}
{%- macro fmt(m, pre='') -%}{{ pre }}{{ m.content | trim }}{%- endmacro -%}
{%- for m in messages if m.role != 'tool' -%}
{%- if loop.first and m.role == 'system' %}{% set ns.sys = m.content %}{% continue %}{% endif -%}
<|im_start|>{{ m.role ~ '\n' }}{% if m.role == 'assistant' %}{% generation %}{{ fmt(m) }}<|im_end|>{% endgeneration %}
{% else %}{{ fmt(m, ns.sys[:3]) }}{{ (m.tool_calls or []) | map(attribute='function') | list | tojson(indent=2) }}<|im_end|>
{% endif %}{%- endfor -%}
{{ tools | selectattr('type', 'equalto', 'function') | list | length }}{{ 'x'.split('a') }}{{ {'b': 1} | dictsort }}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' if 1 < 2 else raise_exception('no') }}{% endif -%}
JINJA
templates=$(bash "$here/scripts/test-env.sh" --templates 2>/dev/null) && cp "$templates"/*.jinja "$out/corpus_jinja/"
cp "$here"/examples/*.ini "$here"/tests/integration/jobs/*.ini "$out/corpus_jobspec/" 2>/dev/null || true
printf '\x08\x02\xa2\x01\x00' > "$out/corpus_wire/ack"          # version 2, ack {}
printf '\x08\x02\xd2\x02\x02\x08\x05' > "$out/corpus_wire/step"  # version 2, step_cmd {step: 5}

for t in wire jobspec bpe jinja; do
  echo "== fuzz_$t for ${secs}s"
  rc=0
  (cd "$out" && ASAN_OPTIONS=detect_leaks=1 "./fuzz_$t" -max_total_time="$secs" -print_final_stats=1 \
     "corpus_$t" > "fuzz_$t.log" 2>&1) || rc=$?
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|INFO: seed corpus)" "$out/fuzz_$t.log" || true
  if [ "$rc" -ne 0 ]; then
    # libFuzzer exits non-zero on a crash, leak, timeout or sanitizer report, and saves the input.
    grep -E "ERROR|SUMMARY|Test unit written" "$out/fuzz_$t.log" >&2 || true
    tail -40 "$out/fuzz_$t.log" >&2
    echo "fuzz_$t found a failing input (exit status $rc)" >&2
    exit 1
  fi
done
echo "fuzz: no crash, leak or timeout"
