#!/usr/bin/env bash
# tests/gpu/run.sh — every check that needs a GPU, in one call of at most 8 minutes (docs/gpu.md).
#
#   bash tests/gpu/run.sh [--dry-run] [--only 2,6] [--budget SECONDS] [--strict-targets]
#
# Steps, in the order 1 2 6 7 3 4 5 8 9, each within its allotment (seconds: minimum-maximum) and
# with one "run.sh: [N] name: PASS|FAIL|SKIP: detail" line:
#   1 binaries + GPU   10-40  unpack .gpubundle (scripts/gpu-bundle.sh, built on the dev machine for
#                      sm_90), start them natively or through the carried glibc loader; nvidia-smi;
#                      the versions of cuDNN, cuBLASLt, NCCL and the driver
#   2 gpu_check        30-50  every CUDA kernel against its CPU twin, the comms (and NCCL's spans), the
#                      bf16 GEMM rate
#   6 benchmark        45-75  GPT-2 124M, B = 16, T = 1024, bf16, world 1: tokens/s, MFU by PaLM's and
#                      llm.c's counts, step phases, peak vs plan, exposed comm; nvidia-smi's clocks
#                      and throttle reasons before and after; cuDNN's debug log where it fell back
#   7 PyTorch          90-105 bench/torch_step.py --device cuda, eager and torch.compile, for the ratio
#   3 cuda vs cpu      30-75  5 steps of full, grad_op, none (grad_accum 2), full with offload, and a
#                      Llama (GQA) in full, losses within rtol 2e-2 of the CPU's; a LoRA (also with
#                      offload) and a QLoRA job (2 ranks, gloo staged), losses and adapters within 4x
#                      the CPU's own bf16-vs-fp32 distance of the CPU's in bf16, the saved base bit
#                      for bit the CPU's
#   4 gloo-staged      30-40  N = 2 and N = 1 ranks on the one GPU, within a tolerance calibrated from
#                      two N = 1 runs; then N = 4 as sharding = hybrid, 2 groups of 2
#   5 racecheck        20-25  one short step under compute-sanitizer --tool racecheck on fsdpd's own
#                      attention (FSDP_CUDA_ATTN=tc); cuBLASLt's and cuDNN's kernels left out
#   8 async ckpt       20-25  a save taken asynchronously on the GPU (pinned snapshot copied on its own
#                      stream while the next step runs) writes the same bytes as a synchronous one,
#                      and resuming from each gives the same losses, bit for bit
#   9 table            15     printed last and written to $OUT/gpu_report.md and gpu_report.json
# The maxima and the table sum to 450 s (--dry-run prints the account). cuDNN runs only where it is
# measured (steps 2, 6, and step 3's full and Llama runs); the rest use fsdpd's tensor-core attention.
# A GPU job that fails with a device fault is re-run for one step under compute-sanitizer memcheck
# (naming the kernel); one still running at its deadline has each rank's host stack taken (gdb, else
# cuda-gdb, else /proc/PID/task/*/wchan and stack) before it is killed.
# A failing step does not stop the next ones. Exit status: 0 nothing FAILED; 1 a step FAILED (with
# --strict-targets also a missed performance target); 2 no GPU (and nothing failed) outside --dry-run.
#
# --dry-run: no GPU is used even where one exists: the GPU steps say SKIP, and everything else runs
#   for real (unpacking or finding the binaries, the CPU reference runs, the plan, the table).
# --only LIST: run only these steps (1 and 9 always run), e.g. a rerun of 3,6 in the time left.
# --budget S: the whole run's deadline (default 450 s). Each step gets its maximum, cut to what the
#   budget leaves after the table and the maxima of steps 6 and 7 still to come; a step whose cut
#   allotment is under its minimum SKIPs saying so; a step never FAILs for want of time.
# Binaries, first found: $FSDP_GPU_BIN (a build directory: fsdp-worker, fsdpctl, tests/gpu/gpu_check),
#   $FSDP_GPU_BUNDLE or .gpubundle/fsdp-gpu-bundle.tar.xz, else a CUDA build into build-gpu here
#   (needs scripts/install-deps.sh's packages; it may use the budget but for steps 6 and 7). Logs:
#   $OUT (default /tmp/fsdp-gpu-report), under 15 MiB in all: logs.tar.gz (every text file of the
#   run, never a checkpoint; the largest cut to head and tail to fit), gpu_check.log, the report.
# For tests of this script (tests/integration/gpu_run_script.sh): FSDP_GPU_PRETEND=NAME takes NAME for
#   the GPU without asking nvidia-smi (so the GPU steps run and must fail cleanly where there is
#   none); FSDP_GPU_FORCE_LOADER=1 starts the bundle through its carried loader even where the
#   native one would do; FSDP_GPU_PYTHON is the python3 for PyTorch (default python3);
#   FSDP_GPU_SANITIZER is compute-sanitizer's path (none: step 5 SKIPs); FSDP_GPU_SMI is nvidia-smi's
#   (also asked for the clocks under FSDP_GPU_PRETEND); FSDP_GPU_GDB and FSDP_GPU_CUDA_GDB name
#   the debuggers for host stacks (none: not used); FSDP_GPU_TIME_SCALE=K (an integer, default 1)
#   multiplies the budget, every step's minimum and maximum and every job's time: CPU stand-ins on a
#   busy machine take longer than the GPU jobs the allotments are sized for.
# The steps are called as "step$s" and the cleanup from a trap: shellcheck cannot see those calls.
# shellcheck disable=SC2317
set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HELP=$SRC/tests/gpu/report.py
PY=${FSDP_GPU_PYTHON:-python3}
DRY=${FSDP_GPU_DRY_RUN:-0}
ONLY=""
BUDGET=${FSDP_GPU_BUDGET_S:-450}
STRICT=0
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --only) ONLY=${2:-}; shift ;;
    --only=*) ONLY=${1#--only=} ;;
    --budget) BUDGET=${2:-}; shift ;;
    --budget=*) BUDGET=${1#--budget=} ;;
    --strict-targets) STRICT=1 ;;
    -h|--help) sed -n '2,/the debuggers for host stacks/p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $BUDGET in ''|*[!0-9]*) echo "run.sh: --budget needs whole seconds, got '$BUDGET'" >&2; exit 2 ;; esac
case $ONLY in *[!0-9,]*) echo "run.sh: --only needs step numbers like 3,6, got '$ONLY'" >&2; exit 2 ;; esac

