#!/usr/bin/env bash
# run.sh: the GPU acceptance check, run from inside the bundle tools/gpu_bundle.sh makes,
# on a machine with NVIDIA GPUs, a driver, the CUDA runtime libraries and Python with
# PyTorch (no Bazel, no network needed).
#
#   tar xJf gpu_bundle.tar.xz -C /tmp && /tmp/gpu_bundle/run.sh
#   OUT=/some/dir STEPS=30 BATCH=16 /tmp/gpu_bundle/run.sh
#
# What it does, in order, each step under `timeout` (a failing step is recorded and the
# script goes on):
#   0. finds libcudart / libcublas / libcublasLt / libnccl (the sonames our binaries need,
#      lib/cuda_sonames.txt) in $FSDP_CUDA_LIB_DIRS, then the CUDA toolkit ($CUDA_HOME,
#      default /usr/local/cuda), then the nvidia-* wheels of $PYTHON (site-packages
#      nvidia/*/lib), then ldconfig's cache; sets LD_LIBRARY_PATH to the bundle's lib/
#      (Debian libraries; lib/compat's libstdc++/libgcc_s only if this machine's are too
#      old) and those directories; prints nvidia-smi -L, ldd --version and ldd of the binaries.
#   1. every gpu-tagged test binary in bin/tests (gtest), counting passed/failed/skipped;
#   2. fused attention at GPT-2's shape (B=$BATCH T=1024 H=12 hd=64): bin/attention_bench
#      (each block shape of our kernels, forward and backward, with a bit-identity check
#      against shape 0, then the tuner's choice; JSON), then bench/attention_torch.py
#      (PyTorch SDPA's flash, cuDNN and efficient backends on the same problem; JSON);
#      prints a line "run.sh: attention ..." with the forward and backward milliseconds of
#      our tuned kernels beside SDPA's flash backend;
#   3. bin/collectives_bench --backend=nccl over the GPUs (JSON);
#   4. our main job on GPT-2 124M (V=50304 T=1024 C=768 L=12 H=12) in bf16 on 1 GPU
#      (--device=cuda --backend=nccl --world_size=1 --param_dtype=bfloat16 --profile_ops:
#      the last step's ops per category, measured with CUDA events beside the roofline
#      estimate of the same op list, core/roofline.h); when it fails, once more with GEMM
#      tuning off (FSDP_GEMM_TUNING=0, then also for steps 6 to 8; not after a timeout):
#      the first attempt is the failed step ours_tuned, its error in
#      ours.gemm_tuning_off_after, its log's end in run.log; when the job still fails (or
#      timed out), once more with forward prefetch off as well
#      (--forward_prefetch=false, then also for steps 6 to 8): the failed attempt is the
#      step ours_prefetch, its error in ours.forward_prefetch_off_after, its log's end in
#      run.log;
#   5. bench/pytorch_fsdp2.py on the same model and batch;
#   6. our main job again with --cpu_offload (shards, gradients and AdamW state in pinned
#      host memory, NOTE [CPU offload] in fsdp/options.h) for OFFLOAD_STEPS steps: its
#      tokens/s and peak device memory beside step 4's;
#   7. our main job on a Llama of GPT-2 small's widths (--model=llama, V=50304 T=1024
#      C=768 L=12 H=12, LLAMA_KV key-value heads, a SwiGLU of LLAMA_I, untied head) in bf16
#      with --profile_ops for LLAMA_STEPS steps: its tokens/s, MFU, peak device memory and op
#      profile (estimated and measured milliseconds per category) beside step 4's;
#   8. Nsight Compute (ncu, where the machine has one and can read its counters), on the
#      first launch of each launch configuration of bin/attention_bench (every block shape
#      of the fused attention) and of NCU_STEPS steps of the main job of step 4: per
#      kernel its duration, compute and memory throughput, occupancy, registers, busiest
#      pipes, shared-memory bank conflicts and main warp stall reasons (summary "ncu": the
#      kernels that took longest; every metric in ncu.csv). Diagnostic: its failure does not
#      make the run fail;
#   then prints ONE JSON line, last: gpu tests passed/failed/skipped and failing names,
#   tokens/s of each side and their ratio (ours / PyTorch), our MFU and peak device memory,
#   our op profile (estimated and measured milliseconds per op category, and the 8 GEMM
#   shapes that took the most time with their TFLOP/s), both attention
#   benchmarks' JSON lines ("attention": {"ours", "pytorch", "summary"}),
#   each step's status, and the environment (GPU, driver, library paths used).
# Logs and the JSON go to the work directory ($RUN_WORK, default a new /tmp/gpu_run.*) and,
# when $OUT is set, are copied there after each phase, so a run cut off from outside still
# leaves the summary of what finished: at most 8 files (the device tool's limit), each cut
# to its last 16 MiB: summary.json, run.log (run.sh's lines, then ldd of every binary),
# gpu_tests.log, attention.log (both attention benchmarks' output), main_job.log,
# main_job_summary.json, pytorch_fsdp2.log, ncu.csv (both ncu reports' raw pages); the
# collectives benchmark's JSON goes at the end of run.log.
# ldd -r checks every symbol the binaries need against the CUDA libraries found: one they
# lack is listed in env.ldd_missing with its name.
#
# Settings (environment): STEPS (our timed steps, default 30), PT_STEPS (20) and PT_WARMUP
# (5) for PyTorch, BATCH (sequences per step, 16), LOG_EVERY (5), PYTHON (python3),
# CUDA_HOME, FSDP_CUDA_LIB_DIRS, FSDP_PREFER_WHEEL=1 (wheel libraries before the toolkit's),
# TEST_TIMEOUT_S (per test binary, 120), TESTS_BUDGET_S (all tests, 200), ATTN_TIMEOUT_S
# (each of the two attention benchmarks, 60), BENCH_TIMEOUT_S (60), OURS_TIMEOUT_S (150),
# PT_TIMEOUT_S (150), OFFLOAD_STEPS (10), OFFLOAD_TIMEOUT_S (90), LLAMA_STEPS (15),
# LLAMA_TIMEOUT_S (90), LLAMA_KV (4), LLAMA_I (2048), NCU (the ncu to use;
# default: on PATH, in $CUDA_HOME/bin, or under /opt/nvidia/nsight-compute), NCU_STEPS (2),
# NCU_TIMEOUT_S (each of the two profiles, 150), RUN_BUDGET_S (the whole run, 540: each
# step's limit is cut so the summary still comes before it), OURS_EXTRA_ARGS (more flags),
# SKIP=tests,attention,bench,ours,pytorch,offload,llama,ncu (steps to leave out), PEAK_TFLOPS (for
# the MFU estimate).
# Exit status: 0 when every step that ran passed (ncu's aside), 1 otherwise.
set -u

BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=${RUN_WORK:-$(mktemp -d /tmp/gpu_run.XXXXXX)}
mkdir -p "$WORK/steps" "$WORK/tests"
PYTHON=${PYTHON:-python3}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
STEPS=${STEPS:-30}
PT_STEPS=${PT_STEPS:-20}
PT_WARMUP=${PT_WARMUP:-5}
BATCH=${BATCH:-16}
LOG_EVERY=${LOG_EVERY:-5}
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-120}
TESTS_BUDGET_S=${TESTS_BUDGET_S:-200}
ATTN_TIMEOUT_S=${ATTN_TIMEOUT_S:-60}
BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-60}
OURS_TIMEOUT_S=${OURS_TIMEOUT_S:-150}
PT_TIMEOUT_S=${PT_TIMEOUT_S:-150}
OFFLOAD_STEPS=${OFFLOAD_STEPS:-10}
OFFLOAD_TIMEOUT_S=${OFFLOAD_TIMEOUT_S:-90}
LLAMA_STEPS=${LLAMA_STEPS:-15}
LLAMA_TIMEOUT_S=${LLAMA_TIMEOUT_S:-90}
LLAMA_KV=${LLAMA_KV:-4}
LLAMA_I=${LLAMA_I:-2048}
NCU_STEPS=${NCU_STEPS:-2}
NCU_TIMEOUT_S=${NCU_TIMEOUT_S:-150}
RUN_BUDGET_S=${RUN_BUDGET_S:-540}
SKIP=${SKIP:-}
# GPT-2 124M.
MODEL_V=50304 MODEL_T=1024 MODEL_C=768 MODEL_L=12 MODEL_H=12

START=$(date +%s)
say() { echo "run.sh: $*" | tee -a "$WORK/run.log"; }
skipped() { case ",$SKIP," in *",$1,"*) return 0 ;; esac; return 1; }
# record <step> <rc> <seconds> [note]: what the summary reads back.
record() {
  printf '%s\n%s\n%s\n' "$2" "$3" "${4:-}" >"$WORK/steps/$1"
}

say "bundle $BUNDLE, work directory $WORK"
[ -f "$BUNDLE/MANIFEST.txt" ] && head -3 "$BUNDLE/MANIFEST.txt" | sed 's/^/run.sh: /'

# ---- 0. environment and libraries -------------------------------------------------------
say "nvidia-smi -L:"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L 2>&1 | tee "$WORK/nvidia_smi.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    >"$WORK/gpu_query.txt" 2>&1
  NGPU=$(grep -c '^GPU' "$WORK/nvidia_smi.txt" || true)
else
  echo "nvidia-smi not found" | tee "$WORK/nvidia_smi.txt"
  : >"$WORK/gpu_query.txt"
  NGPU=0
fi
say "ldd --version:"
ldd --version 2>&1 | head -1 | tee "$WORK/ldd_version.txt"

