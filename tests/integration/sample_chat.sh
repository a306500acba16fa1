#!/usr/bin/env bash
# fsdpctl sample --chat on tiny chat model folders: a Llama model of transformers 5 with a byte-level
# tokenizer trained here, under two published chat templates (scripts/test-env.sh's llama.cpp copies):
#   llama31  Llama 3.1 Instruct's; tokenizer_config.json's eos_token <|end_of_text|>,
#            generation_config.json's eos_token_id [<|end_of_text|>, <|eom_id|>]; the turn ends
#            with <|eot_id|>
#   qwen25   Qwen 2.5 Instruct's; eos_token <|endoftext|>, no generation_config.json; the turn
#            ends with <|im_end|>, which only the template says
# For each, with and without --system, with non-ASCII and emoji: --print-prompt's text and ids equal
# transformers' apply_chat_template(..., add_generation_prompt=True) (tokenize=False and True), and
# its stop ids are the three (two) above. A greedy chat sample runs end to end; the worker stops at
# the first stop id and prints what came before it (checked on ids, against the same run without
# stop ids); bad input gets one line.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" sample-chat
FAIL_LOGS=()
PY=$(bash "$SRC/scripts/test-env.sh" --check) || fail "the Python test environment is missing (scripts/test-env.sh)"
TEMPLATES=$(bash "$SRC/scripts/test-env.sh" --templates) || fail "the chat templates are not fetched (scripts/test-env.sh)"

"$PY" - "$S" "$TEMPLATES" <<'PY' || fail "making the model folders"
import glob, json, os, shutil, sys, torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import LlamaConfig, LlamaForCausalLM
S, T = sys.argv[1], sys.argv[2]
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]
text = [open(f, encoding="utf-8").read() for f in sorted(glob.glob("/usr/share/common-licenses/*"))[:6]]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=600, special_tokens=special, show_progress=False,
                                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
V = tok.get_vocab_size()
torch.manual_seed(7)
cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
model = LlamaForCausalLM(cfg).eval()
fam = {"llama31": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|end_of_text|>", ["<|end_of_text|>", "<|eom_id|>"]),
       "qwen25": ("Qwen-Qwen2.5-7B-Instruct.jinja", None, "<|endoftext|>", None)}
for name, (tmpl, bos, eos, gen) in fam.items():
    d = f"{S}/{name}"
    model.save_pretrained(d)
    tok.save(f"{d}/tokenizer.json")
    cfgj = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": bos,
            "chat_template": open(os.path.join(T, tmpl), encoding="utf-8").read()}
    json.dump(cfgj, open(f"{d}/tokenizer_config.json", "w"))
    if gen:
        json.dump({"eos_token_id": [tok.token_to_id(x) for x in gen]}, open(f"{d}/generation_config.json", "w"))
    elif os.path.exists(f"{d}/generation_config.json"):
        os.remove(f"{d}/generation_config.json")
os.makedirs(f"{S}/bare")   # the model without a tokenizer: the worker prints ids
for f in ("config.json", "model.safetensors"):
    shutil.copy(f"{S}/llama31/{f}", f"{S}/bare/{f}")
PY

Q='What is the GPL? Ünïcödé and emoji: 😀👍🏽 ✨'
SYS='You answer in one sentence — briefly.'
for fam in llama31 qwen25; do
  "$CTL" sample "$S/$fam" --chat "$Q" --print-prompt > "$S/$fam-nosys.json" || fail "$fam: --print-prompt"
  "$CTL" sample "$S/$fam" --chat "$Q" --system "$SYS" --print-prompt > "$S/$fam-sys.json" || fail "$fam: --print-prompt --system"
done
"$PY" - "$S" "$Q" "$SYS" <<'PY' || fail "the chat prompt differs from transformers' apply_chat_template (above)"
import json, sys
from transformers import AutoTokenizer
S, Q, SYS = sys.argv[1:4]
want_stop = {"llama31": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], "qwen25": ["<|endoftext|>", "<|im_end|>"]}
bad = 0
for fam in ("llama31", "qwen25"):
    tok = AutoTokenizer.from_pretrained(f"{S}/{fam}")
    for kind, msgs in (("nosys", [{"role": "user", "content": Q}]),
                       ("sys", [{"role": "system", "content": SYS}, {"role": "user", "content": Q}])):
        got = json.load(open(f"{S}/{fam}-{kind}.json"))
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        stop = sorted(tok.convert_tokens_to_ids(want_stop[fam]))
        ok = got["prompt"] == text and got["prompt_ids"] == ids and sorted(got["stop_ids"]) == stop
        print(f"{fam}/{kind}: {len(ids)} prompt ids, stop ids {sorted(got['stop_ids'])} (expected {stop}): "
              f"{'equal' if ok else 'DIFFER'}")
        if not ok:
            bad += 1
            print(f"  ours   {got['prompt']!r}\n  theirs {text!r}\n  ours   {got['prompt_ids']}\n  theirs {ids}")
sys.exit(1 if bad else 0)
PY

# end to end, and the stop: the same greedy run with and without the stop ids
out=$("$CTL" sample "$S/qwen25" --chat "$Q" --tokens 6 --temperature 0) || fail "sample --chat failed: $out"
echo "sample --chat (qwen25): $out"
ids=$("$PY" -c 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["prompt_ids"])))' "$S/llama31-sys.json")
all=$("$BUILD/fsdp-worker" --sample "$S/bare" --prompt-ids "$ids" --tokens 12 --temperature 0) || fail "worker --prompt-ids: $all"
read -r -a g <<< "$all"
[ "${#g[@]}" = 12 ] || fail "expected 12 ids, got: $all"
k=0; while [ "${g[$k]}" != "${g[5]}" ]; do k=$((k + 1)); done   # the first place the sixth id comes
cut=$("$BUILD/fsdp-worker" --sample "$S/bare" --prompt-ids "$ids" --stop-ids "999999999,${g[5]}" --tokens 12 --temperature 0 2>&1) &&
  fail "a stop id outside the vocabulary was accepted: $cut"
cut=$("$BUILD/fsdp-worker" --sample "$S/bare" --prompt-ids "$ids" --stop-ids "${g[5]}" --tokens 12 --temperature 0) ||
  fail "worker --stop-ids: $cut"
want="${g[*]:0:$k}"
echo "greedy: $all; stopped at ${g[5]}: '$cut'"
[ "$cut" = "$want" ] || fail "with --stop-ids ${g[5]} the worker printed '$cut', expected '$want'"

# bad input: one line each
check_one_line() {   # check_one_line WHAT PATTERN CMD...
  local what=$1 pat=$2; shift 2
  if "$@" > "$S/out" 2> "$S/err"; then fail "$what was accepted"; fi
  [ "$(wc -l < "$S/err")" = 1 ] && grep -q -- "$pat" "$S/err" || fail "$what: unexpected refusal: $(cat "$S/err")"
}
check_one_line "--chat with --prompt" "one of them" "$CTL" sample "$S/qwen25" --chat x --prompt y
check_one_line "--system without --chat" "go with --chat" "$CTL" sample "$S/qwen25" --prompt y --system z
check_one_line "--chat without a template" "has no chat template" "$CTL" sample "$S/bare" --chat x --tokenizer "$S/qwen25/tokenizer.json"
echo "PASS: sample_chat"