OUTDIR=${OUT:-/tmp/fsdp-gpu-report}
mkdir -p "$OUTDIR" || { echo "run.sh: cannot create $OUTDIR" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-gpucheck.XXXXXX") || exit 2
RESULTS=$WORK/results.tsv
METRICS=$WORK/metrics.jsonl
: >"$RESULTS"
: >"$METRICS"
T0=$SECONDS
# The report ($OUTDIR) stays under REPORT_LIMIT bytes whatever ran, so that it can be copied off the
# node: gpu_check.log and gpu_build.log are cut to their first and last 2 MiB, and logs.tar.gz
# (report.py pack: text files only, never checkpoints or the bundle) gets what is left less 256 KiB
# for the table, which is written before this trap runs, and the operator's run.log.
REPORT_LIMIT=$((15 * 1024 * 1024))
cut_log() {
  local f=$1 half=$((2 * 1024 * 1024))
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt $((2 * half)) ] || return 0
  { head -c "$half" "$f"; printf '\n[run.sh: cut to its first and last 2 MiB]\n'; tail -c "$half" "$f"; } >"$f.cut" && mv "$f.cut" "$f"
}
finish() {
  local f others=0
  cut_log "$OUTDIR/gpu_check.log"
  cut_log "$OUTDIR/gpu_build.log"
  rm -f "$OUTDIR/logs.tar.gz"
  for f in "$OUTDIR"/*; do [ -f "$f" ] && others=$((others + $(stat -c %s "$f"))); done
  python3 "$HELP" pack "$WORK" "$OUTDIR/logs.tar.gz" --limit $((REPORT_LIMIT - 256 * 1024 - others)) >/dev/null ||
    echo "run.sh: the logs could not be packed into $OUTDIR/logs.tar.gz" >&2
  rm -rf "$WORK"
}
trap finish EXIT

log() { echo "== run.sh [$((SECONDS - T0)) s] $*"; }
# result STEP NAME STATUS DETAIL SECONDS
result() {
  local detail=${4//$'\n'/ }
  detail=${detail//$'\t'/ }
  echo "run.sh: [$1] $2: $3: $detail"
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${5:-0}" "$detail" >>"$RESULTS"
}
# metric KEY VALUE: a number, or (quoted by this function) a string
metric() {
  if [[ $2 =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; then
    printf '{"%s": %s}\n' "$1" "$2" >>"$METRICS"
  else
    python3 -c 'import json, sys; print(json.dumps({sys.argv[1]: sys.argv[2]}))' "$1" "$2" >>"$METRICS"
  fi
}
metric_json() { echo "$1" >>"$METRICS"; }   # a whole JSON object
selected() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
# The budget. Steps run in the order 1 2 6 7 3 4 5 8: the benchmark and the PyTorch comparison
# before the least predictable steps. Each step has a minimum and a maximum (seconds, below); a
# step starts with the time to its end fixed (STEP_END): its maximum, cut to what the budget leaves
# after 15 s for the table and the maxima of the protected steps (6, 7) still to run (each while
# it could still get its minimum). A step
# whose cut allotment is under its minimum SKIPs saying so, without starting. The maxima sum to
# at most the 450 s default budget less the table's 15 s (--dry-run prints the account).
STEP_ORDER=(1 2 6 7 3 4 5 8)
declare -A STEP_MIN=([1]=10 [2]=30 [6]=45 [7]=90 [3]=30 [4]=30 [5]=20 [8]=20)
declare -A STEP_MAX=([1]=40 [2]=50 [6]=75 [7]=105 [3]=75 [4]=40 [5]=25 [8]=25)
PROTECTED=" 6 7 "
TIME_SCALE=${FSDP_GPU_TIME_SCALE:-1}
[[ $TIME_SCALE =~ ^[1-9][0-9]?$ ]] || { echo "run.sh: FSDP_GPU_TIME_SCALE=$TIME_SCALE: allowed: an integer 1..99" >&2; exit 2; }
if [ "$TIME_SCALE" -gt 1 ]; then
  BUDGET=$((BUDGET * TIME_SCALE))
  for s in "${STEP_ORDER[@]}"; do STEP_MIN[$s]=$((STEP_MIN[$s] * TIME_SCALE)) STEP_MAX[$s]=$((STEP_MAX[$s] * TIME_SCALE)); done
fi
TABLE_S=15
STEP_END=0 STEP_NOW="" STEP_GOT=0
# step_window STEP REST...: sets STEP_END for STEP (REST: the steps after it still to run); fails
# with STEP_WHY when its allotment would be under its minimum.
step_window() {
  local s=$1 r keep=0 left kept="" total=$((BUDGET - (SECONDS - T0) - TABLE_S))
  shift
  # step 1 comes first whatever is kept: without its binaries no step runs. A protected step is
  # kept its maximum only while it could still get its minimum after this step's minimum.
  if [ "$s" != 1 ]; then
    for r in "$@"; do
      { [[ $PROTECTED == *" $r "* ]] && selected "$r"; } || continue
      [ $((total - keep - STEP_MIN[$s])) -ge "${STEP_MIN[$r]}" ] || continue
      keep=$((keep + STEP_MAX[$r]))
      kept+=" $r"
    done
  fi
  left=$((total - keep))
  STEP_GOT=$((left < STEP_MAX[$s] ? left : STEP_MAX[$s]))
  STEP_NOW=$s
  if [ "$STEP_GOT" -lt "${STEP_MIN[$s]}" ]; then
    STEP_WHY="needs at least ${STEP_MIN[$s]} s and the ${BUDGET} s budget leaves $((left > 0 ? left : 0)) s"
    [ "$keep" -eq 0 ] || STEP_WHY+=" after the $keep s kept for step$([ ${#kept} -gt 2 ] && echo s)$kept"
    return 1
  fi
  STEP_END=$((SECONDS + STEP_GOT))
}
# step_account: the budget by the script's own accounting, one line (and a metric)
step_account() {
  local s sum=0 parts=""
  for s in "${STEP_ORDER[@]}"; do sum=$((sum + STEP_MAX[$s])); parts+="${parts:+ + }$s: ${STEP_MAX[$s]}"; done
  echo "budget: step maxima $parts = $sum s, + $TABLE_S s for the table = $((sum + TABLE_S)) s of $BUDGET s"
  metric_json "{\"budget_account\": {\"maxima\": $sum, \"table\": $TABLE_S, \"budget\": $BUDGET}}"
}
# allot WANT MIN: the seconds a job of the running step may take: WANT, cut to what is left of the
# step's allotment; fails when fewer than MIN remain.
allot() {
  local left=$((STEP_END - SECONDS)) want=$(($1 * TIME_SCALE)) min=$(($2 * TIME_SCALE))
  [ "$left" -ge "$min" ] || return 1
  echo $((left < want ? left : want))
}
# no_time: why a job of the running step did not start
no_time() { echo "step $STEP_NOW's $STEP_GOT s allotment is spent ($((STEP_END - SECONDS)) s left)"; }
# last_error RUNDIR: the launcher's one-line account of a failed run (the failing rank's last line).
last_error() {
  local m mc
  mc=$(grep -h '^memcheck: ' "$1.launch" 2>/dev/null | head -n 1)
  if grep -q '^timed out after' "$1.launch" 2>/dev/null; then
    echo "$(grep -m1 '^timed out after' "$1.launch"); host stacks: $(sed -n 's/^  pid /pid /p' "$1.launch" | paste -sd';')"
    return
  fi
  m=$(grep -h 'failed:' "$1.launch" 2>/dev/null | head -n 1)
  [ -n "$m" ] || m=$(tail -n 1 "$1.launch" 2>/dev/null)
  [ -n "$m" ] || m="no output"
  m=${m#*launch-standalone.sh: }
  # "rank 0 failed: 2026-...Z ERROR worker[0] main.c:127: MESSAGE" -> "rank 0: MESSAGE"
  echo "$m${mc:+; $mc}" | sed -E 's/^rank ([0-9]+) failed: [0-9TZ:.-]+ ERROR [^ ]+ [^ ]+: /rank \1: /'
}

# ---------------------------------------------------------------- jobs (run_jobs.sh)
. "$SRC/tests/gpu/run_jobs.sh"

# ---------------------------------------------------------------- step 1: binaries and the GPU
WRAP=$WORK/wrap
mkdir -p "$WRAP"
GPU=""            # the GPU's description; empty: no GPU steps
GPU_CHECK_BIN=""  # the real gpu_check the wrapper starts
GPU_UNVERIFIED="" # 1: no nvidia-smi, so gpu_check's CUDA probe decides whether there is a GPU
NO_GPU_WHY=""
# The carried OpenBLAS does not know every CPU: the wrappers give it kernels this CPU has, and set
# OMP_WAIT_POLICY, so that fsdp-worker and gpu_check never re-execute themselves through
# /proc/self/exe to set these (which the carried loader could not survive).
CORETYPE=${OPENBLAS_CORETYPE:-}
if [ -z "$CORETYPE" ] && [ -r /proc/cpuinfo ]; then
  if grep -qw avx512f /proc/cpuinfo; then CORETYPE=SkylakeX; elif grep -qw avx2 /proc/cpuinfo; then CORETYPE=Haswell; fi
fi
ENVSET="OMP_WAIT_POLICY=\${OMP_WAIT_POLICY:-passive}${CORETYPE:+ OPENBLAS_CORETYPE=$CORETYPE}"

# find_dir SONAME: a directory on this machine holding it (the CUDA toolkit, the driver, pip wheels).
find_dir() {
  local so=$1 d f sp
  for d in ${CUDA_HOME:+"$CUDA_HOME/lib64"} ${CUDAToolkit_ROOT:+"$CUDAToolkit_ROOT/lib64"} /usr/local/cuda/lib64 \
           /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
           /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu; do
    [ -e "$d/$so" ] && { echo "$d"; return 0; }
  done
  f=$(ldconfig -p 2>/dev/null | awk -v s="$so" '$1 == s {print $NF; exit}')
  [ -n "$f" ] && { dirname "$f"; return 0; }
  for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    f=$(find "$sp/nvidia" -name "$so" -print -quit 2>/dev/null)
    [ -n "$f" ] && { dirname "$f"; return 0; }
  done
  # the last resort, inside step 1's allotment like every search
  f=$(timeout "$(allot 30 2 || echo 1)" find /usr /opt -name "$so" -print -quit 2>/dev/null)
  [ -n "$f" ] && { dirname "$f"; return 0; }
  return 1
}
# find_cudnn: the node's libcudnn.so.9 (never carried: the bundle's MANIFEST.txt names it expected_from_node),
# exported as FSDP_CUDNN_LIB for the workers and gpu_check: $FSDP_CUDNN_LIB, else PyTorch's wheel
# (nvidia/cudnn/lib beside $PY's torch), else the loader's cache. None: the attention runs on the
# tensor-core kernel (ops_cuda_cudnn.h) and the table says so.
CUDNN=""
find_cudnn() {
  local f=${FSDP_CUDNN_LIB:-}
  [ -n "$f" ] || f=$(timeout "$(allot 15 2 || echo 1)" "$PY" -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib", "libcudnn.so.9"))' 2>/dev/null || true)
  [ -n "$f" ] && [ -e "$f" ] || f=$(ldconfig -p 2>/dev/null | awk '$1 == "libcudnn.so.9" {print $NF; exit}')
  if [ -n "$f" ] && [ -e "$f" ]; then
    CUDNN=$f
    export FSDP_CUDNN_LIB=$f
    metric cudnn_lib "$f"
  else
    metric cudnn_lib "none found on this node (FSDP_CUDNN_LIB, PyTorch's nvidia/cudnn, ldconfig): attention on tensor cores"
  fi
}
# lib_versions: the versions of the libraries fsdp-worker runs with (the ones its wrapper resolves,
# and the cuDNN found above), from each library's own version call (report.py versions), and the
# driver's; the metrics "versions" and, per library, its path.
SMI=""
lib_versions() {
  local libs out
  libs=$(FSDP_WRAP_LIST=1 "$WRAP/fsdp-worker" 2>/dev/null | awk '/libcublasLt|libnccl|libcuda\.so/ && $3 ~ /^\// {print $3}')
  # shellcheck disable=SC2086
  out=$(timeout "$(allot 20 2 || echo 2)" python3 "$HELP" versions $libs ${CUDNN:+"$CUDNN"} 2>&1) ||
    out="{\"versions\": \"report.py versions failed: ${out//\"/\'}\"}"
  metric_json "$out"
  echo "  libraries: $(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["versions"])' "$out" 2>/dev/null)"
}
# smi_clocks WHEN: nvidia-smi -q -d CLOCK,PERFORMANCE into runs/smi-WHEN.txt and its clocks and
# active throttle reasons as the metric clocks_WHEN (nothing without nvidia-smi)
smi_clocks() {
  [ -n "$SMI" ] || { metric "clocks_$1" "no nvidia-smi"; return; }
  mkdir -p "$WORK/runs"
  timeout "$(allot 10 2 || echo 2)" "$SMI" -q -d CLOCK,PERFORMANCE >"$WORK/runs/smi-$1.txt" 2>&1
  metric "clocks_$1" "$(python3 "$HELP" smi "$WORK/runs/smi-$1.txt")"
}
# attention_ran DIR: which attention a job's rank 0 ran, from the lines its log has (ops_cuda_cudnn_run.c)
attention_ran() {
  local log=$1/rank-0.log fb
  fb=$(grep -m1 -o 'attention: .*; the tensor-core kernel runs instead' "$log" 2>/dev/null)
  if [ -n "$fb" ]; then echo "tc: cuDNN did not run (${fb#attention: })"
  elif grep -q 'attention: cuDNN [0-9]' "$log" 2>/dev/null; then echo "cudnn: $(grep -m1 -o 'cuDNN [0-9.]* from [^ ]*' "$log")"
  else echo "${FSDP_CUDA_ATTN:-cudnn} (FSDP_CUDA_ATTN; the log names no cuDNN)"; fi
}
# write_wrappers MODE LIBPATH DIR [LDSO]: $WRAP/{fsdp-worker,fsdpctl,gpu_check} start DIR's binaries
# (gpu_check also as DIR/tests/gpu/gpu_check, a build tree's place) with their libraries: the native
# loader with LD_LIBRARY_PATH, or the carried loader. FSDP_WRAP_LIST=1 lists the libraries instead.
write_wrappers() {
  local mode=$1 lp=$2 dir=$3 ldso=${4:-} b path
  for b in fsdp-worker fsdpctl gpu_check; do
    path=$dir/$b
    if [ "$b" = gpu_check ]; then
      [ -e "$path" ] || path=$dir/tests/gpu/gpu_check
      GPU_CHECK_BIN=$path
    fi
    if [ "$mode" = loader ]; then
      cat >"$WRAP/$b" <<EOF
#!/bin/sh
[ -n "\${FSDP_WRAP_LIST:-}" ] && exec "$ldso" --library-path "$lp" --list "$path"
export $ENVSET
exec "$ldso" --library-path "$lp" "$path" "\$@"
EOF
    else
      cat >"$WRAP/$b" <<EOF
#!/bin/sh
${lp:+export LD_LIBRARY_PATH="$lp\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"}
[ -n "\${FSDP_WRAP_LIST:-}" ] && export LD_TRACE_LOADED_OBJECTS=1
export $ENVSET
exec "$path" "\$@"
EOF
    fi
    chmod +x "$WRAP/$b"
  done
}
# wrappers_start: every binary finds every library (with the right symbol versions) and the two
# that have --help answer it. gpu_check may be absent (a build without the CUDA backend): step 2 says so.
wrappers_start() {
  local b out
  for b in fsdp-worker fsdpctl gpu_check; do
    [ "$b" = gpu_check ] && [ ! -e "$GPU_CHECK_BIN" ] && continue
    out=$(FSDP_WRAP_LIST=1 "$WRAP/$b" 2>&1) || { START_WHY="$b: $(echo "$out" | grep -m1 -E 'not found|error|version' || echo "$out" | head -n 1)"; return 1; }
    if echo "$out" | grep -qE 'not found|version .* not found'; then
      START_WHY="$b: $(echo "$out" | grep -m1 'not found' | sed 's/^[[:space:]]*//')"
      return 1
    fi
  done
  for b in fsdp-worker fsdpctl; do
    # LD_BIND_NOW: a symbol missing from this machine's libnccl/libcublasLt fails here, not mid-run
    out=$(LD_BIND_NOW=1 "$WRAP/$b" --help 2>&1 >/dev/null) || { START_WHY="$b --help: $(echo "$out" | head -n 1)"; return 1; }
  done
  return 0
}

