#!/usr/bin/env bash
# Installs nvcc, the CUDA runtime (static and shared) and CCCL into
# /usr/local/cuda, where CMakeLists.txt looks for nvcc, from one of two
# sources (the image's build stage takes CUDA from either, as its CUDA_SOURCE
# build argument says):
#
#   pypi        NVIDIA's wheels on PyPI (nvidia-cuda-nvcc, -runtime, -crt,
#               nvvm, -cccl) in a venv: works wherever PyPI is reachable.
#   nvidia-apt  NVIDIA's debian12 apt repository (cuda-nvcc-13-0, ...).
#
# Usage: deploy/install-cuda.sh pypi|nvidia-apt VERSION   (VERSION: 13.0)
# Needs python3-venv (pypi) or curl and ca-certificates (nvidia-apt); root.
set -euo pipefail

source=${1:?usage: $0 pypi|nvidia-apt VERSION}
version=${2:?usage: $0 pypi|nvidia-apt VERSION}
major=${version%%.*}

# The CA bundle the image build may pass as a secret (see the Dockerfile).
if [[ -s /run/secrets/ca-bundle ]]; then
  export PIP_CERT=/run/secrets/ca-bundle
fi

case "$source" in
  pypi)
    python3 -m venv /opt/cuda-pypi
    # Every part pinned to the one release: nvidia-cuda-nvcc leaves nvvm
    # (cicc) unpinned, and a newer cicc writes PTX this ptxas refuses.
    /opt/cuda-pypi/bin/pip install --no-cache-dir --disable-pip-version-check -q \
      "nvidia-cuda-nvcc==${version}.*" "nvidia-nvvm==${version}.*" \
      "nvidia-cuda-crt==${version}.*" "nvidia-cuda-runtime==${version}.*" \
      "nvidia-cuda-cccl==${version}.*"
    root=$(echo /opt/cuda-pypi/lib/python3*/site-packages/nvidia/cu"${major}")
    [[ -x "$root/bin/nvcc" ]] || { echo "install-cuda: no nvcc under $root" >&2; exit 1; }
    # nvcc.profile and CMake's FindCUDAToolkit look for lib64/, and
    # FindCUDAToolkit for the unversioned libcudart.so the wheel leaves out.
    ln -sfn lib "$root/lib64"
    ln -sfn "libcudart.so.${major}" "$root/lib/libcudart.so"
    ln -sfn "$root" /usr/local/cuda
    ;;
  nvidia-apt)
    apt-get update
    apt-get install -y --no-install-recommends ca-certificates curl
    curl -fsSL -o /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
    dpkg -i /tmp/cuda-keyring.deb
    rm /tmp/cuda-keyring.deb
    apt-get update
    package=${version/./-}
    apt-get install -y --no-install-recommends \
      "cuda-nvcc-$package" "cuda-cudart-dev-$package" "cuda-cccl-$package" \
      "cuda-driver-dev-$package"
    rm -rf /var/lib/apt/lists/*
    ;;
  *)
    echo "install-cuda: unknown source '$source' (pypi or nvidia-apt)" >&2
    exit 2
    ;;
esac
/usr/local/cuda/bin/nvcc --version | tail -1
