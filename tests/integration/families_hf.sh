#!/usr/bin/env bash
# Never a different model than transformers': tiny folders saved by transformers 5 (lib/families_hf.py).
# pad_token_id: a Llama folder with pad_token_id set (untied and tied), 3 steps on 2 ranks, its export's
# embedding equal to transformers' after the same 3 AdamW steps (the pad row: nn.Embedding's padding_idx,
# which the lookup never trains; a tied head still does), and far from the same steps with padding_idx
# None. Dropout: a GPT-2 folder with GPT2Config's default 0.1 and a Llama one with attention_dropout
# 0.1 are refused at plan, one line naming the key, and plan with [model] dropout = none says dropout
# is off. A tied config whose weights also hold a different lm_head.weight trains untied, as
# transformers loads it (step-1 loss equal to transformers', far from the tied control). Llama, Qwen2
# and GPT-2 tied folders whose weights also hold lm_head.weight equal to the embedding: step-1 loss and
# fsdpctl sample's logits equal transformers', the export tied without lm_head; one element of the head
# off: trained and exported untied (GPT-2: refused), and refused under a bare init = FILE tied by hand.
# init = FILE of another architecture's folder (qwen2, qwen3, mistral, phi3 under arch = llama, llama
# under qwen2) is refused in one line naming both. An export
# whose --tokenizer is refused leaves the output folder as it found it (the next export into it runs).
# Every part runs; the ones that fail are listed at the end.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/fsdp-it-fam.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
TPY=$(bash "$src/scripts/test-env.sh" --check)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
CTL=$build/fsdpctl
failed=()
part_fail() { echo "FAIL: $*"; failed+=("$*"); }

"$TPY" "$src/tests/integration/lib/families_hf.py" build "$tmp" > "$tmp/build.log" 2>&1 ||
  { tail -20 "$tmp/build.log"; exit 1; }
grep -E '^head_' "$tmp/build.log"
ref() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[sys.argv[2]]; print(eval(sys.argv[3], {"r": r}))' \
  "$tmp/refs.json" "$1" "$2"; }

job() {   # job NAME MODEL-LINES STEPS
  cat > "$tmp/$1.ini" <<JOB
[job]
name = $1
steps = $3
[model]
$2
seq_len = 32
[data]
train = train.bin
shuffle = false
batch_size = 2
grad_accum = 1
[optim]
lr = 1e-3
warmup_steps = 0
schedule = constant
weight_decay = 0.1
[fsdp]
world_size = 2
timeout_s = 60
[checkpoint]
dir = ckpt-$1
every = $3
JOB
}
run() {   # run NAME
  FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/out-$1 timeout 120 "$src/scripts/launch-standalone.sh" 2 "$tmp/$1.ini" \
    > /dev/null 2>&1
}
loss() { python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1]) if l.startswith("{")][int(sys.argv[2]) - 1])' "$1" "$2"; }
rel_ok() { python3 -c 'import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)' "$1" "$2" "$3"; }
refused() {   # refused WHAT NEEDLE...: plan $tmp/bad.ini exits 1 with one line holding every NEEDLE
  set +e
  "$CTL" plan "$tmp/bad.ini" > /dev/null 2> "$tmp/bad.err"
  local rc=$? what=$1
  set -e
  shift
  local msg ok=1
  msg=$(cat "$tmp/bad.err")
  for n in "$@"; do [[ "$msg" == *"$n"* ]] || ok=0; done
  if [ "$rc" -ne 1 ] || [ "$(wc -l < "$tmp/bad.err")" -ne 1 ] || [ $ok = 0 ] || grep -Eq '[a-z_]+\.(c|h):[0-9]+:' <<<"$msg"; then
    part_fail "$what: rc $rc: $msg"
  else
    echo "refused ($what): $msg"
  fi
}

