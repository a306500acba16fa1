#!/usr/bin/env bash
# scripts/gpu-bundle.sh — build fsdp-worker, fsdpctl and gpu_check for sm_90 HERE and pack them, with
# every shared library they need that a bare CUDA machine lacks, into .gpubundle/ (git-ignored), so
# that tests/gpu/run.sh runs them on the device machine (docs/gpu.md, "Running it").
#
#   scripts/gpu-bundle.sh             configure + build (FSDP_CUDA=ON, sm_90), then pack
#   scripts/gpu-bundle.sh --no-build  pack what the build directory already holds
#
# What goes in .gpubundle/fsdp-gpu-bundle.tar.xz (one directory, fsdp-gpu-bundle/):
#   bin/    the three executables, debug sections stripped (symbols kept for sanitizer backtraces)
#   lib/    every library `ldd` names except glibc and the CUDA/NVIDIA ones (libzmq, protobuf-c,
#           inih, jansson, isa-l, gloo, OpenBLAS, libgomp, libgfortran, libstdc++, sodium, ...)
#   glibc/  this machine's loader and glibc libraries: used only where the device machine's glibc
#           is older than the binaries need (MANIFEST.txt: glibc_needed); then run.sh starts every
#           binary through glibc/ld-linux-x86-64.so.2 --library-path
#   MANIFEST.txt  commit, date, arch, glibc_needed, the libraries taken from the device machine
# Not carried (too large, and present there: the CUDA toolkit and PyTorch's wheels): libcuda.so.1
# (driver), libcublasLt.so.13 (541 MB), libnccl.so.2 (218 MB); run.sh finds them there. Nor
# libcudnn.so.9 (its engines ~245 MB): fsdp-worker opens it at run time (ops_cuda_cudnn.h), so ldd
# does not see it; MANIFEST.txt names it on its expected_from_node line.
# The CUDA runtime is linked statically. A copy of MANIFEST.txt is left beside the archive.
#
# Environment: FSDP_GPU_BUILD (build directory, default build-gpu; `build` reuses make test's tree
# when it is a CUDA build), FSDP_CUDA_ARCH (default 90), FSDP_GPU_BUNDLE (output directory, default
# .gpubundle), JOBS (build parallelism, default 2), FSDP_GPU_BUNDLE_XZ (xz level, default 6; the ctest uses 1).
# Exit status: 0 packed and within the size limit; 1 otherwise (one line says why).
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${FSDP_GPU_BUILD:-$SRC/build-gpu}
case $BUILD in /*) ;; *) BUILD=$SRC/$BUILD ;; esac
ARCH=${FSDP_CUDA_ARCH:-90}
DEST=${FSDP_GPU_BUNDLE:-$SRC/.gpubundle}
JOBS=${JOBS:-2}
# A bundle is kept under 64 MiB (the working tree, about 2 MiB, plus this archive), so that it travels
# to a GPU node cheaply.
LIMIT_MIB=64
build=1
case "${1:-}" in
  "") ;;
  --no-build) build=0 ;;
  -h|--help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--no-build]" >&2; exit 2 ;;
esac
die() { echo "gpu-bundle: $*" >&2; exit 1; }

if [ "$build" = 1 ]; then
  echo "gpu-bundle: configuring $BUILD (FSDP_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=$ARCH)"
  cmake -S "$SRC" -B "$BUILD" -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >/dev/null ||
    die "configuring $BUILD failed: the CUDA toolkit (nvcc, cuBLAS, NCCL) and scripts/install-deps.sh's packages are needed here"
  echo "gpu-bundle: building fsdp-worker fsdpctl gpu_check (-j$JOBS)"
  cmake --build "$BUILD" -j"$JOBS" --target fsdp-worker fsdpctl gpu_check >/dev/null ||
    die "building in $BUILD failed (rerun: cmake --build $BUILD --target fsdp-worker fsdpctl gpu_check)"
fi

BINS=("$BUILD/fsdp-worker" "$BUILD/fsdpctl" "$BUILD/tests/gpu/gpu_check")
for b in "${BINS[@]}"; do
  [ -x "$b" ] || die "$b is missing: build with the CUDA backend first (drop --no-build)"
done
flags=$BUILD/worker/CMakeFiles/fsdpcuda.dir/flags.make
[ -f "$flags" ] || die "$BUILD has no CUDA backend ($flags missing): configure with -DFSDP_CUDA=ON"
grep -q "sm_$ARCH" "$flags" || die "$BUILD compiles CUDA for $(grep -o 'code=[^ ]*' "$flags" | head -1), not sm_$ARCH: set FSDP_CUDA_ARCH or reconfigure"

tmp=$(mktemp -d /tmp/fsdp-gpu-bundle.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
stage=$tmp/fsdp-gpu-bundle
mkdir -p "$stage/bin" "$stage/lib" "$stage/glibc"

# Libraries the device machine provides (driver, CUDA toolkit, NCCL): never carried.
is_external() { case $1 in libcuda.so*|libcublas*|libcudart*|libnccl*|libnvidia-*|libcudnn*|libnvrtc*|libnvJitLink*|libcufft*|libcurand*|libcusparse*|libcusolver*) return 0;; esac; return 1; }
# glibc's own libraries: they must match the loader, so they go to glibc/ (the fallback only).
is_glibc() { case $1 in ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*|libmvec.so.*|libBrokenLocale.so.*|libnsl.so.*|libnss_*|libthread_db.so.*) return 0;; esac; return 1; }

declare -A external=()
for b in "${BINS[@]}"; do
  strip --strip-debug -o "$stage/bin/$(basename "$b")" "$b"
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      is_external "$name" && { external[$name]=1; continue; }
      die "$(basename "$b") needs $name, which is not found on this machine"
    fi
    if is_external "$name"; then external[$name]=1
    elif is_glibc "$name"; then cp -L "$path" "$stage/glibc/$name"
    else cp -L "$path" "$stage/lib/$name"
    fi
  done < <(ldd "$b")
done
interp=$(readelf -l "${BINS[0]}" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
[ -n "$interp" ] || die "cannot read the program interpreter of ${BINS[0]}"
cp -L "$interp" "$stage/glibc/$(basename "$interp")"
chmod -R u+w "$stage"

# The newest glibc symbol version anything carried outside glibc/ asks for: the device machine's
# glibc must be at least that for the binaries to start natively (else run.sh uses glibc/).
glibc_needed=$(objdump -T "$stage"/bin/* "$stage"/lib/* 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -n 1)
[ -n "$glibc_needed" ] || die "could not read the glibc symbol versions of the carried files (objdump -T)"
nccl_h=$(grep -m1 -o 'NCCL_INCLUDE_DIR:PATH=.*' "$BUILD/CMakeCache.txt" | cut -d= -f2)
nccl_ver=$(awk '/define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "$nccl_h/nccl.h" 2>/dev/null || true)
{
  echo "commit: $(git -C "$SRC" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(sed -n "s/^PRETTY_NAME=//p" /etc/os-release | tr -d "\""), $(ldd --version | head -n 1)"
  echo "cuda_arch: sm_$ARCH"
  echo "nvcc: $(grep -h -m1 -o 'CMAKE_CUDA_COMPILER_VERSION "[^"]*"' "$BUILD"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -n 1 | cut -d'"' -f2)"
  echo "glibc_needed: ${glibc_needed#GLIBC_}"
  echo "external: ${!external[*]}"
  # opened at run time (dlopen), so ldd does not list it: the attention's cuDNN (ops_cuda_cudnn.h)
  echo "expected_from_node: libcudnn.so.9 (dlopen: FSDP_CUDNN_LIB, the loader's path, PyTorch's nvidia/cudnn/lib; none: attention on tensor cores)"
  echo "nccl_headers: ${nccl_ver:-unknown}"
  echo "bin: $(cd "$stage/bin" && echo *)"
  echo "lib: $(cd "$stage/lib" && echo *)"
  echo "glibc: $(cd "$stage/glibc" && echo *)"
} > "$stage/MANIFEST.txt"

mkdir -p "$DEST"
rm -f "$DEST/fsdp-gpu-bundle.tar.xz" "$DEST/MANIFEST.txt"
XZ_OPT="-${FSDP_GPU_BUNDLE_XZ:-6} -T${JOBS}" tar -C "$tmp" -cJf "$DEST/fsdp-gpu-bundle.tar.xz" fsdp-gpu-bundle
cp "$stage/MANIFEST.txt" "$DEST/MANIFEST.txt"

# The size that travels: the archive, and the working tree the tool sends beside it.
raw=$(du -sb "$stage" | cut -f1)
packed=$(stat -c %s "$DEST/fsdp-gpu-bundle.tar.xz")
tree=$(cd "$SRC" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
total=$((packed + $(stat -c %s "$DEST/MANIFEST.txt") + tree))
echo "gpu-bundle: $DEST/fsdp-gpu-bundle.tar.xz: $(mib "$packed") MiB ($(mib "$raw") MiB unpacked);" \
     "with the working tree ($(mib "$tree") MiB) $(mib "$total") MiB of the tool's $LIMIT_MIB MiB"
echo "gpu-bundle: glibc needed ${glibc_needed#GLIBC_} (loader carried for older ones); taken from the device machine: ${!external[*]}"
[ "$total" -le $((LIMIT_MIB * 1048576)) ] || die "$(mib "$total") MiB would travel: over the $LIMIT_MIB MiB a bundle is kept under"
