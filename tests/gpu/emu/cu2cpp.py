#!/usr/bin/env python3
"""cu2cpp IN.cu [OUT.cpp] — rewrite one worker/cuda/ops_cuda_*.cu for the host emulator (tests/gpu/emu): a kernel launch
`k<<<grid, block, smem, stream>>>(args)` becomes `emu_launch_k(grid, block, smem, stream, k, args)`,
and `extern __shared__ T name[];` becomes a pointer to the emulated block's dynamic shared memory."""
import re
import sys

src = open(sys.argv[1]).read()
src = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?([\w ]+?) (\w+)\[\];", r"\1 *\2 = (\1 *)emu_dyn_smem;", src)
src = src.replace("#include <mma.h>", "/* <mma.h>: emu.h emulates WMMA */")
src, n = re.subn(r"([\w:]+(?:<[^<>;()]*>)?)<<<(.*?)>>>\(", r"emu_launch_k(\2, \1, ", src, flags=re.S)
text = '#line 1 "%s"\n' % sys.argv[1] + src
if len(sys.argv) > 2:
    with open(sys.argv[2], "w") as f:
        f.write(text)
else:
    sys.stdout.write(text)
