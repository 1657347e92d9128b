"""PyTorch side of the CPU benchmark (bench/cpu/README.md): trains the same GPT as
//trainer:main_job over N local ranks (gloo), one intra-op thread each, fp32 AdamW, and
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

Started once, the ranks serve several trials (TorchRanks, used by run_bench.py), so the
seconds to a minute `import torch` takes on a loaded machine are paid once per benchmark.
Timing as StageRunner::Fit (integration/stage_runner.cc) times ours: from after wrapping and
creating the optimizer to the end of the last step (a barrier), tokens = global batch x
sequence length per step; except that tokens_per_second leaves out the first step, where
FSDP2 and FSDP1 run their lazy initialisation (the counterpart of our wrap, which is not
timed); tokens_per_second_incl_first_step keeps it. Our first step stays in our figure.
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


def _peak_rss_reset():
    # Resets VmHWM (Linux >= 4.0: "5" to clear_refs), so each trial reports its own peak.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def trial(args, rank, world):
    """Builds, wraps and trains the GPT of args on this rank; returns its figures."""
    import gc
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    gc.collect()
    _peak_rss_reset()
    torch.manual_seed(args.seed)
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
        raise ValueError(f"--strategy={args.strategy}: use FSDP2, DDP, FSDP1_SHARD_GRAD_OP or NONE")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=False)

    local_batch = args.batch_size // world
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    batches = [torch.randint(0, args.vocab_size, (local_batch, args.seq_len + 1), generator=g)
               for _ in range(min(args.steps, 8))]
    if world > 1:
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
    if world > 1:
        dist.barrier()
    seconds = time.perf_counter() - start
    record = {"rank": rank, "seconds": seconds, "first_step_seconds": first_step_seconds or 0.0,
              "n_params": n_params, "final_loss": final_loss,
              "peak_rss_bytes": _peak_rss_bytes(), "torch_version": torch.__version__,
              "blas": _blas_info(torch)}
    del model, opt, batches, loss
    return record


def serve_rank(args):
    """One rank: joins the group once, then runs one trial per JSON line on stdin (fields
    override the flags) and answers each with a RESULT line on stdout, until EOF."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    world = args.world_size
    # Also with one rank: fully_shard and DDP need a process group (the scaling section of
    # run_bench.py runs FSDP2 on 1 rank x 2 threads).
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=args.rank, world_size=world)
    print("READY", flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        t = argparse.Namespace(**{**vars(args), **json.loads(line)})
        if t.seq_len == 0:
            t.seq_len = t.block_size
        try:
            record = trial(t, args.rank, world)
        except Exception as e:  # reported to the parent, which fails the benchmark
            record = {"rank": args.rank, "error": f"{type(e).__name__}: {e}"}
        print("RESULT " + json.dumps(record), flush=True)
    dist.destroy_process_group()


class TorchRanks:
    """The PyTorch ranks, started once (importing torch takes seconds to a minute on a
    loaded machine) and reused for every trial; usable without torch in the caller.

        ranks = TorchRanks(python, world_size=2, threads=1)
        result = ranks.run(strategy="FSDP2", vocab_size=64, block_size=32, n_embd=64,
                           n_layer=2, n_head=4, batch_size=16, steps=50)
        ranks.close()
    """

    def __init__(self, python, world_size=2, threads=1):
        import subprocess
        self.world_size = world_size
        port = free_port()
        self.procs = [subprocess.Popen(
            [python, os.path.abspath(__file__), "--serve", f"--rank={r}", f"--port={port}",
             f"--world_size={world_size}", f"--threads={threads}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for r in range(world_size)]
        for p in self.procs:
            self._expect(p, "READY")

    def _expect(self, p, prefix):
        while True:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"torch_gpt.py: a rank exited (status {p.wait()}) "
                                   f"before answering {prefix}")
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def run(self, **fields):
        fields.setdefault("seq_len", 0)
        for p in self.procs:
            p.stdin.write(json.dumps(fields) + "\n")
            p.stdin.flush()
        ranks = [json.loads(self._expect(p, "RESULT")) for p in self.procs]
        for r in ranks:
            if "error" in r:
                raise RuntimeError(f"torch_gpt.py rank {r['rank']}: {r['error']}")
        seq_len = fields["seq_len"] or fields["block_size"]
        seconds = max(r["seconds"] for r in ranks)
        first = max(r["first_step_seconds"] for r in ranks)
        tokens_per_step = fields["batch_size"] * seq_len
        steps = fields["steps"]
        return {
            "side": "pytorch",
            "torch_version": ranks[0]["torch_version"],
            "strategy": fields["strategy"],
            "world_size": self.world_size,
            "steps": fields["steps"],
            # Without the first step: FSDP2 and FSDP1 initialise lazily in the first forward
            # (seconds), the counterpart of our wrap, which StageRunner::Fit does not time.
            "tokens_per_second": ((steps - 1) * tokens_per_step / (seconds - first)
                                  if steps > 1 and seconds > first else steps * tokens_per_step / seconds),
            "tokens_per_second_incl_first_step": steps * tokens_per_step / seconds,
            "seconds": seconds,
            "first_step_seconds": first,
            "model_parameters": ranks[0]["n_params"],
            "final_loss": ranks[0]["final_loss"],
            "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in ranks],
            "blas": ranks[0]["blas"],
        }

    def close(self):
        for p in self.procs:
            p.stdin.close()
        for p in self.procs:
            p.wait()


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
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve_rank(args)
        return 0
    if args.strategy == "NONE":
        args.world_size = 1
    if args.batch_size % args.world_size != 0:
        raise SystemExit(f"torch_gpt.py: --batch_size={args.batch_size} is not a multiple of "
                         f"--world_size={args.world_size}")
    ranks = TorchRanks(sys.executable, args.world_size, args.threads)
    try:
        fields = {k: getattr(args, k) for k in (
            "strategy", "vocab_size", "block_size", "seq_len", "n_embd", "n_layer", "n_head",
            "batch_size", "steps", "lr", "seed")}
        out = ranks.run(**fields)
        out["threads_per_rank"] = args.threads
        print(json.dumps(out))
    finally:
        ranks.close()
    return 0


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
