#!/usr/bin/env python3
"""report.py — the arithmetic of tests/gpu/run.sh: loss comparisons, the benchmark's figures and
the final table. Standard library only (it runs under whatever python3 the GPU machine has).

  report.py compare REF TEST --ranks N --steps K --rtol R   losses of two standalone runs agree
  report.py moves REF FROZEN --rtol R --steps K              REF's training moved its loss off a
                                                            frozen run's by > 3·R (so compare can fail)
  report.py lora REF TEST --ranks N --steps K [--cal "DL DA"]
                                                            two LoRA runs' distance "DL DA": the largest
                                                            relative loss difference over the steps, the
                                                            largest norm-wise relative one over the adapter
                                                            tensors (adapter/adapter_model.safetensors);
                                                            --cal: pass when within 4·max(1e-5, cal) each
  report.py bench RUN PLAN.json --skip S [--gemm-tflops G]  the benchmark's figures, one JSON object
  report.py gemm-torch                                      bf16 8192³ matmul rate through PyTorch
  report.py table RESULTS.tsv METRICS.json OUTDIR            print the table; write gpu_report.{md,json}
  report.py stack [--proc] FILE                             a gdb/cuda-gdb backtrace's main thread, innermost
                                                            first: "f1 < f2 < ..." (6 frames); --proc:
                                                            each thread's wait channel from /proc
  report.py memcheck LOG                                    compute-sanitizer memcheck's first error: the
                                                            access and the kernel
  report.py racecheck LOG --rc N                            racecheck's verdict: hazards in our kernels
                                                            fail; in cuBLASLt's or cuDNN's (LIB_KERNELS) do not
  report.py pack WORK OUT.tar.gz --limit BYTES              the run's logs as a tar.gz of at most BYTES:
                                                            text files only (never checkpoints), the
                                                            largest cut to their head and tail first
  report.py first-steps RUNS                                each process's first step_ms, one JSON object
  report.py versions LIB...                                 each library's version from its own call (cuDNN,
                                                            cuBLASLt, NCCL, the driver), one JSON object
  report.py smi FILE                                        `nvidia-smi -q -d CLOCK,PERFORMANCE`: SM and
                                                            memory clocks, the active throttle reasons

RUN directories are scripts/launch-standalone.sh's: rank-R.jsonl, one JSON line per step (fields
of metrics.jsonl: step, loss, step_ms, tokens, peak_bytes{...,total}, phase_ms{allgather,...}).
Exit status: 0 the check passed, 1 it failed (one line says why), 2 usage.
"""
import json
import math
import os
import re
import statistics
import sys

# The libraries' own kernels, not ours to race-check: cuBLASLt's (Hopper: nvjet_*, sm90_xmma_*,
# cutlass3x_*; gemv and split-K reductions) and cuDNN's (its runtime-compiled SDPA engines,
# cudnn_generated_*_sdpa_*_flash_fprop/bprop_*, and its precompiled fmha/cudnn::* kernels). None of
# worker/cuda's kernels matches.
LIB_KERNELS = re.compile(r"nvjet|xmma|cutlass|cublas|gemv|splitKreduce|gemmk1|gemmSN"
                         r"|cudnn|sdpa|fmha|flash_[fb]prop")


def fail(msg):
    print(msg)
    sys.exit(1)


def load_run(run, ranks, steps):
    """Rank 0's losses, after checking that every rank reported `steps` finite losses and that all
    ranks report the same (global) loss at every step."""
    per_rank = []
    for r in range(ranks):
        path = os.path.join(run, f"rank-{r}.jsonl")
        try:
            with open(path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError) as e:
            fail(f"{path}: {e}")
        if len(rows) != steps:
            fail(f"{path}: {len(rows)} step reports, expected {steps}")
        losses = [row.get("loss") for row in rows]
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
            fail(f"{path}: a loss is missing or not finite: {losses}")
        per_rank.append(losses)
    for r in range(1, ranks):
        if per_rank[r] != per_rank[0]:
            fail(f"{run}: rank {r} reports losses {per_rank[r]} but rank 0 {per_rank[0]} (the loss is the global mean)")
    return per_rank[0]


