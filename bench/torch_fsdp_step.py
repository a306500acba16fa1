#!/usr/bin/env python3
"""torch_fsdp_step — PyTorch FSDP2 (fully_shard) on CPU ranks, the model and batch of bench/cpu_bf16_step.sh,
for the bf16 comparison in docs/performance.md ("bf16 on the CPU").

The GPT-2 of bench/torch_step.py (nanoGPT's), each block and then the root under fully_shard, gloo
over loopback, AdamW (lr 1e-3, weight decay 0.1 on every parameter, as torch's default groups do):
the whole training step (forward, backward with its reduce-scatters, optimizer step, zero_grad).
--dtype bf16: MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), which on a CPU with
AVX512-BF16 makes PyTorch's GEMMs (oneDNN) bf16; fp32: no policy. Prints one JSON line from rank 0:
the median step time over the steps after --warmup, the losses, the threads per rank.

  ~/.cache/fsdpd/testenv/bin/python bench/torch_fsdp_step.py --world 2 --dtype bf16 --steps 12
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import GPT2  # noqa: E402  (the same model as the single-process bench)


def rank_main(rank, a, init_file, out):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=a.world)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torch.manual_seed(0)
    model = GPT2(a.n_layer, a.n_embd, a.n_head, a.vocab, a.seq, sdpa=True)
    kw = {}
    if a.dtype == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for b in model.h:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(1 + rank)
    times, losses = [], []
    for step in range(a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        tgt = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        dist.barrier()
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"torch_fsdp_step": a.dtype, "torch": torch.__version__, "world": a.world, "threads": a.threads,
                       "step_ms": statistics.median(times[a.warmup:]), "steps_ms": times, "losses": losses,
                       "cpu_capability": torch.backends.cpu.get_cpu_capability()}, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="threads per rank (0: online CPUs / world, at least 1)")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2, help="sequences per rank")
    a = ap.parse_args()
    if a.threads <= 0:
        a.threads = max(1, (os.cpu_count() or 1) // a.world)
    with tempfile.TemporaryDirectory(prefix="torch-fsdp-") as d:
        out = os.path.join(d, "rank0.json")
        mp.spawn(rank_main, args=(a, os.path.join(d, "init"), out), nprocs=a.world, join=True)
        with open(out) as f:
            print(f.read())


if __name__ == "__main__":
    main()
