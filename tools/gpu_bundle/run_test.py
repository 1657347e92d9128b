#!/usr/bin/env python3
"""The bundle's run.sh / run.py without a GPU, on a fake bundle: stand-in test binaries
(gtest-like), main job, attention and collectives benchmarks, PyTorch scripts, nvidia-smi,
ncu, and CUDA toolkit and wheel library folders. Each stand-in appends a line to a trace
file when it runs (the main job with the switches it saw), so the checks see what ran, in
which order, in which environment.

  python3 tools/gpu_bundle/run_test.py [path/to/run.sh [TestClass.test_name ...]]
(run.py and gpu_run/ beside that run.sh; the default is this file's folder)
"""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUN_SH = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(HERE, "run.sh")
SRC = os.path.dirname(RUN_SH)
ROOT = tempfile.mkdtemp(prefix="run_test.", dir=os.environ.get("TEST_TMPDIR", "/tmp"))
B = os.path.join(ROOT, "bundle")
sys.path.insert(0, SRC)
sys.dont_write_bytecode = True  # nothing written beside the sources
from gpu_run.settings import CALLS  # noqa: E402  (the phase lists under test)

# ---- the stand-ins ---------------------------------------------------------------------
GTESTS = {
    "a_test": """# Passes two cases and skips one; checks what run.py gives a test.
[ -d "$TEST_TMPDIR" ] || { echo "no TEST_TMPDIR"; exit 1; }
case "$LD_LIBRARY_PATH" in *"/bundle/lib:"*) ;; *) echo "bad LD_LIBRARY_PATH"; exit 1 ;; esac
echo "[ RUN      ] A.one"; echo "[       OK ] A.one (3 ms)"
echo "[ RUN      ] A.two"; echo "[       OK ] A.two (0 ms)"
echo "[ RUN      ] A.gpu"; echo "no CUDA device"; echo "[  SKIPPED ] A.gpu (0 ms)"
echo "[  PASSED  ] 2 tests."
""",
    "b_test": """echo "[ RUN      ] B.ok"; echo "[       OK ] B.ok (1 ms)"
echo "[ RUN      ] B.fails"; echo "b_test.cc:3: Failure"; echo "[  FAILED  ] B.fails (2 ms)"
echo "[ RUN      ] Param/B.typed/0"
echo "[  FAILED  ] Param/B.typed/0, where GetParam() = 4 (0 ms)"
echo "[  FAILED  ] 2 tests, listed below:"; echo "[  FAILED  ] B.fails"
exit 1
""",
    "c_test": """echo "[ RUN      ] C.fine"; echo "[       OK ] C.fine (1 ms)"
echo "[ RUN      ] C.crashes"
kill -ABRT $$
""",
    "d_test": """echo "[ RUN      ] D.hangs"
exec sleep 30
""",
}

