#!/usr/bin/env bash
# Mixed transformers 4 and 5 rope keys in one config.json, against transformers 5 itself: a tiny
# position-sensitive Llama saved by save_pretrained, then its config rewritten as people's folders
# carry them: (a) rope_parameters {"rope_type": "default"} beside a legacy rope_scaling llama3 block,
# (b) rope_parameters {"rope_type": "default"} without a base beside a top-level rope_theta 500000,
# (c) the legacy block with its own rope_theta. For each, fsdpctl sample --logits on the folder
# equals what AutoModelForCausalLM computes from that same folder to 1e-5 of the largest logit, and
# fsdpctl plan shows the scaling and base transformers uses; (d) rope_parameters' base and a
# different top-level one, which transformers resolves silently, is refused in one line; (e) linear
# scaling in transformers 5's rope_parameters and (f) in the legacy {"type": "linear"} block: the
# same logits as transformers, and the plan's line.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/fsdp-it-ropekeys.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
TPY=$(bash "$src/scripts/test-env.sh" --check)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
CTL=$build/fsdpctl
PROMPT='0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!?'

"$TPY" - "$tmp" "$src/tests/integration/lib" <<'PY' > "$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log"; exit 1; }
import json, shutil, sys, torch
sys.path.insert(0, sys.argv[2])
from hf_finetune import V, save_tokenizer, sharpen
from transformers import LlamaConfig, LlamaForCausalLM
d = sys.argv[1]
torch.manual_seed(2)
cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
m = sharpen(LlamaForCausalLM(cfg))
m.save_pretrained(f"{d}/base")
save_tokenizer(f"{d}/base")
base = json.load(open(f"{d}/base/config.json"))
llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
variants = {
    "a": dict(rope_parameters={"rope_type": "default"}, rope_scaling=llama3),
    "b": dict(rope_parameters={"rope_type": "default"}, rope_theta=500000.0),
    "c": dict(rope_parameters={"rope_type": "default"}, rope_scaling=dict(llama3, rope_theta=500000.0)),
    "d": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rope_theta=500000.0),
    "e": dict(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
    "f": dict(rope_scaling={"type": "linear", "factor": 2.5}, rope_theta=20000.0),
}
for k, extra in variants.items():
    shutil.copytree(f"{d}/base", f"{d}/{k}")
    c = {x: y for x, y in base.items() if x != "rope_parameters"}
    c.update(extra)
    json.dump(c, open(f"{d}/{k}/config.json", "w"), indent=1)
PY

compare() {   # compare VARIANT: fsdpd's logits on the folder against transformers' on the same folder
  "$CTL" sample "$tmp/$1" --prompt "$PROMPT" --logits > "$tmp/$1.json"
  "$TPY" - "$tmp/$1" "$tmp/$1.json" "$PROMPT" <<'PY' 2>&1 | grep -v "Loading weights"
import json, sys, torch
from transformers import AutoModelForCausalLM
d, ours, prompt = sys.argv[1:4]
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64).eval()
with torch.no_grad():
    hf = m(input_ids=torch.tensor([list(prompt.encode())])).logits[0]
got = torch.tensor(json.load(open(ours)), dtype=torch.float64)
rp = m.config.rope_parameters
diff = (got - hf).abs().max().item()
scale = hf.abs().max().item()
print(f"{d.rsplit('/', 1)[-1]}: transformers uses {rp['rope_type']} theta {rp['rope_theta']}; fsdpd's logits within "
      f"{diff:.2e} ({diff / scale:.1e} of the largest, {scale:.2f})")
sys.exit(0 if got.shape == hf.shape and diff <= 1e-5 * scale else 1)
PY
}
failed=0
compare a || failed=1
compare b || failed=1
compare c || failed=1
compare e || failed=1
compare f || failed=1
jobfile() { printf '[model]\nfrom = %s\nseq_len = 64\n[data]\ntrain = synthetic:markov:1\n' "$tmp/$1" > "$tmp/$1.ini"; }
plan_line() { jobfile "$1"; "$CTL" plan "$tmp/$1.ini" | grep -m1 "$2" || true; }
grep -q "theta=10000" <<<"$(plan_line a theta=)" && grep -q "rope llama3 factor 8" <<<"$(plan_line a "; rope")" ||
  { echo "plan of (a): $(plan_line a theta=) / $(plan_line a "; rope")"; failed=1; }
grep -q "theta=500000" <<<"$(plan_line b theta=)" || { echo "plan of (b): $(plan_line b theta=)"; failed=1; }
grep -q "theta=500000" <<<"$(plan_line c theta=)" || { echo "plan of (c): $(plan_line c theta=)"; failed=1; }
grep -q "rope linear factor 4$" <<<"$(plan_line e "; rope")" || { echo "plan of (e): $(plan_line e "; rope")"; failed=1; }
grep -q "theta=20000" <<<"$(plan_line f theta=)" && grep -q "rope linear factor 2.5$" <<<"$(plan_line f "; rope")" ||
  { echo "plan of (f): $(plan_line f theta=) / $(plan_line f "; rope")"; failed=1; }
set +e
jobfile d
"$CTL" plan "$tmp/d.ini" > /dev/null 2> "$tmp/d.err"
rc=$?
set -e
if [ "$rc" -ne 1 ] || [ "$(wc -l < "$tmp/d.err")" -ne 1 ] ||
   ! grep -q "rope_parameters has rope_theta 10000 but the top-level rope_theta is 500000" "$tmp/d.err"; then
  echo "(d) not refused in one line: rc $rc: $(cat "$tmp/d.err")"
  failed=1
else
  echo "refused (d): $(cat "$tmp/d.err")"
fi
[ "$failed" -eq 0 ] || { echo "rope_keys_hf: FAILED"; exit 1; }
echo "rope_keys_hf: ok"
