#!/usr/bin/env python3
"""The Python side of tests/test_gguf.cpp: gguf-py (llama.cpp's own GGUF package, PyPI `gguf`) reads
the GGUF files ember wrote, and writes one for ember to read.

  python check_gguf.py check DIR
      For every DIR/<name>.gguf with DIR/<name>.expect.json (written by the C++ test):
        {"alignment": 32,
         "metadata": [{"key": ..., "type": "UINT32", "value": ...},
                      {"key": ..., "type": "ARRAY", "element": "STRING", "value": [...]}, ...],
         "tensors": [{"name": ..., "type": "Q8_0", "ne": [...], "offset": ...}, ...]}
      and optionally DIR/<name>.bytes.safetensors (each tensor's bytes as ember meant to write
      them, U8) and DIR/<name>.sources.safetensors (the float32 values each tensor was made from):
        1. gguf.GGUFReader opens the file; its keys (in order), value types and values, its
           alignment, and its tensors' names, types, ne and offsets are the expected ones;
        2. every tensor's bytes as the reader returns them equal the expected bytes;
        3. every tensor with a source equals gguf-py's own encoding of that source: numpy's
           float32 / float16 (round to nearest even) casts, and gguf.quants.quantize for Q8_0
           (written to match ggml's quantize_row_q8_0_ref bit for bit).
        4. with DIR/<name>.logits.safetensors ("ids" I64 [L], "logits" F32 [L, vocab], metadata
           "atol"): llama.cpp's gpt2 graph (src/models/gpt2.cpp: LayerNorm, fused qkv split q, k,
           v, causal attention scaled by 1/sqrt(head_dim), GELU(tanh) MLP, output_norm, the head
           output.weight or else token_embd.weight), run in float64 numpy on the file's tensors,
           gives ember's logits for the same weights to atol.
      Prints one JSON line per file, then "OK"; "FAIL: ..." lines and exit 1 on a mismatch.
  python check_gguf.py write PATH
      Writes PATH with gguf.GGUFWriter: the metadata and tensors that test_gguf.cpp expects.
Prints "SKIPPED: ..." (exit 0) when numpy, safetensors or gguf is not importable.
"""
import glob
import json
import os
import sys

try:
    import numpy as np
    import gguf
    from safetensors.numpy import load_file
except ImportError as e:  # the C++ test reports it as skipped
    print(f"SKIPPED: a reference package is not importable ({e})")
    sys.exit(0)

T = gguf.GGMLQuantizationType
V = gguf.GGUFValueType


def reference_bytes(src, type_name):
    src = np.ascontiguousarray(src, dtype=np.float32)
    if type_name == "F32":
        return src.astype("<f4").tobytes()
    if type_name == "F16":
        return src.astype("<f2").tobytes()
    if type_name == "Q8_0":
        return np.ascontiguousarray(gguf.quants.quantize(src, T.Q8_0)).tobytes()
    raise ValueError(f"no reference encoding for {type_name}")


def same_value(want, got, type_name):
    if type_name == "FLOAT32":  # JSON holds the float32 value as a double: exact
        return np.float32(want) == np.float32(got)
    return want == got


