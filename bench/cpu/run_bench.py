"""CPU benchmark, our library against PyTorch (issue 12 item 1; bench/cpu/README.md).

Run through bench/cpu/run.sh, which builds //trainer:main_job with -c opt and the
PyTorch virtual environment first. For each GPT config and strategy pair it alternates runs
(ours, theirs, ours, ...), takes the median tokens/s of each side and prints one JSON
document (and, after every strategy pair, what is done so far in <--out>/partial.json):
tokens/s, the ratio ours / theirs, peak memory by tag (ours, from main_job's
summary.json) and peak RSS (theirs), parameter counts (checked equal: the script exits 1
if they differ), the load average before and after every run, and the GEMM library each
side uses (ours: main_job's summary, e.g. "oneDNN 2.6.3 (isa avx2)").

Pairs: our FULL_SHARD vs PyTorch FSDP2, our NO_SHARD vs DDP, our SHARD_GRAD_OP vs FSDP1
SHARD_GRAD_OP. Both sides: --world_size ranks x --threads intra-op threads, fp32 AdamW,
the same global batch and sequence length; tokens/s over the steps of the fit (start-up,
wrapping and checkpointing excluded on both sides; PyTorch's first step, where FSDP
initialises lazily, excluded too: bench/cpu/torch_gpt.py). The PyTorch ranks start once
and serve every run (torch_gpt.TorchRanks); each of our runs is one main_job.

Backends (--backends=false skips it): for each config, our FULL_SHARD over gloo (the
default) and over shared memory (--backend=shm), runs interleaved, printed as "backends":
tokens/s of each, the ratio shm / gloo and shm over PyTorch FSDP2's median from the results.

Scaling (issue 12 item 4; --scaling=false skips it): for each config, FULL_SHARD vs FSDP2
on 1 rank x 2 intra-op threads and on 2 ranks x 1 thread (the latter taken from the main
results when they ran exactly that), printed as "scaling": tokens/s of each layout, the
ratio 1x2 / 2x1 on each side and ours / PyTorch for each layout.
"""

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_bound import memory_check  # noqa: E402

CONFIGS = [  # V T C L H B, and the default steps of one run
    {"V": 64, "T": 32, "C": 64, "L": 2, "H": 4, "B": 16, "steps": 150},
    {"V": 256, "T": 64, "C": 128, "L": 4, "H": 4, "B": 16, "steps": 40},
    {"V": 512, "T": 128, "C": 256, "L": 6, "H": 8, "B": 8, "steps": 12},
]
PAIRS = [("FULL_SHARD", "FSDP2"), ("NO_SHARD", "DDP"), ("SHARD_GRAD_OP", "FSDP1_SHARD_GRAD_OP")]


def load():
    return [round(x, 2) for x in os.getloadavg()]


def label(c):
    return f"{c['V']} {c['T']} {c['C']} {c['L']} {c['H']} {c['B']}"


