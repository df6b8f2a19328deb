#!/usr/bin/env python3
"""The Python side of tests/test_onnx.cpp: checks the ONNX files ember exported with the reference
implementations (onnx's checker and onnxruntime).

  python check_onnx.py DIR

For every DIR/<case>.onnx with its DIR/<case>.io.safetensors (written by the C++ test: inputs
"input.<k>" and ember's outputs "expected.<k>" for k = 0, 1, ..., stored as fp32/int64, and
metadata: "atol", "rtol", optional "expect_metadata" (JSON object the model's metadata_props must
contain), "expect_producer", "qdq" ("1": an INT8 model, linted for TensorRT's rules, its
onnxruntime-optimised ops reported), "require_integer_kernels" ("1": they must include one),
"atol_on"/"rtol_on" (the bound with optimisations on, where onnxruntime's rewrites approximate)):
1. onnx.checker.check_model(path, full_check=True) (shape inference included);
2. onnxruntime runs the model with its graph optimisations off and on, each input cast to the
   model's input type, and the output must match ember's to atol + rtol * |expected|;
3. the metadata and producer are what the test asked for.
On an x86-64 processor without VNNI (AVX2 or AVX-512F alone), onnxruntime's integer kernels
multiply u8 by s8 with pmaddubsw, whose 16-bit pair sums saturate for 8-bit weights (onnxruntime
offers 7-bit weights, reduce_range, for such processors): there the outputs of an optimised graph
that runs integer kernels are not compared (the case says so in "on_values"); the integer kernels
must still be there, and the unoptimised graph is compared as everywhere.
Prints one JSON line per case and "OK" when every check passed; "SKIPPED: ..." when a package is
missing; exits 1 on a failure.
"""
import glob
import json
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from safetensors.numpy import load_file
except ImportError as e:  # the C++ test reports it as skipped
    print(f"SKIPPED: a reference package is not importable ({e})")
    sys.exit(0)

NP_OF_ONNX = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.UINT8: np.uint8,
}
try:  # bfloat16 inputs: onnx depends on ml_dtypes
    import ml_dtypes

    NP_OF_ONNX[onnx.TensorProto.BFLOAT16] = ml_dtypes.bfloat16
except ImportError:
    pass


# onnxruntime's integer kernels that its QDQ fusions produce.
INTEGER_OPS = {"QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "MatMulIntegerToFloat", "QGemm",
               "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearLeakyRelu",
               "QLinearSigmoid", "QLinearConcat"}


def lint_qdq(model):
    """TensorRT's rules for explicit quantization: every QuantizeLinear/DequantizeLinear has an
    int8 zero point that is all zeros, scales that are positive and finite, a valid axis for
    per-channel scales, and the opset is at most 25. Returns the number of Q/DQ nodes."""
    from onnx import numpy_helper

    if model.opset_import[0].version > 25:
        raise AssertionError(f"opset {model.opset_import[0].version} > 25 (TensorRT 11 parses up to 25)")
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ranks = {t.name: len(t.dims) for t in model.graph.initializer}
    count = 0
    for n in model.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        count += 1
        if len(n.input) < 3 or n.input[2] not in inits:
            raise AssertionError(f"{n.name}: no constant zero point")
        zp, scale = inits[n.input[2]], inits.get(n.input[1])
        if zp.dtype != np.int8 or np.any(zp != 0):
            raise AssertionError(f"{n.name}: zero point {zp} (TensorRT wants int8 zeros)")
        if scale is None or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise AssertionError(f"{n.name}: scales must be positive and finite")
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        if scale.ndim == 1 and scale.size > 1:
            rank = ranks.get(n.input[0])
            if rank is not None and not (-rank <= axis < rank):
                raise AssertionError(f"{n.name}: axis {axis} for a rank-{rank} input")
            if rank is not None and inits[n.input[0]].shape[axis] != scale.size:
                raise AssertionError(f"{n.name}: {scale.size} scales for dimension {axis} of {inits[n.input[0]].shape}")
    if count == 0:
        raise AssertionError("no QuantizeLinear/DequantizeLinear node")
    return count