# Directories that may hold the CUDA libraries, in the order they are tried.
candidate_dirs() {
  local d
  if [ -n "${FSDP_CUDA_LIB_DIRS:-}" ]; then tr ':' '\n' <<<"$FSDP_CUDA_LIB_DIRS"; fi
  local toolkit=("$CUDA_HOME/lib64" "$CUDA_HOME/targets/x86_64-linux/lib" "$CUDA_HOME/lib")
  local wheel=()
  if command -v "$PYTHON" >/dev/null 2>&1; then
    local roots
    roots=$("$PYTHON" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null || true)
    while IFS= read -r d; do
      [ -n "$d" ] || continue
      for lib in "$d"/*/lib; do [ -d "$lib" ] && wheel+=("$lib"); done
    done <<<"$roots"
  fi
  if [ "${FSDP_PREFER_WHEEL:-0}" = 1 ]; then
    printf '%s\n' "${wheel[@]+"${wheel[@]}"}" "${toolkit[@]}"
  else
    printf '%s\n' "${toolkit[@]}" "${wheel[@]+"${wheel[@]}"}"
  fi
  if command -v ldconfig >/dev/null 2>&1; then
    ldconfig -p 2>/dev/null | sed -n 's/.* => \(.*\)\/[^/]*$/\1/p' | sort -u
  fi
}

SONAMES=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2)
if [ -s "$BUNDLE/lib/cuda_sonames.txt" ]; then
  mapfile -t SONAMES <"$BUNDLE/lib/cuda_sonames.txt"
fi
mapfile -t CANDIDATES < <(candidate_dirs | awk 'NF && !seen[$0]++')
LIB_DIRS=()
: >"$WORK/cuda_libs.txt"
for so in "${SONAMES[@]}"; do
  [ -n "$so" ] || continue
  found=""
  for d in "${CANDIDATES[@]}"; do
    if [ -e "$d/$so" ]; then found="$d"; break; fi
  done
  if [ -n "$found" ]; then
    echo "$so $found/$so" >>"$WORK/cuda_libs.txt"
    case " ${LIB_DIRS[*]+"${LIB_DIRS[*]}"} " in *" $found "*) ;; *) LIB_DIRS+=("$found") ;; esac
    say "found $so in $found"
  else
    echo "$so NOT_FOUND" >>"$WORK/cuda_libs.txt"
    say "NOT FOUND: $so (searched: ${CANDIDATES[*]+"${CANDIDATES[*]}"})"
  fi
done

LD_PATH="$BUNDLE/lib"
for d in "${LIB_DIRS[@]+"${LIB_DIRS[@]}"}"; do LD_PATH="$LD_PATH:$d"; done
[ -n "${LD_LIBRARY_PATH:-}" ] && LD_PATH="$LD_PATH:$LD_LIBRARY_PATH"

BINARIES=()
for f in "$BUNDLE"/bin/* "$BUNDLE"/bin/tests/*; do
  [ -f "$f" ] && [ -x "$f" ] && BINARIES+=("$f")
done
# Debian's libstdc++ / libgcc_s only when this machine's lack a version our binaries need.
COMPAT=0
if [ -d "$BUNDLE/lib/compat" ] && [ ${#BINARIES[@]} -gt 0 ]; then
  if LD_LIBRARY_PATH="$LD_PATH" ldd "${BINARIES[@]}" 2>&1 |
      grep -E "version .(GLIBCXX|CXXABI|GCC)_[0-9.]+. not found" >/dev/null; then
    LD_PATH="$BUNDLE/lib:$BUNDLE/lib/compat:${LD_PATH#"$BUNDLE/lib:"}"
    COMPAT=1
    say "this machine's libstdc++/libgcc_s are older than Debian 12's: using lib/compat"
  fi
fi
echo "$COMPAT" >"$WORK/compat.txt"
echo "$LD_PATH" >"$WORK/ld_library_path.txt"
say "LD_LIBRARY_PATH=$LD_PATH"

: >"$WORK/ldd.txt"
for b in "${BINARIES[@]+"${BINARIES[@]}"}"; do
  name=${b#"$BUNDLE/"}
  # -r: also resolve every symbol, so a CUDA library too old for ours names the symbol.
  out=$(LD_LIBRARY_PATH="$LD_PATH" ldd -r "$b" 2>&1)
  printf '== ldd %s\n%s\n' "$name" "$out" >>"$WORK/ldd.txt"
  if [ "$name" = bin/main_job ]; then
    say "ldd $name:"
    echo "$out"
  fi
  missing=$(grep -E "not found|undefined symbol" <<<"$out" || true)
  if [ -n "$missing" ]; then
    sed "s|^[[:space:]]*|$name: |" <<<"$missing" >>"$WORK/ldd_missing.txt"
    say "ldd $name: MISSING:"
    echo "$missing"
  else
    say "ldd $name: $(grep -c '=>' <<<"$out") libraries, none missing"
  fi
done

# cap <seconds>: the seconds a step may take, cut to what RUN_BUDGET_S leaves (less 15 s
# for the summary); 0 when too little is left.
cap() {
  local left=$((RUN_BUDGET_S - ($(date +%s) - START) - 15))
  [ "$left" -ge 10 ] || { echo 0; return; }
  echo $(($1 < left ? $1 : left))
}

# run_timed <name> <timeout_s> <log> <command...>: runs it (the timeout cut by cap) with
# this script's environment, records it.
run_timed() {
  local name=$1 limit log=$3
  limit=$(cap "$2")
  shift 3
  local t0 rc note=""
  if [ "$limit" = 0 ]; then
    record "$name" -1 0 "not run: the run's budget of ${RUN_BUDGET_S} s is spent"
    say "$name: not run (RUN_BUDGET_S=${RUN_BUDGET_S} spent)"
    return 1
  fi
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  [ $rc = 124 ] || [ $rc = 137 ] && note="timed out after ${limit} s"
  record "$name" "$rc" "$(($(date +%s) - t0))" "$note"
  if [ $rc = 0 ]; then
    say "$name: ok ($(($(date +%s) - t0)) s)"
  else
    say "$name: FAILED rc=$rc ${note} (log $log); last lines:"
    tail -n 8 "$log"
  fi
  return $rc
}

# run_step <name> <timeout_s> <log> <command...>: run_timed with our libraries.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  run_timed "$name" "$limit" "$log" env LD_LIBRARY_PATH="$LD_PATH" "$@"
}

# ---- the summary (assembled after each phase and at the end) ---------------------------
export OFFLOAD_STEPS LLAMA_STEPS LLAMA_KV LLAMA_I
export WORK BUNDLE STEPS PT_STEPS PT_WARMUP BATCH MODEL_V MODEL_T MODEL_C MODEL_L MODEL_H START
export PEAK_TFLOPS=${PEAK_TFLOPS:-0} SKIP
summary_py() {
  "$PYTHON" - <<'PY'
import glob, json, os, re, statistics, subprocess, time

W = os.environ["WORK"]
B = os.environ["BUNDLE"]

def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default

def last_json(text):
    """The last line of text that parses as a JSON object, or the whole text as JSON."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    try:
        v = json.loads(text)
        return v if isinstance(v, dict) else None
    except ValueError:
        return None

steps = {}
for path in sorted(glob.glob(os.path.join(W, "steps", "*"))):
    lines = read(path).split("\n")
    rc = int(lines[0]) if lines and lines[0].lstrip("-").isdigit() else None
    steps[os.path.basename(path)] = {
        "ok": rc == 0, "rc": rc,
        "seconds": int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else None,
        "note": lines[2] if len(lines) > 2 and lines[2] else None}

SKIPPED = [x for x in os.environ.get("SKIP", "").split(",") if x]

def step_error(name, log):
    s = steps.get(name)
    if s is None:
        return "skipped (SKIP)" if name in SKIPPED else "not run"
    if s["ok"]:
        return None
    tail = [l.strip()[:300] for l in read(log).splitlines() if l.strip()][-3:]
    return "; ".join(x for x in [f"rc={s['rc']}", s["note"]] + tail if x)

# gtest: count test cases by their result lines; a binary that failed without a FAILED
# case (crash, timeout, bad exit) counts as one failure named after the binary.
passed = failed = skipped = 0
failed_names, not_run, binaries = [], [], {}
ok_re = re.compile(r"^\[\s+OK\s+\] (\S+) \(\d+ ms\)")
fail_re = re.compile(r"^\[\s+FAILED\s+\] (\S+)(?:, where .*)? \(\d+ ms\)")
skip_re = re.compile(r"^\[\s+SKIPPED\s+\] (\S+) \(\d+ ms\)")
run_re = re.compile(r"^\[\s+RUN\s+\] (\S+)")
for name, s in steps.items():
    if not name.startswith("test:"):
        continue
    binary = name[5:]
    if s["rc"] == -1:
        not_run.append(binary)
        continue
    text = read(os.path.join(W, "tests", binary + ".log"))
    p = f = k = 0
    started, finished = [], set()
    for line in text.splitlines():
        m = run_re.match(line)
        if m:
            started.append(m.group(1)); continue
        m = ok_re.match(line)
        if m:
            p += 1; finished.add(m.group(1)); continue
        m = fail_re.match(line)
        if m:
            f += 1; finished.add(m.group(1)); failed_names.append(f"{binary}:{m.group(1)}"); continue
        m = skip_re.match(line)
        if m:
            k += 1; finished.add(m.group(1))
    unfinished = [t for t in started if t not in finished]
    for t in unfinished:
        f += 1
        failed_names.append(f"{binary}:{t} (did not finish: {s['note'] or 'rc=' + str(s['rc'])})")
    if not s["ok"] and f == 0:
        f += 1
        failed_names.append(f"{binary} ({s['note'] or 'rc=' + str(s['rc'])})")
    passed, failed, skipped = passed + p, failed + f, skipped + k
    binaries[binary] = {"ok": s["ok"] and f == 0, "passed": p, "failed": f, "skipped": k,
                        "seconds": s["seconds"]}

# NCCL benchmark: the best bus bandwidth per op.
bench = {"ok": steps.get("bench", {}).get("ok", False), "error": step_error("bench", os.path.join(W, "nccl_bench.log"))}
bj = None
text = read(os.path.join(W, "nccl_bench.log"))
# Its JSON (indented, so it opens with a line "{") among log lines on stderr.
m = re.search(r"^\{$", text, re.M)
if m:
    try:
        bj, _ = json.JSONDecoder().raw_decode(text[m.start():])
    except ValueError:
        bj = None
if isinstance(bj, dict):
    with open(os.path.join(W, "nccl_bench.json"), "w") as out:
        json.dump(bj, out, indent=1)
    best = {}
    for r in bj.get("results", []):
        op = r.get("op")
        for key in ("busbw_GBps", "algbw_GBps"):
            v = r.get(key)
            if isinstance(v, (int, float)):
                best.setdefault(op, {})[key] = max(best.get(op, {}).get(key, 0), v)
    bench.update({"nproc": bj.get("nproc"), "best": best})

cfg = {k: int(os.environ[k]) for k in ("MODEL_V", "MODEL_T", "MODEL_C", "MODEL_L", "MODEL_H", "BATCH")}
L, T, C, V = cfg["MODEL_L"], cfg["MODEL_T"], cfg["MODEL_C"], cfg["MODEL_V"]
# Parameters of the GPT (tied lm_head): wte, wpe, per block 12 C^2 + 13 C, ln_f.
n_params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
flops_per_token = 6.0 * n_params + 12.0 * L * T * C  # nanoGPT's estimate_mfu

gpu_query = read(os.path.join(W, "gpu_query.txt")).strip().splitlines()
gpu_name = gpu_query[0].split(",")[0].strip() if gpu_query else None
driver = gpu_query[0].split(",")[1].strip() if gpu_query and "," in gpu_query[0] else None
peak = float(os.environ.get("PEAK_TFLOPS") or 0)
if peak <= 0 and gpu_name:
    for key, v in (("H200", 989.0), ("H100", 989.0), ("GH200", 989.0), ("A100", 312.0),
                   ("B200", 2250.0), ("L40S", 362.0)):
        if key in gpu_name:
            peak = v
            break

def est_mfu(tps, world=1):
    if not tps or peak <= 0:
        return None
    return flops_per_token * tps / world / (peak * 1e12)

# Ours: summary.json of the run. Tokens/s after the warm-up: the job's own figure
# (tokens_per_second_after_warmup) where it reports one, else the median of its progress
# intervals after the first (which holds the warm-up: allocator, cuBLASLt heuristics, NCCL
# set-up), else the whole fit stage.
ours = {"ok": steps.get("ours", {}).get("ok", False),
        "error": step_error("ours", os.path.join(W, "main_job.log"))}
# A failed attempt of step 4 (retry_ours): these figures are the next attempt's, with GEMM
# tuning off after ours_tuned, and forward prefetch off too after ours_prefetch.
for attempt, key in (("ours_tuned", "gemm_tuning_off_after"),
                    ("ours_prefetch", "forward_prefetch_off_after")):
    if attempt in steps:
        ours[key] = step_error(attempt, os.path.join(W, "main_job_%s.log" % attempt[len("ours_"):]))
log = read(os.path.join(W, "main_job.log"))
summ = None
try:
    summ = json.loads(read(os.path.join(W, "main_job_summary.json")))
except ValueError:
    summ = None
if not isinstance(summ, dict):
    summ = last_json(log)
summ = summ or {}

def number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

rates = [float(m.group(1)) for m in re.finditer(r"step\s+\d+/\d+.*?tokens/s\s+([0-9.eE+]+)", log)]
after_warmup = number(summ.get("tokens_per_second_after_warmup"))
if after_warmup:
    tps, basis = after_warmup, (f"the job's tokens_per_second_after_warmup "
                                f"({summ.get('warmup_steps_excluded')} warm-up steps excluded)")
elif len(rates) > 1:
    tps, basis = statistics.median(rates[1:]), "median of the progress intervals after the first"
else:
    tps, basis = number(summ.get("tokens_per_second")), "whole fit stage"
world = number(summ.get("world_size")) or 1
mem_peaks = summ.get("peak_device_memory_bytes")
mem_list = [p for p in mem_peaks if number(p) is not None] if isinstance(mem_peaks, list) else None
mem_peak = max(mem_list) if mem_list else number(mem_peaks)

def simple(v):
    if isinstance(v, list):
        return all(isinstance(x, (int, float, str, type(None))) for x in v)
    return isinstance(v, (int, float, str, type(None), dict))

ours.update({
    "tokens_per_s": tps,
    "tokens_per_s_basis": basis,
    "tokens_per_s_whole_fit": number(summ.get("tokens_per_second")),
    "mfu": number(summ.get("mfu")),
    "mfu_estimate": est_mfu(tps, world),
    "peak_device_memory_bytes": mem_peak,
    "peak_device_memory_bytes_per_rank": mem_list,
    "device": summ.get("device"),
    "final_train_loss": summ.get("final_train_loss"),
    "steps": int(os.environ["STEPS"]),
    # The job's own figures on memory (its bound), throughput, FLOPs and the device.
    "summary": {k: v for k, v in summ.items()
                if simple(v) and any(w in k for w in ("memory", "bound", "mfu", "tokens", "flop",
                                                      "device", "backend", "step", "world",
                                                      "vocab", "peak"))},
})

# NOTE [GEMM tuning] (nn/cuda/gemm.h): each GEMM problem's first call timed the heuristic's
# first answer against the others that write its bits; the sums over the problems of one
# call each (the job's summary has every line).
tuning = summ.get("gemm_tuning")
if isinstance(tuning, list):
    times = [re.search(r"the first ([0-9.]+) ms, chosen (the first|another) ([0-9.]+) ms", str(t))
             for t in tuning]
    ours["gemm_tuning"] = {
        "problems": len(tuning),
        "tuned": sum(1 for m in times if m),
        "chose_another": sum(1 for m in times if m and m.group(2) == "another"),
        "fallbacks": sum(1 for t in tuning if "the fallback runs" in str(t)),
        "first_ms": round(sum(float(m.group(1)) for m in times if m), 3),
        "chosen_ms": round(sum(float(m.group(3)) for m in times if m), 3),
    }

# --profile_ops: the last fit step per op category, measured on the device (CUDA events)
# beside the roofline estimate the same op list gives on H200 rates (core/roofline.h).
op_profile = None
prof = summ.get("op_profile") if isinstance(summ, dict) else None
if isinstance(prof, dict):
    op_profile = {
        "estimated_step_ms": prof.get("estimated_step_ms"),
        "measured_op_ms": prof.get("measured_op_ms"),
        "estimated_mfu": prof.get("estimated_mfu"),
        "measured_op_mfu": prof.get("measured_op_mfu"),
        "launches": prof.get("launches"),
        "host_syncs": prof.get("host_syncs"),
        "categories": {c.get("category"): {k: c.get(k) for k in (
            "ops", "estimated_ms", "measured_ms", "achieved_tflops", "achieved_gbps")}
            for c in prof.get("categories", [])},
        # The GEMM problems that took the most time (all of them: main_job_summary.json).
        "gemm_shapes": [{k: g.get(k) for k in (
            "category", "batch", "m", "n", "k", "count", "measured_ms", "achieved_tflops")}
            for g in (prof.get("gemm_shapes") or [])[:8] if isinstance(g, dict)],
    }

pt = {"ok": steps.get("pytorch", {}).get("ok", False),
      "error": step_error("pytorch", os.path.join(W, "pytorch_fsdp2.log"))}
pj = last_json(read(os.path.join(W, "pytorch_fsdp2.log"))) or {}
if pj.get("ok") is False and not pt["error"]:
    pt["error"] = pj.get("error")
for key in ("tokens_per_s", "mfu", "peak_device_memory_bytes", "step_s_median", "torch",
            "cuda", "nccl", "final_loss"):
    pt[key] = pj.get(key)
pt["optimizer"] = (pj.get("config") or {}).get("optimizer")
pt["steps"], pt["warmup"] = int(os.environ["PT_STEPS"]), int(os.environ["PT_WARMUP"])

# A later job step's summary.json (a dict, or None), and its peak device memory (the
# largest rank's) and tokens/s (after warm-up where it says).
def job_summary(directory):
    try:
        j = json.loads(read(os.path.join(W, directory, "summary.json")))
    except ValueError:
        return None
    return j if isinstance(j, dict) else None

def job_peak(j):
    m = j.get("peak_device_memory_bytes")
    if isinstance(m, list):
        m = max([p for p in m if number(p) is not None], default=None)
    return number(m)

def job_tokens_per_s(j):
    return number(j.get("tokens_per_second_after_warmup")) or number(j.get("tokens_per_second"))

# --cpu_offload: the same job with the state on the host (NOTE [CPU offload]).
offload = {"ok": steps.get("offload", {}).get("ok", False),
           "error": step_error("offload", os.path.join(W, "offload.log"))}
oj = job_summary("main_job_offload")
if oj is not None:
    o_mem = job_peak(oj)
    o_tps = job_tokens_per_s(oj)
    offload.update({
        "tokens_per_s": o_tps,
        "peak_device_memory_bytes": o_mem,
        "final_train_loss": oj.get("final_train_loss"),
        "steps": int(os.environ["OFFLOAD_STEPS"]),
        "tokens_per_s_over_no_offload": o_tps / tps if o_tps and tps else None,
        "peak_device_memory_over_no_offload":
            o_mem / mem_peak if o_mem and mem_peak else None,
        "memory_estimate": {k: oj.get(k) for k in ("memory_estimate",
                                                   "memory_estimate_over_fit_peak")},
    })

# --model=llama (step 7): a Llama of GPT-2 small's widths, its own throughput, memory and
# op profile (the Llama layers' kernels, measured nowhere else).
llama = {"ok": steps.get("llama", {}).get("ok", False),
         "error": step_error("llama", os.path.join(W, "llama.log"))}
lj = job_summary("main_job_llama")
if lj is not None:
    l_prof = lj.get("op_profile") if isinstance(lj.get("op_profile"), dict) else {}
    llama.update({
        "tokens_per_s": job_tokens_per_s(lj),
        "mfu": number(lj.get("mfu")),
        "peak_device_memory_bytes": job_peak(lj),
        "final_train_loss": lj.get("final_train_loss"),
        "steps": int(os.environ["LLAMA_STEPS"]),
        "n_kv_head": int(os.environ["LLAMA_KV"]),
        "intermediate_size": int(os.environ["LLAMA_I"]),
        "op_profile": {
            "estimated_step_ms": l_prof.get("estimated_step_ms"),
            "measured_op_ms": l_prof.get("measured_op_ms"),
            "categories": {c.get("category"): {k: c.get(k) for k in (
                "ops", "estimated_ms", "measured_ms")}
                for c in l_prof.get("categories", []) if isinstance(c, dict)},
        },
    })
def llama_line():
    if not llama.get("ok"):
        return f"llama: not ok: {str(llama.get('error'))[:200]}"
    tps, mfu, prof = llama.get("tokens_per_s"), llama.get("mfu"), llama["op_profile"]
    return (f"llama: tokens/s {tps if tps is None else round(tps)}, MFU "
            f"{mfu if mfu is None else round(mfu, 4)}, peak "
            f"{llama.get('peak_device_memory_bytes')} B, op ms measured "
            f"{prof.get('measured_op_ms')} (estimated {prof.get('estimated_step_ms')})")
llama["summary"] = llama_line()

# Fused attention (step 2, SKIP=attention for both): each benchmark's JSON line as it
# printed it, or why there is none.
def bench_line(step, log, key):
    if "attention" in SKIPPED:
        return {"ok": False, "error": "skipped (SKIP)"}
    j = last_json(read(os.path.join(W, log)))
    if isinstance(j, dict) and key in j:
        return j
    return {"ok": False, "error": step_error(step, os.path.join(W, log)) or f"no JSON line in {log}"}

def slim_bench(j):
    """Our bench's line without what attention.log keeps anyway (shape names, least times,
    executed-FLOP rates), so the summary line stays short enough to read in a terminal."""
    if not isinstance(j.get("forward"), list) and not isinstance(j.get("backward"), list):
        return j
    def rows(key, ids):
        return [{k: r.get(k) for k in ids + ("median_ms", "tflops", "same_bits", "error")}
                for r in (j.get(key) or []) if isinstance(r, dict)]
    out = {k: j.get(k) for k in ("attention_bench", "ok", "error", "device", "shape")}
    out["forward"] = rows("forward", ("shape",))
    out["backward"] = rows("backward", ("kv", "q"))
    out["tuned"] = j.get("tuned")
    return out

attn_ours = slim_bench(bench_line("attention", "attention_bench.log", "attention_bench"))
attn_pt = bench_line("attention_pytorch", "attention_torch.log", "attention_torch")

def attention_summary():
    """One line: our tuned forward and backward beside SDPA's flash backend."""
    def ms(v):
        return f"{v:.3f} ms" if number(v) is not None else "-"
    tuned = attn_ours.get("tuned") or {}
    flash = (attn_pt.get("backends") or {}).get("flash") or {}
    o_f, o_b = number(tuned.get("forward_ms")), number(tuned.get("backward_ms"))
    p_f, p_b = number(flash.get("forward_ms")), number(flash.get("backward_ms"))
    parts = [f"attention B={cfg['BATCH']} T={T} H={cfg['MODEL_H']} head_dim={C // cfg['MODEL_H']}:"]
    if o_f is not None or o_b is not None:
        parts.append(f"ours (tuned) forward {ms(o_f)}, backward {ms(o_b)};")
    else:
        parts.append(f"ours: {str(attn_ours.get('error'))[:200]};")
    if p_f is not None or p_b is not None:
        parts.append(f"PyTorch SDPA flash forward {ms(p_f)}, backward {ms(p_b)}")
    else:
        parts.append(f"PyTorch SDPA flash: {str(flash.get('error') or attn_pt.get('error'))[:200]}")
    if None not in (o_f, o_b, p_f, p_b) and p_f > 0 and p_b > 0:
        parts.append(f"(ours / PyTorch time: forward {o_f / p_f:.2f}, backward {o_b / p_b:.2f})")
    if attn_ours.get("ok") is False and (o_f is not None or o_b is not None):
        parts.append(f"[ours not ok: {str(attn_ours.get('error'))[:200]}]")
    return " ".join(parts)

attention = {"ours": attn_ours, "pytorch": attn_pt,
             "summary": None if "attention" in SKIPPED else attention_summary()}

# Nsight Compute (step 7): each profile's kernels from its raw page (one row per kernel,
# a column per metric, a units row first), the longest first.
def ncu_number(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None

def ncu_profile(step, name):
    import csv, io
    out = {"ok": steps.get(step, {}).get("ok", False),
           "error": step_error(step, os.path.join(W, name + ".log"))}
    if "ncu" in SKIPPED:
        return out
    rows = list(csv.reader(io.StringIO(read(os.path.join(W, name + ".csv")))))
    hi = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if hi is None:
        if out["ok"]:
            out["error"] = f"no kernels in {name}.csv"
        return out
    header, data = rows[hi], rows[hi + 1:]
    units = {}
    if data and not (data[0] and data[0][0].strip().isdigit()):
        units, data = dict(zip(header, data[0])), data[1:]
    scale_us = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
                "ms": 1e3, "second": 1e6, "s": 1e6}
    pipe_re = re.compile(r"^sm__(?:inst_executed_pipe_(\w+?)|pipe_(\w+?)_cycles_active)"
                         r"\.avg\.pct_of_peak_sustained_active$")
    stall_re = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)"
                          r"_per_issue_active\.ratio$")
    def first(d, *names):
        for n in names:
            v = ncu_number(d.get(n, ""))
            if v is not None:
                return v
        return None
    kernels = []
    for r in data:
        if len(r) != len(header):
            continue
        d = dict(zip(header, r))
        dur = ncu_number(d.get("gpu__time_duration.sum", ""))
        if dur is not None:
            dur *= scale_us.get(units.get("gpu__time_duration.sum", "nsecond"), 1e-3)
        pipes, stalls, conflicts = {}, {}, 0.0
        for col, v in d.items():
            x = ncu_number(v)
            if x is None:
                continue
            m = pipe_re.match(col)
            if m:
                key = m.group(1) or m.group(2)
                pipes[key] = max(pipes.get(key, 0.0), x)
            m = stall_re.match(col)
            if m:
                stalls[m.group(1)] = x
            if "bank_conflicts" in col and "shared" in col and col.endswith(".sum"):
                conflicts += x
        kernels.append({
            "kernel": d.get("Kernel Name", "")[:160],
            "us": round(dur, 2) if dur is not None else None,
            "grid": d.get("launch__grid_size"), "block": d.get("launch__block_size"),
            "registers": first(d, "launch__registers_per_thread"),
            "sm_pct": first(d, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            "memory_pct": first(d, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
            "dram_pct": first(d, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                              "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            "occupancy_pct": first(d, "sm__warps_active.avg.pct_of_peak_sustained_active"),
            "occupancy_limit_pct": first(d, "sm__maximum_warps_per_active_cycle_pct"),
            "issue_pct": first(d, "smsp__issue_active.avg.pct_of_peak_sustained_active",
                               "sm__inst_issued.avg.pct_of_peak_sustained_active"),
            "pipes_pct": dict(sorted(pipes.items(), key=lambda kv: -kv[1])[:3]),
            "stalls": dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:4]),
            "shared_bank_conflicts": conflicts,
        })
    kernels.sort(key=lambda k: -(k["us"] or 0))
    out.update({"kernels": len(kernels), "longest": kernels[:10]})
    return out

ncu = {"attention": ncu_profile("ncu_attention", "ncu_attention"),
       "step": ncu_profile("ncu_step", "ncu_step")}

ratio = None
if ours["tokens_per_s"] and pt.get("tokens_per_s"):
    ratio = ours["tokens_per_s"] / pt["tokens_per_s"]

libs = {}
for line in read(os.path.join(W, "cuda_libs.txt")).splitlines():
    parts = line.split(" ", 1)
    if len(parts) == 2:
        libs[parts[0]] = None if parts[1] == "NOT_FOUND" else parts[1]

# Step 7 (ncu) is a diagnosis: its failure does not fail the run.
all_ok = all(s["ok"] for k, s in steps.items() if not k.startswith("ncu")) and bool(steps)
summary = {
    "gpu_run_summary": 1,
    "ok": all_ok,
    "gpu_tests": {"passed": passed, "failed": failed, "skipped": skipped,
                  "failed_names": failed_names, "not_run": not_run,
                  "binaries": binaries},
    "tokens_per_s": {"ours": ours["tokens_per_s"], "pytorch_fsdp2": pt.get("tokens_per_s")},
    "tokens_per_s_ratio": ratio,
    "tokens_per_s_ratio_is": "ours / pytorch_fsdp2 (target >= 1.0)",
    "mfu": ours["mfu"] if ours["mfu"] is not None else ours["mfu_estimate"],
    "peak_device_memory_bytes": ours["peak_device_memory_bytes"],
    "op_profile": op_profile,
    "ours": ours,
    "pytorch_fsdp2": pt,
    "offload": offload,
    "llama": llama,
    "attention": attention,
    "nccl_bench": bench,
    "ncu": ncu,
    "config": {"vocab_size": V, "block_size": T, "seq_len": T, "n_embd": C, "n_layer": L,
               "n_head": cfg["MODEL_H"], "batch_size": cfg["BATCH"], "param_dtype": "bfloat16",
               "model_parameters": n_params, "flops_per_token": flops_per_token,
               "peak_tflops_assumed": peak or None},
    "steps": {k: v for k, v in steps.items() if not k.startswith("test:")},
    "env": {"gpu": gpu_name, "driver": driver,
            "gpus": [l for l in read(os.path.join(W, "nvidia_smi.txt")).splitlines() if l.startswith("GPU")],
            "glibc": read(os.path.join(W, "ldd_version.txt")).strip(),
            "libraries": libs,
            "ld_library_path": read(os.path.join(W, "ld_library_path.txt")).strip(),
            "ldd_missing": [l for l in read(os.path.join(W, "ldd_missing.txt")).splitlines() if l],
            "compat_libstdcxx": read(os.path.join(W, "compat.txt")).strip() == "1",
            "bundle": read(os.path.join(B, "MANIFEST.txt")).splitlines()[:1]},
    "seconds": int(time.time()) - int(os.environ["START"]),
    "work_dir": W,
}
with open(os.path.join(W, "summary.json"), "w") as out:
    json.dump(summary, out, indent=1)
print(json.dumps(summary, separators=(",", ":")))
PY
}

# Logs to $OUT (at most 8 files, the device tool's limit; each cut to its last 16 MiB).
# Files that go together share one: run.log is run.sh's lines, then ldd.txt and the
# collectives benchmark's JSON; attention.log holds both attention benchmarks' output,
# ncu.csv both ncu reports.
copy_out() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT" || return 0
  cat "$WORK"/tests/*.log >"$WORK/gpu_tests.log" 2>/dev/null || : >"$WORK/gpu_tests.log"
  local f a
  for f in attention_bench.log attention_torch.log; do
    [ -f "$WORK/$f" ] && printf '== %s\n%s\n' "$f" "$(cat "$WORK/$f")"
  done >"$WORK/attention.log"
  [ -s "$WORK/attention.log" ] || rm -f "$WORK/attention.log"
  for f in ncu_attention.csv ncu_step.csv; do
    [ -f "$WORK/$f" ] && printf '== %s\n%s\n' "$f" "$(cat "$WORK/$f")"
  done >"$WORK/ncu.csv"
  [ -s "$WORK/ncu.csv" ] || rm -f "$WORK/ncu.csv"
  for f in summary.json run.log gpu_tests.log attention.log main_job.log \
      main_job_summary.json pytorch_fsdp2.log ncu.csv; do
    [ -f "$WORK/$f" ] || continue
    if [ "$f" = run.log ]; then
      { cat "$WORK/run.log"; echo "== ldd.txt"; cat "$WORK/ldd.txt" 2>/dev/null
        if [ -f "$WORK/nccl_bench.json" ]; then echo "== nccl_bench.json"; cat "$WORK/nccl_bench.json"; fi
        for a in tuned prefetch; do  # retry_ours's failed attempts
          [ -f "$WORK/main_job_$a.log" ] || continue
          echo "== main_job_$a.log (the main job's failed attempt ours_$a: its last 60 lines)"
          cat "$WORK/main_job_$a.log"
        done
      } | tail -c $((16 << 20)) >"$OUT/$f"
    else
      tail -c $((16 << 20)) "$WORK/$f" >"$OUT/$f"
    fi
  done
}

# After each phase: the summary so far, and the logs, into $OUT, so that a run cut off by
# an outer time limit still leaves what finished.
checkpoint() {
  summary_py >/dev/null 2>>"$WORK/summary.err" && copy_out
  return 0
}

# ---- 1. gpu tests ------------------------------------------------------------------------
if skipped tests; then
  say "gpu tests: skipped (SKIP)"
else
  tests_start=$(date +%s)
  ran=0
  for t in "$BUNDLE"/bin/tests/*; do
    [ -f "$t" ] && [ -x "$t" ] || continue
    name=$(basename "$t")
    left=$((TESTS_BUDGET_S - ($(date +%s) - tests_start)))
    if [ $left -le 5 ]; then
      say "gpu test $name: not run (the tests' budget of ${TESTS_BUDGET_S} s is spent)"
      record "test:$name" "-1" 0 "not run: tests budget spent"
      continue
    fi
    limit=$((left < TEST_TIMEOUT_S ? left : TEST_TIMEOUT_S))
    tmp="$WORK/tests/$name.tmp"
    mkdir -p "$tmp"
    runfiles=""
    [ -d "$t.runfiles" ] && runfiles="$t.runfiles"
    TEST_TMPDIR="$tmp" TEST_SRCDIR="${runfiles:-$tmp}" RUNFILES_DIR="${runfiles:-$tmp}" \
      TEST_WORKSPACE=fsdp run_step "test:$name" "$limit" "$WORK/tests/$name.log" "$t" \
      --gtest_color=no
    ran=$((ran + 1))
  done
  say "gpu tests: $ran binaries run"
fi
checkpoint

# say_summary_line <key>: says summary.json's <key>.summary, the line a step's figures make
# (nothing where the summary or the line is missing).
say_summary_line() {
  local line
  if line=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["summary"])' \
      "$WORK/summary.json" "$1" 2>/dev/null); then
    say "$line"
  fi
}

# ---- 2. fused attention: ours and PyTorch SDPA on GPT-2's shape ---------------------------
ATTN_ARGS=(--batch="$BATCH" --seq_len=$MODEL_T --n_head=$MODEL_H --head_dim=$((MODEL_C / MODEL_H)))
if skipped attention; then
  say "attention: skipped (SKIP)"
else
  if [ -x "$BUNDLE/bin/attention_bench" ]; then
    run_step attention "$ATTN_TIMEOUT_S" "$WORK/attention_bench.log" "$BUNDLE/bin/attention_bench" \
      "${ATTN_ARGS[@]}"
  else
    record attention 127 0 "bin/attention_bench is not in the bundle"
  fi
  if command -v "$PYTHON" >/dev/null 2>&1; then
    # Not with our LD_LIBRARY_PATH: PyTorch finds its own libraries.
    run_timed attention_pytorch "$ATTN_TIMEOUT_S" "$WORK/attention_torch.log" "$PYTHON" \
      "$BUNDLE/bench/attention_torch.py" "${ATTN_ARGS[@]}"
  else
    record attention_pytorch 127 0 "$PYTHON not found"
  fi
fi
checkpoint
# The summary's line on it: our tuned kernels beside SDPA's flash backend.
skipped attention || say_summary_line attention

# ---- 3. NCCL collectives benchmark -------------------------------------------------------
if skipped bench; then
  say "collectives bench: skipped (SKIP)"
elif [ -x "$BUNDLE/bin/collectives_bench" ]; then
  nproc=$NGPU
  [ "$nproc" -ge 1 ] || nproc=1
  [ "$nproc" -le 8 ] || nproc=8
  run_step bench "$BENCH_TIMEOUT_S" "$WORK/nccl_bench.log" "$BUNDLE/bin/collectives_bench" \
    --backend=nccl --nproc="$nproc" --max_bytes=$((1 << 30))
else
  record bench 127 0 "bin/collectives_bench is not in the bundle"
fi
checkpoint

# run_job <step> <timeout_s> <log> <output_dir> <steps> [flags...]: our main job on the
# model and batch above, on one GPU in bf16.
# job_command <output_dir> <steps>: that command (without OURS_EXTRA_ARGS), into JOB.
# RETRY_ARGS: flags a failed attempt of step 4 added for every later run of the job.
RETRY_ARGS=""
job_command() {
  JOB=("$BUNDLE/bin/main_job" --device=cuda --backend=nccl --world_size=1
    --param_dtype=bfloat16 --vocab_size=$MODEL_V --block_size=$MODEL_T --seq_len=$MODEL_T
    --n_embd=$MODEL_C --n_layer=$MODEL_L --n_head=$MODEL_H --batch_size="$BATCH"
    --steps="$2" --log_every="$LOG_EVERY" --stages=fit --release=false --output_dir="$1")
}
run_job() {
  local step=$1 limit=$2 log=$3 dir=$4 n=$5
  shift 5
  rm -rf "$dir"
  job_command "$dir" "$n"
  # shellcheck disable=SC2086
  run_step "$step" "$limit" "$log" "${JOB[@]}" "$@" $RETRY_ARGS ${OURS_EXTRA_ARGS:-}
}

# ---- 4. our main job ---------------------------------------------------------------------
# retry_ours <step> <what>: keeps step 4's failed attempt as <step> (its log's last 60
# lines in main_job_<step without ours_>.log, for run.log) and runs step 4 again.
retry_ours() {
  mv "$WORK/steps/ours" "$WORK/steps/$1"
  tail -n 60 "$WORK/main_job.log" >"$WORK/main_job_${1#ours_}.log"
  say "main job: again with $2"
  run_job ours "$OURS_TIMEOUT_S" "$WORK/main_job.log" "$WORK/main_job" "$STEPS" --profile_ops
}
if skipped ours; then
  say "main job: skipped (SKIP)"
elif [ -x "$BUNDLE/bin/main_job" ]; then
  run_job ours "$OURS_TIMEOUT_S" "$WORK/main_job.log" "$WORK/main_job" "$STEPS" --profile_ops
  # A failure with GEMM tuning on (NOTE [GEMM tuning] in nn/cuda/gemm.h) is run once more
  # with it off, as are the later job steps: the run still measures the step when the
  # tuner is what fails. The first attempt stays a failed step (ours_tuned), its log's end
  # goes into run.log.
  # A run that timed out skips this attempt: the tuner times its candidates and returns,
  # and a second hang would spend the run's budget.
  ours_rc=$(head -1 "$WORK/steps/ours")
  if [ "$ours_rc" != 0 ] && [ "$ours_rc" != -1 ] && [ "$ours_rc" != 124 ] &&
      [ "$ours_rc" != 137 ] && [ "${FSDP_GEMM_TUNING:-1}" != 0 ]; then
    export FSDP_GEMM_TUNING=0
    retry_ours ours_tuned "GEMM tuning off (FSDP_GEMM_TUNING=0)"
  fi
  # Forward prefetch (on by default with --device=cuda) overlaps the next unit's all-gather
  # with a unit's kernels across two streams: when the job still fails, once more without
  # it, so that a fault of that overlap leaves a measured step (ours_prefetch is the failed
  # attempt).
  ours_rc=$(head -1 "$WORK/steps/ours")
  if [ "$ours_rc" != 0 ] && [ "$ours_rc" != -1 ]; then
    RETRY_ARGS="--forward_prefetch=false"
    retry_ours ours_prefetch "forward prefetch off (--forward_prefetch=false)"
  fi
  [ -f "$WORK/main_job/summary.json" ] && cp "$WORK/main_job/summary.json" "$WORK/main_job_summary.json"
else
  record ours 127 0 "bin/main_job is not in the bundle"
fi
checkpoint

# ---- 5. PyTorch FSDP2 --------------------------------------------------------------------
if skipped pytorch; then
  say "pytorch fsdp2: skipped (SKIP)"
elif [ "$(cap "$PT_TIMEOUT_S")" = 0 ]; then
  record pytorch -1 0 "not run: the run's budget of ${RUN_BUDGET_S} s is spent"
elif command -v "$PYTHON" >/dev/null 2>&1; then
  # Not with our LD_LIBRARY_PATH: PyTorch finds its own libraries.
  t0=$(date +%s)
  PT_LIMIT=$(cap "$PT_TIMEOUT_S")
  timeout -k 10 "$PT_LIMIT" "$PYTHON" "$BUNDLE/bench/pytorch_fsdp2.py" \
    --vocab_size=$MODEL_V --block_size=$MODEL_T --seq_len=$MODEL_T --n_embd=$MODEL_C \
    --n_layer=$MODEL_L --n_head=$MODEL_H --batch_size="$BATCH" --steps="$PT_STEPS" \
    --warmup="$PT_WARMUP" --param_dtype=bfloat16 \
    ${PEAK_TFLOPS:+--peak_tflops="$PEAK_TFLOPS"} >"$WORK/pytorch_fsdp2.log" 2>&1
  rc=$?
  note=""
  [ $rc = 124 ] || [ $rc = 137 ] && note="timed out after ${PT_LIMIT} s"
  record pytorch "$rc" "$(($(date +%s) - t0))" "$note"
  if [ $rc = 0 ]; then say "pytorch fsdp2: ok"; else
    say "pytorch fsdp2: FAILED rc=$rc $note; last lines:"
    tail -n 8 "$WORK/pytorch_fsdp2.log"
  fi
else
  record pytorch 127 0 "$PYTHON not found"
fi

checkpoint

# ---- 6. our main job with CPU offload ----------------------------------------------------
if skipped offload; then
  say "offload: skipped (SKIP)"
elif [ -x "$BUNDLE/bin/main_job" ]; then
  run_job offload "$OFFLOAD_TIMEOUT_S" "$WORK/offload.log" "$WORK/main_job_offload" \
    "$OFFLOAD_STEPS" --cpu_offload
else
  record offload 127 0 "bin/main_job is not in the bundle"
fi

checkpoint

# ---- 7. our main job on a Llama ----------------------------------------------------------
if skipped llama; then
  say "llama: skipped (SKIP)"
elif [ -x "$BUNDLE/bin/main_job" ]; then
  run_job llama "$LLAMA_TIMEOUT_S" "$WORK/llama.log" "$WORK/main_job_llama" "$LLAMA_STEPS" \
    --model=llama --n_kv_head="$LLAMA_KV" --intermediate_size="$LLAMA_I" --profile_ops
else
  record llama 127 0 "bin/main_job is not in the bundle"
fi
checkpoint
skipped llama || say_summary_line llama

# ---- 8. Nsight Compute: what bounds each kernel ------------------------------------------
find_ncu() {
  if [ -n "${NCU:-}" ]; then echo "$NCU"; return; fi
  local c
  for c in "$(command -v ncu 2>/dev/null)" "$CUDA_HOME/bin/ncu" /opt/nvidia/nsight-compute/*/ncu; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
  done
}
# ncu_profile <step> <name> <command...>: the first launch of each launch configuration,
# the sections below, into $WORK/<name>.ncu-rep, then its raw page as $WORK/<name>.csv.
ncu_profile() {
  local step=$1 name=$2
  shift 2
  rm -f "$WORK/$name.ncu-rep" "$WORK/$name.csv"
  run_step "$step" "$NCU_TIMEOUT_S" "$WORK/$name.log" "$NCU_BIN" --clock-control none \
    --target-processes all --filter-mode per-launch-config --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables -f -o "$WORK/$name" "$@"
  if [ -f "$WORK/$name.ncu-rep" ]; then
    timeout -k 5 60 "$NCU_BIN" --import "$WORK/$name.ncu-rep" --csv --page raw \
      >"$WORK/$name.csv" 2>>"$WORK/$name.log" ||
      say "$step: reading the report failed (log $WORK/$name.log)"
  fi
}
if skipped ncu; then
  say "ncu: skipped (SKIP)"
