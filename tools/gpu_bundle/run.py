#!/usr/bin/env python3
"""The GPU acceptance run, from inside the bundle tools/gpu_bundle.sh makes, on a machine
with NVIDIA GPUs, a driver, the CUDA runtime libraries and Python 3.8+ with PyTorch (no
Bazel, no network). run.sh is its entry point:

  tar xJf gpu_bundle.tar.xz -C /tmp && /tmp/gpu_bundle/run.sh            # --call=1
  /tmp/gpu_bundle/run.sh --call=2       # the second call, on the still-warm machine
  /tmp/gpu_bundle/run.sh --call=all     # everything, for a machine with time
  OUT=/some/dir BATCH=16 /tmp/gpu_bundle/run.sh

Calls (tools/gpu_bundle/README.md has the device tool's commands for each). The phases run
in this order, the most informative first, each step under a timeout (a failing step is
recorded and the run goes on):
  --call=1 (default, RUN_BUDGET_S 300): ours, pytorch, pytorch_compiled, attention, tests,
      bench
  --call=2 (RUN_BUDGET_S 420): ours, pytorch, ours_again (our job and PyTorch eager in
      A/B/A order), llama, offload, ncu_attention
  --call=all (RUN_BUDGET_S 540): ours, pytorch, ours_again, pytorch_compiled, attention,
      tests, bench, llama, offload, ncu_attention, ncu_step

First, always (gpu_run/libraries.py): nvidia-smi -L, ldd --version; the CUDA libraries our
binaries need (lib/cuda_sonames.txt) are looked for in $FSDP_CUDA_LIB_DIRS, then the CUDA
toolkit ($CUDA_HOME), then the nvidia-* wheels of $PYTHON (FSDP_PREFER_WHEEL=1: the wheels
first), then ldconfig's cache; LD_LIBRARY_PATH for our binaries is the bundle's lib/ (and
lib/compat's libstdc++/libgcc_s only where this machine's are too old), those folders, then
the caller's; ldd -r of every binary names each symbol or library the machine lacks
(env.ldd_missing).

The phases (gpu_run/phases.py):
  ours              our main job on GPT-2 124M (V=50304 T=1024 C=768 L=12 H=12) in bf16 on
                    one GPU, --steps=STEPS --throughput_warmup_steps=PT_WARMUP --profile_ops; when it
                    dies, the retries of gpu_run/job.py (FSDP_ATTENTION_SHAPES=reference
                    FSDP_ATTENTION_TUNING=0, then FSDP_GEMM_TUNING=0 as well, then
                    --forward_prefetch=false with more than one process); the summary's
                    ours.figures_from names the attempt that measured. Its tokens/s: the
                    job's device_timed figure (CUDA events), else its host clock's.
  pytorch           bench/pytorch_fsdp2.py (fully_shard per block, eager) on the same model
                    and batch, PT_WARMUP untimed steps then PT_STEPS timed with CUDA events.
  ours_again        our job once more: with ours and pytorch, the A/B/A order whose mean
                    the summary's aba.ratio compares.
  pytorch_compiled  the same PyTorch run with torch.compile on each block (--compile).
  attention         fused attention at GPT-2's shape (B=BATCH T=1024 H=12 hd=64):
                    bin/attention_bench (each block shape, forward and backward, checked
                    bit-identical to shape 0, then the tuner's choice), then
                    bench/attention_torch.py (SDPA's flash, cuDNN and efficient backends).
  tests             every gpu-tagged gtest binary in bin/tests (TESTS_BUDGET_S in all).
  bench             bin/collectives_bench --backend=nccl over the GPUs; "skipped (one
                    process)" with one GPU.
  llama             our job on a Llama of GPT-2 small's widths (--model=llama, LLAMA_KV
                    key-value heads, a SwiGLU of LLAMA_I) with --profile_ops.
  offload           our job with --cpu_offload (NOTE [CPU offload] in fsdp/options.h).
  ncu_attention     Nsight Compute on the first launch of each launch configuration of
                    bin/attention_bench (per kernel: duration, throughputs, occupancy,
                    registers, busiest pipes, bank conflicts, warp stalls). Diagnostic:
                    its failure does not fail the run.
  ncu_step          the same over NCU_STEPS steps of our job, GEMM tuning off.
Our job's later runs (ours_again, llama, offload, ncu_step) keep the switches of the
attempt of `ours` that ran last.

Output: lines "run.sh: ..." (also in run.log; "run.sh: phase <i>/<n>: <name>" opens each
phase), then ONE JSON line, last: "gpu_run_summary" (gpu_run/summary.py: the call and its
phases, gpu tests, tokens/s of each side with its basis and the ratios, our MFU (of our
tokens/s above; the job's host-timed one in ours.mfu), peak memory and op profile, the attempts of our job, both attention benchmarks, Llama, offload,
ncu, each step's record, the environment). The logs and the summary go to the work
directory ($RUN_WORK, default a new /tmp/gpu_run.*) and, when $OUT is set, after each
phase to $OUT (gpu_run/outdir.py: at most 8 files, each cut to 16 MiB), so a run cut off
from outside still leaves what finished. SIGTERM or SIGINT ends the running step and the
run with the summary of what ran.

Settings (environment): PT_STEPS (timed steps, 20) and PT_WARMUP (untimed steps before
them, 5) for both sides; STEPS (our job's steps in all, PT_WARMUP + PT_STEPS + 1: it times
each step up to the next one's start); BATCH (sequences per step, 16); LOG_EVERY (5); OURS_WORLD_SIZE (our job's ranks, 1; more need as
many GPUs, and PyTorch still runs on one); PYTHON (python3: runs this driver and PyTorch's
scripts); CUDA_HOME (/usr/local/cuda); FSDP_CUDA_LIB_DIRS; FSDP_PREFER_WHEEL=1;
RUN_BUDGET_S (the whole run; per call above: every step's limit is cut so that the summary
comes before it); OURS_TIMEOUT_S (150), PT_TIMEOUT_S (150), PT_COMPILE_TIMEOUT_S (180),
ATTN_TIMEOUT_S (each attention benchmark, 60), TEST_TIMEOUT_S (per test binary, 120),
TESTS_BUDGET_S (200), BENCH_TIMEOUT_S (60), LLAMA_STEPS (15), LLAMA_TIMEOUT_S (90),
LLAMA_KV (4), LLAMA_I (2048), OFFLOAD_STEPS (10), OFFLOAD_TIMEOUT_S (90), NCU (default: on
PATH, in $CUDA_HOME/bin or under /opt/nvidia/nsight-compute), NCU_STEPS (2), NCU_TIMEOUT_S
(each profile, 150); OURS_EXTRA_ARGS (more flags for every run of our job); SKIP (a comma
list of ours, pytorch, pytorch_compiled, ours_again, attention, tests, bench, llama,
offload, ncu: phases to leave out; pytorch leaves out both PyTorch runs, ours also
ours_again); PEAK_TFLOPS (for the MFU estimate; default from the GPU's name); OUT.

Exit status: 0 when every step that ran passed (ncu's and those skipped on purpose aside),
1 otherwise, 2 for bad arguments.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import traceback

from gpu_run import libraries, ncu, outdir, phases, summary
from gpu_run.settings import CALLS, Settings
from gpu_run.steps import CutOff, Log, Records, Runner, raise_cut_off


class Run:
    """What the phases share: the settings, the bundle, the work directory, the log, the
    steps' records and runner, LD_LIBRARY_PATH, and our job's retry switches."""

    def __init__(self, settings):
        self.settings = settings
        self.bundle = os.path.dirname(os.path.abspath(__file__))
        self.work = settings.run_work or tempfile.mkdtemp(prefix="gpu_run.", dir="/tmp")
        os.makedirs(self.path("tests"), exist_ok=True)
        self.log = Log(self.path("run.log"))
        self.records = Records(self.path("steps.json"))
        self.runner = Runner(self.log, self.records, settings.run_budget_s)
        self.ngpu = 0
        self.ld_path = ""
        self.job_env = {}    # the switches of the main job's last attempt
        self.job_args = []   # its flags
        self.attempts = []   # each attempt of the main job (gpu_run/job.py)

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def our_env(self, extra=None):
        """This process's environment with our LD_LIBRARY_PATH (and `extra`)."""
        env = dict(os.environ, LD_LIBRARY_PATH=self.ld_path)
        env.update(extra or {})
        return env