def integer_kernels_saturate():
    """True on an x86-64 processor whose 8-bit dot products go through pmaddubsw (no VNNI)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return False
    if flags is None or "avx2" not in flags:
        return False  # not x86-64 with AVX2 (onnxruntime's u8s8 path), or nothing known
    return not ({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


def check_case(path):
    case = os.path.basename(path)[: -len(".onnx")]
    io_path = path[: -len(".onnx")] + ".io.safetensors"
    with open(io_path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(header_len)).get("__metadata__", {})
    tensors = load_file(io_path)
    atol, rtol = float(meta.get("atol", "1e-5")), float(meta.get("rtol", "1e-5"))
    result = {"case": case}

    onnx.checker.check_model(path, full_check=True)
    model = onnx.load(path)  # external data too
    result["opset"] = model.opset_import[0].version
    result["ir_version"] = model.ir_version
    props = {p.key: p.value for p in model.metadata_props}
    want = json.loads(meta.get("expect_metadata", "{}"))
    for k, v in want.items():
        if props.get(k) != v:
            raise AssertionError(f"metadata {k!r} is {props.get(k)!r}, expected {v!r}")
    if "expect_producer" in meta and model.producer_name != meta["expect_producer"]:
        raise AssertionError(f"producer {model.producer_name!r}")
    in_type = NP_OF_ONNX[model.graph.input[0].type.tensor_type.elem_type]
    if meta.get("qdq") == "1":
        result["qdq_pairs"] = lint_qdq(model)

    worst = 0.0
    runs = 0
    compare_on = True
    for level_name, level in (("off", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                              ("on", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.log_severity_level = 3
        optimized = path + f".ort-{level_name}.onnx"
        if meta.get("qdq") == "1" and level_name == "on":
            so.optimized_model_filepath = optimized
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        if meta.get("qdq") == "1" and level_name == "on":
            # onnxruntime fused the Q/DQ pairs into integer kernels: name them.
            ops = sorted({n.op_type for n in onnx.load(optimized).graph.node})
            integer = [o for o in ops if o in INTEGER_OPS]
            if not integer and meta.get("require_integer_kernels") == "1":
                raise AssertionError(f"onnxruntime's optimised graph has no integer kernel: {ops}")
            result["integer_kernels"] = integer
            result["optimised_ops"] = ops
            if integer and integer_kernels_saturate():
                compare_on = False
                result["on_values"] = ("not compared: this processor has no VNNI, so onnxruntime's u8s8 "
                                       "integer kernels saturate 16-bit pair sums")
        if level_name == "on" and not compare_on:
            continue
        name = sess.get_inputs()[0].name
        k = 0
        while f"input.{k}" in tensors:
            x = tensors[f"input.{k}"].astype(in_type)
            expected = tensors[f"expected.{k}"].astype(np.float64)
            (y,) = sess.run(None, {name: x})
            y = np.asarray(y).astype(np.float64)
            if y.shape != expected.shape:
                raise AssertionError(f"optimisations {level_name}, input {k} {x.shape}: output {y.shape}, "
                                     f"expected {expected.shape}")
            err = np.abs(y - expected)
            a = float(meta.get("atol_on", atol)) if level_name == "on" else atol
            r = float(meta.get("rtol_on", rtol)) if level_name == "on" else rtol
            bound = a + r * np.abs(expected)
            if not np.all(err <= bound):
                i = int(np.argmax(err - bound))
                raise AssertionError(f"optimisations {level_name}, input {k} {x.shape}: max error "
                                     f"{float(err.max()):.3g} (at {i}: {y.flat[i]} vs {expected.flat[i]}), "
                                     f"bound atol {a} + rtol {r}")
            worst = max(worst, float(err.max()) if err.size else 0.0)
            runs += 1
            k += 1
    result.update({"ok": True, "runs": runs, "max_abs_err": worst})
    return result


def main():
    directory = sys.argv[1]
    failed = 0
    for path in sorted(glob.glob(os.path.join(directory, "*.onnx"))):
        try:
            r = check_case(path)
        except Exception as e:  # noqa: BLE001 - every failure is reported with its case
            r = {"case": os.path.basename(path)[: -len(".onnx")], "ok": False, "error": f"{type(e).__name__}: {e}"}
            failed += 1
        print(json.dumps(r))
    print("FAILED" if failed else "OK")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
