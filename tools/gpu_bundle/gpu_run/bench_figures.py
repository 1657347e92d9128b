"""The summary's figures of the gpu tests (gtest counts), the collectives benchmark, the
attention benchmarks and the Nsight Compute profiles."""

import json
import os
import re

from . import ncu as ncu_mod
from .settings import MODEL
from .sources import last_json, number, step_block


OK_RE = re.compile(r"^\[\s+OK\s+\] (\S+) \(\d+ ms\)")
FAIL_RE = re.compile(r"^\[\s+FAILED\s+\] (\S+)(?:, where .*)? \(\d+ ms\)")
SKIP_RE = re.compile(r"^\[\s+SKIPPED\s+\] (\S+) \(\d+ ms\)")
RUN_RE = re.compile(r"^\[\s+RUN\s+\] (\S+)")


def gtest_counts(text):
    """Passed, failed and skipped cases of a gtest log, the failed names, and the cases
    started that never finished."""
    p, f, k, failed, started, finished = 0, 0, 0, [], [], set()
    for line in text.splitlines():
        for regex, kind in ((RUN_RE, "run"), (OK_RE, "ok"), (FAIL_RE, "fail"), (SKIP_RE, "skip")):
            m = regex.match(line)
            if not m:
                continue
            name = m.group(1)
            if kind == "run":
                started.append(name)
            else:
                finished.add(name)
                p, f, k = p + (kind == "ok"), f + (kind == "fail"), k + (kind == "skip")
                if kind == "fail":
                    failed.append(name)
            break
    return p, f, k, failed, [t for t in started if t not in finished]


def gpu_tests(src):
    """gtest cases by their result lines; a binary that failed without a FAILED case
    (crash, timeout, bad exit) counts as one failure named after the binary."""
    out = {"passed": 0, "failed": 0, "skipped": 0, "failed_names": [], "not_run": [],
           "binaries": {}}
    for name, s in src.steps.items():
        if not name.startswith("test:"):
            continue
        binary = name[5:]
        if s["rc"] == -1:
            out["not_run"].append(binary)
            continue
        p, f, k, failed, unfinished = gtest_counts(src.text(os.path.join("tests", binary + ".log")))
        names = [f"{binary}:{t}" for t in failed]
        why = s["note"] or f"rc={s['rc']}"
        names += [f"{binary}:{t} (did not finish: {why})" for t in unfinished]
        f += len(unfinished)
        if not s["ok"] and f == 0:
            f, names = 1, names + [f"{binary} ({why})"]
        out["passed"] += p
        out["failed"] += f
        out["skipped"] += k
        out["failed_names"] += names
        out["binaries"][binary] = {"ok": s["ok"] and f == 0, "passed": p, "failed": f,
                                   "skipped": k, "seconds": s["seconds"]}
    return out


def nccl_bench(src):
    """The best bus and algorithm bandwidth per op (its JSON also into nccl_bench.json)."""
    out = step_block(src, "bench", "nccl_bench.log")
    text = src.text("nccl_bench.log")
    # Its JSON (indented, so it opens with a line "{") among log lines on stderr.
    m = re.search(r"^\{$", text, re.M)
    try:
        bj = json.JSONDecoder().raw_decode(text[m.start():])[0] if m else None
    except ValueError:
        bj = None
    if not isinstance(bj, dict):
        return out
    with open(src.path("nccl_bench.json"), "w") as f:
        json.dump(bj, f, indent=1)
    best = {}
    for r in bj.get("results", []):
        for key in ("busbw_GBps", "algbw_GBps"):
            v = r.get(key)
            if isinstance(v, (int, float)):
                op = best.setdefault(r.get("op"), {})
                op[key] = max(op.get(key, 0), v)
    out.update({"nproc": bj.get("nproc"), "best": best})
    return out


def bench_line(src, step, log, key):
    """A benchmark's JSON line as it printed it, or why there is none."""
    if src.settings.skipped("attention") or "attention" not in src.settings.phases:
        return {"ok": False, "error": src.not_run("attention")}
    j = last_json(src.text(log))
    if isinstance(j, dict) and key in j:
        return j
    return {"ok": False, "error": src.error(step, log) or f"no JSON line in {log}"}


def slim_bench(j):
    """Our bench's line without what attention.log keeps anyway (shape names, least times,
    executed-FLOP rates), so the summary line stays short enough to read in a terminal."""
    if not isinstance(j.get("forward"), list) and not isinstance(j.get("backward"), list):
        return j

    def rows(key, ids):
        return [{k: r.get(k) for k in ids + ("median_ms", "tflops", "same_bits", "error")}
                for r in (j.get(key) or []) if isinstance(r, dict)]
    out = {k: j.get(k) for k in ("attention_bench", "ok", "error", "device", "shape")}
    out.update({"forward": rows("forward", ("shape",)), "backward": rows("backward", ("kv", "q")),
                "tuned": j.get("tuned")})
    return out


def attention_line(ours, pt, batch):
    """One line: our tuned forward and backward beside SDPA's flash backend."""
    def ms(v):
        return f"{v:.3f} ms" if number(v) is not None else "-"
    tuned = ours.get("tuned") or {}
    flash = (pt.get("backends") or {}).get("flash") or {}
    o_f, o_b = number(tuned.get("forward_ms")), number(tuned.get("backward_ms"))
    p_f, p_b = number(flash.get("forward_ms")), number(flash.get("backward_ms"))
    parts = [f"attention B={batch} T={MODEL['T']} "
             f"H={MODEL['H']} head_dim={MODEL['C'] // MODEL['H']}:"]
    if o_f is not None or o_b is not None:
        parts.append(f"ours (tuned) forward {ms(o_f)}, backward {ms(o_b)};")
    else:
        parts.append(f"ours: {str(ours.get('error'))[:200]};")
    if p_f is not None or p_b is not None:
        parts.append(f"PyTorch SDPA flash forward {ms(p_f)}, backward {ms(p_b)}")
    else:
        parts.append(f"PyTorch SDPA flash: {str(flash.get('error') or pt.get('error'))[:200]}")
    if None not in (o_f, o_b, p_f, p_b) and p_f > 0 and p_b > 0:
        parts.append(f"(ours / PyTorch time: forward {o_f / p_f:.2f}, backward {o_b / p_b:.2f})")
    if ours.get("ok") is False and (o_f is not None or o_b is not None):
        parts.append(f"[ours not ok: {str(ours.get('error'))[:200]}]")
    return " ".join(parts)


def attention_block(src):
    ours = slim_bench(bench_line(src, "attention", "attention_bench.log", "attention_bench"))
    pt = bench_line(src, "attention_pytorch", "attention_torch.log", "attention_torch")
    ran = "attention" in src.settings.phases and not src.settings.skipped("attention")
    line = attention_line(ours, pt, src.settings.batch) if ran else None
    return {"ours": ours, "pytorch": pt, "summary": line}


def ncu_profile(src, step):
    out = step_block(src, step, step + ".log")
    if step not in src.steps:
        return out
    found = ncu_mod.kernels(src.text(step + ".csv"))
    if found is None:
        if out["ok"]:
            out["error"] = f"no kernels in {step}.csv"
        return out
    out.update({"kernels": len(found), "longest": found[:10]})
    return out
