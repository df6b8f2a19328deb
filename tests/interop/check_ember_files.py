#!/usr/bin/env python3
"""The Python side of tests/test_safetensors.cpp's live interop test, with the reference
implementation (the `safetensors` package and numpy):

  python check_ember_files.py DIR

1. reads DIR/ember_dtypes.safetensors and DIR/ember_big.safetensors, which ember wrote, and checks
   every tensor's dtype, shape and bytes and the metadata against the formulas the C++ side used;
2. writes DIR/python_big.safetensors (several MB) for ember to read back.
Prints "SKIPPED: ..." when the package is missing, "OK" when every check passed; exits 1 otherwise.
"""
import os
import sys

try:
    import numpy as np
    import safetensors
    from safetensors.numpy import save_file
except ImportError as e:  # the C++ test reports it as skipped
    print(f"SKIPPED: the Python safetensors package is not importable ({e})")
    sys.exit(0)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import BF16_BITS, python_values  # noqa: E402

BIG = 3 * 2**20 // 4 * 4  # float32 elements of the several-MB tensors


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    # The reference reader (Rust, through the package's deserialize) validates the file.
    tensors = dict(safetensors.deserialize(blob))
    with safetensors.safe_open(path, framework="numpy") as f:
        metadata = f.metadata()
    return tensors, metadata


def expect(tensors, name, dtype, arr):
    if name not in tensors:
        fail(f"{name} missing (have {sorted(tensors)})")
    t = tensors[name]
    if t["dtype"] != dtype or list(t["shape"]) != list(arr.shape):
        fail(f"{name}: {t['dtype']} {t['shape']}, expected {dtype} {list(arr.shape)}")
    if bytes(t["data"]) != np.ascontiguousarray(arr).tobytes():
        fail(f"{name}: bytes differ")


def main(d):
    vals = python_values()
    code = {np.float64: "F64", np.float32: "F32", np.float16: "F16", np.int64: "I64", np.int32: "I32", np.uint8: "U8"}
    tensors, metadata = read(os.path.join(d, "ember_dtypes.safetensors"))
    for k, v in vals.items():
        expect(tensors, k, code[v.dtype.type], v)
    expect(tensors, "bf16", "BF16", np.array(BF16_BITS, dtype="<u2").reshape(2, 2))
    if metadata != {"writer": "ember", "note": "quotes \" and unicode \u00e9"}:
        fail(f"metadata {metadata}")
    if len(tensors) != len(vals) + 1:
        fail(f"{len(tensors)} tensors")

    tensors, _ = read(os.path.join(d, "ember_big.safetensors"))
    expect(tensors, "big", "F32", (np.arange(BIG, dtype=np.float32) * np.float32(0.5)))
    expect(tensors, "big_i64", "I64", np.arange(BIG // 4, dtype=np.int64) - 5)

    save_file({"big": np.arange(BIG, dtype=np.float32) * np.float32(-0.25),
               "small": np.array([[1, 2, 3]], dtype=np.int32)},
              os.path.join(d, "python_big.safetensors"), metadata={"writer": "python"})
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
