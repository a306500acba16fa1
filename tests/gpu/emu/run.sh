#!/usr/bin/env bash
# tests/gpu/emu/run.sh — build and run gpu_emu: gpu_check's kernel checks (small shapes, AdamW,
# utilities) with the CUDA kernels of worker/cuda/ops_cuda_*.cu compiled for the host under the
# thread-model emulator (emu.h, emu.cpp: one coroutine per CUDA thread, real barriers and warp
# shuffles in a random order, WMMA and cuBLASLt as plain host code). ctest runs the same binary as
# the test "gpu_emu" in any build with the CUDA backend. It catches indexing, masking and
# synchronization bugs without a GPU; it cannot see speed, shared-memory limits, the real cuBLASLt,
# or races that only parallel hardware shows. FSDP_EMU_BUILD: the build directory (default
# build-cuda, configured with -DFSDP_CUDA=ON). GPU_CHECK_SEED=N repeats a run's inputs.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
BUILD=${FSDP_EMU_BUILD:-$SRC/build-cuda}
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S "$SRC" -B "$BUILD" -DFSDP_CUDA=ON >/dev/null
cmake --build "$BUILD" --target gpu_emu -j2 >/dev/null
exec "$BUILD/tests/gpu/gpu_emu"