else
  NCU_BIN=$(find_ncu)
  if [ -z "$NCU_BIN" ]; then
    record ncu_attention 127 0 "ncu not found (PATH, $CUDA_HOME/bin, /opt/nvidia/nsight-compute)"
    say "ncu: not found"
  else
    say "ncu: $NCU_BIN"
    if [ -x "$BUNDLE/bin/attention_bench" ]; then
      ncu_profile ncu_attention ncu_attention "$BUNDLE/bin/attention_bench" "${ATTN_ARGS[@]}"
    fi
    checkpoint
    if [ -x "$BUNDLE/bin/main_job" ]; then
      rm -rf "$WORK/main_job_ncu"
      job_command "$WORK/main_job_ncu" "$NCU_STEPS"
      # Without GEMM tuning (NOTE [GEMM tuning] in nn/cuda/gemm.h): its candidates would be
      # hundreds of launch configurations for ncu to profile once each, none of them the
      # steady state's; the heuristic's first answers run instead.
      # shellcheck disable=SC2086
      (export FSDP_GEMM_TUNING=0
       ncu_profile ncu_step ncu_step "${JOB[@]}" $RETRY_ARGS ${OURS_EXTRA_ARGS:-})
    fi
  fi
  checkpoint
  # Lines on the longest kernels of each profile.
  "$PYTHON" - "$WORK/summary.json" 2>/dev/null <<'PY' | while IFS= read -r l; do say "$l"; done
