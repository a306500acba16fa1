#!/usr/bin/env python3
"""torch_matmul_rate — PyTorch's single-thread CPU matmul rate in fp32 and bf16 at the N = 2 bench's
shapes (docs/performance.md, "bf16 on the CPU"): whether this CPU's bf16 path (oneDNN / MKL) is
faster than its fp32 one. Alternates the two dtypes; GFLOP/s over process CPU time, so other
processes' time slices do not count.
  ~/.cache/fsdpd/testenv/bin/python bench/torch_matmul_rate.py [--reps 20]
"""
import argparse
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=20)
a = ap.parse_args()
torch.set_num_threads(1)
print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, 1 thread")
for M, N, K in [(256, 768, 256), (256, 1024, 256), (256, 4096, 256), (1024, 1024, 1024)]:
    rate = {}
    for dt in (torch.float32, torch.bfloat16) * 2:
        x, y = torch.randn(M, K, dtype=dt), torch.randn(K, N, dtype=dt)
        for _ in range(3):
            x @ y
        t = time.process_time()
        for _ in range(a.reps):
            x @ y
        rate.setdefault(dt, []).append(2 * M * N * K * a.reps / (time.process_time() - t) / 1e9)
    f32, b16 = rate[torch.float32], rate[torch.bfloat16]
    print(f"{M}x{N}x{K}: fp32 {' '.join(f'{r:.0f}' for r in f32)} GFLOP/s, bf16 {' '.join(f'{r:.0f}' for r in b16)}"
          f" (bf16/fp32 {max(b16) / max(f32):.2f})")
