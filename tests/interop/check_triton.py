#!/usr/bin/env python3
"""The Python side of tests/test_triton.cpp: checks the Triton model repositories ember wrote with
Triton's own schema, onnx and onnxruntime.

  python check_triton.py REPOSITORY

For every model folder REPOSITORY/<name> (hidden folders are temporary ones and must not exist):
1. config.pbtxt parses as Triton's ModelConfig (tritonclient.grpc.model_config_pb2, the message
   tritonserver reads) with google.protobuf.text_format, which rejects unknown fields and values;
   its name is the folder's, its platform "onnxruntime_onnx" and backend "onnxruntime";
2. every version folder's model.onnx passes onnx's checker, and the config's inputs and outputs
   are the graph's (initializers excluded), in order: names, data types, and dims (the shape
   without dimension 0 when max_batch_size > 0, which must then be symbolic; -1 for symbolic or
   unknown dimensions; a tensor that is only the batch as dims [1] with reshape { shape: [] });
3. onnxruntime runs the model with a batch of 3 and of max_batch_size (other symbolic dimensions
   4), and its outputs have the config's data types and dims.
Prints one JSON line per model (with what the config says, for the C++ test to compare) and "OK"
when every check passed; "SKIPPED: ..." when a package is missing; exits 1 on a failure.
"""
import json
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc
except ImportError as e:  # the C++ test reports it as skipped
    print(f"SKIPPED: a reference package is not importable ({e})")
    sys.exit(0)

T = onnx.TensorProto
TRITON_OF_ONNX = {
    T.FLOAT: "TYPE_FP32", T.FLOAT16: "TYPE_FP16", T.BFLOAT16: "TYPE_BF16", T.DOUBLE: "TYPE_FP64",
    T.INT8: "TYPE_INT8", T.INT16: "TYPE_INT16", T.INT32: "TYPE_INT32", T.INT64: "TYPE_INT64",
    T.UINT8: "TYPE_UINT8", T.UINT16: "TYPE_UINT16", T.UINT32: "TYPE_UINT32", T.UINT64: "TYPE_UINT64",
    T.BOOL: "TYPE_BOOL", T.STRING: "TYPE_STRING",
}
NP_OF_TRITON = {
    "TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_FP64": np.float64, "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_BOOL": np.bool_,
}

try:  # bfloat16 tensors: onnx depends on ml_dtypes
    import ml_dtypes

    NP_OF_TRITON["TYPE_BF16"] = ml_dtypes.bfloat16
except ImportError:
    pass


def expected_entry(value_info, batched, errors, role):
    """(data type, dims, reshaped) of a graph value as the config must describe it."""
    t = value_info.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    if batched:
        if not dims or t.shape.dim[0].HasField("dim_value"):
            errors.append(f"{role} '{value_info.name}': dimension 0 is not symbolic but max_batch_size > 0")
        dims = dims[1:]
    reshaped = batched and not dims
    return TRITON_OF_ONNX.get(t.elem_type, f"onnx type {t.elem_type}"), dims or [1], reshaped


def compare(role, entries, values, batched, errors):
    if [e.name for e in entries] != [v.name for v in values]:
        errors.append(f"{role} names {[e.name for e in entries]} != graph's {[v.name for v in values]}")
        return
    for e, v in zip(entries, values):
        dtype, dims, reshaped = expected_entry(v, batched, errors, role)
        got = mc.DataType.Name(e.data_type)
        if got != dtype:
            errors.append(f"{role} '{e.name}': data_type {got}, graph's {dtype}")
        if list(e.dims) != dims:
            errors.append(f"{role} '{e.name}': dims {list(e.dims)}, graph's {dims}")
        if e.HasField("reshape") != reshaped or (reshaped and list(e.reshape.shape) != []):
            errors.append(f"{role} '{e.name}': reshape {e.reshape if e.HasField('reshape') else None}, "
                          f"expected {'[]' if reshaped else 'none'}")


def feed_shape(entry, batch):
    """An input's shape: [batch] + dims, or [batch] alone where reshaped; symbolic (-1) dims as 4."""
    return [batch] + ([] if entry.HasField("reshape") else [d if d > 0 else 4 for d in entry.dims])


