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
. "$root/bench/lib/gpu_stage.sh"
mkdir -p "$stage"
stage=$(cd "$stage" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gpu_stage_bundle "$stage" "$build_dir" "$work" \
  "softmax-server softmax-client VERSION LIBRARIES lib python" \
  "softmax-server softmax-client cuda_backend_test"

rm -rf "$stage/wheels"
mkdir -p "$stage/wheels"
if [[ -n "${WHEELS:-}" ]]; then
  cp "$WHEELS"/*.whl "$stage/wheels/"
else
  gpu_stage_download_wheels "$stage/wheels" "$(gpu_stage_platforms 28 17)" "tritonclient[grpc,http]"
fi
# ml_dtypes stays: tritonclient 2.73 takes BF16 inputs only as its arrays.
rm -f "$stage"/wheels/{numpy,grpcio,protobuf,perf_analyzer,pytest,pluggy,iniconfig,pygments}-*.whl
echo "wheels: $(ls "$stage"/wheels | wc -l), $(du -sb "$stage/wheels" | cut -f1) bytes"

rm -rf "$stage/src"
mkdir -p "$stage/src/bench/soak" "$stage/src/bench/lib"
cp "$root/bench/__init__.py" "$stage/src/bench/"
cp "$root"/bench/lib/*.py "$root"/bench/lib/*.sh "$stage/src/bench/lib/"
cp "$root"/bench/soak/*.py "$root"/bench/soak/*.sh "$stage/src/bench/soak/"
echo "staged in $stage: $(du -sb "$stage" | cut -f1) bytes (one transfer holds 67108864 with the checkout)"
