#!/usr/bin/env python3
"""Makes and checks the Hugging Face GPT-2 test data of checkpoint/hf_gpt2_test.cc.

    python3 tools/hf/gpt2_testdata.py              # writes checkpoint/testdata/hf_gpt2/
    python3 tools/hf/gpt2_testdata.py --check      # also: our export, loaded by transformers

It runs itself in a virtual environment with torch and `transformers` from PyPI (the
benchmarks' torch environment, bench/cpu/setup.sh torch, plus transformers; nothing is
downloaded from a model hub). The data: a tiny GPT2LMHeadModel (vocabulary 64, or
--vocab_size, 32 positions, width 32, 2 layers, 4 heads) with random weights, biases and LayerNorm affines
(seed 0), saved with save_pretrained (config.json, model.safetensors), and
expected.safetensors: fixed input ids [2, 16] and the logits transformers computes on them
in float32. `make test` needs none of this: the files are committed.

--check builds //checkpoint:hf_gpt2_roundtrip, which loads the committed checkpoint into
our Gpt and exports it in the Hugging Face layout (checkpoint/hf_gpt2.h), loads that
export with GPT2LMHeadModel.from_pretrained, and compares its logits with the committed
ones (max |difference| printed; exit 1 above 1e-5).
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "checkpoint", "testdata", "hf_gpt2")
sys.path.insert(0, os.path.dirname(HERE))
import torch_venv  # noqa: E402


def make(out, vocab_size=64):
    import torch
    import transformers
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=32, n_embd=32,
                                     n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=vocab_size - 1,
                                     eos_token_id=vocab_size - 1)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        # Biases and LayerNorm affines start at 0 and 1; make every tensor matter.
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    extra = os.path.join(out, "generation_config.json")
    if os.path.exists(extra):
        os.remove(extra)
    ids = (torch.arange(2 * 16).reshape(2, 16) * 7 + 3) % vocab_size
    with torch.no_grad():
        logits = model(ids).logits.float().contiguous()
    save_file({"input_ids": ids.to(torch.int32).contiguous(), "logits": logits},
              os.path.join(out, "expected.safetensors"))
    print(f"wrote {out}: transformers {transformers.__version__}, torch {torch.__version__}")


def check(out):
    import torch
    import transformers
    from safetensors.torch import load_file

    exported = tempfile.mkdtemp(prefix="hf_gpt2_export_")
    subprocess.run(["bazel", "run", "//checkpoint:hf_gpt2_roundtrip", "--", f"--from={out}",
                    f"--to={exported}"], cwd=ROOT, check=True)
    model = transformers.GPT2LMHeadModel.from_pretrained(exported).eval()
    expected = load_file(os.path.join(out, "expected.safetensors"))
    with torch.no_grad():
        logits = model(expected["input_ids"].long()).logits.float()
    diff = (logits - expected["logits"]).abs().max().item()
    print(f"transformers on our export ({exported}): max |logits - expected| = {diff:.3g}")
    return diff <= 1e-5


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT)
    p.add_argument("--check", action="store_true")
    p.add_argument("--vocab_size", type=int, default=64,
                   help="64 for the test data; 256 for a tiny GPT-2 over byte tokens "
                        "(tools/text_to_tokens.py)")
    p.add_argument("--in_venv", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if not args.in_venv:
        return torch_venv.rerun_in_venv(__file__)
    make(args.out, args.vocab_size)
    if args.check and not check(args.out):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
