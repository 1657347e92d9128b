"""The run's JSON summary (one line, "gpu_run_summary"), assembled from the steps' records
and what the steps left in the work directory (job_figures.py, bench_figures.py). assemble()
is called after every phase, so each piece copes with a step that has not run yet."""

import os
import time

from . import bench_figures as bench
from . import job_figures as jobs
from .settings import MODEL
from .sources import Sources, read

PEAK_TFLOPS = (("H200", 989.0), ("H100", 989.0), ("GH200", 989.0), ("A100", 312.0),
               ("B200", 2250.0), ("L40S", 362.0))


def model_config(src):
    L, T, C, V = MODEL["L"], MODEL["T"], MODEL["C"], MODEL["V"]
    # Parameters of the GPT (tied lm_head): wte, wpe, per block 12 C^2 + 13 C, ln_f.
    n_params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return {"vocab_size": V, "block_size": T, "seq_len": T, "n_embd": C, "n_layer": L,
            "n_head": MODEL["H"], "batch_size": src.settings.batch, "param_dtype": "bfloat16",
            "model_parameters": n_params,
            "flops_per_token": 6.0 * n_params + 12.0 * L * T * C}  # nanoGPT's estimate_mfu


def gpu_and_peak(src):
    """The GPU's name, the driver, and the peak TFLOP/s the MFU estimate assumes."""
    query = src.text("gpu_query.txt").strip().splitlines()
    fields = [x.strip() for x in query[0].split(",")] if query else []
    name = fields[0] if fields else None
    driver = fields[1] if len(fields) > 1 else None
    peak = src.settings.peak_tflops
    if peak <= 0 and name:
        peak = next((v for key, v in PEAK_TFLOPS if key in name), 0.0)
    return name, driver, peak


def environment(src, gpu_name, driver):
    libs = {}
    for line in src.text("cuda_libs.txt").splitlines():
        parts = line.split(" ", 1)
        if len(parts) == 2:
            libs[parts[0]] = None if parts[1] == "NOT_FOUND" else parts[1]
    lines = lambda name: [l for l in src.text(name).splitlines() if l]
    return {"gpu": gpu_name, "driver": driver,
            "gpus": [l for l in lines("nvidia_smi.txt") if l.startswith("GPU")],
            "glibc": src.text("ldd_version.txt").strip(),
            "libraries": libs,
            "ld_library_path": src.text("ld_library_path.txt").strip(),
            "ldd_missing": lines("ldd_missing.txt"),
            "compat_libstdcxx": src.text("compat.txt").strip() == "1",
            "bundle": read(os.path.join(src.run.bundle, "MANIFEST.txt")).splitlines()[:1]}


def ratio(a, b):
    return a / b if a and b else None


def figures(src):
    """Every piece but the environment's, keyed as in the summary."""
    cfg = model_config(src)
    gpu_name, driver, peak = gpu_and_peak(src)
    cfg["peak_tflops_assumed"] = peak or None

    def mfu_estimate(tps, world=1):
        return cfg["flops_per_token"] * tps / world / (peak * 1e12) if tps and peak > 0 else None
    ours, prof = jobs.ours_block(src, mfu_estimate)
    pt = jobs.pytorch_block(src, "pytorch", "pytorch_fsdp2.log")
    ptc = jobs.pytorch_block(src, "pytorch_compiled", "pytorch_fsdp2_compiled.log")
    out = {"ours": ours, "op_profile": prof, "pytorch_fsdp2": pt,
           "pytorch_fsdp2_compiled": ptc, "config": cfg, "gpu": (gpu_name, driver)}
    if "ours_again" in src.settings.phases:
        out["aba"] = jobs.aba_block(src, ours, pt)
    out.update({"offload": jobs.offload_block(src, ours), "llama": jobs.llama_block(src),
                "attention": bench.attention_block(src), "nccl_bench": bench.nccl_bench(src),
                "ncu": {"attention": bench.ncu_profile(src, "ncu_attention"),
                        "step": bench.ncu_profile(src, "ncu_step")}})
    return out


