#!/usr/bin/env bash
# blas_info — fsdp-worker and fsdpd say which BLAS kernels run, once at start, and warn when
# OPENBLAS_CORETYPE forces kernels older than this CPU's (docs/performance.md, "BLAS kernels"):
# forced to SSE3 ("Prescott") on a CPU with AVX, warned; forced to the CPU's own set, or unset, not.
# Usage: bash blas_info.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" blasinfo
W="$BUILD/fsdp-worker"
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
own=""   # the OpenBLAS kernel type of this CPU's widest set
if grep -qw avx512f <<<"$flags"; then own=SkylakeX; elif grep -qw avx2 <<<"$flags"; then own=Haswell;
elif grep -qw avx <<<"$flags"; then own=Sandybridge; fi
[ -n "$own" ] || { echo "skip: this CPU has no AVX: no kernel type is older than its own"; exit 77; }

out=$(OPENBLAS_CORETYPE=Prescott "$W" --blas-info)
grep -q "^BLAS: OpenBLAS .*kernels Prescott (SSE)" <<<"$out" || fail "no kernel line with Prescott forced: $out"
grep -q "^warning: OPENBLAS_CORETYPE=Prescott in the environment forces .* set OPENBLAS_CORETYPE=$own" <<<"$out" ||
  fail "no warning with OPENBLAS_CORETYPE=Prescott on a CPU with $own kernels: $out"
out=$(OPENBLAS_CORETYPE=$own "$W" --blas-info)
grep -q "kernels $own " <<<"$out" || fail "OPENBLAS_CORETYPE=$own not taken: $out"
grep -q "^warning" <<<"$out" && fail "a warning with OPENBLAS_CORETYPE=$own, this CPU's own: $out"
out=$(env -u OPENBLAS_CORETYPE "$W" --blas-info)
grep -q "^BLAS: OpenBLAS" <<<"$out" || fail "no kernel line with OPENBLAS_CORETYPE unset: $out"
grep -q "in the environment forces" <<<"$out" && fail "an environment warning with OPENBLAS_CORETYPE unset: $out"

# the same lines, once, in fsdpd's log at start (its workers inherit the variable)
OPENBLAS_CORETYPE=Prescott start_daemon
wait_for 30 grep -q "INFO .*BLAS: OpenBLAS" "$S/fsdpd.log" || fail "fsdpd logged no BLAS line"
grep -q "WARN .*OPENBLAS_CORETYPE=Prescott in the environment forces" "$S/fsdpd.log" || fail "fsdpd did not warn"
[ "$(grep -c 'BLAS: OpenBLAS' "$S/fsdpd.log")" = 1 ] || fail "fsdpd logged the BLAS line more than once"
stop_daemon
echo "blas_info: ok"
