"""One function per phase of the run (run.py's docstring lists them in order).

Each takes the run (run.py's Run: settings, bundle, work directory, log, records, runner,
LD_LIBRARY_PATH, our job's retry switches) and records its steps; none raises for a step
that fails. PyTorch's scripts run with this process's environment (PyTorch finds its own
libraries), our binaries with the bundle's LD_LIBRARY_PATH.
"""

import glob
import os
import shutil
import subprocess
import time

from . import job
from .settings import MODEL


def _bundle_file(run, *parts):
    return os.path.join(run.bundle, *parts)


def _executable(run, step, *parts):
    """The bundle's binary, or None after recording `step` as missing."""
    path = _bundle_file(run, *parts)
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    run.records.record(step, 127, 0, f"{'/'.join(parts)} is not in the bundle")
    return None


def _python_script(run, step, script, log_name, args, timeout_s):
    """One of bench/'s PyTorch scripts under $PYTHON (recorded as missing without it)."""
    if not shutil.which(run.settings.python):
        run.records.record(step, 127, 0, f"{run.settings.python} not found")
        return 127
    argv = [run.settings.python, _bundle_file(run, "bench", script)] + args
    return run.runner.run(step, timeout_s, run.path(log_name), argv)


def ours(run):
    """Our main job on GPT-2 124M, with the retries of job.py."""
    if _executable(run, "ours", "bin", "main_job"):
        job.run_main_with_retries(run)


def _pytorch(run, step, log_name, compiled):
    s, m = run.settings, MODEL
    args = [f"--vocab_size={m['V']}", f"--block_size={m['T']}", f"--seq_len={m['T']}",
            f"--n_embd={m['C']}", f"--n_layer={m['L']}", f"--n_head={m['H']}",
            f"--batch_size={s.batch}", f"--steps={s.pt_steps}", f"--warmup={s.pt_warmup}",
            "--param_dtype=bfloat16"]
    if s.peak_tflops > 0:
        args.append(f"--peak_tflops={s.peak_tflops:g}")
    if compiled:
        args.append("--compile")
    timeout_s = s.pt_compile_timeout_s if compiled else s.pt_timeout_s
    _python_script(run, step, "pytorch_fsdp2.py", log_name, args, timeout_s)


def pytorch(run):
    """PyTorch FSDP2 (bench/pytorch_fsdp2.py) on the same model, batch and steps, eager."""
    _pytorch(run, "pytorch", "pytorch_fsdp2.log", compiled=False)


def pytorch_compiled(run):
    """The same with torch.compile on each block (--compile)."""
    _pytorch(run, "pytorch_compiled", "pytorch_fsdp2_compiled.log", compiled=True)


def ours_again(run):
    """Our job once more after PyTorch's run: the second A of A/B/A."""
    if _executable(run, "ours_again", "bin", "main_job"):
        job.run_job(run, "ours_again", run.settings.ours_timeout_s, "main_job_again.log",
                    "main_job_again", run.settings.steps, job.main_job_flags(run))


def attention(run):
    """Fused attention at GPT-2's shape: bin/attention_bench, then PyTorch SDPA."""
    args = run.settings.attention_args()
    binary = _executable(run, "attention", "bin", "attention_bench")
    if binary:
        run.runner.run("attention", run.settings.attn_timeout_s,
                       run.path("attention_bench.log"), [binary] + args, run.our_env())
    _python_script(run, "attention_pytorch", "attention_torch.py", "attention_torch.log", args,
                   run.settings.attn_timeout_s)


def tests(run):
    """Every gpu-tagged test binary in bin/tests, within TESTS_BUDGET_S in all."""
    start, ran = time.time(), 0
    for t in sorted(glob.glob(_bundle_file(run, "bin", "tests", "*"))):
        if not (os.path.isfile(t) and os.access(t, os.X_OK)):
            continue
        name = os.path.basename(t)
        left = run.settings.tests_budget_s - int(time.time() - start)
        if left <= 5:
            run.log.say(f"gpu test {name}: not run (the tests' budget of "
                        f"{run.settings.tests_budget_s} s is spent)")
            run.records.record(f"test:{name}", -1, 0, "not run: tests budget spent")
            continue
        tmp = run.path("tests", name + ".tmp")
        os.makedirs(tmp, exist_ok=True)
        runfiles = t + ".runfiles" if os.path.isdir(t + ".runfiles") else tmp
        env = run.our_env({"TEST_TMPDIR": tmp, "TEST_SRCDIR": runfiles,
                           "RUNFILES_DIR": runfiles, "TEST_WORKSPACE": "fsdp"})
        run.runner.run(f"test:{name}", min(left, run.settings.test_timeout_s),
                       run.path("tests", name + ".log"), [t, "--gtest_color=no"], env)
        ran += 1
    run.log.say(f"gpu tests: {ran} binaries run")