def run(path, cfg, errors):
    batched = cfg.max_batch_size > 0
    batches = [3, cfg.max_batch_size] if batched else [0]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b in batches:
        feeds = {}
        for e in cfg.input:
            shape = feed_shape(e, b)
            if not batched:  # the whole shape is in dims: a symbolic batch runs as 3
                shape = [d if d > 0 else 3 for d in e.dims]
            dt = NP_OF_TRITON[mc.DataType.Name(e.data_type)]
            feeds[e.name] = (rng.standard_normal(shape) if np.issubdtype(dt, np.floating) else np.zeros(shape)).astype(dt)
        outs = sess.run([o.name for o in cfg.output], feeds)
        for o, y in zip(cfg.output, outs):
            want = NP_OF_TRITON[mc.DataType.Name(o.data_type)]
            if y.dtype != want:
                errors.append(f"batch {b}: output '{o.name}' is {y.dtype}, config says {mc.DataType.Name(o.data_type)}")
            dims = ([b] + ([] if o.HasField("reshape") else list(o.dims))) if batched else list(o.dims)
            finite = bool(np.all(np.isfinite(y.astype(np.float64))))
            if len(y.shape) != len(dims) or any(d != -1 and s != d for s, d in zip(y.shape, dims)) or not finite:
                errors.append(f"batch {b}: output '{o.name}' shape {list(y.shape)} (finite: {finite}) "
                              f"against {dims} (-1: any)")
    return [b for b in batches if b]


def check_model(repo, name):
    errors, report = [], {"model": name}
    folder = os.path.join(repo, name)
    cfg = mc.ModelConfig()
    with open(os.path.join(folder, "config.pbtxt")) as f:
        text_format.Parse(f.read(), cfg)  # raises on a field or value Triton's schema does not have
    if cfg.name != name:
        errors.append(f"config name '{cfg.name}' is not the folder's '{name}'")
    if cfg.platform != "onnxruntime_onnx" or cfg.backend != "onnxruntime":
        errors.append(f"platform '{cfg.platform}', backend '{cfg.backend}'")
    versions = sorted(v for v in os.listdir(folder) if v.isdigit())
    if not versions:
        errors.append("no version folder")
    report.update(max_batch_size=cfg.max_batch_size, versions=versions,
                  inputs=[[e.name, mc.DataType.Name(e.data_type), list(e.dims)] for e in cfg.input],
                  outputs=[[e.name, mc.DataType.Name(e.data_type), list(e.dims)] for e in cfg.output],
                  instance_group=[[g.count, mc.ModelInstanceGroup.Kind.Name(g.kind)] for g in cfg.instance_group],
                  dynamic_batching=cfg.HasField("dynamic_batching"),
                  preferred_batch_size=list(cfg.dynamic_batching.preferred_batch_size),
                  max_queue_delay_microseconds=cfg.dynamic_batching.max_queue_delay_microseconds)
    for v in versions:
        path = os.path.join(folder, v, "model.onnx")
        onnx.checker.check_model(path, full_check=True)
        graph = onnx.load(path, load_external_data=False).graph
        weights = {t.name for t in graph.initializer}
        batched = cfg.max_batch_size > 0
        compare("input", cfg.input, [i for i in graph.input if i.name not in weights], batched, errors)
        compare("output", cfg.output, list(graph.output), batched, errors)
        if not errors:
            report["ran_batches"] = run(path, cfg, errors)
    report["ok"] = not errors
    report["errors"] = errors
    return report


def main():
    repo = sys.argv[1]
    failed = False
    for name in sorted(os.listdir(repo)):
        if name.startswith("."):
            print(json.dumps({"model": name, "ok": False, "errors": ["a hidden (temporary) folder is left"]}))
            failed = True
            continue
        try:
            r = check_model(repo, name)
        except Exception as e:  # a parse or load error fails the model, with its message
            r = {"model": name, "ok": False, "errors": [f"{type(e).__name__}: {e}"]}
        failed |= not r["ok"]
        print(json.dumps(r))
    print("FAILED" if failed else "OK")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
