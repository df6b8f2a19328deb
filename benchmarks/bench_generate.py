#!/usr/bin/env python3
"""Hugging Face transformers' half of bench_generate.cpp (same model folder, prompt, timing rule):
greedy generate() of batch 1 with its KV cache, tokens/s = new tokens / wall time of the call,
the median of --runs calls after one warm-up. Needs torch and transformers.

  python bench_generate.py --make DIR          GPT2LMHeadModel(GPT2Config()) with random weights
                                               (GPT-2 124M's shapes), saved by save_pretrained
  python bench_generate.py --model DIR --threads N --prompt-ids <bench_generate's line> [--new 64 --runs 3]
--prompt-ids takes the ids bench_generate prints (ember's Philox draws), so both sides decode the
same prompt and their greedy tokens can be compared; without it, --prompt random ids from torch.
"""
import argparse
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make")
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-ids", required=False, help="comma-separated ids (ember's prompt)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if a.make:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(bos_token_id=None, eos_token_id=None))
        model.save_pretrained(a.make, safe_serialization=True)
        print(f"wrote {a.make}: {sum(p.numel() for p in model.parameters())} parameters")
        return
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    model = GPT2LMHeadModel.from_pretrained(a.model).eval()
    print(f"transformers load {a.model}: {time.perf_counter() - t0:.2f} s")
    if a.prompt_ids:
        ids = torch.tensor([[int(x) for x in a.prompt_ids.split(",")]])
    else:
        ids = torch.randint(0, model.config.vocab_size, (1, a.prompt), generator=torch.Generator().manual_seed(0))
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=a.new, min_new_tokens=a.new,
              use_cache=True, pad_token_id=0)
    with torch.inference_mode():
        out = model.generate(ids, **kw)  # warm-up
        tps = []
        for _ in range(a.runs):
            s = time.perf_counter()
            out = model.generate(ids, **kw)
            tps.append(a.new / (time.perf_counter() - s))
    print(f"transformers kv-cache threads={a.threads} tokens/s={statistics.median(tps):.2f} "
          f"(runs: {' '.join(f'{t:.2f}' for t in tps)})")
    print("transformers tokens:", " ".join(str(int(t)) for t in out[0, ids.shape[1]:ids.shape[1] + 8]), "...")


if __name__ == "__main__":
    main()