def bench(run):
    """bin/collectives_bench over the GPUs (at most 8); left out with one."""
    nproc = max(1, min(run.ngpu, 8))
    if nproc == 1:
        run.records.record("bench", None, 0, "skipped (one process)", skipped=True)
        run.log.say("bench: skipped (one process)")
        return
    binary = _executable(run, "bench", "bin", "collectives_bench")
    if binary:
        run.runner.run("bench", run.settings.bench_timeout_s, run.path("nccl_bench.log"),
                       [binary, "--backend=nccl", f"--nproc={nproc}",
                        f"--max_bytes={1 << 30}"], run.our_env())


def offload(run):
    """Our job with --cpu_offload (NOTE [CPU offload] in fsdp/options.h)."""
    if _executable(run, "offload", "bin", "main_job"):
        job.run_job(run, "offload", run.settings.offload_timeout_s, "offload.log",
                    "main_job_offload", run.settings.offload_steps, ["--cpu_offload"])


def llama(run):
    """Our job on a Llama of GPT-2 small's widths (--model=llama) with --profile_ops."""
    s = run.settings
    if _executable(run, "llama", "bin", "main_job"):
        job.run_job(run, "llama", s.llama_timeout_s, "llama.log", "main_job_llama",
                    s.llama_steps, ["--model=llama", f"--n_kv_head={s.llama_kv}",
                                    f"--intermediate_size={s.llama_i}", "--profile_ops"])


def find_ncu(run):
    """$NCU, else ncu on PATH, in $CUDA_HOME/bin or under /opt/nvidia/nsight-compute."""
    if run.settings.ncu:
        return run.settings.ncu
    candidates = [shutil.which("ncu"), os.path.join(run.settings.cuda_home, "bin", "ncu")]
    candidates += sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _ncu_profile(run, step, argv, env):
    """The first launch of each launch configuration of argv under ncu into <step>.ncu-rep,
    then its raw page as <step>.csv."""
    ncu = find_ncu(run)
    if not ncu:
        run.records.record(step, 127, 0, "ncu not found (PATH, "
                           f"{run.settings.cuda_home}/bin, /opt/nvidia/nsight-compute)")
        run.log.say(f"{step}: ncu not found")
        return
    report, csv = run.path(step + ".ncu-rep"), run.path(step + ".csv")
    for f in (report, csv):
        if os.path.exists(f):
            os.remove(f)
    sections = ["SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats",
                "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables"]
    run.runner.run(step, run.settings.ncu_timeout_s, run.path(step + ".log"),
                   [ncu, "--clock-control", "none", "--target-processes", "all",
                    "--filter-mode", "per-launch-config", "--launch-count", "1"]
                   + [x for s in sections for x in ("--section", s)]
                   + ["-f", "-o", run.path(step)] + argv, env)
    if not os.path.isfile(report):
        return
    with open(csv, "w") as out, open(run.path(step + ".log"), "a") as err:
        try:
            subprocess.run([ncu, "--import", report, "--csv", "--page", "raw"], stdout=out,
                           stderr=err, stdin=subprocess.DEVNULL, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError) as e:
            run.log.say(f"{step}: reading the report failed ({e}; log {step}.log)")


def ncu_attention(run):
    """Nsight Compute on every launch configuration of bin/attention_bench."""
    binary = _executable(run, "ncu_attention", "bin", "attention_bench")
    if binary:
        _ncu_profile(run, "ncu_attention", [binary] + run.settings.attention_args(),
                     run.our_env())


def ncu_step(run):
    """Nsight Compute on NCU_STEPS steps of our job, without GEMM tuning: its candidates
    would be hundreds of launch configurations to profile once each, none of them the
    steady state's (NOTE [GEMM tuning] in nn/cuda/gemm.h)."""
    if not _executable(run, "ncu_step", "bin", "main_job"):
        return
    out_dir = run.path("main_job_ncu")
    shutil.rmtree(out_dir, ignore_errors=True)
    _ncu_profile(run, "ncu_step", job.job_argv(run, out_dir, run.settings.ncu_steps, []),
                 job.job_env(run, {"FSDP_GEMM_TUNING": "0"}))


PHASES = {
    "ours": ours,
    "pytorch": pytorch,
    "pytorch_compiled": pytorch_compiled,
    "ours_again": ours_again,
    "attention": attention,
    "tests": tests,
    "bench": bench,
    "llama": llama,
    "offload": offload,
    "ncu_attention": ncu_attention,
    "ncu_step": ncu_step,
}