def fmt(xs):
    return "[" + ", ".join(f"{x:.5f}" for x in xs) + "]"


def cmd_compare(a):
    ref = load_run(a.ref, a.ref_ranks or 1, a.steps)
    test = load_run(a.test, a.ranks, a.steps)
    rel = [abs(t - r) / abs(r) for r, t in zip(ref, test)]
    k = max(range(len(rel)), key=rel.__getitem__)
    msg = f"max rel diff {rel[k]:.2e} at step {k + 1} (tol {a.rtol:.0e}); ref {fmt(ref)} got {fmt(test)}"
    if rel[k] > a.rtol:
        fail(msg)
    print(msg)


def cmd_moves(a):
    ref = load_run(a.ref, 1, a.steps)
    frozen = load_run(a.frozen, 1, a.steps)
    eff = [abs(r - f) / abs(r) for r, f in zip(ref, frozen)]
    msg = f"training moved the reference loss by up to {max(eff):.2e} relative (needs > {3 * a.rtol:.0e})"
    if max(eff) <= 3 * a.rtol:
        fail(msg + ": the comparison could not tell a broken update from a working one; raise lr")
    print(msg)


def safetensors_f32(path):
    """The F32 tensors of a safetensors file, by name (the standard library's struct: no numpy here)."""
    import struct
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k == "__metadata__":
            continue
        if v["dtype"] != "F32":
            fail(f"{path}: {k} is {v['dtype']}, expected F32")
        a, b = v["data_offsets"]
        out[k] = struct.unpack(f"<{(b - a) // 4}f", raw[8 + n + a:8 + n + b])
    return out


def cmd_lora(a):
    ref = load_run(a.ref, a.ranks, a.steps)
    test = load_run(a.test, a.ranks, a.steps)
    dl = max(abs(t - r) / abs(r) for r, t in zip(ref, test))
    ar = safetensors_f32(os.path.join(a.ref, "adapter", "adapter_model.safetensors"))
    at = safetensors_f32(os.path.join(a.test, "adapter", "adapter_model.safetensors"))
    if sorted(ar) != sorted(at):
        fail(f"the adapters' names differ: {sorted(set(ar) ^ set(at))}")
    da, where = 0.0, ""
    for k in sorted(ar):
        if not all(math.isfinite(y) for y in at[k]):
            da, where = math.inf, k
            break
        num = math.sqrt(sum((x - y) ** 2 for x, y in zip(ar[k], at[k])))
        den = math.sqrt(sum(x * x for x in ar[k]))
        d = num / den if den > 0 else num
        if d > da:
            da, where = d, k
    detail = f"losses {dl:.2e}, adapters {da:.2e} (worst {where}); ref {fmt(ref)} got {fmt(test)}"
    if not a.cal:
        print(f"{dl:.3e} {da:.3e}")
        print(f"  {detail}", file=sys.stderr)
        return
    tl, ta = (4 * max(1e-5, float(x)) for x in a.cal.split())
    msg = f"losses {dl:.2e} (tol {tl:.2e}), adapters {da:.2e} (tol {ta:.2e}; worst {where}); ref {fmt(ref)} got {fmt(test)}"
    if dl > tl or da > ta:
        fail(msg)
    print(msg)


# Dense bf16 peaks (TFLOP/s, no sparsity) by nvidia-smi name, as llm.c's MFU divides by them:
# the first key found in the name wins (order matters: "H100 PCIe" before "H100").
BF16_PEAK = [("GH200", 989.4), ("H200", 989.4), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4),
             ("H800", 989.4), ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0), ("A10G", 70.0)]


def bf16_peak(gpu):
    return next((v for k, v in BF16_PEAK if k in (gpu or "")), None)