find_smi() {
  local c
  for c in "${FSDP_GPU_SMI:-}" "$(command -v nvidia-smi 2>/dev/null)" /usr/local/nvidia/bin/nvidia-smi /usr/bin/nvidia-smi; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

step1() {
  local s0=$SECONDS t mode="" why="" started="" bundle tarball
  log "step 1: binaries and the GPU"
  t=$(allot 40 10) || { result 1 "binaries + GPU" FAIL "$(no_time)"; return; }
  if [ -n "${FSDP_GPU_BIN:-}" ]; then
    local d=$FSDP_GPU_BIN
    case $d in /*) ;; *) d=$SRC/$d ;; esac
    write_wrappers native "" "$d"
    mode="build directory $d"
  else
    tarball=${FSDP_GPU_BUNDLE:-$SRC/.gpubundle}/fsdp-gpu-bundle.tar.xz
    if [ -f "$tarball" ]; then
      mkdir -p "$WORK/bundle"
      if ! timeout "$t" tar -C "$WORK/bundle" -xJf "$tarball" 2>"$WORK/untar.log"; then
        # no xz(1) here: Python's tarfile reads xz itself
        timeout "$(allot 40 5 || echo 5)" python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[1]); t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' \
          "$tarball" "$WORK/bundle" 2>>"$WORK/untar.log" ||
          { result 1 "binaries + GPU" FAIL "cannot unpack $tarball: $(tail -n 1 "$WORK/untar.log")" $((SECONDS - s0)); return; }
      fi
      bundle=$WORK/bundle/fsdp-gpu-bundle
      sed 's/^/  bundle /' "$bundle/MANIFEST.txt"
      # the libraries the bundle leaves to this machine (libcublasLt, libnccl), and the driver's
      local ext="" so d missing=""
      for so in $(sed -n 's/^external: //p' "$bundle/MANIFEST.txt") libcuda.so.1; do
        if d=$(find_dir "$so"); then
          [[ ":$ext:" == *":$d:"* ]] || ext=${ext:+$ext:}$d
          echo "  $so: $d"
        elif [ "$so" != libcuda.so.1 ]; then
          missing="$missing $so"
        fi
      done
      [ -z "$missing" ] || { result 1 "binaries + GPU" FAIL "not on this machine:$missing (the bundle leaves them to the CUDA toolkit / pip wheels)" $((SECONDS - s0)); return; }
      local host_lp=${LD_LIBRARY_PATH:-}
      write_wrappers native "$bundle/lib${ext:+:$ext}" "$bundle/bin"
      if [ -n "${FSDP_GPU_FORCE_LOADER:-}" ]; then
        START_WHY="not tried (FSDP_GPU_FORCE_LOADER)"
      elif wrappers_start; then
        started=1
        mode="bundle, native loader (glibc $(ldd --version 2>/dev/null | head -n 1 | awk '{print $NF}'))"
      fi
      if [ -z "$started" ]; then
        why=$START_WHY
        echo "  native start failed ($why); trying the carried glibc loader"
        write_wrappers loader "$bundle/glibc:$bundle/lib${ext:+:$ext}${host_lp:+:$host_lp}" "$bundle/bin" \
          "$bundle/glibc/ld-linux-x86-64.so.2"
        if wrappers_start; then
          started=1
          mode="bundle, carried glibc loader (native: $why)"
        else
          result 1 "binaries + GPU" FAIL "the bundle's binaries do not start: natively $why; through the carried loader $START_WHY" $((SECONDS - s0))
          return
        fi
      fi
    else
      # No bundle: build here (a machine with scripts/install-deps.sh's packages and the toolkit).
      local build=${FSDP_GPU_BUILD:-$SRC/build-gpu} arch=${FSDP_CUDA_ARCH:-90}
      # building is the one thing that may take more than step 1's maximum: it may use what the
      # budget leaves after the table and the protected steps' maxima (the later steps are cut)
      STEP_END=$((T0 + BUDGET - TABLE_S - STEP_MAX[6] - STEP_MAX[7]))
      t=$(allot 600 30) || { result 1 "binaries + GPU" FAIL "no .gpubundle, and no time to build here: $(no_time)" $((SECONDS - s0)); return; }
      log "no bundle ($tarball): building $build for sm_$arch (at most $t s)"
      # shellcheck disable=SC2016
      if ! timeout -k 10 "$t" bash -c 'cmake -S "$1" -B "$2" -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$3" &&
             cmake --build "$2" -j"$(nproc)" --target fsdp-worker fsdpctl gpu_check' _ "$SRC" "$build" "$arch" \
             >"$OUTDIR/gpu_build.log" 2>&1; then
        result 1 "binaries + GPU" FAIL "no .gpubundle (run scripts/gpu-bundle.sh on the dev machine and carry .gpubundle) and building here failed: $(grep -m1 -iE 'error|not found' "$OUTDIR/gpu_build.log")" $((SECONDS - s0))
        return
      fi
      write_wrappers native "" "$build"
      mode="built here in $build"
    fi
  fi
  if [ -z "$started" ] && ! wrappers_start; then
    result 1 "binaries + GPU" FAIL "the binaries do not start ($mode): $START_WHY" $((SECONDS - s0))
    return
  fi
  BIN_OK=1
  metric binaries "$mode"
  # The GPU.
  if [ "$DRY" = 1 ]; then
    NO_GPU_WHY="dry run"
  elif [ -n "${FSDP_GPU_PRETEND:-}" ]; then
    GPU="$FSDP_GPU_PRETEND (FSDP_GPU_PRETEND: not asked of nvidia-smi)"
    [ -z "${FSDP_GPU_SMI:-}" ] || SMI=$FSDP_GPU_SMI   # a test's stand-in, for the clocks
  elif ! SMI=$(find_smi); then
    # no nvidia-smi: let CUDA decide (step 2's gpu_check; without it, the GPU steps try and say)
    GPU="unknown (no nvidia-smi here; gpu_check asks CUDA)"
    GPU_UNVERIFIED=1
  else
    local q
    q=$(timeout "$(allot 20 2 || echo 1)" "$SMI" --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1)
    if [ -z "$q" ] || echo "$q" | grep -qiE 'fail|error|no devices|not found'; then
      NO_GPU_WHY="no GPU: nvidia-smi says: ${q:-nothing}"
    else
      GPU=$q
      timeout "$(allot 10 2 || echo 1)" "$SMI" -L 2>&1 | sed 's/^/  /'
    fi
  fi
  metric gpu "${GPU:-none ($NO_GPU_WHY)}"
  find_cudnn
  lib_versions
  result 1 "binaries + GPU" PASS "$mode; GPU: ${GPU:-none ($NO_GPU_WHY)}" $((SECONDS - s0))
}

# ---------------------------------------------------------------- step 2: gpu_check
GEMM=""
step2() {
  local s0=$SECONDS t rc
  log "step 2: gpu_check (log: $OUTDIR/gpu_check.log)"
  if [ ! -e "$GPU_CHECK_BIN" ]; then
    if [ -n "$GPU" ]; then result 2 gpu_check FAIL "$GPU_CHECK_BIN is missing: a build without the CUDA backend?"
    else result 2 gpu_check SKIP "$NO_GPU_WHY (and no gpu_check: a build without the CUDA backend)"; fi
    return
  fi
  t=$(allot 55 30) || { result 2 gpu_check SKIP "$(no_time)"; return; }
  # with a libcudnn found and cuDNN selected, gpu_check fails if the attention falls back to tensor cores
  local fallback=""
  [ -n "$CUDNN" ] && [ "${FSDP_CUDA_ATTN:-cudnn}" = cudnn ] && fallback=0
  mkdir -p "$WORK/runs"
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=$WORK/runs/gpu_check.cudnn.log CUBLASLT_LOG_LEVEL=1 \
    CUBLASLT_LOG_FILE=$WORK/runs/gpu_check.cublaslt.%i.log \
    GPU_CHECK_ATTN_FALLBACK=$fallback timeout -k 10 "$t" "$WRAP/gpu_check" >"$OUTDIR/gpu_check.log" 2>&1
  rc=$?
  grep -E '^device 0:|^random inputs|GEMM rate .*TFLOP|FAIL|SKIPPED|^gpu_check:|attention with cuDNN' "$OUTDIR/gpu_check.log" | head -n 40 | sed 's/^/  /'
  GEMM=$(sed -n 's/^bf16 GEMM rate 8192^3 .* \([0-9.]*\) TFLOP\/s$/\1/p' "$OUTDIR/gpu_check.log" | head -n 1)
  [ -n "$GEMM" ] && { metric gemm_tflops "$GEMM"; metric gemm_source "gpu_check: ops_cuda_matmul_forward, 8192^3, random bf16"; }
  local summary
  local att
  att=$(grep -m1 'attention with cuDNN selected' "$OUTDIR/gpu_check.log" | sed 's/^attention with cuDNN selected *//')
  [ -z "$att" ] || metric attention_check "$att"
  summary=$(grep -m1 '^gpu_check: [0-9]* checks passed' "$OUTDIR/gpu_check.log")
  case "$rc" in
    0) result 2 gpu_check PASS "${summary#gpu_check: }; GEMM ${GEMM:-?} TFLOP/s" $((SECONDS - s0)) ;;
    1) result 2 gpu_check FAIL "${summary:-stopped early}: first: $(grep -m1 'FAIL' "$OUTDIR/gpu_check.log")" $((SECONDS - s0)) ;;
    2) if [ -n "$GPU_UNVERIFIED" ]; then
         NO_GPU_WHY="no GPU: $(grep -m1 -o 'no CUDA device[^.]*' "$OUTDIR/gpu_check.log")"
         GPU=""
         result 2 gpu_check SKIP "$NO_GPU_WHY" $((SECONDS - s0))
       elif [ -n "$GPU" ]; then
         result 2 gpu_check FAIL "nvidia-smi sees $GPU but CUDA does not: $(grep -m1 -o 'no CUDA device[^.]*' "$OUTDIR/gpu_check.log")" $((SECONDS - s0))
       else
         result 2 gpu_check SKIP "$NO_GPU_WHY ($(grep -m1 -o 'no CUDA device[^.]*' "$OUTDIR/gpu_check.log" || echo "exit 2"))" $((SECONDS - s0))
       fi ;;
    124|137) result 2 gpu_check FAIL "did not finish within $t s" $((SECONDS - s0)) ;;
    *) result 2 gpu_check FAIL "ended with status $rc: $(tail -n 1 "$OUTDIR/gpu_check.log")" $((SECONDS - s0)) ;;
  esac
}

