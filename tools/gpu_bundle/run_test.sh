#!/usr/bin/env bash
# Test of the bundle's run.sh without a GPU: a fake bundle (gtest-like test scripts, a fake
# main job, collectives and attention benchmarks and PyTorch scripts, a fake nvidia-smi, fake
# CUDA toolkit and wheel library directories) checks its library discovery, its gtest
# counting, its timeouts, the JSON it assembles, the files it copies to $OUT, and its summary
# without Python.
set -euo pipefail

RUN_SH=${1:-tools/gpu_bundle/run.sh}
[ -f "$RUN_SH" ] || { echo "run.sh not found at $RUN_SH"; exit 1; }
T=$(mktemp -d "${TEST_TMPDIR:-/tmp}/run_test.XXXXXX")
failures=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "PASS: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}

# ---- the fake bundle -------------------------------------------------------------------
B=$T/bundle
mkdir -p "$B/bin/tests" "$B/lib/compat" "$B/bench" "$T/fakebin" "$T/cuda/lib64" \
  "$T/site/nvidia/nccl/lib" "$T/site/nvidia/cu13/lib"
cp "$RUN_SH" "$B/run.sh"
chmod +x "$B/run.sh"
printf 'libcudart.so.13\nlibcublas.so.13\nlibcublasLt.so.13\nlibnccl.so.2\n' >"$B/lib/cuda_sonames.txt"
echo "gpu_bundle test-commit" >"$B/MANIFEST.txt"
# The toolkit has cudart and cuBLAS but no NCCL; the wheels have NCCL and another cudart.
touch "$T/cuda/lib64/libcudart.so.13" "$T/cuda/lib64/libcublas.so.13" "$T/cuda/lib64/libcublasLt.so.13"
touch "$T/site/nvidia/nccl/lib/libnccl.so.2" "$T/site/nvidia/cu13/lib/libcudart.so.13"

cat >"$T/fakebin/nvidia-smi" <<'EOF'
#!/bin/sh
case "$1" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-fake)" ;;
  *) echo "NVIDIA H200, 580.95.05, 143771 MiB" ;;
esac
EOF

cat >"$B/bin/tests/a_test" <<'EOF'
#!/bin/sh
# Passes two cases and skips one; checks what run.sh gives a test.
[ -d "$TEST_TMPDIR" ] || { echo "no TEST_TMPDIR"; exit 1; }
case "$LD_LIBRARY_PATH" in *"/bundle/lib:"*) ;; *) echo "bad LD_LIBRARY_PATH"; exit 1 ;; esac
echo "[==========] Running 3 tests from 1 test suite."
echo "[ RUN      ] A.one"
echo "[       OK ] A.one (3 ms)"
echo "[ RUN      ] A.two"
echo "[       OK ] A.two (0 ms)"
echo "[ RUN      ] A.gpu"
echo "a_test.cc:9: Skipped"
echo "no CUDA device"
echo "[  SKIPPED ] A.gpu (0 ms)"
echo "[  PASSED  ] 2 tests."
EOF
cat >"$B/bin/tests/b_test" <<'EOF'
#!/bin/sh
echo "[ RUN      ] B.ok"
echo "[       OK ] B.ok (1 ms)"
echo "[ RUN      ] B.fails"
echo "b_test.cc:3: Failure"
echo "[  FAILED  ] B.fails (2 ms)"
echo "[ RUN      ] Param/B.typed/0"
echo "[  FAILED  ] Param/B.typed/0, where GetParam() = 4 (0 ms)"
echo "[  FAILED  ] 2 tests, listed below:"
echo "[  FAILED  ] B.fails"
exit 1
EOF
cat >"$B/bin/tests/c_test" <<'EOF'
#!/bin/sh
echo "[ RUN      ] C.fine"
echo "[       OK ] C.fine (1 ms)"
echo "[ RUN      ] C.crashes"
kill -ABRT $$
EOF
cat >"$B/bin/tests/d_test" <<'EOF'
#!/bin/sh
echo "[ RUN      ] D.hangs"
sleep 30
EOF

cat >"$B/bin/collectives_bench" <<'EOF'
#!/bin/sh
echo "I1203 rank 0: {not json} starting" >&2
cat <<'J'
{
  "benchmark": "collectives",
  "nproc": 1,
  "results": [
    {"op": "all_gather", "bytes": 4096, "algbw_GBps": 1.5, "busbw_GBps": 0.0},
    {"op": "all_gather", "bytes": 8192, "algbw_GBps": 2.5, "busbw_GBps": 0.0}
  ]
}
J
EOF