def gpt2_forward(r, ids):
    """Logits [L, vocab] of llama.cpp's gpt2 graph, from the file's tensors, in float64."""
    W = {}
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        W[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(shape)
    f = lambda key: r.fields[key].contents()  # noqa: E731
    E, H, eps = f("gpt2.embedding_length"), f("gpt2.attention.head_count"), f("gpt2.attention.layer_norm_epsilon")

    def norm(x, w, b):
        m = x.mean(-1, keepdims=True)
        return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b

    def gelu(x):  # ggml_gelu: the tanh approximation
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    L, d = len(ids), E // H
    x = W["token_embd.weight"][ids] + W["position_embd.weight"][:L]
    for i in range(f("gpt2.block_count")):
        p = f"blk.{i}."
        h = norm(x, W[p + "attn_norm.weight"], W[p + "attn_norm.bias"])
        qkv = h @ W[p + "attn_qkv.weight"].T + W[p + "attn_qkv.bias"]
        q, k, v = (qkv[:, j * E:(j + 1) * E].reshape(L, H, d).transpose(1, 0, 2) for j in range(3))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d) + np.triu(np.full((L, L), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = (a @ v).transpose(1, 0, 2).reshape(L, E)
        x = x + ctx @ W[p + "attn_output.weight"].T + W[p + "attn_output.bias"]
        h = norm(x, W[p + "ffn_norm.weight"], W[p + "ffn_norm.bias"])
        x = x + gelu(h @ W[p + "ffn_up.weight"].T + W[p + "ffn_up.bias"]) @ W[p + "ffn_down.weight"].T + W[p + "ffn_down.bias"]
    x = norm(x, W["output_norm.weight"], W["output_norm.bias"])
    return x @ W.get("output.weight", W["token_embd.weight"]).T


def check_file(path, failures):
    stem = path[: -len(".gguf")]
    name = os.path.basename(stem)
    with open(stem + ".expect.json", encoding="utf-8") as f:
        expect = json.load(f)
    fail = lambda msg: failures.append(f"{name}: {msg}")  # noqa: E731
    r = gguf.GGUFReader(path)
    if r.alignment != expect["alignment"]:
        fail(f"alignment {r.alignment}, expected {expect['alignment']}")
    if r.data_offset % r.alignment:
        fail(f"data offset {r.data_offset} is not aligned")
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    want_keys = [m["key"] for m in expect["metadata"]]
    if keys != want_keys:
        fail(f"keys {keys}, expected {want_keys}")
    for m in expect["metadata"]:
        field = r.fields.get(m["key"])
        if field is None:
            continue
        types = [t.name for t in field.types]
        want_types = [m["type"]] + ([m["element"]] if m["type"] == "ARRAY" else [])
        if types != want_types:
            fail(f"{m['key']}: types {types}, expected {want_types}")
            continue
        got = field.contents()
        if m["type"] == "ARRAY":
            ok = len(got) == len(m["value"]) and all(same_value(a, b, m["element"]) for a, b in zip(m["value"], got))
        else:
            ok = same_value(m["value"], got, m["type"])
        if not ok:
            fail(f"{m['key']}: value {str(got)[:200]}, expected {str(m['value'])[:200]}")
    want_bytes = load_file(stem + ".bytes.safetensors") if os.path.exists(stem + ".bytes.safetensors") else {}
    sources = load_file(stem + ".sources.safetensors") if os.path.exists(stem + ".sources.safetensors") else {}
    if [t.name for t in r.tensors] != [t["name"] for t in expect["tensors"]]:
        fail(f"tensors {[t.name for t in r.tensors]}, expected {[t['name'] for t in expect['tensors']]}")
    n_bytes = n_ref = 0
    worst_q8 = 0.0
    for t, e in zip(r.tensors, expect["tensors"]):
        if t.tensor_type.name != e["type"] or [int(d) for d in t.shape] != e["ne"]:
            fail(f"{t.name}: {t.tensor_type.name} ne {list(t.shape)}, expected {e['type']} ne {e['ne']}")
            continue
        if t.data_offset - r.data_offset != e["offset"]:
            fail(f"{t.name}: offset {t.data_offset - r.data_offset}, expected {e['offset']}")
        raw = np.ascontiguousarray(t.data).view(np.uint8).tobytes()
        if t.name in want_bytes:
            n_bytes += 1
            if raw != want_bytes[t.name].tobytes():
                fail(f"{t.name}: the bytes gguf-py reads differ from those ember meant to write")
        if t.name in sources:
            n_ref += 1
            src = sources[t.name]
            if list(src.shape) != list(reversed(e["ne"])):
                fail(f"{t.name}: source shape {list(src.shape)} against ne {e['ne']}")
                continue
            ref = reference_bytes(src, e["type"])
            if raw != ref:
                a, b = np.frombuffer(raw, np.uint8), np.frombuffer(ref, np.uint8)
                fail(f"{t.name}: {int((a != b).sum())} of {a.size} bytes differ from gguf-py's {e['type']} encoding")
            if e["type"] == "Q8_0":
                deq = gguf.quants.dequantize(t.data, T.Q8_0).reshape(-1, 32)
                blocks = src.reshape(-1, 32)
                d = np.abs(blocks).max(axis=1, keepdims=True) / 127
                err = np.abs(deq - blocks) / np.where(d == 0, 1, d)
                worst_q8 = max(worst_q8, float(err.max()))
    logits_diff = None
    if os.path.exists(stem + ".logits.safetensors"):
        from safetensors import safe_open

        with safe_open(stem + ".logits.safetensors", "np") as lf:
            atol = float(lf.metadata()["atol"])
            ids, want = lf.get_tensor("ids"), lf.get_tensor("logits")
        got = gpt2_forward(r, ids)
        logits_diff = float(np.abs(got - want).max())
        if not logits_diff <= atol:
            fail(f"llama.cpp's gpt2 graph gives logits {logits_diff:.3g} from ember's (atol {atol})")
    print(json.dumps({"file": name, "metadata": len(keys), "tensors": len(r.tensors), "bytes_checked": n_bytes,
                      "reference_checked": n_ref, "q8_0_max_err_over_d": round(worst_q8, 6),
                      "logits_max_diff": logits_diff}))


def write_reference(path):
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_name("written by gguf-py")
    w.add_uint32("test.u32", 7)
    w.add_int32("test.i32", -5)
    w.add_float32("test.f32", 0.25)
    w.add_uint64("test.u64", 1 << 40)
    w.add_int64("test.i64", -(1 << 40))
    w.add_float64("test.f64", -1.5)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "h\u00e9llo")
    w.add_array("test.strs", ["a", "bc", ""])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -2.0])
    w.add_tensor("f32", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("f16", (np.arange(128, dtype=np.float32) / 8 - 7).astype(np.float16).reshape(4, 32))
    # Exact float32 arithmetic (a division by 3, correctly rounded in numpy and in C++ alike).
    src = (((np.arange(128) * 7) % 23 - 11).astype(np.float32) / np.float32(3)).reshape(2, 64)
    w.add_tensor("q8_0", gguf.quants.quantize(src, T.Q8_0), raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("WROTE")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "write"):
        print(__doc__)
        sys.exit(2)
    if sys.argv[1] == "write":
        write_reference(sys.argv[2])
        return
    failures = []
    files = sorted(glob.glob(os.path.join(sys.argv[2], "*.gguf")))
    if not files:
        failures.append(f"no .gguf files in {sys.argv[2]}")
    for path in files:
        try:
            check_file(path, failures)
        except Exception as e:  # noqa: BLE001 -- a reader error is a failure of that file
            failures.append(f"{os.path.basename(path)}: {type(e).__name__}: {e}")
    for f in failures:
        print("FAIL: " + f)
    if failures:
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