MAIN_JOB = r"""
# The main job: checks its flags per role (from --output_dir), traces the switches it saw.
# FAKE_FAIL_UNLESS_REFERENCE=1: dies unless FSDP_ATTENTION_SHAPES=reference and
# FSDP_ATTENTION_TUNING=0; FAKE_FAIL_UNLESS_GEMM_OFF=1: dies unless FSDP_GEMM_TUNING=0;
# FAKE_FAIL_PREFETCH=1: dies unless --forward_prefetch=false; FAKE_HANG=1: the main run hangs.
out=""; prefetch=on
for a in "$@"; do
  case "$a" in
    --output_dir=*) out=${a#--output_dir=} ;;
    --forward_prefetch=false) prefetch=off ;;
  esac
done
role=$(basename "$out"); role=${role#main_job}; role=${role#_}; role=${role:-main}
echo "main_job $role shapes=${FSDP_ATTENTION_SHAPES:-} attention_tuning=${FSDP_ATTENTION_TUNING:-} gemm_tuning=${FSDP_GEMM_TUNING:-} prefetch=$prefetch $*" >>"$FAKE_TRACE"
need() {
  for want in "$@"; do
    case " $ARGS " in *" $want "*) ;; *) echo "main_job: missing flag $want in: $ARGS"; exit 2 ;; esac
  done
}
ARGS="$*"
case "$LD_LIBRARY_PATH" in *"/bundle/lib:"*) ;; *) echo "bad LD_LIBRARY_PATH"; exit 1 ;; esac
need --device=cuda --backend=nccl "--world_size=${OURS_WORLD_SIZE:-1}" --param_dtype=bfloat16 \
  --vocab_size=50304 --block_size=1024 --seq_len=1024 --n_embd=768 --n_layer=12 --n_head=12 \
  --batch_size=4
if [ "${FAKE_FAIL_UNLESS_REFERENCE:-0}" = 1 ] &&
    { [ "${FSDP_ATTENTION_SHAPES:-}" != reference ] || [ "${FSDP_ATTENTION_TUNING:-}" != 0 ]; }; then
  echo "step     1/7 (global 1)  loss 9.0000  tokens/s       99  peak r0 1 MiB"
  echo "main_job: Internal: flash attention backward: an illegal memory access"; exit 3
fi
if [ "${FAKE_FAIL_UNLESS_GEMM_OFF:-0}" = 1 ] && [ "${FSDP_GEMM_TUNING:-}" != 0 ]; then
  echo "main_job: Internal: the GEMM tuner exploded"; exit 3
fi
if [ "${FAKE_FAIL_PREFETCH:-0}" = 1 ] && [ $prefetch = on ]; then
  echo "main_job: Internal: the all-gather stream faulted"; exit 4
fi
mkdir -p "$out"
case $role in
  ncu)
    [ "${FSDP_GEMM_TUNING:-}" = 0 ] || { echo "main_job: GEMM tuning on under ncu"; exit 2; }
    need --steps=2; exit 0 ;;
  llama)
    need --model=llama --n_kv_head=4 --intermediate_size=2048 --steps=2 --profile_ops
    echo '{"world_size": 1, "tokens_per_second_after_warmup": 900.0, "mfu": 0.4, "peak_device_memory_bytes": [99999], "final_train_loss": 6.7, "op_profile": {"estimated_step_ms": 35.0, "measured_op_ms": 50.0, "categories": [{"category": "elementwise", "ops": 110, "estimated_ms": 6.2, "measured_ms": 9.0}]}}' >"$out/summary.json"
    exit 0 ;;
  offload)
    need --cpu_offload --steps=3
    echo '{"world_size": 1, "device_timed": {"tokens_per_second": 700.0}, "tokens_per_second_after_warmup": 500.0, "peak_device_memory_bytes": [61728], "final_train_loss": 6.9, "memory_estimate": 60000}' >"$out/summary.json"
    exit 0 ;;
esac
# The main run and its A/B/A repeat: the same flags, PyTorch's warm-up and steps.
need --steps=7 --throughput_warmup_steps=2 --profile_ops
if [ "${FAKE_HANG:-0}" = 1 ] && [ $role = main ]; then
  echo "step     1/7 (global 1)  loss 9.0000  tokens/s       97  peak r0 1 MiB"; exec sleep 60
fi
echo "step     2/7 (global 2)  loss 9.0000  tokens/s      100  peak r0 1 MiB"
echo "step     4/7 (global 4)  loss 8.0000  tokens/s     1100  peak r0 1 MiB"
echo "step     6/7 (global 6)  loss 7.0000  tokens/s     1200  peak r0 1 MiB"
after=1250.0; [ "${FAKE_NO_AFTER_WARMUP:-0}" = 1 ] && after=null
timed=1400.0; [ $role = again ] && timed=1200.0
device_timed="\"device_timed\": {\"basis\": \"CUDA events on the compute stream\", \"steps\": 4, \"step_ms_median\": 11.0, \"step_ms_mean\": 11.7, \"tokens_per_second\": $timed},"
[ "${FAKE_NO_DEVICE_TIMED:-0}" = 1 ] && device_timed=""
cat >"$out/summary.json" <<J
{"world_size": 1, "device": "cuda", "tokens_per_second": 800.0, "mfu": 0.55, $device_timed
 "tokens_per_second_after_warmup": $after, "warmup_steps_excluded": 2,
 "peak_device_memory_bytes": [123456], "final_train_loss": 6.5,
 "fsdp_memory_bound_bytes": 120000, "fit_losses": [9, 8, 7],
 "gemm_tuning": ["qkv: 8 answers; the first 0.300 ms, chosen another 0.250 ms; 3 kept",
   "fc: 5 answers; the first 0.100 ms, chosen the first 0.100 ms; 1 kept",
   "proj: not tuned (its output is all zeros)",
   "mlp: not tuned (no cuBLASLt algorithm: the fallback runs)"],
 "op_profile": {"estimated_step_ms": 57.0, "measured_op_ms": 80.0, "estimated_mfu": 0.25,
   "measured_op_mfu": 0.18, "launches": 1969, "host_syncs": 2, "ops": [],
   "categories": [{"category": "attention", "ops": 1356, "estimated_ms": 20.7,
     "measured_ms": 30.5, "achieved_tflops": 61.5, "achieved_gbps": 2535.0, "flops": 1}]}}
J
echo '{"world_size": 1, "tokens_per_second": 800.0}'
"""

ATTENTION_BENCH = r"""
# FAKE_ATTN_CRASH=1: dies without a word.
echo "attention_bench" >>"$FAKE_TRACE"
[ "${FAKE_ATTN_CRASH:-0}" = 1 ] && kill -ABRT $$
case "$LD_LIBRARY_PATH" in *"/bundle/lib:"*) ;; *) echo "bad LD_LIBRARY_PATH"; exit 1 ;; esac
for want in --batch=4 --seq_len=1024 --n_head=12 --head_dim=64; do
  case " $* " in *" $want "*) ;; *) echo "attention_bench: missing flag $want in: $*"; exit 2 ;; esac
done
echo "attention_bench: forward shape 0: median 0.3000 ms" >&2
echo '{"attention_bench":1,"ok":true,"error":null,"shape":{"B":4,"T":1024,"H":12,"head_dim":64,"out_bf16":true},"forward":[{"shape":0,"name":"64 queries, 4 warps","median_ms":0.3,"min_ms":0.29,"same_bits":true}],"backward":[{"kv":0,"q":0,"names":["a","b"],"median_ms":0.9,"same_bits":true}],"tuned":{"tuning_ms":{"forward":12.0,"backward":30.0},"forward_ms":0.25,"backward_ms":0.8,"report":"forward: shape 0 0.3 ms (chosen)"}}'
"""

COLLECTIVES_BENCH = r"""
echo "collectives_bench $*" >>"$FAKE_TRACE"
echo "I1203 rank 0: {not json} starting" >&2
cat <<'J'
{
  "benchmark": "collectives",
  "nproc": 2,
  "results": [
    {"op": "all_gather", "bytes": 4096, "algbw_GBps": 1.5, "busbw_GBps": 0.7},
    {"op": "all_gather", "bytes": 8192, "algbw_GBps": 2.5, "busbw_GBps": 1.2}
  ]
}
J
"""

