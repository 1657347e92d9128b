#!/usr/bin/env bash
# Sets up what the CPU benchmarks need and `make test` never does (bench/cpu/README.md):
#
#   bash bench/cpu/setup.sh torch   # PyTorch from PyPI in a virtual environment
#   bash bench/cpu/setup.sh gemm    # the GEMM libraries Debian ships, unpacked (not installed)
#
# torch: a virtual environment at $FSDP_BENCH_CACHE/torch-venv (default
#   ~/.cache/fsdp_bench) with torch from PyPI (FSDP_BENCH_TORCH_VERSION, default 2.15.0) and
#   the dependencies it declares (see setup_torch for why not fewer). Checks `import torch`.
# gemm: `apt-get download` + `dpkg -x` of OpenBLAS 0.3.21 (pthread and openmp variants, with
#   the libgfortran they load), BLIS 0.9 (serial, pthread, openmp), oneDNN 2.6 (the build
#   links the installed libdnnl-dev), libxsmm 1.17 and Eigen 3.4 into
#   $FSDP_BENCH_CACHE/gemm_libs. Unpacked rather than installed on purpose: installing
#   libblis4-* or libopenblas0-openmp re-points the libblas.so.3 / libopenblas.so.0
#   alternatives every other build on the machine links against.
# Idempotent: a second run only checks (about a second).
set -euo pipefail

CACHE="${FSDP_BENCH_CACHE:-$HOME/.cache/fsdp_bench}"
TORCH_VERSION="${FSDP_BENCH_TORCH_VERSION:-2.15.0}"
what="${1:-all}"

setup_torch() {
  local venv="$CACHE/torch-venv"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, torch.distributed" 2>/dev/null; then
    echo "setup: torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') ready in $venv" >&2
    return 0
  fi
  mkdir -p "$CACHE"
  echo "setup: creating $venv with torch==$TORCH_VERSION from PyPI (several GB, minutes)" >&2
  python3 -m venv "$venv"
  # The smallest install that imports. PyPI has no CPU-only Linux wheel (download.pytorch.org,
  # which has one, is not reachable from these machines), and `--no-deps` is not enough:
  # torch._C links libcudart, cuBLAS, cuDNN, NCCL, cuFile, cuSPARSELt and NVSHMEM at import
  # even when nothing runs on a GPU, and a system CUDA toolkit of another version does not
  # satisfy it (torch 2.15 wants NCCL >= 2.30: undefined symbol ncclCommResume with 2.28).
  # So the wheel with its declared dependencies; nothing else.
  "$venv/bin/pip" install -q "torch==$TORCH_VERSION"
  "$venv/bin/python" -c "import torch, torch.distributed as d; assert d.is_gloo_available(); print('setup: torch', torch.__version__, 'imports; gloo available')" >&2
}

GEMM_PACKAGES=(libopenblas0-pthread libopenblas-pthread-dev libopenblas0-openmp
               libopenblas-openmp-dev libgfortran5 libquadmath0  # OpenBLAS needs libgfortran
               libblis4-serial libblis4-pthread libblis4-openmp libblis-dev libdnnl2 libdnnl-dev
               libxsmm-dev libeigen3-dev
               ocl-icd-libopencl1)  # libdnnl.so.2 needs libOpenCL.so.1 to load

setup_gemm() {
  local root="$CACHE/gemm_libs"
  local stamp="$root/.done-$(echo "${GEMM_PACKAGES[*]}" | md5sum | cut -c1-8)"
  if [ -f "$stamp" ]; then
    echo "setup: GEMM libraries ready in $root" >&2
    return 0
  fi
  local debs="$CACHE/debs"
  mkdir -p "$debs" "$root"
  (cd "$debs" && apt-get download "${GEMM_PACKAGES[@]}" >/dev/null 2>&1) || {
    echo "setup: apt-get download failed; run 'apt-get update' and retry" >&2
    return 1
  }
  for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done
  touch "$stamp"
  echo "setup: unpacked ${#GEMM_PACKAGES[@]} packages into $root" >&2
}

case "$what" in
  torch) setup_torch ;;
  gemm) setup_gemm ;;
  all) setup_torch; setup_gemm ;;
  *) echo "usage: $0 [torch|gemm|all]" >&2; exit 2 ;;
esac
