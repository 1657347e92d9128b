"""PyTorch side of bench/activation_checkpointing.sh: the GPT of bench/cpu/torch_gpt.py (the
same model as nn/gpt.cc) trained on one process, fp32, AdamW, without and with
torch.utils.checkpoint around every block (non-reentrant, PyTorch's recommended mode), and
prints one JSON line with, per mode, the bytes allocated at the end of the forward and the
peak during a step (each above what was allocated before the step: activations, their
gradients and the temporaries; parameter gradients already exist, so they do not count),
and the median step time.

    $VENV/bin/python bench/activation_checkpointing_torch.py --n_layer=6 --batch=8

Memory comes from torch.profiler's allocation records (profile_memory=True): each op's own
net bytes, summed in the order the ops started (PyTorch keeps no allocation counters for CPU
tensors otherwise). A temporary freed inside the op that made it is not seen, so the peak is
a lower bound of PyTorch's.
"""

import argparse
import importlib.util
import json
import os
import statistics
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab_size", type=int, default=512)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--n_embd", type=int, default=256)
    p.add_argument("--n_layer", type=int, default=6)
    p.add_argument("--n_head", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=0, help="0: os.cpu_count()")
    args = p.parse_args()
    args.block_size = args.seq_len

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(args.threads or os.cpu_count())
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("torch_gpt", os.path.join(here, "cpu", "torch_gpt.py"))
    torch_gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(torch_gpt)
    Gpt, _ = torch_gpt.build_model(torch, nn, F, args)

    def make(checkpointed):
        torch.manual_seed(0)
        model = Gpt()
        if checkpointed:
            for block in model.blocks:
                plain_forward = block.forward
                block.forward = lambda x, f=plain_forward: checkpoint(f, x, use_reentrant=False)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    gen = torch.Generator().manual_seed(1)

    def batch():
        idx = torch.randint(0, args.vocab_size, (args.batch, args.seq_len + 1), generator=gen)
        return idx[:, :-1], idx[:, 1:]

    def step(model, opt, x, y):
        opt.zero_grad(set_to_none=False)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab_size), y.reshape(-1))
        del logits
        loss.backward()
        opt.step()

    def memory(model, opt, x, y):
        opt.zero_grad(set_to_none=False)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            logits = model(x)
            with record_function("forward_end"):
                pass
            loss = F.cross_entropy(logits.reshape(-1, args.vocab_size), y.reshape(-1))
            del logits
            loss.backward()
        events = sorted(prof.events(), key=lambda e: e.time_range.start)
        current = peak = held = 0
        for e in events:
            if e.name == "forward_end":
                held = current
            # Each allocation or free counts in the op that made it (self_cpu_memory_usage,
            # net within the op); "[memory]" events are those outside any op.
            current += e.self_cpu_memory_usage
            peak = max(peak, current)
        return held, peak

    plain = make(False)
    ckpt = make(True)
    times = {"plain": [], "checkpointed": []}
    for s in range(args.steps + 1):
        x, y = batch()
        for name, (model, opt) in (("plain", plain), ("checkpointed", ckpt)):
            t0 = time.perf_counter()
            step(model, opt, x, y)
            if s > 0:
                times[name].append(time.perf_counter() - t0)
    x, y = batch()
    out = {"benchmark": "activation_checkpointing_torch", "torch": torch.__version__,
           "threads": torch.get_num_threads(),
           "config": {k: getattr(args, k) for k in ("vocab_size", "seq_len", "n_embd", "n_layer",
                                                    "n_head", "batch", "steps")}}
    for name, (model, opt) in (("plain", plain), ("checkpointed", ckpt)):
        held, peak = memory(model, opt, x, y)
        out[name] = {"held_after_forward_bytes": held, "peak_bytes": peak,
                     "step_s_median": statistics.median(times[name])}
    out["peak_ratio_checkpointed_over_plain"] = out["checkpointed"]["peak_bytes"] / out["plain"]["peak_bytes"]
    out["step_time_ratio"] = out["checkpointed"]["step_s_median"] / out["plain"]["step_s_median"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