PYTORCH_FSDP2 = r"""
import json, os, sys, time
args = dict(a.lstrip("-").split("=", 1) if "=" in a else (a.lstrip("-"), True) for a in sys.argv[1:])
compiled = args.get("compile") is True
with open(os.environ["FAKE_TRACE"], "a") as f:
    f.write("pytorch " + ("compiled" if compiled else "eager") + "\n")
assert args["batch_size"] == "4" and args["vocab_size"] == "50304", args
assert args["param_dtype"] == "bfloat16" and args["steps"] == "4" and args["warmup"] == "2", args
assert "/bundle/lib" not in os.environ.get("LD_LIBRARY_PATH", "")
if os.environ.get("FAKE_PT_HANG") == "1":
    with open(os.environ["FAKE_PT_PID"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
print("some warning from torch")
print(json.dumps({"ok": True, "tokens_per_s": 1600.0 if compiled else 1000.0,
                  "step_ms_median": 4.0, "step_ms_mean": 4.1, "wall_tokens_per_s": 990.0,
                  "timing_basis": "CUDA events (stand-in)", "mfu": 0.4,
                  "peak_device_memory_bytes": 999,
                  "config": {"optimizer": "AdamW fused", "compile": compiled}}))
"""

ATTENTION_TORCH = r"""
import json, os, sys
with open(os.environ["FAKE_TRACE"], "a") as f:
    f.write("attention_torch\n")
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
assert args == {"batch": "4", "seq_len": "1024", "n_head": "12", "head_dim": "64"}, args
assert "/bundle/lib" not in os.environ.get("LD_LIBRARY_PATH", "")
# What $OUT held when this phase ran: the summary copied after the phases before it.
if os.environ.get("OUT") and os.path.exists(os.path.join(os.environ["OUT"], "summary.json")):
    with open(os.path.join(os.environ["OUT"], "summary.json")) as f, \
            open(os.environ["FAKE_TRACE"] + ".out_at_attention", "w") as g:
        json.dump(sorted(json.load(f)["steps"]), g)
print("UserWarning: something from torch", file=sys.stderr)
print(json.dumps({"attention_torch": 1, "ok": True, "torch": "2.11.0",
                  "backends": {"flash": {"ok": True, "forward_ms": 0.2, "backward_ms": 0.5},
                               "cudnn": {"ok": False, "error": "RuntimeError: no"}}}))
"""

NVIDIA_SMI = r"""
case "$1" in
  -L) i=0; while [ $i -lt "${FAKE_NGPU:-1}" ]; do echo "GPU $i: NVIDIA H200 (UUID: GPU-fake$i)"; i=$((i + 1)); done ;;
  *) echo "NVIDIA H200, 580.95.05, 143771 MiB" ;;
esac
"""

NCU = r"""
# Runs the profiled command and writes a report naming it; with --import prints that
# report's raw page. FAKE_NCU_FAIL=1: cannot read the counters.
[ "${FAKE_NCU_FAIL:-0}" = 1 ] && { echo "==ERROR== Failed to initialize the profiler" >&2; exit 1; }
if [ "$1" = --import ]; then
  case "$(cat "$2")" in
    *attention_bench*) cat <<'CSV'
"ID","Process ID","Process Name","Kernel Name","launch__grid_size","launch__block_size","launch__registers_per_thread","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active","sm__maximum_warps_per_active_cycle_pct","smsp__issue_active.avg.pct_of_peak_sustained_active","sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
"","","","","","","register/thread","nsecond","%","%","%","%","%","%","%","","","",""
"0","7","attention_bench","FlashForward<64>","(16, 192, 1)","(128, 1, 1)","96","2,500","40.5","30.0","20.0","25.0","55.0","12.0","35.0","1.5","0.5","1,000","24"
"1","7","attention_bench","FlashBackwardKV<64>","(16, 192, 1)","(128, 1, 1)","128","1,500,000","60.0","45.0","18.0","18.75","70.0","20.0","48.0","2.0","3.0","0","0"
CSV
      ;;
    *) cat <<'CSV'
"ID","Process ID","Process Name","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed"
"","","","","usecond","%"
"0","8","main_job","LayerNormForward","12.5","33.0"
CSV
      ;;
  esac
  exit 0
fi
case " $* " in *" --clock-control none "*) ;; *) echo "fake ncu: no --clock-control none"; exit 2 ;; esac
o=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) o=$2; shift 2 ;;
    --clock-control|--target-processes|--filter-mode|--launch-count|--section) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ -n "$o" ] || { echo "fake ncu: no -o"; exit 2; }
echo "ncu $(basename "$1")" >>"$FAKE_TRACE"
"$@" || exit $?
echo "$1" >"$o.ncu-rep"
"""


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text, executable=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def make_bundle():
    os.makedirs(os.path.join(B, "gpu_run"))
    for name in ("run.sh", "run.py"):
        shutil.copy(os.path.join(SRC, name), os.path.join(B, name))
    os.chmod(os.path.join(B, "run.sh"), 0o755)
    for f in sorted(os.listdir(os.path.join(SRC, "gpu_run"))):
        if f.endswith(".py"):
            shutil.copy(os.path.join(SRC, "gpu_run", f), os.path.join(B, "gpu_run", f))
    write(os.path.join(B, "lib", "cuda_sonames.txt"),
          "libcudart.so.13\nlibcublas.so.13\nlibcublasLt.so.13\nlibnccl.so.2\n")
    os.makedirs(os.path.join(B, "lib", "compat"))
    write(os.path.join(B, "MANIFEST.txt"), "gpu_bundle test-commit\n")
    # The toolkit has cudart and cuBLAS but no NCCL; the wheels have NCCL and another cudart.
    for lib in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"):
        write(os.path.join(ROOT, "cuda", "lib64", lib), "")
    write(os.path.join(ROOT, "site", "nvidia", "nccl", "lib", "libnccl.so.2"), "")
    write(os.path.join(ROOT, "site", "nvidia", "cu13", "lib", "libcudart.so.13"), "")
    for name, body in GTESTS.items():
        write(os.path.join(B, "bin", "tests", name),
              f'#!/bin/sh\necho "test {name}" >>"$FAKE_TRACE"\n{body}', True)
    write(os.path.join(B, "bin", "main_job"), "#!/bin/bash\n" + MAIN_JOB, True)
    write(os.path.join(B, "bin", "attention_bench"), "#!/bin/sh\n" + ATTENTION_BENCH, True)
    write(os.path.join(B, "bin", "collectives_bench"), "#!/bin/sh\n" + COLLECTIVES_BENCH, True)
    write(os.path.join(B, "bench", "pytorch_fsdp2.py"), PYTORCH_FSDP2)
    write(os.path.join(B, "bench", "attention_torch.py"), ATTENTION_TORCH)
    write(os.path.join(ROOT, "fakebin", "nvidia-smi"), "#!/bin/sh\n" + NVIDIA_SMI, True)
    write(os.path.join(ROOT, "fakebin", "ncu"), "#!/bin/sh\n" + NCU, True)


