#!/usr/bin/env python3
"""PyTorch FSDP2 peer benchmark: the GPT of nn/gpt.h trained with fully_shard.

The model is the same definition as our nn::Gpt (nanoGPT's GPT-2 without dropout): learned
token and position embeddings, n_layer pre-LN blocks (h = x + attn(ln_1(x)),
y = h + mlp(ln_2(h))), causal self-attention with a fused qkv Linear(C, 3C) and a
Linear(C, C) projection (both with biases), an MLP Linear(C, 4C) -> GELU (tanh form) ->
Linear(4C, C), a final LayerNorm (eps 1e-5), and lm_head tied to the token embedding
(no bias). Initialisation as GPT-2: N(0, 0.02), the two "proj" weights
N(0, 0.02 / sqrt(2 n_layer)), biases 0.

Sharding is FSDP2: `fully_shard` on every block, then on the root, with
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) under --param_dtype=bfloat16.
The optimizer is torch.optim.AdamW(fused=True) (falls back to foreach, and says so in the
JSON, if this PyTorch cannot run the fused kernel on sharded parameters). Data: uniform
random tokens drawn on the device (the cost of the step does not depend on the data).

Timing, as our main job's device_timed figure: the first --warmup steps (at least one) are
not timed; then CUDA events on the current stream, one before the first timed step's work
and one after each timed step's, time --steps steps without a host wait between them.
step_ms_median and step_ms_mean are over those steps; tokens_per_s is the timed tokens over
the events' total time (first to last event), which is the mean step, not the median.
wall_tokens_per_s is the same tokens over the host clock (from the first timed step's launch
to a synchronize after the last), for comparison.

  python3 bench/pytorch_fsdp2.py                        # one process, GPT-2 124M, 1 GPU
  python3 bench/pytorch_fsdp2.py --batch_size=16 --steps=20 --warmup=5
  torchrun --nproc_per_node=8 bench/pytorch_fsdp2.py --batch_size=64

--batch_size is the global batch (sequences per step over all ranks, a multiple of the
world size), as in our main job. Run alone, the script initialises a world-size-1 NCCL
process group itself over a free TCP port on 127.0.0.1; under torchrun it uses torchrun's
environment. Prints one JSON line on stdout from rank 0: tokens/s (all ranks), step times
and the timing basis, peak device memory per rank, the config, versions.
"""

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab_size", type=int, default=50304)
    p.add_argument("--block_size", type=int, default=1024, help="context length (positions)")
    p.add_argument("--seq_len", type=int, default=0, help="tokens per sequence (0: block_size)")
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--n_head", type=int, default=12)
    p.add_argument("--batch_size", type=int, default=16, help="global sequences per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before the timed ones")
    p.add_argument("--param_dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile each block (off by default)")
    p.add_argument("--peak_tflops", type=float, default=0.0,
                   help="device peak dense bf16 TFLOP/s for the MFU figure (0: guess from the GPU name)")
    args = p.parse_args(argv)
    if args.seq_len == 0:
        args.seq_len = args.block_size
    for name in ("vocab_size", "block_size", "seq_len", "n_embd", "n_layer", "n_head", "batch_size", "steps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name}={getattr(args, name)}: must be positive")
    if args.warmup < 0:
        p.error(f"--warmup={args.warmup}: must be >= 0")
    if args.seq_len > args.block_size:
        p.error(f"--seq_len={args.seq_len}: must be at most --block_size={args.block_size}")
    if args.n_embd % args.n_head != 0:
        p.error(f"--n_embd={args.n_embd} is not a multiple of --n_head={args.n_head}")
    return args


TIMING_BASIS = ("CUDA events on the current stream, one before the first timed step and one "
                "after each, no host wait between steps; tokens_per_s = timed tokens / (last "
                "event - first event)")

# Dense bf16 peak TFLOP/s (no sparsity) by GPU name, for the MFU figure.
PEAK_BF16_TFLOPS = [("H200", 989.0), ("H100", 989.0), ("GH200", 989.0), ("A100", 312.0),
                    ("B200", 2250.0), ("L40S", 362.0)]


def peak_tflops_for(name, override):
    if override > 0:
        return override
    for key, value in PEAK_BF16_TFLOPS:
        if key in name:
            return value
    return 0.0