# ---------------------------------------------------------------- the small model of steps 3-5
# GPT-2-shaped, head size 64 (what the fused attention takes), V = 256: 5 steps at lr 3e-3 move the
# loss ~17 % away from an untrained model's on the same batches, 8x the tolerance of step 3.
SM=(2 4 256 256 128)     # L H C V T
SM_B=4 SM_GA=2 SM_STEPS=5 SM_LR=3e-3
# step 3's Llama: grouped-query attention (2 kv heads for 4), SwiGLU width 688, head size 64
LLAMA_MODEL=$'arch = llama\nn_kv_head = 2\nffn_dim = 688'
CUDA_OK=""       # "" not probed; 1 trains on cuda; else the reason it does not
probe_cuda() {
  [ -n "$CUDA_OK" ] && return
  local t
  t=$(allot 30 15) || { CUDA_OK="no time left to probe device = cuda ($(no_time))"; return; }
  job_ini "$WORK/probe.ini" cuda full auto 1 2 1 1 "$SM_LR" 1 2 128 256 64
  if FSDP_CUDA_ATTN=tc run_or_diagnose probe 1 "$WORK/probe.ini" "$t"; then CUDA_OK=1
  else CUDA_OK="fsdp-worker does not train device = cuda: $(last_error "$WORK/runs/probe")"
  fi
  echo "  probe (device = cuda, 1 step): ${CUDA_OK/#1/ok}"
}

