#!/usr/bin/env python3
"""What a checkpoint costs the training, synchronous against asynchronous (NOTE
[Asynchronous save] in checkpoint/sharded.h), on the main job's CPU configs b and c.

    bazel build -c opt //trainer:main_job
    python3 bench/checkpoint_cost.py [--runs 5] [--configs bc]

For each config, each run fits the same steps (the config's, times --steps_scale) three ways, in rotating order: without
checkpoints, with a synchronous checkpoint every steps / 8 steps, and with the same checkpoints
written in the background. What the saves cost the training is the fit's wall time up to its
last step (fit_seconds - fit_final_save_seconds: the save after the last step is committed
before Fit returns in both modes) minus that of the run without checkpoints, of the same
round. One JSON line per config: the medians, the theoretical floor of an asynchronous save's
cost (its snapshot: a copy of the rank's shards and optimizer state, at the host copy
bandwidth measured here) beside the synchronous cost, and async / sync as the ratio of the
median costs (the issue's target: at most 0.10). On a machine without spare cores the
background writer competes with the ranks for the CPU.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The main job's CPU configs (V T C L H B steps), as bench/cpu compares them.
CONFIGS = {"b": (256, 64, 128, 4, 4, 16, 40), "c": (512, 128, 256, 6, 8, 8, 12)}


def memcpy_bytes_per_second():
    """A rough host copy bandwidth: 256 MiB copied with bytes()."""
    block = bytearray(256 << 20)
    start = time.perf_counter()
    bytes(block)
    return len(block) / (time.perf_counter() - start)


def run(binary, config, every, mode, out, world_size):
    v, t, c, l, h, b, steps = config
    cmd = [binary, f"--vocab_size={v}", f"--seq_len={t}", f"--block_size={t}", f"--n_embd={c}",
           f"--n_layer={l}", f"--n_head={h}", f"--batch_size={b}", f"--steps={steps}",
           f"--world_size={world_size}", "--intra_op_threads=1", "--stages=fit", "--release=false",
           f"--output_dir={out}", f"--log_every={every}"]
    if mode != "none":
        cmd += [f"--checkpoint_every_steps={every}", "--keep_checkpoints=2"]
    if mode == "async":
        cmd.append("--async_checkpoints")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{mode}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--configs", default="bc")
    p.add_argument("--binary", default=os.path.join(ROOT, "bazel-bin/trainer/main_job"))
    p.add_argument("--world_size", type=int, default=2,
                   help="ranks (one intra-op thread each); fewer ranks than cores leaves the "
                        "background writer a core of its own")
    p.add_argument("--steps_scale", type=int, default=3,
                   help="fit the config's steps times this, saving 8 times per fit: a save's "
                        "cost is a small part of a fit's time, and more of them stand out of "
                        "the noise")
    args = p.parse_args()
    bandwidth = memcpy_bytes_per_second()
    for name in args.configs:
        config = CONFIGS[name][:-1] + (CONFIGS[name][-1] * args.steps_scale,)
        steps = config[-1]
        every = max(1, steps // 8)
        seconds = {"none": [], "sync": [], "async": []}
        state_bytes = 0
        modes = ["none", "sync", "async"]
        for r in range(args.runs):
            order = modes[r % 3:] + modes[:r % 3]
            with tempfile.TemporaryDirectory(prefix="checkpoint_cost_") as tmp:
                for mode in order:
                    s = run(args.binary, config, every, mode, os.path.join(tmp, mode),
                            args.world_size)
                    seconds[mode].append(s["fit_seconds"] - s["fit_final_save_seconds"])
                    peak = s["fit_peak_bytes_per_rank"][0]
                    state_bytes = peak["param"] + peak["optim"]
        saves = steps // every - 1  # the last one, after the last step, is not counted
        sync_cost = [s - n for s, n in zip(seconds["sync"], seconds["none"])]
        async_cost = [a - n for a, n in zip(seconds["async"], seconds["none"])]
        median_sync = statistics.median(sync_cost)
        median_async = statistics.median(async_cost)
        print(json.dumps({
            "config": name, "V_T_C_L_H_B": config[:6], "steps": steps, "saves": saves,
            "fit_seconds_median": {m: statistics.median(v) for m, v in seconds.items()},
            "save_cost_seconds_median": {"sync": median_sync, "async": median_async},
            "snapshot_floor_seconds": saves * state_bytes / bandwidth,
            "rank_state_bytes": state_bytes,
            "async_over_sync": median_async / median_sync if median_sync > 0 else None,
            "runs": args.runs, "world_size": args.world_size, "cores": os.cpu_count(),
        }))


if __name__ == "__main__":
    main()
