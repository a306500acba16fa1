#!/usr/bin/env bash
# The Python environment the interoperability tests compare against: torch, transformers,
# tokenizers and safetensors from PyPI in a virtual environment, created once and cached outside
# the clone (default ~/.cache/fsdpd/testenv, or FSDPD_TEST_VENV). `make test` runs this before
# ctest, outside any test's timeout. It costs about 6 GB of disk (torch's wheel brings CUDA
# libraries) and a few minutes on the first run; later runs only check it.
# It also fetches, once, the published chat templates the renderer is compared on (common/jinja,
# tests/integration/chat_template_hf.sh): the source distribution of llama-cpp-python (77 MB) vendors
# about 70 of them under vendor/llama.cpp/models/templates/; pip saves it without building it (the
# environment has its build backend, scikit-build-core) and its *.jinja files are kept in
# CHAT_TEMPLATES (default ~/.cache/fsdpd/chat-templates, or FSDPD_CHAT_TEMPLATES).
#   scripts/test-env.sh          create or check the environment; prints its python on the last line
#   scripts/test-env.sh --check  print its python if it is complete, else one line and exit 1 (tests)
#   scripts/test-env.sh --templates  print the chat template folder if it was fetched, else one line
#                                and exit 1 (tests)
set -euo pipefail
# shellcheck source=scripts/venv.sh
. "$(dirname "$0")/venv.sh"
VENV=${FSDPD_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdpd/testenv}
# Versions the tests were written against (transformers 5: rope_parameters, dtype in config.json).
# jinja2: the renderer of transformers' apply_chat_template; scikit-build-core: llama-cpp-python's
# build backend, which pip needs to save its source distribution (the chat templates). bitsandbytes:
# the NF4 format fsdpd's QLoRA base is compared with (its CPU backend; tests/integration/nf4_bnb.sh).
REQS=(torch==2.15.0 transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0 numpy jinja2==3.1.6
      scikit-build-core==1.1.2 peft==0.21.2 bitsandbytes==0.50.2)
CHAT_TEMPLATES=${FSDPD_CHAT_TEMPLATES:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdpd/chat-templates}
TEMPLATES_SDIST=llama-cpp-python==0.3.36

fetch_templates() {
  [ -f "$CHAT_TEMPLATES/.complete" ] && return 0
  echo "test-env: fetching the chat templates of $TEMPLATES_SDIST (77 MB, once)" >&2
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
     --no-build-isolation "$TEMPLATES_SDIST" >&2 &&
   tar -xzf llama_cpp_python-*.tar.gz --wildcards '*/vendor/llama.cpp/models/templates/*.jinja') || {
    rm -rf "$tmp"
    echo "test-env: could not fetch $TEMPLATES_SDIST" >&2
    return 1
  }
  rm -rf "$CHAT_TEMPLATES"
  mkdir -p "$CHAT_TEMPLATES"
  cp "$tmp"/llama_cpp_python-*/vendor/llama.cpp/models/templates/*.jinja "$CHAT_TEMPLATES/"
  rm -rf "$tmp"
  echo "$TEMPLATES_SDIST" >"$CHAT_TEMPLATES/.complete"
}

if [ "${1:-}" = --templates ]; then
  if [ -f "$CHAT_TEMPLATES/.complete" ]; then
    echo "$CHAT_TEMPLATES"
    exit 0
  fi
  echo "the chat templates are not fetched into $CHAT_TEMPLATES: run scripts/test-env.sh (make test does)" >&2
  exit 1
fi
if venv_current "$VENV" "${REQS[@]}"; then
  [ "${1:-}" = --check ] || fetch_templates
  echo "$VENV/bin/python"
  exit 0
fi
if [ "${1:-}" = --check ]; then
  echo "the test environment $VENV is missing or incomplete: run scripts/test-env.sh (make test does)" >&2
  exit 1
fi
venv_create test-env "$VENV" "torch, transformers, tokenizers, safetensors; ~6 GB" "${REQS[@]}"
"$VENV/bin/python" -c "import torch, transformers, tokenizers, safetensors, jinja2, peft" >&2
venv_stamp "$VENV" "${REQS[@]}"
fetch_templates
echo "$VENV/bin/python"
