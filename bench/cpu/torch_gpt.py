"""PyTorch side of the CPU benchmark (bench/cpu/README.md): trains the same GPT as
//integration:main_job over N local ranks (gloo), one intra-op thread each, fp32 AdamW, and
prints one JSON line: tokens/s over all ranks, parameter count, peak RSS per rank.

    $VENV/bin/python bench/cpu/torch_gpt.py --strategy=FSDP2 --vocab_size=64 --block_size=32 \
        --n_embd=64 --n_layer=2 --n_head=4 --batch_size=16 --steps=50

The model mirrors nn/gpt.cc, nn/transformer.cc and nn/attention.cc: token + learned
positional embeddings, pre-LN blocks (x + attn(ln_1(x)), h + mlp(ln_2(h))), causal
self-attention with a fused qkv Linear (bias) and an output projection (bias), MLP
C -> 4C -> C with GELU in its tanh form, final LayerNorm, lm_head tied to the token embedding
without a bias; LayerNorm eps 1e-5 with weight and bias. Cross-entropy over every position.
Strategies: FSDP2 (fully_shard on each block, then the root), DDP, FSDP1_SHARD_GRAD_OP
(FullyShardedDataParallel, SHARD_GRAD_OP, one unit per block plus the root) and NONE (one
process, no wrapper: a sanity check).

Timing matches StageRunner::Fit (integration/stage_runner.cc): from after wrapping and
creating the optimizer to the end of the last step (a barrier), every step included; tokens
= global batch x sequence length per step.
"""

import argparse
import json
import math
import os
import re
import resource
import socket
import sys
import time


def build_model(torch, nn, F, args):
    C, H = args.n_embd, args.n_head

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(C, 3 * C, bias=True)
            self.proj = nn.Linear(C, C, bias=True)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(x).split(C, dim=2)
            q = q.view(B, T, H, C // H).transpose(1, 2)
            k = k.view(B, T, H, C // H).transpose(1, 2)
            v = v.view(B, T, H, C // H).transpose(1, 2)
            # Explicit softmax attention as nn/attention.cc computes it (no fused SDPA
            # kernel, which our library does not have either).
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.proj(y)

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(C, 4 * C, bias=True)
            self.proj = nn.Linear(4 * C, C, bias=True)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.mlp = Mlp()

        def forward(self, x):
            h = x + self.attn(self.ln_1(x))
            return h + self.mlp(self.ln_2(h))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab_size, C)
            self.wpe = nn.Embedding(args.block_size, C)
            self.blocks = nn.ModuleList([Block() for _ in range(args.n_layer)])
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            self.lm_head = nn.Linear(C, args.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as Linear::Tied in nn/gpt.cc

        def forward(self, idx):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return Gpt, Block


def run_rank(rank, args, port, result_path):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    world = args.world_size
    if args.strategy != "NONE":
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    Gpt, Block = build_model(torch, nn, F, args)
    model = Gpt()
    for m in model.modules():  # GPT-2 style init (speed-irrelevant; keeps the loss sane)
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    # Unique parameters (the tied lm_head counted once), before any wrapper flattens them.
    n_params = sum(p.numel() for p in model.parameters())

    if args.strategy == "FSDP2":
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif args.strategy == "DDP":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    elif args.strategy == "FSDP1_SHARD_GRAD_OP":
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FullyShardedDataParallel(
            model, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
            auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=False,
            device_id=torch.device("cpu"))  # without it FSDP1 insists on an accelerator
    elif args.strategy != "NONE":
        raise SystemExit(f"torch_gpt.py: --strategy={args.strategy}: use FSDP2, DDP, "
                         "FSDP1_SHARD_GRAD_OP or NONE")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=False)

    local_batch = args.batch_size // world
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    batches = [torch.randint(0, args.vocab_size, (local_batch, args.seq_len + 1), generator=g)
               for _ in range(min(args.steps, 8))]
    if args.strategy != "NONE":
        dist.barrier()
    start = time.perf_counter()
    first_step_seconds = None
    loss = None
    for step in range(args.steps):
        if step == 1:
            first_step_seconds = time.perf_counter() - start
        data = batches[step % len(batches)]
        x, y = data[:, :-1], data[:, 1:]
        opt.zero_grad(set_to_none=False)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab_size), y.reshape(-1))
        loss.backward()
        opt.step()
    final_loss = float(loss.detach())
    if args.strategy != "NONE":
        dist.barrier()
    seconds = time.perf_counter() - start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    record = {"rank": rank, "seconds": seconds, "first_step_seconds": first_step_seconds, "n_params": n_params, "final_loss": final_loss,
              "peak_rss_bytes": peak_rss, "torch_version": torch.__version__,
              "blas": _blas_info(torch)}
    with open(f"{result_path}.{rank}", "w") as f:
        json.dump(record, f)
    if args.strategy != "NONE":
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", default="FSDP2")
    p.add_argument("--world_size", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--vocab_size", type=int, default=64)
    p.add_argument("--block_size", type=int, default=32)
    p.add_argument("--seq_len", type=int, default=0, help="default: --block_size")
    p.add_argument("--n_embd", type=int, default=64)
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=16, help="global sequences per step")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", default="", help="per-rank result file prefix (default: a temp)")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.seq_len == 0:
        args.seq_len = args.block_size
    if args.strategy == "NONE":
        args.world_size = 1
    if args.batch_size % args.world_size != 0:
        raise SystemExit(f"torch_gpt.py: --batch_size={args.batch_size} is not a multiple of "
                         f"--world_size={args.world_size}")
    if args.rank >= 0:  # one rank, started by the parent below
        run_rank(args.rank, args, args.port, args.result)
        return 0
    import subprocess
    import tempfile

    # The parent only starts the ranks (it never imports torch: one import fewer).
    result = args.result or os.path.join(tempfile.mkdtemp(prefix="torch_gpt_"), "rank")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *sys.argv[1:],
                               f"--rank={r}", f"--port={port}", f"--result={result}"])
             for r in range(args.world_size)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"torch_gpt.py: ranks exited with {codes}")
    ranks = []
    for r in range(args.world_size):
        with open(f"{result}.{r}") as f:
            ranks.append(json.load(f))
    seconds = max(r["seconds"] for r in ranks)
    tokens = args.steps * args.batch_size * args.seq_len
    out = {
        "side": "pytorch",
        "torch_version": ranks[0]["torch_version"],
        "strategy": args.strategy,
        "world_size": args.world_size,
        "threads_per_rank": args.threads,
        "steps": args.steps,
        "tokens_per_second": tokens / seconds,
        "seconds": seconds,
        "model_parameters": ranks[0]["n_params"],
        "final_loss": ranks[0]["final_loss"],
        "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in ranks],
        "first_step_seconds": max(r["first_step_seconds"] or 0 for r in ranks),
        "blas": ranks[0]["blas"],
    }
    print(json.dumps(out))


def _blas_info(torch):
    cfg = torch.__config__.show()
    keys = [line.strip(" -") for line in cfg.splitlines()
            if "Math Kernel Library" in line or "oneDNN" in line]
    blas = re.search(r"BLAS_INFO=(\w+)", cfg)
    if blas:
        keys.insert(0, "BLAS_INFO=" + blas.group(1))
    keys.append("mkldnn enabled: %s" % torch.backends.mkldnn.is_available())
    return "; ".join(keys)


if __name__ == "__main__":
    sys.exit(main())