def cmd_bench(a):
    path = os.path.join(a.run, "rank-0.jsonl")
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        with open(a.plan) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{e}")
    bad = [r.get("step") for r in rows if not math.isfinite(r.get("loss", float("nan")))]
    if bad:
        fail(f"{path}: the loss is not finite at steps {bad}")
    timed = rows[a.skip:]
    if not timed:
        fail(f"{path}: {len(rows)} step reports, none after the {a.skip} warm-up steps")
    med = statistics.median
    step_ms = med([r["step_ms"] for r in timed])
    tokens = med([r["tokens"] for r in timed])
    tps = tokens / (step_ms / 1e3)
    fpt = float(plan["flops_per_token"])
    achieved = tps * fpt / 1e12
    # llm.c's count: 6·N + 6·L·C·T (every parameter, wpe included; attention's score and weighted
    # sum counted once, not twice as PaLM's 12·L·C·T), over the GPU's dense bf16 peak
    m = plan["model"]
    fpt_llmc = 6.0 * plan["n_params"] + 6.0 * m["n_layer"] * m["n_embd"] * m["seq_len"]
    bf16 = bf16_peak(a.gpu)
    peak = max(r["peak_bytes"]["total"] for r in rows)
    planned = int(plan["memory"]["total"])
    phases = {k: med([r["phase_ms"].get(k, 0.0) for r in timed]) for k in ("allgather", "compute", "reducescatter",
                                                                          "optimizer")}
    ag = med([r["phase_ms"].get("allgather", 0.0) for r in timed])
    rs = med([r["phase_ms"].get("reducescatter", 0.0) for r in timed])
    out = {"steps": len(rows), "steps_timed": len(timed), "step_ms": step_ms, "tokens_per_step": tokens,
           "tokens_per_s": tps, "flops_per_token": fpt, "achieved_tflops": achieved,
           "gemm_tflops": a.gemm_tflops, "mfu": achieved / a.gemm_tflops if a.gemm_tflops else None,
           "flops_per_token_llmc": fpt_llmc, "bf16_peak_tflops": bf16,
           "mfu_llmc": tps * fpt_llmc / 1e12 / bf16 if bf16 else None,
           "peak_bytes": peak, "plan_bytes": planned, "peak_vs_plan": (peak - planned) / planned,
           "peak_by_category": max(rows, key=lambda r: r["peak_bytes"]["total"])["peak_bytes"],
           "plan_by_category": plan["memory"], "allgather_ms": ag, "reducescatter_ms": rs,
           "exposed_comm_ms": ag + rs, "exposed_comm_share": (ag + rs) / step_ms,
           "phase_ms": phases,
           "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"]}
    print(json.dumps(out))


def cmd_gemm_torch(_a):
    import torch   # noqa: the one subcommand that needs it
    n, iters = 8192, 20
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(n, n, device="cuda", dtype=torch.bfloat16, generator=g) - 0.5
    y = torch.rand(n, n, device="cuda", dtype=torch.bfloat16, generator=g) - 0.5
    for _ in range(3):
        x @ y
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        x @ y
    e1.record()
    torch.cuda.synchronize()
    t = e0.elapsed_time(e1) / 1e3 / iters
    print(f"{2 * n ** 3 / t / 1e12:.1f}")