class Result:
    """One run of run.sh: exit status, stdout, the summary, the trace, $OUT."""

    def __init__(self, name, rc, stdout):
        self.name, self.rc, self.stdout = name, rc, stdout
        self.out = os.path.join(ROOT, "out_" + name)
        self.work = os.path.join(ROOT, "work_" + name)
        self.trace_path = os.path.join(ROOT, "trace_" + name)
        lines = stdout.strip().splitlines()
        try:
            self.summary = json.loads(lines[-1]) if lines else {}
        except ValueError:
            self.summary = {}
        self.trace = read(self.trace_path).splitlines() if os.path.exists(self.trace_path) else []

    def run_log(self):
        return read(os.path.join(self.work, "run.log"))

    def phases(self):
        """The phases run.log says ran, in order."""
        return re.findall(r"^run\.sh: phase \d+/\d+: (\S+)$", self.run_log(), re.M)

    def ran(self):
        """The trace without arguments: what ran, in order (test binaries as "test")."""
        out = []
        for line in self.trace:
            words = line.split()
            out.append(" ".join(words[:2]) if words[0] in ("main_job", "pytorch", "ncu")
                       else "test" if words[0] == "test" else words[0])
        return [x for i, x in enumerate(out) if not (x == "test" and i and out[i - 1] == "test")]

    def job_lines(self, role):
        return [l for l in self.trace if l.startswith(f"main_job {role} ")]

    def out_file(self, name):
        return read(os.path.join(self.out, name))

    @property
    def steps(self):
        return self.summary.get("steps", {})


CACHE = {}


def run_bundle(name, args=(), outer_timeout=None, **env):
    """run.sh in the fake bundle, once per name (later calls get the same Result)."""
    if name in CACHE:
        return CACHE[name]
    base = {"PATH": os.path.join(ROOT, "fakebin") + os.pathsep + os.environ["PATH"],
            "PYTHONPATH": os.path.join(ROOT, "site"), "CUDA_HOME": os.path.join(ROOT, "cuda"),
            "BATCH": "4", "PT_STEPS": "4", "PT_WARMUP": "2", "OFFLOAD_STEPS": "3",
            "LLAMA_STEPS": "2", "TEST_TIMEOUT_S": "2",
            "OUT": os.path.join(ROOT, "out_" + name), "RUN_WORK": os.path.join(ROOT, "work_" + name),
            "FAKE_TRACE": os.path.join(ROOT, "trace_" + name),
            "FAKE_PT_PID": os.path.join(ROOT, "pt_pid_" + name),
            # run.py and the stand-in scripts under this test's Python (python3.8 run_test.py
            # checks the oldest Python run.py supports).
            "PYTHON": sys.executable}
    for k in ("SKIP", "RUN_BUDGET_S", "OUT", "FSDP_GEMM_TUNING", "FSDP_ATTENTION_SHAPES",
              "FSDP_ATTENTION_TUNING"):
        os.environ.pop(k, None)
    full = dict(os.environ)
    full.update(base)
    full.update(env)
    argv = [os.path.join(B, "run.sh")] + list(args)
    if outer_timeout:
        argv = ["timeout", "--preserve-status", str(outer_timeout)] + argv
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full,
                       universal_newlines=True)
    CACHE[name] = Result(name, p.returncode, p.stdout)
    return CACHE[name]


def call1():
    return run_bundle("call1")


