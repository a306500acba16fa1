#!/usr/bin/env bash
# tests/gpu/emu/run.sh — run gpu_check's kernel checks (tiny shapes, AdamW, utilities) on the CPU,
# with the CUDA kernels of worker/ops_cuda_*.cu compiled for the host under a thread-model emulator
# (emu.h, emu.cpp: one coroutine per CUDA thread, real barriers and warp shuffles, cuBLASLt as a
# naive GEMM). It catches indexing, masking and synchronization bugs without a GPU; it cannot see
# speed, shared-memory limits, the real cuBLASLt, or races that only real parallel hardware shows.
# Needs a configured CUDA build (for the headers and libfsdpcommon): FSDP_EMU_BUILD (default
# build-cuda). Output directory: ${TMPDIR:-/tmp}/fsdp-emu.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
BUILD=${FSDP_EMU_BUILD:-$SRC/build-cuda}
OUTD=${TMPDIR:-/tmp}/fsdp-emu
CUDA_INC=${CUDAToolkit_ROOT:-/usr/local/cuda}/include
mkdir -p "$OUTD"
cmake --build "$BUILD" --target fsdpcommon >/dev/null
INC=(-I"$SRC/worker" -I"$SRC/common" -I"$SRC/tests/gpu" -I"$SRC/tests/gpu/emu" -I"$CUDA_INC" -I"$BUILD/common" -I"$BUILD")
OBJS=()
for cu in "$SRC"/worker/ops_cuda_*.cu; do
  b=$(basename "$cu" .cu)
  python3 "$SRC/tests/gpu/emu/cu2cpp.py" "$cu" >"$OUTD/$b.cpp"
  g++ -std=c++17 -O1 -g -ffp-contract=off -w -include "$SRC/tests/gpu/emu/emu.h" "${INC[@]}" -c "$OUTD/$b.cpp" -o "$OUTD/$b.o"
  OBJS+=("$OUTD/$b.o")
done
g++ -std=c++17 -O1 -g -ffp-contract=off "${INC[@]}" -c "$SRC/tests/gpu/emu/emu.cpp" -o "$OUTD/emu.o"
for c in tests/gpu/harness.c tests/gpu/check_ops.c tests/gpu/check_util.c tests/gpu/emu/emu_main.c worker/ops_cpu.c worker/optim.c; do
  gcc -std=gnu11 -O2 -g -fopenmp -fno-math-errno "${INC[@]}" -c "$SRC/$c" -o "$OUTD/$(basename "$c" .c).o"
  OBJS+=("$OUTD/$(basename "$c" .c).o")
done
g++ -fopenmp -o "$OUTD/emu_check" "${OBJS[@]}" "$OUTD/emu.o" "$BUILD/common/libfsdpcommon.a" $(pkg-config --libs openblas inih jansson libprotobuf-c libisal libzmq) -lpthread -lm
exec "$OUTD/emu_check"
