#!/usr/bin/env bash
# LoRA over a frozen, sharded base against peft (lib/lora_peft.py builds the models and peft's reference):
# tiny GPT-2 and Llama folders with adapters on attention and MLP ([lora] init_from = a PEFT folder whose B
# is non-zero), on 2 ranks with sharding full and hybrid, and full with activation checkpointing (the same
# adapters bit for bit), the adapters sharded in their own units ([lora] adapters = sharded), and full with
# them replicated (adapters = replicated; fsdpctl plan --json names the layout): the step-1 loss equals peft's on the same rows to
# 1e-5 relative (the same loss without the alpha/r scale does not); after 10 steps every adapter weight
# equals peft + torch AdamW (in fp64) to 1e-5 of its tensor's largest (a control that also trains the base does not) and the base is bit for
# bit the loaded one; the adapter folder the worker writes loads with PeftModel.from_pretrained; the
# measured peaks per category and bytes sent equal fsdpctl plan's (no gradient, optimizer state or
# reduce-scatter for the base). Bad input
# is refused by fsdpctl plan in one line: an unknown target, a rank above a layer's width, init_from an
# adapter of another rank or another base, a dropout, sharded adapters where nothing is sharded. Every part runs; the failures are listed at the end.
#
# lora_peft.sh BUILD SRC families (lora_families.sh): the same parts, sharding full and hybrid, for every
# other family (Qwen2 with q/k/v biases, Qwen3 with q/k norms and head_dim != hidden / heads, Mistral's
# and Gemma 3's sliding windows, Phi-3's fused qkv_proj and gate_up_proj with longrope), adapters on all of
# each one's attention and MLP projections; fsdpctl export --merge of Phi-3's full run's checkpoint equals
# peft's merge_and_unload into its fused tensors (the base alone does not); Phi-3's refusals: no targets
# (peft has no default for it), and Llama's unfused names.
#
# lora_peft.sh BUILD SRC nf4 (qlora_peft.sh): the same for QLoRA, [lora] base_dtype = nf4 on the models at
# widths of 64, against peft over the base as fsdpd quantized it (fsdpd's NF4 codes, which must be
# bitsandbytes' quantize_4bit's, dequantized by bitsandbytes; the other tensors in bf16): the saved base after
# training is that dequantized base bit for bit, and the control is peft over the base un-quantized; nf4 on a
# model whose widths are no multiple of 64 is refused at plan; fsdpctl export --merge of the full run's checkpoint
# equals peft's merge_and_unload over the dequantized base (not over the base un-quantized).
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) set=${3:-base}
case $set in
  base) models="gpt2 llama" modes="full hybrid full-ckpt full-replicated" nf4="";;
  nf4) models="gpt2 llama" modes="full hybrid full-ckpt full-replicated" nf4=1;;
  families) models="qwen2 qwen3 mistral gemma3 phi3" modes="full hybrid" nf4="";;
  *) echo "lora_peft.sh: the third argument is '$set'; allowed: nf4, families, or none"; exit 2;;
esac
lr=1e-3
# lib/lora_peft.py's LR_WIDE: the wider models, and the families, are chaotic at 1e-3 in fp32
[ "$set" = base ] || lr=5e-4
tmp=$(mktemp -d /tmp/fsdp-it-lora.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
TPY=$(bash "$src/scripts/test-env.sh" --check)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# a bf16 base (nf4's root and working unit) computes its GEMMs in fp32 on the CPU, as peft's reference does,
# not in AVX512-BF16 where the CPU has it
export FSDP_CPU_BF16=off
CTL=$build/fsdpctl
failed=()
part_fail() { echo "FAIL: $*"; failed+=("$*"); }

"$TPY" "$src/tests/integration/lib/lora_peft.py" build "$tmp" "${set/nf4/base}" ${nf4:+"$build/nf4_tool"} \
  > "$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log"; exit 1; }
grep -E "^(${models// /|}):" "$tmp/build.log"

