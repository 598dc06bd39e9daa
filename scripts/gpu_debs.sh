#!/usr/bin/env bash
# Fetches, on this machine, the Debian packages TierMoE builds against into
# .gpu-debs/ (git-ignored, about 8 MB), for a GPU machine that cannot reach a
# registry: scripts/gpu_check.sh unpacks them there into a private prefix
# (dpkg-deb -x, the system left alone). The list is scripts/install_deps.sh's
# libraries and the packages they need that a CUDA image may lack.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  libdnnl2 libdnnl-dev
  ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-c-headers opencl-clhpp-headers
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  libbenchmark1debian libbenchmark-dev
)
rm -rf .gpu-debs
mkdir -p .gpu-debs
(cd .gpu-debs && apt-get download "${packages[@]}")
debs=(.gpu-debs/*.deb)
echo "gpu_debs: ${#debs[@]} packages, $(du -sh .gpu-debs | cut -f1) in .gpu-debs/"
