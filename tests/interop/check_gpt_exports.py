#!/usr/bin/env python3
"""The files examples/char_transformer wrote with --export and --gguf, opened by the reference
implementations: onnx's full checker and onnxruntime (token ids of two lengths in, logits of
[batch, length, vocabulary] out, finite), and gguf-py's reader (llama.cpp's gpt2 architecture, every
tensor readable). The numbers themselves are checked against ember in tests/test_onnx.cpp and
tests/test_gguf.cpp; this is the example's end-to-end run.

  python check_gpt_exports.py MODEL.onnx MODEL.gguf
Prints "SKIPPED: ..." without the packages, "OK" when every check passed; exits 1 otherwise.
"""
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from gguf import GGUFReader
except ImportError as e:
    print(f"SKIPPED: a reference package is not importable ({e})")
    sys.exit(0)


def main():
    onnx_path, gguf_path = sys.argv[1], sys.argv[2]
    onnx.checker.check_model(onnx_path, full_check=True)
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    reader = GGUFReader(gguf_path)
    fields = {k: f for k, f in reader.fields.items()}
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    vocab = int(fields["gpt2.vocab_size"].parts[-1][0]) if "gpt2.vocab_size" in fields else None
    for shape in ((1, 5), (3, 9)):
        ids = np.arange(np.prod(shape), dtype=np.int64).reshape(shape) % (vocab or 2)
        (logits,) = sess.run(None, {inp.name: ids})
        if logits.shape[:2] != shape or not np.all(np.isfinite(logits)):
            print(f"FAIL: logits {logits.shape} for ids {shape}")
            return 1
    names = [t.name for t in reader.tensors]
    if arch != "gpt2" or "token_embd.weight" not in names or logits.shape[2] != vocab:
        print(f"FAIL: architecture {arch}, tensors {names[:4]}..., vocabulary {vocab} vs logits {logits.shape}")
        return 1
    for t in reader.tensors:
        _ = np.asarray(t.data).sum()
    print(f"onnx: logits {logits.shape}; gguf: {arch}, {len(names)} tensors")
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
