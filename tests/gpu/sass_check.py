#!/usr/bin/env python3
"""sass_check.py TOOLS_DIR OBJECT... -- the static check of the built kernels, no GPU needed
(ctest sass_check; docs/gpu.md). TOOLS_DIR holds cuobjdump and nvdisasm; "-" asks
scripts/cuda-tools.sh --check for it. OBJECTs are libfsdpcuda's compiled .cu objects.

Every kernel of KERNELS (the elementwise, normalization, reduction and embedding kernels:
memory-bound, so their speed is the bytes they move per instruction, and the tensor-core attention
kernels, whose tiles stream from global memory inside their main loop) must, in its SASS:
  - load global memory 128 bits at a time somewhere (an LDG.E.128 of any flavour); an attention
    kernel, inside a loop, and to shared memory as well counts (LDGSTS...128: cp.async of 16 bytes);
  - have no 16-bit global load (LDG.E.U16 / .S16) inside a loop (a backward branch's range): a
    scalar tail after the loop is allowed, a 2-byte main loop is not;
  - use no local memory (LDL/STL: register spills or a local array).
A kernel's VEC = false instantiation (template argument false: "ILb0E" in its mangled name) is its
element-by-element path for pointers that are not 16-byte aligned (ops_cuda_common.cuh) and is
left aside; its other instantiations are held to the rules. A kernel of KERNELS missing from the
objects, or present only as its fallback, fails too (renamed: update the table). Spills of every
kernel also fail the build itself (ptxas -warn-spills, an error with FSDP_WERROR). The attention
kernels' line adds their registers (cuobjdump -res-usage); their dynamic shared memory is not in the
object: a static_assert in ops_cuda_attention_tc.cu holds it within the 227 KB opt-in. Prints one
line per kernel; exit 0 all hold, 1 one does not, 2 usage or tools missing.
"""
import os
import re
import subprocess
import sys

# kernel base name -> what it is (for the report)
KERNELS = {
    "gelu_forward_kernel": "elementwise", "gelu_backward_kernel": "elementwise",
    "residual_forward_kernel": "elementwise", "add_bias_kernel": "elementwise",
    "gated_forward_kernel": "elementwise", "gated_backward_kernel": "elementwise",
    "cast_f32_bf16_kernel": "elementwise", "cast_bf16_f32_kernel": "elementwise",
    "acc_f32_kernel": "elementwise", "acc_bf16_kernel": "elementwise", "adamw_kernel": "elementwise",
    "encoder_forward_kernel": "elementwise",
    "layernorm_forward_kernel": "normalization", "layernorm_dinp_kernel": "normalization",
    "residual_layernorm_kernel": "normalization",
    "rmsnorm_forward_kernel": "normalization", "rmsnorm_dinp_kernel": "normalization",
    "sumsq_partial_kernel": "reduction", "colsum_partial_kernel": "reduction",
    "layernorm_dparams_kernel": "reduction", "rmsnorm_dweight_kernel": "reduction",
    "encoder_dwte_kernel": "embedding", "encoder_dwpe_kernel": "embedding", "encoder_link_kernel": "embedding",
    "xent_fused_kernel": "softmax",
    "attention_dvec_kernel": "reduction",
    "attention_tc_forward_kernel": "attention", "attention_tc_dkv_kernel": "attention",
    "attention_tc_dq_kernel": "attention",
}
# 128-bit global loads: into registers (LDG.E.128, and its sm_90 spellings with cache or scope
# qualifiers between: LDG.E.EL.128, LDG.E.STRONG.GPU.128, ...), or (cp.async, the attention's tiles)
# straight into shared memory
LDG128 = re.compile(r"\bLDG\.E(\.\w+)*\.128\b")
LOAD128 = re.compile(r"\b(LDG\.E(\.\w+)*\.128|LDGSTS\.E(\.\w+)*\.128)\b")

