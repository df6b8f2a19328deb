#!/usr/bin/env python3
"""Fashion-MNIST through the ONNX files examples/fashion_mnist exported (--export, --int8 1), in
onnxruntime: the fp32 model's test accuracy equals ember's, the INT8 model (QuantizeLinear /
DequantizeLinear pairs) is within 0.5 points of the fp32 model's, TensorRT's rules for explicit
quantization hold (tests/interop/check_onnx.py's lint), and onnxruntime's optimised graph names
the integer kernels it runs.

  python check_fashion_onnx.py MODEL.onnx MODEL_int8.onnx TEST_SUBSET [FASHION_MNIST_DIR]

Prints "SKIPPED: ..." without numpy/onnx/onnxruntime or the data, one JSON line and "OK" when every
check passed; exits 1 otherwise.
"""
import gzip
import json
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:
    print(f"SKIPPED: a reference package is not importable ({e})")
    sys.exit(0)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_onnx import INTEGER_OPS, integer_kernels_saturate, lint_qdq  # noqa: E402


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def accuracy(path, x, y, level):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    optimized = path + ".ort-optimised.onnx"
    if level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL:
        so.optimized_model_filepath = optimized
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    correct = 0
    for i in range(0, len(x), 500):
        (logits,) = sess.run(None, {name: x[i:i + 500]})
        correct += int((np.argmax(logits, axis=1) == y[i:i + 500]).sum())
    ops = sorted({n.op_type for n in onnx.load(optimized).graph.node}) if level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL else []
    return correct / len(x), ops


def main():
    fp32, int8, subset = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data_dir = sys.argv[4] if len(sys.argv) > 4 else os.environ.get("EMBER_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    images = os.path.join(data_dir, "t10k-images-idx3-ubyte.gz")
    if not os.path.exists(images):
        print(f"SKIPPED: Fashion-MNIST not found in {data_dir}")
        return 0
    x = idx(images).astype(np.float32) / 255.0
    y = idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    if subset > 0:
        x, y = x[:subset], y[:subset]
    x = ((x - 0.2860) / 0.3530).astype(np.float32)[:, None, :, :]  # the example's Normalize
    r = {}
    for name, path in (("fp32", fp32), ("int8", int8)):
        onnx.checker.check_model(path, full_check=True)
        model = onnx.load(path)
        props = {p.key: p.value for p in model.metadata_props}
        r[name + "_ember"] = float(props["test_accuracy"])
        r[name + "_ort_off"], _ = accuracy(path, x, y, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        r[name + "_ort_on"], ops = accuracy(path, x, y, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        if name == "int8":
            r["qdq_nodes"] = lint_qdq(model)
            r["integer_kernels"] = [o for o in ops if o in INTEGER_OPS]
            r["optimised_ops"] = ops
    print(json.dumps(r))
    problems = []
    # onnxruntime and ember agree on the fp32 model (a tie in the arg-max may flip one image).
    if abs(r["fp32_ort_off"] - r["fp32_ember"]) > 1.5 / len(x):
        problems.append("fp32: onnxruntime's accuracy differs from ember's")
    # On an x86-64 processor without VNNI, onnxruntime's u8s8 integer kernels saturate 16-bit pair
    # sums (check_onnx.py): the optimised INT8 model's accuracy is reported there, not bounded.
    levels = ("off", "on")
    if r["integer_kernels"] and integer_kernels_saturate():
        levels = ("off",)
        print("SKIPPED (in part): the optimised INT8 model's accuracy bound: this processor has no VNNI, "
              "so onnxruntime's u8s8 integer kernels saturate")
    for level in levels:
        drop = 100.0 * (r["fp32_ort_" + level] - r["int8_ort_" + level])
        if drop > 0.5:
            problems.append(f"int8 loses {drop:.2f} points with optimisations {level} (at most 0.5)")
    if abs(r["int8_ort_off"] - r["int8_ember"]) > 0.005:
        problems.append("int8: onnxruntime's accuracy is more than 0.5 points from ember's fake quantization")
    if not r["integer_kernels"]:
        problems.append("onnxruntime ran no integer kernel")
    for p in problems:
        print("FAIL:", p)
    print("FAILED" if problems else "OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
