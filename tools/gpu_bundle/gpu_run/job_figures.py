"""The summary's figures of our job (its attempts, tokens/s, memory, GEMM tuning, op
profile; the A/B/A repeat, offload and Llama runs) and of PyTorch FSDP2."""

import os
import re
import statistics

from .sources import last_json, number, step_block


def job_tokens_per_s(j, log=""):
    """A job's tokens/s and what it is: the CUDA events' figure (device_timed) where the
    job's summary has one, else the host clock's after the warm-up, else the median of the
    progress lines after the first (which holds the warm-up), else the whole fit stage."""
    timed = j.get("device_timed")
    if isinstance(timed, dict) and number(timed.get("tokens_per_second")):
        return timed["tokens_per_second"], (
            f"device_timed: {timed.get('basis') or 'CUDA events'}, {timed.get('steps')} steps "
            f"after the warm-up (total tokens / total event time)")
    after = number(j.get("tokens_per_second_after_warmup"))
    if after:
        return after, (f"the job's tokens_per_second_after_warmup "
                       f"({j.get('warmup_steps_excluded')} warm-up steps excluded; host clock, "
                       f"no device_timed in the job's summary)")
    rates = [float(m.group(1)) for m in
             re.finditer(r"step\s+\d+/\d+.*?tokens/s\s+([0-9.eE+]+)", log)]
    if len(rates) > 1:
        return statistics.median(rates[1:]), "median of the progress intervals after the first"
    return number(j.get("tokens_per_second")), "whole fit stage"


def job_peak(j):
    """The largest rank's peak device memory, and the list per rank (or None)."""
    m = j.get("peak_device_memory_bytes")
    if isinstance(m, list):
        per_rank = [p for p in m if number(p) is not None]
        return (max(per_rank) if per_rank else None), per_rank
    return number(m), None


def _simple(v):
    if isinstance(v, list):
        return all(isinstance(x, (int, float, str, type(None))) for x in v)
    return isinstance(v, (int, float, str, type(None), dict))


SUMMARY_WORDS = ("memory", "bound", "mfu", "tokens", "flop", "device", "backend", "step",
                 "world", "vocab", "peak")


def gemm_tuning(tuning):
    """NOTE [GEMM tuning] (nn/cuda/gemm.h): each GEMM problem's first call timed the
    heuristic's first answer against the others that write its bits; the sums over the
    problems of one call each (the job's summary has every line)."""
    times = [re.search(r"the first ([0-9.]+) ms, chosen (the first|another) ([0-9.]+) ms",
                       str(t)) for t in tuning]
    return {"problems": len(tuning),
            "tuned": sum(1 for m in times if m),
            "chose_another": sum(1 for m in times if m and m.group(2) == "another"),
            "fallbacks": sum(1 for t in tuning if "the fallback runs" in str(t)),
            "first_ms": round(sum(float(m.group(1)) for m in times if m), 3),
            "chosen_ms": round(sum(float(m.group(3)) for m in times if m), 3)}


def op_profile(prof):
    """--profile_ops: the last fit step per op category, measured on the device (CUDA
    events) beside the roofline estimate of the same op list (core/roofline.h)."""
    if not isinstance(prof, dict):
        return None
    return {
        **{k: prof.get(k) for k in ("estimated_step_ms", "measured_op_ms", "estimated_mfu",
                                    "measured_op_mfu", "launches", "host_syncs")},
        "categories": {c.get("category"): {k: c.get(k) for k in (
            "ops", "estimated_ms", "measured_ms", "achieved_tflops", "achieved_gbps")}
            for c in prof.get("categories", []) if isinstance(c, dict)},
        # The GEMM problems that took the most time (all of them: main_job_summary.json).
        "gemm_shapes": [{k: g.get(k) for k in (
            "category", "batch", "m", "n", "k", "count", "measured_ms", "achieved_tflops")}
            for g in (prof.get("gemm_shapes") or [])[:8] if isinstance(g, dict)],
    }


def attempts(src, ours):
    """Each attempt of the main job with its error; each failed one's error also under its
    key (attention_reference_after, gemm_tuning_off_after, forward_prefetch_off_after)."""
    out = []
    for a in getattr(src.run, "attempts", []):
        step = a["step"]
        log = "main_job.log" if step == "ours" else f"main_job_{step[len('ours_'):]}.log"
        entry = {"attempt": a["attempt"], "step": step, "ok": src.ok(step),
                 "error": src.error(step, log)}
        if a.get("error_key"):
            ours[a["error_key"]] = entry["error"]
        out.append(entry)
    return out


def ours_block(src, mfu_estimate):
    ours = step_block(src, "ours", "main_job.log")
    tried = attempts(src, ours)
    log = src.text("main_job.log")
    summ = src.job_summary("main_job_summary.json") or last_json(log) or {}
    tps, basis = job_tokens_per_s(summ, log)
    peak, per_rank = job_peak(summ)
    s = src.settings
    ours.update({
        "figures_from": tried[-1]["attempt"] if ours["ok"] and tried else None,
        "attempts": tried,
        "tokens_per_s": tps,
        "tokens_per_s_basis": basis,
        "tokens_per_s_whole_fit": number(summ.get("tokens_per_second")),
        "device_timed": summ.get("device_timed"),
        "mfu": number(summ.get("mfu")),
        "mfu_estimate": mfu_estimate(tps, number(summ.get("world_size")) or 1),
        "peak_device_memory_bytes": peak,
        "peak_device_memory_bytes_per_rank": per_rank,
        "device": summ.get("device"),
        "final_train_loss": summ.get("final_train_loss"),
        "steps": s.steps, "warmup_steps": s.pt_warmup, "timed_steps": s.steps - s.pt_warmup - 1,
        # The job's own figures on memory (its bound), throughput, FLOPs and the device.
        "summary": {k: v for k, v in summ.items()
                    if _simple(v) and any(w in k for w in SUMMARY_WORDS)},
    })
    if isinstance(summ.get("gemm_tuning"), list):
        ours["gemm_tuning"] = gemm_tuning(summ["gemm_tuning"])
    return ours, op_profile(summ.get("op_profile"))


