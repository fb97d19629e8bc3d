#!/usr/bin/env bash
# Runs, on a machine with an NVIDIA GPU, everything that needs one: the
# DeviceWorker's GPU unit tests, the end-to-end tests on --device=cuda, the
# batching benchmark and the service benchmark, all from a release bundle.
#
# Usage (from the checkout root, with the bundle built by `make gpu-bundle`):
#   scripts/gpu-check.sh BUNDLE_DIR OUT_DIR [steps]
# steps: any of unit,e2e,batching,service (default: all of them).
# Needs python3 with grpcio, protobuf, numpy and pytest (matplotlib for plots).
# Everything lands in OUT_DIR/gpu-check.tgz plus a summary in OUT_DIR/summary.txt.
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
steps=${3:-unit,e2e,batching,service}
work=$(mktemp -d)
mkdir -p "$out"
status=0

step() { [[ ",$steps," == *",$1,"* ]]; }
note() { echo "== $*" | tee -a "$work/summary.txt"; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
  | tee "$work/gpu.txt"

if step unit; then
  note "DeviceWorker GPU unit tests"
  LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/device_worker_test" 2>&1 | tee "$work/device_worker_test.log" \
    | tail -8 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

if step e2e; then
  note "end-to-end tests on the GPU backend"
  SOFTMAX_SERVER_BIN="$bundle/softmax-server" SOFTMAX_CLIENT_BIN="$bundle/softmax-client" \
  SOFTMAX_PYTHON_DIR="$bundle/python" PYTHONDONTWRITEBYTECODE=1 \
    python3 -m pytest -p no:cacheprovider -q -rs --rootdir=tests \
      tests/test_gpu_serving.py tests/test_numerics.py tests/test_stream.py \
      2>&1 | tee "$work/e2e.log" | tail -15 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

if step batching; then
  note "batching benchmark"
  python3 bench/batching/run.py --bundle="$bundle" --device=cuda --out="$work/batching" \
    2>&1 | tee "$work/batching.log" | tail -12 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

if step service; then
  note "service benchmark"
  python3 bench/service/run.py --bundle="$bundle" --device=cuda --out="$work/service" \
    --duration=3 --warmup=1 2>&1 | tee "$work/service.log" | tail -30 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

cp "$work/summary.txt" "$out/summary.txt"
tar -C "$work" -czf "$out/gpu-check.tgz" .
rm -rf "$work"
exit $status
