"""The run's settings (environment variables) and the phases each --call runs."""

import os

# The phases of each call, in the order they run: the most informative first, so that a run
# cut short still has what matters most (docs/GPUS.md says why this order).
CALLS = {
    "1": ["ours", "pytorch", "pytorch_compiled", "attention", "tests", "bench"],
    "2": ["ours", "pytorch", "ours_again", "llama", "offload", "ncu_attention"],
    "all": ["ours", "pytorch", "ours_again", "pytorch_compiled", "attention", "tests", "bench",
            "llama", "offload", "ncu_attention", "ncu_step"],
}

# RUN_BUDGET_S's default per call: call 1 fits about five minutes of the device tool's 15,
# call 2 what is left of them on the still-warm machine, "all" a whole 10-minute command.
DEFAULT_BUDGET_S = {"1": 300, "2": 420, "all": 540}

# The SKIP names that leave a phase out (SKIP=pytorch leaves out both PyTorch runs,
# SKIP=ours our job and its A/B/A repeat, SKIP=ncu both profiles).
SKIP_NAMES = {
    "ours": ("ours",),
    "pytorch": ("pytorch",),
    "pytorch_compiled": ("pytorch", "pytorch_compiled"),
    "ours_again": ("ours", "ours_again"),
    "attention": ("attention",),
    "tests": ("tests",),
    "bench": ("bench",),
    "llama": ("llama",),
    "offload": ("offload",),
    "ncu_attention": ("ncu",),
    "ncu_step": ("ncu",),
}

# GPT-2 124M.
MODEL = {"V": 50304, "T": 1024, "C": 768, "L": 12, "H": 12}


def _int(env, name, default):
    value = env.get(name, "")
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"run.sh: {name}={value!r}: not an integer")


class Settings:
    """Every setting of the run, read once from the environment (run.py's docstring lists
    them with their defaults)."""

    def __init__(self, call, env=None):
        env = os.environ if env is None else env
        self.call = call
        self.python = env.get("PYTHON") or "python3"
        self.cuda_home = env.get("CUDA_HOME") or "/usr/local/cuda"
        self.cuda_lib_dirs = env.get("FSDP_CUDA_LIB_DIRS", "")
        self.prefer_wheel = env.get("FSDP_PREFER_WHEEL", "0") == "1"
        self.pt_steps = _int(env, "PT_STEPS", 20)
        self.pt_warmup = _int(env, "PT_WARMUP", 5)
        # Our job times the steps PyTorch times, after the same warm-up.
        # Our job times each step from its start to the next one's (its last step is not
        # timed), so PT_STEPS timed steps take one step more.
        self.steps = _int(env, "STEPS", self.pt_warmup + self.pt_steps + 1)
        self.batch = _int(env, "BATCH", 16)
        self.log_every = _int(env, "LOG_EVERY", 5)
        self.ours_world_size = _int(env, "OURS_WORLD_SIZE", 1)
        self.test_timeout_s = _int(env, "TEST_TIMEOUT_S", 120)
        self.tests_budget_s = _int(env, "TESTS_BUDGET_S", 200)
        self.attn_timeout_s = _int(env, "ATTN_TIMEOUT_S", 60)
        self.bench_timeout_s = _int(env, "BENCH_TIMEOUT_S", 60)
        self.ours_timeout_s = _int(env, "OURS_TIMEOUT_S", 150)
        self.pt_timeout_s = _int(env, "PT_TIMEOUT_S", 150)
        self.pt_compile_timeout_s = _int(env, "PT_COMPILE_TIMEOUT_S", 180)
        self.offload_steps = _int(env, "OFFLOAD_STEPS", 10)
        self.offload_timeout_s = _int(env, "OFFLOAD_TIMEOUT_S", 90)
        self.llama_steps = _int(env, "LLAMA_STEPS", 15)
        self.llama_timeout_s = _int(env, "LLAMA_TIMEOUT_S", 90)
        self.llama_kv = _int(env, "LLAMA_KV", 4)
        self.llama_i = _int(env, "LLAMA_I", 2048)
        self.ncu = env.get("NCU", "")
        self.ncu_steps = _int(env, "NCU_STEPS", 2)
        self.ncu_timeout_s = _int(env, "NCU_TIMEOUT_S", 150)
        self.run_budget_s = _int(env, "RUN_BUDGET_S", DEFAULT_BUDGET_S[call])
        self.ours_extra_args = env.get("OURS_EXTRA_ARGS", "").split()
        self.skip = [x for x in env.get("SKIP", "").split(",") if x]
        self.peak_tflops = float(env.get("PEAK_TFLOPS") or 0)
        self.out = env.get("OUT", "")
        self.run_work = env.get("RUN_WORK", "")
        self.phases = CALLS[call]

    def skipped(self, phase):
        """Whether SKIP leaves the phase out."""
        return any(name in self.skip for name in SKIP_NAMES[phase])

    def attention_args(self):
        """The attention benchmarks' flags: GPT-2's attention at BATCH."""
        return [f"--batch={self.batch}", f"--seq_len={MODEL['T']}", f"--n_head={MODEL['H']}",
                f"--head_dim={MODEL['C'] // MODEL['H']}"]
