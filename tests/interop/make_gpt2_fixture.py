#!/usr/bin/env python3
"""Makes tests/interop/gpt2_tiny/ with Hugging Face transformers, for tests/test_gpt.cpp: a tiny
GPT2LMHeadModel with random weights, saved by save_pretrained, and what transformers computes
with it. The C++ tests read these files only; they never need Python, torch or transformers.

  python tests/interop/make_gpt2_fixture.py [out_dir]        (default: this folder's gpt2_tiny)
  python tests/interop/make_gpt2_fixture.py --check DIR      (transformers loads what
                                                              nn::GPT::save_huggingface wrote)

Needs torch and transformers (pip install torch transformers into a throwaway venv).

gpt2_tiny/config.json, gpt2_tiny/model.safetensors
    save_pretrained's own files (transformers' names, Conv1D weights [in, out], no
    lm_head.weight: tied) of GPT2Config(vocab_size=64, n_positions=32, n_layer=2, n_head=2,
    n_embd=32) with every parameter drawn at random (torch.manual_seed(0)), LayerNorm weights
    and biases included, so that a name or a transpose mixed up in the mapping changes the logits.
gpt2_tiny/reference.safetensors
    input_ids  int64 [2, 12]      two fixed token sequences
    logits     float32 [2, 12, 64]  model.eval()(input_ids).logits
    generated  int64 [2, 20]      model.generate(input_ids, do_sample=False, max_new_tokens=8):
                                  greedy, with transformers' KV cache
    The prompts are chosen (the first seed from 0 up) so that at every greedy step the best logit
    leads the second by at least 1e-3: rounding cannot flip the argmax between implementations.
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, POSITIONS, LAYERS, HEADS, EMBD = 64, 32, 2, 2, 32
PROMPT_LEN, NEW_TOKENS = 12, 8


def make_model():
    torch.manual_seed(0)
    # No bos/eos: GPT-2's 50256 is outside this vocabulary, and generate() must not stop early.
    config = GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD,
                        bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():  # lm_head.weight is wte's: not listed twice
            if name.endswith("wte.weight"):
                p.copy_(torch.randn_like(p) * 0.5)
            elif ".ln_" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    return model.eval()


def greedy_margin(model, ids):
    """The smallest lead of the best logit over the second best along greedy decoding."""
    margin = float("inf")
    with torch.no_grad():
        seq = ids
        for _ in range(NEW_TOKENS):
            last = model(seq).logits[:, -1, :]
            top = torch.topk(last, 2, dim=-1).values
            margin = min(margin, float((top[:, 0] - top[:, 1]).min()))
            seq = torch.cat([seq, last.argmax(-1, keepdim=True)], dim=1)
    return margin


def make(out_dir):
    model = make_model()
    for seed in range(100):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB, (2, PROMPT_LEN), generator=g)
        margin = greedy_margin(model, ids)
        if margin >= 1e-3:
            break
    else:
        sys.exit("no prompt with greedy margins >= 1e-3 among seeds 0-99")
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    gen_config = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen_config):
        os.remove(gen_config)  # not read by ember; the fixture keeps what it tests
    with torch.no_grad():
        logits = model(ids).logits.float().contiguous()
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=NEW_TOKENS, use_cache=True, pad_token_id=0)
    save_file({"input_ids": ids.contiguous(), "logits": logits, "generated": generated.contiguous()},
              os.path.join(out_dir, "reference.safetensors"),
              metadata={"prompt_seed": str(seed), "greedy_margin": repr(margin),
                        "torch": torch.__version__, "transformers": __import__("transformers").__version__})
    print(f"wrote {out_dir}: prompt seed {seed}, smallest greedy margin {margin:.3g}")


def check(saved_dir):
    """transformers loads the folder nn::GPT::save_huggingface wrote; its logits for the
    reference prompts match the fixture's reference logits."""
    from safetensors.torch import load_file
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_tiny")
    ref = load_file(os.path.join(here, "reference.safetensors"))
    model = GPT2LMHeadModel.from_pretrained(saved_dir).eval()
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "head not tied"
    with torch.no_grad():
        logits = model(ref["input_ids"]).logits
    diff = float((logits - ref["logits"]).abs().max())
    print(f"transformers read {saved_dir}: max |logits - reference| = {diff:.3g}")
    if diff > 1e-5:
        sys.exit("FAILED")
    print("OK")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        make(sys.argv[1] if len(sys.argv) > 1 else
             os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_tiny"))
