"""The copy to $OUT after each phase, so that a run cut off from outside still leaves the
summary of what finished.

At most 8 files (the device tool's limit), each cut to its last 16 MiB; files that go
together share one:
  summary.json, main_job_summary.json  as written
  run.log              run.sh's lines, then ldd.txt, the collectives benchmark's JSON and
                       the last 60 lines of each failed attempt of the main job
  gpu_tests.log        every test binary's output
  attention.log        both attention benchmarks' output, ours first
  main_job.log         the main job's (last attempt's) output, then its A/B/A repeat's
  pytorch_fsdp2.log    PyTorch FSDP2's output, then the compiled run's
  ncu.csv              both Nsight Compute reports' raw pages
"""

import glob
import os

LIMIT_BYTES = 16 << 20
FILES = ("summary.json", "run.log", "gpu_tests.log", "attention.log", "main_job.log",
         "main_job_summary.json", "pytorch_fsdp2.log", "ncu.csv")


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def sections(run, names, first_bare=False):
    """The files' contents, each under a line "== <name>" (the first without one when
    first_bare); None when none exists."""
    parts = []
    for i, name in enumerate(names):
        data = _read(run.path(name))
        if data is None:
            continue
        bare = first_bare and i == 0
        parts.append(data if bare else b"== " + name.encode() + b"\n" + data.rstrip(b"\n") + b"\n")
    return b"".join(parts) if parts else None


def failed_attempt_logs(run):
    out = []
    for a in getattr(run, "attempts", []):
        if a["step"] == "ours":
            continue
        name = f"main_job_{a['step'][len('ours_'):]}.log"
        data = _read(run.path(name))
        if data is not None:
            out.append(f"== {name} (the main job's failed attempt {a['step']}, "
                       f"{a['attempt']}: its last 60 lines)\n".encode() + data)
    return out


def contents(run):
    """Each file of $OUT and its bytes (None: not there yet)."""
    tests = sorted(glob.glob(run.path("tests", "*.log")))
    run_log = [_read(run.path("run.log")) or b"", b"== ldd.txt\n",
               _read(run.path("ldd.txt")) or b""]
    bench = sections(run, ["nccl_bench.json"])
    return {
        "summary.json": _read(run.path("summary.json")),
        "run.log": b"".join(run_log + ([bench] if bench else []) + failed_attempt_logs(run)),
        "gpu_tests.log": b"".join(_read(t) or b"" for t in tests),
        "attention.log": sections(run, ["attention_bench.log", "attention_torch.log"]),
        "main_job.log": sections(run, ["main_job.log", "main_job_again.log"], first_bare=True),
        "main_job_summary.json": _read(run.path("main_job_summary.json")),
        "pytorch_fsdp2.log": sections(run, ["pytorch_fsdp2.log", "pytorch_fsdp2_compiled.log"],
                                      first_bare=True),
        "ncu.csv": sections(run, ["ncu_attention.csv", "ncu_step.csv"]),
    }


def copy_out(run):
    """Writes the files to $OUT (nothing without it)."""
    if not run.settings.out:
        return
    try:
        os.makedirs(run.settings.out, exist_ok=True)
    except OSError:
        return
    for name, data in contents(run).items():
        if data is None or (not data and name != "gpu_tests.log"):
            continue
        with open(os.path.join(run.settings.out, name), "wb") as f:
            f.write(data[-LIMIT_BYTES:])
