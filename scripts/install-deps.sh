#!/usr/bin/env bash
# Installs the Debian packages fsdpd needs, by purpose; only what is missing.
#   scripts/install-deps.sh           what the build and `make demo` need
#   scripts/install-deps.sh --test    also what the tests need (`make test`)
#   scripts/install-deps.sh --list [--test|--bench]   print the packages, install nothing
#   scripts/install-deps.sh --bench   also what the benchmarks compare against or profile with
#                                     (PyTorch for bench/torch_step.py, perf, valgrind for
#                                     bench/trace_instructions.sh, time for bench/lora_step.sh)
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is not a Debian package here: it is found under
# /usr/local/cuda or CUDAToolkit_ROOT when present, and the build goes CPU-only without it.
# The Python packages the interoperability tests compare against come from PyPI through
# scripts/test-env.sh.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libuv1-dev libzmq3-dev libprotobuf-c-dev protobuf-c-compiler
  libopenblas-dev libgloo-dev libinih-dev libsqlite3-dev libjansson-dev libisal-dev
  libonig-dev libutf8proc-dev    # tokenizer.json: split regexes (Oniguruma, as `tokenizers`), NFC
  libmicrohttpd-dev     # fsdpd --metrics: the HTTP server of the Prometheus endpoint
  gnuplot-nox           # fsdpctl plot
  libncurses-dev        # fsdpctl top
)
TEST_PKGS=(
  python3 python3-venv  # integration tests' helpers; scripts/test-env.sh's virtual environment
  procps mount          # pgrep, and a tmpfs for the full-disk case
  tmux                  # tests/integration/top.sh: fsdpctl top in an 80x24 terminal
  passwd util-linux     # trust_files.sh and trust_users.sh: useradd/userdel, runuser and setpriv for other users
  curl prometheus       # tests/integration/metrics.sh: scrapes, and promtool check metrics
  clang libclang-rt-14-dev   # tests/fuzz: libFuzzer targets run by .ci/run
  slurmctld slurmd slurm-client munge   # tests/integration/slurm.sh: a one-node Slurm of its own
)
LIST=0
if [ "${1:-}" = --list ]; then LIST=1; shift; fi
case "${1:-}" in
  "") ;;
  --test) PKGS+=("${TEST_PKGS[@]}") ;;
  --bench) PKGS+=("${TEST_PKGS[@]}" python3-torch linux-perf valgrind time) ;;
  *) echo "usage: $0 [--list] [--test|--bench]" >&2; exit 2 ;;
esac
if [ "$LIST" = 1 ]; then
  printf '%s\n' "${PKGS[@]}"
  exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
