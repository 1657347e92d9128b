"""Nsight Compute's raw page (ncu --import --csv --page raw): one row per kernel, a column
per metric, a units row first. Each kernel's duration, throughputs, occupancy, registers,
busiest pipes, main warp stall reasons and shared-memory bank conflicts, longest first."""

import csv
import io
import re

SCALE_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
            "second": 1e6, "s": 1e6}
PIPE = re.compile(r"^sm__(?:inst_executed_pipe_(\w+?)|pipe_(\w+?)_cycles_active)"
                  r"\.avg\.pct_of_peak_sustained_active$")
STALL = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)"
                   r"_per_issue_active\.ratio$")


def number(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None


def _first(d, *names):
    for n in names:
        v = number(d.get(n, ""))
        if v is not None:
            return v
    return None


def _pipes_stalls_conflicts(d):
    pipes, stalls, conflicts = {}, {}, 0.0
    for col, v in d.items():
        x = number(v)
        if x is None:
            continue
        m = PIPE.match(col)
        if m:
            key = m.group(1) or m.group(2)
            pipes[key] = max(pipes.get(key, 0.0), x)
        m = STALL.match(col)
        if m:
            stalls[m.group(1)] = x
        if "bank_conflicts" in col and "shared" in col and col.endswith(".sum"):
            conflicts += x
    return pipes, stalls, conflicts


def kernel(d, units):
    """One row (column -> value) as the summary's kernel entry."""
    dur = number(d.get("gpu__time_duration.sum", ""))
    if dur is not None:
        dur *= SCALE_US.get(units.get("gpu__time_duration.sum", "nsecond"), 1e-3)
    pipes, stalls, conflicts = _pipes_stalls_conflicts(d)
    return {
        "kernel": d.get("Kernel Name", "")[:160],
        "us": round(dur, 2) if dur is not None else None,
        "grid": d.get("launch__grid_size"), "block": d.get("launch__block_size"),
        "registers": _first(d, "launch__registers_per_thread"),
        "sm_pct": _first(d, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        "memory_pct": _first(d, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        "dram_pct": _first(d, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                           "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        "occupancy_pct": _first(d, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        "occupancy_limit_pct": _first(d, "sm__maximum_warps_per_active_cycle_pct"),
        "issue_pct": _first(d, "smsp__issue_active.avg.pct_of_peak_sustained_active",
                            "sm__inst_issued.avg.pct_of_peak_sustained_active"),
        "pipes_pct": dict(sorted(pipes.items(), key=lambda kv: -kv[1])[:3]),
        "stalls": dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:4]),
        "shared_bank_conflicts": conflicts,
    }


def kernels(text):
    """The page's kernels, longest first; None when it has no header row."""
    rows = list(csv.reader(io.StringIO(text)))
    hi = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if hi is None:
        return None
    header, data = rows[hi], rows[hi + 1:]
    units = {}
    if data and not (data[0] and data[0][0].strip().isdigit()):
        units, data = dict(zip(header, data[0])), data[1:]
    found = [kernel(dict(zip(header, r)), units) for r in data if len(r) == len(header)]
    found.sort(key=lambda k: -(k["us"] or 0))
    return found


def lines(name, profile):
    """The lines run.sh says about a profile: its kernels and the three longest."""
    if not profile.get("kernels"):
        return [f"ncu {name}: {profile.get('error') or 'no kernels'}"[:300]]
    out = [f"ncu {name}: {profile['kernels']} kernels profiled; the longest:"]
    for k in profile["longest"][:3]:
        out.append(f"ncu   {k['us']} us, SM {k['sm_pct']}%, memory {k['memory_pct']}%, "
                   f"occupancy {k['occupancy_pct']}%, issue {k['issue_pct']}%, stalls "
                   f"{k['stalls']}: {k['kernel'][:80]}")
    return out
