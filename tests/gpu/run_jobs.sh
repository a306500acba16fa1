# run_jobs.sh — sourced by tests/gpu/run.sh: the job files and launches of its steps 3-8, and what
# it does when a run fails (a kernel fault re-run under compute-sanitizer memcheck, a hang's host
# stacks). It uses run.sh's variables ($WORK, $BIN, $WRAP, ...) and helpers (log, allot, last_error).
# shellcheck shell=bash

# job_ini FILE DEVICE SHARDING COMM WORLD B GA STEPS LR L H C V T [PARAM_DTYPE [OFFLOAD]]
# ($JOB_MODEL_EXTRA: more [model] lines, e.g. Llama's arch and keys)
job_ini() {
  cat >"$1" <<JOB
[job]
name = gpucheck
steps = $8
seed = 1337
[model]
n_layer = ${10}
n_head = ${11}
n_embd = ${12}
vocab_size = ${13}
seq_len = ${14}
${JOB_MODEL_EXTRA:-}
[data]
train = synthetic:markov:7
batch_size = $6
grad_accum = $7
[optim]
lr = $9
min_lr = 0
schedule = constant
warmup_steps = 0
weight_decay = 0.1
grad_clip = 1.0
[fsdp]
world_size = $5
device = $2
sharding = $3
prefetch = 1
param_dtype = ${15:-bf16}
reduce_dtype = fp32
offload = ${16:-none}
comm = $4
timeout_s = 120
JOB
}
# lora_ini FILE DEVICE ADAPTERS LR STEPS [nf4] [OFFLOAD]: the LoRA job that tests/gpu/emu/lora_job.sh runs under the
# emulator and step 3 on the GPU: a tiny Llama (2 layers, C = 128, 2 heads of 64 over 1 kv head, SwiGLU
# 256, V = 256, T = 32, B = 2), seed 11, rank-4 adapters on all seven projections, 2 ranks over gloo
# (staged through pinned memory on a CUDA device), sharding full, bf16, AdamW with eps = 1 (linear in
# the gradient: lora_job.sh says why); with nf4 the base is NF4 (QLoRA); OFFLOAD: [fsdp] offload
# (default none).
lora_ini() {
  cat >"$1" <<JOB
[job]
steps = $5
seed = 11
[model]
arch = llama
n_layer = 2
n_head = 2
n_kv_head = 1
n_embd = 128
ffn_dim = 256
vocab_size = 256
seq_len = 32
[data]
train = synthetic:markov:7
batch_size = 2
grad_accum = 1
[optim]
lr = $4
min_lr = 0
schedule = constant
warmup_steps = 0
weight_decay = 0.1
grad_clip = 1.0
eps = 1
[fsdp]
world_size = 2
device = $2
sharding = full
param_dtype = bf16
reduce_dtype = fp32
offload = ${7:-none}
comm = gloo
timeout_s = 600
[lora]
rank = 4
alpha = 8
targets = q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
adapters = $3
$([ "${6:-}" = nf4 ] && echo "base_dtype = nf4")
JOB
}
# Step 3's LoRA and QLoRA: lora_ini's job (run_jobs.sh; what gpu_emu_lora and gpu_emu_qlora run
# under the emulator), 4 steps, adapters sharded, 2 ranks over gloo staged on the one GPU (LoRA also
# with offload = optimizer: AdamW on the host, against the same CPU reference). The
# reference is the CPU computing in bf16 (FSDP_CPU_BF16=emulate); the tolerance 4x the distance
# between it and the CPU in fp32 (losses relative, adapters norm-wise per tensor: report.py lora;
# tests/gpu/emu/lora_job.sh says why). lora_refs: the CPU runs (also in a dry run); lora_gpu NAME
# SECONDS: the GPU run and its checks, one line.
LORA_STEPS=4 LORA_LR=3 LORA_WHY=""
declare -A LORA_CAL=()
lora_refs() {
  local name nf t prec
  for name in lora qlora; do
    nf=""
    [ "$name" = qlora ] && nf=nf4
    lora_ini "$WORK/cpu-$name.ini" cpu sharded "$LORA_LR" "$LORA_STEPS" "$nf"
    for prec in emulate off; do
      t=$(allot 30 5) || { LORA_WHY="$name: no time left for the CPU references ($(no_time))"; return 1; }
      FSDP_CPU_BF16=$prec run_job "cpu-$name-$prec" 2 "$WORK/cpu-$name.ini" "$t" \
        --save "$WORK/runs/cpu-$name-$prec/base.safetensors" --save-adapter "$WORK/runs/cpu-$name-$prec/adapter" ||
        { LORA_WHY="CPU reference ($name, FSDP_CPU_BF16=$prec) failed: $(last_error "$WORK/runs/cpu-$name-$prec")"; return 1; }
    done
    LORA_CAL[$name]=$(python3 "$HELP" lora "$WORK/runs/cpu-$name-emulate" "$WORK/runs/cpu-$name-off" --ranks 2 \
      --steps "$LORA_STEPS" 2>/dev/null) || { LORA_WHY="$name: ${LORA_CAL[$name]}"; return 1; }
    echo "  $name: the CPU in bf16 against fp32: ${LORA_CAL[$name]} (losses, adapters)"
  done
}
lora_gpu() {
  local name=$1 nf="" out run=$WORK/runs/cuda-$1 ref=${1%-offload} offload=none
  [ "$name" = qlora ] && nf=nf4
  [ "$name" = "$ref" ] || offload=optimizer
  lora_ini "$WORK/cuda-$name.ini" cuda sharded "$LORA_LR" "$LORA_STEPS" "$nf" "$offload"
  FSDP_CUDA_ATTN=tc run_or_diagnose "cuda-$name" 2 "$WORK/cuda-$name.ini" "$2" \
    --save "$run/base.safetensors" --save-adapter "$run/adapter" || { last_error "$run"; return 1; }
  out=$(python3 "$HELP" lora "$WORK/runs/cpu-$ref-emulate" "$run" --ranks 2 --steps "$LORA_STEPS" --cal "${LORA_CAL[$ref]}") ||
    { echo "$out"; return 1; }
  cmp -s "$WORK/runs/cpu-$ref-emulate/base.safetensors" "$run/base.safetensors" ||
    { echo "the base saved after training is not the CPU's bit for bit${nf:+ (the NF4 dequantization)}; $out"; return 1; }
  echo "${out%%; ref *}; base bit for bit the CPU's"
}