import json, sys
ncu = json.load(open(sys.argv[1])).get("ncu") or {}
for key in ("attention", "step"):
    p = ncu.get(key) or {}
    if not p.get("kernels"):
        print(f"ncu {key}: {p.get('error') or 'no kernels'}"[:300])
        continue
    print(f"ncu {key}: {p['kernels']} kernels profiled; the longest:")
    for k in p["longest"][:3]:
        print(f"ncu   {k['us']} us, SM {k['sm_pct']}%, memory {k['memory_pct']}%, occupancy "
              f"{k['occupancy_pct']}%, issue {k['issue_pct']}%, stalls {k['stalls']}: "
              f"{k['kernel'][:80]}")
PY
fi

say "done in $(($(date +%s) - START)) s; summary:"
if command -v "$PYTHON" >/dev/null 2>&1 && summary_line=$(summary_py 2>"$WORK/summary.err"); then
  copy_out
  echo "$summary_line"
  case "$summary_line" in '{"gpu_run_summary":1,"ok":true'*) exit 0 ;; esac
  exit 1
fi
# No Python (or the summary failed): the step statuses only.
why="$PYTHON not found"
[ -s "$WORK/summary.err" ] && why="$PYTHON: $(tail -c 300 "$WORK/summary.err" | tr -d '"\\\n\t')"
line="{\"gpu_run_summary\":1,\"ok\":false,\"error\":\"summary not assembled ($why)\",\"steps\":{"
sep=""
for f in "$WORK"/steps/*; do
  [ -f "$f" ] || continue
  line="$line$sep\"$(basename "$f")\":$(head -1 "$f")"
  sep=","
done
echo "$line}}" >"$WORK/summary.json"
copy_out
cat "$WORK/summary.json"
exit 1
