#!/usr/bin/env bash
# tests/gpu/run.sh's own logic, on this machine without a GPU (the GPU steps themselves run only on
# a device machine, docs/gpu.md):
#  1. --dry-run with this build's binaries (step 3 left out: part 3 runs its CPU references): step 1
#     PASS, the plan of step 6 is read for real, every GPU step SKIPs, the table is written, exit 0;
#     the script's own account of the budget (every step at its maximum, and the table) is within
#     450 s, and the report (step 8 included) is under 15 MiB; a step short of its minimum SKIPs
#     saying so, and the benchmark and PyTorch keep their time while they are still to come;
#     report.py pack keeps an archive of a 20 MB log and a checkpoint under its limit, without the
#     checkpoint;
#  2. a pretended GPU (FSDP_GPU_PRETEND), step 6 only: the device = cuda run cannot succeed here, so
#     the step must FAIL with the worker's one-line reason, the table must show it, and exit 1;
#  3. the PASS paths, with stand-ins: a worker that trains "device = cuda" on the CPU (the real
#     worker with device = cpu) and reports synthetic benchmark steps for GPT-2 124M, a gpu_check and
#     a python3-with-torch that print what the real ones print: steps 2-4, 6-8 PASS (8: the async
#     checkpoint against the sync one, for real on the CPU), the figures
#     (MFU, peak against the plan, the PyTorch ratios) land in the table; and report.py's loss
#     comparisons fail when they should;
#  3b. a job whose ranks hang: at the step's deadline each rank's host stack (gdb) is shown in the
#     step's FAIL line and the ranks are killed; without gdb, cuda-gdb (a stand-in) is used, and
#     without either each thread's /proc wait channel;
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
acc = r["metrics"]["budget_account"]
assert acc["maxima"] + acc["table"] <= 450 and acc["budget"] == 450, acc
print("dry run: ok; budget account", acc)
PY
test -s "$tmp/dry/gpu_report.md"
grep -qE '^budget: step maxima .* = [0-9]+ s, \+ 15 s for the table = [0-9]+ s of 450 s$' "$tmp/dry.log" ||
  { cat "$tmp/dry.log"; echo "dry run: no budget account line"; exit 1; }
