#!/usr/bin/env python3
"""PyTorch twins of ember's benchmarks (bench_core, bench_layers), for side-by-side ratios on the
GPU machine, which has PyTorch. Same workloads and sizes as the *_cuda benchmarks of the C++
programs; CUDA events, warm-up, median of repeated runs.

  python3 benchmarks/bench_torch.py --out torch.json
  python3 benchmarks/bench_torch.py --compare build/bench_core.json build/bench_layers.json torch.json

--compare prints, for each benchmark present in both, ember's time, PyTorch's time and the ratio
(PyTorch time / ember time: above 1 means ember is faster).
"""
import argparse
import json
import statistics
import sys


def cuda_time_ms(fn, warmup=5, reps=30):
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_torch():
    import torch
    import torch.nn as nn
    torch.backends.cuda.matmul.allow_tf32 = False  # ember's fp32 GEMM does not use TF32
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    results = {}
    # bench_core (CUDA sizes)
    n = 4096
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    results["matmul_ember_cuda/4096"] = cuda_time_ms(lambda: a @ b)
    m = 1 << 26
    x, y = torch.randn(m, device=dev), torch.randn(m, device=dev)
    out = torch.empty_like(x)
    results["memcpy_cuda/67108864"] = cuda_time_ms(lambda: out.copy_(x))
    results["add_cuda/67108864"] = cuda_time_ms(lambda: x + y)
    results["mul_scalar_cuda/67108864"] = cuda_time_ms(lambda: x * 1.5)
    results["relu_cuda/67108864"] = cuda_time_ms(lambda: torch.relu(x))
    rows = x.view(-1, 1024)
    results["sum_rows_cuda/67108864"] = cuda_time_ms(lambda: rows.sum(1))
    results["softmax_rows_cuda/67108864"] = cuda_time_ms(lambda: torch.softmax(rows, 1))
    # bench_layers (CUDA sizes: batch 256, features 4096, image 32, channels 128, tokens 512, embed 1024, heads 16)
    def fwd_bwd(module, inp, **kw):
        inp = inp.detach().requires_grad_()
        def step():
            module(inp, **kw).sum().backward() if not kw else module(inp, inp, inp, **kw)[0].sum().backward()
        return step
    lin = nn.Linear(4096, 4096, device=dev)
    results["linear_fwd_bwd_cuda"] = cuda_time_ms(fwd_bwd(lin, torch.randn(256, 4096, device=dev)))
    conv = nn.Conv2d(128, 128, 3, padding=1, device=dev)
    results["conv2d_fwd_bwd_cuda"] = cuda_time_ms(fwd_bwd(conv, torch.randn(64, 128, 32, 32, device=dev)))
    ln = nn.LayerNorm(1024, device=dev)
    results["layernorm_fwd_bwd_cuda"] = cuda_time_ms(fwd_bwd(ln, torch.randn(256 * 512 // 4, 1024, device=dev)))
    attn = nn.MultiheadAttention(1024, 16, batch_first=True, device=dev)
    mask = torch.triu(torch.full((512, 512), float("-inf"), device=dev), 1)
    results["attention_fwd_bwd_cuda"] = cuda_time_ms(
        fwd_bwd(attn, torch.randn(16, 512, 1024, device=dev), attn_mask=mask, need_weights=False))
    p = torch.randn(1 << 24, device=dev, requires_grad=True)
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-3)
    results["adamw_step_cuda"] = cuda_time_ms(opt.step)
    return results


def ember_times(paths):
    """Median real time in ms per benchmark name from Google Benchmark JSON files."""
    out = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for b in data.get("benchmarks", []):
            name = b["name"].replace("/real_time", "")
            unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
            out[name] = b["real_time"] * unit
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs="+")
    args = ap.parse_args()
    if args.compare:
        torch_file = args.compare[-1]
        with open(torch_file) as f:
            torch_ms = json.load(f)
        ember_ms = ember_times(args.compare[:-1])
        print(f"{'benchmark':40s} {'ember ms':>10s} {'torch ms':>10s} {'torch/ember':>12s}")
        for name, t in sorted(torch_ms.items()):
            if name in ember_ms:
                print(f"{name:40s} {ember_ms[name]:10.3f} {t:10.3f} {t / ember_ms[name]:12.2f}")
        return 0
    res = run_torch()
    text = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
