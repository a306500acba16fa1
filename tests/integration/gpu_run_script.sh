#!/usr/bin/env bash
# tests/gpu/run.sh's own logic, on this machine without a GPU (the GPU steps themselves run only on
# a device machine, docs/gpu.md):
#  1. --dry-run with this build's binaries (step 3 left out: part 3 runs its CPU references): step 1
#     PASS, the plan of step 6 is read for real, every GPU step SKIPs, the table is written, exit 0;
#  2. a pretended GPU (FSDP_GPU_PRETEND), step 6 only: the device = cuda run cannot succeed here, so
#     the step must FAIL with the worker's one-line reason, the table must show it, and exit 1;
#  3. the PASS paths, with stand-ins: a worker that trains "device = cuda" on the CPU (the real
#     worker with device = cpu) and reports synthetic benchmark steps for GPT-2 124M, a gpu_check and
#     a python3-with-torch that print what the real ones print: steps 2-4, 6-8 PASS (8: the async
#     checkpoint against the sync one, for real on the CPU), the figures
#     (MFU, peak against the plan, the PyTorch ratios) land in the table; and report.py's loss
#     comparisons fail when they should;
#  3b. a job whose ranks hang: at the step's deadline each rank's host stack (gdb) is shown in the
#     step's FAIL line and the ranks are killed;
#  3c. a device fault: the job is re-run for one step under (a stand-in of) compute-sanitizer
#     memcheck and the step's FAIL line names the kernel;
#  4. with the CUDA backend: scripts/gpu-bundle.sh packs this build, and the bundle, unpacked, starts
#     through its carried glibc loader and its libraries alone (all but glibc and the CUDA ones come
#     from the bundle), and answers a dry run of step 6.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d /tmp/fsdp-it-gpurun.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# 1. dry run
rc=0
FSDP_GPU_BIN=$build OUT=$tmp/dry timeout 300 bash "$src/tests/gpu/run.sh" --dry-run --only 2,4,5,6,7,8 >"$tmp/dry.log" 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat "$tmp/dry.log"; echo "dry run: exit $rc, expected 0"; exit 1; }
python3 - "$tmp/dry/gpu_report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
st = {s["step"]: (s["status"], s["detail"]) for s in r["steps"]}
assert sorted(st) == [str(i) for i in range(1, 10)], st
assert st["1"][0] == "PASS", st["1"]
for i in "245678":
    assert st[i][0] == "SKIP" and st[i][1].startswith("dry run"), (i, st[i])
assert st["3"] == ("SKIP", "not selected (--only 2,4,5,6,7,8)"), st["3"]
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

# 3. stand-ins for the GPU-side programs: the PASS paths and the figures
fake=$tmp/fake-bin
mkdir -p "$fake"
cat >"$fake/fsdp-worker" <<'SH'
#!/usr/bin/env bash
set -euo pipefail
real=$REAL_BUILD/fsdp-worker
[ "${1:-}" = --help ] && exec "$real" --help
job=${*: -1}
if grep -q '^vocab_size = 50257' "$job"; then   # the benchmark: 2 % over the plan, 120 ms steps
  total=$("$REAL_BUILD/fsdpctl" plan --json "$job" | python3 -c 'import json, sys; print(json.load(sys.stdin)["memory"]["total"])')
  steps=$(sed -n 's/^steps = //p' "$job")
  for ((s = 1; s <= steps; s++)); do
    printf '{"step":%d,"rank":0,"loss":%s,"tokens":16384,"step_ms":%d,"peak_bytes":{"total":%d},"phase_ms":{"allgather":0.5,"compute":100,"reducescatter":0.25,"optimizer":3},"sent_bytes":{}}\n' \
      "$s" "$(awk -v s="$s" 'BEGIN {print 11 - s / 10}')" $((s <= 3 ? 500 : 120)) $((total + total / 50))
  done
  exit 0