PT_KEYS = ("tokens_per_s", "step_ms_median", "step_ms_mean", "timing_basis",
           "wall_tokens_per_s", "mfu", "peak_device_memory_bytes", "torch", "cuda", "nccl",
           "final_loss")


def pytorch_block(src, step, log):
    """bench/pytorch_fsdp2.py's JSON line: tokens/s from CUDA events over the timed steps."""
    pt = step_block(src, step, log)
    pj = last_json(src.text(log)) or {}
    if pj.get("ok") is False and not pt["error"]:
        pt["error"] = pj.get("error")
    pt.update({k: pj.get(k) for k in PT_KEYS})
    ms = number(pj.get("step_ms_median"))
    pt["step_s_median"] = ms / 1e3 if ms is not None else pj.get("step_s_median")
    config = pj.get("config") or {}
    pt.update({"optimizer": config.get("optimizer"), "compile": config.get("compile"),
               "steps": src.settings.pt_steps, "warmup": src.settings.pt_warmup})
    return pt


def aba_block(src, ours, pt):
    """Our job, PyTorch, our job again (calls 2 and all): each figure and the ratio of our
    two runs' mean to PyTorch's."""
    again = step_block(src, "ours_again", "main_job_again.log")
    j = src.job_summary(os.path.join("main_job_again", "summary.json")) or {}
    second, basis = job_tokens_per_s(j, src.text("main_job_again.log")) if j else (None, None)
    first, middle = ours.get("tokens_per_s"), pt.get("tokens_per_s")
    mean = (first + second) / 2 if first and second else None
    return {**again, "order": ["ours", "pytorch_fsdp2", "ours_again"],
            "ours_first": first, "pytorch_fsdp2": middle, "ours_second": second,
            "ours_second_basis": basis, "ours_mean": mean,
            "ratio": mean / middle if mean and middle else None,
            "ratio_is": "mean of our two runs / pytorch_fsdp2 (eager)"}


def offload_block(src, ours):
    """--cpu_offload: the same job with the state on the host (NOTE [CPU offload])."""
    offload = step_block(src, "offload", "offload.log")
    j = src.job_summary(os.path.join("main_job_offload", "summary.json"))
    if j is None:
        return offload
    tps, _ = job_tokens_per_s(j)
    mem, _ = job_peak(j)
    base_tps, base_mem = ours.get("tokens_per_s"), ours.get("peak_device_memory_bytes")
    offload.update({
        "tokens_per_s": tps, "peak_device_memory_bytes": mem,
        "final_train_loss": j.get("final_train_loss"), "steps": src.settings.offload_steps,
        "tokens_per_s_over_no_offload": tps / base_tps if tps and base_tps else None,
        "peak_device_memory_over_no_offload": mem / base_mem if mem and base_mem else None,
        "memory_estimate": {k: j.get(k) for k in ("memory_estimate",
                                                  "memory_estimate_over_fit_peak")},
    })
    return offload


def llama_block(src):
    """--model=llama: a Llama of GPT-2 small's widths, its own throughput, memory and op
    profile (the Llama layers' kernels, measured nowhere else)."""
    llama = step_block(src, "llama", "llama.log")
    j = src.job_summary(os.path.join("main_job_llama", "summary.json"))
    if j is not None:
        prof = j.get("op_profile") if isinstance(j.get("op_profile"), dict) else {}
        s = src.settings
        llama.update({
            "tokens_per_s": job_tokens_per_s(j)[0], "mfu": number(j.get("mfu")),
            "peak_device_memory_bytes": job_peak(j)[0],
            "final_train_loss": j.get("final_train_loss"), "steps": s.llama_steps,
            "n_kv_head": s.llama_kv, "intermediate_size": s.llama_i,
            "op_profile": {
                "estimated_step_ms": prof.get("estimated_step_ms"),
                "measured_op_ms": prof.get("measured_op_ms"),
                "categories": {c.get("category"): {k: c.get(k) for k in (
                    "ops", "estimated_ms", "measured_ms")}
                    for c in prof.get("categories", []) if isinstance(c, dict)}},
        })
    llama["summary"] = llama_line(llama)
    return llama


def llama_line(llama):
    if not llama.get("ok"):
        return f"llama: not ok: {str(llama.get('error'))[:200]}"
    tps, mfu, prof = llama.get("tokens_per_s"), llama.get("mfu"), llama["op_profile"]
    return (f"llama: tokens/s {tps if tps is None else round(tps)}, MFU "
            f"{mfu if mfu is None else round(mfu, 4)}, peak "
            f"{llama.get('peak_device_memory_bytes')} B, op ms measured "
            f"{prof.get('measured_op_ms')} (estimated {prof.get('estimated_step_ms')})")