def run_ok(steps):
    """Every step that ran passed; ncu's (a diagnosis) and those skipped on purpose aside."""
    counted = [s for k, s in steps.items() if not k.startswith("ncu") and not s.get("skipped")]
    return bool(counted) and all(s["ok"] for s in counted)


def assemble(run):
    """The summary as a dict (run.py writes it to summary.json and prints it)."""
    src = Sources(run)
    f = figures(src)
    ours, pt, ptc = f["ours"], f["pytorch_fsdp2"], f["pytorch_fsdp2_compiled"]
    summary = {
        "gpu_run_summary": 1,
        "ok": run_ok(src.steps),
        "call": src.settings.call,
        "phases": src.settings.phases,
        "gpu_tests": bench.gpu_tests(src),
        "tokens_per_s": {"ours": ours["tokens_per_s"], "pytorch_fsdp2": pt.get("tokens_per_s"),
                         "pytorch_fsdp2_compiled": ptc.get("tokens_per_s")},
        "tokens_per_s_basis": {"ours": ours["tokens_per_s_basis"],
                               "pytorch_fsdp2": pt.get("timing_basis"),
                               "pytorch_fsdp2_compiled": ptc.get("timing_basis")},
        "tokens_per_s_ratio": ratio(ours["tokens_per_s"], pt.get("tokens_per_s")),
        "tokens_per_s_ratio_is": "ours / pytorch_fsdp2 (target >= 1.0)",
        "tokens_per_s_ratio_compiled": ratio(ours["tokens_per_s"], ptc.get("tokens_per_s")),
        "tokens_per_s_ratio_compiled_is": "ours / pytorch_fsdp2_compiled (torch.compile per block)",
        # The MFU of the tokens/s above (device-timed where the job has it); the job's own,
        # host-timed figure stays in ours.mfu.
        "mfu": ours["mfu_estimate"] if ours["mfu_estimate"] is not None else ours["mfu"],
        "peak_device_memory_bytes": ours["peak_device_memory_bytes"],
    }
    if "aba" in f:
        summary["tokens_per_s_ratio_aba"] = f["aba"]["ratio"]
    summary.update({k: f[k] for k in ("op_profile", "ours", "pytorch_fsdp2",
                                      "pytorch_fsdp2_compiled")})
    summary.update({k: f[k] for k in ("aba", "offload", "llama", "attention", "nccl_bench",
                                      "ncu", "config") if k in f})
    summary.update({
        "steps": {k: v for k, v in src.steps.items() if not k.startswith("test:")},
        "env": environment(src, *f["gpu"]),
        "seconds": int(time.time() - run.runner.start),
        "work_dir": run.work,
    })
    return summary


def fallback(run, why):
    """The summary when assemble() failed: the steps' exit statuses and why."""
    return {"gpu_run_summary": 1, "ok": False, "error": f"summary not assembled ({why})",
            "call": run.settings.call,
            "steps": {k: v["rc"] for k, v in run.records.steps.items()}}


def tokens_line(summary):
    """tokens/s of each side, and their ratios."""
    t = summary["tokens_per_s"]

    def fig(v):
        return "-" if v is None else f"{v:,.0f}"
    line = (f"tokens/s: ours {fig(t['ours'])} ({summary['tokens_per_s_basis']['ours']}), "
            f"PyTorch FSDP2 {fig(t['pytorch_fsdp2'])}, compiled "
            f"{fig(t['pytorch_fsdp2_compiled'])}")
    for key, name in (("tokens_per_s_ratio", "ratio"), ("tokens_per_s_ratio_compiled",
                      "ratio to compiled"), ("tokens_per_s_ratio_aba", "A/B/A ratio")):
        if summary.get(key) is not None:
            line += f"; {name} {summary[key]:.3f}"
    return line