# pad_token_id: the row as transformers trains it, untied and tied.
for m in pad_untied pad_tied; do
  job "$m" "from = $m" 3
  "$CTL" plan "$tmp/$m.ini" > "$tmp/plan-$m.txt" || part_fail "$m: fsdpctl plan refused the folder"
  grep -q "pad_token_id 5 (the lookup does not train its row" "$tmp/plan-$m.txt" ||
    part_fail "$m: fsdpctl plan does not show pad_token_id 5"
  run "$m" || { part_fail "$m: the 3-step run failed: $(tail -1 "$tmp/out-$m/rank-0.log")"; continue; }
  "$CTL" export "$tmp/ckpt-$m" -o "$tmp/exp_$m" > /dev/null || { part_fail "$m: fsdpctl export failed"; continue; }
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); sys.exit(c.get("pad_token_id") != 5)' \
    "$tmp/exp_$m/config.json" || part_fail "$m: the export's config.json lost pad_token_id"
  "$TPY" "$src/tests/integration/lib/families_hf.py" rows "$tmp" "$m" "$tmp/exp_$m" ||
    part_fail "$m: the embedding after 3 steps differs from transformers' (above)"
done

# Dropout: refused unless the job trains without it.
job bad "from = gpt2_drop" 1
refused "GPT-2's default dropout" "embd_pdrop = 0.1" "the key is absent" "dropout = none"
job bad "from = llama_drop" 1
refused "Llama's attention_dropout" "attention_dropout = 0.1" "dropout = none"
job nodrop "$(printf 'from = gpt2_drop\ndropout = none')" 1
"$CTL" plan "$tmp/nodrop.ini" > "$tmp/nodrop.txt" 2>&1 || part_fail "dropout = none: plan refused: $(cat "$tmp/nodrop.txt")"
grep -q "^Dropout   none: .*embd_pdrop = 0.1 is not applied" "$tmp/nodrop.txt" ||
  part_fail "dropout = none: plan does not say dropout is off: $(grep -m1 Dropout "$tmp/nodrop.txt" || true)"

# A tied config whose weights hold a different lm_head.weight: untied, as transformers loads it.
job head_differs "from = head_differs" 1
if [ "$(ref head_differs 'r["tied"]')" != False ]; then
  part_fail "transformers tied the differing head (the reference changed)"
elif run head_differs; then
  got=$(loss "$tmp/out-head_differs/rank-0.jsonl" 1) want=$(ref head_differs 'r["loss"]') ctl=$(ref head_differs 'r["control"]')
  echo "head_differs: step-1 loss fsdpd $got, transformers $want, tied control $ctl"
  rel_ok "$got" "$want" 1e-5 || part_fail "head_differs: step-1 loss $got, transformers' $want (1e-5 relative)"
  ! rel_ok "$got" "$ctl" 1e-3 || part_fail "head_differs: the tied control ($ctl) does not tell the models apart"
else
  part_fail "head_differs: the run failed: $(tail -1 "$tmp/out-head_differs/rank-0.log")"
fi

# Tied folders whose weights also hold lm_head.weight equal to the embedding (transformers ties them):
# trained tied, as transformers computes them; exported as save_pretrained writes a tied model; sampled.
# The same with one element of the head one float step off: transformers loads it untied, and so does
# fsdpd (GPT-2, which has no untied head, refuses it); a bare init = FILE tied by hand refuses it.
for fam in llama qwen2 gpt2; do
  m=tied_$fam
  if [ "$(ref $m 'r["tied"]')" != True ]; then part_fail "$m: transformers does not tie the equal head"; continue; fi
  job "$m" "from = $m" 1
  run "$m" || { part_fail "$m: the run failed: $(tail -1 "$tmp/out-$m/rank-0.log")"; continue; }
  got=$(loss "$tmp/out-$m/rank-0.jsonl" 1) want=$(ref $m 'r["loss"]')
  echo "$m: step-1 loss fsdpd $got, transformers $want"
  rel_ok "$got" "$want" 1e-5 || part_fail "$m: step-1 loss $got, transformers' $want (1e-5 relative)"
  "$CTL" sample "$tmp/$m" --prompt "tied heads" --logits > "$tmp/logits-$m.json" 2> "$tmp/sample.err" ||
    part_fail "$m: fsdpctl sample refused the folder: $(cat "$tmp/sample.err")"
  "$TPY" "$src/tests/integration/lib/families_hf.py" logits "$tmp" "$m" "$tmp/logits-$m.json" ||
    part_fail "$m: fsdpctl sample's logits differ from transformers' (above)"
  "$CTL" export "$tmp/ckpt-$m" -o "$tmp/exp_$m" > /dev/null || { part_fail "$m: fsdpctl export failed"; continue; }
  "$TPY" "$src/tests/integration/lib/families_hf.py" head "$tmp/exp_$m" 1 ||
    part_fail "$m: the export is not the tied model save_pretrained writes (above)"
