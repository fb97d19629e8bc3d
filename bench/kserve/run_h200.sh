#!/usr/bin/env bash
# On the GPU machine (no package index there): unpacks what stage.sh staged,
# installs PyTriton and its dependencies offline into the machine's Python
# (PyTriton's Python backend only sees packages of the interpreter itself, so
# no --target or venv), then runs pa_bench.py: perf_analyzer on our KServe
# gRPC and HTTP endpoints beside softmax-client load, and on PyTriton.
#
# Usage (from the checkout root):
#   bench/kserve/run_h200.sh STAGE OUT [pa_bench.py flags...]
# Everything lands in OUT: results.json/.csv, table.md, plot.png, logs/, and
# setup.log (unpacking and pip).
set -uo pipefail
stage=$(cd "${1:?usage: run_h200.sh STAGE OUT [flags]}" && pwd)
out=${2:?usage: run_h200.sh STAGE OUT [flags]}
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/bench/lib/gpu_stage.sh"
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
started=$SECONDS

mkdir -p "$work/wheels" "$work/whl"
gpu_stage_unpack_bundle "$stage" "$work" > "$work/bundle.path" &
tar -C "$work/wheels" -xJf "$stage/wheels.tar.xz"
wait
bundle=$(cat "$work/bundle.path")
echo "== unpacked in $((SECONDS - started)) s: $(cat "$bundle/VERSION" | head -1)"

# Each unpacked wheel zipped again (perf_analyzer runs from where it lies).
gpu_stage_rezip_wheels "$work/wheels" "$work/whl" perf_analyzer-
gpu_stage_pip_install "$out/setup.log" "$work"/whl/*.whl
rc=$?
echo "== pip rc $rc after $((SECONDS - started)) s"; grep -v "^$" "$out/setup.log" | tail -3
pa=$(ls "$work"/wheels/perf_analyzer-*/perf_analyzer/bin/perf_analyzer)
chmod +x "$pa"
"$pa" --version 2>&1 | head -1
site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# The tritonserver binary that PyTriton starts finds its libraries here.
export LD_LIBRARY_PATH=$site/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 -c "import numpy, torch, pytriton, tritonclient.grpc; print('numpy', numpy.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" python3 -m bench.kserve.pa_bench \
  --bundle="$bundle" --perf-analyzer="$pa" --device=cuda --out="$out" "$@" 2>&1 \
  | tee "$out/pa_bench.log"
status=${PIPESTATUS[0]}
echo "== done in $((SECONDS - started)) s, rc $status"
rm -rf "$work"
exit "$status"
