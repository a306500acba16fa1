# bench/lib.sh — the conditions every bench prints beside its figures (docs/performance.md): the load
# average before and after, the CPU model and the instruction-set flags that matter to the kernels,
# and the BLAS library and kernel type the workers use. Sourced by the benches:
#   . "$(dirname "$0")/lib.sh"; bench_conditions_begin BUILD_DIR; ...; bench_conditions_end
# The BLAS line is fsdp-worker's own (--blas-info), so it names the kernels a worker runs with this
# environment (OPENBLAS_CORETYPE included), not a guess from the CPU.

bench_loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

bench_cpu_line() {
  local model flags f
  model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
  flags=""
  for f in sse4_2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile; do
    grep -m1 '^flags' /proc/cpuinfo | grep -qw "$f" && flags="$flags $f"
  done
  echo "cpu: ${model:-unknown} ($(nproc) online); flags:${flags:- none of sse4_2..amx}"
}

bench_blas_line() {   # bench_blas_line BUILD_DIR
  local out
  if out=$("$1/fsdp-worker" --blas-info 2>&1); then echo "$out"; else echo "blas: unknown (fsdp-worker --blas-info failed)"; fi
}

bench_conditions_begin() {   # bench_conditions_begin BUILD_DIR
  BENCH_LOAD_BEFORE=$(bench_loadavg)
  bench_cpu_line
  bench_blas_line "$1"
  echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-(unset)} OMP_NUM_THREADS=${OMP_NUM_THREADS-(unset)}"
  echo "load average before: $BENCH_LOAD_BEFORE"
}

bench_conditions_end() {
  echo "load average before: ${BENCH_LOAD_BEFORE:-?}, after: $(bench_loadavg)"
}
