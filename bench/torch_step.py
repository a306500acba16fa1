#!/usr/bin/python3
"""torch_step — the model and batch of bench/bench_step.c in PyTorch CPU eager mode, for the ratio in
docs/performance.md. GPT-2 as nanoGPT writes it (LayerNorm eps 1e-5, tanh GELU, learned positions,
tied head, biases, causal attention written out as matmul + mask + softmax + matmul since Debian's
torch 1.13 has no scaled_dot_product_attention), fp32, mean cross-entropy; times forward + backward
(gradients accumulate, as in bench_step) and reports the same figures: tokens/s and GFLOP/s with the
plan's 6·Ψ + 12·L·C·T FLOPs per token.

Benchmark only: needs Debian's python3-torch (apt-get install -y python3-torch), run with
/usr/bin/python3. Example: /usr/bin/python3 bench/torch_step.py --config small --threads 2
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H, T):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T))

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, C, H, V, T):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H, T) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()          # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


CONFIGS = {"tiny": dict(L=2, C=64, H=4, V=64, T=32, B=8),
           "small": dict(L=2, C=768, H=12, V=50257, T=256, B=2)}


def run(name, cfg, iters, threads):
    torch.manual_seed(0)
    L, C, H, V, T, B = (cfg[k] for k in "LCHVTB")
    model = GPT2(L, C, H, V, T)
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * n_params + 12 * L * C * T
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    times = []
    for it in range(iters + 1):            # the first is warm-up
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        loss.backward()
        t = time.perf_counter() - t0
        if it:
            times.append(t)
    times.sort()
    med = times[len(times) // 2]
    print(f"{name} (torch {torch.__version__} eager): L={L} C={C} H={H} V={V} T={T} B={B} params={n_params} "
          f"threads={threads} iters={iters}")
    print(f"  fwd+bwd   median {med:.4f} s  min {times[0]:.4f} s  {B * T / med:.0f} tokens/s  "
          f"{flops_per_token * B * T / med * 1e-9:.1f} GFLOP/s, loss {loss.item():.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="both", choices=["tiny", "small", "both"])
    ap.add_argument("--layers", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--iters", type=int)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for name in (["tiny", "small"] if a.config == "both" else [a.config]):
        cfg = dict(CONFIGS[name])
        for key, arg in (("L", a.layers), ("B", a.batch), ("T", a.seq)):
            if arg:
                cfg[key] = arg
        run(name, cfg, a.iters or (50 if name == "tiny" else 5), a.threads)


if __name__ == "__main__":
    main()
