#!/usr/bin/env bash
# Stages what run_h200.sh needs on the GPU machine, which has no package index,
# into one git-ignored folder that travels in one transfer (64 MiB):
#
#   STAGE/bundle.tar.xz   softmax-server and softmax-client of the release
#                         bundle (`make gpu-bundle`), debug info stripped, with lib/
#   STAGE/wheels.tar.xz   the wheels of perf-analyzer, nvidia-pytriton (with its
#                         bundled tritonserver), "numpy<2" and their dependencies
#                         for CPython 3.12 on x86-64 Linux, unpacked, so that xz
#                         compresses their contents (a wheel is a zip: 105 MB of
#                         them would need two transfers)
#
# Usage (from the checkout root, where pip reaches PyPI):
#   bench/kserve/stage.sh STAGE [BUILD_DIR]      (BUILD_DIR default: build)
#
# Left behind to fit: from the PyTriton wheel, since the GPU machine's Python is
# 3.12, the Python backend stubs for 3.8-3.11 and 3.13 and the libpython 3.13
# that only the 3.13 stub links; NumPy's test suites; typer and the packages
# only it needs (PyTriton's command line); the bundle's OpenSSL and libstdc++.
# PyTriton 0.7.0 needs NumPy < 2: with NumPy 2 its models answer with empty
# outputs (seen with 2.5), so NumPy 1.26 travels and is installed there.
# WHEEL_CACHE=DIR reuses a folder of already downloaded wheels.
set -euo pipefail
stage=${1:?usage: stage.sh STAGE [BUILD_DIR]}
build_dir=${2:-build}
. "$(dirname "$0")/../lib/gpu_stage.sh"
mkdir -p "$stage"
stage=$(cd "$stage" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- the server bundle (the bundle's OpenSSL and libstdc++ stay behind:
# perf_analyzer links the machine's too)
gpu_stage_bundle "$stage" "$build_dir" "$work" \
  "softmax-server softmax-client VERSION LIBRARIES lib" "softmax-server softmax-client"

# --- the wheels
wheels=${WHEEL_CACHE:-$work/wheels}
mkdir -p "$wheels"
if ! ls "$wheels"/nvidia_pytriton-*.whl > /dev/null 2>&1; then
  gpu_stage_download_wheels "$wheels" \
    "$(gpu_stage_platforms 39 38 35 34 31 28 27 24 17; printf -- '--platform\nlinux_x86_64\n')" \
    "nvidia-pytriton==0.7.0" "numpy<2" "perf-analyzer==2.60.0"
fi
# typer and what only it brings (pydantic, rich, pygments, ...) serve PyTriton's
# command line, which is not used: left behind.
cli_only="typer pydantic pydantic_core rich pygments markdown_it_py mdurl shellingham annotated_doc annotated_types typing_inspection"
# aiohttp and its own packages serve only tritonclient's asyncio clients,
# which PyTriton imports but its server never calls: an empty `aiohttp` takes
# their place (below), which keeps the stage and the checkout under one
# transfer's 64 MiB now that the bundle carries libcurl.
on_machine="aiohttp aiohappyeyeballs aiosignal frozenlist multidict propcache yarl"
gpu_stage_unpack_wheels "$wheels" "$work" "$cli_only $on_machine"
stub="$work/w/aiohttp-0.0.0-py3-none-any"
mkdir -p "$stub/aiohttp" "$stub/aiohttp-0.0.0.dist-info"
echo "# Empty: tritonclient.http.aio imports aiohttp; the benchmark never calls it." > "$stub/aiohttp/__init__.py"
printf 'Metadata-Version: 2.1\nName: aiohttp\nVersion: 0.0.0\n' > "$stub/aiohttp-0.0.0.dist-info/METADATA"
printf 'Wheel-Version: 1.0\nGenerator: stage.sh\nRoot-Is-Purelib: true\nTag: py3-none-any\n' \
  > "$stub/aiohttp-0.0.0.dist-info/WHEEL"
printf '%s,,\n' aiohttp/__init__.py aiohttp-0.0.0.dist-info/{METADATA,WHEEL,RECORD} \
  > "$stub/aiohttp-0.0.0.dist-info/RECORD"
pt=$(ls -d "$work"/w/nvidia_pytriton-*)
for v in 3.8 3.9 3.10 3.11 3.13; do rm -rf "$pt/pytriton/tritonserver/python_backend_stubs/$v"; done
rm -f "$pt"/nvidia_pytriton.libs/libpython3-*.13.so*
find "$work"/w/numpy-* -type d -name tests -prune -exec rm -rf {} +
gpu_stage_tar_wheels "$stage" "$work"
echo "wheels: $(ls "$wheels"/*.whl | wc -l) wheels, $(stat -c %s "$stage/wheels.tar.xz") bytes"
total=$(du -cb "$stage"/*.tar.xz | tail -1 | cut -f1)
echo "staged in $stage: $total bytes (one transfer holds 67108864 with the checkout)"
