#!/usr/bin/env python3
"""PyTorch SDPA on the problem bench/attention_bench.cc times: causal self-attention, bf16.

q, k and v are [B, H, T, D] bf16 normal(0, 1) tensors on the GPU with requires_grad, and
the call is torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) (scale
1/sqrt(D), as ours). For each backend among FLASH_ATTENTION, CUDNN_ATTENTION and
EFFICIENT_ATTENTION (forced with torch.nn.attention.sdpa_kernel([backend])): --warmup
untimed calls, then --reps calls of the forward alone and --reps of forward + backward
(torch.autograd.grad with a fixed bf16 gradient of the output), each between two CUDA
events; the median of each. backward_ms = the median of forward + backward minus the
forward's.

FLOPs are attention_bench's model FLOPs, so the TFLOP/s compare: with P = T (T + 1) / 2
causal (query, key) pairs per head, forward 4 B H P D, backward 10 B H P D.

  python3 bench/attention_torch.py
  python3 bench/attention_torch.py --batch=4 --seq_len=2048 --reps=50

Prints one JSON line, last on stdout: {"attention_torch":1, "ok", "torch", "cuda", "gpu",
"shape", "flops", "backends": {"flash": {"ok", "forward_ms", "fwd_bwd_ms", "backward_ms",
"forward_tflops", "backward_tflops", "error"}, "cudnn": ..., "efficient": ...}}. A backend
that fails (or that this PyTorch lacks) has ok false and its error; the others still run.
Exit status: 0 when at least one backend ran; 1 without PyTorch, without CUDA or when none
ran; 2 for bad arguments.
"""

import argparse
import json
import statistics
import sys

# Our names for the SDPBackend members, in the order they run.
BACKENDS = [("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"),
            ("efficient", "EFFICIENT_ATTENTION")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16, help="sequences (B)")
    p.add_argument("--seq_len", type=int, default=1024, help="tokens per sequence (T)")
    p.add_argument("--n_head", type=int, default=12, help="heads (H)")
    p.add_argument("--head_dim", type=int, default=64, help="head width (D)")
    p.add_argument("--reps", type=int, default=20, help="timed calls per measurement")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before them")
    args = p.parse_args(argv)
    for name in ("batch", "seq_len", "n_head", "head_dim", "reps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name}={getattr(args, name)}: must be positive")
    if args.warmup < 0:
        p.error(f"--warmup={args.warmup}: must be >= 0")
    return args


def model_flops(args):
    """Forward and backward FLOPs over the batch (attention_bench's model FLOPs)."""
    pairs = args.seq_len * (args.seq_len + 1) // 2
    per_product = args.batch * args.n_head * pairs * args.head_dim
    return {"forward_model": 4.0 * per_product, "backward_model": 10.0 * per_product}


def shape_of(args):
    return {"B": args.batch, "T": args.seq_len, "H": args.n_head, "head_dim": args.head_dim,
            "reps": args.reps, "warmup": args.warmup}


def first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def median_ms(torch, fn, warmup, reps):
    """The median time of `reps` calls of fn, each between two CUDA events, after `warmup`."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, stop in zip(starts, stops):
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) for start, stop in zip(starts, stops))


def bench_backend(torch, backend, q, k, v, gy, args, flops):
    from torch.nn.attention import sdpa_kernel
    F = torch.nn.functional

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward():
        y = forward()
        return torch.autograd.grad(y, (q, k, v), gy)

    with sdpa_kernel([backend]):
        fwd = median_ms(torch, forward, args.warmup, args.reps)
        both = median_ms(torch, forward_backward, args.warmup, args.reps)
    bwd = both - fwd
    return {"ok": True, "forward_ms": fwd, "fwd_bwd_ms": both, "backward_ms": bwd,
            "forward_tflops": flops["forward_model"] / (fwd * 1e-3) / 1e12,
            "backward_tflops": flops["backward_model"] / (bwd * 1e-3) / 1e12 if bwd > 0 else None,
            "error": None}


def main(argv=None):
    args = parse_args(argv)
    flops = model_flops(args)
    out = {"attention_torch": 1, "ok": False, "error": None, "shape": shape_of(args),
           "flops": flops}

    def fail(error):
        out["error"] = error
        print(json.dumps(out), flush=True)
        return 1

    try:
        import torch
    except ImportError as e:
        return fail(f"attention_torch: no PyTorch ({e})")
    out.update({"torch": torch.__version__, "cuda": torch.version.cuda})
    if not torch.cuda.is_available():
        return fail("attention_torch: torch.cuda.is_available() is False")
    out["gpu"] = torch.cuda.get_device_name(0)
    try:
        from torch.nn.attention import SDPBackend
    except ImportError as e:
        return fail(f"attention_torch: no torch.nn.attention.SDPBackend ({e})")

    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    dims = (args.batch, args.n_head, args.seq_len, args.head_dim)
    q, k, v = (torch.randn(dims, device="cuda", dtype=torch.bfloat16, generator=gen)
               .requires_grad_() for _ in range(3))
    gy = torch.randn(dims, device="cuda", dtype=torch.bfloat16, generator=gen)

    backends = {}
    for name, member in BACKENDS:
        backend = getattr(SDPBackend, member, None)
        if backend is None:
            backends[name] = {"ok": False, "error": f"this PyTorch has no SDPBackend.{member}"}
            continue
        try:
            backends[name] = bench_backend(torch, backend, q, k, v, gy, args, flops)
        except Exception as e:  # a backend that refuses the problem or fails: the others go on
            backends[name] = {"ok": False, "error": first_line(e)}
            try:
                torch.cuda.synchronize()
            except Exception as sticky:  # the device itself failed: nothing more can run
                out["backends"] = backends
                return fail(f"attention_torch: the device after {name}'s error: "
                            f"{first_line(sticky)}")
        r = backends[name]
        if r["ok"]:
            print(f"attention_torch: {name}: forward {r['forward_ms']:.4f} ms "
                  f"({r['forward_tflops']:.1f} TFLOP/s), backward {r['backward_ms']:.4f} ms",
                  file=sys.stderr)
        else:
            print(f"attention_torch: {name}: {r['error']}", file=sys.stderr)
    out["backends"] = backends
    if not any(r["ok"] for r in backends.values()):
        return fail("attention_torch: no backend ran")
    out["ok"] = True
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
