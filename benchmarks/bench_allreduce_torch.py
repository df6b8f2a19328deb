#!/usr/bin/env python3
"""PyTorch twin of ember's bench_allreduce_nccl (benchmarks/bench_allreduce.cpp): torch.distributed
all_reduce over NCCL, float32 sum, in place, one process per GPU, with the same sizes, iteration
counts, warm-up, check and columns, so that one run on a GPU machine compares ember's NCCL process
group with PyTorch's:

  torchrun --standalone --nproc_per_node=N benchmarks/bench_allreduce_torch.py [--max-bytes 256M]
  mpirun -np N build/benchmarks/bench_allreduce_nccl [--max-bytes 256M]

Without torchrun it runs one rank on cuda:0. Never run by the tests.

algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (as nccl-tests; 0 for one rank). Per size: 5
warm-up all-reduces of ones (then every element must be n^5: checked with min/max on the GPU),
then `iters` all-reduces of zeros issued with async_op=True between a barrier and the host clock,
and a wait for all of them plus torch.cuda.synchronize(); time = the slowest rank's average per
all_reduce. A wrong value on any rank prints WRONG and makes the exit status 1.
"""
import argparse
import datetime
import os
import re
import sys
import time

WARMUP = 5


def parse_bytes(s):
    """4096, 4K, 64M, 1G (binary multiples; a trailing B or iB is allowed), as bench_allreduce."""
    m = re.fullmatch(r"(\d+)([KMG]?)(I?B)?", s.strip().upper())
    if not m or int(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive size: {s!r}")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def iters_for(args, nbytes):
    if args.iters:
        return args.iters
    return max(5, min(200, (512 << 20) // nbytes))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-bytes", type=parse_bytes, default=4 << 10)
    ap.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    ap.add_argument("--iters", type=int, default=0, help="timed iterations per size (default: 512 MiB / size, in [5, 200])")
    args = ap.parse_args()
    if args.min_bytes < 4 or args.max_bytes < args.min_bytes:
        ap.error("need 4 <= --min-bytes <= --max-bytes")
    if args.iters < 0:
        ap.error("--iters must be positive")

    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print(f"bench_allreduce_torch: error: PyTorch is not importable ({e})", file=sys.stderr)
        return 1

    if not torch.cuda.is_available():
        print("bench_allreduce_torch: error: no CUDA device is visible (NCCL needs a GPU)", file=sys.stderr)
        return 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= torch.cuda.device_count():
        print(f"bench_allreduce_torch: error: local rank {local_rank} needs cuda:{local_rank} but only "
              f"{torch.cuda.device_count()} GPU(s) are visible", file=sys.stderr)
        return 1
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    timeout = datetime.timedelta(minutes=2)
    if "WORLD_SIZE" in os.environ:  # torchrun (or any launcher that sets the env:// variables)
        dist.init_process_group("nccl", timeout=timeout)
    else:  # one rank, no launcher
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    rank, n = dist.get_rank(), dist.get_world_size()

    if rank == 0:
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            nccl = "?"
        s = "" if n == 1 else "s"
        print(f"# torch bench_allreduce: NCCL backend (NCCL {nccl}, torch {torch.__version__}), {n} rank{s}, "
              f"one process per GPU (cuda:<local rank>), GPU of rank 0: cuda:{local_rank} "
              f"{torch.cuda.get_device_name(dev)}; float32 sum, in place, CUDA tensors; time: host clock, "
              f"issue to synchronize, max over ranks")
        print("# %12s %12s %8s %12s %10s %10s %8s" % ("size(B)", "count", "iters", "time(us)", "algbw(GB/s)",
                                                       "busbw(GB/s)", "check"))
        sys.stdout.flush()

    all_ok = True
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        count = nbytes // 4
        iters = iters_for(args, nbytes)
        t = torch.ones(count, dtype=torch.float32, device=dev)
        for _ in range(WARMUP):
            dist.all_reduce(t)
        want = float(n) ** WARMUP
        lo, hi = t.min().item(), t.max().item()
        ok = abs(lo - want) <= 1e-6 * want and abs(hi - want) <= 1e-6 * want
        del t
        fill = torch.zeros(count, dtype=torch.float32, device=dev)
        torch.cuda.synchronize()
        dist.barrier(device_ids=[local_rank])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        works = [dist.all_reduce(fill, async_op=True) for _ in range(iters)]
        for w in works:
            w.wait()
        torch.cuda.synchronize()
        secs = (time.perf_counter() - t0) / iters
        del works, fill
        worst = torch.tensor([secs, 0.0 if ok else 1.0], dtype=torch.float64, device=dev)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        secs, wrong = worst.tolist()
        all_ok = all_ok and wrong == 0.0
        if rank == 0:
            algbw = nbytes / secs / 1e9
            busbw = algbw * 2.0 * (n - 1) / n
            print("  %12d %12d %8d %12.1f %10.2f %10.2f %8s" % (nbytes, count, iters, secs * 1e6, algbw, busbw,
                                                                "ok" if wrong == 0.0 else "WRONG"))
            sys.stdout.flush()
        nbytes *= 2
    dist.destroy_process_group()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
