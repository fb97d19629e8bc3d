#!/usr/bin/env bash
# Runs, on a machine with an NVIDIA GPU, everything that needs one: the
# DeviceWorker's GPU unit tests, the end-to-end tests on --device=cuda, the
# batching benchmark and the service benchmark, all from a release bundle.
#
# Usage (from the checkout root, with the bundle built by `make gpu-bundle`):
#   scripts/gpu-check.sh BUNDLE_DIR OUT_DIR [steps]
# steps: any of unit,e2e,batching,small,service (default: unit,e2e,batching,service).
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
  for delay in 100 2000; do
    note "batching benchmark, --max_queue_delay_us=$delay"
    python3 bench/batching/run.py --bundle="$bundle" --device=cuda \
      --server-arg=--max_queue_delay_us=$delay --out="$work/batching-delay$delay" \
      2>&1 | tee "$work/batching-delay$delay.log" | tail -8 | tee -a "$work/summary.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
fi

if step small; then
  # The small-payload point (1 x 1024 float32, 256 callers), unary and stream,
  # over 16 connections.
  for mode in unary stream; do
    note "small payloads, $mode"
    extra=(); [[ $mode == stream ]] && extra=(--stream)
    python3 bench/service/run.py --bundle="$bundle" --device=cuda --out="$work/small-$mode" \
      --payloads=1x1024:float32 --concurrency=256 --connections=16 --duration=4 --warmup=1 \
      "${extra[@]}" 2>&1 | tee "$work/small-$mode.log" | tail -4 | tee -a "$work/summary.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
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