def thread_env(threads):
    # main_job gets --intra_op_threads=N (nn::SetIntraOpThreads: oneDNN's GEMMs and the
    # library's OpenMP loops); OMP_NUM_THREADS says the same to anything else OpenMP, as
    # torch.set_num_threads(N) on the other side.
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_ours(args, c, strategy, steps, run_index, world_size=None, threads=None,
             backend="auto"):
    world_size = world_size or args.world_size
    threads = threads or args.threads
    out_dir = os.path.join(args.out, f"ours_{c['V']}_{c['T']}_{c['C']}_{strategy}_"
                                     f"{world_size}x{threads}_{backend}_{run_index}")
    cmd = [args.main_job, f"--world_size={world_size}", f"--intra_op_threads={threads}",
           f"--strategy={strategy}", f"--backend={backend}",
           "--stages=fit", "--release=false", f"--steps={steps}", f"--batch_size={c['B']}",
           f"--seq_len={c['T']}", f"--block_size={c['T']}", f"--vocab_size={c['V']}",
           f"--n_embd={c['C']}", f"--n_layer={c['L']}", f"--n_head={c['H']}",
           f"--log_every={steps}", f"--output_dir={out_dir}"]
    before = load()
    proc = subprocess.run(cmd, env=thread_env(threads), capture_output=True, text=True,
                          timeout=args.run_timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"ours {strategy} {label(c)} failed (exit {proc.returncode}): "
                           f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    with open(os.path.join(out_dir, "summary.json")) as f:
        s = json.load(f)
    if s.get("intra_op_threads") != threads:
        raise RuntimeError(f"ours {strategy} {label(c)}: main_job ran {s.get('intra_op_threads')} "
                           f"intra-op threads, asked for {threads}")
    return {"tokens_per_second": s["tokens_per_second"], "backend": s.get("backend"),
            "gemm_library": s.get("gemm_library"),
            "memory_check": memory_check(s) if strategy == "FULL_SHARD" else None,
            "comm_overlap": s.get("comm_overlap"),
            "model_parameters": s["model_parameters"],
            "peak_bytes_per_rank": s["peak_bytes_per_rank"],
            "load_before": before, "load_after": load()}


def run_theirs(ranks, c, strategy, steps):
    before = load()
    r = ranks.run(strategy=strategy, vocab_size=c["V"], block_size=c["T"], n_embd=c["C"],
                  n_layer=c["L"], n_head=c["H"], batch_size=c["B"], steps=steps)
    r["load_before"] = before
    r["load_after"] = load()
    return r


def our_gemm_library(main_job):
    """The GEMM libraries main_job links (ldd) and, for OpenBLAS, the kernels it picks."""
    info = {}
    try:
        ldd = subprocess.run(["ldd", main_job], capture_output=True, text=True).stdout
    except OSError as e:
        return {"error": str(e)}
    for line in ldd.splitlines():
        m = re.match(r"\s*(\S*(?:blas|blis|dnnl|xsmm|mkl|gomp)\S*)\s+=>\s+(\S+)", line)
        if m:
            path = os.path.realpath(m.group(2))
            info[m.group(1)] = path
            try:
                lib = ctypes.CDLL(path)
                for fn in ("openblas_get_config", "openblas_get_corename"):
                    if hasattr(lib, fn):
                        getattr(lib, fn).restype = ctypes.c_char_p
                        info[fn] = getattr(lib, fn)().decode()
            except OSError as e:
                info["load_error"] = str(e)
    return info


SCALING_LAYOUTS = [(1, 2), (2, 1)]  # (ranks, intra-op threads per rank)


def run_scaling(args, c, steps, ranks, scaling_ranks, results):
    """FULL_SHARD vs FSDP2 of config c on each layout of SCALING_LAYOUTS, runs interleaved."""
    from torch_gpt import TorchRanks
    entry = {"config": label(c), "steps": steps, "strategy": ["FULL_SHARD", "FSDP2"],
             "ours": {}, "pytorch": {}, "ratio_ours_over_pytorch": {}}
    for world, threads in SCALING_LAYOUTS:
        key = f"{world}x{threads}"
        reuse = [r for r in results if r["config"] == label(c) and r["steps"] == steps
                 and r["ours"]["strategy"] == "FULL_SHARD"]
        if reuse and (world, threads) == (args.world_size, args.threads):
            o = reuse[0]["ours"]["tokens_per_second_runs"]
            t = reuse[0]["pytorch"]["tokens_per_second_runs"]
            entry["ours"][key] = {"tokens_per_second_median": statistics.median(o),
                                  "tokens_per_second_runs": o, "from": "results"}
            entry["pytorch"][key] = {"tokens_per_second_median": statistics.median(t),
                                     "tokens_per_second_runs": t, "from": "results"}
        else:
            if (world, threads) == (args.world_size, args.threads):
                theirs_ranks = ranks
            else:
                if (world, threads) not in scaling_ranks:
                    scaling_ranks[(world, threads)] = TorchRanks(args.torch_python, world, threads)
                theirs_ranks = scaling_ranks[(world, threads)]
            ours, theirs, loads = [], [], []
            for i in range(args.runs):
                ours.append(run_ours(args, c, "FULL_SHARD", steps, i, world, threads))
                theirs.append(run_theirs(theirs_ranks, c, "FSDP2", steps))
                loads += [[r["load_before"], r["load_after"]] for r in (ours[-1], theirs[-1])]
                print(f"[bench] scaling {label(c)} {key}: FULL_SHARD "
                      f"{ours[-1]['tokens_per_second']:.0f} vs FSDP2 "
                      f"{theirs[-1]['tokens_per_second']:.0f} tokens/s (load {load()[0]})",
                      file=sys.stderr, flush=True)
            o = [r["tokens_per_second"] for r in ours]
            t = [r["tokens_per_second"] for r in theirs]
            entry["ours"][key] = {"tokens_per_second_median": statistics.median(o),
                                  "tokens_per_second_runs": o}
            entry["pytorch"][key] = {"tokens_per_second_median": statistics.median(t),
                                     "tokens_per_second_runs": t}
            entry.setdefault("load_average_per_run", {})[key] = loads
        o_med = entry["ours"][key]["tokens_per_second_median"]
        t_med = entry["pytorch"][key]["tokens_per_second_median"]
        entry["ratio_ours_over_pytorch"][key] = o_med / t_med if t_med > 0 else None
    for side in ("ours", "pytorch"):
        one, two = (entry[side][f"{w}x{t}"]["tokens_per_second_median"]
                    for w, t in SCALING_LAYOUTS)
        entry[side]["ratio_1x2_over_2x1"] = one / two if two > 0 else None
    return entry


def run_backends(args, c, steps, results):
    """Our FULL_SHARD of config c over gloo and over shm, runs interleaved."""
    gloo, shm = [], []
    for i in range(args.runs):
        gloo.append(run_ours(args, c, "FULL_SHARD", steps, i, backend="gloo"))
        shm.append(run_ours(args, c, "FULL_SHARD", steps, i, backend="shm"))
        if gloo[-1]["backend"] != "gloo" or shm[-1]["backend"] != "shm":
            raise RuntimeError(f"backends {label(c)}: main_job ran {gloo[-1]['backend']} and "
                               f"{shm[-1]['backend']}, asked for gloo and shm")
        print(f"[bench] backends {label(c)}: FULL_SHARD gloo {gloo[-1]['tokens_per_second']:.0f}"
              f" vs shm {shm[-1]['tokens_per_second']:.0f} tokens/s (load {load()[0]})",
              file=sys.stderr, flush=True)
    g = statistics.median(r["tokens_per_second"] for r in gloo)
    m = statistics.median(r["tokens_per_second"] for r in shm)
    fsdp2 = [r["pytorch"]["tokens_per_second_median"] for r in results
             if r["config"] == label(c) and r["steps"] == steps
             and r["pytorch"]["strategy"] == "FSDP2"]
    return {"config": label(c), "steps": steps, "strategy": "FULL_SHARD",
            "gloo_tokens_per_second_median": g,
            "gloo_tokens_per_second_runs": [r["tokens_per_second"] for r in gloo],
            "shm_tokens_per_second_median": m,
            "shm_tokens_per_second_runs": [r["tokens_per_second"] for r in shm],
            "ratio_shm_over_gloo": m / g if g > 0 else None,
            "ratio_shm_over_pytorch_fsdp2": m / fsdp2[0] if fsdp2 and fsdp2[0] > 0 else None,
            "comm_overlap_shm_runs": [r["comm_overlap"] for r in shm],
            "load_average_per_run": [[r["load_before"], r["load_after"]]
                                     for pair in zip(gloo, shm) for r in pair]}


def cpu_model():
    with open("/proc/cpuinfo") as f:
        text = f.read()
    get = lambda k: (re.search(rf"^{k}\s*:\s*(.*)$", text, re.M) or [None, "?"])[1]
    return {"model_name": get("model name"), "family": get("cpu family"), "model": get("model"),
            "cores": os.cpu_count()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--main_job", required=True, help="the -c opt main_job binary")
    p.add_argument("--torch_python", required=True, help="python of the PyTorch venv")
    p.add_argument("--out", default="out/bench_cpu", help="where our runs write their output")
    p.add_argument("--steps", type=int, default=0,
                   help="training steps of every run (default: per config, %s)"
                        % [c["steps"] for c in CONFIGS])
    p.add_argument("--steps_scale", type=float, default=1.0,
                   help="multiplies the per-config default steps (e.g. 0.5 on a loaded machine)")
    p.add_argument("--runs", type=int, default=3, help="runs of each side (median reported)")
    p.add_argument("--world_size", type=int, default=2)
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads per rank (main_job --intra_op_threads, "
                        "torch.set_num_threads)")
    p.add_argument("--scaling", default="true", choices=["true", "false"],
                   help="also run FULL_SHARD vs FSDP2 on 1 rank x 2 threads and 2 ranks x 1 "
                        "thread per config (the JSON's 'scaling')")
    p.add_argument("--backends", default="true", choices=["true", "false"],
                   help="also run our FULL_SHARD over gloo and over shm, interleaved, per "
                        "config (the JSON's 'backends')")
    p.add_argument("--configs", default="0,1,2", help="indices into the config table")
    p.add_argument("--pairs", default="FULL_SHARD,NO_SHARD,SHARD_GRAD_OP",
                   help="our strategies to run (each against its PyTorch counterpart)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: first config, FULL_SHARD vs FSDP2, 1 run, 20 steps")
    p.add_argument("--run_timeout_s", type=float, default=900, help="limit of one run of ours")
    args = p.parse_args()
    if args.quick:
        args.configs, args.pairs, args.runs = "0", "FULL_SHARD", 1
        args.steps = args.steps or 20
    os.makedirs(args.out, exist_ok=True)
    configs = [CONFIGS[int(i)] for i in args.configs.split(",")]
    wanted = args.pairs.split(",")
    pairs = [pr for pr in PAIRS if pr[0] in wanted]

    doc = {
        "benchmark": "bench/cpu/run_bench.py",
        "cpu": cpu_model(),
        "world_size": args.world_size,
        "threads_per_rank": args.threads,
        "runs_per_side": args.runs,
        "our_thread_flags": {"--intra_op_threads": args.threads,
                             "OMP_NUM_THREADS": str(args.threads)},
        "gemm_library": {"ours": {"linked": our_gemm_library(args.main_job)}},
        "load_average_start": load(),
        "results": [],
    }
    mismatch = False
    t0 = time.time()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_gpt import TorchRanks  # no torch import here: the ranks import it, once
    ranks = TorchRanks(args.torch_python, args.world_size, args.threads)
    scaling_ranks = {}  # (world_size, threads) -> TorchRanks of the scaling section
    for c in configs:
        steps = args.steps or max(3, round(c["steps"] * args.steps_scale))
        per_strategy = {}
        for ours_name, theirs_name in pairs:
            ours, theirs = [], []
            for i in range(args.runs):
                ours.append(run_ours(args, c, ours_name, steps, i))
                theirs.append(run_theirs(ranks, c, theirs_name, steps))
                print(f"[bench] {label(c)} {ours_name} {ours[-1]['tokens_per_second']:.0f} vs "
                      f"{theirs_name} {theirs[-1]['tokens_per_second']:.0f} tokens/s "
                      f"(load {load()[0]})", file=sys.stderr, flush=True)
            o = statistics.median(r["tokens_per_second"] for r in ours)
            t = statistics.median(r["tokens_per_second"] for r in theirs)
            params_ours, params_theirs = ours[0]["model_parameters"], theirs[0]["model_parameters"]
            equal = params_ours == params_theirs
            mismatch |= not equal
            doc["gemm_library"].setdefault("pytorch", theirs[0].get("blas"))
            doc["gemm_library"]["ours"].setdefault("library", ours[0]["gemm_library"])
            doc.setdefault("torch_version", theirs[0].get("torch_version"))
            # Peak bytes by tag per rank over the runs (the same each run, bar noise).
            peaks = ours[0]["peak_bytes_per_rank"]
            for r in ours[1:]:
                for rank, tags in enumerate(r["peak_bytes_per_rank"]):
                    for k, v in tags.items():
                        peaks[rank][k] = max(peaks[rank][k], v)
            per_strategy[ours_name] = o
            doc["results"].append({
                "config": label(c), "V": c["V"], "T": c["T"], "C": c["C"], "L": c["L"],
                "H": c["H"], "B": c["B"], "steps": steps,
                "ours": {"strategy": ours_name, "tokens_per_second_median": o,
                         "tokens_per_second_runs": [r["tokens_per_second"] for r in ours],
                         "model_parameters": params_ours,
                         "peak_bytes_per_rank_by_tag": peaks,
                         "memory_check": ours[-1]["memory_check"],
                         "comm_overlap_runs": [r["comm_overlap"] for r in ours]},
                "pytorch": {"strategy": theirs_name, "tokens_per_second_median": t,
                            "tokens_per_second_runs": [r["tokens_per_second"] for r in theirs],
                            "tokens_per_second_incl_first_step_runs": [
                                r["tokens_per_second_incl_first_step"] for r in theirs],
                            "first_step_seconds_runs": [r["first_step_seconds"] for r in theirs],
                            "model_parameters": params_theirs,
                            "peak_rss_bytes_per_rank": max(
                                (r["peak_rss_bytes_per_rank"] for r in theirs),
                                key=lambda v: max(v))},
                "ratio_ours_over_pytorch": o / t if t > 0 else None,
                "parameter_counts_equal": equal,
                "load_average_per_run": [[r["load_before"], r["load_after"]]
                                         for pair in zip(ours, theirs) for r in pair],
            })
            # What is done so far, in case the run is cut short (a long run on a loaded machine).
            with open(os.path.join(args.out, "partial.json"), "w") as f:
                json.dump(doc, f, indent=2)
        if "FULL_SHARD" in per_strategy and "NO_SHARD" in per_strategy:
            doc.setdefault("full_shard_step_time_over_no_shard", {})[label(c)] = (
                per_strategy["NO_SHARD"] / per_strategy["FULL_SHARD"])
        if args.backends == "true":
            doc.setdefault("backends", []).append(run_backends(args, c, steps, doc["results"]))
        if args.scaling == "true":
            doc.setdefault("scaling", []).append(
                run_scaling(args, c, steps, ranks, scaling_ranks, doc["results"]))
            with open(os.path.join(args.out, "partial.json"), "w") as f:
                json.dump(doc, f, indent=2)
    ranks.close()
    for r in scaling_ranks.values():
        r.close()
    doc["load_average_end"] = load()
    doc["wall_seconds"] = round(time.time() - t0, 1)
    print(json.dumps(doc, indent=2))
    if mismatch:
        print("run_bench: parameter counts differ between our GPT and the PyTorch one "
              "(see parameter_counts_equal)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
