#!/usr/bin/env python3
"""Makes the few-KB safetensors fixtures in this folder with the reference implementation (the
Python `safetensors` package, numpy only; PyTorch is not needed), for tests/test_safetensors.cpp.

  python tests/interop/make_fixtures.py [out_dir]     (default: this script's folder)

python_dtypes.safetensors
    Every dtype ember holds (F64 F32 F16 BF16 I64 I32 U8), a 0-d tensor, an empty tensor and
    metadata; values from the formulas in python_values() below (the C++ test repeats them).
python_unsupported.safetensors
    I16, I8 and BOOL tensors (format dtypes ember cannot hold) next to one F32 tensor.
torch_model.safetensors, torch_model_io.safetensors
    A state dict with exactly the names (and order) torch.nn gives this model

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
                self.bn = torch.nn.BatchNorm2d(4)
                self.ln = torch.nn.LayerNorm(4)
                self.attn = torch.nn.MultiheadAttention(4, 2, batch_first=True)
                self.fc = torch.nn.Linear(4, 3)
            def forward(self, x):                      # x [N, 2, H, W], model.eval()
                h = torch.relu(self.bn(self.conv(x)))  # [N, 4, H, W]
                h = h.flatten(2).transpose(1, 2)       # [N, H*W, 4] tokens
                h = self.ln(h)
                h = self.attn(h, h, h, need_weights=False)[0]
                return self.fc(h.mean(1))              # [N, 3]

    with random weights and running statistics, and an input x with the output y that this file
    computes in numpy (float64 arithmetic on the float32 values, stored as float32).
"""
import os
import sys

import numpy as np
from safetensors import TensorSpec, serialize
from safetensors.numpy import save_file


def python_values():
    return {
        "f64": (np.arange(6, dtype=np.float64).reshape(2, 3) * 0.5 - 1.0),
        "f32": (np.arange(6, dtype=np.float32).reshape(3, 2) * 0.25 + 2.0),
        "f16": (np.arange(8, dtype=np.float16).reshape(2, 2, 2) * np.float16(-0.5)),
        "i64": np.array([-3, 2**40, 7], dtype=np.int64),
        "i32": np.array([[-1, 2], [3, -(2**31)]], dtype=np.int32),
        "u8": np.array([0, 255, 7], dtype=np.uint8),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


# bf16 has no numpy dtype: the raw little-endian bits of 1.0, -2.0, 0.5, 3.0.
BF16_BITS = [0x3F80, 0xC000, 0x3F00, 0x4040]


def raw_serialize(entries, metadata=None):
    """The package's low-level serialize(): raw bytes per tensor, which is how BF16 gets in.
    entries: {name: (safetensors dtype name, shape, numpy array holding the bytes)}."""
    names = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
             "I32": "int32", "U8": "uint8"}
    keep = []
    specs = {}
    for k, (dt, shape, arr) in entries.items():
        arr = np.ascontiguousarray(arr)
        keep.append(arr)
        specs[k] = TensorSpec(dtype=names[dt], shape=list(shape), data_ptr=arr.ctypes.data, data_len=arr.nbytes)
    return serialize(specs, metadata=metadata)


def write_dtypes(out):
    vals = python_values()
    code = {np.float64: "F64", np.float32: "F32", np.float16: "F16", np.int64: "I64", np.int32: "I32", np.uint8: "U8"}
    entries = {k: (code[v.dtype.type], v.shape, v) for k, v in vals.items()}
    entries["bf16"] = ("BF16", (2, 2), np.array(BF16_BITS, dtype="<u2"))
    blob = raw_serialize(entries, metadata={"format": "pt", "source": "python"})
    with open(os.path.join(out, "python_dtypes.safetensors"), "wb") as f:
        f.write(blob)
    save_file({"i16": np.array([-2, 3], dtype=np.int16), "i8": np.array([-1], dtype=np.int8),
               "bool": np.array([True, False]), "ok": np.array([1.5], dtype=np.float32)},
              os.path.join(out, "python_unsupported.safetensors"))