step3() {
  local s0=$SECONDS t sh fails="" passes="" out
  local rtol=2e-2
  log "step 3: device = cuda against device = cpu (full, grad_op, none, full with offload, Llama full; grad_accum $SM_GA; rtol $rtol)"
  # The references run on the CPU (also in a dry run, so the plumbing is exercised here).
  for sh in full grad_op none; do
    t=$(allot 60 10) || { result 3 "cuda vs cpu" SKIP "$(no_time) (CPU references)" $((SECONDS - s0)); return; }
    job_ini "$WORK/cpu-$sh.ini" cpu "$sh" auto 1 "$SM_B" "$SM_GA" "$SM_STEPS" "$SM_LR" "${SM[@]}"
    run_job "cpu-$sh" 1 "$WORK/cpu-$sh.ini" "$t" ||
      { result 3 "cuda vs cpu" FAIL "CPU reference ($sh) failed: $(last_error "$WORK/runs/cpu-$sh")" $((SECONDS - s0)); return; }
  done
  t=$(allot 60 10) || { result 3 "cuda vs cpu" SKIP "$(no_time) (CPU references)" $((SECONDS - s0)); return; }
  JOB_MODEL_EXTRA=$LLAMA_MODEL job_ini "$WORK/cpu-llama.ini" cpu full auto 1 "$SM_B" "$SM_GA" "$SM_STEPS" "$SM_LR" "${SM[@]}"
  run_job cpu-llama 1 "$WORK/cpu-llama.ini" "$t" ||
    { result 3 "cuda vs cpu" FAIL "CPU reference (llama) failed: $(last_error "$WORK/runs/cpu-llama")" $((SECONDS - s0)); return; }
  t=$(allot 60 10) || { result 3 "cuda vs cpu" SKIP "$(no_time)" $((SECONDS - s0)); return; }
  job_ini "$WORK/cpu-frozen.ini" cpu full auto 1 "$SM_B" "$SM_GA" "$SM_STEPS" 1e-12 "${SM[@]}"
  run_job cpu-frozen 1 "$WORK/cpu-frozen.ini" "$t" ||
    { result 3 "cuda vs cpu" FAIL "CPU frozen reference failed: $(last_error "$WORK/runs/cpu-frozen")" $((SECONDS - s0)); return; }
  out=$(python3 "$HELP" moves "$WORK/runs/cpu-full" "$WORK/runs/cpu-frozen" --steps "$SM_STEPS" --rtol "$rtol") ||
    { result 3 "cuda vs cpu" FAIL "$out" $((SECONDS - s0)); return; }
  echo "  CPU references ok; $out"
  lora_refs || { result 3 "cuda vs cpu" FAIL "$LORA_WHY" $((SECONDS - s0)); return; }
  [ -n "$GPU" ] || { result 3 "cuda vs cpu" SKIP "$NO_GPU_WHY (the 5 CPU reference runs and LoRA's and QLoRA's 4 passed)" $((SECONDS - s0)); return; }
  probe_cuda
  [ "$CUDA_OK" = 1 ] || { result 3 "cuda vs cpu" FAIL "$CUDA_OK" $((SECONDS - s0)); return; }
  # full-offload: sharding full with offload = optimizer (AdamW on the host over pinned memory),
  # against the same CPU reference as full; llama: sharding full of the Llama model against its own
  local name ref extra
  for name in full grad_op none full-offload llama; do
    sh=${name%-offload} extra=""
    [ "$name" = llama ] && sh=full extra=$LLAMA_MODEL
    ref=cpu-$([ "$name" = llama ] && echo llama || echo "$sh")
    t=$(allot 60 10) || { fails="$fails $name: no time left;"; continue; }
    # cuDNN where the step measures the attention (full, llama); the sharding variants run
    # fsdpd's tensor-core attention and compile no cuDNN engines
    local attn=${FSDP_CUDA_ATTN:-cudnn}
    case $name in grad_op|none|full-offload) attn=tc ;; esac
    JOB_MODEL_EXTRA=$extra job_ini "$WORK/cuda-$name.ini" cuda "$sh" auto 1 "$SM_B" "$SM_GA" "$SM_STEPS" "$SM_LR" \
      "${SM[@]}" bf16 "$([ "$name" = full-offload ] && echo optimizer || echo none)"
    if ! FSDP_CUDA_ATTN=$attn run_or_diagnose "cuda-$name" 1 "$WORK/cuda-$name.ini" "$t"; then
      fails="$fails $name: $(last_error "$WORK/runs/cuda-$name");"
    elif out=$(python3 "$HELP" compare "$WORK/runs/$ref" "$WORK/runs/cuda-$name" --steps "$SM_STEPS" --rtol "$rtol"); then
      passes="$passes $name: ${out%%; ref *};"
    else
      fails="$fails $name: $out;"
    fi
    echo "  $name: ${out:-see $WORK/runs/cuda-$name}"
  done
  for name in lora lora-offload qlora; do
    t=$(allot 30 10) || { fails="$fails $name: no time left;"; continue; }
    if out=$(lora_gpu "$name" "$t"); then passes="$passes $name: $out;"; else fails="$fails $name: $out;"; fi
    echo "  $name: $out"
  done
  if [ -n "$fails" ]; then result 3 "cuda vs cpu" FAIL "${fails# }${passes:+ passed:$passes}" $((SECONDS - s0))
  else result 3 "cuda vs cpu" PASS "${passes# }" $((SECONDS - s0)); fi
}