fi
sed -e 's/^device = cuda/device = cpu/' -e 's/^comm = .*/comm = auto/' -e 's/^offload = .*/offload = none/' "$job" >"$job.cpu"
exec "$real" "${@:1:$#-1}" "$job.cpu"
SH
cat >"$fake/gpu_check" <<'SH'
#!/bin/sh
echo "device 0: stand-in, compute capability 9.0"
printf '%-60s %.3f ms per GEMM  %.1f TFLOP/s\n' "bf16 GEMM rate 8192^3 (M=8192 K=8192 N=8192)" 1.412 780.0
echo "gpu_check: 69 checks passed, 0 failed: PASS"
SH
cat >"$fake/python" <<'SH'
#!/bin/sh
[ "$1" = -c ] && exit 0
echo '{"torch_step": "gpt2", "mode": "eager", "tokens_per_s": 100000.0, "step_ms": 163.8, "peak_bytes": 3e10, "compile_s": null}'
echo '{"torch_step": "gpt2", "mode": "compile", "tokens_per_s": 150000.0, "step_ms": 109.2, "peak_bytes": 2.5e10, "compile_s": 42.0}'
SH
chmod +x "$fake/fsdp-worker" "$fake/gpu_check" "$fake/python"
ln -s "$build/fsdpctl" "$fake/fsdpctl"
rc=0
REAL_BUILD=$build FSDP_GPU_BIN=$fake FSDP_GPU_PRETEND="NVIDIA H100 80GB HBM3 stand-in" FSDP_GPU_PYTHON=$fake/python FSDP_GPU_SANITIZER=none \
  OUT=$tmp/pass timeout 300 bash "$src/tests/gpu/run.sh" >"$tmp/pass.log" 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat "$tmp/pass.log"; echo "stand-ins: exit $rc, expected 0"; exit 1; }
python3 - "$tmp/pass/gpu_report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
st = {s["step"]: s["status"] for s in r["steps"]}
assert st == {"1": "PASS", "2": "PASS", "3": "PASS", "4": "PASS", "5": "SKIP", "6": "PASS", "7": "PASS", "8": "PASS", "9": "PASS"}, st
m = r["metrics"]
assert m["gemm_tflops"] == 780.0, m
tps = 16384 / 0.120
assert abs(m["ours_tokens_per_s"] - tps) < 1e-6 * tps, m
assert abs(m["ours_mfu"] - tps * m["ours_flops_per_token"] / 780e12) < 1e-9, m
assert abs(m["peak_vs_plan"] - 0.02) < 1e-3, m
assert abs(m["ratio_compile"] - tps / 150000) < 1e-9 and abs(m["ratio_eager"] - tps / 100000) < 1e-9, m
# llm.c's count, 6·N + 6·L·C·T, over an H100's dense bf16 peak
assert m["ours_bf16_peak_tflops"] == 989.4, m
fpt = 6 * 124439808 + 6 * 12 * 768 * 1024   # GPT-2 124M: N = 124,439,808 (V = 50257)
assert m["ours_flops_per_token_llmc"] == fpt and abs(m["ours_mfu_llmc"] - tps * fpt / 989.4e12) < 1e-9, m
assert r["targets"] == {"MFU ≥ 40 % (llm.c's count)": False, "tokens/s ≥ torch.compile's": False,
                        "peak memory within 10 % of the plan": True}, r["targets"]
print("stand-ins: ok")
PY
# report.py's comparisons: 3 % off fails rtol 2e-2, 1 % passes; an untrained run fails `moves`
mk() {
  mkdir -p "$tmp/cmp/$1"
  for l in "${@:2}"; do echo "{\"step\": 1, \"loss\": $l}"; done >"$tmp/cmp/$1/rank-0.jsonl"
}
mk ref 5.0 4.8 4.6
mk off3 5.0 4.8 4.738
mk off1 5.0 4.8 4.646
mk frozen 5.0 4.99 5.01
if python3 "$src/tests/gpu/report.py" compare "$tmp/cmp/ref" "$tmp/cmp/off3" --steps 3 --rtol 2e-2; then
  echo "report.py compare passed losses 3 % apart at rtol 2e-2"; exit 1
fi
python3 "$src/tests/gpu/report.py" compare "$tmp/cmp/ref" "$tmp/cmp/off1" --steps 3 --rtol 2e-2
python3 "$src/tests/gpu/report.py" moves "$tmp/cmp/ref" "$tmp/cmp/frozen" --steps 3 --rtol 2e-2
if python3 "$src/tests/gpu/report.py" moves "$tmp/cmp/ref" "$tmp/cmp/off1" --steps 3 --rtol 2e-2; then
  echo "report.py moves passed a run that barely differs from the frozen one"; exit 1
