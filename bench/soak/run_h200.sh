#!/usr/bin/env bash
# On the GPU machine: the soak (bench/soak/soak.py) on --device=cuda from a
# release bundle, for 8 minutes by default (one GPU command may run 10).
#
# STAGE (made by bench/soak/stage.sh) holds:
#   bundle.tar.xz  the bundle of `make gpu-bundle` (server, client, lib/, python/
#                  stubs, bin/cuda_backend_test: run first when present)
#   wheels/        optional: tritonclient[grpc,http] and its dependencies but
#                  numpy, grpcio and protobuf, which the machine has. Without
#                  them (or when they do not import there) the soak runs
#                  softmax.v1 traffic only and says so in its notes.
#   src/           optional: the soak's sources, for a checkout that lacks them
#
# Usage (from any folder): bench/soak/run_h200.sh STAGE OUT [soak.py flags]
#   SOAK_DURATION  default 8m;  SOAK_CALLERS  Python callers, default 8;
#   SOAK_BULK      softmax-client load callers, default 128 (half streamed)
# The server gets --max_held_bytes=1GiB: 128 callers in flight hold about
# 240 MiB, past the soak's own 128 MiB (which would refuse them outside bursts).
# Writes OUT/soak.json, OUT/soak.png, OUT/soak.log, OUT/server.log, OUT/gpu.txt,
# OUT/cuda_backend_test.log;
# exits with soak.py's code (1: a check failed, the table says which).
set -uo pipefail
stage=$(cd "${1:?usage: run_h200.sh STAGE OUT [soak.py flags]}" && pwd)
out=${2:?usage: run_h200.sh STAGE OUT [soak.py flags]}
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
duration=${SOAK_DURATION:-8m}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

. "$root/bench/lib/gpu_stage.sh"
bundle=$(gpu_stage_unpack_bundle "$stage" "$work")
if ls "$stage"/wheels/*.whl > /dev/null 2>&1; then
  gpu_stage_pip_install "$out/pip.log" --target "$work/py" "$stage"/wheels/*.whl \
    || { echo "pip install failed (KServe traffic will be skipped):"; tail -3 "$out/pip.log"; }
  export PYTHONPATH=$work/py${PYTHONPATH:+:$PYTHONPATH}
else
  echo "no wheels in $stage: softmax.v1 traffic only"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
cat "$bundle/VERSION"
if [[ -x "$bundle/bin/cuda_backend_test" ]]; then
  # The caching allocators and the backend on this GPU first (about 7 s).
  LD_LIBRARY_PATH="$bundle/lib" timeout 60 "$bundle/bin/cuda_backend_test" \
    > "$out/cuda_backend_test.log" 2>&1
  echo "cuda_backend_test: rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$out/cuda_backend_test.log" | tr '\n' ' ')"
fi

# The soak, its drain and the report take about a minute beyond --duration; a
# soak stopped by this timeout leaves soak.partial.json (written every minute).
seconds=$(python3 -c "import sys; t=sys.argv[1]; print(int(float(t[:-1]) * {'s': 1, 'm': 60, 'h': 3600}[t[-1]] if t[-1] in 'smh' else float(t)))" "$duration")
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$bundle/python:$root${PYTHONPATH:+:$PYTHONPATH}" \
  timeout $((seconds + 75)) python3 -m bench.soak.soak \
  --bundle="$bundle" --device=cuda --duration="$duration" \
  --callers="${SOAK_CALLERS:-8}" --bulk-callers="${SOAK_BULK:-128}" \
  --server-arg=--max_held_bytes=$((1 << 30)) --out="$out" "$@" \
  2>&1 | tee "$out/soak.log"
exit "${PIPESTATUS[0]}"