# ---------------------------------------------------------------- step 4: gloo staged, N = 2 and 1
# The tolerance comes from two N = 1 runs on this GPU: B = 4 with grad_accum 2 (the reference) and
# B = 2 with grad_accum 4, the same rows per step (docs/design.md §6) in N = 2's GEMM shapes. Their
# difference d is what the shapes alone do (other cuBLASLt kernels, other bf16 roundings from the
# first layer on); N = 2 adds only the fp32 reduction's order. rtol = max(1e-4, 4·d); a d whose
# 4·d exceeds step 3's 2e-2 (whose sensitivity is checked) leaves nothing to test and FAILs.
step4() {
  local s0=$SECONDS t n out rtol cal
  local FSDP_CUDA_ATTN=tc   # fsdpd's attention: deterministic, and no cuDNN engines to compile
  export FSDP_CUDA_ATTN
  log "step 4: gloo staged through pinned memory, N = 2 and N = 1 on the one GPU (rtol from two N = 1 runs)"
  [ -n "$GPU" ] || { result 4 "gloo-staged N=2 vs N=1" SKIP "$NO_GPU_WHY"; return; }
  probe_cuda
  [ "$CUDA_OK" = 1 ] || { result 4 "gloo-staged N=2 vs N=1" FAIL "$CUDA_OK" $((SECONDS - s0)); return; }
  # the same global batch: N = 1 with B = 4, N = 1 with B = 2 and grad_accum doubled, N = 2 with B = 2
  for n in 1 1b 2; do
    t=$(allot 45 10) || { result 4 "gloo-staged N=2 vs N=1" SKIP "$(no_time)" $((SECONDS - s0)); return; }
    case $n in
      1b) job_ini "$WORK/staged-$n.ini" cuda full gloo 1 $((SM_B / 2)) $((SM_GA * 2)) "$SM_STEPS" "$SM_LR" "${SM[@]}" ;;
      *) job_ini "$WORK/staged-$n.ini" cuda full gloo "$n" $((SM_B / n)) "$SM_GA" "$SM_STEPS" "$SM_LR" "${SM[@]}" ;;
    esac
    run_or_diagnose "staged-$n" "${n%b}" "$WORK/staged-$n.ini" "$t" ||
      { result 4 "gloo-staged N=2 vs N=1" FAIL "N = ${n%b}$([ "$n" = 1b ] && echo " (B = 2, calibration)"): $(last_error "$WORK/runs/staged-$n")" $((SECONDS - s0)); return; }
    [ "$n" = 1b ] || continue
    cal=$(python3 "$HELP" compare "$WORK/runs/staged-1" "$WORK/runs/staged-1b" --steps "$SM_STEPS" --rtol 1) ||
      { result 4 "gloo-staged N=2 vs N=1" FAIL "calibration (N = 1, B = 4 against B = 2): $cal" $((SECONDS - s0)); return; }
    cal=$(echo "$cal" | sed -n 's/^max rel diff \([0-9.e+-]*\) .*/\1/p')
    rtol=$(python3 -c 'import sys; print(f"{max(1e-4, 4 * float(sys.argv[1])):.1e}")' "$cal")
    metric staged_rtol "$rtol"
    metric staged_calibration_diff "$cal"
    echo "  calibration: N = 1 at B = 4 and at B = 2 differ by $cal: rtol $rtol"
    if python3 -c 'import sys; sys.exit(float(sys.argv[1]) <= 2e-2)' "$rtol"; then
      result 4 "gloo-staged N=2 vs N=1" FAIL "calibration: N = 1 at B = 4 and B = 2 differ by $cal, so rtol 4·d = $rtol is above step 3's 2e-2: the comparison could not tell a broken reduction" $((SECONDS - s0))
      return
    fi
  done
  if ! out=$(python3 "$HELP" compare "$WORK/runs/staged-1" "$WORK/runs/staged-2" --ranks 2 --steps "$SM_STEPS" --rtol "$rtol"); then
    result 4 "gloo-staged N=2 vs N=1" FAIL "$out (rtol = max(1e-4, 4 x $cal) from two N = 1 runs)" $((SECONDS - s0))
    return
  fi
  out="$out (rtol from two N = 1 runs differing by $cal)"
  # hybrid on the same rows: N = 4 with B = 1, groups {0,1} and {2,3}, each its own staged comms
  local hy
  if t=$(allot 45 10); then
    job_ini "$WORK/staged-hybrid.ini" cuda hybrid gloo 4 $((SM_B / 4)) "$SM_GA" "$SM_STEPS" "$SM_LR" "${SM[@]}"
    sed -i 's/^sharding = hybrid$/sharding = hybrid\nshard_group = 2/' "$WORK/staged-hybrid.ini"
    if ! run_or_diagnose staged-hybrid 4 "$WORK/staged-hybrid.ini" "$t"; then
      result 4 "gloo-staged N=2 vs N=1" FAIL "$out; hybrid 2 x 2: $(last_error "$WORK/runs/staged-hybrid")" $((SECONDS - s0))
      return
    fi
    if ! hy=$(python3 "$HELP" compare "$WORK/runs/staged-1" "$WORK/runs/staged-hybrid" --ranks 4 --steps "$SM_STEPS" --rtol "$rtol"); then
      result 4 "gloo-staged N=2 vs N=1" FAIL "$out; hybrid 2 x 2 vs N=1: $hy" $((SECONDS - s0))
      return
    fi
    out="$out; hybrid 2 x 2: $hy"
  else
    out="$out; hybrid 2 x 2 not run ($(no_time))"
  fi
  result 4 "gloo-staged N=2 vs N=1" PASS "$out" $((SECONDS - s0))
}

# ---------------------------------------------------------------- step 5: racecheck
find_sanitizer() {
  local c
  [ "${FSDP_GPU_SANITIZER:-}" = none ] && return 1
  [ -n "${FSDP_GPU_SANITIZER:-}" ] && { echo "$FSDP_GPU_SANITIZER"; return 0; }
  for c in "$(command -v compute-sanitizer 2>/dev/null)" ${CUDA_HOME:+"$CUDA_HOME/bin/compute-sanitizer"} \
           /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}
step5() {
  local s0=$SECONDS t cs rc log=$WORK/runs/racecheck.log
  log "step 5: one short step under compute-sanitizer --tool racecheck"
  [ -n "$GPU" ] || { result 5 racecheck SKIP "$NO_GPU_WHY"; return; }
  cs=$(find_sanitizer) || { result 5 racecheck SKIP "compute-sanitizer is not on this machine${FSDP_GPU_SANITIZER:+ (FSDP_GPU_SANITIZER=$FSDP_GPU_SANITIZER)}"; return; }
  probe_cuda
  [ "$CUDA_OK" = 1 ] || { result 5 racecheck FAIL "$CUDA_OK" $((SECONDS - s0)); return; }
  t=$(allot 30 20) || { result 5 racecheck SKIP "$(no_time)"; return; }
  # one rank, staged gloo (world 1 needs no rendezvous, and no NCCL kernels under the tool), 1 step,
  # 1 layer, T = 64: every kernel of the step runs at least once
  job_ini "$WORK/race.ini" cuda full gloo 1 2 1 1 "$SM_LR" 1 2 128 256 64
  mkdir -p "$WORK/runs/race-rdv"
  # cuBLASLt's and cuDNN's own kernels are not instrumented where the tool can leave them out
  # (report.py's LIB_KERNELS); a hazard reported in one anyway does not fail the step
  local excl=() lib
  lib=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import report; print(report.LIB_KERNELS.pattern)' \
        "$SRC/tests/gpu")
  "$cs" --help 2>&1 | grep -q -- '--kernel-name-exclude' && excl=(--kernel-name-exclude "regex=$lib")
  # fsdpd's own attention kernels (the tensor-core ones), not cuDNN's: cuDNN's are a library's
  FSDP_CUDA_ATTN=tc timeout -k 10 "$t" "$cs" --tool racecheck --racecheck-report all --target-processes all --error-exitcode 3 \
    --print-limit 20 ${excl[@]+"${excl[@]}"} "$WRAP/fsdp-worker" --standalone --rank 0 --world 1 --rendezvous "$WORK/runs/race-rdv" \
    "$WORK/race.ini" >"$log" 2>&1
  rc=$?
  grep -E 'RACECHECK SUMMARY|Error|Hazard|not supported|ERROR' "$log" | head -n 10 | sed 's/^/  /'
  local out
  if grep -qiE 'device not supported|unable to (initialize|start)|not supported on this' "$log"; then
    result 5 racecheck SKIP "compute-sanitizer cannot instrument this GPU here: $(grep -m1 -iE 'not supported|unable to' "$log")" $((SECONDS - s0))
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    result 5 racecheck FAIL "did not finish within $t s" $((SECONDS - s0))
  elif out=$(python3 "$HELP" racecheck "$log" --rc "$rc"); then
    result 5 racecheck PASS "${out#*= }; attention on fsdpd's tensor-core kernels${excl[*]:+ (cuBLASLt and cuDNN kernels not instrumented)}" $((SECONDS - s0))
  else
    result 5 racecheck FAIL "$out (log in logs.tar.gz: runs/racecheck.log)" $((SECONDS - s0))
  fi
}

