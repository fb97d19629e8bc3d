#!/usr/bin/env bash
# On the GPU machine: the shared-memory tests on the GPU backend, then the
# benchmark (shm_bench.py). STAGE holds bundle.tar.xz (`make gpu-bundle`,
# stripped) and wheels/ (tritonclient[grpc,http], perf-analyzer, pytest and
# their dependencies but numpy, grpcio and protobuf, which the machine has).
# Usage (from the checkout root): bench/shm/run_h200.sh STAGE OUT [shm_bench flags]
set -uo pipefail
stage=$(cd "${1:?usage: run_h200.sh STAGE OUT}" && pwd)
out=${2:?usage: run_h200.sh STAGE OUT}
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
. "$(dirname "$0")/../lib/gpu_stage.sh"
bundle=$(gpu_stage_unpack_bundle "$stage" "$work")
gpu_stage_pip_install "$out/pip.log" --target "$work/py" "$stage"/wheels/*.whl \
  || tail -3 "$out/pip.log"
export PYTHONPATH=$work/py PATH=$work/py/bin:$PATH
pa=$(ls "$work"/py/perf_analyzer/bin/perf_analyzer 2>/dev/null || command -v perf_analyzer)
echo "perf_analyzer: $pa"

echo "== CudaBackend unit tests"
LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/cuda_backend_test" > "$out/cuda_backend_test.log" 2>&1
echo "rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$out/cuda_backend_test.log" | tr '\n' ' ')"
echo "== end-to-end tests on the GPU (shared memory, KServe, serving)"
SOFTMAX_SERVER_BIN="$bundle/softmax-server" SOFTMAX_CLIENT_BIN="$bundle/softmax-client" \
SOFTMAX_PYTHON_DIR="$bundle/python" PYTHONDONTWRITEBYTECODE=1 \
PYTHONPATH="$PWD:$bundle/python:$PYTHONPATH" \
  timeout 300 python3 -m pytest -p no:cacheprovider -q -rs --rootdir=tests \
    tests/test_shared_memory.py tests/test_gpu_serving.py > "$out/e2e.log" 2>&1
echo "rc $?: $(tail -1 "$out/e2e.log")"
grep -E "FAILED|Error" "$out/e2e.log" | head -10

echo "== benchmark"
timeout 400 python3 -m bench.shm.shm_bench --bundle="$bundle" --perf-analyzer="$pa" \
  --out="$out" "$@" 2>&1 | tee "$out/bench.log" | grep -v '^{'
rm -rf "$work"
