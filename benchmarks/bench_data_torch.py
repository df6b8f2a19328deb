#!/usr/bin/env python3
"""PyTorch twin of bench_data (not run by the tests; needs torch and Pillow).

Reads the PNG folder bench_data wrote (root/<label>/<index>.png) through torch.utils.data.DataLoader
with the same batch size and worker counts, and the same samples as in-memory tensors, and prints
samples per second in bench_data's JSON line format, for a side-by-side table.

  python3 benchmarks/bench_data_torch.py [--dir /tmp/ember_bench_data] [--samples 70000] [--batch 256] [--workers 0,1,2]

PyTorch's workers are processes (fork), ember's are threads; both decode with libpng.
"""
import argparse
import json
import os
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, TensorDataset


class PngFolder(Dataset):
    def __init__(self, root):
        self.items = []
        for label in sorted(os.listdir(root)):
            d = os.path.join(root, label)
            if not os.path.isdir(d):
                continue
            for f in sorted(os.listdir(d)):
                if f.endswith(".png"):
                    self.items.append((os.path.join(d, f), int(label)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        with Image.open(path) as im:
            a = np.asarray(im, dtype=np.uint8)
        return torch.from_numpy(a.copy()), label


def throughput(ds, workers, batch):
    g = torch.Generator()
    g.manual_seed(1)
    loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, generator=g,
                        persistent_workers=workers > 0, prefetch_factor=4 if workers > 0 else None)
    t0 = time.perf_counter()
    n = 0
    for x, y in loader:
        n += x.shape[0]
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/ember_bench_data")
    ap.add_argument("--samples", type=int, default=70000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", default="0,1,2")
    a = ap.parse_args()
    root = os.path.join(a.dir, "png_%d" % a.samples)
    if not os.path.exists(os.path.join(root, "done")):
        raise SystemExit("run bench_data --samples %d first (it writes %s)" % (a.samples, root))
    torch.set_num_threads(1)
    pngs = PngFolder(root)
    xs, ys = zip(*(pngs[i] for i in range(len(pngs))))
    memory = TensorDataset(torch.stack(xs), torch.tensor(ys))
    for source, ds in (("png", pngs), ("memory", memory)):
        for w in (int(v) for v in a.workers.split(",")):
            sps = throughput(ds, w, a.batch)
            print(json.dumps({"bench": "data_read_torch", "source": source, "workers": w, "batch": a.batch,
                              "samples": len(ds), "samples_per_second": round(sps, 1)}))


if __name__ == "__main__":
    main()