cat >"$B/bin/attention_bench" <<'EOF'
#!/bin/sh
# Checks the flags and libraries run.sh gives it; FAKE_ATTN_CRASH=1: dies without a word.
[ "${FAKE_ATTN_CRASH:-0}" = 1 ] && kill -ABRT $$
case "$LD_LIBRARY_PATH" in *"/bundle/lib:"*) ;; *) echo "bad LD_LIBRARY_PATH"; exit 1 ;; esac
for want in --batch=4 --seq_len=1024 --n_head=12 --head_dim=64; do
  case " $* " in *" $want "*) ;; *) echo "attention_bench: missing flag $want in: $*"; exit 2 ;; esac
done
echo "attention_bench: forward shape 0: median 0.3000 ms" >&2
echo '{"attention_bench":1,"ok":true,"error":null,"shape":{"B":4,"T":1024,"H":12,"head_dim":64,"out_bf16":true},"forward":[{"shape":0,"name":"64 queries, 4 warps","median_ms":0.3,"min_ms":0.29,"same_bits":true}],"backward":[{"kv":0,"q":0,"names":["a","b"],"median_ms":0.9,"same_bits":true}],"tuned":{"tuning_ms":{"forward":12.0,"backward":30.0},"forward_ms":0.25,"backward_ms":0.8,"report":"forward: shape 0 0.3 ms (chosen)"}}'
EOF

cat >"$B/bin/main_job" <<'EOF'
#!/bin/sh
# Checks the flags run.sh passes, prints progress lines, writes summary.json.
# FAKE_FAIL_PREFETCH=1: every run fails while forward prefetch is on (no
# --forward_prefetch=false); FAKE_HANG_PREFETCH=1: the main run hangs while it is on.
out=""
prefetch=on
for a in "$@"; do
  case "$a" in
    --output_dir=*) out=${a#--output_dir=} ;;
    --forward_prefetch=false) prefetch=off ;;
  esac
done
if [ "${FAKE_FAIL_PREFETCH:-0}" = 1 ] && [ $prefetch = on ]; then
  case "$out" in */main_job) ;; *) echo "main_job: $out with forward prefetch on after it failed"; exit 2 ;; esac
fi
case "$out" in */main_job_ncu)
  # Phase 7: a short run under ncu, without GEMM tuning.
  [ "${FSDP_GEMM_TUNING:-}" = 0 ] || { echo "main_job: GEMM tuning on under ncu"; exit 2; }
  for want in --device=cuda --backend=nccl --world_size=1 --param_dtype=bfloat16 --steps=2; do
    case " $* " in *" $want "*) ;; *) echo "main_job: missing flag $want in: $*"; exit 2 ;; esac
  done
  exit 0 ;;
esac
case " $* " in *" --model=llama "*)
  # Phase 7: the Llama run (after a failure with tuning on, with it off).
  if [ "${FAKE_FAIL_TUNED:-0}" = 1 ] && [ "${FSDP_GEMM_TUNING:-}" != 0 ]; then
    echo "main_job: llama with GEMM tuning on after it failed"; exit 2
  fi
  for want in --device=cuda --backend=nccl --world_size=1 --param_dtype=bfloat16 \
      --vocab_size=50304 --seq_len=1024 --n_embd=768 --n_layer=12 --n_head=12 --n_kv_head=4 \
      --intermediate_size=2048 --batch_size=4 --steps=2 --profile_ops; do
    case " $* " in *" $want "*) ;; *) echo "main_job: missing flag $want in: $*"; exit 2 ;; esac
  done
  mkdir -p "$out"
  echo '{"world_size": 1, "tokens_per_second_after_warmup": 900.0, "mfu": 0.4, "peak_device_memory_bytes": [99999], "final_train_loss": 6.7, "op_profile": {"estimated_step_ms": 35.0, "measured_op_ms": 50.0, "categories": [{"category": "elementwise", "ops": 110, "estimated_ms": 6.2, "measured_ms": 9.0}]}}' >"$out/summary.json"
  exit 0 ;;