class Call1Test(unittest.TestCase):
    """--call=1 (the default) on one GPU."""

    def test_phases_in_order_of_value(self):
        r = call1()
        self.assertEqual(r.phases(), CALLS["1"])
        self.assertEqual(CALLS["1"], ["ours", "pytorch", "pytorch_compiled", "attention",
                                      "tests", "bench"])
        self.assertEqual(r.ran(), ["main_job main", "pytorch eager", "pytorch compiled",
                                   "attention_bench", "attention_torch", "test"])
        self.assertEqual(r.summary["call"], "1")
        self.assertEqual(r.summary["phases"], CALLS["1"])

    def test_bench_skipped_with_one_process(self):
        r = call1()
        self.assertEqual(r.steps["bench"]["note"], "skipped (one process)")
        self.assertTrue(r.steps["bench"]["skipped"])
        self.assertEqual(r.summary["nccl_bench"], {"ok": False, "error": "skipped (one process)"})
        self.assertIn("run.sh: bench: skipped (one process)", r.stdout)

    def test_phases_of_other_calls_say_so(self):
        r = call1()
        for key in ("offload", "llama"):
            self.assertEqual(r.summary[key]["error"], "not in --call=1")
        self.assertNotIn("aba", r.summary)
        self.assertEqual(r.summary["ncu"]["attention"]["error"], "not in --call=1")

    def test_exit_status_and_json_line(self):
        r = call1()
        self.assertEqual(r.rc, 1)  # test binaries failed
        self.assertIs(r.summary["ok"], False)
        self.assertEqual(r.summary["gpu_run_summary"], 1)

    def test_gtest_counting(self):
        t = call1().summary["gpu_tests"]
        self.assertEqual((t["passed"], t["skipped"], t["failed"]), (4, 1, 4))
        self.assertIn("b_test:B.fails", t["failed_names"])
        self.assertIn("b_test:Param/B.typed/0", t["failed_names"])
        self.assertTrue(any(n.startswith("c_test:C.crashes (did not finish") for n in t["failed_names"]))
        self.assertTrue(any(n.startswith("d_test:D.hangs (did not finish: timed out")
                            for n in t["failed_names"]))
        self.assertTrue(t["binaries"]["a_test"]["ok"])
        self.assertFalse(t["binaries"]["b_test"]["ok"])

    def test_library_discovery(self):
        r = call1()
        env = r.summary["env"]
        self.assertEqual(env["libraries"]["libcudart.so.13"],
                         os.path.join(ROOT, "cuda/lib64/libcudart.so.13"))
        self.assertEqual(env["libraries"]["libnccl.so.2"],
                         os.path.join(ROOT, "site/nvidia/nccl/lib/libnccl.so.2"))
        self.assertTrue(env["ld_library_path"].startswith(
            f"{B}/lib:{ROOT}/cuda/lib64:{ROOT}/site/nvidia/nccl/lib"))
        self.assertEqual(env["ldd_missing"], [])
        self.assertEqual((env["gpu"], env["driver"]), ("NVIDIA H200", "580.95.05"))
        self.assertIn("GPU 0: NVIDIA H200", r.stdout)

    def test_ours_tokens_from_cuda_events_over_host_clock(self):
        s = call1().summary
        self.assertEqual(s["tokens_per_s"]["ours"], 1400.0)  # device_timed, not 1250
        self.assertTrue(s["ours"]["tokens_per_s_basis"].startswith("device_timed: CUDA events"))
        self.assertEqual(s["tokens_per_s_basis"]["ours"], s["ours"]["tokens_per_s_basis"])
        self.assertEqual(s["ours"]["device_timed"]["step_ms_median"], 11.0)
        self.assertEqual((s["ours"]["steps"], s["ours"]["warmup_steps"], s["ours"]["timed_steps"]),
                         (7, 2, 4))
        self.assertAlmostEqual(s["ours"]["mfu_estimate"],
                               s["config"]["flops_per_token"] * 1400 / 989e12)

    def test_pytorch_eager_and_compiled(self):
        s = call1().summary
        self.assertEqual(s["tokens_per_s"]["pytorch_fsdp2"], 1000.0)
        self.assertEqual(s["tokens_per_s"]["pytorch_fsdp2_compiled"], 1600.0)
        self.assertAlmostEqual(s["tokens_per_s_ratio"], 1.4)
        self.assertAlmostEqual(s["tokens_per_s_ratio_compiled"], 0.875)
        self.assertEqual(s["pytorch_fsdp2"]["timing_basis"], "CUDA events (stand-in)")
        self.assertEqual(s["pytorch_fsdp2"]["step_ms_median"], 4.0)
        self.assertEqual(s["pytorch_fsdp2"]["step_s_median"], 0.004)
        self.assertIs(s["pytorch_fsdp2_compiled"]["compile"], True)
        self.assertIs(s["pytorch_fsdp2"]["compile"], False)
        self.assertEqual((s["pytorch_fsdp2"]["steps"], s["pytorch_fsdp2"]["warmup"]), (4, 2))

    def test_ours_figures(self):
        s = call1().summary
        ours = s["ours"]
        self.assertEqual(ours["figures_from"], "first attempt")
        self.assertEqual([a["attempt"] for a in ours["attempts"]], ["first attempt"])
        self.assertEqual(ours["peak_device_memory_bytes_per_rank"], [123456])
        self.assertEqual(ours["tokens_per_s_whole_fit"], 800.0)
        # The top-level MFU is that of tokens_per_s.ours (CUDA events: 1400), not the job's
        # host-timed 0.55, which stays in ours.mfu.
        self.assertAlmostEqual(s["mfu"], s["config"]["flops_per_token"] * 1400 / 989e12)
        self.assertEqual((ours["mfu"], s["peak_device_memory_bytes"]), (0.55, 123456))
        self.assertEqual(s["op_profile"]["categories"]["attention"],
                         {"ops": 1356, "estimated_ms": 20.7, "measured_ms": 30.5,
                          "achieved_tflops": 61.5, "achieved_gbps": 2535.0})
        self.assertEqual(ours["gemm_tuning"], {"problems": 4, "tuned": 2, "chose_another": 1,
                                               "fallbacks": 1, "first_ms": 0.4, "chosen_ms": 0.35})
        self.assertEqual(ours["summary"]["fsdp_memory_bound_bytes"], 120000)
        self.assertNotIn("fit_losses", ours["summary"])
        self.assertEqual(s["config"]["model_parameters"], 124475904)
        for key in ("gemm_tuning_off_after", "attention_reference_after",
                    "forward_prefetch_off_after"):
            self.assertNotIn(key, ours)
        self.assertFalse([k for k in s["steps"] if k.startswith("ours_")])

    def test_attention(self):
        r = call1()
        a = r.summary["attention"]
        self.assertEqual(a["ours"]["tuned"]["forward_ms"], 0.25)
        self.assertEqual(a["ours"]["forward"], [{"shape": 0, "median_ms": 0.3, "tflops": None,
                                                 "same_bits": True, "error": None}])
        self.assertNotIn("name", a["ours"]["backward"][0])
        self.assertEqual(a["pytorch"]["backends"]["flash"]["backward_ms"], 0.5)
        line = ("attention B=4 T=1024 H=12 head_dim=64: ours (tuned) forward 0.250 ms, backward "
                "0.800 ms; PyTorch SDPA flash forward 0.200 ms, backward 0.500 ms (ours / "
                "PyTorch time: forward 1.25, backward 1.60)")
        self.assertEqual(a["summary"], line)
        self.assertIn("run.sh: " + line, r.stdout)

    def test_tokens_line(self):
        self.assertIn("run.sh: tokens/s: ours 1,400 (device_timed", call1().stdout)

    def test_out_after_each_phase(self):
        r = call1()
        # The attention phase's stand-in read $OUT/summary.json: the phases before it.
        with open(r.trace_path + ".out_at_attention") as f:
            self.assertEqual(json.load(f), ["ours", "pytorch", "pytorch_compiled"])

    def test_out_files(self):
        r = call1()
        names = sorted(os.listdir(r.out))
        self.assertEqual(names, sorted(["summary.json", "run.log", "gpu_tests.log",
                                        "attention.log", "main_job.log",
                                        "main_job_summary.json", "pytorch_fsdp2.log"]))
        self.assertIn("== ldd bin/main_job", r.out_file("run.log"))
        self.assertIn("run.sh: done in", r.out_file("run.log"))
        self.assertIn("UserWarning: something from torch", r.out_file("attention.log"))
        self.assertTrue(r.out_file("attention.log").startswith("== attention_bench.log\n"))
        pt = r.out_file("pytorch_fsdp2.log")
        self.assertTrue(pt.startswith("some warning from torch"))
        self.assertIn("== pytorch_fsdp2_compiled.log\n", pt)
        self.assertEqual(json.loads(r.out_file("summary.json"))["tokens_per_s"],
                         r.summary["tokens_per_s"])


