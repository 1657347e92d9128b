"""Markdown table of one or more bench/cpu/run_bench.py JSON documents (README use).

    python3 bench/cpu/table.py out/bench_cpu/result.json [more.json ...]

One row per config: median tokens/s of each side and the ratio ours / PyTorch for each
strategy pair found, then the load average the runs saw.
"""
import json
import sys

PAIRS = [("FULL_SHARD", "FSDP2"), ("NO_SHARD", "DDP"), ("SHARD_GRAD_OP", "FSDP1 SHARD_GRAD_OP")]


def main(paths):
    rows = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for r in doc["results"]:
            rows.setdefault(r["config"], {})[r["ours"]["strategy"]] = r
    header = "| config (V T C L H B) |"
    sep = "|---|"
    for ours, theirs in PAIRS:
        header += f" ours {ours} | PyTorch {theirs} | ratio |"
        sep += "---|---|---|"
    header += " load average (1 min) |"
    sep += "---|"
    print(header)
    print(sep)
    for config, by in rows.items():
        line = f"| {config} |"
        loads = []
        for ours, _ in PAIRS:
            r = by.get(ours)
            if r is None:
                line += " - | - | - |"
                continue
            line += (f" {r['ours']['tokens_per_second_median']:,.0f} |"
                     f" {r['pytorch']['tokens_per_second_median']:,.0f} |"
                     f" {r['ratio_ours_over_pytorch']:.2f} |")
            loads += [b[0] for pair in r["load_average_per_run"] for b in pair]
        line += f" {min(loads):.1f}-{max(loads):.1f} |" if loads else " - |"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