fi

# 3b. a job that hangs (every rank blocks): at its deadline each rank's host stack is taken (gdb,
# where present) and shown, then the job is killed; a step of 40 s or so, in a budget of 60 s
hang=$tmp/hang-bin
mkdir -p "$hang"
cat >"$hang/fsdp-worker" <<'SH'
#!/usr/bin/env bash
[ "${1:-}" = --help ] && exec "$REAL_BUILD/fsdp-worker" --help
exec python3 -c 'import signal; signal.pause()' "$@"
SH
chmod +x "$hang/fsdp-worker"
ln -s "$build/fsdpctl" "$hang/fsdpctl"
rc=0
REAL_BUILD=$build FSDP_GPU_BIN=$hang FSDP_GPU_PRETEND="stand-in" OUT=$tmp/hang timeout 300 \
  bash "$src/tests/gpu/run.sh" --only 6 --budget 60 >"$tmp/hang.log" 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat "$tmp/hang.log"; echo "hang: exit $rc, expected 1 (step 6 FAIL)"; exit 1; }
python3 - "$tmp/hang/gpu_report.json" "$(command -v gdb || true)" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
st = {s["step"]: (s["status"], s["detail"]) for s in r["steps"]}
d = st["6"][1]
assert st["6"][0] == "FAIL" and re.search(r"timed out after \d+ s; host stacks: ", d), d
if sys.argv[2]:   # gdb attached to the one rank: its main thread's frames
    assert re.search(r"host stacks: pid \d+: \S+", d) and "no stack" not in d, d
print("hang: step 6 FAIL:", d[:160])
PY
pgrep -f "$hang/" >/dev/null && { echo "hang: a rank outlived its job"; exit 1; }

# 3c. a device fault: the failing job is run again for one step under compute-sanitizer memcheck
# (a stand-in that prints what memcheck prints), and the step's FAIL line names the kernel
fault=$tmp/fault-bin
mkdir -p "$fault"
cat >"$fault/fsdp-worker" <<'SH'
#!/usr/bin/env bash
[ "${1:-}" = --help ] && exec "$REAL_BUILD/fsdp-worker" --help
echo "2026-12-01T00:00:00Z ERROR worker[0] main.c:1: device = cuda: CUDA device 0: cudaStreamSynchronize (a kernel or copy failed): an illegal memory access was encountered (cudaErrorIllegalAddress)" >&2
exit 1
SH
cat >"$fault/compute-sanitizer" <<'SH'
#!/usr/bin/env bash
while [ "${1:-}" != "${1#--}" ]; do shift 2; done   # its options, each with a value
echo "========= COMPUTE-SANITIZER" >&2
echo "========= Invalid __global__ read of size 2 bytes" >&2
echo "=========     at void gelu_forward_kernel<true>(__nv_bfloat16 *, const __nv_bfloat16 *, long)+0x1c0" >&2
exec "$@"
SH
chmod +x "$fault/fsdp-worker" "$fault/compute-sanitizer"
ln -s "$build/fsdpctl" "$fault/fsdpctl"
rc=0
REAL_BUILD=$build FSDP_GPU_BIN=$fault FSDP_GPU_PRETEND="stand-in" FSDP_GPU_SANITIZER=$fault/compute-sanitizer \
  OUT=$tmp/fault timeout 300 bash "$src/tests/gpu/run.sh" --only 6 >"$tmp/fault.log" 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat "$tmp/fault.log"; echo "fault: exit $rc, expected 1 (step 6 FAIL)"; exit 1; }
python3 - "$tmp/fault/gpu_report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
d = {s["step"]: s for s in r["steps"]}["6"]["detail"]
assert "illegal memory access" in d and "memcheck: Invalid __global__ read of size 2 bytes in void gelu_forward_kernel<true>" in d, d
print("fault: step 6 FAIL:", d[:200])
PY

# 4. the bundle (needs the CUDA backend: gpu_check)
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