class Call2Test(unittest.TestCase):
    """--call=2: A/B/A, Llama, offload, ncu on the attention benchmark only."""

    @classmethod
    def setUpClass(cls):
        cls.r = run_bundle("call2", ["--call=2"])

    def test_phases(self):
        self.assertEqual(self.r.phases(), CALLS["2"])
        self.assertEqual(CALLS["2"], ["ours", "pytorch", "ours_again", "llama", "offload",
                                      "ncu_attention"])
        self.assertEqual(self.r.ran(), ["main_job main", "pytorch eager", "main_job again",
                                        "main_job llama", "main_job offload",
                                        "ncu attention_bench", "attention_bench"])
        self.assertEqual(self.r.summary["call"], "2")

    def test_aba(self):
        s = self.r.summary
        aba = s["aba"]
        self.assertEqual((aba["ours_first"], aba["pytorch_fsdp2"], aba["ours_second"]),
                         (1400.0, 1000.0, 1200.0))
        self.assertEqual(aba["ours_mean"], 1300.0)
        self.assertAlmostEqual(aba["ratio"], 1.3)
        self.assertAlmostEqual(s["tokens_per_s_ratio_aba"], 1.3)
        self.assertTrue(aba["ok"])
        self.assertIn("\n== main_job_again.log\n", self.r.out_file("main_job.log"))

    def test_llama_and_offload(self):
        s = self.r.summary
        self.assertEqual(s["llama"]["op_profile"], {"estimated_step_ms": 35.0, "measured_op_ms": 50.0,
                         "categories": {"elementwise": {"ops": 110, "estimated_ms": 6.2,
                                                        "measured_ms": 9.0}}})
        self.assertEqual((s["llama"]["tokens_per_s"], s["llama"]["mfu"]), (900.0, 0.4))
        self.assertIn("run.sh: llama: tokens/s 900, MFU 0.4, peak 99999 B, op ms measured 50.0 "
                      "(estimated 35.0)", self.r.stdout)
        # Offload's device-timed figure beside ours' (700 / 1400), memory 61728 / 123456.
        self.assertEqual(s["offload"]["tokens_per_s"], 700.0)
        self.assertEqual(s["offload"]["tokens_per_s_over_no_offload"], 0.5)
        self.assertEqual(s["offload"]["peak_device_memory_over_no_offload"], 0.5)

    def test_ncu_attention_only(self):
        ncu = self.r.summary["ncu"]
        self.assertEqual(ncu["step"]["error"], "not in --call=2")
        a = ncu["attention"]
        self.assertEqual([k["kernel"] for k in a["longest"]], ["FlashBackwardKV<64>", "FlashForward<64>"])
        self.assertEqual((a["longest"][0]["us"], a["longest"][1]["us"]), (1500.0, 2.5))
        k = a["longest"][1]
        self.assertEqual((k["sm_pct"], k["occupancy_pct"], k["registers"], k["grid"]),
                         (40.5, 20.0, 96, "(16, 192, 1)"))
        self.assertEqual(k["pipes_pct"], {"tensor_op_hmma": 35.0, "alu": 12.0})
        self.assertEqual(list(k["stalls"]), ["long_scoreboard", "barrier"])
        self.assertEqual(k["shared_bank_conflicts"], 1024.0)
        self.assertIn("run.sh: ncu attention: 2 kernels profiled; the longest:", self.r.stdout)
        self.assertIn("== ncu_attention.csv", self.r.out_file("ncu.csv"))

    def test_passes(self):
        self.assertEqual(self.r.rc, 0, self.r.stdout[-3000:])
        self.assertIs(self.r.summary["ok"], True)


class CallAllTest(unittest.TestCase):
    """--call=all on two GPUs: every phase, the collectives benchmark included."""

    @classmethod
    def setUpClass(cls):
        cls.r = run_bundle("all", ["--call=all"], FAKE_NGPU="2")

    def test_phases(self):
        self.assertEqual(self.r.phases(), CALLS["all"])
        self.assertEqual(self.r.ran(), [
            "main_job main", "pytorch eager", "main_job again", "pytorch compiled",
            "attention_bench", "attention_torch", "test", "collectives_bench", "main_job llama",
            "main_job offload", "ncu attention_bench", "attention_bench", "ncu main_job",
            "main_job ncu"])

    def test_bench_over_the_gpus(self):
        self.assertIn("--nproc=2", [l for l in self.r.trace if l.startswith("collectives_bench")][0])
        b = self.r.summary["nccl_bench"]
        self.assertTrue(b["ok"])
        self.assertEqual(b["best"]["all_gather"], {"busbw_GBps": 1.2, "algbw_GBps": 2.5})
        self.assertIn("== nccl_bench.json", self.r.out_file("run.log"))

    def test_ncu_step(self):
        step = self.r.summary["ncu"]["step"]
        self.assertTrue(step["ok"])
        self.assertEqual(step["longest"][0]["kernel"], "LayerNormForward")
        self.assertEqual(step["longest"][0]["us"], 12.5)
        self.assertIn("gemm_tuning=0", self.r.job_lines("ncu")[0])
        self.assertLessEqual(len(os.listdir(self.r.out)), 8)