def conv2d(x, w, b, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = np.zeros((n, o, h, wd))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + h, j:j + wd]  # [n, c, h, w]
            y += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return y + b[None, :, None, None]


def reference_forward(sd, x):
    d = {k: v.astype(np.float64) for k, v in sd.items()}
    h = conv2d(x.astype(np.float64), d["conv.weight"], d["conv.bias"], 1)
    eps = 1e-5
    h = (h - d["bn.running_mean"][None, :, None, None]) / np.sqrt(d["bn.running_var"][None, :, None, None] + eps)
    h = h * d["bn.weight"][None, :, None, None] + d["bn.bias"][None, :, None, None]
    h = np.maximum(h, 0.0)
    n, c, hh, ww = h.shape
    h = h.reshape(n, c, hh * ww).transpose(0, 2, 1)  # [N, L, E]
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    h = (h - mu) / np.sqrt(var + eps) * d["ln.weight"] + d["ln.bias"]
    E, H = c, 2
    D = E // H
    qkv = h @ d["attn.in_proj_weight"].T + d["attn.in_proj_bias"]
    q, k, v = qkv[..., :E], qkv[..., E:2 * E], qkv[..., 2 * E:]
    L = h.shape[1]
    split = lambda t: t.reshape(n, L, H, D).transpose(0, 2, 1, 3)  # [N, H, L, D]
    q, k, v = split(q) / np.sqrt(D), split(k), split(v)
    s = q @ k.transpose(0, 1, 3, 2)
    s = np.exp(s - s.max(-1, keepdims=True))
    a = s / s.sum(-1, keepdims=True)
    o = (a @ v).transpose(0, 2, 1, 3).reshape(n, L, E)
    o = o @ d["attn.out_proj.weight"].T + d["attn.out_proj.bias"]
    return o.mean(1) @ d["fc.weight"].T + d["fc.bias"]


def write_torch_model(out):
    rng = np.random.default_rng(1234)
    r = lambda *s: rng.uniform(-0.5, 0.5, size=s).astype(np.float32)
    # torch's state_dict order: each module's parameters, then its buffers, then its children.
    sd = {
        "conv.weight": r(4, 2, 3, 3), "conv.bias": r(4),
        "bn.weight": (1.0 + r(4)).astype(np.float32), "bn.bias": r(4),
        "bn.running_mean": r(4), "bn.running_var": (1.0 + r(4)).astype(np.float32),
        "bn.num_batches_tracked": np.array(17, dtype=np.int64),
        "ln.weight": (1.0 + r(4)).astype(np.float32), "ln.bias": r(4),
        "attn.in_proj_weight": r(12, 4), "attn.in_proj_bias": r(12),
        "attn.out_proj.weight": r(4, 4), "attn.out_proj.bias": r(4),
        "fc.weight": r(3, 4), "fc.bias": r(3),
    }
    x = rng.uniform(-1.0, 1.0, size=(2, 2, 3, 3)).astype(np.float32)
    y = reference_forward(sd, x).astype(np.float32)
    save_file(sd, os.path.join(out, "torch_model.safetensors"), metadata={"format": "pt"})
    save_file({"x": x, "y": y}, os.path.join(out, "torch_model_io.safetensors"))


def write_fuzz_seeds(out):
    seeds = os.path.join(out, "..", "fuzz", "corpus", "safetensors")
    if not os.path.isdir(seeds):
        return
    vals = python_values()
    with open(os.path.join(seeds, "small.safetensors"), "wb") as f:
        f.write(raw_serialize({"a": ("F32", (2,), vals["f32"][0]), "e": ("F32", (0, 3), vals["empty"])},
                              metadata={"k": "v"}))
    with open(os.path.join(seeds, "scalar.safetensors"), "wb") as f:
        f.write(raw_serialize({"s": ("I64", (), vals["i64"][:1])}))

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    write_dtypes(out)
    write_torch_model(out)
    write_fuzz_seeds(out)
    print("fixtures written to", out)
