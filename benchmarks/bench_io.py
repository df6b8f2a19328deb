#!/usr/bin/env python3
"""The Python twin of bench_io.cpp: save and load of a 124M-parameter float32 state dict with
GPT-2-small shapes through the reference safetensors library (numpy), on the same machine.

  python bench_io.py [--dir /tmp] [--rounds 3]

bench_io --python PY runs this with --rounds 1 after each of its own rounds (interleaved). Prints
one line per round: "python round: save S save+fsync S load S" (seconds). safetensors' save_file
does not fsync; "save+fsync" adds an fsync of the file, which ember's atomic save always does.
"""
import argparse
import os
import sys
import time

try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    print(f"SKIPPED: the Python safetensors package is not importable ({e})")
    sys.exit(0)


def gpt2_shapes():
    s = [("wte.weight", (50257, 768)), ("wpe.weight", (1024, 768))]
    for i in range(12):
        p = f"h.{i}."
        s += [(p + "ln_1.weight", (768,)), (p + "ln_1.bias", (768,)),
              (p + "attn.c_attn.weight", (768, 2304)), (p + "attn.c_attn.bias", (2304,)),
              (p + "attn.c_proj.weight", (768, 768)), (p + "attn.c_proj.bias", (768,)),
              (p + "ln_2.weight", (768,)), (p + "ln_2.bias", (768,)),
              (p + "mlp.c_fc.weight", (768, 3072)), (p + "mlp.c_fc.bias", (3072,)),
              (p + "mlp.c_proj.weight", (3072, 768)), (p + "mlp.c_proj.bias", (768,))]
    return s + [("ln_f.weight", (768,)), ("ln_f.bias", (768,))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    sd = {k: (rng.standard_normal(s, dtype=np.float32) * np.float32(0.02)) for k, s in gpt2_shapes()}
    path = os.path.join(a.dir, f"python-bench-io-{os.getpid()}.safetensors")
    try:
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            save_file(sd, path)
            t1 = time.perf_counter()
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            t2 = time.perf_counter()
            back = load_file(path)
            t3 = time.perf_counter()
            del back
            print(f"python round: save {t1 - t0:.6f} save+fsync {t2 - t0:.6f} load {t3 - t2:.6f}", flush=True)
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