esac
case " $* " in *" --cpu_offload "*)
  # Phase 5: the offload run (after a failure with tuning on, with it off).
  if [ "${FAKE_FAIL_TUNED:-0}" = 1 ] && [ "${FSDP_GEMM_TUNING:-}" != 0 ]; then
    echo "main_job: offload with GEMM tuning on after it failed"; exit 2
  fi
  for want in --device=cuda --backend=nccl --world_size=1 --param_dtype=bfloat16 \
      --batch_size=4 --steps=3; do
    case " $* " in *" $want "*) ;; *) echo "main_job: missing flag $want in: $*"; exit 2 ;; esac
  done
  mkdir -p "$out"
  echo '{"world_size": 1, "tokens_per_second_after_warmup": 500.0, "peak_device_memory_bytes": [61728], "final_train_loss": 6.9, "memory_estimate": 60000}' >"$out/summary.json"
  exit 0 ;;
esac
for want in --device=cuda --backend=nccl --world_size=1 --param_dtype=bfloat16 \
    --vocab_size=50304 --block_size=1024 --seq_len=1024 --n_embd=768 --n_layer=12 \
    --n_head=12 --batch_size=4 --steps=20 --profile_ops; do
  case " $* " in *" $want "*) ;; *) echo "main_job: missing flag $want in: $*"; exit 2 ;; esac
done
mkdir -p "$out"
if [ "${FAKE_FAIL_TUNED:-0}" = 1 ] && [ "${FSDP_GEMM_TUNING:-}" != 0 ]; then
  # FAKE_FAIL_TUNED=1: fails while GEMM tuning is on.
  echo "step     5/20 (global 5)  loss 9.0000  tokens/s       99  peak r0 1 MiB"
  echo "main_job: Internal: the GEMM tuner exploded"
  exit 3
fi
if [ "${FAKE_FAIL_PREFETCH:-0}" = 1 ] && [ $prefetch = on ]; then
  echo "step     5/20 (global 5)  loss 9.0000  tokens/s       98  peak r0 1 MiB"
  echo "main_job: Internal: the all-gather stream faulted"
  exit 4
fi
if [ "${FAKE_HANG_PREFETCH:-0}" = 1 ] && [ $prefetch = on ]; then
  echo "step     5/20 (global 5)  loss 9.0000  tokens/s       97  peak r0 1 MiB"
  exec sleep 60
