#!/usr/bin/env bash
# The Python environment the interoperability tests compare against: torch, transformers,
# tokenizers and safetensors from PyPI in a virtual environment, created once and cached outside
# the clone (default ~/.cache/fsdpd/testenv, or FSDPD_TEST_VENV). `make test` runs this before
# ctest, outside any test's timeout. It costs about 6 GB of disk (torch's wheel brings CUDA
# libraries) and a few minutes on the first run; later runs only check it.
#   scripts/test-env.sh          create or check the environment; prints its python on the last line
#   scripts/test-env.sh --check  print its python if it is complete, else one line and exit 1 (tests)
set -euo pipefail
# shellcheck source=scripts/venv.sh
. "$(dirname "$0")/venv.sh"
VENV=${FSDPD_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdpd/testenv}
# Versions the tests were written against (transformers 5: rope_parameters, dtype in config.json).
REQS=(torch==2.15.0 transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0 numpy)
if venv_current "$VENV" "${REQS[@]}"; then
  echo "$VENV/bin/python"
  exit 0
fi
if [ "${1:-}" = --check ]; then
  echo "the test environment $VENV is missing or incomplete: run scripts/test-env.sh (make test does)" >&2
  exit 1
fi
venv_create test-env "$VENV" "torch, transformers, tokenizers, safetensors; ~6 GB" "${REQS[@]}"
"$VENV/bin/python" -c "import torch, transformers, tokenizers, safetensors" >&2
venv_stamp "$VENV" "${REQS[@]}"
echo "$VENV/bin/python"
