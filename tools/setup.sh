#!/usr/bin/env bash
# Installs what this repo needs to build and test, and nothing that is already present.
# Idempotent: when everything is installed it only checks, which takes about a second.
#
#   tools/setup.sh           # install missing Debian packages (needs root or sudo)
#
# Everything comes from Debian's archive; no network access beyond apt is needed.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap      # Bazel 4.2.3, the Bazel these machines can get offline
  bazel-platforms      # @platforms for Bazel 4 (TOOLCHAIN.md)
  g++
  libabsl-dev
  libprotobuf-dev
  protobuf-compiler
  libgoogle-glog-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libgloo-dev
  libdnnl-dev          # oneDNN 2.6: CPU GEMM (dnnl_sgemm); pulls libdnnl2, libgomp1, an OpenCL ICD loader
  nlohmann-json3-dev
  iproute2             # network namespaces for the multi-host test
  clang-format-14      # the formatting check of make test (tools/format.sh)
  python3              # tools/function_lengths.py and the bundle's run.py
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: missing packages (${missing[*]}) and not root; install them or rerun as root" >&2
    exit 1
  fi
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists only when they are absent or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
  $SUDO apt-get update -qq
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