RETRY1 = "retry 1 (FSDP_ATTENTION_SHAPES=reference FSDP_ATTENTION_TUNING=0)"
RETRY2 = "retry 2 (FSDP_ATTENTION_SHAPES=reference FSDP_ATTENTION_TUNING=0 FSDP_GEMM_TUNING=0)"
RETRY3 = ("retry 3 (FSDP_ATTENTION_SHAPES=reference FSDP_ATTENTION_TUNING=0 FSDP_GEMM_TUNING=0 "
          "--forward_prefetch=false)")


class RetryTest(unittest.TestCase):
    """Our job dies: the retries route around the fault, later job runs keep the switches."""

    def test_retry1_attention_reference_shapes(self):
        r = run_bundle("retry1", ["--call=2"], SKIP="ncu", FAKE_FAIL_UNLESS_REFERENCE="1")
        s = r.summary
        self.assertEqual(s["ours"]["figures_from"], RETRY1)
        self.assertEqual(s["steps"]["ours_attention_tuned"]["rc"], 3)
        self.assertTrue(s["steps"]["ours"]["ok"])
        self.assertIn("illegal memory access", s["ours"]["attention_reference_after"])
        self.assertEqual([(a["attempt"], a["ok"]) for a in s["ours"]["attempts"]],
                         [("first attempt", False), (RETRY1, True)])
        self.assertNotIn("ours_tuned", s["steps"])
        self.assertEqual(s["tokens_per_s"]["ours"], 1400.0)
        self.assertIs(s["ok"], False)
        self.assertEqual(r.rc, 1)
        self.assertIn(f"run.sh: main job: again, {RETRY1}", r.stdout)
        # The later runs of our job: the switch in force, and they pass.
        for role in ("main", "again", "llama", "offload"):
            self.assertIn("shapes=reference attention_tuning=0 gemm_tuning=", r.job_lines(role)[-1])
        self.assertTrue(all(s["steps"][k]["ok"] for k in ("ours_again", "llama", "offload")))
        self.assertIn("illegal memory access", r.out_file("run.log"))
        self.assertNotIn("illegal memory access", r.out_file("main_job.log").split("== main_job_again")[0])

    def test_retry2_gemm_tuning_off(self):
        r = run_bundle("retry2", ["--call=2"], SKIP="ncu,pytorch", FAKE_FAIL_UNLESS_GEMM_OFF="1")
        s = r.summary
        self.assertEqual(s["ours"]["figures_from"], RETRY2)
        self.assertEqual((s["steps"]["ours_attention_tuned"]["rc"], s["steps"]["ours_tuned"]["rc"]),
                         (3, 3))
        self.assertIn("the GEMM tuner exploded", s["ours"]["gemm_tuning_off_after"])
        self.assertIn("the GEMM tuner exploded", s["ours"]["attention_reference_after"])
        self.assertNotIn("ours_prefetch_off", s["steps"])
        for role in ("again", "llama", "offload"):
            self.assertIn("shapes=reference attention_tuning=0 gemm_tuning=0 prefetch=on",
                          r.job_lines(role)[-1])
        self.assertTrue(all(s["steps"][k]["ok"] for k in ("ours", "ours_again", "llama", "offload")))

    def test_retry_left_out_when_its_switches_are_in_force(self):
        r = run_bundle("retry_in_force", SKIP="tests,pytorch,attention",
                       FAKE_FAIL_UNLESS_GEMM_OFF="1", FSDP_ATTENTION_SHAPES="reference",
                       FSDP_ATTENTION_TUNING="0")
        s = r.summary
        self.assertEqual([a["attempt"] for a in s["ours"]["attempts"]], ["first attempt", RETRY2])
        self.assertEqual(s["steps"]["ours_tuned"]["rc"], 3)
        self.assertNotIn("ours_attention_tuned", s["steps"])

    def test_no_prefetch_retry_with_one_process(self):
        r = run_bundle("prefetch1", SKIP="tests,pytorch,attention", FAKE_FAIL_PREFETCH="1")
        s = r.summary
        self.assertEqual(s["steps"]["ours_prefetch_off"]["note"], "skipped (one process)")
        self.assertEqual(s["steps"]["ours"]["rc"], 4)
        self.assertIsNone(s["ours"]["figures_from"])
        self.assertEqual(len(r.job_lines("main")), 3)
        self.assertNotIn("prefetch=off", "\n".join(r.trace))

    def test_prefetch_retry_with_two_processes(self):
        r = run_bundle("prefetch2", ["--call=2"], SKIP="ncu,pytorch", FAKE_FAIL_PREFETCH="1",
                       OURS_WORLD_SIZE="2")
        s = r.summary
        self.assertEqual(s["ours"]["figures_from"], RETRY3)
        self.assertEqual([s["steps"][k]["rc"] for k in ("ours_attention_tuned", "ours_tuned",
                                                         "ours_prefetch")], [4, 4, 4])
        self.assertIn("the all-gather stream faulted", s["ours"]["forward_prefetch_off_after"])
        for role in ("again", "llama", "offload"):
            self.assertIn("prefetch=off", r.job_lines(role)[-1])
        self.assertTrue(all(s["steps"][k]["ok"] for k in ("ours", "ours_again", "llama", "offload")))

    def test_no_kernel_retry_after_a_timeout(self):
        r = run_bundle("hang", SKIP="tests,pytorch,attention", FAKE_HANG="1", OURS_TIMEOUT_S="3")
        s = r.summary
        self.assertIn(s["steps"]["ours"]["rc"], (124, 137))
        self.assertEqual(s["steps"]["ours"]["note"], "timed out after 3 s")
        self.assertEqual(len(r.job_lines("main")), 1)
        self.assertEqual(s["steps"]["ours_prefetch_off"]["note"], "skipped (one process)")


