#!/usr/bin/env bash
# The CPU benchmark of issue 12: our FSDP against PyTorch on the same GPT, side by side
# (bench/cpu/README.md). From a fresh clone, after tools/setup.sh:
#
#   bash bench/cpu/run.sh             # full: 3 configs x 3 strategy pairs x 3 runs a side,
#                                     # then FULL_SHARD over gloo vs shm (--backends=false: not)
#                                     # and 1 rank x 2 threads vs 2 x 1 (--scaling=false: not)
#   bash bench/cpu/run.sh --quick     # smoke test: first config, FULL_SHARD vs FSDP2, 1 run
#   bash bench/cpu/run.sh --steps=30 --runs=5 --configs=2 --pairs=NO_SHARD
#
# It creates the PyTorch virtual environment on first use (bench/cpu/setup.sh torch: under
# ~/.cache/fsdp_bench, several GB: the PyPI wheel links CUDA libraries even on a CPU),
# builds //trainer:main_job with -c opt, then runs bench/cpu/run_bench.py, which prints
# the JSON on stdout (progress on stderr). Also writes it to out/bench_cpu/result.json.
# `make test` never needs any of this.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${FSDP_BENCH_CACHE:-$HOME/.cache/fsdp_bench}"
bash bench/cpu/setup.sh torch
bazel build -c opt //trainer:main_job >&2
mkdir -p out/bench_cpu
python3 bench/cpu/run_bench.py --main_job=bazel-bin/trainer/main_job \
  --torch_python="$CACHE/torch-venv/bin/python" --out=out/bench_cpu "$@" \
  | tee out/bench_cpu/result.json