fi
echo "step     5/20 (global 5)  loss 9.0000  tokens/s      100  peak r0 1 MiB"
echo "step    10/20 (global 10)  loss 8.0000  tokens/s     1100  peak r0 1 MiB"
echo "step    15/20 (global 15)  loss 7.0000  tokens/s     1200  peak r0 1 MiB"
echo "step    20/20 (global 20)  loss 6.0000  tokens/s     1300  peak r0 1 MiB"
after=1250.0
[ "${FAKE_NO_AFTER_WARMUP:-0}" = 1 ] && after=null
cat >"$out/summary.json" <<J
{"world_size": 1, "device": "cuda", "tokens_per_second": 800.0, "mfu": 0.55,
 "tokens_per_second_after_warmup": $after, "warmup_steps_excluded": 3,
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
EOF

cat >"$B/bench/pytorch_fsdp2.py" <<'EOF'
import json, sys
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
assert args["batch_size"] == "4" and args["vocab_size"] == "50304" and args["param_dtype"] == "bfloat16", args
print("some warning from torch")
print(json.dumps({"ok": True, "tokens_per_s": 1000.0, "mfu": 0.4,
                  "peak_device_memory_bytes": 999, "config": {"optimizer": "AdamW fused"}}))
EOF
cat >"$B/bench/attention_torch.py" <<'EOF'
import json, os, sys
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
assert args == {"batch": "4", "seq_len": "1024", "n_head": "12", "head_dim": "64"}, args
# PyTorch runs with its own libraries, not the bundle's.
assert "/bundle/lib" not in os.environ.get("LD_LIBRARY_PATH", ""), os.environ["LD_LIBRARY_PATH"]
print("UserWarning: something from torch", file=sys.stderr)
print(json.dumps({"attention_torch": 1, "ok": True, "torch": "2.11.0",
                  "backends": {"flash": {"ok": True, "forward_ms": 0.2, "backward_ms": 0.5},
                               "cudnn": {"ok": False, "error": "RuntimeError: no"}}}))
EOF
cat >"$T/fakebin/ncu" <<'EOF'
#!/bin/sh
# A fake Nsight Compute: runs the profiled command (ours, with their flags) and writes a
# report naming it; with --import, prints that report's raw page (a header, a units row,
# a row per kernel). FAKE_NCU_FAIL=1: cannot read the counters.
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
"$@" || exit $?
echo "$1" >"$o.ncu-rep"
EOF
chmod +x "$T/fakebin/"* "$B/bin/"* "$B/bin/tests/"*

export PATH="$T/fakebin:$PATH" PYTHONPATH="$T/site" CUDA_HOME="$T/cuda"
export BATCH=4 STEPS=20 OFFLOAD_STEPS=3 LLAMA_STEPS=2 TEST_TIMEOUT_S=2

# ---- 1. a full run ----------------------------------------------------------------------
set +e
OUT=$T/out RUN_WORK=$T/work1 "$B/run.sh" >"$T/stdout1" 2>&1
rc=$?
set -e
cat "$T/stdout1"
check "run.sh exits 1 when a step failed" [ "$rc" = 1 ]
tail -n 1 "$T/stdout1" >"$T/summary1.json"
check "the last line is the JSON summary" python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$T/summary1.json"

py_check() {  # py_check <description> <summary file> <python expression over s>
  check "$1" python3 -c "import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if ($3) else 1)" "$2"
}
S=$T/summary1.json
py_check "gpu tests: 4 passed (A.one A.two B.ok C.fine)" "$S" 's["gpu_tests"]["passed"] == 4'
py_check "gpu tests: 1 skipped" "$S" 's["gpu_tests"]["skipped"] == 1'
py_check "gpu tests: 4 failed (B.fails, B.typed/0, C.crashes, D.hangs)" "$S" 's["gpu_tests"]["failed"] == 4'
py_check "failing names: B.fails and the parameterised one" "$S" \
  '"b_test:B.fails" in s["gpu_tests"]["failed_names"] and "b_test:Param/B.typed/0" in s["gpu_tests"]["failed_names"]'
py_check "failing names: the crashed and the timed-out cases" "$S" \
  'any(n.startswith("c_test:C.crashes (did not finish") for n in s["gpu_tests"]["failed_names"]) and any(n.startswith("d_test:D.hangs (did not finish: timed out") for n in s["gpu_tests"]["failed_names"])'
py_check "a_test binary ok, b_test not" "$S" 's["gpu_tests"]["binaries"]["a_test"]["ok"] and not s["gpu_tests"]["binaries"]["b_test"]["ok"]'
py_check "libcudart from the toolkit (before the wheel)" "$S" \
  's["env"]["libraries"]["libcudart.so.13"] == "'"$T"'/cuda/lib64/libcudart.so.13"'
py_check "libnccl from the wheel (the toolkit has none)" "$S" \
  's["env"]["libraries"]["libnccl.so.2"] == "'"$T"'/site/nvidia/nccl/lib/libnccl.so.2"'
py_check "LD_LIBRARY_PATH: bundle lib, toolkit, wheel" "$S" \
  's["env"]["ld_library_path"].startswith("'"$B"'/lib:'"$T"'/cuda/lib64:'"$T"'/site/nvidia/nccl/lib")'
py_check "ours: the job's tokens/s after warm-up (1250)" "$S" 's["tokens_per_s"]["ours"] == 1250.0'
py_check "ours: peak device memory per rank kept" "$S" 's["ours"]["peak_device_memory_bytes_per_rank"] == [123456]'
py_check "ours: whole-fit tokens/s kept (800)" "$S" 's["ours"]["tokens_per_s_whole_fit"] == 800.0'
py_check "pytorch tokens/s 1000 and ratio 1.25" "$S" \
  's["tokens_per_s"]["pytorch_fsdp2"] == 1000.0 and abs(s["tokens_per_s_ratio"] - 1.25) < 1e-12'
py_check "mfu and peak memory from our summary" "$S" 's["mfu"] == 0.55 and s["peak_device_memory_bytes"] == 123456'
py_check "op profile: estimated and measured step, per category" "$S" \
  's["op_profile"]["estimated_step_ms"] == 57.0 and s["op_profile"]["measured_op_ms"] == 80.0 and s["op_profile"]["categories"]["attention"] == {"ops": 1356, "estimated_ms": 20.7, "measured_ms": 30.5, "achieved_tflops": 61.5, "achieved_gbps": 2535.0}'
py_check "gemm tuning: problems, tuned, another chosen, fallbacks, summed times" "$S" \
  's["ours"]["gemm_tuning"] == {"problems": 4, "tuned": 2, "chose_another": 1, "fallbacks": 1, "first_ms": 0.4, "chosen_ms": 0.35}'
py_check "our summary's memory bound passed through, not its losses" "$S" \
  's["ours"]["summary"]["fsdp_memory_bound_bytes"] == 120000 and "fit_losses" not in s["ours"]["summary"]'
py_check "mfu estimate: 6N + 12LTC flops per token at 989 TFLOP/s" "$S" \
  'abs(s["ours"]["mfu_estimate"] - s["config"]["flops_per_token"] * 1250 / 989e12) < 1e-15 and s["config"]["model_parameters"] == 124475904'
py_check "bench: ok with its best algbw" "$S" 's["nccl_bench"]["ok"] and s["nccl_bench"]["best"]["all_gather"]["algbw_GBps"] == 2.5'
py_check "steps ours, bench, pytorch, offload, attention, attention_pytorch ok" "$S" \
  'all(s["steps"][k]["ok"] for k in ("ours", "bench", "pytorch", "offload", "attention", "attention_pytorch"))'
py_check "attention: both benchmarks' JSON lines" "$S" \
  's["attention"]["ours"]["tuned"]["forward_ms"] == 0.25 and s["attention"]["ours"]["forward"][0]["same_bits"] is True and s["attention"]["pytorch"]["backends"]["flash"]["backward_ms"] == 0.5 and s["attention"]["pytorch"]["backends"]["cudnn"]["ok"] is False'
py_check "attention: our rows in the summary without the names and least times (attention.log has them)" "$S" \
  's["attention"]["ours"]["forward"] == [{"shape": 0, "median_ms": 0.3, "tflops": None, "same_bits": True, "error": None}] and "name" not in s["attention"]["ours"]["backward"][0] and s["attention"]["ours"]["backward"][0]["kv"] == 0'
py_check "attention: the summary line, ours tuned beside SDPA flash" "$S" \
  's["attention"]["summary"] == "attention B=4 T=1024 H=12 head_dim=64: ours (tuned) forward 0.250 ms, backward 0.800 ms; PyTorch SDPA flash forward 0.200 ms, backward 0.500 ms (ours / PyTorch time: forward 1.25, backward 1.60)"'
check "attention: run.sh prints that line" grep -q "^run.sh: attention B=4 T=1024 H=12 head_dim=64: ours (tuned) forward 0.250 ms" "$T/stdout1"
check "attention: run.sh runs it after the gpu tests and before the NCCL bench" \
  python3 -c 'import sys; t = open(sys.argv[1]).read(); sys.exit(0 if t.index("gpu tests: 4 binaries run") < t.index("run.sh: attention: ok") < t.index("run.sh: attention_pytorch: ok") < t.index("run.sh: bench: ok") else 1)' "$T/stdout1"
py_check "offload: its tokens/s and peak beside ours (0.4 and 0.5 of them)" "$S" \
  's["offload"]["tokens_per_s"] == 500.0 and s["offload"]["peak_device_memory_bytes"] == 61728 and s["offload"]["tokens_per_s_over_no_offload"] == 0.4 and s["offload"]["peak_device_memory_over_no_offload"] == 0.5 and s["offload"]["steps"] == 3'
py_check "llama: its tokens/s, MFU, peak and op profile" "$S" \
  's["steps"]["llama"]["ok"] and s["llama"]["tokens_per_s"] == 900.0 and s["llama"]["mfu"] == 0.4 and s["llama"]["peak_device_memory_bytes"] == 99999 and s["llama"]["steps"] == 2 and s["llama"]["n_kv_head"] == 4 and s["llama"]["op_profile"] == {"estimated_step_ms": 35.0, "measured_op_ms": 50.0, "categories": {"elementwise": {"ops": 110, "estimated_ms": 6.2, "measured_ms": 9.0}}}'
check "llama: run.sh prints its line" \
  grep -q "^run.sh: llama: tokens/s 900, MFU 0.4, peak 99999 B, op ms measured 50.0 (estimated 35.0)" "$T/stdout1"
py_check "environment: GPU and driver" "$S" 's["env"]["gpu"] == "NVIDIA H200" and s["env"]["driver"] == "580.95.05"'
py_check "overall ok is false" "$S" 's["ok"] is False'
py_check "no library missing for the (script) binaries" "$S" 's["env"]["ldd_missing"] == []'
py_check "ncu: the attention profile's kernels, the longest first, microseconds from nanoseconds" "$S" \
  's["ncu"]["attention"]["ok"] and s["ncu"]["attention"]["kernels"] == 2 and [k["kernel"] for k in s["ncu"]["attention"]["longest"]] == ["FlashBackwardKV<64>", "FlashForward<64>"] and s["ncu"]["attention"]["longest"][0]["us"] == 1500.0 and s["ncu"]["attention"]["longest"][1]["us"] == 2.5'
py_check "ncu: throughputs, occupancy, issue, registers, grid" "$S" \
  '(lambda k: k["sm_pct"] == 40.5 and k["memory_pct"] == 30.0 and k["occupancy_pct"] == 20.0 and k["occupancy_limit_pct"] == 25.0 and k["issue_pct"] == 55.0 and k["registers"] == 96 and k["grid"] == "(16, 192, 1)")(s["ncu"]["attention"]["longest"][1])'
py_check "ncu: busiest pipes, main stalls and shared-memory bank conflicts" "$S" \
  '(lambda k: k["pipes_pct"] == {"tensor_op_hmma": 35.0, "alu": 12.0} and list(k["stalls"]) == ["long_scoreboard", "barrier"] and k["shared_bank_conflicts"] == 1024.0)(s["ncu"]["attention"]["longest"][1])'
py_check "ncu: the step's profile (microseconds as given)" "$S" \
  's["ncu"]["step"]["ok"] and s["ncu"]["step"]["kernels"] == 1 and s["ncu"]["step"]["longest"][0]["us"] == 12.5 and s["ncu"]["step"]["longest"][0]["kernel"] == "LayerNormForward"'
check "ncu: run.sh prints the longest kernels" grep -q "^run.sh: ncu attention: 2 kernels profiled; the longest:" "$T/stdout1"
for f in summary.json run.log gpu_tests.log attention.log main_job.log main_job_summary.json pytorch_fsdp2.log ncu.csv; do
  check "\$OUT/$f copied" [ -s "$T/out/$f" ]
done
check "at most 8 files in \$OUT" [ "$(ls "$T/out" | wc -l)" -le 8 ]
check "\$OUT/run.log ends with ldd.txt" grep -q "^== ldd bin/main_job" "$T/out/run.log"
check "\$OUT/run.log holds the collectives benchmark's JSON" grep -q "^== nccl_bench.json" "$T/out/run.log"
check "\$OUT/ncu.csv holds both profiles" \
  python3 -c 'import sys; t = open(sys.argv[1]).read(); sys.exit(0 if "== ncu_attention.csv" in t and "== ncu_step.csv" in t and "FlashBackwardKV<64>" in t else 1)' "$T/out/ncu.csv"
check "\$OUT/attention.log holds both attention benchmarks' output" \
  grep -q "UserWarning: something from torch" "$T/out/attention.log"
check "\$OUT/attention.log: ours first" grep -q "^attention_bench: forward shape 0" "$T/out/attention.log"
check "stdout prints nvidia-smi -L and ldd --version" grep -q "GPU 0: NVIDIA H200" "$T/stdout1"

# ---- 2. wheel libraries first, failing tests left out: exit 0 --------------------------
rm "$B/bin/tests/b_test" "$B/bin/tests/c_test" "$B/bin/tests/d_test"
set +e
FAKE_NCU_FAIL=1 FAKE_NO_AFTER_WARMUP=1 FSDP_PREFER_WHEEL=1 SKIP=bench,attention RUN_WORK=$T/work2 "$B/run.sh" >"$T/stdout2" 2>&1
rc=$?
set -e
check "run.sh exits 0 when every step that ran passed (ncu failing aside)" [ "$rc" = 0 ]
tail -n 1 "$T/stdout2" >"$T/summary2.json"
py_check "FSDP_PREFER_WHEEL=1: libcudart from the wheel" "$T/summary2.json" \
  's["env"]["libraries"]["libcudart.so.13"] == "'"$T"'/site/nvidia/cu13/lib/libcudart.so.13"'
py_check "no after-warm-up figure: median of the progress intervals after the first (1200)" \
  "$T/summary2.json" 's["tokens_per_s"]["ours"] == 1200.0 and abs(s["tokens_per_s_ratio"] - 1.2) < 1e-12'
py_check "skipped bench is not run" "$T/summary2.json" \
  '"bench" not in s["steps"] and s["nccl_bench"]["error"] == "skipped (SKIP)" and s["ok"] is True'
py_check "SKIP=attention: neither attention benchmark runs" "$T/summary2.json" \
  '"attention" not in s["steps"] and "attention_pytorch" not in s["steps"] and s["attention"]["ours"] == {"ok": False, "error": "skipped (SKIP)"} and s["attention"]["pytorch"]["error"] == "skipped (SKIP)" and s["attention"]["summary"] is None'
check "SKIP=attention: said so" grep -q "^run.sh: attention: skipped (SKIP)" "$T/stdout2"
py_check "ncu failing: recorded with its error, the run still ok" "$T/summary2.json" \
  's["steps"]["ncu_step"]["ok"] is False and "Failed to initialize the profiler" in s["ncu"]["step"]["error"] and s["ok"] is True'

# ---- 2b. our attention benchmark dies without its JSON line -----------------------------
set +e
FAKE_ATTN_CRASH=1 SKIP=tests,bench,ours,pytorch,offload RUN_WORK=$T/work_attn "$B/run.sh" >"$T/stdout_attn" 2>&1
rc=$?
set -e
check "attention crashed: exit 1" [ "$rc" = 1 ]
tail -n 1 "$T/stdout_attn" >"$T/summary_attn.json"
py_check "attention crashed: ours ok false with its exit status, PyTorch's line still there" "$T/summary_attn.json" \
  's["attention"]["ours"]["ok"] is False and s["attention"]["ours"]["error"].startswith("rc=134") and s["steps"]["attention"]["rc"] == 134 and s["attention"]["pytorch"]["ok"] is True and s["steps"]["attention_pytorch"]["ok"]'
check "attention crashed: the line says so beside PyTorch's figures" \
  grep -q "^run.sh: attention B=4 T=1024 H=12 head_dim=64: ours: rc=134.*; PyTorch SDPA flash forward 0.200 ms, backward 0.500 ms$" "$T/stdout_attn"

# ---- 2c. our job fails with GEMM tuning on: once more with it off ------------------------
rm -rf "$T/out_tuned"
set +e
FAKE_FAIL_TUNED=1 OUT=$T/out_tuned SKIP=tests,bench,attention,pytorch,ncu RUN_WORK=$T/work_tuned \
  "$B/run.sh" >"$T/stdout_tuned" 2>&1
rc=$?
set -e
check "tuned job failed: exit 1" [ "$rc" = 1 ]
check "tuned job failed: run.sh says it runs it again" \
  grep -q "^run.sh: main job: again with GEMM tuning off (FSDP_GEMM_TUNING=0)" "$T/stdout_tuned"
tail -n 1 "$T/stdout_tuned" >"$T/summary_tuned.json"
py_check "tuned job failed: the first attempt a failed step, the second's figures (1250, not the first's 99)" \
  "$T/summary_tuned.json" \
  's["steps"]["ours_tuned"]["rc"] == 3 and s["steps"]["ours"]["ok"] and s["ours"]["ok"] and s["tokens_per_s"]["ours"] == 1250.0 and "the GEMM tuner exploded" in s["ours"]["gemm_tuning_off_after"] and s["ok"] is False'
py_check "tuned job failed: the offload and llama runs with tuning off too" "$T/summary_tuned.json" \
  's["steps"]["offload"]["ok"] and s["steps"]["llama"]["ok"]'
check "tuned job failed: \$OUT/run.log holds the first attempt's log" \
  grep -q "the GEMM tuner exploded" "$T/out_tuned/run.log"
check "tuned job failed: \$OUT/main_job.log is the second attempt's alone" \
  python3 -c 'import sys; t = open(sys.argv[1]).read(); sys.exit(0 if "tokens/s      100" in t and "exploded" not in t else 1)' "$T/out_tuned/main_job.log"
py_check "a job that passes is run once" "$S" '"ours_tuned" not in s["steps"] and "gemm_tuning_off_after" not in s["ours"] and "ours_prefetch" not in s["steps"] and "forward_prefetch_off_after" not in s["ours"]'

# ---- 2d. our job fails with tuning on, and again with it off: once more without prefetch --
rm -rf "$T/out_prefetch"
set +e
FAKE_FAIL_TUNED=1 FAKE_FAIL_PREFETCH=1 OUT=$T/out_prefetch SKIP=tests,bench,attention,pytorch \
  RUN_WORK=$T/work_prefetch "$B/run.sh" >"$T/stdout_prefetch" 2>&1
rc=$?
set -e
check "prefetch job failed: exit 1" [ "$rc" = 1 ]
check "prefetch job failed: run.sh says it runs it a third time" \
  grep -q "^run.sh: main job: again with forward prefetch off (--forward_prefetch=false)" "$T/stdout_prefetch"
tail -n 1 "$T/stdout_prefetch" >"$T/summary_prefetch.json"
py_check "prefetch job failed: both failed attempts as steps, the third's figures (1250)" \
  "$T/summary_prefetch.json" \
  's["steps"]["ours_tuned"]["rc"] == 3 and s["steps"]["ours_prefetch"]["rc"] == 4 and s["steps"]["ours"]["ok"] and s["tokens_per_s"]["ours"] == 1250.0 and "the GEMM tuner exploded" in s["ours"]["gemm_tuning_off_after"] and "the all-gather stream faulted" in s["ours"]["forward_prefetch_off_after"] and s["ok"] is False'
py_check "prefetch job failed: the offload, llama and ncu runs with prefetch and tuning off too" \
  "$T/summary_prefetch.json" \
  's["steps"]["offload"]["ok"] and s["steps"]["llama"]["ok"] and s["steps"]["ncu_step"]["ok"]'
check "prefetch job failed: \$OUT/run.log holds both failed attempts' logs" \
  python3 -c 'import sys; t = open(sys.argv[1]).read(); sys.exit(0 if "the GEMM tuner exploded" in t and "the all-gather stream faulted" in t else 1)' "$T/out_prefetch/run.log"

# ---- 2e. our job times out: no tuning-off attempt, straight to prefetch off --------------
set +e
FAKE_HANG_PREFETCH=1 OURS_TIMEOUT_S=3 SKIP=tests,bench,attention,pytorch,offload,llama,ncu \
  RUN_WORK=$T/work_hang "$B/run.sh" >"$T/stdout_hang" 2>&1
rc=$?
set -e
check "hung job: exit 1" [ "$rc" = 1 ]
tail -n 1 "$T/stdout_hang" >"$T/summary_hang.json"
py_check "hung job: timed out with prefetch on, then measured with it off and tuning on" \
  "$T/summary_hang.json" \
  '"ours_tuned" not in s["steps"] and s["steps"]["ours_prefetch"]["rc"] in (124, 137) and s["steps"]["ours"]["ok"] and s["tokens_per_s"]["ours"] == 1250.0'
check "hung job: GEMM tuning stayed on" bash -c '! grep -q "GEMM tuning off" "$1"' _ "$T/stdout_hang"

# ---- 3. the run's budget spent before any step -----------------------------------------
set +e
RUN_BUDGET_S=20 SKIP=bench RUN_WORK=$T/work_budget "$B/run.sh" >"$T/stdout_budget" 2>&1
rc=$?
set -e
check "budget spent: exit 1" [ "$rc" = 1 ]
tail -n 1 "$T/stdout_budget" >"$T/summary_budget.json"
py_check "budget spent: steps recorded as not run, tests as not run (not failed)" "$T/summary_budget.json" \
  's["steps"]["ours"]["rc"] == -1 and s["steps"]["pytorch"]["rc"] == -1 and s["steps"]["offload"]["rc"] == -1 and s["steps"]["llama"]["rc"] == -1 and s["steps"]["attention"]["rc"] == -1 and s["steps"]["attention_pytorch"]["rc"] == -1 and s["gpu_tests"]["not_run"] == ["a_test"] and s["gpu_tests"]["failed"] == 0 and s["ok"] is False'

# ---- 4. cut off by an outer limit while PyTorch runs: $OUT holds what finished ---------
cat >"$B/bench/pytorch_fsdp2.py" <<'EOF'
import time
time.sleep(40)
EOF
rm -rf "$T/out_cut"
set +e
OUT=$T/out_cut SKIP=bench RUN_WORK=$T/work_cut timeout 15 "$B/run.sh" >"$T/stdout_cut" 2>&1
set -e
py_check "cut off: \$OUT/summary.json has the tests and our job" "$T/out_cut/summary.json" \
  's["gpu_tests"]["passed"] == 2 and s["steps"]["ours"]["ok"] and s["tokens_per_s"]["ours"] == 1250.0'
check "cut off: our job's log copied" [ -s "$T/out_cut/main_job.log" ]

# ---- 5. a library nowhere; no Python for the summary ------------------------------------
echo libfsdp_nowhere.so.7 >>"$B/lib/cuda_sonames.txt"
set +e
PYTHON=/nonexistent/python3 SKIP=tests,bench,pytorch RUN_WORK=$T/work3 "$B/run.sh" >"$T/stdout3" 2>&1
rc=$?
set -e
cat "$T/stdout3"
check "without Python: exit 1" [ "$rc" = 1 ]
check "a missing library is reported" grep -q "NOT FOUND: libfsdp_nowhere.so.7" "$T/stdout3"
tail -n 1 "$T/stdout3" >"$T/summary3.json"
py_check "without Python: a JSON line with the step statuses" "$T/summary3.json" \
  's["ok"] is False and s["steps"]["ours"] == 0'

echo "$failures failed"
[ "$failures" = 0 ]
