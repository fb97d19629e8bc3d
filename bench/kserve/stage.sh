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
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$stage"
stage=$(cd "$stage" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- the server bundle
make -C "$root" gpu-bundle BUILD_DIR="$build_dir" > "$work/bundle.log" 2>&1 \
  || { tail -20 "$work/bundle.log"; exit 1; }
bundle=$(ls -d "$root"/dist/softmax-serve-*-linux-* | grep -v 'tar.gz$' | head -1)
name=$(basename "$bundle")
mkdir -p "$work/b/$name/bin"
cp -a "$bundle"/{softmax-server,softmax-client,VERSION,LIBRARIES,lib} "$work/b/$name/"
cp -a "$bundle"/bin/{softmax-server,softmax-client} "$work/b/$name/bin/"
# The GPU machine's own OpenSSL 3 and libstdc++ serve (perf_analyzer links them too).
rm -f "$work/b/$name"/lib/{libssl.so.3,libcrypto.so.3,libstdc++.so.6}
strip --strip-debug "$work/b/$name"/bin/* "$work/b/$name"/lib/*.so* 2>/dev/null || true
tar -C "$work/b" -cf - "$name" | xz -T2 -9 > "$stage/bundle.tar.xz"
echo "bundle: $name, $(stat -c %s "$stage/bundle.tar.xz") bytes"

# --- the wheels
wheels=${WHEEL_CACHE:-$work/wheels}
mkdir -p "$wheels"
if ! ls "$wheels"/nvidia_pytriton-*.whl > /dev/null 2>&1; then
  plat=()
  for n in 39 38 35 34 31 28 27 24 17; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
  plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64)
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$wheels" "nvidia-pytriton==0.7.0" "numpy<2" "perf-analyzer==2.60.0"
fi
# typer and what only it brings (pydantic, rich, pygments, ...) serve PyTriton's
# command line, which is not used: left behind.
cli_only="typer pydantic pydantic_core rich pygments markdown_it_py mdurl shellingham annotated_doc annotated_types typing_inspection"
# aiohttp and its own packages serve only tritonclient's asyncio clients,
# which PyTriton imports but its server never calls: an empty `aiohttp` takes
# their place (below), which keeps the stage and the checkout under one
# transfer's 64 MiB now that the bundle carries libcurl.
on_machine="aiohttp aiohappyeyeballs aiosignal frozenlist multidict propcache yarl"
mkdir -p "$work/w"
for w in "$wheels"/*.whl; do
  base=$(basename "$w"); [[ " $cli_only $on_machine " == *" ${base%%-*} "* ]] && continue
  d="$work/w/$(basename "$w" .whl)"
  mkdir -p "$d" && unzip -q "$w" -d "$d"  # unzip keeps the executable bits
done
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
tar -C "$work/w" -cf - . | xz -T2 -9 > "$stage/wheels.tar.xz"
echo "wheels: $(ls "$wheels"/*.whl | wc -l) wheels, $(stat -c %s "$stage/wheels.tar.xz") bytes"
total=$(du -cb "$stage"/*.tar.xz | tail -1 | cut -f1)
echo "staged in $stage: $total bytes (one transfer holds 67108864 with the checkout)"
