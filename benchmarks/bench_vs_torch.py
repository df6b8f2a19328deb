#!/usr/bin/env python3
"""PyTorch's half of the comparison with ember (twin: bench_vs_torch.cpp, same workloads, shapes
and timing rule: one warm-up call, then calls until --min-time seconds and at least 3 calls, the
median reported). benchmarks/vs_torch.sh runs the two interleaved and prints the ratio table.

Run: python bench_vs_torch.py --threads N [--min-time S] [--only NAME]
Prints "<name> <threads> <median seconds per call>" per workload, as the C++ twin.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def median_time(f, min_time):
    f()
    t = []
    start = time.perf_counter()
    while len(t) < 3 or time.perf_counter() - start < min_time:
        a = time.perf_counter()
        f()
        t.append(time.perf_counter() - a)
        if len(t) >= 200:
            break
    t.sort()
    return t[len(t) // 2]


class Block(nn.Module):
    """ember's nn::TransformerBlock: pre-norm, causal self-attention (in/out projections), GELU(tanh) MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.in_proj = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        n, t, d = x.shape
        h = self.ln_1(x)
        q, k, v = self.in_proj(h).split(d, dim=-1)
        q, k, v = (z.view(n, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = self.out_proj(a.transpose(1, 2).reshape(n, t, d))
        x = x + a
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def step(model, opt, x, y=None):
    def run():
        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y) if y is not None else (out * out).mean()
        loss.backward()
        opt.step()

    return run


def workloads():
    def mlp():
        m = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
        return step(m, torch.optim.SGD(m.parameters(), lr=0.01), torch.randn(256, 784),
                    torch.zeros(256, dtype=torch.long))

    def cnn():
        m = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(64 * 7 * 7, 10))
        return step(m, torch.optim.Adam(m.parameters(), lr=1e-3), torch.randn(64, 1, 28, 28),
                    torch.zeros(64, dtype=torch.long))

    def transformer():
        m = nn.Sequential(*[Block(256, 4) for _ in range(4)])
        return step(m, torch.optim.AdamW(m.parameters(), lr=1e-3), torch.randn(8, 128, 256))

    def ln_fwd():
        ln = nn.LayerNorm(1024)
        x = torch.randn(8192, 1024)

        def run():
            with torch.no_grad():
                ln(x)
        return run

    def ln_fwd_bwd():
        ln = nn.LayerNorm(1024)
        x = torch.randn(8192, 1024, requires_grad=True)
        gy = torch.randn(8192, 1024)

        def run():
            x.grad = None
            ln.zero_grad()
            ln(x).backward(gy)
        return run

    def sm_fwd():
        x = torch.randn(8192, 1024)

        def run():
            with torch.no_grad():
                torch.softmax(x, -1)
        return run

    def sm_fwd_bwd():
        x = torch.randn(8192, 1024, requires_grad=True)
        gy = torch.randn(8192, 1024)

        def run():
            x.grad = None
            torch.softmax(x, -1).backward(gy)
        return run

    def attention_fwd_bwd():
        # the transformer row's attention alone: batch 8, 4 heads, T 128, head size 64, causal
        q, k, v = (torch.randn(8, 4, 128, 64, requires_grad=True) for _ in range(3))
        gy = torch.randn(8, 4, 128, 64)

        def run():
            q.grad = k.grad = v.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(gy)
        return run

    def add():
        a, b = torch.randn(1 << 24), torch.randn(1 << 24)

        def run():
            with torch.no_grad():
                a + b
        return run

    def sgemm():
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)

        def run():
            with torch.no_grad():
                a @ b
        return run

    return [("mlp_sgd", mlp), ("cnn_adam", cnn), ("transformer_adamw", transformer), ("layernorm_fwd", ln_fwd),
            ("layernorm_fwd_bwd", ln_fwd_bwd), ("softmax_fwd", sm_fwd), ("softmax_fwd_bwd", sm_fwd_bwd),
            ("attention_fwd_bwd", attention_fwd_bwd), ("add_16M", add), ("sgemm_1024", sgemm)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--only", default="")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    for name, make in workloads():
        if a.only and name != a.only:
            continue
        s = median_time(make(), a.min_time)
        print(f"{name} {a.threads} {s:.6g}", flush=True)


if __name__ == "__main__":
    main()
