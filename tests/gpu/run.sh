#!/usr/bin/env bash
# tests/gpu/run.sh — build the CUDA backend and run the device-only checks (tests/gpu/gpu_check.c)
# on a machine with an NVIDIA GPU, in one go and in a few minutes (docs/gpu.md).
#
#   bash tests/gpu/run.sh
#
# Steps, each bounded by a timeout: install missing Debian packages (scripts/install-deps.sh),
# configure build-gpu with -DFSDP_CUDA=ON, build gpu_check and fsdp-worker, list the GPUs, run
# gpu_check. Its output also goes to ${OUT:-/tmp}/gpu_check.log (the build's to gpu_build.log).
# Environment: FSDP_GPU_BUILD (build directory, default build-gpu in the source tree),
# FSDP_CUDA_ARCH (default 90: H100/H200), CUDAToolkit_ROOT (when the toolkit is not /usr/local/cuda).
# Exit status: gpu_check's (0 every check passed, 1 a check failed, 2 no usable GPU or driver,
# 124 it timed out), or the status of the step that failed before it.
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${FSDP_GPU_BUILD:-$SRC/build-gpu}
ARCH=${FSDP_CUDA_ARCH:-90}
LOGDIR=${OUT:-/tmp}
mkdir -p "$LOGDIR"
LOG=$LOGDIR/gpu_check.log
BUILDLOG=$LOGDIR/gpu_build.log
JOBS=$(nproc 2>/dev/null || echo 4)
T0=$SECONDS

step() { echo "== run.sh [$((SECONDS - T0)) s] $*"; }

# 1. Dependencies (Debian/Ubuntu only).
step "dependencies (scripts/install-deps.sh)"
if command -v apt-get >/dev/null 2>&1 && command -v dpkg-query >/dev/null 2>&1; then
  if ! timeout -k 10 600 bash "$SRC/scripts/install-deps.sh"; then
    echo "run.sh: scripts/install-deps.sh failed (no root or sudo? no network?); continuing: configure says what is missing" >&2
  fi
else
  echo "run.sh: apt-get/dpkg are not available on this machine: install the packages listed in" \
       "scripts/install-deps.sh (or their equivalents) by hand; continuing" >&2
fi

# 2. Configure. A build directory configured from another source path (a copied tree) is remade.
step "configure $BUILD (FSDP_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=$ARCH)"
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$SRC" "$BUILD/CMakeCache.txt"; then
  echo "run.sh: $BUILD was configured for another source tree; reconfiguring it from scratch"
  rm -rf "$BUILD"
fi
: >"$BUILDLOG"
CMAKE_ARGS=(-S "$SRC" -B "$BUILD" -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH")
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
if ! timeout -k 10 180 cmake "${CMAKE_ARGS[@]}" >>"$BUILDLOG" 2>&1; then
  tail -n 40 "$BUILDLOG"
  echo "run.sh: FAIL: configuring the CUDA build failed (log: $BUILDLOG)" >&2
  exit 1
fi
grep -E "CUDA backend|CUDA compiler identification" "$BUILDLOG" || true

# 3. Build.
step "build gpu_check and fsdp-worker (-j$JOBS)"
if ! timeout -k 10 600 cmake --build "$BUILD" -j"$JOBS" --target gpu_check fsdp-worker >>"$BUILDLOG" 2>&1; then
  tail -n 60 "$BUILDLOG"
  echo "run.sh: FAIL: the CUDA build failed (log: $BUILDLOG)" >&2
  exit 1
fi

# 4. The GPUs.
step "nvidia-smi -L"
timeout -k 5 30 nvidia-smi -L || echo "run.sh: nvidia-smi failed or is missing (gpu_check says whether CUDA sees a device)"

# 5. The checks.
step "gpu_check (log: $LOG)"
set +e
timeout -k 10 480 "$BUILD/tests/gpu/gpu_check" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e
case $rc in
  0) verdict="PASS: every check passed" ;;
  1) verdict="FAIL: at least one check failed (lines marked FAIL above)" ;;
  2) verdict="NO GPU: no usable CUDA device or driver on this machine" ;;
  124|137) verdict="FAIL: gpu_check did not finish within 480 s" ;;
  *) verdict="FAIL: gpu_check ended with status $rc" ;;
esac
step "$verdict (exit $rc)"
exit "$rc"