job() {   # job FILE MODEL SHARDING[-ckpt|-replicated] TARGETS
  cat > "$1" <<JOB
[job]
steps = 10
seed = 5
[model]
from = $2
seq_len = 32
[data]
train = train.bin
shuffle = false
batch_size = 2
grad_accum = 1
[optim]
lr = $lr
warmup_steps = 0
schedule = constant
weight_decay = 0.1
beta2 = 0.95
grad_clip = 1.0
[fsdp]
world_size = 2
sharding = ${3%%-*}
$([ "$3" = hybrid ] && echo "shard_group = 1")
$([ "$3" = full-ckpt ] && echo "activation_checkpointing = full")
timeout_s = 60
[lora]
rank = 4
alpha = 8
targets = ${4:-}
init_from = init_$2
adapters = $([ "${3#*-}" = replicated ] && echo replicated || echo sharded)
$([ -n "$nf4" ] && echo "base_dtype = nf4")
$({ [ -n "$nf4" ] || [ "$2" = phi3 ]; } && [ "$3" = full ] && printf '[checkpoint]\ndir = %s\nevery = 10' "$tmp/ck-$2")
JOB
}

for m in $models; do
  case $m in
    gpt2) targets="c_attn, c_proj, c_fc";;
    phi3) targets="qkv_proj, o_proj, gate_up_proj, down_proj";;
    *) targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";;
  esac
  for mode in $modes; do
    job "$tmp/$m-$mode.ini" "$m" "$mode" "$targets"
    out=$tmp/out-$m-$mode
    FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$out timeout 120 "$src/scripts/launch-standalone.sh" 2 "$tmp/$m-$mode.ini" \
      --save "$out/base.safetensors" --save-adapter "$out/adapter" > /dev/null 2>&1 ||
      { part_fail "$m ($mode): the LoRA job failed: $(tail -1 "$out/rank-0.log")"; continue; }
    "$TPY" "$src/tests/integration/lib/lora_peft.py" verify "$tmp" "$m" "$out" 2>&1 | grep -v -i warn ||
      part_fail "$m ($mode): fsdpd's LoRA is not peft's (above)"
    # the measured peaks per category and the bytes sent are the plan's (base, adapters, their gradient
    # and AdamW state, no reduce-scatter)
    "$CTL" plan "$tmp/$m-$mode.ini" --json > "$tmp/plan-$m-$mode.json"
    python3 - "$tmp/plan-$m-$mode.json" "$out" "$mode" <<'PY' || part_fail "$m ($mode): measured memory or traffic is not the plan's"
import json, sys
plan = json.load(open(sys.argv[1]))
want_layout = "replicated" if sys.argv[3].endswith("replicated") else "sharded"
bad = 0
if plan["lora"]["adapters"] != want_layout:
    print(f"the plan holds the adapters {plan['lora']['adapters']}, the job says {want_layout}")
    bad = 1
for r in (0, 1):
    rep = [json.loads(l) for l in open(f"{sys.argv[2]}/rank-{r}.jsonl") if l.startswith("{")][-1]
    for what, want, got in (("peak", plan["memory"], rep["peak_bytes"]), ("sent", plan["sent_bytes"], rep["sent_bytes"])):
        for k, v in got.items():
            if k in want and want[k] != v:
                print(f"rank {r}: {what} {k} measured {v}, plan {want[k]}")
                bad = 1
print(f"measured = plan ({want_layout}): peaks {rep['peak_bytes']['total']} bytes, grad_shard "
      f"{rep['peak_bytes']['grad_shard']}, reducescatter {rep['sent_bytes']['reducescatter']} bytes" if not bad
      else "measured != plan")
sys.exit(bad)
PY
  done
  # --merge of the full run's checkpoint: into the dequantized NF4 base; Phi-3's into its fused tensors
  if [ -n "$nf4" ] || [ "$m" = phi3 ]; then
    "$CTL" export "$tmp/ck-$m" -o "$tmp/merged-$m" --merge > "$tmp/export.log" 2>&1 ||
      part_fail "$m: export --merge: $(tail -1 "$tmp/export.log")"
    "$TPY" "$src/tests/integration/lib/lora_peft.py" merged "$tmp" "$m" "$tmp/out-$m-full" "$tmp/merged-$m" 2>&1 |
      grep -v -i warn || part_fail "$m: the merged export is not peft's merge_and_unload"
  fi
  [ "$set" = families ] && continue   # (full and hybrid only: the layouts and checkpointing are the base set's)
  # activation checkpointing recomputes the same operators: the same adapters, bit for bit
  cmp -s "$tmp/out-$m-full/adapter/adapter_model.safetensors" "$tmp/out-$m-full-ckpt/adapter/adapter_model.safetensors" ||
    part_fail "$m: the adapters with activation checkpointing are not bit for bit those without"
  # the sharded adapters are the replicated ones (the same sums: a rank's shard of two ranks' gradients)
  "$TPY" - "$tmp/out-$m-full/adapter/adapter_model.safetensors" "$tmp/out-$m-full-replicated/adapter/adapter_model.safetensors" <<'PY' ||
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
worst = max(float(abs(a[k] - b[k]).max() / max(abs(b[k]).max(), 1e-30)) for k in b)
print(f"sharded vs replicated adapters: worst {worst:.2e} of the tensor's largest")
sys.exit(0 if a.keys() == b.keys() and worst <= 1e-5 else 1)
PY
    part_fail "$m: the sharded adapters are not the replicated ones"
