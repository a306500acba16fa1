#!/usr/bin/env bash
# Before/after step times of bench_step from two builds, in alternating runs (the order swapped every
# round) so that both see the same machine conditions: for each architecture and configuration, ROUNDS rounds of (A, B), each
# run reporting its fwd+bwd tokens/s (from its median step); prints per row the median over rounds
# of each build's tokens/s and the ratio B/A (1.00: unchanged, above 1: B faster).
#   bench/step_ab.sh BUILD_A BUILD_B [ROUNDS] [THREADS]
set -euo pipefail
a=${1:?BUILD_A}
b=${2:?BUILD_B}
rounds=${3:-5}
threads=${4:-2}
median() { sort -g | awk '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m}'; }
step() { "$1/bench/bench_step" "${@:2}" --threads "$threads" | awk '$1 == "fwd+bwd" && $2 == "median" {print $8}'; }
printf '%-6s %-36s %12s %12s %7s\n' arch config "A tok/s" "B tok/s" "B/A"
for arch in gpt2 llama; do
  for cfg in "--config tiny --iters 100" "--config small --seq 64 --iters 4"; do
    : > /tmp/step_ab.$$.a
    : > /tmp/step_ab.$$.b
    for ((r = 0; r < rounds; r++)); do   # A then B, then B then A: neither always runs second
      order="a b"
      if ((r % 2)); then order="b a"; fi
      for x in $order; do
        dir=$a
        [ "$x" = b ] && dir=$b
        # shellcheck disable=SC2086
        step "$dir" $cfg --arch "$arch" >> /tmp/step_ab.$$.$x
      done
    done
    ma=$(median < /tmp/step_ab.$$.a)
    mb=$(median < /tmp/step_ab.$$.b)
    printf '%-6s %-36s %12.0f %12.0f %7.3f\n' "$arch" "$cfg" "$ma" "$mb" "$(awk -v x="$ma" -v y="$mb" 'BEGIN {print y / x}')"
  done
done
rm -f /tmp/step_ab.$$.a /tmp/step_ab.$$.b
