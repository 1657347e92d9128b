#!/usr/bin/env python3
"""Makes and checks the Hugging Face Llama test data of checkpoint/hf_llama_test.cc.

    python3 tools/hf/llama_testdata.py             # writes checkpoint/testdata/hf_llama/
    python3 tools/hf/llama_testdata.py --check     # regenerates elsewhere and compares; our export

It runs itself in the virtual environment tools/hf/gpt2_testdata.py uses (torch and
`transformers` from PyPI; nothing is downloaded from a model hub). The data: a tiny
LlamaForCausalLM (vocabulary 96, width 32, intermediate 64, 2 layers, 4 query heads
sharing 2 key/value heads, 32 positions, rope_theta 500000, rms_norm_eps 1e-5, lm_head
untied; eager attention) with random weights and RMSNorm scales (seed 0), saved with
save_pretrained (config.json, model.safetensors), and expected.safetensors: fixed input
ids [2, 16] and the logits transformers computes on them in float32. `make test` needs
none of this: the files are committed.

--check, without touching the committed files:
  1. regenerates the data in a temporary directory and compares it with the committed
     data (config.json field for field but transformers_version, every tensor bit for bit,
     the logits within 1e-6);
  2. builds //checkpoint:hf_llama_roundtrip, which loads a checkpoint into our nn::Llama
     and exports it in the Hugging Face layout (checkpoint/hf_llama.h), runs it on the
     committed checkpoint, loads the export with LlamaForCausalLM.from_pretrained and
     compares its logits with the committed ones;
  3. the same from a copy transformers saves sharded (model.safetensors.index.json and
     its shards), and from a model of the same shape with tied embeddings.
Each max |difference| is printed; exit 1 when any is above its bound (1e-5 for logits).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "checkpoint", "testdata", "hf_llama")
TOLERANCE = 1e-5

sys.path.insert(0, os.path.dirname(HERE))
import torch_venv  # noqa: E402


def make_model(tied=False, vocab_size=96):
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=tied,
        attention_bias=False, mlp_bias=False, attention_dropout=0.0, hidden_act="silu",
        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager")
    model = model.float().eval()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    with torch.no_grad():
        # Linear and embedding weights start at N(0, 0.02) and RMSNorm scales at 1; wider
        # weights make attention far from uniform and every scale matter.
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    return model


def input_ids(vocab_size=96):
    import torch

    return (torch.arange(2 * 16).reshape(2, 16) * 7 + 3) % vocab_size


def logits_of(model, ids):
    import torch

    with torch.no_grad():
        return model(ids.long()).logits.float().contiguous()


def make(out, tied=False, vocab_size=96):
    import torch
    import transformers
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    model = make_model(tied, vocab_size)
    model.save_pretrained(out, safe_serialization=True)
    extra = os.path.join(out, "generation_config.json")
    if os.path.exists(extra):
        os.remove(extra)
    ids = input_ids()
    save_file({"input_ids": ids.to(torch.int32).contiguous(), "logits": logits_of(model, ids)},
              os.path.join(out, "expected.safetensors"))
    print(f"wrote {out}: transformers {transformers.__version__}, torch {torch.__version__}")
    return model


def compare_with_committed(fresh, committed):
    """The regenerated data against the committed files; True when they agree."""
    from safetensors.torch import load_file

    ok = True
    with open(os.path.join(fresh, "config.json")) as f:
        a = json.load(f)
    with open(os.path.join(committed, "config.json")) as f:
        b = json.load(f)
    for c in (a, b):
        c.pop("transformers_version", None)
    if a != b:
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        print(f"config.json differs from the committed one in {keys}")
        ok = False
    mine, theirs = (load_file(os.path.join(d, "model.safetensors")) for d in (fresh, committed))
    if sorted(mine) != sorted(theirs):
        print(f"model.safetensors names differ: {sorted(set(mine) ^ set(theirs))}")
        ok = False
    unequal = [n for n in mine if n in theirs and not (
        mine[n].dtype == theirs[n].dtype and mine[n].shape == theirs[n].shape
        and bool((mine[n] == theirs[n]).all()))]
    if unequal:
        print(f"model.safetensors tensors differ from the committed ones: {unequal}")
        ok = False
    x, y = (load_file(os.path.join(d, "expected.safetensors")) for d in (fresh, committed))
    same_ids = bool((x["input_ids"] == y["input_ids"]).all())
    diff = (x["logits"] - y["logits"]).abs().max().item()
    print(f"regenerated vs committed: config.json {'same' if a == b else 'DIFFERENT'}, "
          f"{len(mine)} tensors {'bit for bit' if not unequal else 'DIFFERENT'}, "
          f"ids {'same' if same_ids else 'DIFFERENT'}, max |logits difference| = {diff:.3g}")
    return ok and same_ids and diff <= 1e-6


def roundtrip(source, what):
    """Our load + export of `source` (//checkpoint:hf_llama_roundtrip), loaded by
    transformers; the max |logits difference| against `source`'s expected logits."""
    import transformers
    from safetensors.torch import load_file

    exported = tempfile.mkdtemp(prefix="hf_llama_export_")
    subprocess.run(["bazel", "run", "--ui_event_filters=-info", "--noshow_progress",
                    "//checkpoint:hf_llama_roundtrip", "--", f"--from={source}",
                    f"--to={exported}"], cwd=ROOT, check=True)
    model = transformers.LlamaForCausalLM.from_pretrained(
        exported, attn_implementation="eager").float().eval()
    expected = load_file(os.path.join(source, "expected.safetensors"))
    diff = (logits_of(model, expected["input_ids"]) - expected["logits"]).abs().max().item()
    print(f"transformers on our export of {what} ({exported}): "
          f"max |logits - transformers' on the original| = {diff:.3g}")
    return diff


def check(out):
    from safetensors.torch import load_file, save_file

    ok = True
    fresh = tempfile.mkdtemp(prefix="hf_llama_regenerated_")
    model = make(fresh)
    ok &= compare_with_committed(fresh, out)

    ok &= roundtrip(out, "the committed checkpoint") <= TOLERANCE

    # transformers' own sharded layout: an index and several files.
    sharded = tempfile.mkdtemp(prefix="hf_llama_sharded_")
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="40KB")
    shards = [f for f in os.listdir(sharded) if f.endswith(".safetensors")]
    assert os.path.exists(os.path.join(sharded, "model.safetensors.index.json")), sharded
    save_file(load_file(os.path.join(out, "expected.safetensors")),
              os.path.join(sharded, "expected.safetensors"))
    ok &= roundtrip(sharded, f"a sharded copy ({len(shards)} files and the index)") <= TOLERANCE

    tied = tempfile.mkdtemp(prefix="hf_llama_tied_")
    make(tied, tied=True)
    ok &= roundtrip(tied, "a tied-embedding model") <= TOLERANCE
    print("check:", "OK" if ok else "FAILED")
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT)
    p.add_argument("--check", action="store_true")
    p.add_argument("--vocab_size", type=int, default=96,
                   help="96 for the test data; 256 for a tiny Llama over byte tokens "
                        "(tools/text_to_tokens.py)")
    p.add_argument("--in_venv", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if not args.in_venv:
        return torch_venv.rerun_in_venv(__file__)
    if args.check:
        return 0 if check(args.out) else 1
    make(args.out, vocab_size=args.vocab_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
