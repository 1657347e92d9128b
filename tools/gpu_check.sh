#!/bin/bash
# gpu_check.sh: the GPU checks in one go, for a machine with an NVIDIA GPU.
#   1. builds with --config=cuda and runs every test tagged "gpu"
#      (bazel test --config=cuda --test_tag_filters=gpu //...);
#   2. runs the NCCL collectives benchmark (one rank per GPU, up to 8) and keeps its JSON.
# A few minutes on a GPU machine. Where there is no GPU it says so and exits 0 without
# building anything (GPU_CHECK_FORCE=1 runs it anyway; the gpu tests then skip).
#
#   tools/gpu_check.sh                 # from anywhere in the repo
#   OUT=/some/dir tools/gpu_check.sh   # where nccl_bench.json and the logs go
#
# Without Bazel (the GPU machines lent here have none) it runs the bundle instead when
# out/gpu_bundle.tar.xz is present (tools/gpu_bundle.sh makes it; run.sh inside it runs the
# gpu tests, the NCCL benchmark and our job against PyTorch FSDP2, and prints one JSON line).
#
# Exit status: 0 when every step passed (or there is no GPU), 1 when a step failed,
# 2 when the machine lacks what the script needs (bazel, or the bundle).
set -u
cd "$(dirname "$0")/.." || exit 2
OUT_DIR=${OUT:-$PWD/gpu_check_out}
OUTPUT_BASE=${GPU_CHECK_OUTPUT_BASE:-/root/.cache/bazel_ob/gpu_check}
BAZEL=(bazel --output_base="$OUTPUT_BASE")
COMMON=(--config=cuda --symlink_prefix=/)

say() { echo "gpu_check: $*"; }

if [ "${GPU_CHECK_FORCE:-0}" != 1 ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    say "SKIPPED: no GPU here (nvidia-smi not found); nothing was built or run"
    exit 0
  fi
  if ! gpus=$(nvidia-smi -L 2>&1) || [ -z "$gpus" ]; then
    say "SKIPPED: no usable GPU here (nvidia-smi -L: ${gpus:-no devices}); nothing was built or run"
    exit 0
  fi
  say "GPUs:"
  echo "$gpus"
fi
if ! command -v bazel >/dev/null 2>&1; then
  if [ -f out/gpu_bundle.tar.xz ]; then
    dir=$(mktemp -d /tmp/gpu_check_bundle.XXXXXX)
    say "bazel is not installed: running the bundle out/gpu_bundle.tar.xz from $dir"
    tar -xJf out/gpu_bundle.tar.xz -C "$dir" || { say "FAILED: cannot extract out/gpu_bundle.tar.xz"; exit 2; }
    OUT="$OUT_DIR" "$dir/gpu_bundle/run.sh"
    exit $?
  fi
  say "FAILED: bazel is not installed and there is no out/gpu_bundle.tar.xz (tools/gpu_bundle.sh)"
  exit 2
fi
mkdir -p "$OUT_DIR"
start=$(date +%s)
failed=0

say "step 1/2: bazel test --config=cuda --test_tag_filters=gpu //..."
if "${BAZEL[@]}" test "${COMMON[@]}" --test_tag_filters=gpu --build_tests_only \
    --test_output=all --test_summary=short //... 2>&1 | tee "$OUT_DIR/gpu_tests.log"; then
  say "gpu tests passed"
else
  say "FAILED: gpu tests (log: $OUT_DIR/gpu_tests.log)"
  failed=1
fi

say "step 2/2: NCCL collectives benchmark"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${ngpu:-0}" -ge 1 ] || ngpu=1
[ "$ngpu" -le 8 ] || ngpu=8
if "${BAZEL[@]}" build "${COMMON[@]}" //bench:collectives_bench 2>&1 | tail -3; then
  bin="$("${BAZEL[@]}" info "${COMMON[@]}" bazel-bin 2>/dev/null)/bench/collectives_bench"
  if timeout 300 "$bin" --backend=nccl --nproc="$ngpu" --max_bytes=$((1 << 30)) \
      >"$OUT_DIR/nccl_bench.json" 2>"$OUT_DIR/nccl_bench.err"; then
    say "benchmark JSON: $OUT_DIR/nccl_bench.json"
    cat "$OUT_DIR/nccl_bench.json"
  else
    say "FAILED: NCCL benchmark (stderr: $OUT_DIR/nccl_bench.err)"
    cat "$OUT_DIR/nccl_bench.err"
    failed=1
  fi
else
  say "FAILED: building //bench:collectives_bench with --config=cuda"
  failed=1
fi

say "done in $(($(date +%s) - start)) s: $([ $failed = 0 ] && echo PASSED || echo FAILED)"
exit $failed
