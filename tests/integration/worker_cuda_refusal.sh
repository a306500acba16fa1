#!/usr/bin/env bash
# fsdp-worker --standalone with [fsdp] device = cuda on a machine without a CUDA driver or GPU: the
# job fails at once (no rendezvous wait, no training), exit status 1, with exactly one ERROR line
# naming the problem: "device = cuda: no usable GPU: cudaGetDeviceCount: ..." in a CUDA build, or
# "device = cuda: this fsdp-worker was built without CUDA ..." in a build without it. Skipped where
# libcuda.so.1 is installed (there a GPU may really be usable: tests/gpu/run.sh covers that).
set -euo pipefail
build=$1
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  echo "worker_cuda_refusal: libcuda.so.1 present; skipped"
  exit 0
fi
tmp=$(mktemp -d /tmp/fsdp-it-cuda.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/job.ini" <<JOB
[job]
name = cuda-refusal
steps = 2
[model]
n_layer = 1
n_head = 2
n_embd = 128
vocab_size = 64
seq_len = 16
[data]
train = synthetic:markov:3
batch_size = 2
[fsdp]
world_size = 2
device = cuda
timeout_s = 60
JOB
# rank 1 of 2 with no rank 0: a worker that reached the rendezvous would wait timeout_s (60 s)
start=$(date +%s)
set +e
timeout 30 "$build/fsdp-worker" --standalone --rank 1 --world 2 --rendezvous "$tmp/rdv" "$tmp/job.ini" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
set -e
took=$(( $(date +%s) - start ))
if [ "$rc" -ne 1 ]; then echo "expected exit status 1, got $rc"; cat "$tmp/err"; exit 1; fi
if [ "$took" -gt 20 ]; then echo "took ${took}s: it waited instead of failing at once"; exit 1; fi
errors=$(grep -c ' ERROR ' "$tmp/err" || true)
if [ "$errors" -ne 1 ]; then echo "expected one ERROR line, got $errors:"; cat "$tmp/err"; exit 1; fi
if ! grep -Eq 'ERROR .*device = cuda: (no usable GPU: cudaGetDeviceCount: .+|this fsdp-worker was built without CUDA .+)$' "$tmp/err"; then
  echo "the ERROR line does not name the problem:"; cat "$tmp/err"; exit 1
fi
if [ -s "$tmp/out" ]; then echo "it reported steps:"; cat "$tmp/out"; exit 1; fi
echo "worker_cuda_refusal: ok ($(grep ' ERROR ' "$tmp/err" | sed 's/.*ERROR //'))"
