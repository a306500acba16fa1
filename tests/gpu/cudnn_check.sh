#!/usr/bin/env bash
# gpu_cudnn (a ctest): cudnn_check against the real libcudnn that PyTorch's wheel carries in the
# test environment (scripts/test-env.sh; make test creates it). No GPU needed; see cudnn_check.c.
#   cudnn_check.sh CUDNN_CHECK_BINARY
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$(bash "$here/../../scripts/test-env.sh" --check)
lib=$("$py" -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib", "libcudnn.so.9"))')
if [ ! -f "$lib" ]; then
  echo "FAIL: the test environment has no libcudnn.so.9 (looked at $lib)" >&2
  exit 1
fi
exec "$1" real "$lib"
