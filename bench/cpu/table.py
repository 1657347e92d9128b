"""Markdown table of one or more bench/cpu/run_bench.py JSON documents (README use).

    python3 bench/cpu/table.py out/bench_cpu/result.json [more.json ...]

One row per config: median tokens/s of each side and the ratio ours / PyTorch for each
strategy pair found, then the load average the runs saw. When the documents have a
"scaling" section, a second table: FULL_SHARD vs FSDP2 on 1 rank x 2 threads and on
2 ranks x 1 thread, with the ratios. With a "backends" section, a table of our FULL_SHARD
over gloo and over shm. Last, the targets: FULL_SHARD's step time over NO_SHARD's and its
peak memory against the two bounds.
"""
import json
import sys

PAIRS = [("FULL_SHARD", "FSDP2"), ("NO_SHARD", "DDP"), ("SHARD_GRAD_OP", "FSDP1 SHARD_GRAD_OP")]


def scaling_table(entries):
    print()
    print("| config (V T C L H B) | ours 1x2 | ours 2x1 | ours 1x2/2x1 | PyTorch 1x2 | "
          "PyTorch 2x1 | PyTorch 1x2/2x1 | ours/PyTorch 1x2 | ours/PyTorch 2x1 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for e in entries:
        o, t, r = e["ours"], e["pytorch"], e["ratio_ours_over_pytorch"]
        print(f"| {e['config']} | {o['1x2']['tokens_per_second_median']:,.0f} |"
              f" {o['2x1']['tokens_per_second_median']:,.0f} | {o['ratio_1x2_over_2x1']:.2f} |"
              f" {t['1x2']['tokens_per_second_median']:,.0f} |"
              f" {t['2x1']['tokens_per_second_median']:,.0f} | {t['ratio_1x2_over_2x1']:.2f} |"
              f" {r['1x2']:.2f} | {r['2x1']:.2f} |")


def backends_table(entries):
    print()
    print("| config (V T C L H B) | ours FULL_SHARD gloo | ours FULL_SHARD shm | shm / gloo | "
          "shm / PyTorch FSDP2 | all-gather hidden (shm) |")
    print("|---|---|---|---|---|---|")
    for e in entries:
        overlap = [o for o in e.get("comm_overlap_shm_runs", []) if o]
        hidden = (sum(o["all_gather_hidden"] for o in overlap) / len(overlap)) if overlap else None
        vs = e.get("ratio_shm_over_pytorch_fsdp2")
        vs_text = f"{vs:.2f}" if vs is not None else "-"
        hidden_text = f"{hidden:.0%}" if hidden is not None else "-"
        print(f"| {e['config']} | {e['gloo_tokens_per_second_median']:,.0f} |"
              f" {e['shm_tokens_per_second_median']:,.0f} | {e['ratio_shm_over_gloo']:.2f} |"
              f" {vs_text} | {hidden_text} |")


def main(paths):
    rows = {}
    scaling = {}
    backends = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for r in doc["results"]:
            rows.setdefault(r["config"], {})[r["ours"]["strategy"]] = r
        for e in doc.get("scaling", []):
            scaling[e["config"]] = e
        for e in doc.get("backends", []):
            backends[e["config"]] = e
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
    if scaling:
        scaling_table(scaling.values())
    if backends:
        backends_table(backends.values())
    targets_table(rows)


def targets_table(rows):
    """FULL_SHARD's step time over NO_SHARD's, and FULL_SHARD's peak memory against bounds."""
    lines = []
    for config, by in rows.items():
        fs, ns = by.get("FULL_SHARD"), by.get("NO_SHARD")
        step = (ns["ours"]["tokens_per_second_median"] / fs["ours"]["tokens_per_second_median"]
                if fs and ns else None)
        mem = (fs or {}).get("ours", {}).get("memory_check")
        overlap = [o for o in (fs or {}).get("ours", {}).get("comm_overlap_runs", []) if o]
        hidden = (sum(o["all_gather_hidden"] for o in overlap) / len(overlap)) if overlap else None
        lines.append(
            f"| {config} | {step:.3f} |" if step else f"| {config} | - |")
        if mem:
            lines[-1] += (f" {mem['measured_param_grad_optim_bytes']:,} |"
                          f" {mem['measured_over_issue_bound']:.2f} |"
                          f" {mem['measured_over_fsdp_bound']:.3f} |")
        else:
            lines[-1] += " - | - | - |"
        lines[-1] += f" {hidden:.0%} |" if hidden is not None else " - |"
    print()
    print("| config (V T C L H B) | FULL_SHARD / NO_SHARD step time | peak param+grad+optim "
          "bytes per rank | over 16 Psi/N + 4 P_max | over the FSDP bound | all-gather hidden |")
    print("|---|---|---|---|---|---|")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
