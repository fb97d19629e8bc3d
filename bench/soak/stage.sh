#!/usr/bin/env bash
# Stages what run_h200.sh needs on the GPU machine (no package index there)
# into one git-ignored folder that travels in one transfer (64 MiB):
#
#   STAGE/bundle.tar.xz  the `make gpu-bundle` bundle: softmax-server,
#                        softmax-client, the CUDA backend's unit tests
#                        (bin/cuda_backend_test), lib/ and the python/ stubs, debug info
#                        stripped (the machine's own OpenSSL 3 and libstdc++ serve)
#   STAGE/wheels/        tritonclient[grpc,http] and its dependencies for
#                        CPython 3.12 on x86-64 Linux, but numpy, grpcio and
#                        protobuf (the machine's serve) and perf_analyzer
#   STAGE/src/           the soak's sources (bench/soak, bench/lib), so that a
#                        checkout without them can run STAGE/src/bench/soak/run_h200.sh
#
# Usage (from the checkout root): bench/soak/stage.sh STAGE [BUILD_DIR]
#   WHEELS=DIR copies the wheels from DIR instead of downloading them.
set -euo pipefail
stage=${1:?usage: stage.sh STAGE [BUILD_DIR]}
build_dir=${2:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$stage"
stage=$(cd "$stage" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

make -C "$root" gpu-bundle BUILD_DIR="$build_dir" > "$work/bundle.log" 2>&1 \
  || { tail -20 "$work/bundle.log"; exit 1; }
bundle=$(ls -d "$root"/dist/softmax-serve-*-linux-* | grep -v 'tar.gz$' | head -1)
name=$(basename "$bundle")
mkdir -p "$work/b/$name/bin"
cp -a "$bundle"/{softmax-server,softmax-client,VERSION,LIBRARIES,lib,python} "$work/b/$name/"
cp -a "$bundle"/bin/{softmax-server,softmax-client,cuda_backend_test} "$work/b/$name/bin/"
rm -f "$work/b/$name"/lib/{libssl.so.3,libcrypto.so.3,libstdc++.so.6}
strip --strip-debug "$work/b/$name"/bin/* "$work/b/$name"/lib/*.so* 2>/dev/null || true
tar -C "$work/b" -cf - "$name" | xz -T2 -9 > "$stage/bundle.tar.xz"
echo "bundle: $name, $(stat -c %s "$stage/bundle.tar.xz") bytes"

rm -rf "$stage/wheels"
mkdir -p "$stage/wheels"
if [[ -n "${WHEELS:-}" ]]; then
  cp "$WHEELS"/*.whl "$stage/wheels/"
else
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$stage/wheels" \
    "tritonclient[grpc,http]"
fi
# ml_dtypes stays: tritonclient 2.73 takes BF16 inputs only as its arrays.
rm -f "$stage"/wheels/{numpy,grpcio,protobuf,perf_analyzer,pytest,pluggy,iniconfig,pygments}-*.whl
echo "wheels: $(ls "$stage"/wheels | wc -l), $(du -sb "$stage/wheels" | cut -f1) bytes"

rm -rf "$stage/src"
mkdir -p "$stage/src/bench/soak" "$stage/src/bench/lib"
cp "$root/bench/__init__.py" "$stage/src/bench/"
cp "$root"/bench/lib/*.py "$stage/src/bench/lib/"
cp "$root"/bench/soak/*.py "$root"/bench/soak/*.sh "$stage/src/bench/soak/"
echo "staged in $stage: $(du -sb "$stage" | cut -f1) bytes (one transfer holds 67108864 with the checkout)"
