#!/usr/bin/env bash
# Installs the Debian packages fsdpd builds and tests with; only what is missing.
#   scripts/install-deps.sh           what `make demo` and `make test` need
#   scripts/install-deps.sh --bench   also what the benchmarks compare against or profile with
#                                     (PyTorch for bench/torch_step.py, perf, valgrind for
#                                     bench/trace_instructions.sh)
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is not a Debian package here: it is found under
# /usr/local/cuda or CUDAToolkit_ROOT when present, and the build goes CPU-only without it.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libuv1-dev libzmq3-dev libprotobuf-c-dev protobuf-c-compiler
  libopenblas-dev libgloo-dev libinih-dev libsqlite3-dev libjansson-dev libisal-dev
  libpcre2-dev libutf8proc-dev   # tokenizer.json: split regexes with Unicode properties, NFC
  libmicrohttpd-dev     # fsdpd --metrics: the HTTP server of the Prometheus endpoint
  gnuplot-nox           # fsdpctl plot
  libncurses-dev        # fsdpctl top
  tmux                  # tests/integration/top.sh: fsdpctl top in an 80x24 terminal
  python3 procps mount   # integration tests: pgrep, and a tmpfs for the full-disk case
  curl prometheus       # tests/integration/metrics.sh: scrapes, and promtool check metrics
  clang libclang-rt-14-dev   # tests/fuzz: libFuzzer targets run by .ci/run
  slurmctld slurmd slurm-client munge   # tests/integration/slurm.sh: a one-node Slurm of its own
)
case "${1:-}" in
  "") ;;
  --bench) PKGS+=(python3-torch linux-perf valgrind) ;;
  *) echo "usage: $0 [--bench]" >&2; exit 2 ;;
esac

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