def flops_per_token(args, n_params):
    """Training FLOPs per token, nanoGPT's estimate_mfu (PaLM appendix B): 6 N over all N
    parameters, plus 12 L T C for q k^T and att v (forward and backward, causal not halved)."""
    return 6.0 * n_params + 12.0 * args.n_layer * args.seq_len * args.n_embd


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(args, torch, nn, F):
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_head = args.n_head
            self.qkv = nn.Linear(args.n_embd, 3 * args.n_embd)
            self.proj = nn.Linear(args.n_embd, args.n_embd)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(c, dim=2)
            q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(args.n_embd, 4 * args.n_embd)
            self.proj = nn.Linear(4 * args.n_embd, args.n_embd)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(args.n_embd, eps=1e-5)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(args.n_embd, eps=1e-5)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab_size, args.n_embd)
            self.wpe = nn.Embedding(args.block_size, args.n_embd)
            self.blocks = nn.ModuleList([Block() for _ in range(args.n_layer)])
            self.ln_f = nn.LayerNorm(args.n_embd, eps=1e-5)
            self.lm_head = nn.Linear(args.n_embd, args.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():
                if name.endswith("proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * args.n_layer))
                elif name.endswith("weight") and p.dim() == 2:
                    nn.init.normal_(p, mean=0.0, std=0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)
                # LayerNorm weights keep their default 1.

        def forward(self, tokens, targets):
            t = tokens.shape[1]
            pos = torch.arange(t, device=tokens.device)
            x = self.wte(tokens) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return Gpt()


def time_steps(torch, step, steps):
    """Runs `steps` calls of step() between CUDA events on the current stream: one before
    the first call's work, one after each call's, no host wait in between. Returns each
    step's milliseconds (in order), the milliseconds from the first event to the last, the
    host clock's seconds from the first launch to a synchronize after the last step, and the
    steps' losses."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    losses = []
    start = time.perf_counter()
    events[0].record()
    for i in range(steps):
        losses.append(step().detach())
        events[i + 1].record()
    torch.cuda.synchronize()
    wall_seconds = time.perf_counter() - start
    step_ms = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
    return step_ms, events[0].elapsed_time(events[-1]), wall_seconds, losses


def timing_figures(step_ms, total_ms, wall_seconds, timed_tokens):
    """The JSON's timing keys: tokens/s over the events' total time (the mean step), the
    median and mean step, and the host clock's tokens/s beside them."""
    return {"tokens_per_s": timed_tokens / (total_ms / 1e3),
            "step_ms_median": statistics.median(step_ms),
            "step_ms_mean": total_ms / len(step_ms),
            "step_ms_min": min(step_ms),
            "timing_basis": TIMING_BASIS,
            "wall_tokens_per_s": timed_tokens / wall_seconds}


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # PyTorch before 2.6 kept FSDP2 here
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "pytorch_fsdp2: torch.cuda.is_available() is False"}))
        return 2
    standalone = "RANK" not in os.environ
    if standalone:
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group(backend="nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world != 0:
        if rank == 0:
            print(json.dumps({"ok": False, "error": f"pytorch_fsdp2: --batch_size={args.batch_size} "
                                                    f"is not a multiple of the world size {world}"}))
        dist.destroy_process_group()
        return 2
    local_batch = args.batch_size // world

    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False  # as our fp32 GEMMs (CUBLAS_COMPUTE_32F)
    torch.backends.cudnn.allow_tf32 = False
    with torch.device(device):
        model = build_model(args, torch, nn, F)
    n_params = sum(p.numel() for p in model.parameters())  # the tied weight counted once

    bf16 = args.param_dtype == "bfloat16"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else torch.float32,
                              reduce_dtype=torch.float32)
    for block in model.blocks:
        if args.compile:
            block.compile()
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)

    def make_adamw(fused):
        kind = {"fused": True} if fused else {"foreach": True}
        return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                                 betas=(0.9, 0.999), eps=1e-8, **kind)

    optimizer_impl = "fused"
    try:
        opt = make_adamw(True)
    except (RuntimeError, ValueError, TypeError) as e:
        optimizer_impl = f"foreach (fused refused: {e})"
        opt = make_adamw(False)

    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed * 1000 + rank)

    def step():
        tokens = torch.randint(0, args.vocab_size, (local_batch, args.seq_len + 1),
                               device=device, generator=gen)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    # The first step, untimed even with --warmup=0: a fused AdamW this PyTorch cannot run on
    # sharded parameters fails here, and the foreach one replaces it.
    try:
        step()
        torch.cuda.synchronize()
    except (RuntimeError, NotImplementedError) as e:
        if optimizer_impl != "fused":
            raise
        optimizer_impl = f"foreach (fused failed: {str(e).splitlines()[0][:200]})"
        opt.zero_grad(set_to_none=True)
        opt = make_adamw(False)
        step()
    for _ in range(max(0, args.warmup - 1)):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    dist.barrier()
    step_ms, total_ms, wall_seconds, losses = time_steps(torch, step, args.steps)
    dist.barrier()
    peak = torch.cuda.max_memory_allocated(device)
    peak_reserved = torch.cuda.max_memory_reserved(device)

    timing = timing_figures(step_ms, total_ms, wall_seconds,
                            args.steps * args.batch_size * args.seq_len)
    tokens_per_s = timing["tokens_per_s"]
    gpu_name = torch.cuda.get_device_name(device)
    peak_tflops = peak_tflops_for(gpu_name, args.peak_tflops)
    achieved_tflops = flops_per_token(args, n_params) * tokens_per_s / world / 1e12
    result = {
        "ok": True,
        "framework": "pytorch_fsdp2",
        **timing,
        "tokens_per_s_per_gpu": tokens_per_s / world,
        "timed_steps": args.steps,
        "warmup_steps": args.warmup,
        "peak_device_memory_bytes": peak,
        "peak_device_memory_reserved_bytes": peak_reserved,
        "tflops_per_gpu": achieved_tflops,
        "mfu": achieved_tflops / peak_tflops if peak_tflops > 0 else None,
        "peak_tflops_assumed": peak_tflops or None,
        "final_loss": float(losses[-1]) if losses else None,
        "model_parameters": n_params,
        "config": {"vocab_size": args.vocab_size, "block_size": args.block_size,
                   "seq_len": args.seq_len, "n_embd": args.n_embd, "n_layer": args.n_layer,
                   "n_head": args.n_head, "batch_size": args.batch_size,
                   "param_dtype": args.param_dtype, "reduce_dtype": "float32",
                   "optimizer": "AdamW " + optimizer_impl, "compile": args.compile,
                   "attention": "F.scaled_dot_product_attention(is_causal=True)"},
        "world_size": world,
        "gpu": gpu_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
    }
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