# report_ok DIR: under 15 MiB in all, logs.tar.gz a readable archive without a checkpoint
report_ok() {
  local size
  size=$(du -cb "$1"/* | tail -n 1 | cut -f1)
  [ "$size" -lt $((15 * 1024 * 1024)) ] || { ls -l "$1"; echo "$1: the report is $size bytes, over 15 MiB"; exit 1; }
  tar -tzf "$1/logs.tar.gz" >"$tmp/list" || { echo "$1/logs.tar.gz is not an archive"; exit 1; }
  if grep -E '(^|/)step-[0-9]+(/|$)|\.bin$' "$tmp/list"; then echo "$1/logs.tar.gz holds checkpoint files"; exit 1; fi
  grep -q 'results.tsv' "$tmp/list" || { echo "$1/logs.tar.gz lacks results.tsv"; exit 1; }
}
report_ok "$tmp/dry"

# 1b. allotments, in one dry run of a 100 s budget: the benchmark's maximum is kept while it is
# still to come, so step 2 SKIPs for it; PyTorch could not get its minimum after the benchmark's,
# so nothing is kept for it: step 6 runs, and step 7 SKIPs short of its own minimum
rc=0
FSDP_GPU_BIN=$build OUT=$tmp/keep timeout 120 bash "$src/tests/gpu/run.sh" --dry-run --only 2,6,7 --budget 100 >"$tmp/keep.log" 2>&1 || rc=$?
if [ $rc -ne 0 ] || ! grep -qE 'run.sh: \[2\] gpu_check: SKIP: needs at least [0-9]+ s and the 100 s budget leaves [0-9]+ s after the 75 s kept for step 6$' "$tmp/keep.log" ||
   ! grep -q 'run.sh: \[6\] benchmark: SKIP: dry run (the plan was read)' "$tmp/keep.log" ||
   ! grep -qE 'run.sh: \[7\] PyTorch same step: SKIP: needs at least 90 s and the 100 s budget leaves [0-9]+ s$' "$tmp/keep.log"; then
  cat "$tmp/keep.log"; echo "budget 100: step 2 should SKIP for the time kept for 6, step 6 run, step 7 SKIP for its minimum"; exit 1
fi
# pack: a 20 MB log is cut, a checkpoint left out, the archive under its limit
mkdir -p "$tmp/pk/runs/ck/step-00000002"
head -c 15000000 /dev/urandom | base64 -w 100 >"$tmp/pk/runs/big.log"
head -c 4096 /dev/urandom >"$tmp/pk/runs/ck/step-00000002/rank-0.bin"
echo kept >"$tmp/pk/runs/small.log"
python3 "$src/tests/gpu/report.py" pack "$tmp/pk" "$tmp/pk.tar.gz" --limit 5000000
[ "$(stat -c %s "$tmp/pk.tar.gz")" -le 5000000 ] || { echo "pack: over its limit"; exit 1; }
tar -xzOf "$tmp/pk.tar.gz" runs/big.log >"$tmp/pk-big.log"
grep -q 'report.py pack: [0-9]* bytes left out' "$tmp/pk-big.log" || { echo "pack: the big log was not cut"; exit 1; }
[ "$(tar -xzOf "$tmp/pk.tar.gz" runs/small.log)" = kept ] || { echo "pack: the small log was lost"; exit 1; }
if tar -tzf "$tmp/pk.tar.gz" | grep -q 'step-'; then echo "pack: the checkpoint was packed"; exit 1; fi
echo "allotments and pack: ok"

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
cat >"$fake/nvidia-smi" <<'SH'
#!/bin/sh
cat <<NVSMI
==============NVSMI LOG==============
Attached GPUs                             : 1
GPU 00000000:19:00.0
    Clocks Event Reasons
        Idle                              : Not Active
        SW Power Cap                      : Active
        HW Slowdown                       : Not Active
    Clocks
        Graphics                          : 1755 MHz
        SM                                : 1755 MHz
        Memory                            : 3201 MHz
NVSMI
SH
chmod +x "$fake/fsdp-worker" "$fake/gpu_check" "$fake/python" "$fake/nvidia-smi"
ln -s "$build/fsdpctl" "$fake/fsdpctl"
rc=0
# (CPU stand-ins for GPU jobs, on a machine that may be busy: allotments three times a GPU's)
REAL_BUILD=$build FSDP_GPU_BIN=$fake FSDP_GPU_PRETEND="NVIDIA H100 80GB HBM3 stand-in" FSDP_GPU_PYTHON=$fake/python FSDP_GPU_SANITIZER=none \
  FSDP_GPU_SMI=$fake/nvidia-smi FSDP_GPU_TIME_SCALE=3 \
  OUT=$tmp/pass timeout 600 bash "$src/tests/gpu/run.sh" >"$tmp/pass.log" 2>&1 || rc=$?
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
assert m["clocks_before_bench"] == "Graphics 1755 MHz, SM 1755 MHz, Memory 3201 MHz; throttle: SW Power Cap", m
assert m["first_step_ms"]["bench/rank-0"] == 500, m["first_step_ms"]
assert len(m["first_step_ms"]) >= 10, m["first_step_ms"]   # every job's every rank
# step 4 on the CPU: the two N = 1 runs differ by float summation alone, so the floor holds
assert m["staged_calibration_diff"] < 2.5e-5 and m["staged_rtol"] == 1e-4, m
assert "cudnn " in m["versions"], m["versions"]
assert [s["step"] for s in r["steps"]] == ["1", "2", "6", "7", "3", "4", "5", "8", "9"], r["steps"]
print("stand-ins: ok")
PY
report_ok "$tmp/pass"
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
  bash "$src/tests/gpu/run.sh" --only 6 --budget 75 >"$tmp/hang.log" 2>&1 || rc=$?
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
# without gdb: cuda-gdb (a stand-in printing gdb's format), and without it /proc
sleep 120 &
sp=$!
cat >"$hang/cuda-gdb" <<'SH'
#!/bin/sh
printf 'Thread 1 (Thread 0x7f LWP 1 "fsdp-worker"):\n#0  0x00007f in pthread_cond_timedwait () from /lib/libc.so.6\n#1  0x000055 in comm_wait (c=0x1) at comm.c:12\n'
SH
chmod +x "$hang/cuda-gdb"
st=$(HELP=$src/tests/gpu/report.py FSDP_GPU_GDB=none FSDP_GPU_CUDA_GDB=$hang/cuda-gdb bash -c '. "$1"; host_stacks "$2" "$3"; cat "$2"' _ \
  "$src/tests/gpu/run_jobs.sh" "$tmp/st-cuda" "$sp")
echo "$st" | grep -q "^stack: pid $sp: pthread_cond_timedwait < comm_wait$" || { echo "$st"; echo "host stacks: cuda-gdb not used"; kill "$sp"; exit 1; }
st=$(HELP=$src/tests/gpu/report.py FSDP_GPU_GDB=none FSDP_GPU_CUDA_GDB=none bash -c '. "$1"; host_stacks "$2" "$3"; cat "$2"' _ \
  "$src/tests/gpu/run_jobs.sh" "$tmp/st-proc" "$sp")
kill "$sp"
echo "$st" | grep -qE "^stack: pid $sp: /proc: 1 threads, main thread in [a-z_0-9]+" || { echo "$st"; echo "host stacks: /proc not read"; exit 1; }
echo "host stacks without gdb: ok"

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