done
for fam in llama qwen2; do
  m=ulp_$fam
  if [ "$(ref $m 'r["tied"]')" != False ]; then part_fail "$m: transformers ties the differing head"; continue; fi
  job "$m" "from = $m" 1
  run "$m" || { part_fail "$m: the run failed: $(tail -1 "$tmp/out-$m/rank-0.log")"; continue; }
  got=$(loss "$tmp/out-$m/rank-0.jsonl" 1) want=$(ref $m 'r["loss"]')
  echo "$m: step-1 loss fsdpd $got, transformers $want"
  rel_ok "$got" "$want" 1e-5 || part_fail "$m: step-1 loss $got, transformers' $want (1e-5 relative)"
  "$CTL" export "$tmp/ckpt-$m" -o "$tmp/exp_$m" > /dev/null || { part_fail "$m: fsdpctl export failed"; continue; }
  "$TPY" "$src/tests/integration/lib/families_hf.py" head "$tmp/exp_$m" 0 ||
    part_fail "$m: the export is not untied (above)"
done
job bad "from = ulp_gpt2" 1
refused "GPT-2 with a different lm_head.weight" "holds lm_head.weight different from wte.weight" "arch = gpt2"
mkdir -p "$tmp/bare_same" "$tmp/bare_ulp"
cp "$tmp/tied_llama/model.safetensors" "$tmp/bare_same/"
cp "$tmp/ulp_llama/model.safetensors" "$tmp/bare_ulp/"
tied_shape='arch = llama\nn_layer = 2\nn_head = 4\nn_kv_head = 2\nn_embd = 32\nffn_dim = 64\nvocab_size = 256\ntie_word_embeddings = true'
for w in "$tmp/bare_same/model.safetensors" "$tmp/tied_llama/model.safetensors"; do
  job tied_init "$(printf "$tied_shape\ninit = %s" "$w")" 1
  "$CTL" plan "$tmp/tied_init.ini" > /dev/null 2> "$tmp/tied_init.err" ||
    part_fail "init = $w (tied, its lm_head equal): plan refused: $(cat "$tmp/tied_init.err")"
done
job bad "$(printf "$tied_shape\ninit = %s" "$tmp/bare_ulp/model.safetensors")" 1
refused "a bare init = FILE tied by hand, its lm_head.weight different" \
  "holds an untied model (lm_head.weight, different from model.embed_tokens.weight)" "set tie_word_embeddings = false"

# init = FILE of another architecture's folder.
shape='n_layer = 2\nn_head = 4\nn_kv_head = 2\nn_embd = 32\nffn_dim = 64\nvocab_size = 256'
for pair in qwen2:llama qwen3:llama mistral:llama phi3:llama llama:qwen2; do
  folder=${pair%%:*} arch=${pair#*:}
  job bad "$(printf "arch = $arch\n$shape\ninit = %s" "$tmp/$folder/model.safetensors")" 1
  refused "init = the $folder folder under arch = $arch" "model_type is '$folder'" "arch = $arch" "from = $tmp/$folder"
done

# export --tokenizer refused: nothing of the export is left, so the next one into the folder runs.
mkdir "$tmp/exp_tok"
echo '{"model": {"type": "Unigram"}}' > "$tmp/bad_tokenizer.json"
if "$CTL" export "$tmp/ckpt-pad_untied" -o "$tmp/exp_tok" --tokenizer "$tmp/bad_tokenizer.json" > /dev/null 2> "$tmp/tok.err"; then
  part_fail "export with an unsupported tokenizer succeeded"
else
  echo "export refused: $(cat "$tmp/tok.err")"
  [ -z "$(ls -A "$tmp/exp_tok")" ] || part_fail "the refused export left files: $(ls "$tmp/exp_tok")"
  "$CTL" export "$tmp/ckpt-pad_untied" -o "$tmp/exp_tok" > /dev/null 2> "$tmp/tok2.err" ||
    part_fail "the next export into the folder failed: $(cat "$tmp/tok2.err")"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "families_hf: ${#failed[@]} part(s) failed:"
  printf '  - %s\n' "${failed[@]}"
  exit 1
fi
echo "families_hf: ok"
