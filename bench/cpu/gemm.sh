#!/usr/bin/env bash
# GEMM library by measurement (issue 12 item 2): unpacks the candidate libraries Debian ships
# (bench/cpu/setup.sh gemm; nothing is installed), builds the libxsmm and Eigen shims with
# g++, builds //bench/cpu:gemm_bench with -c opt and runs it: single thread, as shipped (no
# environment variables), every GEMM shape of the three GPT benchmark configs, JSON on stdout.
#
#   bash bench/cpu/gemm.sh                    # full run (a few minutes on a loaded machine)
#   bash bench/cpu/gemm.sh --quick            # first config only, short timings
#   bash bench/cpu/gemm.sh --min_seconds=0.5  # extra flags go to gemm_bench
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${FSDP_BENCH_CACHE:-$HOME/.cache/fsdp_bench}"
bash bench/cpu/setup.sh gemm
ROOT="$CACHE/gemm_libs"
LIB="$ROOT/usr/lib/x86_64-linux-gnu"
SHIMS="$CACHE/gemm_shims"
mkdir -p "$SHIMS"

# The shims: rebuilt when their source is newer.
build_shim() {  # out src flags...
  local out="$1" src="$2"
  shift 2
  if [ ! -f "$out" ] || [ "$src" -nt "$out" ]; then
    g++ -std=c++17 -fPIC -shared -o "$out" "$src" "$@"
  fi
}
build_shim "$SHIMS/eigen_x86_64.so" bench/cpu/eigen_shim.cc -O2 -I"$ROOT/usr/include/eigen3"
build_shim "$SHIMS/eigen_avx2_fma.so" bench/cpu/eigen_shim.cc -O2 -mavx2 -mfma -I"$ROOT/usr/include/eigen3"
build_shim "$SHIMS/xsmm.so" bench/cpu/xsmm_shim.cc -O2 -I"$ROOT/usr/include" \
  -Wl,--whole-archive "$ROOT/usr/lib/libxsmm.a" -Wl,--no-whole-archive \
  -L"$LIB/openblas-pthread" -Wl,-rpath,"$LIB/openblas-pthread" -Wl,-rpath,"$LIB" -lopenblas \
  -lpthread -ldl -lm

bazel build -c opt //bench/cpu:gemm_bench >&2

args=()
quick=0
for a in "$@"; do
  if [ "$a" = "--quick" ]; then quick=1; else args+=("$a"); fi
done
if [ "$quick" = 1 ]; then args=(--configs="64,32,64,2,4,16" --min_seconds=0.03 "${args[@]}"); fi

# The first --lib is the one the library links today (gemm_bench's "speedup_vs_" baseline):
# oneDNN, installed by tools/setup.sh (libdnnl-dev). The OpenBLAS the library linked until
# issue 12 is the openblas-pthread one (unpacked here, like the others).
exec bazel-bin/bench/cpu/gemm_bench \
  --preload="$LIB/libOpenCL.so.1" \
  --preload="$LIB/libquadmath.so.0" \
  --preload="$LIB/libgfortran.so.5" \
  --lib=onednn:dnnl:/usr/lib/x86_64-linux-gnu/libdnnl.so.2 \
  --lib=openblas-pthread:cblas:"$LIB/openblas-pthread/libopenblas.so.0" \
  --lib=openblas-openmp:cblas:"$LIB/openblas-openmp/libopenblas.so.0" \
  --lib=blis-serial:cblas:"$LIB/blis-serial/libblis.so.4" \
  --lib=blis-pthread:cblas:"$LIB/blis-pthread/libblis.so.4" \
  --lib=blis-openmp:cblas:"$LIB/blis-openmp/libblis.so.4" \
  --lib=libxsmm:shim:"$SHIMS/xsmm.so" \
  --lib=eigen-x86_64:shim:"$SHIMS/eigen_x86_64.so" \
  --lib=eigen-avx2-fma:shim:"$SHIMS/eigen_avx2_fma.so" \
  "${args[@]}"
