#!/usr/bin/python3
"""torch_step — the model and batch of bench/bench_step.c in PyTorch, for the ratios in docs/performance.md.

GPT-2 as nanoGPT writes it (LayerNorm eps 1e-5, tanh GELU, learned positions, tied head, biases,
mean cross-entropy). Times forward + backward (gradients accumulate, as in bench_step) or, with
--optimizer, the whole training step (forward, backward, AdamW, zero_grad), the median over --iters
after --warmup untimed steps, and reports tokens/s and GFLOP/s with the plan's 6·Ψ + 12·L·C·T FLOPs
per token.

  --device cpu (default): fp32, attention written out as matmul + mask + softmax + matmul (Debian's
      torch 1.13 has no scaled_dot_product_attention); the figures of docs/performance.md's CPU rows.
      Debian's python3-torch: /usr/bin/python3 bench/torch_step.py --config small --threads 2
  --device cuda: fp32 parameters under bf16 autocast (--dtype fp32 turns it off), fused causal
      attention (F.scaled_dot_product_attention, is_causal) where torch has it, AdamW fused=True.
      --mode eager | compile | both: torch.compile's time to the first compiled step is reported
      as compile_s. tests/gpu/run.sh runs
      python3 bench/torch_step.py --device cuda --config gpt2 --optimizer --mode both --json

--json adds one JSON line per mode ({"torch_step": ..., "mode", "tokens_per_s", "step_ms", ...}) for
scripts; the human-readable lines are printed either way.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self, C, H, T, sdpa):
        super().__init__()
        self.H = H
        self.sdpa = sdpa
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        if not sdpa:
            self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T))

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, C, H, V, T, sdpa):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H, T, sdpa) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()          # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


CONFIGS = {"tiny": dict(L=2, C=64, H=4, V=64, T=32, B=8),
           "small": dict(L=2, C=768, H=12, V=50257, T=256, B=2),
           "gpt2": dict(L=12, C=768, H=12, V=50257, T=1024, B=16)}   # GPT-2 124M, tests/gpu/run.sh step 6


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run(name, cfg, a, mode):
    dev = torch.device(a.device)
    torch.manual_seed(0)
    L, C, H, V, T, B = (cfg[k] for k in "LCHVTB")
    sdpa = {"auto": a.device == "cuda" and HAVE_SDPA, "sdpa": True, "manual": False}[a.attn]
    if sdpa and not HAVE_SDPA:
        raise SystemExit(f"torch_step: --attn sdpa: torch {torch.__version__} has no scaled_dot_product_attention")
    model = GPT2(L, C, H, V, T, sdpa).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * n_params + 12 * L * C * T
    opt = None
    if a.optimizer:
        kw = {"fused": True} if a.device == "cuda" else {}
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw)
    step_fn = model
    if mode == "compile":
        if not hasattr(torch, "compile"):
            raise SystemExit(f"torch_step: --mode compile: torch {torch.__version__} has no torch.compile")
        step_fn = torch.compile(model)
    autocast = a.device == "cuda" and a.dtype == "bf16"
    idx = torch.randint(0, V, (B, T), device=dev)
    tgt = torch.randint(0, V, (B, T), device=dev)

    def step():
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss = step_fn(idx, tgt)
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    # Untimed warm-up: the first step of a compiled model is its compilation (compile_s).
    t0 = time.perf_counter()
    loss = step()
    sync(dev)
    first_s = time.perf_counter() - t0
    for _ in range(a.warmup - 1):
        loss = step()
    sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        loss = step()
        sync(dev)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    what = "fwd+bwd+AdamW" if opt is not None else "fwd+bwd"
    prec = "bf16 autocast" if autocast else "fp32"
    attn = "sdpa" if sdpa else "manual"
    print(f"{name} (torch {torch.__version__} {mode}, {a.device}, {prec}, attention {attn}): L={L} C={C} H={H} "
          f"V={V} T={T} B={B} params={n_params} threads={a.threads} iters={a.iters}")
    print(f"  {what:<13} median {med:.4f} s  min {min(times):.4f} s  {B * T / med:.0f} tokens/s  "
          f"{flops_per_token * B * T / med * 1e-9:.1f} GFLOP/s, loss {loss.item():.4f}"
          + (f", first step {first_s:.1f} s" if mode == "compile" else ""))
    if a.json:
        rec = {"torch_step": name, "torch": torch.__version__, "device": a.device, "mode": mode, "dtype": a.dtype,
               "attention": attn, "optimizer": opt is not None, "B": B, "T": T, "n_params": n_params,
               "flops_per_token": flops_per_token, "iters": a.iters, "step_ms": med * 1e3,
               "tokens_per_s": B * T / med, "loss": loss.item(),
               "compile_s": first_s if mode == "compile" else None,
               "peak_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None}
        print(json.dumps(rec), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="both", choices=["tiny", "small", "gpt2", "both"],
                    help="both = tiny then small")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--iters", type=int)
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 1; 3 with compile)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default=None, choices=["fp32", "bf16"],
                    help="cuda: bf16 autocast (default) or fp32; cpu: fp32 only")
    ap.add_argument("--mode", default="eager", choices=["eager", "compile", "both"])
    ap.add_argument("--attn", default="auto", choices=["auto", "sdpa", "manual"],
                    help="auto: scaled_dot_product_attention on cuda where torch has it, written out on cpu")
    ap.add_argument("--optimizer", action="store_true", help="time the whole step: also AdamW and zero_grad")
    ap.add_argument("--json", action="store_true", help="also one JSON line per mode")
    a = ap.parse_args()
    if a.dtype is None:
        a.dtype = "bf16" if a.device == "cuda" else "fp32"
    if a.device == "cpu" and a.dtype != "fp32":
        raise SystemExit("torch_step: --dtype bf16 needs --device cuda (the CPU rows are fp32)")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"torch_step: --device cuda: torch {torch.__version__} sees no CUDA device")
    torch.set_num_threads(a.threads)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True     # what the fp32 parts of autocast would use in training
    modes = ["eager", "compile"] if a.mode == "both" else [a.mode]
    for name in (["tiny", "small"] if a.config == "both" else [a.config]):
        cfg = dict(CONFIGS[name])
        for key, arg in (("L", a.layers), ("B", a.batch), ("T", a.seq)):
            if arg:
                cfg[key] = arg
        for mode in modes:
            w = a.warmup if a.warmup is not None else (3 if mode == "compile" else 1)
            b = argparse.Namespace(**vars(a))
            b.warmup = max(1, w)
            b.iters = a.iters or (50 if name == "tiny" else 10 if a.device == "cuda" else 5)
            run(name, cfg, b, mode)


if __name__ == "__main__":
    main()
