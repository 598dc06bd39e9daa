#!/usr/bin/env bash
# Installs the Debian packages TierMoE builds against, only those missing.
# Idempotent: a second run installs nothing and does not touch the network.
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config
  libdnnl-dev          # oneDNN: f32 GEMM on AVX-512, attention
  ocl-icd-opencl-dev   # oneDNN's CMake config requires OpenCL (only a Recommends of libdnnl-dev)
  nlohmann-json3-dev   # config.json, safetensors headers, --json output
  libcli11-dev         # the tiermoe command line
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev     # bench/ (Google Benchmark)
  libopenmpi-dev openmpi-bin  # expert parallelism between processes (mpirun), the ep tests
  python3-venv python3-dev    # the Python package: make test's venv, the extension's headers
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install_deps: error: not root and sudo is not installed; as root, run:" >&2
    echo "  apt-get update && apt-get install --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  SUDO="sudo"
fi
echo "install_deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
