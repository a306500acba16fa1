#!/usr/bin/env bash
# tests/gpu/emu/lora_job.sh BUILD SRC [nf4] — whole LoRA (or, with nf4, QLoRA: [lora] base_dtype = nf4)
# training jobs through the CUDA device code (worker/cuda/device_cuda.c and its kernel table) with the
# kernels emulated on the CPU (fsdp-worker-emu, tests/gpu/CMakeLists.txt), against fsdp-worker's CPU
# device running the same jobs: a tiny Llama (grouped-query attention, head size 64, adapters on all
# seven projections), 2 ranks over gloo staged through "pinned" memory, sharding full, the adapters
# sharded (LoRA also replicated, and sharded with [fsdp] offload = optimizer: the adapters' master and
# AdamW state in pinned host memory, AdamW on the host), bf16 compute (ctests gpu_emu_lora, gpu_emu_qlora; docs/gpu.md "Whole jobs
# under the emulator"). Checks, per layout:
#   - every step's loss, and the adapters after the last step (each tensor, norm-wise relative), within
#     the tolerance below of the CPU reference's;
#   - the base saved after training (--save) bit for bit the CPU run's: the frozen bf16 base as loaded,
#     or with nf4 the base as the device dequantized it from its NF4 bytes (worker/ops/nf4.c against the
#     CUDA kernel of ops_cuda_nf4.cu, in a whole job);
#   - the measured peaks per category and the bytes sent equal fsdpctl plan's for device = cuda, the
#     staged comm's pinned buffer (plan_stage_bytes, which the plan does not count: docs/memory.md)
#     added to comm and total.
# Controls, each of which must fail its check: training moves the reference's loss by more than 3x the
# loss tolerance away from a run at lr 1e-12 (so the comparison can see a broken update); LoRA: the emulated
# worker with the adapters' GEMM sums assigned instead of accumulated (EMU_FAULT=gemm_accumulate) fails
# the loss or the adapter comparison; with nf4, the dequantization without the block scales' offset
# (EMU_FAULT=nf4_offset) fails the base's bit-identity.
#
# The reference and its tolerance. bf16 compute: the CUDA device keeps activations in bf16 (each
# operator rounds its output, unit roundoff u = 2^-8) and sums in its kernels' orders; the reference is
# the CPU device computing in bf16 (FSDP_CPU_BF16=emulate: every GEMM's operands rounded to bf16, fp32
# accumulation) from the same bf16 weights. What bf16 rounding does to this job is measured, not
# guessed: d, the distance between the CPU's bf16 run and its fp32 run (FSDP_CPU_BF16=off), the largest
# over the steps' losses (relative) and over the adapter tensors (norm-wise relative), each floored at
# 1e-5; the CUDA run must be within 4d of the reference, as run.sh's step 4 calibrates its gloo
# comparison (the CUDA device's roundings are another set of the same size, in other places and with
# other summation orders; 4d leaves room for twice d either way). AdamW runs with eps = 1: at PyTorch's
# 1e-8 every update is ±lr by its gradient's sign (|m̂/√v̂| ≈ 1), so an element whose gradient is below
# its rounding error takes either sign and the adapters' distance is the share of such elements (0.24
# norm-wise after 4 steps at lr 3e-2, T = 64, measured), which no rounding bound holds; with eps = 1
# (√v̂ ~ 1e-3 here) the update is lr·m̂/(1 + √v̂) ≈ lr·m̂, linear in the gradient, so the adapters
# differ by what their gradients do, and lr = 3 moves the loss by 2e-2 in 4 steps.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) nf4=${3:-}
EMU=$build/tests/gpu/fsdp-worker-emu CPU=$build/fsdp-worker CTL=$build/fsdpctl
for b in "$EMU" "$CPU" "$CTL"; do [ -x "$b" ] || { echo "lora_job.sh: $b is not built"; exit 1; }; done
STEPS=4 LR=3
tmp=$(mktemp -d /tmp/fsdp-emu-lora.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# cuDNN is the CUDA device's default attention; the stub library offers no engine, so the tensor-core
# kernel runs (as in gpu_emu)
export FSDP_CUDNN_LIB=$build/tests/gpu/libcudnn_stub.so
what=LoRA
[ -n "$nf4" ] && what=QLoRA
failed=()
part_fail() { echo "FAIL: $*"; failed+=("$*"); }

# the job (lora_ini: the one run.sh's step 3 runs on a GPU)
. "$src/tests/gpu/run_jobs.sh"
job() { lora_ini "$1" "$2" "$3" "$4" "$STEPS" "$nf4" "${5:-none}"; }
run() {   # run NAME WORKER INI [ENV=VALUE...]: 2 ranks; artefacts in $tmp/NAME
  local name=$1 worker=$2 ini=$3
  shift 3
  env "$@" FSDP_WORKER="$worker" FSDP_OUT="$tmp/$name" bash "$src/scripts/launch-standalone.sh" 2 "$ini" \
    --save "$tmp/$name/base.safetensors" --save-adapter "$tmp/$name/adapter" >/dev/null 2>"$tmp/$name.launch"
}
last_err() { tail -n 1 "$tmp/$1/rank-0.log" 2>/dev/null; }

# dist REF TEST: "DL DA", the two runs' loss and adapter distances (report.py lora)
dist() { python3 "$src/tests/gpu/report.py" lora "$1" "$2" --ranks 2 --steps "$STEPS"; }
# within NAME REF TEST CAL: within 4·max(1e-5, CAL) each (report.py lora --cal)
within() {
  local out rc=0
  out=$(python3 "$src/tests/gpu/report.py" lora "$2" "$3" --ranks 2 --steps "$STEPS" --cal "$4") || rc=$?
  echo "$1: $out"
  return $rc
}

# the measured peaks per category and the bytes sent are the CUDA plan's (+ the staged comm's buffer)
plan_check() {   # plan_check INI RUN
  "$CTL" plan "$1" --json >"$tmp/plan.json" 2>/dev/null
  python3 - "$tmp/plan.json" "$2" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
stage = min(64 << 20, max(4 * (plan["shard_world"] + 1) * u["shard_numel"] for u in plan["units"]))
want_mem = dict(plan["memory"])
want_mem["comm"] += stage
want_mem["total"] += stage
bad = 0
for r in (0, 1):
    rep = [json.loads(l) for l in open(f"{sys.argv[2]}/rank-{r}.jsonl") if l.startswith("{")][-1]
    for what, want, got in (("peak", want_mem, rep["peak_bytes"]), ("sent", plan["sent_bytes"], rep["sent_bytes"])):
        for k, v in got.items():
            if k in want and want[k] != v:
                print(f"rank {r}: {what} {k} measured {v}, plan {want[k]}")
                bad = 1
if not bad:
    print(f"measured = plan (device = cuda; comm and total + the staged buffer's {stage} bytes): peaks {rep['peak_bytes']}")
sys.exit(bad)
PY
}

# the calibration: the CPU in bf16 against the CPU in fp32; the control: training moves the loss
job "$tmp/cpu-sharded.ini" cpu sharded "$LR"
job "$tmp/cpu-frozen.ini" cpu sharded 1e-12
run cpu-frozen "$CPU" "$tmp/cpu-frozen.ini" FSDP_CPU_BF16=emulate &&
  run cpu-sharded "$CPU" "$tmp/cpu-sharded.ini" FSDP_CPU_BF16=emulate &&
  run cpu-fp32 "$CPU" "$tmp/cpu-sharded.ini" FSDP_CPU_BF16=off ||
  { echo "FAIL: a CPU reference run failed: $(last_err cpu-frozen) $(last_err cpu-sharded) $(last_err cpu-fp32)"; exit 1; }
cal=$(dist "$tmp/cpu-sharded" "$tmp/cpu-fp32")
echo "calibration: the CPU in bf16 against fp32 differs by $cal (losses, adapters): the tolerance is 4x each"
moved=$(dist "$tmp/cpu-sharded" "$tmp/cpu-frozen" 2>/dev/null)
python3 -c 'import sys; m, t = float(sys.argv[1].split()[0]), 4 * max(1e-5, float(sys.argv[2].split()[0])); print(f"training moves the loss by {m:.2e} from lr 1e-12 (needs > 3 x {t:.2e})"); sys.exit(m <= 3 * t)' \
  "$moved" "$cal" || part_fail "$what: the loss comparison could not tell a broken update from a working one"

# QLoRA: the sharded layout only (the replicated adapters' path does not touch the NF4 base, and
# LoRA's run covers it), to keep the test's emulated runs within CI's time
layouts="sharded"
[ -n "$nf4" ] || layouts+=" replicated sharded-offload"
for lay in $layouts; do
  # the CPU device has no offload: sharded-offload's reference is the CPU's sharded run
  ad=${lay%-offload} ref=cpu-${lay%-offload}
  job "$tmp/cuda-$lay.ini" cuda "$ad" "$LR" "$([ "$lay" = "$ad" ] && echo none || echo optimizer)"
  if [ "$lay" = replicated ]; then
    job "$tmp/cpu-$ad.ini" cpu "$ad" "$LR"
    run "cpu-$ad" "$CPU" "$tmp/cpu-$ad.ini" FSDP_CPU_BF16=emulate ||
      { part_fail "$what ($ad): the CPU run failed: $(last_err "cpu-$ad")"; continue; }
  fi
  s0=$SECONDS
  run "cuda-$lay" "$EMU" "$tmp/cuda-$lay.ini" ||
    { part_fail "$what ($lay): the emulated CUDA run failed: $(last_err "cuda-$lay")"; continue; }
  echo "$what ($lay): the emulated CUDA run took $((SECONDS - s0)) s"
  within "$what ($lay) cuda vs cpu" "$tmp/$ref" "$tmp/cuda-$lay" "$cal" ||
    part_fail "$what ($lay): the CUDA device's losses or adapters are not the CPU's"
  if cmp -s "$tmp/$ref/base.safetensors" "$tmp/cuda-$lay/base.safetensors"; then
    echo "  the base after training: bit for bit the CPU's${nf4:+ (the NF4 base as each device dequantized it)}"
  else
    part_fail "$what ($lay): the base saved after training is not the CPU run's bit for bit"
  fi
  plan_check "$tmp/cuda-$lay.ini" "$tmp/cuda-$lay" || part_fail "$what ($lay): the measured peaks or bytes are not the CUDA plan's"
done

# planted faults, one step each against a one-step CPU run: each must fail its comparison
lora_ini "$tmp/cpu-1.ini" cpu sharded "$LR" 1 "$nf4"
lora_ini "$tmp/cuda-1.ini" cuda sharded "$LR" 1 "$nf4"
run cpu-1 "$CPU" "$tmp/cpu-1.ini" FSDP_CPU_BF16=emulate || part_fail "$what: the one-step CPU run failed: $(last_err cpu-1)"
if [ -n "$nf4" ]; then
  :   # the adapters' sums are LoRA's control; QLoRA's is the dequantization's offset, below
elif ! run cuda-fault "$EMU" "$tmp/cuda-1.ini" EMU_FAULT=gemm_accumulate; then
  echo "control: EMU_FAULT=gemm_accumulate: the run failed ($(last_err cuda-fault)), as a broken job may"
elif STEPS=1 within "control: EMU_FAULT=gemm_accumulate" "$tmp/cpu-1" "$tmp/cuda-fault" "$cal"; then
  part_fail "$what: the adapters' sums assigned (EMU_FAULT=gemm_accumulate) passed the comparison"
fi
if [ -n "$nf4" ]; then
  if ! run cuda-nf4fault "$EMU" "$tmp/cuda-1.ini" EMU_FAULT=nf4_offset; then
    echo "control: EMU_FAULT=nf4_offset: the run failed ($(last_err cuda-nf4fault))"
  elif cmp -s "$tmp/cpu-1/base.safetensors" "$tmp/cuda-nf4fault/base.safetensors"; then
    part_fail "QLoRA: the dequantization without its offset (EMU_FAULT=nf4_offset) saved the CPU's base"
  else
    echo "control: EMU_FAULT=nf4_offset: the dequantized base differs from the CPU's, as it must"
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf '%s whole-job checks under the emulator: %d failed\n' "$what" "${#failed[@]}"
  exit 1
fi
echo "$what whole-job checks under the emulator: PASS"