# ---------------------------------------------------------------- step 6: the benchmark
OURS_TPS=""
step6() {
  local s0=$SECONDS t out plan=$WORK/bench-plan.json steps=10 skip=3 verdict=PASS why=""
  log "step 6: GPT-2 124M, B = 16, T = 1024, bf16, world 1 ($steps steps, the first $skip untimed)"
  job_ini "$WORK/bench.ini" cuda full auto 1 16 1 "$steps" 6e-4 12 12 768 50257 1024
  "$WRAP/fsdpctl" plan --json "$WORK/bench.ini" >"$plan" 2>"$WORK/bench-plan.err" ||
    { result 6 benchmark FAIL "fsdpctl plan --json failed: $(head -n 1 "$WORK/bench-plan.err")" $((SECONDS - s0)); return; }
  out=$(python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); print(p["memory"]["total"], p["flops_per_token"])' "$plan") ||
    { result 6 benchmark FAIL "fsdpctl plan --json: no memory.total / flops_per_token" $((SECONDS - s0)); return; }
  echo "  plan: memory.total ${out% *} bytes, flops_per_token ${out#* }"
  metric plan_bytes "${out% *}"
  [ -n "$GPU" ] || { result 6 benchmark SKIP "$NO_GPU_WHY (the plan was read)" $((SECONDS - s0)); return; }
  probe_cuda
  [ "$CUDA_OK" = 1 ] || { result 6 benchmark FAIL "$CUDA_OK" $((SECONDS - s0)); return; }
  if [ -z "$GEMM" ]; then
    # step 2 did not run or gave no rate: measure one through PyTorch's cuBLAS
    GEMM=$(timeout 60 "$PY" "$HELP" gemm-torch 2>/dev/null | tail -n 1)
    [ -n "$GEMM" ] && { metric gemm_tflops "$GEMM"; metric gemm_source "PyTorch bf16 matmul 8192^3 (gpu_check gave no rate)"; }
  fi
  t=$(allot 75 30) || { result 6 benchmark SKIP "$(no_time)" $((SECONDS - s0)); return; }
  # the libraries' own accounts of trouble: cuDNN's warnings and errors, cuBLASLt's errors, NCCL's
  # setup (logs.tar.gz: runs/bench.*.log); the clocks and throttle reasons on either side
  smi_clocks before_bench
  local rc=0 att
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=$WORK/runs/bench.cudnn.log CUBLASLT_LOG_LEVEL=1 \
    CUBLASLT_LOG_FILE=$WORK/runs/bench.cublaslt.%i.log NCCL_DEBUG=INFO NCCL_DEBUG_FILE=$WORK/runs/bench.nccl.%h.%p.log \
    run_or_diagnose bench 1 "$WORK/bench.ini" $((t - 10)) || rc=$?
  smi_clocks after_bench
  att=$(attention_ran "$WORK/runs/bench")
  metric attention "$att"
  [ "${att%%:*}" != tc ] || cudnn_fallback_log
  [ "$rc" -eq 0 ] || { result 6 benchmark FAIL "$(last_error "$WORK/runs/bench")" $((SECONDS - s0)); return; }
  out=$(python3 "$HELP" bench "$WORK/runs/bench" "$plan" --skip "$skip" ${GEMM:+--gemm-tflops "$GEMM"} --gpu "$GPU") ||
    { result 6 benchmark FAIL "$out" $((SECONDS - s0)); return; }
  metric_json "$(python3 -c 'import json, sys; b = json.loads(sys.argv[1]); print(json.dumps({"ours_" + k if k not in ("plan_bytes", "peak_vs_plan") else k: v for k, v in b.items()}))' "$out")"
  OURS_TPS=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["tokens_per_s"])' "$out")
  local line
  line=$(python3 -c '
import json, sys
b = json.loads(sys.argv[1])
mfu = f"MFU {100 * b['"'"'mfu'"'"']:.1f} % (PaLM, GEMM rate)" if b["mfu"] is not None else "MFU unknown (no GEMM rate)"
if b["mfu_llmc"] is not None:
    mfu += f", {100 * b['"'"'mfu_llmc'"'"']:.1f} % (llm.c, bf16 peak)"
print(f"{b['"'"'tokens_per_s'"'"']:.0f} tokens/s, {b['"'"'step_ms'"'"']:.1f} ms/step, {mfu}, peak {b['"'"'peak_bytes'"'"'] / 2**30:.2f} GiB vs plan "
      f"{b['"'"'plan_bytes'"'"'] / 2**30:.2f} GiB ({100 * b['"'"'peak_vs_plan'"'"']:+.1f} %), exposed comm {b['"'"'exposed_comm_ms'"'"']:.2f} ms "
      f"({100 * b['"'"'exposed_comm_share'"'"']:.1f} %), loss {b['"'"'loss_first'"'"']:.3f} -> {b['"'"'loss_last'"'"']:.3f}")
print("ok" if abs(b["peak_vs_plan"]) <= 0.10 else "peak memory is more than 10 % off the plan")
' "$out")
  why=$(echo "$line" | tail -n 1)
  [ "$why" = ok ] || verdict=FAIL
  result 6 benchmark "$verdict" "$(echo "$line" | head -n 1)${why/#ok/}" $((SECONDS - s0))
}

# cudnn_fallback_log: the benchmark's attention fell back from cuDNN: one step of its job again with
# cuDNN's debug log at its most detailed (CUDNN_LOGLEVEL_DBG=3: every call with its descriptors and
# status) into runs/bench-fallback.cudnn.log, and its last error or warning as a metric
cudnn_fallback_log() {
  local t ini=$WORK/bench-fallback.ini log=$WORK/runs/bench-fallback.cudnn.log
  [ -n "$CUDNN" ] || return 0
  t=$(allot 30 10) || { metric cudnn_fallback "no time for a run with CUDNN_LOGLEVEL_DBG=3 ($(no_time))"; return 0; }
  sed 's/^steps = .*/steps = 1/' "$WORK/bench.ini" >"$ini"
  CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=$log run_job bench-fallback 1 "$ini" "$t" >/dev/null
  metric cudnn_fallback "$(grep -E '^[EW]!|CUDNN_STATUS_[A-Z_]*' "$log" 2>/dev/null | grep -v CUDNN_STATUS_SUCCESS | tail -n 1 | cut -c1-300 ||
    echo "cuDNN logged no error or warning (runs/bench-fallback.cudnn.log)")"
}