def cmd_table(a):
    rows = []
    with open(a.results) as f:
        for line in f:
            if line.strip():
                sid, name, status, secs, detail = line.rstrip("\n").split("\t", 4)
                rows.append({"step": sid, "check": name, "status": status, "seconds": int(secs), "detail": detail})
    metrics = {}
    if os.path.exists(a.metrics):
        with open(a.metrics) as f:
            for line in f:
                if line.strip():
                    metrics.update(json.loads(line))
    failed = [r for r in rows if r["status"] == "FAIL"]

    def cell(s, n=110):
        s = s.replace("|", "/")
        return s if len(s) <= n else s[: n - 1] + "…"

    lines = ["| step | check | result | s | detail |", "|---|---|---|---|---|"]
    lines += [f"| {r['step']} | {r['check']} | {r['status']} | {r['seconds']} | {cell(r['detail'])} |" for r in rows]
    fig = []

    def add(label, key, f="{:.1f}", scale=1.0):
        v = metrics.get(key)
        if isinstance(v, (int, float)):
            fig.append(f"| {label} | {f.format(v * scale)} |")
        elif isinstance(v, str):
            fig.append(f"| {label} | {cell(v)} |")

    add("GPU", "gpu")
    acc = metrics.get("budget_account")
    if isinstance(acc, dict):
        fig.append(f"| budget: the steps' maxima + the table, of the budget (s) | {acc['maxima']} + {acc['table']} "
                   f"of {acc['budget']} |")
    add("binaries", "binaries")
    add("bf16 GEMM rate, 8192³ (TFLOP/s, this run)", "gemm_tflops")
    add("GEMM rate source", "gemm_source")
    add("fsdpd GPT-2 124M B=16 T=1024 bf16, world 1: tokens/s", "ours_tokens_per_s", "{:.0f}")
    add("fsdpd step (ms, median)", "ours_step_ms")
    add("fsdpd model TFLOP/s (plan's FLOPs per token)", "ours_achieved_tflops")
    add("fsdpd MFU, PaLM's count (6·(N − wpe) + 12·L·C·T) over this run's GEMM rate, %", "ours_mfu", "{:.1f}",
        100)
    add("fsdpd MFU, llm.c's count (6·N + 6·L·C·T) over the bf16 peak, %", "ours_mfu_llmc", "{:.1f}", 100)
    add("bf16 dense peak used (TFLOP/s)", "ours_bf16_peak_tflops")
    add("attention kernels (the benchmark's rank 0: cudnn, or tc with why cuDNN did not run)", "attention")
    add("libcudnn (the node's, opened at run time; never carried)", "cudnn_lib")
    add("gpu_check's attention with cuDNN selected", "attention_check")
    add("cuDNN's account of the benchmark's fallback (CUDNN_LOGLEVEL_DBG=3)", "cudnn_fallback")
    add("libraries (their own version calls)", "versions")
    add("clocks and throttle reasons before the benchmark (nvidia-smi -q)", "clocks_before_bench")
    add("clocks and throttle reasons after the benchmark", "clocks_after_bench")
    add("step 4's rtol, from two N = 1 runs (their difference)", "staged_rtol", "{:.1e}")
    add("step 4's calibration difference (N = 1, B = 4 against B = 2)", "staged_calibration_diff", "{:.2e}")
    first = metrics.get("first_step_ms")
    if isinstance(first, dict) and first:
        slow = max(first, key=first.get)
        fig.append(f"| first step per process (ms): {len(first)} processes, median / max | "
                   f"{statistics.median(first.values()):.0f} / {first[slow]:.0f} ({cell(slow, 40)}) |")
    add("fsdpd peak memory (GiB)", "ours_peak_bytes", "{:.2f}", 1 / 2**30)
    add("plan's memory (GiB)", "plan_bytes", "{:.2f}", 1 / 2**30)
    add("peak against plan, %", "peak_vs_plan", "{:+.1f}", 100)
    add("exposed communication (ms, all-gather + reduce-scatter waits)", "ours_exposed_comm_ms", "{:.2f}")
    add("exposed communication, % of the step", "ours_exposed_comm_share", "{:.1f}", 100)
    ph = metrics.get("ours_phase_ms")
    if isinstance(ph, dict):
        fig.append("| step phases (ms, median): " + ", ".join(ph) + " | "
                   + " / ".join(f"{v:.1f}" for v in ph.values()) + " |")
    add("PyTorch eager tokens/s", "torch_eager_tokens_per_s", "{:.0f}")
    add("PyTorch torch.compile tokens/s", "torch_compile_tokens_per_s", "{:.0f}")
    add("torch.compile first step (s)", "torch_compile_s")
    add("PyTorch peak memory, compile (GiB)", "torch_compile_peak_bytes", "{:.2f}", 1 / 2**30)
    add("fsdpd / PyTorch eager", "ratio_eager", "{:.2f}")
    add("fsdpd / torch.compile", "ratio_compile", "{:.2f}")
    targets = []
    mfu, ratio, pvp = metrics.get("ours_mfu_llmc"), metrics.get("ratio_compile"), metrics.get("peak_vs_plan")
    if isinstance(mfu, (int, float)):
        targets.append(("MFU ≥ 40 % (llm.c's count)", mfu >= 0.40))
    if isinstance(ratio, (int, float)):
        targets.append(("tokens/s ≥ torch.compile's", ratio >= 1.0))
    if isinstance(pvp, (int, float)):
        targets.append(("peak memory within 10 % of the plan", abs(pvp) <= 0.10))
    fig += [f"| target: {t} | {'met' if ok else 'MISSED'} |" for t, ok in targets]
    verdict = (f"{len(failed)} FAILED: " + ", ".join(f"{r['step']} {r['check']}" for r in failed)) if failed \
        else "no step FAILED"
    md = ["# tests/gpu/run.sh report", "", f"{metrics.get('when', '')} {metrics.get('mode', '')}".strip(), "",
          *lines, "", "| figure | value |", "|---|---|", *fig, "", f"Verdict: {verdict}.", ""]
    text = "\n".join(md)
    os.makedirs(a.outdir, exist_ok=True)
    with open(os.path.join(a.outdir, "gpu_report.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.outdir, "gpu_report.json"), "w") as f:
        json.dump({"steps": rows, "metrics": metrics, "targets": {t: ok for t, ok in targets},
                   "failed": [r["step"] for r in failed]}, f, indent=2)
        f.write("\n")
    print(text)


def cmd_stack(a):
    if a.proc:   # proc_stacks' lines: each thread's wait channel, the main thread's kernel frames
        with open(a.gdb, errors="replace") as f:
            text = f.read()
        waits = re.findall(r"^Thread \d+ \(tid \d+, ([^)]*)\): wchan (\S+)", text, re.M)
        kframes = re.findall(r"^  \[<[0-9a-f]+>\] (\S+?)\+", text.split("Thread 2 ")[0], re.M)
        if not waits:
            print("no stack (/proc had no threads)")
            return
        main = f"main thread in {waits[0][1]}" + (f" ({' < '.join(kframes[:6])})" if kframes else "")
        rest = sorted({f"{c} in {w}" for c, w in waits[1:]})
        print(f"/proc: {len(waits)} threads, {main}" + (f"; others: {', '.join(rest[:6])}" if rest else ""))
        return
    frames, main = [], False
    with open(a.gdb, errors="replace") as f:
        for line in f:
            if line.startswith("Thread "):
                main = line.startswith("Thread 1 ")
            elif main and line.startswith("#"):
                m = re.search(r" in (\S+) \(", line) or re.match(r"#\d+\s+(\S+) \(", line)
                if m:
                    frames.append(m.group(1))
    print(" < ".join(frames[:6]) if frames else "no stack (gdb could not attach?)")


def cmd_memcheck(a):
    """The first '========= Invalid ...' (or other error) line and the kernel of its 'at' line."""
    with open(a.log, errors="replace") as f:
        lines = [ln.rstrip("\n") for ln in f]
    for i, ln in enumerate(lines):
        m = re.match(r"=+ (Invalid .*|Misaligned .*|.*[Ee]rror.*)$", ln)
        if not m or "ERROR SUMMARY" in ln:
            continue
        where = next((re.sub(r"^=+\s+at\s+", "", x).strip() for x in lines[i + 1:i + 4]
                      if re.match(r"=+\s+at\s", x)), None)
        print(f"{m.group(1).strip()}" + (f" in {where[:160]}" if where else ""))
        return
    print("memcheck reported no error (the fault did not recur in one step)")


def cmd_racecheck(a):
    """Exit 0 when the run ended cleanly and every reported hazard lies in cuBLASLt's kernels."""
    with open(a.log, errors="replace") as f:
        text = f.read()
    summary = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed[^\n]*", text)
    # the accesses of each reported race or hazard: "... access at KERNEL+0x.. in FILE" (errors) or
    # "Write Thread (x, y, z) at 0x.. in FILE:LINE:KERNEL" (hazards)
    places = re.findall(r"=+\s+(?:Error: Race reported between |and )?\w+ (?:access|Thread \([^)]*\)) at (.*)", text)
    ours = [p for p in places if not LIB_KERNELS.search(p)]
    n = int(summary.group(1)) if summary else None
    if a.rc not in (0, 3) or n is None:
        fail(f"exit {a.rc}, " + ("no RACECHECK SUMMARY line" if n is None else summary.group(0)))
    if n == 0 and a.rc == 0:
        print(summary.group(0))
    elif ours or not places:
        fail(f"{summary.group(0)}: " + (f"in our kernels: {ours[0][:160]}" if ours else "no access named"))
    else:
        print(f"{summary.group(0)}, all {len(places)} accesses in cuBLASLt's or cuDNN's own kernels (not ours)")


# What pack leaves out: checkpoints (step-NNNNNNNN/ directories and rank files), the unpacked
# bundle, sockets, and any file that is not text (a NUL in its first 8 KiB).
PACK_SKIP_DIRS = re.compile(r"^(bundle|step-\d+|.*-rdv)$")
PACK_SKIP_FILES = re.compile(r"\.(bin|sock|pt|safetensors|gz|xz|so(\.\d+)*)$")


def is_text(path):
    try:
        with open(path, "rb") as f:
            return b"\0" not in f.read(8192)
    except OSError:
        return False


def cmd_pack(a):
    """Every text file under WORK into OUT (tar.gz), the total uncompressed size kept to --limit: the
    largest files are cut to their first and last part (a line says how much was left out) until the
    sum fits, so the archive can never exceed the limit whatever the run wrote."""
    import io
    import tarfile
    files = []
    for root, dirs, names in os.walk(a.work):
        dirs[:] = sorted(d for d in dirs if not PACK_SKIP_DIRS.match(d))
        for n in sorted(names):
            p = os.path.join(root, n)
            if os.path.isfile(p) and not os.path.islink(p) and not PACK_SKIP_FILES.search(n) and is_text(p):
                files.append([p, os.path.getsize(p)])
    budget = a.limit - 512 * (2 * len(files) + 4)   # tar's headers and end blocks
    cap = max((s for _, s in files), default=0)
    while sum(min(s, cap) for _, s in files) > budget and cap > 4096:
        cap = int(cap * 0.8)
    cut = 0
    with tarfile.open(a.out, "w:gz") as t:
        for p, size in files:
            arc = os.path.relpath(p, a.work)
            if size <= cap:
                t.add(p, arcname=arc, recursive=False)
                continue
            with open(p, "rb") as f:
                head = f.read(cap // 2 - 128)
                f.seek(size - (cap // 2 - 128))
                tail = f.read()
            data = head + f"\n[report.py pack: {size - len(head) - len(tail)} bytes left out]\n".encode() + tail
            info = tarfile.TarInfo(arc)
            info.size, info.mtime = len(data), int(os.path.getmtime(p))
            t.addfile(info, io.BytesIO(data))
            cut += 1
    print(f"{len(files)} files, {os.path.getsize(a.out)} bytes" + (f", {cut} cut to {cap} bytes" if cut else ""))


def cmd_first_steps(a):
    out = {}
    for root, _dirs, names in os.walk(a.runs):
        for n in sorted(names):
            m = re.match(r"rank-(\d+)\.jsonl$", n)
            if not m:
                continue
            try:
                with open(os.path.join(root, n)) as f:
                    first = json.loads(f.readline())
                out[f"{os.path.relpath(root, a.runs)}/rank-{m.group(1)}"] = first["step_ms"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
    print(json.dumps({"first_step_ms": dict(sorted(out.items()))}))


# (file name part, symbol, how the call returns it, how to print it)
VERSION_CALLS = [
    ("libcudnn", "cudnnGetVersion", "ret", lambda v: f"{v // 10000}.{v // 100 % 100}.{v % 100}"),
    ("libcublasLt", "cublasLtGetVersion", "ret", lambda v: f"{v // 10000}.{v // 100 % 100}.{v % 100}"),
    ("libnccl", "ncclGetVersion", "out", lambda v: f"{v // 10000}.{v // 100 % 100}.{v % 100}"),
    ("libcuda", "cuDriverGetVersion", "out", lambda v: f"CUDA {v // 1000}.{v % 1000 // 10} (driver API)"),
]


def cmd_versions(a):
    """Load each library (they need no GPU for their version call) and ask it."""
    import ctypes
    names, paths = {}, {}
    for path in a.libs:
        base = os.path.basename(path)
        call = next((c for c in VERSION_CALLS if base.startswith(c[0] + ".")), None)
        if call is None:
            continue
        key = call[0][3:]
        paths[key] = path
        try:
            lib = ctypes.CDLL(path)
            fn = getattr(lib, call[1])
            if call[2] == "ret":
                fn.restype = ctypes.c_size_t
                v = int(fn())
            else:
                out = ctypes.c_int(0)
                fn.restype = ctypes.c_int
                rc = fn(ctypes.byref(out))
                if rc != 0:
                    raise OSError(f"{call[1]} returned {rc}")
                v = out.value
            names[key] = call[3](v)
        except (OSError, AttributeError) as e:
            names[key] = f"unknown ({e})"
    for want in ("cudnn", "cublasLt", "nccl", "cuda"):
        names.setdefault(want, "not linked or not found")
    print(json.dumps({"versions": ", ".join(f"{k} {v}" for k, v in names.items()), "version_paths": paths}))


def cmd_smi(a):
    """'SM 1980 MHz, memory 3201 MHz; throttle: none' from nvidia-smi -q -d CLOCK,PERFORMANCE."""
    section, clocks, active = "", {}, []
    with open(a.file, errors="replace") as f:
        for line in f:
            s = line.strip()
            if not s or ":" not in s:
                section = s or section
                continue
            k, v = (x.strip() for x in s.split(":", 1))
            if not v:
                section = k
            elif section == "Clocks" and k in ("SM", "Memory", "Graphics"):
                clocks[k] = v
            elif "Reasons" in section and v == "Active" and k != "Idle":
                active.append(k)
    c = ", ".join(f"{k} {v}" for k, v in clocks.items()) or "no clocks"
    print(f"{c}; throttle: {', '.join(active) or 'none active'}")


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compare")
    p.add_argument("ref")
    p.add_argument("test")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--ref-ranks", type=int, default=1)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--rtol", type=float, required=True)
    p = sub.add_parser("moves")
    p.add_argument("ref")
    p.add_argument("frozen")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--rtol", type=float, required=True)
    p = sub.add_parser("lora")
    p.add_argument("ref")
    p.add_argument("test")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--cal", default="", help='the calibration distance "DL DA" (report.py lora of two references)')
    p = sub.add_parser("bench")
    p.add_argument("run")
    p.add_argument("plan")
    p.add_argument("--skip", type=int, default=3)
    p.add_argument("--gemm-tflops", type=float, default=None)
    p.add_argument("--gpu", default="", help="the GPU's name (nvidia-smi), for its bf16 peak")
    sub.add_parser("gemm-torch")
    p = sub.add_parser("table")
    p.add_argument("results")
    p.add_argument("metrics")
    p.add_argument("outdir")
    p = sub.add_parser("stack")
    p.add_argument("gdb")
    p.add_argument("--proc", action="store_true", help="the file holds run_jobs.sh's proc_stacks lines")
    p = sub.add_parser("memcheck")
    p.add_argument("log")
    p = sub.add_parser("racecheck")
    p.add_argument("log")
    p.add_argument("--rc", type=int, required=True)
    p = sub.add_parser("pack")
    p.add_argument("work")
    p.add_argument("out")
    p.add_argument("--limit", type=int, required=True)
    p = sub.add_parser("first-steps")
    p.add_argument("runs")
    p = sub.add_parser("versions")
    p.add_argument("libs", nargs="*")
    p = sub.add_parser("smi")
    p.add_argument("file")
    a = ap.parse_args()
    {"compare": cmd_compare, "moves": cmd_moves, "lora": cmd_lora, "bench": cmd_bench, "gemm-torch": cmd_gemm_torch,
     "table": cmd_table, "stack": cmd_stack, "memcheck": cmd_memcheck, "racecheck": cmd_racecheck,
     "pack": cmd_pack, "first-steps": cmd_first_steps, "smi": cmd_smi, "versions": cmd_versions}[a.cmd](a)


if __name__ == "__main__":
    main()
