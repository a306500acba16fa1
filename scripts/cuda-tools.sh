#!/usr/bin/env bash
# The CUDA binary tools the static SASS check (tests/gpu/sass_check.py, ctest sass_check) reads the
# built kernels with: cuobjdump and nvdisasm, which the CUDA toolkit's Debian packaging here leaves
# out, from PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, in a small virtual
# environment created once and cached outside the clone (default ~/.cache/fsdpd/cudatools, or
# FSDPD_CUDA_TOOLS). `make test` runs this before ctest. A newer cuobjdump reads older cubins, so
# the wheels need not match the toolkit (13.2 is the oldest 13.x on PyPI).
#   scripts/cuda-tools.sh          create or check it; prints the directory holding both on the last line
#   scripts/cuda-tools.sh --check  print that directory if complete, else one line and exit 1 (tests)
set -euo pipefail
# shellcheck source=scripts/venv.sh
. "$(dirname "$0")/venv.sh"
VENV=${FSDPD_CUDA_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdpd/cudatools}
REQS=(nvidia-cuda-cuobjdump==13.2.86 nvidia-cuda-nvdisasm==13.2.86)
bindir() { find "$VENV/lib" -path '*/nvidia/*/bin/cuobjdump' -printf '%h\n' 2>/dev/null | head -n 1; }
if venv_current "$VENV" "${REQS[@]}" && [ -x "$(bindir)/nvdisasm" ]; then
  bindir
  exit 0
fi
if [ "${1:-}" = --check ]; then
  echo "the CUDA binary tools $VENV are missing or incomplete: run scripts/cuda-tools.sh (make test does)" >&2
  exit 1
fi
venv_create cuda-tools "$VENV" "cuobjdump, nvdisasm; ~30 MB" "${REQS[@]}"
d=$(bindir)
if [ ! -x "$d/cuobjdump" ] || [ ! -x "$d/nvdisasm" ]; then
  echo "cuda-tools: the wheels brought no cuobjdump/nvdisasm" >&2
  exit 1
fi
venv_stamp "$VENV" "${REQS[@]}"
echo "$d"
