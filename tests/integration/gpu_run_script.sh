#!/usr/bin/env bash
# tests/gpu/run.sh's own logic, on this machine without a GPU (the GPU steps themselves run only on
# a device machine, docs/gpu.md):
#  1. --dry-run with this build's binaries: step 1 PASS, the CPU reference runs of step 3 and the
#     plan of step 6 run for real, every GPU step SKIPs, the table is written, exit 0;
#  2. a pretended GPU (FSDP_GPU_PRETEND), step 6 only: the device = cuda run cannot succeed here, so
#     the step must FAIL with the worker's one-line reason, the table must show it, and exit 1;
#  3. with the CUDA backend: scripts/gpu-bundle.sh packs this build, and the bundle, unpacked, starts
#     through its carried glibc loader and its libraries alone (all but glibc and the CUDA ones come
#     from the bundle), and answers a dry run of step 6.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d /tmp/fsdp-it-gpurun.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# 1. dry run
rc=0
FSDP_GPU_BIN=$build OUT=$tmp/dry timeout 300 bash "$src/tests/gpu/run.sh" --dry-run >"$tmp/dry.log" 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat "$tmp/dry.log"; echo "dry run: exit $rc, expected 0"; exit 1; }
python3 - "$tmp/dry/gpu_report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
st = {s["step"]: (s["status"], s["detail"]) for s in r["steps"]}
assert sorted(st) == [str(i) for i in range(1, 9)], st
assert st["1"][0] == "PASS", st["1"]
for i in "234567":
    assert st[i][0] == "SKIP" and st[i][1].startswith("dry run"), (i, st[i])
assert "4 CPU reference runs passed" in st["3"][1], st["3"]
assert "plan was read" in st["6"][1], st["6"]
assert r["metrics"]["plan_bytes"] > 0 and not r["failed"], r
print("dry run: ok")
PY
test -s "$tmp/dry/gpu_report.md"

# 2. a pretended GPU: the benchmark's device = cuda run must fail cleanly
rc=0
FSDP_GPU_BIN=$build FSDP_GPU_PRETEND="no real GPU" OUT=$tmp/fake timeout 300 bash "$src/tests/gpu/run.sh" --only 6 \
  >"$tmp/fake.log" 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat "$tmp/fake.log"; echo "pretended GPU: exit $rc, expected 1 (step 6 FAIL)"; exit 1; }
python3 - "$tmp/fake/gpu_report.json" "$tmp/fake/gpu_report.md" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
st = {s["step"]: (s["status"], s["detail"]) for s in r["steps"]}
assert st["6"][0] == "FAIL" and "rank 0" in st["6"][1], st["6"]
assert all(st[i][0] == "SKIP" for i in "23457"), st
assert r["failed"] == ["6"], r["failed"]
md = open(sys.argv[2]).read()
assert "| 6 | benchmark | FAIL |" in md and "Verdict: 1 FAILED: 6 benchmark." in md, md
print("pretended GPU: step 6 FAIL:", st["6"][1][:120])
PY

# 3. the bundle (needs the CUDA backend: gpu_check)
if [ ! -x "$build/tests/gpu/gpu_check" ]; then
  echo "bundle: not checked (this build has no CUDA backend)"
  echo "gpu_run_script: ok"
  exit 0
fi
FSDP_GPU_BUILD=$build FSDP_GPU_BUNDLE=$tmp/bundle FSDP_GPU_BUNDLE_XZ=1 timeout 300 bash "$src/scripts/gpu-bundle.sh" --no-build
test -s "$tmp/bundle/fsdp-gpu-bundle.tar.xz"
grep -q '^cuda_arch: sm_90$' "$tmp/bundle/MANIFEST.txt"
mkdir "$tmp/unpacked"
tar -C "$tmp/unpacked" -xJf "$tmp/bundle/fsdp-gpu-bundle.tar.xz"
b=$tmp/unpacked/fsdp-gpu-bundle
ext=$(dirname "$(ldd "$build/tests/gpu/gpu_check" | awk '/libnccl|libcublasLt/ {print $3; exit}')")
for x in fsdp-worker fsdpctl gpu_check; do
  "$b/glibc/ld-linux-x86-64.so.2" --library-path "$b/glibc:$b/lib:$ext" --list "$b/bin/$x" >"$tmp/list-$x"
  if grep -q 'not found' "$tmp/list-$x"; then cat "$tmp/list-$x"; echo "bundle: $x misses a library"; exit 1; fi
  # every resolved library is the bundle's, except the CUDA ones left to the device machine
  if awk '/=>/ {print $3}' "$tmp/list-$x" | grep -v -e "^$b/" -e "^$ext/" | grep .; then
    echo "bundle: $x loads the libraries above from outside the bundle"; exit 1
  fi
done
rc=0
FSDP_GPU_BUNDLE=$tmp/bundle FSDP_GPU_FORCE_LOADER=1 OUT=$tmp/bdry timeout 300 bash "$src/tests/gpu/run.sh" --dry-run --only 6 \
  >"$tmp/bdry.log" 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat "$tmp/bdry.log"; echo "bundle dry run: exit $rc, expected 0"; exit 1; }
grep -q 'run.sh: \[1\] binaries + GPU: PASS: bundle, carried glibc loader' "$tmp/bdry.log" ||
  { cat "$tmp/bdry.log"; echo "bundle dry run: step 1 did not start the bundle through its loader"; exit 1; }
grep -q 'run.sh: \[6\] benchmark: SKIP: dry run (the plan was read)' "$tmp/bdry.log" ||
  { cat "$tmp/bdry.log"; echo "bundle dry run: the bundle's fsdpctl did not plan"; exit 1; }
echo "bundle: $(du -h "$tmp/bundle/fsdp-gpu-bundle.tar.xz" | cut -f1) at xz -1; starts through its loader; ok"
echo "gpu_run_script: ok"
