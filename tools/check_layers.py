#!/usr/bin/env python3
"""Checks that ember's headers include only layers at or below their own (docs/architecture.md,
"Layers"): prints every include that runs upward, and exits 1 if there is any that is not one of
the named exceptions below. ctest runs it (headers.layers); by hand:
    python3 tools/check_layers.py [include-dir]      (--list: print the folder graph too)
"""
import os
import re
import sys

# Each folder of include/ember and the folders it may include (besides itself). core and
# autograd are one layer: the tensor handles need the tape and the tape needs complete handles.
ALLOWED = {
    "core": {"autograd"},
    "autograd": {"core"},
    "backend": {"core", "autograd"},
    "io": {"core", "autograd"},
    "ops": {"core", "autograd"},
    "optim": {"core", "autograd", "ops", "io"},
    "amp": {"core", "autograd", "ops", "optim"},
    "nn": {"core", "autograd", "ops", "optim", "amp", "io"},
    "quant": {"core", "autograd", "ops", "optim", "amp", "nn", "io"},
    "data": {"core", "autograd", "io"},
    "logging": {"core", "autograd", "io"},
    "profile": {"core", "autograd", "ops", "optim", "amp", "nn", "io", "logging"},
    "dist": {"core", "autograd", "ops", "optim", "amp", "nn", "io"},
    "deploy": {"core", "autograd", "ops", "optim", "amp", "nn", "io", "quant"},
    "train": {"core", "autograd", "ops", "optim", "amp", "nn", "io", "data", "logging", "profile", "dist"},
}
# The compiled library's units (EMBER_COMPILED_LIB) sit above every layer: each compiles the
# implementation of the layer it is named for.
ALLOWED["src"] = set(ALLOWED) | {"backend"}
# Includes that cross the order on purpose, each with its reason.
EXCEPTIONS = {
    # Header-only builds define the CPU backend where backend_for needs it; with separate
    # compilation the library holds it and this include is compiled out.
    ("ember/core/backend_registry.hpp", "ember/backend/cpu/cpu_backend.hpp"),
}
# Public API that lives with its backend: the CPU thread count, the CUDA runtime and NCCL for
# the GPU process group, the CPU kernel choice that ranks compare.
BACKEND_API = {"ember/backend/cpu/parallel.hpp", "ember/backend/cpu/gemm_choice.hpp",
               "ember/backend/cuda/runtime.hpp", "ember/backend/cuda/nccl.hpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](ember/[^">]+)[">]')


def folder(path):
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else None


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include")
    bad, known, graph = [], [], {}
    for d, _, files in os.walk(os.path.join(root, "ember")):
        for f in sorted(files):
            path = os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            src = folder(path)
            with open(os.path.join(d, f), errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if not m or src is None:
                        continue
                    dst = folder(m.group(1))
                    if dst is None or dst == src:
                        continue
                    graph.setdefault(src, set()).add(dst)
                    if (path, m.group(1)) in EXCEPTIONS:
                        known.append(f"{path}:{n} -> {m.group(1)}")
                    elif dst == "backend" and m.group(1) in BACKEND_API and src not in ("ops", "nn"):
                        continue
                    elif src not in ALLOWED:
                        bad.append(f"{path}:{n}: folder '{src}' has no place in the layer order (tools/check_layers.py)")
                    elif dst not in ALLOWED[src]:
                        bad.append(f"{path}:{n}: {src} includes {m.group(1)} ({dst} is not below {src})")
    if "--list" in sys.argv:
        for k in sorted(graph):
            print(f"{k} -> {', '.join(sorted(graph[k]))}")
    for k in known:
        print(f"allowed exception: {k}")
    for b in bad:
        print(b)
    print(f"check_layers: {len(bad)} include(s) against the layer order, {len(known)} named exception(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