# ---------------------------------------------------------------- step 7: PyTorch, same model, same GPU
step7() {
  local s0=$SECONDS t rc log=$WORK/runs/torch_step.log
  log "step 7: PyTorch on the same GPU (bench/torch_step.py --device cuda, eager and torch.compile)"
  mkdir -p "$WORK/runs"
  if [ -z "$GPU" ]; then
    # exercise the script on the CPU where torch is installed
    if "$PY" -c 'import torch' 2>/dev/null; then
      if timeout "$(allot 105 10 || echo 10)" "$PY" "$SRC/bench/torch_step.py" --device cpu --config tiny --iters 3 --json >"$log" 2>&1; then
        result 7 "PyTorch same step" SKIP "$NO_GPU_WHY (torch_step.py --device cpu --config tiny ran: $(grep -m1 -o '[0-9]* tokens/s' "$log"))" $((SECONDS - s0))
      else
        result 7 "PyTorch same step" FAIL "torch_step.py --device cpu failed: $(tail -n 1 "$log")" $((SECONDS - s0))
      fi
    else
      result 7 "PyTorch same step" SKIP "$NO_GPU_WHY (and no torch for python3 here)"
    fi
    return
  fi
  "$PY" -c 'import torch' 2>/dev/null || { result 7 "PyTorch same step" SKIP "python3 has no torch on this machine"; return; }
  t=$(allot 105 60) || { result 7 "PyTorch same step" SKIP "$(no_time)"; return; }
  PYTHONUNBUFFERED=1 timeout -k 10 "$t" "$PY" "$SRC/bench/torch_step.py" --device cuda --config gpt2 --optimizer \
    --mode both --iters 10 --json >"$log" 2>&1
  rc=$?
  grep -v '^{' "$log" | tail -n 6 | sed 's/^/  /'
  local out
  out=$(python3 - "$log" "${OURS_TPS:-}" <<'PY'
import json, sys
recs = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        recs[r["mode"]] = r
m = {}
for mode, r in recs.items():
    m[f"torch_{mode}_tokens_per_s"] = r["tokens_per_s"]
    m[f"torch_{mode}_step_ms"] = r["step_ms"]
    m[f"torch_{mode}_peak_bytes"] = r["peak_bytes"]
    if r["compile_s"] is not None:
        m["torch_compile_s"] = r["compile_s"]
ours = float(sys.argv[2]) if sys.argv[2] else None
if ours:
    for mode in recs:
        m[f"ratio_{mode}"] = ours / recs[mode]["tokens_per_s"]
print(json.dumps(m))
print("; ".join(f"{mode} {r['tokens_per_s']:.0f} tokens/s" + (f" (compile {r['compile_s']:.0f} s)" if r["compile_s"] else "")
                for mode, r in recs.items()) or "no result")
print(" ".join(sorted(recs)))
PY
)
  metric_json "$(echo "$out" | sed -n 1p)"
  local summary modes
  summary=$(echo "$out" | sed -n 2p)
  modes=$(echo "$out" | sed -n 3p)
  if [ "$modes" = "compile eager" ] && [ "$rc" -eq 0 ]; then
    result 7 "PyTorch same step" PASS "$summary" $((SECONDS - s0))
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    # PyTorch is the yardstick, not the code under test: running out of its allotment (typically
    # torch.compile from cold) is a lack of time, what it measured before that is kept
    result 7 "PyTorch same step" SKIP "PyTorch did not finish within its $t s (torch.compile from cold?); got: $summary" $((SECONDS - s0))
  else
    result 7 "PyTorch same step" FAIL "exit $rc; got: $summary; last line: $(grep -v '^{' "$log" | tail -n 1)" $((SECONDS - s0))
  fi
}

# ---------------------------------------------------------------- step 8: asynchronous checkpoint
# 3 steps saving after step 2 (written while step 3 runs) and 3, with async = false and true; the
# rank file of step 2 must be the same bytes; then, from step 2 (step 3's save removed), 2 more
# steps: the same losses, bit for bit. Two runs give the same bits only with a deterministic
# attention: cuDNN's backward accumulates dQ with atomics, so these jobs run the tensor cores'.
step8() {
  local s0=$SECONDS t mode
  local FSDP_CUDA_ATTN=tc
  export FSDP_CUDA_ATTN
  log "step 8: an asynchronous checkpoint on the GPU against a synchronous one"
  [ -n "$GPU" ] || { result 8 "async ckpt" SKIP "$NO_GPU_WHY" $((SECONDS - s0)); return; }
  probe_cuda
  [ "$CUDA_OK" = 1 ] || { result 8 "async ckpt" FAIL "$CUDA_OK" $((SECONDS - s0)); return; }
  for mode in false true; do
    t=$(allot 25 8) || { result 8 "async ckpt" SKIP "$(no_time)" $((SECONDS - s0)); return; }
    rm -rf "$WORK/ck-$mode"
    job_ini "$WORK/ck-$mode.ini" cuda full auto 1 "$SM_B" "$SM_GA" 3 "$SM_LR" "${SM[@]}"
    printf '[checkpoint]\ndir = %s\nevery = 2\nkeep = 3\nasync = %s\n' "$WORK/ck-$mode" "$mode" >>"$WORK/ck-$mode.ini"
    run_job "ck-$mode" 1 "$WORK/ck-$mode.ini" "$t" ||
      { result 8 "async ckpt" FAIL "async = $mode: $(last_error "$WORK/runs/ck-$mode")" $((SECONDS - s0)); return; }
    rm -rf "$WORK/ck-$mode/step-00000003"
    sed -i 's/^steps = 3$/steps = 5/' "$WORK/ck-$mode.ini"
    t=$(allot 25 8) || { result 8 "async ckpt" SKIP "$(no_time)" $((SECONDS - s0)); return; }
    run_job "ck-$mode-resumed" 1 "$WORK/ck-$mode.ini" "$t" ||
      { result 8 "async ckpt" FAIL "async = $mode, resumed: $(last_error "$WORK/runs/ck-$mode-resumed")" $((SECONDS - s0)); return; }
  done
  if ! cmp -s "$WORK/ck-false/step-00000002/rank-0.bin" "$WORK/ck-true/step-00000002/rank-0.bin"; then
    result 8 "async ckpt" FAIL "the rank file of step 2 differs between async = false and true" $((SECONDS - s0))
    return
  fi
  local out
  if out=$(python3 - "$WORK/runs/ck-false-resumed/rank-0.jsonl" "$WORK/runs/ck-true-resumed/rank-0.jsonl" <<'PY'
import json, sys
a, b = ([(d["step"], d["loss"]) for d in map(json.loads, open(p)) if "loss" in d] for p in sys.argv[1:])
assert [s for s, _ in a] == [3, 4, 5], f"the resumed run reported steps {[s for s, _ in a]}, expected 3, 4, 5"
assert a == b, f"losses after resuming: sync {a}, async {b}"
print("step 2's rank file identical; resumed losses " + " ".join(f"{l:.6f}" for _, l in b) + " equal bit for bit")
PY
  ); then result 8 "async ckpt" PASS "$out" $((SECONDS - s0))
  else result 8 "async ckpt" FAIL "$out" $((SECONDS - s0)); fi
}

# ---------------------------------------------------------------- run
BIN_OK=""
metric when "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
metric mode "$([ "$DRY" = 1 ] && echo "dry run" || echo "GPU run")${ONLY:+, only steps $ONLY}"
[ "$DRY" = 1 ] && step_account
rest=("${STEP_ORDER[@]}")
for s in "${STEP_ORDER[@]}"; do
  rest=("${rest[@]:1}")
  name=$(case $s in 1) echo "binaries + GPU";; 2) echo gpu_check;; 3) echo "cuda vs cpu";; 4) echo "gloo-staged N=2 vs N=1";;
         5) echo racecheck;; 6) echo benchmark;; 7) echo "PyTorch same step";; 8) echo "async ckpt";; esac)
  if [ "$s" != 1 ] && ! selected "$s"; then result "$s" "$name" SKIP "not selected (--only $ONLY)"; continue; fi
  if [ "$s" != 1 ] && [ -z "$BIN_OK" ] && [ "$s" != 7 ]; then result "$s" "$name" SKIP "step 1 failed: no binaries"; continue; fi
  if ! step_window "$s" ${rest[@]+"${rest[@]}"}; then
    result "$s" "$name" "$([ "$s" = 1 ] && echo FAIL || echo SKIP)" "$STEP_WHY"
    continue
  fi
  "step$s"
done
log "step 9: the table ($OUTDIR/gpu_report.md, gpu_report.json)"
# each process's first step (cuDNN's runtime-compiled engines, cuBLASLt's heuristics, NCCL's setup)
metric_json "$(python3 "$HELP" first-steps "$WORK/runs")"
result 9 table PASS "written to $OUTDIR/gpu_report.md and gpu_report.json" 0
python3 "$HELP" table "$RESULTS" "$METRICS" "$OUTDIR" || echo "run.sh: FAIL: the table could not be written" >&2
if grep -q $'\tFAIL\t' "$RESULTS"; then exit 1; fi
if [ "$STRICT" = 1 ] && ! python3 -c 'import json, sys; sys.exit(not all(json.load(open(sys.argv[1]))["targets"].values()))' \
     "$OUTDIR/gpu_report.json"; then
  echo "run.sh: a performance target was missed (--strict-targets)"; exit 1
fi
if [ -z "$GPU" ] && [ "$DRY" != 1 ]; then exit 2; fi
exit 0