def checkpoint(run):
    """The summary so far into summary.json, and the logs into $OUT."""
    try:
        s = summary.assemble(run)
    except Exception as e:  # a bug here must not cost the run its line
        with open(run.path("summary.err"), "a") as f:
            traceback.print_exc(file=f)
        s = summary.fallback(run, f"{type(e).__name__}: {e}"[:300])
    with open(run.path("summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    outdir.copy_out(run)
    return s


def phase_lines(name, s):
    """The lines run.sh says after a phase, from the summary."""
    if name in ("pytorch", "pytorch_compiled", "ours_again") and "tokens_per_s" in s:
        return [summary.tokens_line(s)]
    if name == "attention" and (s.get("attention") or {}).get("summary"):
        return [s["attention"]["summary"]]
    if name == "llama" and "llama" in s:
        return [s["llama"]["summary"]]
    if name.startswith("ncu_") and "ncu" in s:
        key = name[len("ncu_"):]
        return ncu.lines(key, s["ncu"][key])
    return []


def run_phases(run):
    names = run.settings.phases
    for i, name in enumerate(names):
        run.log.say(f"phase {i + 1}/{len(names)}: {name}")
        if run.settings.skipped(name):
            run.log.say(f"{name}: skipped (SKIP)")
            continue
        phases.PHASES[name](run)
        for line in phase_lines(name, checkpoint(run)):
            run.log.say(line)


def main(argv):
    p = argparse.ArgumentParser(prog="run.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--call", choices=sorted(CALLS), default="1",
                   help="which phases run (default 1)")
    args = p.parse_args(argv)
    run = Run(Settings(args.call))
    signal.signal(signal.SIGTERM, raise_cut_off)
    signal.signal(signal.SIGINT, raise_cut_off)
    try:
        run.log.say(f"bundle {run.bundle}, work directory {run.work}, --call={args.call}: "
                    f"{', '.join(run.settings.phases)} (RUN_BUDGET_S={run.settings.run_budget_s})")
        for line in summary.read(os.path.join(run.bundle, "MANIFEST.txt")).splitlines()[:3]:
            run.log.say(line)
        run.ngpu, run.ld_path = libraries.discover(run)
        run_phases(run)
        run.log.say(f"done in {run.runner.elapsed()} s; summary:")
    except CutOff as e:
        run.log.say(f"cut off ({e}) after {run.runner.elapsed()} s; the summary of what ran:")
    s = checkpoint(run)
    print(json.dumps(s, separators=(",", ":")), flush=True)
    return 0 if s.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