class BudgetTest(unittest.TestCase):

    def test_budget_spent_before_any_step(self):
        r = run_bundle("budget", ["--call=all"], RUN_BUDGET_S="20")
        s = r.summary
        self.assertEqual(r.rc, 1)
        for k in ("ours", "pytorch", "pytorch_compiled", "ours_again", "offload", "llama",
                  "attention", "attention_pytorch"):
            self.assertEqual(s["steps"][k]["rc"], -1, k)
        self.assertEqual(s["gpu_tests"]["not_run"], ["a_test", "b_test", "c_test", "d_test"])
        self.assertEqual(s["gpu_tests"]["failed"], 0)
        self.assertEqual(r.trace, [])

    def test_step_limit_cut_by_budget(self):
        r = run_bundle("budget_cut", RUN_BUDGET_S="28", SKIP="tests", FAKE_PT_HANG="1")
        note = r.summary["steps"]["pytorch"]["note"]
        seconds = int(re.match(r"timed out after (\d+) s", note).group(1))
        self.assertLessEqual(seconds, 28 - 15)
        self.assertEqual(r.summary["steps"]["pytorch_compiled"]["rc"], -1)
        self.assertTrue(r.summary["steps"]["ours"]["ok"])


class CutOffTest(unittest.TestCase):
    """SIGTERM from outside while PyTorch runs: the step ends, the summary comes."""

    @classmethod
    def setUpClass(cls):
        cls.r = run_bundle("cut", outer_timeout=8, SKIP="tests", FAKE_PT_HANG="1")

    def test_summary_of_what_ran(self):
        s = self.r.summary
        self.assertEqual(self.r.rc, 1)
        self.assertTrue(s["steps"]["ours"]["ok"])
        self.assertEqual(s["steps"]["pytorch"]["rc"], -15)
        self.assertTrue(s["steps"]["pytorch"]["note"].startswith("cut off (signal 15)"))
        out = json.loads(self.r.out_file("summary.json"))
        self.assertEqual(out["tokens_per_s"]["ours"], 1400.0)
        self.assertTrue(self.r.out_file("main_job.log"))

    def test_step_process_ended(self):
        with open(os.path.join(ROOT, "pt_pid_cut")) as f:
            pid = int(f.read())
        time.sleep(0.5)
        with self.assertRaises(ProcessLookupError):
            os.kill(pid, 0)


class SettingsTest(unittest.TestCase):

    def test_wheel_first_host_basis_skip_and_ncu_failing(self):
        r = run_bundle("wheel", ["--call=2"], FSDP_PREFER_WHEEL="1", FAKE_NO_DEVICE_TIMED="1",
                       FAKE_NCU_FAIL="1", SKIP="llama")
        s = r.summary
        self.assertEqual(r.rc, 0, r.stdout[-3000:])
        self.assertEqual(s["env"]["libraries"]["libcudart.so.13"],
                         os.path.join(ROOT, "site/nvidia/cu13/lib/libcudart.so.13"))
        self.assertEqual(s["tokens_per_s"]["ours"], 1250.0)
        self.assertIn("host clock, no device_timed", s["ours"]["tokens_per_s_basis"])
        self.assertFalse(s["steps"]["ncu_attention"]["ok"])
        self.assertIn("Failed to initialize the profiler", s["ncu"]["attention"]["error"])
        self.assertEqual(s["llama"]["error"], "skipped (SKIP)")
        self.assertIn("run.sh: llama: skipped (SKIP)", r.stdout)

    def test_progress_lines_without_a_job_figure(self):
        r = run_bundle("progress", SKIP="tests,attention,pytorch_compiled",
                       FAKE_NO_DEVICE_TIMED="1", FAKE_NO_AFTER_WARMUP="1")
        s = r.summary
        self.assertEqual(r.rc, 0, r.stdout[-3000:])
        self.assertEqual(s["tokens_per_s"]["ours"], 1150.0)
        self.assertAlmostEqual(s["tokens_per_s_ratio"], 1.15)
        self.assertEqual(s["attention"]["ours"], {"ok": False, "error": "skipped (SKIP)"})
        self.assertIsNone(s["attention"]["summary"])
        self.assertNotIn("pytorch_compiled", s["steps"])
        self.assertEqual(s["pytorch_fsdp2_compiled"]["error"], "skipped (SKIP)")

    def test_attention_crash(self):
        r = run_bundle("attn_crash", SKIP="tests,ours,pytorch", FAKE_ATTN_CRASH="1")
        a = r.summary["attention"]
        self.assertEqual(r.rc, 1)
        self.assertTrue(a["ours"]["error"].startswith("rc=134"))
        self.assertIs(a["pytorch"]["ok"], True)
        self.assertRegex(r.stdout, r"run\.sh: attention B=4 T=1024 H=12 head_dim=64: ours: "
                         r"rc=134.*; PyTorch SDPA flash forward 0.200 ms, backward 0.500 ms\n")

    def test_without_python(self):
        r = run_bundle("nopython", PYTHON="/nonexistent/python3")
        self.assertEqual(r.rc, 1)
        self.assertIs(r.summary["ok"], False)
        self.assertIn("/nonexistent/python3 not found", r.summary["error"])
        self.assertEqual(json.loads(r.out_file("summary.json")), r.summary)

    def test_bad_call(self):
        p = subprocess.run([os.path.join(B, "run.sh"), "--call=3"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--call", p.stdout)


if __name__ == "__main__":
    make_bundle()
    try:
        unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[2:])
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)