# run_job NAME WORLD INI SECONDS [WORKER FLAGS...]: scripts/launch-standalone.sh with our worker ($RUN_WORKER,
# default the wrapper); artefacts in $WORK/runs/NAME, the launcher's messages in $WORK/runs/NAME.launch. A run
# still going after SECONDS (less 27 s, or half of SECONDS up to 54) has each rank's host stack written to NAME.stacks
# (host_stacks), one line per rank in NAME.launch, before it is killed, and returns 124.
run_job() {
  # the job's own deadline keeps 27 s of SECONDS for a hang's host stacks (17 s) and its kill (10 s),
  # so that a job never outlasts what allot gave it
  local dir=$WORK/runs/$1 pid wait_s=$(($4 > 54 ? $4 - 27 : $4 / 2))
  mkdir -p "$WORK/runs"
  : >"$dir.launch"   # appended to by the launcher and by this function alike
  FSDP_WORKER=${RUN_WORKER:-$WRAP/fsdp-worker} FSDP_OUT=$dir bash "$SRC/scripts/launch-standalone.sh" "$2" "$3" "${@:5}" \
    >/dev/null 2>>"$dir.launch" &
  pid=$!
  if ! timeout "$wait_s" tail --pid="$pid" -f /dev/null; then   # the deadline passed with the job running
    local ranks
    ranks=$(rank_pids "$pid")
    echo "timed out after $wait_s s" >>"$dir.launch"
    # shellcheck disable=SC2086
    host_stacks "$dir.stacks" $ranks
    sed -n 's/^stack: /  /p' "$dir.stacks" | tee -a "$dir.launch"
    kill -TERM "$pid" 2>/dev/null   # the launcher's trap stops its ranks
    # shellcheck disable=SC2086
    timeout 10 tail --pid="$pid" -f /dev/null || kill -KILL "$pid" $ranks 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
  fi
  wait "$pid"
}
# rank_pids PID: the processes below PID that run a rank (their command line has --rank).
rank_pids() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -q -- ' --rank ' && echo "$c"
    rank_pids "$c"
  done
}
# host_stacks OUT PID...: every thread's host stack of each PID into OUT, and per process one
# "stack: pid P: f1 < f2 < ..." line of its main thread's innermost frames. A GPU node often has no
# gdb: the first of gdb, cuda-gdb (both in batch mode, 15 s at most, all at once) that is there, else
# the kernel's view, each thread's /proc/P/task/T/wchan and (where readable: root) its kernel stack.
# FSDP_GPU_GDB / FSDP_GPU_CUDA_GDB name the debuggers (none: not used).
host_stacks() {
  local out=$1 p dbg="" c
  shift
  : >"$out"
  local cands=("${FSDP_GPU_GDB:-gdb}")
  if [ -n "${FSDP_GPU_CUDA_GDB:-}" ]; then cands+=("$FSDP_GPU_CUDA_GDB")
  else cands+=(cuda-gdb ${CUDA_HOME:+"$CUDA_HOME/bin/cuda-gdb"} /usr/local/cuda/bin/cuda-gdb); fi
  for c in "${cands[@]}"; do
    [ "$c" != none ] && command -v "$c" >/dev/null 2>&1 && { dbg=$(command -v "$c"); break; }
  done
  local dbgs=()
  for p in "$@"; do
    if [ -n "$dbg" ]; then
      timeout -k 2 15 "$dbg" -p "$p" -batch -nx -ex 'set pagination off' -ex 'thread apply all bt 16' >"$out.$p" 2>&1 &
      dbgs+=($!)
    else
      proc_stacks "$p" >"$out.$p"
    fi
  done
  [ ${#dbgs[@]} -eq 0 ] || wait "${dbgs[@]}"
  for p in "$@"; do
    { echo "=== pid $p ($([ -n "$dbg" ] && basename "$dbg" || echo /proc)): $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"; cat "$out.$p"; } >>"$out"
    if [ -n "$dbg" ]; then echo "stack: pid $p: $(python3 "$HELP" stack "$out.$p")" >>"$out"
    else echo "stack: pid $p: $(python3 "$HELP" stack --proc "$out.$p")" >>"$out"; fi
    rm -f "$out.$p"
  done
}
# proc_stacks PID: "Thread N (tid T, COMM): wchan W" and the kernel stack's lines for every thread.
proc_stacks() {
  local t n=0
  for t in /proc/"$1"/task/*; do
    [ -d "$t" ] || continue
    n=$((n + 1))
    echo "Thread $n (tid ${t##*/}, $(cat "$t/comm" 2>/dev/null)): wchan $(cat "$t/wchan" 2>/dev/null || echo '?')"
    sed 's/^/  /' "$t/stack" 2>/dev/null
  done
  [ "$n" -gt 0 ] || echo "no /proc/$1/task (the process is gone)"
}
# A failed run whose message is a fault of the device (a kernel or copy failed, an illegal address)
# does not name the kernel: memcheck_rerun NAME WORLD INI reruns one step of it under
# compute-sanitizer --tool memcheck, within the budget, and prints the first error's kernel and
# access (nothing when there is no fault, no sanitizer or no time).
CUDA_FAULT='a kernel or copy failed|illegal (memory access|address|instruction)|misaligned address'
CUDA_FAULT+='|unspecified launch failure|cudaErrorLaunchFailure|cudaErrorIllegal|cudaErrorMisaligned|hardware stack error'
memcheck_rerun() {
  local cs t ini=$WORK/$1-memcheck.ini log=$WORK/runs/$1-memcheck.log
  grep -qE "$CUDA_FAULT" "$WORK/runs/$1.launch" "$WORK/runs/$1"/rank-*.log 2>/dev/null || return 0
  cs=$(find_sanitizer) || { echo "no compute-sanitizer here to name the kernel"; return 0; }
  t=$(allot 120 30) || { echo "no time left for compute-sanitizer memcheck"; return 0; }
  sed 's/^steps = .*/steps = 1/' "$3" >"$ini"
  printf '#!/bin/sh\nexec "%s" --tool memcheck --print-limit 5 --error-exitcode 3 "%s" "$@"\n' "$cs" "$WRAP/fsdp-worker" \
    >"$WRAP/fsdp-worker-memcheck"
  chmod +x "$WRAP/fsdp-worker-memcheck"
  RUN_WORKER=$WRAP/fsdp-worker-memcheck run_job "$1-memcheck" "$2" "$ini" "$t" >/dev/null
  cat "$WORK/runs/$1-memcheck"/rank-*.log >"$log" 2>/dev/null
  python3 "$HELP" memcheck "$log"
}
# run_or_diagnose NAME WORLD INI SECONDS: run_job; on a device fault, memcheck's account of it is
# added to NAME.launch (last_error shows it).
run_or_diagnose() {
  run_job "$@" && return 0
  local rc=$? why
  why=$(memcheck_rerun "$1" "$2" "$3")
  [ -z "$why" ] || echo "memcheck: $why" >>"$WORK/runs/$1.launch"
  return "$rc"
}