ADDR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def base_name(mangled):
    m = re.match(r"_Z(\d+)", mangled)
    return mangled[len(m.group(0)):len(m.group(0)) + int(m.group(1))] if m else mangled


def functions(sass):
    """{mangled: [(address, instruction text)]} from cuobjdump -sass."""
    out, cur = {}, None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = ADDR.search(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def loops(code):
    """[start, end] address ranges closed by a backward branch."""
    r = []
    for addr, ins in code:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", ins)
        if m and int(m.group(1), 16) <= addr:
            r.append((int(m.group(1), 16), addr))
    return r


def check(name, kind, code):
    why = []
    rs = loops(code)
    if kind == "attention":
        if not any(LOAD128.search(i) and any(a <= addr <= b for a, b in rs) for addr, i in code):
            why.append("no 128-bit global load (LDG.E.128 or LDGSTS.128) in a loop")
    elif not any(LDG128.search(i) for _, i in code):
        why.append("no 128-bit global load (LDG.E.128)")
    for addr, ins in code:
        if re.search(r"\bLDG\.E\.[US]16\b", ins) and any(a <= addr <= b for a, b in rs):
            why.append(f"16-bit global load in a loop at /*{addr:04x}*/ {ins}")
            break
    for addr, ins in code:
        if re.match(r"(LDL|STL)\b", ins):
            why.append(f"local memory (a spill?) at /*{addr:04x}*/ {ins}")
            break
    return why


def main():
    if len(sys.argv) < 3:
        print(__doc__.split("\n")[0])
        return 2
    tools, objs = sys.argv[1], sys.argv[2:]
    if tools == "-":
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "cuda-tools.sh")
        p = subprocess.run(["bash", script, "--check"], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"sass_check: {p.stderr.strip()}")
            return 2
        tools = p.stdout.strip().splitlines()[-1]
    cuobjdump = os.path.join(tools, "cuobjdump")
    if not os.access(cuobjdump, os.X_OK) or not os.access(os.path.join(tools, "nvdisasm"), os.X_OK):
        print(f"sass_check: no cuobjdump and nvdisasm in {tools}: run scripts/cuda-tools.sh (make test does)")
        return 2
    env = dict(os.environ, PATH=tools + os.pathsep + os.environ.get("PATH", ""))
    found, regs = {}, {}
    for o in objs:
        p = subprocess.run([cuobjdump, "-res-usage", o], capture_output=True, text=True, env=env)
        for m in re.finditer(r"Function (\S+):\s*REG:(\d+)", p.stdout):
            regs[m.group(1)] = int(m.group(2))
        p = subprocess.run([cuobjdump, "-sass", o], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            print(f"sass_check: cuobjdump -sass {o}: {(p.stderr or p.stdout).strip()[:200]}")
            return 2
        for mangled, code in functions(p.stdout).items():
            found.setdefault(base_name(mangled), []).append((mangled, code))
    bad = 0
    for name, kind in KERNELS.items():
        if name not in found:
            print(f"FAIL {name} ({kind}): not in the built objects")
            bad += 1
            continue
        held = [(m, c) for m, c in found[name] if not m.startswith(f"_Z{len(name)}{name}ILb0E")]
        if not held:
            print(f"FAIL {name} ({kind}): only its element-by-element fallback was built")
            bad += 1
        for mangled, code in held:
            why = check(name, kind, code)
            n128 = sum(1 for _, i in code if LOAD128.search(i))
            what = f"{len(code)} instructions, {n128} LDG.E.128/LDGSTS.128"
            if kind == "attention":
                hs = re.search(r"ILi(\d+)E", mangled)
                what = f"head size {hs.group(1) if hs else '?'}, {what}, {regs.get(mangled, '?')} registers"
            print(f"{'FAIL' if why else 'ok  '} {name} ({kind}, {what})" + (": " + "; ".join(why) if why else ""))
            bad += bool(why)
    print(f"sass_check: {len(KERNELS)} kernels, {bad} failing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
