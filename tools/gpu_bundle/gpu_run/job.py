"""Our main job: its command line, and the retries that route around a faulty kernel.

GPT-2 124M in bf16 on OURS_WORLD_SIZE GPUs (default one) over NCCL. When the job dies (a
non-zero exit, not a timeout), it runs again with more of what could be at fault turned
off, each retry keeping the switches of the one before:

  retry 1  FSDP_ATTENTION_SHAPES=reference FSDP_ATTENTION_TUNING=0: the fused attention on
           its reference block shapes, its tuner off (NOTE [Flash block shapes] in
           kernels/cuda/flash_attention.h);
  retry 2  FSDP_GEMM_TUNING=0 as well: the GEMM tuner off (NOTE [GEMM tuning] in
           nn/cuda/gemm.h);
  retry 3  --forward_prefetch=false as well (also after a timeout), only with more than one
           process: forward prefetch overlaps the next unit's all-gather with a unit's
           kernels, which one process has nothing to overlap with.

A retry whose switches are already in force is left out. The failed attempt keeps its
record under the name of what the next attempt turns off (ours_attention_tuned,
ours_tuned, ours_prefetch) and its log's last 60 lines in main_job_<that name>.log; the
last attempt is the step "ours". Its switches hold for every later run of the job (the A/B/A
repeat, offload, Llama, ncu).
"""

import os
import shutil

from . import settings as settings_mod
from . import steps as steps_mod

ATTENTION_REFERENCE = {"FSDP_ATTENTION_SHAPES": "reference", "FSDP_ATTENTION_TUNING": "0"}
GEMM_TUNING_OFF = {"FSDP_GEMM_TUNING": "0"}
PREFETCH_OFF = ["--forward_prefetch=false"]


class Retry:
    """One retry: the switches it runs with (its own and those of the retries before it),
    the record and summary key the failed attempt before it keeps, and when it applies."""

    def __init__(self, number, name, env, args, failed_step, error_key, after_timeout,
                 min_processes):
        self.number, self.name, self.env, self.args = number, name, env, args
        self.failed_step, self.error_key = failed_step, error_key
        self.after_timeout, self.min_processes = after_timeout, min_processes

    @property
    def label(self):
        switches = [f"{k}={v}" for k, v in self.env.items()] + self.args
        return f"retry {self.number} ({' '.join(switches)})"


def retries():
    both = dict(ATTENTION_REFERENCE, **GEMM_TUNING_OFF)
    return [
        Retry(1, "attention_reference", ATTENTION_REFERENCE, [], "ours_attention_tuned",
              "attention_reference_after", after_timeout=False, min_processes=1),
        Retry(2, "gemm_tuning_off", both, [], "ours_tuned", "gemm_tuning_off_after",
              after_timeout=False, min_processes=1),
        Retry(3, "prefetch_off", both, PREFETCH_OFF, "ours_prefetch",
              "forward_prefetch_off_after", after_timeout=True, min_processes=2),
    ]


def job_argv(run, out_dir, steps, flags):
    """Our main job on GPT-2 124M in bf16 at BATCH, with the retry's flags and
    OURS_EXTRA_ARGS last."""
    s, m = run.settings, settings_mod.MODEL
    return ([os.path.join(run.bundle, "bin", "main_job"), "--device=cuda", "--backend=nccl",
             f"--world_size={s.ours_world_size}", "--param_dtype=bfloat16",
             f"--vocab_size={m['V']}", f"--block_size={m['T']}", f"--seq_len={m['T']}",
             f"--n_embd={m['C']}", f"--n_layer={m['L']}", f"--n_head={m['H']}",
             f"--batch_size={s.batch}", f"--steps={steps}", f"--log_every={s.log_every}",
             "--stages=fit", "--release=false", f"--output_dir={out_dir}"]
            + flags + run.job_args + s.ours_extra_args)


def job_env(run, extra=None):
    """Our libraries, the retry's switches, then `extra`."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = run.ld_path
    env.update(run.job_env)
    env.update(extra or {})
    return env


def run_job(run, step, timeout_s, log_name, dir_name, steps, flags, extra_env=None):
    """One run of our job into the work directory's dir_name (emptied first)."""
    out_dir = run.path(dir_name)
    shutil.rmtree(out_dir, ignore_errors=True)
    return run.runner.run(step, timeout_s, run.path(log_name),
                          job_argv(run, out_dir, steps, flags), job_env(run, extra_env))


def main_job_flags(run):
    """The main run's flags: the warm-up PyTorch has (steps left out of the throughput
    figures; --warmup_steps is the learning-rate warm-up), and the op profile."""
    return [f"--throughput_warmup_steps={run.settings.pt_warmup}", "--profile_ops"]


def run_main(run):
    """Our job once: the step "ours" (main_job.log, main_job/)."""
    return run_job(run, "ours", run.settings.ours_timeout_s, "main_job.log", "main_job",
                   run.settings.steps, main_job_flags(run))


def _adds_nothing(run, retry):
    in_force = dict(os.environ, **run.job_env)
    return (all(in_force.get(k) == v for k, v in retry.env.items())
            and all(a in run.job_args for a in retry.args))


def _keep_failed(run, retry):
    """The failed attempt's record as retry.failed_step, its log's end beside it."""
    run.records.rename("ours", retry.failed_step)
    lines = steps_mod.tail_lines(run.path("main_job.log"), 60)
    with open(run.path(f"main_job_{retry.failed_step[len('ours_'):]}.log"), "w") as f:
        f.write("".join(line + "\n" for line in lines))
    run.attempts[-1].update({"ok": False, "step": retry.failed_step,
                             "error_key": retry.error_key})


def run_main_with_retries(run):
    """The main job, retried as the module's docstring says; run.job_env, run.job_args
    and run.attempts say what ran."""
    run.attempts = [{"attempt": "first attempt", "step": "ours"}]
    rc = run_main(run)
    for retry in retries():
        timed_out = rc in (steps_mod.TIMEOUT_RC, 137)
        if rc in (0, steps_mod.BUDGET_RC, steps_mod.CUT_OFF_RC) or \
                (timed_out and not retry.after_timeout) or _adds_nothing(run, retry):
            continue
        if run.settings.ours_world_size < retry.min_processes:
            run.records.record(f"ours_{retry.name}", None, 0, "skipped (one process)",
                               skipped=True)
            run.log.say(f"main job: {retry.label}: skipped (one process)")
            continue
        _keep_failed(run, retry)
        run.job_env = dict(retry.env)
        run.job_args = list(retry.args)
        run.attempts.append({"attempt": retry.label, "step": "ours"})
        run.log.say(f"main job: again, {retry.label}")
        rc = run_main(run)
    run.attempts[-1]["ok"] = rc == 0
    summary = run.path("main_job", "summary.json")
    if os.path.isfile(summary):
        shutil.copyfile(summary, run.path("main_job_summary.json"))
    return rc
