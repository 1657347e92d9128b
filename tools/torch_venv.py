"""The virtual environment with PyTorch and transformers (from PyPI) that the repository's
test-data scripts run in, and how a script re-runs itself there.

    sys.path.insert(0, <this directory>)
    import torch_venv
    if not args.in_venv:
        return torch_venv.rerun_in_venv(__file__)   # the same arguments, plus --in_venv

bench/cpu/setup.sh torch makes the environment (under $FSDP_BENCH_CACHE, default
~/.cache/fsdp_bench); transformers is added at FSDP_TRANSFORMERS_VERSION (default 5.25.0)
when it is missing.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRANSFORMERS = os.environ.get("FSDP_TRANSFORMERS_VERSION", "5.25.0")


def venv_python():
    """The environment's python, made (and given transformers) if need be."""
    cache = os.environ.get("FSDP_BENCH_CACHE", os.path.expanduser("~/.cache/fsdp_bench"))
    subprocess.run(["bash", os.path.join(ROOT, "bench", "cpu", "setup.sh"), "torch"], check=True)
    python = os.path.join(cache, "torch-venv", "bin", "python")
    probe = subprocess.run([python, "-c", "import transformers, safetensors"],
                           capture_output=True)
    if probe.returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "-q", f"transformers=={TRANSFORMERS}"],
                       check=True)
    return python


def rerun_in_venv(script):
    """Runs `script` with this process's arguments and --in_venv in the environment;
    returns its exit code."""
    return subprocess.run([venv_python(), os.path.abspath(script), "--in_venv"]
                          + sys.argv[1:]).returncode
