#!/usr/bin/env python3
"""PyTorch twins of ember's benchmarks (bench_core, bench_layers), for side-by-side ratios on the
GPU machine, which has PyTorch. Same workloads and sizes as the *_cuda benchmarks of the C++
programs; CUDA events around each call (as benchmarks/bench_main.hpp times ember's side), warm-up,
median of repeated runs. The JSON is {case: milliseconds, ..., "errors": {case: message}} ("errors"
only when a case failed: the others are still measured).

  python3 benchmarks/bench_torch.py --out torch.json
  python3 benchmarks/bench_torch.py --compare build/bench_core.json build/bench_layers.json torch.json

--compare prints, for each benchmark present in both, ember's time, PyTorch's time and the ratio
(PyTorch time / ember time: above 1 means ember is faster).
"""
import argparse
import json
import os
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


def torch_cases():
    """(name, setup) pairs; setup() builds the inputs and returns the call to time. Names are the
    C++ cases' names (Google Benchmark's, without its "/manual_time" suffix)."""
    import torch
    import torch.nn as nn
    dev = "cuda"
    cases = []
    # bench_core (CUDA sizes)
    n, m = 4096, 1 << 26

    def matmul():
        a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
        return lambda: a @ b
    cases.append(("matmul_ember_cuda/4096", matmul))

    def vectors():
        return torch.randn(m, device=dev), torch.randn(m, device=dev)

    def memcpy():
        x, _ = vectors()
        out = torch.empty_like(x)
        return lambda: out.copy_(x)
    cases.append(("memcpy_cuda/67108864", memcpy))

    def add():
        x, y = vectors()
        return lambda: x + y
    cases.append(("add_cuda/67108864", add))

    def mul_scalar():
        x, _ = vectors()
        return lambda: x * 1.5
    cases.append(("mul_scalar_cuda/67108864", mul_scalar))

    def relu():
        x, _ = vectors()
        return lambda: torch.relu(x)
    cases.append(("relu_cuda/67108864", relu))

    def sum_rows():
        rows = vectors()[0].view(-1, 1024)
        return lambda: rows.sum(1)
    cases.append(("sum_rows_cuda/67108864", sum_rows))

    def softmax_rows():
        rows = vectors()[0].view(-1, 1024)
        return lambda: torch.softmax(rows, 1)
    cases.append(("softmax_rows_cuda/67108864", softmax_rows))

    # bench_layers (CUDA sizes: batch 256, features 4096, image 32, channels 128, tokens 512, embed 1024, heads 16)
    def fwd_bwd(module, inp, **kw):
        inp = inp.detach().requires_grad_()

        def step():
            if kw:
                module(inp, inp, inp, **kw)[0].sum().backward()
            else:
                module(inp).sum().backward()
        return step

    cases.append(("linear_fwd_bwd_cuda",
                  lambda: fwd_bwd(nn.Linear(4096, 4096, device=dev), torch.randn(256, 4096, device=dev))))
    cases.append(("conv2d_fwd_bwd_cuda",
                  lambda: fwd_bwd(nn.Conv2d(128, 128, 3, padding=1, device=dev), torch.randn(64, 128, 32, 32, device=dev))))
    cases.append(("layernorm_fwd_bwd_cuda",
                  lambda: fwd_bwd(nn.LayerNorm(1024, device=dev), torch.randn(256 * 512 // 4, 1024, device=dev))))

    def attention():
        attn = nn.MultiheadAttention(1024, 16, batch_first=True, device=dev)
        mask = torch.triu(torch.full((512, 512), float("-inf"), device=dev), 1)
        return fwd_bwd(attn, torch.randn(16, 512, 1024, device=dev), attn_mask=mask, need_weights=False)
    cases.append(("attention_fwd_bwd_cuda", attention))

    def adamw():
        p = torch.randn(1 << 24, device=dev, requires_grad=True)
        p.grad = torch.randn_like(p)
        return torch.optim.AdamW([p], lr=1e-3).step
    cases.append(("adamw_step_cuda", adamw))
    return cases


def run_torch(out_path=None):
    """Times every case; a failing case is reported in "errors" (the others still run), and the JSON
    is rewritten after each case, so a run stopped by a deadline keeps what it measured."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # ember's fp32 GEMM does not use TF32
    torch.backends.cudnn.allow_tf32 = False
    results, errors = {}, {}

    def save():
        if out_path:
            tmp = out_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(dict(results, **({"errors": errors} if errors else {})), f, indent=1)
            os.replace(tmp, out_path)

    for name, setup in torch_cases():
        try:
            results[name] = cuda_time_ms(setup())
        except Exception as e:  # one failing case must not lose the others
            errors[name] = f"{type(e).__name__}: {e}"
            print(f"{name}: FAILED: {errors[name]}", file=sys.stderr)
        torch.cuda.empty_cache()
        save()
    return results, errors


def ember_times(paths):
    """Median real time in ms per benchmark name from Google Benchmark JSON files."""
    out = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for b in data.get("benchmarks", []):
            if b.get("error_occurred") or b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                continue
            name = b.get("run_name", b["name"]).replace("/manual_time", "").replace("/real_time", "")
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
            if name in ember_ms and isinstance(t, (int, float)):
                print(f"{name:40s} {ember_ms[name]:10.3f} {t:10.3f} {t / ember_ms[name]:12.2f}")
        return 0
    try:
        import torch
    except ImportError as e:
        print(f"SKIPPED: PyTorch not importable ({e})")
        return 3
    if not torch.cuda.is_available():
        print("SKIPPED: PyTorch sees no CUDA device")
        return 3
    res, errors = run_torch(args.out)
    print(json.dumps(dict(res, **({"errors": errors} if errors else {})), indent=1))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