done

# Refusals at plan: one line on stderr, exit 1
refuse() {   # refuse WHAT PATTERN FILE
  if "$CTL" plan "$3" > /dev/null 2> "$tmp/err"; then part_fail "$1: fsdpctl plan accepted it"; return; fi
  [ "$(wc -l < "$tmp/err")" -eq 1 ] || part_fail "$1: not one line: $(cat "$tmp/err")"
  grep -q -- "$2" "$tmp/err" || part_fail "$1: the line does not say '$2': $(cat "$tmp/err")"
  echo "refused, $1: $(cat "$tmp/err")"
}
if [ "$set" = families ]; then   # Phi-3: peft has no default targets for it; Llama's unfused names are no module of it
  job "$tmp/bad-phi3-default.ini" phi3 full ""
  sed -i '/^targets/d; /^init_from/d' "$tmp/bad-phi3-default.ini"
  refuse "phi3 without targets" "targets is required with arch = phi3.*allowed: qkv_proj, o_proj, gate_up_proj, down_proj" \
    "$tmp/bad-phi3-default.ini"
  job "$tmp/bad-phi3-name.ini" phi3 full "q_proj, v_proj"
  sed -i '/^init_from/d' "$tmp/bad-phi3-name.ini"
  refuse "an unfused Llama name on phi3" "'q_proj' is no module of a phi3 block" "$tmp/bad-phi3-name.ini"
else
  job "$tmp/bad-target.ini" gpt2 full "c_attn, q_proj"
  refuse "an unknown target" "'q_proj' is no module" "$tmp/bad-target.ini"
  job "$tmp/bad-rank.ini" gpt2 full "c_attn"
  sed -i 's/^rank = 4/rank = 100/; /^init_from/d' "$tmp/bad-rank.ini"
  refuse "a rank above the layer's width" "rank = 100 is above the width" "$tmp/bad-rank.ini"
  job "$tmp/bad-r.ini" gpt2 full "c_attn, c_proj, c_fc"
  sed -i 's/^rank = 4/rank = 8/' "$tmp/bad-r.ini"
  refuse "init_from an adapter of another rank" "rank r = 4" "$tmp/bad-r.ini"
  job "$tmp/bad-base.ini" llama full "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
  sed -i 's#^init_from = .*#init_from = init_gpt2#' "$tmp/bad-base.ini"
  refuse "init_from an adapter of another base" "init_from" "$tmp/bad-base.ini"
  job "$tmp/bad-drop.ini" gpt2 full ""
  sed -i 's/^alpha = 8/alpha = 8\ndropout = 0.1/' "$tmp/bad-drop.ini"
  refuse "a dropout" "dropout = 0.1 is not implemented" "$tmp/bad-drop.ini"
  job "$tmp/bad-layout.ini" gpt2 none "c_attn"
  refuse "sharded adapters with sharding none" "adapters = sharded with \[fsdp\] sharding = none" "$tmp/bad-layout.ini"

  if [ -n "$nf4" ]; then   # a width NF4's blocks do not divide
    job "$tmp/bad-width.ini" gpt2 full ""
    sed -i 's/^from = gpt2/n_layer = 2\nn_head = 2\nn_embd = 96\nvocab_size = 256/; /^init_from/d' "$tmp/bad-width.ini"
    refuse "nf4 on a width that is no multiple of 64" "must be a multiple of 64" "$tmp/bad-width.ini"
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "${#failed[@]} part(s) failed:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "lora_peft ($set: $models): all parts passed"
